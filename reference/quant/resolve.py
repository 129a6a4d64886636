"""Which format a stored tensor is in, from its byte sizes (colibri's ``qt_resolve_fmt``).

Inputs: the tensor's ``[O, I]`` shape from the model config, the payload's byte count ``nb``,
the ``.qs`` sidecar's byte count ``ns`` and dtype, and the optional ``colibri.fmt`` stamp.
Every format whose payload AND scale sizes both fit is a candidate. Unstamped ties resolve as
colibri does: int8-row over fp8 (the fmt1/fmt8 byte collision), int4-grouped over int4-row,
row formats over int3-g64; an e8 vs fp8 tie (width 98) is refused. A stamp must name one of
the candidates and then decides. Anything else is refused with the tensor named.

Spec: spec/model.md §14 "Format resolution".
"""

from __future__ import annotations

from dataclasses import dataclass

from colibri.reference.quant.errors import QuantFormatError
from colibri.reference.quant.formats import (
    FORMAT_NAMES,
    FORMATS_BY_NAME,
    GROUP_SIZES,
    Fmt,
    ceil_div,
    payload_nbytes,
    scale_count,
)


@dataclass(frozen=True)
class Resolved:
    fmt: Fmt
    group_size: int = 0

    @property
    def name(self) -> str:
        return FORMAT_NAMES[self.fmt]


#: Unstamped precedence among candidates that fit the same bytes.
_PRECEDENCE = (
    Fmt.E8_IQ3,
    Fmt.INT8_ROW,
    Fmt.FP8_E4M3_B128,
    Fmt.INT4_GROUPED,
    Fmt.INT4_ROW,
    Fmt.INT2_ROW,
    Fmt.INT3_G64,
)


def candidates(rows: int, cols: int, nb: int, ns: int) -> list[Resolved]:
    """Every format whose payload and ``.qs`` byte counts both fit ``[rows, cols]``."""
    found: list[Resolved] = []
    if ns == 4 and nb == payload_nbytes(Fmt.E8_IQ3, rows, cols):
        found.append(Resolved(Fmt.E8_IQ3))
    if nb == rows * cols:
        if ns == 4 * rows:
            found.append(Resolved(Fmt.INT8_ROW))
        if ns == 4 * scale_count(Fmt.FP8_E4M3_B128, rows, cols):
            found.append(Resolved(Fmt.FP8_E4M3_B128))
    if nb == payload_nbytes(Fmt.INT4_ROW, rows, cols):
        for gs in GROUP_SIZES:
            if gs > cols:
                break
            if ns == 4 * rows * ceil_div(cols, gs):
                found.append(Resolved(Fmt.INT4_GROUPED, gs))
                break
        if ns == 4 * rows:
            found.append(Resolved(Fmt.INT4_ROW))
    if nb == payload_nbytes(Fmt.INT2_ROW, rows, cols) and ns == 4 * rows:
        found.append(Resolved(Fmt.INT2_ROW))
    if nb == payload_nbytes(Fmt.INT3_G64, rows, cols) and ns == 4 * scale_count(
        Fmt.INT3_G64, rows, cols
    ):
        found.append(Resolved(Fmt.INT3_G64))
    return sorted(found, key=lambda r: _PRECEDENCE.index(r.fmt))


def _families_by_payload(rows: int, cols: int, nb: int) -> list[Fmt]:
    return [
        f
        for f in (Fmt.E8_IQ3, Fmt.INT8_ROW, Fmt.INT4_ROW, Fmt.INT2_ROW, Fmt.INT3_G64)
        if nb == payload_nbytes(f, rows, cols)
    ]


def resolve_format(
    name: str,
    rows: int,
    cols: int,
    nb: int,
    ns: int,
    *,
    scale_dtype: str = "F32",
    stamp: str | None = None,
) -> Resolved:
    """Resolve the format of quantized tensor ``name`` or raise :class:`QuantFormatError`."""
    shape = f"[{rows}, {cols}]"
    fp8_blocks = scale_count(Fmt.FP8_E4M3_B128, rows, cols)
    ue8m0 = scale_dtype == "F8_E8M0" or (scale_dtype == "U8" and ns == fp8_blocks)
    if nb == rows * cols and ue8m0:
        raise QuantFormatError(
            name,
            "fp8-e4m3-b128 with UE8M0 block scales (one exponent byte per 128x128 block) is "
            "refused for GLM; the .qs sidecar must hold f32 block scales",
        )
    if scale_dtype != "F32":
        raise QuantFormatError(name, f".qs sidecar must be F32, got {scale_dtype}")
    found = candidates(rows, cols, nb, ns)
    if stamp is not None:
        stamped = FORMATS_BY_NAME.get(stamp)
        if stamped is None or stamped == Fmt.F32:
            raise QuantFormatError(
                name, f"colibri.fmt stamp names {stamp!r}, which is not a quantized format"
            )
        for cand in found:
            if cand.fmt == stamped:
                return cand
        inferred = ", ".join(c.name for c in found) or "no format"
        raise QuantFormatError(
            name,
            f"colibri.fmt stamp says {stamp} but the byte sizes ({nb} payload, {ns} .qs) "
            f"of {shape} fit {inferred}",
        )
    if not found:
        families = _families_by_payload(rows, cols, nb)
        if not families:
            raise QuantFormatError(
                name,
                f"quantized payload is {nb} bytes: no int8/int4/int2/int3-g64/e8/fp8 layout of "
                f"{shape} has that size",
            )
        fam = families[0]
        if fam == Fmt.E8_IQ3:
            expected = "4 (the e8 tag)"
        elif fam == Fmt.INT4_ROW:
            expected = f"{4 * rows} (per row) or {4 * rows}*groups (grouped)"
        else:
            expected = str(4 * scale_count(fam, rows, cols))
        raise QuantFormatError(
            name,
            f".qs scale array is {ns} bytes; {FORMAT_NAMES[fam]} {shape} expects {expected}",
        )
    fmts = {c.fmt for c in found}
    if Fmt.E8_IQ3 in fmts and Fmt.FP8_E4M3_B128 in fmts:
        raise QuantFormatError(
            name,
            f"byte sizes of {shape} fit both e8-iq3-lattice and fp8-e4m3-b128; a colibri.fmt "
            "stamp is required to tell them apart",
        )
    return found[0]
