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
bench model (docs/performance.md, "The llama.cpp peer"). The decode worker's ``llama_cpp``
engine runs it.
"""

from __future__ import annotations

from pathlib import Path

from colibri.benchmarks.workers import importable

#: llama.cpp's output types the bench compares against (f32 and q8_0, the targets' peers).
FTYPES = ("f32", "q8_0")


def gguf_path(cache_dir: Path, model_dir: Path, ftype: str) -> Path:
    return cache_dir / "gguf" / f"{model_dir.name}-{ftype}.gguf"


def unavailable_reason(python: str, gguf: Path) -> str | None:
    """Why the llama.cpp peer cannot run on ``gguf`` with ``python``, or None when it can."""
    if not importable(python, "llama_cpp"):
        return (f"llama_cpp (llama-cpp-python) is not importable by {python} "
                "(see --peer-python)")
    if not gguf.is_file():
        return (f"no GGUF at {gguf} (convert the bench model with "
                "tools/llama_cpp_gguf.py; docs/performance.md)")
    return None
