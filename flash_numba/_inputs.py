"""Checking and normalising the arrays given to the public functions.

Conventions (the same for every public function):

* Shapes ``(N, d)``, ``(H, N, d)`` or ``(B, H, N, d)``; q, k and v have the same
  rank, the same head dim ``d`` (1..128) and the same batch dim B; k and v have one
  shape ``(..., Hkv, Nk, d)``, whose length ``Nk`` may differ from q's ``Nq`` and whose
  head count ``Hkv`` may be any divisor of q's ``Hq`` (grouped-query attention: query
  head h reads key/value head h // G, G = Hq // Hkv; G = Hq is multi-query attention).
* Storage dtypes float16, bfloat16, float32 or float64, the same for all arrays; kernels
  accumulate in float32 (float64 for float64 storage).  The log-sum-exp ``lse``
  is float32 (float64 for float64 storage), shape ``lead + (Nq,)``.
* bfloat16 (kernels that run it, e.g. flash2_tc): a torch.bfloat16 tensor (read through an int16 view:
  PyTorch's ``__cuda_array_interface__`` refuses bfloat16), an ``ml_dtypes.bfloat16`` NumPy array, or
  16-bit words wrapped by :func:`as_bfloat16`.  Inside the package it is stored as ``uint16`` words
  (``Problem.dtype`` uint16, ``Problem.dtype_name`` "bfloat16"); outputs are bfloat16 (torch), uint16
  words (NumPy; ``ml_dtypes.bfloat16`` when the input was one); lse float32.
* Host (NumPy) arrays are copied to the device and results come back as NumPy.
  Device arrays (Numba device arrays, or anything with
  ``__cuda_array_interface__``: PyTorch, CuPy) are used in place, zero-copy, and
  results stay on the device as Numba device arrays.  Mixing the two is refused,
  and so is a device array on another GPU than the current CUDA device.
* Strided inputs: q, k, v, o and dO are read in place where their rows are contiguous
  (:mod:`flash_numba._views` says how and why); outputs (o, lse, dq, dk, dv) are contiguous
  arrays allocated here; a device ``lse`` must be contiguous.
* NaN or Inf in the inputs is not searched for (that would cost a pass over the
  data): it propagates to the outputs as in PyTorch.

Every problem raises ``TypeError`` (wrong kind of object or dtype) or
``ValueError`` (wrong shape or value) whose message names the argument.
"""

from __future__ import annotations

import contextlib as _contextlib
import contextvars as _contextvars
import math
from dataclasses import dataclass

import numpy as np

from . import _launch_plan, _memory, _stream, _switches, _views
from ._memory import DeviceMemoryError  # noqa: F401  (the package exports it from here)
from .device import SIMULATOR

MAX_HEAD_DIM = 128
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_DTYPE_NAMES = "float16, bfloat16, float32 or float64"
#: How a bfloat16 array is stored inside the package: its 16-bit words.
BF16_STORAGE = np.dtype(np.uint16)


class Bfloat16Words(np.ndarray):
    """A NumPy ``uint16`` array that holds bfloat16 words (what :func:`as_bfloat16` returns)."""


def as_bfloat16(x) -> Bfloat16Words:
    """bfloat16 input for NumPy users: ``uint16`` words as they are, or a float array rounded to bfloat16
    (nearest even); an ``ml_dtypes.bfloat16`` array is viewed as its words."""
    from .kernels._bf16 import to_bf16_bits

    a = np.asarray(x)
    if a.dtype.name == "bfloat16" or a.dtype == np.uint16:
        words = a.view(np.uint16)
    elif a.dtype.kind == "f":
        words = to_bf16_bits(a)
    else:
        raise TypeError(f"x: expected uint16 words or a float array to round to bfloat16, got dtype {a.dtype}")
    return words.view(Bfloat16Words)


