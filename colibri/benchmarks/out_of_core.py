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
  the share of the decode during which reads were in flight and the rate they came in at
  then (where the time between them goes);
- on skewed routing at each cap, the same run with experts pinned from a ``.coli_usage``
  recorded on 8 other prompts (``PIN``, half the expert cache, as AUTOPIN would): the
  hit-rate gain pins buy over LRU alone;
- on skewed routing at cap 1/4 (accelerated engine), ``CONVERSATIONS`` conversations decoded
  together, one row each per step, as a server with that many users decodes them: LRU alone
  and with the same pins. One conversation's routing is strongly correlated from token to
  token, which an LRU keeps; several conversations share the cache and dilute that
  locality, which is where a ranking from a usage history pays;
- at cap 1/4 (accelerated engine): the same run reading the next layer's likely experts
  ahead (``READ_AHEAD=1``: its speed over LRU alone and the share of the experts read ahead
  that a layer then asked for), and the run bounded by ``RAM_GB`` alone, without the cgroup:
  its peak resident memory plus the page cache's share of the model's files that it does not
  map (``mincore`` and ``smaps`` after the decode), held against the budget;
- ``colibri plan``'s prediction (hit rate, bytes read per token, tok/s) beside each
  measurement;
- llama.cpp on the same model as a GGUF under the same cap (its default mmap), where the peer
  interpreter imports ``llama_cpp`` and the GGUF exists (else the reason it was skipped).

The read bandwidth is measured once, sequential O_DIRECT over the expert shards with as many
reads in flight as the disk tier keeps and one read at a time; the bound takes the better.
Everything is one JSON document; the runs are in one sitting, so the ratios compare like with
like.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri.backend_kit.expert_disk import DEFAULT_IN_FLIGHT
from colibri.benchmarks import BenchOptions, Section, register, workers
from colibri.benchmarks.bandwidth import storage_read_gb_s
from colibri.benchmarks.memory_cgroup import MemoryCgroup, available, drop_caches
from colibri.benchmarks.out_of_core_model import ensure_models
from colibri.plan import predict_decode, ranked_usage, usage_hit_rate

#: What a cap allows beyond the experts' share and the dense weights: the interpreter,
#: numpy, the kernel library, buffers (the engine's own budget says what it needs).
ALLOWANCE = 600_000_000
CAPS = (0.125, 0.25, 0.5)
QUARTER = 0.25
#: The run at cap 1/4 bounded by ``RAM_GB`` alone (no cgroup): its peak resident memory plus
#: the page cache's footprint of the model's files, held against the budget.
RAM_GB_ONLY = "ram_gb_only"
#: Tokens decoded per run: the accelerated engine, and the (much slower) reference.
TOKENS = {"accelerated": 24, "reference": 4, "llama_cpp": 24}
PROMPT_TOKENS = 16
MEASURED_PROMPT, USAGE_PROMPT = 1, 99
#: Conversations decoded together in the shared-cache runs (prompt seeds from
#: MEASURED_PROMPT on: none of them among the usage history's).
CONVERSATIONS = 4
#: Prompts the usage history is recorded on (none of them the measured one): 8 prompts of
#: 24 tokens give each layer about 1,500 selections to rank 96 experts by.
USAGE_PROMPTS = 8
DECODE = "out_of_core_worker:decode"


@dataclass(frozen=True)
class Setup:
    #: routing ("uniform", "skewed") -> model directory.
    models: dict[str, Path]
    #: Where the skewed model's usage file is recorded.
    work_dir: Path
    engines: tuple[str, ...] = ("accelerated", "reference")
    caps: tuple[float, ...] = CAPS
    tokens: dict[str, int] | None = None
    allowance: int = ALLOWANCE
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


