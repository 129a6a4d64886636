"""Shared inputs of the constrained-decoding tests: a chat prompt for the embedded default
model (random weights) and a bounded JSON Schema, so every reply ends inside its budget."""

from __future__ import annotations

from typing import Any

PROMPT = b"[gMASK]<sop><|user|>Describe a person.<|assistant|><think></think>"
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
