"""The Tornado application: one handler that applies colibri's check order to every path.

Security first (Host guard, then authentication where required), then body framing, then
the route. Prompts are never logged: the access log records method, path, status and
duration only.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import mimetypes
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import tornado.iostream
import tornado.web
from colibri.server import anthropic_api, examples, metrics, openai_api, systemone, token_count
from colibri.server.context import JSON, ServerState, dumps
from colibri.server.errors import APIError, ClientCancelled, EngineFailure, bad, engine_error
from colibri.server.replicas import ReplicaSet
from colibri.server.template import continue_assistant_enabled

from colibri import resources

log = logging.getLogger("colibri.server.access")

MAX_BODY = 4 << 20
LOOPBACK = ("127.0.0.1", "localhost", "::1", "")
CORS_HEADERS = ("Authorization, Content-Type, x-api-key, anthropic-version, X-TypeSafe-SDK, "
                "X-TypeSafe-Runtime, X-TypeSafe-Retry-Count")
CORS_EXPOSE = ("x-request-id, x-typesafe-request-id, x-colibri-queue-wait-ms, "
               "x-colibri-elapsed-ms, x-colibri-engine-ms, Retry-After")
LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")

Endpoint = Callable[[ServerState, JSON, "Handler"], Awaitable[None]]
POST_ROUTES: dict[str, Endpoint] = {
    "/v1/chat/completions": openai_api.chat_completion,
    "/v1/completions": openai_api.completion,
    "/v1/messages": anthropic_api.messages,
    "/v1/messages/count_tokens": token_count.count_tokens,
    "/v1/systemone": systemone.systemone,
}
#: What this server answers, in /v1/models and /health (colibri's capability names).
CAPABILITIES = ["chat", "systemone"]
#: `GET /experts.json` when no atlas was written (spec/http.md §10, schemas/atlas_absent.json).
ATLAS_ABSENT: JSON = {"atlas": "absent", "message": "No expert atlas has been written on "
                      "this server; colibri atlas analyze --web writes one."}
#: The one POST route colibri serves without checking `model` (it answers any model id).
MODEL_FREE = "/v1/systemone"


def host_of(header: str) -> str:
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def _has_surrogate(node: Any) -> bool:
    if isinstance(node, str):
        return bool(LONE_SURROGATE.search(node))
    if isinstance(node, list):
        return any(_has_surrogate(v) for v in node)
    if isinstance(node, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in node.items())
    return False


def openapi_document() -> bytes:
    return json.dumps(json.loads(resources.spec_path("openapi.yaml").read_text()),
                      separators=(",", ":")).encode()


def web_root(configured: str | None) -> Path | None:
    candidates = [Path(configured)] if configured else [
        Path(__file__).resolve().parent.parent / "web" / "dist"]
    for root in candidates:
        if (root / "index.html").is_file():
            return root.resolve()
    return None


class Handler(tornado.web.RequestHandler):
    SUPPORTED_METHODS = ("GET", "POST", "OPTIONS")

    def initialize(self, state: ServerState) -> None:
        self.state = state
        self.request_id = "req_" + uuid.uuid4().hex
        self.gone = asyncio.Event()
        self.streaming = False
        self.last_write = time.monotonic()
        self.anthropic = False
        # spec/http.md 2.2: the body is JSON whatever `Content-Type` says. Tornado would parse
        # a form content type's body before the handler runs and answer a malformed one (a
        # multipart type without a boundary) with its own 400 in the wrong envelope; nothing
        # here reads form arguments.
        self.request._parse_body = lambda: None  # type: ignore[method-assign]

    # ---- tornado hooks --------------------------------------------------------------

    def set_default_headers(self) -> None:
        self.clear_header("Content-Type")
        self.set_header("Server", "colibri")

    def on_connection_close(self) -> None:
        self.gone.set()

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        # Tornado raises HTTPError for what it refuses itself (a 405): an answer, not a fault.
        if isinstance(value, tornado.web.HTTPError):
            return
        log.error("unhandled error on %s %s", self.request.method, self.request.path,
                  exc_info=(typ, value, tb))

    def compute_etag(self) -> None:
        return None

    # ---- Exchange protocol ----------------------------------------------------------

    async def send_json(self, status: int, body: JSON,
                        headers: dict[str, str] | None = None) -> None:
        if self.gone.is_set():
            return
        data = dumps(body).encode()
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("x-request-id", self.request_id)
        self.set_header("x-typesafe-request-id", self.request_id)
        for key, value in (headers or {}).items():
            self.set_header(key, value)
        self._cors()
        self.finish(data)

    async def start_sse(self, headers: dict[str, str]) -> None:
        self.set_status(200)
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        self.set_header("Connection", "close")
        self.set_header("x-request-id", self.request_id)
        for key, value in headers.items():
            self.set_header(key, value)
        self._cors()
        self.streaming = True
        await self._flush()

    async def send_sse(self, data: bytes) -> None:
        if self.gone.is_set():
            return
        self.write(data)
        await self._flush()

    async def _flush(self) -> None:
        try:
            await self.flush()
            self.last_write = time.monotonic()
        except tornado.iostream.StreamClosedError:
            self.gone.set()

    # ---- shared checks --------------------------------------------------------------

    def _cors(self) -> None:
        origin = self.request.headers.get("Origin")
        allowed = self.state.config.cors_origins
        if origin is None or (origin not in allowed and "*" not in allowed):
            return
        self.set_header("Access-Control-Allow-Origin", "*" if "*" in allowed else origin)
        self.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
        self.set_header("Access-Control-Allow-Headers", CORS_HEADERS)
        self.set_header("Access-Control-Expose-Headers", CORS_EXPOSE)
        self.set_header("Access-Control-Max-Age", "600")
        if "*" not in allowed:
            self.set_header("Vary", "Origin")

    def _host_allowed(self) -> bool:
        config = self.state.config
        allowed = {h.strip().lower() for h in config.allowed_hosts if h.strip()}
        if "*" in allowed:
            return True
        host = host_of(self.request.headers.get("Host", ""))
        bind = config.bind_host.strip("[]").lower()
        return host in LOOPBACK or host == bind or host in allowed

    def _host_error(self) -> APIError:
        host = host_of(self.request.headers.get("Host", ""))
        return APIError(403, f"Host header {host!r} not allowed. Add it with --allowed-host "
                        f"{host} (or COLI_ALLOWED_HOSTS), or --allowed-host '*' to accept any "
                        "host when the bind is already public.", code="forbidden")

    def authenticated(self) -> bool:
        key = self.state.config.api_key
        if not key:
            return True
        bearer = self.request.headers.get("Authorization", "")
        x_key = self.request.headers.get("x-api-key", "")
        ok_bearer = hmac.compare_digest(bearer.encode(), f"Bearer {key}".encode())
        ok_key = hmac.compare_digest(x_key.encode(), key.encode())
        return ok_bearer or ok_key

    @staticmethod
    def _auth_error() -> APIError:
        return APIError(401, "Invalid or missing API key.", type="authentication_error",
                        code="invalid_api_key")

    async def _error(self, error: APIError) -> None:
        body = error.anthropic_body() if self.anthropic else error.openai_body()
        if error.close:
            self.request.connection.no_keep_alive = True  # type: ignore[union-attr]
            self.set_header("Connection", "close")
        await self.send_json(error.status, body, error.headers)

    # ---- methods --------------------------------------------------------------------

    async def options(self, *_args: str) -> None:
        if not self._host_allowed():
            self.set_status(403)
            self.set_header("Content-Length", "0")
            self.finish()
            return
        self.set_status(204)
        self._cors()
        self.finish()

    async def get(self, *_args: str) -> None:
        try:
            await self._get()
        except APIError as error:
            await self._error(error)

    async def _get(self) -> None:
        path = self.request.path
        if not self._host_allowed():
            raise self._host_error()
        if path == "/metrics":
            if not self.authenticated():
                raise self._auth_error()
            text = metrics.render(self.state.scheduler.snapshot(), self.state.metrics)
            self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.set_header("Cache-Control", "no-store")
            self.finish(text.encode())
            return
        if path == "/health":
            await self._health()
            return
        if path == "/experts":
            await self.send_json(200, self._experts())
            return
        if path == "/profile":
            tele = self.state.supervisor.telemetry
            body: JSON = {"seq": 0, "turns": []}
            if self.authenticated():
                body = {"seq": tele.profile_seq, "turns": list(tele.profile)}
            await self.send_json(200, body)
            return
        if path == "/openapi.json":
            self.set_header("Content-Type", "application/json")
            self._cors()
            self.finish(openapi_document())
            return
        if path == "/experts.json":
            self._atlas()
            return
        if path == "/examples.json":
            self.set_header("Cache-Control", "no-cache")
            await self.send_json(200, examples.load(self.state.config.model_dir))
            return
        if not path.startswith("/v1/") and self._static(path):
            return
        if not self.authenticated():
            raise self._auth_error()
        model_id = self.state.config.model_id
        if path == "/v1/models":
            await self.send_json(200, {"object": "list", "data": [self._model()], "models": [
                {"name": model_id, "description": f"{self.state.config.family.name} (colibri "
                 "reference), served by colibri; POST /v1/systemone answers typed questions.",
                 "release_date": time.strftime("%Y-%m-%d",
                                               time.gmtime(self.state.created))}]})
            return
        if path.startswith("/v1/models/") and unquote(path[len("/v1/models/"):]) == model_id:
            await self.send_json(200, self._model())
            return
        raise APIError(404, "Not found.", code="not_found")

    def _model(self) -> JSON:
        return {"id": self.state.config.model_id, "object": "model",
                "created": self.state.created, "owned_by": "colibri",
                "input_modalities": ["text"], "capabilities": list(CAPABILITIES)}

    def _experts(self) -> JSON:
        tele = self.state.supervisor.telemetry
        if not self.authenticated() or tele.emap is None:
            return {"rows": 0, "cols": 0, "map": "", "hits": "", "seq": 0}
        rows, cols, hexmap = tele.emap
        return {"rows": rows, "cols": cols, "map": hexmap, "hits": tele.hits,
                "seq": tele.hits_seq}

    async def _health(self) -> None:
        sup = self.state.supervisor
        status = "ok" if sup.state == "ready" else sup.state
        code = 200 if status == "ok" else 503
        if not self.authenticated():
            await self.send_json(code, {"status": status})
            return
        body: JSON = {"status": status, "arch": "glm",
                      "scheduler": self.state.scheduler.snapshot(),
                      "kv_slots": self.state.config.kv_slots, "input_modalities": ["text"],
                      "continue_assistant": continue_assistant_enabled()}
        if sup.telemetry.tiers is not None:
            body["tiers"] = sup.telemetry.tiers
        if sup.telemetry.hwinfo is not None:
            body["hwinfo"] = sup.telemetry.hwinfo
        body["capabilities"] = list(CAPABILITIES)
        body["engine"] = {"state": sup.state, "restarts": sup.restarts, "pid": sup.pid,
                          "last_exit": sup.last_exit, "seeds": sup.supports_seeds}
        if isinstance(sup, ReplicaSet):
            # Only with --replicas above 1, so one engine's /health is unchanged.
            engines = [{**engine, "active": active} for engine, active in
                       zip(sup.describe(), self.state.scheduler.busy_by_replica(), strict=True)]
            body["replicas"] = {"engines": engines,
                                "affinity": self.state.affinity.counts.as_json()}
        await self.send_json(code, body)

    def _atlas(self) -> None:
        """The expert atlas `colibri atlas analyze --web` wrote (a state path, so a dashboard
        build cannot replace it), else the one the served model ships, else a
        `web/dist/experts.json`, else the documented empty state: a fresh install of a model
        without an atlas has none, and saying so is an answer, not a failure."""
        configured = self.state.config.atlas_path
        target = Path(configured) if configured else resources.atlas_path()
        shipped = None if target.is_file() else examples.shipped_atlas(
            self.state.config.model_dir)
        if target.is_file():
            data = target.read_bytes()
        elif shipped is not None:
            data = dumps(shipped).encode()
        elif self._static("/experts.json"):
            return
        else:
            data = dumps(ATLAS_ABSENT).encode()
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-cache")
        self._cors()
        self.finish(data)

    def _static(self, path: str) -> bool:
        """Serve a web/dist file or the SPA fallback; False when the path is not static."""
        rel = unquote(path).lstrip("/") or "index.html"
        spa = path == "/" or "." not in rel
        root = web_root(self.state.config.web_dist)
        if root is None:
            if spa:
                raise APIError(404, "The web dashboard is not built (web/dist is missing); "
                               "run `make build`.", code="web_not_built")
            return False
        target = (root / rel).resolve()
        if not (target.is_relative_to(root) and target.is_file()):
            if not spa:
                return False
            target = root / "index.html"
        kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        self.set_header("Content-Type", kind)
        self._cors()
        self.finish(target.read_bytes())
        return True

    async def post(self, *_args: str) -> None:
        path = self.request.path
        self.anthropic = path in ("/v1/messages", "/v1/messages/count_tokens")
        try:
            if not self._host_allowed():
                raise self._host_error()
            if not self.authenticated():
                raise self._auth_error()
            body = self._body()
            if path != MODEL_FREE and body.get("model") != self.state.config.model_id:
                raise APIError(404, f"The model `{body.get('model')}` does not exist.",
                               param="model", code="model_not_found")
            route = POST_ROUTES.get(path)
            if route is None:
                raise APIError(404, "Not found.", code="not_found")
            await route(self.state, body, self)
        except APIError as error:
            if self.streaming:
                self._abort()
            else:
                await self._error(error)
        except ClientCancelled:
            self._abort()
        except EngineFailure as exc:
            log.warning("engine failure on %s: %s", path, exc)
            if self.streaming or self.gone.is_set():
                self._abort()
            else:
                await self._error(engine_error())

    def _abort(self) -> None:
        """End a response that can no longer be completed: close the connection."""
        connection = self.request.connection
        stream = getattr(connection, "stream", None)
        if stream is not None:
            stream.close()
        self.gone.set()
        # Nothing more may be written: keep Tornado from finishing the response itself.
        self._finished = True

    def _body(self) -> JSON:
        headers = self.request.headers
        if "Transfer-Encoding" in headers:
            raise APIError(400, "Transfer-Encoding is not supported; send one Content-Length.",
                           close=True)
        lengths = headers.get_list("Content-Length")
        if len(lengths) > 1:
            raise bad("Multiple Content-Length headers are not supported.")
        raw_length = lengths[0].strip() if lengths else "0"
        if not raw_length.isdigit():
            raise APIError(400, "Invalid Content-Length header.", close=True)
        if not 1 <= int(raw_length) <= MAX_BODY:
            raise APIError(400, f"Request body must be between 1 and {MAX_BODY} bytes.",
                           close=True)
        try:
            body = json.loads(self.request.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise bad("Request body must be valid JSON.") from exc
        if _has_surrogate(body):
            raise bad("Request body contains an unpaired UTF-16 surrogate escape; strings "
                      "must be valid Unicode.")
        if not isinstance(body, dict):
            raise bad("Request body must be a JSON object.")
        return body

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = APIError(status_code, "Unsupported method." if status_code == 405
                         else "Internal server error.",
                         type="invalid_request_error" if status_code < 500 else "server_error",
                         code="method_not_allowed" if status_code == 405 else None)
        self.set_header("Content-Type", "application/json")
        if status_code == 405:
            # RFC 9110 15.5.6: a 405 names the methods the resource supports.
            self.set_header("Allow", ", ".join(self.SUPPORTED_METHODS))
        self.finish(dumps(error.openai_body()).encode())


def make_app(state: ServerState) -> tornado.web.Application:
    return tornado.web.Application([(r"/.*", Handler, {"state": state})],
                                   compress_response=False)
