"""Turning a case's prompt into SUBMIT payload bytes for the model under test.

A model with a tokenizer gets the text itself. A model without one (such as the
``glm5-tiny`` fixture) is driven with the ``ids=1`` extension: the payload is decimal token
ids. Texts are mapped to ids byte by byte, so a text that extends another still extends it
as ids, which keeps prefix-reuse cases meaningful in both modes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


class PromptError(ValueError):
    pass


@dataclass(frozen=True)
class Payload:
    data: bytes
    #: Token count when the suite knows it (ids payloads), else None.
    tokens: int | None
    ids: bool


@dataclass(frozen=True)
class PromptCodec:
    ids_mode: bool
    vocab: int
    oracle: dict[str, Any]
    #: End-of-sequence ids (config.json / generation_config.json): an engine stops there.
    eos_ids: frozenset[int] = frozenset()
    model_dir: Path | None = None
    #: Byte-level mode (conformance/byte_tokenizer.py): entry i is the byte token i is
    #: spelled with; payloads are text, one token per byte.
    byte_of: tuple[int, ...] | None = None

    @classmethod
    def for_model(cls, model_dir: Path | None, mode: str = "auto") -> PromptCodec:
        vocab = 256
        oracle: dict[str, Any] = {}
        has_tokenizer = False
        eos: set[int] = set()
        if model_dir is not None:
            for name in ("config.json", "generation_config.json"):
                path = model_dir / name
                if not path.is_file():
                    continue
                document = json.loads(path.read_text())
                if name == "config.json":
                    vocab = int(document.get("vocab_size", vocab))
                value = document.get("eos_token_id")
                eos.update([value] if isinstance(value, int) else value or [])
            oracle_file = model_dir / "oracle.json"
            if oracle_file.is_file():
                loaded = json.loads(oracle_file.read_text())
                oracle = loaded if isinstance(loaded, dict) else {}
            has_tokenizer = (model_dir / "tokenizer.json").is_file()
        ids_mode = {"ids": True, "text": False}.get(mode, not has_tokenizer)
        if vocab < 4:
            raise PromptError(f"vocabulary of {vocab} tokens is too small to build prompts")
        return cls(ids_mode, vocab, oracle, frozenset(int(v) for v in eos), model_dir)

    def with_bytes(self, byte_of: tuple[int, ...], model_dir: Path) -> PromptCodec:
        """The same model driven through a byte-level tokenizer living in model_dir."""
        return replace(self, ids_mode=False, byte_of=byte_of, model_dir=model_dir)

    def spell(self, ids: list[int]) -> bytes:
        """The bytes of token ids under the byte-level tokenizer."""
        if self.byte_of is None:
            raise PromptError("only a byte-level codec spells token ids as bytes")
        return bytes(self.byte_of[i] for i in ids)

    def text_ids(self, text: str) -> list[int]:
        # Stay clear of id 0 and the top of the vocabulary, where special tokens usually sit.
        span = min(self.vocab - 2, 250)
        return [1 + byte % span for byte in text.encode("utf-8")]

    def oracle_ids(self, key: str) -> list[int]:
        value = self.oracle.get(key)
        if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
            raise PromptError(f"oracle.json has no token-id list {key!r}")
        return [int(v) for v in value]

    def encode(self, prompt: Any) -> Payload:
        if isinstance(prompt, dict) and ("ids" in prompt or "oracle" in prompt):
            ids = (
                [int(v) for v in prompt["ids"]]
                if "ids" in prompt
                else self.oracle_ids(str(prompt["oracle"]))
            )
            if self.byte_of is not None:
                return Payload(self.spell(ids), len(ids), False)
            return Payload(" ".join(map(str, ids)).encode(), len(ids), True)
        if not isinstance(prompt, str):
            raise PromptError(f"unsupported prompt {prompt!r}")
        if self.byte_of is not None:
            data = prompt.encode("utf-8")
            return Payload(data, len(data), False)
        if self.ids_mode:
            ids = self.text_ids(prompt)
            return Payload(" ".join(map(str, ids)).encode(), len(ids), True)
        return Payload(prompt.encode("utf-8"), None, False)


def submit_frame(
    request_id: int | str,
    slot: int,
    payload: Payload,
    max_tokens: int,
    temperature: float,
    top_p: float,
    ext: dict[str, int],
    grammar: bytes = b"",
    *,
    keys_after_top_p: bool = False,
) -> bytes:
    """The SUBMIT header, payload and grammar bytes of one request (spec/protocol.md 2.3);
    an ids payload adds ``ids=1`` unless ``ext`` says otherwise. ``keys_after_top_p``: the
    serve_codec dialect's shape (§5.2), keys right after top_p and no grammar section."""
    ext = dict(ext)
    if payload.ids:
        ext.setdefault("ids", 1)
    header = (
        f"SUBMIT {request_id} {slot} {len(payload.data)} {max_tokens} "
        f"{temperature:.8g} {top_p:.8g}"
    )
    keys = "".join(f" {k}={v}" for k, v in ext.items())
    if keys_after_top_p:
        # A field 8 without '=' is extension_bytes there, which most family engines refuse.
        header += keys
    elif ext or grammar:
        # colibri's GLM parser only takes key=value tokens after an explicit gbytes field.
        header += f" {len(grammar)}" + keys
    return header.encode() + b"\n" + payload.data + grammar + b"\n"
