"""What an engine process imports before it serves: only what serving needs.

The suite starts hundreds of engines and a server restarts them, so start-up cost is paid
often. Three imports were measured at ~20-40 ms each and are needed only on paths few
processes take: llguidance (a request with a grammar), importlib.metadata (which llguidance
loads; the version is read from ``colibri.__version__``) and importlib.resources (package
data is found through ``importlib.util``)."""

from __future__ import annotations

import os
import subprocess
import sys

from colibri import resources

LAZY = ("llguidance", "importlib.metadata", "importlib.resources")

# Runs the real entry point on a real model with stdin at EOF (the engine loads, says READY,
# drains and exits), then reports which of LAZY it imported (not those the interpreter's site
# start-up had already loaded, which a .pth file of some other package may do).
PROBE = f"""
import sys
before = set(sys.modules)
sys.argv = ["colibri", "engine", "--model", sys.argv[1]]
from colibri.cli import main
try:
    main()
except SystemExit:
    pass
print("LOADED", [m for m in {LAZY!r} if m in sys.modules and m not in before], file=sys.stderr)
"""


def test_an_engine_start_imports_none_of_the_lazy_modules() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLI_", "KV", "SERVE"))}
    model = resources.fixture_model_dir("glm5-chat-tiny")  # a tokenizer: the text path loads
    done = subprocess.run([sys.executable, "-c", PROBE, str(model)], stdin=subprocess.DEVNULL,
                          capture_output=True, env=env, timeout=60, check=False)
    report = [line for line in done.stderr.decode().splitlines() if line.startswith("LOADED")]
    assert b"READY" in done.stdout, done.stderr.decode()[-2000:]
    assert report == ["LOADED []"], done.stderr.decode()[-2000:]


def test_a_grammar_still_compiles_after_the_lazy_import() -> None:
    """The deferred import is the one the matcher uses: a grammar compiles and validates."""
    from colibri.text.grammar import check

    assert check('{"type": "integer"}')
