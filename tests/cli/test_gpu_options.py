"""`--gpu` and `--vram-gb` on `colibri engine` / `colibri serve`: colibri's mapping onto the
engine's environment, and named errors for malformed values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from colibri.commands.gpu_options import apply_gpu_arguments, gpu_error


@pytest.mark.parametrize(("gpu", "vram", "before", "after"), [
    (None, None, {}, {}),
    (None, "24", {}, {"CUDA_EXPERT_GB": "24"}),
    ("auto", None, {}, {"COLI_CUDA": "1", "CUDA_DENSE": "1"}),
    ("0, 1", "auto", {}, {"COLI_CUDA": "1", "COLI_GPUS": "0,1", "CUDA_DENSE": "1",
                          "CUDA_EXPERT_GB": "auto"}),
    ("1", None, {"CUDA_DENSE": "0"}, {"COLI_CUDA": "1", "COLI_GPUS": "1", "CUDA_DENSE": "0"}),
    ("none", "8", {"CUDA_DENSE": "1", "CUDA_EXPERT_GB": "3"}, {"COLI_CUDA": "0"}),
])
def test_mapping(gpu: str | None, vram: str | None, before: dict[str, str],
                 after: dict[str, str]) -> None:
    env = dict(before)
    apply_gpu_arguments(gpu, vram, env)
    assert env == after


@pytest.mark.parametrize(("gpu", "vram", "message"), [
    ("cuda", None, "--gpu must be auto, none or a list of device ordinals, got 'cuda'"),
    ("0,x", None, "--gpu must be auto, none or a list of device ordinals, got '0,x'"),
    (None, "-2", "--vram-gb must be >= 0, got -2"),
    (None, "big", "--vram-gb must be a number of GB or auto, got 'big'"),
    (None, "nan", "--vram-gb must be >= 0, got nan"),
])
def test_errors(gpu: str | None, vram: str | None, message: str) -> None:
    assert gpu_error(gpu, vram) == message


def test_valid_values_pass() -> None:
    assert gpu_error("auto", "auto") is None
    assert gpu_error("0,1", "12.5") is None
    assert gpu_error("none", "0") is None


def test_engine_refuses_a_malformed_gpu_flag() -> None:
    done = subprocess.run([sys.executable, "-m", "colibri", "engine", "--gpu", "cuda"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 2
    assert "colibri engine: --gpu must be auto, none or a list of device ordinals" in done.stderr


def serve_env(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[int, dict[str, str]]:
    """(`colibri serve ARGV`'s exit status, the environment it would start the engine with)."""
    import argparse

    from colibri.server import runner

    from colibri.commands import serve

    seen: dict[str, str] = {}

    async def fake_serve_forever(config: object, argv: list[str], env: dict[str, str],
                                 port: int) -> int:
        seen.update(env)
        return 0

    monkeypatch.setattr(runner, "serve_forever", fake_serve_forever)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return serve.run(parser.parse_args(argv)), seen


def test_serve_hands_the_mapping_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_EXPERT_GB", "3")
    code, seen = serve_env(monkeypatch, ["--gpu", "0,1", "--vram-gb", "auto"])
    assert code == 0
    assert (seen["COLI_CUDA"], seen["COLI_GPUS"], seen["CUDA_EXPERT_GB"],
            seen["CUDA_DENSE"]) == ("1", "0,1", "auto", "1")
    assert serve_env(monkeypatch, ["--gpu", "x"])[0] == 1


def test_serve_ctx_reaches_the_engine_and_is_checked(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CTX", raising=False)
    code, seen = serve_env(monkeypatch, ["--ctx", "8192"])
    assert code == 0 and seen["CTX"] == "8192"
    assert serve_env(monkeypatch, ["--ctx", "3"])[0] == 1
    assert "--ctx must be at least 8, got 3" in capsys.readouterr().err
