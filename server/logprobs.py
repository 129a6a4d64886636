"""Log-probability arrays that describe exactly the text the client received (api.md).

Each engine token occupies a span of characters of the raw engine text. The text the client
gets is a region of that raw text (after stop handling) with reasoning and marker bytes
removed; the output pipeline that produced the text marks those characters
(``OutputPipeline.answer_mask``), and a token reports only its marked characters, so
``"".join(tokens)`` is always the returned text.
"""

from __future__ import annotations

import math
from typing import Any

from colibri.server.errors import APIError
from colibri.server.generation import EngineResult, TokenSpan

JSON = dict[str, Any]


def incomplete() -> APIError:
    return APIError(500, "The engine's per-token records do not cover the generated text.",
                    type="server_error", code="engine_logprob_records_incomplete")


def _num(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _entries(raw: str, spans: list[TokenSpan], mask: list[bool]) -> list[tuple[TokenSpan, str,
                                                                                bool]]:
    out = []
    for span in spans:
        if span.record is None:
            raise incomplete()
        if span.start == span.end:
            # A frame that completed no character (part of a multi-byte codepoint).
            if span.start < len(mask) and mask[span.start]:
                out.append((span, "", False))
            continue
        chars = "".join(raw[i] for i in range(span.start, span.end) if mask[i])
        if chars:
            out.append((span, chars, len(chars) < span.end - span.start))
    return out


def _label(span: TokenSpan, text: str, token_id: int, value: float, own_taken: bool) -> str:
    assert span.record is not None
    if not own_taken and value == span.record.logprob:
        return text
    return f"<token_id:{token_id}>"


def chat_logprobs(result: EngineResult, mask: list[bool], content: str, top: int) -> JSON:
    entries = _entries(result.raw_text, result.tokens, mask)
    if "".join(text for _, text, _ in entries) != content:
        raise incomplete()
    items = []
    for span, text, truncated in entries:
        assert span.record is not None
        own_bytes = list(text.encode()) if truncated else list(span.payload)
        alternatives = []
        own_taken = False
        for token_id, value in span.record.candidates[:top]:
            label = _label(span, text, token_id, value, own_taken)
            is_own = label == text and not label.startswith("<token_id:")
            own_taken = own_taken or is_own
            alternatives.append({"token": label, "logprob": _num(value),
                                 "bytes": own_bytes if is_own else None})
        items.append({"token": text, "logprob": _num(span.record.logprob), "bytes": own_bytes,
                      "top_logprobs": alternatives})
    return {"content": items, "refusal": None}


def completion_logprobs(result: EngineResult, mask: list[bool], text: str,
                        echo: bool) -> tuple[str, JSON]:
    entries = _entries(result.raw_text, result.tokens, mask)
    if "".join(t for _, t, _ in entries) != text:
        raise incomplete()
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float | None] | None] = []
    if echo:
        if not result.echo:
            raise incomplete()
        full_mask = [True] * len(result.echo_text)
        prompt_entries = _entries(result.echo_text, result.echo, full_mask)
        for span, piece, _ in prompt_entries:
            assert span.record is not None
            tokens.append(piece)
            token_logprobs.append(_num(span.record.logprob))
            tops.append(_table(span, piece) if span.record.candidates else None)
        text = result.echo_text + text
    for span, piece, _ in entries:
        assert span.record is not None
        tokens.append(piece)
        token_logprobs.append(_num(span.record.logprob))
        tops.append(_table(span, piece))
    offsets = []
    position = 0
    for piece in tokens:
        offsets.append(position)
        position += len(piece)
    return text, {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops,
                  "text_offset": offsets}


def _table(span: TokenSpan, text: str) -> dict[str, float | None]:
    assert span.record is not None
    table: dict[str, float | None] = {}
    own_taken = False
    for token_id, value in span.record.candidates:
        label = _label(span, text, token_id, value, own_taken)
        own_taken = own_taken or label == text
        table[label] = _num(value)
    return table
