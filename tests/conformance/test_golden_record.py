"""``colibri golden record`` / ``compare``: an engine's outputs on a prompt set, and another
run against the recording under the sameness rules (spec/model.md §15)."""

from __future__ import annotations

import copy
import json
import shlex
import sys
from pathlib import Path

import pytest
from colibri.conformance.golden_record import (
    FORMAT,
    Recording,
    RecordingError,
    compare,
    compare_engine,
)

from colibri.cli import main
from colibri.resources import fixtures_dir

MODEL = fixtures_dir() / "models" / "glm5-tiny"
ENGINE = f"{shlex.quote(sys.executable)} -m colibri engine"
PROMPTS = [{"oracle": "prompt_ids"}, "hello world"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("golden")
    (folder / "prompts.json").write_text(json.dumps(PROMPTS))
    out = folder / "recording.json"
    assert main(["golden", "record", "--model", str(MODEL), "--prompts",
                 str(folder / "prompts.json"), "--out", str(out), "--max-tokens", "5",
                 "--logprobs", "3"]) == 0
    return out


def test_a_recording_holds_each_prompts_frames(recorded: Path) -> None:
    document = json.loads(recorded.read_text())
    assert document["format"] == FORMAT and document["logprobs"] == 3
    first = document["prompts"][0]["frames"]
    assert [line.split(" ")[0] for line in first] == ["DATA"] * 5 + ["DONE"]
    assert first[-1].startswith("DONE 1 STAT 5 * * * 12 ")  # measurements masked
    assert all(len(line.split(" | ")[0].split(" ")) == 5 + 2 * 3 for line in first[:-1])


def test_the_same_engine_compares_same(recorded: Path) -> None:
    result = compare_engine(Recording.load(recorded), ENGINE, MODEL)
    assert result.ok, result.report()
    assert result.worst["DATA.logprob"] == 0.0  # one machine, one engine: the same bytes


def _edited(recording: Recording, prompt: int, line: int, field: int, value: str) -> Recording:
    edited = copy.deepcopy(recording)
    head, sep, payload = edited.frames[prompt][line].partition(" | ")
    fields = head.split(" ")
    fields[field] = value
    edited.frames[prompt][line] = " ".join(fields) + sep + payload
    return edited


def test_compare_names_what_departs(recorded: Path) -> None:
    recording = Recording.load(recorded)
    actual = recording.frames
    assert compare(recording, actual).ok
    logprob = float(actual[0][0].split(" ")[3])
    tolerance = recording.tolerance.logprob
    near = _edited(recording, 0, 0, 3, f"{logprob + tolerance / 2:.6f}")
    assert compare(near, actual).ok  # kind (b): within the tolerance
    far = _edited(recording, 0, 0, 3, f"{logprob + 10 * tolerance + 1e-3:.6f}")
    assert "prompt 0: line 0 (DATA) logprob" in compare(far, actual).report()
    token = _edited(recording, 1, 2, 5, "7")  # a top-k candidate's id: kind (a)
    assert not compare(token, actual).ok
    assert "prompts" in compare(recording, actual[:1]).report()


def test_malformed_recordings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="not a colibri-golden-recording"):
        Recording.from_json({"format": "other"})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(RecordingError, match="not JSON"):
        Recording.load(tmp_path / "bad.json")
