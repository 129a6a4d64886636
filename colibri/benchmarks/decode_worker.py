"""The decode worker: greedy decoding of one or more engines, timed the same way for each.

Engines (:func:`open_engine`: one adapter each, the same three calls, ``new_state``,
``prefill`` and ``step``):

* ``reference`` / ``accelerated``: colibri's models (``load_model``); a step takes several
  rows, and reports the experts each row chose (the parent turns them into weight bytes);
* ``backend``: any colibri backend through the engine seam (``Backend.step``), on a
  ``device`` with a VRAM expert budget ``vram_bytes`` (the GPU bench);
* ``hf``: HF transformers eager float32, one row;
* ``llama_cpp``: a GGUF through llama-cpp-python, one row; token ids go in directly (the
  bench model has no tokenizer, and ids keep both engines on the same prompt).

Programs, each a ``workers.call`` target returning plain JSON:

* :func:`alone`: one engine: load, then ``warmup`` + ``tokens`` greedy steps after the prompt
  (the first ``warmup`` reported apart: they fault in experts never used before), optionally
  ``batch`` rows stepped together and the prefill timings;
* :func:`turns`: engines (and bandwidth probes) taking turns in one process for ``rounds``
  rounds, so a shared machine's changing load hits them alike: the parent takes one ratio per
  round.

Only the standard library is imported at the top: a peer's interpreter (torch, or llama_cpp,
without colibri) runs the HF and llama.cpp engines from this file alone.
"""

from __future__ import annotations

import importlib
import io
import os
import time
from pathlib import Path
from typing import Any

from colibri.benchmarks.process_memory import rss_bytes

PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
#: Tokens of the longer prompt that prefill throughput is measured on.
PREFILL_TOKENS = 64

#: One step's routes as JSON: [[layer, [expert ids]], ...], row after row.
Routes = list[list[Any]]


def prefill_prompt(vocab_size: int) -> list[int]:
    """PREFILL_TOKENS deterministic ids inside the vocabulary (ids 0 and 1 left out)."""
    return [(37 * i + 11) % (vocab_size - 2) + 2 for i in range(PREFILL_TOKENS)]


def _argmax(row: Any) -> int:
    return int(row.argmax())


# ---------------------------------------------------------------------------------------------
# engines


class _Colibri:
    """colibri's reference or accelerated model (``load_model``)."""

    rows = True

    def __init__(self, spec: dict[str, Any]) -> None:
        if spec["kind"] == "accelerated":
            from colibri.accelerated import load_model as load_accelerated

            self.model: Any = load_accelerated(spec["model"], threads=spec.get("threads"))
        else:
            from colibri.reference import load_model

            self.model = load_model(spec["model"])
        cfg = self.model.config
        self.sparse = [i for i in range(cfg.num_hidden_layers) if cfg.is_sparse(i)]
        self.vocab_size = int(cfg.vocab_size)

    def new_state(self) -> Any:
        return self.model.new_state()

    def prefill(self, state: Any, ids: list[int]) -> Any:
        return self.model.prefill(state, ids)[-1]

    def step(self, states: list[Any], tokens: list[int]) -> tuple[Any, Any]:
        logits, routes = self.model.forward_rows(states, tokens, [True] * len(states))
        return logits, routes

    def routes(self, raw: Any) -> Routes:
        """A step's routes array ([rows, sparse layers, k]) as JSON, row after row (outside
        the timed step)."""
        return [[layer, [int(e) for e in row[j]]] for row in raw
                for j, layer in enumerate(self.sparse)]

    def report(self) -> dict[str, Any]:
        experts = getattr(self.model, "experts", None)
        stats = getattr(experts, "stats", None)
        kernels = getattr(self.model, "kernels", None)
        return {"threads": os.cpu_count(),
                "kernel_threads": None if kernels is None else kernels.threads,
                "store": type(experts).__name__,
                "cache": None if stats is None else {
                    "hits": stats.hits, "misses": stats.misses, "evictions": stats.evictions,
                    "budget_bytes": getattr(experts, "budget_bytes", None)}}


