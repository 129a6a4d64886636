"""One mux script through three engines: `colibri engine` (reference backend, interpreted
control plane), the same with the mypyc-compiled control plane, and `colibri engine
--accelerated`. Their transcripts must be the same under the sameness rules (spec/model.md
§15 through colibri.conformance.golden_compare): kind (a) exact, logprobs within the model's
tolerance, timings masked.

The script covers several busy slots, text and ``ids=1`` payloads, greedy and seeded sampling
with logprobs, STOP, CANCEL, an unknown id and prefix reuse, with persistence on (every turn
end appends to ``.coli_kv``). A resume from disk is left to the persistence tests: a second
process per engine would double this test's cost (each start is ~2 s of CPU). It is sent in
waves, the next one only once
every request of the previous one has ended, and each wave is one write shorter than a pipe's
atomic size, so the engine reads it whole: which decode step a STOP lands after is then fixed
by the protocol's one-command-per-iteration rule, not by timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from colibri.conformance.golden_compare import FrameComparer
from colibri.conformance.sameness import Tolerance
from support.accelerated_support import BUILT, NOT_BUILT_REASON
from support.control_plane_support import needs_compiled
from support.engine_harness import ids, normalize, submit

from colibri import control_plane
from colibri.protocol import FrameReader
from colibri.resources import fixture_model_dir

MODEL = fixture_model_dir("glm5-chat-tiny")
CTX = 128
PIPE_ATOMIC = 4096  # POSIX PIPE_BUF: a write up to this size arrives in one piece


@dataclass(frozen=True)
class Wave:
    commands: bytes
    #: Request ids whose DONE or ERROR ends the wave.
    ends: tuple[int, ...]


PROMPT = b"The quick brown fox"
#: Three slots busy at once, then prefix reuse, CANCEL and an unknown id.
SCRIPT = (
    Wave(
        submit(1, 0, PROMPT, max_tokens=6, ext="logprobs=2")
        + submit(2, 1, ids(5, 6, 7, 8, 9), max_tokens=6, temperature="0.9", top_p="0.95",
                 ext="seed=11 ids=1 logprobs=3")
        + submit(3, 2, ids(9, 8, 7), max_tokens=40, ext="ids=1")
        + b"STOP 3\n",
        (1, 2, 3),
    ),
    Wave(
        submit(4, 0, PROMPT + b" jumps over", max_tokens=5)  # reuses slot 0's prefix
        + submit(5, 1, ids(5, 6, 7, 8, 9, 10), max_tokens=30, temperature="0.7", top_p="1",
                 ext="seed=3 ids=1")
        + b"CANCEL 5\n"
        + b"STOP 99\n",
        (4, 5, 99),
    ),
)


def _drive(argv: Sequence[str], env: dict[str, str], waves: Sequence[Wave], log: Path) -> list[str]:
    """Frames of one engine process, normalised; its stderr goes to `log`."""
    with log.open("wb") as stderr:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=stderr, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    reader = FrameReader(proc.stdout)
    lines: list[str] = []
    try:
        reader.read_preamble()
        for wave in waves:
            assert len(wave.commands) <= PIPE_ATOMIC
            proc.stdin.write(wave.commands)
            proc.stdin.flush()
            pending = set(wave.ends)
            while pending:
                frame = reader.read_frame()
                assert frame is not None, "the engine closed stdout mid-wave"
                lines.append(normalize(frame))
                if frame.kind in ("DONE", "ERROR") and frame.parsed is not None:
                    pending.discard(frame.parsed.get_int("id"))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return lines


def _transcript(variant: str, state_dir: Path) -> list[str]:
    argv = [sys.executable, "-m", "colibri", "engine"]
    env = {k: v for k, v in os.environ.items() if k != control_plane.ENV}
    env.update(SNAP=str(MODEL), SERVE="1", SERVE_BATCH="1", KV_SLOTS="3", CTX=str(CTX),
               COLI_STATE_DIR=str(state_dir), COLI_PERSIST="1", SEED="1234")
    if variant == "compiled":
        env[control_plane.ENV] = "compiled"
    elif variant == "accelerated":
        argv.append("--accelerated")
        env["COLIBRI_THREADS"] = "2"
    else:
        env[control_plane.ENV] = "interpreted"
    lines = _drive(argv, env, SCRIPT, state_dir / "engine.log")
    assert (state_dir / ".coli_kv").stat().st_size > 0  # slot 0's turns were persisted
    return lines


@pytest.fixture(scope="module")
def reference_transcript(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return _transcript("reference", tmp_path_factory.mktemp("reference"))


def _comparer() -> FrameComparer:
    return FrameComparer(Tolerance.for_model_dir(MODEL, positions=CTX))


def test_the_script_exercises_what_it_claims(reference_transcript: list[str]) -> None:
    kinds = [line.split(" ", 1)[0] for line in reference_transcript]
    assert kinds.count("ACCEPT") == 5
    assert "ERROR 5 CANCELLED" in reference_transcript
    assert "ERROR 99 NOT_FOUND" in reference_transcript
    dones = [line for line in reference_transcript if line.startswith("DONE ")]
    assert len(dones) == 4  # 1, 2, 3 and 4
    # STOP 3 ends request 3 early (length_limited 0) long before its 40 tokens.
    (done3,) = [line for line in dones if line.startswith("DONE 3 ")]
    assert done3.endswith(" 0") and int(done3.split()[3]) < 40
    assert any(line.startswith("DATA 2 ") and len(line.split(" | ")[0].split()) > 3
               for line in reference_transcript)  # logprob tails are compared within tolerance


@pytest.mark.parametrize("variant", [
    pytest.param("compiled", marks=needs_compiled),
    pytest.param("accelerated", marks=pytest.mark.skipif(
        not BUILT, reason=NOT_BUILT_REASON or "built")),
])
def test_every_engine_writes_the_reference_transcript(
    variant: str, reference_transcript: list[str], tmp_path: Path
) -> None:
    actual = _transcript(variant, tmp_path)
    outcome = _comparer().lines(actual, reference_transcript)
    assert outcome.ok, outcome.report()


def test_a_diverging_engine_fails_the_comparison(reference_transcript: list[str]) -> None:
    """The comparison is not vacuous: one token or one logprob beyond tolerance differs."""
    comparer = _comparer()
    at = next(i for i, line in enumerate(reference_transcript) if line.startswith("DATA 1 "))
    head, payload = reference_transcript[at].split(" | ", 1)
    other_token = [*reference_transcript]
    other_token[at] = f"{head} | {payload}x"
    assert not comparer.lines(other_token, reference_transcript).ok
    fields = head.split(" ")
    fields[3] = f"{float(fields[3]) - 100 * comparer.logprob_tolerance():.6f}"
    off_logprob = [*reference_transcript]
    off_logprob[at] = " ".join(fields) + " | " + payload
    assert not comparer.lines(off_logprob, reference_transcript).ok
    shorter = reference_transcript[:at] + reference_transcript[at + 1 :]
    assert not comparer.lines(shorter, reference_transcript).ok
