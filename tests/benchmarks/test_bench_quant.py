"""``colibri bench`` section ``quant-formats``: report shape and bookkeeping (no timing)."""

from __future__ import annotations

import json
from pathlib import Path

from colibri.benchmarks import BenchOptions, load_sections, select
from colibri.resources import fixture_model_dir


def test_quant_section_is_registered() -> None:
    assert "quant-formats" in load_sections()
    assert [s.name for s in select([], ["reference-quantized"])] == ["quant-formats"]


def test_quant_section_compares_formats_with_f32(tmp_path: Path) -> None:
    section = load_sections()["quant-formats"]
    options = BenchOptions(
        model=fixture_model_dir("glm5-tiny"), cache_dir=tmp_path, tokens=2, warmup=1,
        extra={"quant_schemes": ["f32", "int4g64", "e8"]},
    )
    result = section.run(options)
    json.dumps(result)  # the report is plain JSON
    formats = result["formats"]
    f32, int4 = formats["f32"], formats["int4g64"]
    assert f32["store"] == "MappedExpertStore" and int4["store"] == "QuantizedExpertStore"
    assert f32["tok_s_vs_f32"] == 1.0
    # grouped int4 experts move about 1/7 of the f32 expert bytes per token
    ratio = int4["expert_bytes_per_token"] / f32["expert_bytes_per_token"]
    assert 0.1 < ratio < 0.2
    assert int4["bytes_per_token"] < f32["bytes_per_token"]
    assert int4["expert_cache"]["misses"] > 0
    assert 0.0 <= int4["greedy_agreement_vs_f32"] <= 1.0
    assert f32["prefill_logits_max_abs_diff_vs_f32"] == 0.0
    assert 0.0 < int4["prefill_logits_rel_l2_vs_f32"] < 0.5
    assert len(int4["ids"]) == 3  # warmup + tokens
    # glm5-tiny's experts are 32 wide: e8 needs multiples of 256, reported, not crashed
    assert "multiple of 256" in formats["e8"]["error"]
    # the container is cached for the next run
    assert (tmp_path / "glm5-tiny-int4g64" / "convert_report.json").is_file()


def test_the_cached_container_name_carries_every_non_default_choice(tmp_path: Path) -> None:
    """A container cached before ``--io`` existed (int8 dense, f32 io) is never reused for the
    bench's int8-io pass, which converts its own once and then reuses it."""
    from colibri.reference.quant import Fmt
    from colibri.reference.quant.container import QuantContainer

    from colibri.benchmarks.decode_sections import QUANT_DENSE, QUANT_EXPERTS, QUANT_IO
    from colibri.benchmarks.quant_formats import container_dir, container_for

    base = fixture_model_dir("glm5-tiny")
    old = container_dir(base, QUANT_EXPERTS, tmp_path, QUANT_DENSE)
    assert old == tmp_path / "glm5-tiny-int4g64-int8"
    new = container_dir(base, QUANT_EXPERTS, tmp_path, QUANT_DENSE, QUANT_IO)
    assert new == tmp_path / "glm5-tiny-int4g64-int8-io-int8"
    assert container_dir(base, "e8", tmp_path) == tmp_path / "glm5-tiny-e8"
    got, seconds = container_for(base, QUANT_EXPERTS, tmp_path, QUANT_DENSE, QUANT_IO)
    assert got == new and seconds is not None and not old.exists()
    vocab, hidden = 256, 128
    head = QuantContainer.open(new).tensor_format("lm_head.weight", (vocab, hidden))
    assert head.fmt == Fmt.INT8_ROW
    assert container_for(base, QUANT_EXPERTS, tmp_path, QUANT_DENSE, QUANT_IO) == (new, None)
