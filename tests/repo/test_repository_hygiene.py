"""Repository-wide invariants that no single module's tests would notice."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFLICT_MARKER = re.compile(r"^(<{7}|>{7}) ", re.MULTILINE)


def _tracked_text_files() -> list[Path]:
    listing = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    suffixes = {".py", ".md", ".json", ".yaml", ".toml", ".txt", ".jinja", ""}
    return [REPO / name for name in listing if Path(name).suffix in suffixes]


def test_no_merge_conflict_markers_are_committed() -> None:
    offenders = []
    for path in _tracked_text_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if CONFLICT_MARKER.search(text):
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


# The reference's math modules cite the section of spec/model.md they implement, and the
# sections they cite exist (a reader goes from the code to the equations and back).
_NOT_MATH = {"__init__", "aligned_write", "backend", "errors", "expert_lru", "safetensors",
             "quant/errors", "quant/safetensors_file"}


def test_reference_math_docstrings_cite_their_model_md_section() -> None:
    import ast

    root = Path(__file__).resolve().parents[2]
    spec = (root / "spec" / "model.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", spec, flags=re.M))
    missing, unknown = [], []
    for path in sorted((root / "reference").rglob("*.py")):
        name = path.relative_to(root / "reference").with_suffix("").as_posix()
        if name in _NOT_MATH:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        cited = " ".join(re.findall(r"spec/model\.md([^\n]*)", doc))
        numbers = re.findall(r"§(\d+(?:\.\d+)?)", cited)
        if not numbers:
            missing.append(name)
        unknown += [f"{name}: §{n}" for n in numbers if n not in sections]
    assert missing == [] and unknown == []
