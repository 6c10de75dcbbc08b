"""The tensor-core building blocks (kernels/_mma.py) against the PTX ISA's fragment layouts, lane by lane.

The expected registers are written here from the ISA's tables (section 9.7.14.5.8, m16n8k16; 9.7.14.5.7,
m16n8k8; 9.7.9.25, ldmatrix), independently of _mma's own host model.  In the simulator the stand-ins run;
on a GPU (``gpu`` tests) the same kernels run the real instructions and are compared with the host model
bit for bit: small-integer inputs make every product and sum exact in float32, so any placement error
or rounding difference shows.
"""

import numpy as np
import pytest
from numba import cuda

from flash_numba.device import jit
from flash_numba.kernels import _mma
from flash_numba.kernels._bf16 import from_bf16_bits, to_bf16_bits

SHAPES = {"m16n8k16_f16": (4, 2, 16, "f16"), "m16n8k16_bf16": (4, 2, 16, "bf16"), "m16n8k8_f16": (2, 1, 8, "f16")}


def bits16(x, kind):
    x = np.asarray(x, dtype=np.float32)
    return x.astype(np.float16).view(np.uint16) if kind == "f16" else to_bf16_bits(x)


def word(lo, hi, kind):
    """One packed register: ``lo`` in bits 0..15, ``hi`` in bits 16..31."""
    return np.uint32(int(bits16(lo, kind)) | (int(bits16(hi, kind)) << 16))


