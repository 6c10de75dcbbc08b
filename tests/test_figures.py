"""The figures (flash_numba.tools.figures, figures/make_all.py) and the ncu cross-check (tools.profile).

In the simulator: the model-only run writes every model figure and its CSV
equals the IO model; figure 3 counts tiny sizes; the GPU-only paths (times,
memory, per-launch timing) run on tiny sizes with the clock and the memory
reading faked, so their plumbing is exercised here and their numbers on a GPU.
"""

import importlib.util
import itertools
import subprocess
from argparse import Namespace
from pathlib import Path

import pytest

from flash_numba import _switches, iomodel, kernels
from flash_numba.tools import figures, passes, profile, timing
from flash_numba.tools.csvfile import read_csv
from flash_numba.tools.figures import (
    common,
    fig1_paper_table,
    fig2_block_size,
    fig3_hbm_vs_seqlen,
    fig4_memory,
    fig5_runtime,
    fig6_roofline,
)

ROOT = Path(__file__).resolve().parents[1]
FLOAT32_KERNELS = tuple(n for n in kernels.NAMES if "float32" in kernels.get(n).dtypes)  # the tools run float32

TINY = common.Sizes(
    d=8,
    table=(1, 2, 16),
    table_count_BH=1,
    block_N=16,
    block_BH=2,
    block_Br=(8, 16),
    block_Bc=(8, 16),
    seq_N=(4, 8, 16, 32),
    seq_count_max=4,
    mem_N=(8, 16),
    mem_BH=1,
    time_N=(8,),
    time_BH=1,
    breakdown_N=(8,),
    roof=(1, 16),
    slow_s=1e9,  # the simulator is slow; never cut a series short here
)


