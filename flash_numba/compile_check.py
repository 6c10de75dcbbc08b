"""The compile tier: build every kernel for real GPUs without a GPU.

The simulator never type-checks a kernel, so code that runs there can still fail
to compile for a GPU.  :func:`compile_ptx` asks Numba for PTX for a compute
capability (7.5 = Colab's T4, 9.0 = H100/H200); this needs ``numba-cuda[cu13]``
(NVVM from the CUDA wheels) but no GPU.  :func:`ptxas_report` then assembles the
PTX with the ``ptxas`` from the ``nvidia-cuda-nvcc`` wheel (13.5; the system's
13.0 ptxas rejects Numba's newer PTX), with the register cap the kernel is
launched with (``--maxrregcount``, what Numba passes to its linker), and reads
its ``-v`` report: registers, static shared memory, stack frame and spills per
kernel.  :func:`compile_kernel` takes both the options and the cap from the
kernel's dispatcher, so the tier builds what ships.

Run it for every kernel module (this is what ``tests/test_compile.py`` does)::

    NUMBA_ENABLE_CUDASIM=0 python -m flash_numba.compile_check [--csv compile.csv]

It compiles each module's ``compile_all`` for cc 7.5 and 9.0, prints one row per
kernel specialisation (registers, static shared bytes, stack, spills) and exits
non-zero if anything failed to compile or declares more than 48 KB of static
shared memory.
"""

from __future__ import annotations

import argparse
import csv
import functools
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

from .device import STATIC_SHARED_LIMIT

CCS = ((7, 5), (9, 0))

#: (dtypes, head dims) handed to each module's ``compile_all``: every dtype at
#: d = 64, and the other head dims the tests use at float32 (d = 16 for flash2_fast only, in
#: its spec's ``compile_groups``: the readable kernels' d = 16 builds left the tier on 2026-12-01, when CI
#: reached 8 minutes (benchmarks/results/ci-2026-12-01-s10/README.md): their blocks come from the same 48 KB rule
#: at every d, and d = 16 holds fewer values per thread than the d = 64 and 80 builds that stay).  The
#: attention-dropout
#: variants are built for float32 at d = 64 only (not counting; see
#: :data:`flash_numba.kernels._dropout.COMPILED_WITH_DROPOUT`): every kernel's dropout
#: code is compiled and assembled (registers, spills) for both ccs without doubling the tier.
GROUPS = ((("float16", "float32", "float64"), (64,)), (("float32",), (80, 128)))
#: Storage dtypes and head dims whose counted builds (``count_hbm=True``) the tier compiles: the counters are
#: integer code that changes with neither the data's dtype nor d, and counted runs are not timed (a counted build
#: that spilled would be slower, not wrong).  With every dtype counted, CI took 7:09-8:33 on 2 cores, against its
#: 8 minutes; with float32 counted at every d, 8:35 (2026-12-01, benchmarks/results/ci-2026-12-01-s10/README.md).
COUNTED_DTYPES = ("float32",)
COUNTED_DS = (64,)

#: The representative tier (``make test``): every kernel of every family built for each cc, at float32 (a kernel
#: without float32, its first dtype: flash2_tc's float16) and d = 64, and of the variants a module's ``compile_all``
#: lists there only the few that :func:`representative` picks: each launch with each of its :data:`FEATURES` (the
#: causal mask, the counting build, dropout, 16-byte copies, ...) at least once per cc.  The full tier (``make
#: test-all``: :data:`GROUPS` and each spec's ``compile_groups``, every variant) adds the other dtypes and head dims,
#: whose blocks, register caps and spills differ, and every combination of the variants; run it before a kernel
#: change lands.
REPRESENTATIVE = ((("float32",), (64,)),)
TIERS = ("representative", "all")

#: The words of a compile-tier label that name a variant of a launch rather than the launch: the representative
#: tier builds each launch (its label without these words, per cc) once with each word that its variants carry.
FEATURES = ("causal", "count", "dropout", "aligned", "grouped", "paged", "sm75", "sm80")


def representative(labels) -> list[int]:
    """Indices into ``labels`` (one cc's compile-tier labels of one module) of the builds the representative tier
    keeps: per launch (a label without its :data:`FEATURES` words), the fewest builds, greedily, that carry every
    feature word any of its variants carries (a tie goes to the first listed); a launch without variants once.

    For example flash2_fast's forward at float32, d = 64 lists 12 variants (causal or not, counting or not, with
    dropout or not, 16-byte copies or not); two carry all four words: ``causal aligned dropout`` and ``count``."""
    launches: dict[str, list[tuple[int, frozenset]]] = {}
    for i, label in enumerate(labels):
        words = label.split()
        key = " ".join(w for w in words if w not in FEATURES)
        launches.setdefault(key, []).append((i, frozenset(w for w in words if w in FEATURES)))
    keep = []
    for variants in launches.values():
        need = frozenset().union(*(words for _, words in variants))
        if not need:
            keep.append(variants[0][0])
        while need:
            i, words = max(variants, key=lambda v: len(v[1] & need))  # the first of the best
            keep.append(i)
            need -= words
    return sorted(keep)


