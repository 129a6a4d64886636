"""Bench section ``default-model``: what the embedded default model has learned, on held-out data.

Everything is measured on examples from ``fixtures/chat_small_data.py`` drawn with its
``HELDOUT_SEED`` (the training run used ``TRAIN_SEED``), with colibri's own engine (the
accelerated one when its C library is built, else the numpy reference; the result says which):

* **exact match per task**: greedy decoding from the example's prompt (the rendering a client's
  request gets) until an end-of-turn id or a special token; the text after ``</think>`` must
  equal the expected answer, and is counted apart for prompts with thinking on and off;
* **System One accuracy** on the closed-set questions: each option scored by the sum of its
  tokens' logprobs after the prompt ``server/systemone.py`` renders (``normalize=sum``, what
  ``POST /v1/systemone`` does through the engine's ECHO channel), the best option chosen;
* **MTP acceptance**: at every greedy step of those answers, the MTP head's draft of the token
  after next against the token greedy decoding then picks (spec/model.md §9);
* **held-out loss per topic** (mean next-token negative log-likelihood, nats) beside a
  unigram baseline fitted on the training distribution of that topic (add-one smoothed).

``python -m colibri.benchmarks.default_model --examples N --json FILE`` runs the same measurement
outside ``colibri bench`` (the model card's numbers come from it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from colibri.benchmarks import BenchOptions, Section, register
from colibri.fixtures import chat_small_data as data
from colibri.resources import default_model_dir

#: Generation tasks scored by exact match (topics of the data mixture).
TASKS = ("add2", "add3", "sub2", "mul1", "units", "sort", "count", "classify", "tools", "chat")
#: Topics whose held-out loss is compared with the unigram baseline.
LOSS_TOPICS = tuple(data.MIXTURE)
MAX_NEW_TOKENS = 120
DEFAULT_EXAMPLES = 40
UNIGRAM_FIT_EXAMPLES = 400


@dataclass
class TaskScore:
    """Exact-match counts of one task, split by thinking mode, and MTP draft counts."""

    right: dict[str, int] = field(default_factory=lambda: {"think": 0, "no_think": 0})
    total: dict[str, int] = field(default_factory=lambda: {"think": 0, "no_think": 0})
    drafts: int = 0
    accepted: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        right, total = sum(self.right.values()), sum(self.total.values())
        return {
            "exact_match": right / total if total else None,
            "examples": total,
            "by_mode": {m: {"exact_match": self.right[m] / self.total[m], "examples": self.total[m]}
                        for m in self.total if self.total[m]},
            "mtp_acceptance": self.accepted / self.drafts if self.drafts else None,
            "mtp_drafts": self.drafts,
            "first_failures": self.failures[:3],
        }


def open_model(model_dir: Path) -> tuple[Any, str]:
    """The accelerated engine when its library is built, else the reference (named)."""
    from colibri.accelerated.native import LibraryNotBuilt

    try:
        from colibri.accelerated import load_model as load_accelerated

        return load_accelerated(model_dir, threads=1), "accelerated"
    except LibraryNotBuilt:
        from colibri.reference import load_model as load_reference

        return load_reference(model_dir), "reference"


class Evaluator:
    def __init__(self, model_dir: Path) -> None:
        from colibri.reference import Tokenizer

        self.model, self.engine = open_model(model_dir)
        self.tokenizer = Tokenizer.from_file(model_dir)
        generation = json.loads((model_dir / "generation_config.json").read_text())
        eos = generation.get("eos_token_id", [])
        self.stops = set(eos if isinstance(eos, list) else [eos]) | set(self.tokenizer.special_ids)
        self.has_mtp = getattr(self.model, "mtp", None) is not None or getattr(
            self.model, "mtp_layer", None) is not None

    def greedy(self, prompt: str, score: TaskScore | None = None) -> str:
        """Greedy continuation of ``prompt`` (stop tokens excluded), counting MTP drafts."""
        state = self.model.new_state()
        logits = self.model.prefill(state, self.tokenizer.encode(prompt))[-1]
        out: list[int] = []
        token = int(np.argmax(logits))
        while token not in self.stops and len(out) < MAX_NEW_TOKENS:
            out.append(token)
            draft = int(np.argmax(self.model.mtp_draft(state, token))) if self.has_mtp else -1
            logits = self.model.decode(state, token)
            token = int(np.argmax(logits))
            if score is not None and self.has_mtp:
                score.drafts += 1
                score.accepted += int(draft == token)
        return str(self.tokenizer.decode(out))

    def answer_of(self, example: data.Example, generated: str) -> str:
        if example.prompt.endswith("<think>"):  # thinking on: the answer follows </think>
            head, sep, tail = generated.partition("</think>")
            return tail.strip() if sep else ""
        return generated.strip()

    def task(self, topic: str, n: int) -> dict[str, Any]:
        score = TaskScore()
        for example in data.heldout(topic, n):
            mode = "think" if example.prompt.endswith("<think>") else "no_think"
            got = self.answer_of(example, self.greedy(example.prompt, score))
            score.total[mode] += 1
            if got == example.answer:
                score.right[mode] += 1
            else:
                score.failures.append({"prompt": example.prompt[-80:], "expected": example.answer,
                                       "got": got})
        return score.report()

    def system_one(self, n: int) -> dict[str, Any]:
        """Closed-set accuracy scored as ``POST /v1/systemone`` scores (sum of logprobs)."""
        from colibri.server.systemone import Decision, render

        right = 0
        examples = data.heldout("classify", n, seed=data.HELDOUT_SEED + 1)
        per_kind: Counter[str] = Counter()
        per_kind_right: Counter[str] = Counter()
        for example in examples:
            prompt = render(Decision(example.state, example.question, list(example.options), "sum"))
            assert prompt == example.prompt, "System One's rendering changed; retrain the data"
            prompt_ids = self.tokenizer.encode(prompt)
            scores = []
            for option in example.options:
                state = self.model.new_state()
                prompt_logits = self.model.prefill(state, prompt_ids)[-1]
                scores.append(self._option_score(state, prompt_logits, option))
            chosen = example.options[int(np.argmax(scores))]
            kind = example.kind
            per_kind[kind] += 1
            if chosen == example.answer:
                right += 1
                per_kind_right[kind] += 1
        return {"accuracy": right / len(examples), "examples": len(examples),
                "by_question": {k: per_kind_right[k] / per_kind[k] for k in sorted(per_kind)}}

    def _option_score(self, state: Any, prompt_logits: Any, option: str) -> float:
        ids = self.tokenizer.encode(option)
        rows = [prompt_logits]
        if len(ids) > 1:
            rows.extend(self.model.prefill(state, ids[:-1]))
        return sum(logprob(row, tok) for row, tok in zip(rows, ids, strict=True))

    def losses(self, n: int) -> dict[str, Any]:
        vocab = self.tokenizer.vocab_size
        out: dict[str, Any] = {}
        for topic in LOSS_TOPICS:
            counts = np.ones(vocab)  # add-one smoothing
            for example in data.heldout(topic, UNIGRAM_FIT_EXAMPLES, seed=data.TRAIN_SEED):
                for tok in self.tokenizer.encode(example.text)[1:]:
                    counts[tok] += 1
            unigram = np.log(counts / counts.sum())
            nll = base = 0.0
            tokens = 0
            for example in data.heldout(topic, n):
                ids = self.tokenizer.encode(example.text)
                logits = self.model.prefill(self.model.new_state(), ids)
                for row, tok in zip(logits[:-1], ids[1:], strict=True):
                    nll -= logprob(row, tok)
                    base -= float(unigram[tok])
                tokens += len(ids) - 1
            out[topic] = {"loss": nll / tokens, "unigram": base / tokens,
                          "ratio": (nll / tokens) / (base / tokens), "tokens": tokens}
        return out


def logprob(row: Any, token: int) -> float:
    """log softmax(row)[token] in float64 with the maximum subtracted."""
    top = float(np.max(row))
    lse = top + math.log(float(np.sum(np.exp(np.asarray(row, np.float64) - top))))
    return float(row[token]) - lse


def evaluate(model_dir: Path, examples: int) -> dict[str, Any]:
    started = time.perf_counter()
    ev = Evaluator(model_dir)
    tasks = {topic: ev.task(topic, examples) for topic in TASKS}
    drafts = sum(t["mtp_drafts"] for t in tasks.values())
    accepted = sum(round((t["mtp_acceptance"] or 0) * t["mtp_drafts"]) for t in tasks.values())
    return {
        "model": model_dir.name,
        "engine": ev.engine,
        "examples_per_task": examples,
        "heldout_seed": data.HELDOUT_SEED,
        "tasks": tasks,
        "system_one": ev.system_one(2 * examples),
        "mtp_acceptance": accepted / drafts if drafts else None,
        "mtp_drafts": drafts,
        "heldout_loss": ev.losses(max(examples // 2, 10)),
        "eval_wall_s": time.perf_counter() - started,
    }


def run(options: BenchOptions) -> dict[str, Any]:
    model_dir = options.model or default_model_dir()
    if not (model_dir / "tokenizer.json").is_file():
        # The tasks are text: a model without a tokenizer (the other sections' bench models)
        # has nothing to answer with. Said in the report, never a silent pass.
        return {"skipped": f"{model_dir} has no tokenizer.json; this section evaluates a "
                           "chat model (default: the embedded one)"}
    return evaluate(model_dir, int(options.extra.get("examples", DEFAULT_EXAMPLES)))


register(Section(
    name="default-model",
    # Not an engine comparison: selected by name (or --engine default-model), so a speed run
    # with --engine reference does not also sit through minutes of held-out decoding.
    engines=("default-model",),
    description="the default model's held-out task scores, System One, MTP, loss vs unigram",
    run=run,
))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES,
                        help="held-out examples per task")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = evaluate(args.model or default_model_dir(), args.examples)
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
