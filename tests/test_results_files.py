"""The committed results files that the package reads (flash_numba.recorded: the lessons' recorded H200 runs):
each reads, carries its provenance (device, date, commit) and holds what the lessons say it holds.

Every test of a committed CSV or log lives here, so that moving or pruning results folders touches one file.
"""

import numpy as np
import pytest

from flash_numba import device
from flash_numba.course import recorded
from flash_numba.kernels import flash2_fast


def test_the_recorded_store_conflicts_read_consistently():
    """Nsight Compute's hint, parsed: conflicts = (ways - 1) x requests (ways rounded to 0.1), and the passes are
    the requests plus the conflicts; the swizzle timings with their GPU and commit."""
    reports = recorded.shared_store_conflicts()
    assert len(reports) == 3 and all(r["cc"] == "9.0" for r in reports)
    for r in reports:
        assert abs(r["conflicts"] / r["store_requests"] - (r["ways"] - 1)) <= 0.05
        assert r["store_wavefronts"] == r["store_requests"] + r["conflicts"]
    rows = recorded.swizzle_rows()
    assert {r["tree"] for r in rows} == {"swizzled", "before"} and len(rows) == 24
    assert recorded.folder_provenance(recorded.SWIZZLE_CSV)["device"] == "NVIDIA H200"


def test_the_recorded_sweep_and_latest_run_read_with_their_provenance():
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
    rows = recorded.atomic_block_rows()
    assert {(r["d"], r["Bc"], r["causal"]) for r in rows} == {
        (d, Bc, c) for d in ("32", "64") for Bc in ("32", "64") for c in ("False", "True")}
    assert all(r["device"] == "NVIDIA H200" and float(r["ms"]) > 0 for r in rows)
    ms = {(r["d"], r["Bc"], r["causal"]): float(r["ms"]) for r in rows}
    assert all(ms[d, "64", c] < ms[d, "32", c] for d in ("32", "64") for c in ("False", "True"))  # why it ships


def test_the_recorded_host_times_read_before_and_after():
    """Lesson 10's host time of one call (session 12): both trees, both runs, each kernel and pass, from the H200;
    flash2_fast's backward (one launch fewer after) is the faster in every pairing of runs."""
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


def test_recorded_ncu_rows_and_table():
    rows = recorded.ncu_rows()
    assert {(r["BH"], r["N"]) for r in rows} == {(8, 1024), (32, 4096)}
    calls = {(r["BH"], r["N"], r["kernel"]): r for r in recorded.ncu_per_call()}
    for key, c in calls.items():
        assert c["counted"] == sum(r["counted"] for r in rows if (r["BH"], r["N"], r["kernel"]) == key)
    assert calls[32, 4096, "standard"]["dram"] > calls[32, 4096, "standard"]["counted"] / 2
    assert calls[32, 4096, "flash2_fast"]["dram"] < calls[32, 4096, "flash2_fast"]["counted"] / 4
    table = recorded.ncu_table()
    assert table.startswith("recorded on the H200, not measured now") and "ncu_bytes.csv" in table


def test_recorded_results_carry_their_provenance():
    assert recorded.available()
    p = recorded.provenance()
    assert "H200" in p["device"] and p["date"].startswith("2026-11-30") and "bench.py" in p["command"]
    table = recorded.bench_table(["flash2_fast"], "fwd", 4096)
    assert table.startswith(recorded.LABEL) and "flash2_fast" in table
    rows = recorded.bench_rows(["standard"], "fwd", 4096)
    assert len(rows) == 1 and float(rows[0]["ms"]) > 0
