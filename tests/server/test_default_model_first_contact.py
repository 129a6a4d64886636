"""The first questions a newcomer asks the default model are answered right at the settings they
meet it with: through `colibri serve`, with the server's defaults (no sampling fields: what
`colibri chat` also uses) and with the dashboard's, over questions no training stage drew
(one- and two-digit sums, a sum right after a product) and over every one-digit product (all
trained; there is no held-out one). Each kind must reach first_contact.KIND_TARGET and all
together OVERALL_TARGET; the card reports the same measurement at larger sizes
(`colibri bench --section default-model`)."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from colibri.fixtures import chat_small_data as data
from support.server_harness import interrupt, serve_process

from colibri.benchmarks import first_contact

ROOT = Path(__file__).resolve().parents[2]
#: Asks per kind (a kind with fewer items asks each more than once, with another seed).
ASKS = 30
#: The dashboard's chat defaults (web/src/pages/Chat.tsx); the server's are no fields at all.
SETTINGS: dict[str, dict[str, Any]] = {
    "server": {},
    "dashboard": {"temperature": 0.7, "enable_thinking": True, "max_completion_tokens": 1024},
}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLI_MODEL", "COLI_MODEL_ID", "COLIBRI_DEFAULT_MODEL", "COLI_THINK",
                        "COLI_TEMP")}
    env["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    env["COLI_PERSIST"] = "0"
    with serve_process([], env, ROOT) as (proc, _line, v1):
        yield v1
        interrupt(proc)


def ask(v1: str, messages: list[dict[str, str]], settings: dict[str, Any], seed: int) -> str:
    body = {"model": "glm5-chat-small", "messages": messages, "seed": seed, **settings}
    request = urllib.request.Request(v1 + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return str(json.load(response)["choices"][0]["message"]["content"]).strip()


def asks(examples: list[data.Example]) -> list[tuple[data.Example, int]]:
    """(example, seed) pairs: every example once, cycling until there are at least ASKS."""
    return [(examples[i % len(examples)], 1000 + i) for i in range(max(ASKS, len(examples)))]


def test_the_held_out_kinds_never_occur_in_training() -> None:
    train = data.training_keys()
    for kind, examples in first_contact.items(ASKS).items():
        if first_contact.KINDS[kind] is None:
            continue
        assert examples, kind
        assert not [e for e in examples if data.question_key(e) in train], kind
        validation = data.heldout(str(first_contact.KINDS[kind]), 100, "validation").examples
        data.check_disjoint(examples, validation)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_first_questions_are_answered_right_at_the_defaults(url: str, setting: str) -> None:
    right_all = total_all = 0
    report: dict[str, str] = {}
    shortfalls = []
    for kind, examples in first_contact.items(ASKS).items():
        pairs = asks(examples)
        misses = [(e.answer, got) for e, seed in pairs
                  if (got := ask(url, data.messages_of(e), SETTINGS[setting], seed)) != e.answer]
        right = len(pairs) - len(misses)
        report[kind] = f"{right}/{len(pairs)} (missed: {misses[:3]})"
        if right < first_contact.KIND_TARGET * len(pairs):
            shortfalls.append(kind)
        right_all += right
        total_all += len(pairs)
    assert not shortfalls, report
    assert right_all >= first_contact.OVERALL_TARGET * total_all, report
