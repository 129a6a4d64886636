"""`colibri plan` (spec/plan.md) and doctor's model checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colibri import resources
from colibri.doctor import check_model
from colibri.plan import PlanError, Request, build, environment_for_plan, shipped_config

HOST = {"MemAvailable": 100 * 10**9}
GLM5 = shipped_config("glm5-744b")


def test_glm5_config_alone() -> None:
    plan = build(GLM5, Request(ctx=8192, kv_slots=2, expert_format="int4-g64"), HOST, [])
    assert plan["schema_version"] == 1
    assert plan["model"]["routed_experts"] == 76 * 256 == 19456  # 75 MoE layers + MTP
    # 79 attention layers (78 + MTP) x (512 latent + 64 rope + 128 indexer key) floats
    assert plan["kv"]["bytes_per_token"] == 79 * (512 + 64 + 128) * 4
    assert plan["kv"]["bytes_per_slot"] == 8192 * plan["kv"]["bytes_per_token"]
    # int4-g64: 4-bit payload + one f32 scale per 64 inputs, gate/up [2048, 6144], down [6144, 2048]
    expected = 2 * (2048 * 3072 + 4 * 2048 * 96) + (6144 * 1024 + 4 * 6144 * 32)
    assert plan["expert_bytes"]["int4-g64"] == expected == 21_233_664
    assert plan["expert_bytes"]["bf16"] == 3 * 2048 * 6144 * 2
    ram = plan["tiers"]["ram"]
    assert ram["budget_bytes"] == int(0.88 * HOST["MemAvailable"])
    assert ram["expert_cache_bytes"] == ram["budget_bytes"] - ram["dense_bytes"] - ram[
        "runtime_bytes"]
    assert ram["cache_slots_per_layer"] == ram["expert_cache_bytes"] // (expected * 76)


def test_a_family_name_and_a_budget_under_the_dense_weights() -> None:
    assert shipped_config("glm5") == GLM5
    with pytest.raises(PlanError, match="no shipped config named 'glm'"):
        shipped_config("glm")
    small = build(GLM5, Request(ram_gb=20), HOST, [])
    dense_gb = small["tiers"]["ram"]["dense_bytes"] / 1e9
    assert dense_gb > 20 and any(
        w.startswith(f"the dense weights ({dense_gb:.1f} GB) are larger than the RAM budget "
                     "(20.0 GB)") for w in small["warnings"])
    roomy = build(GLM5, Request(ram_gb=200), HOST, [])
    assert not any("dense weights" in w for w in roomy["warnings"])


def test_more_ram_fits_more_and_slots_cost_kv() -> None:
    small = build(GLM5, Request(ram_gb=200, expert_format="int4-g64"), HOST, [])
    big = build(GLM5, Request(ram_gb=600, expert_format="int4-g64"), HOST, [])
    assert big["tiers"]["ram"]["warm_experts"] > small["tiers"]["ram"]["warm_experts"]
    assert big["projected_hit_rate"] == 1.0 > small["projected_hit_rate"]
    one = build(GLM5, Request(ram_gb=200, kv_slots=1), HOST, [])
    four = build(GLM5, Request(ram_gb=200, kv_slots=4), HOST, [])
    assert (four["tiers"]["ram"]["runtime_bytes"] - one["tiers"]["ram"]["runtime_bytes"]
            == 3 * one["kv"]["bytes_per_slot"])
    gpu = [{"index": 0, "name": "H200", "total_bytes": 141 * 10**9,
            "free_bytes": 140 * 10**9, "usable_bytes": 138 * 10**9}]
    hot = build(GLM5, Request(ram_gb=200, expert_format="int4-g64"), HOST, gpu)
    assert hot["tiers"]["vram"]["hot_experts"] == 138 * 10**9 // 21_233_664


def test_pin_set_from_a_usage_file(tmp_path: Path) -> None:
    usage = tmp_path / "stats.txt"
    usage.write_text("-1 5 8\n-2 1 3815245270\n3 1 5\n4 7 9\n3 0 9\n4 2 1\n")
    # The usage file names glm5-chat-tiny's sparse layers (3 and 4) and experts.
    tiny = resources.fixture_model_dir("glm5-chat-tiny")
    plan = build(tiny, Request(usage=usage), HOST, [])
    assert plan["pin"]["experts"][:3] == ["3:0", "4:7", "3:1"]  # ties: lower layer first
    assert plan["env"]["PIN"] == str(usage)
    usage.write_text("3 x 1\n")
    with pytest.raises(PlanError, match="corrupt"):
        build(tiny, Request(usage=usage), HOST, [])


def test_auto_tier_environment_never_overrides() -> None:
    plan = build(resources.default_model_dir(), Request(), HOST, [])
    env = environment_for_plan(plan, {"CTX": "512"})
    assert env["CTX"] == "512" and env["RAM_GB"] == plan["env"]["RAM_GB"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_cli_text_json_and_named_errors(tmp_path: Path) -> None:
    done = run_cli("plan", "--config", "glm5-744b", "--format", "int4-g64", "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["schema_version"] == 1
    done = run_cli("plan")
    assert done.returncode == 0 and "KV " in done.stdout and "env RAM_GB=" in done.stdout
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    done = run_cli("plan", "--model", str(tmp_path))
    assert done.returncode == 1 and "cannot read" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_cli("plan", "--config", "nope")
    assert done.returncode == 1 and "no shipped config named 'nope'" in done.stderr
    done = run_cli("plan", "--format", "int5")
    assert done.returncode == 1 and "unknown expert format" in done.stderr


def test_doctor_model_checks(tmp_path: Path) -> None:
    ok = {c.id: c.status for c in check_model(resources.default_model_dir())}
    assert ok == {"model_config": "ok", "model_weights": "ok", "model_indexer": "ok",
                  "model_formats": "ok",
                  "model_page_cache": "ok"}  # a few MB cached: never worth a warning
    assert {c.id: c.status for c in check_model(GLM5)}["model_weights"] == "warn"
    broken = tmp_path / "m"
    shutil.copytree(resources.default_model_dir(), broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    got = {c.id: c for c in check_model(broken)}
    assert got["model_weights"].status == "fail" and "truncated" in got["model_weights"].summary
    weights.unlink()
    (broken / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"x": "model-00001-of-00002.safetensors"}}))
    (broken / "other.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    got = {c.id: c for c in check_model(broken)}
    assert got["model_weights"].status == "fail" and "missing" in got["model_weights"].summary
    assert check_model(tmp_path / "absent")[0].status == "fail"


def test_doctor_json_keeps_schema_version_and_adds_the_plan() -> None:
    done = run_cli("doctor", "--json")
    doc = json.loads(done.stdout)
    assert doc["schema_version"] == 1 and doc["model"] and doc["plan"]["kv_slots_that_fit"] >= 1
    assert {"model_config", "model_weights", "model_formats"} <= {c["id"] for c in doc["checks"]}


def test_auto_tier_applies_the_pin_set_it_computes(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve --auto-tier` with a usage file: the engine pins exactly the plan's set (the
    handshake's TIERS and EMAP show it), here 4 of the 10 used experts, limited by RAM."""
    import colibri.reference.backend as reference_backend
    from support.engine_harness import run_engine

    # The engine runs inside this test process, whose size is not the engine's: the plan's
    # ENGINE_RUNTIME stands for it.
    monkeypatch.setattr(reference_backend, "runtime_bytes", lambda _dense: 0)
    from colibri.commands.serve import auto_tier

    model = resources.fixture_model_dir("glm5-chat-tiny")  # the expert ids below are its own
    usage = tmp_path / "usage.txt"
    counts = {(3, 1): 50, (4, 6): 40, (3, 7): 40, (4, 0): 30, (3, 0): 20, (4, 2): 20,
              (3, 5): 9, (4, 7): 8, (3, 2): 3, (4, 4): 1}
    usage.write_text("-1 5 8\n-2 1 3815245270\n" + "".join(
        f"{layer} {expert} {n}\n" for (layer, expert), n in sorted(counts.items())))
    big = build(model, Request(usage=usage), HOST, [])
    ram, typical = big["tiers"]["ram"], big["model"]["weights"]["typical_expert_bytes"]
    # RAM for the dense part, the runtime and 4.5 experts: the warm tier holds 4
    host = {"MemAvailable": int((ram["dense_bytes"] + ram["runtime_bytes"] + 4.5 * typical)
                                / 0.88) + 1}
    env = auto_tier(model, 1, usage, {}, host, [])
    plan = build(model, Request(usage=usage), host, [])
    assert plan["pin"]["experts"] == ["3:1", "3:7", "4:6", "4:0"]  # ties: lower layer first
    assert env["PIN"] == str(usage)
    run = run_engine(b"", model_dir=model, env=env, ctx=64)
    tiers = next(f for f in run.frames if f.kind == "TIERS")
    emap = next(f for f in run.frames if f.kind == "EMAP")
    _, rows_text, cols_text, hex_cells = emap.line.decode().split()
    rows, cols, cells = int(rows_text), int(cols_text), bytes.fromhex(hex_cells)
    assert (rows, cols) == (2, 8)
    resident = {f"{3 + i // cols}:{i % cols}" for i, cell in enumerate(cells) if cell >> 6}
    assert resident == set(plan["pin"]["experts"])
    assert int(tiers.line.split()[2]) == 4  # RAM tier
    # A PIN the user set to another file keeps its own budget: the plan's is for its ranking.
    other = auto_tier(model, 1, usage, {"PIN": str(tmp_path / "mine.txt")}, host, [])
    assert other["PIN"] == str(tmp_path / "mine.txt") and "PIN_GB" not in other
