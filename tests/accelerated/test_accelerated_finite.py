"""The loader's content check (csrc/finite.c, ``Kernels.all_finite``): a stored weight is
finite exactly when numpy says every value is, for each stored dtype, at any position, on
the calling thread (small tensors) and on the pool (large ones, cut into chunks)."""

from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.accelerated_support import BUILT, NOT_BUILT_REASON

if not BUILT:
    pytest.skip(NOT_BUILT_REASON, allow_module_level=True)

# Also run against the ASan + UBSan build (`make sanitize-test`): the loader runs this on
# every float weight before a kernel reads it.
pytestmark = pytest.mark.sanitize

from colibri.accelerated.kernels import (  # noqa: E402
    DTYPE_CODES,
    KernelInvalidArgument,
    Kernels,
    KernelUnsupportedDtype,
)

DTYPES = {"F32": np.dtype(np.float32), "BF16": np.dtype(ml_dtypes.bfloat16),
          "F16": np.dtype(np.float16)}
#: Sizes on either side of the pool's threshold (COL_INLINE_WORK, 2^18 values) and of its
#: 2^14-value items, so a bad value can sit in a chunk's last item or a tensor's tail.
SIZES = [1, 31, (1 << 14) + 3, (1 << 18) - 1, (1 << 18) + 5, 3 << 18]


@pytest.fixture(scope="module")
def kernels() -> Iterator[Kernels]:
    k = Kernels(2)
    yield k
    k.close()


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(sorted(DTYPES)), size=st.sampled_from(SIZES),
       bad=st.sampled_from([np.nan, np.inf, -np.inf, None]), where=st.floats(0, 1))
def test_all_finite_agrees_with_numpy(kernels: Kernels, dtype: str, size: int,
                                      bad: float | None, where: float) -> None:
    rng = np.random.default_rng(size)
    # The largest finite values and subnormals are finite; only all-ones exponents are not.
    values = rng.standard_normal(size).astype(DTYPES[dtype])
    info = ml_dtypes.finfo(DTYPES[dtype])
    values[::7] = info.max
    values[3::11] = info.smallest_subnormal
    if bad is not None:
        values[min(size - 1, int(where * size))] = bad
    assert kernels.all_finite(values, DTYPE_CODES[dtype]) == bool(np.isfinite(values).all())


def test_a_bad_value_in_the_last_position_of_a_pooled_tensor_is_found(kernels: Kernels) -> None:
    values = np.zeros((3 << 18) + 7, dtype=np.float32)
    assert kernels.all_finite(values, 0)
    values[-1] = np.inf
    assert not kernels.all_finite(values, 0)
    assert kernels.all_finite(values[:-1], 0)


def test_a_wrong_array_is_refused(kernels: Kernels) -> None:
    with pytest.raises(KernelInvalidArgument, match="all_finite"):
        kernels.all_finite(np.zeros(8, dtype=np.float64), 0)
    with pytest.raises(KernelInvalidArgument, match="all_finite"):
        kernels.all_finite(np.zeros((8, 8), dtype=np.float32)[:, ::2], 0)
    with pytest.raises(KernelUnsupportedDtype, match="col_all_finite"):
        kernels.all_finite(np.zeros(8, dtype=np.float32).view(np.uint16), 7)
