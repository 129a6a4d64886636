"""Example prompts a model ships (``examples.json`` in its folder), and its shipped atlas.

One file is the source of truth for what a newcomer is offered to try: the dashboard reads it
as ``GET /examples.json`` (spec/http.md §10), ``colibri chat`` prints it at start, and the
README quotes it. A model without the file offers nothing rather than prompts it may answer
wrongly.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from colibri.atlas.analyze import SPECIALIST_AT

JSON = dict[str, Any]

#: The file in a model's folder.
EXAMPLES_FILE = "examples.json"
#: What the analysis `colibri atlas analyze --out` wrote for a model, shipped beside it.
SHIPPED_ATLAS_FILE = "atlas_analysis.json"
#: `GET /examples.json` for a model that ships none.
NO_EXAMPLES: JSON = {"chat": [], "systemone": None}


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def load(model_dir: str | Path | None) -> JSON:
    """The model's examples in the served shape (chat prompts, one System One question), or
    :data:`NO_EXAMPLES` when the model ships none or the file does not read as examples."""
    if model_dir is None:
        return dict(NO_EXAMPLES)
    try:
        doc = json.loads((Path(model_dir) / EXAMPLES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return dict(NO_EXAMPLES)
    if not isinstance(doc, dict):
        return dict(NO_EXAMPLES)
    chat = [{"prompt": e["prompt"], "skill": e.get("skill") if _text(e.get("skill")) else None}
            for e in doc.get("chat") or [] if isinstance(e, dict) and _text(e.get("prompt"))]
    s1 = doc.get("systemone")
    systemone = None
    if (isinstance(s1, dict) and isinstance(s1.get("state", ""), str) and _text(s1.get("question"))
            and isinstance(s1.get("options"), list) and len(s1["options"]) >= 2
            and all(_text(o) for o in s1["options"])):
        systemone = {"state": s1.get("state", ""), "question": s1["question"],
                     "options": list(s1["options"])}
    return {"chat": chat, "systemone": systemone}


def shipped_atlas(model_dir: str | Path | None) -> JSON | None:
    """The atlas analysis shipped with the model (``--out`` shape, a list of records) in the
    dashboard's shape, labelled as ``colibri atlas analyze --web`` labels it; None without
    one."""
    if model_dir is None:
        return None
    try:
        doc = json.loads((Path(model_dir) / SHIPPED_ATLAS_FILE).read_text(encoding="utf-8"))
        categories = [str(c) for c in doc["categories"]]
        experts: JSON = {}
        for r in doc["experts"]:
            affinity = {str(c): float(p) for c, p in r["p"].items() if p > 0}
            entropy = round(-sum(p * math.log2(p) for p in affinity.values()), 2)
            label = (f"specialist: {r['top_topic']}" if r["spec"] >= SPECIALIST_AT
                     else "generalist")
            experts[f"{int(r['layer'])}:{int(r['expert'])}"] = {
                "affinity": affinity, "entropy": entropy, "top": str(r["top_topic"]),
                "label": label}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {"categories": categories, "experts": experts} if experts else None


def try_line(served: JSON) -> str | None:
    """The line `colibri chat` prints at start: the chat prompts to try, or None."""
    prompts = [str(e["prompt"]) for e in served.get("chat") or []
               if isinstance(e, dict) and _text(e.get("prompt"))]
    return "[try: " + " · ".join(prompts) + "]" if prompts else None


def fetch(url: str) -> JSON:
    """``GET /examples.json`` of a running server; :data:`NO_EXAMPLES` when it has none or
    does not answer one (an older server, another implementation)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/examples.json", timeout=10) as reply:
            doc = json.load(reply)
    except (OSError, ValueError):
        return dict(NO_EXAMPLES)
    return doc if isinstance(doc, dict) else dict(NO_EXAMPLES)
