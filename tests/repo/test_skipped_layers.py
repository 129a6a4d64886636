"""No silent layers: a test layer that cannot run is a CI failure, and a listed skip elsewhere.

``tools/layer_skip.sh`` is the one way the Makefile and ``.ci/run`` skip a layer; these tests
hold its two behaviours and that no recipe skips a layer around it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "layer_skip.sh"


def run(*args: str, ci: bool, ledger: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["COLIBRI_SKIP_LEDGER"] = str(ledger)
    if ci:
        env["CI"] = "true"
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          check=False)


def test_under_ci_a_missing_tool_fails_naming_what_to_install(tmp_path: Path) -> None:
    ledger = tmp_path / "skipped.txt"
    done = run("web dashboard tests", "npm not found", "Node 20 with npm", ci=True,
               ledger=ledger)
    assert done.returncode == 1
    assert "web dashboard tests cannot run: npm not found -- install Node 20 with npm" in (
        done.stderr)
    assert not ledger.exists()


def test_elsewhere_a_skip_is_recorded_and_summarised_once(tmp_path: Path) -> None:
    ledger = tmp_path / "skipped.txt"
    assert run("--reset", ci=False, ledger=ledger).returncode == 0
    assert "every layer ran" in run("--summary", ci=False, ledger=ledger).stdout
    done = run("browser e2e tests", "chromium not found", "chromium", ci=False, ledger=ledger)
    assert done.returncode == 0 and "SKIPPED" in done.stdout
    summary = run("--summary", ci=False, ledger=ledger).stdout
    assert "browser e2e tests: chromium not found (install chromium)" in summary
    assert run("--reset", ci=False, ledger=ledger).returncode == 0 and not ledger.exists()
    assert run("only-two", "args", ci=False, ledger=ledger).returncode == 2


def test_every_skip_in_the_makefile_and_ci_goes_through_the_script() -> None:
    for path in (ROOT / "Makefile", ROOT / ".ci" / "run"):
        text = path.read_text()
        # A hand-written "SKIPPED" banner is a skip CI=true would not turn into a failure.
        assert not re.search(r"echo [^\n]*SKIPPED", text), path
    makefile = (ROOT / "Makefile").read_text()
    for layer in ("web dashboard build", "web dashboard tests", "browser e2e tests",
                  "compiled control plane tests", "accelerated engine tests"):
        assert f'tools/layer_skip.sh "{layer}"' in makefile, layer
    assert 'tools/layer_skip.sh "make oracle-check"' in (ROOT / ".ci" / "run").read_text()
    # The one skip that is not its recipe's last command must end the recipe itself.
    assert '"accelerated engine tests" "no C compiler" "a C compiler (gcc)" || exit 1' in makefile
    assert re.search(r"^test: skip-ledger .*\n\t@tools/layer_skip.sh --summary", makefile,
                     re.MULTILINE)
