"""flash_numba.tools.bench: the harness validates before it times, and reports in a fixed structure.

In the simulator :func:`bench.main` runs end to end on tiny problems (no times):
these tests check the table and CSV structure, that every kernel in
``kernels.NAMES`` gets a row, that a wrong implementation stops the run
before anything is timed, the FLOP convention, the sweep the options give,
and, on made-up rows, the numbers the table, the CSV and the plot derive from
a time.  The gpu test runs a real sweep.
"""

import dataclasses
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from flash_numba import iomodel, kernels, reference
from flash_numba.tools import bench, timing
from flash_numba.tools import bench_cases as cases
from flash_numba.tools import bench_report as report
from flash_numba.device import SIMULATOR
from flash_numba.kernels import flash2

TINY = ["--n", "8", "--d", "4", "--bh", "1", "--causal", "true"]


#: The kernels the float32 runs here time (flash2_tc runs float16 and bfloat16)
FLOAT32_KERNELS = [n for n in kernels.NAMES if "float32" in kernels.get(n).dtypes]


def _wrong_kernel(monkeypatch, *, forward=None, backward=None):
    """Register a kernel "wrong": flash2's spec with its forward and/or backward replaced."""
    mod = dataclasses.replace(
        flash2.SPEC, name="wrong", forward=forward or flash2.SPEC.forward, backward=backward or flash2.SPEC.backward
    )
    real_get = kernels.get
    monkeypatch.setattr(kernels, "NAMES", kernels.NAMES + ("wrong",))
    monkeypatch.setattr(kernels, "get", lambda name: mod if name == "wrong" else real_get(name))


def _perturbed(array, index):
    """A device copy of ``array`` with one element moved by 1."""
    from numba import cuda

    host = array.copy_to_host()
    host[index] += 1.0
    return cuda.to_device(host)


# ---------------------------------------------------------------------------- end to end (simulator)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's end-to-end run")
def test_main_validates_then_prints_a_table_and_a_csv(tmp_path, capsys):
    path = tmp_path / "bench.csv"
    assert bench.main(TINY + ["--pass", "fwd+bwd", "--csv", str(path)]) == 0
    captured = capsys.readouterr()
    out, err = captured.out, captured.err

    # Validation first, in llm.c's words, then one table for the one configuration.
    assert out.count("All results match. Starting benchmarks.") == 1
    assert out.index("All results match.") < out.index("B*H = 1 (B=1, H=1), N = 8, d = 4, float32, causal, fwd+bwd:")
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("implementation"))
    assert (
        lines[head].split() == "implementation N d causal pass ms TFLOP/s % fp32 peak HBM bytes HBM by peak mem".split()
    )
    ours = cases.implementation_names("float32")  # every kernel that runs float32, then flash2_fast-atomic
    assert ours == FLOAT32_KERNELS + ["flash2_fast-atomic"]
    table = lines[head + 2 : head + 2 + len(ours)]
    assert [row.split()[0] for row in table] == ours
    for row in table:
        assert "n/a (simulator)" in row
        assert len(row) == len(lines[head])  # fixed width
    assert "FlashAttention-2's convention" in out

    # A progress line per validation and per row, on stderr.
    n = len(ours)
    assert f"[validate {n}/{n}]" in err
    assert f"[{n}/{n}] {ours[-1]} N=8 d=4 causal=True fwd+bwd" in err

    header, rows = report.read_csv(str(path))
    assert header[0].startswith("device: simulator")
    assert header[1].startswith("date: ")
    assert header[2] == "command: flash-numba bench " + " ".join(TINY + ["--pass", "fwd+bwd", "--csv", str(path)])
    assert [r["implementation"] for r in rows] == ours
    flops = cases.attention_flops(1, 8, 4, True, "fwd+bwd")
    for r in rows:
        assert (r["B"], r["H"], r["N"], r["d"], r["dtype"], r["causal"], r["pass"]) == (
            "1", "1", "8", "4", "float32", "True", "fwd+bwd"
        )  # fmt: skip
        assert (r["ms"], r["tflops"], r["peak_fraction"], r["peak_mem_bytes"]) == ("", "", "", "")
        assert int(r["flops"]) == flops and r["status"] == "ok" and r["hbm_source"] == "counted"
    # The counted bytes of the standard kernels are forward + backward, as the IO model predicts.
    model = iomodel.forward("standard", 1, 8, 8, 4, "float32", True) + iomodel.backward(
        "standard", 1, 8, 8, 4, "float32", True
    )
    assert int(rows[0]["hbm_bytes"]) == model.total


