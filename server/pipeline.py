"""The output pipeline: engine text → stop filter → reasoning split → tool gate → client.

The pipeline also keeps where in the raw engine text each character of the answer came from,
so log-probabilities describe exactly the text it produced (``answer_mask``).
"""

from __future__ import annotations

from colibri.server.stops import GLM_IMPLICIT_STOPS, StopFilter
from colibri.server.thinking import Part, ThinkingSplit
from colibri.server.toolcalls import ToolStreamGate

Piece = tuple[str, str]


def stop_filter(client_stops: tuple[str, ...], ignore_leading: bool, chat: bool,
                implicit: tuple[str, ...] = GLM_IMPLICIT_STOPS) -> StopFilter:
    """colibri's stop policy: on chat without ``stop``, the served family's implicit role
    markers (patient; GLM's by default, none for a family that ends its turns with
    end-of-text only, server/chat_family.py)."""
    if client_stops:
        return StopFilter(client_stops, patient=ignore_leading)
    if chat and implicit:
        return StopFilter(implicit, patient=True)
    return StopFilter((), patient=ignore_leading)


class OutputPipeline:
    def __init__(self, stops: StopFilter, split: ThinkingSplit | None, tools_active: bool,
                 streaming: bool) -> None:
        self.stops = stops
        self.split = split
        self.gate = ToolStreamGate() if tools_active and streaming else None
        self.reasoning = ""
        #: The whole answer text after the split (tool calls are parsed from it).
        self.answer = ""
        #: Raw-text ``[start, end)`` of each piece of ``answer``, in order.
        self.answer_spans: list[tuple[int, int]] = []

    @property
    def stopped(self) -> bool:
        return self.stops.matched

    def feed(self, text: str) -> list[Piece]:
        kept = self.stops.feed(text)
        return self._after_stops(kept, self.stops.released_at, final=False)

    def finish(self) -> list[Piece]:
        kept = self.stops.finish()
        return self._after_stops(kept, self.stops.released_at, final=True)

    def answer_mask(self, size: int) -> list[bool]:
        """Which of the raw text's ``size`` characters are in ``answer``."""
        mask = [False] * size
        for start, end in self.answer_spans:
            mask[start:end] = [True] * (end - start)
        return mask

    def _after_stops(self, text: str, at: int, final: bool) -> list[Piece]:
        parts: list[Part]
        if self.split is None:
            parts = [("content", text, at)] if text else []
        else:
            parts = self.split.feed(text, at) if text else []
            if final:
                parts += self.split.finish()
        out: list[Piece] = []
        for kind, piece, start in parts:
            if kind == "reasoning":
                self.reasoning += piece
                out.append((kind, piece))
                continue
            self.answer += piece
            self.answer_spans.append((start, start + len(piece)))
            shown = self.gate.feed(piece) if self.gate is not None else piece
            if shown:
                out.append(("content", shown))
        if final and self.gate is not None:
            tail = self.gate.finish()
            if tail:
                out.append(("content", tail))
        return out
