"""The CLI surface: help, version, unknown commands."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from colibri import __version__
from colibri.cli import COMMAND_MODULES, build_parser, main


def test_version_command_prints_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"colibri {__version__}"
    # The installed distribution's metadata comes from the same constant (pyproject's
    # dynamic version), so the two can never drift apart.
    from importlib.metadata import version

    assert version("colibri") == __version__


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


def _command_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_a_one_command_parser_parses_that_command_like_the_whole_one(module: str) -> None:
    # main() registers only the command it is given; its parser must be the same one
    # the whole CLI builds (same options, defaults, help), and hold nothing else.
    name = module.rsplit(".", 1)[1]
    alone = _command_parsers(build_parser(name))
    assert list(alone) == [name]
    assert alone[name].format_help() == _command_parsers(build_parser())[name].format_help()


def test_an_unknown_first_word_gets_the_whole_parser() -> None:
    assert len(_command_parsers(build_parser("frobnicate"))) == len(COMMAND_MODULES)
