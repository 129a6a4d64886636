"""Helpers shared by the reference-engine tests: cached fixture models and their oracles."""

from __future__ import annotations

import dataclasses
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from colibri.reference import ModelConfig, ReferenceModel, load_model
from colibri.reference.safetensors import Checkpoint, read_all, write_safetensors

from colibri.resources import fixture_model_dir

ORACLE_FIXTURES = (
    "glm5-tiny", "glm5-tiny-dsa", "deepseek3-tiny", "glm5-tiny-mtp", "glm5-chat-tiny",
    "glm5-chat-small", "olmoe-tiny", "qwen3moe-tiny", "kimi-tiny",
)


@cache
def model(name: str) -> ReferenceModel:
    return load_model(fixture_model_dir(name))


def fresh_model(name: str) -> ReferenceModel:
    return load_model(fixture_model_dir(name))


def causal_model(name: str) -> ReferenceModel:
    """The fixture read as if its config declared no DSA indexer: every layer is plain
    causal MLA (the experiments' "indexer off", as a config rather than a model switch)."""
    path = fixture_model_dir(name)
    config = dataclasses.replace(ModelConfig.from_dir(path), indexer_types=None)
    return ReferenceModel(config, Checkpoint(path))


@cache
def oracle(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((fixture_model_dir(name) / "oracle.json").read_text())
    return data


def oracle_logits(name: str) -> np.ndarray:
    return np.load(fixture_model_dir(name) / "oracle_logits.npy")


def copy_fixture(name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(fixture_model_dir(name), target)
    return target


def rewrite_tensors(model_dir: Path, change: Any) -> None:
    """Load every tensor, let ``change(dict)`` edit the dict, write the file back."""
    path = model_dir / "model.safetensors"
    tensors = read_all(path)
    change(tensors)
    path.unlink()
    write_safetensors(path, tensors)


def greedy(m: ReferenceModel, prompt: list[int], new_tokens: int) -> list[int]:
    state = m.new_state()
    logits = m.prefill(state, prompt)[-1]
    ids = list(prompt)
    for _ in range(new_tokens):
        token = int(np.argmax(logits))
        ids.append(token)
        logits = m.decode(state, token)
    return ids


def mapped_file_bytes(model_dir: Path, page: int = 4096) -> int:
    """The most a process's maps of ``model_dir``'s weight files can hold resident: each
    file's size rounded up to whole pages."""
    return sum(-(-f.stat().st_size // page) * page for f in model_dir.glob("*.safetensors"))
