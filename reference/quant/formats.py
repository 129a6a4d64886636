"""colibri's quantized weight formats: ordinals, names and byte arithmetic.

A container never stores the format of a tensor. The reader infers it from the byte sizes of
the payload and of its ``.qs`` scale sidecar against the tensor's ``[O, I]`` shape, exactly
as colibri's ``qt_resolve_fmt`` does; this module holds that arithmetic.

Spec: spec/model.md §14.
"""

from __future__ import annotations

from enum import IntEnum


class Fmt(IntEnum):
    """colibri's public format ordinals (7 = MXFP4 is Vulkan-only and not a CPU format)."""

    F32 = 0
    INT8_ROW = 1
    INT4_ROW = 2
    INT2_ROW = 3
    INT4_GROUPED = 4
    INT3_G64 = 5
    E8_IQ3 = 6
    FP8_E4M3_B128 = 8


#: The registry names (colibri's FMT_NAMES); the ``colibri.fmt`` stamp uses these strings.
FORMAT_NAMES: dict[Fmt, str] = {
    Fmt.F32: "f32",
    Fmt.INT8_ROW: "int8-row",
    Fmt.INT4_ROW: "int4-row",
    Fmt.INT2_ROW: "int2-row",
    Fmt.INT4_GROUPED: "int4-grouped",
    Fmt.INT3_G64: "int3-g64",
    Fmt.E8_IQ3: "e8-iq3-lattice",
    Fmt.FP8_E4M3_B128: "fp8-e4m3-b128",
}
FORMATS_BY_NAME: dict[str, Fmt] = {name: fmt for fmt, name in FORMAT_NAMES.items()}

#: Group sizes the reader recognises for int4-grouped, finest first (colibri probes in this
#: order and takes the first whose scale count matches).
GROUP_SIZES: tuple[int, ...] = (16, 32, 48, 64, 96, 128, 192, 256)

INT3_GROUP = 64
INT3_GROUP_BYTES = 24
E8_BLOCK = 256
E8_SUB_BLOCK = 32
E8_BLOCK_BYTES = 98
FP8_BLOCK = 128
#: The single float a fmt6 ``.qs`` sidecar holds: a tag, not a scale.
E8_QS_TAG = 6.0


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def payload_nbytes(fmt: Fmt, rows: int, cols: int) -> int:
    """Bytes of the weight payload of an ``[rows, cols]`` tensor in ``fmt``."""
    if fmt == Fmt.F32:
        return rows * cols * 4
    if fmt in (Fmt.INT8_ROW, Fmt.FP8_E4M3_B128):
        return rows * cols
    if fmt in (Fmt.INT4_ROW, Fmt.INT4_GROUPED):
        return rows * ceil_div(cols, 2)
    if fmt == Fmt.INT2_ROW:
        return rows * ceil_div(cols, 4)
    if fmt == Fmt.INT3_G64:
        return rows * ceil_div(cols, INT3_GROUP) * INT3_GROUP_BYTES
    if fmt == Fmt.E8_IQ3:
        return rows * ceil_div(cols, E8_BLOCK) * E8_BLOCK_BYTES
    raise ValueError(f"unknown format {fmt!r}")


def scale_count(fmt: Fmt, rows: int, cols: int, group_size: int = 0) -> int:
    """Number of f32 values in the ``.qs`` sidecar of an ``[rows, cols]`` tensor in ``fmt``."""
    if fmt == Fmt.F32:
        return 0
    if fmt in (Fmt.INT8_ROW, Fmt.INT4_ROW, Fmt.INT2_ROW):
        return rows
    if fmt == Fmt.INT4_GROUPED:
        if group_size <= 0:
            raise ValueError("int4-grouped needs a positive group size")
        return rows * ceil_div(cols, group_size)
    if fmt == Fmt.INT3_G64:
        return rows * ceil_div(cols, INT3_GROUP)
    if fmt == Fmt.E8_IQ3:
        return 1
    if fmt == Fmt.FP8_E4M3_B128:
        return ceil_div(rows, FP8_BLOCK) * ceil_div(cols, FP8_BLOCK)
    raise ValueError(f"unknown format {fmt!r}")


def parse_format(value: int | str | Fmt) -> Fmt:
    """Accept an ordinal, a registry name or a :class:`Fmt`; refuse anything else."""
    if isinstance(value, Fmt):
        return value
    if isinstance(value, str):
        if value in FORMATS_BY_NAME:
            return FORMATS_BY_NAME[value]
        raise ValueError(
            f"unknown quantized format name {value!r}; known: {sorted(FORMATS_BY_NAME)}"
        )
    try:
        return Fmt(value)
    except ValueError:
        raise ValueError(
            f"unknown quantized format ordinal {value!r}; known: {[int(f) for f in Fmt]}"
        ) from None
