"""Build the accelerated engine's C library with the system compiler, incrementally.

``python -m colibri.accelerated.native_build`` (what ``make build`` runs) compiles every
``accelerated/csrc/**/*.c`` into one shared library per instruction-set *variant*:

- ``generic``: ``-O3``, no ISA flags: runs on any CPU of the architecture;
- ``avx2``: ``-O3 -mavx2 -mfma`` (x86-64 only);
- ``avx512``: the avx2 flags plus AVX-512 F/BW/VL/DQ (x86-64 only). Its quantized kernels
  keep the avx2 build's 32 lanes in 16-lane registers with the same multiply-adds in the same
  order, its float kernels are the avx2 ones, so the two give the same bytes (tested where the
  CPU runs both).

The loader (``colibri.accelerated.native``) picks the best variant the running CPU supports,
so a library built on one machine never executes an illegal instruction on an older one.
Both variants are compiled from the same source: kernels fix their summation order in the
source (explicit lane accumulators), never through ``-ffast-math``, so each variant is
deterministic; the two may differ in the last bits (FMA contraction), which is sameness
kind (b) (spec/model.md §15).

A variant is rebuilt only when a source, a header or the flags change: a stamp next to the
library records the SHA-256 of all of them.

The three compiled pieces of ``make build`` share this module's shape: this C library, the
CUDA library (``cuda_build``, beside ``cuda_native`` which loads it) and the mypyc control
plane (``colibri.control_plane_build``, beside ``colibri.control_plane`` which loads it).
Each is ``python -m MODULE``: a stamp of its inputs decides a rebuild, ``build()`` returns
``(artifact, compiled now)`` pairs, a missing tool (:class:`ToolMissing`) is a one-line note
and exit status 0 (the reference engine needs none of them), a refusal (:class:`BuildError`)
exit status 1, and :func:`run_step` prints what was built, or one line when all is current.

``--sanitize`` builds one more variant, ``sanitize`` (ASan + UBSan, ``-O1 -g``, any UB fatal),
into ``build/accelerated/sanitize/`` — never by default. A Python process can load it only with
the ASan runtime preloaded; ``--sanitize -- COMMAND...`` builds it, then runs COMMAND with that
environment (:func:`sanitizer_env`: ``LD_PRELOAD``, ``ASAN_OPTIONS``, ``UBSAN_OPTIONS``,
``COLIBRI_ISA=sanitize``, ``COLIBRI_SANITIZE=1``). ``make sanitize-test`` runs the tests marked
``sanitize`` (the loader's corrupt-input tests) that way.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
#: Where libraries go: ``<repo>/build/accelerated/<variant>/libcolibri.so`` in a checkout.
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "build" / "accelerated"
LIBRARY_NAME = "libcolibri.so"
BASE_FLAGS = ("-std=c11", "-O3", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra",
              "-Werror=implicit-function-declaration", "-fno-fast-math",
              "-ffp-contract=off")


#: The AVX-512 subsets the avx512 variant is compiled for (and a CPU must have to run it).
AVX512_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]


def variants() -> list[Variant]:
    """The variants this machine's architecture has, best last."""
    found = [Variant("generic", ())]
    if platform.machine() in ("x86_64", "AMD64"):
        found.append(Variant("avx2", ("-mavx2", "-mfma")))
        found.append(Variant("avx512", ("-mavx2", "-mfma", *AVX512_FLAGS)))
    return found


#: ASan + UBSan: out-of-bounds reads/writes and undefined behaviour abort with a report.
SANITIZE = Variant("sanitize", ("-O1", "-g", "-fno-omit-frame-pointer",
                                "-fsanitize=address,undefined", "-fno-sanitize-recover=all"))


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


def build_variant(cc: str, variant: Variant, out: Path) -> tuple[Path, bool]:
    """Compile one variant unless its stamp is current: the library path, and whether it was
    compiled now."""
    target = out / variant.name / LIBRARY_NAME
    stamp_file = target.with_suffix(".stamp")
    stamp = _stamp(cc, variant)
    if target.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return target, False
    error = compile_library(target, stamp, lambda partial: [
        cc, *BASE_FLAGS, *variant.flags, f"-I{SOURCE_DIR}", *(str(s) for s in sources()), "-o",
        str(partial), "-lm"])
    if error is not None:
        raise BuildError(f"{variant.name}: {error}")
    return target, True


