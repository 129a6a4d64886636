"""tools/llama_cpp_engine.py, llama.cpp behind the mux protocol for the golden cases: its
logprob tables are colibri's (slot order, float64 log-softmax), its SUBMIT framing follows
spec/protocol.md §2.2, and, where a llama.cpp interpreter is at hand, it passes the golden
cases on glm5-chat-tiny (docs/model-families.md, "llama.cpp on the golden cases").

The live test needs ``COLIBRI_PEER_PYTHON`` (an interpreter with llama-cpp-python, torch and
transformers, as for ``colibri bench``'s llama.cpp peer) and ``COLIBRI_LLAMA_SDIST`` (the
llama-cpp-python sdist whose converter writes the GGUF); it is skipped without them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import PASS, SKIP
from colibri.conformance.protocol_target import protocol_runner
from colibri.conformance.runner import run_parallel

from colibri.engine.sampling import logprob_entry
from colibri.resources import fixture_model_dir

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "llama_cpp_engine.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llama_cpp_engine", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("k", [1, 3, 8])
def test_the_logprob_tail_is_colibris(k: int) -> None:
    """Same ids in the same slot order and the same values as the reference engine's
    table, ties included (rows drawn from a few values)."""
    tool = load_tool()
    rng = np.random.default_rng(k)
    for _ in range(20):
        row = rng.choice([-1.5, 0.0, 0.25, 2.0], size=40).astype(np.float32)
        token = int(rng.integers(40))
        entry = logprob_entry(row, token, k)
        expected = f" {entry.logprob:.6f} {k}" + "".join(f" {i} {lp:.6f}" for i, lp in entry.top)
        assert tool.tail(row, token, k) == expected


def test_submit_headers_are_framed_as_the_protocol_says() -> None:
    tool = load_tool()
    assert tool.submit_header(b"SUBMIT 1 0 5 16 0 1 0 logprobs=2 ids=1") == (
        [1, 0, 5, 16], 0.0, 1.0, 0, {"logprobs": 2, "ids": 1})
    assert tool.submit_header(b"SUBMIT 1 0 5 16 0 1 ids=1") == (
        [1, 0, 5, 16], 0.0, 1.0, 0, {"ids": 1})  # serve_codec's form: no gbytes
    assert tool.submit_header(b"SUBMIT 1 0 5 16 0 1 bogus=1")[4]["invalid"] == 1
    assert tool.submit_header(b"SUBMIT 1 0 5 16 0 1 logprobs=33")[4]["invalid"] == 1
    for unframeable in (b"SUBMIT 1 0 5 16 0", b"SUBMIT 1 0 x 16 0 1", b"PING",
                        b"SUBMIT 1 0 99999999 16 0 1"):
        assert tool.submit_header(unframeable) is None


def _peer() -> tuple[str, str]:
    peer, sdist = os.environ.get("COLIBRI_PEER_PYTHON"), os.environ.get("COLIBRI_LLAMA_SDIST")
    if not peer or not sdist:
        pytest.skip("COLIBRI_PEER_PYTHON and COLIBRI_LLAMA_SDIST name no llama.cpp peer")
    probe = subprocess.run([peer, "-c", "import llama_cpp, torch, transformers"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{peer} cannot import llama_cpp, torch and transformers")
    return peer, sdist


def test_llama_cpp_passes_the_golden_cases_on_glm5_chat_tiny(tmp_path: Path) -> None:
    peer, sdist = _peer()
    model = fixture_model_dir("glm5-chat-tiny")
    gguf = tmp_path / "glm5-chat-tiny.gguf"
    subprocess.run([sys.executable, str(ROOT / "tools" / "llama_cpp_gguf.py"), "--sdist", sdist,
                    "--python", peer, "--model", str(model), "--out", str(gguf),
                    "--ftype", "f32"], check=True, capture_output=True)
    from colibri.conformance.cases import load_cases

    golden = [c for c in load_cases("protocol") if c.area == "golden"]
    runner = protocol_runner(f"{peer} {TOOL} --gguf {gguf}", model, timeout=60.0)
    results = {r.case_id: r.status for r in run_parallel(runner, golden, Expectations(),
                                                          reruns=0, jobs=1)}
    assert results == {"protocol.golden.oracle-greedy-tokens": PASS,
                       "protocol.golden.oracle-teacher-forced": PASS,
                       "protocol.golden.oracle-logprobs": PASS,
                       "protocol.golden.oracle-greedy-bytes": SKIP}
