"""flash2_fast: the register-tiled flash2 forward, against the float64 reference.

Simulator tests use the smallest micro-tile (Br = 8, Bc = 16) or (16, 32) so that
tiles are partial; the GPU tier uses the blocks the kernel chooses itself.
"""

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import _switches, blocks, iomodel, reference
from conftest import FULL
from flash_numba.kernels import flash2_fast

ON_GPU = not fn.device.SIMULATOR


def _qkv(rng, lead, Nq, Nk, d, dtype):
    return tuple(rng.standard_normal(lead + (n, d)).astype(dtype) for n in (Nq, Nk, Nk))


def _check_forward(res, q, k, v, causal, tol):
    o, lse = reference.attention_forward(q, k, v, causal=causal)
    assert not np.isnan(res.o).any(), "an output element was never written"
    err = np.abs(res.o.astype(np.float64) - o).max() / max(np.abs(o).max(), 1e-30)
    assert err < tol, err
    assert np.array_equal(np.isneginf(res.lse), np.isneginf(lse))
    fin = np.isfinite(lse)
    assert np.abs(res.lse[fin] - lse[fin]).max() < tol * max(1.0, np.abs(lse[fin]).max())


@pytest.mark.parametrize(
    "lead, Nq, Nk, d, causal, block",
    [  # its own micro-tile geometry (every kernel's checks: tests/test_kernels.py)
        ((), 9, 40, 18, True, (16, 32)),  # Nq < Nk, d > 16: two column groups
        ((), 9, 20, 120, True, (8, 16)),  # TD = 8: O's columns in two quads 64 apart, the last one partial
    ],
)
def test_forward_float32(rng, lead, Nq, Nk, d, causal, block):
    q, k, v = _qkv(rng, lead, Nq, Nk, d, np.float32)
    res = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast", block=block)
    _check_forward(res, q, k, v, causal, 2e-6)


