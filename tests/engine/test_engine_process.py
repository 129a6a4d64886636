"""`colibri engine` as a real process: colibri's environment, pipes, exit codes, and a SIGKILL
in the middle of saving the KV file."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.engine_harness import ids, submit

from colibri import resources
from colibri.protocol import FrameReader, WireFrame

TINY = resources.fixture_model_dir("glm5-tiny")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLI_", "KV", "SERVE"))}
    env.update({"SNAP": str(TINY), "SERVE": "1", "SERVE_BATCH": "1"})
    env.update(extra)
    return env


def _engine(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "colibri", "engine", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def _frames(stdout: bytes) -> list[WireFrame]:
    import io

    reader = FrameReader(io.BytesIO(stdout))
    reader.read_preamble()
    frames = []
    while (frame := reader.read_frame()) is not None:
        frames.append(frame)
    return frames


def test_environment_driven_mux_session(tmp_path: Path) -> None:
    env = _env(KV_SLOTS="2", CTX="128", SEED="5", COLI_STATE_DIR=str(tmp_path))
    script = submit(1, 0, ids(*PROMPT), 4, ext="ids=1") + submit(
        2, 1, ids(*PROMPT[:4]), 3, temperature="0.7", ext="ids=1"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", "engine"],
        input=script,
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    frames = _frames(proc.stdout)
    caps = frames[1].line.decode()
    assert "slots=2" in caps and "ctx=128" in caps
    done = [f.line.decode().split()[:4] for f in frames if f.kind == "DONE"]
    assert done == [["DONE", "1", "STAT", "4"], ["DONE", "2", "STAT", "3"]]
    assert (tmp_path / ".coli_kv").exists() and (tmp_path / ".coli_kv.1").exists()
    assert (tmp_path / ".coli_usage").stat().st_size > 0
    assert b"Traceback" not in proc.stderr


def test_legacy_protocol_selected_by_serve_alone() -> None:
    env = _env(COLI_PERSIST="0", NGEN="3")
    del env["SERVE_BATCH"]
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", "engine"],
        input=b"3 14 159\n\x02RESET\n",
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0
    out = proc.stdout.split(b"\x01\x01READY\x01\x01\n", 1)[1]
    assert out.startswith(b"STAT 0 0.00 0.0 ") and b"\nTIERS " in out
    assert out.count(b"\x01\x01END\x01\x01\n") == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"KV_SLOTS": "17"}, "KV_SLOTS must be between 1 and 16"),
        ({"CTX": "4"}, "CTX must"),
        ({"COLI_STATE_DIR": "/proc/colibri-cannot-exist"}, "state directory"),
        ({"SNAP": "/nonexistent/model"}, "cannot start"),
    ],
)
def test_bad_configuration_exits_2(extra: dict[str, str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", "engine"],
        input=b"",
        capture_output=True,
        env=_env(**extra),
        timeout=60,
    )
    assert proc.returncode == 2
    assert message in proc.stderr.decode()
    assert proc.stdout == b""


def _engine_streaming_a_long_request() -> tuple[subprocess.Popen[bytes], FrameReader]:
    """An engine that has started streaming request 1 (4000 tokens: it will not finish)."""
    proc = _engine(_env(COLI_PERSIST="0"))
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(submit(1, 0, ids(*PROMPT), 4000, ext="ids=1"))
    proc.stdin.flush()
    reader = FrameReader(proc.stdout)
    reader.read_preamble()
    while (frame := reader.read_frame()) is not None and frame.kind != "DATA":
        pass
    return proc, reader


def test_sigterm_finishes_active_requests() -> None:
    proc, reader = _engine_streaming_a_long_request()
    proc.send_signal(signal.SIGTERM)
    rest = []
    while (frame := reader.read_frame()) is not None:
        rest.append(frame)
    assert proc.wait(timeout=30) == 0
    assert rest[-1].kind == "DONE"
    assert rest[-1].parsed is not None and rest[-1].parsed.get_int("length_limited") == 0


def test_sigint_finishes_active_requests_and_keeps_serving() -> None:
    proc, reader = _engine_streaming_a_long_request()
    proc.send_signal(signal.SIGINT)
    while (frame := reader.read_frame()) is not None and frame.kind != "DONE":
        pass
    assert frame is not None and frame.line.startswith(b"DONE 1 STAT")
    assert proc.stdin is not None
    proc.stdin.write(submit(2, 0, ids(*PROMPT), 2, ext="ids=1"))
    proc.stdin.close()
    rest = []
    while (frame := reader.read_frame()) is not None:
        rest.append(frame.line.split(b" ")[0] + b" " + frame.line.split(b" ")[1])
    assert b"ACCEPT 2" in rest and rest[-1] == b"DONE 2"
    assert proc.wait(timeout=30) == 0


def _kv_tokens(path: Path) -> list[int]:
    data = path.read_bytes()
    n_layers, kv_lora, rope, index_hd, nic, _vocab, nrec, _tag = struct.unpack_from("<8i", data, 8)
    size = 4 + 4 * (n_layers * (kv_lora + rope) + nic * index_hd)
    complete = min(nrec, (len(data) - 40) // size)
    return [struct.unpack_from("<i", data, 40 + i * size)[0] for i in range(complete)]


@pytest.mark.parametrize("kill_after", ["GPUS", "DATA", "TIERS"])
def test_sigkill_during_save_then_resume(tmp_path: Path, kill_after: str) -> None:
    """Kill while a turn is being saved (the save runs between GPUS and TIERS of the turn-end
    block); the next engine loads the file or ignores it, never crashes, and a conversation
    resumed from it continues exactly like a cold engine given the same tokens."""
    env = _env(COLI_STATE_DIR=str(tmp_path), CTX="512")
    conversation = list(PROMPT)
    for turn in range(3):
        proc = _engine(env)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(submit(turn + 1, 0, ids(*conversation), 12, ext="ids=1"))
        proc.stdin.flush()
        reader = FrameReader(proc.stdout)
        reader.read_preamble()
        seen = 0
        while (frame := reader.read_frame()) is not None:
            if frame.kind == "DATA" and frame.payload:
                conversation.append(int(frame.payload))
            if frame.kind == kill_after:
                seen += 1
                if seen == (3 if kill_after == "DATA" else 1):
                    proc.kill()
                    break
        proc.wait(timeout=30)
    path = tmp_path / ".coli_kv"
    stored = _kv_tokens(path) if path.exists() else []
    assert stored == conversation[: len(stored)]
    # Restart: the file is loaded (or ignored), and extending it continues byte-identically.
    follow = submit(50, 0, ids(*conversation, 9), 6, ext="ids=1")
    resumed = subprocess.run(
        [sys.executable, "-m", "colibri", "engine"],
        input=follow,
        capture_output=True,
        env=env,
        timeout=60,
    )
    cold = subprocess.run(
        [sys.executable, "-m", "colibri", "engine"],
        input=follow,
        capture_output=True,
        env=_env(COLI_PERSIST="0", CTX="512"),
        timeout=60,
    )
    assert resumed.returncode == 0 and b"Traceback" not in resumed.stderr
    if stored:
        assert f"resumed conversation from disk: {len(stored)} tokens".encode() in resumed.stderr

    def data(run: subprocess.CompletedProcess[bytes]) -> list[bytes]:
        return [f.line + (f.payload or b"") for f in _frames(run.stdout) if f.kind == "DATA"]

    assert data(resumed) == data(cold)


def test_colibri_chat_drives_a_private_legacy_engine() -> None:
    env = _env(COLI_PERSIST="0", NGEN="4", COLI_TEMP="0")
    del env["SERVE_BATCH"]
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", "chat", "--model", str(TINY)],
        input=b"3 14 159\n:more\n:reset\n3 14 159\n:quit\n",
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    answers = proc.stdout.decode().splitlines()
    assert len(answers) == 3
    assert answers[0] == answers[2]  # greedy, and :reset really started over
    assert all(len(a.split()) == 4 for a in answers)
    assert "[conversation cleared]" in proc.stderr.decode()
    # Each turn's footer is the readable one --attach prints, not the raw STAT.
    footers = re.findall(r"\[(\d+) tok · [0-9.]+s · [0-9.]+ tok/s · [0-9.]+% expert hits\]",
                         proc.stderr.decode())
    assert footers == ["4", "4", "4"]


def test_colibri_chat_says_when_it_resumes_and_new_starts_fresh(tmp_path: Path) -> None:
    env = _env(COLI_STATE_DIR=str(tmp_path), NGEN="4", COLI_TEMP="0")
    del env["SERVE_BATCH"]

    def chat(*flags: str, turn: bytes = b"3 14 159\n") -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run([sys.executable, "-m", "colibri", "chat", "--model", str(TINY),
                               *flags], input=turn + b":quit\n", capture_output=True, env=env,
                              timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        return done

    first = chat()
    assert "continuing the conversation" not in first.stderr.decode()
    resumed = chat(turn=b"")
    saved = re.search(r"\[continuing the conversation saved on disk \((\d+) tokens\): type "
                      r":reset, or start with --new, for a fresh one\]", resumed.stderr.decode())
    assert saved is not None and int(saved.group(1)) > 0
    fresh = chat("--new")
    assert f"[a new conversation: the saved one ({saved.group(1)} tokens) was cleared]" in (
        fresh.stderr.decode())
    assert fresh.stdout == first.stdout  # greedy from an empty conversation, as the first was
