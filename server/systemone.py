"""`POST /v1/systemone`: a closed-set decision scored through the engine's logprob channel.

Nothing is generated. Each option is appended to one rendered prompt and scored with an
ECHO request (`max_tokens=0`, `logprobs=1`); with `echo_at` (CAPS echo_at=1) the engine
scores only the tokens that cover the option and keeps the slot's prefix, so N options on one
slot cost one document prefill. An engine without it echoes every position and the server
picks the same tokens by their bytes. spec/http.md "System One" states every rule here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from colibri.server.chat_family import GLM, ChatFamily
from colibri.server.context import Exchange, ServerState, wait_header
from colibri.server.errors import APIError
from colibri.server.generation import EngineResult, EngineTurn, TokenSpan

from colibri.protocol import SubmitRequest

JSON = dict[str, Any]
MAX_OPTIONS = 64
NORMALIZE = ("sum", "mean")


class Unprocessable(APIError):
    """422 with a FastAPI-style ``detail`` list, the shape System One clients read."""

    def __init__(self, detail: list[JSON]) -> None:
        super().__init__(422, "; ".join(str(d["msg"]) for d in detail))
        self.detail = detail

    def openai_body(self) -> dict[str, Any]:
        return {"detail": self.detail}


def _item(loc: list[str | int], msg: str, kind: str) -> JSON:
    return {"loc": ["body", *loc], "msg": msg, "type": kind}


@dataclass(frozen=True)
class Decision:
    state: str
    question: str
    options: list[str]
    normalize: str


def parse(body: JSON) -> Decision:
    """Every field checked at once; all failures are reported together (422)."""
    detail: list[JSON] = []
    strings: dict[str, str] = {}
    for name in ("state", "question"):
        value = body.get(name)
        if name not in body:
            detail.append(_item([name], "Field required.", "missing"))
        elif not isinstance(value, str):
            detail.append(_item([name], "Input should be a valid string.", "string_type"))
        elif "\x00" in value:
            detail.append(_item([name], "NUL characters are not supported.", "value_error"))
        else:
            strings[name] = value
    if "question" in strings and not strings["question"].strip():
        detail.append(_item(["question"], "The question must not be empty.", "value_error"))
    options: list[str] = []
    raw = body.get("options")
    if "options" not in body:
        detail.append(_item(["options"], "Field required.", "missing"))
    elif not isinstance(raw, list):
        detail.append(_item(["options"], "Input should be a valid list.", "list_type"))
    elif len(raw) < 2:
        detail.append(_item(["options"], "List should have at least 2 items.", "too_short"))
    elif len(raw) > MAX_OPTIONS:
        detail.append(_item(["options"], f"List should have at most {MAX_OPTIONS} items.",
                            "too_long"))
    else:
        seen: set[str] = set()
        for i, option in enumerate(raw):
            if not isinstance(option, str):
                detail.append(_item(["options", i], "Input should be a valid string.",
                                    "string_type"))
            elif not option:
                detail.append(_item(["options", i], "An option must not be empty.",
                                    "value_error"))
            elif "\x00" in option:
                detail.append(_item(["options", i], "NUL characters are not supported.",
                                    "value_error"))
            elif option in seen:
                detail.append(_item(["options", i], f"Duplicate option {option!r}.",
                                    "value_error"))
            else:
                seen.add(option)
                options.append(option)
    normalize = body.get("normalize", "sum")
    if normalize not in NORMALIZE:
        detail.append(_item(["normalize"], "Input should be 'sum' or 'mean'.", "enum"))
    if detail:
        raise Unprocessable(detail)
    return Decision(strings["state"], strings["question"], options, str(normalize))


def render(decision: Decision, family: ChatFamily = GLM) -> str:
    """The prompt every option continues: one user turn in the family's template, thinking
    off (GLM-5's: the turn, then an empty reasoning block)."""
    listed = "\n".join(f"- {o}" for o in decision.options)
    body = ((decision.state + "\n\n" if decision.state else "") + decision.question
            + "\nAnswer with exactly one of:\n" + listed)
    turn = [{"role": "user", "content": body}]
    return family.template.render(turn, thinking=False, effort=None, tools=None,
                                  continued=False).prompt


def option_tokens(echo: list[TokenSpan], prompt_bytes: int, kept_prefix: bool) -> list[float]:
    """Logprobs of the tokens covering the option: every frame with `echo_at`, else the
    frames whose bytes reach past the prompt (a token merging across the boundary counts)."""
    picked = echo
    if not kept_prefix:
        picked, end = [], 0
        for span in echo:
            end += len(span.payload)
            if end > prompt_bytes:
                picked.append(span)
    out: list[float] = []
    for span in picked:
        if span.record is None or not math.isfinite(span.record.logprob):
            raise APIError(500, "The engine's echo records do not cover the option.",
                           type="server_error", code="engine_logprob_records_incomplete")
        out.append(span.record.logprob)
    return out


def distribution(scores: list[float]) -> list[float]:
    """softmax over the options, in float64 with the maximum subtracted."""
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = math.fsum(weights)
    return [w / total for w in weights]


async def _score(state: ServerState, exchange: Exchange, slot: int, text: str,
                 prompt_bytes: int, kept: bool, param: list[str | int]) -> EngineResult:
    ext = {"logprobs": 1}
    if kept:
        ext["echo_at"] = prompt_bytes
    request = SubmitRequest(slot, text.encode(), 0, 0.0, 1.0, b"", ext)
    try:
        async with EngineTurn(state, request, exchange) as turn:
            async for _ in turn:
                pass  # a scoring turn shows nothing until it is done
        return turn.outcome()
    except APIError as error:
        if error.code != "context_length_exceeded":
            raise
        raise Unprocessable([_item(param, error.message.replace("your messages",
                                                                "this request"),
                                   "context_length_exceeded")]) from error


async def systemone(state: ServerState, body: JSON, exchange: Exchange) -> None:
    decision = parse(body)
    prompt = render(decision, state.config.family)
    prompt_bytes = len(prompt.encode())
    kept = state.supervisor.telemetry.caps.get("echo_at") == "1"
    choices: list[JSON] = []
    read = 0
    prompt_tokens: int | None = None
    async with state.admitted(None, exchange) as admission:
        for i, option in enumerate(decision.options):
            try:
                result = await _score(state, exchange, admission.slot, prompt + option,
                                      prompt_bytes, kept, ["options", i])
            except Unprocessable:
                # Name the field that does not fit: the document, or this option after it.
                await _score(state, exchange, admission.slot, prompt, prompt_bytes, kept,
                             ["state"])
                raise
            lps = option_tokens(result.echo, prompt_bytes, kept)
            if not lps:
                raise APIError(500, "The engine scored no token of an option.",
                               type="server_error", code="engine_logprob_records_incomplete")
            nt = result.stats.prompt_tokens
            read += nt
            prompt_tokens = nt - len(lps) if prompt_tokens is None else min(prompt_tokens,
                                                                             nt - len(lps))
            total = math.fsum(lps)
            choices.append({"option": option, "logprob": total,
                            "mean_logprob": total / len(lps), "tokens": len(lps)})
        key = "logprob" if decision.normalize == "sum" else "mean_logprob"
        ps = distribution([c[key] for c in choices])
        for choice, p in zip(choices, ps, strict=True):
            choice["p"] = p
        best = max(range(len(ps)), key=lambda j: (ps[j], -j))
        entropy = -math.fsum(p * math.log2(p) for p in ps if p > 0)
        scored = sum(int(c["tokens"]) for c in choices)
        assert prompt_tokens is not None
        reply: JSON = {
            "answer": decision.options[best], "entropy": entropy,
            "normalize": decision.normalize,
            "choices": [{"option": c["option"], "p": c["p"], "logprob": c["logprob"],
                         "mean_logprob": c["mean_logprob"], "tokens": c["tokens"]}
                        for c in choices],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                      "read_tokens": read, "total_tokens": prompt_tokens + scored}}
        await exchange.send_json(200, reply, wait_header(admission))


__all__ = ["Decision", "Unprocessable", "distribution", "option_tokens", "parse", "render",
           "systemone"]
