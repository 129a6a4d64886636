"""The served `/openapi.json` holds: it is a valid OpenAPI 3.1 document (openapi-spec-validator),
and a property-based fuzzer of the document (schemathesis) finds the server as documented.

The fuzzer drives every operation of the document against a live `colibri serve` (the
reference engine on glm5-chat-tiny): the document's examples, its coverage cases (boundary
values, and the methods an operation does not declare) and generated requests, valid and
invalid. No answer may be a 5xx; every answer has a documented status, content type, headers
and body, streamed events included. The run is bounded and derandomised (a fixed number of
examples per operation, no example database), and the server caps every generation at two
tokens.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from functools import cache
from typing import Any

import jsonschema
import pytest
import referencing
from colibri.server.context import ServerConfig
from referencing.jsonschema import DRAFT202012
from support.http_transcript import exchange
from support.server_harness import LiveServer, launch

from colibri import resources

#: The model id the document's request examples name, so that they reach the engine.
M = "glm-5.2-colibri"
CHAT_TINY = resources.fixture_model_dir("glm5-chat-tiny")
#: Generated requests per operation, valid and invalid together; the examples and coverage
#: phases add their own fixed lists.
MAX_EXAMPLES = 12


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # A dashboard of one page, so that GET /{path} answers its documented 200 as well as 404s.
    web = tmp_path_factory.mktemp("web")
    (web / "index.html").write_text("<!doctype html><title>colibri</title>\n")
    argv = [sys.executable, "-m", "colibri", "engine", "--model", str(CHAT_TINY)]
    config = ServerConfig(model_id=M, kv_slots=2, max_tokens=2, web_dist=str(web),
                          tokenizer_path=str(CHAT_TINY / "tokenizer.json"))
    server = launch(config, argv, {"CTX": "512", "COLI_PERSIST": "0"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(live: LiveServer) -> dict[str, Any]:
    reply = exchange(live.url, "GET", "/openapi.json")
    assert reply["status"] == 200, reply
    document: dict[str, Any] = reply["body"]
    return document


# ---- the validator ------------------------------------------------------------------

def _errors(document: dict[str, Any]) -> list[str]:
    from openapi_spec_validator import OpenAPIV31SpecValidator

    return [error.message for error in OpenAPIV31SpecValidator(document).iter_errors()]


def test_served_document_is_valid_openapi_3_1(served: dict[str, Any]) -> None:
    assert served["openapi"] == "3.1.0"
    assert _errors(served) == []


def test_validator_rejects_a_tuple_items_and_an_undeclared_path_parameter(
        served: dict[str, Any]) -> None:
    """The validator is strict where the document is easy to get wrong: 3.1 spells a tuple
    `prefixItems` (draft 4's `items: [...]` is invalid), and every operation under a templated
    path must declare the template's parameter, the CORS preflight of `/{path}` included."""
    tuple_items = copy.deepcopy(served)
    loc = (tuple_items["components"]["schemas"]["validation_error"]["properties"]["detail"]
           ["items"]["properties"]["loc"])
    loc["items"] = loc.pop("prefixItems")
    assert any("is not of type 'object', 'boolean'" in e for e in _errors(tuple_items))
    undeclared = copy.deepcopy(served)
    del undeclared["paths"]["/{path}"]["parameters"]
    assert any("Path parameter 'path' for 'options' operation" in e
               for e in _errors(undeclared))


# ---- the fuzzer ---------------------------------------------------------------------

#: The fuzzer reads the committed document, which is the served one (checked below).
DOCUMENT: dict[str, Any] = json.loads(resources.spec_path("openapi.yaml").read_text())
OPERATION_IDS = [operation["operationId"] for item in DOCUMENT["paths"].values()
                 for method, operation in item.items() if method != "parameters"]

FUZZ_CONFIG: dict[str, Any] = {
    "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True,
                   "database": "none"},
    # Most generated requests name the served model, so that they get past the model check
    # to validation and the engine (and GET /v1/models/{model} to its 200); the rest keep the
    # 404s fuzzed.
    "dictionaries": {"served": {"values": [M]}},
    "parameters": {"body.model": {"dictionary": "served", "probability": 0.9},
                   "path.model": {"dictionary": "served", "probability": 0.5}},
    # The run checks answers, not which requests are accepted: the request schemas describe
    # the fields colibri reads, and its rules (spec/http.md's validation catalogue) include
    # some JSON Schema cannot state, such as `tool_choice` naming a declared tool, or 1.0
    # not being an integer.
    "checks": {"positive_data_acceptance": {"enabled": False},
               "negative_data_rejection": {"enabled": False},
               # Replaced by `undeclared_method` below.
               "unsupported_method": {"enabled": False}},
    "request-timeout": 60,
}


@cache
def _fuzzed() -> Any:
    import schemathesis

    return schemathesis.openapi.from_dict(DOCUMENT,
                                          config=schemathesis.Config.from_dict(FUZZ_CONFIG))


