"""``colibri plan``: memory budgeting for the expert tiers and the KV slots (spec/plan.md).

Works from ``config.json`` alone (bytes per expert per format are arithmetic on the shapes,
spec/model.md's formats); with weights present it also measures what the checkpoint actually
holds (safetensors headers only, nothing is loaded). GB means 10^9 bytes throughout.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.quant.formats import FORMAT_NAMES, Fmt, payload_nbytes, scale_count

SCHEMA_VERSION = 1
GB = 1e9
#: The share of MemAvailable a plan budgets when --ram is not given (colibri's 0.88).
RAM_SHARE = 0.88
#: Per-GPU reserve for the driver and the dense work (colibri's 2 GB).
VRAM_RESERVE = 2 * GB
MAX_SLOTS = 16
#: The engine process itself (interpreter, numpy, kernel library, buffers): RAM_GB bounds the
#: whole process, and the engine measures this part at start-up; the plan assumes this much.
ENGINE_RUNTIME = 300_000_000
EXPERT_TENSOR = re.compile(r"(?:model\.)?layers\.(\d+)\.mlp\.experts\.(\d+)\.")


class PlanError(ValueError):
    """The plan cannot be made (unreadable config, bad option); the message says why."""


@dataclass(frozen=True)
class Request:
    ctx: int | None = None
    kv_slots: int = 1
    ram_gb: float | None = None
    vram_gb: float | None = None
    usage: Path | None = None
    #: The expert format to size a config-only plan with (a key of expert_bytes_by_format).
    expert_format: str = "bf16"
    #: Measured storage read bandwidth (GB/s) and the engine's in-RAM step time (ms): with
    #: both, the plan predicts decode tok/s (``predict_decode``).
    read_gb_s: float | None = None
    step_ms: float | None = None


def usage_hit_rate(ranked: list[tuple[int, int, int]], resident: int) -> float:
    """With a usage history (``ranked_usage``), the resident set is its hottest experts:
    the hit rate is their share of the recorded selections (what pins and a warm LRU serve)."""
    total = sum(n for _, _, n in ranked)
    return sum(n for _, _, n in ranked[:resident]) / total if total else 0.0


def predict_decode(*, hit_rate: float, bytes_per_token: int, read_gb_s: float,
                   step_s: float) -> dict[str, float]:
    """Decode under a RAM budget: the misses' bytes per token (``1 - hit_rate`` of the
    experts a token routes to) read at ``read_gb_s``, overlapped at best with the in-RAM step,
    so tok/s is at most ``1 / max(read time, step time)``."""
    read = (1.0 - hit_rate) * bytes_per_token
    return {"hit_rate": hit_rate, "read_bytes_per_token": read,
            "tok_s": 1.0 / max(read / (read_gb_s * GB), step_s)}


def load_config(model: Path) -> tuple[ModelConfig, Path | None]:
    """(config, model dir or None when only a config file was given)."""
    path = model / "config.json" if model.is_dir() else model
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PlanError(f"no model config at {path}") from exc
    except (OSError, ValueError) as exc:
        raise PlanError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise PlanError(f"{path} is not a JSON object")
    try:
        config = ModelConfig.from_dict(raw)
    except (CheckpointError, KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{path}: {exc}") from exc
    return config, (model if model.is_dir() else None)


def expert_bytes_by_format(config: ModelConfig) -> dict[str, int]:
    """One routed expert (gate, up [I, H] and down [H, I]) in every CPU format, scales included;
    `bf16` is the source checkpoint's size."""
    hidden, inter = config.hidden_size, config.moe_intermediate_size
    shapes = [(inter, hidden), (inter, hidden), (hidden, inter)]
    out = {"bf16": sum(2 * r * c for r, c in shapes)}
    for fmt, name in FORMAT_NAMES.items():
        group = 64 if fmt == Fmt.INT4_GROUPED else 0
        total = 0
        for rows, cols in shapes:
            total += payload_nbytes(fmt, rows, cols) + 4 * scale_count(fmt, rows, cols, group)
        label = "int4-g64" if fmt == Fmt.INT4_GROUPED else name
        out[label] = total
    return out


