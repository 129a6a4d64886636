"""Golden regression for anyone's model: record an engine's outputs on a prompt set, then
compare another engine or build against the recording under the sameness rules (§15).

``record`` runs each prompt greedily (temperature 0, top_p 1) on one freshly started engine,
in order, with ``logprobs=k`` so every DATA frame carries its token id, logprob and top-k
table, and keeps that request's DATA frames and its DONE. ``compare`` runs the same prompts
on the target and compares the frames with :class:`.golden_compare.FrameComparer`: token ids,
payload bytes, counts and flags exact (kind (a)), logprobs within the model's tolerance
(kind (b)), top-k tables tie-aware. The DONE fields that measure the run rather than its
result (``tok_s``, ``hit_pct``, ``rss_gb``) are masked as ``*``.

The recording is JSON (``FORMAT``): the prompts as given, the settings, the tolerance's
``reduction_length`` and ``logit_scale`` (from the model's oracle logits, or given by the
user for a model without an oracle), and per prompt its frame lines (``header | payload``,
the payload as latin-1 so every byte survives).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from colibri.conformance.engine import EngineError, EngineSession, EngineTarget
from colibri.conformance.frames import Frame
from colibri.conformance.golden_compare import PAYLOAD_SEPARATOR, Comparison, FrameComparer
from colibri.conformance.prompts import PromptCodec, submit_frame
from colibri.conformance.sameness import Tolerance

from colibri.protocol import load_spec, parse_line

FORMAT = "colibri-golden-recording/1"
#: DONE fields that measure the run, not its result.
MEASURED = frozenset({"tok_s", "hit_pct", "rss_gb"})
MASK = "*"
KEPT_KINDS = frozenset({"DATA", "DONE", "ERROR"})


class RecordingError(ValueError):
    pass


@dataclass
class Recording:
    engine: str
    model: str
    max_tokens: int
    logprobs: int
    tolerance: Tolerance
    prompts: list[Any]
    frames: list[list[str]]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "engine": self.engine,
            "model": self.model,
            "max_tokens": self.max_tokens,
            "logprobs": self.logprobs,
            "tolerance": {"reduction_length": self.tolerance.reduction_length,
                          "logit_scale": self.tolerance.logit_scale},
            "prompts": [{"prompt": p, "frames": f}
                        for p, f in zip(self.prompts, self.frames, strict=True)],
        }

    @classmethod
    def from_json(cls, document: Any) -> Recording:
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise RecordingError(f"not a {FORMAT} document")
        try:
            tolerance = Tolerance(int(document["tolerance"]["reduction_length"]),
                                  float(document["tolerance"]["logit_scale"]))
            entries = document["prompts"]
            return cls(str(document["engine"]), str(document["model"]),
                       int(document["max_tokens"]), int(document["logprobs"]), tolerance,
                       [e["prompt"] for e in entries], [list(e["frames"]) for e in entries])
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordingError(f"malformed recording: {exc}") from exc

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Recording:
        try:
            return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            raise RecordingError(f"{path}: not JSON: {exc}") from exc


def frame_line(frame: Frame) -> str:
    """A frame as a recording line: DONE's measurements masked, the payload after ``|``."""
    text = frame.header.decode("latin-1")
    if frame.kind == "DONE":
        parsed = parse_line(text, load_spec())
        if parsed is not None:
            fields = text.split(" ")
            names = [f.get("name", f.get("literal")) for f in parsed.spec.fields]
            text = " ".join([fields[0]] + [MASK if n in MEASURED else v
                                           for n, v in zip(names, fields[1:], strict=False)])
    if frame.payload is not None:
        text += PAYLOAD_SEPARATOR + frame.payload.decode("latin-1")
    return text


def run_prompts(
    target: EngineTarget,
    codec: PromptCodec,
    prompts: list[Any],
    max_tokens: int,
    logprobs: int,
    timeout: float = 120.0,
) -> list[list[str]]:
    """Each prompt's DATA/DONE (or ERROR) lines, one request at a time on one engine."""
    session = EngineSession(target, {"kv_slots": 1})
    try:
        session.start()
        out = []
        for number, prompt in enumerate(prompts, start=1):
            start = len(session.frames)
            payload = codec.encode(prompt)
            session.send(submit_frame(number, 0, payload, max_tokens, 0.0, 1.0,
                                      {"logprobs": logprobs}))
            session.wait_for(lambda f, rid=number: f.kind in ("DONE", "ERROR")
                             and f.request_id == rid, timeout, f"the end of prompt {number}",
                             start)
            out.append([frame_line(f) for f in session.frames[start:]
                        if f.kind in KEPT_KINDS and f.request_id == number])
        return out
    finally:
        session.close()


def record(
    engine_cmd: str,
    model_dir: Path,
    prompts: list[Any],
    max_tokens: int,
    logprobs: int,
    tolerance: Tolerance,
    prompt_mode: str = "auto",
) -> Recording:
    target = EngineTarget.from_command(engine_cmd, model_dir)
    codec = PromptCodec.for_model(model_dir, prompt_mode)
    frames = run_prompts(target, codec, prompts, max_tokens, logprobs)
    return Recording(engine_cmd, model_dir.name, max_tokens, logprobs, tolerance, prompts, frames)


def compare(recording: Recording, actual: list[list[str]]) -> Comparison:
    """The target's lines against the recording's, prompt by prompt."""
    comparer = FrameComparer(recording.tolerance)
    out = Comparison()
    if len(actual) != len(recording.frames):
        out.fail("prompts", f"{len(actual)} prompts", f"{len(recording.frames)} prompts")
    for number, (got, want) in enumerate(zip(actual, recording.frames, strict=False)):
        part = comparer.lines(got, want)
        part.mismatches = [replace(m, where=f"prompt {number}: {m.where}")
                           for m in part.mismatches]
        out.merge(part)
    return out


def compare_engine(
    recording: Recording, engine_cmd: str, model_dir: Path, prompt_mode: str = "auto"
) -> Comparison:
    target = EngineTarget.from_command(engine_cmd, model_dir)
    codec = PromptCodec.for_model(model_dir, prompt_mode)
    try:
        actual = run_prompts(target, codec, recording.prompts, recording.max_tokens,
                             recording.logprobs)
    except EngineError as exc:
        out = Comparison()
        out.fail("engine", str(exc), "a run of every prompt", "engine")
        return out
    return compare(recording, actual)
