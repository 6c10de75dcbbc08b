"""A block's tiles in one shared array, static up to 48 KB and dynamic above (flash_numba.kernels._smem).

The dynamic path runs wherever a block's tiles exceed ``_switches.DYNAMIC_ABOVE``; setting it to 0
runs it at any size, in the simulator too, and it must give the static path's results bit for bit
(on a GPU, where the small static build is register-capped and the dynamic one not, within a few roundings).
"""

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import _switches, blocks, device
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


@pytest.mark.parametrize("causal", [False, True])
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
            # instruction order (and fused multiply-adds) may differ: a few roundings apart (s9/E: 1.5 ulp)
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


def test_the_recorded_store_conflicts_read_consistently():
    """Nsight Compute's hint, parsed: conflicts = (ways - 1) x requests (ways rounded to 0.1), and the passes are
    the requests plus the conflicts; the swizzle timings with their GPU and commit."""
    from flash_numba import recorded

    reports = recorded.shared_store_conflicts()
    assert len(reports) == 3 and all(r["cc"] == "9.0" for r in reports)
    for r in reports:
        assert abs(r["conflicts"] / r["store_requests"] - (r["ways"] - 1)) <= 0.05
        assert r["store_wavefronts"] == r["store_requests"] + r["conflicts"]
    rows = recorded.swizzle_rows()
    assert {r["tree"] for r in rows} == {"swizzled", "before"} and len(rows) == 24
    assert recorded.folder_provenance(recorded.SWIZZLE_CSV)["device"] == "NVIDIA H200"


def test_the_recorded_sweep_and_latest_run_read_with_their_provenance():
    from flash_numba import recorded

    rows = recorded.block_sweep_rows(128)
    blocks = {(int(r["Br"]), int(r["Bc"])) for r in rows}
    assert (32, 16) in blocks and (64, 32) in blocks, blocks  # the 48 KB block and a dynamic one
    assert flash2_fast.geometry(128, 8, 2, np.float32)["smem"] > device.STATIC_SHARED_LIMIT
    assert "H200" in recorded.provenance(recorded.BLOCK_SWEEP_CSV)["device"]
    latest = recorded.bench_rows(None, "fwd", 4096, recorded.LATEST_BENCH_CSV, d=64)
    assert {r["implementation"] for r in latest} >= {"flash2_fast", "torch-math", "torch-efficient"}
    assert all(r["d"] == "64" and r["causal"] == "False" for r in latest)


def test_the_recorded_atomic_blocks_read_with_their_provenance():
    """Lesson 9's recorded atomic backward at 32 and 64 keys a block: both head dims, both masks, from the H200."""
    from flash_numba import recorded

    rows = recorded.atomic_block_rows()
    assert {(r["d"], r["Bc"], r["causal"]) for r in rows} == {
        (d, Bc, c) for d in ("32", "64") for Bc in ("32", "64") for c in ("False", "True")}
    assert all(r["device"] == "NVIDIA H200" and float(r["ms"]) > 0 for r in rows)
    ms = {(r["d"], r["Bc"], r["causal"]): float(r["ms"]) for r in rows}
    assert all(ms[d, "64", c] < ms[d, "32", c] for d in ("32", "64") for c in ("False", "True"))  # why it ships


def test_the_recorded_host_times_read_before_and_after():
    """Lesson 10's host time of one call (session 12): both trees, both runs, each kernel and pass, from the H200;
    flash2_fast's backward (one launch fewer after) is the faster in every pairing of runs."""
    from flash_numba import recorded

    rows = recorded.host_rows()
    keys = {(r["tree"], r["run"], r["kernel"], r["pass"]) for r in rows}
    assert keys == {(t, n, k, p) for t in ("before", "after") for n in (1, 2) for k in ("flash2_fast", "flash2")
                    for p in ("fwd", "bwd")}
    assert all(r["device"] == "NVIDIA H200" and r["host_us"] > 0 for r in rows)
    bwd = {(r["tree"], r["run"]): r["host_us"] for r in rows if (r["kernel"], r["pass"]) == ("flash2_fast", "bwd")}
    assert max(bwd["after", n] for n in (1, 2)) < min(bwd["before", n] for n in (1, 2))


