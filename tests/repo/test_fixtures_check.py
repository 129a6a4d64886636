"""colibri.fixtures.check's comparison (the regeneration itself needs torch: make oracle-check)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from colibri.conformance.sameness import Tolerance
from colibri.fixtures.check import compare, generators, oracle_check_flag

from colibri.resources import fixture_model_dir


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def test_identical_trees_have_no_problems(tmp_path: Path) -> None:
    files = {"models/a/config.json": b"{}", "models/a/model.safetensors": b"xyz"}
    assert compare(_tree(tmp_path / "gen", files), _tree(tmp_path / "git", files)) == []


def test_every_kind_of_difference_is_listed(tmp_path: Path) -> None:
    gen = _tree(tmp_path / "gen", {"models/a/x": b"1", "models/a/new": b"n"})
    git = _tree(tmp_path / "git", {"models/a/x": b"2", "models/a/stale": b"s", "models/b/y": b""})
    assert compare(gen, git) == [
        "not committed: models/a/new",
        "differs: models/a/x (bytes differ)",
        "no longer generated: models/a/stale",
    ]


def test_generators_are_discovered() -> None:
    assert "make_models.py" in [p.name for p in generators()]


def test_every_generator_declares_whether_oracle_check_reruns_it() -> None:
    assert {p.name: oracle_check_flag(p) for p in generators()} == {
        # The trained default's oracle: HF on the committed weights, re-run; the training
        # itself (train_chat_small.py) is no generator and never re-run.
        "make_chat_small_oracle.py": True,
        "make_layer_goldens.py": False,
        "make_models.py": True,
        "make_olmoe.py": True,
        "make_qwen3_moe.py": True,
        "make_kimi.py": True,
        "make_quant_models.py": True,
        "make_tokenizer.py": True,
    }


def test_oracle_check_flag_is_read_without_importing(tmp_path: Path) -> None:
    script = tmp_path / "make_trained.py"
    script.write_text("import torch_that_is_not_installed\nORACLE_CHECK = False\n")
    assert oracle_check_flag(script) is False
    script.write_text("x = 1\n")
    assert oracle_check_flag(script) is None
    script.write_text("ORACLE_CHECK = 'yes'\n")
    with pytest.raises(ValueError, match="True or False"):
        oracle_check_flag(script)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _regenerated(tmp_path: Path, name: str) -> tuple[Path, Path, float]:
    """A committed copy of fixture ``name`` and an identical "regenerated" tree, plus its tau."""
    committed = tmp_path / "git" / "models" / name
    shutil.copytree(fixture_model_dir(name), committed)
    generated = tmp_path / "gen" / "models" / name
    shutil.copytree(committed, generated)
    ids = json.loads((committed / "oracle.json").read_text())["full_ids"]
    tau = Tolerance.for_model_dir(committed, positions=len(ids)).logit
    return tmp_path / "gen", tmp_path / "git", tau


def test_logits_within_the_tolerance_are_the_same(tmp_path: Path) -> None:
    gen, git, tau = _regenerated(tmp_path, "glm5-tiny")
    path = gen / "models/glm5-tiny/oracle_logits.npy"
    logits = np.load(path)
    logits[3, 7] += np.float32(0.9 * tau)
    path.write_bytes(_npy(logits))
    assert compare(gen, git) == []


def test_logits_past_the_tolerance_differ(tmp_path: Path) -> None:
    gen, git, tau = _regenerated(tmp_path, "glm5-tiny")
    path = gen / "models/glm5-tiny/oracle_logits.npy"
    logits = np.load(path)
    logits[3, 7] += np.float32(1.5 * tau)
    path.write_bytes(_npy(logits))
    [problem] = compare(gen, git)
    assert problem.startswith("differs: models/glm5-tiny/oracle_logits.npy (max |diff|")


def test_logits_of_another_shape_or_dtype_differ(tmp_path: Path) -> None:
    gen, git, _ = _regenerated(tmp_path, "glm5-tiny")
    path = gen / "models/glm5-tiny/oracle_logits.npy"
    logits = np.load(path)
    path.write_bytes(_npy(logits[:-1]))
    assert compare(gen, git) == [
        "differs: models/glm5-tiny/oracle_logits.npy (float32[31, 256], committed float32[32, 256])"
    ]
    path.write_bytes(_npy(logits.astype(np.float64)))
    assert "committed float32" in compare(gen, git)[0]


def _edit_oracle(gen: Path, name: str, **changes: object) -> None:
    path = gen / "models" / name / "oracle.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_oracle_margins_are_numeric_and_everything_else_exact(tmp_path: Path) -> None:
    gen, git, tau = _regenerated(tmp_path, "glm5-tiny")
    o = json.loads((git / "models/glm5-tiny/oracle.json").read_text())
    # Margins are differences of two logits: 2 * tau (and reformatting the JSON is no change).
    _edit_oracle(gen, "glm5-tiny", min_margin=o["min_margin"] + 1.9 * tau,
                 min_selection_gap=o["min_selection_gap"] - 1.9 * tau)
    assert compare(gen, git) == []
    _edit_oracle(gen, "glm5-tiny", min_margin=o["min_margin"] + 2.1 * tau)
    [problem] = compare(gen, git)
    assert "min_margin" in problem and "min_selection_gap" not in problem
    # Ids, the seed and versions are kind (a): any change is listed.
    for key, value in (("seed", o["seed"] + 1), ("tf_pred", o["tf_pred"][::-1]),
                       ("torch_version", "2.13.1"), ("full_ids", o["full_ids"][:-1])):
        _regenerated(tmp_path / key, "glm5-tiny")
        _edit_oracle(tmp_path / key / "gen", "glm5-tiny", **{key: value})
        assert compare(tmp_path / key / "gen", tmp_path / key / "git") == [
            f"differs: models/glm5-tiny/oracle.json ({key} differs)"
        ]


def test_weights_and_configs_stay_byte_exact(tmp_path: Path) -> None:
    gen, git, _ = _regenerated(tmp_path, "glm5-tiny")
    config = gen / "models/glm5-tiny/config.json"
    config.write_text(json.dumps(json.loads(config.read_text())))  # same JSON, other bytes
    weights = gen / "models/glm5-tiny/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert compare(gen, git) == [
        "differs: models/glm5-tiny/config.json (bytes differ)",
        "differs: models/glm5-tiny/model.safetensors (bytes differ)",
    ]


def test_committed_fixture_models_stay_under_24_mb() -> None:
    """The random fixtures take ~18.3 MiB; the cap was 20 MiB until glm5-chat-small, the
    trained default (~4.5 MiB: 2.2 M bf16 parameters with its MTP head, plus its oracle), came;
    it was raised by that model's size and no more, so a new fixture still has to fit.
    kimi-tiny (~305 KiB) did not fit the ~91 KiB left: Kimi's format alone fixes 256 special
    ids, so its vocabulary and logits cannot shrink below that; the cap was raised by 320 KiB.
    The default model's two first-contact training stages added 256 KiB of recorded loss curve
    (training.json, train_log.txt), which the replay tests check step by step."""
    from colibri.resources import fixtures_dir

    total = sum(p.stat().st_size for p in (fixtures_dir() / "models").rglob("*") if p.is_file())
    cap = 24 * 1024 * 1024 + 576 * 1024
    assert total < cap, f"fixtures/models holds {total / 2**20:.1f} MiB"


def test_the_trained_models_folder_holds_only_what_its_oracle_generator_writes() -> None:
    """make oracle-check (which needs torch) fails on a committed file the generator does not
    write; this holds the same without torch: every file beside the trained model's oracle is
    one of the generator's INPUTS, copied through unchanged."""
    import ast

    source = Path(__file__).resolve().parents[2] / "fixtures" / "make_chat_small_oracle.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    inputs = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "INPUTS" for t in node.targets))
    written = {*inputs, "oracle.json", "oracle_logits.npy"}
    folder = fixture_model_dir("glm5-chat-small")
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == sorted(written)
