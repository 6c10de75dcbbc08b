"""Lessons 13 (tensor cores) and 14 (decoding): every checker passes its solution and fails, naming the
mistake, on the classic wrong answers."""

import numpy as np
import pytest
from numba import cuda, float32
from numba.types import float16

from flash_numba.course import decoding, tensor_cores
from flash_numba.course import exercises as ex
from flash_numba.course.tensor_cores import mma_m16n8k16_f16, pack_f16x2
from flash_numba.device import SIMULATOR


def _verdict(capsys, name, answer):
    ok = ex.check(name, answer)
    return ok, capsys.readouterr().out


# ----------------------------------------------------------------------------- mma_tile: wrong kernels


def _tile_kernel(mistake=None):
    """The tile product with one classic mistake (None: right)."""

    @cuda.jit
    def tile_product(A, B, C):
        As = cuda.shared.array(256, float16)
        Bs = cuda.shared.array(256, float16)
        lane = cuda.threadIdx.x
        for e in range(8):
            i = 8 * lane + e
            As[i] = A[i // 16, i % 16]
            Bs[i] = B[i // 16, i % 16]
        if mistake != "no barrier":
            cuda.syncthreads()
        g = lane >> 2
        t = lane % 4

        def a_at(r, k):
            if mistake == "A transposed":
                r, k = k, r
            return float32(As[16 * r + k])

        def pair_a(r, k):
            lo, hi = a_at(r, k), a_at(r, k + 1)
            return pack_f16x2(hi, lo) if mistake == "A halves swapped" else pack_f16x2(lo, hi)

        a0, a1, a2, a3 = pair_a(g, 2 * t), pair_a(g + 8, 2 * t), pair_a(g, 2 * t + 8), pair_a(g + 8, 2 * t + 8)
        if mistake == "a1 a2 swapped":
            a1, a2 = a2, a1
        for n in range(1 if mistake == "one product" else 2):
            n0 = 0 if mistake == "same tile" else 8 * n
            if mistake == "B transposed":
                b0 = pack_f16x2(float32(Bs[16 * g + n0 + 2 * t]), float32(Bs[16 * g + n0 + 2 * t + 1]))
                b1 = pack_f16x2(float32(Bs[16 * (g + 8) + n0 + 2 * t]), float32(Bs[16 * (g + 8) + n0 + 2 * t + 1]))
            else:
                b0 = pack_f16x2(float32(Bs[16 * (2 * t) + n0 + g]), float32(Bs[16 * (2 * t + 1) + n0 + g]))
                b1 = pack_f16x2(float32(Bs[16 * (2 * t + 8) + n0 + g]), float32(Bs[16 * (2 * t + 9) + n0 + g]))
            z = float32(0)
            c0, c1, c2, c3 = mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, z, z, z, z)
            lo_row, hi_row = (g + 8, g) if mistake == "c rows swapped" else (g, g + 8)
            C[lo_row, 8 * n + 2 * t] = c0
            C[lo_row, 8 * n + 2 * t + 1] = c1
            C[hi_row, 8 * n + 2 * t] = c2
            C[hi_row, 8 * n + 2 * t + 1] = c3

    return tile_product


@pytest.fixture(scope="module", autouse=True)
def _simulator_only():
    if not SIMULATOR:
        pytest.skip("the fragment map is read from the simulator's stand-ins")


def test_the_right_kernel_passes(capsys):
    ok, out = _verdict(capsys, "mma_tile", _tile_kernel())
    assert ok, out
    assert ex.check_solution("mma_tile")


@pytest.mark.parametrize("mistake, named", [
    ("B transposed", "you transposed B's fragment"),
    ("A transposed", "you transposed A's fragment"),
    ("a1 a2 swapped", "you swapped a1 and a2"),
    ("A halves swapped", "you swapped the halves of A's registers"),
    ("same tile", "the second product needs B's columns 8..15"),
    ("one product", "one m16n8k16 computes a 16 x 8 block of C"),
    ("c rows swapped", "c2, c3 = C[g+8][2t]"),
    ("no barrier", "cuda.syncthreads()"),
])
def test_a_wrong_kernel_is_named(capsys, mistake, named):
    ok, out = _verdict(capsys, "mma_tile", _tile_kernel(mistake))
    assert not ok and named in out, out


def test_a_product_without_the_instruction_is_refused(capsys):
    @cuda.jit
    def fma_product(A, B, C):
        lane = cuda.threadIdx.x
        for e in range(8):
            i = 8 * lane + e
            acc = float32(0)
            for k in range(16):
                acc += float32(A[i // 16, k]) * float32(B[k, i % 16])
            C[i // 16, i % 16] = acc

    ok, out = _verdict(capsys, "mma_tile", fma_product)
    assert not ok and "no call of mma_m16n8k16_f16" in out, out


def test_an_instruction_called_by_half_the_warp_is_named(capsys):
    @cuda.jit
    def half_warp(A, B, C):
        lane = cuda.threadIdx.x
        if lane < 16:
            z = float32(0)
            c0, c1, c2, c3 = mma_m16n8k16_f16(0, 0, 0, 0, 0, 0, z, z, z, z)
            C[0, lane] = c0

    ok, out = _verdict(capsys, "mma_tile", half_warp)
    assert not ok and "all 32 lanes of the warp call it together" in out, out


def test_a_kernel_not_written_yet_is_not_done(capsys):
    @cuda.jit
    def stub(A, B, C):
        raise NotImplementedError

    ok, out = _verdict(capsys, "mma_tile", stub)
    assert not ok and "not done yet" in out


# ----------------------------------------------------------------------------- p_in_registers


@pytest.mark.parametrize("wrong, named", [
    (lambda lo, hi: ((lo[0], lo[1]), (hi[0], hi[1]), (lo[2], lo[3]), (hi[2], hi[3])), "you swapped a1 and a2"),
    (lambda lo, hi: ((lo[1], lo[0]), (lo[3], lo[2]), (hi[1], hi[0]), (hi[3], hi[2])), "you swapped lo and hi"),
    (lambda lo, hi: ((hi[0], hi[1]), (hi[2], hi[3]), (lo[0], lo[1]), (lo[2], lo[3])), "you swapped the two products"),
])
def test_p_in_registers_names_the_mistake(capsys, wrong, named):
    ok, out = _verdict(capsys, "p_in_registers", wrong)
    assert not ok and named in out, out


def test_the_fragment_map_matches_the_instruction():
    """fragment_of (the figure's labels) against the stand-in's host model, element by element."""
    from flash_numba.kernels._mma import _maps

    a_rows, a_cols, b_rows, b_cols, c_rows, c_cols = _maps(16)
    for lane in range(32):
        for r in range(4):
            for h in range(2):
                assert tensor_cores.fragment_of("A", a_rows[lane, r, h], a_cols[lane, r, h]) == (
                    lane, f"a{r}", ("lo", "hi")[h])
        for r in range(2):
            for h in range(2):
                assert tensor_cores.fragment_of("B", b_rows[lane, r, h], b_cols[lane, r, h]) == (
                    lane, f"b{r}", ("lo", "hi")[h])
        for r in range(4):
            assert tensor_cores.fragment_of("C", c_rows[lane, r], c_cols[lane, r]) == (lane, f"c{r}", "")


# ----------------------------------------------------------------------------- merge_splits


def _merge(kind):
    def f(O, M, L):
        m = M.max()
        if m == -np.inf:
            return np.zeros(O.shape[1]), -np.inf
        a = np.exp(M - m)
        l = (a * L).sum()
        if kind == "no rescale O":
            return O.sum(0) / l, m + np.log(l)
        if kind == "max of l":
            return (a[:, None] * O).sum(0) / L.max(), m + np.log(L.max())
        if kind == "no rescale l":
            return (a[:, None] * O).sum(0) / L.sum(), m + np.log(L.sum())
        if kind == "no divide":
            return (a[:, None] * O).sum(0), m + np.log(l)
        if kind == "lse without m":
            return (a[:, None] * O).sum(0) / l, np.log(l)
        raise AssertionError(kind)

    return f


@pytest.mark.parametrize("kind, named", [
    ("no rescale O", "you did not rescale O_s"),
    ("max of l", "you took the maximum of l_s"),
    ("no rescale l", "you did not rescale l_s"),
    ("no divide", "you did not divide by l"),
    ("lse without m", "lse = m + log(l)"),
])
def test_merge_splits_names_the_mistake(capsys, kind, named):
    ok, out = _verdict(capsys, "merge_splits", _merge(kind))
    assert not ok and named in out, out


def test_merge_without_the_empty_guard_gives_nan_and_is_told_why(capsys):
    def no_guard(O, M, L):
        m = M.max()
        a = np.exp(M - m)
        return (a[:, None] * O).sum(0) / (a * L).sum(), m + np.log((a * L).sum())

    ok, out = _verdict(capsys, "merge_splits", no_guard)
    assert not ok and "no key at all" in out and "yours has NaN" in out, out


def test_merge_splits_solution_passes():
    assert ex.check_solution("merge_splits")


# ----------------------------------------------------------------------------- decode_bytes


@pytest.mark.parametrize("wrong, named", [
    (lambda B, Hq, Hkv, L, d, s: (2 * B * Hq * L * d * s + 2 * B * Hq * d * s + 4 * B * Hq, 4 * B * Hq * L * d),
     "once per query head"),
    (lambda B, Hq, Hkv, L, d, s: (B * Hkv * L * d * s + 2 * B * Hq * d * s + 4 * B * Hq, 4 * B * Hq * L * d),
     "you counted K only"),
    (lambda B, Hq, Hkv, L, d, s: (2 * B * Hkv * L * d + 2 * B * Hq * d, 4 * B * Hq * L * d), "elements, not bytes"),
    (lambda B, Hq, Hkv, L, d, s: (2 * B * Hkv * L * d * s + 2 * B * Hq * d * s, 4 * B * Hq * L * d),
     "left out the lse"),
    (lambda B, Hq, Hkv, L, d, s: decoding.decode_bytes_solution(B, Hq, Hkv, L, d, s)[:1] + (2 * B * Hq * L * d,),
     "your FLOPs count one product"),
])
def test_decode_bytes_names_the_mistake(capsys, wrong, named):
    ok, out = _verdict(capsys, "decode_bytes", wrong)
    assert not ok and named in out, out


def test_decode_bytes_equal_what_the_kernel_counts():
    """The exercise's count plus the metadata terms is what attention_decode counts in the simulator."""
    from flash_numba import attention_decode

    rng = np.random.default_rng(0)
    B, Hq, Hkv, L, d = 2, 4, 2, 21, 8
    q = rng.standard_normal((B, Hq, 1, d)).astype(np.float32)
    k, v = (rng.standard_normal((B, Hkv, L, d)).astype(np.float32) for _ in range(2))
    res = attention_decode(q, k, v, num_splits=1, count_hbm=True)
    nbytes, _ = decoding.decode_bytes_solution(B, Hq, Hkv, L, d, 4)
    assert res.hbm.total == nbytes + res.hbm.terms["lengths"]


def test_a_wave_never_holds_more_than_the_resident_blocks():
    per = decoding.wave(1000, 132, 4)
    assert per.max() == 4 and per.sum() == 528
    assert (decoding.wave(64, 132, 4) == 0).sum() == 68
