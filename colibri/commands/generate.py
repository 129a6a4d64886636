"""``colibri generate``: greedy continuation of token ids (and text, with a tokenizer)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "generate", help="greedy generation with the reference engine (prints token ids)"
    )
    parser.add_argument("--model", type=Path, default=None,
                        help="model directory (default: the embedded default model)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ids", help='prompt token ids, e.g. "3 14 159" (spaces or commas)')
    source.add_argument("--prompt", help="prompt text (needs a model with tokenizer.json)")
    parser.add_argument("--max-tokens", type=int, default=20, help="tokens to generate (20)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="keep going past end-of-sequence ids")
    parser.set_defaults(handler=run)


def _tokenizer(model_dir: Path) -> Any | None:
    """The model's tokenizer when it ships one and colibri.reference provides a Tokenizer."""
    import colibri.reference as ref

    cls = getattr(ref, "Tokenizer", None)
    path = model_dir / "tokenizer.json"
    if cls is None or not path.is_file():
        return None
    return cls.from_file(path)


def _parse_ids(text: str) -> list[int]:
    parts = text.replace(",", " ").split()
    if not parts:
        raise ValueError("--ids is empty")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--ids must be integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from colibri.reference import CheckpointError, load_model
    from colibri.reference.generate import greedy_tokens
    from colibri.resources import default_model_dir

    model_dir: Path = args.model or default_model_dir()
    if args.max_tokens < 0:
        print("error: --max-tokens must be >= 0", file=sys.stderr)
        return 2
    try:
        model = load_model(model_dir)
        tokenizer = _tokenizer(model_dir)
        if args.prompt is not None:
            if tokenizer is None:
                print(f"error: --prompt needs a tokenizer; {model_dir} has none (use --ids)",
                      file=sys.stderr)
                return 2
            prompt = list(tokenizer.encode(args.prompt))
        else:
            prompt = _parse_ids(args.ids)
        stops = () if args.ignore_eos else model.config.eos_token_ids
        tokens = list(greedy_tokens(model, prompt, args.max_tokens, stops))
    except (CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(" ".join(str(t) for t in tokens))
    if tokenizer is not None:
        print(tokenizer.decode(tokens))
    return 0
