"""Running HTTP cases: requests (plain or streamed), held streams, and their expectations."""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import referencing
from colibri.conformance.cases import Case
from colibri.conformance.http_stream_rules import anthropic_blocks, openai_chunks
from colibri.conformance.http_target import (
    COLIBRI_SERVER_CAPABILITIES,
    Endpoint,
    HttpTarget,
    HttpTargetError,
    ManagedServer,
    Response,
    discover_model,
    identifies_as_colibri,
    probe,
)
from colibri.conformance.outcome import CheckFailure

from colibri.resources import spec_dir


@dataclass
class HttpState:
    endpoint: Endpoint
    responses: dict[str, Response] = field(default_factory=dict)
    # The response must stay referenced: with "Connection: close" it owns the socket, and
    # dropping it would disconnect the client (the server would cancel the held request).
    held: dict[str, tuple[http.client.HTTPConnection, http.client.HTTPResponse]] = field(
        default_factory=dict
    )
    last: str = ""
    routes: dict[str, tuple[str, str]] = field(default_factory=dict)


def _substitute(value: Any, model: str) -> Any:
    if isinstance(value, str):
        return value.replace("{model}", model)
    if isinstance(value, list):
        return [_substitute(v, model) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, model) for k, v in value.items()}
    return value


def sse_events(body: bytes) -> list[dict[str, str]]:
    """Events of an SSE body: each a dict of field -> value (data lines joined by LF)."""
    events = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip():
            continue
        event: dict[str, str] = {}
        for line in block.decode("utf-8", "replace").split("\n"):
            if line.startswith(":"):
                event.setdefault("comment", line)
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            event[name] = event[name] + "\n" + value if name in event else value
        events.append(event)
    return events