def kv_bytes_per_token(config: ModelConfig) -> int:
    """float32 KV of one token over every attention layer (MTP included): the MLA latent
    (kv_lora_rank + qk_rope_head_dim) plus the DSA indexer key (index_head_dim) where present."""
    layers = config.num_hidden_layers + config.num_nextn_predict_layers
    per_layer = config.kv_lora_rank + config.qk_rope_head_dim
    indexed = 0 if config.indexer_types is None else config.index_head_dim
    return layers * (per_layer + indexed) * 4


def workspace_bytes(config: ModelConfig, ctx: int) -> int:
    """float32 per-head score and value scratch of one prefill at full context."""
    return ctx * config.num_attention_heads * (config.qk_nope_head_dim + config.v_head_dim) * 4


def _tensor_sizes(files: list[Path]) -> list[tuple[str, int, str]]:
    """(name, stored bytes, dtype) of every tensor of the safetensors ``files`` (headers only)."""
    out: list[tuple[str, int, str]] = []
    for path in files:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(length))
        for name, info in header.items():
            if name != "__metadata__":
                start, end = info["data_offsets"]
                out.append((name, int(end) - int(start), str(info["dtype"])))
    return out


def stored_expert_bytes(model_dir: Path) -> dict[tuple[int, int], int]:
    """Bytes the checkpoint stores for each routed (layer, expert), scales included; empty
    without weights."""
    per_expert: dict[tuple[int, int], int] = {}
    for name, size, _ in _tensor_sizes(sorted(model_dir.glob("*.safetensors"))):
        match = EXPERT_TENSOR.search(name)
        if match:
            key = (int(match.group(1)), int(match.group(2)))
            per_expert[key] = per_expert.get(key, 0) + size
    return per_expert


def measure_weights(model_dir: Path) -> dict[str, Any] | None:
    """Bytes the checkpoint holds: routed experts per (layer, expert) and everything else."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    per_expert = stored_expert_bytes(model_dir)
    dense = 0
    dtypes: set[str] = set()
    for name, size, dtype in _tensor_sizes(files):
        if EXPERT_TENSOR.search(name):
            dtypes.add(dtype)
        else:
            dense += size
    sizes = sorted(per_expert.values())
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "dense_bytes": dense, "routed_experts": len(per_expert),
            "expert_bytes": sum(sizes), "typical_expert_bytes": sizes[len(sizes) // 2]
            if sizes else 0, "max_expert_bytes": sizes[-1] if sizes else 0,
            "expert_dtypes": sorted(dtypes)}


def dense_bytes_from_config(config: ModelConfig) -> int:
    """Everything but the routed experts, in bf16 (an estimate when there are no weights)."""
    h = config.hidden_size
    q = config.q_lora_rank or 0
    heads = config.num_attention_heads
    attn = ((h * q + q * heads * config.qk_head_dim) if q else h * heads * config.qk_head_dim)
    attn += h * (config.kv_lora_rank + config.qk_rope_head_dim)
    attn += config.kv_lora_rank * heads * (config.qk_nope_head_dim + config.v_head_dim)
    attn += heads * config.v_head_dim * h
    if config.indexer_types is not None:
        attn += (q or h) * config.index_n_heads * config.index_head_dim
        attn += h * config.index_head_dim + h * config.index_n_heads
    dense_mlp = 3 * h * config.intermediate_size
    shared = 3 * h * config.moe_intermediate_size * config.n_shared_experts
    layers = config.num_hidden_layers + config.num_nextn_predict_layers
    sparse = sum(1 for t in config.mlp_layer_types if t == "sparse") + \
        config.num_nextn_predict_layers
    total = layers * attn + (layers - sparse) * dense_mlp + sparse * (
        shared + h * config.n_routed_experts)
    total += 2 * config.vocab_size * h
    return 2 * total


def meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def gpus() -> list[dict[str, Any]]:
    """NVIDIA devices with free memory (nvidia-smi), [] when there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "--query-gpu=index,name,memory.total,memory.free",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            total, free = float(parts[2]) * 2**20, float(parts[3]) * 2**20
            out.append({"index": int(parts[0]), "name": parts[1], "total_bytes": int(total),
                        "free_bytes": int(free),
                        "usable_bytes": int(max(0.0, free - VRAM_RESERVE))})
    return out


