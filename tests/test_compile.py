"""The compile tier: every kernel specialisation builds for real GPUs (sm_75 and sm_90).

The simulator never type-checks a kernel, so this tier compiles each module's
``compile_all`` to PTX with NVVM and assembles it with ptxas, in one process
with ``NUMBA_ENABLE_CUDASIM=0`` (``python -m flash_numba.compile_check``).
No GPU is needed.
"""

import csv
import os
import subprocess
import sys

import pytest

from flash_numba import compile_check, kernels
from flash_numba.device import SIMULATOR, STATIC_SHARED_LIMIT

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Rows of the CSV that ``python -m flash_numba.compile_check`` writes, and its output."""
    out = tmp_path_factory.mktemp("compile") / "compile.csv"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run(
        [sys.executable, "-m", "flash_numba.compile_check", "--csv", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"compile tier failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    with open(out, newline="") as f:
        return list(csv.DictReader(f)), proc.stdout


def test_every_module_compiles_for_both_compute_capabilities(compiled):
    rows, stdout = compiled
    for name in kernels.NAMES:
        for cc in compile_check.CCS:
            got = [r for r in rows if r["module"] == name and r["cc"] == f"{cc[0]}.{cc[1]}"]
            assert got, f"no {name} kernel compiled for cc {cc}"
    assert len({(r["label"], r["cc"]) for r in rows}) == len(rows), "a specialisation is listed twice"
    assert f"{len(rows)} kernel specialisations compiled" in stdout


def test_static_shared_memory_fits_48_kb(compiled):
    rows, _ = compiled
    too_big = [(r["label"], r["cc"], r["shared_bytes"]) for r in rows if int(r["shared_bytes"]) > STATIC_SHARED_LIMIT]
    assert not too_big


@pytest.mark.skipif(not compile_check.have_ptxas(), reason="no ptxas (install the dev extra: nvidia-cuda-nvcc)")
def test_ptxas_reports_registers_for_every_kernel(compiled):
    rows, _ = compiled
    assert all(int(r["registers"]) > 0 for r in rows)


def test_shared_bytes_read_from_ptx_match_ptxas():
    ptx = """
.visible .shared .align 4 .b8 _cudapy_smem_1[4096];
.visible .shared .align 8 .b8 _cudapy_smem_2[2176];
.extern .shared .align 16 .b8 dynamic_smem[];
"""
    assert compile_check.ptx_shared_bytes(ptx) == 6272
    report = compile_check.parse_ptxas(
        "ptxas info    : Function properties for k\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 14 registers, used 1 barriers, 6272 bytes smem\n"
    )
    assert report == compile_check.PtxasReport(14, 6272, 8, 4, 12)


@pytest.mark.skipif(not SIMULATOR, reason="this pytest process runs on a GPU")
def test_compile_check_refuses_to_run_in_the_simulator(capsys):
    assert compile_check.main([]) == 2
    assert "NUMBA_ENABLE_CUDASIM=0" in capsys.readouterr().err
