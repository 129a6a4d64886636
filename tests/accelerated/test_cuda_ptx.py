"""What nvcc made of the kernels' arithmetic, read from their PTX (needs nvcc, no GPU).

The bit-identity claim (spec/DEVIATIONS.md, "CUDA kernels") needs every float operation of a
product rounded as the CPU build beside it rounds: a fused multiply-add exactly where the
lane functions ask for one (``fused`` products), none elsewhere, no flush-to-zero and no
approximate instruction. PTX shows it before ptxas: explicit ``.rn`` operations are never
contracted by ptxas, plain ``add.f32`` / ``mul.f32`` could be, so none may appear.
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