def test_the_recorded_split_s_dp_backward_reads_with_its_commits():
    """Lesson 10's d = 128 backward, S^T and dP^T in every thread or in separate warps (session 14): both modes and
    masks each way, from the H200, each with its tree's commit; the split one faster in each pairing (why it ships)."""
    from flash_numba import recorded

    rows = recorded.split_s_dp_rows()
    assert {(r["threads"], r["mode"], r["causal"]) for r in rows} == {
        (t, m, c) for t in ("both", "split") for m in ("deterministic", "atomic") for c in ("False", "True")}
    assert all(r["device"] == "NVIDIA H200" and r["d"] == "128" for r in rows)
    assert {r["threads"]: r["commit"] for r in rows} == {"both": "e6533b3", "split": "4f81286"}
    ms = {(r["threads"], r["mode"], r["causal"]): r["ms"] for r in rows}
    assert all(ms["split", m, c] < ms["both", m, c] for m in ("deterministic", "atomic") for c in ("False", "True"))


def test_the_recorded_dq_lane_groups_read_with_their_commit():
    """Lesson 10's d = 64 backward, the dQ loop's lanes in one group or two (session 15): both blocks, modes and masks,
    two runs each, from the H200 and one commit; the atomic 32 x 64 (as shipped) faster with two groups in every
    pairing of runs (why it ships)."""
    from flash_numba import recorded

    rows = recorded.dq_lane_rows()
    assert {(r["groups"], r["run"], r["Bc"], r["mode"], r["causal"]) for r in rows} == {
        (g, n, bc, m, c) for g in (1, 2) for n in "ab" for bc in ("32", "64") for m in ("deterministic", "atomic")
        for c in ("False", "True")}
    assert all(r["device"] == "NVIDIA H200" and r["d"] == "64" for r in rows)
    assert {r["commit"] for r in rows} == {"0cf1fe6"}
    ms = {(r["groups"], r["run"], r["causal"]): r["ms"] for r in rows if (r["Bc"], r["mode"]) == ("64", "atomic")}
    assert all(ms[2, a, c] < ms[1, b, c] for a in "ab" for b in "ab" for c in ("False", "True"))


def test_the_recorded_forward_steps_read_with_their_commits():
    """Session 10's forward, change by change (lesson 4): every tree timed twice at d = 64 and 128, each row with
    its tree's commit; and Nsight Compute after the fix, whose counts agree with each other."""
    from flash_numba import recorded

    rows = recorded.forward_step_rows()
    trees = {r["tree"] for r in rows}
    assert trees >= {"main", "keys16", "keys16v", "keys16s"}
    for tree in trees:
        mine = [r for r in rows if r["tree"] == tree and r["implementation"] == "flash2_fast"]
        assert {(r["d"], r["causal"], r["run"]) for r in mine} >= {(d, c, run) for d in ("64", "128")
                                                                   for c in ("False", "True") for run in ("1", "2")}
        assert len({r["commit"] for r in mine}) == 1 and len(mine[0]["commit"]) == 7
    after = recorded.shared_store_conflicts(recorded.FORWARD_NCU_AFTER_TXT)
    assert len(after) == 1 and after[0]["cc"] == "9.0"
    a = after[0]
    assert a["conflicts"] < a["store_wavefronts"] and a["store_wavefronts"] / a["store_requests"] == \
        pytest.approx(a["ways"], abs=0.05)



@pytest.mark.parametrize("d, TM, TN, dtype", [(64, 8, 4, np.float32), (128, 8, 3, np.float32), (80, 8, 2, np.float32),
                                             (1, 1, 1, np.float64)])
def test_lesson_10s_tile_bytes_is_the_kernels_geometry(d, TM, TN, dtype):
    """The exercise's solution (lesson 10) counts the tiles the forward holds, as flash2_fast.geometry lays them out."""
    from flash_numba.exercises.counts import _tile_bytes_solution

    assert _tile_bytes_solution(d, TM, TN, np.dtype(dtype).itemsize) == flash2_fast.geometry(d, TM, TN, dtype)["smem"]
