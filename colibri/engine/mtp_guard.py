"""colibri's MTP guard and the drafting counters: over the last 24 proposals, fewer than 70%
accepted pauses drafting for 256 tokens (COLI_MTP_GUARD_WINDOW / _PCT in colibri), so a head
that predicts badly costs little. Drafting never changes output, only speed."""

from __future__ import annotations

from collections import deque

WINDOW = 24
MIN_ACCEPT_PCT = 70
PAUSE_TOKENS = 256


class MtpGuard:
    def __init__(self) -> None:
        self.drafted = 0
        self.accepted = 0
        self._recent: deque[bool] = deque(maxlen=WINDOW)
        self._paused = 0

    def allows(self) -> bool:
        """Whether this step may draft (a paused step counts down the pause)."""
        if self._paused > 0:
            self._paused -= 1
            return False
        return True

    def record(self, accepted: bool) -> bool:
        """Count one proposal; True when this one tripped the guard (drafting now paused)."""
        self.drafted += 1
        self.accepted += int(accepted)
        self._recent.append(accepted)
        if len(self._recent) == WINDOW and 100 * sum(self._recent) < MIN_ACCEPT_PCT * WINDOW:
            self._paused = PAUSE_TOKENS
            self._recent.clear()
            return True
        return False

    def summary(self) -> str:
        pct = 100.0 * self.accepted / self.drafted if self.drafted else 0.0
        return f"[MTP] {self.accepted}/{self.drafted} drafts accepted ({pct:.1f}%)"
