"""The safetensors reader of quantized containers (the format colibri uses).

File layout: an 8-byte little-endian header length, a JSON header
``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}``, then the
data; offsets are relative to the first data byte. Tensors are memory-mapped, so opening a
directory costs only the headers. ``__metadata__["colibri.fmt"]`` (a JSON-encoded map of
tensor name to format name) is collected across shards; conflicting claims are refused.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from colibri.reference.errors import CheckpointError
from colibri.reference.safetensors import DTYPES, write_safetensors

#: Headers larger than this are refused: real ones are kilobytes to a few megabytes.
MAX_HEADER_BYTES = 256 << 20
FMT_STAMP_KEY = "colibri.fmt"


class ContainerError(CheckpointError):
    """A safetensors file or directory that cannot be read as a container."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute offset of the first data byte in the file
    nbytes: int


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The parsed JSON header and the absolute offset where the data starts."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ContainerError(f"{path}: truncated safetensors file (no header length)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            raise ContainerError(f"{path}: header of {length} bytes is larger than allowed")
        text = fh.read(length)
    if len(text) != length:
        raise ContainerError(f"{path}: truncated safetensors header")
    try:
        header = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContainerError(f"{path}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ContainerError(f"{path}: header is not a JSON object")
    return header, 8 + length


class SafetensorsDir:
    """Every tensor of the ``*.safetensors`` files of a directory, by name."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise ContainerError(f"{self.directory}: no .safetensors files")
        self.tensors: dict[str, TensorEntry] = {}
        self.stamps: dict[str, str] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        self._maps: dict[Path, np.memmap[Any, np.dtype[np.uint8]]] = {}
        for path in files:
            self._add_file(path)

    def _add_file(self, path: Path) -> None:
        header, data_start = read_header(path)
        size = path.stat().st_size
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise ContainerError(f"{path}: __metadata__ must map strings to strings")
        self.metadata[path.name] = meta
        if FMT_STAMP_KEY in meta:
            self._add_stamps(path, meta[FMT_STAMP_KEY])
        for name, info in header.items():
            entry = self._entry(path, name, info, data_start, size)
            if name in self.tensors:
                raise ContainerError(
                    f"{name}: stored twice ({self.tensors[name].path.name} and {path.name})"
                )
            self.tensors[name] = entry

    def _entry(self, path: Path, name: str, info: Any, start: int, size: int) -> TensorEntry:
        if not isinstance(info, dict):
            raise ContainerError(f"{path}: {name}: header entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPES:
            raise ContainerError(f"{path}: {name}: unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ContainerError(f"{path}: {name}: bad shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
            or start + offsets[1] > size
        ):
            raise ContainerError(f"{path}: {name}: data_offsets {offsets!r} out of range")
        nbytes = offsets[1] - offsets[0]
        count = int(np.prod(shape, dtype=np.int64))
        if nbytes != count * DTYPES[dtype].itemsize:
            raise ContainerError(
                f"{path}: {name}: {nbytes} bytes do not hold {dtype} of shape {shape}"
            )
        return TensorEntry(name, path, dtype, tuple(shape), start + offsets[0], nbytes)

    def _add_stamps(self, path: Path, raw: str) -> None:
        try:
            stamps = json.loads(raw)
        except json.JSONDecodeError:
            raise ContainerError(f"{path}: __metadata__[{FMT_STAMP_KEY!r}] is not JSON") from None
        if not isinstance(stamps, dict) or not all(isinstance(v, str) for v in stamps.values()):
            raise ContainerError(f"{path}: {FMT_STAMP_KEY} must be a JSON map of name -> format")
        for name, fmt in stamps.items():
            previous = self.stamps.get(name)
            if previous is not None and previous != fmt:
                raise ContainerError(
                    f"{name}: {FMT_STAMP_KEY} stamps disagree ({previous!r} vs {fmt!r})"
                )
            self.stamps[name] = fmt

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def entry(self, name: str) -> TensorEntry:
        try:
            return self.tensors[name]
        except KeyError:
            raise ContainerError(f"{name}: tensor missing from {self.directory}") from None

    def raw(self, name: str) -> npt.NDArray[np.uint8]:
        """The tensor's bytes (a read-only memory map slice)."""
        entry = self.entry(name)
        mm = self._maps.get(entry.path)
        if mm is None:
            mm = np.memmap(entry.path, dtype=np.uint8, mode="r")
            self._maps[entry.path] = mm
        return mm[entry.offset : entry.offset + entry.nbytes]

    def array(self, name: str) -> npt.NDArray[Any]:
        """The tensor with its stored dtype and shape (read-only view)."""
        entry = self.entry(name)
        return self.raw(name).view(DTYPES[entry.dtype]).reshape(entry.shape)

    def float32(self, name: str) -> npt.NDArray[np.float32]:
        """A float tensor (F32/F16/BF16) converted to a float32 copy."""
        entry = self.entry(name)
        if entry.dtype not in ("F32", "F16", "BF16"):
            raise ContainerError(f"{name}: expected a float tensor, stored as {entry.dtype}")
        return self.array(name).astype(np.float32)


__all__ = ["ContainerError", "SafetensorsDir", "TensorEntry", "read_header", "write_safetensors"]