def tier_groups(spec, tier: str = "all") -> tuple:
    """The ``(dtypes, ds)`` groups the compile tier builds for a kernel's ``spec`` in ``tier``."""
    if tier not in TIERS:
        raise ValueError(f"tier: expected one of {', '.join(TIERS)}, got {tier!r}")
    if tier == "all":
        return GROUPS + tuple(spec.compile_groups)
    (dtypes, ds), = REPRESENTATIVE
    return ((dtypes if set(dtypes) <= set(spec.dtypes) else spec.dtypes[:1], ds),)


def count_variants(dtype, d: int) -> tuple[bool, ...]:
    """The ``count`` values a module's ``compile_all`` builds for storage ``dtype`` at head dim ``d``:
    (False, True) or (False,)."""
    return (False, True) if str(dtype) in COUNTED_DTYPES and d in COUNTED_DS else (False,)



#: numba-cuda 0.30.4 lowers a kernel differently only below cc 6.0 (float64
#: atomics) and 7.5 (fast tanh): from 7.5 up the LLVM IR is the same.
_SAME_LOWERING_FROM = (7, 5)


@dataclass(frozen=True)
class _TargetDevice:
    compute_capability: tuple


class Compiled(NamedTuple):
    """One kernel specialisation as the compile tier builds it: its PTX and the register cap it ships with."""

    label: str
    ptx: str
    max_registers: int | None = None


def compile_ptx(pyfunc, argtypes, cc, fastmath=None) -> str:
    """PTX for the Python function of a kernel at the given argument types and cc.

    ``fastmath``: the kernel's ``fastmath`` option (None: the function's ``_fastmath``
    attribute, else off; :func:`compile_kernel` reads it from the dispatcher).

    Typing and lowering to LLVM IR (about as long as NVVM takes) come out the same
    for every cc from 7.5 up, so the LLVM library of a kernel is kept (:func:`_library`)
    and only NVVM runs again for the next cc.  A kernel listed again (its factory
    returns the same function: a kernel that does not depend on d, in each d's list)
    is not compiled again (:func:`_ptx`).
    """
    fastmath = getattr(pyfunc, "_fastmath", False) if fastmath is None else fastmath
    fastmath = frozenset(fastmath) if isinstance(fastmath, (set, frozenset)) else bool(fastmath)
    args = (pyfunc, tuple(argtypes), tuple(cc), fastmath)
    return _Pending(args) if _pending else _ptx(*args)


#: True while :func:`compile_module` lists a module's builds before choosing some (the representative tier):
#: :func:`compile_ptx` then hands back a :class:`_Pending` that the chosen builds' PTX is made from.
_pending = False


@dataclass(frozen=True)
class _Pending:
    """The arguments of a PTX build not made yet (:func:`compile_module`'s representative tier)."""

    args: tuple

    def build(self) -> str:
        return _ptx(*self.args)


@functools.lru_cache(maxsize=None)
def _ptx(pyfunc, argtypes, cc, fastmath):
    lowering_cc = _SAME_LOWERING_FROM if cc >= _SAME_LOWERING_FROM else cc
    (ptx,) = _library(pyfunc, argtypes, lowering_cc, fastmath).get_asm_strs(cc=cc)
    return ptx


_OWN_CAP = object()


def compile_kernel(label: str, kernel, argtypes, cc, max_registers=_OWN_CAP) -> Compiled:
    """A Numba CUDA kernel (its dispatcher) built as it ships: its own ``fastmath`` and register cap.

    ``label`` gets `` sm_XY`` appended.  :func:`ptxas_report` assembles the PTX with the
    same register cap (``--maxrregcount``) that Numba passes to the linker at launch: the
    dispatcher's ``max_registers``, or ``max_registers`` where the kernel's cap depends on
    the device's compute capability (the kernel module's rule for ``cc``; the dispatcher
    is then built uncapped, so that its lowering serves every cc).
    """
    options = kernel.targetoptions
    ptx = compile_ptx(kernel.py_func, argtypes, cc, options.get("fastmath", False))
    cap = options.get("max_registers") if max_registers is _OWN_CAP else max_registers
    return Compiled(f"{label} sm_{cc[0]}{cc[1]}", ptx, cap)


