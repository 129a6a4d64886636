"""Keep spec/protocol.json's derived parts and spec/protocol.md's tables in step with the
hand-edited spec/protocol.json.

spec/protocol.json is the source of truth of the wire protocols and is edited by hand. Two
things are derived from it so they can never disagree with it:

- each line kind's ``regex``, built from its ``fields`` grammar (an ``exact`` line is that
  text; a ``prefix`` comes before the kind), with the scalar regexes of ``types``;
- the tables of spec/protocol.md between ``<!-- generated: NAME ... -->`` and
  ``<!-- end generated: NAME -->``: CAPS keys, SUBMIT extensions, the validation order and
  the error codes.

    python tools/gen_protocol_json.py          # rewrite the regexes and the tables
    python tools/gen_protocol_json.py --check  # exit 1 if either is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "spec" / "protocol.json"
PROSE = ROOT / "spec" / "protocol.md"

Json = dict[str, Any]


def _escape(text: str) -> str:
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 else re.escape(c) for c in text)


def _item_regex(types: Json, item: Json, named: bool) -> str:
    """The regex of one grammar item, including the single space that precedes it."""
    if "literal" in item:
        return " " + str(item["literal"])
    if "type" in item:
        body = types[item["type"]]["regex"]
        return f" (?P<{item['name']}>{body})" if named else f" (?:{body})"
    if "optional" in item:
        return "(?:" + "".join(_item_regex(types, i, named) for i in item["optional"]) + ")?"
    inner = "".join(_item_regex(types, i, False) for i in item["fields"])
    count = item["repeat"]
    quant = f"{{{count}}}" if isinstance(count, int) else "*"
    return f"(?P<{item['name']}>(?:{inner}){quant})" if named else f"(?:{inner}){quant}"


def line_regex(types: Json, entry: Json) -> str:
    if "exact" in entry:
        return "^" + _escape(entry["exact"]) + "$"
    body = "".join(_item_regex(types, i, True) for i in entry["fields"])
    return "^" + _escape(entry.get("prefix", "")) + entry["kind"] + body + "$"


def derived(document: Json) -> Json:
    """The document with every line's regex rebuilt from its grammar."""
    for entry in document["lines"]:
        entry["regex"] = line_regex(document["types"], entry)
    return document


def source() -> Json:
    data: Json = json.loads(TARGET.read_text(encoding="utf-8"))
    return data


def render() -> str:
    """spec/protocol.json as it must be committed."""
    return json.dumps(derived(source()), indent=2, ensure_ascii=True) + "\n"


# --- the Markdown tables ---------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> str:
    def row(cells: list[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    return "\n".join([row(header), "|" + "|".join("---" for _ in header) + "|"]
                     + [row(r) for r in rows])


def _caps(doc: Json) -> str:
    return _table(["key", "meaning"], [[f"`{c['key']}`", c["meaning"]]
                                       for c in doc["capabilities"]])


def _extensions(doc: Json) -> str:
    return _table(["key", "values", "effect"],
                  [[f"`{e['key']}`", e["values"], e["meaning"]] for e in doc["extensions"]])


def _validation(doc: Json) -> str:
    return _table(["#", "check", "reply", "afterwards"],
                  [[str(v["step"]), v["check"], v["reply"], v["afterwards"]]
                   for v in doc["validation_order"]])


def _errors(doc: Json) -> str:
    rows = []
    for e in doc["errors"]:
        args = "`" + " ".join(f"<{a}>" for a in e["args"]) + "`" if e["args"] else ""
        rows.append([f"`{e['code']}`", args, e["meaning"]])
    return _table(["code", "args", "meaning"], rows)


TABLES: dict[str, Callable[[Json], str]] = {
    "caps": _caps,
    "extensions": _extensions,
    "validation-order": _validation,
    "errors": _errors,
}


def render_prose(text: str) -> str:
    """protocol.md with every generated table rewritten from protocol.json."""
    doc = source()
    for name, make in TABLES.items():
        pattern = re.compile(
            rf"(<!-- generated: {name} [^\n]*-->\n)(.*?)(<!-- end generated: {name} -->)", re.S
        )
        if pattern.search(text) is None:
            raise SystemExit(f"spec/protocol.md has no generated block {name!r}")
        match = pattern.search(text)
        assert match is not None
        text = text[: match.end(1)] + make(doc) + "\n" + text[match.start(3) :]
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if anything derived is stale")
    args = parser.parse_args()
    outputs = {TARGET: render(), PROSE: render_prose(PROSE.read_text(encoding="utf-8"))}
    stale = [p for p, text in outputs.items() if p.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run python tools/gen_protocol_json.py",
                  file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path], encoding="utf-8")
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
