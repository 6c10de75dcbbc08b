"""The command line: ``flash-numba tour`` / ``info`` and ``python -m flash_numba``."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flash_numba import cli, device, kernels, reference

ROW = re.compile(
    r"^(?P<kernel>\w+)\s+(?P<err_o>\S+)\s+(?P<err_lse>\S+)\s+(?P<read>[\d,]+)\s+(?P<written>[\d,]+)"
    r"\s+(?P<total>[\d,]+)\s+(?P<ratio>\S+)(?:\s+(?P<ms>\S+))?$"
)


def table_rows(out: str) -> dict:
    rows = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m and m["kernel"] != "kernel" and m["kernel"] in kernels.NAMES:
            rows[m["kernel"]] = m.groupdict()
    return rows


def _int(s):
    return int(s.replace(",", ""))


@pytest.mark.skipif(not device.SIMULATOR, reason="simulator sizes and wording")
def test_tour_in_the_simulator(capsys):
    assert cli.main(["tour", "--causal"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == device.describe()
    assert "(B, H, N, d) = (1, 1, 40, 16), float32, causal=True" in out
    rows = table_rows(out)
    assert list(rows) == [n for n in kernels.NAMES if "float32" in kernels.get(n).dtypes]  # the tour's dtype
    for r in rows.values():
        assert float(r["err_o"]) <= 1e-5 and float(r["err_lse"]) <= 1e-5
        assert _int(r["read"]) + _int(r["written"]) == _int(r["total"]) > 0
        assert r["ms"] is None
    assert rows["standard"]["ratio"] == "1.000x"
    for name in ("flash1", "flash2"):
        ratio = _int(rows[name]["total"]) / _int(rows["standard"]["total"])
        assert rows[name]["ratio"] == f"{ratio:.3f}x"
    assert "all results match the float64 reference" in out
    assert "times are not measured in the simulator" in out
    assert "not available" not in out


def test_tour_reports_a_mismatch(monkeypatch, capsys):
    monkeypatch.setattr(kernels, "NAMES", ("flash1",))
    exact = reference.attention_forward

    def off_by_a_little(q, k, v, **kw):
        o, lse = exact(q, k, v, **kw)
        return o + 1e-3, lse

    monkeypatch.setattr(reference, "attention_forward", off_by_a_little)
    assert cli.main(["tour"]) == 1
    assert "MISMATCH: flash1" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["tour", "info"])
def test_a_kernel_that_does_not_import_fails_the_command(monkeypatch, command):
    """No "not available" fallback: a listed kernel whose module is missing or broken raises."""
    monkeypatch.setattr(kernels, "NAMES", ("flash1", "flash9"))
    with pytest.raises((ModuleNotFoundError, ValueError), match="flash9"):
        cli.main([command])


def test_rel_error():
    ref = np.array([1.0, -2.0, -np.inf])
    assert cli.rel_error(ref, ref) == 0.0
    assert cli.rel_error([1.0, -1.0, -np.inf], ref) == pytest.approx(0.5)
    assert cli.rel_error([1.0, -2.0, 0.0], ref) == np.inf  # a -inf row must stay -inf
    assert cli.rel_error([np.nan, -2.0, -np.inf], ref) != cli.rel_error(ref, ref)


def test_usage_errors_exit_2(capsys):
    for argv in ([], ["bench-nothing"], ["tour", "--dtype", "int8"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2


def test_python_dash_m_runs_info():
    proc = subprocess.run([sys.executable, "-m", "flash_numba", "info"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("simulator" if device.SIMULATOR else "gpu: ")
    assert "block sizes (Br, Bc)" in proc.stdout


@pytest.mark.gpu
def test_tour_on_a_gpu(capsys):
    assert cli.main(["tour"]) == 0
    out = capsys.readouterr().out
    assert "(B, H, N, d) = (2, 4, 1024, 64)" in out
    rows = table_rows(out)
    assert list(rows) == [n for n in kernels.NAMES if "float32" in kernels.get(n).dtypes]
    assert all(float(r["ms"]) > 0 for r in rows.values())


@pytest.mark.parametrize("name, module", [("bench", "flash_numba.tools.bench"),
                                          ("figures", "flash_numba.tools.figures"),
                                          ("profile", "flash_numba.tools.profile")])
def test_delegated_subcommands_reach_their_module(monkeypatch, name, module):
    import importlib

    seen = {}
    monkeypatch.setattr(importlib.import_module(module), "main", lambda argv: seen.setdefault("argv", argv) and 0)
    assert cli.main([name, "--quick", "x"]) == 0
    assert seen["argv"] == ["--quick", "x"]


# ---------------------------------------------------------------------------- bad options: one line, exit 2


def _bad_options(tmp: Path) -> list:
    """``(argv, the option the error must name)``: every option the commands check, given a bad value."""
    a_file = tmp / "a_file.txt"
    a_file.write_text("not a directory\n")
    return [
        ([], "command"),
        (["nope"], "command"),
        (["tour", "--seed", "-5"], "--seed"),
        (["tour", "--seed", "x"], "--seed"),
        (["tour", "--dtype", "int8"], "--dtype"),
        (["bench", "--csv", "/no/such/dir/x.csv"], "--csv"),
        (["bench", "--csv", str(tmp)], "--csv"),
        (["bench", "--csv", str(a_file / "x.csv")], "--csv"),
        (["bench", "--plot", "/no/such/dir/x.png"], "--plot"),
        (["bench", "--n", "0"], "--n"),
        (["bench", "--n", "-5"], "--n"),
        (["bench", "--n", "1.5"], "--n"),
        (["bench", "--d", "0"], "--d"),
        (["bench", "--d", "129"], "--d"),
        (["bench", "--bh", "0"], "--bh"),
        (["bench", "--repeats", "0"], "--repeats"),
        (["bench", "--peak", "0"], "--peak"),
        (["bench", "--peak", "nan"], "--peak"),
        (["bench", "--kernels", "nope"], "--kernels"),
        (["bench", "--dtype", "int8"], "--dtype"),
        (["bench", "--causal", "maybe"], "--causal"),
        (["bench", "--pass", "bwd"], "--pass"),
        (["profile", "--kernels", "nope"], "--kernels"),
        (["profile", "--N", "-5"], "--N"),
        (["profile", "--N", "0"], "--N"),
        (["profile", "--d", "200"], "--d"),
        (["profile", "--d", "0"], "--d"),
        (["profile", "--BH", "0"], "--BH"),
        (["profile", "--out", str(a_file)], "--out"),
        (["profile", "--out", str(a_file / "sub")], "--out"),
        (["profile", "--ncu", "/no/such/ncu"], "--ncu"),
        (["figures", "--out", str(a_file)], "--out"),
        (["figures", "--out", str(a_file / "sub")], "--out"),
        (["figures", "--only", "7"], "--only"),
    ]


def test_every_bad_option_is_one_line_naming_it_and_exit_status_2(tmp_path, capsys, monkeypatch):
    """Refused while parsing: nothing runs (no mode line on stdout), no traceback, one line on stderr."""
    from flash_numba.tools import bench, figures, profile

    def never(*args, **kwargs):
        raise AssertionError("work started before the options were checked")

    for module, name in ((bench, "run"), (profile, "our_counts"), (profile, "_child"),
                         (reference, "attention_forward")):
        monkeypatch.setattr(module, name, never)
    monkeypatch.setattr(figures, "FIGURES", {n: never for n in figures.FIGURES})
    for argv, option in _bad_options(tmp_path):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        out, err = capsys.readouterr()
        assert e.value.code == 2, argv
        assert out == "", argv
        prog = " ".join(["flash-numba", *argv[:1]]) if argv and argv[0] != "nope" else "flash-numba"
        assert err.count("\n") == 1 and err.startswith(f"{prog}: error: "), (argv, err)
        assert f"argument {option}: " in err or err.endswith(f"required: {option}\n"), (argv, err)
        assert "Traceback" not in err


def test_profile_d_0_is_an_error_not_the_default(capsys):
    """``--d 0`` used to run d = 16 silently; 0 is a value, and it is refused."""
    with pytest.raises(SystemExit) as e:
        cli.main(["profile", "--d", "0", "--no-ncu"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "flash-numba profile: error: argument --d: expected an integer from 1 to 128, got 0\n"


@pytest.mark.parametrize("argv, message", [
    (["bench", "--csv", "/no/such/dir/x.csv", "--n", "8", "--d", "4", "--bh", "1"],
     "flash-numba bench: error: argument --csv: directory /no/such/dir does not exist"),
    (["tour", "--seed", "-5"], "flash-numba tour: error: argument --seed: expected an integer >= 0, got -5"),
])
def test_python_dash_m_prints_one_line_and_no_traceback(argv, message):
    """A real process: the line on stderr is all there is, and no traceback reaches it."""
    proc = subprocess.run([sys.executable, "-m", "flash_numba", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == message + "\n"
    assert proc.stdout == ""


def test_output_folders_are_made_when_missing(tmp_path, capsys):
    """--out of figures and profile is made with its parents (the documented behaviour); --csv's folder is not."""
    out = tmp_path / "new" / "sub"
    assert cli.main(["figures", "--model-only", "--only", "4", "--out", str(out)]) == 0
    assert out.is_dir() and "figure 4: skipped" in capsys.readouterr().out


def test_argcheck_types():
    from argparse import ArgumentTypeError

    from flash_numba.tools import argcheck

    assert argcheck.head_dim("128") == 128 and argcheck.positive("1") == 1 and argcheck.non_negative("0") == 0
    for parse, text in ((argcheck.head_dim, "129"), (argcheck.positive, "0"), (argcheck.non_negative, "-1"),
                        (argcheck.positive, "2.0"), (argcheck.positive_float, "-1"), (argcheck.positive_float, "inf"),
                        (argcheck.output_file, ""), (argcheck.output_dir, "")):
        with pytest.raises(ArgumentTypeError):
            parse(text)
    assert argcheck.positive_float("2.5") == 2.5
    assert argcheck.output_file("x.csv") == "x.csv"  # the current folder


def test_ctrl_c_is_one_line_and_status_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(reference, "attention_forward", interrupted)
    assert cli.main(["tour"]) == 130
    assert capsys.readouterr().err == "\nflash-numba tour: interrupted\n"
