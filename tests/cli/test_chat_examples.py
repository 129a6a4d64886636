"""`colibri chat` starts by offering the prompts the model ships in its examples.json (the
ones the dashboard's empty chat offers); a model that ships none gets no such line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from colibri.server.examples import try_line

from colibri import resources


def _chat(model: Path, state: Path) -> str:
    env = {**os.environ, "XDG_STATE_HOME": str(state), "COLI_PERSIST": "0"}
    done = subprocess.run([sys.executable, "-m", "colibri", "chat", "--new", "--model",
                           str(model)], input=b":quit\n", capture_output=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr.decode()


@pytest.mark.slow
def test_chat_offers_the_default_models_examples(tmp_path: Path) -> None:
    model = resources.default_model_dir()
    shipped = json.loads((model / "examples.json").read_text())
    line = try_line(shipped)
    assert line is not None and shipped["chat"][0]["prompt"] in line
    assert line in _chat(model, tmp_path).splitlines()


@pytest.mark.slow
def test_a_model_without_examples_offers_none(tmp_path: Path) -> None:
    assert "[try:" not in _chat(resources.fixture_model_dir("glm5-chat-tiny"), tmp_path)
