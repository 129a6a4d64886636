"""``colibri chat``: an interactive conversation with a private engine in legacy mode.

The engine runs as a child process (``colibri engine --legacy``) and is driven only through
the legacy wire protocol (spec/protocol.md section 3): each input line is a turn, ``:more``
continues the last answer (``\\x02MORE``), ``:reset`` clears the conversation (``\\x02RESET``),
``:quit`` or end of input leaves. Answers stream to stdout; each turn ends with a footer on
stderr (tokens, seconds, tok/s, as ``--attach`` prints it). The engine keeps the conversation
on disk (``COLI_PERSIST``, spec/protocol.md §4): a chat that resumes one says so at start, and
``--new`` starts a fresh one instead. At start it prints the prompts the model ships in its
``examples.json`` (what it answers well), as the dashboard's empty chat offers them.
"""

from __future__ import annotations

import argparse
import codecs
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from colibri.commands.backend_choice import add_backend_arguments, backend_name
from colibri.protocol import END_LINE as END
from colibri.protocol import READY_LINE as READY


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal (private legacy-mode engine)",
        description=__doc__,
    )
    parser.add_argument(
        "--model", type=Path, help="model directory (default: the embedded default model)"
    )
    parser.add_argument("--ctx", type=int, help="context length (CTX)")
    parser.add_argument("--ngen", type=int, default=None, help="tokens per answer (NGEN)")
    parser.add_argument("--temperature", type=float, default=None, help="COLI_TEMP (0.7)")
    parser.add_argument("--engine-cmd", help="engine command line (default: colibri engine)")
    parser.add_argument("--new", action="store_true",
                        help="start a fresh conversation instead of resuming the one the "
                             "engine saved on disk")
    add_backend_arguments(parser)
    # `--attach [URL]`: talk to a running `colibri serve` over SSE instead (colibri.server.attach).
    from colibri.server import attach

    attach.add_arguments(parser)
    parser.set_defaults(handler=run)


def _footer(stat: bytes, seconds: float) -> str:
    """The turn's footer from its legacy STAT (``STAT <produced> <tok/s> <hit %> ...``) and
    its wall time, as ``--attach`` prints one; the STAT itself when it is not that."""
    from colibri.server.attach import rate_line

    fields = stat.decode("ascii", "replace").split()
    if len(fields) < 4 or fields[0] != "STAT" or not fields[1].isdigit():
        return stat.decode("ascii", "replace")
    return f"{rate_line(int(fields[1]), seconds)} · {fields[3]}% expert hits"


