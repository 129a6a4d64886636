"""The ``colibri`` command line: one sub-command per module in ``colibri.commands``.

Each command module exposes ``register(subparsers)``; it adds its parser and sets
``handler`` to a function ``(argparse.Namespace) -> int``. Handlers import heavy modules
lazily so that ``colibri --help`` and ``colibri version`` stay instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from colibri import __version__, control_plane

#: Sub-command modules, in the order ``--help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "colibri.commands.version",
    "colibri.commands.doctor",
    "colibri.commands.generate",
    "colibri.commands.convert",
    "colibri.commands.bench",
    "colibri.commands.serve",
    "colibri.commands.web",
    "colibri.commands.engine",
    "colibri.commands.chat",
    "colibri.commands.conformance",
    "colibri.commands.golden",
    "colibri.commands.atlas",
    "colibri.commands.plan",
)


def _module_of(name: str) -> str | None:
    module = f"colibri.commands.{name}"
    return module if module in COMMAND_MODULES else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or, given the name of a known sub-command, a parser holding only
    that one: it parses that command's arguments exactly as the whole parser does, and
    spares each ``colibri engine`` process (the test suite starts hundreds) importing every
    other command module."""
    parser = argparse.ArgumentParser(
        prog="colibri",
        description=(
            "Reference implementation and conformance suite for colibri, "
            "the GLM-5-class mixture-of-experts inference system."
        ),
    )
    parser.add_argument("--version", action="version", version=f"colibri {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    only = None if command is None else _module_of(command)
    for module_name in COMMAND_MODULES if only is None else (only,):
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Before any command module imports the control plane: --accelerated processes run the
    # mypyc-compiled colibri.engine / colibri.text (colibri.control_plane says how).
    try:
        control_plane.select(sys.argv[1:] if argv is None else argv)
    except control_plane.ControlPlaneError as exc:
        print(f"colibri: {exc}", file=sys.stderr)
        return 2
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(words[0] if words and not words[0].startswith("-") else None)
    args = parser.parse_args(words)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        result: int = handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # A closed stdout (e.g. `colibri ... | head`) is not an error worth a traceback.
        sys.stderr.close()
        return 141
    return result
