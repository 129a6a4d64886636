"""Bench section ``grammar``: the per-token cost of constrained decoding as a ratio of the
decode step, with the mask computed on the sampling thread and overlapped with
the forward (``colibri.engine.mask_overlap``), side by side in one run.

The per-token figure is measured on the loop's own thread (``MuxEngine.grammar_seconds``:
applying the mask, consuming the token, waiting for the mask worker), over tokens; the
ratio divides it by the decode step. The wall difference with the plain run is reported too.

The mux loop (what ``colibri engine`` runs) decodes one greedy request of ``tokens`` tokens
three ways on the same model and prompt: without a grammar, under a JSON Schema with masks
inline (``COLI_GRAMMAR_OVERLAP=0``), and overlapped (the default). The schema is an array of
at least 200 ``{name, age}`` objects, so no run ends before its budget. Each mode's time is
its minimum over ``REPEATS`` runs, modes interleaved per round (a burst of load on a shared machine
then hits all alike). The decode step is the plain runs' least time inside the forward per token.
``mask_us`` is the matcher alone (a walk over the same grammar, no model), for
scale. Models: the embedded default (its own tokenizer); with ``--model`` that model too,
where a model without a tokenizer borrows the default's, its ids past the default's
vocabulary spelled as filler words (so the mask spans the model's vocabulary), which the
entry says.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from colibri.benchmarks import BenchOptions, Section, register
from colibri.protocol.records import Submit, SubmitRequest

SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 200,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
}
PROMPT = b"[gMASK]<sop><|user|>List people.<|assistant|><think></think>"
MODES = ("plain", "inline", "overlapped")
REPEATS = 3


class _PaddedTokenizer:
    """The default model's tokenizer over a larger vocabulary: ids past it are filler words
    ``w<id>`` (so the mask spans the model's whole vocabulary, as a real tokenizer's would)."""

    def __init__(self, inner: Any, known: int) -> None:
        self.inner = inner
        self.known = known

    def encode(self, text: str) -> list[int]:
        out: list[int] = self.inner.encode(text)
        return out

    def token_bytes(self, token_id: int) -> bytes:
        if token_id >= self.known:
            return f"w{token_id}".encode()
        data: bytes = self.inner.token_bytes(token_id)
        return data

    def token_to_id(self, token: str) -> int | None:
        found: int | None = self.inner.token_to_id(token)
        return found

    @property
    def special_ids(self) -> frozenset[int]:
        ids: frozenset[int] = self.inner.special_ids
        return ids


def _tokenizer(model_dir: Path) -> tuple[Any, bool]:
    """The model's tokenizer, or the default model's padded to this vocabulary (True:
    borrowed)."""
    from colibri import resources
    from colibri.text.tokenizer import Tokenizer

    own = model_dir / "tokenizer.json"
    if own.is_file():
        return Tokenizer.from_file(own), False
    default = resources.default_model_dir()
    return _PaddedTokenizer(Tokenizer.from_file(default / "tokenizer.json"), _vocab(default)), True


def _one_run(backend_name: str, model_dir: Path, tokenizer: Any, mode: str,
             tokens: int) -> tuple[float, float, int, float]:
    """(wall seconds of the loop, seconds inside decode forwards, decode steps, seconds the
    loop's thread spent on the grammar)."""
    from colibri.engine.main import build_runtime
    from colibri.engine.mux import MuxEngine
    from colibri.engine.registry import BackendOptions, open_backend
    from colibri.engine.settings import from_environment
    from colibri.engine.wire_input import BytesSource
    from colibri.engine.wire_output import FrameWriter

    env = {"COLI_PERSIST": "0", "DRAFT": "0",
           "COLI_GRAMMAR_OVERLAP": "0" if mode == "inline" else "1"}
    log = io.StringIO()
    settings = from_environment(env, model_dir=model_dir, kv_slots=1, ctx=tokens + 64)
    backend = open_backend(backend_name, model_dir, BackendOptions(), log)
    runtime = build_runtime(settings, env, log, backend=backend, tokenizer=tokenizer,
                            ignore_stops=mode == "plain")
    grammar = b"" if mode == "plain" else json.dumps(SCHEMA).encode()
    script = Submit(1, SubmitRequest(0, PROMPT, tokens, 0.0, 1.0, grammar)).encode()
    engine = MuxEngine(runtime, BytesSource(script), FrameWriter(io.BytesIO()))
    started = time.perf_counter()
    engine.run()
    wall = time.perf_counter() - started
    forward = sum(seconds for _, seconds in engine.step_log)
    return wall, forward, engine.steps, engine.grammar_seconds


def mask_us_per_token(tokenizer: Any, vocab: int, tokens: int) -> float:
    """The matcher alone: mean µs per mask along a walk through the schema's language."""
    from colibri.engine.constraint import build_vocabulary

    stop = tokenizer.token_to_id("<|endoftext|>")
    vocabulary = build_vocabulary(tokenizer, vocab, [stop] if stop is not None else [])
    matcher = vocabulary.matcher(json.dumps(SCHEMA))
    started = time.perf_counter()
    for _ in range(tokens):
        allowed = np.flatnonzero(matcher.allowed())
        matcher.consume(int(allowed[len(allowed) // 2]))
    return 1e6 * (time.perf_counter() - started) / tokens


def measure(backend_name: str, model_dir: Path, tokens: int) -> dict[str, Any]:
    tokenizer, borrowed = _tokenizer(model_dir)
    _one_run(backend_name, model_dir, tokenizer, "overlapped", 8)  # imports, caches
    runs: dict[str, list[tuple[float, float, int, float]]] = {mode: [] for mode in MODES}
    for _ in range(REPEATS):
        for mode in MODES:
            runs[mode].append(_one_run(backend_name, model_dir, tokenizer, mode, tokens))
    # Each figure is its own minimum over the repeats: the least disturbed measurement.
    wall = {mode: min(r[0] for r in runs[mode]) for mode in MODES}
    steps = {mode: runs[mode][0][2] for mode in MODES}
    step_us = 1e6 * min(r[1] / max(r[2], 1) for r in runs["plain"])
    entry: dict[str, Any] = {
        "backend": backend_name,
        "model": model_dir.name,
        "tokenizer": "the default model's, ids past it filler words" if borrowed
                     else "the model's",
        "tokens": tokens,
        "decode_step_us": step_us,
        "mask_us": min(mask_us_per_token(tokenizer, _vocab(model_dir), tokens)
                       for _ in range(REPEATS)),
    }
    for mode in MODES:
        entry[f"{mode}_us_per_token"] = 1e6 * wall[mode] / tokens
        entry[f"{mode}_decode_steps"] = steps[mode]
    for mode in ("inline", "overlapped"):
        # Measured on the loop's thread: masking, consuming and waiting for the worker.
        exposed_us = 1e6 * min(r[3] for r in runs[mode]) / tokens
        entry[f"{mode}_grammar_us_per_token"] = exposed_us
        entry[f"{mode}_grammar_over_decode_step"] = exposed_us / step_us if step_us else None
        # The same seen end to end (noisier: the difference of two walls).
        entry[f"{mode}_wall_overhead_us_per_token"] = 1e6 * (wall[mode] - wall["plain"]) / tokens
    return entry


def _vocab(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    return int(config["vocab_size"])


def run(options: BenchOptions) -> dict[str, Any]:
    from colibri import resources
    from colibri.engine.registry import BackendUnavailable, check_available

    tokens = max(options.tokens, 1) * 8
    models = [resources.default_model_dir()]
    if options.model is not None and options.model.resolve() != models[0].resolve():
        models.append(options.model)
    result: dict[str, Any] = {
        "method": "mux loop, one greedy request; grammar time on the loop's thread "
                  "(mask, consume, wait for the worker) per token, ratio over the decode step "
                  "(forward time per token, plain run); minimum of 3 runs each, modes interleaved",
        "schema": "array of >= 200 {name <= 12 chars, age 0..120} objects",
        "runs": [],
    }
    for backend_name in ("reference", "accelerated"):
        try:
            check_available(backend_name)
            for model_dir in models:
                result["runs"].append(measure(backend_name, model_dir, tokens))
        except BackendUnavailable as exc:
            result["runs"].append({"backend": backend_name, "skipped": str(exc)})
        except Exception as exc:  # e.g. the accelerated C library not built
            result["runs"].append({"backend": backend_name, "error": str(exc)})
    return result


register(
    Section(
        name="grammar",
        engines=("reference", "accelerated"),
        description="constrained decoding: mask overhead per token over the decode step, "
                    "inline vs overlapped with the forward",
        run=run,
    )
)
