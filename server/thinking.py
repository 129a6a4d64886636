"""Splits GLM output into reasoning and answer text at ``</think>`` (spec/http.md §7.1)."""

from __future__ import annotations

OPEN = "<think>"
CLOSE = "</think>"

#: ``(kind, text, start)``: kind ``reasoning`` or ``content``, start its raw-text offset.
Part = tuple[str, str, int]


class ThinkingSplit:
    """Streaming splitter; both markers are always removed, the first ``</think>`` switches.

    ``feed(chunk, at)`` takes ``at``, the raw-text offset of ``chunk``; successive chunks are
    contiguous whenever text is held back, so every part knows where it came from.
    """

    def __init__(self, starts_in_reasoning: bool) -> None:
        self.thinking = starts_in_reasoning
        self.pending = ""
        self._end = 0

    def feed(self, chunk: str, at: int = 0) -> list[Part]:
        text = self.pending + chunk
        base = at - len(self.pending)
        self._end = at + len(chunk)
        self.pending = ""
        out: list[Part] = []
        while text:
            open_at = text.find(OPEN)
            close_at = text.find(CLOSE)
            hits = [(p, m) for p, m in ((open_at, OPEN), (close_at, CLOSE)) if p >= 0]
            if not hits:
                keep = self._held(text)
                self._emit(out, text[: len(text) - keep], base)
                self.pending = text[len(text) - keep:]
                break
            pos, marker = min(hits)
            self._emit(out, text[:pos], base)
            if marker == CLOSE and self.thinking:
                self.thinking = False
            text = text[pos + len(marker):]
            base += pos + len(marker)
        return out

    def finish(self) -> list[Part]:
        out: list[Part] = []
        self._emit(out, self.pending, self._end - len(self.pending))
        self.pending = ""
        return out

    def _emit(self, out: list[Part], text: str, start: int) -> None:
        if text:
            out.append(("reasoning" if self.thinking else "content", text, start))

    @staticmethod
    def _held(text: str) -> int:
        for size in range(min(len(CLOSE) - 1, len(text)), 0, -1):
            tail = text[-size:]
            if OPEN.startswith(tail) or CLOSE.startswith(tail):
                return size
        return 0
