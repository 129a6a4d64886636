"""Wire lines are spelled by the codec (colibri/protocol/records.py) and nowhere else: a
string that starts with a wire keyword and formats values into it (an f-string, %-format or
.format) is a hand-made frame."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("colibri", "server", "conformance")
CODEC = ROOT / "colibri" / "protocol"

#: Modules that still write frames by hand, each to move onto the codec; the test fails as
#: soon as one of them stops (so the list only shrinks) or another one starts.
NOT_YET_ON_THE_CODEC = frozenset({
    # Writes the serve_codec dialect's SUBMIT too (keys right after top_p, spec/protocol.md
    # 5.2), a shape our own engine refuses and the codec therefore does not spell.
    "conformance/prompts.py",
})


def _keywords() -> list[str]:
    document = json.loads((ROOT / "spec" / "protocol.json").read_text(encoding="utf-8"))
    return sorted(line["kind"] for line in document["lines"] if not line.get("exact"))


def hand_made_frames(text: str) -> list[str]:
    """String literals that spell a wire line with values in it: the keyword, then only
    placeholders, numbers, upper-case words and separators (a message such as
    ``f"EMAP has {n} fields"`` is prose, not a frame)."""
    kinds = "|".join(_keywords())
    literal = re.compile(rf"""\b([fFbB]{{0,2}})(["'])((?:\\x02)?(?:{kinds}) [^"'\n]*)\2(\s*%)?""")
    frame_body = re.compile(
        r"(?:[a-z_]+=(?:\{[^}!]*\}|[0-9]+)|\{[^}!]*\}|%[sdfgi]|[A-Z0-9_=.+\-]+|\s|\\n|\{\})*"
    )
    found = []
    for match in literal.finditer(text):
        prefix, body, percent = match.group(1).lower(), match.group(3), match.group(4)
        formats = "f" in prefix or (percent is not None and "%" in body) or "{}" in body
        rest = body.split(" ", 1)[1]
        if formats and frame_body.fullmatch(rest):
            found.append(match.group(0))
    return found


def test_the_pattern_sees_a_hand_made_frame() -> None:
    assert hand_made_frames('x = f"DONE {rid} STAT {n}"')
    assert hand_made_frames('x = b"STOP %d\\n" % rid')
    assert hand_made_frames('head = f"SUBMIT {rid} 0 {n} 4 0 1{ext}\\n"')
    assert not hand_made_frames('raise KeyError(f"CAPS keys not in spec: {unknown}")')
    assert not hand_made_frames('if kind == "DONE":')


def test_no_wire_keyword_is_formatted_by_hand_outside_the_codec() -> None:
    found = {
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if CODEC not in path.parents and hand_made_frames(path.read_text(encoding="utf-8"))
    }
    assert found == NOT_YET_ON_THE_CODEC
