"""Grammar masks computed while the backend computes (spec/protocol.md 2.3, "Grammar").

A request's next mask depends only on its grammar and the tokens it has emitted, all known
before the forward that produces its next logit row, so the mask and the forward can run at
the same time. llguidance's ``compute_bitmask`` drops the GIL, and so do the backends'
kernels (numpy's BLAS, the accelerated library through ctypes): one worker thread fills the
masks of the step's grammar rows while the calling thread runs the step. Each matcher is
touched by one thread at a time (the caller waits before it samples), and a mask is a pure
function of the matcher's state, so the tokens are the same bytes overlapped or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from colibri.text.grammar import Matcher

__all__ = ["MaskOverlap"]


def _fill(matchers: Sequence[Matcher]) -> None:
    for matcher in matchers:
        matcher.allowed()


class MaskOverlap:
    """Starts the masks of a step's grammar rows on a worker; ``wait`` joins them.

    Disabled (``COLI_GRAMMAR_OVERLAP=0``), ``start`` does nothing and each mask is computed
    on the calling thread when its row is sampled, as the benchmark's baseline."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._pool: ThreadPoolExecutor | None = None

    def start(self, matchers: Sequence[Matcher]) -> Future[None] | None:
        if not self.enabled or not matchers:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")
        return self._pool.submit(_fill, list(matchers))

    @staticmethod
    def wait(pending: Future[None] | None) -> None:
        """Block until ``pending`` is done; an error of the worker is raised here."""
        if pending is not None:
            pending.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
