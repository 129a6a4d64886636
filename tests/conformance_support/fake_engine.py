"""A scripted engine double speaking the mux protocol, for the conformance suite's own tests.

It follows colibri's validation order, frame formats, slot interleaving, STOP/CANCEL and EOF
rules, with a toy "model": the next-token logits are a hash of the token history, so prefix
reuse and batching can never change a token, exactly like a correct engine. Token t's text is
one letter. Run: ``python fake_engine.py`` with SNAP/SERVE/SERVE_BATCH/KV_SLOTS/CTX set.
"""

from __future__ import annotations

import math
import os
import select
import sys
from pathlib import Path

VOCAB = 256
OUT = sys.stdout.buffer


def emit(data: bytes) -> None:
    OUT.write(data)
    OUT.flush()


def logits(history: list[int]) -> list[float]:
    state = 7
    for token in history:
        state = (state * 31 + token + 1) % 1_000_003
    return [float((state * (j + 3) * 2654435761 >> 7) % 997) / 97.0 for j in range(VOCAB)]


def log_softmax(row: list[float]) -> list[float]:
    top = max(row)
    total = math.log(sum(math.exp(v - top) for v in row)) + top
    return [v - total for v in row]


def tail(row: list[float], chosen: int, k: int) -> str:
    lps = log_softmax(row)
    best = sorted(range(VOCAB), key=lambda j: (-row[j], j))[:k]
    return f" {lps[chosen]:.6f} {k}" + "".join(f" {j} {lps[j]:.6f}" for j in best)


def text_of(token: int) -> bytes:
    return bytes([97 + token % 26])


