"""flash2_fast's 16-byte K/V loads (flash_numba.kernels._vec): when they run, and that they read what the element
loads read.

The forward reads full K/V tiles 16 bytes a thread where every row of k and v starts on 16 bytes (the usual
contiguous tensor), and element by element otherwise (a view whose rows do not line up, a counted run).  Both
builds must give the same bits: the loads change, the arithmetic does not.  Simulator sizes: block (16, 32),
N = 45 (one full key tile of 32, read with vectors, and a partial one).
"""

import numpy as np
import pytest
from numba import cuda

import flash_numba as fn
from flash_numba import _views, reference
from flash_numba.kernels import _tile_ops, _vec
from conftest import FULL
from flash_numba.kernels import flash2_fast

from test_flash2 import err64
from test_strides import host, strided_view

BLOCK = (16, 32)


def padded(x, extra, offset=0):
    """x (B, H, N, d) copied into a device buffer whose rows hold d + extra elements, starting ``offset``
    elements into it; returned as its (B, H, N, d) view (rows d + extra elements apart)."""
    B, H, N, d = x.shape
    w = d + extra
    buf = np.zeros(offset + B * H * N * w, x.dtype)
    buf[offset:].reshape(B, H, N, w)[..., :d] = x
    dev = cuda.to_device(buf)[offset:]
    s = x.itemsize
    return strided_view(dev, x.shape, (H * N * w * s, N * w * s, w * s, s))


def test_lanes():
    assert [_vec.lanes(t) for t in (np.float16, np.float32, np.float64)] == [8, 4, 2]


def test_vector_columns():
    """(VEC, elements a load, rows at a time, loads a thread): 128 threads cover whole rows of vectors."""
    assert _tile_ops.vector_columns(64, 64, "float32") == (True, 4, 8, 8)  # 16 threads a row, 8 rows at a time
    assert _tile_ops.vector_columns(64, 64, "float64") == (True, 2, 4, 16)
    assert _tile_ops.vector_columns(64, 64, "float16") == (True, 8, 16, 4)
    assert _tile_ops.vector_columns(48, 128, "float32") == (True, 4, 4, 12)  # d = 128's 64 x 48 block
    assert not _tile_ops.vector_columns(64, 96, "float32")[0]  # 24 threads a row do not divide 128
    assert not _tile_ops.vector_columns(64, 18, "float32")[0]  # rows of 18 are not whole vectors
    assert not _tile_ops.vector_columns(16, 16, "float32")[0]  # 32 rows at a time, 16 in the tile
    assert not _tile_ops.vector_columns(64, 64, None)[0]


def test_aligned16(rng):
    """True where every row starts on 16 bytes: the first element does and the strides are whole vectors."""
    x = rng.standard_normal((2, 2, 5, 8)).astype(np.float32)
    assert _vec.aligned16(*_views.flat_input(cuda.to_device(x)))
    assert _vec.aligned16(*_views.flat_input(padded(x, 4)))  # rows 12 elements (48 bytes) apart
    assert not _vec.aligned16(*_views.flat_input(padded(x, 1)))  # rows 9 elements apart
    assert not _vec.aligned16(*_views.flat_input(padded(x, 4, offset=1)))  # rows 48 bytes apart, from byte 4
    assert _vec.aligned16(*_views.flat_input(padded(x, 4, offset=4)))  # ... from byte 16


@pytest.mark.parametrize("dtype, d, causal", [pytest.param(np.float32, 16, False, marks=FULL),  # (causal's)
                                              (np.float32, 16, True), (np.float64, 16, False), (np.float16, 32, False)])
@pytest.mark.slow
def test_vector_and_element_loads_give_the_same_bits(rng, monkeypatch, dtype, d, causal):
    """The same forward on aligned k, v (16-byte loads), on views whose rows are 1 element apart from a vector
    (element loads) and counted (element loads): the same O and L, bit for bit, and close to float64."""
    assert _tile_ops.vector_columns(BLOCK[1], d, np.dtype(dtype).name)[0]  # the full tile is read with vectors
    built = []
    factory = flash2_fast.forward_kernel

    def spy(*args, **kwargs):
        built.append(kwargs["aligned"])
        return factory(*args, **kwargs)

    monkeypatch.setattr(flash2_fast, "forward_kernel", spy)
    q, k, v = (rng.standard_normal((1, 2, 45, d)).astype(dtype) for _ in range(3))
    dev_q = cuda.to_device(q)
    runs = [fn.attention_forward(dev_q, cuda.to_device(k), cuda.to_device(v), kernel="flash2_fast", causal=causal,
                                 block=BLOCK),
            fn.attention_forward(dev_q, padded(k, 1), padded(v, 1), kernel="flash2_fast", causal=causal, block=BLOCK),
            fn.attention_forward(dev_q, cuda.to_device(k), cuda.to_device(v), kernel="flash2_fast", causal=causal,
                                 block=BLOCK, count_hbm=True)]
    assert built == [True, False, False]
    o, lse = host(runs[0].o), host(runs[0].lse)
    for r in runs[1:]:
        assert np.array_equal(host(r.o), o) and np.array_equal(host(r.lse), lse)
    o_ref, _ = reference.attention_forward(q, k, v, causal=causal)
    # 45 keys: a few roundings of the storage dtype on the largest output (the float32 and float64 sums are exact
    # to far better than that; float16 stores O once, half an ulp)
    assert err64(o, o_ref) < 8 * np.finfo(dtype).eps
