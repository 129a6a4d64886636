"""The GLM-5 chat format: how turns are laid out in a prompt (spec/http.md §7, spec/model.md).

    [gMASK]<sop><|system|>...<|user|>...<|assistant|><think>reasoning</think>reply...

This is the one place the turn markers and the assistant cue are written; the server's full
template (tools, reasoning effort, continued turns), the legacy chat loop, ``colibri generate``
and the benchmarks build their prompts from these pieces.
"""

from __future__ import annotations

#: Opens every conversation; GLM-5 has no BOS token, the template supplies these two.
PREFIX = "[gMASK]<sop>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
OBSERVATION = "<|observation|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def assistant_cue(thinking: bool) -> str:
    """What opens the model's reply: inside an open reasoning block, or past an empty one."""
    return ASSISTANT + THINK_OPEN + ("" if thinking else THINK_CLOSE)


def assistant_turn(reasoning: str, text: str) -> str:
    """A finished assistant turn, as history."""
    return f"{ASSISTANT}{THINK_OPEN}{reasoning}{THINK_CLOSE}{text}"


def user_turn(text: str, *, thinking: bool = False) -> str:
    """One user turn followed by the assistant cue (a turn appended to a conversation)."""
    return USER + text + assistant_cue(thinking)


def chat_prompt(text: str, *, thinking: bool = False) -> str:
    """A whole single-turn conversation: the prefix, the user's text, the assistant cue."""
    return PREFIX + user_turn(text, thinking=thinking)
