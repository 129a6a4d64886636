"""llama.cpp as an optional peer of ``colibri bench`` (like the HF one): skipped with a reason
when it cannot run, never a dependency.

It runs when the peer interpreter (``--peer-python``, ``$COLIBRI_PEER_PYTHON`` or this one)
imports ``llama_cpp`` (llama-cpp-python; 0.3.36 builds llama.cpp from the registry's sdist in
about ten minutes on two cores: build the wheel once, ``pip wheel llama-cpp-python==0.3.36``)
and a GGUF of the model exists at ``gguf_path``: ``<cache-dir>/gguf/<model>-<ftype>.gguf``.
colibri does not write GGUF itself; llama.cpp's own converter does, from the sdist's
``vendor/llama.cpp/convert_hf_to_gguf.py`` (it needs torch and transformers, a tokenizer in
the model directory, and an ``index_head_dim`` that is a multiple of 64):
``tools/llama_cpp_gguf.py --sdist llama_cpp_python-0.3.36.tar.gz --bench`` runs it on the
bench model (docs/performance.md, "The llama.cpp peer").
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from colibri.benchmarks.decode_steps import PROMPT, prefill_prompt, prefill_summary, run_worker

#: llama.cpp's output types the bench compares against (f32 and q8_0, the targets' peers).
FTYPES = ("f32", "q8_0")


def gguf_path(cache_dir: Path, model_dir: Path, ftype: str) -> Path:
    return cache_dir / "gguf" / f"{model_dir.name}-{ftype}.gguf"


def unavailable_reason(python: str, gguf: Path) -> str | None:
    """Why the llama.cpp peer cannot run on ``gguf`` with ``python``, or None when it can."""
    probe = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, check=False)
    if probe.returncode != 0:
        return (f"llama_cpp (llama-cpp-python) is not importable by {python} "
                "(see --peer-python)")
    if not gguf.is_file():
        return (f"no GGUF at {gguf} (convert the bench model with "
                "tools/llama_cpp_gguf.py; docs/performance.md)")
    return None


def run_peer(python: str, gguf: Path, vocab_size: int, tokens: int, warmup: int,
             threads: int, decode_summary: Any) -> dict[str, Any]:
    """One llama.cpp worker on ``gguf``: decode (``decode_summary`` of its step times, no
    byte counts of its own) and prefill, or the skip reason."""
    reason = unavailable_reason(python, gguf)
    if reason is not None:
        return {"skipped": reason}
    long_prompt = prefill_prompt(vocab_size)
    raw = run_worker([python, str(Path(__file__).with_name("llama_cpp_worker.py")),
                      "--gguf", str(gguf), "--prompt", " ".join(map(str, PROMPT)),
                      "--long-prompt", " ".join(map(str, long_prompt)),
                      "--tokens", str(tokens), "--warmup", str(warmup),
                      "--threads", str(threads)], "llama.cpp worker")
    if "error" in raw:
        return raw
    return {
        "gguf": str(gguf),
        "version": raw["version"],
        "threads": raw["threads"],
        "load_s": raw["load_s"],
        "decode": decode_summary(raw["step_s"]),
        "prefill": prefill_summary(raw["ttft_s"], raw["prefill_s"], len(long_prompt),
                                   len(PROMPT)),
        "greedy_ids": raw["ids"],
    }
