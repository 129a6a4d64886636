"""Reporters: a summary table per area, JSON (one record per case) and JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import TextIO

from colibri.conformance.http_profiles import describe, profile_counts
from colibri.conformance.outcome import ERROR, FAIL, PASS, SKIP, XFAIL, XPASS, Result

COLUMNS = (PASS, FAIL, ERROR, XFAIL, XPASS, SKIP)


def summary_table(results: list[Result], out: TextIO) -> None:
    per_area: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COLUMNS, 0))
    for result in results:
        per_area[f"{result.suite}.{result.area}"][result.status] += 1
    width = max([len(a) for a in per_area] + [5])
    header = f"{'area':<{width}}  " + "  ".join(f"{c:>5}" for c in COLUMNS)
    out.write(header + "\n" + "-" * len(header) + "\n")
    totals = dict.fromkeys(COLUMNS, 0)
    for area in sorted(per_area):
        counts = per_area[area]
        for c in COLUMNS:
            totals[c] += counts[c]
        out.write(f"{area:<{width}}  " + "  ".join(f"{counts[c]:>5}" for c in COLUMNS) + "\n")
    out.write("-" * len(header) + "\n")
    out.write(f"{'total':<{width}}  " + "  ".join(f"{totals[c]:>5}" for c in COLUMNS) + "\n")
    if any(r.profile for r in results):
        out.write("\nper profile:\n")
        for line in describe(profile_counts(results)):
            out.write(f"  {line}\n")
    for result in results:
        if result.status in (FAIL, ERROR, XPASS) or result.warnings:
            label = result.status.upper() if result.status != PASS else "WARN"
            out.write(f"\n{label} {result.case_id} [{result.level}] ({result.clause})\n")
            for line in (result.message.splitlines() + result.warnings)[:8]:
                out.write(f"    {line}\n")


def verdict(results: list[Result]) -> bool:
    """True iff every must case passed or is an expected failure."""
    return not any(r.blocking for r in results)


def write_json(results: list[Result], path: Path) -> None:
    records = [
        {
            "id": r.case_id,
            "suite": r.suite,
            "area": r.area,
            "level": r.level,
            "clause": r.clause,
            "profile": r.profile,
            "status": r.status,
            "message": r.message,
            "warnings": r.warnings,
            "attempts": r.attempts,
            "duration_s": round(r.duration_s, 4),
        }
        for r in results
    ]
    profiles = {name: dict(counts) for name, counts in profile_counts(results).items()}
    document = {"ok": verdict(results), "profiles": profiles, "cases": records}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def write_junit(results: list[Result], path: Path, name: str) -> None:
    suite = ET.Element(
        "testsuite",
        name=name,
        tests=str(len(results)),
        failures=str(sum(r.status in (FAIL, XPASS) for r in results)),
        errors=str(sum(r.status == ERROR for r in results)),
        skipped=str(sum(r.status in (SKIP, XFAIL) for r in results)),
        time=f"{sum(r.duration_s for r in results):.3f}",
    )
    for r in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"{r.suite}.{r.area}",
            name=r.case_id,
            time=f"{r.duration_s:.3f}",
        )
        ET.SubElement(case, "properties").extend(
            [
                ET.Element("property", name="level", value=r.level),
                ET.Element("property", name="clause", value=r.clause),
                ET.Element("property", name="profile", value=r.profile),
            ]
        )
        if r.status == FAIL:
            ET.SubElement(case, "failure", message=r.message[:200]).text = r.message
        elif r.status == XPASS:
            ET.SubElement(case, "failure", message="unexpected pass").text = r.message
        elif r.status == ERROR:
            ET.SubElement(case, "error", message=r.message[:200]).text = r.message
        elif r.status in (SKIP, XFAIL):
            ET.SubElement(case, "skipped", message=f"{r.status}: {r.message}"[:200])
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    path.write_text(ET.tostring(root, encoding="unicode") + "\n", encoding="utf-8")
