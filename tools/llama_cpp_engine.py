"""llama.cpp behind colibri's mux protocol (spec/protocol.md §2), so that the conformance
suite's golden cases judge llama.cpp on a fixture model the way they judge colibri's engines.

llama.cpp is a conformance target, never a dependency: this script runs in an interpreter with
llama-cpp-python (and numpy), imports nothing of colibri, and serves a GGUF that
``tools/llama_cpp_gguf.py`` made with llama.cpp's own converter::

    PEER=/work/peer/venv/bin/python
    .venv/bin/python tools/llama_cpp_gguf.py --sdist llama_cpp_python-0.3.36.tar.gz \\
        --python $PEER --model fixtures/models/olmoe-tiny --out /tmp/olmoe-tiny.gguf --ftype f32
    colibri conformance protocol --model fixtures/models/olmoe-tiny --cases 'protocol.golden.*' \\
        --engine-cmd "$PEER tools/llama_cpp_engine.py --gguf /tmp/olmoe-tiny.gguf"

What it serves is what the golden cases need, and CAPS says exactly that: token-id payloads
(``ids=1``; DATA and ECHO payloads are `` <id>``, the form of a model without tokenizer, so
llama.cpp's detokenizer is not what is judged), greedy decoding (temperature 0: colibri's
sampler and RNG are not llama.cpp's, so a sampled request is refused with BAD_REQUEST), the
logprob tails of the raw logit rows (float64 log-softmax, colibri's slot-order table) and
ECHO frames. One request at a time, decoded to its end before the next command is read, so
nothing is ever active when a STOP or CANCEL arrives. No KV reuse, no telemetry block, no
grammar. A stop token is llama.cpp's end-of-generation set for the GGUF (``token_is_eog``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Any, BinaryIO

import numpy as np

MAX_LINE = 4096
MAX_PAYLOAD = 16 * 1024 * 1024
MAX_GRAMMAR = 1024 * 1024
MAX_TOP = 32
EXTENSIONS = {"logprobs": 32, "ids": 1, "pin": 1, "seed": 2**64 - 1, "echo_at": MAX_PAYLOAD}
REQ_UINT = re.compile(rb"[0-9]{1,20}")
REQ_FLOAT = re.compile(rb"[+-]?([0-9]+(\.[0-9]+)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
EXTENSION = re.compile(rb"([a-z_]{1,15})=([0-9]{1,20})")
#: llama.cpp keeps its KV cache in f16 unless told otherwise; colibri's KV is float32
#: (spec/model.md), and f16 keys and values alone move a tiny fixture's logits by ~4e-4,
#: past the golden tolerance, so f32 is the default: the comparison is of the model math.
#: ggml's type ids (GGML_TYPE_F32, GGML_TYPE_F16); llama_cpp is imported only to serve, so
#: the protocol side of this file loads (and is tested) without it.
KV_TYPES = {"f32": 0, "f16": 1}


class Refused(Exception):
    """A SUBMIT answered with ``ERROR <id> <code>``."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def write(out: BinaryIO, line: str, payload: bytes | None = None) -> None:
    """One protocol line (and its payload) in a single write, flushed (spec/protocol.md §1)."""
    data = line.encode() + b"\n"
    if payload is not None:
        data += payload + b"\n"
    out.write(data)
    out.flush()


def top_k_table(row: np.ndarray, k: int) -> list[int]:
    """colibri's slot order (spec/protocol.md §2.5): the first k ids fill the slots, then a
    logit strictly larger than the smallest slot value replaces the first such minimum."""
    ids = list(range(k))
    values = [float(row[i]) for i in ids]
    for token in range(k, row.size):
        value = float(row[token])
        slot = min(range(k), key=values.__getitem__)
        if value > values[slot]:
            ids[slot], values[slot] = token, value
    return ids


