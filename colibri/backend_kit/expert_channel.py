"""The per-layer expert call over a direct channel: one TCP connection from the engine to each
expert worker, one request and one answer per layer.

Why not a Ray call per layer: an actor call costs about 1-3 ms on this project's machine
(scheduling, serialization through the object store, the reply), and a decode step makes one
per routed layer, so on a small model the calls are the whole step (docs/cluster.md). A
connection of our own costs a loopback or network round trip and two copies of the rows. Ray
keeps everything else: where the workers run, restarting a lost one, and the control calls
(``ready``, ``serve``) that say where a worker listens.

The format, little-endian, nothing else on the connection:

- request: ``REQUEST`` (magic ``CXR1``, layer, experts, pairs, x rows, x columns), then the
  experts and ``start`` (experts + 1 values) as int64, the pairs' rows as int64, and x as
  float32, row-major;
- answer: ``ANSWER`` (magic ``CXA1``, status, two sizes): status 0 with ``[n, d]`` and the
  float32 answer, or status 1 with the length of a UTF-8 error message and the message.

A worker answers its requests in order, one at a time (``ChannelServer`` holds a lock around
the compute: a connection given up on by a caller's deadline may still be computing when the
caller's next connection arrives).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable

import numpy as np

from colibri.backend_kit.remote_experts import F32, I64, ExpertCall

REQUEST = struct.Struct("<4sqqqqq")
ANSWER = struct.Struct("<4sqqq")
REQUEST_MAGIC, ANSWER_MAGIC = b"CXR1", b"CXA1"
OK, FAILED = 0, 1
#: Run: (layer, experts, x, start, rows) -> the answer [start[-1], D].
Run = Callable[[int, list[int], F32, I64, I64], F32]


class ChannelClosed(ConnectionError):
    """The other end closed the connection (a worker's process that died closes its own)."""


class WorkerFailed(Exception):
    """The worker answered with an error (its message)."""


def no_delay(conn: socket.socket) -> None:
    """Send each message at once: with Nagle's algorithm a small one waits for the peer's
    delayed acknowledgement (about 40 ms on Linux)."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def peer_closed(conn: socket.socket) -> bool:
    """Whether the other end has closed a connection that has nothing to read (a worker's
    process that died between two calls), without waiting."""
    timeout = conn.gettimeout()
    conn.settimeout(0.0)  # (with a timeout, Python would wait for data before the peek)
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        conn.settimeout(timeout)


def read_exact(conn: socket.socket, n: int) -> bytearray:
    data = bytearray(n)
    view = memoryview(data)
    got = 0
    while got < n:
        count = conn.recv_into(view[got:])
        if count == 0:
            raise ChannelClosed("the connection was closed")
        got += count
    return data


def send_request(conn: socket.socket, call: ExpertCall) -> None:
    x = np.ascontiguousarray(call.x, np.float32)
    experts = np.asarray(call.experts, np.int64)
    start = np.ascontiguousarray(call.start, np.int64)
    rows = np.ascontiguousarray(call.rows, np.int64)
    head = REQUEST.pack(REQUEST_MAGIC, call.layer, experts.size, rows.size, x.shape[0],
                        x.shape[1])
    conn.sendall(b"".join((head, experts.tobytes(), start.tobytes(), rows.tobytes(),
                           x.tobytes())))


def read_request(conn: socket.socket) -> ExpertCall | None:
    """The next request, or None when the caller closed the connection between requests."""
    try:
        head = read_exact(conn, REQUEST.size)
    except ChannelClosed:
        return None
    magic, layer, n_experts, n_pairs, x_rows, x_cols = REQUEST.unpack(head)
    if magic != REQUEST_MAGIC or min(n_experts, n_pairs, x_rows, x_cols) < 0:
        raise ValueError("not an expert request")
    ints = np.frombuffer(read_exact(conn, 8 * (2 * n_experts + 1 + n_pairs)), np.int64)
    x = np.frombuffer(read_exact(conn, 4 * x_rows * x_cols), np.float32)
    return ExpertCall(layer, ints[:n_experts].tolist(), x.reshape(x_rows, x_cols),
                      ints[n_experts:2 * n_experts + 1], ints[2 * n_experts + 1:])


def send_answer(conn: socket.socket, y: F32) -> None:
    y = np.ascontiguousarray(y, np.float32)
    conn.sendall(ANSWER.pack(ANSWER_MAGIC, OK, y.shape[0], y.shape[1]) + y.tobytes())


def send_failure(conn: socket.socket, message: str) -> None:
    text = message.encode("utf-8", "replace")
    conn.sendall(ANSWER.pack(ANSWER_MAGIC, FAILED, len(text), 0) + text)


def read_answer(conn: socket.socket) -> F32:
    magic, status, n, d = ANSWER.unpack(read_exact(conn, ANSWER.size))
    if magic != ANSWER_MAGIC or status not in (OK, FAILED) or min(n, d) < 0:
        raise ChannelClosed("the worker's answer is not an expert answer")
    if status == FAILED:
        raise WorkerFailed(read_exact(conn, n).decode("utf-8", "replace"))
    y: F32 = np.frombuffer(read_exact(conn, 4 * n * d), np.float32).reshape(n, d)
    return y


class ChannelServer:
    """A worker's side: accepts connections (a caller reconnects after it gave up on one)
    and answers each request with ``run``."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server(("", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="expert-channel").start()

    def close(self) -> None:
        """Stop listening and cut every connection, as the worker's end would be cut if its
        process died (a caller sees the connection close)."""
        self._listener.close()
        for conn in list(self._open):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            no_delay(conn)
            self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.closing(conn):
            try:
                while (call := read_request(conn)) is not None:
                    with self._lock:
                        try:
                            y = self._run(call.layer, call.experts, call.x, call.start,
                                          call.rows)
                        except Exception as exc:  # noqa: BLE001 - the caller is told
                            send_failure(conn, f"{type(exc).__name__}: {exc}")
                            continue
                    send_answer(conn, y)
            except (OSError, ValueError):
                return  # the caller went away (or spoke something else): the next one comes
            finally:
                self._open.discard(conn)
