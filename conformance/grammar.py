"""The engine-output grammar of ``spec/protocol.json`` (or another protocol.json given with
``--protocol-json``), read through ``colibri.protocol``, the one reader of the format; the
suite never keeps its own copy of the line formats.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from colibri.conformance.frames import BROKEN, PREAMBLE, Frame

from colibri.protocol import load_spec


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


def load_grammar(path: Path) -> Grammar:
    """The engine-output rules of a protocol.json, read by ``colibri.protocol``."""
    try:
        spec = load_spec(path)
    except FileNotFoundError as exc:
        raise GrammarError(f"protocol grammar not found: {path}") from exc
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{path} is not valid JSON: {exc}") from exc
    except (KeyError, TypeError, ValueError, re.error) as exc:
        raise GrammarError(f"{path} is not a protocol.json: {exc!r}") from exc
    rules = {
        kind: LineRule(kind, re.compile(line.regex.pattern.encode("utf-8"), re.DOTALL),
                       line.payload is not None)
        for kind, line in spec.engine_lines.items()
    }
    if not rules:
        raise GrammarError(f"{path} defines no engine output line with a regex")
    return Grammar(rules, str(path))
