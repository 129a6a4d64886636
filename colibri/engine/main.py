"""Start an engine process: load the model and its tokenizer, open the state directory, then
run the mux or legacy loop on stdin/stdout (what ``colibri engine`` does)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, TextIO

from colibri.engine.backend import EngineModel, TextTokenizer, usage_rows
from colibri.engine.legacy import LegacyEngine
from colibri.engine.mux import MuxEngine, SignalFlags
from colibri.engine.runtime import EngineRuntime
from colibri.engine.settings import EngineSettings, SettingsError, default_state_dir
from colibri.engine.wire_input import FdSource
from colibri.engine.wire_output import FrameWriter

_SAMPLE = 1 << 16
_SAMPLES = 16


def model_fingerprint(model_dir: Path) -> int:
    """A non-zero int32 naming this model's weights (the `.coli_kv` model tag).

    sha256 over config.json and, per weight file, its size and 16 evenly spaced 64 KiB
    samples (the whole file when small): cheap on a large model, exact on the fixtures.
    """
    digest = hashlib.sha256()
    config = model_dir / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        size = path.stat().st_size
        digest.update(path.name.encode() + size.to_bytes(8, "little"))
        with open(path, "rb") as handle:
            if size <= _SAMPLE * _SAMPLES:
                digest.update(handle.read())
            else:
                for i in range(_SAMPLES):
                    handle.seek((size - _SAMPLE) * i // (_SAMPLES - 1))
                    digest.update(handle.read(_SAMPLE))
    tag = int.from_bytes(digest.digest()[:4], "little", signed=True)
    return tag or 1


def _max_positions(model_dir: Path) -> int:
    try:
        raw = json.loads((model_dir / "config.json").read_text())
        value = raw.get("max_position_embeddings", 4096)
        return int(value) if isinstance(value, int) and value > 0 else 4096
    except (OSError, ValueError):
        return 4096


def load_tokenizer(model_dir: Path) -> TextTokenizer | None:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    from colibri.text.tokenizer import Tokenizer

    loaded: TextTokenizer = Tokenizer.from_file(path)
    return loaded


def build_runtime(settings: EngineSettings, env: Mapping[str, str], log: TextIO) -> EngineRuntime:
    """The reference model with a tiered expert store, its tokenizer, and the state dir."""
    from colibri.reference.config import ModelConfig
    from colibri.reference.expert_store import TieredExpertStore, mapped_reader
    from colibri.reference.kv_codec import ReferenceKvCodec
    from colibri.reference.model import Model
    from colibri.reference.safetensors import Checkpoint
    from colibri.reference.weights import TensorLoader

    model_dir = settings.model_dir
    config = ModelConfig.from_dir(model_dir)
    checkpoint = Checkpoint(model_dir)
    rows = usage_rows(config)
    read = mapped_reader(TensorLoader(checkpoint), config)
    if any(name.endswith(".qs") for name in checkpoint.tensors):
        # A colibri container: experts are dequantized when read (the quant store with no
        # cache of its own; the tiers below are the engine's).
        from colibri.reference.quant.loading import quantized_expert_store

        quantized = quantized_expert_store(model_dir, config, budget_bytes=0)
        if quantized is not None:
            read = quantized.expert
    store = TieredExpertStore(read, config, rows, settings.ram_budget_bytes)
    model = Model(config, checkpoint, store)
    engine_model: EngineModel = model
    state_dir: Path | None = None
    if settings.persist:
        state_dir = settings.state_dir or default_state_dir(model_dir, env)
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(state_dir, os.W_OK):
                raise PermissionError(f"{state_dir} is not writable")
        except OSError as exc:
            raise SettingsError(f"state directory {state_dir}: {exc}") from None
    runtime = EngineRuntime(
        engine_model,
        load_tokenizer(model_dir),
        settings,
        log,
        state_dir=state_dir,
        codec=ReferenceKvCodec(model.new_state()),
        tiers=store,
        model_tag=model_fingerprint(model_dir),
        max_positions=_max_positions(model_dir),
    )
    if model.mtp is not None and settings.draft != 0:
        runtime.drafter = model
    if settings.pin is not None:
        ranked = _pin_ranking(runtime, settings.pin, log)
        count = store.pin(ranked, settings.pin_budget_bytes)
        print(f"[PIN] pinned {count} experts from {settings.pin}", file=log)
    if settings.repin_every > 0:
        runtime.repinner = store.repin_pass
    return runtime


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
    print(f"== colibri reference engine: loading {settings.model_dir} ==", file=log)
    from colibri.reference.errors import CheckpointError

    try:
        runtime = build_runtime(settings, env, log)
    except (SettingsError, CheckpointError, OSError, ValueError) as exc:
        # Nothing reaches stdout: a server waiting for READY sees EOF and the exit status.
        print(f"colibri engine: cannot start: {exc}", file=log)
        return 2
    out = FrameWriter(stdout)
    shape = runtime.shape
    arch = getattr(shape, "model_type", "?")
    out.line(
        f"== colibri reference engine ({arch}) | layers={shape.num_hidden_layers} "
        f"experts={shape.n_routed_experts} | slots={settings.kv_slots} ctx={runtime.ctx} | "
        f"MTP {'ACTIVE' if runtime.drafter is not None else 'absent'} =="
    )
    source = FdSource(stdin_fd)
    if not settings.mux:
        return LegacyEngine(
            runtime,
            source,
            out,
            temperature=settings.legacy_temperature,
            top_p=settings.legacy_top_p,
        ).run()
    flags = SignalFlags()

    def on_interrupt(signum: int, frame: object) -> None:
        flags.interrupt = True

    def on_terminate(signum: int, frame: object) -> None:
        flags.terminate = True

    signal.signal(signal.SIGINT, on_interrupt)
    signal.signal(signal.SIGTERM, on_terminate)
    return MuxEngine(runtime, source, out, flags).run()


def main_from_environment(settings: EngineSettings, env: Mapping[str, str] | None = None) -> int:
    environment = os.environ if env is None else env
    return serve(
        settings, environment, stdin_fd=sys.stdin.fileno(), stdout=sys.stdout.buffer, log=sys.stderr
    )