def test_backward_falls_back_to_flash2_for_other_blocks(rng):
    q, k, v = _qkv(rng, (), 11, 13, 4, np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.flash_attention_forward(q, k, v, kernel="flash2_fast", block=(8, 16))
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", block=(8, 12), count_hbm=True)
    assert "dQ" in b.hbm.per_kernel  # flash2's kernel names: (8, 12) is not a micro-tile shape
    dq, dk, dv = reference.attention_backward(q, k, v, f.o, f.lse, do)
    for ours, ref in ((b.dq, dq), (b.dk, dk), (b.dv, dv)):
        assert np.abs(ours - ref).max() < 1e-5 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("d, dtype, budget, want", [
    (64, np.float32, 227 * 1024, (32, 64)),  # an H200: 64 keys a block, dynamic shared memory
    (64, np.float16, 227 * 1024, (32, 64)),  # float16 tiles hold float32
    (32, np.float32, 227 * 1024, (32, 64)),  # d = 32: static tiles (44 KB)
    (32, np.float32, 48 * 1024, None),  # but not where blocks stop at 48 KB (a T4: unmeasured, half the blocks an SM)
    (64, np.float32, 48 * 1024, None),  # a T4: the tiles do not fit, the deterministic block
    (64, np.float64, 227 * 1024, None),  # float64 stays within 48 KB
    (128, np.float32, 227 * 1024, None),  # measured at d = 64 only
])
def test_the_atomic_backward_chooses_its_own_block(d, dtype, budget, want):
    want = want or flash2_fast.choose_block(d, dtype, budget, "backward")
    assert flash2_fast.choose_atomic_block(d, dtype, budget) == want
    assert flash2_fast.SPEC.block(d, dtype, "backward", budget=budget, deterministic=False) == want
    assert flash2_fast.SPEC.block(d, dtype, "forward", budget=budget, deterministic=False) == \
        flash2_fast.choose_block(d, dtype, budget)  # the option is the backward's
    assert flash2_fast.SPEC.block(64, dtype, "backward", block=(16, 16), budget=budget, deterministic=False) == (16, 16)
    here = blocks.dynamic_budget()
    assert fn.resolve_block("flash2_fast", d, dtype, pass_="backward", deterministic=False) == \
        flash2_fast.choose_atomic_block(d, dtype, here)
    with pytest.raises(TypeError, match="deterministic"):
        fn.resolve_block("flash2_fast", d, dtype, pass_="backward", deterministic=None)


def test_block_choice_fits_and_validates():
    for d in (16, 32, 64, 80, 128):
        for dt in (np.float16, np.float32, np.float64):
            Br, Bc = fn.resolve_block("flash2_fast", d, dt)
            assert Br % 8 == 0 and Bc % 16 == 0
            assert flash2_fast.shared_bytes(Br, Bc, d, dt) <= blocks.dynamic_budget()  # 48 KB below cc 9.0
    assert flash2_fast.choose_block(64, np.float32, 48 * 1024) == (64, 32)
    with pytest.raises(ValueError, match="block"):
        fn.resolve_block("flash2_fast", 64, np.float32, block=(12, 16))  # Br not a multiple of 8


@pytest.mark.gpu
@pytest.mark.parametrize("N", [1, 17, 64, 97, 128, 1000, 1025])
@pytest.mark.parametrize("d", [16, 32, 64, 80, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_forward_real_sizes(rng, N, d, causal):
    q, k, v = _qkv(rng, (2, 2), N, N + 7, d, np.float32)
    res = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
    _check_forward(res, q, k, v, causal, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("Nq, Nk", [(1000, 777), (97, 1025)])
def test_gpu_forward_dtypes(rng, dtype, Nq, Nk):
    q, k, v = _qkv(rng, (3,), Nq, Nk, 64, dtype)
    res = fn.flash_attention_forward(q, k, v, causal=True, kernel="flash2_fast")
    o, _ = reference.attention_forward(q, k, v, causal=True)
    ours = np.abs(res.o.astype(np.float64) - o).max()
    if dtype == np.float64:
        assert ours < 1e-12
    else:
        plain = np.abs(reference.plain_attention(q, k, v, causal=True, dtype=np.float16).astype(np.float64) - o).max()
        assert ours <= 3 * plain + 1e-4, (ours, plain)


@pytest.mark.gpu
def test_gpu_counts_equal_model(rng):
    q, k, v = _qkv(rng, (4,), 1000, 1025, 64, np.float32)
    for causal in (False, True):
        res = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast", count_hbm=True)
        assert res.hbm == iomodel.forward("flash2_fast", 4, 1000, 1025, 64, np.float32, causal, res.block)


TWO_PASS_NAMES = ["flash2_fast dQ", "flash2_fast dK, dV"]  # the dQ kernel computes D itself
SPLIT_NAMES = ["D = rowsum(dO*O)", "flash2_fast zero dQ copies", "flash2_fast dK, dV, dQ (split)",
               "flash2_fast sum dQ copies"]


COUNTED_SHAPES = [(17, 23, 5, (16, 16)), (33, 20, 16, (32, 16)), (9, 47, 3, (16, 32))]
#: (copies, causal, shape): 0 copies is the two-pass backward, else the split one.  make test runs each copies value
#: once, causal and not in turn, the shapes in turn (every copies value, causal or not, every shape); make test-all
#: all 24
COUNTED_CASES = [pytest.param(copies, causal, *shape, id="-".join(map(str, (*shape[:3], f"block{i}", causal, copies))),
                              marks=() if copies % 3 == i and causal == bool(copies % 2) else FULL)
                 for i, shape in enumerate(COUNTED_SHAPES) for causal in (False, True) for copies in (0, 1, 2, 3)]


@pytest.mark.parametrize("copies, causal, Nq, Nk, d, block", COUNTED_CASES)
def test_backward_hbm_counted_equals_model(rng, monkeypatch, copies, causal, Nq, Nk, d, block):
    """Both deterministic backwards, the split one with 1-3 copies of dQ: S blocks per head run ceil(Tc / S)
    rounds of key tiles (Nk = 47 at Bc = 16: 3 tiles; 1 copy: 3 rounds, 2 copies: the second round reversed and
    short, 3 copies: one round)."""
    monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", copies)
    q, k, v = _qkv(rng, (2,), Nq, Nk, d, np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast", block=(8, 16))
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", block=block,
                                    count_hbm=True)
    assert list(b.hbm.per_kernel) == (SPLIT_NAMES if copies else TWO_PASS_NAMES)
    assert b.hbm == iomodel.backward("flash2_fast", 2, Nq, Nk, d, np.float32, causal, block)
    dq, dk, dv = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=causal)
    for ours, ref in ((b.dq, dq), (b.dk, dk), (b.dv, dv)):
        assert not np.isnan(ours).any()
        assert np.abs(ours - ref).max() < 2e-6 * max(1.0, np.abs(ref).max())
    if copies:  # dK, dV: the atomic kernel's code, the same sums in the same order
        a = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", block=block,
                                        deterministic=False)
        assert np.array_equal(a.dk, b.dk) and np.array_equal(a.dv, b.dv)


@pytest.mark.parametrize("dtype", [np.float16, pytest.param(np.float64, marks=FULL)])
def test_split_backward_dtypes(rng, monkeypatch, dtype):
    """float16: the copies are float32, summed, then rounded once; float64 throughout."""
    monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", 2)
    q, k, v = _qkv(rng, (2,), 19, 37, 16, dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    f = fn.flash_attention_forward(q, k, v, causal=True, kernel="flash2_fast", block=(8, 16))
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=True, kernel="flash2_fast", block=(16, 16),
                                    count_hbm=True)
    assert list(b.hbm.per_kernel) == SPLIT_NAMES
    assert b.hbm == iomodel.backward("flash2_fast", 2, 19, 37, 16, dtype, True, (16, 16))
    monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", 0)
    two = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=True, kernel="flash2_fast", block=(16, 16))
    ref = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=True)
    for ours, other, r in zip((b.dq, b.dk, b.dv), (two.dq, two.dk, two.dv), ref):
        assert ours.dtype == dtype and not np.isnan(ours).any()
        err = np.abs(ours.astype(np.float64) - r).max()
        if dtype == np.float64:
            assert err < 1e-12 * max(1.0, np.abs(r).max())
        else:  # Dao-AILab's rule against the two-pass backward's error
            assert err <= 2 * np.abs(other.astype(np.float64) - r).max() + 1e-3, err


