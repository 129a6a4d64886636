"""The ``--device cuda`` placement logic, on the CPU: which products go to the device, how a
layer's experts are split between the device and the CPU and put back in order, and the VRAM
tier's upload/release contract.

The device here is a test double that computes every "device" product with the CPU kernels
(``CpuStandIn``), so the model's logits must be byte-identical to the CPU engine's whatever
is placed where -- any mistake in routing a product, splitting a layer's experts or scattering
their rows back changes them. It also counts its calls, so a test cannot pass by never
reaching the device path. Nothing here says anything about the CUDA kernels themselves
(tests/accelerated/test_cuda_formats.py, test_cuda_orders.py and the GPU tests do).
"""

from __future__ import annotations

from functools import cache

import pytest
from colibri.accelerated.cuda_model import (
    CudaKernels,
    CudaVramTier,
    GpuPlacement,
    place_model,
)
from colibri.accelerated.kernels import Kernels
from colibri.accelerated.model import Model, open_model
from support.accelerated_support import assert_decode_batch_invariant, needs_library
from support.cuda_standin import CpuStandIn

from colibri.resources import fixture_model_dir

pytestmark = needs_library


def _placed(name: str, capacity: int | None = None) -> tuple[Model, GpuPlacement, CpuStandIn]:
    stand_in = CpuStandIn(Kernels(2), capacity)
    placement = GpuPlacement(stand_in, 0)  # type: ignore[arg-type]
    model = open_model(fixture_model_dir(name), kernels=CudaKernels(2, placement))
    model.fused_layers = False
    place_model(model, placement)
    return model, placement, stand_in


@cache
def _cpu_logits(name: str) -> bytes:
    ids = [3, 14, 159, 26, 53, 58, 97, 93, 23, 84]
    return open_model(fixture_model_dir(name), threads=2).forward(ids).tobytes()


IDS = [3, 14, 159, 26, 53, 58, 97, 93, 23, 84]


@pytest.mark.parametrize("name", ["glm5-tiny", "glm5-tiny-int4g64", "glm5-tiny-e8",
                                  "glm5-tiny-mtp"])
def test_dense_on_the_device_and_half_the_experts_in_vram_change_no_byte(name: str) -> None:
    model, placement, stand_in = _placed(name)
    tier = CudaVramTier(placement, model.read_expert)
    for layer in model.sparse_layers:
        for e in range(0, model.config.n_routed_experts, 2):
            assert tier.upload(layer, e)
    assert tier.experts == len(model.sparse_layers) * ((model.config.n_routed_experts + 1) // 2)
    assert model.forward(IDS).tobytes() == _cpu_logits(name)
    # A layer's dense or shared MLP is at most one device call; more means routed experts ran
    # there (found by their mapped address, read separately by the tier and the model).
    layers = len(model.layers) + (model.mtp_layer is not None)
    assert stand_in.calls["matmul"] > 0 and stand_in.calls["expert_mlp"] > layers


def test_released_experts_go_back_to_the_cpu() -> None:
    model, placement, stand_in = _placed("glm5-tiny")
    tier = CudaVramTier(placement, model.read_expert)
    layer = model.sparse_layers[0]
    every = range(model.config.n_routed_experts)
    for e in every:
        assert tier.upload(layer, e)
    held = stand_in.used_bytes
    for e in every:
        tier.release(layer, e)
    assert tier.experts == 0 and stand_in.used_bytes < held
    before = stand_in.calls["expert_mlp"]
    assert model.forward(IDS).tobytes() == _cpu_logits("glm5-tiny")
    dense_mlps = sum(lw.dense is not None or lw.shared is not None for lw in model.layers)
    # Only the dense and shared MLPs still reach the device: one call per such layer.
    assert stand_in.calls["expert_mlp"] - before == dense_mlps


def test_a_full_device_refuses_whole_experts_and_keeps_the_rest_on_the_cpu() -> None:
    model, placement, stand_in = _placed("glm5-tiny")
    one = int(model.read_expert(model.sparse_layers[0], 0).nbytes)
    stand_in.capacity = stand_in.used_bytes + 2 * one + one // 2
    tier = CudaVramTier(placement, model.read_expert)
    layer = model.sparse_layers[0]
    assert tier.upload(layer, 0) and tier.upload(layer, 1)
    used = stand_in.used_bytes
    assert not tier.upload(layer, 2)  # half an expert left: nothing of it stays uploaded
    assert stand_in.used_bytes == used and tier.experts == 2
    assert model.forward(IDS).tobytes() == _cpu_logits("glm5-tiny")


def test_the_tier_budget_refuses_before_the_device_does() -> None:
    model, placement, stand_in = _placed("glm5-tiny")
    one = int(model.read_expert(model.sparse_layers[0], 0).nbytes)
    tier = CudaVramTier(placement, model.read_expert, budget_bytes=one)
    layer = model.sparse_layers[0]
    assert tier.upload(layer, 0) and tier.upload(layer, 0)  # again: already held
    assert not tier.upload(layer, 1)
    assert tier.experts == 1 and tier.bytes == one


def test_a_row_is_byte_identical_alone_and_batched_with_experts_split() -> None:
    model, placement, _ = _placed("glm5-tiny")
    tier = CudaVramTier(placement, model.read_expert)
    for layer in model.sparse_layers:
        for e in range(1, model.config.n_routed_experts, 3):
            tier.upload(layer, e)
    prompts = [[3, 14, 159, 26, 53, 58], [7, 8, 9], [200, 11, 77, 240, 5, 99, 1, 2]]
    assert_decode_batch_invariant(model, prompts)
