"""``--backend {reference,accelerated}`` and its shorthand ``--accelerated``, shared by the
commands that run an engine (engine, serve, generate, chat)."""

from __future__ import annotations

import argparse
import sys

from colibri.engine.registry import BACKENDS, DEFAULT_BACKEND


def add_backend_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default=None,
        help=f"which backend computes the model (default: {DEFAULT_BACKEND})",
    )
    parser.add_argument(
        "--accelerated",
        action="store_true",
        help="shorthand for --backend accelerated",
    )


def backend_name(args: argparse.Namespace) -> str:
    if args.accelerated:
        return "accelerated"
    chosen: str = args.backend or DEFAULT_BACKEND
    return chosen


def available_backend(args: argparse.Namespace, prefix: str) -> str | None:
    """The chosen backend's name, or None after saying on stderr why this build lacks it."""
    from colibri.engine.registry import BackendUnavailable, check_available

    name = backend_name(args)
    try:
        check_available(name)
    except BackendUnavailable as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return None
    return name
