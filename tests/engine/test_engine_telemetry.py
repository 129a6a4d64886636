"""PERF/PROF report the backend's measured phases; HWINFO/GPUS its devices (protocol.md 2.6)."""

from __future__ import annotations

import pytest
from support.engine_fakes import FakeBackend
from support.engine_harness import EngineRun, ids, run_engine, submit

from colibri import resources
from colibri.engine.backend import Device, StepTiming

GIB = 1 << 30


def _line(run: EngineRun, kind: str) -> list[str]:
    return next(f.line.decode().split() for f in reversed(run.frames) if f.kind == kind)


def test_perf_and_prof_sum_the_decode_steps_of_the_backend() -> None:
    timing = StepTiming(total_s=0.5, matmul_s=0.25, attention_s=0.125, head_s=0.0625)
    run = run_engine(submit(5, 0, ids(3, 4, 5), 4, ext="ids=1"), model=FakeBackend(timing=timing))
    perf = _line(run, "PERF")
    prof = _line(run, "PROF")
    # 4 tokens: the first comes from the prefill (outside the decode window), 3 decode steps.
    assert perf[5:7] + perf[8:9] == ["0.750000", "0.375000", "0.187500"]
    assert prof[6:9] == ["0.750", "0.375", "0.188"]
    assert perf[4] == "0.000000"  # no async expert loads: expert waits are always 0


def test_a_batched_step_counts_for_each_of_its_requests() -> None:
    timing = StepTiming(total_s=0.5, matmul_s=0.25, attention_s=0.125, head_s=0.0625)
    script = submit(1, 0, ids(3, 4), 3, ext="ids=1") + submit(2, 1, ids(5, 6), 3, ext="ids=1")
    run = run_engine(script, model=FakeBackend(timing=timing), kv_slots=2)
    perfs = [f.line.decode().split() for f in run.frames if f.kind == "PERF"]
    assert [p[1] for p in perfs] == ["1", "2"]
    assert [p[5] for p in perfs] == ["0.500000", "0.500000"]


def test_hwinfo_and_gpus_come_from_the_backend_devices() -> None:
    devices = [Device(0, "Fake H1", 80 * GIB, 2 * GIB, 12), Device(1, "Fake H1", 80 * GIB)]
    run = run_engine(submit(5, 0, ids(3, 4), 2, ext="ids=1"), model=FakeBackend(devices=devices))
    hwinfos = [f.line.decode() for f in run.frames if f.kind == "HWINFO"]
    gpus = [f.line.decode().rstrip("\n") for f in run.frames if f.kind == "GPUS"]
    assert len(hwinfos) == 2 and len(gpus) == 2  # the handshake and the turn-end block
    fields = hwinfos[-1].split()
    assert fields[4:6] == ["2", f"{160 * GIB / 1e9:.1f}"]
    assert hwinfos[-1].rstrip("\n").endswith("|Fake H1")
    assert gpus[-1] == f"GPUS 2 2.147 {80 * GIB / 1e9:.3f} 12 0.000 {80 * GIB / 1e9:.3f} 0"


def test_cpu_backend_reports_no_devices() -> None:
    run = run_engine(submit(5, 0, ids(3, 4), 2, ext="ids=1"))
    assert _line(run, "GPUS") == ["GPUS", "0"]
    hwinfo = _line(run, "HWINFO")
    assert hwinfo[4:6] == ["0", "0.0"]
    assert " ".join(hwinfo).endswith("|")


@pytest.mark.parametrize("max_tokens", [4])
def test_reference_perf_phases_are_measured_and_within_the_decode_time(max_tokens: int) -> None:
    run = run_engine(
        submit(5, 0, ids(3, 4, 5), max_tokens, ext="ids=1"),
        model_dir=resources.fixture_model_dir("glm5-tiny"),
    )
    perf = [float(v) for v in _line(run, "PERF")[2:]]
    decode, _disk, wait, emm, attn, _kvb, head = perf
    assert wait == 0.0
    assert emm > 0 and attn > 0 and head > 0
    assert emm + attn + head <= decode
