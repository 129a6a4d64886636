"""Build the CUDA kernel library with nvcc, where nvcc exists, incrementally.

``python -m colibri.accelerated.cuda_build`` (what ``make build`` runs) compiles every
``accelerated/cuda/*.cu`` into ``build/accelerated/cuda/libcolibri_cuda.so``:

- machine code for sm_80 (A100) and sm_90 (H100/H200), plus compute_90 PTX that the driver
  can compile for newer GPUs;
- ``--fmad=false``: nvcc never contracts a multiply and an add; the kernels ask for a fused
  multiply-add explicitly (``fmaf``) exactly where the avx2 CPU build uses one, so the
  products can reproduce its bits (spec/DEVIATIONS.md, "CUDA kernels");
- the CUDA runtime linked statically (``-cudart static``), so the library loads on a machine
  with a driver and no toolkit -- and on one with neither, where its calls return the
  runtime's cudaErrorInsufficientDriver instead of failing to load.

Where nvcc is absent (``$NVCC``, else ``nvcc`` on PATH, else ``bin/nvcc`` under
``$CUDA_HOME``, ``$CUDA_PATH`` or ``/usr/local/cuda``) the
build is skipped with a one-line note and exit status 0: the CPU engine needs none of it,
and ``--device cuda`` then names the missing step. A stamp of the compiler command, the
flags and every source and header (the CPU library's quant tables included) decides a
rebuild: the shape ``native_build`` gives every build step.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from colibri.accelerated.native_build import DEFAULT_OUT as NATIVE_OUT
from colibri.accelerated.native_build import SOURCE_DIR as CSRC_DIR
from colibri.accelerated.native_build import BuildError, ToolMissing, compile_library, run_step

SOURCE_DIR = Path(__file__).resolve().parent / "cuda"
DEFAULT_OUT = NATIVE_OUT / "cuda"
LIBRARY_NAME = "libcolibri_cuda.so"
GENCODE = ("-gencode", "arch=compute_80,code=sm_80",
           "-gencode", "arch=compute_90,code=sm_90",
           "-gencode", "arch=compute_90,code=compute_90")
#: How each source is compiled (tests/accelerated/test_cuda_ptx.py reads the PTX they give).
COMPILE_FLAGS = ("-std=c++17", "-O3", "--fmad=false", "-Xcompiler", "-fPIC,-fno-fast-math")
FLAGS = (*COMPILE_FLAGS, "-shared", "-cudart", "static", *GENCODE)
#: The CPU library's headers the CUDA sources include (format numbers and codes, the iq3 grid).
SHARED_HEADERS = tuple(CSRC_DIR / "quant" / name
                       for name in ("coli_quant.h", "q_sizes.h", "coli_quant_tables.h"))


def nvcc() -> str | None:
    """The CUDA compiler, or None where this machine has none."""
    for candidate in (os.environ.get("NVCC"), "nvcc"):
        if candidate and shutil.which(candidate):
            return candidate
    # The toolkit's installers leave nvcc off PATH: look where they put it.
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def sources() -> list[Path]:
    return sorted(SOURCE_DIR.glob("*.cu"))


def _inputs() -> list[Path]:
    return sorted(p for p in SOURCE_DIR.iterdir() if p.suffix in (".cu", ".cuh", ".h")) + list(
        SHARED_HEADERS)


def stamp(compiler: str) -> str:
    digest = hashlib.sha256(" ".join((compiler, *FLAGS)).encode())
    for path in _inputs():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def library_path(out: Path | None = None) -> Path:
    return (out or DEFAULT_OUT) / LIBRARY_NAME


def build(compiler: str, out: Path | None = None) -> tuple[Path, bool]:
    """Compile unless the stamp is current; (the library, whether it was rebuilt)."""
    out = out or DEFAULT_OUT
    target = library_path(out)
    stamp_file = target.with_suffix(".stamp")
    want = stamp(compiler)
    if target.is_file() and stamp_file.is_file() and stamp_file.read_text() == want:
        return target, False
    error = compile_library(target, want, lambda partial: [
        compiler, *FLAGS, f"-I{SOURCE_DIR}", f"-I{CSRC_DIR}", *(str(s) for s in sources()),
        "-o", str(partial)])
    if error is not None:
        raise BuildError(error)
    return target, True


def build_step() -> list[tuple[Path, bool]]:
    compiler = nvcc()
    if compiler is None:
        raise ToolMissing("nvcc not found (set NVCC or CUDA_HOME)")
    return [build(compiler)]


def main(argv: list[str] | None = None) -> int:
    del argv
    return run_step("CUDA", DEFAULT_OUT, build_step, "--device cuda will not be available")


__all__ = ["BuildError", "ToolMissing", "build", "build_step", "library_path", "main", "nvcc",
           "stamp"]

if __name__ == "__main__":
    raise SystemExit(main())
