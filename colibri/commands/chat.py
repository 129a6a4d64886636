"""``colibri chat``: an interactive conversation with a private engine in legacy mode.

The engine runs as a child process (``colibri engine --legacy``) and is driven only through
the legacy wire protocol (spec/protocol.md section 3): each input line is a turn, ``:more``
continues the last answer (``\\x02MORE``), ``:reset`` clears the conversation (``\\x02RESET``),
``:quit`` or end of input leaves. Answers stream to stdout; each turn's STAT goes to stderr.
"""

from __future__ import annotations

import argparse
import codecs
import os
import subprocess
import sys
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
    add_backend_arguments(parser)
    # `--attach [URL]`: talk to a running `colibri serve` over SSE instead (colibri.server.attach).
    from colibri.server import attach

    attach.add_arguments(parser)
    parser.set_defaults(handler=run)


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
    engine = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert engine.stdin is not None and engine.stdout is not None
    try:
        while True:
            line = engine.stdout.readline()
            if not line:
                print("colibri chat: the engine exited before it was ready", file=sys.stderr)
                return engine.wait() or 1
            if line == READY:
                break
        engine.stdout.readline()  # STAT
        engine.stdout.readline()  # TIERS
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
            stat = _read_reply(engine.stdout, sys.stdout)
            if frame == b"\x02RESET\n":
                print("[conversation cleared]", file=sys.stderr)
            else:
                print(f"[{stat.decode('ascii', 'replace')}]", file=sys.stderr)
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