def test_dq_copies_rule():
    """The fewest copies that keep the GPU's block slots busiest, the two-pass backward where none does."""
    from flash_numba.kernels.flash2_fast.layout import DQ_COPIES_LIMIT, dq_copies

    MB = 1 << 20
    # H200 at d = 64: 132 SMs x 4 blocks; 32 heads, N = 4096 at Bc = 32: 16 copies, 512 blocks of 8 tiles
    assert dq_copies(32, 128, 32 * MB, 528) == 16
    assert dq_copies(32, 32, 8 * MB, 528) == 16  # N = 1024: 2 tiles a block
    assert dq_copies(1024, 32, 256 * MB, 528) == 1  # the paper's B = 64, H = 16: a block per head, 2 waves
    assert dq_copies(32, 4, MB, 528) == 0  # N = 128: 128 blocks for 528 slots, two-pass
    assert dq_copies(1, 2048, 16 * MB, 528) == 0  # one head, N = 65536: 64 copies fit 1 GiB, 64 blocks
    assert dq_copies(32, 128, DQ_COPIES_LIMIT // 8, 528) == 0  # 8 copies at most: 256 blocks, half the slots


@pytest.mark.parametrize("d, copies", [(64, 16), (80, 12), (96, 16), (128, 12)])
def test_split_copies_on_an_h200_are_the_measured_best(d, copies):
    """The copies an H200 (132 SMs, 228 KB a SM, cc 9.0) gets at B*H = 32, N = 4096: at d = 80, 96 and 128 those
    forced copies measured fastest (2026-12-01, benchmarks/results/h200-2026-12-01-s11/E/copies.txt: 12 against 16 at
    d = 80, 16 against 12 at d = 96; h200-2026-12-01-s13/F/copies.txt: at d = 128, three
    blocks an SM since P and dS share a tile, 12 copies 23.35 ms against 8's 25.33 and 16's 36.90)."""
    from flash_numba.kernels.flash2_fast import layout

    block = layout.choose_block(d, np.float32, 227 * 1024, "backward")
    per_sm = layout.kvq_blocks_per_sm(*block, d, np.float32, (9, 0), 228 * 1024)
    assert layout.dq_copies(32, -(-4096 // block[1]), 32 * 4096 * d * 4, 132 * per_sm) == copies


def test_p_and_ds_share_a_tile_from_td_8_and_d_128_fits_three_blocks_on_an_h200():
    """At d = 128 the dK/dV kernel keeps P and dS in one tile: 4,608 bytes less a block, three blocks in 228 KB."""
    from flash_numba.kernels.flash2_fast import layout

    for d, share in ((64, False), (112, False), (113, True), (128, True)):
        g = layout.geometry_kv(d, 4, 2, np.float32)
        assert g["share_p_ds"] is share and len(g["tiles"]) == (7 if share else 8)
    assert layout.backward_smem(32, 32, 128, np.float32) == 75520  # 80,128 with two tiles
    assert layout.kvq_blocks_per_sm(32, 32, 128, np.float32, (9, 0), 228 * 1024) == 3


def test_p_ds_tiles_switches_the_tiles_and_restores_them(rng):
    """Lesson 10 times the two builds: within ``p_ds_tiles(share)`` every head dim has one tile or two, and the
    kernels built there are not the ones used after."""
    import importlib

    from flash_numba.kernels.flash2_fast import layout

    # flash2_fast.backward is the pass's function: the kernels' module by its full name
    backward = importlib.import_module("flash_numba.kernels.flash2_fast.backward")
    q, k, v = _qkv(rng, (), 9, 20, 16, np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.flash_attention_forward(q, k, v, kernel="flash2_fast", block=(8, 16))
    ref = reference.attention_backward(q, k, v, f.o, f.lse, do)
    built = {}
    for share in (True, False):
        with layout.p_ds_tiles(share):
            assert layout.geometry_kv(16, 2, 1, np.float32)["share_p_ds"] is share
            assert layout.geometry_kv(128, 4, 2, np.float32)["share_p_ds"] is share
            b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", block=(16, 16),
                                            deterministic=False)
            built[share] = backward.dkdv_kernel(16, 2, 1, "float32", False, False, None, atomic_dq=True)
            for ours, r in zip((b.dq, b.dk, b.dv), ref):
                assert np.abs(ours - r).max() < 2e-6 * max(1.0, np.abs(r).max())
    assert built[True][1]["share_p_ds"] and not built[False][1]["share_p_ds"]
    assert not layout.geometry_kv(16, 2, 1, np.float32)["share_p_ds"] and layout.SHARE_P_DS_MIN_TD == 8
    assert not backward.dkdv_kernel(16, 2, 1, "float32", False, False, None, atomic_dq=True)[1]["share_p_ds"]


def test_split_s_dp_rule():
    """S^T and dP^T in separate warps where the build has more than 128 registers and Br >= 32 (TN >= 2)."""
    from flash_numba.kernels.flash2_fast import layout

    assert layout.split_s_dp(2, None) and layout.split_s_dp(2, 168) and layout.split_s_dp(4, None)
    assert not layout.split_s_dp(2, 128) and not layout.split_s_dp(1, None) and not layout.split_s_dp(1, 168)
    with layout.s_dp_split(True):
        assert layout.split_s_dp(1, 128)
    with layout.s_dp_split(False):
        assert not layout.split_s_dp(2, None)
    assert _switches.FORCE_SPLIT_S_DP is None
    # dV, dK split too where S^T, dP^T are, P and dS have a tile each, and 2 TD columns come in quads
    assert layout.split_dv_dk(True, False, 4) and layout.split_dv_dk(True, False, 2)
    assert not layout.split_dv_dk(False, False, 4) and not layout.split_dv_dk(True, True, 8)
    assert not layout.split_dv_dk(True, False, 5)  # d = 80


@pytest.mark.parametrize("d, causal, p, share", [pytest.param(32, False, 0.0, False, marks=FULL),
                                                 pytest.param(32, True, 0.25, False, marks=FULL), (40, True, 0.0, True),
                                                 pytest.param(40, False, 0.25, True, marks=FULL)])
@pytest.mark.slow
def test_s_and_dp_split_across_warps_is_bit_for_bit_the_unsplit_backward(rng, monkeypatch, d, causal, p, share):
    """Split or not, each dS, P and product is the same arithmetic in the same order: the deterministic backward's
    outputs are the same bits (split dQ copies and two-pass), and the atomic one's dK, dV; with dropout (P handed
    over undropped, Zs P written back), causal masks, and P, dS in one tile (``share``, as from d = 113 on).  At
    d = 32 with two tiles, dV and dK are split across warps too (layout.split_dv_dk)."""
    from flash_numba.kernels.flash2_fast import layout

    q, k, v = _qkv(rng, (), 33, 33, d, np.float32)  # two query blocks of 32, three key tiles of 16 (the last 1 row)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.attention_forward(q, k, v, causal=causal, kernel="flash2_fast", block=(8, 16), dropout_p=p)
    kw = dict(causal=causal, kernel="flash2_fast", block=(32, 16), dropout_p=p, dropout_seed=f.dropout_seed)
    out = {}
    for split in (True, False):
        with layout.p_ds_tiles(share), layout.s_dp_split(split):
            for copies in (2, 0):
                monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", copies)
                out[split, copies] = fn.attention_backward(q, k, v, f.o, f.lse, do, count_hbm=True, **kw)
            monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", None)
            out[split, "atomic"] = fn.attention_backward(q, k, v, f.o, f.lse, do, deterministic=False, **kw)
    for mode in (2, 0):
        for name in ("dq", "dk", "dv"):
            assert np.array_equal(getattr(out[True, mode], name), getattr(out[False, mode], name)), (mode, name)
        assert out[True, mode].hbm == out[False, mode].hbm  # the bytes counted: each thread stores its own half
    assert np.array_equal(out[True, "atomic"].dk, out[False, 2].dk)
    assert np.array_equal(out[True, "atomic"].dv, out[False, 2].dv)
    if p == 0:
        ref = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=causal)
        for ours, r in zip((out[True, 2].dq, out[True, 2].dk, out[True, 2].dv), ref):
            assert np.abs(ours - r).max() < 2e-6 * max(1.0, np.abs(r).max())


def test_dq_lane_groups_rule():
    """Two groups of 16 lanes for dQ where they load less per useful multiply-add: d = 32, 64, 80 (RW = 8), not
    d = 128 (a tie), d = 96's 16-row steps (RW = 4) or builds both causal and with dropout."""
    from flash_numba.kernels.flash2_fast import layout

    assert [layout.dq_lane_groups(8, DP) for DP in (32, 48, 64, 80, 128)] == [2, 2, 2, 2, 1]
    assert layout.dq_lane_groups(4, 96) == 1 and layout.dq_lane_groups(16, 64) == 2
    assert layout.dq_lane_groups(8, 64, causal_dropout=True) == 1  # ptxas spilled there under the caps
    with layout.dq_lanes(1):
        assert layout.dq_lane_groups(8, 64) == 1
    assert _switches.FORCE_DQ_LANE_GROUPS is None


@pytest.mark.parametrize("d, causal, share", [(40, True, False), pytest.param(72, False, True, marks=FULL)])
@pytest.mark.slow
def test_dq_in_two_lane_groups_is_bit_for_bit_one_group(rng, monkeypatch, d, causal, share):
    """dQ_i += dS_ij K_j with a warp's lanes as one group (8 rows x 2 columns a lane at d = 40, the second for half
    the lanes) or two (4 x 3): each dQ element the same sum in the same order, so the split backward's copies of dQ
    hold the same bits, and dK, dV and the bytes counted are unchanged; d = 40 and 72 have columns past d (48 and 80
    a row), d = 72 P and dS in one tile; the atomic path's dQ against float64.  (At d = 32 and 64 every other test
    runs two groups, the rule's.)"""
    from flash_numba.kernels.flash2_fast import layout

    q, k, v = _qkv(rng, (), 33, 33, d, np.float32)  # two query blocks of 32, three key tiles of 16 (the last 1 row)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.attention_forward(q, k, v, causal=causal, kernel="flash2_fast", block=(8, 16))
    kw = dict(causal=causal, kernel="flash2_fast", block=(32, 16))
    ref = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=causal)
    out = {}
    monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", 2)
    for groups in (1, 2):
        with layout.p_ds_tiles(share), layout.dq_lanes(groups):
            out[groups] = fn.attention_backward(q, k, v, f.o, f.lse, do, count_hbm=True, **kw)
            atomic = fn.attention_backward(q, k, v, f.o, f.lse, do, deterministic=False, **kw)
        assert np.abs(atomic.dq - ref[0]).max() < 2e-6 * max(1.0, np.abs(ref[0]).max()), groups
    for name in ("dq", "dk", "dv"):
        assert np.array_equal(getattr(out[1], name), getattr(out[2], name)), name
    assert out[1].hbm == out[2].hbm
    assert np.abs(out[2].dq - ref[0]).max() < 2e-6 * max(1.0, np.abs(ref[0]).max())


@pytest.mark.parametrize("dtype", [np.float16, pytest.param(np.float64, marks=FULL)])
def test_s_and_dp_split_across_warps_in_other_dtypes(rng, dtype):
    """float16 storage (float32 sums) and float64: split or not, the same bits; float64 close to the reference."""
    from flash_numba.kernels.flash2_fast import layout

    q, k, v = _qkv(rng, (), 37, 45, 32, dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    f = fn.attention_forward(q, k, v, causal=True, kernel="flash2_fast", block=(8, 16))
    out = {}
    for split in (True, False):
        with layout.s_dp_split(split):
            out[split] = fn.attention_backward(q, k, v, f.o, f.lse, do, causal=True, kernel="flash2_fast",
                                               block=(32, 16))
    for name in ("dq", "dk", "dv"):
        assert np.array_equal(getattr(out[True], name), getattr(out[False], name)), name
    if dtype == np.float64:
        ref = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=True)
        for ours, r in zip((out[True].dq, out[True].dk, out[True].dv), ref):
            assert np.abs(ours - r).max() < 1e-12 * max(1.0, np.abs(r).max())


@pytest.mark.parametrize("causal, copies", [  # 0 copies: the two-pass backward; 2: the split one
    pytest.param(causal, copies, id=f"{causal}-{copies}", marks=() if causal == bool(copies) else FULL)
    for causal in (False, True) for copies in (0, 2)])
def test_deterministic_backward_with_p_and_ds_in_one_tile(rng, monkeypatch, copies, causal):
    """TD = 8 (d = 120: two quads of columns 64 apart, the last partial): P, then dS, in one shared tile."""
    monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", copies)
    q, k, v = _qkv(rng, (), 9, 40, 120, np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast", block=(8, 16))
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", block=(16, 16),
                                    count_hbm=True)
    assert list(b.hbm.per_kernel) == (SPLIT_NAMES if copies else TWO_PASS_NAMES)
    ref = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=causal)
    for ours, r in zip((b.dq, b.dk, b.dv), ref):
        assert np.abs(ours - r).max() < 2e-6 * max(1.0, np.abs(r).max())


