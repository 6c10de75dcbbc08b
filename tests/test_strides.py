"""Strided inputs: device arrays whose rows are contiguous are read in place by every kernel.

The two layouts real models hand attention, as (B, H, N, d) views of one device buffer:

* ``transposed``: x of shape (B, N, H, d) seen as (B, H, N, d) (``x.view(B, N, H, d).transpose(1, 2)``);
* ``packed``: one qkv buffer (B, N, 3, H, d), q, k, v its three (B, H, N, d) slices
  (``qkv.view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)``).

Every kernel at every dtype, forward and backward on these views (o and dO strided too), is in the
test matrix (tests/test_kernels.py: test_strided_views, test_grouped_query_with_strided_kv; the
helpers below build the views).  Here: no copy is made of a strided device input (the kernels get
the caller's memory), an input whose last dim is strided is copied, and flash_numba.torch takes
permuted tensor views. Simulator sizes (B*H <= 4, N <= 17, d <= 16).
"""

import numpy as np
import pytest
from numba import cuda

import flash_numba as fn
from flash_numba import _inputs, _views, reference
from flash_numba.device import SIMULATOR

from test_flash2 import err64

BLOCK = (16, 16)  # every kernel takes it; Tr = Tc = 2 at N = 17


def strided_view(dev, shape, strides):
    """A device view of ``shape`` and byte ``strides`` starting at the first element of device array ``dev``."""
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(np.lib.stride_tricks.as_strided(dev._ary, shape, strides))
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return DeviceNDArray(shape, strides, dev.dtype, gpu_data=dev.gpu_data)


def transposed(x):
    """x (B, H, N, d) copied into a (B, N, H, d) device buffer, returned as its (B, H, N, d) view."""
    B, H, N, d = x.shape
    buf = cuda.to_device(np.ascontiguousarray(x.transpose(0, 2, 1, 3)))
    s = x.itemsize
    return strided_view(buf, x.shape, (N * H * d * s, d * s, H * d * s, s))


def packed(*xs):
    """Arrays (B, H, N, d) (the same shape) copied into one (B, N, len(xs), H, d) buffer, returned as its views."""
    B, H, N, d = xs[0].shape
    P, s = len(xs), xs[0].itemsize
    buf = cuda.to_device(np.ascontiguousarray(np.stack([x.transpose(0, 2, 1, 3) for x in xs], axis=2)))
    strides = (N * P * H * d * s, d * s, P * H * d * s, s)
    return [strided_view(buf[:, :, i], xs[0].shape, strides) for i in range(P)]


def address(x):
    """The device address of a device array's first element."""
    return x._ary.__array_interface__["data"][0] if SIMULATOR else x.device_ctypes_pointer.value


def host(x):
    return np.asarray(x.copy_to_host() if hasattr(x, "copy_to_host") else x)


def test_strided_device_input_is_not_copied(monkeypatch, rng):
    """The kernels read the caller's memory: no copy is made (the copy path is never taken), the kernel
    inputs share the caller's buffer, and flash2_fast's flat inputs start at the view's first element."""

    def no_copy(arr):
        raise AssertionError("a strided device input with contiguous rows was copied")

    monkeypatch.setattr(_views, "_contiguous_copy", no_copy)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)) for _ in range(3))
    views = packed(q, k, v)
    prob, ops = _inputs.prepare(dict(zip("qkv", views)), causal=False, scale=None)
    for name, view in zip("qkv", views):
        dev = ops[name].dev
        assert address(dev) == address(view)  # the caller's memory ...
        assert tuple(dev.strides) == tuple(view.strides)  # ... with its strides, (B, H, N, d) already
        flat, layout = _views.flat_input(dev)
        assert address(flat) == address(view)
        assert layout == (2, 5 * 3 * 2 * 8, 8, 3 * 2 * 8)  # (H, stride_B, stride_H, stride_N) in elements
    o = fn.attention(*views, kernel="flash2_fast")
    assert err64(host(o), reference.attention_forward(q, k, v)[0]) < 1e-13


