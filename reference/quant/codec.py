"""``quantize`` / ``dequantize`` for every colibri format, with the checks a reader owes.

``dequantize(fmt, payload, scales, shape)`` returns the ``[O, I]`` float32 weights in the
model's own domain: for fmt6 the stored ``W Q`` is un-rotated back to ``W`` (use
:func:`dequantize_stored` for the rotated values a fmt6 kernel multiplies with ``Q^T x``).
``quantize(fmt, weights, **params)`` returns ``(payload, scales)``: the flat ``uint8`` blob and
the flat ``float32`` ``.qs`` sidecar exactly as a container stores them.

Spec: spec/model.md §14.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from colibri.reference.quant import e8_iq3, fp8, hadamard, int3, int_grouped, int_row
from colibri.reference.quant.absmax import check_weights
from colibri.reference.quant.errors import QuantFormatError
from colibri.reference.quant.formats import (
    E8_BLOCK,
    E8_QS_TAG,
    FORMAT_NAMES,
    GROUP_SIZES,
    Fmt,
    ceil_div,
    parse_format,
    payload_nbytes,
    scale_count,
)
from colibri.reference.tensors import F32, U8

DEFAULT_GROUP_SIZE = 64


def _shape(shape: Sequence[int], name: str) -> tuple[int, int]:
    dims = tuple(int(d) for d in shape)
    if len(dims) != 2 or dims[0] <= 0 or dims[1] <= 0:
        raise QuantFormatError(name, f"shape must be [O, I] with positive sizes, got {shape}")
    return dims[0], dims[1]


def _payload(payload: npt.ArrayLike | bytes, fmt: Fmt, rows: int, cols: int, name: str) -> U8:
    if isinstance(payload, bytes | bytearray | memoryview):
        arr = np.frombuffer(payload, dtype=np.uint8)
    else:
        arr = np.asarray(payload)
        if arr.dtype != np.uint8:
            if fmt == Fmt.F32 and arr.dtype == np.float32:
                arr = arr.reshape(-1).view(np.uint8)
            else:
                raise QuantFormatError(name, f"payload must be uint8 bytes, got dtype {arr.dtype}")
    arr = arr.reshape(-1)
    expected = payload_nbytes(fmt, rows, cols)
    if arr.size != expected:
        raise QuantFormatError(
            name,
            f"{FORMAT_NAMES[fmt]} payload of [{rows}, {cols}] must be {expected} bytes, "
            f"got {arr.size}",
        )
    return arr


def _scales(scales: npt.ArrayLike | None, expected: int, fmt: Fmt, name: str) -> F32:
    if scales is None:
        if expected == 0:
            return np.zeros(0, dtype=np.float32)
        raise QuantFormatError(name, f"{FORMAT_NAMES[fmt]} needs a .qs scale sidecar; none given")
    arr = np.asarray(scales)
    if fmt == Fmt.FP8_E4M3_B128 and arr.dtype == np.uint8:
        raise QuantFormatError(
            name,
            "fp8-e4m3-b128 with UE8M0 (one exponent byte per 128x128 block) scales is refused "
            "for GLM; block scales must be f32",
        )
    if arr.dtype != np.float32:
        raise QuantFormatError(name, f".qs scales must be float32, got dtype {arr.dtype}")
    arr = arr.reshape(-1)
    if arr.size != expected:
        raise QuantFormatError(
            name,
            f".qs holds {arr.size} f32 values ({arr.size * 4} bytes); {FORMAT_NAMES[fmt]} "
            f"needs {expected} ({expected * 4} bytes)",
        )
    if not np.all(np.isfinite(arr)):
        bad = int(np.argmax(~np.isfinite(arr)))
        raise QuantFormatError(name, f".qs scale #{bad} is {arr[bad]}: scales must be finite")
    return arr


def group_size_from_scales(rows: int, cols: int, nscales: int) -> int:
    """The finest recognised group size whose scale count matches, else 0."""
    for gs in GROUP_SIZES:
        if gs > cols:
            break
        if nscales == rows * ceil_div(cols, gs):
            return gs
    return 0


def dequantize_stored(
    fmt: int | str | Fmt,
    payload: npt.ArrayLike | bytes,
    scales: npt.ArrayLike | None,
    shape: Sequence[int],
    *,
    group_size: int | None = None,
    name: str = "tensor",
) -> F32:
    """Decode to the values as stored (for fmt6: the rotated ``W Q``)."""
    fmt = parse_format(fmt)
    rows, cols = _shape(shape, name)
    data = _payload(payload, fmt, rows, cols, name)
    if fmt == Fmt.F32:
        return data.view(np.float32).reshape(rows, cols).copy()
    if fmt == Fmt.INT4_GROUPED:
        # The group size is not stored: the scale count gives it (finest match first).
        count = 0 if scales is None else int(np.size(scales))
        gs = group_size or group_size_from_scales(rows, cols, count)
        if gs <= 0:
            raise QuantFormatError(
                name,
                f"int4-grouped scale count {count} matches no group size in "
                f"{list(GROUP_SIZES)} for [{rows}, {cols}]",
            )
        s = _scales(scales, scale_count(fmt, rows, cols, gs), fmt, name)
        return int_grouped.dequantize_int4_grouped(data, s, rows, cols, gs)
    s = _scales(scales, scale_count(fmt, rows, cols), fmt, name)
    if fmt == Fmt.INT8_ROW:
        return int_row.dequantize_int8(data, s, rows, cols)
    if fmt == Fmt.INT4_ROW:
        return int_row.dequantize_int4_row(data, s, rows, cols)
    if fmt == Fmt.INT2_ROW:
        return int_row.dequantize_int2(data, s, rows, cols)
    if fmt == Fmt.INT3_G64:
        return int3.dequantize_int3_g64(data, s, rows, cols)
    if fmt == Fmt.FP8_E4M3_B128:
        if fp8.has_nan_codes(data):
            raise QuantFormatError(name, "fp8 payload holds e4m3 NaN codes (0x7f/0xff)")
        return fp8.dequantize_fp8(data, s, rows, cols)
    # fmt6
    _check_e8(rows, cols, s, name)
    _, _, halves = e8_iq3.split_blocks(data)
    d = e8_iq3.decode_half(halves)
    if not np.all(np.isfinite(d)):
        bad = int(np.argmax(~np.isfinite(d)))
        raise QuantFormatError(name, f"e8 super-block #{bad} has a non-finite fp16 scale")
    return e8_iq3.decode_blocks(data).reshape(rows, cols)


def _check_e8(rows: int, cols: int, scales: F32, name: str) -> None:
    if cols % E8_BLOCK != 0:
        raise QuantFormatError(
            name, f"e8-iq3-lattice needs a width that is a multiple of {E8_BLOCK}, got {cols}"
        )
    if scales.size != 1 or scales[0] != np.float32(E8_QS_TAG):
        raise QuantFormatError(name, f"e8-iq3-lattice .qs must be the single tag {E8_QS_TAG}")


def dequantize(
    fmt: int | str | Fmt,
    payload: npt.ArrayLike | bytes,
    scales: npt.ArrayLike | None,
    shape: Sequence[int],
    *,
    group_size: int | None = None,
    name: str = "tensor",
) -> F32:
    """Decode a quantized tensor to its ``[O, I]`` float32 weights (fmt6 un-rotated)."""
    fmt = parse_format(fmt)
    stored = dequantize_stored(fmt, payload, scales, shape, group_size=group_size, name=name)
    if fmt == Fmt.E8_IQ3:
        return hadamard.unrotate_rows(stored)
    return stored


def quantize(
    fmt: int | str | Fmt,
    weights: npt.ArrayLike,
    *,
    group_size: int = DEFAULT_GROUP_SIZE,
    rotate: bool = True,
    name: str = "tensor",
) -> tuple[U8, F32]:
    """Encode ``[O, I]`` weights; returns ``(payload uint8 flat, scales float32 flat)``.

    ``group_size`` applies to int4-grouped; ``rotate=False`` makes fmt6 encode the rows as
    given (they must already be rotated).
    """
    fmt = parse_format(fmt)
    w = check_weights(weights, name)
    rows, cols = w.shape
    if fmt == Fmt.F32:
        return w.reshape(-1).view(np.uint8).copy(), np.zeros(0, dtype=np.float32)
    if fmt == Fmt.INT8_ROW:
        return int_row.quantize_int8(w)
    if fmt == Fmt.INT4_ROW:
        return int_row.quantize_int4_row(w)
    if fmt == Fmt.INT2_ROW:
        return int_row.quantize_int2(w)
    if fmt == Fmt.INT4_GROUPED:
        if group_size not in GROUP_SIZES:
            raise ValueError(f"{name}: group size {group_size} is not one of {list(GROUP_SIZES)}")
        return int_grouped.quantize_int4_grouped(w, group_size)
    if fmt == Fmt.INT3_G64:
        return int3.quantize_int3_g64(w)
    if fmt == Fmt.FP8_E4M3_B128:
        return fp8.quantize_fp8(w)
    if cols % E8_BLOCK != 0:
        raise QuantFormatError(
            name, f"e8-iq3-lattice needs a width that is a multiple of {E8_BLOCK}, got {cols}"
        )
    stored = hadamard.rotate_rows(w) if rotate else w
    payload = e8_iq3.encode_blocks(stored)
    return payload, np.array([E8_QS_TAG], dtype=np.float32)
