"""Reporters: a summary table per area, JSON (one record per case) and JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import TextIO

from colibri.conformance.http_profiles import describe
from colibri.conformance.http_profiles import profile_counts as http_profile_counts
from colibri.conformance.outcome import ERROR, FAIL, PASS, SKIP, XFAIL, XPASS, Result
from colibri.conformance.profile_report import lacking, profile_counts
from colibri.conformance.versions import report_header

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
    # Protocol profiles nest (colibri extends core): profile_report writes their summary.
    if _suite(results) == "http" and any(r.profile for r in results):
        out.write("\nper profile:\n")
        for line in describe(http_profile_counts(results)):
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
            **_metadata(r),
        }
        for r in results
    ]
    document: dict[str, object] = {**report_header(_suite(results)), "ok": verdict(results)}
    if _suite(results) == "protocol" and any(r.profile for r in results):
        document["profiles"] = profile_counts(results)
        document["lacks"] = lacking(results)
    elif any(r.profile for r in results):
        counts = http_profile_counts(results)
        document["profiles"] = {name: dict(tally) for name, tally in counts.items()}
    document["cases"] = records
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def _suite(results: list[Result]) -> str:
    return results[0].suite if results else ""


def _text(value: object) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _metadata(r: Result) -> dict[str, object]:
    """Profile, capabilities, seed clause: present for protocol cases."""
    if not r.profile:
        return {}
    return {"profile": r.profile, "requires": r.requires, "seed": r.seed, "lacks": r.lacks}


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
    header = report_header(_suite(results))
    spec = header["spec"]
    assert isinstance(spec, dict)
    ET.SubElement(suite, "properties").extend(
        [ET.Element("property", name="suite_version", value=str(header["suite_version"]))]
        + [ET.Element("property", name=f"spec:{k}", value=str(v)) for k, v in spec.items()]
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
            ]
            + [ET.Element("property", name=k, value=_text(v)) for k, v in _metadata(r).items()]
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
