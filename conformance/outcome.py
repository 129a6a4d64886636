"""Verdicts: what one case run produced, and how expectations turn it into pass/fail."""

from __future__ import annotations

from dataclasses import dataclass, field


class CheckFailure(AssertionError):
    """An expectation did not hold; the message says which and why."""


class NotApplicable(Exception):
    """The case cannot run on this target (missing capability, data or configuration)."""


PASS = "pass"
FAIL = "fail"
SKIP = "skip"
XFAIL = "xfail"  # failed, and the expectations file says it is expected to
XPASS = "xpass"  # passed although expected to fail (the expectation file is stale)
ERROR = "error"  # the harness itself could not run the case (engine would not start, ...)


@dataclass
class Result:
    case_id: str
    suite: str
    area: str
    level: str
    clause: str
    status: str
    message: str = ""
    duration_s: float = 0.0
    attempts: int = 1
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: The case's profile (protocol: core, colibri or serve_codec; HTTP: openai, anthropic
    #: or colibri), capabilities and seed clause.
    profile: str = ""
    requires: list[str] = field(default_factory=list)
    seed: str = ""
    #: Capabilities the target lacks, when that is why the case was skipped.
    lacks: list[str] = field(default_factory=list)

    @property
    def blocking(self) -> bool:
        """Does this result make the run fail (exit 1)?"""
        return self.level == "must" and self.status in (FAIL, ERROR)