@dataclass(frozen=True)
class ModelBytes:
    """A model's routed-expert bytes, the rest, and the expert bytes one token routes to."""

    experts: int
    dense: int
    per_token: int
    files: list[Path]

    @classmethod
    def of(cls, model: Path) -> ModelBytes:
        from colibri.reference.config import ModelConfig
        from colibri.reference.safetensors import Checkpoint

        checkpoint = Checkpoint(model)
        cfg = ModelConfig.from_dir(model)
        sizes = [(info.end - info.begin, info.file) for name, info in checkpoint.tensors.items()
                 if ".mlp.experts." in name]
        experts = sum(size for size, _ in sizes)
        count = sum(cfg.is_sparse(i) for i in range(cfg.num_hidden_layers)) * \
            cfg.n_routed_experts
        per_token = experts * cfg.num_experts_per_tok * \
            sum(cfg.is_sparse(i) for i in range(cfg.num_hidden_layers)) // max(count, 1)
        return cls(experts, checkpoint.total_bytes - experts, per_token,
                   sorted({file for _, file in sizes}))


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
    tokens = {**TOKENS, **(setup.tokens or {})}
    sizes = {routing: ModelBytes.of(model) for routing, model in setup.models.items()}
    cgroup_version, no_cgroup = available()
    drop_caches()
    one_at_a_time = storage_read_gb_s(sizes["uniform"].files)
    drop_caches()
    in_flight = storage_read_gb_s(sizes["uniform"].files, in_flight=DEFAULT_IN_FLIGHT)
    # The bound holds the engine to the disk's best rate: reads kept in flight (as the disk
    # tier keeps them) or one at a time, whichever this disk gave now.
    bandwidth = max((r for r in (one_at_a_time, in_flight) if r), default=None)
    doc: dict[str, Any] = {
        "section": "out-of-core",
        "models": {routing: {"path": str(model), "expert_bytes": sizes[routing].experts,
                             "dense_bytes": sizes[routing].dense}
                   for routing, model in setup.models.items()},
        "memory_cgroup": cgroup_version or f"none: {no_cgroup} (RAM_GB alone bounds the runs)",
        "read_bandwidth_gb_s": bandwidth,
        "read_bandwidth_in_flight": DEFAULT_IN_FLIGHT,
        "read_bandwidth_in_flight_gb_s": in_flight,
        "read_bandwidth_one_at_a_time_gb_s": one_at_a_time,
        "allowance_bytes": setup.allowance,
        "runs": [],
    }
    for routing, model in setup.models.items():
        size = sizes[routing]
        usage = setup.work_dir / f"ooc-{routing}.coli_usage"
        limits = {f: int(f * size.experts) + size.dense + setup.allowance for f in setup.caps}
        for engine in setup.engines:
            base = {"model": str(model), "backend": engine, "tokens": tokens[engine],
                    "prompt_tokens": PROMPT_TOKENS, "prompt_seed": MEASURED_PROMPT}
            _warm(model)
            in_ram = {1: _worker(DECODE, base, None)}
            if engine == setup.engines[0]:  # the history pins and predictions come from
                _worker(DECODE, {**base, "prompt_seed": USAGE_PROMPT,
                                 "record_usage": str(usage),
                                 "record_prompts": USAGE_PROMPTS}, None)
            shared = routing == "skewed" and engine == "accelerated" and usage.is_file()
            if shared and QUARTER in limits:
                in_ram[CONVERSATIONS] = _worker(DECODE, {**base, "conversations": CONVERSATIONS},
                                                None)
            doc["runs"].append({"routing": routing, "engine": engine, "cap": "in RAM",
                                **_summary(in_ram[1])})
            for fraction, limit in limits.items():
                pins = {"pin": str(usage), "pin_gb": 0.5 * fraction * size.experts / 1e9}
                variants: list[tuple[str, dict[str, Any]]] = [("lru", {})]
                if routing == "skewed" and usage.is_file():
                    # Half the expert cache, as AUTOPIN shares it out.
                    variants.append(("pinned", pins))
                if fraction == QUARTER and engine == "accelerated":
                    variants.append(("read_ahead", {"read_ahead": 1}))
                    if cgroup_version:
                        variants.append((RAM_GB_ONLY, {}))
                    if shared:
                        many = {"conversations": CONVERSATIONS}
                        variants += [("lru", many), ("pinned", {**pins, **many})]
                for policy, extra in variants:
                    measured = _capped(DECODE, {**base, "ram_gb": limit / 1e9, **extra},
                                       limit, None if policy == RAM_GB_ONLY else cgroup_version)
                    row = _capped_row(routing, engine, policy, fraction, limit, measured,
                                      in_ram[extra.get("conversations", 1)], bandwidth,
                                      size.per_token)
                    if in_ram[1].get("step_s") and bandwidth:
                        row["predicted"] = _prediction(model, usage, fraction, size, bandwidth,
                                                       in_ram[1]["step_s"])
                    doc["runs"].append(row)
        if setup.gguf and routing in setup.gguf and setup.peer_python:
            for fraction, limit in limits.items():
                measured = _capped("out_of_core_llama:decode", {
                    "gguf": str(setup.gguf[routing]), "tokens": tokens["llama_cpp"],
                    "prompt_tokens": PROMPT_TOKENS, "prompt_seed": MEASURED_PROMPT},
                    limit, cgroup_version, python=setup.peer_python)
                doc["runs"].append({"routing": routing, "engine": "llama_cpp", "policy": "mmap",
                                    "cap_fraction": fraction, "cap_bytes": limit,
                                    **_summary(measured)})
    doc["summary"] = summarize(doc["runs"])
    return doc


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("tok_s", "read_bytes_per_token", "hit_rate", "peak_cgroup_bytes", "oom_kills",
            "peak_rss_bytes", "page_cache_bytes", "mapped_model_rss_bytes", "pinned",
            "prefetched", "prefetch_used", "error")
    out = {k: result[k] for k in keys if k in result}
    if result.get("disk_s") and result.get("decode_s"):
        # The share of the decode during which a layer's reads were in flight: 1.0 would be
        # a disk never idle, which the bound assumes.
        out["reads_in_flight_share"] = result["disk_s"] / result["decode_s"]
        out["read_gb_s_while_in_flight"] = result.get("disk_bytes", 0) / result["disk_s"] / 1e9
    if result.get("conversations", 1) > 1:
        out["conversations"] = result["conversations"]
    return out


