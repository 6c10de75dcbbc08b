"""The command line: ``flash-numba tour`` / ``info`` and ``python -m flash_numba``."""

import re
import subprocess
import sys

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
    assert list(rows) == list(kernels.NAMES)
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
    assert list(rows) == list(kernels.NAMES)
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