def test_a_wrong_forward_stops_the_run_before_timing(monkeypatch, capsys, tmp_path):
    def forward(prob, ops, block, counters):
        o, lse = flash2.forward(prob, ops, block, counters)
        return _perturbed(o, (0, prob.Nq - 1, 0)), lse

    _wrong_kernel(monkeypatch, forward=forward)
    path = tmp_path / "never.csv"
    assert bench.main(TINY + ["--kernels", "wrong", "--pass", "fwd", "--csv", str(path)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH wrong (B, H, N, d) = " in out
    assert "o max relative error" in out and "lse max relative error" not in out
    assert "VALIDATION FAILED" in out
    assert "All results match" not in out and "implementation" not in out
    assert not path.exists()


def test_a_wrong_backward_is_caught_when_the_backward_is_benchmarked(monkeypatch, capsys):
    def backward(prob, ops, block, counters):
        dq, dk, dv = flash2.backward(prob, ops, block, counters)
        return dq, _perturbed(dk, (0, 0, 0)), dv

    _wrong_kernel(monkeypatch, backward=backward)
    assert bench.main(TINY + ["--kernels", "wrong", "--pass", "both"]) == 1
    out = capsys.readouterr().out
    assert "dk max relative error" in out
    assert "dq max relative error" not in out and "dv max relative error" not in out
    assert "All results match" not in out


def test_the_last_head_is_checked_at_the_benchmark_size(monkeypatch):
    """On a GPU the benchmark size is validated on its first and last heads: break only the last."""

    def call(inp, cfg, count_hbm=False):
        q, k, v = (cases.to_host(x) for x in (inp.q, inp.k, inp.v))
        o, lse = reference.attention_forward(q, k, v, causal=cfg.causal)
        if cfg.BH > 1:
            o[-1, -1, 0, 0] += 1.0
        return {"o": o, "lse": lse}, None

    monkeypatch.setattr(bench, "SIMULATOR", False)
    monkeypatch.setattr(timing, "free_pending", lambda: None)  # the simulator has no deallocation queue
    cfg = cases.Config(2, 2, 8, 4, "float32", False, "fwd")
    mismatches, notes = bench.validate([cases.Impl("ref", call)], [cfg])
    assert notes == []
    assert len(mismatches) == 1 and "(B, H, N, d) = (2, 2, 8, 4)" in mismatches[0] and ": o max" in mismatches[0]


def test_standard_attention_is_skipped_when_its_n_by_n_buffers_do_not_fit(monkeypatch):
    from numba import cuda

    gpu = types.SimpleNamespace(get_memory_info=lambda: types.SimpleNamespace(free=10**9, total=2 * 10**9))
    monkeypatch.setattr(bench, "SIMULATOR", False)
    monkeypatch.setattr(timing, "free_pending", lambda: None)
    monkeypatch.setattr(cuda, "current_context", lambda: gpu)
    cfg = cases.Config(4, 8, 4096, 64, "float32", False, "fwd")  # S and P: 2 x 32 x 4096^2 x 4 bytes
    assert bench.no_room("standard", cfg) == "its N x N buffers need 4.29 GB, 1 GB free"
    assert bench.no_room("flash2", cfg) is None
    row = bench.measure(cases.Impl("standard", lambda *a: pytest.fail("must not run")), [None], cfg, 1)
    assert (row.ms, row.hbm_bytes, row.status) == (None, None, "skipped: its N x N buffers need 4.29 GB, 1 GB free")
    assert report.format_table([row], 50.0).endswith("  skipped: its N x N buffers need 4.29 GB, 1 GB free")


def test_a_torch_backend_that_cannot_run_here_is_dropped_with_a_note():
    def call(inp, cfg, count_hbm=False):
        raise RuntimeError("No available kernel. Aborting execution.")

    impls = [cases.Impl("torch-flash", call, is_torch=True)]
    mismatches, notes = bench.validate(impls, [cases.Config(1, 1, 8, 4, "float16", False, "fwd")])
    assert mismatches == [] and impls == []
    assert notes == ["torch-flash: not available here (No available kernel. Aborting execution.)"]


def test_any_other_error_is_not_swallowed():
    def call(inp, cfg, count_hbm=False):
        raise RuntimeError("an illegal memory access was encountered")

    with pytest.raises(bench.Failed, match="torch-math on B.H = 1 .*: RuntimeError: an illegal memory access") as e:
        bench.validate(
            [cases.Impl("torch-math", call, is_torch=True)], [cases.Config(1, 1, 8, 4, "float32", False, "fwd")]
        )
    assert isinstance(e.value.__cause__, RuntimeError)  # the original error is chained, not lost


def test_unknown_implementation_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--kernels", "flash9"])
    assert exc.value.code == 2
    assert "unknown implementation 'flash9'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--n", "0"], ["--d", "129"], ["--bh", "-1"], ["--repeats", "0"], ["--peak", "0"]])
