"""``colibri bench --engine accelerated``: both engines side by side in one run, as ratios
(no timing is asserted; the greedy ids must agree, kind (a))."""

from __future__ import annotations

import json

import pytest
from support.accelerated_support import BUILT, NOT_BUILT_REASON

from colibri.cli import main
from colibri.resources import fixture_model_dir

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)


def test_accelerated_section_reports_both_engines_and_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "--engine", "accelerated", "--model", str(fixture_model_dir("glm5-tiny")),
            "--tokens", "2", "--batch", "2", "--warmup", "1", "--no-peers"]
    assert main(argv) == 0
    section = json.loads(capsys.readouterr().out)["sections"]["accelerated-decode"]
    assert set(section) >= {"accelerated", "reference", "same_greedy_ids",
                            "ratio_accelerated_over_reference_decode",
                            "ratio_accelerated_over_reference_decode_batch"}
    assert section["same_greedy_ids"] is True
    for engine in ("accelerated", "reference"):
        assert section[engine]["decode"]["tokens_per_s"] > 0
        assert section[engine]["decode_batch"]["batch"] == 2
    assert section["ratio_accelerated_over_reference_decode"] > 0
