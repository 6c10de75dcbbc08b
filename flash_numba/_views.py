"""The device arrays the kernels read: the caller's memory seen as ``(B, H, N, d)`` views.

Strided inputs.  The kernels read q, k, v (and o, dO in the backward) as 4-D
``(B, H, N, d)`` arrays of Numba layout 'A' (:func:`kernels._common.input_type`):
strides read from the array at run time, so a device array whose last dim is
contiguous (element stride 1) is read in place whatever its other strides, e.g. the
``(B, H, N, d)`` views ``x.view(B, N, H, d).transpose(1, 2)`` and
``qkv.view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)[i]``, as FlashAttention-2 reads them.
A device array whose last dim has another stride, or with a negative stride, is copied (on the device) to
contiguous form first; host arrays are copied to the device anyway, views included.
Why one type: Numba compiles a kernel once per argument *type*, and types a
contiguous array as layout 'C', a strided one as 'A'; handing every launch an 'A'
array (a contiguous one too, see :class:`KernelArray`) keeps one compiled kernel per
configuration, the one the compile tier builds.  flash2_fast, the tuned kernel, reads
the same memory as flat 1-D arrays with their strides (:func:`flat_input`: global
loads and 32-bit offsets within a head).  lse is a contiguous ``(BH, N)`` array
(:func:`_to_device`, :func:`_tensor_to_device`).

:mod:`flash_numba._inputs` checks the arguments first and then calls these.
"""

from __future__ import annotations

import numpy as np

from . import _memory, _stream
from .device import SIMULATOR

if SIMULATOR:
    _DeviceNDArray = object  # KernelArray is not used in the simulator (kernel_input returns a FakeCUDAArray)
else:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray as _DeviceNDArray


def _is_c_contiguous(arr) -> bool:
    if isinstance(arr, np.ndarray):
        return arr.flags.c_contiguous
    fn = getattr(arr, "is_c_contiguous", None)
    return bool(fn()) if fn is not None else True

def _to_device(arr, on_device: bool, shape2, name: str):
    """Contiguous device array of shape ``shape2`` (lse; a zero-copy view when possible)."""
    from numba import cuda

    if on_device:
        if not _is_c_contiguous(arr):
            raise ValueError(f"{name}: device array is not C-contiguous; make it contiguous first")
        if tuple(int(s) for s in arr.shape) == tuple(shape2):
            return arr  # already (BH, N): a Numba reshape would only build another array object
        return arr.reshape(shape2)
    host = np.ascontiguousarray(arr).reshape(shape2)
    return cuda.to_device(host, stream=_stream.current())


def _tensor_to_device(t, shape2, name: str):
    """A CUDA torch tensor (lse) as a contiguous Numba array of shape ``shape2``, zero-copy."""
    from numba import cuda

    if not t.is_contiguous():  # torch's C-contiguity: the same rule as Numba's
        raise ValueError(f"{name}: device array is not C-contiguous; make it contiguous first")
    return cuda.as_cuda_array(t.view(tuple(shape2)))


def _rows_contiguous(shape, strides, itemsize: int) -> bool:
    """True when the last dim's elements are adjacent (stride = item size; any stride when d = 1) and no
    stride is negative (the kernels add strides as unsigned offsets)."""
    return (int(shape[-1]) == 1 or int(strides[-1]) == itemsize) and min(int(s) for s in strides) >= 0


def _strides4(shape, strides) -> tuple:
    """The byte strides of ``shape`` as ``(B, H, N, d)``: 0 for the leading dims a 2-D or 3-D array lacks."""
    return (0,) * (4 - len(shape)) + tuple(int(s) for s in strides)


def _shape4(shape) -> tuple:
    """``shape`` (..., N, d) as ``(B, H, N, d)``, ones for the leading dims a 2-D or 3-D array lacks."""
    return (1,) * (4 - len(shape)) + tuple(int(s) for s in shape)


class KernelArray(_DeviceNDArray):
    """A device array that Numba types as layout 'A' whatever its strides.

    Every input a kernel reads is one of these (:func:`kernel_input`), so that a
    contiguous array and a strided view reach the kernel as the same type, and the
    dispatcher compiles one specialisation: Numba's dispatcher types a device array
    from its ``flags`` (C-contiguous: 'C'), hence ``flags`` here reports neither C- nor
    F-contiguous.  Only kernel launches see these arrays; nothing copies them.
    """

    _FLAGS = {"C_CONTIGUOUS": False, "F_CONTIGUOUS": False}

    @property
    def flags(self):
        return dict(self._FLAGS)

    @property
    def _numba_type_(self):
        from numba import types
        from numba.np import numpy_support

        return types.Array(numpy_support.from_dtype(self.dtype), self.ndim, "A")


