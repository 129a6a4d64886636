"""colibri's quantized weight formats (fmt 0-6, 8): codecs, the fmt6 rotation, containers.

Public API: :func:`dequantize`, :func:`quantize`, :class:`Fmt`, :data:`FORMAT_NAMES`,
:class:`QuantFormatError`, and the rotation helpers :func:`rotate_rows`,
:func:`rotate_activations`, :func:`unrotate_rows`.

Spec: spec/model.md §14.
"""

from __future__ import annotations

from colibri.reference.quant.codec import dequantize, dequantize_stored, quantize
from colibri.reference.quant.errors import QuantFormatError
from colibri.reference.quant.formats import FORMAT_NAMES, FORMATS_BY_NAME, Fmt
from colibri.reference.quant.hadamard import rotate_activations, rotate_rows, unrotate_rows

__all__ = [
    "FORMATS_BY_NAME",
    "FORMAT_NAMES",
    "Fmt",
    "QuantFormatError",
    "dequantize",
    "dequantize_stored",
    "quantize",
    "rotate_activations",
    "rotate_rows",
    "unrotate_rows",
]
