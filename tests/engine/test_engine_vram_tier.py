"""The VRAM tier through the real engine loop: CUDA_EXPERT_GB (or --vram-gb) with a backend
whose store has a device tier shows tier-2 experts in the handshake's TIERS and EMAP, and live
REPIN names the device; the device is the in-memory double (support/vram_double.py), the
model and store are the reference's, so what is tested is the store's books as the wire
reports them. Without a device tier the same settings change nothing."""

from __future__ import annotations

from pathlib import Path

from colibri.reference.backend import ReferenceBackend
from support.engine_harness import EngineRun, ids, run_engine, submit
from support.vram_double import InMemoryVram

from colibri import resources
from colibri.engine.backend import Backend

TINY = resources.fixture_model_dir("glm5-tiny")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]


def _lines(run: EngineRun, kind: str) -> list[list[str]]:
    return [f.line.decode().split() for f in run.frames if f.kind == kind]


def _with_device(slots: int) -> tuple[list[InMemoryVram], object]:
    devices: list[InMemoryVram] = []

    def wrap(backend: Backend) -> Backend:
        assert isinstance(backend, ReferenceBackend)
        store = backend.store
        one = store.stored_bytes((3, 0))
        device = InMemoryVram(slots * one, lambda layer, e: store.stored_bytes((layer, e)))
        store.attach_vram(device, slots * one, gpu=0)
        devices.append(device)
        return backend

    return devices, wrap


def test_vram_experts_in_the_handshake_tiers_and_emap() -> None:
    devices, wrap = _with_device(slots=5)
    run = run_engine([submit(1, 0, ids(*PROMPT), 4, ext="ids=1")], model_dir=TINY,
                     env={"CUDA_EXPERT_GB": "auto"}, wrap=wrap)  # type: ignore[arg-type]
    tiers = _lines(run, "TIERS")
    # no history: the fill places experts in id order while the budget (5 experts) lasts
    assert tiers[0][1:4] == ["5", "0", "11"]
    one = run.engine.rt.tiers.stored_bytes((3, 0))  # type: ignore[attr-defined]
    assert float(tiers[0][4]) == round(5 * one / 1e9, 2)
    emap = bytes.fromhex(_lines(run, "EMAP")[0][3])
    assert [b >> 6 for b in emap[:6]] == [2, 2, 2, 2, 2, 0]
    assert set(devices[0].resident) == {(3, e) for e in range(5)}
    # later blocks: routed experts came into RAM beside the five on the device
    vram, ram, disk = map(int, _lines(run, "TIERS")[-1][1:4])
    assert vram == 5 and ram > 0 and vram + ram + disk == 16
    last = bytes.fromhex(_lines(run, "EMAP")[-1][3])
    assert sum(1 for b in last if b >> 6 == 2) == 5
    assert sum(1 for b in last if b >> 6 == 1) == ram


def test_repin_moves_hot_experts_onto_the_device(tmp_path: Path) -> None:
    run_engine([submit(1, 0, ids(*PROMPT), 16, ext="ids=1")], model_dir=TINY, state_dir=tmp_path)
    devices, wrap = _with_device(slots=2)
    run = run_engine([submit(2, 0, ids(7, 8, 9), 48, ext="ids=1")], model_dir=TINY,
                     state_dir=tmp_path, env={"CUDA_EXPERT_GB": "auto", "REPIN": "4"},
                     wrap=wrap)  # type: ignore[arg-type]
    assert _lines(run, "TIERS")[0][1] == "2"
    repins = _lines(run, "REPIN")
    on_device = [r for r in repins if r[4] == "0"]
    assert on_device, f"no VRAM swap in {repins}"
    for _, layer, eid, old_tier, _gpu in on_device:
        assert int(layer) in (3, 4) and 0 <= int(eid) < 8 and old_tier in ("0", "1")
    for line in _lines(run, "TIERS"):
        assert line[1] == "2"  # swaps keep the device's count
    assert len(devices[0].resident) == 2


def test_without_a_device_tier_the_budget_changes_nothing() -> None:
    script = [submit(1, 0, ids(*PROMPT), 4, ext="ids=1")]
    plain = run_engine(script, model_dir=TINY)
    budgeted = run_engine(script, model_dir=TINY, env={"CUDA_EXPERT_GB": "8"})
    for kind in ("TIERS", "EMAP", "GPUS", "DATA", "HITS"):
        assert _lines(plain, kind) == _lines(budgeted, kind)
    assert "[VRAM]" not in budgeted.stderr
