"""The direct channel of the expert calls (``expert_channel``): a request reads back as the
call that was sent, a worker's answer or failure reaches the caller as such, and a closed
connection is told apart from an answer."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colibri.backend_kit.expert_channel import (
    ChannelClosed,
    ChannelServer,
    WorkerFailed,
    read_answer,
    read_request,
    send_answer,
    send_request,
)
from colibri.backend_kit.remote_experts import ExpertCall


@pytest.fixture()
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _call(layer: int, experts: list[int], rows: int, cols: int, seed: int) -> ExpertCall:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 3, len(experts))
    start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return ExpertCall(layer, experts, rng.standard_normal((rows, cols)).astype(np.float32),
                      start, rng.integers(0, max(rows, 1), int(start[-1])).astype(np.int64))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 90), st.lists(st.integers(0, 255), max_size=8, unique=True),
       st.integers(0, 5), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_a_request_reads_back_as_the_call_that_was_sent(
        layer: int, experts: list[int], rows: int, cols: int, seed: int) -> None:
    a, b = socket.socketpair()
    with a, b:
        call = _call(layer, experts, rows, cols, seed)
        send_request(a, call)
        got = read_request(b)
        assert got is not None
        assert (got.layer, got.experts) == (call.layer, call.experts)
        assert got.x.tobytes() == call.x.tobytes() and got.x.shape == call.x.shape
        assert np.array_equal(got.start, call.start) and np.array_equal(got.rows, call.rows)


def test_an_answer_and_a_failure_reach_the_caller(pair: tuple[socket.socket, socket.socket]
                                                  ) -> None:
    a, b = pair
    y = np.arange(12, dtype=np.float32).reshape(3, 4)
    send_answer(b, y)
    assert read_answer(a).tobytes() == y.tobytes()
    server = ChannelServer(lambda layer, experts, x, start, rows: (_ for _ in ()).throw(
        KeyError(f"layer {layer}: experts {experts} are not this worker's")))
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        send_request(conn, _call(3, [7], 1, 4, 0))
        with pytest.raises(WorkerFailed, match="KeyError: .layer 3: experts \\[7\\]"):
            read_answer(conn)


def test_the_server_answers_in_order_and_a_closed_end_is_not_an_answer() -> None:
    server = ChannelServer(lambda layer, _e, x, _s, _r: x * float(layer))
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        for layer in (1, 2, 3):
            send_request(conn, _call(layer, [0], 2, 4, layer))
        for layer in (1, 2, 3):
            expected = _call(layer, [0], 2, 4, layer).x * float(layer)
            assert read_answer(conn).tobytes() == expected.tobytes()
    a, b = socket.socketpair()
    with a:
        b.close()
        with pytest.raises(ChannelClosed):
            read_answer(a)


def test_a_closed_peer_is_seen_at_once_and_an_open_one_is_not_waited_on() -> None:
    import time

    from colibri.backend_kit.expert_channel import peer_closed

    a, b = socket.socketpair()
    with a:
        a.settimeout(30.0)  # a caller's deadline must not turn the check into a wait
        started = time.monotonic()
        assert not peer_closed(a)
        assert time.monotonic() - started < 1.0 and a.gettimeout() == 30.0
        b.close()
        assert peer_closed(a)
