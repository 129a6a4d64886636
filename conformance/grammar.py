"""The engine-output grammar, loaded from ``spec/protocol.json``.

protocol.json is the single machine-readable description of the wire; the suite never
keeps its own copy of the line formats. The loader accepts the entry shapes protocol.json
uses (a mapping or a list of entries, each naming its kind and a regular expression for the
header line) and keeps only engine-to-server lines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri.conformance.frames import BROKEN, PREAMBLE, Frame

_REGEX_KEYS = ("regex", "pattern", "header_regex", "line_regex", "grammar")
_KIND_KEYS = ("kind", "name", "frame", "line")
_INBOUND = {
    "server",
    "request",
    "requests",
    "in",
    "inbound",
    "server_to_engine",
    "server->engine",
    "to_engine",
}


class GrammarError(ValueError):
    """protocol.json is missing or has no usable line grammar."""


@dataclass(frozen=True)
class LineRule:
    kind: str
    regex: re.Pattern[bytes]
    payload: bool


@dataclass(frozen=True)
class Grammar:
    rules: dict[str, LineRule]
    source: str

    def check(self, frame: Frame) -> str | None:
        """A problem description, or None when the frame is well-formed.

        Unknown kinds are allowed: forward compatibility is a protocol rule, so an engine may
        add telemetry lines. Preamble lines before READY are free-form.
        """
        if frame.kind == BROKEN:
            return frame.problem or "broken framing"
        if frame.problem:
            return frame.problem
        if frame.kind == PREAMBLE:
            return None
        rule = self.rules.get(frame.kind)
        if rule is None:
            return None
        if rule.regex.fullmatch(frame.header) is None:
            return f"{frame.kind} line does not match protocol.json: {frame.describe()!r}"
        return None


def _entries(document: Any) -> list[tuple[str, dict[str, Any]]]:
    """(kind, entry) pairs from whichever container layout protocol.json uses."""
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(node: Any, inherited_direction: str | None, key_hint: str | None) -> None:
        if isinstance(node, dict):
            direction = node.get("direction", inherited_direction)
            if any(k in node for k in _REGEX_KEYS) and isinstance(
                next((node[k] for k in _REGEX_KEYS if k in node), None), str
            ):
                kind = next((node[k] for k in _KIND_KEYS if isinstance(node.get(k), str)), key_hint)
                if kind and str(direction or "").lower() not in _INBOUND:
                    found.append((kind, node))
                return
            for key, value in node.items():
                next_direction = direction
                if key.lower() in _INBOUND:
                    next_direction = key
                walk(value, next_direction, key if isinstance(value, dict) else key_hint)
        elif isinstance(node, list):
            for item in node:
                walk(item, inherited_direction, key_hint)

    walk(document, None, None)
    return found


def load_grammar(path: Path) -> Grammar:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise GrammarError(f"protocol grammar not found: {path}") from exc
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{path} is not valid JSON: {exc}") from exc
    rules: dict[str, LineRule] = {}
    for kind, entry in _entries(document):
        pattern = next(entry[k] for k in _REGEX_KEYS if isinstance(entry.get(k), str))
        try:
            regex = re.compile(pattern.encode("utf-8"), re.DOTALL)
        except re.error as exc:
            raise GrammarError(f"{path}: bad regex for {kind}: {exc}") from exc
        payload = bool(entry.get("payload") or entry.get("payload_framed"))
        word = kind.split()[0].upper() if kind.split() else kind
        rules.setdefault(word, LineRule(word, regex, payload))
    if not rules:
        raise GrammarError(f"{path} defines no engine output line with a regex")
    return Grammar(rules, str(path))
