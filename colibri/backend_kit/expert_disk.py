"""The disk tier: a routed expert's stored bytes, read with positioned reads into memory this
process owns.

colibri keeps the experts that are not resident on disk and reads them after each layer's
routing (``pread``, gate/up/down coalesced). Reading them through the checkpoint's memory map
instead would work, but the kernel's page cache would then be a second expert cache that no
budget bounds and no report shows, and page faults taken one at a time inside a step cost
more than the bytes. So:

- an expert's tensors (gate, up, down and any ``.qs`` scale sidecars) are grouped per file and
  coalesced into runs of adjacent byte ranges, one positioned read each;
- a run is read with ``O_DIRECT`` where the file system allows it (offset and length widened
  to the block size, into a block-aligned buffer), so the page cache never holds it; where it
  does not (tmpfs, some network file systems), with a buffered read followed by
  ``posix_fadvise(DONTNEED)`` over the range;
- ``read_many`` keeps several experts' reads in flight on a small thread pool (``os.preadv``
  releases the GIL), so a layer's misses arrive at the disk's rate, not one at a time; and a
  long run is itself read as several pieces in flight (``PIECE``): one 10 MB read at a time
  leaves a disk's queue half idle (this project's virtual disk: 1.6 GB/s for one read of an
  expert, 2.3 GB/s for the same bytes as two or more reads in flight);
- the buffers are recycled and reserved ahead: a fresh 10 MB allocation per read would cost
  its page faults and zeroing (a few ms on a bare machine, tens where a virtual machine backs
  fresh memory lazily: longer than the read), so a buffer whose expert has been let go is
  reused for the next read of that size, and ``warm`` touches the expert cache's buffers in
  the background before reads need them (``BufferPool``);
- a read that returns fewer bytes than the tensors need (a shard truncated under a running
  engine) or fails is an ``ExpertReadError`` naming the expert, the file and the offset, and
  nothing of that expert is returned: a partially read expert is never used.

The stored arrays come back in their stored dtype and shape; the backend turns them into what
it computes with (float32 for the reference, in-place descriptors for the accelerated engine).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from colibri.engine.backend import BackendReadError
from colibri.reference.experts import expert_tensor_names
from colibri.reference.safetensors import DTYPES, Checkpoint, TensorInfo

Key = tuple[int, int]
T = TypeVar("T")
#: An expert's stored tensors by name (gate/up/down and their ``.qs`` sidecars).
StoredTensors = dict[str, np.ndarray]
#: The tensors an expert is stored as: its three projections and any sidecars.
ExpertExtents = Callable[[int, int], Sequence[TensorInfo]]

#: O_DIRECT's alignment: the largest logical block size in use (4 KiB covers 512-byte disks).
BLOCK = 4096
#: Tensors of one expert closer than this in one file are read as one run (the gap is read
#: and dropped): one larger read beats two seeks.
COALESCE_GAP = 64 * 1024
#: Experts read concurrently by ``read_many``: enough to keep an NVMe queue busy.
DEFAULT_IN_FLIGHT = 4
#: A run longer than this is read as pieces of about this size, in flight together.
PIECE = 4 << 20


def checkpoint_extents(checkpoint: Checkpoint) -> ExpertExtents:
    """Where each expert's tensors lie in a checkpoint or container: its three projections
    and, for quantized ones, their ``.qs`` scale sidecars."""

    def extents(layer: int, expert: int) -> list[TensorInfo]:
        found = []
        for name in expert_tensor_names(layer, expert):
            found.append(checkpoint.info(name))
            if name + ".qs" in checkpoint:
                found.append(checkpoint.info(name + ".qs"))
        return found

    return extents


#: An expert's bytes could not be read whole (short read, I/O error, file gone). The engine's
#: own class, not a subclass: under the mypyc-compiled control plane ``BackendReadError`` is
#: a native class, which interpreted code may raise but not subclass.
ExpertReadError = BackendReadError


@dataclass(frozen=True)
class Run:
    """One positioned read: a byte range of a file holding some of an expert's tensors."""

    file: Path
    begin: int
    end: int
    tensors: tuple[TensorInfo, ...]