def make_all():
    spec = importlib.util.spec_from_file_location("make_all", ROOT / "figures" / "make_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def tiny_run(tmp_path, kernel_names, gpu):
    return common.Run(out=tmp_path, sizes=TINY, count=True, gpu=gpu, label="test device", kernels=kernel_names)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Stand-ins for the GPU's clock and free-memory reading (the simulator has neither)."""
    monkeypatch.setattr(timing, "median_ms", lambda fn: (fn(), 1.5)[1])
    monkeypatch.setattr(timing.LaunchTimer, "stop", lambda self: {n: 1.0 + i for i, n in enumerate(self.names)})
    free = itertools.count(10**12, -(2**20))  # every reading 1 MiB less free memory
    monkeypatch.setattr(timing, "free_bytes", lambda: next(free))
    monkeypatch.setattr(timing, "torch_cuda", lambda: None)
    monkeypatch.setattr(fig6_roofline, "ceilings", lambda run: (1000.0, 10.0, "test ceilings"))


# ---------------------------------------------------------------------------- model-only


def test_model_only_writes_every_model_figure_and_skips_the_timed_ones(tmp_path, capsys):
    assert make_all()(["--model-only", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    stems = ["fig1_paper_table", "fig2_block_size", "fig3_hbm_vs_seqlen", "fig6_roofline"]
    for stem in stems:
        for ext in ("png", "csv"):
            path = tmp_path / f"{stem}.{ext}"
            assert path.stat().st_size > 0, path
    assert (tmp_path / "fig1_paper_table.md").read_text().count("| standard | total |") == 1
    assert "figure 4: skipped: needs a GPU" in out and "figure 5: skipped: needs a GPU" in out
    assert not list(tmp_path.glob("fig4*")) and not list(tmp_path.glob("fig5*"))
    assert "Numba CUDA simulator" in (tmp_path / "fig3_hbm_vs_seqlen.csv").read_text().splitlines()[1]

    # Figure 3: every (kernel, pass, N) of the default sizes, modelled, nothing counted.
    rows = read_csv(tmp_path / "fig3_hbm_vs_seqlen.csv")
    names = {n for n in kernels.NAMES if "float32" in kernels.get(n).dtypes}  # the figures run float32
    assert {r["kernel"] for r in rows} == names and {"standard", "flash1", "flash2"} <= names
    assert len(rows) == len(names) * 2 * len(common.Sizes().seq_N)
    for r in rows:
        assert r["source"] == "model"
        N, d = int(r["N"]), int(r["d"])
        block = passes.block_for(r["kernel"], d, r["pass"])
        fn = iomodel.forward if r["pass"] == "forward" else iomodel.backward
        want = fn(r["kernel"], 1, N, N, d, "float32", False, block)
        assert (int(r["bytes_read"]), int(r["bytes_written"])) == (want.bytes_read, want.bytes_written)

    # Figure 1: the GPT-2 medium shape, B*H = 64 * 16.
    for r in read_csv(tmp_path / "fig1_paper_table.csv"):
        if r["pass"] == "total":
            continue
        fn = iomodel.forward if r["pass"] == "forward" else iomodel.backward
        want = fn(r["implementation"], 1024, 1024, 1024, 64, "float32", False,
                  passes.block_for(r["implementation"], 64, r["pass"]))
        assert (int(r["model_bytes_read"]), int(r["model_bytes_written"])) == (want.bytes_read, want.bytes_written)
        assert r["ms"] == "" and r["counted_gb"] == ""

    # Figure 2: explicit blocks, forward, N = 1024, d = 64, B*H = 128; flash1's bytes fall as Bc grows.
    rows = read_csv(tmp_path / "fig2_block_size.csv")
    assert rows
    for r in rows:
        block = (int(r["Br"]), int(r["Bc"]))
        want = iomodel.forward(r["kernel"], 128, 1024, 1024, 64, "float32", False, block)
        assert int(r["model_bytes_read"]) + int(r["model_bytes_written"]) == want.total
    flash1 = sorted((int(r["Bc"]), int(r["model_bytes_read"])) for r in rows
                    if r["kernel"] == "flash1" and r["Br"] == "16")
    assert len(flash1) >= 3 and all(a[1] > b[1] for a, b in zip(flash1, flash1[1:]))


def test_only_selects_figures(tmp_path, capsys):
    assert figures.main(["--model-only", "--only", "4", "5", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "figure 4: skipped" in out and "figure 5: skipped" in out and "figure 3" not in out
    assert list(tmp_path.iterdir()) == []


def test_flop_table_covers_every_launch_and_matches_the_textbook_count():
    for name in FLOAT32_KERNELS:
        for pass_ in ("forward", "backward"):
            launches = passes.model(name, pass_, 1, 32, 16).per_kernel
            assert set(passes.flops(launches, 1, 32, 16)) == set(launches)
    BH, N, d = 3, 40, 16
    std = passes.flops(passes.model("standard", "forward", BH, N, d).per_kernel, BH, N, d)
    assert sum(std.values()) == BH * (4 * N * N * d + 8 * N * N)  # Q K^T and P V, plus scale and softmax
    f2 = passes.flops(passes.model("flash2", "backward", BH, N, d).per_kernel, BH, N, d)
    assert sum(f2.values()) == BH * (14 * N * N * d + 10 * N * N + 2 * N * d)


# ---------------------------------------------------------------------------- kernels run (simulator)


def test_figure3_counts_tiny_sizes_equal_to_the_model(tmp_path, capsys):
    run = tiny_run(tmp_path, ("flash1", "flash2"), gpu=False)
    fig3_hbm_vs_seqlen.make(run)
    assert "4 passes counted, 4 equal to the IO model" in capsys.readouterr().out
    rows = read_csv(tmp_path / "fig3_hbm_vs_seqlen.csv")
    counted = [r for r in rows if r["source"] == "counted"]
    assert sorted((r["kernel"], r["pass"], r["N"]) for r in counted) == sorted(
        (k, p, "4") for k in run.kernels for p in ("forward", "backward"))
    for r in counted:
        want = passes.model(r["kernel"], r["pass"], 1, int(r["N"]), 8)
        assert (int(r["bytes_read"]), int(r["bytes_written"])) == (want.bytes_read, want.bytes_written)


def test_launch_timer_sees_every_launch_in_counter_order():
    """The timing hook relies on each module asking counters.array(name) once per launch, in launch order."""
    for kernel in ("standard", "flash1", "flash2"):
        q, k, v, do = passes.random_inputs(1, 8, 8)
        f = passes.forward(kernel, q, k, v)
        arrays = {"q": q, "k": k, "v": v, "o": f.o, "lse": f.lse, "do": do}
        for pass_ in ("forward", "backward"):
            timer = timing.LaunchTimer()
            passes.run_pass(kernel, pass_, arrays, timer)
            assert timer.names == list(passes.model(kernel, pass_, 1, 8, 8).per_kernel), (kernel, pass_)
            assert timer.stop() is None  # the simulator has no clock


def test_figures_1_2_6_on_a_faked_gpu(tmp_path, fake_gpu, monkeypatch):
    monkeypatch.setattr(timing, "LAUNCH_REPEATS", 1)
    paths = fig1_paper_table.make(tiny_run(tmp_path, ("flash1",), gpu=True))
    row = next(r for r in read_csv(paths[0]) if r["pass"] == "total")
    assert float(row["counted_gb"]) == pytest.approx(float(row["model_gb"])) and float(row["ms"]) == 3.0

    rows = read_csv(fig2_block_size.make(tiny_run(tmp_path, ("flash1",), gpu=True))[0])
    assert [(r["Br"], r["Bc"], r["ms"]) for r in rows] == [("8", "8", "1.5"), ("8", "16", "1.5"), ("16", "8", "1.5"),
                                                           ("16", "16", "1.5")]

    rows = read_csv(fig6_roofline.make(tiny_run(tmp_path, ("flash1", "flash2"), gpu=True))[0])
    assert [(r["implementation"], r["launch"]) for r in rows] == [
        ("flash1", "Algorithm 1"), ("flash1", "Algorithm 4"), ("flash2", "flash2 forward"),
        ("flash2", "D = rowsum(dO*O)"), ("flash2", "dK, dV"), ("flash2", "dQ")]  # init kernels: no FLOPs
    for r in rows:
        assert r["bytes_source"] == "counted" and float(r["tflops"]) == pytest.approx(
            int(r["flops"]) / (float(r["ms"]) * 1e9), rel=1e-4)


def test_figure1_counts_at_the_full_size_where_bytes_are_not_linear_in_heads(tmp_path, fake_gpu, monkeypatch):
    """flash2_fast's split backward keeps more copies of dQ for fewer heads: scaling a count up would be wrong."""
    from flash_numba.kernels.flash2_fast import layout

    monkeypatch.setattr(layout, "split_dq_copies", lambda BH, *args: 3)
    assert fig1_paper_table.linear_in_heads("flash2_fast", 2, 8, 64, 16)
    monkeypatch.setattr(layout, "split_dq_copies", lambda BH, *args: 3 if BH < 8 else 1)
    assert not fig1_paper_table.linear_in_heads("flash2_fast", 2, 8, 64, 16)
    assert fig1_paper_table.linear_in_heads("flash2", 2, 8, 64, 16)
    seen = []
    monkeypatch.setattr(passes, "counted", lambda kernel, BH, N, d: (seen.append(BH),
                        tuple(passes.model(kernel, p, BH, N, d) for p in ("forward", "backward")))[1])
    monkeypatch.setattr(timing, "time_passes", lambda kernel, BH, N, d: ((1.0, 2.0), BH))
    sizes = replace_sizes(tiny_run(tmp_path, ("flash2_fast", "flash2"), gpu=True), table=(2, 4, 64),
                          table_count_BH=2)
    rows = read_csv(fig1_paper_table.make(sizes)[0])
    assert seen == [8, 2]  # flash2_fast counted at B*H = 8, flash2 at 2 and scaled
    for r in rows:
        assert float(r["counted_gb"]) == pytest.approx(float(r["model_gb"])), r


def test_figure4_measures_memory_and_stops_at_out_of_memory(tmp_path, fake_gpu, monkeypatch, capsys):
    assert timing.peak_memory("flash1", 1, 8, 8) == 2 * 2**20  # the faked free memory drops 1 MiB a reading

    def peak(kernel, BH, N, d, deterministic=True):
        if kernel == "standard" and N > 8:
            raise RuntimeError("[CUresult.CUDA_ERROR_OUT_OF_MEMORY] Call to cuMemAlloc results in "
                               "CUDA_ERROR_OUT_OF_MEMORY")
        if kernel == "flash2_fast" and deterministic:  # the split backward's copies of dQ
            return N * N // 2 * 2**20
        return (N * N if kernel == "standard" else N) * 2**20

    monkeypatch.setattr(timing, "peak_memory", peak)
    monkeypatch.setattr(passes, "warm_up", lambda kernel, d: None)
    run = replace_sizes(tiny_run(tmp_path, ("standard", "flash2", "flash2_fast"), gpu=True), mem_N=(8, 16, 32))
    paths = fig4_memory.make(run)
    rows = read_csv(paths[0])
    assert [(r["kernel"], r["N"], r["peak_mib"], r["standard_over_this"], r["note"]) for r in rows] == [
        ("standard", "8", "64.0", "1.0", ""),
        ("standard", "16", "", "", "out of memory at N = 16"),
        ("flash2", "8", "8.0", "8.0", ""),
        ("flash2", "16", "16.0", "", ""),
        ("flash2", "32", "32.0", "", ""),
        ("flash2_fast", "8", "32.0", "2.0", ""),
        ("flash2_fast", "16", "128.0", "", ""),
        ("flash2_fast", "32", "512.0", "", ""),
        ("flash2_fast (deterministic=False)", "8", "8.0", "8.0", ""),
        ("flash2_fast (deterministic=False)", "16", "16.0", "", ""),
        ("flash2_fast (deterministic=False)", "32", "32.0", "", ""),
    ]
    assert paths[1].stat().st_size > 0
    assert "standard: out of memory at N = 16; series stopped" in capsys.readouterr().out
    assert not timing.out_of_memory(ValueError("bad block"))


def test_figure5_times_and_breaks_down_the_standard_path(tmp_path, fake_gpu, monkeypatch):
    monkeypatch.setattr(passes, "warm_up", lambda kernel, d: None)
    monkeypatch.setattr(timing, "time_passes", lambda kernel, BH, N, d, shrink, torch=None: ((N / 8, N / 4), BH))

    def run_pass(kernel, pass_, arrays, counters):  # the launches' names, as the kernels ask for them
        for name in passes.model(kernel, pass_, 1, 8, 8).per_kernel:
            counters.array(name)

    monkeypatch.setattr(passes, "run_pass", run_pass)
    paths = fig5_runtime.make(replace_sizes(tiny_run(tmp_path, ("standard", "flash1"), gpu=True), time_N=(8, 16)))
    assert [p.name for p in paths] == ["fig5_runtime.csv", "fig5_runtime.png", "fig5_standard_breakdown.csv",
                                       "fig5_standard_breakdown.png"]
    rows = read_csv(paths[0])
    assert [(r["implementation"], r["N"], r["fwd_ms"], r["total_ms"]) for r in rows] == [
        ("standard", "8", "1.0", "3.0"), ("standard", "16", "2.0", "6.0"),
        ("flash1", "8", "1.0", "3.0"), ("flash1", "16", "2.0", "6.0")]
    breakdown = read_csv(paths[2])
    forward = passes.model("standard", "forward", 1, 8, 8).per_kernel
    backward = passes.model("standard", "backward", 1, 8, 8).per_kernel
    assert [r["launch"] for r in breakdown] == list(forward) + list(backward)
    # the faked clock gives launch i of a pass 1 + i ms: the forward's 3 launches take 1, 2, 3 of 6 ms
    assert [float(r["share"]) for r in breakdown[:3]] == [pytest.approx(x / 6, rel=1e-4) for x in (1, 2, 3)]


def replace_sizes(run, **changes):
    from dataclasses import replace

    return replace(run, sizes=replace(run.sizes, **changes))


# ---------------------------------------------------------------------------- profile


NCU_HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)


def ncu_row(launch, kernel_name, metric, unit, value):
    """One line of ncu --csv output, as ncu quotes it."""
    return (f'"{launch}","4242","python3.11","127.0.0.1","{kernel_name}","1","7","(48, 1, 1)","(2, 1, 1)","0",'
            f'"9.0","Command line profiler metrics","{metric}","{unit}","{value}"')


INIT = "cudapy::flash_numba::kernels::flash1::init(Array<float, 3, C>, float)"
ALG1 = "cudapy::flash_numba::kernels::flash1::algorithm1(Array<float, 3, C>, float)"
NCU_SAMPLE = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.11)",
    '==PROF== Profiling "kernel" - 0: 0%....50%....100% - 3 passes',
    "==PROF== Disconnected from process 4242",
    NCU_HEADER,
    ncu_row(0, INIT, "dram__bytes_read.sum", "byte", "0"),
    ncu_row(0, INIT, "dram__bytes_write.sum", "Kbyte", "1.28"),
    ncu_row(0, INIT, "lts__t_bytes.sum", "byte", "2,304"),
    ncu_row(1, ALG1, "dram__bytes_read.sum", "Mbyte", "1.5"),
    ncu_row(1, ALG1, "dram__bytes_write.sum", "byte", "n/a"),
    ncu_row(1, ALG1, "lts__t_bytes.sum", "Gbyte", "0.002"),
]) + "\n"


def test_ncu_csv_parser_reads_the_documented_format():
    launches = profile.parse_ncu_csv(NCU_SAMPLE)
    assert [launch.id for launch in launches] == [0, 1]
    assert launches[0].kernel_name.startswith("cudapy::flash_numba::kernels::flash1::init(")  # commas inside quotes
    assert launches[0].metrics == {"dram__bytes_read.sum": 0, "dram__bytes_write.sum": 1280,
                                   "lts__t_bytes.sum": 2304}
    assert launches[1].metrics == {"dram__bytes_read.sum": 1.5e6, "lts__t_bytes.sum": 2e6}  # n/a left out
    assert profile.parse_ncu_csv("==PROF== ERR_NVGPUCTRPERM - no permission\n") == []
    with pytest.raises(ValueError, match="unknown unit"):
        profile.parse_ncu_csv(NCU_SAMPLE.replace('"Kbyte"', '"furlong"'))


def test_profile_without_ncu_prints_our_counts(tmp_path, capsys):
    assert profile.main(["--no-ncu", "--kernels", "flash1", "flash2", "--BH", "1", "--N", "17", "--d", "8",
                         "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ncu: not run (--no-ncu)" in out and "counted == model for every launch" in out
    for kernel in ("flash1", "flash2"):
        for pass_ in ("forward", "backward"):
            for name, kb in passes.model(kernel, pass_, 1, 17, 8).per_kernel.items():
                short = "fwd" if pass_ == "forward" else "bwd"
                line = next(line for line in out.splitlines() if line.startswith(f"{kernel} {short} {name} "))
                assert f"{kb.bytes_read:,}" in line and f"{kb.bytes_written:,}" in line
    rows = read_csv(tmp_path / "profile.csv")
    assert len(rows) == 8 and all(r["ncu_dram_read"] == "" for r in rows)
    assert "L2 hits" in (tmp_path / "profile.md").read_text()


def test_profile_runs_ncu_and_matches_its_launches_by_order(monkeypatch):
    args = Namespace(kernels=["flash1"], BH=1, N=17, d=8)
    seen = {}

    def fake_run(cmd, capture_output, text):
        seen["cmd"] = cmd
        rows = NCU_SAMPLE.splitlines(keepends=True)[4:]  # launches 0, 1 again as 2, 3: four launches
        more = [line.replace('"0","4242"', '"2","4242"').replace('"1","4242"', '"3","4242"') for line in rows]
        Path(cmd[cmd.index("--log-file") + 1]).write_text(NCU_SAMPLE + "".join(more))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(profile.subprocess, "run", fake_run)
    launches, note = profile.run_ncu("/opt/ncu", args)
    cmd = seen["cmd"]
    assert cmd[:6] == ["/opt/ncu", "--clock-control", "none", "--metrics",
                       "dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum", "--csv"]
    assert cmd[cmd.index("-m") + 1:cmd.index("-m") + 3] == ["flash_numba.tools.profile", "--child"]
    assert [launch.id for launch in launches] == [0, 1, 2, 3] and "4 launches" in note
    rows = profile.our_counts(args)
    assert [r.launch for r in rows] == ["init O, l, m", "Algorithm 1", "init dQ", "Algorithm 4"]
    assert profile.attach(rows, launches) is None
    assert (rows[0].dram_write, rows[1].dram_read, rows[3].l2_bytes) == (1280, 1.5e6, 2e6)
    assert "not matched" in profile.attach(rows, launches[:3])

    def denied(cmd, capture_output, text):
        return subprocess.CompletedProcess(cmd, 1, "", "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")

    monkeypatch.setattr(profile.subprocess, "run", denied)
    launches, note = profile.run_ncu("/opt/ncu", args)
    assert launches == [] and "denied (ERR_NVGPUCTRPERM)" in note


def test_an_io_model_error_fails_the_figures(tmp_path, monkeypatch, capsys):
    """No fallback hides a broken IO model: every figure that asks it fails, and so does the run."""
    real = iomodel.forward

    def broken(kernel, *args, **kw):
        if kernel == "flash2":
            raise NotImplementedError("flash2's IO model is broken")
        return real(kernel, *args, **kw)

    monkeypatch.setattr(iomodel, "forward", broken)
    assert figures.main(["--model-only", "--only", "1", "3", "6", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert all(f"figure {n}: FAILED" in out for n in (1, 3, 6)), out


# ---------------------------------------------------------------------------- no lost work


def _figure_that_measures(rows_before: int, then: BaseException | None):
    """A stand-in figure: records ``rows_before`` rows as it measures them, then raises ``then`` (or returns)."""
    def make(run):
        for i in range(rows_before):
            run.record({"kernel": "flash2", "N": 8 * (i + 1), "ms": 1.5 + i})
        if then is not None:
            raise then
        return []

    return make


def test_a_figure_that_fails_midway_keeps_its_measured_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(figures.FIGURES, 4, _figure_that_measures(2, ValueError("boom\nmore")))
    monkeypatch.setitem(figures.FIGURES, 5, _figure_that_measures(3, None))
    assert figures.main(["--model-only", "--only", "4", "5", "--out", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    points = tmp_path / "fig4_points.csv"
    assert f"figure 4: FAILED: ValueError: boom (2 row(s) it measured are in {points})" in out
    assert "Traceback" not in out + err
    assert err == f"flash-numba figures: failed: figure(s) 4; the others are in {tmp_path}\n"
    assert common.read_points(points) == [{"kernel": "flash2", "N": "8", "ms": "1.5"},
                                          {"kernel": "flash2", "N": "16", "ms": "2.5"}]
    assert not (tmp_path / "fig5_points.csv").exists()  # a figure that finished leaves no points file


def test_ctrl_c_in_a_figure_keeps_its_rows_and_the_figures_before(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(figures.FIGURES, 4, _figure_that_measures(1, None))
    monkeypatch.setitem(figures.FIGURES, 5, _figure_that_measures(1, KeyboardInterrupt()))
    assert figures.main(["--model-only", "--only", "4", "5", "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == (f"flash-numba figures: interrupted during figure 5 (1 row(s) it measured are in "
                           f"{tmp_path / 'fig5_points.csv'}); figure(s) 4 are in {tmp_path}")
    assert len(common.read_points(tmp_path / "fig5_points.csv")) == 1


def test_a_figure_writes_its_csv_before_its_png(tmp_path, monkeypatch, capsys):
    """Drawing fails: the data are already on disk, and so are the rows as they were measured."""
    def no_png(run, fig, stem):
        raise RuntimeError("cannot draw")

    monkeypatch.setattr(fig3_hbm_vs_seqlen, "save", no_png)
    assert figures.main(["--model-only", "--only", "3", "--out", str(tmp_path)]) == 1
    assert "figure 3: FAILED: RuntimeError: cannot draw" in capsys.readouterr().out
    rows = read_csv(tmp_path / "fig3_hbm_vs_seqlen.csv")
    assert rows and all(r["source"] == "model" for r in rows)
    assert len(common.read_points(tmp_path / "fig3_points.csv")) == len(rows)


def test_launch_times_name_a_repeated_launch_once(monkeypatch):
    """The split backward launches its dK/dV/dQ kernel once per round of key tiles: launch_times gives it one
    name, in the counters' order (figure 6 matches them), its time the sum of its launches."""
    import numpy as np

    import flash_numba as fn

    monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", 1)  # one copy: a round per key tile
    monkeypatch.setattr(timing, "LAUNCH_REPEATS", 1)
    monkeypatch.setattr(timing.LaunchTimer, "stop", lambda self: {n: float(self.names.count(n)) for n in self.names})
    q, k, v, do = passes.random_inputs(1, 40, 8)
    f = passes.forward("flash2_fast", q, k, v)
    arrays = {"q": q, "k": k, "v": v, "o": f.o, "lse": f.lse, "do": do}
    names, ms = timing.launch_times("flash2_fast", "backward", arrays)
    assert names == list(passes.model("flash2_fast", "backward", 1, 40, 8).per_kernel)
    Bc = fn.resolve_block("flash2_fast", 8, np.float32, pass_="backward")[1]
    assert ms["flash2_fast dK, dV, dQ (split)"] == -(-40 // Bc) > 1  # every round timed, summed


def test_launch_timer_gives_each_launch_its_own_events(monkeypatch):
    """The i-th launch's two events time the i-th counter asked for; a name's launches are summed; a launch
    count that differs from the counters' is an error, not a shifted table (fake events: no GPU here)."""
    from numba import cuda

    class Event:
        def __init__(self, t):
            self.t = t

        def synchronize(self):
            pass

    monkeypatch.setattr(timing.device, "SIMULATOR", False)
    monkeypatch.setattr(cuda, "event_elapsed_time", lambda a, b: b.t - a.t, raising=False)
    timer = timing.LaunchTimer()
    for name in ("S", "P", "S"):  # asked for up front, as the standard forward does
        timer.array(name)
    timer._pairs += [(Event(0), Event(2)), (Event(5), Event(6)), (Event(9), Event(12))]  # gaps: host time
    assert timer.stop() == {"S": 5, "P": 1}
    timer._pairs.pop()
    with pytest.raises(RuntimeError, match="2 launches timed for 3 counters"):
        timer.stop()
