"""analyze: per-expert topic distributions from STATS dumps (seed README "Method"; the exact
steps of colibri's analyze.py, notes/colibri-tools.md §1.4).

For each expert seen: ``total`` selections over all runs (dropped below ``min_count``); per
category the mean over its runs of the expert's share of that run's selections (a run where
it did not fire counts 0: category-size normalisation, since prefill routes the prompt too);
``p(c|e)`` = those means renormalised (base-rate corrected); the top category needs the
expert to fire in ``min_runs`` of its runs (the replication gate: routing inside one run is
autocorrelated, so a run is one observation); ``spec = 1 − H(p)/ln C``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from colibri.atlas.stats import AtlasError, Key, Run, by_category

SPECIALIST_AT = 0.5


@dataclass
class Analysis:
    categories: list[str]
    runs_per_category: dict[str, int]
    seen: int
    dropped_sparse: int = 0
    dropped_unreplicated: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def specialists(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["spec"] >= SPECIALIST_AT]


def analyze(runs: list[Run], min_count: int = 30, min_runs: int = 2) -> Analysis:
    groups = by_category(runs)
    cats = list(groups)
    if len(cats) < 2:
        raise AtlasError(f"the stats hold {len(cats)} category; the atlas needs at least 2")
    log_c = math.log(len(cats))
    totals = {run.name: run.total for run in runs}
    keys: set[Key] = set()
    for run in runs:
        keys.update(run.counts)
    out = Analysis(cats, {c: len(groups[c]) for c in cats}, len(keys))
    for key in sorted(keys):
        total = sum(run.counts.get(key, 0) for run in runs)
        if total < min_count:
            out.dropped_sparse += 1
            continue
        mean_share: dict[str, float] = {}
        fired: dict[str, int] = {}
        for c in cats:
            shares = [run.counts.get(key, 0) / max(1, totals[run.name]) for run in groups[c]]
            mean_share[c] = sum(shares) / len(shares)
            fired[c] = sum(1 for run in groups[c] if run.counts.get(key, 0) > 0)
        s = sum(mean_share.values())
        if s <= 0:
            continue
        p = {c: mean_share[c] / s for c in cats}
        top = max(cats, key=lambda c: p[c])  # first in sorted order on ties
        if fired[top] < min_runs:
            out.dropped_unreplicated += 1
            continue
        h = -sum(v * math.log(v) for v in p.values() if v > 0)
        out.records.append({
            "layer": key[0], "expert": key[1], "total": total,
            "spec": round(1 - h / log_c, 4), "top_topic": top,
            "top_lift": round(p[top] * len(cats), 2),
            "reliability": f"{fired[top]}/{len(groups[top])}",
            "p": {c: round(p[c], 4) for c in cats},
        })
    out.records.sort(key=lambda r: (-r["spec"], -r["total"]))
    return out


def full_document(result: Analysis) -> dict[str, Any]:
    """``--out``: the records as a list."""
    return {"categories": result.categories, "experts": result.records}


def web_document(result: Analysis) -> dict[str, Any]:
    """``--web``: the dashboard's experts.json, keyed "layer:expert" in atlas order."""
    experts: dict[str, Any] = {}
    for r in result.records:
        affinity = {c: v for c, v in r["p"].items() if v > 0}
        entropy = round(-sum(v * math.log2(v) for v in affinity.values()), 2)
        label = f"specialist: {r['top_topic']}" if r["spec"] >= SPECIALIST_AT else "generalist"
        experts[f"{r['layer']}:{r['expert']}"] = {"affinity": affinity, "entropy": entropy,
                                                  "top": r["top_topic"], "label": label}
    return {"categories": result.categories, "experts": experts}


def report(result: Analysis, say: Callable[[str], None]) -> None:
    """colibri's stdout, in its order."""
    say(f"categories ({len(result.categories)}): "
        + ", ".join(f"{c}[{result.runs_per_category[c]}]" for c in result.categories))
    say(f"experts seen: {result.seen}")
    kept = len(result.records)
    say(f"dropped {result.dropped_sparse} sparse (<min_count sel), dropped "
        f"{result.dropped_unreplicated} UNREPLICATED (top topic fired in < min_runs prompts), "
        f"kept {kept}")
    say(f"{'layer':>5} {'exp':>4} {'sel':>6} {'spec':>6} {'lift':>5} {'repl':>5}  topic")
    for r in result.records[:20]:
        say(f"{r['layer']:>5} {r['expert']:>4} {r['total']:>6} {r['spec']:>6.3f} "
            f"{r['top_lift']:>5.2f} {r['reliability']:>5}  {r['top_topic']}")
    layers = sorted({r["layer"] for r in result.records})
    if layers:
        say("specialisation vs depth (mean spec):")
        for layer in layers[:: max(1, len(layers) // 13)]:
            xs = [r["spec"] for r in result.records if r["layer"] == layer]
            mean = sum(xs) / len(xs)
            say(f"  L{layer:<3} {mean:.3f} {'#' * int(60 * mean)}")
    owned: dict[str, int] = {}
    for r in result.records:
        owned[r["top_topic"]] = owned.get(r["top_topic"], 0) + 1
    say("experts owned per topic:")
    for topic, n in sorted(owned.items(), key=lambda kv: -kv[1]):
        say(f"  {topic:<14} {n}")
    strong = len(result.specialists)
    pct = 100.0 * strong / kept if kept else 0.0
    say(f"strong specialists (spec >= {SPECIALIST_AT}, replicated): {strong} / {kept} "
        f"({pct:.1f}%)")
