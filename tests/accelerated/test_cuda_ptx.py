"""What nvcc made of the kernels' arithmetic, read from their PTX (needs nvcc, no GPU).

The bit-identity claim (spec/DEVIATIONS.md, "CUDA kernels") needs every float operation of a
product rounded as the CPU build beside it rounds: a fused multiply-add exactly where the
lane functions ask for one (``fused`` products), none elsewhere, no flush-to-zero and no
approximate instruction. PTX shows it before ptxas: explicit ``.rn`` operations are never
contracted by ptxas, plain ``add.f32`` / ``mul.f32`` could be, so none may appear. The warp
trees' shuffles are read the same way: ``ccu_warp_tree`` itself is run on the host
(test_cuda_orders.py), and the PTX shows the shuffle instruction its device build maps to.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from colibri.accelerated import cuda_build

pytestmark = pytest.mark.skipif(cuda_build.nvcc() is None, reason="nvcc not found")

ENTRY = re.compile(r"\n(?=\.(?:visible )?entry )")
NAME = re.compile(r"\.(?:visible )?entry (\S+)\(")
PLAIN = re.compile(r"\b(?:add|sub|mul|fma)\.f(?:32|64)\b")
SHUFFLE = re.compile(r"\bshfl\.sync\.(\w+)\.b32\s+[^,]+,\s*[^,]+,\s*([^,]+),\s*([^,]+),\s*([^;]+);")
CONSTANT = re.compile(r"\bmov\.[us]32\s+(%r\d+),\s*(-?\d+);")
#: The CPU builds' trees as shuffle-down offsets: csrc/dot.c's reduce32 (lane j += j + 16,
#: + 8, ...) and coli_quant.h's ((t[l] + t[l+8]) + (t[l+16] + t[l+24]), then 4, 2, 1).
FLOAT_TREE = [16, 8, 4, 2, 1]
QUANT_TREE = [8, 16, 4, 2, 1]


def entries(source: str, tmp: Path) -> dict[str, str]:
    """The PTX of one source's kernels, by mangled name (compiled as the library compiles it)."""
    compiler = cuda_build.nvcc()
    assert compiler is not None
    out = tmp / f"{source}.ptx"
    subprocess.run([compiler, *cuda_build.COMPILE_FLAGS, "-ptx", "-arch=compute_90",
                    f"-I{cuda_build.SOURCE_DIR}", f"-I{cuda_build.CSRC_DIR}",
                    str(cuda_build.SOURCE_DIR / source), "-o", str(out)],
                   check=True, capture_output=True)
    found = {}
    for part in ENTRY.split(out.read_text()):
        m = NAME.match(part)
        if m:
            found[m.group(1)] = part
    return found


@pytest.fixture(scope="module")
def ptx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("ptx")
    merged: dict[str, str] = {}
    for source in ("products.cu", "elementwise.cu", "attention.cu"):
        merged.update(entries(source, tmp))
    return merged


def test_no_contractable_flush_to_zero_or_approximate_float_operation(ptx: dict[str, str]
                                                                       ) -> None:
    assert len(ptx) >= 27
    for name, body in ptx.items():
        assert not PLAIN.findall(body), name
        assert "ftz" not in body and "approx" not in body, name


def test_fused_multiply_adds_exactly_where_the_products_ask_for_them(ptx: dict[str, str]
                                                                     ) -> None:
    products = {n: b for n, b in ptx.items() if "float_product" in n or "quant_product" in n}
    assert len(products) == 6 + 14  # 3 dtypes and 7 formats, fused or not
    for name, body in products.items():
        fused = re.search(r"ILi\d+ELi([01])EE", name)
        assert fused is not None, name
        assert ("fma.rn.f32" in body) == (fused.group(1) == "1"), name
    # Kernels whose CPU counterparts round every step (no FMA in any CPU build).
    for kernel in ("rotate_rows", "rms_norm_rows", "rope_heads", "expert_sum_items",
                   "silu_mul_items"):
        (body,) = [b for n, b in ptx.items() if kernel in n]
        assert "fma.rn.f32" not in body, kernel


def shuffles(body: str) -> list[tuple[str, int | None, int | None, int | None]]:
    """(mode, offset, clamp, mask) of each shuffle in text order; register operands resolved
    through the constants moved into them (nvcc's PTX defines each such register once)."""
    constants: dict[str, int] = {}
    found = []
    for line in body.splitlines():
        if m := CONSTANT.search(line):
            constants[m.group(1)] = int(m.group(2))
        elif m := SHUFFLE.search(line):
            operands = [o.strip() for o in m.groups()[1:]]
            values = [int(o) if re.fullmatch(r"-?\d+", o) else constants.get(o) for o in operands]
            found.append((m.group(1), values[0], values[1], values[2]))
    return found


def test_warp_trees_shuffle_down_in_the_cpu_builds_pairing(ptx: dict[str, str]) -> None:
    """Every tree nvcc emitted is five full-warp shuffle-downs with the CPU tree's offsets, in
    its order: a quantized product's coli_quant.h tree, every other warp dot col_dot_f32's."""
    kernels = 0
    for name, body in ptx.items():
        found = shuffles(body)
        if not found:
            continue
        kernels += 1
        assert all(mode == "down" and clamp == 31 and mask == -1
                   for mode, _, clamp, mask in found), name
        offsets = [offset for _, offset, _, _ in found]
        want = QUANT_TREE if "quant_product" in name else FLOAT_TREE
        assert len(offsets) % len(want) == 0, name
        for tree in range(0, len(offsets), len(want)):
            assert offsets[tree:tree + len(want)] == want, name
    assert kernels == 6 + 14 + 2  # the product instantiations, mla_heads and index_keys
