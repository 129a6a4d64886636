"""The output pipeline: engine text → stop filter → reasoning split → tool gate → client."""

from __future__ import annotations

from colibri.server.stops import GLM_IMPLICIT_STOPS, StopFilter
from colibri.server.thinking import ThinkingSplit
from colibri.server.toolcalls import ToolStreamGate

Piece = tuple[str, str]


def stop_filter(client_stops: tuple[str, ...], ignore_leading: bool, chat: bool) -> StopFilter:
    """colibri's stop policy: implicit GLM role markers (patient) on chat without ``stop``."""
    if client_stops:
        return StopFilter(client_stops, patient=ignore_leading)
    if chat:
        return StopFilter(GLM_IMPLICIT_STOPS, patient=True)
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

    @property
    def stopped(self) -> bool:
        return self.stops.matched

    def feed(self, text: str) -> list[Piece]:
        return self._after_stops(self.stops.feed(text), final=False)

    def finish(self) -> list[Piece]:
        return self._after_stops(self.stops.finish(), final=True)

    def _after_stops(self, text: str, final: bool) -> list[Piece]:
        if self.split is None:
            pieces = [("content", text)] if text else []
        else:
            pieces = self.split.feed(text) if text else []
            if final:
                pieces += self.split.finish()
        out: list[Piece] = []
        for kind, piece in pieces:
            if kind == "reasoning":
                self.reasoning += piece
                out.append((kind, piece))
                continue
            self.answer += piece
            shown = self.gate.feed(piece) if self.gate is not None else piece
            if shown:
                out.append(("content", shown))
        if final and self.gate is not None:
            tail = self.gate.finish()
            if tail:
                out.append(("content", tail))
        return out
