"""Reading a usage-counter file strictly: `.coli_usage` and the STATS dump share the layout of
spec/protocol.md §4.2, and what an engine writes must be exactly that layout.

A reader such as the expert atlas is lenient (it skips odd lines); the conformance suite is
not, because a file that only parses leniently is one another reader may misread.
"""

from __future__ import annotations

from pathlib import Path

from colibri.conformance.outcome import CheckFailure


def read_usage(
    path: Path, experts: int, engine_id: int, header: bool = True
) -> dict[tuple[int, int], int]:
    """The non-zero counts by (layer, expert); an all-zero table is a zero-byte file.

    ``header=False`` also accepts the headerless triples colibri's glm.c writes (the layout
    before the ``-1``/``-2`` records, which §4.2's readers still accept); a header that is
    there must still be exact."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckFailure(f"{path.name} cannot be read as ASCII text: {exc}") from None
    if not text:
        return {}
    lines = text.splitlines()
    try:
        records = [tuple(int(x) for x in line.split()) for line in lines]
    except ValueError:
        raise CheckFailure(f"{path.name} has a line that is not integers") from None
    if not header and records and records[0][:1] != (-1,):
        return _counts(path, records, None, experts)
    if len(records) < 2 or len(records[0]) != 3 or records[0][0] != -1:
        raise CheckFailure(f"{path.name} does not start with '-1 <layers> <experts>': {lines[:1]}")
    if records[0][2] != experts:
        raise CheckFailure(f"{path.name} header {lines[0]!r} does not name {experts} experts")
    if records[1] != (-2, 1, engine_id):
        raise CheckFailure(f"{path.name} second line {lines[1]!r} is not '-2 1 {engine_id}'")
    return _counts(path, records[2:], records[0][1], experts)


def _counts(
    path: Path, counts: list[tuple[int, ...]], layers: int | None, experts: int
) -> dict[tuple[int, int], int]:
    """The (layer, expert) -> count records, strictly: three fields, ascending, unique,
    non-zero, inside the header's dimensions (the expert count alone without a header)."""
    if any(len(r) != 3 for r in counts):
        raise CheckFailure(f"{path.name} has a record without exactly 3 fields")
    keys = [(r[0], r[1]) for r in counts]
    if keys != sorted(set(keys)) or any(r[2] <= 0 for r in counts):
        raise CheckFailure(f"{path.name} records are not ascending, unique and non-zero")
    top = layers if layers is not None else max(layer for layer, _ in keys)
    if any(not 0 <= layer <= top or not 0 <= expert < experts for layer, expert in keys):
        where = "its header" if layers is not None else "the model's expert count"
        raise CheckFailure(f"{path.name} names a layer or expert outside {where}")
    return {(r[0], r[1]): r[2] for r in counts}