def _capped_row(routing: str, engine: str, policy: str, fraction: float, limit: int,
                measured: dict[str, Any], in_ram: dict[str, Any], bandwidth: float | None,
                per_token: int) -> dict[str, Any]:
    """A capped run's row; ``in_ram`` is the same engine's in-RAM run with as many
    conversations (its tokens for sameness, its step time for the bound)."""
    row: dict[str, Any] = {"routing": routing, "engine": engine, "policy": policy,
                           "cap_fraction": fraction, "cap_bytes": limit, **_summary(measured)}
    if "tokens" in measured and "tokens" in in_ram:
        row["same_tokens_as_in_ram"] = measured["tokens"] == in_ram["tokens"]
    if "peak_cgroup_bytes" in measured:
        row["peak_within_cap"] = measured["peak_cgroup_bytes"] <= limit
    if policy == RAM_GB_ONLY and measured.get("page_cache_bytes") is not None:
        # The model's pages the process maps are in its RSS already.
        footprint = measured["peak_rss_bytes"] + max(
            0, measured["page_cache_bytes"] - measured["mapped_model_rss_bytes"])
        row["rss_plus_page_cache_bytes"] = footprint
        row["rss_plus_page_cache_within_budget"] = footprint <= limit
    if measured.get("prefetched"):
        row["read_ahead_useful_share"] = measured["prefetch_used"] / measured["prefetched"]
    step_s = in_ram.get("step_s")
    if bandwidth and step_s and "read_bytes_per_token" in measured:
        # Per step: each conversation's token reads its share of the step's bytes.
        rows = measured.get("conversations", 1)
        read_s = rows * measured["read_bytes_per_token"] / (bandwidth * 1e9)
        bound = rows / max(read_s, step_s)
        row["bound_tok_s"] = bound
        row["ratio_to_bound"] = measured["tok_s"] / bound
    return row


