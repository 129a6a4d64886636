"""``colibri bench --section out-of-core``: decoding models whose experts do not fit in RAM.

For each routing of the out-of-core bench models (``out_of_core_model``: 4.5 GB of float32
experts, uniform and skewed routing) and each engine, the section measures:

- the engine **in RAM** (no budget, the model's files in the page cache): its step time and
  greedy tokens, the reference for sameness and for the bound;
- the engine **under a cap** of 1/8, 1/4 and 1/2 of the expert bytes (plus the dense weights
  and ``ALLOWANCE`` for the runtime): a memory cgroup with that hard limit where the host has
  one, ``RAM_GB`` set to the same number, caches dropped first. Reported: decode tok/s, bytes
  read from storage per token (``/proc/<pid>/io``), the RAM hit rate, the cgroup's peak
  memory and OOM kills, whether the tokens equal the in-RAM run's, and the bound
  ``1 / max(bytes read per token / read bandwidth, the in-RAM step time)`` with the ratio to it;
- on skewed routing at each cap, the same run with experts pinned from a ``.coli_usage``
  recorded on other prompts (``PIN``, half the expert cache, as AUTOPIN would): the hit-rate
  gain pins buy over LRU alone;
- ``colibri plan``'s prediction (hit rate, bytes read per token, tok/s) beside each
  measurement;
- llama.cpp on the same model as a GGUF under the same cap (its default mmap), where the peer
  interpreter imports ``llama_cpp`` and the GGUF exists (else the reason it was skipped).

The read bandwidth is measured once, sequential O_DIRECT over the expert shards. Everything is
one JSON document; the runs are in one sitting, so the ratios compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register, workers
from colibri.benchmarks.bandwidth import storage_read_gb_s
from colibri.benchmarks.memory_cgroup import MemoryCgroup, available, drop_caches
from colibri.benchmarks.out_of_core_model import (
    OOC_CONFIG,
    ROUTINGS,
    ensure_models,
    expert_bytes,
    model_dir,
)
from colibri.plan import predict_decode

#: What a cap allows beyond the experts' share and the dense weights: the interpreter,
#: numpy, the kernel library, buffers (the engine's own budget says what it needs).
ALLOWANCE = 600_000_000
CAPS = (0.125, 0.25, 0.5)
#: Tokens decoded per run: the accelerated engine, and the (much slower) reference.
TOKENS = {"accelerated": 24, "reference": 4, "llama_cpp": 24}
PROMPT_TOKENS = 16
MEASURED_PROMPT, USAGE_PROMPT = 1, 99
DECODE = "out_of_core_worker:decode"


@dataclass(frozen=True)
class Setup:
    cache_dir: Path
    engines: tuple[str, ...] = ("accelerated", "reference")
    caps: tuple[float, ...] = CAPS
    peer_python: str | None = None
    gguf: dict[str, Path] | None = None


def _worker(function: str, spec: dict[str, Any], cgroup: MemoryCgroup | None,
            python: str | None = None) -> dict[str, Any]:
    return workers.call(function, spec, function, python=python,
                        wrap=cgroup.command if cgroup is not None else None)


def _warm(model_dir: Path) -> None:
    """Read the model's files into the page cache (the in-RAM run's starting point)."""
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as fh:
            while fh.read(64 << 20):
                pass


def dense_bytes(model_dir: Path) -> int:
    from colibri.reference.safetensors import Checkpoint

    checkpoint = Checkpoint(model_dir)
    return sum(info.end - info.begin for name, info in checkpoint.tensors.items()
               if ".mlp.experts." not in name)


def _capped(function: str, spec: dict[str, Any], limit: int, cgroup_version: str | None,
            python: str | None = None) -> dict[str, Any]:
    drop_caches()
    group = MemoryCgroup("colibri-ooc", limit) if cgroup_version else None
    try:
        result = _worker(function, spec, group, python)
        if group is not None:
            result["peak_cgroup_bytes"] = group.peak_bytes()
            result["oom_kills"] = group.oom_kills()
    finally:
        if group is not None:
            group.close()
    return result


def run_section(setup: Setup) -> dict[str, Any]:
    models = ensure_models(setup.cache_dir)
    experts = expert_bytes()
    cgroup_version, no_cgroup = available()
    drop_caches()
    shards = sorted(models["uniform"].glob("experts-*.safetensors"))
    bandwidth = storage_read_gb_s(shards)
    doc: dict[str, Any] = {
        "section": "out-of-core",
        "model": {"config": {k: OOC_CONFIG[k] for k in (
            "hidden_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
            "num_hidden_layers", "first_k_dense_replace")}, "expert_bytes": experts},
        "memory_cgroup": cgroup_version or f"none: {no_cgroup} (RAM_GB alone bounds the runs)",
        "read_bandwidth_gb_s": bandwidth,
        "allowance_bytes": ALLOWANCE,
        "runs": [],
    }
    per_token_all = (OOC_CONFIG["num_hidden_layers"] - OOC_CONFIG["first_k_dense_replace"]) * \
        OOC_CONFIG["num_experts_per_tok"] * experts // expert_count()
    for routing, model in models.items():
        dense = dense_bytes(model)
        usage = setup.cache_dir / f"ooc-{routing}.coli_usage"
        for engine in setup.engines:
            tokens = TOKENS[engine]
            base = {"model": str(model), "backend": engine, "tokens": tokens,
                    "prompt_tokens": PROMPT_TOKENS, "prompt_seed": MEASURED_PROMPT}
            _warm(model)
            in_ram = _worker(DECODE, base, None)
            if routing == "skewed" and engine == setup.engines[0]:
                _worker(DECODE, {**base, "prompt_seed": USAGE_PROMPT,
                                 "record_usage": str(usage)}, None)
            step_s = in_ram["decode_s"] / tokens if "decode_s" in in_ram else None
            doc["runs"].append({"routing": routing, "engine": engine, "cap": "in RAM",
                                **_summary(in_ram)})
            for fraction in setup.caps:
                limit = int(fraction * experts) + dense + ALLOWANCE
                variants: list[tuple[str, dict[str, Any]]] = [("lru", {})]
                if routing == "skewed" and usage.is_file():
                    # Half the expert cache, as AUTOPIN shares it out.
                    variants.append(("pinned", {"pin": str(usage),
                                                "pin_gb": 0.5 * fraction * experts / 1e9}))
                for policy, extra in variants:
                    measured = _capped(DECODE, {**base, "ram_gb": limit / 1e9, **extra},
                                       limit, cgroup_version)
                    doc["runs"].append(_capped_row(
                        routing, engine, policy, fraction, limit, measured, in_ram, step_s,
                        bandwidth, per_token_all))
        if setup.gguf and routing in setup.gguf and setup.peer_python:
            for fraction in setup.caps:
                limit = int(fraction * experts) + dense + ALLOWANCE
                measured = _capped("out_of_core_llama:decode", {
                    "gguf": str(setup.gguf[routing]), "tokens": TOKENS["llama_cpp"],
                    "prompt_tokens": PROMPT_TOKENS, "prompt_seed": MEASURED_PROMPT},
                    limit, cgroup_version, python=setup.peer_python)
                doc["runs"].append({"routing": routing, "engine": "llama_cpp", "policy": "mmap",
                                    "cap_fraction": fraction, "cap_bytes": limit,
                                    **_summary(measured)})
    doc["summary"] = summarize(doc["runs"])
    return doc


def expert_count() -> int:
    cfg = OOC_CONFIG
    return int((cfg["num_hidden_layers"] - cfg["first_k_dense_replace"])
               * cfg["n_routed_experts"])


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("tok_s", "read_bytes_per_token", "hit_rate", "peak_cgroup_bytes", "oom_kills",
            "peak_rss_bytes", "pinned", "error")
    return {k: result[k] for k in keys if k in result}


def _capped_row(routing: str, engine: str, policy: str, fraction: float, limit: int,
                measured: dict[str, Any], in_ram: dict[str, Any], step_s: float | None,
                bandwidth: float | None, per_token_all: int) -> dict[str, Any]:
    row: dict[str, Any] = {"routing": routing, "engine": engine, "policy": policy,
                           "cap_fraction": fraction, "cap_bytes": limit, **_summary(measured)}
    if "tokens" in measured and "tokens" in in_ram:
        row["same_tokens_as_in_ram"] = measured["tokens"] == in_ram["tokens"]
    if "peak_cgroup_bytes" in measured:
        row["peak_within_cap"] = measured["peak_cgroup_bytes"] <= limit
    if bandwidth and step_s and "read_bytes_per_token" in measured:
        read_s = measured["read_bytes_per_token"] / (bandwidth * 1e9)
        bound = 1.0 / max(read_s, step_s)
        row["bound_tok_s"] = bound
        row["ratio_to_bound"] = measured["tok_s"] / bound
    if bandwidth and step_s:
        row["predicted"] = predict_decode(hit_rate=fraction, bytes_per_token=per_token_all,
                                          read_gb_s=bandwidth, step_s=step_s)
    return row


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the targets name: ratio to the bound at cap 1/4, the pins' hit-rate gain,
    the speed over llama.cpp, sameness and the peak within the cap."""
    out: dict[str, Any] = {}
    by = {(r["routing"], r["engine"], r.get("policy"), r.get("cap_fraction")): r for r in runs}
    for routing in ("uniform", "skewed"):
        ours = by.get((routing, "accelerated", "lru", 0.25), {})
        peer = by.get((routing, "llama_cpp", "mmap", 0.25), {})
        pinned = by.get((routing, "accelerated", "pinned", 0.25), {})
        entry: dict[str, Any] = {"ratio_to_bound_at_quarter": ours.get("ratio_to_bound")}
        if ours.get("tok_s") and peer.get("tok_s"):
            entry["speed_over_llama_cpp_at_quarter"] = ours["tok_s"] / peer["tok_s"]
        if pinned.get("hit_rate") is not None and ours.get("hit_rate") is not None:
            entry["pin_hit_gain_points_at_quarter"] = 100 * (pinned["hit_rate"] - ours["hit_rate"])
        out[routing] = entry
    capped = [r for r in runs if r.get("engine") != "llama_cpp" and "cap_fraction" in r]
    out["all_same_tokens"] = all(r.get("same_tokens_as_in_ram") for r in capped)
    out["all_within_cap"] = all(r.get("peak_within_cap", True) and not r.get("oom_kills")
                                for r in capped)
    out["errors"] = [f"{r['routing']}/{r['engine']}/{r.get('cap_fraction')}: {r['error']}"
                     for r in runs if "error" in r]
    return out


