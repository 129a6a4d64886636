"""HTTP errors with colibri's envelopes: OpenAI everywhere, Anthropic on /v1/messages."""

from __future__ import annotations

from typing import Any

INVALID = "invalid_request_error"


class APIError(Exception):
    """A response the client is told about: status, message, type, param, code."""

    def __init__(self, status: int, message: str, *, type: str = INVALID,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        #: Close the connection after answering (framing errors).
        self.close = close

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


class ClientCancelled(Exception):
    """The client went away; nothing is written back."""


class EngineFailure(Exception):
    """The engine failed a request (died, protocol error, unexpected ERROR code)."""


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def engine_error() -> APIError:
    return APIError(500, "The colibri engine failed to process the request.",
                    type="server_error", code="engine_error")


def engine_unavailable() -> APIError:
    return APIError(503, "The colibri engine is restarting; retry shortly.",
                    type="server_error", code="engine_unavailable",
                    headers={"Retry-After": "1"})


def scheduler_closed() -> APIError:
    return APIError(503, "The inference scheduler is shutting down.", type="server_error",
                    code="scheduler_closed")


def queue_full() -> APIError:
    return APIError(429, "The inference queue is full.", type="rate_limit_error",
                    code="queue_full", headers={"Retry-After": "1"})


def queue_timeout() -> APIError:
    return APIError(429, "Timed out waiting for the inference engine.",
                    type="rate_limit_error", code="queue_timeout",
                    headers={"Retry-After": "1"})


def context_exceeded(args: tuple[str, ...], param: str) -> APIError:
    used, limit = "?", "the context"
    if len(args) >= 2 and args[0].isdigit() and args[1].isdigit():
        used, limit = args[0], args[1]
    else:
        kv = dict(a.split("=", 1) for a in args if "=" in a)
        used = kv.get("prompt_tokens", used)
        limit = kv.get("capacity", limit)
    return APIError(
        400, f"This model's maximum context length is {limit} tokens, however your messages "
        f"resulted in at least {used} tokens. Please shorten the conversation, or restart the "
        "server with a larger CTX.", param=param, code="context_length_exceeded")
