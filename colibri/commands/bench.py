"""``colibri bench``: run benchmark sections and print one JSON document, engines side by side.

Sections live in ``colibri.benchmarks`` (a registry other parts of colibri extend); pick them
with ``--section NAME`` or ``--engine ENGINE`` (repeatable), or run them all.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmark engines side by side (prints one JSON document)"
    )
    parser.add_argument("--engine", action="append", default=[],
                        help="run the sections that measure this engine (repeatable)")
    parser.add_argument("--section", action="append", default=[],
                        help="run this section (repeatable; see --list)")
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    parser.add_argument("--model", type=Path, default=None,
                        help="model directory (default: each section's generated model)")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path.home() / ".cache" / "colibri" / "bench",
                        help="where generated benchmark models are kept (about 1 GB once "
                             "the generated-model sections have run; the run's last line "
                             "says how much is there)")
    parser.add_argument("--tokens", type=int, default=16, help="decode steps to time (16)")
    parser.add_argument("--batch", type=int, default=4, help="sequences in a batched step (4)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed decode steps first (4)")
    parser.add_argument("--no-peers", action="store_true",
                        help="skip peer engines such as HF transformers")
    parser.add_argument("--keep-page-cache", action="store_true",
                        help="time the models in whatever page-cache state they are in, "
                             "instead of reading them back from disk first")
    parser.add_argument("--peer-python", default=None,
                        help="interpreter with torch + transformers for the HF peer "
                             "(default: $COLIBRI_PEER_PYTHON or this one)")
    parser.add_argument("--output", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--format", choices=("json", "table"), default="json",
                        help="json (default): the JSON document on stdout, then a short table "
                             "on stderr; table: only the table, on stdout (--output still "
                             "writes the JSON)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from colibri import __version__, host_topology
    from colibri.benchmarks import BenchOptions, load_sections, select
    from colibri.commands.progress import bar

    if args.list:
        for section in load_sections().values():
            print(f"{section.name:24} engines: {', '.join(section.engines):20} "
                  f"{section.description}")
        return 0
    if args.tokens < 1 or args.batch < 1 or args.warmup < 0:
        print("error: --tokens and --batch must be >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    try:
        sections = select(args.section, args.engine)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = BenchOptions(model=args.model, cache_dir=args.cache_dir, tokens=args.tokens,
                           warmup=args.warmup, batch=args.batch, peers=not args.no_peers,
                           refresh_page_cache=not args.keep_page_cache,
                           extra={"peer_python": args.peer_python} if args.peer_python else {})
    report: dict[str, Any] = {
        "colibri_version": __version__,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine(),
                    # What GB/s figures depend on: which usable CPUs share a core, caches.
                    "host": host_topology.describe()},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sections": {},
    }
    refused: list[str] = []
    # The bar is on stderr: stdout carries only the JSON document.
    with bar(len(sections), "bench", "section") as progress:
        for section in sections:
            progress.set_postfix_str(section.name)
            t0 = time.perf_counter()
            result = section.run(options)
            result["section_wall_s"] = time.perf_counter() - t0
            report["sections"][section.name] = result
            if "refused" in result:
                refused.append(section.name)
                print(f"bench: section {section.name} refused: {result['refused']}",
                      file=sys.stderr)
            progress.update(1)
    text = json.dumps(report, indent=2)
    if args.format == "json":
        print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    # With the JSON on stdout a reader's summary of it goes to stderr; --format table makes
    # the summary the output.
    table = sys.stdout if args.format == "table" else sys.stderr
    for line in summary_lines(report["sections"], args.cache_dir):
        print(line, file=table)
    # A section asked for by name that cannot run here (cuda-decode without a GPU) fails the
    # command; in a run of every section it is only reported.
    return 1 if set(refused) & set(args.section) else 0


#: How many of a section's ratios its summary line shows (the JSON has them all).
SUMMARY_RATIOS = 4


def _ratios(value: Any, path: str = "") -> list[tuple[str, float]]:
    """Every number in a section's result whose key, or a key above it, names a ratio, with
    its dotted path."""
    out: list[tuple[str, float]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(item, (int, float)) and not isinstance(item, bool) and any(
                    word in where for word in ("ratio", "speedup")):
                out.append((where, float(item)))
            else:
                out.extend(_ratios(item, where))
    return out


def summary_lines(sections: dict[str, Any], cache_dir: Path) -> list[str]:
    """A short table of the run (each section's wall time and first ratios) and where the
    generated benchmark models are kept, with their size on disk."""
    lines = [f"{'section':26} {'wall s':>7}  ratios (all in the JSON)"]
    for name, result in sections.items():
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in _ratios(result)[:SUMMARY_RATIOS])
        state = "refused" if "refused" in result else ratios or "-"
        lines.append(f"{name:26} {result.get('section_wall_s', 0.0):7.1f}  {state}")
    if cache_dir.is_dir():
        size = sum(f.stat().st_size for f in cache_dir.rglob("*") if f.is_file())
        lines.append(f"generated benchmark models are kept in {cache_dir} ({size / 1e9:.2f} GB; "
                     "--cache-dir moves them, deleting the folder frees the space)")
    return lines