class _Backend:
    """A colibri backend through the engine seam, experts placed on the device first (with a
    VRAM tier, the budget's worth: expert e of every layer before expert e + 1 of any, so every
    step mixes device and host experts as a partial tier does)."""

    rows = True

    def __init__(self, spec: dict[str, Any]) -> None:
        from colibri.engine.backend import sparse_layers, usage_rows
        from colibri.engine.registry import BackendOptions, open_backend

        self.device = spec.get("device")
        vram = int(spec.get("vram_bytes", 0))
        self.log = io.StringIO()
        self.be: Any = open_backend(spec["backend"], Path(spec["model"]), BackendOptions(
            device=self.device, vram_budget_bytes=vram), self.log)
        self.usage_rows = usage_rows(self.be.shape)
        spread = [(layer, e) for e in range(self.be.shape.n_routed_experts)
                  for layer in self.usage_rows]
        self.placed = self.be.tiers.pin(spread, 0) if vram else 0
        self.sparse = sparse_layers(self.be.shape)
        self.vocab_size = int(self.be.shape.vocab_size)

    def new_state(self) -> Any:
        return self.be.new_state()

    def prefill(self, state: Any, ids: list[int]) -> Any:
        from colibri.engine.backend import StepRow

        rows = [StepRow(state, t, i == len(ids) - 1) for i, t in enumerate(ids)]
        return self.be.step(rows).logits[0]

    def step(self, states: list[Any], tokens: list[int]) -> tuple[Any, Any]:
        from colibri.engine.backend import StepRow

        done = self.be.step([StepRow(s, t, True) for s, t in zip(states, tokens, strict=True)])
        return done.logits, done.routes

    routes = _Colibri.routes

    def report(self) -> dict[str, Any]:
        be = self.be
        counts = be.tiers.tier_counts(self.usage_rows, be.shape.n_routed_experts)
        devices = [{"index": d.index, "name": d.name, "memory_bytes": d.memory_bytes,
                    "used_bytes": d.used_bytes, "experts": d.experts} for d in be.devices()]
        return {"backend": be.name, "device": self.device or "cpu", "build": be.build,
                "placed_experts": self.placed, "devices": devices,
                "tiers": {"vram": counts.vram, "ram": counts.ram, "disk": counts.disk,
                          "vram_bytes": counts.vram_bytes, "ram_bytes": counts.ram_bytes},
                "log_tail": self.log.getvalue().splitlines()[-5:]}

    def close(self) -> None:
        self.be.close()


class _HF:
    """HF transformers eager float32 (imported by name: torch need not be installed here)."""

    rows = False

    def __init__(self, spec: dict[str, Any]) -> None:
        self.torch: Any = importlib.import_module("torch")
        self.transformers: Any = importlib.import_module("transformers")
        self.model = self.transformers.AutoModelForCausalLM.from_pretrained(
            str(spec["model"]), dtype=self.torch.float32, attn_implementation="eager")
        self.model.eval()
        self.vocab_size = int(self.model.config.vocab_size)

    def new_state(self) -> dict[str, Any]:
        return {"cache": None}

    def _forward(self, state: dict[str, Any], ids: list[int]) -> Any:
        with self.torch.no_grad():
            kwargs = {} if state["cache"] is None else {"cache": state["cache"]}
            out = self.model(input_ids=self.torch.tensor([ids]), use_cache=True, **kwargs)
        state["cache"] = out.cache
        return out.logits[0]

    def prefill(self, state: dict[str, Any], ids: list[int]) -> Any:
        return self._forward(state, ids)[-1]

    def step(self, states: list[Any], tokens: list[int]) -> tuple[Any, None]:
        return self._forward(states[0], tokens), None

    def report(self) -> dict[str, Any]:
        return {"versions": {"torch": self.torch.__version__,
                             "transformers": self.transformers.__version__},
                "torch_threads": self.torch.get_num_threads()}


