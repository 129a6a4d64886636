"""``colibri convert --io int8``: the embedding and the lm_head stored int8-row (colibri's real
containers, ``--io-bits 8``). The reference dequantizes both once at load; the accelerated
engine reads the lm_head with the fused kernels in place and decodes only the embedding rows a
lookup gathers. Token for token with the reference (spec/model.md §14, §15), the MTP head and
tied embeddings included; a corrupt io tensor is refused at load by both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.conformance.sameness import Tolerance, logit_scale_of, max_excess
from colibri.conformance.sameness import reduction_length as length_of
from colibri.reference import load_model as load_reference
from colibri.reference.quant import Fmt
from colibri.reference.quant.convert import convert
from colibri.reference.quant.safetensors_file import SafetensorsDir, write_safetensors
from support.accelerated_support import BUILT, NOT_BUILT_REASON, assert_mtp_drafts_match
from support.reference_support import copy_fixture, rewrite_tensors

from colibri.resources import fixture_model_dir

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
IDS = [5, 17, 99, 3, 250, 8, 41, 77, 2, 13]


@pytest.fixture(scope="module")
def mtp_container(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("io") / "mtp-int8-io"
    convert(fixture_model_dir("glm5-tiny-mtp"), out, "int4g64", "int8", io="int8")
    return out


def tolerance(folder: Path, reference_logits: np.ndarray, positions: int) -> float:
    config = json.loads((folder / "config.json").read_text())
    return Tolerance(length_of(config, positions), logit_scale_of(reference_logits)).logit


def greedy(m: Any, prompt: list[int], new: int) -> list[int]:
    state = m.new_state()
    logits = m.prefill(state, prompt)[-1]
    out = []
    for _ in range(new):
        out.append(int(np.argmax(logits)))
        logits = m.decode(state, out[-1])
    return out


def test_the_io_weights_stay_int8_in_the_accelerated_engine(mtp_container: Path) -> None:
    from colibri.accelerated import load_model
    from colibri.accelerated.kernels import QuantWeight

    m = load_model(mtp_container, threads=2)
    assert isinstance(m.lm_head, QuantWeight) and m.lm_head.matrix.fmt == Fmt.INT8_ROW
    cfg = m.config
    assert m.lm_head.nbytes == cfg.vocab_size * (cfg.hidden_size + 4)  # int8 + one scale a row
    assert m.embed.quantized and isinstance(m.embed.weight, QuantWeight)
    # The lookup decodes q * s like the reference's dequantize-at-load: the same bytes.
    r = load_reference(mtp_container)
    ids = [0, 7, 250, 7, cfg.vocab_size - 1]
    assert m.embed.rows(ids).tobytes() == np.ascontiguousarray(r.embed[ids]).tobytes()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.embed.rows([cfg.vocab_size])


def test_logits_greedy_tokens_and_mtp_drafts_match_the_reference(mtp_container: Path) -> None:
    from colibri.accelerated import load_model

    m, r = load_model(mtp_container, threads=2), load_reference(mtp_container)
    want = r.prefill(r.new_state(), IDS)
    got = m.forward(IDS)
    tol = tolerance(mtp_container, want, len(IDS))
    assert max_excess(got, want, tol) <= 0
    assert greedy(m, IDS, 6) == greedy(r, IDS, 6)
    assert_mtp_drafts_match(m, r, IDS, tol)


def test_a_batched_row_is_the_same_bytes_as_alone(mtp_container: Path) -> None:
    from colibri.accelerated import load_model
    from support.accelerated_support import assert_decode_batch_invariant

    m = load_model(mtp_container, threads=2)
    assert_decode_batch_invariant(m, [[1, 2, 3], [9, 8, 7, 6, 5], [42]])


def test_tied_embeddings_share_one_int8_table(tmp_path: Path) -> None:
    from colibri.accelerated import load_model

    hf = copy_fixture("glm5-tiny", tmp_path)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    rewrite_tensors(hf, lambda t: t.pop(HEAD))
    out = tmp_path / "tied"
    convert(hf, out, "int4g64", io="int8")
    m, r = load_model(out, threads=2), load_reference(out)
    assert m.lm_head is m.embed.weight and r.lm_head is r.embed
    want = r.forward(IDS)
    got = m.forward(IDS)
    assert max_excess(got, want, tolerance(out, want, len(IDS))) <= 0
    assert [int(i) for i in got.argmax(-1)] == [int(i) for i in want.argmax(-1)]


def _rewritten(src: Path, dst: Path, name: str, value: np.ndarray) -> Path:
    import shutil

    shutil.copytree(src, dst)
    files = SafetensorsDir(src)
    tensors = {n: np.array(files.array(n)) for n in files.tensors}
    tensors[name] = value
    write_safetensors(dst / "model.safetensors", tensors, files.metadata["model.safetensors"])
    return dst


@pytest.mark.parametrize("name", [EMBED, HEAD])
def test_a_corrupt_io_tensor_is_refused_at_load_by_both_engines(
        mtp_container: Path, tmp_path: Path, name: str) -> None:
    from colibri.accelerated import load_model
    from colibri.accelerated.quant_kernels import NonFiniteScaleError
    from colibri.reference.quant import QuantFormatError

    scales = np.array(SafetensorsDir(mtp_container).array(name + ".qs"))
    scales[3] = np.nan
    bad = _rewritten(mtp_container, tmp_path / "nan", name + ".qs", scales)
    with pytest.raises(NonFiniteScaleError, match=name):
        load_model(bad, threads=1)
    with pytest.raises(QuantFormatError, match="finite"):
        load_reference(bad)
    short = np.array(SafetensorsDir(mtp_container).array(name + ".qs"))[:-1]
    cut = _rewritten(mtp_container, tmp_path / "short", name + ".qs", short)
    for load in (lambda d: load_model(d, threads=1), load_reference):
        with pytest.raises(QuantFormatError, match=name):
            load(cut)
