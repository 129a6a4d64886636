"""Golden math without extensions: greedy DATA bytes against the oracle.

An engine without ``ids=1`` and logprobs cannot put token ids on the wire, but through the
byte-level tokenizer (byte_tokenizer.py) every token is one byte, so the concatenated DATA
payloads of a greedy request spell its token ids. Comparing those bytes with the oracle's
continuation judges any engine's model math on the fixtures (sameness kind (a): token ids
exact, spec/model.md §15). Bytes, not strings: a byte sequence need not be valid UTF-8.
"""

from __future__ import annotations

from typing import Any

from colibri.conformance.outcome import CheckFailure, NotApplicable
from colibri.conformance.prompts import PromptCodec


def oracle_continuation(codec: PromptCodec, key: str, prompt_key: str) -> tuple[list[int], bool]:
    """The oracle's greedy continuation of its prompt, cut at the first end-of-sequence
    token (an engine stops there without sending it), and whether the oracle reached one."""
    full = codec.oracle_ids(key)
    prompt = codec.oracle_ids(prompt_key)
    expected = full[len(prompt):] if full[: len(prompt)] == prompt else full
    stops_at = next((i for i, token in enumerate(expected) if token in codec.eos_ids), None)
    return (expected if stops_at is None else expected[:stops_at]), stops_at is not None


def check_golden_bytes(frames: list[Any], exp: dict[str, Any], codec: PromptCodec) -> None:
    if codec.byte_of is None:
        raise NotApplicable("the target is not driven through the byte-level tokenizer")
    expected, stops = oracle_continuation(
        codec, str(exp.get("oracle", "full_ids")), str(exp.get("prompt", "prompt_ids"))
    )
    data = [f for f in frames if f.kind == "DATA" and f.request_id == exp["id"]]
    got = b"".join(f.payload or b"" for f in data)
    want = codec.spell(expected)
    if got[: len(want)] != want:
        at = next(i for i, (a, b) in enumerate(zip(got + b"\0" * len(want), want, strict=False))
                  if a != b)
        raise CheckFailure(
            f"greedy DATA bytes {got[:len(want)]!r} differ from the oracle's {want!r} "
            f"at token {at}"
        )
    if len(got) < len(want):
        raise CheckFailure(f"only {len(got)} token bytes, the oracle has {len(want)}")
    if len(data) != len(got):
        raise CheckFailure(f"{len(data)} DATA frames carry {len(got)} bytes: one byte per token")
    if stops and len(got) != len(want):
        raise CheckFailure(
            f"the oracle reaches end-of-sequence after {len(want)} tokens, "
            f"the engine sent {len(got)}"
        )
