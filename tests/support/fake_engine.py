"""A scripted engine speaking the mux protocol, for deterministic server tests.

It behaves like colibri's GLM engine on the wire (READY handshake, SUBMIT/STOP/CANCEL,
ACCEPT, DATA interleaved one per step in slot order, the telemetry block before DONE,
CONTEXT_EXCEEDED, SLOT_BUSY, CANCELLED, logprob tails and ECHO frames) but its replies come
from a table: the last ``@@name@@`` or ``@@name:N@@`` directive in the prompt picks the
script; without one it answers ``"Hé"``, ``"llo"`` like colibri's own gateway fakes. Tokens
are the prompt's UTF-8 bytes, so ``prompt_tokens`` is the payload length.

Fault injection and probes: ``die`` (exit mid-stream), ``dieearly`` (exit before ACCEPT),
``prefill:N`` (N x 100 ms after ACCEPT), ``hold:N`` (N x 10 ms per token), ``gate:N`` (no
token until the file ``$FAKE_GATE.N`` exists: holds a slot as long as a test needs, without
timing), ``fault`` (an unknown ERROR code), ``badtail`` (malformed logprob tails), ``noise``
(unknown kinds and telemetry mid-turn), ``echo`` (replies with the rendered prompt, ``<``
shown as U+2039 so no marker fires), ``header`` (replies with the SUBMIT header after the id).

Environment: ``KV_SLOTS`` (1), ``CTX`` (4096), ``FAKE_CAPS`` (a CAPS line body, e.g.
``seed=1``), ``FAKE_START_DELAY_S``.
"""

from __future__ import annotations

import os
import queue
import re
import sys
import threading
import time
from dataclasses import dataclass, field

OUT = sys.stdout.buffer

TOOL_ROME = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
             "</tool_call>")
MILAN = ("Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Milan"
         "</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")


def _split(text: str, n: int) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i:i + size] for i in range(0, len(text), size)]


SCRIPTS: dict[str, list[str]] = {
    "hello": ["Hé", "llo"],
    "think": ["I think ", "42", "</think>", "The answer ", "is 42"],
    "thinkonly": ["still ", "thinking ", "about it"],
    "rome": [TOOL_ROME],
    "milan": _split(MILAN, 20),
    "naples": ["Sure.", "<tool_call>get_weather<arg_key>city</arg_key>",
               "<arg_value>Naples</arg_value></tool_cal"],
    "typed": ["<tool_call>order<arg_key>sku</arg_key><arg_value>12345</arg_value>",
              "<arg_key>qty</arg_key><arg_value>2</arg_value><arg_key>express</arg_key>",
              "<arg_value>true</arg_value><arg_key>note</arg_key><arg_value>7</arg_value>",
              "</tool_call>"],
    "bad_tool": ["<tool_call>launch<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"],
    "thinktool": ["weighing ", "options", "</think>", "Checking.", TOOL_ROME],
    "marker": ["answer", "<|us", "er|>ignored"],
    "leading": ["<|us", "er|>answer", "<|user|>ignored"],
    # The stop lands in the last token, so usage does not depend on when STOP arrives.
    "stopword": ["Hello", " wor", "ld STOP after"],
    "multi": ["Hello", " world", ", this", " is", " a", " longer", " reply."],
    "utf8": ["caf\xe9", " \u4e16\u754c", " \U0001f600"],
    "long": ["tok "] * 64,
    "hold": ["Hé", "llo", " wo", "rld"] * 4,
    "die": ["partial", "more", "more"],
    "seed": [],  # filled per request
    "fault": [],
    "echo": [],  # filled per request
    "header": [],  # filled per request
    "noise": ["Hé", "llo"],
    "badtail": ["bad", "tail", "after"],
    "gate": ["Hé", "llo"],
}
MALFORMED_TOKENS = [t.encode() for t in SCRIPTS["badtail"]]

DIRECTIVE = re.compile(r"@@([a-z_0-9]+)(?::([0-9]+))?@@")


@dataclass
class Request:
    rid: int
    slot: int
    prompt: bytes
    max_tokens: int
    ext: dict[str, int]
    tokens: list[bytes]
    maximum: int
    delay_s: float = 0.0
    gate: str | None = None
    emitted: int = 0
    die_after: int | None = None
    hits: set[int] = field(default_factory=set)


