"""``write_in_aligned_chunks``: the bytes of the pieces back to back, written as whole chunks at
multiples of the chunk size (the page cache's large folios depend on it), the last shorter."""

from __future__ import annotations

import io
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from colibri.reference.aligned_write import WRITE_CHUNK, write_in_aligned_chunks
from colibri.reference.safetensors import read_all, write_safetensors
from hypothesis import given
from hypothesis import strategies as st


class RecordingFile(io.RawIOBase):
    """A raw binary file in memory that records where each write lands and how long it is;
    ``most`` caps what one write takes, as a raw stream may."""

    def __init__(self, most: int | None = None) -> None:
        self.data = bytearray()
        self.writes: list[tuple[int, int]] = []
        self.most = most

    def writable(self) -> bool:
        return True

    def write(self, b: object) -> int:
        view = memoryview(b).cast("B")  # type: ignore[arg-type]
        if self.most is not None:
            view = view[:self.most]
        self.writes.append((len(self.data), len(view)))
        self.data.extend(view)
        return len(view)


@given(st.lists(st.binary(max_size=300), max_size=12), st.integers(1, 97))
def test_pieces_land_in_whole_aligned_chunks(pieces: list[bytes], chunk: int) -> None:
    fh = RecordingFile()
    total = write_in_aligned_chunks(fh, pieces, chunk)
    assert bytes(fh.data) == b"".join(pieces) and total == len(fh.data)
    # Every write but the last is one whole chunk at a multiple of the chunk size.
    for at, length in fh.writes[:-1]:
        assert at % chunk == 0 and length == chunk
    if fh.writes:
        at, length = fh.writes[-1]
        assert at % chunk == 0 and 0 < length <= chunk


def test_short_writes_are_continued() -> None:
    fh = RecordingFile(most=5)
    write_in_aligned_chunks(fh, [b"abcdefghijklmnopqrstuvwxyz"], 16)
    assert bytes(fh.data) == b"abcdefghijklmnopqrstuvwxyz"


def test_a_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk must be positive"):
        write_in_aligned_chunks(RecordingFile(), [b"x"], 0)


def test_safetensors_written_in_chunks_read_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    tensors = {
        # larger than one chunk, so the writes cross chunk boundaries inside a tensor
        "big": rng.standard_normal((WRITE_CHUNK // 4 + 1000,)).astype(np.float32),
        "bf16": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
        "i8": np.arange(-7, 7, dtype=np.int8).reshape(2, 7),
        "empty": np.zeros((0, 4), np.float32),
        "strided": rng.standard_normal((6, 6)).astype(np.float32)[:, ::2],
    }
    write_safetensors(tmp_path / "t.safetensors", tensors)
    back = read_all(tmp_path / "t.safetensors")
    assert set(back) == set(tensors)
    for name, array in tensors.items():
        got = back[name]
        assert got.dtype == array.dtype and got.shape == array.shape
        assert got.tobytes() == np.ascontiguousarray(array).tobytes()
