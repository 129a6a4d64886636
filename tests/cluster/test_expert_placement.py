"""Placement of the routed experts on cluster nodes (``colibri plan --nodes``): the algorithm's
invariants, the placement file and its schema, the command line, and the engine's options.
No Ray here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colibri import resources
from colibri.backend_kit.expert_placement import PlacementError, place_experts, uniform_heat
from colibri.backend_kit.placement_file import (
    PlacementFileError,
    PlacementMismatchError,
    read_placement,
    write_placement,
)
from colibri.cluster_plan import plan_placement
from colibri.engine.settings import SettingsError, from_environment
from colibri.plan import PlanError

TINY = resources.fixture_model_dir("glm5-tiny")  # routed layers 3 and 4, 8 experts of 49152 B
TINY_INT4 = resources.fixture_model_dir("glm5-tiny-int4g64")  # routed layers 1 and 2
SCHEMA = json.loads(resources.spec_path("schemas", "expert_placement.json").read_text())


@st.composite
def models(draw: st.DrawFn) -> tuple[list[int], int, dict[tuple[int, int], int],
                                     dict[tuple[int, int], float], int]:
    """A routed model (layers, experts, sizes, heat) and a node count."""
    layers = sorted(draw(st.sets(st.integers(0, 80), min_size=1, max_size=5)))
    n_experts = draw(st.integers(1, 24))
    keys = [(layer, e) for layer in layers for e in range(n_experts)]
    sizes = {k: draw(st.integers(1, 1000)) for k in keys}
    heat = {k: float(draw(st.integers(0, 500))) for k in keys}
    return layers, n_experts, sizes, heat, draw(st.integers(1, 7))


@settings(max_examples=150, deadline=None)
@given(models(), st.floats(1.0, 3.0))
def test_every_expert_on_exactly_one_node_within_its_ram_and_deterministic(
        model: tuple[list[int], int, dict[tuple[int, int], int], dict[tuple[int, int], float],
                     int], slack: float) -> None:
    layers, n_experts, sizes, heat, nodes = model
    total = sum(sizes.values())
    # From barely enough RAM (the largest expert may not fit what is left) to three times it.
    ram = max(max(sizes.values()), int(slack * total / nodes) + 1)
    try:
        placement = place_experts(layers, n_experts, sizes, heat, nodes, ram)
    except PlacementError as exc:
        # Refused only when not enough in total, or expert by expert once the RAM is so
        # nearly used that the largest expert may find no node with room.
        if "do not fit" in str(exc):
            assert total > nodes * ram
        else:
            assert "not expert by expert" in str(exc)
            assert total > nodes * ram - (nodes - 1) * max(sizes.values())
        return
    assert placement.owners == nodes
    assert sorted(placement.owner) == layers
    shares = [placement.owned(n) for n in range(nodes)]
    every = sorted(k for share in shares for k in share)
    assert every == sorted(sizes)  # each (layer, expert) once, on one node
    for share in shares:
        assert sum(sizes[k] for k in share) <= ram
    assert place_experts(layers, n_experts, sizes, heat, nodes, ram) == placement


@settings(max_examples=150, deadline=None)
@given(models())
def test_with_room_to_spare_each_layers_heat_is_balanced_within_its_hottest_expert(
        model: tuple[list[int], int, dict[tuple[int, int], int], dict[tuple[int, int], float],
                     int]) -> None:
    layers, n_experts, sizes, heat, nodes = model
    placement = place_experts(layers, n_experts, sizes, heat, nodes, sum(sizes.values()))
    for layer, table in placement.owner.items():
        per_node = [0.0] * nodes
        for e, owner in enumerate(table):
            per_node[owner] += heat[(layer, e)]
        hottest = max(heat[(layer, e)] for e in range(n_experts))
        assert max(per_node) - min(per_node) <= hottest


def test_the_hottest_experts_of_a_layer_go_to_different_nodes() -> None:
    heat = {(3, e): 1.0 for e in range(8)} | {(3, 0): 100.0, (3, 5): 90.0}
    sizes = {(3, e): 10 for e in range(8)}
    placement = place_experts([3], 8, sizes, heat, 2, 1000)
    assert placement.owner[3][0] != placement.owner[3][5]


def test_experts_that_do_not_fit_are_refused_with_the_shortfall() -> None:
    sizes = {(1, e): 100 for e in range(8)}
    with pytest.raises(PlacementError, match=r"do not fit 2 node\(s\) × 300 bytes: need at "
                                             r"least 3 nodes of this size, or 400 bytes per "
                                             r"node"):
        place_experts([1], 8, sizes, uniform_heat([1], 8), 2, 300)
    with pytest.raises(PlacementError, match="--nodes must be at least 1"):
        place_experts([1], 8, sizes, uniform_heat([1], 8), 0, 300)


def test_the_plan_of_a_model_validates_and_reads_back(tmp_path: Path) -> None:
    document = plan_placement(TINY, 2, 0.0005)
    jsonschema.validate(document, SCHEMA)
    assert document["model"]["routed_layers"] == [3, 4]
    assert [n["experts"] for n in document["nodes"]] == [8, 8]
    assert all(n["expert_bytes"] <= document["node_ram_bytes"] for n in document["nodes"])
    path = tmp_path / "placement.json"
    write_placement(path, document)
    placement = read_placement(path, [3, 4], 8)
    assert [list(placement.owner[layer]) for layer in (3, 4)] == [
        entry["owner"] for entry in document["layers"]]


def test_usage_heat_spreads_the_hot_experts(tmp_path: Path) -> None:
    usage = tmp_path / "usage.txt"
    usage.write_text("3 0 900\n3 1 800\n3 2 700\n3 3 600\n4 7 50\n")
    document = plan_placement(TINY, 2, 0.001, usage)
    assert document["heat_from"] == f"usage {usage}"
    owners = document["layers"][0]["owner"]
    assert owners[0] != owners[1] and owners[2] != owners[3]
    shares = [n["heat_share"] for n in document["nodes"]]
    assert abs(shares[0] - shares[1]) <= 100 / 3050 + 1e-6


def test_a_plan_that_does_not_fit_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match=r"do not fit 2 node\(s\) × 300 kB"):
        plan_placement(TINY, 2, 0.0003)


def test_a_placement_for_another_model_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "placement.json"
    write_placement(path, plan_placement(TINY_INT4, 2, 0.001))
    with pytest.raises(PlacementMismatchError, match=r"made for another model .*routed "
                       r"layers \[1, 2\] × 8 experts\); this model has routed layers \[3, 4\]"):
        read_placement(path, [3, 4], 8)
    with pytest.raises(PlacementMismatchError, match="× 16 experts"):
        read_placement(path, [1, 2], 16)


def test_a_file_that_is_not_a_placement_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "placement.json"
    with pytest.raises(PlacementFileError, match="does not exist"):
        read_placement(path, [3, 4], 8)
    path.write_text("{not json")
    with pytest.raises(PlacementFileError, match="cannot be read"):
        read_placement(path, [3, 4], 8)
    document = plan_placement(TINY, 2, 0.001)
    document["layers"][0]["owner"][0] = 7  # a node the file does not have
    write_placement(path, document)
    with pytest.raises(PlacementFileError, match="layer 3 names node 7, the file has 2 nodes"):
        read_placement(path, [3, 4], 8)
    del document["nodes"]
    write_placement(path, document)
    with pytest.raises(PlacementFileError, match="not a placement document.*'nodes' is a "
                                                 "required property"):
        read_placement(path, [3, 4], 8)


def _colibri(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLI_", "KV", "SERVE"))}
    return subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def test_the_plan_command_writes_a_placement_file_that_validates(tmp_path: Path) -> None:
    out = tmp_path / "placement.json"
    done = _colibri("plan", "--model", str(TINY), "--nodes", "3", "--node-ram", "0.0003",
                    "--placement-out", str(out))
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    jsonschema.validate(document, SCHEMA)
    assert [n["experts"] for n in document["nodes"]] == [6, 5, 5]
    assert "node 0: 6 experts · 295 kB of 300 kB" in done.stdout
    assert f"--cluster-placement {out}" in done.stdout
    as_json = _colibri("plan", "--model", str(TINY), "--nodes", "2", "--node-ram", "0.001",
                       "--json")
    jsonschema.validate(json.loads(as_json.stdout)["placement"], SCHEMA)


def test_the_plan_command_refuses_what_does_not_fit_and_incomplete_options(
        tmp_path: Path) -> None:
    out = tmp_path / "placement.json"
    done = _colibri("plan", "--model", str(TINY), "--nodes", "2", "--node-ram", "0.0003",
                    "--placement-out", str(out))
    assert done.returncode == 1 and not out.exists()
    assert "colibri plan: the routed experts (786 kB) do not fit 2 node(s) × 300 kB" in \
        done.stderr
    assert _colibri("plan", "--nodes", "2").returncode == 2
    assert _colibri("plan", "--placement-out", str(out)).returncode == 2


def test_the_placement_option_needs_a_cluster_and_reads_its_environment() -> None:
    model = Path("some-model")
    env = {"COLI_CLUSTER": "ray", "COLI_CLUSTER_PLACEMENT": "p.json"}
    assert from_environment(env, model_dir=model).cluster_placement == "p.json"
    assert from_environment(env, model_dir=model,
                            cluster_placement="q.json").cluster_placement == "q.json"
    with pytest.raises(SettingsError, match="--cluster-placement .* needs --cluster"):
        from_environment({"COLI_CLUSTER_PLACEMENT": "p.json"}, model_dir=model)


#: ``colibri ARGS`` that also says on stderr whether Ray was imported.
PROBE = """
import sys
from colibri.cli import main
sys.argv = ["colibri", *sys.argv[1:]]
try:
    code = main()
except SystemExit as exc:
    code = exc.code
print("RAY", "ray" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


def test_an_engine_refuses_a_placement_for_another_model_before_ray_starts(
        tmp_path: Path) -> None:
    path = tmp_path / "placement.json"
    write_placement(path, plan_placement(TINY_INT4, 2, 0.001))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLI_", "KV", "SERVE"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "engine", "--model", str(TINY), "--cluster", "ray",
         "--cluster-placement", str(path)],
        input=b"", capture_output=True, env=env, timeout=120, check=False)
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert f"placement file {path} was made for another model" in stderr
    assert "RAY False" in stderr.splitlines()
    assert b"READY" not in done.stdout