@pytest.mark.skipif(ON_GPU, reason="the simulator's stand-in device; on a GPU: test_gpu_split_backward_* (real sizes)")
@pytest.mark.parametrize("causal", [pytest.param(False, marks=FULL), True])  # (causal: the masks too)
def test_split_backward_natural_choice_in_the_simulator(rng, causal):
    """Without the switch: the simulator's stand-in (1 SM of cc 7.5, 3 blocks of this kernel by registers) gives
    3 copies for one head of 6 key tiles (2 rounds, the second reversed), the split path's names and counts;
    4 key tiles would fill 3 slots at most 67%: the two-pass path."""
    assert flash2_fast.layout.split_dq_copies(1, 1, 50, 96, 16, np.float32, (16, 16)) == 3
    assert flash2_fast.layout.split_dq_copies(1, 1, 50, 64, 16, np.float32, (16, 16)) == 0
    q, k, v = _qkv(rng, (), 50, 96, 16, np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast", block=(8, 16))
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", block=(16, 16),
                                    count_hbm=True)
    assert list(b.hbm.per_kernel) == SPLIT_NAMES
    ref = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=causal)
    for ours, r in zip((b.dq, b.dk, b.dv), ref):
        assert np.abs(ours - r).max() < 2e-6 * max(1.0, np.abs(r).max())


