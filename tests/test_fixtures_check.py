"""colibri.fixtures.check's comparison (the regeneration itself needs torch: make oracle-check)."""

from __future__ import annotations

from pathlib import Path

from colibri.fixtures.check import compare, generators


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
        "differs: models/a/x",
        "no longer generated: models/a/stale",
    ]


def test_generators_are_discovered() -> None:
    assert "make_models.py" in [p.name for p in generators()]


def test_committed_fixture_models_stay_under_20_mb() -> None:
    from colibri.resources import fixtures_dir

    total = sum(p.stat().st_size for p in (fixtures_dir() / "models").rglob("*") if p.is_file())
    assert total < 20 * 1024 * 1024, f"fixtures/models holds {total / 2**20:.1f} MiB"
