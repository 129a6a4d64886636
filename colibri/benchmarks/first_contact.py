"""What a newcomer asks the default model first, measured at the settings they meet it with.

Four kinds of first question, each a set of items no training stage drew
(``fixtures/chat_small_data.py``: held out by construction), except where the whole question
space is trained:

* **one-digit sums** ("What is 2 + 3?"): the test split of ``add1``, whose questions are
  reserved before training (``chat_small_data.reserved``) so that some exist at all;
* **two-digit sums**: the test split of ``add2``;
* **one-digit products**: every product of 1..9 by 1..9. All were trained (``mul1`` draws
  every pair of 2..9 many times over), so this kind is reported as *trained*, over its whole
  space, never as held out;
* **a sum asked right after a product** in the same conversation: the test split of
  ``sum_after_product`` (the conversation never trained; its sum may have been asked alone).

Each item is asked ``SAMPLES`` times, with a different seed each time, at each of
``SETTINGS``: the server's defaults (which ``colibri chat`` shares: temperature 0.7, top-p 0.9,
thinking off) and the dashboard's (the same sampling with thinking on). Sampling is the
engine's own (``colibri.engine.sampling``: temperature, then nucleus, colibri's RNG), so a rate
here is what a user sees, not a greedy best case. The answer must equal the expected one
exactly ("2 + 3 = 5.").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from colibri.benchmarks.rates import rate
from colibri.engine.rng import Rng
from colibri.engine.sampling import sample
from colibri.fixtures import chat_small_data as data
from colibri.server.validation import DEFAULT_TEMPERATURE, DEFAULT_TOP_P


@dataclass(frozen=True)
class Setting:
    name: str
    thinking: bool
    temperature: float
    top_p: float


#: The server's defaults (an OpenAI request naming no sampling; ``colibri chat`` has the same),
#: and the dashboard's (web/src/pages/Chat.tsx: temperature 0.7, Reasoning checked).
SETTINGS = (
    Setting("server and colibri chat defaults", False, DEFAULT_TEMPERATURE, DEFAULT_TOP_P),
    Setting("dashboard defaults", True, DEFAULT_TEMPERATURE, DEFAULT_TOP_P),
)
#: Kind -> the topic its held-out items come from (None: the whole trained space, below).
KINDS: dict[str, str | None] = {
    "one-digit sums": "add1",
    "two-digit sums": "add2",
    "one-digit products": None,
    "a sum after a product": "sum_after_product",
}
#: Each kind's target share of right answers, and all kinds together (items pooled).
KIND_TARGET = 0.75
OVERALL_TARGET = 0.85
ITEMS = 60
SAMPLES = 3


def products() -> list[data.Example]:
    """Every one-digit product, in the training phrasings taken in turn (its key is ``mul1``'s)."""
    phrasings = data.MUL_QUESTIONS
    return [data.Example("mul1d", "", answer=f"{a} * {b} = {a * b}.", prompt=data.render(
        [{"role": "user", "content": phrasings[(a + b) % len(phrasings)].format(a=a, b=b)}],
        False)) for a in range(1, 10) for b in range(1, 10)]


def items(n: int = ITEMS) -> dict[str, list[data.Example]]:
    """Each kind's items: up to ``n`` held-out test items, or the whole space for products."""
    out: dict[str, list[data.Example]] = {}
    for kind, topic in KINDS.items():
        out[kind] = products() if topic is None else list(data.heldout(topic, n).examples)
    return out


def trained_share(examples: Iterable[data.Example]) -> float:
    """Share of the items whose question occurs in the replayed training stream."""
    listed = list(examples)
    train = data.training_keys()
    return sum(data.question_key(e) in train for e in listed) / len(listed) if listed else 0.0


Sampler = Callable[[str, Setting, Rng], str]


def measure(answer: Sampler, n: int = ITEMS, samples: int = SAMPLES) -> dict[str, Any]:
    """Right answers per setting and kind. ``answer(prompt, setting, rng)`` is the model's
    reply after ``</think>`` to the rendered prompt, sampled with ``rng``."""
    sets = items(n)
    report: dict[str, Any] = {
        "samples_per_item": samples, "kind_target": KIND_TARGET,
        "overall_target": OVERALL_TARGET,
        "items": {kind: {"examples": len(examples),
                         "in_training": trained_share(examples),
                         "held_out": KINDS[kind] is not None}
                  for kind, examples in sets.items()},
        "settings": {},
    }
    for setting in SETTINGS:
        per_kind: dict[str, Any] = {}
        right_all = total_all = 0
        for kind, examples in sets.items():
            right = total = 0
            misses: list[dict[str, str]] = []
            for example in examples:
                prompt = data.as_asked(example, setting.thinking)
                for _ in range(samples):
                    # A seed of its own for every ask of the setting.
                    got = answer(prompt, setting, Rng.from_seed(1 + total_all + total))
                    total += 1
                    if got == example.answer:
                        right += 1
                    elif len(misses) < 3:
                        misses.append({"prompt": prompt[-60:], "expected": example.answer,
                                       "got": got})
            per_kind[kind] = {**rate(right, total), "first_misses": misses}
            right_all += right
            total_all += total
        report["settings"][setting.name] = {
            "temperature": setting.temperature, "top_p": setting.top_p,
            "thinking": setting.thinking, "kinds": per_kind, "all": rate(right_all, total_all)}
    return report


def sampled_reply(model: Any, tokenizer: Any, stops: set[int], max_new: int) -> Sampler:
    """A ``Sampler`` over a loaded engine model (``new_state``/``prefill``/``decode``)."""
    def reply(prompt: str, setting: Setting, rng: Rng) -> str:
        state = model.new_state()
        logits = model.prefill(state, tokenizer.encode(prompt))[-1]
        out: list[int] = []
        token = sample(logits, setting.temperature, setting.top_p, rng)
        while token not in stops and len(out) < max_new:
            out.append(token)
            token = sample(model.decode(state, token), setting.temperature, setting.top_p, rng)
        text = str(tokenizer.decode(out))
        if prompt.endswith("<think>"):
            _, sep, tail = text.partition("</think>")
            return tail.strip() if sep else ""
        return text.strip()
    return reply
