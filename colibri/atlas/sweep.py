"""sweep: one engine process per probe, each leaving a STATS dump (seed README, the four traps).

Controls, applied to every run: a fresh engine with ``COLI_PERSIST=0`` (no `.coli_usage`
history is loaded, so the dump is this run only, and nothing of the user's is touched),
``DRAFT=0``/``MTP=0`` (rejected speculative drafts would be counted), ``TOPP=0`` for engines
that prune experts by cumulative probability (the reference router never prunes), greedy
decoding, CPU routing (``--gpu none`` for colibri's engine is the caller's engine command).
Autocorrelation within a run is analyze's replication gate, not the sweep's.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from colibri.atlas.stats import AtlasError, read_dump
from colibri.protocol.records import Submit, SubmitRequest
from colibri.text.chat_format import chat_prompt

CONTROLS = {"COLI_PERSIST": "0", "DRAFT": "0", "MTP": "0", "TOPP": "0"}


@dataclass(frozen=True)
class Probe:
    category: str
    index: int
    prompt: str

    @property
    def name(self) -> str:
        return f"{self.category}_{self.index}"


def plan(probes: Mapping[str, list[str]]) -> list[Probe]:
    return [Probe(c, i, p) for c, prompts in probes.items() for i, p in enumerate(prompts)]


def submit_script(prompt: str, max_tokens: int) -> bytes:
    """One greedy SUBMIT of the chat-rendered probe, then EOF (the engine finishes and dumps)."""
    payload = chat_prompt(prompt).encode("utf-8")
    return Submit(1, SubmitRequest(0, payload, max_tokens, 0.0, 1.0)).encode()


def engine_command(model: Path | None, engine_cmd: str | None) -> list[str]:
    if engine_cmd:
        return shlex.split(engine_cmd)
    argv = [sys.executable, "-m", "colibri", "engine"]
    return argv + (["--model", str(model)] if model is not None else [])


def run_probe(probe: Probe, out: Path, argv: list[str], max_tokens: int,
              env: Mapping[str, str], timeout: float) -> Path:
    target = out / f"{probe.name}.txt"
    target.unlink(missing_ok=True)
    full = {**env, **CONTROLS, "STATS": str(target)}
    try:
        done = subprocess.run(argv, input=submit_script(probe.prompt, max_tokens),
                              capture_output=True, env=full, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AtlasError(f"probe {probe.name}: the engine did not run: {exc}") from exc
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise AtlasError(f"probe {probe.name}: the engine exited {done.returncode}: "
                         + " | ".join(tail))
    if b"\nDONE 1 STAT " not in done.stdout:
        raise AtlasError(f"probe {probe.name}: the engine did not finish the request")
    if not target.exists():
        raise AtlasError(f"probe {probe.name}: the engine wrote no STATS dump (does it honour "
                         "STATS=<path>?)")
    read_dump(target)  # a corrupt dump fails here, naming the file
    return target


def sweep(probes: Mapping[str, list[str]], out: Path, *, model: Path | None = None,
          engine_cmd: str | None = None, max_tokens: int = 32, timeout: float = 600.0,
          env: Mapping[str, str] | None = None,
          progress: Callable[[Probe], None] | None = None) -> list[Path]:
    """Run every probe; ``progress`` is called after each (the CLI renders a bar)."""
    out.mkdir(parents=True, exist_ok=True)
    argv = engine_command(model, engine_cmd)
    base = dict(os.environ if env is None else env)
    written = []
    for probe in plan(probes):
        written.append(run_probe(probe, out, argv, max_tokens, base, timeout))
        if progress is not None:
            progress(probe)
    return written