@pytest.mark.gpu
@pytest.mark.parametrize("copies", [None, 3])  # None: the device's choice (two-pass at 4 heads on an H200)
@pytest.mark.parametrize("N", [1, 17, 97, 1000, 1025])
@pytest.mark.parametrize("d", [16, 64, 80, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_backward_real_sizes(rng, monkeypatch, copies, N, d, causal):
    monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", copies)
    q, k, v = _qkv(rng, (2, 2), N, N + 5, d, np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", count_hbm=True)
    assert b.hbm == iomodel.backward("flash2_fast", 4, N, N + 5, d, np.float32, causal, b.block)
    dq, dk, dv = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=causal)
    for ours, ref in ((b.dq, dq), (b.dk, dk), (b.dv, dv)):
        assert not np.isnan(ours).any()
        assert np.abs(ours - ref).max() < 1e-5 * max(1.0, np.abs(ref).max())


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_split_backward_is_bitwise_reproducible(rng, d, causal):
    """32 heads at N = 1000: the device's own choice of copies (16 at d = 64 on an H200); two calls give
    the same bits, within the tolerance of the other tests of the float64 reference."""
    q, k, v = _qkv(rng, (2, 16), 1000, 1000, d, np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", count_hbm=True)
    copies = flash2_fast.layout.split_dq_copies(32, 1, 1000, 1000, d, np.float32, b.block)
    assert list(b.hbm.per_kernel) == (SPLIT_NAMES if copies else TWO_PASS_NAMES)
    assert b.hbm == iomodel.backward("flash2_fast", 32, 1000, 1000, d, np.float32, causal, b.block)
    again = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast")
    for x, y in ((b.dq, again.dq), (b.dk, again.dk), (b.dv, again.dv)):
        assert np.array_equal(x, y)
    ref = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=causal)
    for ours, r in zip((b.dq, b.dk, b.dv), ref):
        assert np.abs(ours - r).max() < 1e-5 * max(1.0, np.abs(r).max())


# ---------------------------------------------------------------- deterministic=False: dQ by atomics

ATOMIC_NAMES = ["D = rowsum(dO*O)", "flash2_fast zero dQ", "flash2_fast dK, dV, dQ (atomic)"]


@pytest.mark.parametrize(
    "dtype, lead, Nq, Nk, d, causal, block",
    [
        pytest.param(np.float32, (2,), 17, 23, 5, False, (16, 16), marks=FULL),  # (make test: the others)
        (np.float32, (2,), 33, 20, 16, True, (32, 16)),  # Nq > Nk: fully masked rows
        (np.float32, (), 9, 47, 40, True, (16, 32)),  # d = 40: a dQ column group only half used
        pytest.param(np.float64, (), 12, 17, 7, True, (16, 16), marks=FULL),
        (np.float16, (2,), 19, 21, 16, False, (16, 16)),  # accumulator in float32, then a cast
        (np.float64, (), 12, 17, 64, False, (16, 16)),  # TD = 4: dK, dV columns in one quad
        (np.float32, (), 9, 20, 120, True, (16, 16)),  # TD = 8: two quads 64 apart, the last one partial
        pytest.param(np.float16, (), 9, 20, 120, True, (16, 16), marks=FULL),  # the same in float16 storage (float64's
        # tiles pass 48 KB)
        (np.float32, (), 9, 70, 64, True, (32, 64)),  # the atomic path's block at d = 64 on an H200 (dynamic tiles)
    ],
)
def test_backward_atomic_dq(rng, monkeypatch, dtype, lead, Nq, Nk, d, causal, block):
    if flash2_fast.backward_smem(*block, d, dtype) > blocks.dynamic_budget():  # as on a GPU that lets a block have it
        monkeypatch.setattr(blocks, "dynamic_budget", lambda: 227 * 1024)
    q, k, v = _qkv(rng, lead, Nq, Nk, d, dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    f = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast", block=(8, 16))
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", block=block,
                                    count_hbm=True, deterministic=False)
    names = ATOMIC_NAMES + (["flash2_fast dQ to storage dtype"] if dtype == np.float16 else [])
    assert list(b.hbm.per_kernel) == names
    BH = int(np.prod(lead)) if lead else 1
    assert b.hbm == iomodel.backward("flash2_fast", BH, Nq, Nk, d, dtype, causal, block, deterministic=False)
    ref = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=causal)
    # the deterministic split path (one copy of dQ), whatever this device would choose: its dK/dV kernel is the
    # atomic path's (on a GPU these sizes would run the two-pass path, a kernel compiled apart, bits not pinned)
    monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", 1)
    det = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", block=block)
    tol = {np.float32: 2e-6, np.float64: 1e-12}.get(dtype)
    for ours, same_path, r in zip((b.dq, b.dk, b.dv), (det.dq, det.dk, det.dv), ref):
        assert ours.dtype == dtype and not np.isnan(ours).any()
        if tol is None:  # float16: Dao-AILab's rule against the deterministic path's error
            err = np.abs(ours.astype(np.float64) - r).max()
            assert err <= 2 * np.abs(same_path.astype(np.float64) - r).max() + 1e-3, err
        else:
            assert np.abs(ours - r).max() < tol * max(1.0, np.abs(r).max())
    assert np.array_equal(b.dk, det.dk) and np.array_equal(b.dv, det.dv)  # same kernel code for dK, dV


def test_deterministic_must_be_a_bool(rng):
    q, k, v = _qkv(rng, (), 4, 4, 4, np.float32)
    with pytest.raises(TypeError, match="deterministic"):
        fn.flash_attention_backward(q, k, v, q, np.zeros(4, np.float32), q, kernel="flash2_fast", deterministic=0)


@pytest.mark.gpu
@pytest.mark.parametrize("N", [1, 17, 97, 1000, 1025])
@pytest.mark.parametrize("d", [16, 64, 80, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_backward_atomic_real_sizes(rng, N, d, causal):
    q, k, v = _qkv(rng, (2, 2), N, N + 5, d, np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    f = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", count_hbm=True,
                                    deterministic=False)
    assert b.hbm == iomodel.backward("flash2_fast", 4, N, N + 5, d, np.float32, causal, b.block,
                                     deterministic=False)
    dq, dk, dv = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=causal)
    for ours, ref in ((b.dq, dq), (b.dk, dk), (b.dv, dv)):
        assert not np.isnan(ours).any()
        assert np.abs(ours - ref).max() < 1e-5 * max(1.0, np.abs(ref).max())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_gpu_backward_atomic_dtypes(rng, dtype):
    q, k, v = _qkv(rng, (3,), 1000, 777, 64, dtype)
    do = rng.standard_normal(q.shape).astype(dtype)
    f = fn.flash_attention_forward(q, k, v, causal=True, kernel="flash2_fast")
    b = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=True, kernel="flash2_fast", deterministic=False)
    det = fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=True, kernel="flash2_fast")
    ref = reference.attention_backward(q, k, v, f.o, f.lse, do, causal=True)
    for ours, same, r in zip((b.dq, b.dk, b.dv), (det.dq, det.dk, det.dv), ref):
        err, err_det = (np.abs(x.astype(np.float64) - r).max() for x in (ours, same))
        if dtype == np.float64:
            assert err < 1e-12 * max(1.0, np.abs(r).max())
        else:
            assert err <= 2 * err_det + 1e-3, (err, err_det)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("split", [False, True])
