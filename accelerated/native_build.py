"""Build the accelerated engine's C library with the system compiler, incrementally.

``python -m colibri.accelerated.native_build`` (what ``make build`` runs) compiles every
``accelerated/csrc/**/*.c`` into one shared library per instruction-set *variant*:

- ``generic``: ``-O3``, no ISA flags: runs on any CPU of the architecture;
- ``avx2``: ``-O3 -mavx2 -mfma`` (x86-64 only, and only when the compiler accepts them).

The loader (``colibri.accelerated.native``) picks the best variant the running CPU supports,
so a library built on one machine never executes an illegal instruction on an older one.
Both variants are compiled from the same source: kernels fix their summation order in the
source (explicit lane accumulators), never through ``-ffast-math``, so each variant is
deterministic; the two may differ in the last bits (FMA contraction), which is sameness
kind (b) (spec/model.md §15).

A variant is rebuilt only when a source, a header or the flags change: a stamp next to the
library records the SHA-256 of all of them.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
#: Where libraries go: ``<repo>/build/accelerated/<variant>/libcolibri.so`` in a checkout.
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "build" / "accelerated"
LIBRARY_NAME = "libcolibri.so"
BASE_FLAGS = ("-std=c11", "-O3", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra",
              "-Werror=implicit-function-declaration", "-fno-fast-math",
              "-ffp-contract=off")


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]


def variants() -> list[Variant]:
    """The variants this machine's architecture has, best last."""
    found = [Variant("generic", ())]
    if platform.machine() in ("x86_64", "AMD64"):
        found.append(Variant("avx2", ("-mavx2", "-mfma")))
    return found


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc``/``gcc``/``clang`` on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def sources() -> list[Path]:
    return sorted(SOURCE_DIR.rglob("*.c"))


def _stamp(cc: str, variant: Variant) -> str:
    digest = hashlib.sha256()
    digest.update(" ".join((cc, *BASE_FLAGS, *variant.flags)).encode())
    for path in sorted(SOURCE_DIR.rglob("*")):
        if path.suffix in (".c", ".h"):
            digest.update(str(path.relative_to(SOURCE_DIR)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def build_variant(cc: str, variant: Variant, out: Path) -> Path:
    """Compile one variant unless its stamp is current; returns the library path."""
    target = out / variant.name / LIBRARY_NAME
    stamp_file = target.with_suffix(".stamp")
    stamp = _stamp(cc, variant)
    if target.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temporary name and rename, so a running engine never maps a half-written file.
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    command = [cc, *BASE_FLAGS, *variant.flags, f"-I{SOURCE_DIR}",
               *(str(s) for s in sources()), "-o", str(partial), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildError(f"{variant.name}: {' '.join(command)}\n{result.stderr.strip()}")
    partial.replace(target)
    stamp_file.write_text(stamp)
    return target


class BuildError(RuntimeError):
    """The compiler refused the sources (its message is included)."""


def build(out: Path = DEFAULT_OUT) -> list[Path]:
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler found (set CC, or install cc/gcc/clang)")
    if not sources():
        raise BuildError(f"no C sources under {SOURCE_DIR}")
    return [build_variant(cc, v, out) for v in variants()]


def main() -> int:
    if compiler() is None:
        # Not an error for the rest of colibri: the reference engine needs no compiler, and
        # `--accelerated` says which step is missing when asked for.
        print("colibri accelerated build skipped: no C compiler found (set CC, or install "
              "cc/gcc/clang); --accelerated will not be available", file=sys.stderr)
        return 0
    try:
        built = build()
    except BuildError as exc:
        print(f"colibri accelerated build failed: {exc}", file=sys.stderr)
        return 1
    for path in built:
        print(f"built {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
