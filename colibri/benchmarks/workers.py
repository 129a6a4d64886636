"""The one way a bench section runs a measurement in a process of its own.

Why a process: one engine's memory, threads and faulted-in pages must not colour the next
one's numbers, a hung measurement must cost only its deadline, and a peer engine (HF
transformers, llama.cpp) may live in another interpreter (``--peer-python``).

A measurement is a function of keyword arguments that returns a JSON-able dict, named
``"module:function"`` for a module of this folder. ``call`` runs it in a fresh interpreter
(this file as a script), which prints the result as its last stdout line::

    raw = call("bandwidth:device_copy", {"gib": 1.0}, "copy", timeout_s=60)
    if "error" in raw:
        ...  # the function raised or said so, the process failed, or it ran out of time

This file imports only the standard library at the top, so an interpreter without colibri (a
peer's) runs it too: it then loads the named module from this folder by path, and that module
must import only what the interpreter has (``decode_worker`` does).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import traceback
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_worker(argv: list[str], what: str, *, timeout_s: float | None = None,
               env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv`` (``env`` added to this process's environment); its last stdout line is
    its JSON result. A failure gives the worker's own ``error`` where it
    printed one, else ``"<what> failed (exit N): <last stderr line>"``, with ``stderr_tail``;
    a hang past ``timeout_s`` gives ``{"error": "timed out after T s", "timed_out": True}``."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False,
                              timeout=timeout_s, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        raw = exc.stderr or b""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        return {"error": f"timed out after {timeout_s:g} s", "timed_out": True,
                "stderr_tail": text.strip().splitlines()[-5:]}
    lines = proc.stdout.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    except ValueError:
        result = {}
    if proc.returncode != 0 or not result:
        tail = proc.stderr.strip().splitlines()[-8:]
        last = f": {tail[-1]}" if tail else ""
        return {**result, "error": result.get("error")
                or f"{what} failed (exit {proc.returncode}){last}",
                "stderr_tail": tail}
    return result


def call(function: str, spec: Mapping[str, Any], what: str, *, python: str | None = None,
         timeout_s: float | None = None, env: Mapping[str, str] | None = None,
         wrap: Callable[[list[str]], list[str]] | None = None) -> dict[str, Any]:
    """``module:function(**spec)`` in a fresh ``python`` (default: this interpreter);
    ``wrap`` turns the command line into another that runs it (e.g. inside a memory
    cgroup: ``MemoryCgroup.command``)."""
    argv = [python or sys.executable, str(HERE / "workers.py"), "--call", function,
            "--spec", json.dumps(spec)]
    return run_worker(wrap(argv) if wrap else argv, what, timeout_s=timeout_s, env=env)


def importable(python: str, *modules: str) -> bool:
    """Whether ``python`` imports every one of ``modules`` (a peer engine's packages)."""
    probe = subprocess.run([python, "-c", f"import {', '.join(modules)}"], capture_output=True,
                           check=False)
    return probe.returncode == 0


def _resolve(function: str) -> Callable[..., dict[str, Any]]:
    module_name, _, name = function.partition(":")
    try:
        module = importlib.import_module(f"colibri.benchmarks.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("colibri", "colibri.benchmarks"):
            raise
        module = _load_beside(module_name)
    found: Callable[..., dict[str, Any]] = getattr(module, name)
    return found


def _load_beside(module_name: str) -> types.ModuleType:
    """A module of this folder in a peer's interpreter, which has no colibri: ``colibri`` and
    ``colibri.benchmarks`` stand in as bare packages over this checkout's folders (their
    ``__init__`` never runs: it imports what a peer lacks), so the module's own imports of
    the standard-library-only files beside it (``process_memory``) resolve to those files."""
    for name, folder in (("colibri", HERE.parent), ("colibri.benchmarks", HERE)):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(folder)]
            sys.modules[name] = package
    return importlib.import_module(f"colibri.benchmarks.{module_name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run one bench measurement (internal)")
    parser.add_argument("--call", required=True, help="module:function of this folder")
    parser.add_argument("--spec", default="{}", help="its keyword arguments, as JSON")
    args = parser.parse_args(argv)
    try:
        result = _resolve(args.call)(**json.loads(args.spec))
    except Exception as exc:  # noqa: BLE001 - the parent reports any failure as the result
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    # Run as a script, this folder heads sys.path; its files must not shadow top-level modules.
    if sys.path and Path(sys.path[0]).resolve() == HERE:
        sys.path.pop(0)
    sys.exit(main())
