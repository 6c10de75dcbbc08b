"""flash_decode: one decoding step over a KV cache, split-KV (flash-decoding) with a paged cache.

A decoding step computes attention for a few new query tokens (Nq = 1, or up to 16 for speculative
decoding) of B sequences against their cached keys and values.  With one token the products are
matrix-vector: the cache read is the bound, about one FLOP per byte (G FLOPs per byte with grouped-query
attention, G = Hq / Hkv query heads sharing a KV head).  A prefill kernel puts one block per (sequence,
head) on the GPU (B*H = 32 blocks for 132 SMs in our benchmark) and reads the cache at a few percent of
HBM's rate; this module splits the cache of each (sequence, KV head) into ``num_splits`` chunks, each
its own thread block (:mod:`.kernels`, "split kernel"), and merges the partial results ("combine") with the
online-softmax rescale of lesson 3:

    lse2_s = m_s + log2(l_s),  LSE2 = log2(sum_s 2^lse2_s),  O = sum_s 2^(lse2_s - LSE2) * (O_s / l_s)

in the split kernel itself: the last block of each group to finish, found with an atomic counter, merges the
group's partials (:func:`.combine_tail`, :data:`FUSE_COMBINE`: one launch a call), or in a second launch, the combine
kernel (``_switches.DECODE_FUSED = False``).

* **GQA reads each KV element once per step**: the block of KV head hkv computes every query row that
  reads it (the G query heads x Nq tokens of the group, up to 8 a block).
* **Paged cache** (vLLM, FlashAttention 2.5): ``block_table[b, p]`` names the page holding keys
  ``p*P .. p*P + P - 1`` of sequence b; pages in any order, P need not divide the length.
* **Two split kernels** (:func:`choose_path`).  On sm_80+ at float16 and bfloat16 (d a multiple of 16), the
  tensor-core kernel (:mod:`.tc`): each warp streams its tiles of 16 keys through a cp.async pipeline in shared
  memory (no registers held by loads in flight) and multiplies them with mma.m16n8k16, the group's rows padded to
  an m16 tile: a tensor core wastes 12 of 16 rows at G = 4, and still takes ~29 PTX instructions a key (its
  loop at d = 128: ~460 a 16-key tile, a third of them cp.async addresses) where CUDA cores issued ~108 (Nsight
  Compute).  Elsewhere (float32, d = 8, 24, ..., a T4) the CUDA-core kernel (:mod:`.kernels`): 16-byte
  register loads, fp32 accumulation, ``shfl_xor`` row sums.  float16, bfloat16 (its uint16 words, converted with
  :mod:`flash_numba.kernels._bf16` on CUDA cores: integer code, every cc) and float32.  Measured on the H200
  (d = 128, float16, G = 4, B = 8, calls queued back to back, benchmarks/results/h200-2026-12-02-decode-l2): the
  tensor-core kernel, its copies asking the L2 for 128-byte lines, streams the cache at 4,052-4,112 GB/s at 32k and
  4,201-4,284 at 128k (PyTorch flash 4,274-4,312 and 4,466-4,491); the CUDA-core kernel, capped at 128 registers
  (:data:`.kernels.MAX_REGISTERS`), at 2,356 and 2,389.
* **num_splits** (:func:`choose_splits`): as many splits as fill one wave of resident blocks
  (:func:`resident_blocks` an SM: the tensor-core kernel's by its shared memory, the CUDA-core kernel's
  :data:`RESIDENT_BLOCKS`), each split at least :data:`MIN_KEYS_PER_SPLIT` keys (and two pages).

Counters: "flash_decode (one split)" (num_splits = 1: the split kernel writes o and lse), "flash_decode split-KV
+ combine" (the combine fused), or "flash_decode split-KV" and "flash_decode combine";
:mod:`flash_numba.iomodel.flash_decode` predicts them by term.  Public entry: :func:`flash_numba.attention_decode`.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

from ... import _inputs
from ...compile_check import Compiled, compile_kernel, count_variants
from .. import _smem
from .._common import COUNTER_TYPE
from .._launch import launch
from .._spec import lazy
from .._decode_spec import DecodeSpec
from . import tc
from .kernels import (COMBINE_NAME, FUSED_NAME, LOG2E, MAX_ROWS, MAX_SPLITS, NT, SPLIT_NAME, SPLIT_ONE_NAME,
                      WARPS, combine_kernel, geometry, keys_in_flight, rows_per_block, split_kernel)
from .tc import split_tc_kernel

__all__ = ["SPEC", "run", "choose_splits", "launches", "compile_all", "split_kernel", "split_tc_kernel",
           "combine_kernel", "geometry", "rows_per_block", "keys_in_flight", "DTYPES", "MAX_SPLITS", "MAX_NQ",
           "SPLIT_NAME", "SPLIT_ONE_NAME", "COMBINE_NAME", "FUSED_NAME", "FUSE_COMBINE", "fuse_combine", "fused_of",
           "PATHS", "choose_path", "path_of", "row_tile",
           "resident_blocks"]

DTYPES = ("float16", "bfloat16", "float32")
#: New query tokens a call may hold (speculative decoding's drafts).
MAX_NQ = 16
#: CUDA-core split-kernel blocks an SM runs at once: 4 for the builds of one to four rows (128 threads, capped at
#: :data:`.kernels.MAX_REGISTERS` = 128 registers a thread: four blocks fit 65,536 registers); the eight-row builds
#: (~210 registers) hold 2, so their grids of this many blocks run in 2 waves.
RESIDENT_BLOCKS = 4
#: The split rule's floor: keys a split reads at least (and two pages of a paged cache).
MIN_KEYS_PER_SPLIT = 256
#: With more than one split, the split kernel's last block of each group merges the group's partials
#: (:func:`.kernels.combine_tail`: one launch a call) instead of a combine kernel launched after it.
#: ``_switches.DECODE_FUSED`` overrides it.
#: Measured on the H200 (d = 128, G = 4, B*Hkv = 64, 4 splits, float16; benchmarks/results/h200-2026-12-02-decode):
#: the unfused step takes 8.5% longer at 4k, 2.0% at 32k, 0.8% at 128k (4-9 us).
FUSE_COMBINE = True
#: The split kernel's two paths: "tc", tensor cores fed by a cp.async pipeline (:mod:`.tc`: sm_80+, float16 and
#: bfloat16, d a multiple of 16), and "cuda", CUDA cores with 16-byte register loads (:mod:`.kernels`: every cc,
#: every dtype and head dim).
PATHS = ("tc", "cuda")


def choose_path(d: int, dtype_name: str, cc) -> str:
    """The split kernel's path for head dim d, storage ``dtype_name``, compute capability ``cc`` (None: the
    simulator, which runs both): "tc" where :func:`.tc.runs` and cc >= 8.0 (cp.async, m16n8k16), else "cuda".
    ``flash_numba._switches.DECODE_PATH`` or ``FLASH_NUMBA_DECODE_PATH`` in the environment force one ("tc" only
    where it runs: a GPU below 8.0, or a dtype or head dim it does not run, is an error naming the switch)."""
    import os

    from ... import _switches

    forced = _switches.DECODE_PATH or os.environ.get("FLASH_NUMBA_DECODE_PATH") or None
    able = tc.runs(d, dtype_name) and (cc is None or tuple(cc) >= (8, 0))
    if forced is None:
        return "tc" if able else "cuda"
    if forced not in PATHS:
        raise ValueError(f"FLASH_NUMBA_DECODE_PATH: {forced!r} is not a path of flash_decode; use tc or cuda")
    if forced == "tc" and not able:
        raise ValueError(f"FLASH_NUMBA_DECODE_PATH: the tensor-core path runs float16 and bfloat16 at d = 16 .. 128 "
                         f"(a multiple of 16) on compute capability 8.0 and up, not {dtype_name} at d = {d}"
                         + ("" if cc is None else f" on {tuple(cc)}"))
    return forced


def path_of(prob) -> str:
    """The path a problem runs: ``prob.path`` when set (:func:`flash_numba.decode.prepare` sets it), else
    :func:`choose_path` for this device."""
    if getattr(prob, "path", ""):
        return prob.path
    from ... import device

    cc = None if device.SIMULATOR else device.info().compute_capability
    return choose_path(prob.d, prob.dtype_name, cc)


def row_tile(R: int, path: str) -> int:
    """Query rows a split block computes for R = G * Nq rows of a KV head: the tensor-core kernel's m16 tile
    (:data:`.tc.MMA_ROWS`), or the CUDA-core kernel's :func:`rows_per_block`."""
    return tc.MMA_ROWS if path == "tc" else rows_per_block(R)


