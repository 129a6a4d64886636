"""Persistence: `.coli_kv` (COLIKV1, crash ordering, nothing untrusted loaded) and
`.coli_usage` (colibri's text format, accumulated across runs)."""

from __future__ import annotations

import dataclasses
import io
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.engine_fakes import FakeBackend, FakeConfig
from support.engine_harness import ids, run_engine, submit

from colibri.engine import kv_persist, usage_file
from colibri.engine.backend import StepRow
from colibri.engine.kv_persist import HEADER_SIZE, KvFile, KvLayout, KvWriter, writer_file

LAYOUT = KvLayout(n_layers=3, kv_lora=4, qk_rope=2, index_hd=0, nic=0, vocab=64, tag=0x1234)
WRITER = KvWriter("fake", "fake 1")


def _model() -> FakeBackend:
    return FakeBackend(FakeConfig(eos_token_ids=()))


def _data(run: Any, rid: int) -> list[bytes]:
    return [f.line + (f.payload or b"") for f in run.for_id(rid) if f.kind in ("DATA", "ECHO")]


def test_resumed_conversation_continues_byte_identically(tmp_path: Path) -> None:
    first = submit(1, 0, ids(3, 4, 5, 6), 5, ext="ids=1")
    a = run_engine([first], model=_model(), state_dir=tmp_path)
    answer = [int(f.payload or b"0") for f in a.for_id(1) if f.kind == "DATA"]
    follow = submit(2, 0, ids(3, 4, 5, 6, *answer[:-1], 9, 10), 6, ext="ids=1")
    resumed = run_engine([follow], model=_model(), state_dir=tmp_path)
    assert "resumed conversation from disk: 8 tokens" in resumed.stderr
    assert "prefix 8/10" in resumed.stderr
    uninterrupted = run_engine([first, follow], model=_model())
    assert _data(resumed, 2) == _data(uninterrupted, 2)
    # The resumed engine appended to the file the first run left (spec/protocol.md 4.3: a slot
    # holds what it forwarded, and a reused prefix is never rewritten). Run 1 committed its
    # 4 prompt tokens + 4 of its 5 answer tokens (the last one is sampled, never forwarded) = 8;
    # run 2 reused those 8, forwarded the 2 new prompt tokens and 5 of its 6 answer tokens:
    # 8 + 2 + 5 = 15 records, the follow-up prompt followed by its forwarded answer.
    answer2 = [int(f.payload or b"0") for f in resumed.for_id(2) if f.kind == "DATA"]
    assert len(answer2) == 6
    data = (tmp_path / ".coli_kv").read_bytes()
    assert struct.unpack_from("<i", data, 32)[0] == 15
    assert len(data) == HEADER_SIZE + 15 * LAYOUT.record_size
    tokens = [
        struct.unpack_from("<i", data, HEADER_SIZE + i * LAYOUT.record_size)[0] for i in range(15)
    ]
    assert tokens == [3, 4, 5, 6, *answer[:-1], 9, 10, *answer2[:-1]]


def test_file_layout_is_colikv1(tmp_path: Path) -> None:
    run_engine(
        [submit(1, 1, ids(3, 4, 5), 3, ext="ids=1")], model=_model(), kv_slots=2, state_dir=tmp_path
    )
    data = (tmp_path / ".coli_kv.1").read_bytes()
    magic, *header = struct.unpack_from("<8s8i", data)
    assert magic == b"COLIKV1\0"
    assert header == [3, 4, 2, 0, 0, 64, 5, 0x1234]  # 3 prompt + 2 forwarded answer tokens
    assert len(data) == HEADER_SIZE + 5 * LAYOUT.record_size
    tokens = [
        struct.unpack_from("<i", data, HEADER_SIZE + i * LAYOUT.record_size)[0] for i in range(5)
    ]
    assert tokens[:3] == [3, 4, 5]
    assert not (tmp_path / ".coli_kv").exists()  # slot 0 was never used


def _write(path: Path, layout: KvLayout, tokens: list[int], rows: np.ndarray) -> None:
    kv = KvFile(path, layout, WRITER)
    kv.append(tokens, rows.astype(np.float32))


def _rows(n: int) -> np.ndarray:
    return np.arange(n * LAYOUT.record_floats, dtype=np.float32).reshape(n, -1) / 7


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b"COLIKV2\0" + b[8:], "different model or version"),
        (lambda b: b[:8] + struct.pack("<i", 4) + b[12:], "different model or version"),
        (lambda b: b[:36] + struct.pack("<i", 0x9999) + b[40:], "different model"),
        (lambda b: b[:32] + struct.pack("<i", -3) + b[36:], "negative record count"),
        (lambda b: b[:20], "shorter than its header"),
        (lambda b: b[:HEADER_SIZE] + struct.pack("<i", 99) + b[HEADER_SIZE + 4 :], "corrupt"),
        (
            lambda b: (
                b[: HEADER_SIZE + 8] + struct.pack("<f", float("nan")) + b[HEADER_SIZE + 12 :]
            ),
            "corrupt",
        ),
    ],
)
def test_untrusted_files_are_ignored_with_a_message(
    tmp_path: Path, mutate: Any, message: str
) -> None:
    path = tmp_path / ".coli_kv"
    _write(path, LAYOUT, [3, 4, 5], _rows(3))
    path.write_bytes(mutate(path.read_bytes()))
    log = io.StringIO()
    assert KvFile(path, LAYOUT, WRITER).load(100, log) is None
    assert message in log.getvalue()


