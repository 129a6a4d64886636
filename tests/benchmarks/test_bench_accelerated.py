"""``colibri bench --engine accelerated``: both engines side by side in one run, as ratios
(no timing is asserted; the greedy ids must agree, kind (a))."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.accelerated_support import BUILT, NOT_BUILT_REASON
from support.reference_support import mapped_file_bytes

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
        # RSS grown at load, beside the absolute figure the interpreter dominates
        grown = section[engine]["rss_growth_at_load_bytes"]
        assert 0 <= grown < section[engine]["rss_after_load_bytes"]
        assert section[engine]["rss_growth_at_load_vs_checkpoint"] == pytest.approx(
            grown / section["checkpoint_bytes"])
        # of which the checkpoint's own map (page cache) and what the engine allocated
        in_maps = section[engine]["rss_growth_in_weight_maps_bytes"]
        assert 0 < in_maps <= mapped_file_bytes(fixture_model_dir("glm5-tiny"))
        assert section[engine]["rss_growth_outside_weight_maps_bytes"] == grown - in_maps
    assert section["ratio_accelerated_over_reference_decode"] > 0
    assert section["ratio_accelerated_over_reference_prefill"] > 0
    assert section["llama_cpp"] == {"skipped": "--no-peers"}
    assert "skipped" in section["accelerated_int4g64_int8_io_int8"]  # only on the bench model


def test_llama_cpp_peer_is_skipped_with_a_reason(tmp_path: Path) -> None:
    import sys

    from colibri.benchmarks import BenchOptions
    from colibri.benchmarks.decode_sections import llama_cpp_alone
    from colibri.benchmarks.llama_cpp_peer import gguf_path, unavailable_reason

    gguf = gguf_path(tmp_path, Path("glm5-bench-1234"), "q8_0")
    assert gguf == tmp_path / "gguf" / "glm5-bench-1234-q8_0.gguf"
    # llama_cpp is never a dependency of colibri's environment; where it is installed
    # the missing GGUF is the reason.
    reason = unavailable_reason(sys.executable, gguf)
    assert reason is not None
    assert "llama_cpp" in reason or "no GGUF" in reason
    got = llama_cpp_alone(BenchOptions(tokens=2, warmup=1), gguf, 2)
    assert got == {"skipped": reason}


def test_interleaved_section_says_why_it_skipped(tmp_path: Path) -> None:
    from colibri.benchmarks import BenchOptions
    from colibri.benchmarks.turn_sections import interleaved as run

    assert run(BenchOptions(peers=False)) == {"skipped": "--no-peers"}
    assert "skipped" in run(BenchOptions(model=fixture_model_dir("glm5-tiny")))
    # No GGUF in a fresh cache (and nothing generated to find that out).
    got = run(BenchOptions(cache_dir=tmp_path))
    assert "llama_cpp" in got["f32"]["skipped"] or "no GGUF" in got["f32"]["skipped"]
    assert "container" in got["int4g64_int8_io_int8_vs_q8_0"]["skipped"]
    assert list(tmp_path.iterdir()) == []


def test_roofline_section_alternates_copy_probe_and_decode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "--section", "accelerated-roofline",
            "--model", str(fixture_model_dir("glm5-tiny")), "--tokens", "2", "--batch", "2"]
    assert main(argv) == 0
    section = json.loads(capsys.readouterr().out)["sections"]["accelerated-roofline"]
    from colibri.benchmarks.turn_sections import ROUNDS

    assert section["rounds"] == ROUNDS and section["batch"] == 2
    for key in ("copy_bandwidth_gb_per_s", "single_over_copy_bandwidth",
                "read_stream_gb_per_s", "single_over_read_stream",
                "read_stream_one_thread_gb_per_s", "read_stream_threads_over_one",
                "batch_fraction_of_its_bound", "batch_over_single_tokens_per_s",
                "batch_bound_over_single"):
        spread = section[key]
        assert len(spread["rounds"]) == ROUNDS
        assert min(spread["rounds"]) == spread["range"][0] > 0
        assert spread["range"][0] <= spread["median"] <= spread["range"][1]
    mapping = section["checkpoint_mapping"]
    assert mapping["resident_bytes"] > 0
    assert 0 <= mapping["huge_mapped_fraction"] <= 1
    if section["threads"] == 1:
        assert section["one_thread"] is None
    else:
        for key in ("single_over_copy_bandwidth", "batch_fraction_of_its_bound",
                    "single_threads_over_one", "batch_threads_over_one"):
            assert len(section["one_thread"][key]["rounds"]) == ROUNDS
            assert section["one_thread"][key]["range"][0] > 0


def test_roofline_ratios_are_computed_per_round_from_bytes_and_seconds() -> None:
    from colibri.benchmarks.decode import touched_bytes
    from colibri.benchmarks.turn_sections import summarize

    model_dir = fixture_model_dir("glm5-tiny")
    cfg = json.loads((model_dir / "config.json").read_text())
    sparse = [layer for layer in range(cfg["num_hidden_layers"])
              if layer >= cfg["first_k_dense_replace"]]
    one_step = [[layer, [0, 1]] for layer in sparse]  # two experts per sparse layer
    two_rows = [[layer, [0, 1, 2, 3]] for layer in sparse]  # the rows' union: four
    one_bytes = touched_bytes(model_dir, [[(int(l_), tuple(e)) for l_, e in one_step]])[0]
    two_bytes = touched_bytes(model_dir, [[(int(l_), tuple(e)) for l_, e in two_rows]])[0]
    assert two_bytes > one_bytes
    raw = {"threads": 2, "copy_bps": [1e9, 2e9], "read_bps": [4e9, 8e9],
           "read_one_thread_bps": [2e9, 5e9],
           "single_s": [0.5, 0.5], "single_routes": [[one_step]] * 2,
           "batch_s": [1.0, 2.0], "batch_routes": [[two_rows]] * 2,
           "one_thread_single_s": [1.0, 0.5], "one_thread_single_routes": [[one_step]] * 2,
           "one_thread_batch_s": [4.0, 2.0], "one_thread_batch_routes": [[two_rows]] * 2}
    got = summarize(raw, model_dir, batch=2)
    alone = got["one_thread"]
    # One thread: one row in 1.0 s and 0.5 s, the batch in 4.0 s and 2.0 s.
    assert alone["single_over_copy_bandwidth"]["rounds"] == [one_bytes / 1.0 / 1e9,
                                                             one_bytes / 0.5 / 2e9]
    assert alone["batch_fraction_of_its_bound"]["rounds"] == [two_bytes / 4.0 / 1e9,
                                                              two_bytes / 2.0 / 2e9]
    assert alone["single_threads_over_one"]["rounds"] == [1.0 / 0.5, 0.5 / 0.5]
    assert alone["batch_threads_over_one"]["rounds"] == [4.0 / 1.0, 2.0 / 2.0]
    without = summarize({k: v for k, v in raw.items() if not k.startswith("one_thread_")},
                        model_dir, batch=2)
    assert without["one_thread"] is None
    # Round 1: one row streams one_bytes in 0.5 s against 1 GB/s; the batch its bytes in 1 s.
    assert got["single_over_copy_bandwidth"]["rounds"] == [one_bytes / 0.5 / 1e9,
                                                           one_bytes / 0.5 / 2e9]
    assert got["single_over_read_stream"]["rounds"] == [one_bytes / 0.5 / 4e9,
                                                        one_bytes / 0.5 / 8e9]
    assert got["read_stream_gb_per_s"]["rounds"] == [4.0, 8.0]
    assert got["read_stream_one_thread_gb_per_s"]["rounds"] == [2.0, 5.0]
    assert got["read_stream_threads_over_one"]["rounds"] == [2.0, 8 / 5]
    assert got["batch_fraction_of_its_bound"]["rounds"] == [two_bytes / 1.0 / 1e9,
                                                            two_bytes / 2.0 / 2e9]
    assert got["batch_over_single_tokens_per_s"]["rounds"] == [(2 / 1.0) / (1 / 0.5),
                                                               (2 / 2.0) / (1 / 0.5)]
    bound = 2 * one_bytes / two_bytes
    assert got["batch_bound_over_single"]["rounds"] == [bound, bound]


def test_float_products_section_reports_every_variant_rows_and_source() -> None:
    from colibri.accelerated.native import supported_variants
    from colibri.accelerated.native_build import DEFAULT_OUT, LIBRARY_NAME

    from colibri.benchmarks import BenchOptions
    from colibri.benchmarks.float_products import ROWS, SHAPES, run

    got = run(BenchOptions(extra={"float_memory_mib": 1, "float_cache_mib": 1,
                                  "float_repeats": 1}))
    built = [v for v in supported_variants() if (DEFAULT_OUT / v / LIBRARY_NAME).is_file()]
    assert built and list(got["variants"]) == built
    assert len(got["copy_bandwidth_gb_per_s"]) == 2 and min(got["copy_bandwidth_gb_per_s"]) > 0
    assert got["threads"][0] == 1
    for shapes in got["variants"].values():
        assert list(shapes) == [f"{n}x{k}" for n, k in SHAPES]
        for per_threads in shapes.values():
            assert list(per_threads) == [f"threads_{t}" for t in got["threads"]]
            for per_rows in per_threads.values():
                assert list(per_rows) == [str(r) for r in ROWS]
                assert per_rows["1"]["memory_time_over_one_row"] == 1.0
                for rows, entry in per_rows.items():
                    for source in ("memory", "cache"):
                        gbps = entry[source]["gb_per_s"]
                        # multiply-adds are weights x rows; GB/s counts 4 bytes a weight
                        assert gbps > 0
                        assert abs(entry[source]["g_multiply_adds_per_s"]
                                   - int(rows) * gbps / 4) <= 0.01 * int(rows) * gbps / 4 + 1e-3
                    assert entry["memory_over_cache"] == round(
                        entry["memory"]["gb_per_s"] / entry["cache"]["gb_per_s"], 3)
