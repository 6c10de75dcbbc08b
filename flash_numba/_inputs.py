"""Checking and normalising the arrays given to the public functions.

Conventions (the same for every public function):

* Shapes ``(N, d)``, ``(H, N, d)`` or ``(B, H, N, d)``; q, k and v have the same
  rank and leading dimensions, the same head dim ``d`` (1..128), and k and v the
  same length ``Nk``, which may differ from q's ``Nq``.
* Storage dtypes float16, float32 or float64, the same for all arrays; kernels
  accumulate in float32 (float64 for float64 storage).  The log-sum-exp ``lse``
  is float32 (float64 for float64 storage), shape ``lead + (Nq,)``.
* Host (NumPy) arrays are copied to the device and results come back as NumPy.
  Device arrays (Numba device arrays, or anything with
  ``__cuda_array_interface__``: PyTorch, CuPy) are used in place, zero-copy, and
  results stay on the device as Numba device arrays.  Mixing the two is refused,
  and so is a device array on another GPU than the current CUDA device.
* Non-contiguous host arrays (views, negative strides) are copied to contiguous
  form; non-contiguous device arrays are refused (``.contiguous()`` them).
* NaN or Inf in the inputs is not searched for (that would cost a pass over the
  data): it propagates to the outputs as in PyTorch.

Every problem raises ``TypeError`` (wrong kind of object or dtype) or
``ValueError`` (wrong shape or value) whose message names the argument.
"""

from __future__ import annotations

import contextlib as _contextlib
import contextvars as _contextvars
import math
import os as _os
from dataclasses import dataclass

import numpy as np

from .device import SIMULATOR

MAX_HEAD_DIM = 128
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_DTYPE_NAMES = "float16, float32 or float64"


def acc_dtype(dtype) -> np.dtype:
    """The accumulation dtype for a storage dtype (also the dtype of ``lse``)."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _is_device_array(x) -> bool:
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return isinstance(x, FakeCUDAArray)
    return hasattr(x, "__cuda_array_interface__")


def _as_array(x, name: str):
    """Return (array, on_device) for a host or device array, or raise TypeError."""
    if _is_device_array(x):
        if SIMULATOR:
            return x, True
        from numba import cuda

        if torch_device_of(x) is not None:
            x = x.detach()  # a tensor that requires grad refuses __cuda_array_interface__
        arr = cuda.as_cuda_array(x)
        return arr, True
    if isinstance(x, np.ndarray):
        return x, False
    if hasattr(x, "__cuda_array_interface__") and SIMULATOR:
        raise TypeError(f"{name}: a GPU array was given but flash_numba runs in the CUDA simulator")
    if hasattr(x, "__array__") and not isinstance(x, (str, bytes)):
        try:
            return np.asarray(x), False
        except Exception:  # pragma: no cover - exotic objects
            pass
    raise TypeError(
        f"{name}: expected a NumPy array or a CUDA array (Numba, PyTorch, CuPy), got {type(x).__name__}"
    )


def _device_ordinal(arr) -> int | None:
    """The GPU holding a device array's memory; None where the driver cannot say (or in the simulator)."""
    if SIMULATOR:
        return None
    try:
        from numba.cuda.cudadrv import driver as drv

        ptr = int(arr.device_ctypes_pointer.value or 0)
        if ptr == 0:
            return None
        attr = drv.binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return int(drv.driver.cuPointerGetAttribute(attr, drv.binding.CUdeviceptr(ptr)))
    except Exception:  # memory the driver cannot place: leave it to the launch
        return None


def _current_device() -> int:
    """The ordinal of the GPU the kernels launch on (Numba's current device)."""
    from numba import cuda

    return cuda.get_current_device().id


def _check_dtype(arr, name: str) -> np.dtype:
    dt = np.dtype(arr.dtype)
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: dtype {dt} is not supported; use {_DTYPE_NAMES}")
    return dt


def _is_c_contiguous(arr) -> bool:
    if isinstance(arr, np.ndarray):
        return arr.flags.c_contiguous
    fn = getattr(arr, "is_c_contiguous", None)
    return bool(fn()) if fn is not None else True


@dataclass
class Operand:
    """One array, reshaped to ``(BH, N, d)`` (or ``(BH, N)`` for lse) on the device."""

    dev: object  # device array, contiguous
    on_device: bool  # True if the caller gave a device array