def run(options: BenchOptions) -> dict[str, Any]:
    """The section: both engines, llama.cpp where its interpreter and GGUFs are there
    (``<cache-dir>/gguf/glm5-ooc-<routing>-...-f32.gguf``, converted by
    ``tools/llama_cpp_gguf.py --model DIR --out FILE``)."""
    from colibri.benchmarks.decode import peer_python

    models = {routing: model_dir(options.cache_dir, routing) for routing in ROUTINGS}
    gguf = {routing: options.cache_dir / "gguf" / f"{path.name}-f32.gguf"
            for routing, path in models.items()}
    python = peer_python(options)
    peer = None
    if options.peers and all(p.is_file() for p in gguf.values()):
        peer = python if workers.importable(python, "llama_cpp", "numpy") else None
    doc = run_section(Setup(options.cache_dir, peer_python=peer, gguf=gguf if peer else None))
    if peer is None:
        doc["llama_cpp"] = (f"skipped: needs {', '.join(str(p) for p in gguf.values())} and "
                            f"an interpreter that imports llama_cpp (--peer-python; now {python})")
    return doc


register(Section(
    name="out-of-core",
    engines=("accelerated", "reference", "llama_cpp"),
    description="decode with 1/8, 1/4 and 1/2 of 4.5 GB of experts in RAM (memory cgroup, "
                "RAM_GB), uniform and skewed routing, pins, the read-bandwidth bound, llama.cpp",
    run=run,
))
