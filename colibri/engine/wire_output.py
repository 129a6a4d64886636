"""Writing engine frames: one write and one flush per frame, LF line ends, C number spellings.

The formatters here are the only place that spells numbers on the wire; each mirrors a printf
format of colibri's engine (spec/protocol.md section 1.1). Python's %-formatting of finite
floats is correctly rounded like glibc's, and it spells non-finite values nan/inf/-inf as libc
does, so the bytes agree.
"""

from __future__ import annotations

import math
from typing import BinaryIO

from colibri.protocol import END_LINE, READY_LINE

READY = READY_LINE
END = END_LINE


def f1(x: float) -> str:
    return f"{x:.1f}"


def f2(x: float) -> str:
    return f"{x:.2f}"


def f3(x: float) -> str:
    return f"{x:.3f}"


def f6(x: float) -> str:
    if math.isnan(x):
        return "nan"
    return f"{x:.6f}"


def data_header(rid: int, payload: bytes, tail: str = "") -> bytes:
    return f"DATA {rid} {len(payload)}{tail}\n".encode("ascii")


def echo_header(rid: int, payload: bytes, pos: int, tail: str) -> bytes:
    return f"ECHO {rid} {len(payload)} {pos}{tail}\n".encode("ascii")


def done_line(
    rid: int,
    emitted: int,
    tok_s: float,
    hit_pct: float,
    rss_gb: float,
    prompt_tokens: int,
    length_limited: bool,
) -> str:
    return (
        f"DONE {rid} STAT {emitted} {f2(tok_s)} {f1(hit_pct)} {f2(rss_gb)} "
        f"{prompt_tokens} {int(length_limited)}"
    )


def stat_line(produced: int, tok_s: float, hit_pct: float, rss_gb: float) -> str:
    return f"STAT {produced} {f2(tok_s)} {f1(hit_pct)} {f2(rss_gb)}"


class FrameWriter:
    """Writes frames to the engine's stdout (a binary stream), flushing after each."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out

    def raw(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()

    def line(self, text: str) -> None:
        self.raw(text.encode("utf-8") + b"\n")

    def payload(self, header: bytes, payload: bytes) -> None:
        """A payload-framed frame (DATA, ECHO): header line, exact bytes, LF; one write."""
        self.raw(header + payload + b"\n")
