"""Expert tiers on the real model: disk until routed, a byte-bounded LRU, a pinned hot set
ranked from `.coli_usage`, live re-pinning (REPIN), and what the telemetry says about them."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from colibri.reference.config import ModelConfig
from support.accelerated_support import needs_library
from support.engine_harness import EngineRun, ids, run_engine, submit

from colibri import resources
from colibri.engine.backend import StepRow, sparse_layers, usage_rows
from colibri.engine.registry import BackendOptions, open_backend

TINY = resources.fixture_model_dir("glm5-tiny")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]
EXPERT_BYTES = 3 * 128 * 32 * 4  # gate + up + down of one glm5-tiny expert, float32


def _lines(run: EngineRun, kind: str) -> list[list[str]]:
    return [f.line.decode().split() for f in run.frames if f.kind == kind]


def test_experts_start_on_disk_and_come_into_ram_when_routed() -> None:
    run = run_engine([submit(1, 0, ids(*PROMPT), 8, ext="ids=1")], model_dir=TINY)
    tiers = _lines(run, "TIERS")
    assert tiers[0][1:4] == ["0", "0", "16"]  # handshake: every routed expert on disk
    vram, ram, disk = map(int, tiers[-1][1:4])
    assert vram == 0 and ram > 0 and ram + disk == 16
    emap = bytes.fromhex(_lines(run, "EMAP")[-1][3])
    assert sum(1 for b in emap if b >> 6 == 1) == ram
    assert all((b >> 6 == 1) == ((b & 63) > 0) for b in emap)  # resident iff ever used
    done = _lines(run, "DONE")[0]
    assert float(done[5]) < 100.0  # the first uses were misses


def test_pin_auto_and_live_repin(tmp_path: Path) -> None:
    # A first run writes the usage history the pinned set is ranked from.
    run_engine([submit(1, 0, ids(*PROMPT), 16, ext="ids=1")], model_dir=TINY, state_dir=tmp_path)
    pin_gb = 2 * EXPERT_BYTES / 1e9
    run = run_engine(
        [submit(2, 0, ids(7, 8, 9), 48, ext="ids=1")],
        model_dir=TINY,
        state_dir=tmp_path,
        env={"PIN": "auto", "PIN_GB": f"{pin_gb:.9f}", "REPIN": "8"},
    )
    assert "[PIN] pinned 2 experts from auto" in run.stderr
    first_tiers = _lines(run, "TIERS")[0]
    assert first_tiers[1:4] == ["0", "2", "14"]  # pinned before the first request
    repins = _lines(run, "REPIN")
    assert repins, "no live re-pin swap happened"
    for _, layer, eid, old_tier, gpu in repins:
        assert int(layer) in (3, 4) and 0 <= int(eid) < 8 and old_tier in ("0", "1")
        assert gpu == "-1"


def test_quantized_container_behind_the_tiers_gives_the_reference_tokens() -> None:
    import numpy as np
    from colibri.reference import load_model

    model_dir = resources.fixture_model_dir("glm5-tiny-int4g64")
    run = run_engine([submit(1, 0, ids(*PROMPT), 6, ext="ids=1")], model_dir=model_dir)
    engine_ids = [int(f.payload or b"") for f in run.for_id(1) if f.kind == "DATA"]
    model = load_model(model_dir)  # the quant helper's own dequantizing store
    state = model.new_state()
    logits = model.prefill(state, PROMPT)[-1]
    expected = []
    for _ in range(6):
        token = int(np.argmax(logits))
        expected.append(token)
        logits = model.decode(state, token)
    assert engine_ids == expected
    assert int(_lines(run, "TIERS")[-1][2]) > 0  # dequantized experts sit in the RAM tier


def test_hit_rate_and_disk_time_cover_the_decode_window_only() -> None:
    # One token is sampled from the prefill's row and the turn ends: there is no decode
    # forward, so no expert lookup and no disk read fall in the window DONE and PERF cover,
    # although the prefill itself missed and read experts from disk.
    run = run_engine([submit(1, 0, ids(*PROMPT), 1, ext="ids=1")], model_dir=TINY)
    assert _lines(run, "TIERS")[-1][2] != "0"  # the prefill did bring experts into RAM
    done = _lines(run, "DONE")[0]
    assert done[3] == "1" and done[5] == "0.0"
    perf = _lines(run, "PERF")[0]
    assert perf[3] == "0.000000"  # t_edisk


@needs_library
@pytest.mark.parametrize("fixture", ["glm5-tiny", "glm5-tiny-int4g64", "glm5-tiny-e8"])
def test_tier_bytes_are_stored_bytes_and_the_same_for_both_backends(fixture: str) -> None:
    # The reference holds dequantized float32 experts, the accelerated engine the container's
    # bytes; TIERS' GB and the disk counters count the stored bytes in both (DEVIATIONS.md,
    # "Tier bytes"), so the same traffic reports the same numbers.
    from colibri.reference.safetensors import Checkpoint

    model_dir = resources.fixture_model_dir(fixture)
    checkpoint = Checkpoint(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    reports = []
    for name in ("reference", "accelerated"):
        backend = open_backend(name, model_dir, BackendOptions(), io.StringIO())
        state = backend.new_state()
        step = backend.step([StepRow(state, t, False) for t in PROMPT])
        rows = usage_rows(backend.shape)
        counts = backend.tiers.tier_counts(rows, backend.shape.n_routed_experts)
        reports.append((counts, backend.tiers.counters().disk_bytes, step.routes.tolist()))
        backend.close()
    (ref, ref_disk, ref_routes), (acc, acc_disk, acc_routes) = reports
    assert ref_routes == acc_routes
    routed = {(layer, int(e)) for row in ref_routes
              for layer, chosen in zip(sparse_layers(cfg), row, strict=True) for e in chosen}
    stored = 0
    for layer, e in routed:
        for proj in ("gate", "up", "down"):
            base = f"model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight"
            for tensor in (base, base + ".qs"):
                if tensor in checkpoint:
                    info = checkpoint.info(tensor)
                    stored += info.end - info.begin
    assert acc == ref and acc_disk == ref_disk
    assert ref.ram == len(routed) and ref.ram_bytes == stored == ref_disk
    if fixture != "glm5-tiny":  # quantized: fewer bytes than the float32 the reference holds
        assert stored < len(routed) * 3 * cfg.hidden_size * cfg.moe_intermediate_size * 4