def compile_library(target: Path, stamp: str, command: Callable[[Path], list[str]]
                    ) -> str | None:
    """Run ``command(partial)`` to write a library at a temporary name, then rename it to
    ``target`` (a running engine never maps a half-written file) and write its stamp.
    Returns the command and the compiler's message where it fails, else None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    argv = command(partial)
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        return f"{' '.join(argv)}\n{result.stderr.strip()}"
    partial.replace(target)
    target.with_suffix(".stamp").write_text(stamp)
    return None


class BuildError(RuntimeError):
    """The compiler refused the sources (its message is included)."""


class ToolMissing(BuildError):
    """The step's compiler is absent here: the piece is not built (not an error)."""


def run_step(what: str, where: Path, build_step: Callable[[], list[tuple[Path, bool]]],
             skipped: str) -> int:
    """``python -m`` of a build module: build, then one line per artifact compiled now, or
    one line when every one was current. ``skipped``: what is unavailable without the tool."""
    try:
        built = build_step()
    except ToolMissing as exc:
        print(f"colibri {what} build skipped: {exc}; {skipped}", file=sys.stderr)
        return 0
    except BuildError as exc:
        print(f"colibri {what} build failed: {exc}", file=sys.stderr)
        return 1
    for path, compiled in built:
        if compiled:
            print(f"built {path}")
    if not any(compiled for _, compiled in built):
        print(f"{what} in {where} is current ({len(built)} file(s))")
    return 0


def build(out: Path = DEFAULT_OUT) -> list[tuple[Path, bool]]:
    cc = compiler()
    if cc is None:
        raise ToolMissing("no C compiler found (set CC, or install cc/gcc/clang)")
    if not sources():
        raise BuildError(f"no C sources under {SOURCE_DIR}")
    return [build_variant(cc, v, out) for v in variants()]


def build_sanitized(out: Path = DEFAULT_OUT) -> tuple[Path, bool]:
    cc = compiler()
    if cc is None:
        raise ToolMissing("no C compiler found (set CC, or install cc/gcc/clang)")
    if not sources():
        raise BuildError(f"no C sources under {SOURCE_DIR}")
    return build_variant(cc, SANITIZE, out)


def sanitizer_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment in which Python can load the sanitize variant: the compiler's ASan
    runtime preloaded (it must come before any other library), leaks not reported (the
    interpreter's own are not ours), the first error fatal."""
    env = dict(os.environ if base is None else base)
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler found (set CC, or install cc/gcc/clang)")
    runtime = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                             text=True, check=False).stdout.strip()
    if not runtime or not Path(runtime).is_file():
        raise BuildError(f"{cc} has no ASan runtime (libasan.so); install it (e.g. libasan8)")
    env["LD_PRELOAD"] = " ".join(p for p in (runtime, env.get("LD_PRELOAD", "")) if p)
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1:" + env.get("ASAN_OPTIONS", "")
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:" + env.get("UBSAN_OPTIONS", "")
    env["COLIBRI_ISA"] = SANITIZE.name
    env["COLIBRI_SANITIZE"] = "1"
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m colibri.accelerated.native_build")
    parser.add_argument("--sanitize", action="store_true",
                        help="build the ASan + UBSan variant (build/accelerated/sanitize) only")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="with --sanitize: after --, a command to run with the sanitizer "
                             "environment")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command and not args.sanitize:
        parser.error("a command is run only with --sanitize")
    if not args.sanitize:
        return run_step("C library", DEFAULT_OUT, build,
                        "--accelerated will not be available")
    try:
        built = build_sanitized()
        env = sanitizer_env() if command else None
    except BuildError as exc:
        print(f"colibri sanitized C library build failed: {exc}", file=sys.stderr)
        return 1
    if built[1]:
        print(f"built {built[0]}")
    if command:
        return subprocess.run(command, env=env, check=False).returncode
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
