"""The model family the server speaks for: its chat template, the id it serves the model
under, and the seed's per-family rules (seeds/api.md, "Tool-calling support" and the
Anthropic section): whether active tools are rendered or refused with HTTP 400, whether the
family has a reasoning block or thinking is forced off, and which role markers end a reply.

The family is read from the served model's ``config.json`` (``model_type``); the OLMoE
template takes its ``bos_token`` and ``eos_token`` from the model's ``tokenizer_config.json``,
the values transformers hands the model's own Jinja template.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from colibri.server import validation as v
from colibri.server.errors import bad
from colibri.server.olmoe_template import OlmoeTemplate
from colibri.server.qwen_template import QwenTemplate
from colibri.server.qwen_toolcalls import parse_qwen_answer
from colibri.server.stops import GLM_IMPLICIT_STOPS
from colibri.server.template import GlmTemplate, Rendered
from colibri.server.toolcalls import ParsedAnswer, parse_answer

JSON = dict[str, Any]


class ChatFamilyError(ValueError):
    """The model directory names no family this server can render prompts for."""


class ChatTemplate(Protocol):
    def continues(self, messages: list[Any], body: JSON) -> bool:
        """Whether a trailing assistant turn is continued; raises the family's refusals."""
        ...

    def render(self, messages: list[Any], *, thinking: bool, effort: str | None,
               tools: v.ToolSpec | None, continued: bool) -> Rendered: ...


@dataclass(frozen=True)
class ChatFamily:
    #: How messages and ``/v1/models`` name the family.
    name: str
    #: The id a checkpoint of the family is served under when ``--model-id`` is not given.
    model_id: str
    template: ChatTemplate
    #: Active tools are rendered into the prompt; else they are refused (HTTP 400).
    tool_calls: bool
    #: The family has a reasoning block; else thinking is off whatever the request asks.
    reasoning: bool
    #: What ends a chat reply when the client sends no ``stop``.
    implicit_stops: tuple[str, ...]
    #: Reads the reply's tool calls in the family's native form (``(text, tools,
    #: length_limited)``); GLM's unless the family writes its own.
    parse_calls: Callable[[str, v.ToolSpec, bool], ParsedAnswer] = parse_answer
    #: ``strict_tool_calls`` is GLM's alone (notes: colibri-http.md §4.1 step 1).
    strict_tools: bool = False

    def thinking(self, requested: bool) -> bool:
        return requested and self.reasoning

    def check_strict(self, strict: bool) -> None:
        """colibri's wording and place (notes: colibri-http.md §4.1 step 1)."""
        if strict and not self.strict_tools:
            raise bad("`strict_tool_calls` currently supports GLM only.", "strict_tool_calls",
                      "unsupported_parameter")

    def check_tools(self, body: JSON) -> None:
        """A family without a tool format answers active tool declarations and choices with
        400 rather than accept them and ignore them (seeds/api.md). ``tool_choice: "none"``
        makes declared tools inactive, so such a request is served without them."""
        if self.tool_calls:
            return
        choice = body.get("tool_choice")
        if v.validate_tools(body) and choice != "none":
            param = "tools"
        elif choice not in (None, "none"):
            param = "tool_choice"
        else:
            return
        family = self.name
        raise bad(f"The {family} engine does not support tool calling: active `tools` and "
                  "`tool_choice` are refused (send none, or `tool_choice: \"none\"`).", param,
                  "unsupported_parameter")


#: colibri's gateway id for a GLM-5 checkpoint (seeds/api.md).
GLM = ChatFamily(name="GLM-5", model_id="glm-5.2-colibri", template=GlmTemplate(),
                 tool_calls=True, reasoning=True, implicit_stops=GLM_IMPLICIT_STOPS,
                 strict_tools=True)

#: Qwen3-MoE: native ``<tool_call>`` blocks and a reasoning block (seeds/api.md, the Qwen
#: rows); a reply ends at ``<|im_end|>``, the end-of-turn token the engine stops on, so no
#: role marker is an implicit stop (spec/DEVIATIONS.md).
QWEN3_MOE = ChatFamily(name="Qwen3-MoE", model_id="qwen3-moe-colibri", template=QwenTemplate(),
                       tool_calls=True, reasoning=True, implicit_stops=(),
                       parse_calls=parse_qwen_answer)

#: The families whose template is GLM-5's: DeepSeek-V3 fixtures share GLM's tokenizer here.
GLM_MODEL_TYPES = ("glm_moe_dsa", "deepseek_v3")


def olmoe(bos: str, eos: str) -> ChatFamily:
    """OLMoE: no tool format, no reasoning block (seeds/api.md); a reply ends at the
    end-of-text token the engine stops on, so no role marker is an implicit stop."""
    return ChatFamily(name="OLMoE", model_id="olmoe-colibri", template=OlmoeTemplate(bos, eos),
                      tool_calls=False, reasoning=False, implicit_stops=())


def _read_json(path: Path) -> JSON:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ChatFamilyError(f"cannot read {path}: {exc}") from None
    if not isinstance(document, dict):
        raise ChatFamilyError(f"{path} is not a JSON object")
    return document


def _token_text(config: JSON, key: str, path: Path) -> str:
    """A special token as tokenizer_config.json spells it: a string, or an added-token
    object with its ``content``."""
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str):
        raise ChatFamilyError(f"{path} has no string `{key}`, which the chat template writes")
    return value


def family_for_model(model_dir: Path) -> ChatFamily:
    """The chat family of the model in ``model_dir``. A folder without ``config.json`` (an
    ``--engine-cmd`` that finds its model elsewhere) is served as GLM-5, the gateway's own
    family; a ``model_type`` with no template here is refused by name."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        return GLM
    model_type = _read_json(config_path).get("model_type")
    if model_type in GLM_MODEL_TYPES:
        return GLM
    if model_type == "olmoe":
        tokenizer_path = model_dir / "tokenizer_config.json"
        tokenizer = _read_json(tokenizer_path)
        return olmoe(_token_text(tokenizer, "bos_token", tokenizer_path),
                     _token_text(tokenizer, "eos_token", tokenizer_path))
    if model_type == "qwen3_moe":
        return QWEN3_MOE
    known = ", ".join((*GLM_MODEL_TYPES, "olmoe", "qwen3_moe"))
    raise ChatFamilyError(f"{config_path}: model_type {model_type!r} has no chat template in "
                          f"the server (it renders {known})")
