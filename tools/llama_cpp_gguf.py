"""Convert a colibri model to GGUF with llama.cpp's own converter, for llama.cpp as a peer.

llama.cpp is a benchmark peer (``colibri bench``) and a conformance target (its OpenAI-
compatible server), never a dependency: this script takes llama.cpp's converter
(``convert_hf_to_gguf.py``, its ``conversion`` package and ``gguf-py``) out of a
llama-cpp-python sdist and runs it on a staged copy of the model, so nothing of llama.cpp
enters this repository and colibri does not write GGUF itself.

    # the bench peer's GGUFs, where colibri.benchmarks.llama_cpp_peer looks for them
    python tools/llama_cpp_gguf.py --sdist llama_cpp_python-0.3.36.tar.gz --bench \\
        [--cache-dir ~/.cache/colibri/bench] [--ftype f32 --ftype q8_0]
    # any model directory, e.g. a fixture for llama.cpp's server
    python tools/llama_cpp_gguf.py --sdist llama_cpp_python-0.3.36.tar.gz \\
        --model fixtures/models/glm5-chat-tiny --out /tmp/glm5-chat-tiny.gguf

The converter needs torch (CPU) and transformers (``make oracle-deps``): ``--python`` names
the interpreter it runs in. What the model lacks for llama.cpp is supplied in the staging
directory, never by editing vendored files, and each adjustment is printed:

* a tokenizer: the converter insists on one, so a model without ``tokenizer.json`` (the bench
  model) is staged beside the committed fixture tokenizer, a byte-level BPE with GLM's special
  tokens that the converter looks up by name (it pads the vocabulary to the model's ids). The
  bench feeds token ids directly, so which strings the ids spell does not matter;
* the DSA indexer's width: llama.cpp rotates the indexer's q/k with a Hadamard matrix of size
  >= 64 and refuses a narrower ``index_head_dim``; a smaller one is raised to a multiple of 64
  and the indexer tensors (wq_b, wk, k_norm) re-drawn at the new shape (seeded). The indexer
  only selects keys beyond ``index_topk`` context tokens, so outputs on short prompts are the
  model's own;
* the pre-tokenizer: llama.cpp recognises a byte-level BPE by hashing how it splits a fixed
  text, and an unknown hash is fatal; ``TextModel.get_vocab_base_pre`` is wrapped at run time
  to answer ``glm4`` (the GLM split regex our tokenizers use) where the hash is unknown.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
INDEXER_ALIGN = 64
#: A pre-tokenizer name llama.cpp knows for GLM models (see the module docstring).
KNOWN_PRE_TOKENIZER = "glm4"

#: Run in the converter's interpreter: wrap the pre-tokenizer check, then hand over to the
#: converter's own command line.
_DRIVER = """
import sys
src, argv = sys.argv[1], sys.argv[2:]
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
recognize = base.TextModel.get_vocab_base_pre
def pre_or_known(self, tokenizer):
    try:
        return recognize(self, tokenizer)
    except NotImplementedError:
        print("unknown BPE pre-tokenizer hash: written as {pre}")
        return {pre!r}
base.TextModel.get_vocab_base_pre = pre_or_known
sys.argv = [src + "/convert_hf_to_gguf.py", *argv]
import runpy
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def converter_source(sdist: Path, into: Path) -> Path:
    """The sdist's ``vendor/llama.cpp`` (converter, conversion package, gguf-py), once."""
    src = into / "vendor" / "llama.cpp"
    if (src / "convert_hf_to_gguf.py").is_file():
        return src
    with tarfile.open(sdist) as tar:
        wanted = []
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/vendor/llama.cpp/")
            if rest.startswith(CONVERTER_PARTS) and "/" not in top:
                member.name = "vendor/llama.cpp/" + rest
                wanted.append(member)
        if not wanted:
            sys.exit(f"{sdist}: no vendor/llama.cpp converter inside")
        tar.extractall(into, members=wanted, filter="data")
    return src


