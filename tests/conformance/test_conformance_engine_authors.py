"""What an engine author meets when a run goes wrong: reasons inline, defaults in --help, and
an engine that answers no request found once, not once per case after its timeout."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from colibri.conformance.engine import EngineUnresponsive
from colibri.conformance.outcome import FAIL, PASS, Result
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.session import REASON_CHARS, progress_line

from colibri.cli import main
from colibri.resources import fixture_model_dir

SUPPORT = Path(__file__).parents[1] / "support" / "conformance_support"
DEAF = f"{shlex.quote(sys.executable)} {shlex.quote(str(SUPPORT / 'deaf_engine.py'))}"


def result(status: str, message: str = "") -> Result:
    return Result("protocol.frames.done-format", "protocol", "frames", "must", "", status,
                  message)


def test_a_failing_case_line_names_its_reason_inline() -> None:
    assert progress_line(result(PASS)) == "PASS  protocol.frames.done-format"
    line = progress_line(result(FAIL, "expect[0] frame: 'DONE 1' does not match\nmore"))
    assert line == ("FAIL  protocol.frames.done-format  -- expect[0] frame: 'DONE 1' does not "
                    "match")
    long = progress_line(result(FAIL, "x" * 1000))
    assert long.endswith("…") and len(long.split("  -- ")[1]) == REASON_CHARS


def test_help_shows_every_default_timeouts_included(capsys: pytest.CaptureFixture[str]) -> None:
    for suite in ("protocol", "http"):
        with pytest.raises(SystemExit):
            main(["conformance", suite, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "(default: 30.0)" in text and "(default: 2)" in text  # --timeout, --reruns
    with pytest.raises(SystemExit):
        main(["conformance", "protocol", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--startup-timeout SECONDS" in text and "else 120" in text


def test_an_engine_that_answers_no_request_ends_the_run_once() -> None:
    # Raised while the runner is readied: no case ever starts against such an engine.
    with pytest.raises(EngineUnresponsive, match="sent no frame for a one-token SUBMIT within "
                                                 "2s.*no case was run"):
        protocol_runner(DEAF, fixture_model_dir("glm5-tiny"), timeout=2.0)


def test_the_cli_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["conformance", "protocol", "--engine-cmd", DEAF, "--model",
                 str(fixture_model_dir("glm5-tiny")), "--timeout", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "it is not serving requests" in err[0]