def test_rows_that_pad_the_query_block_add_nothing_against_an_infinite_key(rng, monkeypatch, split):
    """k[2, 0] = -inf against q[:, 0] = 1: every row scores key 2 -inf (P = dS = 0, visible: dq[:, 0] NaN), so dk[2]
    and dv[2] are finite in the reference; the rows of zeros that pad the last query block (Nq = 10, Br = 32) score
    it 0 * -inf = NaN, and their P and dS must be set to 0, not multiplied.  S^T and dP^T split across warps or not
    (the two ways the kernel zeroes those rows), the two-pass, split-copies and atomic backwards."""
    from flash_numba.kernels.flash2_fast import layout
    from test_kernels import assert_like_reference

    q, k, v, do = (rng.standard_normal((1, n, 8)) for n in (10, 7, 7, 10))
    q[..., 0], k[..., 0] = 1.0, 0.0
    k[0, 2, 0] = -np.inf
    q, k, v, do = (x.astype(np.float32) for x in (q, k, v, do))
    f = fn.attention_forward(q, k, v, kernel="flash2_fast")
    want = reference.attention_backward(q, k, v, f.o, f.lse, do)
    assert np.isfinite(want[1][0, 2]).all() and np.isfinite(want[2][0, 2]).all() and np.isnan(want[0][0, :, 0]).all()
    with layout.s_dp_split(split):
        for copies, deterministic in ((0, True), (2, True), (None, False)):
            monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", copies)
            b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", block=(32, 16),
                                      deterministic=deterministic)
            for name, got, ref in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), want):
                assert_like_reference(got, ref, 1e-5, f"{name} (copies={copies}, deterministic={deterministic})")
