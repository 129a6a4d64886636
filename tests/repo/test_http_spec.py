"""spec/http.md's machine-readable companions: schemas are valid, the OpenAPI document is
self-contained and current, and http.md names every error code the server can send."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema

from colibri import resources

ROOT = Path(__file__).resolve().parents[2]


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_every_schema_is_valid_draft_2020_12() -> None:
    paths = sorted(resources.spec_path("schemas").glob("*.json"))
    assert len(paths) >= 17
    for path in paths:
        doc = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(doc)
        assert doc["$id"].endswith(f"/schemas/{path.name}")


def test_openapi_is_self_contained() -> None:
    doc = json.loads(resources.spec_path("openapi.yaml").read_text())
    assert doc["openapi"].startswith("3.1")
    components = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.split("/")[-1] in components, ref
    for path in ("/v1/models", "/v1/models/{model}", "/v1/chat/completions", "/v1/completions",
                 "/v1/messages", "/health", "/metrics", "/experts", "/profile",
                 "/openapi.json"):
        assert path in doc["paths"], path


def test_generated_spec_files_are_current() -> None:
    tool = ROOT / "tools" / "make_http_spec.py"
    done = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout


def test_http_md_documents_every_error_code_the_server_sends() -> None:
    text = resources.spec_path("http.md").read_text()
    sources = "\n".join(p.read_text() for p in (ROOT / "server").glob("*.py"))
    codes = set(re.findall(r'code="([a-z_]+)"', sources))
    codes |= set(re.findall(r'"(unsupported_[a-z_]+|invalid_value)"', sources))
    assert codes, "no codes found in the server sources"
    missing = sorted(c for c in codes if f"`{c}`" not in text)
    assert missing == []


def _request_schema(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        json.loads(resources.spec_path(f"schemas/{name}.json").read_text()))


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_request_schemas_document_structured_output() -> None:
    """Every response_format kind the server enforces and strict tools on both surfaces are
    described (spec/http.md 4.3.1); a kind the server refuses is not."""
    chat = _request_schema("chat_request")
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    for fmt in ({"type": "text"}, {"type": "json_object"},
                {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA,
                                                         "strict": True}},
                {"type": "gbnf", "grammar": 'root ::= "a"'}):
        chat.validate({**base, "response_format": fmt})
        _request_schema("completion_request").validate(
            {"model": "m", "prompt": "x", "response_format": fmt})
    for bad in ({"type": "xml"}, {"type": "json_schema", "json_schema": {"name": "p"}},
                {"type": "gbnf", "grammar": ""}):
        assert not chat.is_valid({**base, "response_format": bad}), bad
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": SCHEMA}}
    chat.validate({**base, "tools": [tool, tool["function"]], "strict_tool_calls": True})
    assert not chat.is_valid({**base, "tools": [{"type": "function", "function": {
        "name": "f", "strict": "yes"}}]})
    messages = _request_schema("messages_request")
    messages.validate({"model": "m", "max_tokens": 8, "messages": base["messages"],
                       "tools": [{"name": "f", "strict": True, "input_schema": SCHEMA}]})
    assert not messages.is_valid({"model": "m", "max_tokens": 8, "messages": base["messages"],
                                  "tools": [{"name": "f", "strict": 1}]})
