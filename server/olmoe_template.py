"""OLMoE-Instruct's chat template (the Tulu layout, ``fixtures/olmoe_chat_template.jinja``),
rendered byte for byte as transformers' ``apply_chat_template`` renders the model's own
``tokenizer_config.json`` template::

    <bos><|system|>\\nS\\n<|user|>\\nU\\n<|assistant|>\\nA<eos>\\n<|user|>\\nV\\n<|assistant|>\\n

The role markers are plain text for OLMoE's BPE; ``bos`` and ``eos`` are the tokenizer
config's ``bos_token`` and ``eos_token`` (``<|endoftext|>``), which the template reads too.
OLMoE has no reasoning block and no tool format (seeds/api.md), so thinking is never rendered
and tool turns are refused by name instead of being dropped the way the Jinja template drops
a role it does not know.
"""

from __future__ import annotations

from typing import Any

from colibri.server.errors import bad
from colibri.server.template import Rendered, continue_assistant_enabled, message_text
from colibri.server.validation import ToolSpec

SYSTEM = "<|system|>\n"
USER = "<|user|>\n"
ASSISTANT = "<|assistant|>\n"


class OlmoeTemplate:
    """The OLMoE renderer for one model: its ``bos_token`` and ``eos_token`` strings."""

    def __init__(self, bos: str, eos: str) -> None:
        self.bos = bos
        self.eos = eos

    def continues(self, messages: list[Any], body: dict[str, Any]) -> bool:
        """A trailing assistant turn is continued (transformers' ``continue_final_message``):
        the prompt ends right after its content, with no end-of-text. The template keeps the
        content's bytes as sent, so none of GLM's whitespace or empty-turn refusals apply."""
        if not continue_assistant_enabled() or not messages:
            return False
        last = messages[-1]
        return isinstance(last, dict) and last.get("role") == "assistant"

    def render(self, messages: list[Any], *, thinking: bool, effort: str | None,
               tools: ToolSpec | None, continued: bool) -> Rendered:
        """``thinking``, ``effort`` and ``tools`` are off for OLMoE by the time a request gets
        here (the family's rules); they are taken to keep one renderer signature."""
        out = self.bos
        last = len(messages) - 1
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise bad("Each message must be an object.", f"messages.{i}")
            role = message.get("role")
            if role in ("system", "developer"):
                out += SYSTEM + message_text(message.get("content"), i) + "\n"
            elif role == "user":
                out += USER + message_text(message.get("content"), i) + "\n"
            elif role == "assistant":
                if message.get("tool_calls"):
                    raise bad("The OLMoE engine has no tool-call format, so an assistant "
                              "turn cannot carry `tool_calls`.", f"messages.{i}.tool_calls",
                              "unsupported_value")
                content = message.get("content")
                text = "" if content is None else message_text(content, i)
                if i == last and continued:
                    return Rendered(out + ASSISTANT + text, False, True)
                out += ASSISTANT + text + self.eos + ("" if i == last else "\n")
            elif role == "tool":
                raise bad("The OLMoE engine has no tool-call format, so a conversation "
                          "cannot contain `tool` messages.", f"messages.{i}.role",
                          "unsupported_role")
            else:
                raise bad(f"Unsupported message role: {role!r}.", f"messages.{i}.role",
                          "unsupported_role")
        return Rendered(out + ASSISTANT, False, False)