def test_bad_numbers_are_refused(argv):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2


@pytest.mark.skipif(not SIMULATOR, reason="PyTorch rows exist on a GPU")
def test_torch_rows_are_noted_not_run_in_the_simulator(capsys):
    assert bench.main(TINY + ["--kernels", "torch-math", "torch-flash"]) == 1
    out = capsys.readouterr().out
    assert "torch-math: not run, it needs PyTorch and a GPU" in out
    assert "torch-flash: not run, PyTorch's backend does not take float32" in out
    assert "nothing to run" in out


# ---------------------------------------------------------------------------- conventions and the sweep


def test_flops_follow_flashattention2():
    fwd = 4 * 32 * 1024 * 1024 * 64
    assert cases.attention_flops(32, 1024, 64, False, "fwd") == fwd
    assert cases.attention_flops(32, 1024, 64, False, "fwd+bwd") == fwd + 10 * 32 * 1024 * 1024 * 64
    assert cases.attention_flops(32, 1024, 64, True, "fwd") == fwd / 2
    assert cases.attention_flops(32, 1024, 64, True, "fwd+bwd") == 3.5 * fwd / 2
    assert cases.Config(4, 8, 1024, 64, "float32", True, "fwd").flops == fwd / 2


@pytest.mark.parametrize("bh, B, H", [(32, 4, 8), (1, 1, 1), (2, 1, 2), (12, 3, 4), (7, 7, 1), (64, 8, 8)])
def test_split_bh(bh, B, H):
    assert cases.split_bh(bh) == (B, H)


def test_torch_backends_by_dtype():
    assert cases.torch_backends("float32") == ("torch-math", "torch-efficient")
    assert cases.torch_backends("float64") == ("torch-math",)
    assert set(cases.torch_backends("float16")) == set(cases.TORCH_BACKENDS)


def test_only_standard_attention_needs_n_by_n_memory():
    cfg = cases.Config(4, 8, 4096, 64, "float32", False, "fwd")
    assert cases.workspace_bytes("standard", cfg) == 2 * 32 * 4096**2 * 4
    assert cases.workspace_bytes("standard", cases.Config(4, 8, 4096, 64, "float16", False, "fwd+bwd")) == (
        6 * 32 * 4096**2 * 2
    )
    for name in kernels.NAMES:
        if name != "standard":
            assert cases.workspace_bytes(name, cfg) == 0


def _sweep(argv):
    parser = __import__("argparse").ArgumentParser()
    bench.add_arguments(parser)
    return bench.configs(parser.parse_args(argv))


def test_default_sweep_on_a_gpu(monkeypatch):
    monkeypatch.setattr(bench, "SIMULATOR", False)
    cfgs = _sweep([])
    assert len(cfgs) == 4 * 2 * 2
    assert {(c.B, c.H, c.d, c.dtype) for c in cfgs} == {(4, 8, 64, "float32")}
    assert sorted({c.N for c in cfgs}) == [1024, 2048, 4096, 8192]
    assert {(c.causal, c.pass_) for c in cfgs} == {(a, b) for a in (False, True) for b in ("fwd", "fwd+bwd")}
    quick = _sweep(["--quick"])
    assert sorted({c.N for c in quick}) == [1024, 2048] and {c.pass_ for c in quick} == {"fwd"}


