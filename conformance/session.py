"""Assembling a run from command-line style options: target, capabilities, cases, reports."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO, cast

from colibri.conformance.cases import Case, load_cases
from colibri.conformance.expectations import Expectations
from colibri.conformance.http_profiles import select_profiles
from colibri.conformance.outcome import ERROR, FAIL, XPASS, Result
from colibri.conformance.profile_report import write_profile_summary
from colibri.conformance.report import summary_table, verdict, write_json, write_junit
from colibri.conformance.runner import (
    Cloneable,
    Executor,
    run_parallel,
    run_suite,
    select_cases,
)


@dataclass
class RunOptions:
    select: list[str] = field(default_factory=list)
    case_files: list[Path] = field(default_factory=list)
    capabilities: list[str] = field(default_factory=list)
    without: list[str] = field(default_factory=list)
    expectations: Path | None = None
    update_expectations: bool = False
    json_path: Path | None = None
    junit_path: Path | None = None
    reruns: int = 2
    timeout: float = 30.0
    list_only: bool = False
    quiet: bool = False
    jobs: int = 1
    #: Only the cases of these profiles (conformance/http_profiles.py); all when empty.
    profiles: list[str] = field(default_factory=list)


#: How much of a failure's message its progress line carries (the report has all of it).
REASON_CHARS = 160


def progress_line(result: Result) -> str:
    """``STATUS case-id``, and for a failure or error its reason inline (first line, cut to
    ``REASON_CHARS``), so an engine author sees why as the run goes."""
    line = f"{result.status.upper():5} {result.case_id}"
    if result.status in (FAIL, ERROR, XPASS) and result.message:
        reason = result.message.strip().splitlines()[0]
        if len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 1] + "…"
        line += f"  -- {reason}"
    return line


def finish(
    suite: str,
    executor: Executor,
    options: RunOptions,
    target_name: str,
    out: TextIO = sys.stdout,
) -> tuple[int, list[Result]]:
    """Run the selected cases on an executor, report, and return (exit status, results)."""
    cases: list[Case] = select_profiles(
        select_cases(load_cases(suite, options.case_files), options.select), options.profiles
    )
    executor.capabilities |= set(options.capabilities)
    executor.capabilities -= set(options.without)
    if options.list_only:
        executor.close()
        for case in cases:
            missing = sorted(case.requires - executor.capabilities)
            note = f"  (skipped: lacks {', '.join(missing)})" if missing else ""
            profile = f"  <{case.profile}>" if case.profile else ""
            out.write(f"{case.id}  [{case.level}]{profile}  {case.clause}{note}\n")
        return 0, []
    expectations = Expectations.load(options.expectations)
    unknown = expectations.unknown_ids({c.id for c in load_cases(suite, options.case_files)})
    if unknown:
        out.write(f"warning: expectations name unknown cases: {', '.join(unknown)}\n")
    expectations.target = expectations.target or target_name

    def progress(result: Result) -> None:
        if not options.quiet:
            out.write(progress_line(result) + "\n")
            out.flush()

    if options.jobs > 1 and hasattr(executor, "clone"):
        # Only executors whose cases cannot disturb each other offer clone() (protocol).
        parallel = cast(Cloneable, executor)
        results = run_parallel(
            parallel, cases, expectations, options.reruns, options.jobs, progress
        )
    else:
        results = run_suite(executor, cases, expectations, options.reruns, progress)
    out.write(f"\ncolibri conformance {suite}: {target_name}\n")
    out.write(f"capabilities: {', '.join(sorted(executor.capabilities)) or '(none)'}\n\n")
    summary_table(results, out)
    write_profile_summary(results, out)
    if options.json_path is not None:
        write_json(results, options.json_path)
    if options.junit_path is not None:
        write_junit(results, options.junit_path, f"colibri-conformance-{suite}")
    if options.update_expectations:
        if options.expectations is None:
            out.write("--update-expectations needs --expectations FILE\n")
            return 2, results
        expectations.updated(results).save(options.expectations)
        out.write(f"expectations written to {options.expectations}\n")
    ok = verdict(results)
    failing = sum(r.blocking for r in results)
    out.write(f"\nresult: {'PASS' if ok else 'FAIL'} ({failing} must case(s) failing)\n")
    return (0 if ok else 1), results
