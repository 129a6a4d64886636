"""Running a list of cases against one target: capability gating, expectations, reruns."""

from __future__ import annotations

import fnmatch
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Protocol

from colibri.conformance.cases import Case
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import (
    ERROR,
    FAIL,
    PASS,
    SKIP,
    XFAIL,
    XPASS,
    CheckFailure,
    NotApplicable,
    Result,
)


class Executor(Protocol):
    capabilities: set[str]

    def run(self, case: Case) -> list[str]: ...

    def close(self) -> None: ...


class Cloneable(Executor, Protocol):
    def clone(self) -> Executor: ...


def select_cases(cases: Iterable[Case], patterns: list[str]) -> list[Case]:
    """Cases whose id or area matches any glob pattern (all when no pattern is given)."""
    chosen = list(cases)
    if not patterns:
        return chosen
    return [
        c
        for c in chosen
        if any(fnmatch.fnmatchcase(c.id, p) or fnmatch.fnmatchcase(c.area, p) for p in patterns)
    ]


def _attempt(executor: Executor, case: Case) -> tuple[str, str, list[str]]:
    try:
        warnings = executor.run(case)
    except CheckFailure as exc:
        return FAIL, str(exc), []
    except NotApplicable as exc:
        return SKIP, str(exc), []
    except Exception as exc:  # noqa: BLE001 - a harness error must not stop the run
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return ERROR, f"harness error: {detail}", []
    return PASS, "", warnings


def run_case(executor: Executor, case: Case, expectations: Expectations, reruns: int = 2) -> Result:
    result = Result(case.id, case.suite, case.area, case.level, case.clause, SKIP,
                    profile=case.profile)
    expected = expectations.get(case.id)
    if expected is not None and expected.status == "skip":
        result.message = f"skipped by expectations: {expected.reason}"
        return result
    missing = sorted(case.requires - executor.capabilities)
    if missing:
        result.message = "target lacks: " + ", ".join(missing)
        return result
    start = time.monotonic()
    attempts = 1 + (reruns if expected is not None and expected.status == "flaky" else 0)
    status, message = SKIP, ""
    warnings: list[str] = []
    for attempt in range(1, attempts + 1):
        status, message, warnings = _attempt(executor, case)
        result.attempts = attempt
        if status in (PASS, SKIP):
            break
    result.duration_s = time.monotonic() - start
    result.warnings = warnings
    if expected is not None and expected.status == "xfail":
        if status in (FAIL, ERROR):
            status, message = XFAIL, f"expected failure ({expected.reason}): {message}"
        elif status == PASS:
            status, message = XPASS, f"passed but expected to fail: {expected.reason}"
    result.status, result.message = status, message
    return result


def run_suite(
    executor: Executor,
    cases: list[Case],
    expectations: Expectations,
    reruns: int = 2,
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    results = []
    try:
        for number, case in enumerate(cases):
            prepare = getattr(executor, "prepare", None)
            if prepare is not None and number + 1 < len(cases):
                prepare(cases[number + 1])
            result = run_case(executor, case, expectations, reruns)
            results.append(result)
            if progress is not None:
                progress(result)
    finally:
        executor.close()
    return results


def run_parallel(
    executor: Cloneable,
    cases: list[Case],
    expectations: Expectations,
    reruns: int = 2,
    jobs: int = 2,
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Like run_suite, with `jobs` independent executors (each its own engines) working
    through the cases; results come back in case order. Cases never share an engine across
    workers, so a verdict does not depend on what ran next to it."""
    if jobs <= 1 or len(cases) < 2:
        return run_suite(executor, cases, expectations, reruns, progress)
    workers = [executor] + [executor.clone() for _ in range(jobs - 1)]
    results: list[Result | None] = [None] * len(cases)
    lock = threading.Lock()
    position = [0]
    deaths: dict[int, str] = {}

    def work(worker: Executor) -> None:
        number = -1
        try:
            while True:
                with lock:
                    number = position[0]
                    position[0] += 1
                if number >= len(cases):
                    return
                result = run_case(worker, cases[number], expectations, reruns)
                with lock:
                    results[number] = result
                    if progress is not None:
                        progress(result)
        except BaseException as exc:  # noqa: BLE001 - reported as the case's ERROR below
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            with lock:
                deaths[number] = detail

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in workers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for worker in workers:
            worker.close()
    return [r if r is not None else _lost(case, deaths.get(number))
            for number, (r, case) in enumerate(zip(results, cases, strict=True))]


def _lost(case: Case, death: str | None) -> Result:
    """The verdict of a case whose worker died: an ERROR, never a silently missing case."""
    reason = f"worker died: {death}" if death else "no worker was left to run it"
    return Result(case.id, case.suite, case.area, case.level, case.clause, ERROR,
                  f"harness error: {reason}", profile=case.profile)
