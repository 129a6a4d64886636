"""Repository-wide invariants that no single module's tests would notice."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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
