"""The SUBMIT an HTTP request becomes: the prompt check every surface applies before it takes
a slot, and the sampling fields and extensions (spec/protocol.md SUBMIT)."""

from __future__ import annotations

from colibri.server import validation as v
from colibri.server.errors import bad

from colibri.protocol import SubmitRequest


def check_prompt(prompt: str, param: str) -> None:
    """The wire protocol refuses NUL in a payload; say so before taking a slot."""
    if "\x00" in prompt:
        raise bad("NUL bytes are not supported in prompts.", param)


def submit_request(shaping: v.Shaping, prompt: str, slot: int, logprobs: int,
                   seed: dict[str, int]) -> SubmitRequest:
    ext: dict[str, int] = {}
    if logprobs:
        ext["logprobs"] = logprobs
    ext.update(seed)
    return SubmitRequest(slot, prompt.encode(), shaping.max_tokens, shaping.temperature,
                         shaping.top_p, shaping.grammar, ext)
