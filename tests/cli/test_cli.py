"""The CLI surface: help, version, unknown commands."""

from __future__ import annotations

import subprocess
import sys

import pytest

from colibri import __version__
from colibri.cli import main


def test_version_command_prints_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"colibri {__version__}"
    assert __version__ != "0.0.0+unknown", "the package must be installed"


def test_help_lists_every_registered_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("version", "doctor"):
        assert command in out


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: colibri" in capsys.readouterr().out


def test_unknown_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_console_script_and_module_entry_agree() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "colibri", "version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"colibri {__version__}"
