"""Per-target expectation files: known failures, flaky cases and skips, kept outside the cases.

Format (JSON)::

    {"target": "free text naming the engine or server",
     "cases": {"protocol.frames.done-format": {"status": "xfail", "reason": "..."},
               "http.admission.queue-full":   {"status": "flaky", "reason": "..."},
               "protocol.persistence.resume":  {"status": "skip",  "reason": "..."}}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from colibri.conformance.outcome import ERROR, FAIL, Result

STATUSES = ("xfail", "flaky", "skip")


class ExpectationsError(ValueError):
    pass


@dataclass
class Expectation:
    status: str
    reason: str


@dataclass
class Expectations:
    target: str = ""
    cases: dict[str, Expectation] = field(default_factory=dict)

    def get(self, case_id: str) -> Expectation | None:
        return self.cases.get(case_id)

    @classmethod
    def load(cls, path: Path | None) -> Expectations:
        if path is None or not path.exists():
            return cls()
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ExpectationsError(f"{path}: not JSON: {exc}") from exc
        if not isinstance(document, dict) or not isinstance(document.get("cases", {}), dict):
            raise ExpectationsError(f"{path}: expected an object with a 'cases' object")
        cases: dict[str, Expectation] = {}
        for case_id, entry in document.get("cases", {}).items():
            if not isinstance(entry, dict) or entry.get("status") not in STATUSES:
                raise ExpectationsError(f"{path}: {case_id}: status must be one of {STATUSES}")
            reason = entry.get("reason")
            if not isinstance(reason, str) or not reason.strip():
                raise ExpectationsError(f"{path}: {case_id}: every expectation needs a reason")
            cases[case_id] = Expectation(entry["status"], reason)
        return cls(str(document.get("target", "")), cases)

    def unknown_ids(self, known: set[str]) -> list[str]:
        return sorted(set(self.cases) - known)

    def updated(self, results: list[Result]) -> Expectations:
        """Expectations that make this run's verdict green: failures become xfail."""
        new = Expectations(self.target, {})
        for result in results:
            old = self.cases.get(result.case_id)
            if old is not None and old.status in ("flaky", "skip"):
                new.cases[result.case_id] = old
            elif result.status in (FAIL, ERROR, "xfail"):
                reason = old.reason if old and result.status == "xfail" else ""
                reason = reason or (result.message.splitlines() or ["failed"])[0][:300]
                new.cases[result.case_id] = Expectation("xfail", reason)
        return new

    def save(self, path: Path) -> None:
        document = {
            "target": self.target,
            "cases": {
                k: {"status": v.status, "reason": v.reason} for k, v in sorted(self.cases.items())
            },
        }
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