@dataclass
class Problem:
    """The validated shape of an attention call."""

    lead: tuple  # leading dims of q: (), (H,) or (B, H)
    BH: int
    Nq: int
    Nk: int
    d: int
    dtype: np.dtype
    on_device: bool
    scale: float
    causal: bool
    torch_device: object = None  # set when the inputs are CUDA PyTorch tensors

    @property
    def acc(self) -> np.dtype:
        return acc_dtype(self.dtype)


def check_scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale: expected a real number or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale: must be finite, got {scale}")
    return scale


def _to_device(arr, on_device: bool, shape3, name: str):
    """Contiguous device array of shape ``shape3`` (a zero-copy view when possible)."""
    from numba import cuda

    if on_device:
        if not _is_c_contiguous(arr):
            raise ValueError(f"{name}: device array is not C-contiguous; make it contiguous first")
        return arr.reshape(shape3)
    host = np.ascontiguousarray(arr).reshape(shape3)
    return cuda.to_device(host)


def prepare(named: dict, *, causal: bool, scale, extra: dict | None = None) -> tuple[Problem, dict]:
    """Validate q, k, v (and, for the backward, o, lse, do) and move them to the device.

    ``named`` maps argument names to arrays and must start with q, k, v.
    ``extra`` may hold ``o``, ``do`` (same shape and dtype as q) and ``lse``
    (shape ``lead + (Nq,)``, float32 / float64).
    Returns the :class:`Problem` and a dict of name -> :class:`Operand`.
    """
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal: expected True or False, got {causal!r}")
    arrays = {}
    for name, x in list(named.items()) + list((extra or {}).items()):
        arrays[name] = _as_array(x, name)
    # Plain tuples: the simulator's device arrays refuse negative indices into .shape.
    shapes = {n: tuple(int(s) for s in arr.shape) for n, (arr, _) in arrays.items()}
    qs, ks, vs = shapes["q"], shapes["k"], shapes["v"]
    places = {n: on for n, (_, on) in arrays.items()}
    if len(set(places.values())) > 1:
        host = [n for n, on in places.items() if not on]
        dev = [n for n, on in places.items() if on]
        raise TypeError(
            f"{', '.join(host)} on the host but {', '.join(dev)} on the device: "
            "give all arrays as NumPy arrays or all as CUDA arrays"
        )
    on_device = places["q"]
    for name, (arr, on) in arrays.items():  # device arrays: all on the GPU the kernels launch on
        gpu = _device_ordinal(arr) if on else None
        if gpu is not None and gpu != (here := _current_device()):
            raise ValueError(
                f"{name}: on GPU {gpu} but flash_numba runs on GPU {here} (Numba's current device); "
                f"move every array to GPU {here}, or call numba.cuda.select_device({gpu}) first"
            )

    if len(qs) not in (2, 3, 4):
        raise ValueError(f"q: expected shape (N, d), (H, N, d) or (B, H, N, d), got {qs}")
    for name, xs in (("k", ks), ("v", vs)):
        if len(xs) != len(qs):
            raise ValueError(f"{name}: has {len(xs)} dimensions but q has {len(qs)} ({xs} vs {qs})")
    lead = qs[:-2]
    for name, xs in (("k", ks), ("v", vs)):
        if xs[:-2] != lead:
            raise ValueError(f"{name}: leading (batch, head) dims {xs[:-2]} differ from q's {lead}")
    Nq, d = qs[-2:]
    Nk = ks[-2]
    if ks[-1] != d:
        raise ValueError(f"k: head dim {ks[-1]} differs from q's {d}")
    if vs[-1] != d:
        raise ValueError(f"v: head dim {vs[-1]} differs from q's {d} (flash_numba needs equal head dims)")
    if vs[-2] != Nk:
        raise ValueError(f"v: sequence length {vs[-2]} differs from k's {Nk}")
    if d < 1 or d > MAX_HEAD_DIM:
        raise ValueError(f"q: head dim d = {d} is not supported; use 1 <= d <= {MAX_HEAD_DIM}")
    if Nq == 0:
        raise ValueError("q: empty sequence (Nq = 0); need at least one query row")
    if Nk == 0:
        raise ValueError("k: empty sequence (Nk = 0); need at least one key")
    if any(int(s) == 0 for s in lead):
        raise ValueError(f"q: a batch or head dim is zero {qs}")
    dtype = _check_dtype(arrays["q"][0], "q")
    for name in arrays:
        if name == "lse":
            continue
        dt = _check_dtype(arrays[name][0], name)
        if dt != dtype:
            raise TypeError(f"{name}: dtype {dt} differs from q's {dtype}; give all arrays one dtype")
    for name in ("o", "do"):
        if name in shapes and shapes[name] != qs:
            raise ValueError(f"{name}: shape {shapes[name]} differs from q's {qs}")
    if "lse" in arrays:
        lse = arrays["lse"][0]
        want = lead + (Nq,)
        if shapes["lse"] != want:
            raise ValueError(f"lse: expected shape {want} (q's leading dims and Nq), got {shapes['lse']}")
        if np.dtype(lse.dtype) != acc_dtype(dtype):
            want_dt, got_dt = acc_dtype(dtype), np.dtype(lse.dtype)
            raise TypeError(f"lse: expected dtype {want_dt} for {dtype} inputs, got {got_dt}")

    BH = int(np.prod(lead)) if lead else 1
    scale = check_scale(scale, d)
    prob = Problem(lead, BH, Nq, Nk, d, dtype, on_device, scale, bool(causal), torch_device_of(named["q"]))
    ops = {}
    for name, (arr, on) in arrays.items():
        if name == "lse":
            shape3 = (BH, Nq)
        else:
            shape3 = (BH, Nk if name in ("k", "v") else Nq, d)
        ops[name] = Operand(_to_device(arr, on, shape3, name), on)
    return prob, ops


