"""Splits GLM output into reasoning and answer text at ``</think>`` (spec/http.md §7.1)."""

from __future__ import annotations

OPEN = "<think>"
CLOSE = "</think>"


class ThinkingSplit:
    """Streaming splitter; both markers are always removed, the first ``</think>`` switches."""

    def __init__(self, starts_in_reasoning: bool) -> None:
        self.thinking = starts_in_reasoning
        self.pending = ""

    def feed(self, chunk: str) -> list[tuple[str, str]]:
        """Pieces as ``(kind, text)`` with kind ``reasoning`` or ``content``."""
        text = self.pending + chunk
        self.pending = ""
        out: list[tuple[str, str]] = []
        while text:
            open_at = text.find(OPEN)
            close_at = text.find(CLOSE)
            hits = [(p, m) for p, m in ((open_at, OPEN), (close_at, CLOSE)) if p >= 0]
            if not hits:
                keep = self._held(text)
                self._emit(out, text[: len(text) - keep])
                self.pending = text[len(text) - keep:]
                break
            pos, marker = min(hits)
            self._emit(out, text[:pos])
            if marker == CLOSE and self.thinking:
                self.thinking = False
            text = text[pos + len(marker):]
        return out

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        self._emit(out, self.pending)
        self.pending = ""
        return out

    def _emit(self, out: list[tuple[str, str]], text: str) -> None:
        if text:
            out.append(("reasoning" if self.thinking else "content", text))

    @staticmethod
    def _held(text: str) -> int:
        for size in range(min(len(CLOSE) - 1, len(text)), 0, -1):
            tail = text[-size:]
            if OPEN.startswith(tail) or CLOSE.startswith(tail):
                return size
        return 0