@functools.lru_cache(maxsize=None)
def _library(pyfunc, argtypes, cc, fastmath=False):
    """Numba's code library of a kernel, lowered for ``cc``.

    This is what ``numba.cuda.compile_ptx`` does before it runs NVVM
    (``compiler._compile_pyfunc_with_fixup`` in numba-cuda 0.30.4).  A kernel
    that calls a ``@cuda.jit(device=True)`` function makes Numba type that
    function for the *current* device's cc, which fails without a GPU; ``cc``
    stands in for the device meanwhile.
    """
    from unittest import mock

    from numba.cuda import compiler, dispatcher

    with mock.patch.object(dispatcher, "get_current_device", lambda: _TargetDevice(cc)):
        lib, _ = compiler._compile_pyfunc_with_fixup(
            pyfunc, argtypes, device=False, fastmath=set(fastmath) if fastmath else False, cc=cc, abi="numba"
        )
    return lib


def ptx_float_atomics(ptx: str) -> int:
    """Floating-point atomic adds in a PTX module (``atom``/``red`` ``.add.f16/.f32/.f64``, any state space):
    the additions whose order changes from run to run."""
    return len(re.findall(r"^\s*(?:@%p\d+\s+)?(?:atom|red)(?:\.\w+)*\.add(?:\.\w+)*\.f(?:16|32|64)\b", ptx, flags=re.M))


def ptx_shared_bytes(ptx: str) -> int:
    """Static shared memory a PTX module declares (sum of its ``.shared`` arrays)."""
    return sum(int(n) for n in re.findall(r"^\s*(?:\.visible\s+)?\.shared\s+.*\[(\d+)\];", ptx, flags=re.M))


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


