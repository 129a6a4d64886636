"""Stop sequences applied to the raw engine text, held back across chunks (spec/http.md §7.1).

Strict mode ends the reply at the first match. Patient mode first drops role markers that
arrive before any non-whitespace output (GLM models sometimes open with one), then behaves
like strict mode.
"""

from __future__ import annotations

from colibri.text import chat_format

#: A reply ends where the model starts the next turn of the conversation.
GLM_IMPLICIT_STOPS: tuple[str, ...] = (chat_format.USER, chat_format.OBSERVATION)


class StopFilter:
    def __init__(self, sequences: tuple[str, ...], patient: bool = False) -> None:
        self.sequences = sequences
        self.patient = patient
        self.pending = ""
        self.matched = False
        self.emitted_visible = False
        self._hold = max((len(s) for s in sequences), default=1) - 1
        #: Raw characters consumed so far, and where the kept region starts and ends.
        self.consumed = 0
        self.dropped_prefix = 0
        self.cut: int | None = None
        #: Where, in the raw text, the text the last ``feed``/``finish`` returned begins.
        self.released_at = 0

    def feed(self, chunk: str) -> str:
        if self.matched:
            self.consumed += len(chunk)
            return ""
        base = self.consumed - len(self.pending)
        self.consumed += len(chunk)
        text = self.pending + chunk
        out = ""
        while True:
            hit = self._earliest(text)
            if hit is None:
                break
            pos, seq = hit
            before = text[:pos]
            if self.patient and not self.emitted_visible and not before.strip():
                # A leading marker: drop it and the whitespace before it.
                base += pos + len(seq)
                self.dropped_prefix = base
                text = text[pos + len(seq):]
                continue
            out += before
            self.matched = True
            self.cut = base + pos
            self.pending = ""
            self.released_at = base
            self._note(out)
            return out
        keep = self._held_suffix(text)
        release, self.pending = text[: len(text) - keep], text[len(text) - keep:]
        out += release
        self.released_at = base
        self._note(out)
        return out

    def finish(self) -> str:
        if self.matched:
            return ""
        self.released_at = self.consumed - len(self.pending)
        out, self.pending = self.pending, ""
        self._note(out)
        return out

    def _note(self, out: str) -> None:
        if out.strip():
            self.emitted_visible = True

    def _earliest(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for seq in self.sequences:
            pos = text.find(seq)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, seq)
        return best

    def _held_suffix(self, text: str) -> int:
        for size in range(min(self._hold, len(text)), 0, -1):
            tail = text[-size:]
            if any(seq.startswith(tail) for seq in self.sequences):
                return size
        return 0
