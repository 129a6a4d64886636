"""A memory-mapped safetensors reader: tensors are views into the file, never read eagerly.

The format: an 8-byte little-endian header length, a JSON header mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end of the
header), then the raw little-endian data. A sharded checkpoint adds
``model.safetensors.index.json`` whose ``weight_map`` names the shard of every tensor.

Opening a checkpoint maps each file once (``mmap``); a tensor is a numpy view of its bytes,
so its pages are only read when the math touches them, and the OS can drop them again.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
from colibri.reference.aligned_write import write_in_aligned_chunks
from colibri.reference.errors import CheckpointError

#: safetensors dtype names -> numpy dtypes (little-endian). FP8 and bf16 come from ml_dtypes.
DTYPES: dict[str, np.dtype[np.generic]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    # UE8M0 block exponents: readable so the quantized-container check can refuse them by rule.
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "F64": np.dtype("<f8"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "I16": np.dtype("<i2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
}

#: Dtypes that convert to float32 for the math.
FLOAT_DTYPES = ("F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F64")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute byte offset in the file
    end: int


class SafetensorsFile:
    """One mapped .safetensors file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with path.open("rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: cannot map the file ({exc})") from exc
        self.tensors = self._parse_header()

    def _parse_header(self) -> dict[str, TensorInfo]:
        size = len(self._map)
        if size < 8:
            raise CheckpointError(f"{self.path}: too short to be a safetensors file")
        header_len = int.from_bytes(self._map[:8], "little")
        if header_len <= 0 or 8 + header_len > size:
            raise CheckpointError(f"{self.path}: header length {header_len} is out of range")
        try:
            header = json.loads(self._map[8 : 8 + header_len])
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{self.path}: header is not valid JSON ({exc})") from exc
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: header must be a JSON object")
        data_start = 8 + header_len
        out: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            if not isinstance(entry, dict):
                raise CheckpointError(f"{self.path}: tensor {name}: entry must be an object")
            dtype = entry.get("dtype")
            shape = entry.get("shape")
            offsets = entry.get("data_offsets")
            if dtype not in DTYPES:
                raise CheckpointError(f"{self.path}: tensor {name}: unsupported dtype {dtype!r}")
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and d >= 0 for d in shape
            ):
                raise CheckpointError(f"{self.path}: tensor {name}: bad shape {shape!r}")
            if (
                not isinstance(offsets, list)
                or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)
            ):
                raise CheckpointError(f"{self.path}: tensor {name}: bad data_offsets")
            begin, end = data_start + offsets[0], data_start + offsets[1]
            count = int(np.prod(shape, dtype=np.int64))
            if end > size or begin > end or end - begin != count * DTYPES[dtype].itemsize:
                raise CheckpointError(
                    f"{self.path}: tensor {name}: data_offsets do not match dtype and shape "
                    "or run past the end of the file"
                )
            out[name] = TensorInfo(name, dtype, tuple(shape), self.path, begin, end)
        return out

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The stored tensor as a read-only view of the mapped file (its stored dtype)."""
        dtype = DTYPES[info.dtype]
        count = int(np.prod(info.shape, dtype=np.int64))
        flat = np.frombuffer(self._map, dtype=dtype, count=count, offset=info.begin)
        return flat.reshape(info.shape)


#: Multimodal checkpoints keep their text model under a wrapper's prefix (transformers 5.24
#: saves ``kimi_k25`` as ``model.language_model.*``; Kimi's own files use
#: ``language_model.model.*`` and ``language_model.lm_head.*``). The reference reads a text
#: model's names, so a wrapper prefix is read as the text model's own; other tensors of the
#: wrapper (a vision tower) are present and never read.
WRAPPER_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                    ("language_model.lm_head.", "lm_head."))


def text_model_name(name: str) -> str:
    for prefix, text in WRAPPER_PREFIXES:
        if name.startswith(prefix):
            return text + name[len(prefix):]
    return name


class Checkpoint:
    """Every tensor of a model directory (single file or sharded), by its text-model name."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.files: dict[Path, SafetensorsFile] = {}
        self.tensors: dict[str, TensorInfo] = {}
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: no usable weight_map ({exc})") from exc
            shards = sorted(set(weight_map.values()))
        else:
            shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
        if not shards:
            raise CheckpointError(f"{model_dir}: no .safetensors files")
        for shard in shards:
            path = model_dir / shard
            if not path.is_file():
                raise CheckpointError(f"{model_dir}: shard {shard} is missing")
            f = SafetensorsFile(path)
            self.files[path] = f
            for stored, info in f.tensors.items():
                name = text_model_name(stored)
                if name in self.tensors:
                    raise CheckpointError(f"{model_dir}: tensor {name} appears in two shards")
                self.tensors[name] = info

    @property
    def total_bytes(self) -> int:
        return sum(info.end - info.begin for info in self.tensors.values())

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.model_dir}: missing tensor {name}") from None

    def raw(self, name: str) -> np.ndarray:
        info = self.info(name)
        return self.files[info.file].raw(info)

    def float32(self, name: str) -> np.ndarray:
        """The tensor as float32: a zero-copy view when stored as aligned F32, else converted."""
        info = self.info(name)
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"tensor {name}: dtype {info.dtype} is not a float type")
        raw = self.files[info.file].raw(info)
        if info.dtype == "F32" and raw.flags.aligned:
            return raw
        return raw.astype(np.float32)


#: numpy dtype -> safetensors name (the inverse of DTYPES).
DTYPE_NAMES: dict[np.dtype[np.generic], str] = {dt: name for name, dt in DTYPES.items()}


def dtype_name(dtype: np.dtype[np.generic]) -> str:
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        raise CheckpointError(f"no safetensors dtype for numpy dtype {dtype}")
    return name


def write_safetensors(
    path: str | Path,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
    *,
    by_name: bool = False,
) -> None:
    """Write tensors as one safetensors file (the only writer: checkpoints and containers).

    The data has no holes (the format forbids them) and the header is padded to 8 bytes.
    Tensors go widest dtype first, then by name, so every tensor starts at a multiple of its
    element size (what safetensors does); ``by_name`` orders by name alone, the layout of the
    quantized containers ``colibri convert`` writes (their committed fixtures are byte-checked).
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    if by_name:
        order = sorted(tensors)
    else:
        order = sorted(tensors, key=lambda n: (-tensors[n].dtype.itemsize, n))
    offset = 0
    blobs: list[memoryview] = []
    for name in order:
        array = np.ascontiguousarray(tensors[name])
        dtype = DTYPE_NAMES.get(array.dtype)
        if dtype is None:
            raise CheckpointError(f"{name}: cannot store numpy dtype {array.dtype}")
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        # the bytes in place (a uint8 view: every dtype, ml_dtypes' included, exports one)
        blobs.append(array.reshape(-1).view(np.uint8).data)
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * ((-len(encoded)) % 8)
    # Aligned whole-chunk writes, so the page cache holds the file in large folios for the
    # memory map that reads it next (aligned_write.py).
    with open(path, "wb", buffering=0) as fh:
        write_in_aligned_chunks(fh, [len(encoded).to_bytes(8, "little"), encoded, *blobs])


def read_all(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of one file, copied into memory in its stored dtype (for tools and tests)."""
    f = SafetensorsFile(path)
    return {name: np.array(f.raw(info)) for name, info in f.tensors.items()}