def ranked_usage(path: Path, config: ModelConfig) -> list[tuple[int, int, int]]:
    """(layer, expert, count) of a usage file or STATS dump, most used first (ties: lower
    layer, then lower expert)."""
    from colibri.atlas.stats import AtlasError, read_dump

    try:
        counts = read_dump(path)
    except AtlasError as exc:
        raise PlanError(str(exc)) from exc
    rows = [(layer, expert, n) for (layer, expert), n in counts.items()
            if n > 0 and expert < config.n_routed_experts]
    rows.sort(key=lambda r: (-r[2], r[0], r[1]))
    return rows


def build(model: Path, request: Request, host: Mapping[str, int] | None = None,
          devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    config, model_dir = load_config(model)
    ctx = request.ctx or min(4096, _max_positions(model))
    if ctx < 8:
        raise PlanError(f"--ctx {ctx} is below the engine's minimum of 8")
    if not 1 <= request.kv_slots <= MAX_SLOTS:
        raise PlanError(f"--kv-slots {request.kv_slots} is outside 1..{MAX_SLOTS}")
    formats = expert_bytes_by_format(config)
    if request.expert_format not in formats:
        raise PlanError(f"unknown expert format {request.expert_format!r} (have: "
                        + ", ".join(formats) + ")")
    weights = measure_weights(model_dir) if model_dir is not None else None
    sparse_layers = sum(1 for t in config.mlp_layer_types if t == "sparse")
    routed_layers = sparse_layers + config.num_nextn_predict_layers
    n_experts = routed_layers * config.n_routed_experts
    if weights and weights["routed_experts"]:
        typical, largest = weights["typical_expert_bytes"], weights["max_expert_bytes"]
        dense, total_experts = weights["dense_bytes"], weights["expert_bytes"]
        source = "weights"
    else:
        typical = largest = formats[request.expert_format]
        dense, total_experts = dense_bytes_from_config(config), typical * n_experts
        source = f"config ({request.expert_format} experts, bf16 dense)"
    per_token = kv_bytes_per_token(config)
    per_slot = per_token * ctx
    workspace = workspace_bytes(config, ctx)
    info = dict(meminfo() if host is None else host)
    available = info.get("MemAvailable", 0)
    ram_budget = int(request.ram_gb * GB) if request.ram_gb else int(RAM_SHARE * available)
    runtime = per_slot * request.kv_slots + workspace + 64 * largest + ENGINE_RUNTIME
    cache = max(0, ram_budget - dense - runtime)
    per_cap = typical * routed_layers
    cap = min(config.n_routed_experts, cache // per_cap) if per_cap else 0
    devs = gpus() if devices is None else devices
    usable = sum(int(d["usable_bytes"]) for d in devs)
    vram_budget = int(request.vram_gb * GB) if request.vram_gb is not None else usable
    vram_budget = min(vram_budget, total_experts)
    hot = vram_budget // typical if typical else 0
    warm_bytes = min(total_experts - hot * typical, cache)
    warm = warm_bytes // typical if typical else 0
    fit_slots = 0
    for slots in range(1, MAX_SLOTS + 1):
        if dense + per_slot * slots + workspace + 64 * largest + ENGINE_RUNTIME <= ram_budget:
            fit_slots = slots
    resident = min(n_experts, hot + warm)
    warnings = []
    if dense > ram_budget:
        warnings.append(f"the dense weights ({dense / GB:.1f} GB) are larger than the RAM budget "
                        f"({ram_budget / GB:.1f} GB): they cannot all stay in memory, so steps "
                        "read them back from disk")
    if cap < 1:
        warnings.append("the RAM budget holds less than one expert per layer: every routed "
                        "expert is read from disk")
    if fit_slots < request.kv_slots:
        warnings.append(f"{request.kv_slots} KV slot(s) at ctx {ctx} do not fit the RAM budget "
                        f"(at most {fit_slots})")
    plan: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": {"path": str(model), "model_type": config.model_type,
                  "layers": config.num_hidden_layers, "mtp_layers": config.num_nextn_predict_layers,
                  "routed_layers": routed_layers, "experts_per_layer": config.n_routed_experts,
                  "routed_experts": n_experts, "top_k": config.num_experts_per_tok,
                  "sizes_from": source, "weights": weights},
        "expert_bytes": formats,
        "kv": {"ctx": ctx, "bytes_per_token": per_token, "bytes_per_slot": per_slot,
               "workspace_bytes": workspace, "requested_slots": request.kv_slots,
               "slots_that_fit": fit_slots},
        "tiers": {
            "ram": {"available_bytes": available, "budget_bytes": ram_budget,
                    "dense_bytes": dense, "runtime_bytes": runtime,
                    "expert_cache_bytes": cache, "warm_experts": warm,
                    "cache_slots_per_layer": cap},
            "vram": {"devices": devs, "budget_bytes": vram_budget, "hot_experts": hot},
            "disk": {"expert_bytes": total_experts,
                     "cold_experts": max(0, n_experts - resident)},
        },
        "projected_hit_rate": round(resident / n_experts, 4) if n_experts else 1.0,
        "env": {"RAM_GB": f"{ram_budget / GB:.3f}", "KV_SLOTS": str(min(max(fit_slots, 1),
                                                                request.kv_slots)),
                "CTX": str(ctx)},
        "warnings": warnings,
    }
    if request.usage is not None:
        ranked = ranked_usage(request.usage, config)
        pin_count = hot if hot else warm
        pins = [f"{layer}:{expert}" for layer, expert, _ in ranked[:pin_count]]
        plan["pin"] = {"usage": str(request.usage), "experts": pins,
                       "budget_bytes": (hot if hot else warm) * typical,
                       "tier": "vram" if hot else "ram"}
        plan["env"]["PIN"] = str(request.usage)
        # The engine pins in the same order while the next expert fits PIN_GB; half an
        # expert of slack keeps the decimal GB from rounding the last pin away, and is too
        # little for one more, so the engine pins exactly this set.
        plan["env"]["PIN_GB"] = repr((len(pins) + 0.5) * typical / GB)
    hit = plan["projected_hit_rate"]
    if request.usage is not None and ranked:
        hit = plan["projected_hit_rate"] = round(usage_hit_rate(ranked, resident), 4)
    per_token = config.num_experts_per_tok * routed_layers * typical
    plan["projected_read_bytes_per_token"] = round((1.0 - hit) * per_token)
    if request.read_gb_s and request.step_ms:
        plan["projected_decode"] = predict_decode(
            hit_rate=hit, bytes_per_token=per_token, read_gb_s=request.read_gb_s,
            step_s=request.step_ms / 1000.0)
    return plan


