"""Convert a colibri fixture model to a GLM-architecture GGUF for llama.cpp's server.

llama.cpp's server is a conformance *target* (README, "Conformance: llama.cpp's server"), not
a dependency: this script takes llama.cpp's own converter out of a llama-cpp-python sdist and
runs it on a copy of the fixture, so nothing of llama.cpp enters this repository.

    python tools/llama_cpp_gguf.py --sdist llama_cpp_python-0.3.36.tar.gz \\
        --model fixtures/models/glm5-chat-tiny --out /tmp/glm5-chat-tiny.gguf

Needs torch (CPU) and transformers (`make oracle-deps`). Two adjustments, both printed:

- llama.cpp's DSA indexer wants ``index_head_dim`` to be a multiple of 64; a smaller one is
  raised to 64 and the indexer tensors (wq_b, wk, k_norm) are re-drawn at the new shape
  (seeded). The indexer only selects keys beyond ``index_topk`` (4096) context tokens, so the
  model's outputs on short prompts are those of the fixture.
- The converter recognizes a BPE pre-tokenizer by the hash of a test encoding; the fixtures'
  tokenizers are new, so an unknown hash is mapped to ``glm4`` (the GLM split regex the
  fixtures use) by wrapping ``TextModel.get_vocab_base_pre`` at run time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

INDEXER_ALIGN = 64
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def extract_converter(sdist: Path, into: Path) -> Path:
    """llama.cpp's converter (script, conversion package, gguf-py) from the sdist."""
    with tarfile.open(sdist) as archive:
        members = [
            m for m in archive.getmembers()
            if "/vendor/llama.cpp/" in m.name
            and m.name.split("/vendor/llama.cpp/", 1)[1].startswith(CONVERTER_PARTS)
        ]
        if not members:
            sys.exit(f"{sdist}: no vendor/llama.cpp converter inside")
        archive.extractall(into, members=members, filter="data")
    return next(into.glob("*/vendor/llama.cpp"))


def aligned_copy(model: Path, into: Path, seed: int = 0) -> Path:
    """The fixture, with index_head_dim raised to a multiple of 64 where it is not one."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(model, into)
    config: dict[str, Any] = json.loads((into / "config.json").read_text(encoding="utf-8"))
    old = int(config.get("index_head_dim", 0))
    if not old or old % INDEXER_ALIGN == 0:
        return into
    new = -(-old // INDEXER_ALIGN) * INDEXER_ALIGN
    heads, q_lora, hidden = config["index_n_heads"], config["q_lora_rank"], config["hidden_size"]
    tensors = load_file(str(into / "model.safetensors"))
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    shapes = {"wq_b.weight": (heads * new, q_lora), "wk.weight": (new, hidden)}
    for name in sorted(tensors):
        if ".indexer." not in name:
            continue
        leaf = name.split(".indexer.", 1)[1]
        dtype = tensors[name].dtype
        if leaf in shapes:
            tensors[name] = normal(*shapes[leaf]).astype(dtype)
        elif leaf == "k_norm.weight":
            tensors[name] = np.ones(new, dtype)
        elif leaf == "k_norm.bias":
            tensors[name] = np.zeros(new, dtype)
    save_file(tensors, str(into / "model.safetensors"), metadata={"format": "pt"})
    config["index_head_dim"] = new
    (into / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    print(f"index_head_dim {old} -> {new}: indexer tensors re-drawn (seed {seed})")
    return into


def convert(converter: Path, model: Path, out: Path) -> None:
    """Run llama.cpp's convert_hf_to_gguf in this process, unknown BPE hashes as glm4."""
    sys.path[:0] = [str(converter), str(converter / "gguf-py")]
    import convert_hf_to_gguf
    from conversion.base import TextModel

    recognize = TextModel.get_vocab_base_pre

    def pre_or_glm4(self: Any, tokenizer: Any) -> str:
        try:
            return str(recognize(self, tokenizer))
        except NotImplementedError:
            print("unknown BPE pre-tokenizer hash: written as glm4 (the fixtures' GLM regex)")
            return "glm4"

    TextModel.get_vocab_base_pre = pre_or_glm4
    sys.argv = ["convert_hf_to_gguf.py", str(model), "--outfile", str(out), "--outtype", "f32"]
    convert_hf_to_gguf.main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, required=True, help="llama_cpp_python-*.tar.gz")
    parser.add_argument("--model", type=Path, required=True, help="a fixture model directory")
    parser.add_argument("--out", type=Path, required=True, help="the GGUF to write")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llama-cpp-gguf-") as tmp:
        converter = extract_converter(args.sdist.resolve(), Path(tmp) / "sdist")
        model = aligned_copy(args.model.resolve(), Path(tmp) / "model")
        convert(converter, model, args.out.resolve())
    print(args.out)


if __name__ == "__main__":
    main()
