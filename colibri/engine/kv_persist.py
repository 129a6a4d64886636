"""`.coli_kv`: per-slot KV persistence in colibri's COLIKV1 layout (spec/protocol.md 4.3).

    magic "COLIKV1\\0" | 8 x int32: n_layers, kv_lora, qk_rope, index_hd, nic, vocab, nrec, tag
    records: int32 token, then the slot's float32 KV row for that position

Crash safety comes from ordering, as in colibri: new records are written past the committed
ones and synced before the record count (byte 32) is rewritten, so a kill at any moment
leaves a file whose count describes complete records. Truncation and reset rewrite the count
only. Loading trusts nothing: magic, dimensions, model tag, count, token range and float
finiteness are all checked, and a file that fails is ignored with a message on stderr.

COLIKV1 has no room for who wrote the rows, so a sidecar ``<file>.writer`` (JSON: backend and
build) says it. It is written when a file is (re)created, after the file has been emptied and
before any record, so a file's records and its sidecar always belong together. KV rows are
resumed only under the backend and build that wrote them; the caller re-prefills the tokens
otherwise.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt

MAGIC = b"COLIKV1\0"
_HEADER = struct.Struct("<8s8i")
HEADER_SIZE = _HEADER.size  # 40
NREC_OFFSET = 8 + 6 * 4  # 32


@dataclass(frozen=True)
class KvLayout:
    n_layers: int
    kv_lora: int
    qk_rope: int
    index_hd: int
    nic: int
    vocab: int
    tag: int  # model fingerprint; 0 in files written by colibri

    @property
    def record_floats(self) -> int:
        return self.n_layers * (self.kv_lora + self.qk_rope) + self.nic * self.index_hd

    @property
    def record_size(self) -> int:
        return 4 + 4 * self.record_floats

    def header(self, nrec: int) -> bytes:
        return _HEADER.pack(
            MAGIC,
            self.n_layers,
            self.kv_lora,
            self.qk_rope,
            self.index_hd,
            self.nic,
            self.vocab,
            nrec,
            self.tag,
        )


@dataclass(frozen=True)
class KvWriter:
    """The backend (and its build) whose KV rows a file holds."""

    backend: str
    build: str

    def encode(self) -> bytes:
        return (json.dumps({"backend": self.backend, "build": self.build}) + "\n").encode()

    @staticmethod
    def decode(data: bytes) -> KvWriter | None:
        try:
            fields = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            return None
        if not isinstance(fields, dict):
            return None
        backend, build = fields.get("backend"), fields.get("build")
        if not isinstance(backend, str) or not isinstance(build, str):
            return None
        return KvWriter(backend, build)

    def describe(self) -> str:
        return f"{self.backend} ({self.build})"


def writer_file(path: Path) -> Path:
    return path.with_name(path.name + ".writer")


def slot_file(state_dir: Path, slot: int) -> Path:
    return state_dir / (".coli_kv" if slot == 0 else f".coli_kv.{slot}")


@dataclass
class Loaded:
    tokens: list[int]
    rows: npt.NDArray[np.float32]
    #: Who wrote the rows; None for a file without a readable sidecar (colibri writes none).
    writer: KvWriter | None


class KvFile:
    """One slot's file: what is committed on disk (``nrec``) and how to extend it."""

    def __init__(self, path: Path, layout: KvLayout, writer: KvWriter) -> None:
        self.path = path
        self.layout = layout
        #: Recorded beside every file this process (re)creates.
        self.writer = writer
        self.nrec = 0
        self._ours = False  # the header on disk is ours (else the next append rewrites it)

    def load(self, max_records: int, log: TextIO) -> Loaded | None:
        """The committed records if the file is trustworthy, else None (with a message)."""
        name = self.path.name
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            print(f"[KV] ignoring {name}: {exc}", file=log)
            return None
        if len(data) < HEADER_SIZE:
            if data:
                print(f"[KV] ignoring {name}: shorter than its header", file=log)
            return None
        magic, *dims, nrec, tag = _HEADER.unpack_from(data)
        lay = self.layout
        want = [lay.n_layers, lay.kv_lora, lay.qk_rope, lay.index_hd, lay.nic, lay.vocab]
        if magic != MAGIC or dims != want:
            print(f"[KV] ignoring {name} from a different model or version", file=log)
            return None
        if tag != 0 and tag != lay.tag:
            print(f"[KV] ignoring {name} from a different model (tag {tag:#x})", file=log)
            return None
        if nrec < 0:
            print(f"[KV] ignoring {name}: negative record count {nrec}", file=log)
            return None
        self._ours = True
        if nrec == 0:
            return None
        if nrec >= max_records:
            print(
                f"[KV] ignoring {name}: {nrec} tokens do not fit the context, starting over",
                file=log,
            )
            self._start_over(nrec)
            return None
        complete = (len(data) - HEADER_SIZE) // lay.record_size
        if complete < nrec:
            print(f"[KV] {name}: only {complete} of {nrec} records are complete", file=log)
            if complete == 0:
                self._start_over(nrec)
                return None
            nrec = complete
        body = np.frombuffer(data, np.uint8, nrec * lay.record_size, HEADER_SIZE)
        records = body.reshape(nrec, lay.record_size)
        tokens = records[:, :4].copy().view("<i4").reshape(nrec)
        rows = records[:, 4:].copy().view("<f4").reshape(nrec, lay.record_floats)
        if tokens.min() < 0 or tokens.max() >= lay.vocab or not np.isfinite(rows).all():
            print(
                f"[KV] ignoring {name}: corrupt records (token out of range or non-finite KV)",
                file=log,
            )
            self._ours = False
            return None
        self.nrec = nrec
        return Loaded([int(t) for t in tokens], rows.astype(np.float32), self._read_writer())

    def _read_writer(self) -> KvWriter | None:
        try:
            return KvWriter.decode(writer_file(self.path).read_bytes())
        except OSError:
            return None

    def start_over(self) -> None:
        """Disown the file: the next append recreates it (count 0 first, sidecar, records)."""
        self._start_over(self.nrec)
        self._ours = False

    def _start_over(self, on_disk: int) -> None:
        # truncate() only rewrites the count when it shrinks what we know is committed; a
        # rejected file is still at nrec == 0 in memory, so tell it what the disk says first.
        # Leaving the old count would let a kill between the next record write and count
        # write resurrect the old tail behind the new head.
        self.nrec = on_disk
        self.truncate(0)

    def _write_count(self, handle: object, nrec: int) -> None:
        assert hasattr(handle, "seek") and hasattr(handle, "write")
        handle.seek(NREC_OFFSET)
        handle.write(struct.pack("<i", nrec))

    def truncate(self, n: int) -> None:
        """Forget records past n (the file keeps its bytes; only the count changes)."""
        if n >= self.nrec or not self._ours:
            self.nrec = min(self.nrec, n)
            return
        with open(self.path, "r+b") as handle:
            self._write_count(handle, n)
            handle.flush()
            os.fsync(handle.fileno())
        self.nrec = n

    def append(self, tokens: Sequence[int], rows: npt.NDArray[np.float32]) -> None:
        """Commit positions nrec .. nrec+len(tokens): records first, then the count."""
        if not tokens:
            return
        lay = self.layout
        record = np.zeros((len(tokens), lay.record_size), np.uint8)
        record[:, :4] = np.asarray(tokens, "<i4").view(np.uint8).reshape(len(tokens), 4)
        record[:, 4:] = np.ascontiguousarray(rows, "<f4").view(np.uint8).reshape(len(tokens), -1)
        mode = "r+b" if self._ours and self.path.exists() else "w+b"
        with open(self.path, mode) as handle:
            if mode == "w+b":
                # The file is empty now: whatever the sidecar says, no record is trusted
                # until the header and records below are, and then they are this writer's.
                self._write_writer()
                handle.write(lay.header(0))
                self.nrec = 0
            handle.seek(HEADER_SIZE + self.nrec * lay.record_size)
            handle.write(record.tobytes())
            handle.flush()
            os.fsync(handle.fileno())
            self._write_count(handle, self.nrec + len(tokens))
            handle.flush()
            os.fsync(handle.fileno())
        self._ours = True
        self.nrec += len(tokens)

    def _write_writer(self) -> None:
        path = writer_file(self.path)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as handle:
            handle.write(self.writer.encode())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