class _LlamaCpp:
    """llama.cpp through llama-cpp-python (imported by name). Its one sequence is the context
    itself: a prefill starts it afresh."""

    rows = False

    def __init__(self, spec: dict[str, Any]) -> None:
        self.llama_cpp: Any = importlib.import_module("llama_cpp")
        self.threads = int(spec["threads"])
        self.llm = self.llama_cpp.Llama(
            model_path=str(spec["model"]), n_ctx=int(spec["ctx"]), n_batch=PREFILL_TOKENS,
            n_threads=self.threads, n_threads_batch=self.threads, logits_all=False,
            verbose=False)
        self.vocab_size = int(self.llm.n_vocab())

    def new_state(self) -> None:
        return None

    def _logits(self) -> Any:
        import numpy as np

        # llama-cpp-python 0.3.x fills ``llm.scores`` only with logits_all (which would make
        # llama.cpp compute the lm_head for every prompt row); the context's output row of
        # the last evaluated token is what its own sampler reads.
        return np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(-1), shape=(self.vocab_size,))

    def prefill(self, state: None, ids: list[int]) -> Any:
        self.llm.reset()
        self.llm.eval(ids)
        return self._logits()

    def step(self, states: list[Any], tokens: list[int]) -> tuple[Any, None]:
        self.llm.eval(tokens)
        return [self._logits()], None

    def report(self) -> dict[str, Any]:
        return {"threads": self.threads,
                "version": getattr(self.llama_cpp, "__version__", "?")}


ENGINES: dict[str, Any] = {"reference": _Colibri, "accelerated": _Colibri, "backend": _Backend,
                           "hf": _HF, "llama_cpp": _LlamaCpp}


