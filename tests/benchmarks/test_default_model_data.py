"""The default model's data: the server's prompt layout, and evaluation held out by construction.

glm5-chat-small only answers well on the prompts it was trained on, so the synthetic data
(fixtures/chat_small_data.py) must render each example as the server renders the same request:
the chat turns (server/template.py), the System One question (server/systemone.py) and the
tool declarations. The ``default-model`` bench section scores held-out questions, so this file
also holds what makes them held out: the replayed training stream is the one the committed
model's stages really drew (the record's token counts), no test or validation question occurs
in it, the two splits share none, and the check catches a planted item.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
from colibri.fixtures import chat_small_data as data
from colibri.server.systemone import Decision, render
from colibri.server.template import render_chat
from colibri.server.validation import ToolSpec

from colibri.benchmarks import load_sections
from colibri.benchmarks.default_model import (
    HEADLINE,
    LOSS_EXAMPLES,
    LOSS_TOPICS,
    TASKS,
    VALIDATION_EXAMPLES,
    size_of,
)
from colibri.benchmarks.rates import wilson
from colibri.resources import default_model_dir

CHAT_TASKS = ["add2", "add3", "sub2", "mul1", "units", "sort", "count", "chat", "add1", "mul1d",
              "off_topic"]
#: Topics whose questions are partly reserved: training never draws a reserved one.
RESERVING = ("add1", "sum_after_product", "product_after_sum", "classify_doc", "classify_state",
             "off_topic")


def sorted_values(fn: dict[str, Any]) -> dict[str, Any]:
    """The function's own keys in their order, every value's keys sorted (the training layout)."""
    return {k: json.loads(json.dumps(v, sort_keys=True)) for k, v in fn.items()}


@pytest.mark.parametrize("topic", CHAT_TASKS)
def test_chat_examples_are_the_servers_rendering(topic: str) -> None:
    for example in data.draw(topic, 30, data.HELDOUT_SEED):
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
        # The bench asks each question both ways, as a request without an effort renders.
        for on in (True, False):
            request = render_chat([{"role": "user", "content": user}], thinking=on,
                                  effort=None, tools=None, continued=False)
            assert data.as_asked(example, on) == request.prompt


@pytest.mark.parametrize("topic", sorted(data.CONVERSATIONS))
def test_conversations_are_the_servers_rendering_of_their_messages(topic: str) -> None:
    for example in data.draw(topic, 30, data.HELDOUT_SEED):
        messages = data.messages_of(example)
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert messages[1]["content"] == example.earlier[0]
        thinking = example.prompt.endswith("<think>")
        effort = None
        if thinking:
            word = example.prompt.split("Reasoning Effort: ")[1].split("<|user|>")[0]
            effort = {"Low": "low", "Medium": "medium", "High": "high", "Max": "xhigh"}[word]
        rendered = render_chat(messages, thinking=thinking, effort=effort, tools=None,
                               continued=False)
        assert rendered.prompt == example.prompt
        for on in (True, False):
            request = render_chat(messages, thinking=on, effort=None, tools=None,
                                  continued=False)
            assert data.as_asked(example, on) == request.prompt


@pytest.mark.parametrize("topic", RESERVING)
def test_training_never_draws_a_reserved_question(topic: str) -> None:
    generate = data.EXTRA[topic][0]
    rng = random.Random(5)
    drawn = [generate(rng) for _ in range(3000)]
    assert not [k for e in drawn for k in data.turn_keys(e)
                if data.reservable(k) and data.reserved(k)]
    # ...while the question space itself has reserved questions for the held-out splits.
    space = data.draw(topic, 3000, 5)
    assert any(data.reserved(data.question_key(e)) for e in space)
    # The replayed stream agrees: no stage trained a reserved question of this topic.
    trained = data.training_questions().get(topic, frozenset())
    assert not [k for k in trained if data.reservable(k) and data.reserved(k)]


def test_closed_spaces_are_the_small_ones_the_stages_could_use_up() -> None:
    def closed(topic: str) -> bool:
        keys = {k for e in data.draw(topic, 50, 3) for k in data.turn_keys(e)}
        return all(data.CLOSED_SPACE.match(k) for k in keys)

    assert all(closed(t) for t in ("add2", "sub2", "units", "classify", "tools", "chat"))
    for topic in ("add1", "add3", "mul1", "mul1d", "classify_doc", "classify_state", "off_topic",
                  "sort", "count"):
        keys = {k for e in data.draw(topic, 50, 3) for k in data.turn_keys(e)}
        assert not [k for k in keys if data.CLOSED_SPACE.match(k)], topic


def test_a_closing_stream_draws_no_closed_question_earlier_stages_did_not() -> None:
    before = data.training_keys()
    extra = tuple((name, 0.1) for name in data.EXTRA)
    source = data.stream(data.TRAIN_SEED + 7, extra=extra, closed_before=before)
    drawn = [source() for _ in range(4000)]
    assert not [k for e in drawn for k in data.turn_keys(e)
                if data.CLOSED_SPACE.match(k) and k not in before]
    assert {e.topic for e in drawn} >= {"add2", "classify", "sum_after_product", "add1"}
    # Without closing, the same stream draws new two-digit sums (what the closing prevents).
    open_source = data.stream(data.TRAIN_SEED + 7, extra=extra)
    assert [k for _ in range(4000) for k in data.turn_keys(open_source())
            if data.CLOSED_SPACE.match(k) and k not in before]


def test_one_digit_sums_held_out_are_asked_nowhere_in_training() -> None:
    held = [e for e in data.draw("add1", 2000, 9) if data.reserved(data.question_key(e))]
    assert held
    train = data.training_keys()  # every turn of every conversation included
    assert not [e.answer for e in held if data.question_key(e) in train]


def test_closed_set_examples_are_system_ones_rendering() -> None:
    examples = data.draw("classify", 60, data.HELDOUT_SEED)
    assert {e.kind for e in examples} == {"category", "sentiment", "parity", "language",
                                          "compare"}
    documents = []
    for topic, kind in (("classify_doc", "document"), ("classify_state", "state")):
        drawn = data.draw(topic, 60, data.HELDOUT_SEED)
        assert {e.kind for e in drawn} == {kind}
        assert {e.answer for e in drawn} == {"yes", "no"}
        documents += drawn + list(data.heldout(topic, 60).examples)
    for example in examples + list(data.heldout("classify", 60).examples) + documents:
        assert example.answer in example.options
        decision = Decision(example.state, example.question, list(example.options), "sum")
        assert render(decision) == example.prompt


def test_tool_examples_are_the_servers_rendering_of_key_sorted_schemas() -> None:
    for example in data.draw("tools", 20, data.HELDOUT_SEED):
        functions = tuple(sorted_values(t["function"]) for t in example.tools)
        user = example.prompt.split("<|user|>")[1].split("<|assistant|>")[0]
        rendered = render_chat([{"role": "user", "content": user}], thinking=False, effort=None,
                               tools=ToolSpec(functions, "auto", None), continued=False)
        assert rendered.prompt == example.prompt
        assert example.text.startswith(example.prompt + example.answer + "<|observation|>")


def test_streams_are_deterministic() -> None:
    assert ([e.text for e in data.draw("add2", 50, data.HELDOUT_SEED)]
            == [e.text for e in data.draw("add2", 50, data.HELDOUT_SEED)])
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


# ---------------------------------------------------------------------------------------------
# The training stream is the committed model's


def record() -> dict[str, Any]:
    result: dict[str, Any] = json.loads((default_model_dir() / "training.json").read_text())
    return result


def test_training_run_lists_each_recorded_stage_recipe() -> None:
    stages = record()["stages"]
    assert len(data.TRAINING_RUN) == len(stages)
    for stage, recorded in zip(data.TRAINING_RUN, stages, strict=True):
        assert dict(stage.shares) | dict(stage.extra) == recorded["data"]["mixture"]
        assert [t for t, _ in stage.shares] == list(data.MIXTURE)  # the order rng.choices sees
        assert recorded["data"]["train_seed"] == data.TRAIN_SEED
        assert recorded["training"].get("topics", "the whole mixture") == "the whole mixture"
        assert recorded["training"]["max_len"] == data.TRAINER_MAX_LEN
        assert stage.closed == recorded["training"].get("closed_spaces", False)


@pytest.mark.slow
def test_replayed_stream_reproduces_every_logged_token_count() -> None:
    """The trainer's batching over the replayed draws gives the record's cumulative token
    count at every logged step of every stage, and each stage drew exactly ``drawn``
    examples: the stream the exclusion uses is the one the model was trained on."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    cache: dict[str, int] = {}

    def lengths(texts: list[str]) -> list[int]:
        new = [t for t in dict.fromkeys(texts) if t not in cache]
        encoded = tokenizer.encode_batch(new, add_special_tokens=False)
        cache.update(zip(new, (len(e.ids) for e in encoded), strict=True))
        return [cache[t] for t in texts]

    rec = record()
    before_steps = before_tokens = 0
    for number, (stage, recorded) in enumerate(zip(data.TRAINING_RUN, rec["stages"],
                                                   strict=True), 1):
        steps, final = recorded["training"]["steps"], recorded["final"]
        logged = {row["step"] - before_steps: row["tokens"] - before_tokens
                  for row in rec["curve"] if row["stage"] == number}
        assert logged, number
        # A finished stage trained batches 0..steps-1 and drew batch ``steps`` before it
        # stopped; a checkpoint (the stage stopped early) was written after batch ``steps``.
        trained = steps if final else steps + 1
        tokens = drawn = 0
        replayed: dict[int, int] = {}
        for index, (pools_end, batch) in enumerate(
                data.replay(stage, lengths, recorded["training"]["tokens_per_step"])):
            drawn = pools_end
            if index == trained:
                break
            tokens += batch
            replayed[index] = tokens
            if index == steps:
                break
        assert {s: replayed.get(s) for s in logged} == logged, number
        assert tokens == recorded["training"]["tokens"], number
        assert drawn == stage.drawn, number
        before_steps += steps
        before_tokens += recorded["training"]["tokens"]


