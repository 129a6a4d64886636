"""Start an engine process: load the model and its tokenizer, open the state directory, then
run the mux or legacy loop on stdin/stdout (what ``colibri engine`` does)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, TextIO

from colibri.engine import usage_file
from colibri.engine.backend import Backend
from colibri.engine.legacy import LegacyEngine
from colibri.engine.mux import MuxEngine, SignalFlags
from colibri.engine.registry import BackendOptions, BackendUnavailable, open_backend
from colibri.engine.runtime import EngineRuntime, TextTokenizer
from colibri.engine.settings import DEFAULT_CTX, EngineSettings, SettingsError, default_state_dir
from colibri.engine.wire_input import FdSource
from colibri.engine.wire_output import FrameWriter


def _max_positions(model_dir: Path) -> int:
    try:
        raw = json.loads((model_dir / "config.json").read_text())
        value = raw.get("max_position_embeddings", 4096)
        return int(value) if isinstance(value, int) and value > 0 else 4096
    except (OSError, ValueError):
        return 4096


def load_tokenizer(model_dir: Path) -> TextTokenizer | None:
    """The model's ``tokenizer.json``, else its tiktoken ``tiktoken.model`` (Kimi's format);
    None when it has neither."""
    if not (model_dir / "tokenizer.json").is_file() and not (
            model_dir / "tiktoken.model").is_file():
        return None
    from colibri.text import Tokenizer

    loaded: TextTokenizer = Tokenizer.from_file(model_dir)
    return loaded


def backend_options(settings: EngineSettings, ctx: int) -> BackendOptions:
    """What the settings ask of the backend they open (``ctx`` positions per slot)."""
    return BackendOptions(ram_budget_bytes=settings.ram_budget_bytes, device=settings.device,
                          kv_slots=settings.kv_slots, ctx=ctx,
                          rss_guard_bytes=settings.rss_guard_bytes,
                          read_ahead=settings.read_ahead,
                          vram_budget_bytes=settings.vram_budget_bytes,
                          vram_reserve_bytes=settings.vram_reserve_bytes,
                          cluster=settings.cluster,
                          cluster_workers=settings.cluster_workers,
                          cluster_placement=settings.cluster_placement)


def build_runtime(
    settings: EngineSettings,
    env: Mapping[str, str],
    log: TextIO,
    *,
    backend: Backend | None = None,
    tokenizer: TextTokenizer | None = None,
    ignore_stops: bool = False,
) -> EngineRuntime:
    """The one place an ``EngineRuntime`` is built: the backend (``settings.backend`` from the
    registry unless one is given, as tests and benchmarks do), the model's tokenizer (unless
    given), the state directory, and the pinned hot set."""
    model_dir = settings.model_dir
    if backend is None:
        ctx = settings.ctx or min(DEFAULT_CTX, _max_positions(model_dir))
        options = backend_options(settings, ctx)
        try:
            backend = open_backend(settings.backend, model_dir, options, log)
        except BackendUnavailable as exc:
            raise SettingsError(str(exc)) from None
    if tokenizer is None:
        tokenizer = load_tokenizer(model_dir)
    state_dir: Path | None = None
    if settings.persist:
        state_dir = settings.state_dir or default_state_dir(model_dir, env)
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(state_dir, os.W_OK):
                raise PermissionError(f"{state_dir} is not writable")
        except OSError as error:  # not `exc`: mypyc gives a name one type per function
            raise SettingsError(f"state directory {state_dir}: {error}") from None
    runtime = EngineRuntime(
        backend,
        tokenizer,
        settings,
        log,
        state_dir=state_dir,
        max_positions=_max_positions(model_dir),
        ignore_stops=ignore_stops,
    )
    if settings.pin is not None:
        ranked = _pin_ranking(runtime, settings.pin, log)
        count = runtime.tiers.pin(ranked, settings.pin_budget_bytes)
        print(f"[PIN] pinned {count} experts from {settings.pin}", file=log)
    elif settings.vram_budget_bytes != 0:
        # colibri uploads a prefix of the pin ranking to VRAM; without PIN the ranking is the
        # engine's own history and nothing is pinned in RAM. A store with no VRAM tier (a CPU
        # backend) places nothing, so its output is unchanged.
        count = runtime.tiers.pin(_pin_ranking(runtime, "auto", log), 0)
        if count:
            print(f"[VRAM] placed {count} experts from the usage history", file=log)
    elif settings.autopin and runtime.tiers.expert_cache_bytes > 0:
        _autopin(runtime, log)
    return runtime


#: AUTOPIN waits for this many recorded selections, and shares out its whole budget from
#: AUTOPIN_FULL on (colibri's numbers).
AUTOPIN_MIN_SELECTIONS = 5000
AUTOPIN_FULL = 200_000


def _autopin(runtime: EngineRuntime, log: TextIO) -> None:
    """colibri's AUTOPIN: with a usage history of at least 5000 selections, pin its hottest
    experts in half the expert cache, scaled down while the history is short; the other half
    stays the LRU's."""
    history = int(runtime.usage.counts.sum())
    if history < AUTOPIN_MIN_SELECTIONS:
        return
    budget = int(0.5 * runtime.tiers.expert_cache_bytes * min(1.0, history / AUTOPIN_FULL))
    count = runtime.tiers.pin(_pin_ranking(runtime, "auto", log), budget)
    print(f"[PIN] AUTOPIN: pinned {count} experts in {budget / 1e9:.2f} GB from {history} "
          "recorded selections", file=log)