def finish(prob: Problem, dev, shape_tail):
    """Reshape a device result to the caller's leading dims; copy to host if the inputs were."""
    shape = prob.lead + tuple(shape_tail)
    if prob.torch_device is not None:
        import torch

        return torch.as_tensor(dev.reshape(shape), device=prob.torch_device)
    if prob.on_device:
        return dev.reshape(shape)
    return dev.copy_to_host().reshape(shape)


#: Tests set this (or FLASH_NUMBA_POISON=1 in the environment) so that every
#: output buffer starts filled with NaN: an element a kernel forgets to write
#: then fails the comparison instead of passing by luck on zeros.
POISON_OUTPUTS = _os.environ.get("FLASH_NUMBA_POISON", "") == "1"

# While a call whose inputs are PyTorch tensors runs, buffers come from PyTorch's
# caching allocator (a plain Numba allocation is a cudaMalloc + cudaFree per call,
# which synchronises the device and cost ~0.8 ms per forward at N = 4096 on an H200)
# and results go back as PyTorch tensors.
_TORCH_DEVICE = _contextvars.ContextVar("flash_numba_torch_device", default=None)


def torch_device_of(x):
    """The torch.device of a CUDA PyTorch tensor, else None (without importing torch)."""
    if type(x).__module__.split(".")[0] != "torch" or not getattr(x, "is_cuda", False):
        return None
    return x.device


@_contextlib.contextmanager
def allocate_like(prob: "Problem"):
    """Route :func:`empty`, :func:`zeros`, :func:`full` to PyTorch for a call on torch tensors."""
    token = _TORCH_DEVICE.set(prob.torch_device)
    try:
        yield
    finally:
        _TORCH_DEVICE.reset(token)


def _torch_buffer(shape, dtype, value):
    import torch
    from numba import cuda

    tdt = getattr(torch, np.dtype(dtype).name)
    dev = _TORCH_DEVICE.get()
    t = torch.empty(shape, dtype=tdt, device=dev) if value is None else torch.full(shape, value, dtype=tdt, device=dev)
    return cuda.as_cuda_array(t, sync=False)  # keeps t alive as its owner; nothing to wait for


def empty(shape, dtype):
    """An output buffer on the device (NaN-filled when :data:`POISON_OUTPUTS`)."""
    from numba import cuda

    if _TORCH_DEVICE.get() is not None:
        return _torch_buffer(shape, dtype, float("nan") if POISON_OUTPUTS else None)
    if POISON_OUTPUTS:
        return cuda.to_device(np.full(shape, np.nan, dtype=dtype))
    return cuda.device_array(shape, dtype=dtype)


def zeros(shape, dtype):
    """A zero-filled device buffer, for accumulators the algorithm starts at 0."""
    return full(shape, 0, dtype)


def full(shape, value, dtype):
    """A device buffer filled with ``value`` (e.g. -inf for a running max)."""
    from numba import cuda

    if _TORCH_DEVICE.get() is not None:
        return _torch_buffer(shape, dtype, value)
    return cuda.to_device(np.full(shape, value, dtype=dtype))
