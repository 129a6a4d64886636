"""``POST /v1/messages/count_tokens``: Anthropic's token count of a Messages request.

The count is of the exact prompt `/v1/messages` would send the engine (same translation and
the served family's rendering), tokenized with the served model's ``tokenizer.json``, the
file the engine tokenizes text payloads with, so it equals the `prompt_tokens` the engine
would ACCEPT. It costs no engine call and no KV slot, which is the point of the endpoint: a
client sizes a request before it queues for one. The tokenizer is a neutral piece
(colibri.text) and is loaded once, on first use.
"""

from __future__ import annotations

import functools

from colibri.server.anthropic_request import render_request
from colibri.server.context import JSON, Exchange, ServerState
from colibri.server.engine_request import check_prompt
from colibri.server.errors import APIError

from colibri.text.tokenizer import Tokenizer


@functools.cache
def _tokenizer(path: str) -> Tokenizer:
    return Tokenizer.from_file(path)


def tokenizer_for(state: ServerState) -> Tokenizer:
    path = state.config.tokenizer_path
    if path is None:
        raise APIError(501, "Token counting needs the served model's tokenizer.json, and this "
                       "server was not given one (`colibri serve --model DIR`).",
                       type="server_error", code="tokenizer_unavailable")
    try:
        return _tokenizer(path)
    except ValueError as exc:  # an unreadable or unsupported tokenizer.json
        raise APIError(501, f"The served model's tokenizer cannot be loaded: {exc}",
                       type="server_error", code="tokenizer_unavailable") from None


async def count_tokens(state: ServerState, body: JSON, exchange: Exchange) -> None:
    _, _, rendered = render_request(body, state.config.think_default, False,
                                    state.config.family)
    check_prompt(rendered.prompt, "messages")
    tokens = tokenizer_for(state).encode(rendered.prompt)
    await exchange.send_json(200, {"input_tokens": len(tokens)})
