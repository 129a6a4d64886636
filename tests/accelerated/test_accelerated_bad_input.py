"""Bad input to the accelerated engine: named errors, never a crash (a segfault would kill
the test process). The loader checks every tensor before any C kernel sees its address."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from colibri.reference.errors import CheckpointError
from support.accelerated_support import BUILT, NOT_BUILT_REASON
from support.reference_support import copy_fixture, rewrite_tensors

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)

# `make sanitize-test` (a step of .ci/run) runs this file again against the ASan + UBSan
# build of the C library, so an out-of-bounds read a check missed is caught, not survived.
pytestmark = pytest.mark.sanitize

from colibri.accelerated import load_model  # noqa: E402
from colibri.accelerated.kernels import (  # noqa: E402
    KernelInvalidArgument,
    Kernels,
    KernelUnsupportedDtype,
    Weight,
)


def test_a_truncated_file_names_the_tensor(tmp_path: Path) -> None:
    target = copy_fixture("glm5-tiny", tmp_path)
    path = target / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="run past the end of the file"):
        load_model(target, threads=1)


def test_a_corrupt_header_is_refused(tmp_path: Path) -> None:
    target = copy_fixture("glm5-tiny", tmp_path)
    path = target / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:12] = b"\xff\xfe{{"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="header"):
        load_model(target, threads=1)


def test_a_wrong_shape_names_the_tensor(tmp_path: Path) -> None:
    target = copy_fixture("glm5-tiny", tmp_path)
    name = "model.layers.1.self_attn.kv_b_proj.weight"
    rewrite_tensors(target, lambda t: t.__setitem__(name, t[name][:-1]))
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        load_model(target, threads=1)


def test_a_missing_expert_is_refused_at_load(tmp_path: Path) -> None:
    target = copy_fixture("glm5-tiny", tmp_path)
    name = "model.layers.3.mlp.experts.5.down_proj.weight"
    rewrite_tensors(target, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        load_model(target, threads=1)


def test_a_non_finite_expert_is_refused_when_first_used(tmp_path: Path) -> None:
    target = copy_fixture("glm5-tiny", tmp_path)

    def poison(tensors: dict[str, np.ndarray]) -> None:
        for e in range(8):
            tensors[f"model.layers.3.mlp.experts.{e}.up_proj.weight"][0, 0] = np.nan

    rewrite_tensors(target, poison)
    m = load_model(target, threads=1)
    with pytest.raises(CheckpointError, match="non-finite"):
        m.forward([3, 14, 15])


def test_an_unsupported_config_is_refused(tmp_path: Path) -> None:
    target = copy_fixture("glm5-tiny", tmp_path)
    config = json.loads((target / "config.json").read_text())
    config["hidden_size"] = "big"
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError):
        load_model(target, threads=1)


@pytest.mark.parametrize(("fixture", "model_type"),
                         [("olmoe-tiny", "olmoe"), ("qwen3moe-tiny", "qwen3_moe")])
def test_a_standard_attention_family_is_refused_on_cuda_by_name(
    fixture: str, model_type: str
) -> None:
    """OLMoE and Qwen3-MoE run on the CPU kernels; their placement on a CUDA device is not
    verified, so ``--device cuda`` says so (before touching any device) instead of running it
    (spec/DEVIATIONS.md, "Model families")."""
    from colibri.accelerated.cuda_model import open_cuda_model

    from colibri.resources import fixture_model_dir

    with pytest.raises(CheckpointError, match=f"{model_type}: --device cuda runs MLA families"):
        open_cuda_model(fixture_model_dir(fixture), 0)


def test_out_of_vocabulary_tokens_are_a_value_error() -> None:
    from colibri.resources import fixture_model_dir

    m = load_model(fixture_model_dir("glm5-tiny"), threads=1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.forward([3, 100000])


def test_kernel_arguments_are_checked_before_c_sees_them() -> None:
    k = Kernels(1)
    w = Weight(np.ones((4, 8), np.float32), 0)
    with pytest.raises(KernelInvalidArgument, match="matmul"):
        k.matmul(np.ones((2, 7), np.float32), w)
    with pytest.raises(KernelInvalidArgument, match="float32"):
        k.matmul(np.ones((2, 8), np.float64), w)  # type: ignore[arg-type]
    with pytest.raises(KernelUnsupportedDtype):
        Weight(np.ones((4, 8), np.float32), 1)
    # A C-level refusal comes back as a code and a named error.
    status = k.lib.col_matmul(k.pool, 0, 1, 8, 8, w.ptr, 9, 4, 0, 4)
    assert status == 3
    from colibri.accelerated.binding import raise_for

    with pytest.raises(KernelUnsupportedDtype, match="unsupported weight dtype"):
        raise_for(k.lib, status, "col_matmul")
    k.close()


def test_the_engine_refuses_a_corrupt_model_with_a_startup_error(tmp_path: Path) -> None:
    target = copy_fixture("glm5-tiny", tmp_path)
    path = target / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    result = subprocess.run(
        [sys.executable, "-m", "colibri", "engine", "--accelerated", "--model", str(target)],
        input=b"", capture_output=True, timeout=120, check=False,
    )
    assert result.returncode == 2
    assert b"cannot start" in result.stderr and b"run past the end" in result.stderr
    assert b"Traceback" not in result.stderr
    assert result.stdout == b""


def test_the_backend_names_make_build_when_the_library_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from colibri.accelerated import native
    from colibri.accelerated.native import LibraryNotBuilt

    monkeypatch.setattr(native, "DEFAULT_OUT", tmp_path)
    monkeypatch.setattr(native, "library_path", lambda out=tmp_path: tmp_path / "x.so")
    native.load_library.cache_clear()
    try:
        with pytest.raises(LibraryNotBuilt, match="make build"):
            native.load_library()
    finally:
        native.load_library.cache_clear()


def test_the_sanitizer_run_loads_the_sanitized_library() -> None:
    """Under `make sanitize-test` the checks above run against the ASan + UBSan build."""
    import os

    from colibri.accelerated.native import library_path

    sanitizing = os.environ.get("COLIBRI_SANITIZE") == "1"
    assert (library_path().parent.name == "sanitize") == sanitizing
