"""The default model's training and held-out data speaks exactly the server's prompt layout.

glm5-chat-small only answers well on the prompts it was trained on, so the synthetic data
(fixtures/chat_small_data.py) must render each example as the server renders the same request:
the chat turns (server/template.py), the System One question (server/systemone.py) and the
tool declarations. The ``default-model`` bench section relies on the same examples.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from colibri.fixtures import chat_small_data as data
from colibri.server.systemone import Decision, render
from colibri.server.template import render_chat
from colibri.server.validation import ToolSpec

from colibri.benchmarks import load_sections

CHAT_TASKS = ["add2", "add3", "sub2", "mul1", "units", "sort", "count", "chat"]


def sorted_values(fn: dict[str, Any]) -> dict[str, Any]:
    """The function's own keys in their order, every value's keys sorted (the training layout)."""
    return {k: json.loads(json.dumps(v, sort_keys=True)) for k, v in fn.items()}


@pytest.mark.parametrize("topic", CHAT_TASKS)
def test_chat_examples_are_the_servers_rendering(topic: str) -> None:
    for example in data.heldout(topic, 30):
        thinking = example.prompt.endswith("<think>")
        effort = None
        if thinking:
            word = example.prompt.split("Reasoning Effort: ")[1].split("<|user|>")[0]
            effort = {"Low": "low", "Medium": "medium", "High": "high", "Max": "xhigh"}[word]
        user = example.prompt.split("<|user|>")[1].split("<|assistant|>")[0]
        rendered = render_chat([{"role": "user", "content": user}], thinking=thinking,
                               effort=effort, tools=None, continued=False)
        assert rendered.prompt == example.prompt
        if thinking:
            assert example.text == (example.prompt + example.thought + "</think>"
                                    + example.answer + data.END_TURN)
        else:
            assert example.text == example.prompt + example.answer + data.END_TURN


def test_closed_set_examples_are_system_ones_rendering() -> None:
    examples = data.heldout("classify", 60)
    assert {e.kind for e in examples} == {"category", "sentiment", "parity", "language",
                                          "compare"}
    for example in examples:
        assert example.answer in example.options
        decision = Decision(example.state, example.question, list(example.options), "sum")
        assert render(decision) == example.prompt


def test_tool_examples_are_the_servers_rendering_of_key_sorted_schemas() -> None:
    for example in data.heldout("tools", 20):
        functions = tuple(sorted_values(t["function"]) for t in example.tools)
        user = example.prompt.split("<|user|>")[1].split("<|assistant|>")[0]
        rendered = render_chat([{"role": "user", "content": user}], thinking=False, effort=None,
                               tools=ToolSpec(functions, "auto", None), continued=False)
        assert rendered.prompt == example.prompt
        assert example.text.startswith(example.prompt + example.answer + "<|observation|>")


def test_streams_are_deterministic_and_heldout_differs_from_training() -> None:
    first = [e.text for e in data.heldout("add2", 50)]
    assert [e.text for e in data.heldout("add2", 50)] == first
    train = [e.text for e in data.heldout("add2", 50, seed=data.TRAIN_SEED)]
    assert train != first
    mixture = data.stream(data.TRAIN_SEED)
    again = data.stream(data.TRAIN_SEED)
    assert [mixture().text for _ in range(20)] == [again().text for _ in range(20)]


def test_worked_addition_is_right() -> None:
    rng = random.Random(5)
    for _ in range(200):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        thought = data.addition_thought(a, b)
        assert thought.endswith(f"So {a + b}.")
        steps = thought.split(". ")
        assert steps[0] == f"{a} + {b}"  # the operands restated before any column
        digits = [1 if step == "write the carry 1" else int(step.split("write ")[1][0])
                  for step in steps[1:-1]]  # units first
        assert int("".join(map(str, reversed(digits)))) == a + b


def test_the_bench_section_is_registered() -> None:
    assert "default-model" in load_sections()
