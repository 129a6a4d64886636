"""Models bigger than RAM: RAM_GB bounds the whole process, experts that are not resident are
read by the disk tier (positioned reads into owned buffers), and faults in those reads end the
affected request with a named ERROR while the engine keeps serving."""

from __future__ import annotations

import io
import os
import re
import shutil
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.reference.config import ModelConfig
from colibri.reference.safetensors import Checkpoint, read_all, write_safetensors
from hypothesis import given
from hypothesis import strategies as st
from support.accelerated_support import needs_library
from support.engine_harness import EngineRun, ids, run_engine, submit

from colibri import resources
from colibri.backend_kit.expert_disk import DiskTier, ExpertReadError, checkpoint_extents
from colibri.backend_kit.memory_budget import BudgetTooSmall, split_budget
from colibri.engine.backend import Backend, Step, StepRow, usage_rows
from colibri.engine.registry import BackendOptions, BackendUnavailable, open_backend

TINY = resources.fixture_model_dir("glm5-tiny")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
BACKENDS = ["reference", pytest.param("accelerated", marks=needs_library)]


def _tokens(run: EngineRun, rid: int = 1) -> list[int]:
    return [int(f.payload or b"") for f in run.for_id(rid) if f.kind == "DATA"]


def _budget_line(log: str) -> dict[str, float]:
    found = re.search(r"expert cache [0-9.]+ GB \(([0-9]+) bytes\)", log)
    assert found, log
    return {"cache": float(found.group(1))}