def _pin_ranking(runtime: EngineRuntime, pin: str, log: TextIO) -> list[tuple[int, int]]:
    """Experts by descending usage count (ties: lower layer, then lower id)."""
    counts = runtime.usage.counts
    if pin != "auto":
        from colibri.engine import usage_file

        try:
            counts = usage_file.parse(
                Path(pin).read_bytes(),
                runtime.shape.num_hidden_layers,
                runtime.n_experts,
                set(runtime.rows),
            )
        except (OSError, usage_file.UsageFileError) as exc:
            print(f"[PIN] ignoring {pin}: {exc}", file=log)
            return []
    pairs = [
        (int(counts[layer, e]), layer, e)
        for layer in runtime.rows
        for e in range(runtime.n_experts)
        if counts[layer, e] > 0
    ]
    pairs.sort(key=lambda item: (-item[0], item[1], item[2]))
    return [(layer, e) for _, layer, e in pairs]


def serve(
    settings: EngineSettings,
    env: Mapping[str, str],
    *,
    stdin_fd: int,
    stdout: BinaryIO,
    log: TextIO,
) -> int:
    """Load, then run the selected protocol until EOF. Returns the exit status."""
    print(f"== colibri {settings.backend} engine: loading {settings.model_dir} ==", file=log)
    try:
        runtime = build_runtime(settings, env, log)
    except (SettingsError, OSError, ValueError) as exc:
        # Nothing reaches stdout: a server waiting for READY sees EOF and the exit status.
        print(f"colibri engine: cannot start: {exc}", file=log)
        return 2
    out = FrameWriter(stdout)
    shape = runtime.shape
    arch = getattr(shape, "model_type", "?")
    out.line(
        f"== colibri {runtime.backend.name} engine ({arch}) | layers={shape.num_hidden_layers} "
        f"experts={shape.n_routed_experts} | slots={settings.kv_slots} ctx={runtime.ctx} | "
        f"MTP {'ACTIVE' if runtime.drafting else 'absent'} =="
    )
    source = FdSource(stdin_fd)
    if not settings.mux:
        status = LegacyEngine(
            runtime,
            source,
            out,
            temperature=settings.legacy_temperature,
            top_p=settings.legacy_top_p,
        ).run()
        return dump_stats(runtime, env.get("STATS"), log, status)
    flags = SignalFlags()

    def on_interrupt(signum: int, frame: object) -> None:
        flags.interrupt = True

    def on_terminate(signum: int, frame: object) -> None:
        flags.terminate = True

    signal.signal(signal.SIGINT, on_interrupt)
    signal.signal(signal.SIGTERM, on_terminate)
    status = MuxEngine(runtime, source, out, flags).run()
    return dump_stats(runtime, env.get("STATS"), log, status)


def dump_stats(runtime: EngineRuntime, path: str | None, log: TextIO, status: int) -> int:
    """`STATS=<path>`: at exit, the usage counters in `.coli_usage` format (spec/protocol.md
    4.2 "STATS dump"); exit 1 when it cannot be written, since an atlas sweep reads it."""
    if not path:
        return status
    try:
        usage_file.save(Path(path), runtime.usage.counts)
    except OSError as exc:
        print(f"colibri engine: cannot write STATS {path}: {exc}", file=log)
        return status or 1
    print(f"[STATS] wrote {path}", file=log)
    return status


def main_from_environment(settings: EngineSettings, env: Mapping[str, str] | None = None) -> int:
    environment = os.environ if env is None else env
    return serve(
        settings, environment, stdin_fd=sys.stdin.fileno(), stdout=sys.stdout.buffer, log=sys.stderr
    )
