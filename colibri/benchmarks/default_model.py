"""Bench section ``default-model``: what the embedded default model has learned, on questions it
was never trained on.

The items are held out by construction (``fixtures/chat_small_data.py``): the committed
model's training stream is replayed stage by stage (``TRAINING_RUN``, checked against the
token counts ``training.json`` recorded), every question in it is excluded under one
normalisation (``question_key``: operands in the order asked, phrasing, thinking mode and
option order dropped), and the rest of the question space is split by a hash of the question
into a test split, scored here, and a validation split for training decisions, which this
section only checks for overlap. How many draws each exclusion removed is reported per task.
The engine is colibri's own (the accelerated one when its C library is built, else the numpy
reference; the result says which), one thread.

* **exact match per task**: greedy decoding from the question as the server renders it until an
  end-of-turn id or a special token; the text after ``</think>`` must equal the expected
  answer. Tasks that can think ask every item twice, thinking on (effort unset: High) and off
  (the server's default), and report the two apart; System One and tool prompts always run
  with thinking off. Every rate comes with its Wilson 95 % interval.
* **System One accuracy** on the closed-set questions: each option scored by the sum of its
  tokens' logprobs after the prompt ``server/systemone.py`` renders (``normalize=sum``, what
  ``POST /v1/systemone`` does through the engine's ECHO channel), the best option chosen;
* **MTP acceptance**: at every greedy step of those answers, the MTP head's draft of the token
  after next against the token greedy decoding then picks (spec/model.md §9);
* **held-out loss per topic** (mean next-token negative log-likelihood, nats) beside a
  unigram baseline fitted on that topic's training examples (add-one smoothed).

``python -m colibri.benchmarks.default_model --json FILE`` runs the same measurement outside
``colibri bench`` (the model card's numbers come from it; the defaults are the card's sizes).
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

from colibri.benchmarks import BenchOptions, Section, first_contact, register
from colibri.benchmarks.rates import rate
from colibri.fixtures import chat_small_data as data
from colibri.resources import default_model_dir

#: Generation tasks scored by exact match (topics of the data mixture).
TASKS = ("add2", "add3", "sub2", "mul1", "units", "sort", "count", "classify", "tools", "chat",
         "add1", "mul1d", "sum_after_product", "product_after_sum", "classify_state",
         "classify_doc", "off_topic")
#: The card's headline tasks, scored on HEADLINE_EXAMPLES questions each: 2-digit addition and
#: the closed-set questions (``classify`` is also what System One is scored on).
HEADLINE = ("add2", "classify")
HEADLINE_EXAMPLES = 300
DEFAULT_EXAMPLES = 60
#: Validation items checked for overlap per task (never scored here).
VALIDATION_EXAMPLES = 100
#: Topics whose held-out loss is compared with the unigram baseline.
LOSS_TOPICS = tuple(data.MIXTURE)
LOSS_EXAMPLES = 20
MAX_NEW_TOKENS = 120
UNIGRAM_FIT_EXAMPLES = 400
@dataclass
class Tally:
    """Right and total counts per thinking mode."""

    right: Counter[str] = field(default_factory=Counter)
    total: Counter[str] = field(default_factory=Counter)

    def add(self, mode: str, ok: bool) -> None:
        self.total[mode] += 1
        self.right[mode] += int(ok)

    def by_mode(self) -> dict[str, Any]:
        return {m: rate(self.right[m], self.total[m]) for m in ("think", "no_think")
                if self.total[m]}


@dataclass
class TaskScore:
    """Exact-match counts of one task per thinking mode, and MTP draft counts."""

    tally: Tally = field(default_factory=Tally)
    #: 2-digit addition: the items whose commuted question (b + a) is not in training either.
    commuted_unseen: Tally = field(default_factory=Tally)
    commuted_in_training: int = 0
    drafts: int = 0
    accepted: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)


def commuted_key(example: data.Example) -> str | None:
    """The question key of b + a for the sum a + b (None for any other question)."""
    if example.topic != "add2":
        return None
    question, _, total = example.answer.partition(" = ")
    a, b = question.split(" + ")
    return f"arith:{b} + {a} = {total}"


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

    @staticmethod
    def answer_of(prompt: str, generated: str) -> str:
        if prompt.endswith("<think>"):  # thinking on: the answer follows </think>
            head, sep, tail = generated.partition("</think>")
            return tail.strip() if sep else ""
        return generated.strip()

    def task(self, held: data.HeldOut) -> dict[str, Any]:
        score = TaskScore()
        both = held.topic in data.THINKING_TOPICS
        train = data.training_keys()
        for example in held.examples:
            twin = commuted_key(example)
            if twin is not None and twin in train:
                score.commuted_in_training += 1
            for thinking in (True, False) if both else (False,):
                prompt = data.as_asked(example, thinking) if both else example.prompt
                mode = "think" if prompt.endswith("<think>") else "no_think"
                got = self.answer_of(prompt, self.greedy(prompt, score))
                ok = got == example.answer
                score.tally.add(mode, ok)
                if twin is not None and twin not in train:
                    score.commuted_unseen.add(mode, ok)
                if not ok:
                    score.failures.append({"prompt": prompt[-80:], "expected": example.answer,
                                           "got": got})
        report: dict[str, Any] = {
            "examples": len(held.examples),
            "asked": "thinking on and off" if both else "thinking off (its only prompt form)",
            "selection": held.counts(),
            "training_questions": len(data.trained_questions(held.topic)),
            "by_mode": score.tally.by_mode(),
            "mtp_acceptance": score.accepted / score.drafts if score.drafts else None,
            "mtp_drafts": score.drafts,
            "first_failures": score.failures[:3],
        }
        if held.topic == "add2":
            report["commuted_in_training"] = score.commuted_in_training
            report["commuted_unseen_by_mode"] = score.commuted_unseen.by_mode()
        return report

    def system_one(self, held: data.HeldOut) -> dict[str, Any]:
        """Closed-set accuracy scored as ``POST /v1/systemone`` scores (sum of logprobs)."""
        from colibri.server.systemone import Decision, render

        right = 0
        per_kind: Counter[str] = Counter()
        per_kind_right: Counter[str] = Counter()
        for example in held.examples:
            prompt = render(Decision(example.state, example.question, list(example.options), "sum"))
            assert prompt == example.prompt, "System One's rendering changed; retrain the data"
            prompt_ids = self.tokenizer.encode(prompt)
            scores = []
            for option in example.options:
                state = self.model.new_state()
                prompt_logits = self.model.prefill(state, prompt_ids)[-1]
                scores.append(self._option_score(state, prompt_logits, option))
            chosen = example.options[int(np.argmax(scores))]
            per_kind[example.kind] += 1
            if chosen == example.answer:
                right += 1
                per_kind_right[example.kind] += 1
        return {**rate(right, len(held.examples)),
                "asked": "thinking off (System One's prompt)",
                "selection": held.counts(),
                "by_question": {kind: {**rate(per_kind_right[kind], per_kind[kind]), **counts}
                                for kind, counts in sorted(held.by_kind.items())}}

    def _option_score(self, state: Any, prompt_logits: Any, option: str) -> float:
        ids = self.tokenizer.encode(option)
        rows = [prompt_logits]
        if len(ids) > 1:
            rows.extend(self.model.prefill(state, ids[:-1]))
        return sum(logprob(row, tok) for row, tok in zip(rows, ids, strict=True))

    def losses(self, n: int) -> dict[str, Any]:
        vocab = self.tokenizer.vocab_size
        fit: dict[str, list[data.Example]] = {topic: [] for topic in LOSS_TOPICS}
        for example in data.training_examples():
            bucket = fit.get(example.topic)
            if bucket is not None and len(bucket) < UNIGRAM_FIT_EXAMPLES:
                bucket.append(example)
        out: dict[str, Any] = {}
        for topic in LOSS_TOPICS:
            counts = np.ones(vocab)  # add-one smoothing
            for example in fit[topic]:
                for tok in self.tokenizer.encode(example.text)[1:]:
                    counts[tok] += 1
            unigram = np.log(counts / counts.sum())
            nll = base = 0.0
            tokens = 0
            held = data.heldout(topic, n)
            for example in held.examples:
                ids = self.tokenizer.encode(example.text)
                logits = self.model.prefill(self.model.new_state(), ids)
                for row, tok in zip(logits[:-1], ids[1:], strict=True):
                    nll -= logprob(row, tok)
                    base -= float(unigram[tok])
                tokens += len(ids) - 1
            out[topic] = {"loss": nll / tokens, "unigram": base / tokens,
                          "ratio": (nll / tokens) / (base / tokens), "tokens": tokens,
                          "examples": len(held.examples)} if tokens else {
                "loss": None, "unigram": None, "ratio": None, "tokens": 0, "examples": 0}
        return out


def logprob(row: Any, token: int) -> float:
    """log softmax(row)[token] in float64 with the maximum subtracted."""
    top = float(np.max(row))
    lse = top + math.log(float(np.sum(np.exp(np.asarray(row, np.float64) - top))))
    return float(row[token]) - lse


def size_of(topic: str, headline: int, examples: int) -> int:
    return headline if topic in HEADLINE else examples


def splits(headline: int, examples: int) -> tuple[dict[str, data.HeldOut], dict[str, Any]]:
    """The test sets of the tasks (the loss topics score a prefix of each topic's test set),
    and every topic's validation selection counts, after checking that no test or validation
    question is in training and none is in both."""
    sizes = {t: LOSS_EXAMPLES for t in LOSS_TOPICS} | {
        t: size_of(t, headline, examples) for t in TASKS}
    test = {t: data.heldout(t, n) for t, n in sizes.items()}
    validation = {t: data.heldout(t, VALIDATION_EXAMPLES, "validation") for t in sizes}
    for topic in sizes:
        data.check_disjoint(test[topic].examples, validation[topic].examples)
    return test, {t: v.counts() for t, v in validation.items()}


def training_stream() -> dict[str, Any]:
    return {
        "stages": [{"drawn": s.drawn, "shares": dict(s.shares), "extra": dict(s.extra)}
                   for s in data.TRAINING_RUN],
        "examples": sum(s.drawn for s in data.TRAINING_RUN),
        "questions_by_topic": {t: len(k) for t, k in data.training_questions().items()},
        "distinct_questions": len(data.training_keys()),
    }


METHOD = (
    f"Every example the committed model's {len(data.TRAINING_RUN)} training stages drew is "
    "replayed (`chat_small_data.TRAINING_RUN`; the trainer's batching over them reproduces "
    "the token counts `training.json` recorded at every logged step). An item is held out "
    "only if its `question_key` -- operands or values in the order asked, the user's words "
    "where they are the question, the System One document and question; phrasing template, "
    "thinking mode, effort and option order dropped -- never occurs in that stream. A hash of "
    "the key puts each unseen question in the test split (scored here) or the validation "
    "split (for training decisions; checked here for overlap, never scored), so the two "
    "cannot share a question. Intervals: Wilson 95 %."
)


def evaluate(model_dir: Path, examples: int = DEFAULT_EXAMPLES,
             headline: int = HEADLINE_EXAMPLES,
             first_questions: int = first_contact.ITEMS) -> dict[str, Any]:
    started, cpu_started = time.perf_counter(), time.process_time()
    test, validation = splits(headline, examples)
    ev = Evaluator(model_dir)
    tasks = {topic: ev.task(test[topic]) for topic in TASKS}
    drafts = sum(t["mtp_drafts"] for t in tasks.values())
    accepted = sum(round((t["mtp_acceptance"] or 0) * t["mtp_drafts"]) for t in tasks.values())
    return {
        "model": model_dir.name,
        "engine": ev.engine,
        "threads": 1,
        "method": METHOD,
        "headline_tasks": list(HEADLINE),
        "examples_per_task": {t: size_of(t, headline, examples) for t in TASKS},
        "test_seed": data.HELDOUT_SEED,
        "validation_seed": data.VALIDATION_SEED,
        "validation_share": data.VALIDATION_SHARE,
        "training_stream": training_stream(),
        "tasks": tasks,
        "system_one": ev.system_one(test["classify"]),
        # Yes/no about a short document: the state it gives a thing, and a stated value.
        "system_one_states": ev.system_one(test["classify_state"]),
        "system_one_values": ev.system_one(test["classify_doc"]),
        "first_contact": first_contact.measure(first_contact.sampled_reply(
            ev.model, ev.tokenizer, ev.stops, MAX_NEW_TOKENS), first_questions),
        "validation": validation,
        "mtp_acceptance": accepted / drafts if drafts else None,
        "mtp_drafts": drafts,
        "heldout_loss": ev.losses(LOSS_EXAMPLES),
        "eval_wall_s": time.perf_counter() - started,
        # Beside the wall time: on a shared machine the wall time is mostly others' load.
        "eval_cpu_s": time.process_time() - cpu_started,
    }


def run(options: BenchOptions) -> dict[str, Any]:
    model_dir = options.model or default_model_dir()
    if not (model_dir / "tokenizer.json").is_file():
        # The tasks are text: a model without a tokenizer (the other sections' bench models)
        # has nothing to answer with. Said in the report, never a silent pass.
        return {"skipped": f"{model_dir} has no tokenizer.json; this section evaluates a "
                           "chat model (default: the embedded one)"}
    return evaluate(model_dir, int(options.extra.get("examples", DEFAULT_EXAMPLES)),
                    int(options.extra.get("headline_examples", HEADLINE_EXAMPLES)))


register(Section(
    name="default-model",
    # Not an engine comparison: selected by name (or --engine default-model), so a speed run
    # with --engine reference does not also sit through minutes of held-out decoding.
    engines=("default-model",),
    description="the default model on questions outside its training stream: exact match "
                "(thinking on/off, 95% intervals), System One, MTP, loss vs unigram",
    run=run,
))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES,
                        help="held-out questions per task outside the headline tasks")
    parser.add_argument("--headline-examples", type=int, default=HEADLINE_EXAMPLES,
                        help="held-out questions per headline task (" + ", ".join(HEADLINE) + ")")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument("--first-questions", type=int, default=first_contact.ITEMS,
                        help="held-out items per kind of first question (first_contact)")
    args = parser.parse_args(argv)
    result = evaluate(args.model or default_model_dir(), args.examples, args.headline_examples,
                      args.first_questions)
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