def _fixed_bytes(backend_name: str, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """The budget's fixed part for this model, from the refusal of a budget of one byte."""
    with pytest.raises(BackendUnavailable) as refused:
        open_backend(backend_name, model_dir, BackendOptions(ram_budget_bytes=1, ctx=64),
                     io.StringIO())
    need = re.search(r"need at least RAM_GB=([0-9.]+)", str(refused.value))
    assert need, str(refused.value)
    return round(float(need.group(1)) * 1e9)


def test_a_budget_below_the_fixed_part_is_refused_with_the_minimum() -> None:
    with pytest.raises(BudgetTooSmall, match=r"step holds .* need at least RAM_GB=0\.000003499"):
        split_budget(3_000, runtime=1_000, dense=1_500, kv=500, step=499)
    assert split_budget(3_499, runtime=1_000, dense=1_500, kv=500, step=499).experts == 0


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_engine_refuses_a_budget_that_cannot_hold_the_model(backend_name: str) -> None:
    with pytest.raises(BackendUnavailable, match=r"RAM_GB=0\.000 is too small .* need at least"):
        open_backend(backend_name, TINY, BackendOptions(ram_budget_bytes=1), io.StringIO())


def _held_bytes(backend_name: str, model_dir: Path) -> int:
    """What one cached expert takes: float32 in the reference, stored bytes in the
    accelerated engine (which computes on them in place)."""
    from colibri.reference.config import ModelConfig
    from colibri.reference.experts import stored_expert_bytes

    cfg = ModelConfig.from_dir(model_dir)
    if backend_name == "reference":
        return 3 * cfg.hidden_size * cfg.moe_intermediate_size * 4
    return stored_expert_bytes(Checkpoint(model_dir))(usage_rows(cfg)[0], 0)


@pytest.mark.usefixtures("no_runtime")
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize(("fixture", "cached_experts"), [
    ("glm5-tiny", 0), ("glm5-tiny", 1), ("glm5-tiny", 3), ("glm5-tiny", 64),
    ("glm5-tiny-int4g64", 1), ("glm5-tiny-int4g64", 5)])
def test_tokens_are_the_same_at_any_budget(backend_name: str, fixture: str, cached_experts: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = resources.fixture_model_dir(fixture)
    base = run_engine([submit(1, 0, ids(*PROMPT), 10, ext="ids=1")], model_dir=model_dir,
                      backend_name=backend_name)
    fixed = _fixed_bytes(backend_name, model_dir, monkeypatch)
    expert = _held_bytes(backend_name, model_dir)
    budget = fixed + cached_experts * expert
    run = run_engine([submit(1, 0, ids(*PROMPT), 10, ext="ids=1")], model_dir=model_dir,
                     backend_name=backend_name, env={"RAM_GB": f"{budget / 1e9:.9f}"})
    assert _tokens(run) == _tokens(base)
    cache = _budget_line(run.stderr)["cache"]
    # The refusal's minimum reserves one row's experts for a step; a roomier budget reserves
    # more rows out of what it leaves for experts.
    assert cache <= cached_experts * expert
    if cached_experts <= 3:
        assert cache == cached_experts * expert
    # Each layer's LRU holds its share of the cache.
    layers = len(usage_rows(ModelConfig.from_dir(model_dir)))
    for line in (f.line.decode().split() for f in run.frames if f.kind == "TIERS"):
        assert int(line[2]) <= layers * (cache // layers // expert)
    assert "experts read from disk" in run.stderr


def _split_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """glm5-tiny with its routed experts in a shard of their own (as large checkpoints store
    them), so that shard can be truncated under a running engine."""
    model = tmp_path / "model"
    model.mkdir()
    for name in os.listdir(TINY):
        if not name.endswith(".safetensors") and not name.endswith(".index.json"):
            shutil.copy(TINY / name, model / name)
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(TINY.glob("*.safetensors")):
        tensors.update(read_all(shard))
    experts = {k: v for k, v in tensors.items() if ".mlp.experts." in k}
    dense = {k: v for k, v in tensors.items() if k not in experts}
    write_safetensors(model / "model-00001-of-00002.safetensors", dense)
    write_safetensors(model / "model-00002-of-00002.safetensors", experts)
    return model, model / "model-00002-of-00002.safetensors"


class FaultAt:
    """A backend wrapper that damages the experts' shard before chosen steps and restores it
    before others: a shard truncated (or rewritten) under a running engine."""

    def __init__(self, inner: Backend, shard: Path, break_at: Sequence[int],
                 mend_at: Sequence[int]) -> None:
        self.inner = inner
        self.shard = shard
        self.whole = shard.read_bytes()
        self.break_at, self.mend_at = set(break_at), set(mend_at)
        self.steps = 0

    def step(self, rows: Sequence[StepRow]) -> Step:
        self.steps += 1
        if self.steps in self.break_at:
            with self.shard.open("r+b") as fh:
                fh.truncate(len(self.whole) // 2)
        if self.steps in self.mend_at:
            self.shard.write_bytes(self.whole)
        return self.inner.step(rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.usefixtures("no_runtime")
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_shard_truncated_under_the_engine_ends_the_request_and_the_engine_serves_on(
        backend_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, shard = _split_checkpoint(tmp_path)
    base = run_engine([submit(1, 0, ids(*PROMPT), 6, ext="ids=1")], model_dir=model,
                      backend_name=backend_name)
    budget = _fixed_bytes(backend_name, model, monkeypatch)  # no expert stays cached
    wrapped: list[FaultAt] = []

    def wrap(inner: Backend) -> Backend:
        wrapped.append(FaultAt(inner, shard, break_at=[3], mend_at=[4]))
        return wrapped[0]  # type: ignore[return-value]

    script = [submit(1, 0, ids(*PROMPT), 6, ext="ids=1"),
              submit(2, 0, ids(*PROMPT), 6, ext="ids=1")]
    run = run_engine(script, model_dir=model, backend_name=backend_name, wrap=wrap,
                     env={"RAM_GB": f"{budget / 1e9:.9f}"})
    first = [f.line.decode().strip() for f in run.for_id(1)]
    assert first[-1] == "ERROR 1 EXPERT_READ", first
    assert "[ERROR] expert " in run.stderr and "short read" in run.stderr
    # The file is whole again: the next request gets the tokens of an undamaged run.
    assert _tokens(run, 2) == _tokens(base)
    assert wrapped[0].steps > 4


def test_a_partial_read_is_never_returned_and_the_store_keeps_nothing_of_it(
        tmp_path: Path) -> None:
    from colibri.reference.stored_experts import expert_from_stored

    from colibri.backend_kit.tiered_expert_store import TieredExpertStore

    model, shard = _split_checkpoint(tmp_path)
    cfg = ModelConfig.from_dir(model)
    checkpoint = Checkpoint(model)
    disk = DiskTier(checkpoint_extents(checkpoint))
    rows = usage_rows(cfg)

    def read(layer: int, e: int) -> Any:
        return expert_from_stored(disk.read(layer, e), layer, e, cfg, None)

    def read_submit(keys: Sequence[tuple[int, int]]) -> list[Future[Any]]:
        return disk.submit(keys, lambda s, layer, e: expert_from_stored(s, layer, e, cfg, None))

    store = TieredExpertStore(read, cfg, rows, 0, lambda _l, _e: 1, read_submit=read_submit)
    layer = rows[0]
    whole = shard.read_bytes()
    last = max(checkpoint.info(n).end for n in checkpoint.tensors
               if n.startswith(f"model.layers.{layer}.mlp.experts.7."))
    with shard.open("r+b") as fh:
        fh.truncate(last - 10)  # expert 7's down projection is cut short
    with pytest.raises(ExpertReadError, match=rf"expert {layer}\.7: short read"):
        store.experts(layer, [1, 7])
    assert not store.is_resident(layer, 7) and not store.is_resident(layer, 1)
    shard.write_bytes(whole)
    got = store.experts(layer, [1, 7])
    mapped = Checkpoint(model).float32(f"model.layers.{layer}.mlp.experts.7.down_proj.weight")
    assert np.array_equal(got[1].down, mapped)
    disk.close()


def test_an_io_error_is_a_named_read_error(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _split_checkpoint(tmp_path)
    disk = DiskTier(checkpoint_extents(Checkpoint(model)))

    def failing(*_args: object) -> int:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "preadv", failing)
    with pytest.raises(ExpertReadError, match=r"expert 3\.2: reading .* failed: Input/output"):
        disk.read(3, 2)
    disk.close()


@needs_library
@pytest.mark.usefixtures("no_runtime")
def test_the_accelerated_stack_holds_only_what_the_store_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a budget the experts a step read are process memory: when a layer's experts are
    asked for, every expert an earlier layer's table still holds is one the store holds too
    (the budget counts it), so the tables never keep alive what the cache let go."""
    fixed = _fixed_bytes("accelerated", TINY, monkeypatch)
    backend: Any = open_backend("accelerated", TINY,
                                BackendOptions(ram_budget_bytes=fixed + 2 * 49152, ctx=64),
                                io.StringIO())
    model, store = backend.model, backend.store
    strays: list[int] = []
    kept: list[int] = []
    asked = store.experts_begin

    def experts_begin(layer: int, ids: Sequence[int]) -> Any:
        for block in model._decoder_stack().blocks:
            if block.layer.index != layer:
                held = [e for e in block.transient if block.held[e] is not None]
                kept.append(len(held))
                strays.extend(e for e in held if not store.is_resident(block.layer.index, e))
        return asked(layer, ids)

    monkeypatch.setattr(store, "experts_begin", experts_begin)
    state = backend.new_state()
    for token in PROMPT:
        backend.step([StepRow(state, token, True)])
    assert kept and strays == []
    assert max(kept) > 0  # resident experts stay in the tables between layers and steps
    backend.close()


def _logit_bytes(backend: Any, steps: int = 6) -> list[bytes]:
    state = backend.new_state()
    step = backend.step([StepRow(state, t, True) for t in PROMPT])
    out = [step.logits.tobytes()]
    for _ in range(steps):
        token = int(np.argmax(step.logits[-1]))
        step = backend.step([StepRow(state, token, True)])
        out.append(step.logits.tobytes())
    backend.close()
    return out


@pytest.mark.usefixtures("no_runtime")
@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("cached_experts", [0, 3])
def test_the_bytes_are_the_all_in_ram_bytes(backend_name: str, cached_experts: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Kind (c): on one machine, every logit of a prefill and the decode after it has the same
    bytes with experts read from disk (some resident, the rest read while they compute) as
    with every expert mapped."""
    in_ram = _logit_bytes(open_backend(backend_name, TINY, BackendOptions(ctx=64),
                                       io.StringIO()))
    budget = _fixed_bytes(backend_name, TINY, monkeypatch) + cached_experts * 49152
    capped = _logit_bytes(open_backend(
        backend_name, TINY, BackendOptions(ram_budget_bytes=budget, ctx=64), io.StringIO()))
    assert capped == in_ram


@pytest.mark.usefixtures("no_runtime")
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_load_model_takes_a_ram_budget(backend_name: str) -> None:
    """``load_model(dir, ram_gb=...)`` (both backends' library API): the same logits as the
    unbounded model, a prefill longer than a budgeted forward's rows included, and a budget
    too small refused with the minimum."""
    if backend_name == "reference":
        from colibri.reference import load_model
    else:
        from colibri.accelerated import load_model  # type: ignore[assignment]
    free = load_model(TINY)
    bounded = load_model(TINY, ram_gb=1.0)
    assert bounded.max_step_rows is not None and bounded.max_step_rows < len(PROMPT)
    a, b = free.new_state(), bounded.new_state()
    assert np.array_equal(free.prefill(a, PROMPT), bounded.prefill(b, PROMPT))
    assert np.array_equal(free.decode(a, 26), bounded.decode(b, 26))
    with pytest.raises(BudgetTooSmall, match="need at least RAM_GB="):
        load_model(TINY, ram_gb=1e-6)


def test_the_buffer_pool_reserves_buffers_ahead_and_reads_reuse_them() -> None:
    from colibri.backend_kit.expert_disk import BufferPool

    pool = BufferPool(keep_free=1)
    pool.reserve(100_000, 3)
    assert pool.count(100_000) == 3 and pool.keep_free == 3
    # Reads whose aligned length differs by a block share the reserved buffers.
    taken = [pool.take(100_000 - 4096), pool.take(100_000), pool.take(100_000 + 4096)]
    assert pool.count(100_000) == 3
    del taken
    again = [pool.take(100_000) for _ in range(3)]
    assert pool.count(100_000) == 3 and len({id(b.base) for b in again}) == 3


def test_a_smaller_cache_lets_its_reserved_buffers_go() -> None:
    """The RSS guard shrinks the expert cache; the read buffers reserved for it must go too,
    or the process holds as much as before and the guard shrinks the cache again and again."""
    from colibri.backend_kit.expert_disk import BufferPool

    pool = BufferPool(keep_free=1)
    pool.reserve(100_000, 5)
    held = pool.take(100_000)  # one in use: never let go
    pool.release(2)
    assert pool.count(100_000) == 3  # the one in use and two free
    assert pool.take(100_000).base is not held.base


@pytest.mark.usefixtures("no_runtime")
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_rss_guard_shrinks_the_disk_tiers_buffers_with_the_cache(
        backend_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = _fixed_bytes(backend_name, TINY, monkeypatch) + 8 * 49152
    backend: Any = open_backend(backend_name, TINY, BackendOptions(ram_budget_bytes=budget,
                                                                   ctx=64), io.StringIO())
    kept: list[int] = []
    monkeypatch.setattr(DiskTier, "keep_buffers", lambda _self, count: kept.append(count))
    state = backend.new_state()
    backend.step([StepRow(state, t, False) for t in PROMPT])  # fills the cache: 8 experts
    assert backend.store.tier_counts(usage_rows(backend.shape), 8).ram == 8
    backend.store.trim(4 * 49152)  # the guard: 4 experts' worth too much
    assert kept == [4]  # the 8 experts' buffers reserved for the cache shrink to its new 4
    backend.close()


@given(length=st.integers(1, 64).map(lambda blocks: blocks * 4096),
       piece=st.integers(1, 16).map(lambda blocks: blocks * 4096))
def test_a_long_read_is_split_into_aligned_pieces_that_cover_it(length: int,
                                                               piece: int) -> None:
    import colibri.backend_kit.expert_disk as expert_disk

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(expert_disk, "PIECE", piece)
        ranges = expert_disk.piece_ranges(length)
    assert ranges[0][0] == 0 and ranges[-1][1] == length
    assert all(a < b for a, b in ranges)
    assert all(b == a2 for (_, b), (a2, _) in zip(ranges, ranges[1:], strict=False))
    assert all(a % 4096 == 0 for a, _ in ranges)
    wanted = max(1, round(length / piece))  # pieces of about PIECE bytes, no more
    assert len(ranges) <= wanted
    assert max(b - a for a, b in ranges) < length / wanted + 4096


def test_an_expert_read_in_pieces_is_the_mapped_expert_and_a_cut_piece_is_a_short_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import colibri.backend_kit.expert_disk as expert_disk

    model, shard = _split_checkpoint(tmp_path)
    checkpoint = Checkpoint(model)
    layer = usage_rows(ModelConfig.from_dir(model))[0]
    monkeypatch.setattr(expert_disk, "PIECE", 4096)  # every run is several pieces
    disk = DiskTier(checkpoint_extents(checkpoint))
    stored = disk.read(layer, 7)
    for name, array in stored.items():
        assert np.array_equal(array, checkpoint.raw(name)), name
    down = checkpoint.info(f"model.layers.{layer}.mlp.experts.7.down_proj.weight")
    whole = shard.read_bytes()
    with shard.open("r+b") as fh:  # cut inside a piece that is not the first
        fh.truncate(down.begin + 4096 + 10)
    with pytest.raises(ExpertReadError, match=rf"expert {layer}\.7: short read"):
        disk.read(layer, 7)
    shard.write_bytes(whole)
    disk.close()


def _counting_store(read_ahead_bytes: int) -> tuple[Any, list[tuple[int, int]]]:
    """A store over fake experts (4 bytes each, 4 per layer) whose reads run on a thread, recording
    every read it starts."""
    from concurrent.futures import ThreadPoolExecutor

    from colibri.backend_kit.tiered_expert_store import TieredExpertStore

    cfg = ModelConfig.from_dir(TINY)
    rows = usage_rows(cfg)
    reads: list[tuple[int, int]] = []
    pool = ThreadPoolExecutor(2)

    def read(layer: int, e: int) -> Any:
        return np.full(1, layer * 100 + e, np.int32)

    def read_submit(keys: Sequence[tuple[int, int]]) -> list[Future[Any]]:
        reads.extend(keys)
        return [pool.submit(read, *key) for key in keys]

    store = TieredExpertStore(read, cfg, rows, 16 * len(rows), lambda _l, _e: 1,
                              read_submit=read_submit, held_bytes=lambda _l, _e: 4)
    store.read_ahead_bytes = read_ahead_bytes
    return store, reads


def test_an_expert_read_ahead_is_a_hit_when_asked_for_and_a_wrong_guess_is_dropped() -> None:
    store, reads = _counting_store(read_ahead_bytes=12)
    layer = store.layers[0]
    assert store.prefetch(layer, [1, 2, 3, 4]) == 3  # the room holds three
    assert reads == [(layer, 1), (layer, 2), (layer, 3)]
    assert not store.is_resident(layer, 1)  # a guess is beside the LRU, not in it
    for key in reads:
        store._ahead[key].result()  # the reads are done
    got = store.experts(layer, [1, 5])
    assert [int(w[0]) for w in got] == [layer * 100 + 1, layer * 100 + 5]
    counters = store.counters()
    assert (counters.hits, counters.prefetched, counters.prefetch_used) == (1, 3, 1)
    assert reads[3:] == [(layer, 5)]  # only the unguessed miss was read at the lookup
    assert store.is_resident(layer, 1) and not store.is_resident(layer, 2)
    assert store.prefetch(layer, [1]) == 0  # resident: nothing to read ahead
    assert store.prefetch(layer, [2, 3]) == 2  # the wrong guesses were let go: room again


def test_nothing_is_read_ahead_without_room_or_without_reads_that_overlap() -> None:
    from colibri.backend_kit.tiered_expert_store import TieredExpertStore

    store, reads = _counting_store(read_ahead_bytes=0)
    assert store.prefetch(store.layers[0], [1, 2]) == 0 and reads == []
    cfg = ModelConfig.from_dir(TINY)
    plain = TieredExpertStore(lambda _l, _e: np.zeros(1), cfg, usage_rows(cfg), 10,
                              lambda _l, _e: 1)
    plain.read_ahead_bytes = 10
    assert plain.prefetch(plain.layers[0], [1]) == 0  # reads at once: nothing to overlap


@needs_library
@pytest.mark.usefixtures("no_runtime")
@pytest.mark.parametrize("fixture", ["glm5-tiny", "glm5-chat-small"])
def test_reading_ahead_changes_what_is_read_never_the_bytes(
        fixture: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """READ_AHEAD: the next layer's router guesses from the residual at hand, its guesses are
    read while the layer computes; the logits keep their bytes, and on the trained model
    (whose routers are BF16) a guess is often the expert the layer then asks for."""
    model_dir = resources.fixture_model_dir(fixture)
    in_ram = _logit_bytes(open_backend("accelerated", model_dir, BackendOptions(ctx=64),
                                       io.StringIO()), steps=12)
    expert = _held_bytes("accelerated", model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    # Room for a step of 2+ rows (read-ahead runs in steps of half the rows the reserve is
    # for) and a cache of a quarter of the experts.
    budget = (_fixed_bytes("accelerated", model_dir, monkeypatch)
              + 8 * cfg.num_experts_per_tok * expert
              + len(usage_rows(cfg)) * cfg.n_routed_experts * expert // 4)
    backend: Any = open_backend("accelerated", model_dir,
                                BackendOptions(ram_budget_bytes=budget, ctx=64, read_ahead=1),
                                io.StringIO())
    store = backend.store
    assert _logit_bytes(backend, steps=12) == in_ram
    counters = store.counters()
    assert counters.prefetched > 0
    assert counters.prefetch_used <= counters.prefetched
    if fixture == "glm5-chat-small":  # trained: the residual stream predicts the routing
        assert counters.prefetch_used > 0


@needs_library
@pytest.mark.usefixtures("no_runtime")
def test_the_engine_reads_ahead_only_when_read_ahead_asks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``READ_AHEAD`` reaches the backend through the engine's settings: with it, the store
    reads ahead and the tokens are the plain run's; without it (the default), nothing is read
    ahead."""
    cfg = ModelConfig.from_dir(TINY)
    expert = _held_bytes("accelerated", TINY)
    budget = (_fixed_bytes("accelerated", TINY, monkeypatch)
              + 8 * cfg.num_experts_per_tok * expert
              + len(usage_rows(cfg)) * cfg.n_routed_experts * expert // 4)
    script = [submit(1, 0, ids(*PROMPT), 6, ext="ids=1")]
    plain = run_engine(script, model_dir=TINY, backend_name="accelerated")
    opened: list[Any] = []

    def keep(inner: Backend) -> Backend:
        opened.append(inner)
        return inner

    for read_ahead, reads in (("1", True), (None, False)):
        env = {"RAM_GB": f"{budget / 1e9:.9f}", **({"READ_AHEAD": read_ahead}
                                                   if read_ahead else {})}
        run = run_engine(script, model_dir=TINY, backend_name="accelerated", env=env,
                         wrap=keep)
        assert _tokens(run) == _tokens(plain)
        assert (opened[-1].store.counters().prefetched > 0) is reads
