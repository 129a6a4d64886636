"""What the public API references say a stream's events must look like, beyond framing.

OpenAI (API reference, "The chat completion chunk object" and ``stream_options``): every chunk
of one stream carries the same ``id``, ``created`` and ``model``; the first delta of a choice
carries its ``role``; each choice ends exactly once with a non-null ``finish_reason`` and gets
no content after it; with ``stream_options.include_usage`` one extra chunk with an empty
``choices`` carries the request's ``usage`` and every other chunk has ``"usage": null``.

Anthropic (Messages API, "Streaming messages"): ``message_start`` carries a message with an
empty ``content`` and a ``usage``; content blocks are started at indices 0, 1, ... in order,
each delta and stop names the open block; ``message_delta`` carries the ``stop_reason`` and
the cumulative ``usage.output_tokens``.
"""

from __future__ import annotations

from typing import Any

from colibri.conformance.outcome import CheckFailure

#: finish_reason values the OpenAI reference lists for chat completions.
OPENAI_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
#: stop_reason values the Anthropic reference lists.
ANTHROPIC_STOP = frozenset(
    {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
)


def openai_chunks(chunks: list[dict[str, Any]], usage: str | None) -> None:
    """``usage``: "final" (include_usage was asked), "none" (it was not), None (no rule)."""
    if not chunks:
        raise CheckFailure("no chunks before [DONE]")
    first = chunks[0]
    for number, chunk in enumerate(chunks):
        for key in ("id", "created", "model"):
            if chunk.get(key) != first.get(key):
                raise CheckFailure(
                    f"chunk {number}: {key} {chunk.get(key)!r} differs from the first chunk's "
                    f"{first.get(key)!r}"
                )
    started: set[int] = set()
    finished: dict[int, int] = {}
    for number, chunk in enumerate(chunks):
        for choice in chunk.get("choices") or []:
            index = choice.get("index")
            if not isinstance(index, int):
                raise CheckFailure(f"chunk {number}: a choice without an integer index")
            delta = choice.get("delta") or {}
            if index not in started:
                started.add(index)
                if delta.get("role") != "assistant":
                    raise CheckFailure(
                        f"chunk {number}: the first delta of choice {index} has no role "
                        f"'assistant': {delta!r}"
                    )
            if index in finished and (delta.get("content") or delta.get("tool_calls")):
                raise CheckFailure(f"chunk {number}: choice {index} has content after it ended")
            reason = choice.get("finish_reason")
            if reason is not None:
                if index in finished:
                    raise CheckFailure(f"chunk {number}: choice {index} ended twice")
                if reason not in OPENAI_FINISH:
                    raise CheckFailure(f"chunk {number}: finish_reason {reason!r}")
                finished[index] = number
    missing = sorted(started - set(finished))
    if not started or missing:
        raise CheckFailure(f"choices {missing or '(none)'} never got a finish_reason")
    if usage is not None:
        _openai_usage(chunks, usage, max(finished.values()))


def _openai_usage(chunks: list[dict[str, Any]], usage: str, last_choice: int) -> None:
    carrying = [n for n, chunk in enumerate(chunks) if chunk.get("usage") is not None]
    if usage == "none":
        if carrying:
            raise CheckFailure(f"chunk {carrying[0]} carries usage without include_usage")
        return
    if len(carrying) != 1:
        raise CheckFailure(f"{len(carrying)} chunks carry usage, expected exactly one")
    number = carrying[0]
    chunk = chunks[number]
    if chunk.get("choices") != [] or number < last_choice:
        raise CheckFailure(f"the usage chunk ({number}) must have empty choices and come last")
    for number, other in enumerate(chunks):
        if number != carrying[0] and ("usage" not in other or other["usage"] is not None):
            raise CheckFailure(f"chunk {number}: usage must be present and null")
    counts = chunk["usage"]
    if not isinstance(counts, dict):
        raise CheckFailure(f"usage is not an object: {counts!r}")
    values = [counts.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
    numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if len(numbers) != len(values):
        raise CheckFailure(f"usage counts are not integers: {counts!r}")
    if numbers[0] + numbers[1] != numbers[2]:
        raise CheckFailure(f"total_tokens != prompt_tokens + completion_tokens: {counts!r}")


def anthropic_blocks(events: list[dict[str, Any]]) -> None:
    """``events``: the decoded ``data`` of each event, ping events included."""
    start = events[0]
    message = start.get("message") if isinstance(start, dict) else None
    if not isinstance(message, dict) or message.get("content") != []:
        raise CheckFailure(f"message_start must carry a message with empty content: {start!r}")
    if not isinstance(message.get("usage"), dict):
        raise CheckFailure("message_start's message has no usage")
    open_block: int | None = None
    next_index = 0
    for data in events[1:]:
        kind = data.get("type")
        if kind == "content_block_start":
            if open_block is not None or data.get("index") != next_index:
                raise CheckFailure(f"block started at index {data.get('index')!r}, "
                                   f"expected {next_index} with no block open")
            if not isinstance(data.get("content_block"), dict):
                raise CheckFailure("content_block_start without a content_block object")
            open_block, next_index = next_index, next_index + 1
        elif kind in ("content_block_delta", "content_block_stop"):
            if data.get("index") != open_block:
                raise CheckFailure(f"{kind} for index {data.get('index')!r}, open: {open_block}")
            if kind == "content_block_stop":
                open_block = None
        elif kind == "message_delta":
            reason = (data.get("delta") or {}).get("stop_reason")
            if reason not in ANTHROPIC_STOP:
                raise CheckFailure(f"message_delta stop_reason {reason!r}")
            output = (data.get("usage") or {}).get("output_tokens")
            if not isinstance(output, int) or isinstance(output, bool):
                raise CheckFailure(f"message_delta usage.output_tokens {output!r}")