def _realigned_indexer(model_dir: Path, stage: Path, config: dict[str, Any], seed: int) -> None:
    """Write the staged checkpoint with the indexer at ``index_head_dim`` (already raised in
    ``config``) and every other tensor as stored."""
    from colibri.reference.safetensors import read_all, write_safetensors

    new, heads = config["index_head_dim"], config["index_n_heads"]
    shapes = {"wq_b.weight": (heads * new, config["q_lora_rank"]),
              "wk.weight": (new, config["hidden_size"])}
    rng = np.random.default_rng(seed)
    for weights in sorted(model_dir.glob("*.safetensors")):
        tensors = dict(read_all(weights))
        for name in sorted(tensors):
            leaf = name.split(".indexer.", 1)[1] if ".indexer." in name else ""
            dtype = tensors[name].dtype
            if leaf in shapes:
                tensors[name] = (rng.standard_normal(shapes[leaf]) * 0.02).astype(dtype)
            elif leaf == "k_norm.weight":
                tensors[name] = np.ones(new, dtype)
            elif leaf == "k_norm.bias":
                tensors[name] = np.zeros(new, dtype)
        write_safetensors(stage / weights.name, tensors, {"format": "pt"})


def staging_dir(model_dir: Path, into: Path, seed: int = 0) -> Path:
    """``into/stage-<model>``: the model's config and checkpoint (linked where unchanged), a
    tokenizer (its own, else the fixture tokenizer) and an indexer llama.cpp accepts."""
    stage = into / f"stage-{model_dir.name}"
    stage.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text("utf-8"))
    old = int(config.get("index_head_dim") or 0)
    realign = bool(old) and old % INDEXER_ALIGN != 0
    if realign:
        config["index_head_dim"] = -(-old // INDEXER_ALIGN) * INDEXER_ALIGN
        print(f"index_head_dim {old} -> {config['index_head_dim']}: indexer tensors re-drawn "
              f"(seed {seed})")
    (stage / "config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    if (model_dir / "generation_config.json").is_file():
        shutil.copyfile(model_dir / "generation_config.json", stage / "generation_config.json")
    own = (model_dir / "tokenizer.json").is_file()
    for name in TOKENIZER_FILES:
        source = (model_dir if own else REPO / "fixtures" / "tokenizer") / name
        if source.is_file():
            shutil.copyfile(source, stage / name)
    if not own:
        print("no tokenizer.json: staged beside the fixture tokenizer")
    for weights in model_dir.glob("*.safetensors"):
        link = stage / weights.name
        if link.is_symlink() or link.exists():
            link.unlink()
        if not realign:
            link.symlink_to(weights.resolve())
    if realign:
        _realigned_indexer(model_dir, stage, config, seed)
    return stage


def convert(src: Path, stage: Path, out: Path, ftype: str, python: str) -> None:
    part = out.with_suffix(".part")
    subprocess.run([python, "-c", _DRIVER.format(pre=KNOWN_PRE_TOKENIZER), str(src),
                    str(stage), "--outtype", ftype, "--outfile", str(part)], check=True)
    os.replace(part, out)


def _bench(args: argparse.Namespace, src: Path) -> None:
    from colibri.benchmarks.bench_model import ensure_bench_model
    from colibri.benchmarks.llama_cpp_peer import FTYPES, gguf_path

    model_dir = ensure_bench_model(args.cache_dir)
    stage = staging_dir(model_dir, args.cache_dir / "gguf")
    for ftype in args.ftype or FTYPES:
        out = gguf_path(args.cache_dir, model_dir, ftype)
        if out.is_file() and not args.force:
            print(f"{out} exists (--force converts again)")
            continue
        convert(src, stage, out, ftype, args.python)
        print(f"wrote {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, required=True,
                        help="llama-cpp-python's sdist (it vendors the converter)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--bench", action="store_true",
                      help="the bench model, into <cache-dir>/gguf/ (the bench peer's GGUFs)")
    what.add_argument("--model", type=Path, help="a model directory (with --out)")
    parser.add_argument("--out", type=Path, help="the GGUF to write (with --model)")
    parser.add_argument("--ftype", action="append", choices=("f32", "q8_0", "bf16", "f16"),
                        help="output type(s); --model writes the first (default f32), --bench "
                        "each (default: all the bench compares)")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path.home() / ".cache" / "colibri" / "bench")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter with torch and transformers (default: this one)")
    parser.add_argument("--force", action="store_true", help="convert even if the GGUF exists")
    args = parser.parse_args()
    if args.model is not None and args.out is None:
        parser.error("--model needs --out")
    work = args.cache_dir / "gguf"
    src = converter_source(args.sdist.resolve(), work / "llama.cpp-src")
    if args.bench:
        _bench(args, src)
        return 0
    stage = staging_dir(args.model.resolve(), work)
    convert(src, stage, args.out.resolve(), (args.ftype or ["f32"])[0], args.python)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
