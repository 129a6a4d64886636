"""The docs read as the product: a short README for users, the long material in docs/, and no
history of how the code was written anywhere in the repository (git log keeps that)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250
#: The two commands that do all set-up on a fresh machine come first.
README_HEAD_LINES = 15
#: A reference to one of the project's own issues by number: "issue", then a number, with or
#: without "#" or "-". colibri's upstream numbers are cited as "colibri #N", which this leaves
#: alone.
HISTORY = re.compile(r"\bissue[ -]?#?\d+\b", re.IGNORECASE)
#: Committed fixture data (oracle JSON, training and evaluation logs) is data, not prose.
DATA_SUFFIXES = {".json", ".txt", ".log", ".jsonl", ".csv"}


def _repository_files() -> list[Path]:
    """Tracked files and untracked ones git does not ignore: the tree a commit would hold."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout
    return [REPO / name for name in sorted(set(listing.split("\0"))) if name]


def _is_fixture_data(path: Path) -> bool:
    relative = path.relative_to(REPO).parts
    return relative[0] == "fixtures" and path.suffix in DATA_SUFFIXES


def history_references(paths: list[Path], root: Path) -> list[str]:
    """`file:line: text` for every line of a text file that names an issue by number."""
    found = []
    for path in paths:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: weights, images
        for number, line in enumerate(text.splitlines(), start=1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_readme_is_at_most_250_lines() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_opens_with_make_serve_and_make_test() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    head = "\n".join(lines[:README_HEAD_LINES])
    assert "make serve" in head and "make test" in head


def test_docs_has_a_reading_guide() -> None:
    guide = REPO / "docs" / "README.md"
    assert guide.is_file()
    # every page of docs/ that the guide or the README links to exists
    text = guide.read_text(encoding="utf-8") + (REPO / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((?:docs/)?([a-z_-]+\.md)\)", text))
    assert linked and all((REPO / "docs" / name).is_file() for name in linked), linked


def test_no_file_names_an_issue_by_number() -> None:
    files = [p for p in _repository_files() if not _is_fixture_data(p)]
    assert history_references(files, REPO) == []


def test_a_planted_issue_number_is_found(tmp_path: Path) -> None:
    line = '"""Holds the cache (see ' + "issue" + ' 12)."""'  # split, or this file would match
    planted = tmp_path / "module.py"
    planted.write_text(line + "\n", encoding="utf-8")
    clean = tmp_path / "clean.md"
    clean.write_text("colibri #528 fixed the sampler; an issue of rounding remains.\n",
                     encoding="utf-8")
    assert history_references([planted, clean], tmp_path) == [f"module.py:1: {line}"]
