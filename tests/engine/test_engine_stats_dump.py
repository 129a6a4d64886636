"""`STATS=<path>` (spec/protocol.md 4.2 "STATS dump"): the usage counters at exit, in the
`.coli_usage` format the atlas reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from colibri.reference.config import ModelConfig
from support.engine_harness import submit

from colibri import resources
from colibri.engine.usage_file import ENGINE_ID


def run(env: dict[str, str], script: bytes) -> subprocess.CompletedProcess[bytes]:
    full = {**os.environ, "COLI_PERSIST": "0", "DRAFT": "0", **env}
    return subprocess.run([sys.executable, "-m", "colibri", "engine"], input=script,
                          capture_output=True, env=full, timeout=120, check=False)


def records(path: Path) -> dict[tuple[int, int], int]:
    out = {}
    for line in path.read_text().splitlines():
        layer, expert, count = (int(x) for x in line.split())
        if layer >= 0:
            out[(layer, expert)] = count
    return out


def test_stats_dump_counts_this_run_only(tmp_path: Path) -> None:
    config = ModelConfig.from_dir(resources.default_model_dir())
    short, long_ = tmp_path / "short.txt", tmp_path / "long.txt"
    prompt = b"[gMASK]<sop><|user|>hello<|assistant|><think></think>"
    one = submit(1, 0, prompt, 1)
    assert run({"STATS": str(short)}, one).returncode == 0
    assert run({"STATS": str(long_)}, one + submit(2, 0, prompt + b"more words", 1)).returncode == 0
    lines = short.read_text().splitlines()
    n_layers = config.num_hidden_layers
    assert lines[:2] == [f"-1 {n_layers} {config.n_routed_experts}", f"-2 1 {ENGINE_ID}"]
    a, b = records(short), records(long_)
    top_k = config.num_experts_per_tok
    sparse = [i for i in range(n_layers) if i >= config.first_k_dense_replace]
    # every forwarded token routes top_k experts in every sparse layer
    for layer in sparse:
        per_layer = sum(v for (lay, _), v in a.items() if lay == layer)
        assert per_layer % top_k == 0 and per_layer > 0
    assert sum(b.values()) > sum(a.values())
    # a second run of the same request with COLI_PERSIST=0 is the same dump (fresh usage)
    again = tmp_path / "again.txt"
    run({"STATS": str(again)}, one)
    assert again.read_bytes() == short.read_bytes()


def test_stats_dump_write_failure_is_exit_1(tmp_path: Path) -> None:
    done = run({"STATS": str(tmp_path / "missing-dir" / "s.txt")}, b"")
    assert done.returncode == 1
    assert b"cannot write STATS" in done.stderr
