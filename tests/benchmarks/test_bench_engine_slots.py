"""The `engine-slots` bench section reports what it measured (no timing is asserted)."""

from __future__ import annotations

from colibri import resources
from colibri.benchmarks import BenchOptions, load_sections
from colibri.benchmarks.engine_slots import measure

TINY = resources.fixture_model_dir("glm5-tiny")


def test_measure_times_only_full_steps() -> None:
    result = measure(TINY, slots=3, tokens=4, warmup=1)
    assert result["timed_steps"] == 4
    assert result["aggregate_tokens_per_s"] > 0
    assert result["decode_rows"] > result["decode_steps"]  # it really batched
    assert result["tokens_emitted"] == 3 * (1 + 4 + 3)  # budget per slot, none stopped early


def test_section_report_shape() -> None:
    section = load_sections()["engine-slots"]
    report = section.run(
        BenchOptions(model=TINY, tokens=2, warmup=1, extra={"engine_slots": (1, 8)})
    )
    assert set(report["slots"]) == {"1", "8"}
    assert report["slots"]["1"]["ratio_over_1_slot"] == 1.0
    assert "meets_target" in report and report["target_ratio_8_over_1"] == 3.0