def test_stage_one_trained_additions_without_restated_operands() -> None:
    example = next(e for e in data.draw("add2", 50, 3) if e.thought)
    first, later = data.TRAINING_RUN[0], data.TRAINING_RUN[-1]
    assert later.text(example) == example.text
    a_plus_b = example.answer.split(" =")[0]
    assert first.text(example) == example.text.replace("<think>" + a_plus_b + ". ", "<think>")
    assert first.text(example) != example.text


# ---------------------------------------------------------------------------------------------
# Held out by construction


def test_question_key_drops_phrasing_mode_and_option_order_only() -> None:
    rng = random.Random(0)
    off = data.chat("add2", "Add 27 and 15.", "27 + 15 = 42.", rng)
    on = data.chat("add2", "What is 27 + 15?", "27 + 15 = 42.", rng,
                   data.addition_thought(27, 15), think_rate=1.0)
    assert on.prompt.endswith("<think>") and not off.prompt.endswith("<think>")
    assert data.question_key(on) == data.question_key(off)
    swapped = data.chat("add2", "What is 15 + 27?", "15 + 27 = 42.", rng)
    assert data.question_key(swapped) != data.question_key(on)  # operands in the order asked
    one = data.system_one("parity", "", "Is 7 even or odd?", ["even", "odd"], "odd", rng)
    two = data.system_one("parity", "", "Is 7 even or odd?", ["odd", "even"], "odd", rng)
    assert data.question_key(one) == data.question_key(two)


