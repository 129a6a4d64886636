"""`.coli_usage`: colibri's text file of cumulative routed-expert counts (spec/protocol.md 4.2).

Header records ``-1 <n_layers> <n_experts>`` and ``-2 1 <engine_id>``, then one
``<layer> <expert> <count>`` line per non-zero counter. Written atomically (tmp + rename);
an all-zero history is a zero-byte file. A file that does not fit this model is refused whole.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import numpy.typing as npt

FORMAT_VERSION = 1
U32_MAX = (1 << 32) - 1


def fnv1a32(text: str) -> int:
    h = 0x811C9DC5
    for byte in text.encode("utf-8"):
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


ENGINE_ID = fnv1a32("glm_moe_dsa")  # 3815245270


class UsageFileError(ValueError):
    """The file does not describe this model's usage; the message says why."""


def render(counts: npt.NDArray[np.uint64]) -> bytes:
    n_rows, n_experts = counts.shape
    clipped = np.minimum(counts, np.uint64(U32_MAX))
    nonzero = np.argwhere(clipped > 0)
    if nonzero.size == 0:
        return b""
    lines = [f"-1 {n_rows - 1} {n_experts}", f"-2 {FORMAT_VERSION} {ENGINE_ID}"]
    lines.extend(f"{layer} {expert} {int(clipped[layer, expert])}" for layer, expert in nonzero)
    return ("\n".join(lines) + "\n").encode("ascii")


def save(path: Path, counts: npt.NDArray[np.uint64]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(render(counts))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def parse(data: bytes, n_layers: int, n_experts: int, routed: set[int]) -> npt.NDArray[np.uint64]:
    """Counts [n_layers+1, n_experts] from the file's bytes, or UsageFileError."""
    counts = np.zeros((n_layers + 1, n_experts), np.uint64)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise UsageFileError("not a text file") from None
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            a, b, c = [int(x) for x in fields]
        except ValueError:
            raise UsageFileError(f"line {number} is not three integers") from None
        if a == -1:
            if (b, c) != (n_layers, n_experts):
                raise UsageFileError(
                    f"dimensions {b}x{c} differ from this model's {n_layers}x{n_experts}"
                )
        elif a == -2:
            if b > FORMAT_VERSION:
                raise UsageFileError(f"format version {b} is newer than {FORMAT_VERSION}")
            if c != ENGINE_ID:
                raise UsageFileError(f"engine id {c} is not glm_moe_dsa's {ENGINE_ID}")
        elif a in routed and 0 <= b < n_experts and 0 <= c <= U32_MAX:
            counts[a, b] = c
        else:
            raise UsageFileError(f"line {number} names no routed expert of this model: {line}")
    return counts
