"""The reference mux engine (colibri.engine.mux) over real stdin/stdout, driving the
engine tests' FakeModel instead of a real checkpoint. It lets the conformance suite test the
real protocol implementation in well under a second per start."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine_fakes import FakeCodec, FakeModel  # noqa: E402

from colibri.engine.mux import MuxEngine  # noqa: E402
from colibri.engine.runtime import EngineRuntime  # noqa: E402
from colibri.engine.settings import from_environment  # noqa: E402
from colibri.engine.wire_input import FdSource  # noqa: E402
from colibri.engine.wire_output import FrameWriter  # noqa: E402


def main() -> int:
    env = dict(os.environ)
    settings = from_environment(env, model_dir=Path(env.get("SNAP", "fake-model")))
    model = FakeModel()
    state = env.get("COLI_STATE_DIR")
    persist = env.get("COLI_PERSIST", "1") not in ("0", "false", "off")
    runtime = EngineRuntime(
        model,
        None,
        settings,
        sys.stderr,
        state_dir=Path(state) if state and persist else None,
        codec=FakeCodec(model),
        model_tag=0x1234,
    )
    return MuxEngine(runtime, FdSource(0), FrameWriter(sys.stdout.buffer)).run()


if __name__ == "__main__":
    sys.exit(main())
