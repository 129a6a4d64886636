"""The expert atlas (colibri atlas sweep|analyze|validate; seed expert_atlas/README.md).

The method is pinned on hand-made dumps; then it must *measure what it claims*: on a model
with planted specialists (tests/support/atlas_support.py) it recovers them and validates far above a
label-permutation null, and on the random-weight default model it certifies no more
specialists than that null does."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.atlas_support import PLANTED, plant
from support.http_transcript import validate as schema_validate

from colibri import resources
from colibri.atlas.analyze import analyze, web_document
from colibri.atlas.probes import load_probes
from colibri.atlas.stats import AtlasError, load_runs, read_dump
from colibri.atlas.validate import permutation_null, validate


def write(folder: Path, name: str, lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.txt").write_text("\n".join(lines) + "\n")


def test_dump_rules(tmp_path: Path) -> None:
    write(tmp_path, "a_0", ["-1 5 8", "-2 1 3815245270", "3 1 4", "3 1 9", "junk", "4 2 1 7",
                            "4 0 2"])
    assert read_dump(tmp_path / "a_0.txt") == {(3, 1): 9, (4, 0): 2}  # later line wins
    write(tmp_path, "a_1", ["3 x 4"])
    with pytest.raises(AtlasError, match=r"a_1.txt line 1 is corrupt"):
        read_dump(tmp_path / "a_1.txt")
    with pytest.raises(AtlasError, match="does not exist"):
        read_dump(tmp_path / "nope.txt")
    write(tmp_path / "bad", "noindex", ["3 1 4"])
    with pytest.raises(AtlasError, match="not named <category>_<idx>"):
        load_runs(tmp_path / "bad")
    with pytest.raises(AtlasError, match="holds no"):
        load_runs(tmp_path / "empty") if (tmp_path / "empty").mkdir() is None else None


def test_probe_set_rules(tmp_path: Path) -> None:
    probes = load_probes()
    assert len(probes) == 10 and all(len(p) == 3 for p in probes.values())
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"_comment": "x", "a": ["p", "q"], "b": ["only one"]}))
    with pytest.raises(AtlasError, match="'b' has 1 prompt"):
        load_probes(one)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(AtlasError, match="not valid JSON"):
        load_probes(broken)
    with pytest.raises(AtlasError, match="does not exist"):
        load_probes(tmp_path / "missing.json")


def synthetic(folder: Path, header: bool = False) -> Path:
    """3 categories x 2 runs. Expert (3,0) fires only for `a`, in both runs; (3,1) only in one
    `b` run (a single-prompt fluke); (3,2) everywhere in proportion to run size."""
    head = ["-1 5 8", "-2 1 3815245270"] if header else []
    runs = {
        "a_0": ["3 0 40", "3 2 60"], "a_1": ["3 0 20", "3 2 30"],
        "b_0": ["3 1 50", "3 2 50"], "b_1": ["3 2 100"],
        "c_0": ["3 2 100"], "c_1": ["3 2 10"],
    }
    for name, lines in runs.items():
        write(folder, name, head + lines)
    return folder


def test_analyze_method(tmp_path: Path) -> None:
    result = analyze(load_runs(synthetic(tmp_path)), min_count=30, min_runs=2)
    assert result.categories == ["a", "b", "c"]
    assert result.dropped_unreplicated == 1  # (3,1): top topic b fired in 1 of 2 runs
    by_key = {(r["layer"], r["expert"]): r for r in result.records}
    a = by_key[(3, 0)]
    # per-run shares: a_0 40/100, a_1 20/50 -> mean 0.4; elsewhere 0 -> p = (1, 0, 0)
    assert a["p"] == {"a": 1.0, "b": 0.0, "c": 0.0} and a["spec"] == 1.0
    assert a["top_lift"] == 3.0 and a["reliability"] == "2/2" and a["total"] == 60
    g = by_key[(3, 2)]
    # shares a: .6,.6; b: .5,1; c: 1,1 -> means .6, .75, 1 -> p ∝ those
    s = 0.6 + 0.75 + 1.0
    assert g["p"] == {"a": round(0.6 / s, 4), "b": round(0.75 / s, 4), "c": round(1 / s, 4)}
    h = -sum(v / s * math.log(v / s) for v in (0.6, 0.75, 1.0))
    assert g["spec"] == round(1 - h / math.log(3), 4)
    assert [(r["layer"], r["expert"]) for r in result.records] == [(3, 0), (3, 2)]
    web = web_document(result)
    schema_validate("atlas", web)
    assert web["experts"]["3:0"] == {"affinity": {"a": 1.0}, "entropy": 0.0, "top": "a",
                                     "label": "specialist: a"}
    assert web["experts"]["3:2"]["label"] == "generalist"
    # header records change nothing
    again = analyze(load_runs(synthetic(tmp_path / "h", header=True)), 30, 2)
    assert again.records == result.records


def test_validate_is_leave_one_prompt_out(tmp_path: Path) -> None:
    result = validate(load_runs(synthetic(tmp_path)), k=1)
    assert len(result.trials) == 6
    # held-out a_0: a's top-1 set from a_1 is {(3,0)} (lift 1), c's is {(3,2)}, the only
    # expert c has; on a_0 they cover 40% and 60% of its selections: c wins (pure lift, as
    # colibri's validate.py ranks)
    first = result.trials[0]
    assert (first.category, first.index) == ("a", "0")
    assert (first.own, first.best_other, first.predicted) == (0.4, 0.6, "c")
    # held-out b_0: b's set from b_1 is {(3,2)}, the same as c's: a tie, which the first
    # category in sorted order wins
    second = result.trials[2]
    assert (second.category, second.own, second.best_other, second.hit) == ("b", 0.5, 0.5, True)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLI_ATLAS": "/nonexistent/never-written.json"}
    return subprocess.run([sys.executable, "-m", "colibri", "atlas", *args],
                          capture_output=True, text=True, env=env, timeout=900, check=False)


def test_cli_names_bad_input(tmp_path: Path) -> None:
    done = cli("analyze", "--stats", str(tmp_path / "none"), "--out", str(tmp_path / "x.json"))
    assert done.returncode == 1
    assert "stats directory" in done.stderr and "Traceback" not in done.stderr
    probes = tmp_path / "p.json"
    probes.write_text(json.dumps({"a": ["x"], "b": ["y", "z"]}))
    done = cli("sweep", "--probes", str(probes), "--out", str(tmp_path / "o"))
    assert done.returncode == 1 and "replication gate needs at least 2" in done.stderr


def sweep_and_check(model: Path, out: Path, min_count: int) -> tuple[dict[str, Any],
                                                                      dict[str, Any]]:
    done = cli("sweep", "--model", str(model), "--out", str(out), "--max-tokens", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((out / "stats").glob("*.txt"))) == 30
    web = out / "web.json"
    done = cli("analyze", "--stats", str(out / "stats"), "--out", str(out / "experts.json"),
               "--web", str(web), "--min-count", str(min_count))
    assert done.returncode == 0, done.stderr
    schema_validate("atlas", json.loads(web.read_text()))
    done = cli("validate", str(out / "stats"), "1", "--permutations", "30",
               "--min-count", str(min_count), "--json", str(out / "validate.json"))
    assert done.returncode == 0, done.stderr
    return json.loads((out / "experts.json").read_text()), json.loads(
        (out / "validate.json").read_text())


def test_planted_specialists_are_recovered_and_validate(tmp_path: Path) -> None:
    # PLANTED's layers and expert ids are glm5-chat-tiny's (random weights, 8 experts).
    model = plant(resources.fixture_model_dir("glm5-chat-tiny"), tmp_path / "planted",
                  load_probes())
    atlas, check = sweep_and_check(model, tmp_path / "out", min_count=5)
    planted = {(layer, e): c for layer, plan in PLANTED.items() for c, e in plan.items()}
    certified = {(r["layer"], r["expert"]): r["top_topic"] for r in atlas["experts"]
                 if r["spec"] >= 0.5}
    recovered = {k for k, c in planted.items() if certified.get(k) == c}
    # medicine and math_proof have 1-2 exclusive token occurrences: below any count gate
    assert len(recovered) >= 8, (certified, planted)
    assert set(certified) <= set(planted)  # nothing certified that was not planted
    null = check["null"]
    assert check["accuracy"] >= 0.7
    assert check["accuracy"] > max(null["accuracies"])
    assert null["p_value"] <= 1 / 31 + 1e-9
    assert null["observed_specialists"] > max(null["specialists"])


def test_random_model_certifies_no_more_than_the_null(tmp_path: Path) -> None:
    _, check = sweep_and_check(resources.fixture_model_dir("glm5-chat-tiny"), tmp_path / "out",
                               min_count=30)
    null = check["null"]
    assert null["observed_specialists"] <= max(null["specialists"])
    assert check["accuracy"] <= max(null["accuracies"])


def test_permutation_null_keeps_category_sizes(tmp_path: Path) -> None:
    runs = load_runs(synthetic(tmp_path))
    null = permutation_null(runs, k=1, permutations=5, seed=1)
    assert len(null.accuracies) == 5 and all(0 <= a <= 1 for a in null.accuracies)
    assert null.p_value(1.0) >= 1 / 6


def test_server_serves_the_written_atlas(tmp_path: Path) -> None:
    from colibri.server.app import ATLAS_ABSENT
    from colibri.server.context import ServerConfig
    from support.http_transcript import exchange
    from support.server_harness import launch

    atlas = tmp_path / "state" / "experts.json"
    live = launch(ServerConfig(model_id="m", atlas_path=str(atlas)))
    try:
        # Not written yet: the documented empty state, an answer rather than a 404.
        absent = exchange(live.url, "GET", "/experts.json")
        assert absent["status"] == 200 and absent["body"] == ATLAS_ABSENT
        assert "atlas" in absent["body"] and "categories" not in absent["body"]
        result = analyze(load_runs(synthetic(tmp_path / "stats")), 30, 2)
        atlas.parent.mkdir(parents=True)
        atlas.write_text(json.dumps(web_document(result)))
        got = exchange(live.url, "GET", "/experts.json")
        assert got["status"] == 200 and got["body"] == web_document(result)
    finally:
        live.stop()
