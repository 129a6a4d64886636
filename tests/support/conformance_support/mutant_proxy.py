"""A proxy between the conformance runner and a real engine that breaks it on purpose.

``python mutant_proxy.py MUTANT ENGINE-ARGV...`` spawns the engine with the same environment
and rewrites the byte streams in one specific way (see MUTANTS). The mutation test runs named
conformance cases through each mutant and asserts they fail: the suite has teeth. The mutant
``none`` is transparent, which proves the proxy itself changes nothing.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import threading

from colibri.conformance.frames import Frame, FrameSplitter

# A file beside this one: run as a script, its own folder is first on sys.path.
from serve_codec_double import MODES as CODEC_MODES
from serve_codec_double import main as codec_main

MUTANTS = {
    "none": "transparent proxy",
    "drop_accept": "never sends ACCEPT",
    "misformat_done": "prints DONE's tok/s with three decimals instead of two",
    "wrong_error_code": "answers SLOT_BUSY as DUPLICATE_ID",
    "no_drain_rejected": "does not drain the payload of a SUBMIT refused for its values",
    "data_out_of_slot_order": "emits a decode step's DATA frames in descending slot order",
    "broken_prefix_reuse": "a reused slot yields a different first token",
    "leak_cancelled": "sends one more DATA after acknowledging a CANCEL",
    "cancel_as_done": "acknowledges CANCEL with DONE instead of ERROR CANCELLED",
    "stop_as_cancel": "treats STOP as CANCEL",
    "no_eof_drain": "exits at stdin EOF without finishing in-flight requests",
    "echo_off_by_one": "numbers ECHO positions from 1",
    "wrong_context_limit": "reports CTX-1 instead of CTX-2 in CONTEXT_EXCEEDED",
    "empty_prompt_code": "answers EMPTY_PROMPT as BAD_REQUEST",
    "tail_on_plain_data": "adds a logprob tail to DATA of requests that did not ask",
    "stat_format": "prints the startup STAT with one decimal for rss",
    # Invariants of what fields mean together (spec/cases/protocol/INVARIANTS.md), one or
    # more per class: length vs dimension, sum vs total, count vs frames, ordering, range,
    # monotonic sequence, cross-frame within a turn, across turns.
    "emap_short": "EMAP carries one expert byte fewer than rows x cols",
    "tiers_miscount": "TIERS counts one RAM expert more than EMAP holds",
    "prof_miscount": "PROF counts one completion token more than DONE",
    "length_flag_lies": "DONE says length_limited 0 for a turn that reached its maximum",
    "drop_second_data": "never sends a request's second DATA frame (DONE still counts it)",
    "caps_slots_lie": "CAPS announces one KV slot more than the engine has",
    "topk_unsorted": "writes TOPK entries by ascending logprob",
    "block_out_of_order": "writes PROF before PERF in the turn-end block",
    "hit_pct_over_100": "reports DONE's hit % as 250.0",
    "heat_decays": "clears the heat bits of every EMAP after the first turn's",
    "echo_payload_shift": "ECHO position p carries the payload of position p-1",
    "accept_counts_prefill": "ACCEPT and DONE count only the tokens a warm slot prefills",
    "heat_forgotten": "the handshake EMAP shows no heat (usage history not restored)",
    "stop_stray_error": "answers STOP with ERROR 0 BAD_REQUEST and keeps decoding",
    "stop_ignored": "ignores STOP: the request decodes to its natural end",
    "cancel_ignored": "ignores CANCEL: the request decodes to its natural end",
    "no_entropy": "never writes ENTROPY (the seed's turn-end telemetry loses a line)",
    # Not a mutant: the seed-core double (tests/conformance/test_conformance_profiles.py).
    "seed_core": "speaks only the seed's protocol (serve_protocol.md): no CAPS, ACCEPT, PROF "
    "or CONTEXT_EXCEEDED; STOP and SUBMITs with more than six fields are unknown lines",
    # Not a mutant either: the serve_codec double (serve_codec_double.py) and its mutants.
    **CODEC_MODES,
}

#: Frames of extensions the seed-core double never sends.
_NOT_SEED = ("CAPS", "ACCEPT", "PROF", "ECHO")

_SUBMIT = re.compile(
    rb"SUBMIT ([0-9]+) ([0-9]+) ([0-9]+) ([0-9]+) (\S+) (\S+)( [0-9]+)?((?: \S+=\S+)*)"
)


class Proxy:
    def __init__(self, mutant: str, argv: list[str]) -> None:
        self.mutant = mutant
        env = dict(os.environ)
        if mutant == "seed_core":
            # The seed's engine has no STATS dump (a newer colibri's): the double must not
            # write one, or the suite's probe would rightly find the extension.
            env.pop("STATS", None)
        self.engine = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env
        )
        self.out = sys.stdout.buffer
        self.lock = threading.Lock()
        self.slot_uses: dict[int, int] = {}
        self.warm_ids: set[int] = set()
        self.logprob_ids: set[int] = set()
        self.last_data: dict[int, Frame] = {}
        self.perturbed: set[int] = set()
        self.data_seen: dict[int, int] = {}
        self.emaps_seen = 0
        self.held_perf = b""
        self.echo_before: dict[int, bytes] = {}
        self.slot_prompts: dict[int, list[bytes]] = {}
        self.reused: dict[int, int] = {}  # request id -> prompt tokens a warm slot kept

    # -- server -> engine ------------------------------------------------------------------
    def pump_input(self) -> None:
        source = sys.stdin.buffer
        sink = self.engine.stdin
        assert sink is not None
        buffer = b""

        def more() -> bool:
            nonlocal buffer
            chunk = os.read(source.fileno(), 65536)
            buffer += chunk
            return bool(chunk)

        try:
            while True:
                while b"\n" not in buffer:
                    if not more():
                        if buffer:
                            sink.write(buffer)
                        raise EOFError
                line, _, buffer = buffer.partition(b"\n")
                match = _SUBMIT.fullmatch(line)
                if match is None:
                    if self.mutant == "stop_as_cancel" and line.startswith(b"STOP "):
                        line = b"CANCEL " + line[5:]
                    if self.mutant == "stop_stray_error" and line.startswith(b"STOP "):
                        line += b" "  # malformed: ERROR 0 BAD_REQUEST, the request goes on
                    if self.mutant == "stop_ignored" and line.startswith(b"STOP "):
                        continue
                    if self.mutant == "cancel_ignored" and line.startswith(b"CANCEL "):
                        continue
                    if self.mutant == "seed_core" and line.startswith(b"STOP "):
                        self.reply(b"ERROR 0 BAD_REQUEST\n")  # as the seed's glm.c answers
                        continue
                    sink.write(line + b"\n")
                    continue
                if self.mutant == "seed_core" and (match.group(7) or match.group(8)):
                    # Six fields are all the seed knows: the header cannot be framed, so
                    # its payload is read as command lines (which the engine refuses).
                    self.reply(b"ERROR 0 BAD_REQUEST\n")
                    continue
                size = int(match.group(3)) + int((match.group(7) or b" 0").strip())
                while len(buffer) < size + 1:
                    if not more():
                        sink.write(line + b"\n" + buffer)
                        raise EOFError
                body, buffer = buffer[: size + 1], buffer[size + 1 :]
                rid, slot = int(match.group(1)), int(match.group(2))
                if b"logprobs=" in (match.group(8) or b"") and b"logprobs=0" not in match.group(8):
                    self.logprob_ids.add(rid)
                if self.mutant == "no_drain_rejected" and _bad_values(match):
                    sink.write(b"SUBMIT refused-values\n" + body)
                    continue
                self.slot_uses[slot] = self.slot_uses.get(slot, 0) + 1
                ids = body[: int(match.group(3))].split()
                kept = _common_prefix(self.slot_prompts.get(slot, []), ids)
                self.reused[rid] = min(kept, len(ids) - 1)
                self.slot_prompts[slot] = ids
                if self.slot_uses[slot] > 1:
                    self.warm_ids.add(rid)
                sink.write(line + b"\n" + body)
        except (EOFError, BrokenPipeError, OSError):
            pass
        if self.mutant == "no_eof_drain":
            self.engine.kill()
            return
        try:
            sink.close()
        except OSError:
            pass

    # -- engine -> server ------------------------------------------------------------------
    def write(self, frames: list[Frame]) -> None:
        self.reply(b"".join(self.mutate(f) for f in frames))

    def reply(self, data: bytes) -> None:
        """Write to the server; both pumps write, one frame run at a time."""
        if data:
            with self.lock:
                self.out.write(data)
                self.out.flush()

    def mutate(self, f: Frame) -> bytes:
        m, rid = self.mutant, f.request_id
        fields = f.fields
        if m == "drop_accept" and f.kind == "ACCEPT":
            return b""
        if m == "seed_core" and f.kind in _NOT_SEED:
            return b""
        if m == "seed_core" and f.kind == "ERROR" and "CONTEXT_EXCEEDED" in fields:
            return f"ERROR {rid} BAD_REQUEST\n".encode()
        if m == "misformat_done" and f.kind == "DONE" and len(fields) > 4:
            fields[4] = f"{float(fields[4]):.3f}"
            return " ".join(fields).encode() + b"\n"
        if m == "wrong_error_code" and f.kind == "ERROR" and "SLOT_BUSY" in fields:
            return f.header.replace(b"SLOT_BUSY", b"DUPLICATE_ID") + b"\n"
        if m == "empty_prompt_code" and f.kind == "ERROR" and "EMPTY_PROMPT" in fields:
            return f.header.replace(b"EMPTY_PROMPT", b"BAD_REQUEST") + b"\n"
        if m == "wrong_context_limit" and f.kind == "ERROR" and "CONTEXT_EXCEEDED" in fields:
            fields[-1] = str(int(fields[-1]) + 1)
            return " ".join(fields).encode() + b"\n"
        if m == "broken_prefix_reuse" and f.kind == "DATA" and rid in self.warm_ids:
            if rid not in self.perturbed:
                self.perturbed.add(rid)
                return _with_payload(f, (f.payload or b"") + b"#")
        if (
            m == "leak_cancelled"
            and f.kind == "ERROR"
            and "CANCELLED" in fields
            and rid in self.last_data
        ):
            return f.wire() + self.last_data[rid].wire()
        if m == "cancel_as_done" and f.kind == "ERROR" and "CANCELLED" in fields:
            return f"DONE {rid} STAT 1 1.00 0.0 0.01 1 0\n".encode()
        if m == "echo_off_by_one" and f.kind == "ECHO" and len(fields) > 3:
            fields[3] = str(int(fields[3]) + 1)
            return " ".join(fields).encode() + b"\n" + (f.payload or b"") + b"\n"
        if m == "tail_on_plain_data" and f.kind == "DATA" and rid not in self.logprob_ids:
            return f.header + b" -0.500000 0\n" + (f.payload or b"") + b"\n"
        if m == "stat_format" and f.kind == "STAT" and len(fields) == 5:
            fields[4] = f"{float(fields[4]):.1f}"
            return " ".join(fields).encode() + b"\n"
        if f.kind == "DATA" and rid is not None:
            self.last_data[rid] = f
        mutated = self.mutate_meaning(f)
        return f.wire() if mutated is None else mutated

    def mutate_meaning(self, f: Frame) -> bytes | None:
        """The mutants of invariants.py: grammar stays valid, the meaning breaks."""
        m, rid, fields = self.mutant, f.request_id, f.fields
        if f.kind == "EMAP":
            self.emaps_seen += 1
            if m == "emap_short":
                fields[3] = fields[3][:-2]
            elif (m == "heat_decays" and self.emaps_seen > 2) or (
                m == "heat_forgotten" and self.emaps_seen == 1
            ):
                fields[3] = bytes(b & 0xC0 for b in bytes.fromhex(fields[3])).hex()
            else:
                return None
            return _line(fields)
        if m == "tiers_miscount" and f.kind == "TIERS":
            fields[2] = str(int(fields[2]) + 1)
            return _line(fields)
        if m == "prof_miscount" and f.kind == "PROF":
            fields[3] = str(int(fields[3]) + 1)
            return _line(fields)
        if m == "length_flag_lies" and f.kind == "DONE" and fields[-1] == "1":
            fields[-1] = "0"
            return _line(fields)
        if m == "drop_second_data" and f.kind == "DATA" and rid is not None:
            self.data_seen[rid] = self.data_seen.get(rid, 0) + 1
            return b"" if self.data_seen[rid] == 2 else None
        if m == "caps_slots_lie" and f.kind == "CAPS":
            return _line(
                [f"slots={int(t[6:]) + 1}" if t.startswith("slots=") else t for t in fields]
            )
        if m == "topk_unsorted" and f.kind == "TOPK":
            pairs = [fields[i : i + 2] for i in range(3, len(fields), 2)]
            return _line(fields[:3] + [x for pair in reversed(pairs) for x in pair])
        if m == "block_out_of_order" and f.kind == "PERF":
            self.held_perf = f.wire()
            return b""
        if m == "block_out_of_order" and f.kind == "PROF":
            held, self.held_perf = self.held_perf, b""
            return f.wire() + held
        if m == "no_entropy" and f.kind == "ENTROPY":
            return b""
        if m == "hit_pct_over_100" and f.kind == "DONE":
            fields[5] = "250.0"
            return _line(fields)
        if m == "echo_payload_shift" and f.kind == "ECHO" and rid is not None:
            before = self.echo_before.get(rid)
            self.echo_before[rid] = f.payload or b""
            return None if fields[3] == "0" or before is None else _with_payload(f, before)
        if m == "accept_counts_prefill" and f.kind in ("ACCEPT", "DONE") and rid is not None:
            at = 2 if f.kind == "ACCEPT" else 7
            fields[at] = str(int(fields[at]) - self.reused.get(rid, 0))
            return _line(fields)
        return None

    def pump_output(self) -> None:
        stream = self.engine.stdout
        assert stream is not None
        splitter = FrameSplitter()
        pending: list[Frame] = []
        reorder = self.mutant == "data_out_of_slot_order"
        while True:
            if reorder and pending:
                ready, _, _ = select.select([stream], [], [], 0.05)
                if not ready:
                    self.write(_reversed_run(pending))
                    pending = []
                    continue
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                break
            for frame in splitter.feed(chunk):
                if reorder and frame.kind == "DATA":
                    pending.append(frame)
                    continue
                if pending:
                    self.write(_reversed_run(pending))
                    pending = []
                self.write([frame])
        self.write(_reversed_run(pending) + splitter.finish())

    def run(self) -> int:
        threading.Thread(target=self.pump_input, daemon=True).start()
        self.pump_output()
        return self.engine.wait() if self.mutant != "no_eof_drain" else 0


def _with_payload(frame: Frame, payload: bytes) -> bytes:
    fields = frame.fields
    fields[2] = str(len(payload))
    return " ".join(fields).encode() + b"\n" + payload + b"\n"


def _line(fields: list[str]) -> bytes:
    return " ".join(fields).encode() + b"\n"


def _common_prefix(a: list[bytes], b: list[bytes]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _reversed_run(frames: list[Frame]) -> list[Frame]:
    return list(reversed(frames))


def _bad_values(match: re.Match[bytes]) -> bool:
    try:
        temperature, top_p = float(match.group(5)), float(match.group(6))
    except ValueError:
        return False
    return not (0 <= temperature <= 2 and 0 < top_p <= 1) or int(match.group(4)) == 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in MUTANTS:
        print(f"usage: mutant_proxy.py {{{'|'.join(MUTANTS)}}} ENGINE-ARGV...", file=sys.stderr)
        return 2
    if argv[0] in CODEC_MODES:
        return codec_main(argv[0], argv[1:])
    return Proxy(argv[0], argv[1:]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
