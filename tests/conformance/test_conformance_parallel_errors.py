"""run_parallel: a case whose worker died is an ERROR, never a silently missing case."""

from __future__ import annotations

from colibri.conformance.cases import Case
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import ERROR, PASS
from colibri.conformance.runner import Executor, run_parallel


class Fatal(BaseException):
    """Escapes run_case's `except Exception`, as a dying worker would."""


class Scripted:
    capabilities: set[str] = set()

    def __init__(self, *fatal: str) -> None:
        self.fatal = fatal

    def run(self, case: Case) -> list[str]:
        if case.id in self.fatal:
            raise Fatal("worker thread lost")
        return []

    def close(self) -> None:
        pass

    def clone(self) -> Executor:
        return self


def _case(case_id: str) -> Case:
    return Case(case_id, "http", "area", "", "§1", "must", frozenset(), [], [])


def test_a_dead_worker_leaves_an_error_result_for_its_case() -> None:
    cases = [_case(f"c{i}") for i in range(6)]
    results = run_parallel(Scripted("c2"), cases, Expectations(), reruns=0, jobs=2)
    assert [r.case_id for r in results] == [c.id for c in cases]
    by_id = {r.case_id: r for r in results}
    assert by_id["c2"].status == ERROR and by_id["c2"].blocking
    assert "worker died" in by_id["c2"].message and "worker thread lost" in by_id["c2"].message
    assert all(r.status == PASS for r in results if r.case_id != "c2")


def test_cases_no_worker_reached_are_errors() -> None:
    # The first two claims (c0, c1) kill both workers, so nobody is left to run c2.
    cases = [_case(f"c{i}") for i in range(3)]
    results = run_parallel(Scripted("c0", "c1"), cases, Expectations(), reruns=0, jobs=2)
    assert [r.case_id for r in results] == ["c0", "c1", "c2"]
    assert all(r.status == ERROR for r in results)
    assert "no worker was left" in results[2].message
