"""The engine's configuration from command-line options and colibri's environment variables.

Options win over the environment; the environment names are colibri's own (SNAP, SERVE,
SERVE_BATCH, KV_SLOTS, CTX, SEED, SERVE_TOPK, KVSAVE, COLI_STATE_DIR, COLI_PERSIST, ...) so
harnesses written for the C engine drive this one unchanged (spec/protocol.md 2.9).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from colibri.protocol import LIMITS


class SettingsError(ValueError):
    """A configuration value out of range; the engine exits 2 with this message."""


MIN_KV_SLOTS = LIMITS["kv_slots_min"]
MAX_KV_SLOTS = LIMITS["kv_slots_max"]
DEFAULT_KV_SLOTS = LIMITS["default_kv_slots"]
DEFAULT_CTX = LIMITS["default_ctx"]
MIN_CTX = 8
DEFAULT_NGEN = 256
_FALSE = frozenset({"0", "false", "off", "no"})


@dataclass(frozen=True)
class EngineSettings:
    model_dir: Path
    mux: bool
    kv_slots: int
    ctx: int | None  # None: min(DEFAULT_CTX, the model's max_position_embeddings)
    seed: int | None
    serve_topk: bool
    kv_save: bool
    persist: bool
    state_dir: Path | None  # None: the per-user, per-model default
    ngen: int
    draft: int  # -1 auto (1 with an MTP head), 0 off
    ram_budget_bytes: int  # RAM_GB: everything the process holds; 0 = unbounded
    pin: str | None  # "auto" or a usage file
    pin_budget_bytes: int
    repin_every: int
    serve_all_stops: bool
    think: bool
    chat_template: bool
    legacy_temperature: float  # COLI_TEMP (or a numeric TEMP); colibri's legacy default 0.7
    legacy_top_p: float  # NUCLEUS, default 0.9
    usage_save: bool  # USAGE_SAVE=0: read the usage history, never write it
    usage_decay: float  # COLI_USAGE_DECAY in (0, 1]: counts scaled (rounded) before each save
    backend: str = "reference"  # a name in colibri.engine.registry
    device: str | None = None  # the backend's device choice (--device), None: its default
    #: COLI_GRAMMAR_OVERLAP=0: grammar masks on the sampling thread, not during the forward
    grammar_overlap: bool = True
    #: CUDA_EXPERT_GB (``--vram-gb``): the VRAM expert tier's budget; 0 none, -1 auto.
    vram_budget_bytes: int = 0
    #: CUDA_RESERVE_GB: device memory the VRAM tier leaves free (colibri's 2.0).
    vram_reserve_bytes: int = 2_000_000_000
    #: RSS_GUARD_GB: resident memory above which the expert LRU shrinks (0: RAM_GB's).
    rss_guard_bytes: int = 0
    #: READ_AHEAD: routed layers whose likely experts are read ahead under RAM_GB (0: none).
    read_ahead: int = 0
    #: AUTOPIN: under RAM_GB, pin the usage history's hottest experts once it holds enough
    #: selections (colibri's default; AUTOPIN=0 turns it off).
    autopin: bool = True
    #: --cluster / COLI_CLUSTER: ``ray`` or ``ray:ADDRESS`` (routed experts on expert workers).
    cluster: str | None = None
    #: --cluster-workers / COLI_CLUSTER_WORKERS: expert workers (0: one per cluster node).
    cluster_workers: int = 0
    #: --cluster-placement / COLI_CLUSTER_PLACEMENT: a placement file (colibri plan --nodes).
    cluster_placement: str | None = None


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if not low <= value <= high:
        raise SettingsError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _gb(env: Mapping[str, str], name: str, default: float) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return int(default * 1e9)
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value < 0 or value != value:
        raise SettingsError(f"{name} must be >= 0, got {raw}")
    return round(value * 1e9)  # to the byte: RAM_GB=0.000049152 is 49152 bytes


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() not in _FALSE


def from_environment(
    env: Mapping[str, str],
    *,
    model_dir: Path | None = None,
    kv_slots: int | None = None,
    ctx: int | None = None,
    legacy: bool | None = None,
    default_model: Path | None = None,
    backend: str = "reference",
    device: str | None = None,
    cluster: str | None = None,
    cluster_workers: int | None = None,
    cluster_placement: str | None = None,
) -> EngineSettings:
    """Settings from options (given, not None) over environment variables."""
    snap = model_dir or (Path(env["SNAP"]) if env.get("SNAP") else default_model)
    if snap is None:
        raise SettingsError("no model: pass --model DIR or set SNAP")
    if legacy is None:
        # colibri: SERVE=1 alone is the legacy loop; SERVE_BATCH=1 selects mux. `colibri engine`
        # without SERVE set at all speaks mux, the protocol new integrations use.
        legacy = env.get("SERVE") == "1" and env.get("SERVE_BATCH") != "1"
    if kv_slots is not None:
        slots = kv_slots
    else:
        slots = _int(env, "KV_SLOTS", DEFAULT_KV_SLOTS, MIN_KV_SLOTS, MAX_KV_SLOTS)
    if not MIN_KV_SLOTS <= slots <= MAX_KV_SLOTS:
        raise SettingsError(f"KV_SLOTS must be between 1 and {MAX_KV_SLOTS}, got {slots}")
    context = ctx if ctx is not None else (_int(env, "CTX", 0, 0, 1 << 24) or None)
    if context is not None and context < MIN_CTX:
        raise SettingsError(f"CTX must be at least {MIN_CTX}, got {context}")
    seed_raw = env.get("SEED")
    seed = None
    if seed_raw:
        try:
            seed = int(seed_raw, 10) % (1 << 64)
        except ValueError:
            raise SettingsError(f"SEED={seed_raw!r} is not an integer") from None
    state = env.get("COLI_STATE_DIR")
    pin = env.get("PIN") or None
    cluster = cluster or env.get("COLI_CLUSTER") or None
    if cluster is not None and cluster != "ray" and not cluster.startswith("ray:"):
        raise SettingsError(f"--cluster {cluster!r}: expected ray or ray:ADDRESS")
    if cluster_workers is None:
        cluster_workers = _int(env, "COLI_CLUSTER_WORKERS", 0, 0, 1 << 16)
    if cluster_workers < 0:
        raise SettingsError(f"--cluster-workers must be >= 0, got {cluster_workers}")
    cluster_placement = cluster_placement or env.get("COLI_CLUSTER_PLACEMENT") or None
    if cluster_placement is not None and cluster is None:
        raise SettingsError("--cluster-placement places experts on cluster workers: it needs "
                            "--cluster ray[:ADDRESS]")
    return EngineSettings(
        backend=backend,
        device=device,
        model_dir=snap,
        mux=not legacy,
        kv_slots=slots,
        ctx=context,
        seed=seed,
        serve_topk=env.get("SERVE_TOPK") == "1",
        kv_save=_flag(env, "KVSAVE", True),
        persist=_flag(env, "COLI_PERSIST", True),
        state_dir=Path(state) if state else None,
        ngen=_int(env, "NGEN", DEFAULT_NGEN, 1, 1 << 24),
        draft=_int(env, "DRAFT", -1, -1, 1),
        ram_budget_bytes=_gb(env, "RAM_GB", 0.0),
        rss_guard_bytes=_gb(env, "RSS_GUARD_GB", 0.0),
        read_ahead=_int(env, "READ_AHEAD", 0, 0, 8),
        autopin=_flag(env, "AUTOPIN", True),
        pin=pin,
        pin_budget_bytes=_gb(env, "PIN_GB", 10.0),
        repin_every=_int(env, "REPIN", 0, 0, 1 << 20),
        serve_all_stops=env.get("COLI_SERVE_ALL_STOPS") == "1",
        think=env.get("THINK") == "1",
        chat_template=env.get("CHAT_TEMPLATE", "1") != "0",
        legacy_temperature=_legacy_temperature(env),
        legacy_top_p=_float(env, "NUCLEUS", 0.9, 0.0, 1.0),
        usage_save=_flag(env, "USAGE_SAVE", True),
        usage_decay=_decay(env),
        grammar_overlap=_flag(env, "COLI_GRAMMAR_OVERLAP", True),
        vram_budget_bytes=_vram_budget(env),
        vram_reserve_bytes=_gb(env, "CUDA_RESERVE_GB", 2.0),
        cluster=cluster,
        cluster_workers=cluster_workers,
        cluster_placement=cluster_placement,
    )


def _vram_budget(env: Mapping[str, str]) -> int:
    """CUDA_EXPERT_GB: a size in GB, or ``auto`` (-1: what the device has free but the
    reserve). ``COLI_CUDA=0`` (``--gpu none``) means no VRAM tier whatever it says."""
    if env.get("COLI_CUDA", "").strip() == "0":
        return 0
    if env.get("CUDA_EXPERT_GB", "").strip().lower() == "auto":
        return -1
    return _gb(env, "CUDA_EXPERT_GB", 0.0)


def _decay(env: Mapping[str, str]) -> float:
    value = _float(env, "COLI_USAGE_DECAY", 1.0, 0.0, 1.0)
    if value <= 0.0:
        raise SettingsError("COLI_USAGE_DECAY must be in (0, 1]")
    return value


def _float(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not low <= value <= high:
        raise SettingsError(f"{name} must be between {low} and {high}, got {raw}")
    return value


def _legacy_temperature(env: Mapping[str, str]) -> float:
    """colibri: COLI_TEMP, else TEMP when it is a plain number; negative means auto (0.7)."""
    raw = env.get("COLI_TEMP")
    if not raw:
        temp = env.get("TEMP", "")
        raw = temp if temp.replace(".", "", 1).isdigit() else ""
    if not raw:
        return 0.7
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"COLI_TEMP={raw!r} is not a number") from None
    if value != value or value > 2.0:
        raise SettingsError(f"COLI_TEMP must be at most 2, got {raw}")
    return 0.7 if value < 0 else value


def default_state_dir(model_dir: Path, env: Mapping[str, str]) -> Path:
    """Per user and per model, never the model folder (it may be read-only package data)."""
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    resolved = model_dir.resolve()
    digest = hashlib.sha256(str(resolved).encode("utf-8")).hexdigest()[:12]
    return Path(base) / "colibri" / f"{resolved.name}-{digest}"
