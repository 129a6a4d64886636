"""``colibri bench --engine accelerated``: both engines side by side in one run, as ratios
(no timing is asserted; the greedy ids must agree, kind (a))."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.accelerated_support import BUILT, NOT_BUILT_REASON

from colibri.cli import main
from colibri.resources import fixture_model_dir

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)


def test_accelerated_section_reports_both_engines_and_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Only the section asserted on (the other sections of the engine have tests of their own).
    argv = ["bench", "--section", "accelerated-decode",
            "--model", str(fixture_model_dir("glm5-tiny")),
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
        prefill = section[engine]["prefill"]
        assert prefill["prompt_tokens"] == 12 and prefill["prefill_tokens"] == 64
        assert prefill["time_to_first_token_ms"] > 0 and prefill["prefill_tokens_per_s"] > 0
    assert section["ratio_accelerated_over_reference_decode"] > 0
    assert section["ratio_accelerated_over_reference_prefill"] > 0
    assert section["llama_cpp"] == {"skipped": "--no-peers"}
    assert "skipped" in section["accelerated_int4g64_int8_io_int8"]  # only on the bench model


def test_llama_cpp_peer_is_skipped_with_a_reason(tmp_path: Path) -> None:
    import sys

    from colibri.benchmarks.llama_cpp_peer import gguf_path, run_peer, unavailable_reason

    gguf = gguf_path(tmp_path, Path("glm5-bench-1234"), "q8_0")
    assert gguf == tmp_path / "gguf" / "glm5-bench-1234-q8_0.gguf"
    # llama_cpp is never a dependency of colibri's environment; where it is installed
    # the missing GGUF is the reason.
    reason = unavailable_reason(sys.executable, gguf)
    assert reason is not None
    assert "llama_cpp" in reason or "no GGUF" in reason
    got = run_peer(sys.executable, gguf, 64, 2, 1, 2, lambda steps: {})
    assert got == {"skipped": reason}


def test_interleaved_section_says_why_it_skipped(tmp_path: Path) -> None:
    from colibri.benchmarks import BenchOptions
    from colibri.benchmarks.interleaved_decode import run

    assert run(BenchOptions(peers=False)) == {"skipped": "--no-peers"}
    assert "skipped" in run(BenchOptions(model=fixture_model_dir("glm5-tiny")))
    # No GGUF in a fresh cache (and nothing generated to find that out).
    got = run(BenchOptions(cache_dir=tmp_path))
    assert "llama_cpp" in got["f32"]["skipped"] or "no GGUF" in got["f32"]["skipped"]
    assert "container" in got["int4g64_int8_io_int8_vs_q8_0"]["skipped"]
    assert list(tmp_path.iterdir()) == []
