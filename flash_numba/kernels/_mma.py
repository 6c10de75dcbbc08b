"""Tensor-core building blocks: ``mma.sync``, ``ldmatrix`` and half-pair packing, per lane.

Each function is called by every lane of a warp (uniform control flow, full warp), with that lane's
registers, and returns that lane's registers of the result.  On a GPU each is one PTX instruction
(Numba ``@intrinsic`` emitting llvmlite ``InlineAsm``: no CUDA C, nothing linked).  In the simulator each is
a stand-in on the warp emulation of :mod:`flash_numba.sim.warps`: every lane posts its registers, a block
barrier, every lane reads the warp's posts and takes its own registers of the result, a barrier.  The
stand-ins implement the PTX ISA's fragment layouts exactly, so a kernel that puts the wrong element in the
wrong register fails in the simulator as it would on the GPU.

API (INTERFACES.md section 3; packed operands are uint32 holding two 16-bit values, the lower 16 bits the
element with the lower column / k index)::

    mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> UniTuple(float32, 4)   # sm_80+
    mma_m16n8k16_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> UniTuple(float32, 4)  # sm_80+
    mma_m16n8k8_f16(a0, a1, b0, c0, c1, c2, c3) -> UniTuple(float32, 4)                 # sm_75+
    ldmatrix_x4(smem, index) -> UniTuple(uint32, 4)         # sm_75+
    ldmatrix_x4_trans(smem, index) -> UniTuple(uint32, 4)   # sm_75+
    pack_f16x2(lo, hi) -> uint32                            # two float32 rounded to float16 (nearest even)
    pack_bf16x2(lo, hi) -> uint32                           # two float32 rounded to bfloat16 (nearest even); sm_80+
    unpack_f16x2(u) -> UniTuple(float32, 2)                 # (lo, hi)
    unpack_bf16x2(u) -> UniTuple(float32, 2)                # (lo, hi)
    copy_16(smem, s_index, gmem, g_index)                   # 16 bytes global -> shared (ld.global.v4, st.shared.v4)
    load_16(gmem, g_index) -> UniTuple(uint32, 4)           # 16 bytes from global memory (ld.global.v4)
    store_16(smem, s_index, w0, w1, w2, w3)                 # 16 bytes into shared memory (st.shared.v4)
    store_32(smem, s_index, w)                              # one word (two halves) into shared memory (st.shared.b32)
    zero_16(smem, s_index)                                  # 16 zero bytes into shared
    cp_async_16(smem, s_index, gmem, g_index)               # sm_80+: cp.async.cg.shared.global, 16 bytes
    cp_async_16_l2(prefetch)(smem, s_index, gmem, g_index)  # the same with .L2::<prefetch>B (64, 128, 256)
    cp_async_commit() ; cp_async_wait_all()                 # sm_80+: commit_group; wait_group 0
    cp_async_wait_group(n)() -> None                        # sm_80+: wait_group n (n a Python int: a constant)
    red_add_f32x2(arr, index, x, y)                         # sm_90+: arr.flat[index] += x, [index + 1] += y, one
                                                            # red.global.add.v2.f32 (index even: 8-byte aligned)

(Additions beyond INTERFACES.md: ``unpack_*``, ``copy_16``, ``load_16``, ``store_16``, ``store_32``, ``zero_16``;
``cp_async_wait(n)`` is ``cp_async_wait_group(n)``, a factory: the device function waits until at most n of
this thread's committed groups are still in flight, which a pipeline of n + 1 stages needs; in the simulator,
whose copies land at once, it does nothing.)  The 16-byte functions
take element indices of 16-bit arrays; both must be multiples of 8 (16-byte aligned addresses).

``smem`` is a 1-D shared array of 16-bit elements (float16 or uint16); ``index`` the element index where
this lane's 8-element (16-byte) row starts: it must be a multiple of 8 (16-byte aligned).

Fragment layouts (PTX ISA 8.x/9.x, section 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point
type" and 9.7.14.5.7 for m16n8k8; g = lane >> 2 ("groupID"), t = lane % 4 ("threadID_in_group"))::

    A (16 x 16, row-major)              B (16 x 8, "col": k down)       C, D (16 x 8, float32)
            k: 0..7        8..15               n: 0 .. 7                        n: 0 .. 7
    rows 0-7:  a0           a2         k 0-7 :   b0                   rows 0-7 :  c0 c1
    rows 8-15: a1           a3         k 8-15:   b1                   rows 8-15:  c2 c3

    a0 = A[g][2t, 2t+1]     a1 = A[g+8][2t, 2t+1]    a2 = A[g][2t+8, 2t+9]    a3 = A[g+8][2t+8, 2t+9]
    b0 = B[2t, 2t+1][g]     b1 = B[2t+8, 2t+9][g]
    c0, c1 = C[g][2t], C[g][2t+1]       c2, c3 = C[g+8][2t], C[g+8][2t+1]

    lane:      0      1      2      3      4   ...  31          (a0 of each lane: row g, columns 2t, 2t+1)
    A row 0: [0,1]  [2,3]  [4,5]  [6,7]                       <- lanes 0..3 hold row 0's columns 0..7
    A row 1:                             [0,1] ...            <- lanes 4..7 hold row 1

    m16n8k8 (f16): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1]; b0 = B[2t, 2t+1][g]; C as above.

ldmatrix (PTX ISA 9.7.9.25 "ldmatrix"), ``.m8n8.x4.b16``: four 8 x 8 matrices of 16-bit elements; lanes
8i .. 8i+7 give the addresses of matrix i's rows 0..7 (each row 16 contiguous bytes).  Register i of lane
l receives matrix i's row l >> 2, elements 2(l % 4) and 2(l % 4) + 1: that is exactly an A/B/C fragment
of one 8 x 8 block.  ``.trans`` delivers the transposed matrix: register i of lane l holds elements
[2(l % 4)][l >> 2] (low half) and [2(l % 4) + 1][l >> 2] (high half) of matrix i.

The host model (:func:`warp_mma`, :func:`warp_ldmatrix`: NumPy, 32 lanes at once) is what the stand-ins
run; the GPU test compares the hardware with it bit for bit.  The stand-in's products are exact (float64)
and rounded to float32 once; a tensor core's accumulation order and rounding differ in the last bits for
general inputs, and agree exactly on small-integer inputs.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np

from ..device import SIMULATOR

WARP = 32

# ---------------------------------------------------------------- the host model (NumPy, one warp)
#: registers of A and B per lane, and the k extent, of each instruction shape
SHAPES = {"m16n8k16_f16": (4, 2, 16, "f16"), "m16n8k16_bf16": (4, 2, 16, "bf16"), "m16n8k8_f16": (2, 1, 8, "f16")}


def _halves(words, kind):
    """uint32 words -> (low, high) as float64 arrays of the 16-bit ``kind`` ("f16" or "bf16")."""
    words = np.asarray(words, dtype=np.uint32)
    lo = (words & 0xFFFF).astype(np.uint16)
    hi = (words >> 16).astype(np.uint16)
    if kind == "f16":
        return lo.view(np.float16).astype(np.float64), hi.view(np.float16).astype(np.float64)
    f = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # noqa: E731
    return f(lo), f(hi)


@lru_cache(maxsize=None)
def _maps(k: int):
    """Index maps of the fragments: for every (lane, register, half) the row and column it holds in A (16 x k),
    B (k x 8) and C (16 x 8); the PTX ISA's tables, vectorised."""
    lane = np.arange(WARP)[:, None, None]
    g, t = lane >> 2, lane % 4
    half = np.arange(2)[None, None, :]
    ra = np.arange(k // 4)[None, :, None]
    a_rows = np.broadcast_to(g + 8 * (ra % 2), (WARP, k // 4, 2))
    a_cols = 2 * t + 8 * (ra // 2) + half
    rb = np.arange(k // 8)[None, :, None]
    b_rows = 2 * t + 8 * rb + half
    b_cols = np.broadcast_to(g, (WARP, k // 8, 2))
    rc = np.arange(4)[None, :]
    lane2 = np.arange(WARP)[:, None]
    c_rows = (lane2 >> 2) + 8 * (rc // 2)
    c_cols = 2 * (lane2 % 4) + rc % 2
    return a_rows, a_cols, b_rows, b_cols, c_rows, c_cols


def _split(words, kind):
    lo, hi = _halves(words, kind)
    return np.stack([lo, hi], axis=-1)


def fragment_a(a_regs, kind, k) -> np.ndarray:
    """The 16 x k matrix A that 32 lanes' A registers ``a_regs`` (32, k // 4) hold (float64)."""
    a_rows, a_cols = _maps(k)[:2]
    A = np.full((16, k), np.nan)
    A[a_rows, a_cols] = _split(np.asarray(a_regs, dtype=np.uint32).reshape(WARP, k // 4), kind)
    return A


def fragment_b(b_regs, kind, k) -> np.ndarray:
    """The k x 8 matrix B that 32 lanes' B registers ``b_regs`` (32, k // 8) hold (float64)."""
    b_rows, b_cols = _maps(k)[2:4]
    B = np.full((k, 8), np.nan)
    B[b_rows, b_cols] = _split(np.asarray(b_regs, dtype=np.uint32).reshape(WARP, k // 8), kind)
    return B


def fragment_c(c_regs) -> np.ndarray:
    """The 16 x 8 float32 matrix C (or D) that 32 lanes' accumulators ``c_regs`` (32, 4) hold."""
    c_rows, c_cols = _maps(8)[4:]
    C = np.full((16, 8), np.nan, dtype=np.float32)
    C[c_rows, c_cols] = np.asarray(c_regs, dtype=np.float32).reshape(WARP, 4)
    return C


def lanes_of_c(C) -> np.ndarray:
    """The (32, 4) accumulator registers that hold the 16 x 8 matrix ``C``: the inverse of :func:`fragment_c`."""
    c_rows, c_cols = _maps(8)[4:]
    return np.asarray(C, dtype=np.float32)[c_rows, c_cols]


def warp_mma(shape: str, a_regs, b_regs, c_regs) -> np.ndarray:
    """D = A B + C for one warp: registers in (32, na), (32, nb), (32, 4); D's registers (32, 4) float32.

    The products and their sum are exact (float64), rounded to float32 once."""
    na, nb, k, kind = SHAPES[shape]
    A = fragment_a(np.asarray(a_regs, dtype=np.uint32).reshape(WARP, na), kind, k)
    B = fragment_b(np.asarray(b_regs, dtype=np.uint32).reshape(WARP, nb), kind, k)
    C = fragment_c(np.asarray(c_regs, dtype=np.float32).reshape(WARP, 4)).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # Inf and NaN propagate as on the tensor core
        return lanes_of_c((A @ B + C).astype(np.float32))


def _pair(lo_bits, hi_bits) -> np.uint32:
    return np.uint32(int(lo_bits) | (int(hi_bits) << 16))


def warp_ldmatrix(mem_bits, rows, trans: bool) -> np.ndarray:
    """``ldmatrix.x4[.trans]`` for one warp: ``mem_bits`` the 16-bit words of shared memory (1-D), ``rows`` the
    32 lanes' row start indices; the (32, 4) uint32 registers each lane receives."""
    out = np.empty((WARP, 4), dtype=np.uint32)
    for lane in range(WARP):
        g, t = lane >> 2, lane % 4
        for i in range(4):
            if trans:  # matrix i transposed: elements [2t][g], [2t+1][g]
                lo = mem_bits[rows[8 * i + 2 * t] + g]
                hi = mem_bits[rows[8 * i + 2 * t + 1] + g]
            else:  # matrix i: row g, elements 2t, 2t+1
                lo = mem_bits[rows[8 * i + g] + 2 * t]
                hi = mem_bits[rows[8 * i + g] + 2 * t + 1]
            out[lane, i] = _pair(lo, hi)
    return out


def pack_host(lo, hi, kind: str) -> np.ndarray:
    """NumPy: float arrays -> uint32 words of (lo, hi) rounded to ``kind`` ("f16" or "bf16")."""
    from ._bf16 import to_bf16_bits

    if kind == "f16":
        with np.errstate(over="ignore"):  # beyond 65504 rounds to inf, as cvt.rn.f16.f32 does
            lb = np.asarray(lo, dtype=np.float32).astype(np.float16).view(np.uint16)
            hb = np.asarray(hi, dtype=np.float32).astype(np.float16).view(np.uint16)
    else:
        lb, hb = to_bf16_bits(lo), to_bf16_bits(hi)
    return lb.astype(np.uint32) | (hb.astype(np.uint32) << 16)


# ---------------------------------------------------------------- the simulator's stand-ins
def _warp_posts(value, compute=None):
    """Post this lane's ``value``; return (the 32 lanes' values of this warp, this lane), or with ``compute``,
    (``compute(posts)`` computed once for the warp, this lane).  Every lane of the warp must call."""
    from ..sim.warps import current_thread, warp_sync

    me = current_thread()
    store = me._manager.__dict__.setdefault("_flash_numba_mma", {})
    tid = me.thread_id
    store[tid] = value
    warp_sync(me)
    base = tid - tid % WARP
    generation = getattr(me, "_flash_numba_mma_calls", 0)
    me._flash_numba_mma_calls = generation + 1
    key = ("result", base, generation)
    if compute is not None and key in store:
        out = store[key]
    else:
        try:
            out = [store[base + lane] for lane in range(WARP)]
        except KeyError:
            raise RuntimeError("mma/ldmatrix stand-in: needs a full warp of 32 threads (the block's size is not "
                               "a multiple of 32)") from None
        if compute is not None:
            out = store[key] = compute(out)
    warp_sync(me)
    if compute is not None and tid == base:  # every lane has read it
        store.pop(key, None)
    return out, tid % WARP


def _mma_standin(shape):
    na, nb, _, _ = SHAPES[shape]

    def compute(posts):
        a = np.array([p[:na] for p in posts], dtype=np.uint32)
        b = np.array([p[na:na + nb] for p in posts], dtype=np.uint32)
        c = np.array([p[na + nb:] for p in posts], dtype=np.float32)
        return warp_mma(shape, a, b, c)

    def run(*regs):
        d, lane = _warp_posts(regs, compute)
        d = d[lane]
        return np.float32(d[0]), np.float32(d[1]), np.float32(d[2]), np.float32(d[3])

    run.__name__ = f"mma_{shape}"
    return run


def _bits_of(smem, i) -> int:
    v = smem[i]
    if isinstance(v, (np.floating,)) or np.asarray(v).dtype == np.float16:
        return int(np.asarray(v, dtype=np.float16).view(np.uint16))
    return int(v) & 0xFFFF


def _ldmatrix_standin(trans: bool):
    def run(smem, index):
        if int(index) % 8:
            raise ValueError(f"ldmatrix: index {int(index)} is not a multiple of 8 (rows must start on 16 bytes)")
        posts, lane = _warp_posts(int(index))
        g, t = lane >> 2, lane % 4
        regs = []
        for i in range(4):
            if trans:
                lo, hi = _bits_of(smem, posts[8 * i + 2 * t] + g), _bits_of(smem, posts[8 * i + 2 * t + 1] + g)
            else:
                lo, hi = _bits_of(smem, posts[8 * i + g] + 2 * t), _bits_of(smem, posts[8 * i + g] + 2 * t + 1)
            regs.append(_pair(lo, hi))
        return regs[0], regs[1], regs[2], regs[3]

    run.__name__ = "ldmatrix_x4_trans" if trans else "ldmatrix_x4"
    return run


def _pack_standin(kind):
    def run(lo, hi):
        return np.uint32(pack_host(np.float32(lo), np.float32(hi), kind))

    run.__name__ = f"pack_{kind}x2"
    return run


def _unpack_standin(kind):
    def run(u):
        lo, hi = _halves(np.uint32(u), kind)
        return np.float32(lo), np.float32(hi)

    run.__name__ = f"unpack_{kind}x2"
    return run


def copy_16_standin(smem, s_index, gmem, g_index):
    for e in range(8):
        smem[s_index + e] = gmem[g_index + e]


def _words_of(arr, index):
    return [_pair(_bits_of(arr, index + 2 * w), _bits_of(arr, index + 2 * w + 1)) for w in range(4)]


def load_16_standin(gmem, g_index):
    w = _words_of(gmem, int(g_index))
    return w[0], w[1], w[2], w[3]


def store_16_standin(smem, s_index, w0, w1, w2, w3):
    """The 8 halves of four words into smem (float16 or uint16), lower half first."""
    halves = np.array([int(w0), int(w1), int(w2), int(w3)], dtype=np.uint32).view(np.uint16)
    values = halves.view(np.float16) if np.asarray(smem[s_index]).dtype == np.float16 else halves
    for e in range(8):
        smem[s_index + e] = values[e]


def store_32_standin(smem, s_index, w):
    """The two halves of a word into smem[s_index], smem[s_index + 1] (float16 or uint16), lower half first."""
    halves = np.array([int(w)], dtype=np.uint32).view(np.uint16)
    values = halves.view(np.float16) if np.asarray(smem[s_index]).dtype == np.float16 else halves
    smem[s_index] = values[0]
    smem[s_index + 1] = values[1]


def zero_16_standin(smem, s_index):
    for e in range(8):
        smem[s_index + e] = 0


def _nothing():
    return None


_RED_LOCK = threading.Lock()


def red_add_f32x2_standin(arr, index, x, y):
    """The two float32 adds, under a lock (as the simulator's own atomics)."""
    flat = arr.reshape(-1)
    with _RED_LOCK:
        flat[int(index)] += np.float32(x)
        flat[int(index) + 1] += np.float32(y)


# ---------------------------------------------------------------- the GPU: inline PTX
@lru_cache(maxsize=None)
def _mma_intrinsic(shape: str):
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    na, nb, _, kind = SHAPES[shape]
    mnk, ab = shape.split("_")
    ptx_type = {"f16": "f16", "bf16": "bf16"}[kind]
    n_in = na + nb
    outs = "{$0,$1,$2,$3}"
    a_ops = "{" + ",".join(f"${4 + i}" for i in range(na)) + "}"
    b_ops = "{" + ",".join(f"${4 + na + i}" for i in range(nb)) + "}"
    c_ops = "{" + ",".join(f"${4 + n_in + i}" for i in range(4)) + "}"
    asm_text = f"mma.sync.aligned.{mnk}.row.col.f32.{ptx_type}.{ptx_type}.f32 {outs}, {a_ops}, {b_ops}, {c_ops};"
    constraints = ",".join(["=f"] * 4 + ["r"] * n_in + ["0", "1", "2", "3"])
    argtys = (types.uint32,) * n_in + (types.float32,) * 4
    result = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        f32, i32 = ir.FloatType(), ir.IntType(32)
        fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * n_in + [f32] * 4)
        out = builder.call(ir.InlineAsm(fnty, asm_text, constraints, side_effect=False), args)
        return context.make_tuple(builder, result, [builder.extract_value(out, i) for i in range(4)])

    if shape == "m16n8k8_f16":
        @intrinsic
        def mma(typingctx, a0, a1, b0, c0, c1, c2, c3):
            return result(*argtys), codegen
    else:
        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            return result(*argtys), codegen
    return mma


@lru_cache(maxsize=None)
def _ldmatrix_intrinsic(trans: bool):
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.arrayobj import make_array

    asm_text = ("ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "")
                + ".shared.b16 {$0,$1,$2,$3}, [$4];")
    result = types.UniTuple(types.uint32, 4)

    @intrinsic
    def ldmatrix(typingctx, smem, index):
        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            arr = make_array(sig.args[0])(context, builder, args[0])
            # the tile's shared address (cvta.to.shared, the same for every call: hoisted) plus the index's bytes in
            # 32-bit arithmetic, so that the constant part of an index becomes the instruction's immediate offset
            generic = builder.bitcast(arr.data, ir.IntType(8).as_pointer())
            base = builder.ptrtoint(builder.addrspacecast(generic, ir.PointerType(ir.IntType(8), 3)), i32)
            itemsize = context.get_abi_sizeof(context.get_data_type(sig.args[0].dtype))
            index = builder.trunc(args[1], i32) if args[1].type.width > 32 else args[1]
            address = builder.add(base, builder.mul(index, ir.Constant(i32, itemsize), flags=["nuw"]), flags=["nuw"])
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
            # reads shared memory: volatile with a memory clobber, so it is never moved across a barrier or a store
            out = builder.call(ir.InlineAsm(fnty, asm_text, "=r,=r,=r,=r,r,~{memory}", side_effect=True), [address])
            return context.make_tuple(builder, result, [builder.extract_value(out, i) for i in range(4)])

        return result(smem, types.uint32), codegen

    return ldmatrix


@lru_cache(maxsize=None)
def _pack_intrinsic(kind: str):
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    if kind == "f16":  # two cvt (sm_75 has no cvt.f16x2.f32)
        asm_text = "{ .reg .f16 lo, hi;\n cvt.rn.f16.f32 lo, $1;\n cvt.rn.f16.f32 hi, $2;\n mov.b32 $0, {lo, hi}; }"
    else:  # cvt.rn.bf16x2.f32 d, a, b puts a in the upper half, b in the lower (sm_80+)
        asm_text = "cvt.rn.bf16x2.f32 $0, $2, $1;"

    @intrinsic
    def pack(typingctx, lo, hi):
        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fnty = ir.FunctionType(i32, [f32, f32])
            return builder.call(ir.InlineAsm(fnty, asm_text, "=r,f,f", side_effect=False), list(args))

        return types.uint32(types.float32, types.float32), codegen

    return pack


@lru_cache(maxsize=None)
def _unpack_intrinsic(kind: str):
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    result = types.UniTuple(types.float32, 2)

    @intrinsic
    def unpack(typingctx, u):
        def codegen(context, builder, sig, args):
            i32, f32 = ir.IntType(32), ir.FloatType()
            word = args[0]
            if kind == "bf16":  # a bfloat16 is the upper half of a float32
                lo = builder.shl(word, ir.Constant(i32, 16))
                hi = builder.and_(word, ir.Constant(i32, 0xFFFF0000))
                items = [builder.bitcast(lo, f32), builder.bitcast(hi, f32)]
            else:
                i16, half = ir.IntType(16), ir.HalfType()
                lo = builder.bitcast(builder.trunc(word, i16), half)
                hi = builder.bitcast(builder.trunc(builder.lshr(word, ir.Constant(i32, 16)), i16), half)
                items = [builder.fpext(lo, f32), builder.fpext(hi, f32)]
            return context.make_tuple(builder, result, items)

        return result(types.uint32), codegen

    return unpack


def _pointer(builder, arr_type, context, arr, index, addrspace):
    """The address of ``arr[index]`` as an integer of state space ``addrspace`` (3 shared: 32 bits; 1 global: 64)."""
    from llvmlite import ir
    from numba.cuda.np.arrayobj import make_array

    i64 = ir.IntType(64)
    a = make_array(arr_type)(context, builder, arr)
    index = builder.zext(index, i64) if index.type.width < 64 else index
    generic = builder.bitcast(builder.gep(a.data, [index], inbounds=True), ir.IntType(8).as_pointer())
    spaced = builder.addrspacecast(generic, ir.PointerType(ir.IntType(8), addrspace))
    return builder.ptrtoint(spaced, ir.IntType(32) if addrspace == 3 else i64)


@lru_cache(maxsize=None)
def _copy_intrinsics():
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    def asm(builder, text, constraints, argtys, args):
        fnty = ir.FunctionType(ir.VoidType(), argtys)
        builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), args)

    @intrinsic
    def copy_16(typingctx, smem, s_index, gmem, g_index):
        def codegen(context, builder, sig, args):
            dst = _pointer(builder, sig.args[0], context, args[0], args[1], 3)
            src = _pointer(builder, sig.args[2], context, args[2], args[3], 1)
            asm(builder, "{ .reg .b32 a, b, c, d;\n ld.global.v4.b32 {a, b, c, d}, [$1];\n"
                         " st.shared.v4.b32 [$0], {a, b, c, d}; }", "r,l,~{memory}", [i32, i64], [dst, src])
            return context.get_dummy_value()

        return types.void(smem, types.uint32, gmem, types.uint64), codegen

    @intrinsic
    def load_16(typingctx, gmem, g_index):
        result = types.UniTuple(types.uint32, 4)

        def codegen(context, builder, sig, args):
            src = _pointer(builder, sig.args[0], context, args[0], args[1], 1)
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i64])
            # a plain load of read-only inputs: not volatile, so loads can be issued together
            out = builder.call(ir.InlineAsm(fnty, "ld.global.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
                                            side_effect=False), [src])
            return context.make_tuple(builder, result, [builder.extract_value(out, i) for i in range(4)])

        return result(gmem, types.uint64), codegen

    @intrinsic
    def store_16(typingctx, smem, s_index, w0, w1, w2, w3):
        def codegen(context, builder, sig, args):
            dst = _pointer(builder, sig.args[0], context, args[0], args[1], 3)
            asm(builder, "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r,~{memory}", [i32] * 5,
                [dst, *args[2:]])
            return context.get_dummy_value()

        return types.void(smem, types.uint32, types.uint32, types.uint32, types.uint32, types.uint32), codegen

    @intrinsic
    def store_32(typingctx, smem, s_index, w):
        def codegen(context, builder, sig, args):
            dst = _pointer(builder, sig.args[0], context, args[0], args[1], 3)
            asm(builder, "st.shared.b32 [$0], $1;", "r,r,~{memory}", [i32, i32], [dst, args[2]])
            return context.get_dummy_value()

        return types.void(smem, types.uint32, types.uint32), codegen

    @intrinsic
    def zero_16(typingctx, smem, s_index):
        def codegen(context, builder, sig, args):
            dst = _pointer(builder, sig.args[0], context, args[0], args[1], 3)
            asm(builder, "{ .reg .b32 z;\n mov.b32 z, 0;\n st.shared.v4.b32 [$0], {z, z, z, z}; }", "r,~{memory}",
                [i32], [dst])
            return context.get_dummy_value()

        return types.void(smem, types.uint32), codegen

    cp_async_16 = _cp_async_intrinsic("")

    @intrinsic
    def cp_async_commit(typingctx):
        def codegen(context, builder, sig, args):
            asm(builder, "cp.async.commit_group;", "~{memory}", [], [])
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def cp_async_wait_all(typingctx):
        def codegen(context, builder, sig, args):
            asm(builder, "cp.async.wait_group 0;", "~{memory}", [], [])
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def red_add_f32x2(typingctx, arr, index, x, y):
        def codegen(context, builder, sig, args):
            dst = _pointer(builder, sig.args[0], context, args[0], args[1], 1)
            f32 = ir.FloatType()
            asm(builder, "red.global.add.v2.f32 [$0], {$1, $2};", "l,f,f,~{memory}", [i64, f32, f32],
                [dst, args[2], args[3]])
            return context.get_dummy_value()

        return types.void(arr, types.uint64, types.float32, types.float32), codegen

    return (copy_16, load_16, store_16, store_32, zero_16, cp_async_16, cp_async_commit, cp_async_wait_all,
            red_add_f32x2)


@lru_cache(maxsize=None)
def cp_async_wait_group(n: int):
    """The device function ``wait()``: ``cp.async.wait_group n`` (sm_80+), this thread's copies of every committed
    group but the newest ``n`` have landed in shared memory (other lanes' copies: after a barrier).  The simulator's
    copies land when issued: a no-op there."""
    if not 0 <= int(n) <= 7:
        raise ValueError(f"cp_async_wait_group: n = {n} is not 0 .. 7")
    if SIMULATOR:
        return _nothing
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    text = f"cp.async.wait_group {int(n)};"

    @intrinsic
    def wait(typingctx):
        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(ir.InlineAsm(fnty, text, "~{memory}", side_effect=True), [])
            return context.get_dummy_value()

        return types.void(), codegen

    return wait


@lru_cache(maxsize=None)
def _cp_async_intrinsic(qualifier: str):
    """``cp.async.cg.shared.global<qualifier> [smem], [gmem], 16`` as an intrinsic (GPU builds only)."""
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    text = f"cp.async.cg.shared.global{qualifier} [$0], [$1], 16;"
    i32, i64 = ir.IntType(32), ir.IntType(64)

    @intrinsic
    def cp_async(typingctx, smem, s_index, gmem, g_index):
        def codegen(context, builder, sig, args):
            dst = _pointer(builder, sig.args[0], context, args[0], args[1], 3)
            src = _pointer(builder, sig.args[2], context, args[2], args[3], 1)
            fnty = ir.FunctionType(ir.VoidType(), [i32, i64])
            builder.call(ir.InlineAsm(fnty, text, "r,l,~{memory}", side_effect=True), [dst, src])
            return context.get_dummy_value()

        return types.void(smem, types.uint32, gmem, types.uint64), codegen

    return cp_async


@lru_cache(maxsize=None)
def cp_async_16_l2(prefetch: int = 0):
    """``cp_async_16`` with PTX's L2 prefetch size (sm_80+): ``prefetch`` bytes, 0, 64, 128 or 256 (the
    ``.L2::<n>B`` qualifier: the L2 fetches the aligned block of that many bytes around the 16 copied, so that
    one DRAM access serves the neighbouring copies).  0 is ``cp_async_16`` itself; the simulator's copies ignore
    it."""
    if prefetch not in (0, 64, 128, 256):
        raise ValueError(f"cp_async_16_l2: prefetch = {prefetch} is not 0, 64, 128 or 256")
    if SIMULATOR or prefetch == 0:
        return cp_async_16
    return _cp_async_intrinsic(f".L2::{prefetch}B")


if SIMULATOR:
    copy_16 = cp_async_16 = copy_16_standin
    load_16, store_16, store_32 = load_16_standin, store_16_standin, store_32_standin
    red_add_f32x2 = red_add_f32x2_standin
    zero_16 = zero_16_standin
    cp_async_commit = cp_async_wait_all = _nothing
else:
    (copy_16, load_16, store_16, store_32, zero_16, cp_async_16, cp_async_commit, cp_async_wait_all,
     red_add_f32x2) = _copy_intrinsics()

if SIMULATOR:
    mma_m16n8k16_f16 = _mma_standin("m16n8k16_f16")
    mma_m16n8k16_bf16 = _mma_standin("m16n8k16_bf16")
    mma_m16n8k8_f16 = _mma_standin("m16n8k8_f16")
    ldmatrix_x4 = _ldmatrix_standin(False)
    ldmatrix_x4_trans = _ldmatrix_standin(True)
    pack_f16x2 = _pack_standin("f16")
    pack_bf16x2 = _pack_standin("bf16")
    unpack_f16x2 = _unpack_standin("f16")
    unpack_bf16x2 = _unpack_standin("bf16")
else:
    mma_m16n8k16_f16 = _mma_intrinsic("m16n8k16_f16")
    mma_m16n8k16_bf16 = _mma_intrinsic("m16n8k16_bf16")
    mma_m16n8k8_f16 = _mma_intrinsic("m16n8k8_f16")
    ldmatrix_x4 = _ldmatrix_intrinsic(False)
    ldmatrix_x4_trans = _ldmatrix_intrinsic(True)
    pack_f16x2 = _pack_intrinsic("f16")
    pack_bf16x2 = _pack_intrinsic("bf16")
    unpack_f16x2 = _unpack_intrinsic("f16")
    unpack_bf16x2 = _unpack_intrinsic("bf16")
