"""``colibri plan``: RAM/VRAM budgets, bytes per expert per format, KV per token and per slot."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan", help="memory plan for the expert tiers and KV slots of a model on this machine",
        description="How a model fits this machine: the dense weights, KV slots and runtime "
        "the RAM budget must hold, how many routed experts stay warm in RAM or hot in VRAM and "
        "how many are read from disk, and the engine environment (RAM_GB, KV_SLOTS, CTX) that "
        "realises it. A config alone is enough (--config glm5: the real GLM-5 sizes); warnings "
        "say what does not fit. spec/plan.md defines every number.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--model", type=Path, default=None,
                       help="model directory or a config.json (default: the embedded model)")
    where.add_argument("--config", default=None, metavar="NAME",
                       help="a shipped config: glm5 (glm5-744b, the real GLM-5 sizes)")
    parser.add_argument("--ctx", type=int, default=None,
                        help="context length (default: min(4096, max_position_embeddings))")
    parser.add_argument("--kv-slots", type=int, default=None,
                        help="KV slots to budget (default: $COLI_KV_SLOTS or 1)")
    parser.add_argument("--ram", type=float, default=None, metavar="GB",
                        help="RAM budget in GB (default: 0.88 x MemAvailable)")
    parser.add_argument("--vram", type=float, default=None, metavar="GB",
                        help="expert-tier VRAM budget in GB (default: free - 2 GB per GPU)")
    parser.add_argument("--usage", type=Path, default=None,
                        help="a .coli_usage or STATS dump: suggest the pin set from it")
    parser.add_argument("--format", default="bf16", dest="expert_format",
                        help="expert format to size a plan from a config alone (int4-g64, "
                        "fp8-e4m3-b128, e8-iq3-lattice, ...); measured weights win")
    parser.add_argument("--read-gbps", type=float, default=None, metavar="GB/S",
                        help="measured storage read bandwidth: with --step-ms, predict decode "
                        "tok/s under the RAM budget")
    parser.add_argument("--step-ms", type=float, default=None, metavar="MS",
                        help="the engine's decode step with every expert in RAM (colibri bench)")
    parser.add_argument("--nodes", type=int, default=None, metavar="N",
                        help="place the routed experts on N cluster nodes by heat (--usage, "
                        "else uniform) and memory (--node-ram); refused when they do not fit")
    parser.add_argument("--node-ram", type=float, default=None, metavar="GB",
                        help="with --nodes: each node's RAM for its experts, in GB")
    parser.add_argument("--placement-out", type=Path, default=None, metavar="FILE",
                        help="with --nodes: write the placement file that `--cluster-placement "
                        "FILE` uses (spec/schemas/expert_placement.json)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run)


def model_path(args: argparse.Namespace) -> Path:
    from colibri import resources
    from colibri.plan import shipped_config

    if args.config:
        return shipped_config(args.config)
    return args.model if args.model is not None else resources.default_model_dir()


def placement_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the placement options, or None."""
    if args.nodes is None:
        if args.node_ram is not None or args.placement_out is not None:
            return "--node-ram and --placement-out go with --nodes N"
        return None
    if args.node_ram is None:
        return "--nodes needs --node-ram GB (each node's RAM for its experts)"
    return None


def run(args: argparse.Namespace) -> int:
    from colibri.plan import PlanError, Request, build, format_plan

    problem = placement_problem(args)
    if problem is not None:
        print(f"colibri plan: {problem}", file=sys.stderr)
        return 2
    try:
        slots = args.kv_slots if args.kv_slots is not None else int(
            os.environ.get("COLI_KV_SLOTS", "1"))
        plan = build(model_path(args), Request(args.ctx, slots, args.ram, args.vram,
                                               args.usage, args.expert_format,
                                               args.read_gbps, args.step_ms))
        placement = None
        if args.nodes is not None:
            from colibri.backend_kit.placement_file import write_placement
            from colibri.cluster_plan import plan_placement

            placement = plan_placement(model_path(args), args.nodes, args.node_ram,
                                       args.usage, args.expert_format)
            if args.placement_out is not None:
                write_placement(args.placement_out, placement)
    except (PlanError, ValueError, OSError) as exc:
        print(f"colibri plan: {exc}", file=sys.stderr)
        return 1
    if placement is not None:
        plan["placement"] = placement
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        for line in format_plan(plan):
            print(line)
        if placement is not None:
            from colibri.cluster_plan import format_placement

            for line in format_placement(placement):
                print(line)
            if args.placement_out is not None:
                print(f"wrote {args.placement_out}: use it with --cluster ray[:ADDRESS] "
                      f"--cluster-placement {args.placement_out}")
    return 0