def _max_positions(model: Path) -> int:
    path = model / "config.json" if model.is_dir() else model
    raw = json.loads(path.read_text(encoding="utf-8"))
    value = raw.get("max_position_embeddings", 4096)
    return int(value) if isinstance(value, int) and value > 0 else 4096


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB"


def format_plan(plan: dict[str, Any]) -> list[str]:
    m, kv, tiers = plan["model"], plan["kv"], plan["tiers"]
    ram, vram, disk = tiers["ram"], tiers["vram"], tiers["disk"]
    lines = [
        f"model {m['model_type']} · {m['layers']} layers (+{m['mtp_layers']} MTP) · "
        f"{m['routed_layers']}×{m['experts_per_layer']} routed experts · top-{m['top_k']} · "
        f"sizes from {m['sizes_from']}",
        "expert " + " · ".join(f"{k} {v / 1e6:.2f} MB" for k, v in plan["expert_bytes"].items()),
        f"KV {kv['bytes_per_token'] / 1e3:.1f} kB/token · {_gb(kv['bytes_per_slot'])}/slot at "
        f"ctx {kv['ctx']} · {kv['slots_that_fit']} slot(s) fit",
        f"RAM {_gb(ram['budget_bytes'])} budget · {_gb(ram['dense_bytes'])} dense · "
        f"{_gb(ram['runtime_bytes'])} runtime · {_gb(ram['expert_cache_bytes'])} warm experts "
        f"(~{ram['warm_experts']}) · cap {ram['cache_slots_per_layer']}/layer",
    ]
    if vram["devices"]:
        names = ", ".join(f"{d['index']}:{d['name']}" for d in vram["devices"])
        lines.append(f"VRAM {_gb(vram['budget_bytes'])} hot tier · ~{vram['hot_experts']} "
                     f"experts · {names}")
    else:
        lines.append("VRAM no NVIDIA device detected · CPU path")
    lines.append(f"disk {_gb(disk['expert_bytes'])} experts · {disk['cold_experts']} cold")
    lines.append(f"hit {100 * plan['projected_hit_rate']:.0f}% projected expert residency, "
                 f"{plan['projected_read_bytes_per_token'] / GB:.3f} GB read per token")
    if "projected_decode" in plan:
        lines.append(f"decode ~{plan['projected_decode']['tok_s']:.2f} tok/s at most "
                     "(reads overlapped with the in-RAM step)")
    if "pin" in plan:
        lines.append(f"pin {len(plan['pin']['experts'])} experts from {plan['pin']['usage']} "
                     f"({plan['pin']['tier']})")
    lines.append("env " + " ".join(f"{k}={v}" for k, v in plan["env"].items()))
    lines.extend(f"warn {w}" for w in plan["warnings"])
    return lines


