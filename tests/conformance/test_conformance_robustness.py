"""Hypothesis-driven robustness: malformed bursts never crash the reference engine nor change
the stream of a request decoding on another slot (the conformance fuzz check, fed by
hypothesis instead of the seeded generator). Bounded: each example starts one engine."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from colibri.conformance.engine import EngineSession, EngineTarget
from colibri.conformance.fuzz import run_fuzz
from colibri.conformance.grammar import load_grammar
from colibri.conformance.prompts import PromptCodec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colibri.resources import spec_path

SUPPORT = Path(__file__).parents[1] / "support" / "conformance_support"
ENGINE = f"{shlex.quote(sys.executable)} {shlex.quote(str(SUPPORT / 'mux_fake_model.py'))}"

_number = st.one_of(
    st.integers(-5, 70).map(str),
    st.sampled_from(["nan", "inf", "-0", "1e400", "0x10", "", "99999999999999999999999", "2.5"]),
)
_submit = st.lists(_number, min_size=0, max_size=9).map(
    lambda fields: ("SUBMIT " + " ".join(fields)).encode() + b"\n"
)
_control = st.tuples(st.sampled_from(["STOP", "CANCEL"]), _number).map(
    lambda t: f"{t[0]} {t[1]}\n".encode()
)
_junk = st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"") + b"\n")
_extension = st.tuples(st.from_regex(r"[a-z_]{1,16}", fullmatch=True), _number).map(
    lambda t: f"SUBMIT 7 0 0 4 0 1 0 {t[0]}={t[1]}\n\n".encode()
)
_burst = st.lists(st.one_of(_submit, _control, _junk, _extension), min_size=1, max_size=12)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_burst)
def test_malformed_bursts_leave_other_slots_alone(burst: list[bytes]) -> None:
    target = EngineTarget.from_command(ENGINE, SUPPORT / "fake-model")
    engine = EngineSession(target, {"kv_slots": 2})
    try:
        engine.start()
        run_fuzz(
            engine,
            PromptCodec.for_model(SUPPORT / "fake-model"),
            load_grammar(spec_path("protocol.json")),
            examples=0,
            slot=1,
            timeout=20.0,
            commands=burst,
        )
    finally:
        engine.close()