def plan_runs(tensors: Sequence[TensorInfo], gap: int = COALESCE_GAP) -> list[Run]:
    """Group an expert's tensors into runs: per file, by offset, merging neighbours less than
    ``gap`` bytes apart."""
    runs: list[Run] = []
    by_file: dict[Path, list[TensorInfo]] = {}
    for info in tensors:
        by_file.setdefault(info.file, []).append(info)
    for path in sorted(by_file):
        ordered = sorted(by_file[path], key=lambda t: t.begin)
        group = [ordered[0]]
        for info in ordered[1:]:
            if info.begin - max(t.end for t in group) <= gap:
                group.append(info)
                continue
            runs.append(_run(path, group))
            group = [info]
        runs.append(_run(path, group))
    return runs


def _run(path: Path, group: list[TensorInfo]) -> Run:
    return Run(path, min(t.begin for t in group), max(t.end for t in group), tuple(group))


class BufferPool:
    """Block-aligned read buffers, reused once nothing refers to them.

    A buffer handed out is referred to by the tensor views made of it (numpy keeps a view's
    owner alive), so it is free again exactly when the pool holds the only reference. At
    most ``keep_free`` free buffers of a size are kept; the rest go back to the allocator.
    Sizes are rounded up to ``GRAIN``, so the experts of one model, whose reads differ by a
    block or two of alignment, share their buffers."""

    def __init__(self, keep_free: int = 2 * DEFAULT_IN_FLIGHT) -> None:
        self._buffers: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        self.keep_free = self._floor = keep_free

    def take(self, length: int) -> np.ndarray:
        """A BLOCK-aligned uint8 buffer of ``length`` bytes (a view of a pooled array)."""
        size = _bucket(length)
        with self._lock:
            held = self._buffers.setdefault(size, [])
            free = self._trimmed(held)
            if free:
                raw = free[0]
            else:
                raw = np.empty(size + BLOCK, np.uint8)
                held.append(raw)
        shift = -raw.ctypes.data % BLOCK
        return raw[shift : shift + length]

    def reserve(self, length: int, count: int) -> None:
        """Allocate and touch up to ``count`` buffers for reads of ``length`` bytes ahead of
        need, and keep that many when they fall free. A buffer's first touch costs its page
        faults, and where a virtual machine backs fresh memory lazily that is tens of ms for
        10 MB, longer than the read: paid here, on a thread of its own, a read never waits
        for it. The buffers are the expert cache's own memory (its budget counts them)."""
        size = _bucket(length)
        with self._lock:
            self.keep_free = max(self.keep_free, count)
        for _ in range(count):
            raw = np.empty(size + BLOCK, np.uint8)
            raw[::PAGE_STRIDE] = 0  # one byte per page: every page faulted in now
            with self._lock:
                held = self._buffers.setdefault(size, [])
                if len(held) >= count:  # the reads got there first
                    return
                held.append(raw)

    def release(self, count: int) -> None:
        """Keep no more than ``count`` free buffers of a size (at least the pool's own
        floor) from now on, letting the rest go now: the expert cache shrank (the RSS guard)
        and the memory its buffers held must go with it."""
        with self._lock:
            self.keep_free = max(self._floor, count)
            for held in self._buffers.values():
                self._trimmed(held)

    def _trimmed(self, held: list[np.ndarray]) -> list[np.ndarray]:
        """The free buffers of ``held``, after dropping those beyond ``keep_free``."""
        free = [raw for raw in held if sys.getrefcount(raw) <= FREE_REFS]
        if len(free) > self.keep_free:
            extra = {id(raw) for raw in free[self.keep_free :]}
            held[:] = [raw for raw in held if id(raw) not in extra]
            free = free[: self.keep_free]
        return free

    def count(self, length: int) -> int:
        with self._lock:
            return len(self._buffers.get(_bucket(length), []))