def kernel_input(arr, on_device: bool):
    """``arr`` (..., N, d) as the kernels read it: a ``(B, H, N, d)`` :class:`KernelArray` (simulator: a view).

    A device array whose rows are contiguous (last-dim stride = item size) is viewed in
    place, whatever its other strides; one with another last-dim stride is copied to
    contiguous form on the device (:func:`_contiguous_copy`, the only copy); a host array
    is copied to the device (contiguous).
    """
    from numba import cuda

    if not on_device:
        arr = cuda.to_device(np.ascontiguousarray(arr), stream=_stream.current())
    elif not _rows_contiguous(tuple(arr.shape), tuple(arr.strides), arr.dtype.itemsize):
        arr = _contiguous_copy(arr)  # (tuples: the simulator's shapes refuse negative indices)
    shape4, strides4 = _shape4(arr.shape), _strides4(arr.shape, arr.strides)
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(np.lib.stride_tricks.as_strided(arr._ary, shape4, strides4))
    return KernelArray(shape4, strides4, arr.dtype, stream=arr.stream, gpu_data=arr.gpu_data)


def tensor_input(t):
    """A CUDA torch tensor (..., N, d) as a ``(B, H, N, d)`` :class:`KernelArray`, in place when its rows are
    contiguous (any other strides), else copied (``.contiguous()``)."""
    from numba import cuda

    if not _rows_contiguous(t.shape, t.stride(), 1):
        t = t.contiguous()  # a last dim with another stride: the one case that is copied
    while t.dim() < 4:
        t = t.unsqueeze(0)  # (N, d) or (H, N, d) -> (B, H, N, d): a view
    bf16 = str(t.dtype) == "torch.bfloat16"
    if bf16:  # PyTorch's __cuda_array_interface__ refuses bfloat16: its 16-bit words, as uint16
        import torch

        t = t.view(torch.int16)
    arr = cuda.as_cuda_array(t)
    if bf16:
        arr = arr.view(np.uint16)
    arr.__class__ = KernelArray  # typed 'A' (a subclass that only changes typing, no copy)
    return arr


#: flash2_fast indexes within a head with 32-bit offsets: row * stride_N + column must stay below this.
HEAD_SPAN_LIMIT = 2**32


def flat_input(arr, name: str = "q"):
    """``(flat, layout)``: a ``(B, H, N, d)`` kernel input as one 1-D array and its strides, for flash2_fast.

    ``flat`` is the 1-D C-contiguous array of the elements from the input's first to its
    last (those of other tensors in between included: a packed qkv buffer holds q, k and v
    rows in turn) and ``layout`` is ``(H, stride_B, stride_H, stride_N)`` in elements
    (plain ints, a tuple argument of the kernel): element (b, h, n, x) is
    ``flat[b*stride_B + h*stride_H + n*stride_N + x]``.  Numba compiles an index into a
    C-contiguous array to address arithmetic on the array's pointer, which the tuned
    kernel needs (global-memory loads, one add per load of a tile); a layout-'A' array
    is indexed through integer arithmetic on the address (generic loads, more registers).
    Within a head the kernel's offsets are 32-bit: an input whose rows of one head span
    :data:`HEAD_SPAN_LIMIT` elements or more is copied to contiguous form first (ValueError
    named by ``name`` if even that is too long).
    """
    itemsize = arr.dtype.itemsize
    if _head_span(arr) >= HEAD_SPAN_LIMIT:
        if int(arr.shape[2]) * int(arr.shape[3]) >= HEAD_SPAN_LIMIT:  # even a contiguous copy would be: no copy
            raise ValueError(f"{name}: N * d = {int(arr.shape[2]) * int(arr.shape[3])} elements in one head, "
                             f"over flash2_fast's limit of {HEAD_SPAN_LIMIT} (32-bit offsets within a head)")
        arr = kernel_input(_contiguous_copy(arr), True)
    H = int(arr.shape[1])
    sB, sH, sN, _ = (int(s) // itemsize for s in arr.strides)
    extent = 1 + sum((int(n) - 1) * (int(s) // itemsize) for n, s in zip(arr.shape, arr.strides))
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        flat = FakeCUDAArray(np.lib.stride_tricks.as_strided(arr._ary, (extent,), (itemsize,)))
    else:
        flat = _DeviceNDArray((extent,), (itemsize,), arr.dtype, stream=arr.stream, gpu_data=arr.gpu_data)
    return flat, (H, sB, sH, sN)


def _head_span(arr) -> int:
    """Elements from the first to one past the last of a head of a ``(B, H, N, d)`` array: (N - 1) stride_N + d."""
    return (int(arr.shape[2]) - 1) * (int(arr.strides[2]) // arr.dtype.itemsize) + int(arr.shape[3])


def _contiguous_copy(arr):
    """A C-contiguous copy, on the device, of a device array whose last dim is strided."""
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(np.ascontiguousarray(arr._ary))
    from numba import cuda

    shape = tuple(int(s) for s in arr.shape)
    out = _memory.allocate(lambda: cuda.device_array(shape, dtype=arr.dtype, stream=_stream.current()), shape,
                           arr.dtype)
    # Numba's element-wise assignment kernel, on out's stream, strides of both read at run time (not [...]:
    # a device array's __setitem__ takes no Ellipsis)
    out[:] = arr
    return out
