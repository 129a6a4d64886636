"""``colibri golden``: golden outputs for regression and for finding where an engine diverges.

- ``record`` / ``compare``: an engine's greedy outputs on a prompt set, and another engine or
  build against that recording under the sameness rules (spec/model.md §15), for CI.
- ``layers`` / ``diff``: a per-layer dump of the numpy reference (spec/model.md §16), and the
  first layer and quantity where a target's dump departs from a golden one.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

#: The reference engine, run by this very interpreter.
DEFAULT_ENGINE = f"{shlex.quote(sys.executable)} -m colibri engine"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "golden", help="record and compare golden outputs; find where an engine diverges"
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    rec = actions.add_parser("record", help="record an engine's outputs on a prompt set")
    _engine_options(rec)
    rec.add_argument("--prompts", type=Path, required=True,
                     help="JSON list of prompts: texts, {\"ids\": [...]} or {\"oracle\": KEY}")
    rec.add_argument("--out", type=Path, required=True, help="recording file to write")
    rec.add_argument("--max-tokens", type=int, default=16)
    rec.add_argument("--logprobs", type=int, default=4, help="top-k table size per token")
    rec.add_argument("--logit-scale", type=float,
                     help="largest |logit| of the model (default: from its oracle_logits.npy)")
    rec.set_defaults(handler=run_record)

    cmp = actions.add_parser("compare", help="compare an engine against a recording")
    _engine_options(cmp)
    cmp.add_argument("recording", type=Path)
    cmp.set_defaults(handler=run_compare)

    layers = actions.add_parser("layers", help="write the reference's per-layer dump (§16)")
    layers.add_argument("--model", type=Path, required=True)
    layers.add_argument("--ids", help="comma-separated token ids (default: oracle full_ids)")
    layers.add_argument("--out", type=Path, required=True, help=".npz file to write")
    layers.set_defaults(handler=run_layers)

    diff = actions.add_parser("diff", help="first layer and quantity where a dump departs")
    diff.add_argument("--golden", type=Path, help="golden dump file")
    diff.add_argument("--fixture", help="or the shipped golden of this fixture (e.g. glm5-tiny)")
    diff.add_argument("--target", type=Path, required=True, help="the target's .npz dump")
    diff.set_defaults(handler=run_diff)


def _engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-cmd", default=DEFAULT_ENGINE,
                        help="engine command line (default: the reference engine)")
    parser.add_argument("--model", type=Path, required=True, help="model directory (SNAP)")
    parser.add_argument("--prompt-form", choices=("auto", "text", "ids"), default="auto",
                        help="payload form: text, token ids (ids=1), or auto")


def _fail(message: str) -> int:
    print(f"colibri golden: {message}", file=sys.stderr)
    return 2


def run_record(args: argparse.Namespace) -> int:
    from colibri.conformance.engine import EngineError
    from colibri.conformance.golden_record import record
    from colibri.conformance.prompts import PromptError
    from colibri.conformance.sameness import Tolerance, reduction_length

    try:
        prompts: Any = json.loads(args.prompts.read_text(encoding="utf-8"))
        config = json.loads((args.model / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return _fail(str(exc))
    if not isinstance(prompts, list) or not prompts:
        return _fail(f"{args.prompts}: expected a non-empty JSON list of prompts")
    positions = 4096  # a prompt plus its answer, in tokens: bounds the attention reduction
    if args.logit_scale is not None:
        tolerance = Tolerance(reduction_length(config, positions), args.logit_scale)
    else:
        try:
            tolerance = Tolerance.for_model_dir(args.model, positions)
        except FileNotFoundError as exc:
            return _fail(f"{exc}; give --logit-scale for a model without an oracle")
    try:
        recording = record(args.engine_cmd, args.model, prompts, args.max_tokens,
                           args.logprobs, tolerance, args.prompt_form)
    except (EngineError, PromptError) as exc:
        return _fail(str(exc))
    recording.save(args.out)
    print(f"recorded {len(prompts)} prompt(s) to {args.out}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from colibri.conformance.golden_record import Recording, RecordingError, compare_engine

    try:
        recording = Recording.load(args.recording)
    except (OSError, RecordingError) as exc:
        return _fail(str(exc))
    result = compare_engine(recording, args.engine_cmd, args.model, args.prompt_form)
    print(result.report())
    for quantity, ratio in sorted(result.worst.items()):
        print(f"  largest {quantity} difference: {ratio:.3f} of the tolerance")
    return 0 if result.ok else 1


def run_layers(args: argparse.Namespace) -> int:
    from colibri.conformance.sameness import reduction_length
    from colibri.reference import load_model
    from colibri.reference.layer_trace import save, trace

    try:
        config = json.loads((args.model / "config.json").read_text(encoding="utf-8"))
        if args.ids:
            ids = [int(t) for t in args.ids.split(",")]
        else:
            oracle = json.loads((args.model / "oracle.json").read_text(encoding="utf-8"))
            ids = [int(t) for t in oracle["full_ids"]]
        dump = trace(load_model(args.model), ids)
    except (OSError, ValueError, KeyError) as exc:
        return _fail(str(exc))
    save(args.out, dump, reduction_length(config, len(ids)))
    print(f"wrote {len(dump) - 1} quantities for {len(ids)} tokens to {args.out}")
    return 0


def run_diff(args: argparse.Namespace) -> int:
    from colibri.conformance.layer_diff import DumpError, diff, load
    from colibri.resources import fixtures_dir

    golden_path = args.golden
    if args.fixture is not None:
        golden_path = fixtures_dir() / "layers" / f"{args.fixture}.npz"
    if golden_path is None:
        return _fail("give --golden FILE or --fixture NAME")
    try:
        result = diff(load(golden_path), load(args.target))
    except DumpError as exc:
        return _fail(str(exc))
    print(result.report())
    return 0 if result.first is None else 1