def _bucket(length: int) -> int:
    return -(-length // GRAIN) * GRAIN


#: Buffer sizes are rounded up to this (see ``BufferPool``).
GRAIN = 64 * 1024
#: The smallest page size: touching one byte per stride faults in every page of a buffer.
PAGE_STRIDE = 4096


#: ``sys.getrefcount`` of a pooled array nothing else refers to: the pool's list, the
#: comprehension's variable and the call's own argument (``BufferPool._trimmed``).
FREE_REFS = 3


@dataclass
class DiskCounters:
    """What the disk tier has read since the engine started."""

    reads: int = 0
    bytes: int = 0
    seconds: float = 0.0
    direct: bool = True


class DiskTier:
    """Positioned reads of experts' stored bytes (see the module docstring)."""

    def __init__(self, extents: ExpertExtents, in_flight: int = DEFAULT_IN_FLIGHT,
                 direct: bool = True) -> None:
        self._extents = extents
        self._runs: dict[Key, list[Run]] = {}
        self._pool = ThreadPoolExecutor(max(1, in_flight), thread_name_prefix="expert-read")
        # The pieces of a long run beyond its first (which its reading thread reads itself):
        # a pool of their own, so a read never waits on a slot its own pool's readers hold.
        self._pieces = ThreadPoolExecutor(max(1, in_flight), thread_name_prefix="expert-piece")
        self._buffers = BufferPool(keep_free=2 * max(1, in_flight))
        self._lock = threading.Lock()
        self.counters = DiskCounters(direct=direct and hasattr(os, "O_DIRECT"))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._pieces.shutdown(wait=True)

    def warm(self, layer: int, expert: int, count: int) -> threading.Thread:
        """Reserve read buffers for ``count`` experts shaped like (``layer``, ``expert``),
        on a background thread (``BufferPool.reserve``); the thread is returned."""
        longest = max(self.runs(layer, expert), key=lambda run: run.end - run.begin)
        # The widest an O_DIRECT read of such a run gets: its alignment adds up to 2 blocks.
        length = longest.end - longest.begin + 2 * BLOCK
        thread = threading.Thread(target=self._buffers.reserve, args=(length, count),
                                  name="expert-buffers", daemon=True)
        thread.start()
        return thread

    def keep_buffers(self, count: int) -> None:
        """At most ``count`` free read buffers of a size stay reserved (``BufferPool.release``)."""
        self._buffers.release(count)

    def runs(self, layer: int, expert: int) -> list[Run]:
        key = (layer, expert)
        found = self._runs.get(key)
        if found is None:
            found = self._runs[key] = plan_runs(self._extents(layer, expert))
        return found

    def read(self, layer: int, expert: int) -> StoredTensors:
        """The expert's stored tensors, read now; ``ExpertReadError`` if they cannot be."""
        started = time.perf_counter()
        out: StoredTensors = {}
        read_bytes = 0
        for run in self.runs(layer, expert):
            try:
                buf, base = self._read_run(run)
            except ExpertReadError as exc:
                raise ExpertReadError(f"expert {layer}.{expert}: {exc}") from None
            except OSError as exc:
                raise ExpertReadError(
                    f"expert {layer}.{expert}: reading {run.file} at byte {run.begin} failed: "
                    f"{exc.strerror or exc}") from None
            read_bytes += run.end - run.begin
            for info in run.tensors:
                out[info.name] = _view(buf, info.begin - base, info)
        with self._lock:
            self.counters.reads += 1
            self.counters.bytes += read_bytes
            self.counters.seconds += time.perf_counter() - started
        return out

    def read_many(self, keys: Sequence[Key]) -> list[StoredTensors]:
        """Several experts' tensors, their reads in flight together; in ``keys``' order."""
        return gather(self.submit(keys, lambda stored, _layer, _expert: stored))

    def submit(self, keys: Sequence[Key], then: Callable[[StoredTensors, int, int], T]
               ) -> list[Future[T]]:
        """Start reading ``keys`` on the pool, each expert's tensors handed to ``then`` on
        the reading thread (the backend's check and build, off the caller's critical path;
        it must not use the kernels' own thread pool, which the caller drives meanwhile)."""
        return [self._pool.submit(lambda k: then(self.read(*k), *k), key) for key in keys]

    def _read_run(self, run: Run) -> tuple[np.ndarray, int]:
        """The run's bytes in an owned buffer, and the file offset of the buffer's first byte."""
        if self.counters.direct:
            try:
                return self._read_direct(run)
            except OSError as exc:
                # EINVAL: this file system refuses O_DIRECT (at open or at the read); read
                # buffered from now on rather than fail every expert.
                if exc.errno != 22:
                    raise
                self.counters.direct = False
        return self._read_buffered(run)

    def _read_direct(self, run: Run) -> tuple[np.ndarray, int]:
        start = run.begin - run.begin % BLOCK
        length = -(-(run.end - start) // BLOCK) * BLOCK
        buf = self._buffers.take(length)
        fd = os.open(run.file, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
        try:
            got = self._read_pieces(fd, buf, start)
        finally:
            os.close(fd)
        _check_length(run, start, got)
        return buf, start

    def _read_pieces(self, fd: int, buf: np.ndarray, offset: int) -> int:
        """``_read_full`` of ``buf`` as BLOCK-aligned pieces of about ``PIECE`` bytes in
        flight together; the bytes read before the first gap (a piece that met the file's
        end), so a short file reads as short as it is."""
        pieces = piece_ranges(len(buf))
        later = [self._pieces.submit(_read_full, fd, buf[a:b], offset + a)
                 for a, b in pieces[1:]]
        first_a, first_b = pieces[0]
        try:
            got = [_read_full(fd, buf[first_a:first_b], offset + first_a)]
        finally:
            wait(later)  # no piece outlives the call (the caller closes ``fd``)
        got += gather(later)
        for (a, b), n in zip(pieces, got, strict=True):
            if n < b - a:
                return a + n
        return len(buf)

    def _read_buffered(self, run: Run) -> tuple[np.ndarray, int]:
        buf = np.empty(run.end - run.begin, np.uint8)
        fd = os.open(run.file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            got = _read_full(fd, buf, run.begin)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, run.begin, run.end - run.begin, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        _check_length(run, run.begin, got)
        return buf, run.begin


def gather(futures: Sequence[Future[T]]) -> list[T]:
    """The results in order. The first failure is raised once every one has ended (no read
    outlives the call)."""
    errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


def piece_ranges(length: int) -> list[tuple[int, int]]:
    """[begin, end) pieces of about ``PIECE`` bytes covering ``length``, each a multiple of
    BLOCK but the last (O_DIRECT reads start and end on block boundaries)."""
    count = max(1, round(length / PIECE))
    size = -(-length // count // BLOCK) * BLOCK
    return [(a, min(a + size, length)) for a in range(0, length, size)]


def _read_full(fd: int, buf: np.ndarray, offset: int) -> int:
    """Read into ``buf`` from ``offset`` until it is full or the file ends; bytes read."""
    view = buf.data.cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _check_length(run: Run, start: int, got: int) -> None:
    if start + got < run.end:
        raise ExpertReadError(
            f"short read of {run.file}: bytes {run.begin}..{run.end} wanted, the file ends at "
            f"{start + got} (truncated or being rewritten?)")


def _view(buf: np.ndarray, offset: int, info: TensorInfo) -> np.ndarray:
    """The tensor as a view of the run's buffer in its stored dtype and shape (copied only
    when its offset leaves it unaligned for its dtype)."""
    dtype = DTYPES[info.dtype]
    flat = buf[offset : offset + info.end - info.begin]
    if (flat.ctypes.data % dtype.itemsize) != 0:
        flat = flat.copy()
    return flat.view(dtype).reshape(info.shape)
