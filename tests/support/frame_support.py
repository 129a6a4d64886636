"""Feeding a ``colibri.protocol.FrameParser`` the way a pipe might: in arbitrary pieces."""

from __future__ import annotations

from collections.abc import Iterable

from colibri.protocol import FrameParser, WireFrame


def feed_in_pieces(parser: FrameParser, data: bytes, cuts: Iterable[int]) -> list[WireFrame]:
    """Every frame of `data` fed split at `cuts` (any order, repeats allowed), then EOF."""
    got: list[WireFrame] = []
    start = 0
    for cut in sorted(cuts):
        got += parser.feed(data[start:cut])
        start = cut
    return got + parser.feed(data[start:]) + parser.finish()
