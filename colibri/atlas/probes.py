"""The probe set (seed `c/tools/expert_atlas/probes.json`, shipped as package data)."""

from __future__ import annotations

import json
from pathlib import Path

from colibri.atlas.stats import AtlasError

DEFAULT = Path(__file__).with_name("probes.json")


def load_probes(path: Path | None = None) -> dict[str, list[str]]:
    """Categories -> prompts; keys starting with ``_`` are comments. Every category needs at
    least 2 prompts, or the replication gate has nothing to replicate across."""
    source = path or DEFAULT
    try:
        raw = json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise AtlasError(f"probes file {source} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise AtlasError(f"probes file {source} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise AtlasError(f"probes file {source} must be a JSON object of category -> prompts")
    probes: dict[str, list[str]] = {}
    for category, prompts in raw.items():
        if category.startswith("_"):
            continue
        if "/" in category or not category or category != category.strip():
            raise AtlasError(f"probes file {source}: category name {category!r} is not usable "
                             "in a file name")
        if not isinstance(prompts, list) or not all(isinstance(p, str) and p for p in prompts):
            raise AtlasError(f"probes file {source}: category {category!r} must be a list of "
                             "non-empty strings")
        if len(prompts) < 2:
            raise AtlasError(f"probes file {source}: category {category!r} has {len(prompts)} "
                             "prompt(s); the replication gate needs at least 2 per category")
        probes[category] = list(prompts)
    if len(probes) < 2:
        raise AtlasError(f"probes file {source} needs at least 2 categories")
    return probes