def test_strided_last_dim_is_copied(monkeypatch, rng):
    """An input whose last dim is strided (every other element) is copied to contiguous form, then used."""
    calls = []
    copy = _views._contiguous_copy
    monkeypatch.setattr(_views, "_contiguous_copy", lambda arr: calls.append(1) or copy(arr))
    q, k, v = (rng.standard_normal((3, 17, 8)) for _ in range(3))
    wide = cuda.to_device(np.repeat(q, 2, axis=-1))  # (3, 17, 16): q's columns at 0, 2, 4, ...
    dev_q = wide[:, :, ::2]
    assert dev_q.strides[-1] == 2 * q.itemsize
    o = fn.attention(dev_q, cuda.to_device(k), cuda.to_device(v), kernel="flash2", causal=True)
    assert calls == [1]
    assert err64(host(o), reference.attention_forward(q, k, v, causal=True)[0]) < 1e-13


def test_negative_strides_are_copied(monkeypatch, rng):
    """A device view with a negative stride (the sequence reversed) is copied to contiguous form, then used."""
    calls = []
    copy = _views._contiguous_copy
    monkeypatch.setattr(_views, "_contiguous_copy", lambda arr: calls.append(1) or copy(arr))
    q, k, v = (rng.standard_normal((2, 17, 8)) for _ in range(3))
    dev_q = cuda.to_device(np.ascontiguousarray(q[:, ::-1]))[:, ::-1]  # q's rows, stored last to first
    assert dev_q.strides[1] < 0
    o = fn.attention(dev_q, cuda.to_device(k), cuda.to_device(v), kernel="flash2_fast", causal=True)
    assert calls == [1]
    assert err64(host(o), reference.attention_forward(q, k, v, causal=True)[0]) < 1e-13


def test_flash2_fast_head_span_over_32_bits(monkeypatch, rng):
    """flash2_fast offsets within a head are 32-bit: an input whose head spans too many elements is copied to
    contiguous form (here a packed qkv, row stride 3 H d, under a limit lowered to fit only contiguous rows);
    one that does not fit even then is refused, naming the argument."""
    q, k, v = (rng.standard_normal((1, 2, 17, 8)) for _ in range(3))
    views = packed(q, k, v)
    monkeypatch.setattr(_views, "HEAD_SPAN_LIMIT", 17 * 8 + 1)  # contiguous rows fit, 3 H d-strided ones do not
    calls = []
    copy = _views._contiguous_copy
    monkeypatch.setattr(_views, "_contiguous_copy", lambda arr: calls.append(1) or copy(arr))
    o = fn.attention(*views, kernel="flash2_fast", causal=True)
    assert len(calls) == 3
    assert err64(host(o), reference.attention_forward(q, k, v, causal=True)[0]) < 1e-13
    monkeypatch.setattr(_views, "HEAD_SPAN_LIMIT", 17 * 8)
    with pytest.raises(ValueError, match=r"^q: N \* d = 136 elements in one head, over flash2_fast's limit"):
        fn.attention(*views, kernel="flash2_fast")


@pytest.mark.gpu
def test_one_specialisation_for_every_layout(rng):
    """A contiguous and a strided input reach a kernel as one Numba type: one compiled specialisation."""
    from flash_numba.kernels import flash2

    q = rng.standard_normal((2, 2, 64, 64)).astype(np.float32)
    f = fn.attention_forward(*(cuda.to_device(q) for _ in range(3)), kernel="flash2")
    fn.attention_forward(*packed(q, q, q), kernel="flash2", block=f.block)
    # the factory's arguments as the launcher passes them (an lru_cache key: a default left out is another key)
    assert len(flash2._forward_kernel(64, *f.block, np.dtype(np.float32), False, False, False, False).overloads) == 1
