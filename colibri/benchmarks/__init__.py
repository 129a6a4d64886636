"""Benchmark sections for ``colibri bench``: a registry other parts of colibri extend.

A section is a named measurement that prints as one JSON object inside the bench report. Each
module listed in ``SECTION_MODULES`` calls ``register(...)`` at import time; ``colibri bench``
imports them, selects sections by ``--section`` name or by ``--engine`` (a section lists the
engines it measures), runs them in order and prints one JSON document with every result side
by side. To add one: write a module with a ``run(options) -> dict`` function, call
``register`` at import, and add the module to ``SECTION_MODULES``.

What a new section builds on:

* ``workers.call("module:function", spec, what)``: a measurement in a fresh process (its own
  memory and threads, a deadline, another interpreter for a peer), JSON in and out;
* ``bandwidth``: the ceilings decode GB/s is held against (host copy, the kernels' read
  stream, a device copy), each well under a second, to take between rounds;
* ``decode_worker``: engines (reference, accelerated, a backend through the engine seam, HF
  transformers, llama.cpp) behind one interface, timed alone (``alone``) or taking turns with
  each other and with the probes (``turns``); ``decode`` turns their routes and seconds into
  weight bytes, tok/s and GB/s;
* ``stats``: medians, spreads and best-of timings; ``page_cache``: each timed file read back
  from disk once a run; ``bench_model``: the generated benchmark model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Modules that register bench sections, in report order.
SECTION_MODULES: tuple[str, ...] = (
    "colibri.benchmarks.decode_sections",
    "colibri.benchmarks.turn_sections",
    "colibri.benchmarks.quant_formats",
    "colibri.benchmarks.quant_kernels",
    "colibri.benchmarks.float_products",
    "colibri.benchmarks.engine_slots",
    "colibri.benchmarks.server_stream",
    "colibri.benchmarks.replicas",
    "colibri.benchmarks.control_plane_overhead",
    "colibri.benchmarks.grammar_mask",
    "colibri.benchmarks.default_model",
    "colibri.benchmarks.cuda_decode",
    "colibri.benchmarks.out_of_core",
    "colibri.benchmarks.cluster",
)


@dataclass(frozen=True)
class BenchOptions:
    """What the command line says about the run (sections read what they need)."""

    model: Path | None = None
    cache_dir: Path = Path.home() / ".cache" / "colibri" / "bench"
    tokens: int = 16
    warmup: int = 4
    batch: int = 4
    peers: bool = True  # also run peer engines (e.g. HF transformers) where installed
    # read the timed models back from disk into the page cache first (page_cache.py)
    refresh_page_cache: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    name: str
    engines: tuple[str, ...]
    description: str
    run: Callable[[BenchOptions], dict[str, Any]]


SECTIONS: dict[str, Section] = {}


def register(section: Section) -> None:
    if section.name in SECTIONS:
        raise ValueError(f"bench section {section.name!r} registered twice")
    SECTIONS[section.name] = section


def load_sections() -> dict[str, Section]:
    for module in SECTION_MODULES:
        importlib.import_module(module)
    return SECTIONS


def select(names: list[str], engines: list[str]) -> list[Section]:
    """Sections named in ``names``, else those measuring any of ``engines``, else all."""
    sections = load_sections()
    unknown = [n for n in names if n not in sections]
    if unknown:
        raise ValueError(
            f"unknown bench section(s): {', '.join(unknown)} (known: {', '.join(sections)})"
        )
    known_engines = sorted({e for s in sections.values() for e in s.engines})
    bad = [e for e in engines if e not in known_engines]
    if bad:
        raise ValueError(
            f"unknown engine(s): {', '.join(bad)} (known: {', '.join(known_engines)})"
        )
    chosen = [s for s in sections.values() if s.name in names] if names else list(sections.values())
    if engines:
        chosen = [s for s in chosen if set(s.engines) & set(engines)]
    return chosen
