"""Bench section ``quant-kernels``: the fused dequantize-and-dot kernels per expert format.

For each format, one ``[out, in]`` matrix of random weights (the bench model's expert shape
when ``--model`` gives one, else 2048 x 2048) is quantized once; then, alone in this process
and one thread, the best of ``repeats`` runs of:

* ``fused``: ``colibri.accelerated.quant_kernels.qmatmul`` on a batch of ``rows`` activation
  rows (1 = decode), reported as packed GB/s (payload + ``.qs`` bytes read per second) and ms;
* ``numpy``: what the reference does on a cache miss, ``dequantize`` then ``x @ W.T``;
* ``speedup``: numpy time / fused time, measured side by side in the same run;
* ``batch_sharing``: how many times faster one call on ``--batch`` rows is than that many
  one-row calls (the weights are decoded once per pair of rows).

Both library variants are measured when the CPU runs avx2 (``generic`` is the portable
fallback). Only a benchmark: no test times anything.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import numpy as np

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.stats import best_seconds
from colibri.control_plane import rebuild_hint

#: (format, int4-grouped group size or None)
FORMATS: tuple[tuple[str, int | None], ...] = (
    ("int8-row", None),
    ("int4-row", None),
    ("int4-grouped", 64),
    ("int4-grouped", 128),
    ("int3-g64", None),
    ("int2-row", None),
    ("fp8-e4m3-b128", None),
    ("e8-iq3-lattice", None),
)


def _shape(options: BenchOptions) -> tuple[int, int]:
    if "quant_shape" in options.extra:
        out_f, in_f = options.extra["quant_shape"]
        return int(out_f), int(in_f)
    if options.model is not None and (options.model / "config.json").is_file():
        cfg = json.loads((options.model / "config.json").read_text(encoding="utf-8"))
        inter, hidden = int(cfg["moe_intermediate_size"]), int(cfg["hidden_size"])
        if hidden % 256 == 0:
            return inter, hidden
    return 2048, 2048


def run(options: BenchOptions) -> dict[str, Any]:
    try:
        from colibri.accelerated.native import LibraryNotBuilt, supported_variants
        from colibri.accelerated.native_build import DEFAULT_OUT, LIBRARY_NAME
        from colibri.accelerated.quant_kernels import QuantKernels, quant_matrix
    except ImportError as exc:  # pragma: no cover - a partial install
        return {"skipped": f"accelerated package unavailable: {exc}"}
    from colibri.reference.quant import dequantize, quantize

    libs: dict[str, QuantKernels] = {}
    for variant in supported_variants():
        path = DEFAULT_OUT / variant / LIBRARY_NAME
        if path.is_file():
            libs[variant] = QuantKernels.from_path(path)
    if not libs:
        return {"skipped": str(LibraryNotBuilt(f"the C library is not built: {rebuild_hint()}"))}
    rows = int(options.extra.get("quant_rows", 1))
    batch = max(1, options.batch)
    repeats = int(options.extra.get("quant_repeats", 10))
    out_f, in_f = _shape(options)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((out_f, in_f)).astype(np.float32) * np.float32(0.02)
    x = rng.standard_normal((rows, in_f)).astype(np.float32)
    results: dict[str, Any] = {}
    for fmt, gs in FORMATS:
        label = fmt if gs is None else f"{fmt}-{gs}"
        payload, scales = quantize(fmt, w) if gs is None else quantize(fmt, w, group_size=gs)
        nbytes = int(payload.nbytes + scales.nbytes)

        def numpy_path(fmt: str = fmt, payload: Any = payload, scales: Any = scales,
                       gs: int | None = gs) -> object:
            return x @ dequantize(fmt, payload, scales, (out_f, in_f), group_size=gs).T

        numpy_s = best_seconds(numpy_path, max(2, repeats // 4))
        entry: dict[str, Any] = {
            "packed_bytes": nbytes,
            "numpy_ms": round(numpy_s * 1e3, 3),
            "numpy_gbps": round(nbytes / numpy_s / 1e9, 3),
        }
        for variant, k in libs.items():
            m = quant_matrix(fmt, payload, scales, (out_f, in_f), group_size=gs, lib=k)
            out = np.empty((rows, out_f), dtype=np.float32)
            k.matmul(m, x, out=out)  # warm the pages and caches
            fused = best_seconds(partial(k.matmul, m, x, out=out), repeats)
            xb = rng.standard_normal((batch, in_f)).astype(np.float32)
            outb = np.empty((batch, out_f), dtype=np.float32)
            k.matmul(m, xb, out=outb)
            batched = best_seconds(partial(k.matmul, m, xb, out=outb), repeats)
            entry[variant] = {
                "fused_ms": round(fused * 1e3, 3),
                "fused_gbps": round(nbytes / fused / 1e9, 3),
                "speedup_vs_numpy": round(numpy_s / fused, 2),
                # ``batch`` rows in one call against that many calls of ``rows`` rows
                "batch_ms": round(batched * 1e3, 3),
                "batch_sharing": round(fused * batch / rows / batched, 2),
            }
        results[label] = entry
    return {
        "shape": [out_f, in_f],
        "rows": rows,
        "batch": batch,
        "threads": 1,
        "variants": list(libs),
        "formats": results,
    }


register(Section(
    name="quant-kernels",
    engines=("accelerated",),
    description="fused dequantize-and-dot per expert format: GB/s vs numpy dequantize+matmul",
    run=run,
))