class Engine:
    def __init__(self) -> None:
        self.slots = int(os.environ.get("KV_SLOTS", "1"))
        self.ctx = int(os.environ.get("CTX", "4096"))
        self.persist = os.environ.get("COLI_PERSIST", "1") not in ("0", "false", "off")
        self.state = Path(os.environ.get("COLI_STATE_DIR") or os.environ.get("SNAP", "."))
        self.ids = True
        self.hist: list[list[int]] = [[] for _ in range(self.slots)]
        self.active: dict[int, dict[str, object]] = {}  # slot -> request
        self.buf = b""
        self.eof = False
        if self.persist:
            for slot in range(self.slots):
                path = self._kv(slot)
                if path.exists():
                    self.hist[slot] = [int(t) for t in path.read_text().split()]

    def _kv(self, slot: int) -> Path:
        return self.state / (".coli_kv" if slot == 0 else f".coli_kv.{slot}")

    def save(self, slot: int) -> None:
        if self.persist:
            self._kv(slot).write_text(" ".join(map(str, self.hist[slot])))

    # -- input ----------------------------------------------------------------------------
    def fill(self, block: bool) -> bool:
        if not block and not select.select([0], [], [], 0)[0]:
            return False
        chunk = os.read(0, 65536)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def line(self) -> bytes | None:
        while b"\n" not in self.buf:
            if self.eof or not self.fill(True):
                return None
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def exact(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if self.eof or not self.fill(True):
                return None
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def command(self) -> None:
        line = self.line()
        if line is None:
            self.eof = True
            return
        text = line.decode("latin-1")
        for verb in ("STOP ", "CANCEL "):
            if text.startswith(verb):
                arg = text[len(verb) :]
                if not arg.isdigit() or int(arg) == 0:
                    emit(b"ERROR 0 BAD_REQUEST\n")
                    return
                rid = int(arg)
                slot = next((s for s, r in self.active.items() if r["id"] == rid), None)
                if slot is None:
                    emit(f"ERROR {rid} NOT_FOUND\n".encode())
                elif verb == "STOP ":
                    self.done(slot, 0)
                else:
                    self.save(slot)
                    del self.active[slot]
                    emit(f"ERROR {rid} CANCELLED\n".encode())
                return
        self.submit(text)

    def submit(self, text: str) -> None:
        parts = text.split(" ")
        ext: dict[str, int] = {}
        try:
            if not (parts[0] == "SUBMIT" and len(parts) >= 7 and all(parts[1:])):
                raise ValueError
            rid, slot, nbytes, max_tokens = (int(p) for p in parts[1:5])
            temp, top_p = float(parts[5]), float(parts[6])
            gbytes = int(parts[7]) if len(parts) > 7 else 0
            for token in parts[8:]:
                key, _, value = token.partition("=")
                if key in ext or key not in ("logprobs", "ids", "pin") or not value.isdigit():
                    raise ValueError
                ext[key] = int(value)
                if ext[key] > 32:
                    raise ValueError
            if rid <= 0 or slot < 0 or not 0 <= nbytes <= 1 << 24 or not 0 <= gbytes <= 1 << 20:
                raise ValueError
            if not (max_tokens >= 1 or (max_tokens == 0 and ext.get("logprobs", 0) > 0)):
                raise ValueError
            if not (0 <= temp <= 2 and 0 < top_p <= 1):
                raise ValueError
        except ValueError:
            emit(b"ERROR 0 BAD_REQUEST\n")
            return
        body = self.exact(nbytes + gbytes)
        end = self.exact(1) if body is not None else None
        if body is None or end is None:
            self.eof = True
            return
        if end != b"\n":
            emit(f"ERROR {rid} BAD_FRAME\n".encode())
            self.eof = True
            return
        payload = body[:nbytes]
        if slot >= self.slots or b"\x00" in payload:
            emit(f"ERROR {rid} BAD_REQUEST\n".encode())
            return
        if slot in self.active:
            emit(f"ERROR {rid} SLOT_BUSY\n".encode())
            return
        if any(r["id"] == rid for r in self.active.values()):
            emit(f"ERROR {rid} DUPLICATE_ID\n".encode())
            return
        if ext.get("ids"):
            try:
                ids = [int(t) for t in payload.split()]
                if any(not 0 <= t < VOCAB for t in ids):
                    raise ValueError
            except ValueError:
                emit(f"ERROR {rid} BAD_REQUEST\n".encode())
                return
        else:
            ids = list(payload)
        if not ids:
            emit(f"ERROR {rid} EMPTY_PROMPT\n".encode())
            return
        if len(ids) > self.ctx - 2:
            emit(f"ERROR {rid} CONTEXT_EXCEEDED {len(ids)} {self.ctx - 2}\n".encode())
            return
        k = ext.get("logprobs", 0)
        emit(f"ACCEPT {rid} {len(ids)}\n".encode())
        if k:
            for pos, token in enumerate(ids):
                t = " nan 0" if pos == 0 else tail(logits(ids[:pos]), token, k)
                data = text_of(token)
                emit(f"ECHO {rid} {len(data)} {pos}{t}\n".encode() + data + b"\n")
        self.hist[slot] = list(ids)
        room = self.ctx - len(ids) - 1
        self.active[slot] = {
            "id": rid,
            "max": min(max_tokens, room),
            "k": k,
            "emitted": 0,
            "prompt": len(ids),
        }
        if self.active[slot]["max"] <= 0:  # type: ignore[operator]
            self.done(slot, 1)
            return
        self.step_one(slot)

    # -- decode ---------------------------------------------------------------------------
    def step_one(self, slot: int) -> None:
        req = self.active[slot]
        row = logits(self.hist[slot])
        token = max(range(VOCAB), key=lambda j: (row[j], -j))
        if token == 0:
            self.done(slot, 0)
            return
        self.hist[slot].append(token)
        data = text_of(token)
        t = tail(row, token, int(req["k"])) if req["k"] else ""  # type: ignore[call-overload]
        emit(f"DATA {req['id']} {len(data)}{t}\n".encode() + data + b"\n")
        req["emitted"] = int(req["emitted"]) + 1  # type: ignore[call-overload]
        if int(req["emitted"]) >= int(req["max"]):  # type: ignore[call-overload]
            self.done(slot, 1)

    def done(self, slot: int, limited: int) -> None:
        req = self.active.pop(slot)
        self.save(slot)
        emit(
            b"HWINFO 2 1.0 1.0 0 0.0 fake cpu|\nTIERS 0 0 8 0.00 0.00\nEMAP 1 8 0000000000000000\n"
        )
        emit(b"HITS 1 8 00\nPROF 0.001 1 1 0.000 0.000 0.000 0.000 0.000 1\n")
        emit(
            f"DONE {req['id']} STAT {req['emitted']} 1.00 0.0 0.01 "
            f"{req['prompt']} {limited}\n".encode()
        )

    def run(self) -> int:
        emit(b"== fake engine ==\n\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 0.01\n")
        emit(b"CAPS logprobs=1 ids=1 persist=1\n")
        emit(
            b"HWINFO 2 1.0 1.0 0 0.0 fake cpu|\nTIERS 0 0 8 0.00 0.00\nEMAP 1 8 0000000000000000\n"
        )
        while True:
            if not self.eof:
                if self.active:
                    if self.buf or self.fill(False):
                        self.command()
                else:
                    self.command()
            if self.eof and not self.active:
                return 0
            for slot in sorted(self.active):
                self.step_one(slot)


if __name__ == "__main__":
    sys.exit(Engine().run())
