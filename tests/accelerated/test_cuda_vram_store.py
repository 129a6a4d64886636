"""``--device cuda``'s VRAM tier wired to the expert store, through the real engine loop: the
accelerated backend with its placement on the CPU stand-in device (support/cuda_standin.py)
and CUDA_EXPERT_GB. The store places experts on the "device" within the budget the backend
resolved (its free memory less the reserve), TIERS and EMAP report them in tier 2, GPUS counts
them, and the tokens are the CPU engine's (the stand-in computes with the CPU kernels, so any
misrouted expert would change them). Nothing here runs a CUDA kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from colibri.accelerated.backend import AcceleratedBackend
from colibri.accelerated.cuda_model import CudaKernels, GpuPlacement, place_model
from colibri.accelerated.kernels import Kernels
from colibri.accelerated.model import open_model
from colibri.reference.experts import stored_expert_bytes
from support.accelerated_support import needs_library
from support.cuda_standin import CpuStandIn
from support.engine_harness import EngineRun, ids, run_engine, submit

from colibri import resources
from colibri.backend_kit.model_fingerprint import model_fingerprint
from colibri.backend_kit.tiered_expert_store import TieredExpertStore
from colibri.engine.backend import Backend, usage_rows

pytestmark = needs_library

TINY = resources.fixture_model_dir("glm5-tiny")
PROMPT = [3, 14, 159, 26, 53, 58, 200, 11, 77, 240, 5, 99]


def _lines(run: EngineRun, kind: str) -> list[list[str]]:
    return [f.line.decode().split() for f in run.frames if f.kind == kind]


def _dense_bytes() -> int:
    """What glm5-tiny's dense weights take on the stand-in device."""
    stand_in = CpuStandIn(Kernels(2), capacity=None)
    placement = GpuPlacement(stand_in, 0)  # type: ignore[arg-type]
    place_model(open_model(TINY, kernels=CudaKernels(2, placement)), placement)
    return stand_in.used_bytes


def _on_stand_in(capacity: int, budget_bytes: int, devices: list[CpuStandIn]
                 ) -> Callable[[Backend], Backend]:
    """Replace the engine's backend with the accelerated one on a stand-in device."""

    def wrap(cpu_backend: Backend) -> Backend:
        cpu_backend.close()
        stand_in = CpuStandIn(Kernels(2), capacity=capacity)
        devices.append(stand_in)
        placement = GpuPlacement(stand_in, 0)  # type: ignore[arg-type]
        model = open_model(TINY, kernels=CudaKernels(2, placement))
        model.fused_layers = False
        place_model(model, placement)
        read: Any = model.read_expert
        store = TieredExpertStore(read, model.config, usage_rows(model.config), 0,
                                  stored_expert_bytes(model.checkpoint))
        return AcceleratedBackend(model, store, model_fingerprint(TINY), placement,
                                  budget_bytes, 0)

    return wrap


ONE = 3 * 128 * 32 * 4  # one glm5-tiny expert's stored bytes (float32)


def test_auto_budget_fills_the_free_device_memory() -> None:
    script = [submit(1, 0, ids(*PROMPT), 6, ext="ids=1")]
    cpu = run_engine(script, model_dir=TINY, backend_name="accelerated")
    devices: list[CpuStandIn] = []
    # no VRAM budget: the dense weights (and shared/dense MLPs) alone on the "device"
    plain = run_engine(script, model_dir=TINY, backend_name="accelerated",
                       wrap=_on_stand_in(1 << 30, 0, devices))
    assert all(line[1] == "0" for line in _lines(plain, "TIERS"))
    # room for exactly five experts beside the dense weights; CUDA_EXPERT_GB=auto (-1)
    wrap = _on_stand_in(_dense_bytes() + 5 * ONE, -1, devices)
    run = run_engine(script, model_dir=TINY, backend_name="accelerated",
                     env={"CUDA_EXPERT_GB": "auto"}, wrap=wrap)
    assert _lines(run, "TIERS")[0][1] == "5"
    emap = bytes.fromhex(_lines(run, "EMAP")[0][3])
    assert sum(1 for b in emap if b >> 6 == 2) == 5
    gpus = _lines(run, "GPUS")[-1]
    assert gpus[1] == "1" and gpus[4] == "5"  # one device, five experts resident
    tokens = [[f.payload for f in r.for_id(1) if f.kind == "DATA"] for r in (cpu, plain, run)]
    assert tokens[0] == tokens[1] == tokens[2]
    # the placed experts ran on the "device": more device MLP calls than without them
    assert devices[1].calls["expert_mlp"] > devices[0].calls["expert_mlp"]
