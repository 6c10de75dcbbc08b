"""The L2 sweep: its CSV, its figure (on a synthetic sweep), the script's bookkeeping in the simulator,
the recorded Nsight Compute table, and standard.forward_launches."""

import importlib.util
from pathlib import Path

import matplotlib
import numpy as np
import pytest

from flash_numba import iomodel, reference
from flash_numba.iomodel import terms
from flash_numba.kernels import standard
from flash_numba.tools import csvfile, l2, profile

matplotlib.use("Agg")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "l2_sweep.py"


def _script():
    spec = importlib.util.spec_from_file_location("l2_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _synthetic(BH=8, d=64, Ns=(256, 1024, 4096)):
    """Rows with the model's counts (= the counters) and made-up DRAM and L2 bytes, different per row."""
    rows = []
    for N in Ns:
        for kernel in ("standard", "flash2_fast"):
            split = terms.split(kernel, "forward", BH, N, N, d, np.float32, False, (64, 32))
            total = sum(split.values())
            for j, cache in enumerate(l2.CACHE_MODES):
                rows.append({"kernel": kernel, "cache": cache, "BH": BH, "N": N, "d": d, "dtype": "float32",
                             "Br": 64, "Bc": 32, "launches": 3 if kernel == "standard" else 1,
                             "counted_read": total - 7 * N, "counted_written": 7 * N, **split,
                             "l2_bytes": total // 2 + j, "dram_read": total // (5 + j) + N, "dram_write": N + j})
    return rows


def test_crossing_N():
    assert l2.crossing_N(1, l2.L2_BYTES["T4"]) == 1024  # S of one head at N = 1024, float32: 4 MiB
    assert l2.crossing_N(8, l2.L2_BYTES["H200"]) == pytest.approx(1280)  # 8 * 1280^2 * 4 = 50 MiB
    assert l2.crossing_N(4, 8 * 2**20, itemsize=2) == 1024  # 4 * 1024^2 * 2 bytes


def test_sweep_csv_round_trip(tmp_path):
    rows = _synthetic()
    l2.write_sweep(tmp_path / "s.csv", {"device": "gpu: test", "command": "x --y"}, rows)
    header, back = l2.read_sweep(tmp_path / "s.csv")
    assert header == {"device": "gpu: test", "command": "x --y"}
    assert back == [{c: r[c] for c in l2.COLUMNS} for r in rows]


def test_read_sweep_names_missing_columns(tmp_path):
    (tmp_path / "bad.csv").write_text("kernel,N\nstandard,256\n")
    with pytest.raises(ValueError, match="^path: .* lacks the columns"):
        l2.read_sweep(tmp_path / "bad.csv")


def test_figure_draws_dram_counted_and_the_l2_crossing(tmp_path):
    rows = _synthetic()
    l2.write_sweep(tmp_path / "s.csv", {"device": "gpu: test"}, rows)
    fig = l2.figure(tmp_path / "s.csv")
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    for kernel in ("standard", "flash2_fast"):
        for cache in l2.CACHE_MODES:
            sel = [r for r in rows if r["kernel"] == kernel and r["cache"] == cache]
            line = lines[f"{kernel}: DRAM, L2 {cache}"]
            assert list(line.get_xdata()) == [r["N"] for r in sel]
            assert list(line.get_ydata()) == [r["dram_read"] + r["dram_write"] for r in sel]
        counted = lines[f"{kernel}: counted (requested)"]
        assert counted.get_linestyle() == "--"
        assert list(counted.get_ydata()) == [r["counted_read"] + r["counted_written"]
                                             for r in rows if r["kernel"] == kernel and r["cache"] == "warm"]
    marks = [line for line in ax.get_lines() if line.get_label().startswith("_")]  # the axvline
    assert [m.get_xdata()[0] for m in marks] == [pytest.approx(l2.crossing_N(8, l2.L2_BYTES["H200"]))]
    assert ax.get_xscale() == ax.get_yscale() == "log"


@pytest.mark.slow
def test_sweep_bookkeeping_in_the_simulator(tmp_path):
    """measure() counts our bytes and attaches ncu's launches in the child's order; write() makes the files."""
    script = _script()
    BH, d, Ns = 1, 16, (17, 40)
    names = [name for _ in Ns for kernel in script.KERNELS for name in script.LAUNCH_NAMES[kernel]]
    fake = {cache: [profile.NcuLaunch(i, f"{name}::kernel[v1]", {m: 1000 * i + j + 10 * c
                                                                 for j, m in enumerate(profile.METRICS)})
                    for i, name in enumerate(names)] for c, cache in enumerate(l2.CACHE_MODES)}
    rows, per_launch = script.measure(BH, d, Ns, fake)
    assert len(rows) == len(Ns) * 2 * len(l2.CACHE_MODES) and len(per_launch) == len(names) * 2
    for r in rows:
        block = (r["Br"], r["Bc"])
        model = iomodel.forward(r["kernel"], BH, r["N"], r["N"], d, np.float32, False, block)
        assert r["counted_read"] + r["counted_written"] == model.total == r["compulsory"] + r["re-reads"] + r["S/P"]
        assert (r["S/P"] > 0) == (r["kernel"] == "standard")
    # launch i carries dram_read = 1000 i + 10 c (c: the cache mode): each row sums its own launches
    first = [r for r in rows if r["N"] == Ns[0] and r["kernel"] == "standard"]
    assert [r["dram_read"] for r in first] == [0 + 1000 + 2000 + 3 * 10 * c for c in range(2)]
    script.write(tmp_path, rows, per_launch, ["--out", str(tmp_path)])
    header, back = l2.read_sweep(tmp_path / "l2_sweep.csv")
    assert back == rows and header["command"].endswith(f"--out {tmp_path}")
    assert [r["launch"] for r in csvfile.read_csv(tmp_path / "l2_sweep_launches.csv")][:3] == list(
        standard.FORWARD_NAMES)
    assert (tmp_path / "l2_sweep.png").stat().st_size > 0


def test_forward_launches_compute_the_forward(rng):
    q, k, v = (rng.standard_normal((2, 17, 16)).astype(np.float32) for _ in range(3))
    launches, arrays = standard.forward_launches(q, k, v, causal=True, block=(8, 16))
    assert [name for name, _ in launches] == list(standard.FORWARD_NAMES)
    for _, run in launches:
        run()
    o_ref, lse_ref = (np.stack(x) for x in zip(*(reference.attention_forward(q[h], k[h], v[h], causal=True)
                                                  for h in range(2))))
    assert np.abs(arrays["O"].copy_to_host() - o_ref).max() < 1e-5
    assert np.abs(arrays["L"].copy_to_host() - lse_ref).max() < 1e-5
    with pytest.raises(ValueError, match="^block"):
        standard.forward_launches(q, k, v, block=(12, 16))