def isa_a_regs(A, kind):
    """(32, k/4) A registers, as the ISA's table lists them (a0: row g, cols 2t..; a1: row g+8; a2: cols +8; a3)."""
    k = A.shape[1]
    regs = np.zeros((32, k // 4), dtype=np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        regs[lane, 0] = word(A[g, 2 * t], A[g, 2 * t + 1], kind)
        regs[lane, 1] = word(A[g + 8, 2 * t], A[g + 8, 2 * t + 1], kind)
        if k == 16:
            regs[lane, 2] = word(A[g, 2 * t + 8], A[g, 2 * t + 9], kind)
            regs[lane, 3] = word(A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9], kind)
    return regs


def isa_b_regs(B, kind):
    k = B.shape[0]
    regs = np.zeros((32, k // 8), dtype=np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        regs[lane, 0] = word(B[2 * t, g], B[2 * t + 1, g], kind)
        if k == 16:
            regs[lane, 1] = word(B[2 * t + 8, g], B[2 * t + 9, g], kind)
    return regs


def isa_c_regs(C):
    regs = np.zeros((32, 4), dtype=np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        regs[lane] = C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]
    return regs


@jit
def _mma_kernel(a, b, c, d, which):
    lane = cuda.threadIdx.x
    if which == 0:
        d0, d1, d2, d3 = _mma.mma_m16n8k16_f16(a[lane, 0], a[lane, 1], a[lane, 2], a[lane, 3], b[lane, 0],
                                               b[lane, 1], c[lane, 0], c[lane, 1], c[lane, 2], c[lane, 3])
    elif which == 1:
        d0, d1, d2, d3 = _mma.mma_m16n8k16_bf16(a[lane, 0], a[lane, 1], a[lane, 2], a[lane, 3], b[lane, 0],
                                                b[lane, 1], c[lane, 0], c[lane, 1], c[lane, 2], c[lane, 3])
    else:
        d0, d1, d2, d3 = _mma.mma_m16n8k8_f16(a[lane, 0], a[lane, 1], b[lane, 0],
                                              c[lane, 0], c[lane, 1], c[lane, 2], c[lane, 3])
    d[lane, 0] = d0
    d[lane, 1] = d1
    d[lane, 2] = d2
    d[lane, 3] = d3


def run_mma(shape, a_regs, b_regs, c_regs):
    na, nb, _, _ = SHAPES[shape]
    a = np.zeros((32, 4), np.uint32)
    b = np.zeros((32, 2), np.uint32)
    a[:, :na], b[:, :nb] = a_regs, b_regs
    d = cuda.to_device(np.full((32, 4), np.nan, np.float32))
    _mma_kernel[1, 32](cuda.to_device(a), cuda.to_device(b), cuda.to_device(np.ascontiguousarray(c_regs)), d,
                       list(SHAPES).index(shape))
    return d.copy_to_host()


def small_ints(rng, shape, lo=-8, hi=8):
    return rng.integers(lo, hi + 1, size=shape).astype(np.float64)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mma_places_every_element_as_the_isa_says(shape, rng):
    """D = A B + C with A, B, C placed in the registers by the ISA's table: D read back by the same table
    equals the product exactly (small integers), so every element went in and came out of its register."""
    _, _, k, kind = SHAPES[shape]
    A, B, C = small_ints(rng, (16, k)), small_ints(rng, (k, 8)), small_ints(rng, (16, 8), -100, 100)
    d = run_mma(shape, isa_a_regs(A, kind), isa_b_regs(B, kind), isa_c_regs(C))
    D = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1] = d[lane]
    np.testing.assert_array_equal(D, A @ B + C)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mma_one_hot_elements(shape):
    """Each A element alone (all others 0, B = ones in one column): exactly one lane/register of D changes,
    the one the ISA names, so no two elements share a place."""
    _, _, k, kind = SHAPES[shape]
    for row, col in [(0, 0), (3, 5), (9, 2), (15, k - 1), (8, k // 2)]:
        A = np.zeros((16, k))
        A[row, col] = 3.0
        B = np.zeros((k, 8))
        B[col, 6] = 2.0
        d = run_mma(shape, isa_a_regs(A, kind), isa_b_regs(B, kind), np.zeros((32, 4), np.float32))
        lane, reg = 4 * (row % 8) + 3, 2 * (row // 8)  # D[row][6]: g = row % 8, 2t = 6, c0 (rows 0-7) / c2
        expected = np.zeros((32, 4), np.float32)
        expected[lane, reg] = 6.0
        np.testing.assert_array_equal(d, expected)


def test_mma_host_model_is_the_isa_table(rng):
    """The host model's fragment reader (used by the stand-ins and the GPU comparison) is the ISA's table."""
    for shape, (_, _, k, kind) in SHAPES.items():
        A, B = small_ints(rng, (16, k)), small_ints(rng, (k, 8))
        np.testing.assert_array_equal(_mma.fragment_a(isa_a_regs(A, kind), kind, k), A)
        np.testing.assert_array_equal(_mma.fragment_b(isa_b_regs(B, kind), kind, k), B)


def test_mma_rounds_operands_as_their_type(rng):
    """Operands are the 16-bit values: 1 + 2^-9 is 1 in bfloat16 but not in float16."""
    x = 1.0 + 2.0 ** -9
    for shape, (_, _, k, kind) in SHAPES.items():
        A = np.zeros((16, k))
        A[0, 0] = x
        B = np.zeros((k, 8))
        B[0, 0] = 1.0
        d = run_mma(shape, isa_a_regs(A, kind), isa_b_regs(B, kind), np.zeros((32, 4), np.float32))
        expected = np.float32(x) if kind == "f16" else np.float32(1.0)
        assert d[0, 0] == expected


# ---------------------------------------------------------------- ldmatrix
@jit
def _ldmatrix_kernel(words, rows, out, trans):
    s = cuda.shared.array(1024, np.uint16)
    lane = cuda.threadIdx.x
    for i in range(lane, 1024, 32):
        s[i] = words[i]
    cuda.syncthreads()
    if trans:
        r0, r1, r2, r3 = _mma.ldmatrix_x4_trans(s, rows[lane])
    else:
        r0, r1, r2, r3 = _mma.ldmatrix_x4(s, rows[lane])
    out[lane, 0] = r0
    out[lane, 1] = r1
    out[lane, 2] = r2
    out[lane, 3] = r3


@jit
def _ldmatrix_f16_kernel(values, rows, out):
    s = cuda.shared.array(1024, np.float16)
    lane = cuda.threadIdx.x
    for i in range(lane, 1024, 32):
        s[i] = values[i]
    cuda.syncthreads()
    r0, r1, r2, r3 = _mma.ldmatrix_x4(s, rows[lane])
    out[lane, 0] = r0
    out[lane, 1] = r1
    out[lane, 2] = r2
    out[lane, 3] = r3


def run_ldmatrix(words, rows, trans):
    out = cuda.to_device(np.zeros((32, 4), np.uint32))
    _ldmatrix_kernel[1, 32](cuda.to_device(words), cuda.to_device(rows.astype(np.uint32)), out, trans)
    return out.copy_to_host()


def isa_ldmatrix(words, rows, trans):
    """The ISA's ldmatrix: lanes 8i..8i+7 address matrix i's rows; lane l, register i gets row l/4, elements
    2(l%4), 2(l%4)+1 of matrix i (transposed: elements [2(l%4)][l/4] and [2(l%4)+1][l/4])."""
    M = [np.array([words[rows[8 * i + r]:rows[8 * i + r] + 8] for r in range(8)], dtype=np.uint32) for i in range(4)]
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            m = M[i].T if trans else M[i]
            out[lane, i] = m[g, 2 * t] | (m[g, 2 * t + 1] << 16)
    return out


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_any_row_addresses(trans, rng):
    words = rng.permutation(1024).astype(np.uint16) + np.uint16(1000)  # every word distinct
    rows = 8 * rng.choice(1024 // 8, size=32, replace=False)
    got = run_ldmatrix(words, rows, trans)
    np.testing.assert_array_equal(got, isa_ldmatrix(words, rows, trans))
    np.testing.assert_array_equal(got, _mma.warp_ldmatrix(words, rows, trans))


def test_ldmatrix_loads_the_mma_a_fragment(rng):
    """A 16 x 16 tile at row stride 24 (padded), lane l pointing at row l % 16, column 8 (l // 16): the four
    registers are a0..a3 of the m16n8k16 A fragment; in float16 storage as in uint16."""
    stride = 24
    A = small_ints(rng, (16, 16), -1000, 1000)
    values = np.zeros(1024, np.float16)
    for r in range(16):
        values[r * stride:r * stride + 16] = A[r]
    rows = np.array([(lane % 16) * stride + 8 * (lane // 16) for lane in range(32)], np.uint32)
    np.testing.assert_array_equal(run_ldmatrix(values.view(np.uint16), rows, False), isa_a_regs(A, "f16"))
    out = cuda.to_device(np.zeros((32, 4), np.uint32))
    _ldmatrix_f16_kernel[1, 32](cuda.to_device(values), cuda.to_device(rows), out)
    np.testing.assert_array_equal(out.copy_to_host(), isa_a_regs(A, "f16"))


def test_ldmatrix_trans_loads_the_b_fragment_of_a_row_major_tile(rng):
    """V (16 x 16, rows = k) stored row-major: .trans gives the B fragments of P V for columns 0-7 (r0, r1)
    and 8-15 (r2, r3) with lanes 0-15 on rows 0-15, column 0, and lanes 16-31 on rows 0-15, column 8."""
    stride = 16
    V = small_ints(rng, (16, 16), -1000, 1000)
    words = np.zeros(1024, np.uint16)
    for r in range(16):
        words[r * stride:r * stride + 16] = bits16(V[r], "f16")
    rows = np.array([(lane % 16) * stride + 8 * (lane // 16) for lane in range(32)], np.uint32)
    got = run_ldmatrix(words, rows, True)
    np.testing.assert_array_equal(got[:, 0:2], isa_b_regs(V[:, 0:8], "f16"))
    np.testing.assert_array_equal(got[:, 2:4], isa_b_regs(V[:, 8:16], "f16"))


# ---------------------------------------------------------------- packing
@jit
def _pack_kernel(x, out, back):
    i = cuda.grid(1)
    if i < x.shape[0]:
        lo, hi = x[i, 0], x[i, 1]
        p = _mma.pack_f16x2(lo, hi)
        q = _mma.pack_bf16x2(lo, hi)
        out[i, 0] = p
        out[i, 1] = q
        a, b = _mma.unpack_f16x2(p)
        c, e = _mma.unpack_bf16x2(q)
        back[i, 0] = a
        back[i, 1] = b
        back[i, 2] = c
        back[i, 3] = e


def pack_cases(rng):
    x = np.concatenate([rng.standard_normal(200).astype(np.float32) * 10,
                        np.float32([0.0, -0.0, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 65504.0, 65520.0, 1e-8,
                                    1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, np.inf, -np.inf, 3e38])])
    return np.ascontiguousarray(np.stack([x, rng.permutation(x)], axis=1))


def test_pack_and_unpack_round_to_nearest_even(rng):
    x = pack_cases(rng)
    out = cuda.to_device(np.zeros((len(x), 2), np.uint32))
    back = cuda.to_device(np.zeros((len(x), 4), np.float32))
    _pack_kernel[(len(x) + 31) // 32, 32](cuda.to_device(x), out, back)
    out, back = out.copy_to_host(), back.copy_to_host()
    with np.errstate(over="ignore"):
        lo16, hi16 = x[:, 0].astype(np.float16), x[:, 1].astype(np.float16)
    np.testing.assert_array_equal(out[:, 0] & 0xFFFF, lo16.view(np.uint16))
    np.testing.assert_array_equal(out[:, 0] >> 16, hi16.view(np.uint16))
    np.testing.assert_array_equal(out[:, 1] & 0xFFFF, to_bf16_bits(x[:, 0]))
    np.testing.assert_array_equal(out[:, 1] >> 16, to_bf16_bits(x[:, 1]))
    np.testing.assert_array_equal(back[:, 0], lo16.astype(np.float32))
    np.testing.assert_array_equal(back[:, 3], from_bf16_bits(to_bf16_bits(x[:, 1])))


def test_bf16_host_rounding():
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-8 ties up to 1 + 2^-6
    x = np.float32([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -1.0 - 2.0 ** -8, np.nan, np.inf, 3.4e38])
    np.testing.assert_array_equal(from_bf16_bits(to_bf16_bits(x))[:3], np.float32([1.0, 1.0 + 2.0 ** -6, -1.0]))
    assert np.isnan(from_bf16_bits(to_bf16_bits(x))[3])
    assert from_bf16_bits(to_bf16_bits(x))[4] == np.inf
    assert from_bf16_bits(to_bf16_bits(x))[5] == np.inf  # beyond bfloat16's largest finite value: rounds to inf


# ---------------------------------------------------------------- the GPU against the host model, bit for bit
@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gpu_mma_matches_the_host_model_bit_for_bit(shape, rng):
    na, nb, k, kind = SHAPES[shape]
    for _ in range(20):
        A, B, C = small_ints(rng, (16, k)), small_ints(rng, (k, 8)), small_ints(rng, (16, 8), -1000, 1000)
        a, b, c = isa_a_regs(A, kind), isa_b_regs(B, kind), isa_c_regs(C)
        got = run_mma(shape, a, b, c)
        np.testing.assert_array_equal(got.view(np.uint32), _mma.warp_mma(shape, a, b, c).view(np.uint32))
    # random 16-bit operands: the model's exact sum, rounded once, is within a few float32 ulps of the hardware's
    a = _mma.pack_host(rng.standard_normal((32, na)), rng.standard_normal((32, na)), kind)
    b = _mma.pack_host(rng.standard_normal((32, nb)), rng.standard_normal((32, nb)), kind)
    c = rng.standard_normal((32, 4)).astype(np.float32)
    got, model = run_mma(shape, a, b, c), _mma.warp_mma(shape, a, b, c)
    np.testing.assert_allclose(got, model, rtol=0, atol=1e-5 * (1 + np.abs(model).max()))


@pytest.mark.gpu
@pytest.mark.parametrize("trans", [False, True])
def test_gpu_ldmatrix_matches_the_host_model(trans, rng):
    for _ in range(10):
        words = rng.integers(0, 2 ** 16, size=1024, dtype=np.uint32).astype(np.uint16)
        rows = 8 * rng.choice(1024 // 8, size=32, replace=False)
        np.testing.assert_array_equal(run_ldmatrix(words, rows, trans), _mma.warp_ldmatrix(words, rows, trans))


# ---------------------------------------------------------------- 32-bit shared stores, paired float32 atomics
@jit
def _store32_kernel(words, out):
    sm = cuda.shared.array(64, np.uint16)
    lane = cuda.threadIdx.x
    _mma.store_32(sm, np.uint32(2 * lane), words[lane])
    cuda.syncthreads()
    out[2 * lane] = sm[2 * lane]
    out[2 * lane + 1] = sm[2 * lane + 1]


def test_store_32_puts_the_low_half_first(rng):
    words = rng.integers(0, 2 ** 32, size=32, dtype=np.uint64).astype(np.uint32)
    out = cuda.to_device(np.zeros(64, np.uint16))
    _store32_kernel[1, 32](cuda.to_device(words), out)
    np.testing.assert_array_equal(out.copy_to_host(), words.view(np.uint16))


@jit
def _red2_kernel(acc, x):
    i = cuda.grid(1)
    if i < x.shape[0]:
        _mma.red_add_f32x2(acc, np.uint64(2 * (i % 8)), x[i, 0], x[i, 1])


def test_red_add_f32x2_adds_both_words(rng):
    """64 threads add into 8 pairs (8 adds an element, small integers: exact in any order)."""
    from flash_numba.device import SIMULATOR, info

    if not SIMULATOR and tuple(info().compute_capability) < (9, 0):
        pytest.skip("red.global.add.v2.f32 needs cc >= 9.0")
    x = small_ints(rng, (64, 2), -100, 100).astype(np.float32)
    acc = cuda.to_device(np.ones((2, 8), np.float32))  # any float32 array: the index is its flat element
    _red2_kernel[2, 32](acc, cuda.to_device(x))
    want = 1 + np.stack([x[i::8] for i in range(8)]).sum(axis=1)  # pair i gets threads i, i + 8, ...
    np.testing.assert_array_equal(acc.copy_to_host().reshape(8, 2), want)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mma_entry_is_the_same_with_the_operands_swapped(shape, rng):
    """D = A B and D' = B^T A^T (A's rows and B's columns swapping roles) agree bit for bit with random half
    inputs: what flash2_tc's dK/dV kernel relies on to compute S^T = K Q^T bit-identical to the forward's
    S = Q K^T.  In the simulator the host model's; on a GPU (the ``gpu`` run of this file) the tensor core's."""
    na, nb, k, kind = SHAPES[shape]
    A = rng.standard_normal((16, k))
    B = rng.standard_normal((k, 16))
    zero = np.zeros((32, 4), np.float32)

    def product(X, Y):  # (16 x k) (k x 16) on two n8 tiles, float32 16 x 16
        out = np.zeros((16, 16), np.float32)
        for n in range(2):
            d = run_mma(shape, isa_a_regs(X, kind), isa_b_regs(Y[:, 8 * n:8 * n + 8], kind), zero)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                out[g, 8 * n + 2 * t], out[g, 8 * n + 2 * t + 1] = d[lane, 0], d[lane, 1]
                out[g + 8, 8 * n + 2 * t], out[g + 8, 8 * n + 2 * t + 1] = d[lane, 2], d[lane, 3]
        return out

    np.testing.assert_array_equal(product(A, B).view(np.uint32), product(B.T, A.T).T.view(np.uint32))


def test_cp_async_with_an_l2_prefetch_size_takes_the_isas_sizes():
    for size in (64, 128, 256):
        assert _mma.cp_async_16_l2(size) is _mma.cp_async_16_l2(size)  # one intrinsic a size
    assert _mma.cp_async_16_l2(0) is _mma.cp_async_16
    for bad in (16, 32, 512, -128):
        with pytest.raises(ValueError, match="prefetch"):
            _mma.cp_async_16_l2(bad)
