"""``colibri bench --section cluster``: its two measurements report what docs/cluster.md quotes
(the structure only: timing is never asserted)."""

from __future__ import annotations

from colibri import resources
from colibri.benchmarks import load_sections, workers


def test_the_cluster_section_is_registered_for_both_engines() -> None:
    section = load_sections()["cluster"]
    assert set(section.engines) == {"reference", "accelerated"}


def test_the_decode_measurement_reports_both_engines_and_the_round_trip() -> None:
    tokens = 3
    result = workers.call("cluster_decode:measure",
                          {"model": str(resources.fixture_model_dir("glm5-tiny")),
                           "backends": ["reference"], "tokens": tokens, "warmup": 1},
                          "cluster decode", timeout_s=300)
    assert "error" not in result, result
    assert result["nodes"] == 2
    ref = result["reference"]
    assert ref["single_tok_s"] > 0 and ref["cluster_tok_s"] > 0
    assert ref["cluster_over_single_ratio"] > 0
    # One call per routed layer of each timed step (one call per owner inside it).
    assert ref["round_trip_us"]["calls"] == tokens * ref["routed_layers"] == tokens * 2
    assert 0 < ref["round_trip_us"]["median"] <= ref["round_trip_us"]["p90"]


def test_the_transport_measurement_times_plain_calls_and_a_compiled_graph() -> None:
    result = workers.call("cluster_transport:measure",
                          {"rows": 1, "hidden": 16, "calls": 5, "warmup": 2},
                          "cluster transport", timeout_s=300)
    assert "error" not in result, result
    assert result["payload_bytes"] == 64
    for name in ("plain_two_nodes", "plain_one_node", "compiled_one_node", "channel_two_nodes"):
        assert 0 < result[name]["median_us"] <= result[name]["p90_us"], name
    assert result["compiled_one_node"]["compile_s"] > 0
    assert "not_run" in result["compiled_two_nodes"]
    assert result["compiled_speedup"] > 0 and result["channel_speedup_two_nodes"] > 0