class HttpRunner:
    def __init__(self, target: HttpTarget) -> None:
        self.target = target
        self.capabilities = set(target.capabilities)
        self._schemas = _schema_registry()

    def close(self) -> None:
        self.target.close()

    def run(self, case: Case) -> list[str]:
        try:
            endpoint = self.target.endpoint_for(case.server_args)
        except HttpTargetError as exc:
            raise CheckFailure(f"could not start the server for this case: {exc}") from exc
        state = HttpState(endpoint)
        try:
            for number, step in enumerate(case.steps):
                try:
                    self._step(state, step, number)
                except OSError as exc:
                    raise CheckFailure(f"step {number} ({step['op']}): {exc}") from exc
            return self._check(case, state)
        finally:
            for conn, raw in state.held.values():
                raw.close()
                conn.close()

    def _step(self, state: HttpState, step: dict[str, Any], number: int) -> None:
        model = self.target.model_id
        if step["op"] == "request":
            body: bytes | None = None
            if "json" in step:
                body = json.dumps(_substitute(step["json"], model)).encode()
            elif "body" in step:
                body = step["body"].encode("utf-8")
            elif "pad_bytes" in step:
                body = b'{"pad":"' + b"a" * max(int(step["pad_bytes"]) - 10, 0) + b'"}'
            headers = {
                k: (None if v is None else str(_substitute(v, model)))
                for k, v in step.get("headers", {}).items()
            }
            path = step["path"].replace("{model}", urllib.parse.quote(model, safe=""))
            response = state.endpoint.request(
                step["method"], path, headers, body, step.get("auth", "key")
            )
            name = step.get("name", f"r{number}")
            state.responses[name] = response
            state.routes[name] = (step["method"], path.split("?")[0])
            state.last = name
        elif step["op"] == "hold":
            conn = state.endpoint.connect()
            body = json.dumps(_substitute(step["json"], model)).encode()
            sent: dict[str, str] = {"Content-Type": "application/json"}
            for key, value in state.endpoint.auth_headers("key").items():
                if value is not None:
                    sent[key] = value
            conn.request("POST", state.endpoint.prefix() + step["path"], body, sent)
            raw = conn.getresponse()
            if raw.status != 200:
                raise CheckFailure(f"held request got {raw.status}: {raw.read()[:200]!r}")
            raw.readline()  # the stream has started: the request holds its slot
            state.held[step["name"]] = (conn, raw)
        elif step["op"] == "release":
            held = state.held.pop(step["name"], None)
            if held is not None:
                held[1].close()
                held[0].close()

    # -- expectations -------------------------------------------------------------------
    def _check(self, case: Case, state: HttpState) -> list[str]:
        warnings = []
        if "colibri_ext" in self.capabilities:
            # Every JSON body and event a colibri server sends has a schema in spec/schemas.
            for name, answer in state.responses.items():
                schema = body_schema(*state.routes[name], answer)
                if schema is not None:
                    try:
                        self._schema({"schema": schema}, answer)
                    except CheckFailure as exc:
                        raise CheckFailure(f"response {name} (auto): {exc}") from None
        for number, exp in enumerate(case.expect):
            try:
                response = state.responses.get(exp.get("response", state.last))
                if response is None:
                    raise CheckFailure(f"no response named {exp.get('response', state.last)!r}")
                self._expect(exp, response)
            except CheckFailure as exc:
                message = f"expect[{number}] {exp['type']}: {exc}"
                if exp.get("level", "must") == "should" and case.level == "must":
                    warnings.append(message)
                else:
                    raise CheckFailure(message) from None
        return warnings

    def _expect(self, exp: dict[str, Any], response: Response) -> None:
        kind = exp["type"]
        if kind == "status":
            allowed = exp.get("in", [exp.get("equals")])
            if response.status not in allowed:
                raise CheckFailure(
                    f"status {response.status}, expected {allowed}: {response.body[:300]!r}"
                )
        elif kind == "header":
            value = response.header(exp["name"])
            if exp.get("absent"):
                if value is not None:
                    raise CheckFailure(f"header {exp['name']} present: {value!r}")
            elif value is None:
                raise CheckFailure(f"header {exp['name']} missing")
            elif "equals" in exp and value != exp["equals"]:
                raise CheckFailure(f"header {exp['name']} is {value!r}, expected {exp['equals']!r}")
            elif "matches" in exp and not re.fullmatch(exp["matches"], value):
                raise CheckFailure(
                    f"header {exp['name']} {value!r} does not match /{exp['matches']}/"
                )
        elif kind == "json":
            self._json(exp, response)
        elif kind == "schema":
            self._schema(exp, response)
        elif kind == "sse":
            self._sse(exp, response)
        elif kind == "metrics":
            _metrics(exp, response)
        elif kind == "one_of":
            self._one_of(exp, response)
        else:
            raise CheckFailure(f"expectation {kind!r} is not implemented for HTTP")

    def _one_of(self, exp: dict[str, Any], response: Response) -> None:
        """Passes when every expectation of at least one branch holds: for behaviour the
        public references leave to the server (support a parameter, or refuse it)."""
        reasons = []
        for branch in exp["branches"]:
            try:
                for inner in branch:
                    self._expect(inner, response)
            except CheckFailure as exc:
                reasons.append(str(exc))
                continue
            return
        raise CheckFailure("no branch holds: " + " | ".join(reasons))

    def _json(self, exp: dict[str, Any], response: Response) -> None:
        document = response.json()
        if document is None:
            raise CheckFailure(f"body is not JSON: {response.body[:200]!r}")
        value = _lookup(document, exp["path"])
        if value is _MISSING:
            if exp.get("exists") is False:
                return
            raise CheckFailure(f"{exp['path']} missing in {json.dumps(document)[:300]}")
        if exp.get("exists") is False:
            raise CheckFailure(f"{exp['path']} present: {value!r}")
        if "equals" in exp and value != _substitute(exp["equals"], self.target.model_id):
            raise CheckFailure(f"{exp['path']} is {value!r}, expected {exp['equals']!r}")
        for needle in exp.get("excludes", []):
            if isinstance(value, str) and needle in value:
                raise CheckFailure(f"{exp['path']} contains {needle!r}: {value!r}")
        if "matches" in exp and not (isinstance(value, str) and re.search(exp["matches"], value)):
            raise CheckFailure(f"{exp['path']} {value!r} does not match /{exp['matches']}/")
        _json_relations(exp, value, document)
        if (
            "is" in exp
            and type(value).__name__
            != {
                "string": "str",
                "integer": "int",
                "object": "dict",
                "array": "list",
                "boolean": "bool",
                "null": "NoneType",
                "number": "float",
            }[exp["is"]]
        ):
            if not (exp["is"] == "number" and isinstance(value, int)):
                raise CheckFailure(f"{exp['path']} is {type(value).__name__}, expected {exp['is']}")

    def _schema(self, exp: dict[str, Any], response: Response) -> None:
        name = exp["schema"]
        path = spec_dir() / "schemas" / name
        if not path.exists():
            raise CheckFailure(f"spec/schemas/{name} does not exist")
        schema = json.loads(path.read_text())
        validator = jsonschema.Draft202012Validator(schema, registry=self._schemas)
        if response.is_sse:
            documents = [
                json.loads(e["data"])
                for e in sse_events(response.body)
                if "data" in e and e["data"] != "[DONE]"
            ]
            if exp.get("event") is not None:
                documents = [d for d in documents if d.get("type") == exp["event"]]
        else:
            documents = [response.json()]
        if not documents:
            # A stream of only [DONE], or an event filter matching nothing, proves nothing.
            event = exp.get("event")
            which = f" (no {event!r} event)" if event is not None else ""
            raise CheckFailure(f"{name}: no documents to validate{which}")
        for document in documents:
            error = jsonschema.exceptions.best_match(validator.iter_errors(document))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "(top)"
                raise CheckFailure(f"{name}: {where}: {error.message[:200]}")

    def _sse(self, exp: dict[str, Any], response: Response) -> None:
        if not response.is_sse:
            raise CheckFailure(f"not an event stream: {response.header('content-type')!r}")
        events = [e for e in sse_events(response.body) if set(e) != {"comment"}]
        if not events:
            raise CheckFailure("no events")
        # Exact framing: LF only, "field: value" with one space, one blank line per event.
        event_re = _OPENAI_EVENT if exp.get("api", "openai") == "openai" else _ANTHROPIC_EVENT
        framing = re.fullmatch(rb"(?:" + event_re + rb"|:[^\n]*\n\n)+", response.body)
        if framing is None:
            raise CheckFailure(f"SSE framing is not exact: {response.body[:160]!r}")
        if exp.get("api", "openai") == "openai":
            if any(set(e) - {"data", "comment"} for e in events):
                raise CheckFailure("OpenAI streams carry data-only events")
            if events[-1].get("data") != "[DONE]":
                raise CheckFailure(f"stream does not end with data: [DONE] ({events[-1]!r})")
            chunks = [json.loads(event["data"]) for event in events[:-1]]
            if exp.get("chunk_rules"):
                openai_chunks(chunks, exp.get("usage"))
            text = ""
            for chunk in chunks:
                if chunk.get("object") not in ("chat.completion.chunk", "text_completion"):
                    raise CheckFailure(f"unexpected chunk object {chunk.get('object')!r}")
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text += str(delta.get("content") or "") + str(choice.get("text") or "")
            for needle in exp.get("excludes", []):
                if needle in text:
                    raise CheckFailure(f"streamed text contains {needle!r}: {text[:200]!r}")
        else:
            names = []
            for event in events:
                data = json.loads(event.get("data", "null"))
                if not isinstance(data, dict) or data.get("type") != event.get("event"):
                    raise CheckFailure(f"event name and data.type differ: {event!r}")
                names.append(event["event"])
            order = " ".join(n for n in names if n != "ping")
            pattern = (
                r"message_start( content_block_start( content_block_delta)*"
                r" content_block_stop)* message_delta message_stop"
            )
            if not re.fullmatch(pattern, order):
                raise CheckFailure(f"Anthropic event order: {order}")
            if exp.get("block_rules"):
                anthropic_blocks([json.loads(e["data"]) for e in events])


