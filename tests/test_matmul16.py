"""The 16 x 16 tiled matrix product (lesson 4's teaching kernel) against NumPy and its IO model."""

import numpy as np
import pytest

from flash_numba.iomodel import matmul16 as iomodel
from flash_numba.kernels import matmul16


def _rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-3)


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul_wrapper(rng, trans_a, trans_b):
    BH, M, N, K = 2, 17, 5, 19
    a = rng.standard_normal((BH, K, M) if trans_a else (BH, M, K)).astype(np.float32)
    b = rng.standard_normal((BH, N, K) if trans_b else (BH, K, N)).astype(np.float32)
    want = 0.5 * (a.swapaxes(1, 2) if trans_a else a) @ (b.swapaxes(1, 2) if trans_b else b)
    c, hbm = matmul16.matmul(a, b, trans_a=trans_a, trans_b=trans_b, alpha=0.5, count_hbm=True)
    assert isinstance(c, np.ndarray) and c.shape == (BH, M, N) and c.dtype == np.float32
    assert _rel(c, want) < 4 * np.finfo(np.float32).eps * K  # a length-K float32 dot product
    assert hbm.per_kernel == {"C = alpha*op(A)@op(B)": iomodel.matmul(BH, M, N, K, np.float32)}


def test_matmul_wrapper_2d_device_and_dtypes(rng):
    from numba import cuda

    a = rng.standard_normal((3, 20)).astype(np.float64)
    b = rng.standard_normal((20, 18)).astype(np.float64)
    c = matmul16.matmul(a, b)
    assert c.shape == (3, 18) and _rel(c, a @ b) < 1e-14
    c_dev = matmul16.matmul(cuda.to_device(a), cuda.to_device(b), trans_b=False)
    assert not isinstance(c_dev, np.ndarray) and np.array_equal(c_dev.copy_to_host(), c)
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    c16 = matmul16.matmul(a16, b16)
    assert c16.dtype == np.float16
    want = a16.astype(np.float64) @ b16.astype(np.float64)
    assert np.abs(c16 - want).max() <= 2 * np.abs(want.astype(np.float16) - want).max()


def test_matmul_wrapper_rejects_bad_arguments(rng):
    a = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="inner dimension"):
        matmul16.matmul(a, np.ones((2, 5, 6), np.float32))
    with pytest.raises(ValueError, match="batch"):
        matmul16.matmul(a, np.ones((3, 4, 6), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        matmul16.matmul(a, np.ones((2, 4, 6), np.float64))
    with pytest.raises(TypeError, match="alpha"):
        matmul16.matmul(a, np.ones((2, 4, 6), np.float32), alpha=float("nan"))


def test_io_model_closed_form():
    """(BH=1) C = A B^T with M = N = 32, K = 16: 2 x 2 tiles of C, each stages 16 x 16 of A and of B."""
    e = 4
    kb = iomodel.matmul(1, 32, 32, 16, np.float32)
    assert (kb.bytes_read, kb.bytes_written) == (2 * 32 * 16 * e + 2 * 16 * 32 * e, 32 * 32 * e)
