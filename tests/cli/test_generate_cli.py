"""``colibri generate``: greedy ids from the command line."""

from __future__ import annotations

import pytest
from colibri.reference import load_model
from support.reference_support import oracle

from colibri.cli import main
from colibri.resources import fixture_model_dir


@pytest.mark.parametrize("name", ["glm5-tiny", "deepseek3-tiny"])
def test_generate_prints_the_oracle_continuation(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    o = oracle(name)
    new = len(o["full_ids"]) - len(o["prompt_ids"])
    ids = " ".join(str(i) for i in o["prompt_ids"])
    argv = ["generate", "--model", str(fixture_model_dir(name)), "--ids", ids,
            "--max-tokens", str(new), "--ignore-eos"]
    assert main(argv) == 0
    out = capsys.readouterr().out.split("\n")[0]
    assert [int(t) for t in out.split()] == o["full_ids"][len(o["prompt_ids"]):]


def test_generate_max_tokens_bounds_the_output(capsys: pytest.CaptureFixture[str]) -> None:
    o = oracle("glm5-tiny")
    prompt = " ".join(str(i) for i in o["prompt_ids"])
    first = o["full_ids"][len(o["prompt_ids"])]
    model_dir = str(fixture_model_dir("glm5-tiny"))
    assert main(["generate", "--model", model_dir, "--ids", prompt, "--max-tokens", "3"]) == 0
    assert capsys.readouterr().out.split()[0] == str(first)
    assert main(["generate", "--model", model_dir, "--ids", prompt, "--max-tokens", "0"]) == 0
    assert capsys.readouterr().out.strip() == ""


# glm5-tiny's greedy path after the one-token prompt [99] reaches its EOS id (1) at the 4th
# token and then goes on. Found by searching one-token prompts; every top-1/top-2 logit margin
# on these six steps is >= 0.024 and every router top-k gap >= 2e-3, far above the fixtures'
# margin rule (spec/model.md 11), so the path is the same on every CPU.
EOS_PROMPT = "99"
EOS_PATH = [94, 122, 122, 1, 234, 109]


def test_generate_stops_at_eos_unless_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    model_dir = fixture_model_dir("glm5-tiny")
    assert load_model(model_dir).config.eos_token_ids == (1,)
    argv = ["generate", "--model", str(model_dir), "--ids", EOS_PROMPT,
            "--max-tokens", str(len(EOS_PATH))]
    assert main(argv) == 0
    stopped = [int(t) for t in capsys.readouterr().out.split()]
    # The EOS id is printed, then nothing: fewer tokens than --max-tokens allowed.
    assert stopped == EOS_PATH[: EOS_PATH.index(1) + 1]
    assert len(stopped) < len(EOS_PATH)
    assert main([*argv, "--ignore-eos"]) == 0
    assert [int(t) for t in capsys.readouterr().out.split()] == EOS_PATH


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ids", "3 x"], "--ids must be integers"),
        (["--ids", "3 999"], "token id 999 is outside the vocabulary"),
        (["--prompt", "hello"], "--prompt needs a tokenizer"),
        (["--ids", "3", "--max-tokens", "-1"], "--max-tokens must be >= 0"),
    ],
)
def test_generate_bad_input_is_a_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--model", str(fixture_model_dir("glm5-tiny")), *argv]) == 2
    assert message in capsys.readouterr().err


def test_generate_refuses_a_missing_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", "/nonexistent/model", "--ids", "1"]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_generate_accelerated_says_which_control_plane_runs() -> None:
    import subprocess
    import sys

    from support.accelerated_support import BUILT, NOT_BUILT_REASON

    if not BUILT:
        pytest.skip(NOT_BUILT_REASON)
    done = subprocess.run([sys.executable, "-m", "colibri", "generate", "--accelerated",
                           "--model", str(fixture_model_dir("glm5-tiny")), "--ids", "3 14 159",
                           "--max-tokens", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("[CONTROL] ")  # the line `colibri engine` prints
    assert "[CONTROL]" not in done.stdout and len(done.stdout.split()) == 2
