"""The avx512 library variant gives the avx2 variant's bytes.

Its quantized kernels, and its float kernels for 4-8 activation rows, hold the same 32 lanes
in 16-lane registers and feed each lane the same multiply-adds in the same order (its other
float kernels are the avx2 ones compiled with the wider ISA), so every product, and hence
every logit, must be bit-identical to avx2's: any difference is a bug in a lane, a reduction
or a path choice (or the compiler contracting differently), not rounding. Runs where the CPU
has AVX-512 F/BW/VL/DQ; elsewhere the variant is built but cannot execute, and the loader
never picks it.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from colibri.accelerated.native import supported_variants
from colibri.accelerated.native_build import DEFAULT_OUT, LIBRARY_NAME
from support.accelerated_support import ALL_FIXTURES, BUILT, NOT_BUILT_REASON

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)
if "avx512" not in supported_variants():
    pytest.skip("this CPU has no AVX-512 F/BW/VL/DQ: the avx512 variant cannot run here",
                allow_module_level=True)

VARIANTS = ("avx2", "avx512")


def library(variant: str) -> Path:
    path = DEFAULT_OUT / variant / LIBRARY_NAME
    assert path.is_file(), f"{path} is not built: `make build` builds every variant"
    return path


def test_the_loader_picks_avx512_and_it_reports_itself() -> None:
    from colibri.accelerated.kernels import Kernels
    from colibri.accelerated.native import chosen_variant

    assert chosen_variant() == "avx512"
    kernels = Kernels(1, ctypes.CDLL(str(library("avx512"))))
    try:
        # "avx2..." first: the CUDA build matches it with fused multiply-adds, as for avx2.
        assert kernels.isa == "avx2+fma+avx512"
    finally:
        kernels.close()


@pytest.mark.parametrize("k", [32, 96, 100, 1024, 2048])
def test_float_products_are_the_avx2_bytes_for_every_batch_path(k: int) -> None:
    from colibri.accelerated.kernels import Kernels, Weight

    rng = np.random.default_rng(k)
    kernels = {v: Kernels(2, ctypes.CDLL(str(library(v)))) for v in VARIANTS}
    try:
        # 1..17 rows: one row, 2-3 rows in one pass, 4-8 rows in 16-lane 3 x M tiles (avx2:
        # 3 x 4), more in blocks of 8 (avx2: 4) with a last block of 1-7; 1..301 weight
        # rows: whole tiles of three, one or two left over, pool chunks.
        for n in (1, 2, 4, 7, 301):
            w = Weight(rng.standard_normal((n, k), dtype=np.float32), 0)
            for m in range(1, 18):
                x = rng.standard_normal((m, k), dtype=np.float32)
                got = {v: kern.matmul(x, w).tobytes() for v, kern in kernels.items()}
                assert got["avx512"] == got["avx2"], (n, m)
    finally:
        for kern in kernels.values():
            kern.close()


def _rows_at(offset: int, m: int, k: int, seed: int) -> np.ndarray:
    """A C-contiguous [m, k] float32 array whose data starts `offset` bytes past a 64-byte
    boundary (a view into a larger buffer)."""
    buf = np.empty(m * k + 32, np.float32)
    skip = ((offset - buf.ctypes.data) % 64) // 4
    x = buf[skip : skip + m * k].reshape(m, k)
    x[...] = np.random.default_rng(seed).standard_normal((m, k), dtype=np.float32)
    assert x.ctypes.data % 64 == offset
    return x


@pytest.mark.parametrize("offset", [0, 16, 24, 48])
def test_float_products_are_the_same_bytes_at_any_activation_alignment(offset: int) -> None:
    """The 16-lane tiles want activation rows on 64-byte lines: products copy other rows to an
    aligned buffer (aligned.c) first. The bytes must not depend on where the rows were."""
    from colibri.accelerated.kernels import Kernels, Weight

    kernels = {v: Kernels(2, ctypes.CDLL(str(library(v)))) for v in VARIANTS}
    try:
        for k in (64, 1024):
            w = Weight(np.random.default_rng(k).standard_normal((37, k), dtype=np.float32), 0)
            for m in range(1, 10):
                x = _rows_at(offset, m, k, seed=m)
                got = {v: kern.matmul(x, w).tobytes() for v, kern in kernels.items()}
                assert got["avx512"] == got["avx2"], (k, m)
                assert kernels["avx512"].matmul(np.array(x), w).tobytes() == got["avx512"]
    finally:
        for kern in kernels.values():
            kern.close()


QUANT_CASES: list[tuple[str, dict[str, int], tuple[int, int]]] = [
    ("int8-row", {}, (37, 77)),
    ("int8-row", {}, (5, 1024)),
    ("int4-row", {}, (37, 77)),
    ("int4-row", {}, (9, 513)),
    *[("int4-grouped", {"group_size": gs}, (11, 301)) for gs in (16, 32, 48, 64, 128)],
    *[("int4-grouped", {"group_size": gs}, (64, 1024)) for gs in (64, 128)],
    ("fp8-e4m3-b128", {}, (130, 300)),
    ("fp8-e4m3-b128", {}, (130, 256)),
    ("int2-row", {}, (37, 77)),
    ("int3-g64", {}, (6, 333)),
    ("e8-iq3-lattice", {}, (5, 512)),
]


@pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2][0]}x{c[2][1]}")
def test_quantized_products_are_the_avx2_bytes(
    case: tuple[str, dict[str, int], tuple[int, int]],
) -> None:
    from colibri.accelerated import quant_kernels as qk
    from colibri.reference.quant import quantize

    fmt, kw, shape = case
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    payload, scales = quantize(fmt, w, **kw)
    m = qk.quant_matrix(fmt, payload, scales, shape, group_size=kw.get("group_size"))
    libs = {v: qk.QuantKernels.from_path(library(v)) for v in VARIANTS}
    for rows in (1, 2, 3, 4, 7, 8, 9, 13, 37):  # one-to-four-row, buffered and tile paths
        x = np.random.default_rng(rows).standard_normal((rows, shape[1])).astype(np.float32)
        got = {v: lib.matmul(m, x).tobytes() for v, lib in libs.items()}
        assert got["avx512"] == got["avx2"], rows


# Every fixture's teacher-forced logits and a batched decode step, in a process of each
# variant (COLIBRI_ISA picks the library for the whole engine: products, attention, router,
# the one-call layer stack, quantized experts).
_ENGINE_RUN = """
import json, sys
import numpy as np
from colibri.accelerated import load_model
from colibri.resources import fixture_model_dir
out = {}
for name in json.loads(sys.argv[1]):
    d = fixture_model_dir(name)
    ids = json.loads((d / "oracle.json").read_text())["full_ids"]
    m = load_model(d, threads=2)
    assert m.kernels.isa == sys.argv[3], m.kernels.isa
    out[name + "/forward"] = m.forward(ids)
    states = [m.new_state() for _ in range(3)]
    for i, s in enumerate(states):
        m.prefill(s, ids[: 4 + 3 * i])
    out[name + "/batch"] = np.stack(m.decode_batch(states, [7, 8, 9]))
    # 8 rows: the layers' 4-8-row products (dense weights, experts several rows chose).
    states = [m.new_state() for _ in range(8)]
    for i, s in enumerate(states):
        m.prefill(s, ids[: 2 + i])
    out[name + "/batch8"] = np.stack(m.decode_batch(states, list(range(3, 11))))
np.savez(sys.argv[2], **out)
"""


def test_every_fixture_gives_the_avx2_bytes(tmp_path: Path) -> None:
    results = {}
    for variant, isa in (("avx2", "avx2+fma"), ("avx512", "avx2+fma+avx512")):
        out = tmp_path / f"{variant}.npz"
        env = {**os.environ, "COLIBRI_ISA": variant}
        subprocess.run([sys.executable, "-c", _ENGINE_RUN, json.dumps(ALL_FIXTURES), str(out),
                        isa], env=env, check=True, timeout=600)
        with np.load(out) as data:
            results[variant] = {key: data[key].tobytes() for key in data.files}
    assert results["avx512"].keys() == results["avx2"].keys()
    differ = [key for key in results["avx2"] if results["avx512"][key] != results["avx2"][key]]
    assert not differ
