"""The VRAM tier's settings: CUDA_EXPERT_GB (a size or auto), CUDA_RESERVE_GB (colibri's 2.0),
COLI_CUDA=0 switching the tier off, and the per-device budget rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from colibri.engine.registry import vram_budget
from colibri.engine.settings import SettingsError, from_environment

MODEL = Path("m")


@pytest.mark.parametrize(("env", "budget", "reserve"), [
    ({}, 0, 2_000_000_000),
    ({"CUDA_EXPERT_GB": "12.5"}, 12_500_000_000, 2_000_000_000),
    ({"CUDA_EXPERT_GB": "auto"}, -1, 2_000_000_000),
    ({"CUDA_EXPERT_GB": "AUTO", "CUDA_RESERVE_GB": "0.5"}, -1, 500_000_000),
    ({"CUDA_EXPERT_GB": "4", "COLI_CUDA": "0"}, 0, 2_000_000_000),
])
def test_environment(env: dict[str, str], budget: int, reserve: int) -> None:
    settings = from_environment(env, model_dir=MODEL)
    assert (settings.vram_budget_bytes, settings.vram_reserve_bytes) == (budget, reserve)


@pytest.mark.parametrize("raw", ["-1", "lots", "nan"])
def test_bad_budget_is_a_settings_error(raw: str) -> None:
    with pytest.raises(SettingsError, match="CUDA_EXPERT_GB"):
        from_environment({"CUDA_EXPERT_GB": raw}, model_dir=MODEL)


def test_budget_rule() -> None:
    gb = 1_000_000_000
    assert vram_budget(0, 100 * gb, 2 * gb) == 0  # no tier asked for
    assert vram_budget(-1, 100 * gb, 2 * gb) == 98 * gb  # auto: free minus the reserve
    assert vram_budget(120 * gb, 100 * gb, 2 * gb) == 98 * gb  # capped by the device
    assert vram_budget(10 * gb, 100 * gb, 2 * gb) == 10 * gb
    assert vram_budget(10 * gb, 1 * gb, 2 * gb) == 0  # the reserve does not fit
    assert vram_budget(10 * gb, -1, 2 * gb) == 10 * gb  # free unknown: the device refuses
    assert vram_budget(-1, -1, 2 * gb) == 0


@given(st.integers(-1, 10**12), st.integers(-1, 10**12), st.integers(0, 10**11))
def test_budget_never_exceeds_the_request_or_the_free_memory(req: int, free: int,
                                                             reserve: int) -> None:
    b = vram_budget(req, free, reserve)
    assert b >= 0
    if req >= 0:
        assert b <= req
    if free >= 0:
        assert b <= max(0, free - reserve)