def test_colibri_written_file_with_zero_tag_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / ".coli_kv"
    _write(path, dataclasses.replace(LAYOUT, tag=0), [3, 4], _rows(2))
    loaded = KvFile(path, LAYOUT, WRITER).load(100, io.StringIO())
    assert loaded is not None and loaded.tokens == [3, 4]


def test_truncated_file_keeps_complete_records(tmp_path: Path) -> None:
    path = tmp_path / ".coli_kv"
    _write(path, LAYOUT, [3, 4, 5], _rows(3))
    path.write_bytes(path.read_bytes()[:-5])
    log = io.StringIO()
    loaded = KvFile(path, LAYOUT, WRITER).load(100, log)
    assert loaded is not None and loaded.tokens == [3, 4]
    assert np.array_equal(loaded.rows, _rows(2))
    assert "only 2 of 3 records" in log.getvalue()


def test_too_long_for_the_context_starts_over(tmp_path: Path) -> None:
    path = tmp_path / ".coli_kv"
    _write(path, LAYOUT, list(range(2, 12)), _rows(10))
    log = io.StringIO()
    assert KvFile(path, LAYOUT, WRITER).load(10, log) is None
    assert "starting over" in log.getvalue()


def _count_on_disk(path: Path) -> int:
    return int(struct.unpack_from("<i", path.read_bytes(), kv_persist.NREC_OFFSET)[0])


def test_a_rejected_file_has_its_count_reset_on_disk(tmp_path: Path) -> None:
    too_long = tmp_path / ".coli_kv"
    _write(too_long, LAYOUT, list(range(2, 12)), _rows(10))
    assert KvFile(too_long, LAYOUT, WRITER).load(8, io.StringIO()) is None
    assert _count_on_disk(too_long) == 0
    no_complete_record = tmp_path / ".coli_kv.1"
    _write(no_complete_record, LAYOUT, [3, 4, 5], _rows(3))
    no_complete_record.write_bytes(no_complete_record.read_bytes()[: HEADER_SIZE + 5])
    log = io.StringIO()
    assert KvFile(no_complete_record, LAYOUT, WRITER).load(100, log) is None
    assert "only 0 of 3 records" in log.getvalue()
    assert _count_on_disk(no_complete_record) == 0


@pytest.mark.interpreted_only
def test_a_kill_after_a_rejected_load_never_mixes_conversations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".coli_kv"
    _write(path, LAYOUT, list(range(2, 12)), _rows(10))
    kv = KvFile(path, LAYOUT, WRITER)
    assert kv.load(8, io.StringIO()) is None

    class Killed(Exception):
        pass

    real_write_count = KvFile._write_count

    def kill_before_the_new_count(self: KvFile, handle: object, nrec: int) -> None:
        if nrec != 0:
            raise Killed  # the new records are on disk, their count is not
        real_write_count(self, handle, nrec)

    monkeypatch.setattr(KvFile, "_write_count", kill_before_the_new_count)
    with pytest.raises(Killed):
        kv.append([40, 41], _rows(2) + 100)
    monkeypatch.undo()
    # a restart with a larger context must not see new head + old tail
    assert KvFile(path, LAYOUT, WRITER).load(100, io.StringIO()) is None


