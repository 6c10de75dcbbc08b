"""The compile tier: build every kernel for real GPUs without a GPU.

The simulator never type-checks a kernel, so code that runs there can still fail
to compile for a GPU.  :func:`compile_ptx` asks Numba for PTX for a compute
capability (7.5 = Colab's T4, 9.0 = H100/H200); this needs ``numba-cuda[cu13]``
(NVVM from the CUDA wheels) but no GPU.  :func:`ptxas_report` then assembles the
PTX with the ``ptxas`` from the ``nvidia-cuda-nvcc`` wheel (13.5; the system's
13.0 ptxas rejects Numba's newer PTX) and reads its ``-v`` report: registers,
static shared memory, stack frame and spills per kernel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

CCS = ((7, 5), (9, 0))


def compile_ptx(pyfunc, argtypes, cc) -> str:
    """PTX for the Python function of a kernel at the given argument types and cc."""
    from numba import cuda

    ptx, _ = cuda.compile_ptx(pyfunc, tuple(argtypes), cc=cc, fastmath=getattr(pyfunc, "_fastmath", False))
    return ptx


@dataclass
class PtxasReport:
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


def find_ptxas() -> str | None:
    """The wheel's ptxas (nvidia/cu13/bin/ptxas) if installed, else None."""
    for base in sys.path:
        cand = os.path.join(base, "nvidia", "cu13", "bin", "ptxas")
        if os.path.isfile(cand):
            return cand
    env = os.environ.get("FLASH_NUMBA_PTXAS")
    if env and os.path.isfile(env):
        return env
    return None


def ptxas_report(ptx: str, cc) -> PtxasReport | None:
    """Assemble ``ptx`` for ``sm_XY`` and parse ``ptxas -v``; None without a usable ptxas."""
    exe = find_ptxas()
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run(
            [exe, "-v", f"-arch=sm_{cc[0]}{cc[1]}", src, "-o", os.path.join(tmp, "k.o")],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed for sm_{cc[0]}{cc[1]}:\n{proc.stderr[-2000:]}")
    text = proc.stderr
    regs = re.search(r"Used (\d+) registers", text)
    smem = re.search(r"(\d+) bytes smem", text)
    stack = re.search(r"(\d+) bytes stack frame", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return PtxasReport(
        registers=int(regs.group(1)) if regs else 0,
        shared_bytes=int(smem.group(1)) if smem else 0,
        stack_bytes=int(stack.group(1)) if stack else 0,
        spill_stores=int(spills.group(1)) if spills else 0,
        spill_loads=int(spills.group(2)) if spills else 0,
    )


def have_ptxas() -> bool:
    return find_ptxas() is not None or shutil.which("ptxas") is not None
