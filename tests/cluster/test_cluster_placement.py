"""A placement file on a simulated two-node Ray cluster: the workers hold what the file says, the
engine gives the single process's bytes and tokens, and its NODES line reports the file's
residency."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cluster_support import PROMPT, drive, open_local, ray_cluster, remote  # noqa: F401 (fixture)
from support.engine_harness import EngineRun, ids, run_engine, submit

from colibri import resources
from colibri.backend_kit.placement_file import write_placement
from colibri.cluster_plan import plan_placement
from colibri.engine.registry import BackendOptions, open_backend
from colibri.protocol import FrameReader
from colibri.protocol.records import Nodes

TINY = resources.fixture_model_dir("glm5-tiny")


@pytest.fixture()
def placement_file(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A usage-driven placement of glm5-tiny on two nodes: the hot experts 0-3 of layer 3 are
    spread in heat order, so it is not the striped placement (expert e on node e % 2)."""
    usage = tmp_path / "usage.txt"
    usage.write_text("3 0 900\n3 1 800\n3 2 700\n3 3 600\n")
    document = plan_placement(TINY, 2, 0.0005, usage)
    assert document["layers"][0]["owner"] != [e % 2 for e in range(8)]
    path = tmp_path / "placement.json"
    write_placement(path, document)
    return path, document


def _owner_map(document: dict[str, Any]) -> bytes:
    return bytes(o for entry in document["layers"] for o in entry["owner"])


@pytest.mark.usefixtures("ray_cluster")
def test_the_workers_hold_the_files_experts_and_give_the_single_process_bytes(
        placement_file: tuple[Path, dict[str, Any]]) -> None:
    path, document = placement_file
    local = open_local("reference", "glm5-tiny")
    clustered = open_backend("reference", TINY, BackendOptions(
        cluster="ray", cluster_placement=str(path)), io.StringIO())
    try:
        experts = remote(clustered)
        assert {layer: list(t) for layer, t in experts.placement.owner.items()} == {
            entry["layer"]: entry["owner"] for entry in document["layers"]}
        want, got = drive(local), drive(clustered)
        assert [a.tobytes() for a in got] == [a.tobytes() for a in want]
        nodes = clustered.expert_nodes()
        assert [len(n.owned) for n in nodes] == [n["experts"] for n in document["nodes"]]
        # The reference's workers hold float32 experts: what the checkpoint stores here.
        assert [n.resident_bytes for n in nodes] == [n["expert_bytes"]
                                                     for n in document["nodes"]]
        run: EngineRun = run_engine([submit(1, 0, ids(*PROMPT), 4, ext="ids=1")],
                                    model_dir=TINY, wrap=lambda _: clustered)
        found = [f for f in run.frames if f.kind == "NODES"]
        assert len(found) == 1 and found[0].parsed is not None
        assert Nodes.decode(found[0].line.decode().strip()).map == _owner_map(document)
    finally:
        clustered.close()
        local.close()


def test_the_engine_command_with_a_placement_file_decodes_the_single_process_tokens(
        ray_cluster: Any,  # noqa: F811 (the fixture imported above)
        placement_file: tuple[Path, dict[str, Any]]) -> None:
    path, document = placement_file
    script = submit(1, 0, ids(*PROMPT), 6, ext="ids=1")
    base = run_engine([script], model_dir=TINY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLI_", "KV", "SERVE"))}
    done = subprocess.run(
        [sys.executable, "-m", "colibri", "engine", "--model", str(TINY),
         "--cluster", f"ray:{ray_cluster.address}", "--cluster-placement", str(path)],
        input=script, capture_output=True, env=env, timeout=180, check=False)
    log = done.stderr.decode()
    assert done.returncode == 0, log[-3000:]
    assert f"2 expert workers on 2 nodes, experts placed by {path}" in log
    reader = FrameReader(io.BytesIO(done.stdout))
    reader.read_preamble()
    frames = []
    while (frame := reader.read_frame()) is not None:
        frames.append(frame)
    kinds = [f.kind for f in frames]
    # The residency line follows the handshake's EMAP, before any request's frame.
    assert kinds[kinds.index("EMAP") + 1] == "NODES"
    nodes = Nodes.decode(frames[kinds.index("NODES")].line.decode().strip())
    assert (nodes.rows, nodes.cols) == (2, 8)
    assert nodes.map == _owner_map(document)
    assert [n.experts for n in nodes.nodes] == [n["experts"] for n in document["nodes"]]
    assert all(np.isclose(n.resident_gb, d["expert_bytes"] / 1e9, atol=5e-4)
               for n, d in zip(nodes.nodes, document["nodes"], strict=True))
    got = [int(f.payload or b"") for f in frames
           if f.kind == "DATA" and f.parsed is not None and f.parsed.values.get("id") == 1]
    want = [int(f.payload or b"") for f in base.for_id(1) if f.kind == "DATA"]
    assert got == want and len(got) == 6
    assert json.loads(path.read_text()) == document  # the engine only reads the file
