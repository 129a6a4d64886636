"""``colibri engine``: an engine process speaking colibri's wire protocol on stdin/stdout.

Options override colibri's environment variables (SNAP, SERVE/SERVE_BATCH, KV_SLOTS, CTX,
SEED, SERVE_TOPK, KVSAVE, COLI_STATE_DIR, COLI_PERSIST, ...; spec/protocol.md 2.9), so
harnesses written for the C engine drive this one unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from colibri.commands.backend_choice import add_backend_arguments, available_backend
from colibri.commands.gpu_options import add_gpu_arguments, apply_gpu_arguments, gpu_error


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "engine",
        help="run an engine on stdin/stdout (mux protocol; --legacy for colibri chat's)",
        description=__doc__,
    )
    parser.add_argument(
        "--model", type=Path, help="model directory (default: SNAP or the embedded default model)"
    )
    parser.add_argument("--kv-slots", type=int, help="KV slots, 1..16 (KV_SLOTS)")
    parser.add_argument("--ctx", type=int, help="context length in tokens (CTX)")
    parser.add_argument("--ram-gb", type=float, default=None, metavar="GB",
                        help="bound everything the engine holds (dense weights, KV, expert "
                        "cache) to GB; experts that do not fit are read from disk (RAM_GB; "
                        "default: unbounded)")
    parser.add_argument(
        "--legacy",
        action="store_true",
        default=None,
        help="speak the legacy protocol (as SERVE=1 without SERVE_BATCH=1)",
    )
    add_backend_arguments(parser)
    parser.add_argument("--device", help="the backend's device (e.g. cpu, cuda)")
    add_gpu_arguments(parser)
    add_cluster_arguments(parser)
    parser.set_defaults(handler=run)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cluster``, ``--cluster-workers`` and ``--cluster-placement`` (engine and serve:
    serve hands them to the engine it starts through COLI_CLUSTER, COLI_CLUSTER_WORKERS and
    COLI_CLUSTER_PLACEMENT)."""
    parser.add_argument(
        "--cluster", metavar="ray[:ADDRESS]", default=None,
        help="compute the routed experts on expert workers, Ray actors: `ray` starts a local "
        "Ray, `ray:ADDRESS` joins a running cluster (`ray:auto`: the one on this machine); "
        "needs the `cluster` extra (COLI_CLUSTER)")
    parser.add_argument(
        "--cluster-workers", type=int, default=None, metavar="N",
        help="expert workers to start (default: one per node of the cluster; "
        "COLI_CLUSTER_WORKERS)")
    parser.add_argument(
        "--cluster-placement", metavar="FILE", default=None,
        help="place the routed experts as FILE says, one worker per node of it (written by "
        "`colibri plan --nodes N --node-ram GB --placement-out FILE`; default: striped; "
        "COLI_CLUSTER_PLACEMENT)")


def run(args: argparse.Namespace) -> int:
    from colibri import resources
    from colibri.control_plane import describe
    from colibri.engine.main import main_from_environment
    from colibri.engine.settings import SettingsError, from_environment

    # Which control plane runs (interpreted .py or mypyc-compiled) goes to stderr, never stdout.
    print(describe(), file=sys.stderr)
    backend = available_backend(args, "colibri engine")
    if backend is None:
        return 2
    problem = gpu_error(args.gpu, args.vram_gb)
    if problem is not None:
        print(f"colibri engine: {problem}", file=sys.stderr)
        return 2
    # Into this process's environment: the backend's device probe reads COLI_CUDA/COLI_GPUS.
    apply_gpu_arguments(args.gpu, args.vram_gb, os.environ)
    if args.ram_gb is not None:
        if args.ram_gb < 0:
            print(f"colibri engine: --ram-gb must be >= 0, got {args.ram_gb}", file=sys.stderr)
            return 2
        os.environ["RAM_GB"] = repr(args.ram_gb)
    try:
        settings = from_environment(
            os.environ,
            model_dir=args.model,
            kv_slots=args.kv_slots,
            ctx=args.ctx,
            legacy=args.legacy,
            default_model=resources.default_model_dir(),
            backend=backend,
            device=args.device,
            cluster=args.cluster,
            cluster_workers=args.cluster_workers,
            cluster_placement=args.cluster_placement,
        )
    except SettingsError as exc:
        print(f"colibri engine: {exc}", file=sys.stderr)
        return 2
    return main_from_environment(settings)
