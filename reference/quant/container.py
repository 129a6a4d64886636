"""Reading a colibri container: quantized tensors resolved by byte size, dequantized on use.

A quantized tensor is a flat ``U8`` blob under its HF name plus a ``<name>.qs`` F32 sidecar;
any other weight is a plain F32/F16/BF16 tensor. :class:`QuantContainer` turns either into the
``[O, I]`` float32 weights the model math wants, checking every rule of the format on the way.

Spec: spec/model.md §14 "Container".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from colibri.reference.quant.codec import dequantize
from colibri.reference.quant.errors import QuantFormatError
from colibri.reference.quant.formats import Fmt
from colibri.reference.quant.resolve import Resolved, resolve_format
from colibri.reference.quant.safetensors_file import SafetensorsDir

SCALE_SUFFIX = ".qs"
T = TypeVar("T")


@dataclass(frozen=True)
class TensorFormat:
    """How one weight is stored: its resolved format and its bytes on disk."""

    name: str
    fmt: Fmt
    group_size: int
    payload_bytes: int
    scale_bytes: int

    @property
    def nbytes(self) -> int:
        return self.payload_bytes + self.scale_bytes


class QuantContainer:
    """A model directory's tensors, with quantized ones resolved and dequantized on request."""

    def __init__(self, files: SafetensorsDir) -> None:
        self.files = files

    @classmethod
    def open(cls, directory: str | Path) -> QuantContainer:
        return cls(SafetensorsDir(directory))

    def __contains__(self, name: object) -> bool:
        return name in self.files

    def is_quantized(self, name: str) -> bool:
        return name + SCALE_SUFFIX in self.files

    def has_quantized_tensors(self) -> bool:
        return any(n.endswith(SCALE_SUFFIX) for n in self.files.tensors)

    def tensor_format(self, name: str, shape: tuple[int, int]) -> TensorFormat:
        """Resolve how ``name`` (of model shape ``[O, I]``) is stored, or refuse it."""
        rows, cols = shape
        entry = self.files.entry(name)
        if not self.is_quantized(name):
            if entry.dtype == "U8":
                raise QuantFormatError(
                    name, f"U8 weight without its {name}{SCALE_SUFFIX} scale sidecar"
                )
            if entry.shape != (rows, cols):
                raise QuantFormatError(
                    name, f"stored shape {list(entry.shape)} is not the model's {[rows, cols]}"
                )
            return TensorFormat(name, Fmt.F32, 0, entry.nbytes, 0)
        if entry.dtype != "U8":
            raise QuantFormatError(name, f"quantized payload must be U8, stored as {entry.dtype}")
        scale = self.files.entry(name + SCALE_SUFFIX)
        resolved: Resolved = resolve_format(
            name,
            rows,
            cols,
            entry.nbytes,
            scale.nbytes,
            scale_dtype=scale.dtype,
            stamp=self.files.stamps.get(name),
        )
        return TensorFormat(name, resolved.fmt, resolved.group_size, entry.nbytes, scale.nbytes)

    def weight(self, name: str, shape: tuple[int, int]) -> npt.NDArray[np.float32]:
        """The ``[O, I]`` float32 weights of ``name``, whatever format stores them."""
        info = self.tensor_format(name, shape)
        if info.fmt == Fmt.F32:
            return self.files.float32(name)
        return self.decode(info, shape, dequantize)

    def decode(self, info: TensorFormat, shape: tuple[int, int], decoder: Callable[..., T]) -> T:
        """A quantized tensor's stored parts handed to ``decoder`` in the order
        ``dequantize`` takes them (format, payload, scales, shape; group_size and name by
        keyword): the reference dequantizes, the accelerated path keeps them quantized."""
        return decoder(
            info.fmt,
            self.files.raw(info.name),
            self.files.array(info.name + SCALE_SUFFIX),
            shape,
            group_size=info.group_size or None,
            name=info.name,
        )

    def vector(self, name: str) -> npt.NDArray[np.float32]:
        """A 1-D float tensor (norms, biases): never quantized."""
        if self.is_quantized(name):
            raise QuantFormatError(name, "1-D tensors (norms, biases) must stay float, not .qs")
        return self.files.float32(name)
