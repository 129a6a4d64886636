"""``colibri bench``: the section registry and the JSON report (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.reference_support import mapped_file_bytes

from colibri.benchmarks import load_sections, select
from colibri.benchmarks.bench_model import BENCH_CONFIG, build_tensors, tensor_shapes
from colibri.cli import main
from colibri.resources import fixture_model_dir


def test_sections_are_selected_by_name_or_engine() -> None:
    assert "reference-decode" in load_sections()
    assert [s.name for s in select(["reference-decode"], [])] == ["reference-decode"]
    assert "reference-decode" in [s.name for s in select([], ["reference"])]
    with pytest.raises(ValueError, match="unknown bench section"):
        select(["nope"], [])
    with pytest.raises(ValueError, match="unknown engine"):
        select([], ["nope"])


def test_bench_list_and_bad_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list"]) == 0
    assert "reference-decode" in capsys.readouterr().out
    assert main(["bench", "--engine", "warp-drive"]) == 2
    assert "unknown engine" in capsys.readouterr().err


def test_reference_section_reports_speed_bandwidth_and_rss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    # Only the section asserted on (the other sections of the engine have tests of their own).
    argv = ["bench", "--section", "reference-decode",
            "--model", str(fixture_model_dir("glm5-tiny")),
            "--tokens", "2", "--batch", "2", "--no-peers", "--output", str(out)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    from colibri import host_topology

    assert printed["machine"]["host"]["usable_cpus"] == host_topology.usable_cpus()
    section = printed["sections"]["reference-decode"]
    ref = section["reference"]
    assert ref["decode"]["steps"] == 2 and ref["decode"]["tokens_per_s"] > 0
    assert ref["decode"]["achieved_gb_per_s"] > 0
    assert ref["decode_batch"]["batch"] == 2
    # Each step reads every non-expert weight plus K experts per sparse layer, never more.
    assert 0 < ref["decode"]["weight_bytes_per_step"] < section["checkpoint_bytes"]
    assert ref["rss_after_load_bytes"] > 0
    assert 0 <= ref["rss_growth_at_load_bytes"] < ref["rss_after_load_bytes"]
    assert ref["rss_growth_at_load_vs_checkpoint"] == pytest.approx(
        ref["rss_growth_at_load_bytes"] / section["checkpoint_bytes"])
    in_maps = ref["rss_growth_in_weight_maps_bytes"]
    assert 0 < in_maps <= mapped_file_bytes(fixture_model_dir("glm5-tiny"))
    assert ref["rss_growth_outside_weight_maps_bytes"] == ref["rss_growth_at_load_bytes"] - in_maps
    assert 0 <= ref["weight_maps_in_2mib_entries_fraction"] <= 1
    assert "hf_transformers_eager" not in section


def test_bench_model_geometry_matches_the_issue() -> None:
    cfg = BENCH_CONFIG
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (8192, 1024, 8)
    assert (cfg["first_k_dense_replace"], cfg["n_routed_experts"]) == (3, 32)
    assert (cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]) == (8, 512)
    assert (cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["num_attention_heads"]) == (256, 128, 16)
    shapes = tensor_shapes(cfg)
    assert shapes["model.layers.3.mlp.experts.31.down_proj.weight"] == (1024, 512)
    # llama.cpp (the bench's GGUF peer) applies a Hadamard transform of size >= 64 to the
    # indexer's q and k, so it refuses a narrower indexer head.
    assert cfg["index_head_dim"] % 64 == 0


def test_bench_model_is_reproducible_from_its_seed() -> None:
    small = dict(BENCH_CONFIG, vocab_size=64, hidden_size=32, intermediate_size=16,
                 moe_intermediate_size=8, num_hidden_layers=4, n_routed_experts=4,
                 num_experts_per_tok=2, q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8,
                 qk_rope_head_dim=4, v_head_dim=8, num_attention_heads=2, index_head_dim=8,
                 index_n_heads=2)
    a, b = build_tensors(small, 7), build_tensors(small, 7)
    assert a.keys() == b.keys()
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert build_tensors(small, 8)["lm_head.weight"].tobytes() != a["lm_head.weight"].tobytes()


def test_grammar_section_measures_every_mode_over_the_whole_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from colibri import resources
    from colibri.benchmarks import grammar_mask

    monkeypatch.setattr(grammar_mask, "REPEATS", 1)
    entry = grammar_mask.measure("reference", resources.default_model_dir(), 12)
    # The schema cannot end inside the budget: every mode decodes all the tokens.
    assert [entry[f"{m}_decode_steps"] for m in grammar_mask.MODES] == [11, 11, 11]
    assert entry["tokenizer"] == "the model's" and entry["decode_step_us"] > 0
    for mode in ("inline", "overlapped"):
        assert entry[f"{mode}_grammar_us_per_token"] > 0
        assert entry[f"{mode}_grammar_over_decode_step"] > 0
    assert "grammar" in load_sections()


def test_the_summary_names_each_section_its_ratios_and_the_model_cache(tmp_path: Path) -> None:
    from colibri.commands.bench import SUMMARY_RATIOS, summary_lines

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.safetensors").write_bytes(b"\0" * 3000)
    sections = {
        "decode": {"section_wall_s": 12.34, "ratios": {"accelerated_vs_reference": 3.456},
                   "engines": {"llama": {"speedup": 0.5, "tok_s": 99.0}}},
        "many": {"section_wall_s": 1.0, **{f"r{i}_ratio": float(i) for i in range(9)}},
        "cuda": {"section_wall_s": 0.1, "refused": "no GPU"},
    }
    lines = summary_lines(sections, tmp_path)
    assert lines[1].split() == ["decode", "12.3", "ratios.accelerated_vs_reference", "3.46,",
                                "engines.llama.speedup", "0.50"]
    assert lines[2].count("_ratio") == SUMMARY_RATIOS
    assert lines[3].split()[-1] == "refused"
    assert lines[4].startswith(f"generated benchmark models are kept in {tmp_path} (0.00 GB")
    assert summary_lines({}, tmp_path / "absent") == [lines[0]]