def test_options_choose_the_sweep():
    cfgs = _sweep(["--n", "64", "128", "--d", "16", "32", "--bh", "2", "--dtype", "float16", "--causal", "false"])
    assert [(c.N, c.d, c.causal, c.pass_) for c in cfgs][:3] == [(64, 16, False, "fwd"), (64, 16, False, "fwd+bwd"),
                                                                  (64, 32, False, "fwd")]  # fmt: skip
    assert len(cfgs) == 2 * 2 * 2 and {(c.B, c.H, c.dtype) for c in cfgs} == {(1, 2, "float16")}
    if SIMULATOR:
        sim = _sweep([])
        assert sorted({c.N for c in sim}) == list(cases.SIMULATOR_N) and {c.BH for c in sim} == {1}


# ---------------------------------------------------------------------------- HBM bytes and errors


def test_hbm_bytes_come_from_the_io_model_above_the_count_limit(monkeypatch):
    cfg = cases.Config(1, 1, 64, 8, "float32", True, "fwd+bwd")
    assert cfg.BH * cfg.N**2 > cases.COUNT_LIMIT or not SIMULATOR
    monkeypatch.setattr(bench, "COUNT_LIMIT", 0)
    impl = cases.Impl("standard", lambda *a: pytest.fail("no kernel should run"))
    got = bench.hbm_bytes(impl, None, cfg)
    want = iomodel.forward("standard", 1, 64, 64, 8, "float32", True) + iomodel.backward(
        "standard", 1, 64, 64, 8, "float32", True
    )
    assert got == (want.total, "model")
    assert bench.hbm_bytes(cases.Impl("torch-math", None, is_torch=True), None, cfg) == (None, "n/a")


def test_max_rel_error():
    ref = np.array([1.0, -2.0, -np.inf])
    assert bench.max_rel_error(np.array([1.0, -2.0, -np.inf]), ref) == 0.0
    assert bench.max_rel_error(np.array([1.2, -2.0, -np.inf]), ref) == pytest.approx(0.1)
    assert bench.max_rel_error(np.array([1.0, -2.0, 0.0]), ref) == np.inf  # -inf must stay -inf
    assert bench.max_rel_error(np.array([np.nan, -2.0, -np.inf]), ref) == np.inf
    assert bench.max_rel_error(np.zeros(2), ref) == np.inf  # wrong shape


# ---------------------------------------------------------------------------- table, CSV and plot from times


def _timed_rows():
    rows = []
    for N, scale in ((1024, 1.0), (2048, 4.0)):
        cfg = cases.Config(4, 8, N, 64, "float32", False, "fwd")
        rows.append(
            report.Row("flash2", cfg, ms=2.0 * scale, hbm_bytes=123_000_000, hbm_source="counted", mem_bytes=2**21)
        )
        rows.append(report.Row("torch-math", cfg, ms=1.0 * scale, mem_bytes=5 * 10**9))
    rows.append(report.Row("standard", cases.Config(4, 8, 8192, 64, "float32", False, "fwd"), status="out of memory"))
    return rows


def test_table_derives_tflops_and_peak_fraction_from_the_time():
    rows = _timed_rows()
    text = report.format_table(rows[:2], peak_tflops=50.0)
    flops = cases.attention_flops(32, 1024, 64, False, "fwd")
    tflops = flops / 2e-3 / 1e12
    first = text.splitlines()[3].split()
    assert first[:6] == ["flash2", "1024", "64", "False", "fwd", "2.000"]
    assert first[6] == f"{tflops:.2f}" and first[7] == f"{100 * tflops / 50:.1f}%"
    assert first[8:] == ["123", "MB", "count", "2.1", "MB"]
    torch_row = text.splitlines()[4].split()
    assert torch_row[-4:] == ["-", "-", "5", "GB"]
    oom = report.format_table(rows[-1:], peak_tflops=None).splitlines()[-1]
    assert oom.startswith("standard") and oom.endswith("  out of memory")


def test_csv_round_trip(tmp_path):
    rows, path = _timed_rows(), tmp_path / "r.csv"
    report.write_csv(str(path), rows, ["device: test", "date: today"], peak_tflops=50.0)
    header, got = report.read_csv(str(path))
    assert header == ["device: test", "date: today"]
    assert list(got[0]) == list(report.CSV_FIELDS)
    assert len(got) == len(rows)
    assert float(got[0]["tflops"]) == pytest.approx(rows[0].tflops)
    assert float(got[0]["peak_fraction"]) == pytest.approx(rows[0].tflops / 50.0)
    assert (got[1]["hbm_bytes"], got[1]["hbm_source"], got[1]["peak_mem_bytes"]) == ("", "n/a", str(5 * 10**9))
    assert (got[-1]["ms"], got[-1]["status"]) == ("", "out of memory")


