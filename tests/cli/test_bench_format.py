"""`colibri bench --format table`: the short human table on stdout instead of the JSON
document (which `--output` still writes); the default keeps the JSON on stdout and the table
on stderr."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from colibri.benchmarks import SECTIONS, BenchOptions, Section
from colibri.cli import main


@pytest.fixture
def tiny_section(monkeypatch: pytest.MonkeyPatch) -> str:
    def run(_options: BenchOptions) -> dict[str, Any]:
        return {"ratios": {"fast_vs_slow": 2.5}}

    monkeypatch.setitem(SECTIONS, "format-probe", Section("format-probe", ("reference",),
                                                          "a stand-in", run))
    return "format-probe"


def test_table_format_prints_the_table_and_writes_the_json(
        tiny_section: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "m.bin").write_bytes(b"\0" * 2_000_000)
    out = tmp_path / "report.json"
    assert main(["bench", "--section", tiny_section, "--format", "table", "--output", str(out),
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:2] == ["section", "wall"]
    assert printed[1].split()[0] == tiny_section and "ratios.fast_vs_slow 2.50" in printed[1]
    assert printed[2].startswith(f"generated benchmark models are kept in {tmp_path / 'cache'} "
                                 "(0.00 GB")
    assert json.loads(out.read_text())["sections"][tiny_section]["ratios"] == {
        "fast_vs_slow": 2.5}


def test_json_format_keeps_stdout_the_document(
        tiny_section: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--section", tiny_section, "--cache-dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert tiny_section in json.loads(captured.out)["sections"]
    assert f"{tiny_section}" in captured.err and "ratios.fast_vs_slow 2.50" in captured.err