def _read_reply(stdout: IO[bytes], out: IO[str]) -> bytes:
    """Stream one reply's text to `out` until the END sentinel; return the STAT line."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = b""
    while True:
        chunk = stdout.read1(4096) if hasattr(stdout, "read1") else stdout.read(1)
        if not chunk:
            raise EOFError("the engine exited")
        pending += chunk
        cut = pending.find(END)
        if cut >= 0:
            text, rest = pending[:cut], pending[cut + len(END) :]
            out.write(decoder.decode(text, final=True))
            out.flush()
            while b"\n" not in rest:
                more = stdout.read1(4096) if hasattr(stdout, "read1") else stdout.read(1)
                if not more:
                    raise EOFError("the engine exited")
                rest += more
            return rest.split(b"\n", 1)[0]
        # Keep a tail that could be the start of the sentinel.
        safe = len(pending) - (len(END) - 1)
        if safe > 0:
            out.write(decoder.decode(pending[:safe]))
            out.flush()
            pending = pending[safe:]


#: The engine's start-up line when slot 0's conversation was loaded from disk.
_RESUMED = re.compile(rb"\[KV\] slot 0: resumed conversation from disk: (\d+) tokens")


def _available(stream: IO[bytes]) -> bytes:
    """What the engine has written to ``stream`` so far, without waiting for more."""
    out = b""
    while select.select([stream], [], [], 0)[0]:
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            break
        out += chunk
    return out


def _forward(stream: IO[bytes]) -> None:
    """The engine's later log lines go on to our stderr (reading them keeps its pipe from
    filling)."""
    for line in iter(stream.readline, b""):
        sys.stderr.write(line.decode("utf-8", "replace"))
        sys.stderr.flush()


def _start_up_log(engine: subprocess.Popen[bytes]) -> int:
    """Show what the engine logged before READY and return how many tokens of a saved
    conversation it resumed (0: none). The engine's stderr is line-buffered and written before
    READY, so all of it is in the pipe by the time READY was read."""
    assert engine.stderr is not None
    log = _available(engine.stderr)
    sys.stderr.write(log.decode("utf-8", "replace"))
    threading.Thread(target=_forward, args=(engine.stderr,), daemon=True).start()
    found = _RESUMED.search(log)
    return int(found.group(1)) if found else 0


def _try_line(args: argparse.Namespace) -> str | None:
    """The prompts the model ships in its examples.json (the dashboard offers the same ones);
    None when it ships none, or when an --engine-cmd serves a model this command cannot see."""
    from colibri import resources
    from colibri.server import examples

    if args.model is None and args.engine_cmd:
        return None
    return examples.try_line(examples.load(args.model or resources.default_model_dir()))


def run(args: argparse.Namespace) -> int:
    if getattr(args, "attach", None):
        from colibri.server import attach

        return attach.run(args)
    env = dict(os.environ)
    env.pop("SERVE_BATCH", None)
    env["SERVE"] = "1"
    if args.ngen is not None:
        env["NGEN"] = str(args.ngen)
    if args.temperature is not None:
        env["COLI_TEMP"] = str(args.temperature)
    if args.engine_cmd:
        command = args.engine_cmd.split()
    else:
        command = [sys.executable, "-m", "colibri", "engine", "--legacy",
                   "--backend", backend_name(args)]
        if args.model is not None:
            command += ["--model", str(args.model)]
        if args.ctx is not None:
            command += ["--ctx", str(args.ctx)]
    engine = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
    assert engine.stdin is not None and engine.stdout is not None
    try:
        while True:
            line = engine.stdout.readline()
            if not line:
                assert engine.stderr is not None
                sys.stderr.write(engine.stderr.read().decode("utf-8", "replace"))
                print("colibri chat: the engine exited before it was ready", file=sys.stderr)
                return engine.wait() or 1
            if line == READY:
                break
        engine.stdout.readline()  # STAT
        engine.stdout.readline()  # TIERS
        resumed = _start_up_log(engine)
        if resumed and args.new:
            engine.stdin.write(b"\x02RESET\n")
            engine.stdin.flush()
            _read_reply(engine.stdout, sys.stdout)
            print(f"[a new conversation: the saved one ({resumed} tokens) was cleared]",
                  file=sys.stderr)
        elif resumed:
            print(f"[continuing the conversation saved on disk ({resumed} tokens): type :reset, "
                  "or start with --new, for a fresh one]", file=sys.stderr)
        offer = _try_line(args)
        if offer:
            print(offer, file=sys.stderr)
        interactive = sys.stdin.isatty()
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            text = sys.stdin.readline()
            if not text or text.strip() in (":quit", ":exit", ":q"):
                break
            text = text.rstrip("\n")
            if text.strip() == ":reset":
                frame = b"\x02RESET\n"
            elif text.strip() == ":more":
                frame = b"\x02MORE\n"
            elif not text.strip():
                continue
            else:
                frame = text.encode("utf-8") + b"\n"
            engine.stdin.write(frame)
            engine.stdin.flush()
            started = time.monotonic()
            stat = _read_reply(engine.stdout, sys.stdout)
            if frame == b"\x02RESET\n":
                print("[conversation cleared]", file=sys.stderr)
            else:
                print(f"[{_footer(stat, time.monotonic() - started)}]", file=sys.stderr)
    except (EOFError, BrokenPipeError) as exc:
        print(f"colibri chat: {exc}", file=sys.stderr)
        return 1
    finally:
        if engine.stdin and not engine.stdin.closed:
            try:
                engine.stdin.close()
            except BrokenPipeError:
                pass
        engine.wait(timeout=60)
    return 0
