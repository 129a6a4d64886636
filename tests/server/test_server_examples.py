"""What a newcomer is offered to try is what the default model does well: every example it
ships (examples.json, served as GET /examples.json, printed by `colibri chat`, quoted in the
README) is answered right through `colibri serve` at the dashboard's and the server's
defaults; the System One example is answered right with most of the model's probability on
the allowed answers; Explore gets the atlas the model ships; a `json_schema` reply whose
strings have no bound still ends as valid JSON (spec/http.md 4.3.1, §10)."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from colibri.server import attach
from colibri.server.examples import NO_EXAMPLES, load, shipped_atlas, try_line
from colibri.server.structured_output import DEFAULT_MAX_STRING
from support.server_harness import interrupt, serve_process

from colibri import resources

ROOT = Path(__file__).resolve().parents[2]
MODEL = resources.default_model_dir()
SHIPPED = json.loads((MODEL / "examples.json").read_text())
#: The System One page's "tiny" total probability (web/src/lib/systemone.ts COVERED_AT_LEAST).
COVERED_AT_LEAST = 0.5
#: The dashboard's chat defaults (web/src/pages/Chat.tsx) and the server's (no fields sent).
DASHBOARD = {"temperature": 0.7, "enable_thinking": True, "max_completion_tokens": 1024}
SERVER: dict[str, Any] = {}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLI_MODEL", "COLI_MODEL_ID", "COLIBRI_DEFAULT_MODEL", "COLI_THINK",
                        "COLI_ATLAS", "COLI_JSON_MAX_STRING")}
    # A fresh state root: no atlas written there, no conversation resumed.
    env["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    env["COLI_PERSIST"] = "0"
    with serve_process([], env, ROOT) as (proc, _line, v1):
        yield v1.removesuffix("/v1")
        interrupt(proc)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.load(response)


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        json.loads(resources.spec_path("schemas", f"{name}.json").read_text()))


def test_the_default_model_ships_examples_and_serves_them(url: str) -> None:
    served = get(url + "/examples.json")
    validator("examples").validate(served)
    assert served == load(MODEL)
    assert [e["prompt"] for e in served["chat"]] == [e["prompt"] for e in SHIPPED["chat"]]
    assert len(served["chat"]) >= 2 and served["systemone"] is not None


@pytest.mark.parametrize("settings", [DASHBOARD, SERVER], ids=["dashboard", "server"])
@pytest.mark.parametrize("example", SHIPPED["chat"], ids=lambda e: e["prompt"])
def test_each_chat_example_is_answered_right(url: str, example: dict[str, str],
                                             settings: dict[str, Any]) -> None:
    reply = post(url + "/v1/chat/completions", {
        "model": "glm5-chat-small", "messages": [{"role": "user", "content": example["prompt"]}],
        **settings})
    content = reply["choices"][0]["message"]["content"]
    assert example["answer"] in content, (example, content)


def test_the_system_one_example_is_answered_right_and_sure(url: str) -> None:
    s1 = SHIPPED["systemone"]
    reply = post(url + "/v1/systemone", {"model": "glm5-chat-small", "state": s1["state"],
                                         "question": s1["question"], "options": s1["options"]})
    assert reply["answer"] == s1["answer"]
    covered = math.fsum(math.exp(c["logprob"]) for c in reply["choices"])
    assert covered >= COVERED_AT_LEAST, reply


def test_explore_gets_the_atlas_the_model_ships(url: str) -> None:
    atlas = get(url + "/experts.json")
    validator("atlas").validate(atlas)
    assert atlas == shipped_atlas(MODEL)
    analysis = json.loads((MODEL / "atlas_analysis.json").read_text())
    assert atlas["categories"] == analysis["categories"]
    assert len(atlas["experts"]) == len(analysis["experts"])


def test_an_unbounded_json_schema_string_still_ends_as_valid_json(url: str) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "city": {"type": "string"}},
              "required": ["name", "city"], "additionalProperties": False}
    # Outside the model's skills: before the bound it never closed the string.
    reply = post(url + "/v1/chat/completions", {
        "model": "glm5-chat-small", "temperature": 1.0,
        "messages": [{"role": "user", "content": "Who are you and where do you live?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "p",
                                                                   "schema": schema}}})
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop", reply["usage"]
    answer = json.loads(choice["message"]["content"])
    jsonschema.validate(answer, schema)
    assert all(len(v) <= DEFAULT_MAX_STRING for v in answer.values())
    assert reply["usage"]["completion_tokens"] < 1024


def test_a_model_without_examples_offers_none(tmp_path: Path) -> None:
    assert load(resources.fixture_model_dir("glm5-chat-tiny")) == NO_EXAMPLES
    assert load(None) == NO_EXAMPLES
    (tmp_path / "examples.json").write_text('{"chat": [{"prompt": ""}, 3], "systemone": 1}')
    assert load(tmp_path) == NO_EXAMPLES
    assert shipped_atlas(tmp_path) is None


def test_the_readme_quotes_shipped_examples() -> None:
    readme = (ROOT / "README.md").read_text()
    quoted = [q for pair in re.findall(r"ask it `([^`]+)` or `([^`]+)`", readme) for q in pair]
    assert quoted, "the README offers example prompts"
    assert set(quoted) <= {e["prompt"] for e in SHIPPED["chat"]}


def test_colibri_chat_attach_offers_the_served_examples(url: str) -> None:
    err = io.StringIO()
    args = argparse.Namespace(attach=url, api_key=None, ngen=None)
    assert attach.run(args, stdin=io.StringIO(""), out=io.StringIO(), err=err) == 0
    assert try_line(SHIPPED) in err.getvalue().splitlines()