DOCUMENT_URI = "urn:colibri:openapi"


@cache
def _validator(pointer: str) -> jsonschema.Draft202012Validator:
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(
        DOCUMENT_URI, DRAFT202012.create_resource(DOCUMENT))
    return jsonschema.Draft202012Validator({"$ref": f"{DOCUMENT_URI}#{pointer}"},
                                           registry=registry)


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) of each event of a text/event-stream body."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        name = next((line[6:].strip() for line in lines if line.startswith("event:")), None)
        data = "\n".join(line[5:].lstrip(" ") for line in lines if line.startswith("data:"))
        if lines:
            events.append((name, data))
    return events


def documented_body(ctx: Any, response: Any, case: Any) -> bool | None:
    """The body matches the schema the document gives its status and content type, checked
    with jsonschema's Draft 2020-12 validator (the one spec/schemas are checked with); a
    streamed body event by event against `x-colibri-event-schema`, with the framing the
    descriptions state: OpenAI streams end with `data: [DONE]`, an Anthropic event's
    `event:` name is its `type`."""
    method = case.operation.method.lower()
    if response.request.method.lower() != method:
        return None  # a probe with a method the operation does not declare
    status = str(response.status_code)
    operation = DOCUMENT["paths"][case.operation.path][method]
    if status not in operation["responses"]:
        return None  # an undocumented status is status_code_conformance's to report
    media = (response.headers.get("content-type") or [""])[0].split(";")[0].strip()
    content = operation["responses"][status].get("content", {})
    base = (f"/paths/{_escape(case.operation.path)}/{method}/responses/{status}/content/"
            f"{_escape(media)}")
    if media == "application/json" and media in content:
        _validator(f"{base}/schema").validate(json.loads(response.content))
    elif media == "text/event-stream" and media in content:
        events = _sse_events(response.content.decode("utf-8"))
        assert events, "an empty event stream"
        anthropic = case.operation.path == "/v1/messages"
        if not anthropic and not response.stream_cut_short:
            assert events[-1] == (None, "[DONE]"), events[-1]
            events = events[:-1]
        validator = _validator(f"{base}/x-colibri-event-schema")
        for name, data in events:
            event = json.loads(data)
            validator.validate(event)
            if anthropic:
                assert name == event["type"], (name, event)
    return True


def undeclared_method(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' ST204 (405 with `Allow` for an undeclared method), for the methods the
    server implements nowhere. GET and POST sent to a path that serves only the other are
    routed like an unknown path (spec/http.md 2.3, colibri's check order): a GET answers 404
    `not_found`, a POST runs the body checks first (400 before 404)."""
    from schemathesis.specs.openapi.checks import unsupported_method

    if response.request.method in ("GET", "POST"):
        return None
    return unsupported_method(ctx, response, case)


def test_fuzzed_document_is_the_served_one(served: dict[str, Any]) -> None:
    assert served == DOCUMENT


def _streamed(response: Any) -> bool:
    return bool(response.headers.get("content-type", [""])[0].startswith("text/event-stream"))


def answers_as_documented(case: Any, live: LiveServer) -> None:
    from schemathesis.specs.openapi.checks import response_schema_conformance

    response = case.call(base_url=live.url)
    # schemathesis' own body check runs beside documented_body, except where it misreads a
    # valid document: on /v1/systemone it rewrites the 422 schema's `prefixItems` into draft
    # 4's `items: [...]` and compiles that as 2020-12 (an error, whatever the body); on an
    # event stream it applies `schema` to each event, where OpenAPI 3.1 gives it the whole
    # body (a string). documented_body checks both kinds of body.
    misread = case.operation.path == "/v1/systemone" or _streamed(response)
    case.validate_response(response, excluded_checks=[response_schema_conformance] if misread
                           else [], additional_checks=[documented_body, undeclared_method],
                           transport_kwargs={"base_url": live.url})


@pytest.mark.parametrize("operation_id", OPERATION_IDS)
def test_operation_answers_as_documented(operation_id: str, live: LiveServer) -> None:
    """The examples, coverage and fuzzing phases of one operation: the test schemathesis'
    pytest plugin makes per operation, built here when it runs rather than when pytest
    collects (every xdist worker collects every module, and building all fifteen costs
    seconds), and named by the operation (the plugin's names collapse into one node id
    under pytest 9.2)."""
    from schemathesis.checks import load_all_checks
    from schemathesis.generation.feedback import FeedbackSources
    from schemathesis.pytest._test_builder import build_operation_test
    from schemathesis.python._constants.orchestrator import make_constants_value_source

    load_all_checks()
    schema = _fuzzed()
    run = build_operation_test(
        config=schema.config, operation=schema.find_operation_by_id(operation_id),
        test_func=answers_as_documented, given_kwargs={},
        feedback=FeedbackSources(constants_value_source=make_constants_value_source(schema)))
    run(live=live)
