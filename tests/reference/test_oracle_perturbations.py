"""Tolerances with teeth: a wrong constant in the math fails the oracle comparison.

The kind-(b) tolerance (spec/model.md §15) must admit every BLAS kernel's summation order and
still reject a model whose math is slightly wrong. Each case perturbs one constant by a fixed
amount -- through a perturbed copy of ``config.json`` where the constant is config-driven, else
by patching the reference module's constant -- and requires the teacher-forced comparison with
the transformers oracle to fail, while the unperturbed control passes. Every perturbation here
keeps every argmax of the fixture; only the tolerance can see it.

The DSA indexer is tested on its scores: a positive factor on every score cannot change a
top-k, so a wrong indexer scale leaves the logits bit for bit alone. The reference's scores are
compared with an independent float64 computation of spec/model.md §6 from the checkpoint's
own tensors, fed the inputs the reference's indexer saw.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import colibri.reference.dsa as dsa
import colibri.reference.mla as mla
import numpy as np
import pytest
from colibri.conformance.sameness import Tolerance, logit_scale_of, max_excess, reduction_length
from colibri.reference import load_model
from colibri.reference.config import INDEXER_NORM_EPS, LATENT_NORM_EPS, ModelConfig
from colibri.reference.safetensors import read_all

from colibri.resources import fixture_model_dir

Config = dict[str, Any]


def _oracle(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((fixture_model_dir(name) / "oracle.json").read_text())
    return data


def logits_excess(logits: np.ndarray, name: str) -> float:
    """How far teacher-forced ``logits`` exceed fixture ``name``'s tolerance (<= 0: within).

    The tolerance and the oracle always come from the committed fixture, never a perturbed copy.
    """
    fixture = fixture_model_dir(name)
    expected = np.load(fixture / "oracle_logits.npy")
    positions = len(_oracle(name)["full_ids"])
    return max_excess(logits, expected, Tolerance.for_model_dir(fixture, positions).logit)


def oracle_excess(model_dir: Path, name: str) -> float:
    """logits_excess of the reference loaded from ``model_dir`` on fixture ``name``'s ids."""
    return logits_excess(load_model(model_dir).forward(_oracle(name)["full_ids"]), name)


