"""Float products (csrc/dot.c) over many activation rows: a row's outputs are the same bytes
as that row's product alone (sameness kind (c), spec/model.md §15), whichever path a batch
takes: weight tiles met by blocks of 4 or 8 activation rows (and a last block of 1-7), 3 x 4
and 16-lane register tiles, one-pass blocks of 2 or 3 rows, leftover rows and columns, widths
that are not a multiple of 32."""

from __future__ import annotations

import numpy as np
import pytest
from support.accelerated_support import BUILT, NOT_BUILT_REASON

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)


@pytest.mark.parametrize("k", [2048, 160, 96, 100])
@pytest.mark.parametrize("threads", [1, 2])
def test_each_row_of_a_batch_is_its_product_alone(k: int, threads: int) -> None:
    from colibri.accelerated.kernels import Kernels, Weight

    rng = np.random.default_rng(k)
    # 2048-wide rows: 32 to a 256 KiB tile; two threads' pool cuts 301 rows into guided chunks
    # of 37 rows down to 1, so a chunk spans two tiles, one or part of one, and ends on odd
    # rows. At this width 2-3 rows' activations spill from L1, so those take the kernels that
    # prefetch the weights ahead (dot.c X_SPILL_BYTES); 96 and 100 take the others. 160 is
    # one run of the avx2 tile's 128 columns and a part run (dot.c TILE_SEGMENT).
    w = Weight(rng.standard_normal((301, k), dtype=np.float32), 0)
    x = rng.standard_normal((11, k), dtype=np.float32)
    kernels = Kernels(threads)
    try:
        alone = np.concatenate([kernels.matmul(x[r : r + 1], w) for r in range(x.shape[0])])
        for m in (2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 16, 17, 23):
            assert kernels.matmul(x[:m], w).tobytes() == alone[:m].tobytes()
    finally:
        kernels.close()
