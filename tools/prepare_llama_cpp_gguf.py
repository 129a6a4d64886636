"""Convert the bench model to the GGUFs the llama.cpp bench peer reads (f32 and q8_0).

    python tools/prepare_llama_cpp_gguf.py --sdist llama_cpp_python-0.3.36.tar.gz \
        [--cache-dir ~/.cache/colibri/bench] [--ftype f32 --ftype q8_0]

Run it with an interpreter that has torch (CPU) and transformers (``make oracle-deps``); the
converter itself is llama.cpp's ``convert_hf_to_gguf.py`` (with its ``gguf-py``), taken from
the llama-cpp-python sdist and extracted into ``<cache-dir>/gguf/llama.cpp-src``. colibri
does not write GGUF itself.

Two things the bench model lacks are supplied here rather than by editing vendored files:

* a tokenizer: the converter insists on one, so the staging directory gets the committed
  fixture tokenizer (a byte-level BPE with GLM's special tokens; the converter pads the
  vocabulary to the model's 8192 ids). The bench feeds token ids directly, so which strings
  the ids spell does not matter;
* the pre-tokenizer: llama.cpp recognises a byte-level BPE by hashing how it splits a fixed
  text, and an unknown hash is fatal. ``TextModel.get_vocab_base_pre`` is wrapped at run time
  to answer ``glm4`` (a pre-tokenizer llama.cpp knows), which only affects llama.cpp's own
  text tokenizer, never used by the bench.

The staging directory links the checkpoint (no copy). Outputs land where
``colibri.benchmarks.llama_cpp_peer.gguf_path`` looks: ``<cache-dir>/gguf/<model>-<ftype>.gguf``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from colibri.benchmarks.bench_model import ensure_bench_model
from colibri.benchmarks.llama_cpp_peer import FTYPES, gguf_path

REPO = Path(__file__).resolve().parent.parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: A pre-tokenizer name llama.cpp knows for GLM models (see the module docstring).
KNOWN_PRE_TOKENIZER = "glm4"

#: Run in the converter's interpreter: wrap the pre-tokenizer check, then hand over to the
#: converter's own command line.
_DRIVER = """
import sys
src, argv = sys.argv[1], sys.argv[2:]
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}
sys.argv = [src + "/convert_hf_to_gguf.py", *argv]
import runpy
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def converter_source(sdist: Path, into: Path) -> Path:
    """The sdist's ``vendor/llama.cpp`` (converter + gguf-py), extracted once."""
    src = into / "vendor" / "llama.cpp"
    if (src / "convert_hf_to_gguf.py").is_file():
        return src
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        wanted = [m for m in tar.getmembers()
                  if m.name.startswith(f"{top}/vendor/llama.cpp/")
                  and (m.name.endswith("convert_hf_to_gguf.py")
                       or "/conversion/" in m.name or "/gguf-py/" in m.name)]
        for member in wanted:
            member.name = member.name[len(top) + 1:]
        tar.extractall(into, members=wanted, filter="data")
    return src


def staging_dir(model_dir: Path, into: Path) -> Path:
    """The model's config and checkpoint (linked) beside the fixture tokenizer."""
    stage = into / f"stage-{model_dir.name}"
    stage.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copyfile(model_dir / name, stage / name)
    for name in TOKENIZER_FILES:
        shutil.copyfile(REPO / "fixtures" / "tokenizer" / name, stage / name)
    for weights in model_dir.glob("*.safetensors"):
        link = stage / weights.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(weights.resolve())
    return stage


def convert(src: Path, stage: Path, out: Path, ftype: str, python: str) -> None:
    part = out.with_suffix(".part")
    subprocess.run([python, "-c", _DRIVER.format(pre=KNOWN_PRE_TOKENIZER), str(src),
                    str(stage), "--outtype", ftype, "--outfile", str(part)], check=True)
    os.replace(part, out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, required=True,
                        help="llama-cpp-python's sdist (it vendors the converter)")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path.home() / ".cache" / "colibri" / "bench")
    parser.add_argument("--ftype", action="append", choices=FTYPES,
                        help="output types (default: all the bench compares)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter with torch and transformers")
    parser.add_argument("--force", action="store_true", help="convert even if the GGUF exists")
    args = parser.parse_args()
    model_dir = ensure_bench_model(args.cache_dir)
    work = args.cache_dir / "gguf"
    src = converter_source(args.sdist, work / "llama.cpp-src")
    stage = staging_dir(model_dir, work)
    for ftype in args.ftype or FTYPES:
        out = gguf_path(args.cache_dir, model_dir, ftype)
        if out.is_file() and not args.force:
            print(f"{out} exists (--force converts again)")
            continue
        convert(src, stage, out, ftype, args.python)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
