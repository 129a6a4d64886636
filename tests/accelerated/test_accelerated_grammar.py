"""Constrained decoding is the same on both backends: the mask is applied in the
control plane before the pick, so the accelerated backend's rows, within tolerance of the
reference's, give the same constrained tokens (sameness kind (a), spec/model.md §15) for a
JSON Schema and for the strict tool-call envelope the server builds."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any

import jsonschema
import pytest
from support.accelerated_support import needs_library
from support.engine_harness import run_engine, submit
from support.grammar_cases import PERSON, PROMPT

from colibri import resources
from colibri.protocol import FrameReader
from colibri.text.tool_grammar import tool_envelope

pytestmark = needs_library

MODEL = resources.default_model_dir()
WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "note": {"type": "string"},
        },
        "required": ["city", "days"],
    },
}
ENVELOPE = tool_envelope([WEATHER], required=True).encode()


def tokens(backend: str, grammar: bytes, temperature: str, seed: int = 3) -> list[bytes]:
    """The DATA payloads (one per token) of a grammar request on ``backend``."""
    script = submit(1, 0, PROMPT, 120, temperature=temperature, top_p="0.95", grammar=grammar,
                    ext=f"seed={seed}")
    run = run_engine(script, model_dir=MODEL, ctx=512, backend_name=backend)
    done = [f for f in run.for_id(1) if f.kind == "DONE"]
    assert len(done) == 1, run.stderr
    return [f.payload or b"" for f in run.for_id(1) if f.kind == "DATA"]


@pytest.mark.parametrize("temperature", ["0", "0.9"])
def test_json_schema_tokens_match_the_reference(temperature: str) -> None:
    grammar = json.dumps(PERSON).encode()
    accelerated = tokens("accelerated", grammar, temperature)
    assert accelerated == tokens("reference", grammar, temperature)
    jsonschema.validate(json.loads(b"".join(accelerated)), PERSON)


def _arguments(text: str) -> dict[str, Any]:
    """The arguments of the one call in ``text`` (the envelope's XML form: string
    parameters raw, others JSON)."""
    assert text.startswith("<tool_call>get_weather") and text.endswith("</tool_call>"), text
    parts = text.split("<arg_key>")[1:]
    out: dict[str, Any] = {}
    for part in parts:
        key, rest = part.split("</arg_key><arg_value>")
        value = rest.split("</arg_value>")[0]
        out[key] = value if key in ("city", "note") else json.loads(value)
    return out


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_strict_tool_envelope_tokens_match_the_reference(temperature: str) -> None:
    accelerated = tokens("accelerated", ENVELOPE, temperature, seed=11)
    assert accelerated == tokens("reference", ENVELOPE, temperature, seed=11)
    text = b"".join(accelerated).decode()
    # One call and then possibly more: check the first against the schema.
    first = text.split("</tool_call>")[0] + "</tool_call>"
    jsonschema.validate(_arguments(first), WEATHER["parameters"])


def test_accelerated_engine_process_matches_the_reference() -> None:
    """``colibri engine --accelerated`` runs the mypyc-compiled control plane with the mask
    worker thread: the same tokens as the in-process reference run."""
    script = submit(1, 0, PROMPT, 120, temperature="0.9", top_p="0.95", grammar=ENVELOPE,
                    ext="seed=11")
    env = {**os.environ, "COLI_PERSIST": "0", "CTX": "512"}
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", "engine", "--accelerated", "--model", str(MODEL)],
        input=script, capture_output=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"[CONTROL] compiled" in proc.stderr, proc.stderr.decode()
    reader = FrameReader(io.BytesIO(proc.stdout))
    reader.read_preamble()
    data = []
    while (frame := reader.read_frame()) is not None:
        if frame.kind == "DATA":
            data.append(frame.payload or b"")
    assert data == tokens("reference", ENVELOPE, "0.9", seed=11)
