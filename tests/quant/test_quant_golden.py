"""Golden byte vectors for every format; the same vectors are printed in spec/model.md."""

from __future__ import annotations

import numpy as np
import pytest
from colibri.reference.quant import dequantize, quantize
from colibri.reference.quant.e8_iq3 import decode_blocks
from colibri.reference.quant.hadamard import rotate_rows, sign_bytes

from colibri.resources import spec_path

# (format, weights, params, payload hex, scales, dequantized)
GOLDEN: list[tuple[str, list[float], dict[str, int], str, list[float], list[float]]] = [
    ("int8-row", [0.5, -1.0, 0.25], {}, "408120", [1 / 127], [64 / 127, -1.0, 32 / 127]),
    ("int4-row", [1.75, -0.875, 0.25], {}, "4f89", [0.25], [1.75, -1.0, 0.25]),
    ("int2-row", [4, -4, 2.5, -1, 0], {}, "b702", [4.0], [4.0, -4.0, 4.0, 0.0, 0.0]),
    (
        "int4-grouped",
        [1.75, -0.875, 0.25, 0.0, 7, -7, 3.5, 1] + [0.0] * 8 + [3.5, -1.75],
        {"group_size": 16},
        "7a881f9c888888884f",
        [1.0, 0.5],
        [2.0, -1.0, 0.0, 0.0, 7.0, -7.0, 4.0, 1.0] + [0.0] * 8 + [3.5, -2.0],
    ),
    (
        "int3-g64",
        [3, -4, 1, 0.5, -1.5],
        {},
        "1603" + "00" * 14 + "0d" + "00" * 7,
        [4 / 3],
        [8 / 3, -4.0, 4 / 3, 0.0, -4 / 3],
    ),
    ("fp8-e4m3-b128", [448, -1, 0.001953125], {}, "7eb801", [1.0], [448.0, -1.0, 0.001953125]),
]

# One fmt6 super-block: every index 5 (grid row [62, 12, 4, 4]), sub-block 0 has code 1 and
# only the first sign bit set, the others code 0 and no signs; d = 1.0 (fp16 0x3c00).
E8_BLOCK_HEX = "05" * 64 + "01000010" + "00" * 28 + "003c"
E8_FIRST_GROUP = [-23.25, 4.5, 1.5, 1.5, 23.25, 4.5, 1.5, -1.5]
E8_OTHER_SUB_BLOCK = [7.75, 1.5, 0.5, 0.5, 7.75, 1.5, 0.5, 0.5]

SIGN_BYTES = {
    256: "de658f1678eea03b",
    2048: "a038f927cb70352e",
    4096: "0b178fd2ccf13027",
}


@pytest.mark.parametrize(("fmt", "weights", "params", "payload", "scales", "values"), GOLDEN)
def test_golden_vectors(
    fmt: str,
    weights: list[float],
    params: dict[str, int],
    payload: str,
    scales: list[float],
    values: list[float],
) -> None:
    w = np.array([weights], dtype=np.float32)
    got_payload, got_scales = quantize(fmt, w, **params)
    assert got_payload.tobytes().hex() == payload
    np.testing.assert_array_equal(got_scales, np.array(scales, dtype=np.float32))
    decoded = dequantize(fmt, got_payload, got_scales, w.shape)
    np.testing.assert_array_equal(decoded, np.array([values], dtype=np.float32))


def test_e8_golden_block() -> None:
    block = np.frombuffer(bytes.fromhex(E8_BLOCK_HEX), dtype=np.uint8)
    values = decode_blocks(block)[0]
    assert values[:8].tolist() == E8_FIRST_GROUP
    assert values[8:16].tolist() == [23.25, 4.5, 1.5, 1.5] * 2  # even parity: no 8th sign
    assert values[32:40].tolist() == E8_OTHER_SUB_BLOCK


def test_rotation_sign_stream_golden() -> None:
    for n, hexed in SIGN_BYTES.items():
        assert sign_bytes(n)[:8].hex() == hexed
    # n = 4: sign byte 0x08 flips element 3, so row 3 of the rotated identity is -H[3]/2.
    assert rotate_rows(np.eye(4, dtype=np.float32))[3].tolist() == [-0.5, 0.5, 0.5, -0.5]


def test_spec_prints_the_same_vectors() -> None:
    text = spec_path("model.md").read_text()
    for _, _, _, payload, _, _ in GOLDEN:
        assert f"`{payload}`" in text
    assert E8_BLOCK_HEX[:16] in text and "`003c`" in text
    for hexed in SIGN_BYTES.values():
        assert f"`{hexed}`" in text