def tail(row: np.ndarray, token: int, k: int) -> str:
    """`` <lp> <k>( <token> <lp>)×k`` of one raw logit row, in float64."""
    row64 = row.astype(np.float64)
    peak = float(row64.max())
    log_z = peak + math.log(float(np.exp(row64 - peak).sum()))
    k = min(k, MAX_TOP, row.size)
    table = "".join(f" {i} {row64[i] - log_z:.6f}" for i in top_k_table(row64, k))
    return f" {row64[token] - log_z:.6f} {k}{table}"


class Engine:
    def __init__(self, gguf: str, slots: int, ctx: int, threads: int, kv_type: str) -> None:
        import llama_cpp

        kv = KV_TYPES[kv_type]
        self.llm = llama_cpp.Llama(model_path=gguf, n_ctx=ctx, logits_all=True, n_threads=threads,
                         type_k=kv, type_v=kv, verbose=False)
        self.slots = slots
        self.ctx = ctx
        self.vocab = self.llm.n_vocab()
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.stops = {t for t in range(self.vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}

    def caps(self) -> str:
        return (f"CAPS proto=1 accept=1 stop=1 logprobs={MAX_TOP} echo=1 echo_at=0 ids=1 "
                f"seed=0 grammar=0 topk=0 hits_every=0 slots={self.slots} ctx={self.ctx} "
                f"vocab={self.vocab} tokenizer=0 mtp=0")

    def check(self, slot: int, max_tokens: int, temperature: float, top_p: float,
              ext: dict[str, int], payload: bytes) -> list[int]:
        """Steps 9 and 12-14 of spec/protocol.md §2.3; the prompt's ids."""
        logprobs = ext.get("logprobs", 0)
        if (slot >= self.slots or max_tokens > 2**31 - 1 or not 0 <= temperature <= 2
                or not 0 < top_p <= 1 or (max_tokens == 0 and logprobs == 0)
                or ext.get("echo_at", 0) > 0 or b"\0" in payload):
            raise Refused("BAD_REQUEST")
        if temperature != 0 or ext.get("ids", 0) != 1:
            raise Refused("BAD_REQUEST")  # no colibri sampler, no text payloads (see above)
        try:
            ids = [int(word) for word in payload.split()]
        except ValueError:
            raise Refused("BAD_REQUEST") from None
        if any(not 0 <= i < self.vocab for i in ids):
            raise Refused("BAD_REQUEST")
        if not ids:
            raise Refused("EMPTY_PROMPT")
        if len(ids) > self.ctx - 2:
            raise Refused(f"CONTEXT_EXCEEDED {len(ids)} {self.ctx - 2}")
        return ids

    def serve(self, out: BinaryIO, rid: int, prompt: list[int], max_tokens: int,
              logprobs: int) -> None:
        write(out, f"ACCEPT {rid} {len(prompt)}")
        self.llm.reset()
        self.llm.eval(prompt)
        scores: Any = self.llm.scores
        if logprobs > 0:
            write(out, f"ECHO {rid} {len(f' {prompt[0]}')} 0 nan 0", f" {prompt[0]}".encode())
            for pos in range(1, len(prompt)):
                piece = f" {prompt[pos]}".encode()
                write(out, f"ECHO {rid} {len(piece)} {pos}"
                      f"{tail(scores[pos - 1], prompt[pos], logprobs)}", piece)
        maximum = min(max_tokens, self.ctx - len(prompt) - 1)
        emitted, limited = 0, maximum <= 0
        while not limited:
            row = np.asarray(scores[self.llm.n_tokens - 1])
            token = int(np.argmax(row))  # the first maximum, as colibri's greedy pick
            if token in self.stops:
                break
            piece = f" {token}".encode()
            extra = tail(row, token, logprobs) if logprobs > 0 else ""
            write(out, f"DATA {rid} {len(piece)}{extra}", piece)
            emitted += 1
            limited = emitted >= maximum
            if not limited:
                self.llm.eval([token])
        write(out, f"DONE {rid} STAT {emitted} 0.00 0.0 0.00 {len(prompt)} {int(limited)}")


def submit_header(line: bytes) -> tuple[list[int], float, float, int, dict[str, int]] | None:
    """A SUBMIT header's numbers, or None when it cannot be framed (§2.3 step 6)."""
    fields = line.split(b" ")
    if fields[0] != b"SUBMIT" or not 7 <= len(fields) <= 13:
        return None
    head, rest = fields[1:5], fields[7:]
    if not all(REQ_UINT.fullmatch(f) for f in head) or not all(
            REQ_FLOAT.fullmatch(f) for f in fields[5:7]):
        return None
    gbytes = 0
    if rest and REQ_UINT.fullmatch(rest[0]):
        gbytes, rest = int(rest[0]), rest[1:]
    ext: dict[str, int] = {}
    for item in rest:
        match = EXTENSION.fullmatch(item)
        if match is None:
            return None
        key, value = match.group(1).decode(), int(match.group(2))
        if key not in EXTENSIONS or key in ext or value > EXTENSIONS[key]:
            ext["invalid"] = 1
        ext[key] = value
    numbers = [int(f) for f in head]
    if numbers[2] > MAX_PAYLOAD or gbytes > MAX_GRAMMAR:
        return None
    return numbers, float(fields[5]), float(fields[6]), gbytes, ext


def run(engine: Engine, stdin: BinaryIO, out: BinaryIO) -> None:
    while True:
        line = stdin.readline(MAX_LINE + 1)
        if not line:
            return
        if not line.endswith(b"\n"):
            if len(line) > MAX_LINE:
                while (rest := stdin.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                    pass
                write(out, "ERROR 0 BAD_REQUEST")
                continue
            return  # EOF inside a line
        line = line[:-1]
        verb, _, rid_text = line.partition(b" ")
        if verb in (b"STOP", b"CANCEL"):
            ok = REQ_UINT.fullmatch(rid_text) and 0 < int(rid_text) < 2**64
            write(out, f"ERROR {int(rid_text)} NOT_FOUND" if ok else "ERROR 0 BAD_REQUEST")
            continue
        header = submit_header(line)
        if header is None:
            write(out, "ERROR 0 BAD_REQUEST")
            continue
        (rid, slot, size, max_tokens), temperature, top_p, gbytes, ext = header
        body = stdin.read(size + gbytes + 1)
        if len(body) < size + gbytes + 1:
            return
        shown = rid if 0 < rid < 2**64 else 0
        if body[-1:] != b"\n":
            write(out, f"ERROR {shown} BAD_FRAME")
            return
        try:
            if shown == 0 or "invalid" in ext or b"\0" in body[size:-1]:
                raise Refused("BAD_REQUEST")
            prompt = engine.check(slot, max_tokens, temperature, top_p, ext, body[:size])
        except Refused as refused:
            write(out, f"ERROR {shown} {refused.code}")
            continue
        engine.serve(out, rid, prompt, max_tokens, ext.get("logprobs", 0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True, help="the model as llama.cpp's GGUF")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kv-type", choices=sorted(KV_TYPES), default="f32",
                        help="llama.cpp's KV cache type (default f32, as colibri's KV)")
    args = parser.parse_args()
    slots = int(os.environ.get("KV_SLOTS", "1"))
    ctx = int(os.environ.get("CTX", "4096"))
    try:
        engine = Engine(args.gguf, slots, ctx, args.threads, args.kv_type)
    except ValueError as exc:  # llama.cpp's loader refused the file (its reason is on stderr)
        print(f"llama_cpp_engine: {exc}", file=sys.stderr)
        return 1
    out = sys.stdout.buffer
    write(out, f"== llama.cpp via llama-cpp-python on {os.path.basename(args.gguf)} ==")
    out.write(b"\x01\x01READY\x01\x01\n")
    write(out, "STAT 0 0.00 0.0 0.00")
    write(out, engine.caps())
    run(engine, sys.stdin.buffer, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