def _prediction(model: Path, usage: Path, fraction: float, size: ModelBytes, bandwidth: float,
                step_s: float) -> dict[str, float]:
    """``colibri plan``'s prediction for this cap: the cache holds ``fraction`` of the
    experts, the hottest ones by the usage history where there is one."""
    from colibri.reference.config import ModelConfig

    cfg = ModelConfig.from_dir(model)
    hit = fraction
    if usage.is_file():
        ranked = ranked_usage(usage, cfg)
        routed = sum(cfg.is_sparse(i) for i in range(cfg.num_hidden_layers))
        hit = usage_hit_rate(ranked, int(fraction * routed * cfg.n_routed_experts))
    return predict_decode(hit_rate=hit, bytes_per_token=size.per_token, read_gb_s=bandwidth,
                          step_s=step_s)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the targets name: ratio to the bound at cap 1/4, the pins' hit-rate gain,
    the speed over llama.cpp, sameness and the peak within the cap."""
    out: dict[str, Any] = {}
    by = {(r["routing"], r["engine"], r.get("policy"), r.get("cap_fraction")): r for r in runs
          if r.get("conversations", 1) == 1}
    shared = {r.get("policy"): r for r in runs if r.get("conversations", 1) > 1
              and r.get("cap_fraction") == QUARTER and r["engine"] == "accelerated"}
    for routing in ("uniform", "skewed"):
        ours = by.get((routing, "accelerated", "lru", QUARTER), {})
        peer = by.get((routing, "llama_cpp", "mmap", QUARTER), {})
        pinned = by.get((routing, "accelerated", "pinned", QUARTER), {})
        entry: dict[str, Any] = {"ratio_to_bound_at_quarter": ours.get("ratio_to_bound")}
        if ours.get("tok_s") and peer.get("tok_s"):
            entry["speed_over_llama_cpp_at_quarter"] = ours["tok_s"] / peer["tok_s"]
        if pinned.get("hit_rate") is not None and ours.get("hit_rate") is not None:
            entry["pin_hit_gain_points_at_quarter"] = 100 * (pinned["hit_rate"] - ours["hit_rate"])
        ahead = by.get((routing, "accelerated", "read_ahead", QUARTER), {})
        if ahead.get("tok_s") and ours.get("tok_s"):
            entry["read_ahead_speed_over_lru_at_quarter"] = ahead["tok_s"] / ours["tok_s"]
            entry["read_ahead_useful_share"] = ahead.get("read_ahead_useful_share")
        if routing == "skewed" and shared.get("lru", {}).get("hit_rate") is not None \
                and shared.get("pinned", {}).get("hit_rate") is not None:
            entry["conversations_together"] = shared["lru"]["conversations"]
            entry["pin_hit_gain_points_at_quarter_conversations_together"] = \
                100 * (shared["pinned"]["hit_rate"] - shared["lru"]["hit_rate"])
        alone = by.get((routing, "accelerated", RAM_GB_ONLY, QUARTER), {})
        if "rss_plus_page_cache_within_budget" in alone:
            entry["ram_gb_alone_within_budget_at_quarter"] = \
                alone["rss_plus_page_cache_within_budget"]
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

    models = ensure_models(options.cache_dir)
    gguf = {routing: options.cache_dir / "gguf" / f"{path.name}-f32.gguf"
            for routing, path in models.items()}
    python = peer_python(options)
    peer = None
    if options.peers and all(p.is_file() for p in gguf.values()):
        peer = python if workers.importable(python, "llama_cpp", "numpy") else None
    doc = run_section(Setup(models, options.cache_dir, peer_python=peer,
                            gguf=gguf if peer else None))
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