def open_engine(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The engine ``spec`` names (``kind``, ``model`` and the kind's own keys) and its load:
    seconds, RSS before and after, and for a colibri checkpoint how much of its map is then
    resident (``page_mapping.checkpoint_mapping``)."""
    rss_before = rss_bytes()
    t0 = time.perf_counter()
    engine = ENGINES[spec["kind"]](spec)
    load: dict[str, Any] = {"load_s": time.perf_counter() - t0, "rss_before_load_bytes": rss_before,
                            "rss_after_load_bytes": rss_bytes()}
    if spec["kind"] in ("reference", "accelerated"):
        from colibri.benchmarks.page_mapping import checkpoint_mapping

        load["weights_mapped_after_load"] = checkpoint_mapping(Path(spec["model"]))
    return engine, load


# ---------------------------------------------------------------------------------------------
# programs


class _Lane:
    """``rows`` sequences of one engine stepped together, greedy: one row decodes the prompt;
    several share it and diverge by one token each."""

    def __init__(self, engine: Any, rows: int) -> None:
        self.engine = engine
        prompts = [PROMPT] if rows == 1 else [[*PROMPT, b + 2] for b in range(rows)]
        self.states = [engine.new_state() for _ in prompts]
        self.tokens = [_argmax(engine.prefill(s, p)) for s, p in zip(self.states, prompts,
                                                                      strict=True)]

    def run(self, steps: int) -> tuple[list[float], list[list[int]], list[Routes]]:
        """``steps`` steps: each one's seconds, the tokens it was fed, the routes it chose."""
        seconds: list[float] = []
        fed: list[list[int]] = []
        routes: list[Routes] = []
        for _ in range(steps):
            fed.append(self.tokens)
            t = time.perf_counter()
            logits, chosen = self.engine.step(self.states, self.tokens)
            seconds.append(time.perf_counter() - t)
            if chosen is not None:
                routes.append(self.engine.routes(chosen))
            self.tokens = [_argmax(row) for row in logits]
        return seconds, fed, routes


def _timed_prefills(engine: Any, prompt: list[int], repeats: int) -> list[float]:
    """Seconds to prefill ``prompt`` into a fresh state, ``repeats`` times (weights already
    paged in: the caller decoded first)."""
    times = []
    for _ in range(repeats):
        state = engine.new_state()
        t = time.perf_counter()
        engine.prefill(state, prompt)
        times.append(time.perf_counter() - t)
    return times


def alone(engine: dict[str, Any], tokens: int, warmup: int, batch: int = 0,
          prefill: bool = False, logits_path: str | None = None) -> dict[str, Any]:
    """One engine on its own: ``ids`` (warm-up steps included), ``step_s`` and ``routes`` of
    the timed steps, ``warmup_step_s``; with ``batch`` rows, ``batch_step_s`` and
    ``batch_routes`` of ``max(1, tokens // 2)`` steps after ``warmup``; with ``prefill``,
    ``ttft_s`` (the prompt, 3 times) and ``prefill_s`` (PREFILL_TOKENS, twice); with
    ``logits_path``, the prompt's last logits saved there (numpy)."""
    opened, out = open_engine(engine)
    try:
        lane = _Lane(opened, 1)
        if logits_path is not None:
            import numpy as np

            np.save(logits_path, opened.prefill(opened.new_state(), PROMPT))
        seconds, fed, routes = lane.run(warmup + tokens)
        out.update(ids=[row[0] for row in fed], step_s=seconds[warmup:],
                   warmup_step_s=seconds[:warmup], routes=routes[warmup:])
        if batch and opened.rows:
            seconds, _, routes = _Lane(opened, batch).run(warmup + max(1, tokens // 2))
            out.update(batch_step_s=seconds[warmup:], batch_routes=routes[warmup:])
        if prefill:
            out.update(ttft_s=_timed_prefills(opened, PROMPT, 3),
                       prefill_s=_timed_prefills(opened, prefill_prompt(opened.vocab_size), 2))
        return {**out, **opened.report()}
    finally:
        getattr(opened, "close", lambda: None)()


def _probe(name: str, engines: dict[str, Any], stream: list[Any]) -> float:
    """One bandwidth probe: ``copy`` (host copy) or ``read:<engine>`` (its kernels' read
    stream), bytes per second."""
    from colibri.benchmarks import bandwidth

    if name == "copy":
        return bandwidth.host_copy_bytes_per_s()
    if not stream:
        stream.append(bandwidth.stream_weight())
    kernels = engines[name.removeprefix("read:")].model.kernels
    return bandwidth.read_stream_bytes_per_s(kernels, stream[0])


def turns(engines: dict[str, dict[str, Any]], lanes: list[dict[str, Any]], rounds: int,
          probes: list[str] | None = None, warmup_steps: int | None = None,
          mapping_of: str | None = None) -> dict[str, Any]:
    """Engines taking turns: each round runs every probe of ``probes`` (bandwidth, before the
    decoding), then each lane (``{"engine": name, "rows": n, "steps": n}``) for its steps.
    Before the rounds every lane runs ``warmup_steps`` untimed steps (default: its own steps),
    which pages in and maps what the rounds read. Returns per probe its value per round, per
    lane its seconds per round and routes per round, each engine's report and, for
    ``mapping_of``, its checkpoint's mapping after the warm-up."""
    opened = {name: open_engine(spec)[0] for name, spec in engines.items()}
    running = [_Lane(opened[lane["engine"]], int(lane["rows"])) for lane in lanes]
    for lane, spec in zip(running, lanes, strict=True):
        lane.run(spec["steps"] if warmup_steps is None else warmup_steps)
    mapping = None
    if mapping_of is not None:
        from colibri.benchmarks.page_mapping import checkpoint_mapping

        mapping = checkpoint_mapping(Path(engines[mapping_of]["model"]))
    stream: list[Any] = []
    out_probes: dict[str, list[float]] = {p: [] for p in probes or []}
    seconds: list[list[float]] = [[] for _ in lanes]
    routes: list[list[list[Routes]]] = [[] for _ in lanes]
    for _ in range(rounds):
        for probe in out_probes:
            out_probes[probe].append(_probe(probe, opened, stream))
        for i, (lane, spec) in enumerate(zip(running, lanes, strict=True)):
            step_s, _, chosen = lane.run(int(spec["steps"]))
            seconds[i].append(sum(step_s))
            routes[i].append(chosen)
    return {"probes": out_probes, "lane_s": seconds, "lane_routes": routes,
            "reports": {name: engine.report() for name, engine in opened.items()},
            "checkpoint_mapping": mapping}
