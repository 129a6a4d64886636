"""Reading STATS dumps (spec/protocol.md 4.2 "STATS dump"), the input of analyze and validate.

One record per line, ``<layer> <expert> <count>``; lines without exactly 3 fields are
ignored, records with a negative layer are headers and skipped, a repeated (layer, expert)
overwrites the earlier one. A run is one file ``<category>_<idx>.txt``; the name is split on
its last underscore.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

Key = tuple[int, int]


class AtlasError(ValueError):
    """Bad atlas input (a missing or corrupt stats file, a bad probe set); the message says
    which file and why."""


@dataclass(frozen=True)
class Run:
    name: str
    category: str
    index: str
    counts: dict[Key, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def read_dump(path: Path) -> dict[Key, int]:
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError as exc:
        raise AtlasError(f"stats file {path} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise AtlasError(f"stats file {path} cannot be read: {exc}") from exc
    counts: dict[Key, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if len(fields) != 3:
            continue
        try:
            layer, expert, count = (int(f) for f in fields)
        except ValueError as exc:
            raise AtlasError(f"stats file {path} line {number} is corrupt: {line!r} "
                             "(expected <layer> <expert> <count>)") from exc
        if layer < 0:
            continue
        if expert < 0 or count < 0:
            raise AtlasError(f"stats file {path} line {number} is corrupt: {line!r} "
                             "(negative expert or count)")
        counts[(layer, expert)] = count
    return counts


def run_name(path: Path) -> tuple[str, str]:
    category, sep, index = path.stem.rpartition("_")
    if not sep or not category or not index:
        raise AtlasError(f"stats file {path} is not named <category>_<idx>.txt")
    return category, index


def load_runs(stats_dir: Path) -> list[Run]:
    """Every ``*.txt`` dump of ``stats_dir`` in sorted order."""
    if not stats_dir.is_dir():
        raise AtlasError(f"stats directory {stats_dir} does not exist")
    files = sorted(stats_dir.glob("*.txt"))
    if not files:
        raise AtlasError(f"stats directory {stats_dir} holds no *.txt STATS dumps")
    runs = []
    for path in files:
        category, index = run_name(path)
        runs.append(Run(path.stem, category, index, read_dump(path)))
    return runs


def by_category(runs: list[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for run in runs:
        out.setdefault(run.category, []).append(run)
    return {c: out[c] for c in sorted(out)}
