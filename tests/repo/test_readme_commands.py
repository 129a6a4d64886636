"""The README's commands run as written (with `.venv/bin` on PATH, as the README says to put it).

Every command line of README.md (fenced ``sh`` blocks and indented code lines) is either run
here, with small arguments where a full run would take minutes, or listed in NOT_RUN with the
reason; a new README command that is neither fails the test. The ``python`` blocks run too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()

#: Commands run here, each with what is appended to keep it small and what stdin it gets.
RUN: dict[str, tuple[str, str]] = {
    'colibri generate --model fixtures/models/glm5-tiny --ids "3 14 159" --max-tokens 20':
        ("", ""),
    "printf 'SUBMIT 1 0 8 8 0 1 0 ids=1\\n3 14 159\\n' | colibri engine --model "
    "fixtures/models/glm5-tiny": ("", ""),
    "colibri chat": ("", ":quit\n"),
    'colibri conformance protocol --engine-cmd "colibri engine" --model '
    "fixtures/models/glm5-tiny": (" --cases 'protocol.handshake.*'", ""),
    'colibri conformance http --server-cmd "colibri serve"': (" --cases 'http.models.*'", ""),
}
#: Commands this test does not run, and why.
NOT_RUN = {
    "make serve": "serves until stopped; `make test` is what runs this test",
    "make test": "runs this very test",
    'colibri conformance protocol --engine-cmd "./colibri 0" --model /path/to/snapshot --jobs 2':
        "a template for another engine's binary and snapshot",
    "colibri conformance http --base-url http://127.0.0.1:8000 --model-id glm-5.2-colibri "
    "--api-key KEY": "needs a server already running with that key (the --server-cmd line "
    "runs the same cases against one it starts)",
    "colibri bench --section accelerated-interleaved --section accelerated-roofline --batch 8":
        "generates about 1 GB of models and times for minutes: a benchmark, not a test",
}


def readme_commands() -> list[str]:
    fenced = re.findall(r"```sh\n(.*?)```", README, re.DOTALL)
    lines = [line for block in fenced for line in block.splitlines()]
    lines += re.findall(r"^    ((?:colibri|make|printf) .*)$", README, re.MULTILINE)
    return [re.sub(r"\s+#.*$", "", line).strip() for line in lines if line.strip()]


def test_every_readme_command_is_run_here_or_says_why_not() -> None:
    commands = readme_commands()
    assert commands
    unknown = [c for c in commands if c not in RUN and c not in NOT_RUN]
    assert unknown == [], "a README command this test neither runs nor excuses"
    stale = [c for c in (*RUN, *NOT_RUN) if c not in commands]
    assert stale == [], "listed here but no longer in the README"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLI_", "SERVE", "KV_", "SNAP"))}
    # As the README says: `colibri` is .venv/bin/colibri, i.e. next to this interpreter.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLI_PERSIST"] = "0"  # the chat line must not write into the user's state
    return env


@pytest.mark.parametrize("command", sorted(RUN))
def test_readme_command_runs_as_written(command: str) -> None:
    extra, stdin = RUN[command]
    done = subprocess.run(command + extra, shell=True, cwd=ROOT, env=_env(), input=stdin,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{command}{extra}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
    if "conformance" in command:  # the small selection still ran cases, and they passed
        assert re.search(r"^total +[1-9]", done.stdout, re.MULTILINE), done.stdout[-2000:]
        assert "result: PASS" in done.stdout


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    assert blocks
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], cwd=ROOT, env=_env(),
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{block}\n{done.stderr[-2000:]}"
