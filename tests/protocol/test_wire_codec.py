"""Every frame kind of spec/protocol.json round-trips through its codec record: the bytes a
record encodes match the kind's grammar, and decoding them gives the record back."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from colibri.protocol import load_spec
from colibri.protocol import records as r
from colibri.protocol.framing import FrameParser

UINT = st.integers(0, 2**31 - 1)
U64 = st.integers(0, 2**64 - 1)
ID = st.integers(1, 2**64 - 1)


def fixed(places: int) -> st.SearchStrategy[float]:
    """Values a ``%.Nf`` field spells exactly: n / 10^N."""
    return st.integers(-(10**12), 10**12).map(lambda n: n / 10**places)


F1, F2, F3, F6 = fixed(1), fixed(2), fixed(3), fixed(6)
LOGPROB = st.one_of(fixed(6), st.sampled_from([math.inf, -math.inf]))
NAME = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters="|"),
               max_size=20)
TOP = st.lists(st.tuples(UINT, LOGPROB), max_size=8).map(tuple)
LOGPROBS = st.builds(r.Logprobs, LOGPROB, TOP)
PAYLOAD = st.binary(max_size=64)
CAP_KEY = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=15)
EXT_KEY = st.sampled_from(sorted(load_spec().extensions))


def _hex_map(rows: int, cols: int, per: str) -> st.SearchStrategy[bytes]:
    size = rows * cols if per == "byte" else (rows * cols + 7) // 8
    return st.binary(min_size=size, max_size=size)


RECORDS: dict[str, st.SearchStrategy[Any]] = {
    "READY": st.just(r.Ready()),
    "END": st.just(r.End()),
    "STAT": st.one_of(
        st.builds(r.Stat, UINT, F2, F1, F2),
        st.builds(r.Stat, UINT, F2, F1, F2, UINT, st.booleans()),
    ),
    "CAPS": st.lists(st.tuples(CAP_KEY, U64), max_size=6).map(lambda c: r.Caps(tuple(c))),
    "HWINFO": st.builds(r.HwInfo, UINT, F1, F1, UINT, F1, NAME, NAME),
    "GPUS": st.lists(st.builds(r.GpuDevice, F3, F3, UINT), max_size=4).map(
        lambda d: r.Gpus(tuple(d))),
    "TIERS": st.builds(r.Tiers, UINT, UINT, UINT, F2, F2),
    "EMAP": st.tuples(st.integers(0, 6), st.integers(0, 9)).flatmap(
        lambda rc: st.builds(r.Emap, st.just(rc[0]), st.just(rc[1]), _hex_map(*rc, "byte"))),
    "HITS": st.tuples(st.integers(0, 6), st.integers(0, 9)).flatmap(
        lambda rc: st.builds(r.Hits, st.just(rc[0]), st.just(rc[1]), _hex_map(*rc, "bit"))),
    "ENTROPY": st.lists(F3, max_size=8).map(lambda v: r.Entropy(tuple(v))),
    "PERF": st.builds(r.Perf, U64, F6, F6, F6, F6, F6, F6, F6),
    "PROF": st.builds(r.Prof, F3, UINT, UINT, F3, F3, F3, F3, F3, U64, F3, F3, U64, UINT, U64,
                      F3, F3, st.booleans()),
    "REPIN": st.builds(r.Repin, UINT, UINT, UINT, st.integers(-(2**31), 2**31 - 1)),
    "NODES": st.tuples(st.integers(0, 6), st.integers(0, 9)).flatmap(
        lambda rc: st.builds(r.Nodes, st.just(rc[0]), st.just(rc[1]), _hex_map(*rc, "byte"),
                             st.lists(st.builds(r.NodeResidency, UINT, F3), max_size=4).map(
                                 tuple))),
    "ACCEPT": st.builds(r.Accept, U64, UINT),
    "DATA": st.builds(r.Data, U64, PAYLOAD, st.none() | LOGPROBS),
    "ECHO": st.builds(r.Echo, U64, PAYLOAD, UINT, LOGPROBS),
    "TOPK": st.lists(st.tuples(LOGPROB, st.binary(max_size=8)), max_size=5).flatmap(
        lambda c: st.builds(r.Topk, U64, st.just(tuple(c)))),
    "DONE": st.builds(r.Done, U64, UINT, F2, F1, F2, UINT, st.booleans()),
    "ERROR": st.one_of(
        st.builds(r.Error, U64, st.sampled_from(sorted(load_spec().errors))),
        st.builds(r.Error, U64, st.just("CONTEXT_EXCEEDED"), UINT, UINT),
    ),
    "SUBMIT": st.builds(
        r.Submit, ID,
        st.builds(r.SubmitRequest, st.integers(0, 15), PAYLOAD, UINT,
                  st.integers(0, 200).map(lambda n: n / 100),
                  st.integers(1, 100).map(lambda n: n / 100), st.binary(max_size=16),
                  st.dictionaries(EXT_KEY, st.integers(0, 32), max_size=3)),
    ),
    "STOP": st.builds(r.Stop, ID),
    "CANCEL": st.builds(r.Cancel, ID),
    "RESET": st.just(r.Reset()),
    "MORE": st.just(r.More()),
    "PROMPT": st.builds(r.Prompt, PAYLOAD, st.integers(1, 2**31 - 1),
                        st.integers(0, 200).map(lambda n: n / 100),
                        st.integers(1, 100).map(lambda n: n / 100),
                        st.none() | st.integers(0, 15)),
}


def test_every_frame_kind_of_the_spec_has_a_record() -> None:
    spec = load_spec()
    assert set(r.ENGINE_RECORDS) == set(spec.engine_lines)
    assert set(r.REQUEST_RECORDS) == set(spec.request_lines)
    assert set(RECORDS) == set(spec.engine_lines) | set(spec.request_lines)


def _split(wire: bytes, kind: type[r.Record]) -> tuple[bytes, bytes | None]:
    """Header and payload of one encoded frame, as the framer reads them."""
    if kind.DIRECTION == "engine":
        frames = FrameParser(seen_ready=kind is not r.Ready).feed(wire)
        assert len(frames) == 1 and frames[0].wire() == wire, frames
        return frames[0].header, frames[0].payload
    header, _, rest = wire.partition(b"\n")
    return header, (rest[:-1] if rest else None)


@given(st.one_of(*RECORDS.values()))
def test_every_record_round_trips(record: r.Record) -> None:
    wire = record.encode()
    header, payload = _split(wire, type(record))
    decoded = r.decode(header, payload, type(record).DIRECTION)
    assert decoded == record
    assert decoded is not None and decoded.encode() == wire


def test_the_codec_spells_numbers_as_c_does() -> None:
    assert r.Done(3, 2, 1.005, 49.95, 0.125, 7, True).line() == "DONE 3 STAT 2 1.00 50.0 0.12 7 1"
    nan_tail = r.Echo(1, b"a", 0, r.NO_PREDICTOR).encode()
    assert nan_tail == b"ECHO 1 1 0 nan 0\na\n"
    assert r.Logprobs(-math.nan).tail() == " -nan 0"
    assert r.Topk(5, ((-0.5, b""),)).line() == "TOPK 5 1 -0.500000 -"
