"""``colibri version``: print the installed version."""

from __future__ import annotations

import argparse

from colibri import __version__


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("version", help="print the colibri version")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print(f"colibri {__version__}")
    return 0