_OPENAI_EVENT = rb"data: [^\n]+\n\n"
_ANTHROPIC_EVENT = rb"event: [a-z_]+\ndata: [^\n]+\n\n"


def _json_relations(exp: dict[str, Any], value: Any, document: Any) -> None:
    """The json expectation's comparisons beyond equality (``in``, ``at_most``,
    ``length``, ``equals_sum`` of other paths, ``parses_json``)."""
    where = exp["path"]
    if "in" in exp and value not in exp["in"]:
        raise CheckFailure(f"{where} is {value!r}, expected one of {exp['in']!r}")
    if "at_most" in exp and not (_is_count(value) and value <= exp["at_most"]):
        raise CheckFailure(f"{where} is {value!r}, expected an integer <= {exp['at_most']}")
    if "length" in exp and not (isinstance(value, list) and len(value) == exp["length"]):
        raise CheckFailure(f"{where} is {value!r}, expected an array of {exp['length']}")
    if "equals_sum" in exp:
        parts = [_lookup(document, path) for path in exp["equals_sum"]]
        if not all(_is_count(p) for p in parts) or value != sum(parts):
            raise CheckFailure(f"{where} is {value!r}, expected the sum of "
                               f"{exp['equals_sum']} = {parts!r}")
    if exp.get("parses_json"):
        try:
            json.loads(value) if isinstance(value, str) else None
        except json.JSONDecodeError as exc:
            raise CheckFailure(f"{where} is not JSON text: {value!r} ({exc})") from None
        if not isinstance(value, str):
            raise CheckFailure(f"{where} is {value!r}, expected JSON text in a string")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: What _lookup answers for a path the document does not have (None is a JSON value).
_MISSING = object()


