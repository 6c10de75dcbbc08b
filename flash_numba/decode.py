"""One decoding step with a KV cache: :func:`attention_decode` (flash-decoding over a paged cache).

The kernels are :mod:`flash_numba.kernels.flash_decode`; this module checks the arguments on the host,
moves them to the device and hands the results back, as :mod:`flash_numba.api` does for the forward.
Bad metadata never reaches a kernel: every length and every page index a kernel will follow is
checked here first (the lengths and the table are copied to the host for that: B + B * max_pages
int32s a call).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from . import _inputs, _launch_plan, _stream, _switches, device
from .hbm import Counters, HBMCount
from .kernels import flash_decode as _fd

KERNEL = "flash_decode"
SPEC = _fd.SPEC


@dataclass
class DecodeResult:
    """``o``: shaped like q ``(B, Hq, Nq, d)``; ``lse``: ``(B, Hq, Nq)`` float32, natural log (-inf for a row
    that sees no key: a length of 0, or a causal row before the cache; its o is 0); ``hbm``: an
    :class:`~flash_numba.hbm.HBMCount` with ``count_hbm=True`` (its ``terms`` the IO model's split), else None;
    ``kernel``: the kernel that ran; ``num_splits``: the splits of each cache it used."""

    o: object
    lse: object
    hbm: HBMCount | None
    kernel: str
    num_splits: int


@dataclass
class DecodeProblem:
    """A checked decode call: sizes, metadata on the host (for the IO model), and where it runs."""

    B: int
    Hq: int
    Hkv: int
    Nq: int
    d: int
    dtype: np.dtype
    paged: bool
    page_size: int  # P: rows of a page (unpaged: Nmax, the cache's length, one "page" a sequence)
    max_pages: int  # columns of block_table (unpaged: 1)
    num_pages: int  # pages of the cache (unpaged: B)
    seqlens: np.ndarray  # (B,) int32 on the host
    causal: bool
    scale: float
    num_splits: int = 1
    on_device: bool = False
    torch_device: object = None
    stream: object = 0
    lead: tuple = ()
    keys_in_flight: int | None = None  # T of the CUDA-core split kernel (None: its rule; the benchmark sets others)
    path: str = ""  # the split kernel's path, "tc" or "cuda" (prepare sets it; "": kernels.flash_decode.path_of)
    stages: int | None = None  # the tensor-core kernel's pipeline stages (None: its default; the benchmark sets others)
    fused: bool | None = None  # the combine in the split kernel (None: kernels.flash_decode.fuse_combine's default)
    dtype_name: str = ""  # "float16", "bfloat16" or "float32" (dtype is the storage: uint16 for bfloat16)
    host_dtype: object = None  # ml_dtypes.bfloat16 when the NumPy inputs were: outputs are viewed as it

    def __post_init__(self):
        self.dtype_name = self.dtype_name or self.dtype.name

    @property
    def G(self) -> int:
        return self.Hq // self.Hkv

    @property
    def rows(self) -> int:
        """Output rows B * Hq * Nq."""
        return self.B * self.Hq * self.Nq


def _bool(x, name):
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {x!r}")
    return bool(x)


def _dtype_name(a, name) -> str:
    dt = _inputs._name(a)  # "bfloat16" for bfloat16 words (torch.bfloat16, ml_dtypes, as_bfloat16)
    if dt not in SPEC.dtypes:
        raise TypeError(f"{name}: dtype {dt} is not supported; {SPEC.supports(0, dt)}")
    return dt


def _host_ints(a, name: str, shape: tuple) -> np.ndarray:
    """An int32 metadata argument checked (dtype, shape) and copied to the host."""
    if np.dtype(a.dtype) != np.int32:
        raise TypeError(f"{name}: expected dtype int32, got {np.dtype(a.dtype)}")
    if tuple(a.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(a.shape)}")
    if not a.on_device:
        return np.ascontiguousarray(a.arr)
    if a.torch:
        return a.arr.detach().cpu().numpy()
    return a.arr.copy_to_host()


def _num_splits(num_splits, prob, max_len) -> int:
    if num_splits is None:
        path = _fd.path_of(prob)
        row_tiles = -(-prob.G * prob.Nq // _fd.row_tile(prob.G * prob.Nq, path))
        info = device.info()
        return _fd.choose_splits(prob.B, prob.Hkv, row_tiles, max_len, prob.page_size if prob.paged else None,
                                 info.sm_count, _fd.resident_blocks(prob, path, info.shared_mem_per_sm))
    if isinstance(num_splits, (bool, np.bool_)) or not isinstance(num_splits, (int, np.integer)):
        raise TypeError(f"num_splits: expected an integer or None, got {num_splits!r}")
    if not 1 <= int(num_splits) <= _fd.MAX_SPLITS:
        raise ValueError(f"num_splits: {num_splits} is out of range; use 1 to {_fd.MAX_SPLITS} (or None)")
    return int(num_splits)


def _flat(a, name: str, contiguous_required: bool):
    """A 1-D C-contiguous device view of argument ``a`` (copied to the device from the host; a device ``q`` that
    is not contiguous is copied, a device cache must be contiguous and start on 16 bytes)."""
    from numba import cuda

    if not a.on_device:
        return cuda.to_device(np.ascontiguousarray(a.arr).reshape(-1))
    if a.torch:
        t = a.arr
        if not t.is_contiguous():
            if contiguous_required:
                raise ValueError(f"{name}: must be contiguous (a copy of a KV cache per step would cost more "
                                 "than the step); call .contiguous() once")
            t = t.contiguous()
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: data must start on 16 bytes (the kernels read 16-byte vectors)")
        if a.bf16:  # PyTorch's __cuda_array_interface__ refuses bfloat16: its words
            import torch

            return cuda.as_cuda_array(t.view(-1).view(torch.int16)).view(_inputs.BF16_STORAGE)
        return cuda.as_cuda_array(t.view(-1))
    arr = a.arr
    if not arr.is_c_contiguous():
        if contiguous_required:
            raise ValueError(f"{name}: must be C-contiguous; make it contiguous once")
        from ._views import _contiguous_copy

        arr = _contiguous_copy(arr)
    if not device.SIMULATOR and int(arr.device_ctypes_pointer.value or 0) % 16:
        raise ValueError(f"{name}: data must start on 16 bytes (the kernels read 16-byte vectors)")
    return arr.reshape(int(np.prod(arr.shape)))


def _metadata_device(a, host: np.ndarray):
    """The int32 metadata on the device: the caller's array where it is a contiguous device array, else a copy."""
    from numba import cuda

    if a is not None and a.on_device:
        if a.torch:
            t = a.arr.contiguous()
            return cuda.as_cuda_array(t.view(-1))
        if a.arr.is_c_contiguous():
            return a.arr.reshape(int(np.prod(a.arr.shape)))
    return cuda.to_device(np.ascontiguousarray(host, dtype=np.int32).reshape(-1))


_NO_TABLE: dict = {}


def _no_table():
    """The one-element int32 device array an unpaged call passes for the table (never read), one per context."""
    from numba import cuda

    key = 0 if device.SIMULATOR else id(cuda.current_context())
    if key not in _NO_TABLE:
        _NO_TABLE[key] = _launch_plan.persistent(cuda.to_device(np.zeros(1, np.int32)))
    return _NO_TABLE[key]


def prepare(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, stream):
    """Check every argument on the host; return the :class:`DecodeProblem` and the device operands."""
    prob, checked = check(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, stream)
    return prob, operands(prob, checked)


def operands(prob, checked) -> dict:
    """The device operands of a checked call (:func:`check`): q, k, v as flat device views, the lengths and the
    table on the device."""
    args, meta, table = checked
    seqlens = prob.seqlens
    ops = {"q": _flat(args["q"], "q", False), "k": _flat(args["k_cache"], "k_cache", True),
           "v": _flat(args["v_cache"], "v_cache", True)}
    ops["seqlens"] = _metadata_device(meta.get("cache_seqlens"), seqlens)
    ops["table"] = _metadata_device(meta["block_table"], table) if prob.paged else _no_table()
    return ops


def check(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, stream):
    """Check every argument on the host: ``(prob, checked)``, the :class:`DecodeProblem` and what
    :func:`operands` needs to build the device operands."""
    causal = _bool(causal, "causal")
    args = {"q": _inputs._gather(q, "q"), "k_cache": _inputs._gather(k_cache, "k_cache"),
            "v_cache": _inputs._gather(v_cache, "v_cache")}
    meta = {}
    if cache_seqlens is not None:
        meta["cache_seqlens"] = _inputs._gather(cache_seqlens, "cache_seqlens")
    if block_table is not None:
        meta["block_table"] = _inputs._gather(block_table, "block_table")
    places = {n: a.on_device for n, a in args.items()}
    if len(set(places.values())) > 1:
        host = [n for n, on in places.items() if not on]
        dev = [n for n, on in places.items() if on]
        raise TypeError(f"{', '.join(host)} on the host but {', '.join(dev)} on the device: "
                        "give q and the caches as NumPy arrays or all as CUDA arrays")
    _inputs._check_gpus({**args, **meta})
    qs, ks, vs = (args[n].shape for n in ("q", "k_cache", "v_cache"))
    if len(qs) != 4:
        raise ValueError(f"q: expected shape (B, Hq, Nq, d), got {qs}")
    B, Hq, Nq, d = qs
    for name, xs in (("k_cache", ks), ("v_cache", vs)):
        if len(xs) != 4:
            raise ValueError(f"{name}: expected shape (B, Hkv, Nmax, d), or (num_pages, Hkv, page_size, d) with "
                             f"block_table, got {xs}")
    if vs != ks:
        raise ValueError(f"v_cache: shape {vs} differs from k_cache's {ks}")
    n0, Hkv, P, dk = ks
    if dk != d:
        raise ValueError(f"k_cache: head dim {dk} differs from q's {d}")
    if B < 1 or Hq < 1:
        raise ValueError(f"q: a batch or head dim is zero {qs}")
    if not 1 <= Nq <= _fd.MAX_NQ:
        raise ValueError(f"q: Nq = {Nq} new tokens; flash_decode takes 1 to {_fd.MAX_NQ} (use attention_forward "
                         "for a prefill)")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"k_cache: {Hkv} KV heads do not divide q's {Hq} query heads (grouped-query attention "
                         "needs Hq a multiple of Hkv)")
    dts = {n: _dtype_name(a, n) for n, a in args.items()}
    for n in ("k_cache", "v_cache"):
        if dts[n] != dts["q"]:
            raise TypeError(f"{n}: dtype {dts[n]} differs from q's {dts['q']}; give all arrays one dtype")
    SPEC.check_supported(d, dts["q"])
    if n0 < 1 or P < 1:
        raise ValueError(f"k_cache: empty cache {ks}")
    paged = block_table is not None
    if paged:
        bt = meta["block_table"]
        if len(bt.shape) != 2 or bt.shape[0] != B:
            raise ValueError(f"block_table: expected shape (B, max_pages) = ({B}, max_pages), got {tuple(bt.shape)}")
        table = _host_ints(bt, "block_table", tuple(bt.shape))
        max_pages, num_pages, page_size = int(table.shape[1]), n0, P
        if max_pages < 1:
            raise ValueError("block_table: has no columns (max_pages = 0)")
        capacity = max_pages * page_size
    else:
        if n0 != B:
            raise ValueError(f"k_cache: batch {n0} differs from q's {B} (a paged cache needs block_table)")
        table, max_pages, num_pages, page_size, capacity = None, 1, B, P, P
    if P * d >= 2**32 or num_pages * Hkv >= 2**32:
        raise ValueError(f"k_cache: {ks} is too large for the kernels' 32-bit offsets within a page")
    if cache_seqlens is None:
        seqlens = np.full(B, capacity, dtype=np.int32)
    else:
        seqlens = _host_ints(meta["cache_seqlens"], "cache_seqlens", (B,))
        bad = np.flatnonzero((seqlens < 0) | (seqlens > capacity))
        if bad.size:
            i = int(bad[0])
            where = f"the {max_pages} pages of {page_size} rows in block_table" if paged else f"the cache's {P} rows"
            raise ValueError(f"cache_seqlens: cache_seqlens[{i}] = {int(seqlens[i])} is outside 0 .. {capacity} "
                             f"({where})")
    if paged:  # every page a kernel will follow: the first ceil(L_b / P) entries of each row
        used = (seqlens.astype(np.int64) + page_size - 1) // page_size
        cols = np.arange(max_pages)[None, :] < used[:, None]
        bad = np.argwhere(cols & ((table < 0) | (table >= num_pages)))
        if bad.size:
            b, p = (int(x) for x in bad[0])
            raise ValueError(f"block_table: block_table[{b}, {p}] = {int(table[b, p])} is not a page of the cache "
                             f"(0 .. {num_pages - 1})")
    path = _fd.choose_path(d, dts["q"], None if device.SIMULATOR else device.info().compute_capability)
    heads = B * Hkv * -(-(Hq // Hkv) * Nq // _fd.row_tile(Hq // Hkv * Nq, path))  # the split grid's axis y
    if heads > 65535:
        raise ValueError(f"q: B * Hkv * row tiles = {heads} blocks on the grid's axis y, over CUDA's limit of 65,535; "
                         "call with fewer sequences at a time")
    scale = _inputs.check_scale(scale, d, np.float32)
    storage = _inputs.BF16_STORAGE if dts["q"] == "bfloat16" else np.dtype(dts["q"])
    prob = DecodeProblem(B, Hq, Hkv, Nq, d, storage, paged, page_size, max_pages, num_pages, seqlens,
                         causal, scale, on_device=places["q"], torch_device=_inputs.torch_device_of(q),
                         lead=(B, Hq), dtype_name=dts["q"], host_dtype=args["q"].host_dtype, path=path)
    prob.num_splits = _num_splits(num_splits, prob, int(seqlens.max()) if B else 0)
    prob.stream = _stream.for_call(q, stream)  # PyTorch's current stream for tensors (flash_numba._stream)
    return prob, (args, meta, table)


def attention_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, num_splits=None, causal=False,
                     scale=None, count_hbm=False, stream=None) -> DecodeResult:
    """Attention of Nq new tokens per sequence against a KV cache: one decoding step.

    q ``(B, Hq, Nq, d)``, Nq 1 to 16 (speculative decoding).  k_cache, v_cache ``(B, Hkv, Nmax, d)`` with the
    lengths ``cache_seqlens`` (int32, ``(B,)``, each 0 .. Nmax; None: Nmax), or paged, ``(num_pages, Hkv,
    page_size, d)`` with ``block_table`` (int32, ``(B, max_pages)``): row b names the pages of sequence b in
    order (any pages, any order; key j sits in page ``block_table[b, j // page_size]`` at row
    ``j % page_size``; lengths up to ``max_pages * page_size``, which need not be a multiple of the page size).
    Hkv divides Hq: query head h reads KV head ``h // (Hq / Hkv)`` (grouped-query attention), and each KV
    element is read once per call for all the query heads of its group.  The cache holds the new tokens'
    keys already (append them first): ``causal=True`` masks key j for new token i when ``j > L - Nq + i``
    (bottom-right, as FlashAttention's ``flash_attn_with_kvcache``).  A sequence of length 0 gives o = 0 and
    lse = -inf.  ``scale`` defaults to 1/sqrt(d).  float16, bfloat16 (a torch.bfloat16 tensor, an
    ``ml_dtypes.bfloat16`` array or :func:`flash_numba.as_bfloat16` words; o comes back the same) or float32
    storage, d 8 to 128 a multiple of 8.

    ``num_splits``: chunks each (sequence, KV head) cache is split into, one thread block each, merged by
    the last block of each group to finish (one launch; :data:`flash_numba.kernels.flash_decode.FUSE_COMBINE`)
    or by a combine kernel (1: one launch, no partials).  None chooses
    (:func:`flash_numba.kernels.flash_decode.choose_splits`): as many splits as fill one wave of this GPU
    (``flash_numba.device.info().sm_count`` SMs, each running two blocks of the tensor-core kernel at d = 128
    (its shared memory) or four of the CUDA-core kernel; B*Hkv blocks per split, times the row tiles: G * Nq
    rows in tiles of 16, or 8 on CUDA cores) without starting a second, but no split shorter than 256 keys (nor
    two pages) of the longest sequence, at most 128: 4 splits for B*Hkv = 64 at d = 128, float16 on an H200's
    132 SMs (8 on CUDA cores).  The split kernel runs on tensor cores on sm_80+ at float16 and bfloat16 with d a
    multiple of 16, on CUDA cores elsewhere (:func:`flash_numba.kernels.flash_decode.choose_path`).
    ``count_hbm=True
    counts the bytes each launch reads and writes (equal to :mod:`flash_numba.iomodel.flash_decode`, whose
    split by term is ``result.hbm.terms``).
    ``stream``: a Numba stream for Numba or NumPy arrays (PyTorch tensors run on PyTorch's current stream).

    Every argument is checked on the host before a launch (dtypes, shapes, lengths against the cache or the
    pages given, each page index a sequence uses against the cache): bad metadata raises an error naming the
    argument and never becomes an out-of-bounds read.  On PyTorch tensors (with ``cache_seqlens`` a tensor, no
    ``count_hbm``) the first call of a shape records its launches and later calls replay them after the checks
    (:func:`plan_key`, :mod:`flash_numba._launch_plan`): 0.02-0.04 ms of host time a step instead of Numba's
    0.7-1.3 ms on the H200 (benchmarks/results/h200-2026-12-02-decode).  Returns a :class:`DecodeResult`.
    """
    count = _bool(count_hbm, "count_hbm")
    prob, checked = check(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, causal, scale, stream)
    tensors = (q, k_cache, v_cache) + tuple(t for t in (cache_seqlens, block_table) if t is not None)
    key = plan_key(prob, tensors, count)
    plan = _launch_plan.lookup(key)
    if plan:
        o, lse = plan.replay(tensors)
        return DecodeResult(o, lse, None, KERNEL, prob.num_splits)
    ops = operands(prob, checked)
    with _launch_plan.recording(key if plan is None else None, tensors) as recording:
        result = _run(prob, ops, count)
        recording.finish((result.o, result.lse), None)
    return result


def plan_key(prob, tensors, count: bool = False):
    """The launch-plan key of a checked call on PyTorch tensors (None: the call takes the normal path; see
    :mod:`flash_numba._launch_plan`).  A replay skips Numba's launch path (hundreds of microseconds of host time
    a call), not the checks: every call's lengths and table are still checked on the host first.  The key holds
    what the launches depend on besides the data: the tensors' shapes, strides, dtypes and devices (the lengths
    and the table among them: without ``cache_seqlens`` the call copies its lengths to the device, which no plan
    can replay), the splits, path, pipeline stages and fusion chosen, causal, scale, the stream and the switches;
    the lengths' values are read by the kernels on the device, so they may change between replays."""
    if count or not _launch_plan.ENABLED:
        return None
    return _launch_plan.key("decode", KERNEL, tensors, (
        prob.num_splits, prob.path, prob.stages, prob.fused, prob.keys_in_flight, prob.causal, float(prob.scale),
        prob.paged, _stream.handle(prob.stream), *_switches.values(), os.environ.get("FLASH_NUMBA_DECODE_PATH")))


def _run(prob, ops, count: bool) -> DecodeResult:
    """The launches of a checked call on its stream (the normal path)."""
    counters = Counters(count)
    from .api import _one_launch_at_a_time

    with _stream.using(prob.stream):  # every launch, buffer and copy of the call on its stream
        with _one_launch_at_a_time(), _inputs.allocate_like(prob):
            o, lse = SPEC.run(prob, ops, counters)
        hbm = counters.result()
        if hbm is not None:
            hbm = dataclasses.replace(hbm, terms=SPEC.io_model(prob).terms)
        return DecodeResult(_inputs.finish(prob, o, (prob.Nq, prob.d)), _inputs.finish(prob, lse, (prob.Nq,)), hbm,
                            KERNEL, prob.num_splits)