class _Recorder:
    """A file object that logs every write at its offset (to replay a kill at any point)."""

    def __init__(self, inner: Any, log: list[tuple[int, bytes]]) -> None:
        self.inner, self.log = inner, log

    def write(self, data: bytes) -> int:
        self.log.append((self.inner.tell(), bytes(data)))
        return int(self.inner.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __enter__(self) -> _Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()


@pytest.mark.interpreted_only
def test_a_kill_at_any_write_leaves_old_or_new_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".coli_kv"
    kv = KvFile(path, LAYOUT, WRITER)
    kv.append([3, 4], _rows(2))
    before = path.read_bytes()
    writes: list[tuple[int, bytes]] = []
    monkeypatch.setattr(
        kv_persist, "open", lambda p, mode: _Recorder(open(p, mode), writes), raising=False
    )
    kv.append([5, 6, 7], _rows(5)[2:])
    monkeypatch.undo()
    assert writes[-1][0] == 32  # the record count is the last thing written
    state = bytearray(before)
    for upto in range(len(writes) + 1):
        if upto:
            offset, data = writes[upto - 1]
            end = offset + len(data)
            state.extend(b"\0" * max(0, end - len(state)))
            # a kill can also land inside a write: try every split of this write's bytes
            for cut in (0, len(data) // 2, len(data)):
                partial = bytearray(state)
                partial[offset : offset + cut] = data[:cut]
                path.write_bytes(bytes(partial))
                loaded = KvFile(path, LAYOUT, WRITER).load(100, io.StringIO())
                assert loaded is not None and loaded.tokens in ([3, 4], [3, 4, 5, 6, 7])
            state[offset:end] = data
    path.write_bytes(bytes(state))
    loaded = KvFile(path, LAYOUT, WRITER).load(100, io.StringIO())
    assert loaded is not None and loaded.tokens == [3, 4, 5, 6, 7]


def test_persist_off_writes_nothing(tmp_path: Path) -> None:
    run_engine(
        [submit(1, 0, ids(3, 4), 2, ext="ids=1")],
        model=_model(),
        state_dir=tmp_path,
        env={"COLI_PERSIST": "off"},
    )
    assert list(tmp_path.iterdir()) == []
    run_engine(
        [submit(1, 0, ids(3, 4), 2, ext="ids=1")],
        model=_model(),
        state_dir=tmp_path,
        env={"KVSAVE": "0"},
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [".coli_usage", ".lock"]


def test_a_second_engine_on_the_same_state_dir_runs_without_persistence(tmp_path: Path) -> None:
    from colibri.engine.main import build_runtime
    from colibri.engine.settings import from_environment

    env = {"COLI_STATE_DIR": str(tmp_path)}
    settings = from_environment(env, model_dir=Path("fake"), ctx=64)
    first = build_runtime(settings, env, io.StringIO(), backend=_model())
    log = io.StringIO()
    second = build_runtime(settings, env, log, backend=_model())
    assert first.kv_enabled and not second.kv_enabled and second.state_dir is None
    assert "in use by another engine" in log.getvalue()
    first.close()
    third = build_runtime(settings, env, io.StringIO(), backend=_model())
    assert third.kv_enabled
    third.close()


# --- .coli_usage ---------------------------------------------------------------------------


def test_usage_file_format_and_accumulation(tmp_path: Path) -> None:
    script = [submit(1, 0, ids(3, 4, 5), 3, ext="ids=1")]
    run_engine(script, model=_model(), state_dir=tmp_path)
    text = (tmp_path / ".coli_usage").read_text()
    lines = text.splitlines()
    assert lines[:2] == ["-1 3 8", f"-2 1 {usage_file.ENGINE_ID}"]
    assert usage_file.ENGINE_ID == 3815245270
    records = [tuple(map(int, line.split())) for line in lines[2:]]
    assert all(layer in (1, 2) and 0 <= e < 8 and c > 0 for layer, e, c in records)
    # 3 prompt + 2 decode forwards, 2 experts each, 2 sparse layers
    assert sum(c for _, _, c in records) == 5 * 2 * 2
    run_engine(script, model=_model(), state_dir=tmp_path)
    again = [
        tuple(map(int, line.split()))
        for line in (tmp_path / ".coli_usage").read_text().splitlines()[2:]
    ]
    # The second run resumes the slot: only the last prompt token is re-forwarded (1 + 2
    # decode forwards), and the counts add to the first run's history.
    assert sum(c for _, _, c in again) == 5 * 2 * 2 + 3 * 2 * 2


def test_zero_history_is_a_zero_byte_file(tmp_path: Path) -> None:
    path = tmp_path / ".coli_usage"
    usage_file.save(path, np.zeros((4, 8), np.uint64))
    assert path.read_bytes() == b""


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("-1 5 8\n-2 1 3815245270\n3 1 4\n", "dimensions"),
        ("-1 3 8\n-2 2 3815245270\n", "version"),
        ("-1 3 8\n-2 1 12345\n", "engine id"),
        ("-1 3 8\n-2 1 3815245270\n0 1 4\n", "names no routed expert"),
        ("-1 3 8\n-2 1 3815245270\n1 9 4\n", "names no routed expert"),
        ("hello\n", "not three integers"),
    ],
)
def test_foreign_usage_files_are_ignored(tmp_path: Path, text: str, reason: str) -> None:
    (tmp_path / ".coli_usage").write_text(text)
    run = run_engine([], model=_model(), state_dir=tmp_path)
    assert f"[USAGE] ignoring {tmp_path / '.coli_usage'}" in run.stderr
    assert reason in run.stderr


def test_usage_decay_and_read_only_history(tmp_path: Path) -> None:
    script = [submit(1, 0, ids(3, 4, 5), 3, ext="ids=1")]
    run_engine(script, model=_model(), state_dir=tmp_path)
    path = tmp_path / ".coli_usage"
    first = path.read_bytes()

    def total() -> int:
        return sum(int(line.split()[2]) for line in path.read_text().splitlines()[2:])

    counts = [int(line.split()[2]) for line in path.read_text().splitlines()[2:]]
    assert total() == sum(counts)
    run_engine(script, model=_model(), state_dir=tmp_path, env={"USAGE_SAVE": "0"})
    assert path.read_bytes() == first  # read, never written
    run_engine([], model=_model(), state_dir=tmp_path, env={"COLI_USAGE_DECAY": "0.5"})
    assert total() == sum((c + 1) // 2 for c in counts)  # each count halved, half up


# -- the writer: KV rows resume only under the backend and build that wrote them (4.3) ------


def _conversation(tmp_path: Path, first: FakeBackend, second: FakeBackend) -> tuple[Any, Any]:
    """Run 1 on `first` persists a turn; run 2 on `second` resumes and extends it. Also
    returns the uninterrupted run on `second`."""
    one = submit(1, 0, ids(3, 4, 5, 6), 5, ext="ids=1")
    a = run_engine([one], model=first, state_dir=tmp_path)
    answer = [int(f.payload or b"0") for f in a.for_id(1) if f.kind == "DATA"]
    follow = submit(2, 0, ids(3, 4, 5, 6, *answer[:-1], 9), 4, ext="ids=1")
    resumed = run_engine([follow], model=second, state_dir=tmp_path)
    uninterrupted = run_engine([follow], model=_fake(second.name, second.build))
    return resumed, uninterrupted


def _fake(name: str = "fake", build: str = "fake 1") -> FakeBackend:
    return FakeBackend(FakeConfig(eos_token_ids=()), name=name, build=build)


def test_the_sidecar_names_the_writer(tmp_path: Path) -> None:
    run_engine([submit(1, 0, ids(3, 4), 2, ext="ids=1")], model=_fake("a"), state_dir=tmp_path)
    sidecar = writer_file(tmp_path / ".coli_kv")
    assert sidecar.name == ".coli_kv.writer"
    assert KvWriter.decode(sidecar.read_bytes()) == KvWriter("a", "fake 1")


def test_same_writer_imports_the_rows(tmp_path: Path) -> None:
    second = _fake("a")
    resumed, _ = _conversation(tmp_path, _fake("a"), second)
    assert second.imported == 1 and "re-prefilling" not in resumed.stderr


@pytest.mark.parametrize(
    ("first", "second"),
    [(("a", "fake 1"), ("b", "fake 1")), (("a", "fake 1"), ("a", "fake 2"))],
    ids=["other-backend", "other-build"],
)
def test_another_writer_is_re_prefilled_never_mixed(
    tmp_path: Path, first: tuple[str, str], second: tuple[str, str]
) -> None:
    resumer = _fake(*second)
    resumed, uninterrupted = _conversation(tmp_path, _fake(*first), resumer)
    assert resumer.imported == 0
    assert f"written by {first[0]} ({first[1]}), re-prefilling 8 tokens" in resumed.stderr
    assert "resumed conversation from disk: 8 tokens" in resumed.stderr
    assert "prefix 8/9" in resumed.stderr  # the conversation is kept, not its rows
    # Rows computed here: the same bytes as a run that never saw the other writer's file.
    assert _data(resumed, 2) == _data(uninterrupted, 2)
    # ...and the file is now the resumer's, records and sidecar together.
    ours = KvWriter(resumer.name, resumer.build)
    assert KvWriter.decode(writer_file(tmp_path / ".coli_kv").read_bytes()) == ours
    loaded = KvFile(tmp_path / ".coli_kv", LAYOUT, WRITER).load(100, io.StringIO())
    assert loaded is not None and loaded.writer == ours
    state = resumer.new_state()
    resumer.step([StepRow(state, t, False) for t in loaded.tokens[:8]])
    assert np.array_equal(loaded.rows[:8], resumer.export_kv(state, 0, 8))


def test_a_file_without_a_writer_is_re_prefilled(tmp_path: Path) -> None:
    """colibri writes no sidecar: its rows are another backend's."""
    path = tmp_path / ".coli_kv"
    _write(path, dataclasses.replace(LAYOUT, tag=0), [3, 4, 5], _rows(3))
    writer_file(path).unlink()
    resumer = _fake()
    run = run_engine([submit(1, 0, ids(3, 4, 5, 6), 2, ext="ids=1")], model=resumer,
                     state_dir=tmp_path)
    assert "written by an unknown writer, re-prefilling 3 tokens" in run.stderr
    assert "prefix 3/4" in run.stderr and resumer.imported == 0
    assert KvWriter.decode(writer_file(path).read_bytes()) == WRITER