def test_plot_writes_an_image_only_when_there_are_times(tmp_path):
    path = tmp_path / "bench.png"
    assert report.plot(_timed_rows(), str(path), "test device, today")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not report.plot(
        [report.Row("flash2", cases.Config(1, 1, 8, 4, "float32", False, "fwd"))], str(path) + "2", "t"
    )
    assert not os.path.exists(str(path) + "2")


# ---------------------------------------------------------------------------- imports and the script

_NO_TORCH_NO_MATPLOTLIB = textwrap.dedent(
    """
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "matplotlib"):
                raise ImportError(f"{name} is blocked by the test")
    sys.meta_path.insert(0, Block())
    from flash_numba.tools import bench, bench_cases, timing
    assert timing.torch_cuda() is None
    print(len(bench_cases.implementation_names("float32")))
    """
)


def test_bench_imports_without_torch_and_matplotlib():
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH_NO_MATPLOTLIB], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(len(FLOAT32_KERNELS) + 1)  # and flash2_fast-atomic


def test_benchmarks_script_runs_the_harness():
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench.py")
    proc = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage: flash-numba bench" in proc.stdout and "--kernels" in proc.stdout


# ---------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_a_real_sweep_on_a_gpu(tmp_path, capsys):
    path = tmp_path / "gpu.csv"
    argv = ["--n", "256", "512", "--d", "64", "--bh", "4", "--repeats", "3", "--csv", str(path)]
    assert bench.main(argv) == 0
    assert "All results match. Starting benchmarks." in capsys.readouterr().out
    _, rows = report.read_csv(str(path))
    ours = [r for r in rows if r["implementation"] in kernels.NAMES]
    assert len(ours) == len(FLOAT32_KERNELS) * 2 * 2 * 2
    for r in rows:
        assert r["status"] == "ok", r
        assert float(r["ms"]) > 0 and 0 < float(r["peak_fraction"])
        assert int(r["peak_mem_bytes"]) >= 0
    for r in ours:
        assert r["hbm_source"] == "counted" and int(r["hbm_bytes"]) > 0


# ---------------------------------------------------------------------------- no lost work

SWEEP = ["--kernels", "flash2", "--n", "8", "16", "32", "--d", "4", "--bh", "1", "--causal", "false", "--pass", "fwd"]


def _fake_sweep(monkeypatch, fail_at: int, exc: BaseException, csv_path=None):
    """Validation passes at once; ``measure`` gives a made-up row, and raises ``exc`` on call ``fail_at``.

    Before each call it records the rows the CSV already holds (what a crash at that moment would leave).
    """
    monkeypatch.setattr(bench, "validate", lambda impls, cfgs, torch=None: ([], []))
    calls, on_disk = [], []

    def measure(impl, sets, cfg, repeats, torch=None):
        calls.append(cfg.N)
        if csv_path is not None:
            on_disk.append([r["N"] for r in report.read_csv(str(csv_path))[1]])
        if len(calls) == fail_at:
            raise exc
        return report.Row(impl.name, cfg, hbm_bytes=100 * cfg.N, hbm_source="counted")

    monkeypatch.setattr(bench, "measure", measure)
    return calls, on_disk


def test_a_sweep_that_fails_in_its_second_configuration_keeps_the_first_row(monkeypatch, tmp_path, capsys):
    path = tmp_path / "bench.csv"
    calls, on_disk = _fake_sweep(monkeypatch, 2, ValueError("boom\nsecond line"), path)
    assert bench.main(SWEEP + ["--csv", str(path)]) == 1
    assert calls == [8, 16]  # the sweep stops at the failure: N = 32 is not run
    assert on_disk == [[], ["8"]]  # the first row was on disk before the second was measured
    _, rows = report.read_csv(str(path))
    assert [(r["N"], r["status"], r["hbm_bytes"]) for r in rows[:1]] == [("8", "ok", "800")]
    where = "flash2 on B*H = 1 (B=1, H=1), N = 16, d = 4, float32, no mask, fwd: ValueError: boom"
    assert [(r["N"], r["status"]) for r in rows[1:]] == [("16", f"error: {where}")]  # where it stopped
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"flash-numba bench: failed: {where}; the rows measured so far are in {path}"
    assert not any("Traceback" in line for line in err)


