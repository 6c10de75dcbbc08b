"""A block's tiles in one shared array, static up to 48 KB and dynamic above (flash_numba.kernels._smem).

The dynamic path runs wherever a block's tiles exceed ``_switches.DYNAMIC_ABOVE``; setting it to 0
runs it at any size, in the simulator too, and it must give the static path's results bit for bit
(on a GPU, where the small static build is register-capped and the dynamic one not, within a few roundings).
"""

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import _switches, blocks, device
from conftest import FULL
from flash_numba.kernels import _smem, flash2, flash2_fast


def test_offsets_start_every_tile_on_16_bytes():
    starts, total = _smem.offsets((5, 3, 8, 1), 4)
    assert starts == (0, 8, 12, 20) and total == 21
    assert _smem.offsets((3, 3), 8) == ((0, 4), 7)
    assert _smem.total_bytes((5, 3, 8, 1), 4) == 84
    for d, TM, TN, dt in ((64, 8, 2, np.float32), (128, 8, 2, np.float32), (64, 8, 2, np.float64)):
        g = flash2_fast.geometry(d, TM, TN, dt)
        assert g["smem"] == sum(g["tiles"]) * np.dtype(dt).itemsize  # these tiles need no padding


def _passes(q, k, v, do, causal):
    f = fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal, block=(16, 32))
    det = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", causal=causal, block=(16, 32))
    atomic = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", causal=causal, block=(16, 32),
                                   deterministic=False)
    return f.o, f.lse, det.dq, det.dk, det.dv, atomic.dk, atomic.dv


@pytest.mark.parametrize("causal", [pytest.param(False, marks=FULL), True])  # (causal: the masks too)
@pytest.mark.slow
def test_dynamic_tiles_give_the_static_results_bit_for_bit(rng, monkeypatch, causal):
    q, do = (rng.standard_normal((2, 19, 16)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((2, 23, 16)).astype(np.float32) for _ in range(2))
    static = _passes(q, k, v, do, causal)
    monkeypatch.setattr(_switches, "DYNAMIC_ABOVE", 0)
    dynamic = _passes(q, k, v, do, causal)
    for a, b in zip(static, dynamic):
        if device.SIMULATOR:
            assert np.array_equal(a, b, equal_nan=True)
        else:  # two builds on a GPU: the static one under the 128-register cap, the dynamic one uncapped, whose
            # instruction order (and fused multiply-adds) may differ: a few roundings apart (1.5 ulp measured on
            # the H200, 2026-11-30, benchmarks/results/h200-2026-11-30-s9/E/)
            finite = np.isfinite(a)
            assert np.array_equal(a[~finite], b[~finite], equal_nan=True)
            scale = max(1.0, float(np.abs(a[finite]).max(initial=0.0)))
            np.testing.assert_allclose(a[finite], b[finite], rtol=0, atol=8 * np.finfo(np.float32).eps * scale)


def test_the_dynamic_budget_chooses_larger_blocks(monkeypatch):
    assert blocks.dynamic_budget() >= blocks.shared_budget()
    big = device.SHARED_OPTIN_BY_CC[(9, 0)]
    assert flash2_fast.choose_block(128, np.float32, big) == (64, 48)  # 97 KB: dynamic
    assert flash2_fast.choose_block(128, np.float32, big, "backward") == (32, 32)  # 78 KB
    assert flash2_fast.choose_block(128, np.float32, device.STATIC_SHARED_LIMIT) == (32, 16)
    assert flash2_fast.choose_block(64, np.float32, big) == (64, 64)  # 67 KB
    assert flash2_fast.choose_block(64, np.float32, device.STATIC_SHARED_LIMIT) == (64, 32)  # 43 KB
    assert flash2_fast.choose_block(64, np.float64, big) == (32, 16)  # float64 stays within 48 KB
    monkeypatch.setattr(fn.device, "info", lambda: fn.device.DeviceInfo(
        "stand-in", (9, 0), 1, device.STATIC_SHARED_LIMIT, big, big, None, 32, True))
    assert fn.resolve_block("flash2_fast", 128, np.float32) == (64, 48)
    assert fn.resolve_block("flash2_fast", 128, np.float32, pass_="backward") == (32, 32)
    static = flash2.SPEC.block(128, np.float32, "forward", budget=device.STATIC_SHARED_LIMIT)
    assert fn.resolve_block("flash2", 128, np.float32) == static  # flash2's tiles stay static


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_dynamic_tiles_give_the_static_results_bit_for_bit(rng, monkeypatch, d):
    q, k, v, do = (rng.standard_normal((2, 1000, d)).astype(np.float32) for _ in range(4))
    static = _passes(q, k, v, do, True)
    monkeypatch.setattr(_switches, "DYNAMIC_ABOVE", 0)
    dynamic = _passes(q, k, v, do, True)
    for a, b in zip(static, dynamic):
        assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("d, TM, TN, dtype", [(64, 8, 4, np.float32), (128, 8, 3, np.float32), (80, 8, 2, np.float32),
                                             (1, 1, 1, np.float64)])
def test_lesson_10s_tile_bytes_is_the_kernels_geometry(d, TM, TN, dtype):
    """The exercise's solution (lesson 10) counts the tiles the forward holds, as flash2_fast.geometry lays them out."""
    from flash_numba.course.exercises.counts import _tile_bytes_solution

    assert _tile_bytes_solution(d, TM, TN, np.dtype(dtype).itemsize) == flash2_fast.geometry(d, TM, TN, dtype)["smem"]
