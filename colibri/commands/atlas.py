"""``colibri atlas sweep|analyze|validate``: the expert atlas (seed expert_atlas/README.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from colibri import resources


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "atlas", help="expert atlas: sweep probes, analyze STATS dumps, validate them")
    sub = parser.add_subparsers(dest="atlas_command", metavar="STEP", required=True)

    sweep = sub.add_parser("sweep", help="run every probe through a fresh engine, keeping "
                           "one STATS dump per run in OUT/stats")
    sweep.add_argument("--model", type=Path, default=None,
                       help="model directory (default: the embedded default model)")
    sweep.add_argument("--engine-cmd", default=None,
                       help="engine command line instead of `colibri engine` (it must honour "
                       "STATS=<path>)")
    sweep.add_argument("--probes", type=Path, default=None,
                       help="probe set JSON (default: the seed's probes.json)")
    sweep.add_argument("--out", type=Path, default=Path("atlas_out"))
    sweep.add_argument("--max-tokens", type=int, default=32,
                       help="tokens generated per probe (prefill routes the prompt too)")
    sweep.add_argument("--timeout", type=float, default=600.0, help="seconds per probe")
    sweep.set_defaults(handler=run_sweep)

    analyze = sub.add_parser("analyze", help="per-expert topic distributions, replication "
                             "gate, specialisation")
    analyze.add_argument("--stats", type=Path, default=Path("atlas_out/stats"))
    analyze.add_argument("--min-count", type=int, default=30)
    analyze.add_argument("--min-runs", type=int, default=2)
    analyze.add_argument("--out", type=Path, default=Path("atlas_out/experts.json"))
    analyze.add_argument("--web", nargs="?", type=Path, const=resources.atlas_path(),
                         default=None,
                         help="also write the dashboard's experts.json (bare --web: "
                         f"{resources.atlas_path()}, which `colibri serve` serves)")
    analyze.set_defaults(handler=run_analyze)

    validate = sub.add_parser("validate", help="leave-one-prompt-out, against a "
                              "label-permutation null")
    validate.add_argument("stats", nargs="?", type=Path, default=Path("atlas_out/stats"))
    validate.add_argument("k", nargs="?", type=int, default=200,
                          help="specialists per category (default 200)")
    validate.add_argument("--permutations", type=int, default=0,
                          help="label-permutation null runs (0: none)")
    validate.add_argument("--seed", type=int, default=0)
    validate.add_argument("--min-count", type=int, default=30,
                          help="analyze's gates, for the specialist counts of the null")
    validate.add_argument("--min-runs", type=int, default=2)
    validate.add_argument("--json", type=Path, default=None, help="write the result as JSON")
    validate.set_defaults(handler=run_validate)


def _say(text: str) -> None:
    print(text, flush=True)


def run_sweep(args: argparse.Namespace) -> int:
    from colibri.atlas.probes import load_probes
    from colibri.atlas.stats import AtlasError
    from colibri.atlas.sweep import sweep
    from colibri.commands.progress import bar as bar_for

    if args.max_tokens < 1:
        print("colibri atlas sweep: --max-tokens must be at least 1", file=sys.stderr)
        return 2
    try:
        probes = load_probes(args.probes)
        total = sum(len(p) for p in probes.values())
        with bar_for(total, "atlas sweep", "probe") as bar:
            def advance(probe: object) -> None:
                bar.set_postfix_str(str(getattr(probe, "name", "")))
                bar.update(1)

            written = sweep(probes, args.out / "stats", model=args.model,
                            engine_cmd=args.engine_cmd, max_tokens=args.max_tokens,
                            timeout=args.timeout, progress=advance)
    except AtlasError as exc:
        print(f"colibri atlas sweep: {exc}", file=sys.stderr)
        return 1
    _say(f"wrote {len(written)} STATS dumps to {args.out / 'stats'}")
    return 0


def run_analyze(args: argparse.Namespace) -> int:
    from colibri.atlas.analyze import analyze, full_document, report, web_document
    from colibri.atlas.stats import AtlasError, load_runs

    try:
        result = analyze(load_runs(args.stats), args.min_count, args.min_runs)
    except AtlasError as exc:
        print(f"colibri atlas analyze: {exc}", file=sys.stderr)
        return 1
    report(result, _say)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(full_document(result), indent=1) + "\n")
    _say(f"wrote {args.out}")
    if args.web is not None:
        args.web.parent.mkdir(parents=True, exist_ok=True)
        web = web_document(result)
        args.web.write_text(json.dumps(web, separators=(",", ":")))
        _say(f"wrote {args.web} (dashboard format, {len(web['experts'])} experts)")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from colibri.atlas.stats import AtlasError, load_runs
    from colibri.atlas.validate import permutation_null, report, validate

    try:
        runs = load_runs(args.stats)
        result = validate(runs, args.k)
    except AtlasError as exc:
        print(f"colibri atlas validate: {exc}", file=sys.stderr)
        return 1
    report(result, _say)
    doc: dict[str, object] = {"categories": result.categories, "k": result.k,
                              "hits": result.hits, "trials": len(result.trials),
                              "accuracy": result.accuracy}
    if args.permutations > 0:
        from colibri.atlas.analyze import analyze

        observed = len(analyze(runs, args.min_count, args.min_runs).specialists)
        null = permutation_null(runs, args.k, args.permutations, args.seed, args.min_count,
                                args.min_runs)
        _say(f"label-permutation null ({null.permutations} shuffles, seed {args.seed}): "
             f"accuracy mean {100 * null.mean_accuracy:.1f}%, max "
             f"{100 * max(null.accuracies):.1f}%; p = {null.p_value(result.accuracy):.3f}")
        _say(f"strong specialists: observed {observed}, null max {max(null.specialists)}")
        doc["null"] = {"permutations": null.permutations, "seed": args.seed,
                       "accuracies": null.accuracies, "specialists": null.specialists,
                       "p_value": null.p_value(result.accuracy),
                       "observed_specialists": observed}
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0