def acc_dtype(dtype) -> np.dtype:
    """The accumulation dtype for a storage dtype (also the dtype of ``lse``)."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _is_device_array(x) -> bool:
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return isinstance(x, FakeCUDAArray)
    # A CUDA torch tensor is recognised without reading __cuda_array_interface__: hasattr()
    # would build the whole description (microseconds), and raise for a tensor that requires grad.
    return _is_torch_cuda(x) or hasattr(x, "__cuda_array_interface__")


def _is_torch_cuda(x) -> bool:
    """A CUDA torch tensor with ordinary (strided) storage; sparse ones take the generic path."""
    return torch_device_of(x) is not None and str(x.layout) == "torch.strided"


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


def _numba_context():
    """A ``with`` block in which Numba looks its CUDA context up once.

    Every Numba call that needs the context (``cuda.as_cuda_array``, ``cuda.to_device``,
    ``cuda.get_current_device``, each kernel launch) otherwise asks the driver for it
    again, two driver calls each time.  This is the context manager behind Numba's own
    ``require_context`` decorator: it asks once and attaches the answer to the thread
    until the block ends.  Host overhead per call, nothing else changes.
    """
    if SIMULATOR:
        return _contextlib.nullcontext()
    from numba.cuda.cudadrv import devices

    ensure = getattr(getattr(devices, "_runtime", None), "ensure_context", None)
    return ensure() if ensure is not None else _contextlib.nullcontext()  # other Numba versions: just slower


#: NumPy dtypes of the torch dtypes flash_numba supports, by ``str(tensor.dtype)``.
_TORCH_FLOATS = {f"torch.{np.dtype(t).name}": np.dtype(t) for t in SUPPORTED_DTYPES}
_TORCH_FLOATS["torch.bfloat16"] = BF16_STORAGE  # read through an int16 view (_views.tensor_input)


def _torch_dtype(t) -> np.dtype:
    """The NumPy dtype of a CUDA torch tensor, without building its ``__cuda_array_interface__``.

    Any other dtype is read from that interface, as Numba would read it, so that the
    error message about it stays the one Numba's array would give.
    """
    dt = _TORCH_FLOATS.get(str(t.dtype))
    return dt if dt is not None else np.dtype(t.__cuda_array_interface__["typestr"])


def dtype_name_of(x) -> str | None:
    """The dtype name of an argument as given ("float16", "bfloat16", ...), before any check; None if it has none."""
    if isinstance(x, Bfloat16Words):
        return "bfloat16"
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    text = str(dt)
    if text.startswith("torch."):
        return text[len("torch."):]
    try:
        return np.dtype(dt).name  # (ml_dtypes.bfloat16 is "bfloat16")
    except TypeError:
        return None


def _check_dtype(arr, name: str) -> np.dtype:
    dt = np.dtype(arr.dtype)
    if getattr(arr, "bf16", False):
        return BF16_STORAGE
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: dtype {dt} is not supported; use {_DTYPE_NAMES}")
    return dt


@dataclass
class Operand:
    """One array on the device: a 4-D :class:`~flash_numba._views.KernelArray` view (or ``(BH, N)`` for lse)."""

    dev: object  # device array: (B, H, N, d) KernelArray for q, k, v, o, do; contiguous (BH, N) for lse
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
    G: int = 1  # query heads per key/value head (grouped-query attention); BH // G key/value heads
    dropout_p: float = 0.0  # attention dropout's drop rate (0: none); the api sets it and the seed
    dropout_seed: int = 0  # the keep mask's seed (flash_numba.kernels._dropout)
    bf16: bool = False  # the arrays are bfloat16 (stored as uint16 words)
    host_dtype: object = None  # the NumPy dtype host outputs are viewed as (ml_dtypes.bfloat16), or None

    @property
    def dtype_name(self) -> str:
        """"float16", "bfloat16", "float32" or "float64": the storage dtype by name."""
        return "bfloat16" if self.bf16 else self.dtype.name

    @property
    def acc(self) -> np.dtype:
        return acc_dtype(self.dtype)

    @property
    def BHkv(self) -> int:
        """The number of key/value heads, B * Hkv (= BH without grouped-query attention)."""
        return self.BH // self.G

    @property
    def kv_lead(self) -> tuple:
        """The leading dims of k, v (and dk, dv): q's with Hkv = Hq / G heads."""
        return self.lead[:-1] + (self.lead[-1] // self.G,) if self.lead else ()


def check_scale(scale, d: int, dtype=np.float64) -> float:
    """``scale`` as a float, checked in the dtype the kernels use it in.

    The kernels multiply by ``scale`` in the accumulation dtype (float32 for
    float16 and float32 storage), and flash2_fast by ``scale * log2(e)`` (it
    exponentiates with exp2), so both must be finite there: ``scale=1e39`` is
    finite as a Python float but +inf in float32.
    """
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale: expected a real number or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale: must be finite, got {scale}")
    acc = acc_dtype(dtype)
    limit = float(np.finfo(acc).max) / math.log2(math.e)
    if abs(scale) > limit:
        raise ValueError(f"scale: {scale:g} overflows {acc} (the kernels use scale * log2(e) in {acc}; "
                         f"need |scale| <= {limit:.3g})")
    return scale



@dataclass
class _Arg:
    """One argument as :func:`prepare` checks it, before it is reshaped and moved."""

    arr: object  # NumPy array, Numba device array, or CUDA torch tensor (detached)
    on_device: bool
    shape: tuple  # plain ints: the simulator's device arrays refuse negative indices into .shape
    dtype: object
    torch: bool = False  # arr is a CUDA torch tensor, not converted yet
    bf16: bool = False  # bfloat16 words (torch.bfloat16, ml_dtypes.bfloat16 or as_bfloat16)
    host_dtype: object = None  # ml_dtypes.bfloat16 for such an input


def _gather(x, name: str) -> _Arg:
    """Shape, dtype and place of one argument (TypeError if it is not an array)."""
    if not SIMULATOR and _is_torch_cuda(x):
        # A CUDA torch tensor: what prepare checks is read from the tensor itself, and it is
        # converted once, already reshaped, by _tensor_to_device (host overhead per call).
        if x.requires_grad:
            x = x.detach()  # a tensor that requires grad refuses __cuda_array_interface__
        return _Arg(x, True, tuple(x.shape), _torch_dtype(x), torch=True, bf16=str(x.dtype) == "torch.bfloat16")
    arr, on = _as_array(x, name)
    bf16, host_dtype = isinstance(arr, Bfloat16Words), None
    if not on and arr.dtype.name == "bfloat16":  # ml_dtypes.bfloat16: its words
        bf16, host_dtype, arr = True, arr.dtype, arr.view(np.uint16)
    return _Arg(arr, on, tuple(int(s) for s in arr.shape), arr.dtype, bf16=bf16, host_dtype=host_dtype)


def _check_gpus(args: dict) -> None:
    """Refuse a device array that is not on the GPU the kernels launch on.

    Host overhead per call: a torch tensor names its GPU itself (``x.device.index``); other
    device arrays (Numba, CuPy) cost one driver query each; Numba's current device is
    asked once, and only if some array's GPU is known.
    """
    here = None
    for name, a in args.items():
        if not a.on_device:
            continue
        gpu = a.arr.device.index if a.torch else _device_ordinal(a.arr)
        if gpu is None:
            continue
        if here is None:
            here = _current_device()
        if gpu != here:
            raise ValueError(
                f"{name}: on GPU {gpu} but flash_numba runs on GPU {here} (Numba's current device); "
                f"move every array to GPU {here}, or call numba.cuda.select_device({gpu}) first"
            )


def _problem(args: dict, causal: bool, scale, torch_device) -> Problem:
    """Check the shapes and dtypes of the gathered arguments; return the :class:`Problem`."""
    shapes = {n: a.shape for n, a in args.items()}
    qs, ks, vs = shapes["q"], shapes["k"], shapes["v"]
    if len(qs) not in (2, 3, 4):
        raise ValueError(f"q: expected shape (N, d), (H, N, d) or (B, H, N, d), got {qs}")
    for name, xs in (("k", ks), ("v", vs)):
        if len(xs) != len(qs):
            raise ValueError(f"{name}: has {len(xs)} dimensions but q has {len(qs)} ({xs} vs {qs})")
    lead = qs[:-2]
    G = _group_size(lead, ks[:-2])
    if vs[:-2] != ks[:-2]:
        raise ValueError(f"v: leading (batch, head) dims {vs[:-2]} differ from k's {ks[:-2]}")
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
    dtype = _check_dtype(args["q"], "q")
    for name in args:
        if name == "lse":
            continue
        dt = _check_dtype(args[name], name)
        if dt != dtype or args[name].bf16 != args["q"].bf16:
            raise TypeError(f"{name}: dtype {_name(args[name])} differs from q's {_name(args['q'])}; "
                            "give all arrays one dtype")
    for name in ("o", "do"):
        if name in shapes and shapes[name] != qs:
            raise ValueError(f"{name}: shape {shapes[name]} differs from q's {qs}")
    if "lse" in args:
        lse = args["lse"]
        want = lead + (Nq,)
        if shapes["lse"] != want:
            raise ValueError(f"lse: expected shape {want} (q's leading dims and Nq), got {shapes['lse']}")
        if np.dtype(lse.dtype) != acc_dtype(dtype):
            want_dt, got_dt = acc_dtype(dtype), np.dtype(lse.dtype)
            raise TypeError(f"lse: expected dtype {want_dt} for {dtype} inputs, got {got_dt}")

    BH = int(np.prod(lead)) if lead else 1
    scale = check_scale(scale, d, dtype)
    on_device = args["q"].on_device
    return Problem(lead, BH, Nq, Nk, d, dtype, on_device, scale, bool(causal), torch_device, G,
                   bf16=args["q"].bf16, host_dtype=args["q"].host_dtype)


def _name(a: _Arg) -> str:
    return "bfloat16" if a.bf16 else np.dtype(a.dtype).name


def _group_size(lead: tuple, kv_lead: tuple) -> int:
    """G = Hq // Hkv for q's leading dims ``lead`` and k's ``kv_lead`` (ValueError naming k otherwise)."""
    if kv_lead == lead:
        return 1
    hq, hkv = (int(lead[-1]), int(kv_lead[-1])) if lead else (0, 0)
    if not lead or kv_lead[:-1] != lead[:-1] or hkv < 1 or hq % hkv:
        raise ValueError(f"k: leading (batch, head) dims {kv_lead} differ from q's {lead}"
                         + ("; only the head count may differ, a divisor of q's (grouped-query attention)"
                            if lead else ""))
    return hq // hkv


def prepare(named: dict, *, causal: bool, scale, extra: dict | None = None) -> tuple[Problem, dict]:
    """Validate q, k, v (and, for the backward, o, lse, do) and move them to the device.

    ``named`` maps argument names to arrays and must start with q, k, v.
    ``extra`` may hold ``o``, ``do`` (same shape and dtype as q) and ``lse``
    (shape ``lead + (Nq,)``, float32 / float64).
    Returns the :class:`Problem` and a dict of name -> :class:`Operand`.

    Shapes, dtypes and GPUs are checked on the arguments as given (torch tensors are
    not converted yet); then q, k, v, o, do become ``(B, H, N, d)`` kernel inputs
    (:func:`flash_numba._views.kernel_input`, in place for device arrays with contiguous rows) and lse
    a contiguous ``(BH, Nq)`` array.
    """
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal: expected True or False, got {causal!r}")
    args = {}
    for name, x in list(named.items()) + list((extra or {}).items()):
        args[name] = _gather(x, name)
    places = {n: a.on_device for n, a in args.items()}
    if len(set(places.values())) > 1:
        host = [n for n, on in places.items() if not on]
        dev = [n for n, on in places.items() if on]
        raise TypeError(
            f"{', '.join(host)} on the host but {', '.join(dev)} on the device: "
            "give all arrays as NumPy arrays or all as CUDA arrays"
        )
    on_device = places["q"]
    with _contextlib.ExitStack() as numba_context:
        # One CUDA-context look-up for the Numba calls below (see _numba_context): for
        # device arrays from here on; for NumPy arrays only once the call is known to be
        # valid, so that a bad call with host arrays touches no GPU.
        if on_device:
            numba_context.enter_context(_numba_context())
        _check_gpus(args)  # device arrays: all on the GPU the kernels launch on
        prob = _problem(args, causal, scale, torch_device_of(named["q"]))
        if not on_device:
            numba_context.enter_context(_numba_context())
        ops = {}
        for name, a in args.items():
            if name != "lse":  # q, k, v, o, do: the caller's layout, read in place where it can be
                dev = _views.tensor_input(a.arr) if a.torch else _views.kernel_input(a.arr, a.on_device)
            elif a.torch:
                dev = _views._tensor_to_device(a.arr, (prob.BH, prob.Nq), name)
            else:
                dev = _views._to_device(a.arr, a.on_device, (prob.BH, prob.Nq), name)
            ops[name] = Operand(dev, a.on_device)
    return prob, ops


def finish(prob: Problem, dev, shape_tail, lead=None):
    """Reshape a device result to the caller's leading dims (``lead``, default q's); copy to host if the inputs were."""
    shape = (prob.lead if lead is None else lead) + tuple(shape_tail)
    if prob.torch_device is not None:
        t = getattr(dev, _TENSOR_ATTR, None)
        if t is not None:  # a buffer from _torch_buffer: hand its tensor back, no conversion
            return t.view(shape)
        import torch

        return torch.as_tensor(dev.reshape(shape), device=prob.torch_device)
    if prob.on_device:
        if tuple(int(s) for s in dev.shape) == shape:
            return dev  # (H, N, d) inputs: already the caller's shape, no new Numba array needed
        return dev.reshape(shape)
    stream = _stream.current()
    out = dev.copy_to_host(stream=stream)
    if stream:
        stream.synchronize()  # a copy to pageable memory may return before it is done
    out = out.reshape(shape)
    if prob.host_dtype is not None and out.dtype == BF16_STORAGE:
        out = out.view(prob.host_dtype)  # bfloat16 words back as the caller's ml_dtypes.bfloat16
    return out



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
    """Route :func:`empty`, :func:`zeros`, :func:`full` to PyTorch for a call on torch tensors.

    The block also looks Numba's CUDA context up once (:func:`_numba_context`) for the
    buffers and kernel launches of the call, instead of once per buffer and per launch.
    """
    token = _TORCH_DEVICE.set(prob.torch_device)
    try:
        with _numba_context():
            yield
    finally:
        _TORCH_DEVICE.reset(token)


#: The attribute by which a buffer from :func:`_torch_buffer` remembers its torch tensor.
_TENSOR_ATTR = "_flash_numba_tensor"


def _torch_buffer(shape, dtype, value):
    import torch
    from numba import cuda

    bf16 = np.dtype(dtype) == BF16_STORAGE  # a bfloat16 tensor, seen by the kernels as its words
    tdt = torch.bfloat16 if bf16 else getattr(torch, np.dtype(dtype).name)
    dev = _TORCH_DEVICE.get()
    t = torch.empty(shape, dtype=tdt, device=dev) if value is None else torch.full(shape, value, dtype=tdt, device=dev)
    _launch_plan.note_buffer(shape, tdt, value, t)  # a call being recorded replays this allocation
    arr = cuda.as_cuda_array(t.view(torch.int16) if bf16 else t, sync=False)  # keeps t alive; nothing to wait for
    if bf16:
        arr = arr.view(BF16_STORAGE)
    # finish() returns t itself (a view in the caller's shape) instead of converting the
    # Numba array back with torch.as_tensor (host overhead per call).
    setattr(arr, _TENSOR_ATTR, t)
    return arr


def _allocate(make, shape, dtype):
    """``make()``, a buffer of this call: :func:`flash_numba._memory.allocate` with the call's PyTorch device."""
    return _memory.allocate(make, shape, dtype, _TORCH_DEVICE.get())


def empty(shape, dtype):
    """An output buffer on the device (NaN-filled when ``_switches.POISON_OUTPUTS``: tests)."""
    from numba import cuda

    if _TORCH_DEVICE.get() is not None:
        fill = float("nan") if _switches.POISON_OUTPUTS else None
        return _allocate(lambda: _torch_buffer(shape, dtype, fill), shape, dtype)
    if _switches.POISON_OUTPUTS:  # (bfloat16 words: a quiet NaN)
        nan = np.uint16(0x7FC0) if np.dtype(dtype) == BF16_STORAGE else np.nan
        return _allocate(lambda: cuda.to_device(np.full(shape, nan, dtype=dtype), stream=_stream.current()),
                         shape, dtype)
    return _allocate(lambda: cuda.device_array(shape, dtype=dtype, stream=_stream.current()), shape, dtype)


def zeros(shape, dtype):
    """A zero-filled device buffer, for accumulators the algorithm starts at 0."""
    return full(shape, 0, dtype)


def full(shape, value, dtype):
    """A device buffer filled with ``value`` (e.g. -inf for a running max)."""
    from numba import cuda

    if _TORCH_DEVICE.get() is not None:
        return _allocate(lambda: _torch_buffer(shape, dtype, value), shape, dtype)
    return _allocate(lambda: cuda.to_device(np.full(shape, value, dtype=dtype), stream=_stream.current()),
                     shape, dtype)
