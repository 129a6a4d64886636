"""A bench measurement that a peer engine's interpreter runs (``--peer-python``: one with
llama.cpp or transformers and no colibri) loads there: its module and the
standard-library-only files it imports from beside it."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import numpy as np

from colibri.benchmarks import workers


def _interpreter_without_colibri(tmp_path: Path) -> str:
    """This interpreter without its site hooks (the editable install of colibri is one),
    numpy still on its path: a peer's interpreter as the bench meets it."""
    site = Path(np.__file__).resolve().parent.parent
    script = tmp_path / "peer-python"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" -S "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    probe = subprocess.run([str(script), "-c", "import colibri"], capture_output=True,
                           text=True, check=False, cwd=tmp_path)  # (not the checkout's root)
    assert "No module named 'colibri'" in probe.stderr, probe.stderr
    return str(script)


def test_a_peer_measurement_loads_in_an_interpreter_without_colibri(tmp_path: Path) -> None:
    python = _interpreter_without_colibri(tmp_path)
    prompt = workers.call("decode_worker:prefill_prompt", {"vocab_size": 64}, "prompt",
                          python=python)
    assert isinstance(prompt, list) and prompt  # type: ignore[unreachable]


def test_the_llama_cpp_worker_gets_as_far_as_llama_cpp_itself(tmp_path: Path) -> None:
    python = _interpreter_without_colibri(tmp_path)
    got = workers.call("out_of_core_llama:decode", {"gguf": str(tmp_path / "none.gguf")},
                       "llama.cpp", python=python)
    assert "llama_cpp" in got["error"] and "colibri" not in got["error"], got
