"""`colibri conformance` end to end: exit status, JSON and JUnit files, expectations."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from colibri.conformance.cases import load_cases

SUPPORT = Path(__file__).parents[1] / "support" / "conformance_support"
PY = shlex.quote(sys.executable)
ENGINE = f"{PY} {shlex.quote(str(SUPPORT / 'mux_fake_model.py'))}"
MUTANT = f"{PY} {shlex.quote(str(SUPPORT / 'mutant_proxy.py'))} drop_accept {ENGINE}"


def _conformance(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colibri", "conformance", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _protocol(engine: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _conformance(
        "protocol",
        "--engine-cmd",
        engine,
        "--model",
        str(SUPPORT / "fake-model"),
        "--cases",
        "protocol.frames.*",
        "--timeout",
        "10",
        "--json",
        str(tmp / "r.json"),
        "--junit",
        str(tmp / "r.xml"),
        *extra,
    )


def test_failing_engine_then_recorded_expectations(tmp_path: Path) -> None:
    expectations = tmp_path / "expect.json"
    recorded = _protocol(
        MUTANT, tmp_path, "--expectations", str(expectations), "--update-expectations"
    )
    # This run fails (exit 1) and records why, so the next run is green.
    assert recorded.returncode == 1 and "FAIL protocol.frames.turn-order" in recorded.stdout
    entries = json.loads(expectations.read_text())["cases"]
    assert entries["protocol.frames.turn-order"]["status"] == "xfail"
    assert entries["protocol.frames.turn-order"]["reason"]
    again = _protocol(MUTANT, tmp_path, "--expectations", str(expectations))
    assert again.returncode == 0, again.stdout
    assert "result: PASS" in again.stdout and "protocol.frames" in again.stdout
    records = json.loads((tmp_path / "r.json").read_text())["cases"]
    statuses = {r["id"]: r["status"] for r in records}
    # Every case the pattern selects is reported once, in the JSON and in the JUnit file.
    selected = [c.id for c in load_cases("protocol") if c.id.startswith("protocol.frames.")]
    assert sorted(statuses) == sorted(selected) and len(records) == len(selected)
    assert statuses["protocol.frames.turn-order"] == "xfail"
    assert statuses["protocol.frames.done-format"] == "pass"
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == str(len(selected))
    assert suite.get("failures") == "0"


def test_list_and_usage_errors() -> None:
    listed = _conformance(
        "protocol",
        "--engine-cmd",
        ENGINE,
        "--model",
        str(SUPPORT / "fake-model"),
        "--list",
        "--cases",
        "protocol.golden.*",
    )
    assert listed.returncode == 0 and "protocol.golden.oracle-greedy-tokens" in listed.stdout
    both = _conformance("http", "--base-url", "http://127.0.0.1:9", "--server-cmd", "x")
    assert both.returncode == 2 and "exactly one" in both.stderr
    missing = _conformance("protocol", "--engine-cmd", "/nonexistent/engine")
    assert missing.returncode == 2 and "cannot start" in missing.stderr