def ptxas_report(ptx: str, cc, max_registers: int | None = None) -> PtxasReport | None:
    """Assemble ``ptx`` for ``sm_XY`` (capped at ``max_registers``) and parse ``ptxas -v``; None without ptxas."""
    exe = find_ptxas()
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cap = [] if max_registers is None else [f"--maxrregcount={max_registers}"]
        proc = subprocess.run(
            [exe, "-v", *cap, f"-arch=sm_{cc[0]}{cc[1]}", src, "-o", os.path.join(tmp, "k.o")],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed for sm_{cc[0]}{cc[1]}:\n{proc.stderr[-2000:]}")
    return parse_ptxas(proc.stderr)


def parse_ptxas(text: str) -> PtxasReport:
    """The numbers in ``ptxas -v`` output for one kernel."""
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
    """Whether :func:`ptxas_report` can run (a ptxas on PATH is not used: it may be too old)."""
    return find_ptxas() is not None


@dataclass
class Row:
    """One compiled kernel specialisation."""

    module: str
    label: str
    cc: tuple
    shared_bytes: int  # static shared memory (from ptxas, else from the PTX)
    ptxas: PtxasReport | None
    max_registers: int | None = None  # the register cap it was assembled with (None: uncapped)
    float_atomics: int = 0  # floating-point atomic adds in its PTX (:func:`ptx_float_atomics`)

    def csv_fields(self) -> dict:
        r = self.ptxas
        return {
            "module": self.module,
            "label": self.label,
            "cc": f"{self.cc[0]}.{self.cc[1]}",
            "max_registers": "" if self.max_registers is None else self.max_registers,
            "registers": r.registers if r else "",
            "shared_bytes": self.shared_bytes,
            "stack_bytes": r.stack_bytes if r else "",
            "spill_stores": r.spill_stores if r else "",
            "spill_loads": r.spill_loads if r else "",
            "float_atomics": self.float_atomics,
        }


def compile_module(name: str, ccs=CCS, groups=None, tier: str = "all") -> list[Row]:
    """Compile every specialisation of ``flash_numba.kernels.<name>`` and assemble it with ptxas (``groups``:
    those of ``tier`` by default, :func:`tier_groups`)."""
    from . import kernels

    global _pending

    mod = kernels.get(name)
    groups = tier_groups(mod, tier) if groups is None else groups
    rows, seen, reports = [], set(), {}
    for dtypes, ds in groups:
        for cc in ccs:
            if tier == "representative":  # list the builds (PTX pending), keep those representative() picks
                _pending = True
                try:
                    items = [Compiled(*item) for item in mod.compile_all((cc,), dtypes, ds)]
                finally:
                    _pending = False
                items = [items[i] for i in representative([item.label for item in items])]
            else:
                items = [Compiled(*item) for item in mod.compile_all((cc,), dtypes, ds)]
            for label, ptx, cap in items:  # a plain (label, ptx) pair has no register cap
                ptx = ptx.build() if isinstance(ptx, _Pending) else ptx
                if (label, cc) in seen:  # a kernel not specialised on d comes back once per group
                    continue
                seen.add((label, cc))
                if (ptx, cc, cap) not in reports:  # the same kernel under two labels is assembled once
                    reports[ptx, cc, cap] = ptxas_report(ptx, cc, cap)
                rep = reports[ptx, cc, cap]
                shared = rep.shared_bytes if rep else ptx_shared_bytes(ptx)
                rows.append(Row(name, label, cc, shared, rep, cap, ptx_float_atomics(ptx)))
        _library.cache_clear()  # each group's kernels were lowered once for all ccs; free them
    _ptx.cache_clear()
    return rows


def _compile_in_worker(name: str, tier: str = "all") -> tuple[list[Row], str | None, float]:
    """:func:`compile_module` in a worker process: (rows, error or None, seconds)."""
    from . import compile_check  # this module as the kernels import it, not `python -m`'s copy (__main__)

    start = time.perf_counter()
    try:
        rows, error = compile_check.compile_module(name, tier=tier), None
    except Exception as exc:  # reported beside the other modules' results (and numba's errors may not pickle)
        rows, error = [], f"{type(exc).__name__}: {exc}"
    return rows, error, time.perf_counter() - start


def format_table(rows: list[Row]) -> str:
    """A fixed-width table: kernel, cc, registers, shared bytes, stack, spills."""
    w = max([len(r.label) for r in rows] + [6])
    lines = [f"{'kernel':<{w}}  {'cc':>3}  {'regs':>4}  {'shared B':>8}  {'stack B':>7}  {'spills st/ld':>12}"]
    for r in rows:
        f = r.csv_fields()
        spills = f"{f['spill_stores']}/{f['spill_loads']}" if r.ptxas else ""
        lines.append(
            f"{r.label:<{w}}  {f['cc']:>3}  {f['registers']:>4}  {r.shared_bytes:>8}  {f['stack_bytes']:>7}"
            f"  {spills:>12}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Compile every kernel module for cc 7.5 and 9.0; 0 if all compiled within the shared-memory limit."""
    parser = argparse.ArgumentParser(prog="python -m flash_numba.compile_check", description=main.__doc__)
    parser.add_argument("--csv", help="also write the table to this CSV file")
    parser.add_argument("--kernels", nargs="+", help="kernel modules (default: all of flash_numba.kernels.ALL_NAMES)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    parser.add_argument("--tier", choices=TIERS, default="all",
                        help="all: every specialisation (default); representative: float32 at d = 64, each launch with "
                             "each of its variants' features once (representative())")
    parser.add_argument("--require-ptxas", action="store_true",
                        help="fail when ptxas is missing (else shared bytes are read from the PTX, no registers)")
    args = parser.parse_args(argv)

    import numba

    from . import kernels

    if numba.config.ENABLE_CUDASIM:
        print("the compile tier needs the real CUDA target: run with NUMBA_ENABLE_CUDASIM=0", file=sys.stderr)
        return 2
    if args.require_ptxas and not have_ptxas():
        print("no ptxas found: install nvidia-cuda-nvcc (the dev extra) or set FLASH_NUMBA_PTXAS", file=sys.stderr)
        return 2
    names = args.kernels or kernels.ALL_NAMES
    jobs = max(1, min(args.jobs, len(names)))
    if jobs == 1:  # in this process: a worker would import Numba and the kernels again (seconds of the tier's time)
        results = [_compile_in_worker(name, args.tier) for name in names]
    else:  # one module per task: a worker keeps a kernel's lowering for both ccs (see _library)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_compile_in_worker, names, [args.tier] * len(names)))
    rows, failures = [], []
    for name, (got, error, seconds) in zip(names, results):
        print(f"{name}: {len(got)} specialisations in {seconds:.0f} s", file=sys.stderr)
        if error is not None:
            failures.append(f"{name}: {error}")
        elif not got:
            failures.append(f"{name}: compile_all returned no kernels")
        rows += got
    print(format_table(rows))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(Row("", "", (0, 0), 0, None).csv_fields()))
            writer.writeheader()
            writer.writerows(r.csv_fields() for r in rows)
    too_big = [r for r in rows if r.shared_bytes > STATIC_SHARED_LIMIT]
    failures += [f"{r.label} (cc {r.cc[0]}.{r.cc[1]}): {r.shared_bytes} bytes of static shared memory" for r in too_big]
    assembler = f"ptxas {find_ptxas()}" if have_ptxas() else "no ptxas found: shared bytes read from the PTX"
    print(f"{len(rows)} kernel specialisations compiled ({assembler})")
    for line in failures:
        print(f"FAILED {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