def perturbed_copy(name: str, dest: Path, edit: Callable[[Config], None]) -> Path:
    """The fixture copied under ``dest`` with ``edit`` applied to its config.json."""
    target = dest / name
    shutil.copytree(fixture_model_dir(name), target)
    config = json.loads((target / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def _scale_rope_theta(config: Config) -> None:
    config["rope_parameters"]["rope_theta"] *= 1.001


def _scale_routed_scaling(config: Config) -> None:
    config["routed_scaling_factor"] *= 1.00004


def _scale_rms_eps(config: Config) -> None:
    config["rms_norm_eps"] *= 1.1


#: Config-driven constants: (case id, edit). Amounts are fixed; each moves glm5-tiny's logits by
#: 4-40 tolerances and deepseek3-tiny's by 1.8-4 (spec/DEVIATIONS.md, "Sameness tolerances").
CONFIG_PERTURBATIONS: list[tuple[str, Callable[[Config], None]]] = [
    ("rope_theta x1.001", _scale_rope_theta),
    ("routed_scaling_factor x1.00004", _scale_routed_scaling),
    ("rms_norm_eps x1.1", _scale_rms_eps),
]
FIXTURES = ("glm5-tiny", "deepseek3-tiny")


@pytest.mark.parametrize("name", FIXTURES)
def test_unperturbed_control_passes(name: str) -> None:
    assert oracle_excess(fixture_model_dir(name), name) <= 0


@pytest.mark.parametrize("name", FIXTURES)
def test_unedited_config_copy_passes(name: str, tmp_path: Path) -> None:
    # The seam itself (copy + JSON rewrite) changes nothing.
    assert oracle_excess(perturbed_copy(name, tmp_path, lambda config: None), name) <= 0


@pytest.mark.parametrize(
    "case, edit", CONFIG_PERTURBATIONS, ids=[c for c, _ in CONFIG_PERTURBATIONS]
)
@pytest.mark.parametrize("name", FIXTURES)
def test_a_wrong_config_constant_fails_the_oracle(
    name: str, case: str, edit: Callable[[Config], None], tmp_path: Path
) -> None:
    assert oracle_excess(perturbed_copy(name, tmp_path, edit), name) > 0, case


@pytest.mark.parametrize("name", FIXTURES)
def test_a_wrong_latent_norm_eps_fails_the_oracle(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # q_a_layernorm / kv_a_layernorm: HF's class default 1e-6, not config.rms_norm_eps (§3.1).
    assert LATENT_NORM_EPS == 1e-6
    monkeypatch.setattr(mla, "LATENT_NORM_EPS", 1e-5)
    assert oracle_excess(fixture_model_dir(name), name) > 0


@pytest.mark.parametrize("name", FIXTURES)
def test_a_wrong_attention_scale_fails_the_oracle(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The softmax scale 1/sqrt(qk_head_dim) (§5), off by one part in 10^4.
    def attn_scale(self: ModelConfig) -> float:
        return 1.0001 / math.sqrt(self.qk_head_dim)

    monkeypatch.setattr(ModelConfig, "attn_scale", property(attn_scale))
    assert oracle_excess(fixture_model_dir(name), name) > 0


# ---------------------------------------------------------------------------------------------
# The DSA indexer, on its scores

DSA = "glm5-tiny-dsa"


class IndexerSpy:
    """Records, per indexer layer, the inputs the reference's indexer saw and the scores and
    kept positions it produced, in one full-sequence forward."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hidden: dict[int, np.ndarray] = {}
        self.q_resid: dict[int, np.ndarray] = {}
        self.scores: list[np.ndarray] = []
        self.kept: list[Any] = []
        self._layer_of: dict[int, int] = {}
        # Wraps whatever the module holds now, so a perturbation patched in first is spied on.
        keys, queries = dsa.index_keys, dsa.index_queries
        rows, select = dsa.scores_row, dsa.select

        def index_keys(x: np.ndarray, w: Any, *args: Any) -> np.ndarray:
            self.hidden[self._layer(w)] = x.copy()
            return keys(x, w, *args)

        def index_queries(q: np.ndarray, w: Any, *args: Any) -> np.ndarray:
            self.q_resid[self._layer(w)] = q.copy()
            return queries(q, w, *args)

        def scores_row(*args: Any) -> np.ndarray:
            out = rows(*args)
            self.scores.append(out.copy())
            return out

        def select_spy(scores: np.ndarray, topk: int) -> Any:
            kept = select(scores, topk)
            self.kept.append(None if kept is None else kept.tolist())
            return kept

        monkeypatch.setattr(dsa, "index_keys", index_keys)
        monkeypatch.setattr(dsa, "index_queries", index_queries)
        monkeypatch.setattr(dsa, "scores_row", scores_row)
        monkeypatch.setattr(dsa, "select", select_spy)

    def bind(self, model: Any) -> None:
        self._layer_of = {
            id(lw.attention.indexer): lw.index
            for lw in model.layers
            if lw.attention.indexer is not None
        }

    def _layer(self, w: Any) -> int:
        return self._layer_of[id(w)]


def spied_forward(monkeypatch: pytest.MonkeyPatch) -> tuple[IndexerSpy, np.ndarray]:
    spy = IndexerSpy(monkeypatch)
    model = load_model(fixture_model_dir(DSA))
    spy.bind(model)
    logits = model.forward(_oracle(DSA)["full_ids"])
    return spy, logits


def independent_scores(layer: int, hidden: np.ndarray, q_resid: np.ndarray) -> list[np.ndarray]:
    """spec/model.md §6 in float64, straight from the checkpoint: row i's scores over keys 0..i.

    The rotation is the pairwise one (pairs (2j, 2j+1) stay in place): it has the same dot
    products as the reference's de-interleaved layout, so the layouts are checked against each
    other too. Angles follow §4 (float32 inverse frequencies and angles).
    """
    folder = fixture_model_dir(DSA)
    config = json.loads((folder / "config.json").read_text())
    tensors = read_all(folder / "model.safetensors")
    prefix = f"model.layers.{layer}.self_attn.indexer."

    def weight(name: str) -> np.ndarray:
        return np.asarray(tensors[prefix + name], dtype=np.float64)

    heads, dim, rope = config["index_n_heads"], config["index_head_dim"], config["qk_rope_head_dim"]
    theta = np.float32(config["rope_parameters"]["rope_theta"])
    t = hidden.shape[0]
    exponents = np.arange(0, rope, 2, dtype=np.float32) / np.float32(rope)
    inv = np.float32(1) / np.power(theta, exponents)
    angles = (np.arange(t, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float64)

    def rotate(v: np.ndarray) -> np.ndarray:  # v [T, ..., dim]; the first `rope` dims rotate
        shape = (t,) + (1,) * (v.ndim - 2) + (rope // 2,)
        c, s = np.cos(angles).reshape(shape), np.sin(angles).reshape(shape)
        out = v.copy()
        a, b = v[..., 0:rope:2], v[..., 1:rope:2]
        out[..., 0:rope:2], out[..., 1:rope:2] = a * c - b * s, b * c + a * s
        return out

    h = hidden.astype(np.float64)
    k = h @ weight("wk.weight").T
    k = (k - k.mean(-1, keepdims=True)) / np.sqrt(k.var(-1, keepdims=True) + 1e-6)
    k = rotate(k * weight("k_norm.weight") + weight("k_norm.bias"))
    q = rotate((q_resid.astype(np.float64) @ weight("wq_b.weight").T).reshape(t, heads, dim))
    w = (h @ weight("weights_proj.weight").T) / math.sqrt(heads)
    out = []
    for i in range(t):
        per_head = np.maximum(q[i] @ k[: i + 1].T / math.sqrt(dim), 0.0)  # [heads, i+1]
        out.append(w[i] @ per_head)
    return out


def score_excess(spy: IndexerSpy) -> float:
    """How far the reference's indexer scores exceed their kind-(b) tolerance, every layer."""
    expected: list[np.ndarray] = []
    for layer in sorted(spy.hidden):
        expected += independent_scores(layer, spy.hidden[layer], spy.q_resid[layer])
    assert len(expected) == len(spy.scores) > 0
    got, want = np.concatenate(spy.scores), np.concatenate(expected)
    config = json.loads((fixture_model_dir(DSA) / "config.json").read_text())
    positions = len(_oracle(DSA)["full_ids"])
    tolerance = Tolerance(reduction_length(config, positions), logit_scale_of(want))
    return max_excess(got, want, tolerance.logit)


@pytest.fixture
def unperturbed(monkeypatch: pytest.MonkeyPatch) -> tuple[IndexerSpy, np.ndarray]:
    with monkeypatch.context() as scope:  # the spy is gone again before the test patches
        return spied_forward(scope)


def test_indexer_scores_match_an_independent_computation(
    unperturbed: tuple[IndexerSpy, np.ndarray],
) -> None:
    spy, _ = unperturbed
    assert sorted(spy.hidden) == [0, 2]  # glm5-tiny-dsa's "full" layers
    assert any(k is not None for k in spy.kept), "the fixture must make the indexer select"
    assert score_excess(spy) <= 0


def _scale_output(function: Callable[..., np.ndarray], factor: float) -> Callable[..., np.ndarray]:
    def scaled(*args: Any) -> np.ndarray:
        out: np.ndarray = function(*args) * np.float32(factor)
        return out

    return scaled


#: Indexer constants perturbed through the reference's own module. A factor on the head
#: weights' 1/sqrt(n_heads) or on the score scale 1/sqrt(head_dim) (relu is positively
#: homogeneous) is a positive factor on every score: the top-k cannot see it.
INDEXER_PERTURBATIONS: list[tuple[str, Callable[[pytest.MonkeyPatch], None]]] = [
    ("head weight scale x1.001",
     lambda mp: mp.setattr(dsa, "head_weights", _scale_output(dsa.head_weights, 1.001))),
    ("score scale x1.001",
     lambda mp: mp.setattr(dsa, "scores_row", _scale_output(dsa.scores_row, 1.001))),
    ("key LayerNorm eps 1e-6 -> 1e-5", lambda mp: mp.setattr(dsa, "INDEXER_NORM_EPS", 1e-5)),
]


@pytest.mark.parametrize(
    "case, perturb", INDEXER_PERTURBATIONS, ids=[c for c, _ in INDEXER_PERTURBATIONS]
)
def test_a_wrong_indexer_constant_fails_on_scores_not_on_logits(
    case: str,
    perturb: Callable[[pytest.MonkeyPatch], None],
    unperturbed: tuple[IndexerSpy, np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert INDEXER_NORM_EPS == 1e-6
    control, control_logits = unperturbed
    perturb(monkeypatch)
    spy, logits = spied_forward(monkeypatch)
    # The selections and hence the logits cannot tell ...
    assert spy.kept == control.kept, case
    np.testing.assert_array_equal(logits, control_logits)
    assert logits_excess(logits, DSA) <= 0
    # ... the scores can.
    assert score_excess(spy) > 0, case