def _lookup(document: Any, path: str) -> Any:
    """The value at a dotted path ("choices.0.message"; "" is the document itself)."""
    value = document
    for part in path.split(".") if path else []:
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return _MISSING
    return value


def _metrics(exp: dict[str, Any], response: Response) -> None:
    text = response.body.decode("utf-8", "replace")
    label = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"'
    sample = re.compile(rf"[a-zA-Z_:][a-zA-Z0-9_:]*(\{{{label}(,{label})*\}})? [^ ]+")
    types: dict[str, str] = {}
    values: dict[str, float] = {}
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            if len(parts) < 4:
                raise CheckFailure(f"bad comment line {line!r}")
            if parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        if not sample.fullmatch(line):
            raise CheckFailure(f"not a Prometheus sample line: {line!r}")
        name, _, number = line.rpartition(" ")
        try:
            values[name] = float(number)
        except ValueError:
            raise CheckFailure(f"sample value {number!r} is not a number") from None
    for metric in exp.get("required", []):
        if metric not in types:
            raise CheckFailure(f"metric {metric} missing")
    for metric, kind in types.items():
        if kind == "histogram":
            buckets = [(k, v) for k, v in values.items() if k.startswith(metric + "_bucket{")]
            counts = [v for _, v in buckets]
            if counts != sorted(counts):
                raise CheckFailure(f"{metric} buckets are not cumulative")
            inf = values.get(metric + '_bucket{le="+Inf"}')
            if inf is None or inf != values.get(metric + "_count"):
                raise CheckFailure(f"{metric}: +Inf bucket differs from _count")


def body_schema(method: str, path: str, response: Response) -> str | None:
    """The spec/schemas file that describes a colibri server's answer to method + path."""
    if response.status >= 400:
        if response.json() is None:
            return None
        if response.status == 422 and path.startswith("/v1/systemone"):
            return "validation_error.json"
        return "anthropic_error.json" if path.startswith("/v1/messages") else "error.json"
    if response.status != 200:
        return None
    posts = {
        "/v1/chat/completions": ("chat_completion.json", "chat_completion_chunk.json"),
        "/v1/completions": ("completion.json", "completion_chunk.json"),
        "/v1/messages": ("message.json", "message_stream_event.json"),
        "/v1/systemone": ("systemone.json", "systemone.json"),
        "/v1/messages/count_tokens": ("count_tokens.json", "count_tokens.json"),
    }
    if method == "POST" and path in posts:
        return posts[path][1 if response.is_sse else 0]
    gets = {
        "/v1/models": "model_list.json",
        "/health": "health.json",
        "/experts": "experts.json",
        "/profile": "profile.json",
    }
    if method == "GET" and path in gets:
        return gets[path]
    if method == "GET" and path.startswith("/v1/models/"):
        return "model.json"
    return None


def _schema_registry() -> referencing.Registry[Any]:
    resources = []
    folder = spec_dir() / "schemas"
    for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
        document = json.loads(path.read_text())
        resource = referencing.Resource.from_contents(
            document, default_specification=referencing.jsonschema.DRAFT202012
        )
        name = path.relative_to(folder).as_posix()
        resources.append((document.get("$id", name), resource))
        resources.append((name, resource))
    registry: referencing.Registry[Any] = referencing.Registry().with_resources(resources)
    return registry


def http_runner(
    base_url: str | None,
    server_cmd: str | None,
    model_id: str | None,
    api_key: str | None,
    timeout: float = 30.0,
) -> HttpRunner:
    servers: dict[tuple[str, ...], ManagedServer] = {}
    if server_cmd is not None:
        extra = ["--api-key", api_key] if api_key else []
        server = ManagedServer(server_cmd, extra, 120.0)
        servers[tuple(extra)] = server
        base_url = server.base_url
    assert base_url is not None
    endpoint = Endpoint(base_url.rstrip("/"), api_key, timeout)
    try:
        try:
            model = model_id or discover_model(endpoint)
        except OSError as exc:
            raise HttpTargetError(f"cannot reach {endpoint.base_url}: {exc}") from exc
        capabilities = probe(endpoint, model)
        if server_cmd is not None and identifies_as_colibri(endpoint):
            capabilities |= COLIBRI_SERVER_CAPABILITIES
    except HttpTargetError:
        for server in servers.values():
            server.close()
        raise
    if api_key:
        capabilities.add("auth")
    if server_cmd is not None:
        capabilities.add("managed_server")
    target = HttpTarget(endpoint, model, server_cmd, api_key, capabilities)
    target.servers.update(servers)
    return HttpRunner(target)
