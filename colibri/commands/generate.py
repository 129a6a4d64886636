"""``colibri generate``: continue a prompt with the reference (or ``--accelerated``) engine.

``--ids`` prints the generated token ids (and their text when the model ships a tokenizer).
``--prompt`` renders the text as a chat turn (GLM-5 layout, thinking off) by default, and
prints only the generated text. Greedy unless ``--temperature`` > 0; sampling uses colibri's
RNG and sampler (colibri.engine.sampling), so ``--seed`` makes a run reproducible.
"""

from __future__ import annotations

import argparse
import codecs
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from colibri.commands.backend_choice import add_backend_arguments, available_backend
from colibri.text import chat_format

if TYPE_CHECKING:
    from colibri.text import Tokenizer

#: How --prompt text becomes the model's input (GLM-5; see spec/model.md "Tokenizer").
TEMPLATES = {
    # One user turn with thinking off, as colibri's legacy chat loop sends it.
    "chat": chat_format.chat_prompt("{text}"),
    # colibri's PROMPT mode: the text after the [gMASK]<sop> prefix.
    "prefix": chat_format.PREFIX + "{text}",
    # The text exactly as given (colibri's CHAT_TEMPLATE=0).
    "none": "{text}",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate with the reference or --accelerated engine "
        "(text from --prompt, ids from --ids)",
    )
    parser.add_argument("--model", type=Path, default=None,
                        help="model directory (default: the embedded default model)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ids", help='prompt token ids, e.g. "3 14 159" (spaces or commas)')
    source.add_argument("--prompt", help="prompt text (needs a model with tokenizer.json)")
    parser.add_argument("--template", choices=sorted(TEMPLATES), default="chat",
                        help="how --prompt is wrapped: chat (a user turn, default), "
                             "prefix ([gMASK]<sop> + text), none (as given)")
    parser.add_argument("--max-tokens", type=int, default=20, help="tokens to generate (20)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 (default) is greedy; > 0 samples")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1.0 = off)")
    parser.add_argument("--seed", type=int, default=None,
                        help="sampling seed (colibri's SEED formula); default: the fixed "
                             "unseeded state")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="keep going past end-of-sequence ids")
    add_backend_arguments(parser)
    parser.set_defaults(handler=run)


def _parse_ids(text: str) -> list[int]:
    parts = text.replace(",", " ").split()
    if not parts:
        raise ValueError("--ids is empty")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--ids must be integers, got {text!r}") from None


def _check_sampling(args: argparse.Namespace) -> str | None:
    if args.max_tokens < 0:
        return "--max-tokens must be >= 0"
    if not math.isfinite(args.temperature):
        return "--temperature must be a finite number"
    if not (math.isfinite(args.top_p) and 0.0 < args.top_p <= 1.0):
        return "--top-p must be in (0, 1]"
    return None


def run(args: argparse.Namespace) -> int:
    from colibri.engine.generate import IncrementalModel, sampled_tokens
    from colibri.engine.rng import Rng
    from colibri.reference import CheckpointError, load_model
    from colibri.resources import default_model_dir
    from colibri.text import Tokenizer

    backend = available_backend(args, "error")
    if backend is None:
        return 2
    if backend == "accelerated":
        from colibri.control_plane import describe

        # As `colibri engine` does: which control plane runs goes to stderr, never stdout.
        print(describe(), file=sys.stderr)
    model_dir: Path = args.model or default_model_dir()
    problem = _check_sampling(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        model: IncrementalModel
        if backend == "accelerated":
            from colibri.accelerated import load_model as load_accelerated
            from colibri.accelerated.native import LibraryNotBuilt

            try:
                model = load_accelerated(model_dir)
            except LibraryNotBuilt as exc:
                print(f"error: --accelerated is not available in this build: {exc}",
                      file=sys.stderr)
                return 2
        else:
            model = load_model(model_dir)
        has_tokenizer = (model_dir / "tokenizer.json").is_file()
        tokenizer = Tokenizer.from_file(model_dir) if has_tokenizer else None
        stops: set[int] = set() if args.ignore_eos else set(model.config.eos_token_ids)
        if args.prompt is not None:
            if tokenizer is None:
                print(f"error: --prompt needs a tokenizer; {model_dir} has none (use --ids)",
                      file=sys.stderr)
                return 2
            prompt = tokenizer.encode(TEMPLATES[args.template].replace("{text}", args.prompt))
            if not args.ignore_eos:
                # Standalone colibri also stops at every special control token.
                stops |= tokenizer.special_ids
        else:
            prompt = _parse_ids(args.ids)
        rng = Rng() if args.seed is None else Rng.from_seed(args.seed)
        tokens = sampled_tokens(model, prompt, args.max_tokens, tuple(sorted(stops)),
                                temperature=args.temperature, top_p=args.top_p, rng=rng)
        if args.prompt is not None:
            assert tokenizer is not None
            _stream_text(tokens, tokenizer, stops)
            return 0
        generated = list(tokens)
    except (CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(" ".join(str(t) for t in generated))
    if tokenizer is not None:
        print(tokenizer.decode(generated))
    return 0


def _stream_text(tokens: Iterable[int], tokenizer: Tokenizer, stops: set[int]) -> None:
    """Print the text as tokens arrive; a character cut across tokens waits for its end."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for token in tokens:
        if token in stops:
            break
        sys.stdout.write(decoder.decode(tokenizer.token_bytes(token)))
        sys.stdout.flush()
    sys.stdout.write(decoder.decode(b"", final=True) + "\n")
    sys.stdout.flush()