def stages_of(prob) -> int:
    """Pipeline stages of the tensor-core kernel (``prob.stages``, else :data:`.tc.STAGES`)."""
    return getattr(prob, "stages", None) or tc.STAGES


def resident_blocks(prob, path: str, shared_per_sm: int) -> int:
    """Split blocks an SM runs at once: :data:`RESIDENT_BLOCKS` for the CUDA-core kernel (registers), the
    tensor-core kernel's by its shared memory (:func:`.tc.resident_blocks`)."""
    if path != "tc":
        return RESIDENT_BLOCKS
    fused = fuse_combine(2, getattr(prob, "fused", None))  # (the splits are not chosen yet: as with more than one)
    return tc.resident_blocks(prob.d, stages_of(prob), tc.half_rows(prob.G * prob.Nq), shared_per_sm, fused)


def head_dim_ok(d: int) -> bool:
    """Head dims the kernels run: 8 to 128, a multiple of 8 (a key row is whole 16-byte loads)."""
    return 8 <= d <= 128 and d % 8 == 0


def choose_splits(B: int, Hkv: int, row_tiles: int, max_len: int, page_size: int | None, sm_count: int,
                  resident: int = RESIDENT_BLOCKS) -> int:
    """``num_splits`` for ``num_splits=None``: as many splits as fill one wave of resident blocks, no more.

    The grid has ``B * Hkv * row_tiles`` blocks per split and the GPU runs ``resident * sm_count`` of
    them at once (a wave; ``resident``: :func:`resident_blocks`, 4 for the CUDA-core kernel).  Splits = ``wave //
    blocks``: the grid fills the GPU once without a partial second
    wave (1 when one split already holds a wave), but no split shorter than :data:`MIN_KEYS_PER_SPLIT` keys of
    the longest sequence (nor than two pages): a split pays a block's start, its q, its merge and a partial row
    of d + 1 floats per query row, which a short chunk does not repay.  At most :data:`MAX_SPLITS`.

    The tensor-core kernel (2 stages: 80 KB of shared memory a block, two blocks an SM of 228 KB), measured on the
    H200 (benchmarks/results/h200-2026-12-01-decode-pipeline): 4 splits (256 blocks, 0.97 of a wave of 264)
    2,943 GB/s at 32k and 3,795 at 128k; 8 splits (two waves) 2,878 and 3,776; 3 stages at 4 splits (also two
    blocks an SM) and 4 stages at 2 splits (one block an SM) within 2% of it (2,993 and 2,998 at 32k).  (Those
    runs timed each launch with events around Numba's launch path, host work included: relative to each other
    only.  Timed as calls queued back to back, benchmarks/results/h200-2026-12-02-decode, the rule's 4 splits with
    the combine fused stream 2,886 GB/s at 4k, 3,987 at 32k and 4,187 at 128k, one split 1.5-1.9x slower; since
    the copies' L2 prefetch size, benchmarks/results/h200-2026-12-02-decode-l2, 2,988, 4,052 and 4,247.)

    The CUDA-core kernel, measured on the H200 (132 SMs, B*Hkv = 64, d = 128, float16,
    benchmarks/results/h200-2026-12-01-decode): 8 splits (512 blocks, 0.97 of a wave) was the fastest of 1, 4, 8,
    16/17, 32 and 64 at every cache length
    from 4k to 128k (724 to 2,358 GB/s).  Against it, in time: 17 splits (1,088 blocks, two waves and 32 blocks
    of a third: this rule's first version, which aimed at two waves) 1.23-1.35x (16 at 4k: 1.53x); 32 and 64
    splits (3.9 and 7.8 waves) 1.03-1.55x and 1.04-1.60x, closest at 128k; 4 splits (half a wave) 1.02-1.57x;
    one split 2.1-5.6x.
    """
    blocks = max(1, B * Hkv * row_tiles)
    want = max(1, resident * max(1, sm_count) // blocks)
    min_keys = MIN_KEYS_PER_SPLIT if page_size is None else max(MIN_KEYS_PER_SPLIT, 2 * page_size)
    most = max(1, max_len // min_keys)
    return int(min(want, most, MAX_SPLITS))


def fuse_combine(num_splits: int, fused=None) -> bool:
    """Whether a call of ``num_splits`` merges its partials in the split kernel (:func:`.kernels.combine_tail`):
    never with one split; else ``fused`` (a problem's ``fused``: the benchmark sets it), else
    ``_switches.DECODE_FUSED``, else :data:`FUSE_COMBINE`."""
    from ... import _switches

    if num_splits == 1:
        return False
    for choice in (fused, _switches.DECODE_FUSED, FUSE_COMBINE):
        if choice is not None:
            return bool(choice)
    return FUSE_COMBINE


def fused_of(prob) -> bool:
    """:func:`fuse_combine` for a problem."""
    return fuse_combine(prob.num_splits, getattr(prob, "fused", None))


def launches(num_splits: int, fused=None) -> tuple[str, ...]:
    """The counter names of a call's launches, in order (``fused``: as :func:`fuse_combine`)."""
    if num_splits == 1:
        return (SPLIT_ONE_NAME,)
    return (FUSED_NAME,) if fuse_combine(num_splits, fused) else (SPLIT_NAME, COMBINE_NAME)


#: The fused kernels' group counters a stream holds: one per grid row (CUDA's limit on the grid's axis y).
MAX_GROUPS = 65535
_SEMAPHORES: dict = {}


def semaphores(stream):
    """The int32 group counters of the fused split kernel for launches on ``stream``: zeros, kept per CUDA context
    and stream (each fused launch leaves them zero: its last block of a group resets the group's counter, and
    launches on one stream run one after another).  Built once, by a copy on that stream."""
    from numba import cuda
    from numba.core import config

    from ... import _launch_plan, _stream
    from ...device import SIMULATOR

    h = 0 if SIMULATOR else _stream.handle(stream)
    per_thread = h == 0 and getattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 0)
    key = (0 if SIMULATOR else id(cuda.current_context()), h, threading.get_ident() if per_thread else 0)
    sem = _SEMAPHORES.get(key)
    if sem is None:
        if len(_SEMAPHORES) > 256:  # streams come and go in some programs
            _SEMAPHORES.clear()
        sem = _SEMAPHORES[key] = _launch_plan.persistent(cuda.to_device(np.zeros(MAX_GROUPS, np.int32),
                                                                        stream=stream))
    return sem


_DUMMY: dict = {}


def _unused(dtype):
    """A one-element device array of ``dtype`` for the fused arguments a build does not read (one per context)."""
    from numba import cuda

    from ... import _launch_plan
    from ...device import SIMULATOR

    key = (0 if SIMULATOR else id(cuda.current_context()), np.dtype(dtype).str)
    if key not in _DUMMY:
        _DUMMY[key] = _launch_plan.persistent(cuda.to_device(np.zeros(1, dtype)))
    return _DUMMY[key]


def run(prob, ops, counters):
    """Launch the split kernel (and, with more than one split and without :func:`fused_of`, the combine); returns
    device ``(o, lse)``, o ``(rows, d)`` in the storage dtype and lse ``(rows,)`` float32, rows = B*Hq*Nq in
    (b, h, i) order."""
    from ... import _stream

    S, d, dt = prob.num_splits, prob.d, prob.dtype
    rows = prob.rows
    path = path_of(prob)
    R = prob.G * prob.Nq
    RT = row_tile(R, path)
    row_tiles = -(-R // RT)
    grid = (S, prob.B * prob.Hkv * row_tiles)
    split = S > 1
    fused = fused_of(prob)
    causal = prob.causal and prob.Nq > 1  # one new token sees every key: the causal mask hides none
    shared = {}
    if path == "tc":
        stages, NR = stages_of(prob), tc.half_rows(R)
        kernel = split_tc_kernel(d, prob.dtype_name, NR, prob.paged, split, causal, counters.enabled, stages, fused)
        if tc.dynamic(d, stages, NR, fused):
            shared = {"dynamic_bytes": _smem.total_bytes(tc.tile_sizes(d, stages), 2),
                      "static_bytes": tc.static_bytes(d, NR, fused)}
    else:
        kernel = split_kernel(d, prob.dtype_name, RT, prob.paged, split, causal, counters.enabled,
                              prob.keys_in_flight, fused)
    o = _inputs.empty((rows, d), dt)
    lse = _inputs.empty((rows,), np.float32)
    scale_log2 = np.float32(prob.scale * LOG2E)
    args = (ops["q"], ops["k"], ops["v"], ops["table"], ops["seqlens"])
    tail = (prob.Hkv, prob.G, prob.Nq, prob.page_size, prob.max_pages, rows, row_tiles, scale_log2)
    unused = (_unused(dt), _unused(np.float32), _unused(np.int32))  # o_out, lse_out, sem: read by fused builds only
    if not split:
        launch(kernel, grid, NT, **shared)(*args, o.reshape(rows * d), lse, *unused, *tail,
                                           counters.array(SPLIT_ONE_NAME))
        return o, lse
    o_part = _inputs.empty((S * rows * d,), np.float32)
    lse_part = _inputs.empty((S * rows,), np.float32)
    if fused:
        sem = semaphores(_stream.current())
        launch(kernel, grid, NT, **shared)(*args, o_part, lse_part, o.reshape(rows * d), lse, sem, *tail,
                                           counters.array(FUSED_NAME))
        return o, lse
    launch(kernel, grid, NT, **shared)(*args, o_part, lse_part, *unused, *tail, counters.array(SPLIT_NAME))
    combine = combine_kernel(d, prob.dtype_name, counters.enabled)
    launch(combine, -(-rows // WARPS), NT)(o_part, lse_part, ops["seqlens"], o.reshape(rows * d), lse, rows, S,
                                          prob.Hq, prob.Nq, int(causal), counters.array(COMBINE_NAME))
    return o, lse


def _flops(prob) -> dict:
    """FLOPs per launch: 4 d per (query row, visible key) in the split kernel (S = q.k and P V: a multiply
    and an add each); 2 d per (row, split that saw a key) in the combine (the fused kernel: both)."""
    vis = _model("visible_pairs")(prob)
    names = launches(prob.num_splits, getattr(prob, "fused", None))
    out = {names[0]: 4 * prob.d * vis}
    if prob.num_splits > 1:
        merge = 2 * prob.d * _model("partial_rows")(prob)
        if len(names) == 1:
            out[names[0]] += merge
        else:
            out[COMBINE_NAME] = merge
    return out


def _model(name):
    """A function of the IO model, :mod:`flash_numba.iomodel.flash_decode`, which imports this module's launch
    names: looked up at the call (``_spec.lazy``), so that neither module imports the other at import."""
    return lazy("flash_numba.iomodel.flash_decode", name)


def _io(prob):
    return _model("decode")(prob)


#: The counted builds of the tier use one shape (rows a block, paged, split, causal): the counters are integer code.
_COUNTED_SHAPE = (4, True, True, False)


def _split_shapes(dtype: str, d: int):
    """The (rows a block, paged, split, causal) builds the compile tier assembles for a (dtype, d): at the
    benchmark's float16, d = 128 every non-causal one and two causal; elsewhere the extremes (8 rows unpaged
    unsplit, 4 and 1 rows paged split) and one causal."""
    if dtype == "float16" and d == 128:
        shapes = [(*s, False) for s in itertools.product((1, 2, 4, MAX_ROWS), (False, True), (False, True))]
        return shapes + [(4, True, True, True), (MAX_ROWS, False, False, True)]
    return [(MAX_ROWS, False, False, False), (4, True, True, False), (1, True, True, False), (4, True, True, True)]


def _array_1d(dtype: str):
    """The compile tier's type of a 1-D array of storage ``dtype`` (bfloat16: uint16 words)."""
    from numba import types

    from .._common import array_type

    return types.Array(types.uint16, 1, "C") if dtype == "bfloat16" else array_type(dtype, 1)


def _split_argtypes(dtype: str, split: bool):
    from numba import types

    f32 = types.Array(types.float32, 1, "C")
    out = f32 if split else _array_1d(dtype)
    i32 = types.Array(types.int32, 1, "C")
    return (_array_1d(dtype), _array_1d(dtype), _array_1d(dtype), i32, i32, out, f32, _array_1d(dtype), f32, i32,
            *(types.int64,) * 7, types.float32, COUNTER_TYPE)


def _name(split: bool, fused: bool) -> str:
    return (FUSED_NAME if fused else SPLIT_NAME) if split else SPLIT_ONE_NAME


def _tc_shapes(dtype: str, d: int):
    """The (NR, paged, split, causal, count) builds of the tensor-core kernel the tier assembles for a (dtype, d):
    at d = 128 every non-causal one and two causal; elsewhere one and two halves of rows, paged and split, and
    one causal; counted at float16, d = 64 (the counters are integer code)."""
    if d == 128:
        shapes = [(*s, False, False) for s in itertools.product((1, 2), (False, True), (False, True))]
        shapes += [(1, True, True, True, False), (2, False, False, True, False)]
    else:
        shapes = [(1, True, True, False, False), (2, False, False, True, False)]
    if dtype == "float16" and d == 64:
        shapes.append((1, True, True, False, True))
    return shapes


def _tc_builds(cc, dtype: str, d: int) -> list[Compiled]:
    """The tensor-core kernel's builds for one cc (8.0 and up), dtype and d, labelled with their dynamic shared
    memory where they have any; the split builds as :data:`FUSE_COMBINE` ships them, and the first split shape
    the other way too."""
    out = []
    shapes = [(*s, FUSE_COMBINE) for s in _tc_shapes(dtype, d)]
    shapes += [(*s[:-1], not FUSE_COMBINE) for s in shapes if s[2]][:1]
    for NR, paged, split, causal, count, fused in shapes:
        fused = fused and split
        kernel = split_tc_kernel(d, dtype, NR, paged, split, causal, count, tc.STAGES, fused)
        dyn = _smem.total_bytes(tc.tile_sizes(d, tc.STAGES), 2) if tc.dynamic(d, tc.STAGES, NR, fused) else 0
        label = (f"{_name(split, fused)} tc d={d} {dtype} halves={NR}"
                 f"{' paged' if paged else ''}{' causal' if causal else ''}{' count' if count else ''}"
                 f"{f' dynamic={dyn}' if dyn else ''}")
        out.append(compile_kernel(label, kernel, _split_argtypes(dtype, split), cc))
    return out


def compile_all(ccs, dtypes, ds) -> list[Compiled]:
    """The compile tier: the split kernel's builds (:func:`_split_shapes`), the tensor-core kernel's at cc 8.0 and
    up (:func:`_tc_shapes`; the representative tier's float32 at d = 64 adds its float16 builds at d = 64, so that
    every tier assembles it) and the combine, per cc, dtype, d; the split builds fused as :data:`FUSE_COMBINE`
    says, and the first split shape of each list the other way."""
    from numba import types

    out = []
    for cc in ccs:
        if tuple(cc) < (8, 0):
            continue
        for dtype, d in itertools.product(dtypes, ds):
            if tc.runs(d, dtype):
                out += _tc_builds(cc, dtype, d)
        if "float32" in dtypes and "float16" not in dtypes and 64 in ds:
            out += _tc_builds(cc, "float16", 64)
    for cc, dtype, d in itertools.product(ccs, dtypes, ds):
        if dtype not in DTYPES or not head_dim_ok(d):
            continue
        for count in count_variants(dtype, d):
            shapes = [(*s, FUSE_COMBINE) for s in ([_COUNTED_SHAPE] if count else _split_shapes(dtype, d))]
            shapes += [(*s[:-1], not FUSE_COMBINE) for s in shapes if s[2]][:1]
            for RT, paged, split, causal, fused in shapes:
                fused = fused and split
                kernel = split_kernel(d, dtype, RT, paged, split, causal, count, None, fused)
                label = (f"{_name(split, fused)} d={d} {dtype} rows={RT}"
                         f"{' paged' if paged else ''}{' causal' if causal else ''}{' count' if count else ''}")
                out.append(compile_kernel(label, kernel, _split_argtypes(dtype, split), cc))
            f32 = types.Array(types.float32, 1, "C")
            argtypes = (f32, f32, types.Array(types.int32, 1, "C"), _array_1d(dtype), f32, *(types.int64,) * 5,
                        COUNTER_TYPE)
            label = f"{COMBINE_NAME} d={d} {dtype}{' count' if count else ''}"
            out.append(compile_kernel(label, combine_kernel(d, dtype, count), argtypes, cc))
    return out


SPEC = DecodeSpec(
    name="flash_decode",
    doc=__doc__,
    run=run,
    launches=launches,
    io_model=_io,
    flops=_flops,
    compile_all=compile_all,
    dtypes=DTYPES,
    head_dims=head_dim_ok,
    head_dims_text="8 to 128, a multiple of 8",
    choose_splits=choose_splits,
    compile_groups=((("float16",), (128,)), (("bfloat16",), (128,)), (("float32",), (32,))),
)
