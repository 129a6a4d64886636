"""Per-layer goldens (spec/model.md §16): the committed dumps are the reference's trace, and
``colibri golden diff`` points at the first layer and quantity where a perturbed reference
departs, and at nothing before it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from colibri.conformance.layer_diff import DumpError, diff, load
from colibri.reference import load_model
from colibri.reference.layer_trace import trace
from colibri.reference.model import Model

from colibri.cli import main
from colibri.resources import fixtures_dir

MODELS = ("glm5-tiny", "glm5-tiny-dsa", "deepseek3-tiny")


def _folder(name: str) -> Path:
    return fixtures_dir() / "models" / name


def _ids(name: str) -> list[int]:
    oracle = json.loads((_folder(name) / "oracle.json").read_text(encoding="utf-8"))
    return [int(t) for t in oracle["full_ids"]]


@pytest.fixture(scope="module")
def goldens() -> dict[str, dict[str, np.ndarray]]:
    return {name: load(fixtures_dir() / "layers" / f"{name}.npz") for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_the_committed_golden_is_the_reference_trace(
    name: str, goldens: dict[str, dict[str, np.ndarray]]
) -> None:
    model = load_model(_folder(name))
    dump = trace(model, _ids(name))
    result = diff(goldens[name], dump)
    assert result.first is None and result.missing == [], result.report()
    layers = model.config.num_hidden_layers
    assert sum(n.startswith("hidden.") for n in result.compared) == layers
    # The trace is the forward itself: the very bytes (kind (c), one machine).
    assert np.array_equal(dump["logits"], model.forward(_ids(name)))


def _perturbed(model: Model, layer: int, **changes: object) -> Model:
    lw = model.layers[layer]
    attention = dataclasses.replace(lw.attention, **changes)
    model.layers[layer] = dataclasses.replace(lw, attention=attention)
    return model


def test_a_perturbed_attention_departs_first_at_its_layer(
    goldens: dict[str, dict[str, np.ndarray]]
) -> None:
    model = load_model(_folder("glm5-tiny"))
    o = model.layers[2].attention.o
    dump = trace(_perturbed(model, 2, o=(o * np.float32(1.001)).astype(np.float32)),
                 _ids("glm5-tiny"))
    result = diff(goldens["glm5-tiny"], dump)
    first = result.first
    assert first is not None and first.layer == 2 and first.quantity == "hidden"
    assert all(d.layer is None or d.layer >= 2 for d in result.departures)
    assert result.departures[-1].quantity == "logits"


def test_a_perturbed_indexer_departs_first_at_its_selected_keys(
    goldens: dict[str, dict[str, np.ndarray]]
) -> None:
    model = load_model(_folder("glm5-tiny-dsa"))
    indexer = model.layers[0].attention.indexer
    assert indexer is not None
    shuffled = dataclasses.replace(indexer, wk=np.ascontiguousarray(indexer.wk[::-1]))
    result = diff(goldens["glm5-tiny-dsa"],
                  trace(_perturbed(model, 0, indexer=shuffled), _ids("glm5-tiny-dsa")))
    first = result.first
    assert first is not None and (first.layer, first.quantity) == (0, "dsa_keys")
    assert first.position >= 4  # queries that see at most index_topk keys keep them all


def test_missing_quantities_are_listed_and_another_prompt_is_refused(
    goldens: dict[str, dict[str, np.ndarray]]
) -> None:
    golden = goldens["glm5-tiny"]
    partial = {k: v for k, v in golden.items() if not k.startswith("expert")}
    result = diff(golden, partial)
    assert result.first is None
    assert result.missing and all(m.startswith("expert") for m in result.missing)
    with pytest.raises(DumpError, match="tokens differ"):
        diff(golden, {**golden, "tokens": golden["tokens"][::-1]})


def test_golden_diff_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             goldens: dict[str, dict[str, np.ndarray]]) -> None:
    golden = goldens["deepseek3-tiny"]
    bent = dict(golden)
    bent["experts.1"] = golden["experts.1"].copy()
    bent["experts.1"][5, 0] = (bent["experts.1"][5, 0] + 1) % 16
    np.savez(tmp_path / "bent.npz", **bent)
    assert main(["golden", "diff", "--fixture", "deepseek3-tiny",
                 "--target", str(tmp_path / "bent.npz")]) == 1
    assert "first departure: layer 1 experts, token position 5" in capsys.readouterr().out