def environment_for_plan(plan: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """What ``--auto-tier`` sets: the plan's variables, never overriding the user's. A
    ``PIN`` the user set wins with the plan's ``PIN_GB`` only when the plan ranked that same
    file, so the budget always belongs to the ranking the engine applies."""
    out = dict(env)
    user_pin = env.get("PIN")
    for key, value in plan["env"].items():
        if key == "PIN_GB" and user_pin is not None and user_pin != plan["env"].get("PIN"):
            continue
        out.setdefault(key, value)
    return out


def auto_tier_usage(usage: Path | None, env: Mapping[str, str]) -> Path | None:
    """The usage file ``--auto-tier`` suggests pins from: ``--usage``, else a ``PIN`` that
    names a file (``PIN=auto`` ranks the engine's own history, which the plan cannot see)."""
    if usage is not None:
        return usage
    pin = env.get("PIN", "")
    return Path(pin) if pin and pin != "auto" and Path(pin).is_file() else None


def shipped_config(name: str) -> Path:
    from colibri import resources

    shipped = sorted((resources.fixtures_dir() / "configs").glob("*.json"))
    exact = [p for p in shipped if p.stem == name]
    # A family name stands for its one shipped size ("glm5" is glm5-744b).
    family = [p for p in shipped if p.stem.startswith(name + "-")]
    if exact or len(family) == 1:
        return (exact or family)[0]
    raise PlanError(f"no shipped config named {name!r} (have: "
                    + ", ".join(p.stem for p in shipped) + ")")


__all__ = ["PlanError", "Request", "auto_tier_usage", "build", "environment_for_plan",
           "format_plan", "shipped_config"]