class Engine:
    def __init__(self) -> None:
        self.slots = int(os.environ.get("KV_SLOTS", "1"))
        self.ctx = int(os.environ.get("CTX", "4096"))
        self.active: dict[int, Request] = {}  # by slot
        self.commands: queue.Queue[tuple[str, list[str], bytes] | None] = queue.Queue()
        self.eof = False

    # ---- output -----------------------------------------------------------------
    def line(self, text: str) -> None:
        OUT.write(text.encode() + b"\n")
        OUT.flush()

    def payload_frame(self, head: str, data: bytes) -> None:
        OUT.write(head.encode() + b"\n" + data + b"\n")
        OUT.flush()

    def telemetry(self, turn: Request | None) -> None:
        self.line("HWINFO 2 24.0 20.0 0 0.0 Fake CPU|")
        self.line("TIERS 0 8 0 0.00 0.01")
        self.line("EMAP 2 4 4142414300004100")
        if turn is not None:
            self.line("HITS 2 4 a5")
            self.line(f"PROF 0.010 {len(turn.prompt)} {turn.emitted} 0.000 0.000 0.002 "
                      f"0.003 0.001 {turn.emitted + 1} 1.000 2.000 0 0 0 5.000 0.000 1")

    # ---- input ------------------------------------------------------------------
    def reader(self) -> None:
        stdin = sys.stdin.buffer
        while True:
            raw = stdin.readline()
            if not raw:
                self.commands.put(None)
                return
            fields = raw.decode("utf-8", "replace").split()
            if fields and fields[0] == "SUBMIT" and len(fields) >= 7:
                try:
                    nbytes = int(fields[3])
                    gbytes = int(fields[7]) if len(fields) >= 8 else 0
                except ValueError:
                    self.commands.put(("BAD", fields, b""))
                    continue
                body = stdin.read(nbytes + gbytes)
                term = stdin.read(1)
                if len(body) < nbytes + gbytes:
                    self.commands.put(None)
                    return
                kind = "SUBMIT" if term == b"\n" else "BADFRAME"
                self.commands.put((kind, fields, body[:nbytes]))
                if kind == "BADFRAME":
                    self.commands.put(None)
                    return
            else:
                self.commands.put(("CTL", fields, b""))

    def handle(self, kind: str, fields: list[str], payload: bytes) -> None:
        if kind == "BAD":
            self.line("ERROR 0 BAD_REQUEST")
        elif kind == "BADFRAME":
            self.line(f"ERROR {fields[1]} BAD_FRAME")
        elif kind == "CTL":
            self.control(fields)
        else:
            self.submit(fields, payload)

    def control(self, fields: list[str]) -> None:
        if len(fields) != 2 or fields[0] not in ("STOP", "CANCEL") or not fields[1].isdigit():
            self.line("ERROR 0 BAD_REQUEST")
            return
        rid = int(fields[1])
        for slot, req in list(self.active.items()):
            if req.rid == rid:
                del self.active[slot]
                if fields[0] == "CANCEL":
                    self.line(f"ERROR {rid} CANCELLED")
                else:
                    self.finish(req, False)
                return
        self.line(f"ERROR {rid} NOT_FOUND")

    def submit(self, fields: list[str], payload: bytes) -> None:
        rid, slot, max_tokens = int(fields[1]), int(fields[2]), int(fields[4])
        ext: dict[str, int] = {}
        for token in fields[8:]:
            key, _, value = token.partition("=")
            ext[key] = int(value)
        if slot >= self.slots or b"\0" in payload:
            self.line(f"ERROR {rid} BAD_REQUEST")
            return
        if slot in self.active:
            self.line(f"ERROR {rid} SLOT_BUSY")
            return
        if not payload:
            self.line(f"ERROR {rid} EMPTY_PROMPT")
            return
        if len(payload) > self.ctx - 2:
            self.line(f"ERROR {rid} CONTEXT_EXCEEDED {len(payload)} {self.ctx - 2}")
            return
        text = payload.decode("utf-8", "replace")
        found = DIRECTIVE.findall(text)
        name, arg = found[-1] if found else ("hello", "")
        script = list(SCRIPTS.get(name, SCRIPTS["hello"]))
        delay = 0.0
        if name == "dieearly":
            os._exit(3)
        if name == "hold":
            delay = int(arg or "1") * 0.01
        if name == "seed":
            script = [f"seed={ext['seed']}" if "seed" in ext else "seed=none"]
        if name == "echo":
            # The rendered prompt with markers defused, so tests can pin the template bytes.
            shown = text.replace("<", "\u2039")
            script = [shown[i:i + 24] for i in range(0, len(shown), 24)]
        if name == "header":
            # The SUBMIT header as received (without the id, which depends on test order).
            script = [" ".join(fields[2:])]
        if name == "noise":
            # Unknown kinds and advisory telemetry in the middle of a turn.
            self.line("FUTURE_KIND 1 2 3")
            self.line(f"TOPK {rid} 2 -0.100000 4869 -0.200000 6c6c")
            self.line(f"PERF {rid} 0.100000 0.000000 0.000000 0.000000 0.000000 0.000000 "
                      "0.000000")
            self.line("REPIN 1 2 0 0")
            self.line("ENTROPY 1.500 2.500")
            self.line("GPUS 1 1.500 24.000 7")
        if name == "fault":
            self.line(f"ERROR {rid} ENGINE_FAULT")
            return
        room = self.ctx - len(payload) - 1
        req = Request(rid, slot, payload, max_tokens, ext, [s.encode() for s in script],
                      min(max_tokens, room), delay)
        if name == "die":
            req.die_after = 1
        if name == "gate":
            req.gate = f"{os.environ.get('FAKE_GATE', '/nonexistent')}.{arg or '0'}"
        self.line(f"ACCEPT {rid} {len(payload)}")
        k = ext.get("logprobs", 0)
        if k:
            for pos in range(len(payload)):
                tail = " nan 0" if pos == 0 else self.tail(payload[pos], pos, k)
                self.payload_frame(f"ECHO {rid} 1 {pos}{tail}", payload[pos:pos + 1])
        if name == "prefill":
            time.sleep(int(arg or "1") * 0.1)  # a slow prefill happens after ACCEPT
        self.active[slot] = req
        if not req.tokens or req.maximum <= 0:
            del self.active[slot]
            self.finish(req, req.maximum <= 0 and bool(req.tokens))

    @staticmethod
    def tail(token_id: int, index: int, k: int) -> str:
        lp = -0.125 * (index % 8 + 1)
        cands = [((token_id + 1) % 256, lp - 1.5), (token_id, lp)]
        cands += [((token_id + 2 + j) % 256, lp - 2.0 - j) for j in range(max(0, k - 2))]
        cands = cands[:k]
        return f" {lp:.6f} {k}" + "".join(f" {i} {v:.6f}" for i, v in cands)

    def step(self) -> None:
        if not self.active:
            return
        time.sleep(max(r.delay_s for r in self.active.values()))
        if all(r.gate and not os.path.exists(r.gate) for r in self.active.values()):
            time.sleep(0.01)  # every active request waits for its gate file
            return
        for slot in sorted(self.active):
            req = self.active[slot]
            if req.gate and not os.path.exists(req.gate):
                continue
            token = req.tokens[req.emitted]
            k = req.ext.get("logprobs", 0)
            tail = self.tail(token[0] if token else 0, req.emitted, k) if k else ""
            if k and req.tokens == MALFORMED_TOKENS:
                tail = " -0.5 2 7"  # a count that does not match its table
            self.payload_frame(f"DATA {req.rid} {len(token)}{tail}", token)
            req.emitted += 1
            if req.die_after is not None and req.emitted >= req.die_after:
                os._exit(3)
            if req.emitted >= len(req.tokens):
                del self.active[slot]
                self.finish(req, False)
            elif req.emitted >= req.maximum:
                del self.active[slot]
                self.finish(req, True)

    def finish(self, req: Request, length_limited: bool) -> None:
        self.telemetry(req)
        self.line(f"DONE {req.rid} STAT {req.emitted} 100.00 50.0 0.10 {len(req.prompt)} "
                  f"{int(length_limited)}")

    def run(self) -> int:
        delay = float(os.environ.get("FAKE_START_DELAY_S", "0"))
        self.line("== fake colibri engine ==")
        time.sleep(delay)
        OUT.write(b"\x01\x01READY\x01\x01\n")
        caps = os.environ.get("FAKE_CAPS")
        if caps:
            self.line(f"CAPS {caps}")
        self.line("STAT 0 0.00 0.0 0.10")
        self.telemetry(None)
        threading.Thread(target=self.reader, daemon=True).start()
        while True:
            if not self.active and not self.eof:
                cmd = self.commands.get()
                if cmd is None:
                    self.eof = True
                else:
                    self.handle(*cmd)
            while not self.eof:
                try:
                    nxt = self.commands.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self.eof = True
                else:
                    self.handle(*nxt)
            if self.eof and not self.active:
                return 0
            self.step()

if __name__ == "__main__":
    sys.exit(Engine().run())