def all_sets() -> list[tuple[str, tuple[data.Example, ...], tuple[data.Example, ...]]]:
    """Every (topic, test set, validation set) the bench scores or checks, at its sizes."""
    sizes = {t: size_of(t, 300, 60) for t in TASKS} | {
        t: LOSS_EXAMPLES for t in LOSS_TOPICS if t not in TASKS}
    return [(t, data.heldout(t, n).examples, data.heldout(t, VALIDATION_EXAMPLES,
                                                           "validation").examples)
            for t, n in sizes.items()]


def test_no_held_out_question_occurs_in_training_or_in_both_splits() -> None:
    train = data.training_keys()
    for topic, test, validation in all_sets():
        assert data.overlap(test, train) == [], topic
        assert data.overlap(validation, train) == [], topic
        assert data.overlap(validation, data.keys_of(test)) == [], topic
        assert len(data.keys_of(test)) == len(test), topic  # each question once
        assert {data.split_of(data.question_key(e)) for e in test} <= {"test"}
        assert {data.split_of(data.question_key(e)) for e in validation} <= {"validation"}
        data.check_disjoint(test, validation)


def test_headline_tasks_have_at_least_200_held_out_questions() -> None:
    for topic in HEADLINE:
        assert len(data.heldout(topic, size_of(topic, 300, 60)).examples) >= 200, topic


def test_a_question_planted_in_training_and_test_is_caught() -> None:
    trained = next(e for e in data.training_examples() if e.topic == "add2")
    question = trained.answer.split(" =")[0]
    # The same question in another phrasing and thinking mode: the key catches it all the same.
    planted = data.chat("add2", f"Compute {question}.", trained.answer, random.Random(1))
    assert planted.prompt != trained.prompt
    test = list(data.heldout("add2", 50).examples)
    validation = list(data.heldout("add2", 20, "validation").examples)
    data.check_disjoint(test, validation)
    assert data.overlap(test + [planted], data.training_keys()) == [planted]
    named = re.escape("test items in training: " + data.question_key(planted))
    with pytest.raises(ValueError, match=named):
        data.check_disjoint(test + [planted], validation)
    with pytest.raises(ValueError, match="validation items in training"):
        data.check_disjoint(test, validation + [planted])


def test_a_question_planted_in_test_and_validation_is_caught() -> None:
    test = list(data.heldout("sort", 40).examples)
    validation = list(data.heldout("sort", 40, "validation").examples)
    planted = test[7]
    assert data.overlap(validation + [planted], data.keys_of(test)) == [planted]
    with pytest.raises(ValueError, match="validation items in the test set"):
        data.check_disjoint(test, validation + [planted])


def test_exclusions_are_counted() -> None:
    held = data.heldout("add2", 300)
    counts = held.counts()
    assert counts["kept"] == 300
    assert counts["drawn"] == (counts["kept"] + counts["excluded_in_training"]
                               + counts["excluded_other_split"] + counts["repeats"])
    assert counts["excluded_in_training"] > counts["kept"]  # most 2-digit sums were trained
    chat = data.heldout("chat", 10)  # 14 small-talk prompts, every one trained
    assert chat.examples == () and chat.in_training == chat.drawn == data.MAX_DRAWS


def test_wilson_interval() -> None:
    assert wilson(0, 0) is None
    for right, total, low, high in ((5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0),
                                    (0, 10, 0.0, 0.2775), (270, 300, 0.8608, 0.9291)):
        interval = wilson(right, total)
        assert interval == pytest.approx((low, high), abs=1e-4), (right, total)
