"""The reference mux engine (colibri.engine.mux) over real stdin/stdout, driving the
engine tests' FakeBackend instead of a real checkpoint. It lets the conformance suite test the
real protocol implementation in well under a second per start."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.engine_fakes import FakeBackend  # noqa: E402

from colibri.engine.main import build_runtime  # noqa: E402
from colibri.engine.mux import MuxEngine  # noqa: E402
from colibri.engine.settings import from_environment  # noqa: E402
from colibri.engine.wire_input import FdSource  # noqa: E402
from colibri.engine.wire_output import FrameWriter  # noqa: E402


def main() -> int:
    env = dict(os.environ)
    if not env.get("COLI_STATE_DIR"):
        # No state directory named: run without persistence rather than use the per-user one.
        env["COLI_PERSIST"] = "0"
    settings = from_environment(env, model_dir=Path(env.get("SNAP", "fake-model")))
    runtime = build_runtime(settings, env, sys.stderr, backend=FakeBackend(), tokenizer=None)
    return MuxEngine(runtime, FdSource(0), FrameWriter(sys.stdout.buffer)).run()


if __name__ == "__main__":
    sys.exit(main())