def test_ctrl_c_keeps_the_rows_measured(monkeypatch, tmp_path, capsys):
    path = tmp_path / "bench.csv"
    _fake_sweep(monkeypatch, 3, KeyboardInterrupt())
    assert bench.main(SWEEP + ["--csv", str(path)]) == 130
    assert [r["N"] for r in report.read_csv(str(path))[1]] == ["8", "16"]
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"flash-numba bench: interrupted after 2 row(s); the rows measured so far are in {path}")


def test_a_validation_error_is_one_line_and_nothing_is_timed(monkeypatch, capsys):
    def boom(impls, cfgs, torch=None):
        raise bench.Failed("flash2", cases.Config(1, 1, 9, 4, "float32", False, "fwd"), ZeroDivisionError("x"))

    monkeypatch.setattr(bench, "validate", boom)
    monkeypatch.setattr(bench, "measure", lambda *a, **k: pytest.fail("measured after a failed validation"))
    assert bench.main(SWEEP) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "flash-numba bench: validation failed: flash2 on B*H = 1 (B=1, H=1), N = 9, d = 4, float32, no mask, fwd: "
        "ZeroDivisionError: x; nothing was timed")


@pytest.mark.parametrize("argv, option", [
    (["--csv", "/no/such/dir/x.csv"], "--csv"),
    (["--plot", "/no/such/dir/x.png"], "--plot"),
    (["--csv", "same.csv", "--plot", "same.csv"], "--plot"),
])
def test_an_unwritable_output_is_refused_before_any_measuring(monkeypatch, capsys, argv, option):
    called = []
    for name in ("validate", "measure", "input_sets"):
        monkeypatch.setattr(bench, name, lambda *a, _name=name, **k: called.append(_name))
    with pytest.raises(SystemExit) as e:
        bench.main(SWEEP + argv)
    assert e.value.code == 2 and called == []
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"flash-numba bench: error: argument {option}: ")


def test_a_block_that_does_not_fit_is_refused_before_any_measuring(monkeypatch, capsys):
    def no_block(kernel, d, dtype, block=None, pass_="forward"):
        raise ValueError(f"no block of {kernel} fits d = {d}")

    monkeypatch.setattr(bench, "resolve_block", no_block)
    monkeypatch.setattr(bench, "validate", lambda *a, **k: pytest.fail("validated"))
    with pytest.raises(SystemExit) as e:
        bench.main(SWEEP)
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "flash-numba bench: error: argument --d: flash2 cannot run d = 4 in float32 (forward): "
        "no block of flash2 fits d = 4\n")


def test_plot_without_matplotlib_is_refused_at_once(monkeypatch, capsys, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        bench.main(SWEEP + ["--plot", str(tmp_path / "x.png")])
    assert e.value.code == 2
    assert "argument --plot: needs matplotlib" in capsys.readouterr().err


def test_bfloat16_rows_round_their_inputs_and_skip_a_missing_backward():
    """The harness's bfloat16: inputs rounded to bfloat16 on the host (ties to even) so the float64 reference sees
    what the kernels see; standard runs it forward only; without PyTorch on a GPU nothing runs, with a reason."""
    from flash_numba.tools import bench_cases as bc

    x = np.array([1.0, 1 + 2.0**-8, 1 + 1.5 * 2.0**-8, 1 + 3 * 2.0**-8, -3.0e-3, np.inf], np.float32)
    want = np.array([1.0, 1.0, 1 + 2.0**-7, 1 + 2 * 2.0**-7, -0.0030059814453125, np.inf], np.float32)
    assert np.array_equal(bc.round_to_bfloat16(x), want)
    host = bc.host_inputs((1, 2, 5, 16), "bfloat16", seed=3)
    assert all(np.array_equal(bc.round_to_bfloat16(a), a) for a in host.values())
    assert not bc.backward_runs("standard", "bfloat16") and bc.backward_runs("standard", "float16")
    assert bc.backward_runs("flash2_tc-atomic", "bfloat16") and bc.backward_runs("torch-flash", "bfloat16")
    assert bc.implementation_names("bfloat16") == ["standard", "flash2_tc", "flash2_tc-atomic"]
    assert bc.itemsize("bfloat16") == 2 and bc.TOLERANCE["bfloat16"] == 8 * bc.TOLERANCE["float16"]
    with pytest.raises(ValueError, match="^dtype: bfloat16"):
        bc.to_device(host, None, "bfloat16")
