"""The numpy backend: the reference model behind the engine seam (colibri.engine.backend).

It owns the KV states (``KVState``), the tiered expert store (disk, byte-bounded RAM LRU,
pinned hot set) and the COLIKV1 codec; ``step`` is one ``Model.forward_rows`` call.
"""

from __future__ import annotations

import hashlib
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import numpy.typing as npt
from colibri.reference.config import ModelConfig
from colibri.reference.expert_store import TieredExpertStore, mapped_reader
from colibri.reference.experts import stored_expert_bytes
from colibri.reference.indexer_presence import log_indexer
from colibri.reference.kv_cache import KVState
from colibri.reference.kv_codec import ReferenceKvCodec
from colibri.reference.model import Model
from colibri.reference.safetensors import Checkpoint
from colibri.reference.timing import PhaseClock
from colibri.reference.weights import TensorLoader

from colibri.engine.backend import Device, Draft, KvRecord, Step, StepRow, StepTiming
from colibri.engine.registry import BackendOptions

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


def reference_build() -> str:
    """numpy and its BLAS decide the bytes of the reference's products; the machine decides
    which BLAS kernels run."""
    from colibri import __version__

    return f"colibri {__version__}; numpy {np.__version__}; {platform.machine()}"


class KVStateModel(Protocol):
    """What :class:`KVStateBackend` needs of a model: the reference's, or any model that keeps
    its cache in :class:`KVState` (the accelerated engine's does, so both share the COLIKV1
    codec and ``.coli_kv`` files)."""

    @property
    def config(self) -> ModelConfig: ...
    @property
    def mtp(self) -> object | None: ...
    @property
    def clock(self) -> PhaseClock: ...
    def new_state(self) -> KVState: ...
    def forward_rows(
        self, states: Sequence[KVState], tokens: Sequence[int], wants_logits: Sequence[bool]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]: ...
    def mtp_draft_routed(
        self, state: KVState, token: int
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]: ...


class KVStateBackend:
    """The seam's bookkeeping for a backend whose states are :class:`KVState`: shape, model
    tag, KV record layout and codec, tiers, state length/truncation, the step with its phase
    clock, MTP drafts, no devices. A backend adds ``name``, ``build`` and ``close``."""

    def __init__(self, model: KVStateModel, store: TieredExpertStore, model_tag: int) -> None:
        self._kv_model = model
        self.store = store
        self._tag = model_tag
        self._codec = ReferenceKvCodec(model.new_state())

    @property
    def shape(self) -> ModelConfig:
        return self._kv_model.config

    @property
    def model_tag(self) -> int:
        return self._tag

    @property
    def has_mtp(self) -> bool:
        return self._kv_model.mtp is not None

    @property
    def kv_record(self) -> KvRecord:
        return KvRecord(self._codec.record_floats, self._codec.indexer_layers)

    @property
    def tiers(self) -> TieredExpertStore:
        return self.store

    def new_state(self) -> KVState:
        return self._kv_model.new_state()

    def step(self, rows: Sequence[StepRow]) -> Step:
        clock = self._kv_model.clock
        clock.reset()
        started = time.perf_counter()
        logits, routes = self._kv_model.forward_rows(
            [r.state for r in rows], [r.token for r in rows], [r.wants_logits for r in rows]
        )
        total = time.perf_counter() - started
        return Step(
            logits, routes, StepTiming(total, clock.matmul_s, clock.attention_s, clock.head_s)
        )

    def length(self, state: Any) -> int:
        assert isinstance(state, KVState)
        return state.length

    def truncate(self, state: Any, n: int) -> None:
        assert isinstance(state, KVState)
        state.truncate(n)

    def draft(self, state: Any, token: int) -> Draft:
        assert isinstance(state, KVState)
        logits, routes = self._kv_model.mtp_draft_routed(state, token)
        return Draft(logits, routes)

    def export_kv(self, state: Any, start: int, stop: int) -> npt.NDArray[np.float32]:
        return self._codec.export_rows(state, start, stop)

    def import_kv(self, state: Any, tokens: Sequence[int], rows: npt.NDArray[np.float32]) -> None:
        self._codec.restore(state, tokens, rows)

    def devices(self) -> list[Device]:
        return []  # both compute on the CPU: HWINFO counts no devices, GPUS is `GPUS 0`


class ReferenceBackend(KVStateBackend):
    name = "reference"
    build = reference_build()

    def __init__(self, model: Model, store: TieredExpertStore, model_tag: int) -> None:
        super().__init__(model, store, model_tag)
        self.model = model

    def close(self) -> None:
        pass


def open_backend(model_dir: Path, options: BackendOptions, log: TextIO) -> ReferenceBackend:
    """The reference model with a tiered expert store over its checkpoint or container."""
    if options.device not in (None, "cpu"):
        raise ValueError(f"the reference backend runs on the CPU, not {options.device!r}")
    from colibri.engine.backend import usage_rows

    config = ModelConfig.from_dir(model_dir)
    checkpoint = Checkpoint(model_dir)
    read = mapped_reader(TensorLoader(checkpoint), config)
    if any(name.endswith(".qs") for name in checkpoint.tensors):
        # A colibri container: experts are dequantized when read (the quant store with no
        # cache of its own; the tiers are the tiered store's).
        from colibri.reference.quant.loading import quantized_expert_store

        quantized = quantized_expert_store(model_dir, config, budget_bytes=0)
        if quantized is not None:
            read = quantized.expert
    store = TieredExpertStore(read, config, usage_rows(config), options.ram_budget_bytes,
                              stored_expert_bytes(checkpoint))
    model = Model(config, checkpoint, store)
    log_indexer(model.indexer, log)
    return ReferenceBackend(model, store, model_fingerprint(model_dir))
