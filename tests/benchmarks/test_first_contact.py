"""The first-contact measurement counts what a newcomer would see: each kind of first question
scored on its own items, at each setting, with the reply compared exactly; a model that reads
`+` as `*` fails the sums and passes the products."""

from __future__ import annotations

import re

from colibri.benchmarks import first_contact
from colibri.engine.rng import Rng


def solve(prompt: str, op: str | None = None) -> str:
    """The right reply to the prompt's last question (``op`` forces the operation)."""
    question = prompt.rsplit("<|user|>", 1)[1]
    numbers = [int(n) for n in re.findall(r"\d+", question)]
    product = any(word in question for word in ("*", "times", " x ", "Multiply"))
    a, b = numbers[0], numbers[1]
    sign = op or ("*" if product else "+")
    return f"{a} {sign} {b} = {a + b if sign == '+' else a * b}."


def test_a_model_that_answers_right_scores_every_kind_fully() -> None:
    seen: list[tuple[bool, int]] = []

    def reply(prompt: str, setting: first_contact.Setting, rng: Rng) -> str:
        assert prompt.endswith("<think>") == setting.thinking
        seen.append((setting.thinking, rng.state))
        return solve(prompt)

    report = first_contact.measure(reply, n=8, samples=2)
    for name, setting in report["settings"].items():
        assert setting["all"]["rate"] == 1.0, name
        assert set(setting["kinds"]) == set(first_contact.KINDS)
    assert report["items"]["one-digit products"]["examples"] == 81
    assert not report["items"]["one-digit products"]["held_out"]
    assert report["items"]["one-digit sums"]["in_training"] == 0.0
    # Each ask of one setting draws from its own seed.
    states = [state for thinking, state in seen if not thinking]
    assert len(set(states)) == len(states)


def test_reading_plus_as_times_fails_the_sums_and_only_them() -> None:
    def reply(prompt: str, setting: first_contact.Setting, rng: Rng) -> str:
        return solve(prompt, "*")

    report = first_contact.measure(reply, n=8, samples=1)
    kinds = report["settings"]["server and colibri chat defaults"]["kinds"]
    assert kinds["one-digit products"]["rate"] == 1.0
    for kind in ("one-digit sums", "two-digit sums", "a sum after a product"):
        assert kinds[kind]["rate"] < first_contact.KIND_TARGET, kind
        assert kinds[kind]["first_misses"]
