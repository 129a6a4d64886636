"""The one progress renderer of the CLI: tqdm bars on stderr for every long command.

Library code (``reference/`` stays numpy-only) reports progress through a plain callback;
commands turn the callback into a bar here, so every command draws the same kind of bar and
a pipe or log gets tqdm's line-per-update fallback instead of carriage returns.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm  # type: ignore[import-untyped]


def bar(total: int, desc: str, unit: str, *, stream: TextIO | None = None,
        byte_units: bool = False) -> Any:
    """A tqdm bar on stderr; ``byte_units`` scales the counts as B/kB/MB."""
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=byte_units,
                unit_divisor=1000, file=stream if stream is not None else sys.stderr,
                dynamic_ncols=True)


def byte_progress(desc: str, stream: TextIO | None = None) -> tuple[
        Callable[[int, int], None], Callable[[], None]]:
    """A ``(done_bytes, total_bytes)`` callback drawing a byte bar, and a closer. The bar
    opens on the first call, when the total is known."""
    state: dict[str, Any] = {}

    def advance(nbytes: int, total: int) -> None:
        if "bar" not in state:
            state["bar"] = bar(total, desc, "B", stream=stream, byte_units=True)
        state["bar"].update(nbytes)

    def close() -> None:
        if "bar" in state:
            state["bar"].close()

    return advance, close
