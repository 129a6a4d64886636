"""``colibri bench --section server-stream``: the same engine measured alone and through
``colibri serve``, side by side (no timing is asserted)."""

from __future__ import annotations

import os
import sys

from support.server_harness import FAKE_ENGINE

from colibri.benchmarks import load_sections
from colibri.benchmarks.server_stream import measure


def test_bench_section_reports_both_sides() -> None:
    report = measure([sys.executable, FAKE_ENGINE], dict(os.environ), tokens=8, rounds=1,
                     warmup=0)
    assert report["engine_alone"]["completion_tokens"] == 2
    assert report["through_server"]["completion_tokens"] == 2
    assert set(report) >= {"ratio_decode", "ratio_end_to_end", "meets_target"}
    assert "server-stream" in load_sections()
