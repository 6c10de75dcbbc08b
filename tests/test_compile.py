"""The compile tier: every kernel builds for real GPUs (sm_75 and sm_90), as it ships.

The simulator never type-checks a kernel, so this tier compiles each module's
``compile_all`` to PTX with NVVM and assembles it with ptxas, one process per
kernel module with ``NUMBA_ENABLE_CUDASIM=0`` (``python -m flash_numba.compile_check
--kernels NAME``).  No GPU is needed; ptxas is (a missing ptxas fails the tier).

Two tiers (``--tier``, alias ``--compile-tier``, or the environment variable ``FLASH_NUMBA_TIER``):
``representative`` (the default, ``make test``) builds every kernel of every family for each cc, at
float32 and d = 64, each launch with each of its variants' features (causal, counting, dropout, 16-byte
copies...) at least once (``compile_check.representative``); ``all`` (``make test-all``) builds every
specialisation: every dtype, the head dims whose blocks differ, each spec's ``compile_groups``, every variant.
"""

import csv
import os
import re
import subprocess
import sys

import pytest

from flash_numba import compile_check, kernels
from flash_numba.device import SIMULATOR, STATIC_SHARED_LIMIT, dynamic_shared_limit

pytestmark = pytest.mark.compile


@pytest.mark.parametrize("name", kernels.ALL_NAMES)  # the decode kernels too
def test_every_kernel_compiles_for_sm75_and_sm90_within_48_kb(name, tmp_path, compile_tier):
    """One process per kernel module (pytest-xdist spreads the modules over its workers)."""
    assert compile_check.have_ptxas(), (
        "no ptxas found: the compile tier assembles every kernel to count its registers and spills; install the "
        "dev extra (nvidia-cuda-nvcc) or point FLASH_NUMBA_PTXAS at a ptxas of CUDA 13.x")
    out = tmp_path / "compile.csv"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run(
        [sys.executable, "-m", "flash_numba.compile_check", "--kernels", name, "--jobs", "1", "--csv", str(out),
         "--tier", compile_tier, "--require-ptxas"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, f"compile tier failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert f"{len(rows)} kernel specialisations compiled" in proc.stdout

    assert {r["module"] for r in rows} == {name}
    for cc in compile_check.CCS:
        assert any(r["cc"] == f"{cc[0]}.{cc[1]}" for r in rows), cc
    assert any(" count" in r["label"] for r in rows), "no counting build"
    assert len({(r["label"], r["cc"]) for r in rows}) == len(rows), "a specialisation is listed twice"
    too_big = [(r["label"], r["cc"], r["shared_bytes"]) for r in rows if int(r["shared_bytes"]) > STATIC_SHARED_LIMIT]
    assert not too_big
    # dynamic shared memory (labelled dynamic=<bytes>): above 48 KB, within what the cc lets a block opt in to
    for r in rows:
        dynamic = re.search(r" dynamic=(\d+)", r["label"])
        if dynamic:
            cc = tuple(int(x) for x in r["cc"].split("."))
            assert STATIC_SHARED_LIMIT < int(dynamic.group(1)) <= dynamic_shared_limit(cc), (r["label"], r["cc"])
    # two kernels' tiles in one dynamic array, a block using one of them (labelled aliased=<bytes>: flash2_tc's one
    # backward launch): dynamic for the aliasing, not the size, so within 48 KB with the static arrays (no opt-in)
    for r in rows:
        aliased = re.search(r" aliased=(\d+)", r["label"])
        if aliased:
            assert 0 < int(aliased.group(1)) + int(r["shared_bytes"]) <= STATIC_SHARED_LIMIT, (r["label"], r["cc"])

    # assembled as shipped: the register cap each launch runs with on that cc
    spec = kernels.get(name)
    for r in rows:
        launch = next((n for n in spec.max_registers if r["label"].startswith(n + " ")), None)
        if launch is not None:
            cc = tuple(int(x) for x in r["cc"].split("."))
            d = int(re.search(r" d=(\d+) ", r["label"]).group(1))
            dtype = re.search(r" (float16|float32|float64)\b", r["label"]).group(1)
            want = spec.register_cap(launch, cc, d, dtype, " dynamic=" in r["label"], " count" in r["label"])
            assert r["max_registers"] == ("" if want is None else str(want)), (r["label"], r["max_registers"])
    assert not spec.max_registers or any(r["max_registers"] for r in rows), "no launch was assembled with its cap"

    # floating-point atomics (their order changes from run to run) only in the atomic backward
    # (deterministic=False) and in flash2_fast's split backward, whose copies of dQ get one addition per element a
    # launch (test_flash2_fast's bitwise tests); the atomic backward has them
    atomic = [r["label"] for r in rows if int(r["float_atomics"])]
    allowed = set(spec.atomic_backward_launches) | {"flash2_fast dK, dV, dQ (split)"}
    assert all(any(label.startswith(n + " ") for n in allowed) for label in atomic), atomic
    assert any(label.startswith(n + " ") for n in spec.atomic_backward_launches for label in atomic) == \
        bool(spec.atomic_backward_launches)

    assert all(int(r["registers"]) > 0 for r in rows)
    spills = [(r["label"], r["spill_stores"], r["spill_loads"]) for r in rows
              if int(r["spill_stores"]) or int(r["spill_loads"])]
    assert not spills, f"{len(spills)} specialisations spill registers: {spills}"


def test_reading_shared_bytes_from_ptx_and_the_ptxas_report():
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


def test_counting_float_atomics_in_ptx():
    ptx = ("  atom.global.add.f32 %f1, [%rd1], %f2;\n\t@%p1 red.global.add.f64 [%rd1], %fd2;\n"
           "  atom.global.add.u64 %rd3, [%rd1], %rd2;\n  red.add.f32 [%rd1], %f3;\n")
    assert compile_check.ptx_float_atomics(ptx) == 3  # the int64 counter's add is not one


def test_a_compiled_item_without_a_cap_reads_as_uncapped():
    assert compile_check.Compiled(*("label", "ptx")) == compile_check.Compiled("label", "ptx", None)


@pytest.mark.skipif(not SIMULATOR, reason="this pytest process runs on a GPU")
def test_compile_check_refuses_to_run_in_the_simulator(capsys):
    assert compile_check.main([]) == 2
    assert "NUMBA_ENABLE_CUDASIM=0" in capsys.readouterr().err


def test_the_tiers_groups():
    flash2_fast = kernels.get("flash2_fast")
    assert compile_check.tier_groups(flash2_fast, "representative") == ((("float32",), (64,)),)
    assert compile_check.tier_groups(flash2_fast, "all") == compile_check.GROUPS + flash2_fast.compile_groups
    with pytest.raises(ValueError, match="^tier: expected one of representative, all"):
        compile_check.tier_groups(flash2_fast, "some")
    # the representative group builds the counting and the dropout variants
    dtypes, ds = compile_check.REPRESENTATIVE[0]
    assert compile_check.count_variants(dtypes[0], ds[0]) == (False, True)
    from flash_numba.kernels import _dropout
    assert _dropout.compile_variants(dtypes[0], ds[0], False) == (False, True)


def test_a_missing_ptxas_fails_the_compile_tier(monkeypatch, capsys):
    import numba

    monkeypatch.setattr(compile_check, "find_ptxas", lambda: None)
    monkeypatch.setattr(numba.config, "ENABLE_CUDASIM", False)  # as in the tier's own process
    assert compile_check.main(["--require-ptxas", "--kernels", "flash1"]) == 2
    assert "no ptxas found" in capsys.readouterr().err


def test_counted_builds_are_float32_at_d_64_only():
    assert compile_check.count_variants("float32", 64) == (False, True)
    assert compile_check.count_variants("float32", 128) == (False,)
    assert compile_check.count_variants("float16", 64) == (False,)


def test_the_representative_tier_builds_each_launch_with_each_of_its_features():
    labels = ["k fwd d=64 float32 sm_75", "k fwd d=64 float32 causal sm_75", "k fwd d=64 float32 count sm_75",
              "k fwd d=64 float32 causal count sm_75", "k fwd d=64 float32 dropout sm_75",
              "k fwd d=64 float32 causal dropout sm_75", "k D float32 sm_75", "k D float32 count sm_75",
              "k other d=64 float32 sm_75"]
    picked = compile_check.representative(labels)
    # fwd: causal count (two features), then the first with dropout; D: its counting build; other: itself
    assert picked == [3, 4, 7, 8]
    for launch in ("k fwd ", "k D ", "k other "):
        def features(ls):
            return {w for label in ls if label.startswith(launch) for w in label.split() if w in compile_check.FEATURES}
        assert features(labels[i] for i in picked) == features(labels)
    assert compile_check.representative([]) == []


def test_the_representative_tier_builds_only_what_it_picks(monkeypatch):
    """compile_module lists a module's builds with their PTX pending and builds the picked ones; the full tier
    builds every one."""
    from types import SimpleNamespace

    built = []

    def ptx(pyfunc, argtypes, cc, fastmath):  # stands in for NVVM: the "function" is its PTX
        built.append(pyfunc)
        return pyfunc

    ptx.cache_clear = lambda: None
    monkeypatch.setattr(compile_check, "_ptx", ptx)
    monkeypatch.setattr(compile_check, "ptxas_report", lambda ptx, cc, cap=None: None)
    variants = ("", " causal", " count", " causal count", " dropout")

    def compile_all(ccs, dtypes, ds):
        return [(f"k fwd {dtype} d={d}{v} sm_{cc[0]}{cc[1]}", compile_check.compile_ptx(f"ptx{v}", (), cc))
                for cc in ccs for dtype in dtypes for d in ds for v in variants]

    spec = SimpleNamespace(dtypes=("float32",), compile_groups=(), compile_all=compile_all)
    monkeypatch.setattr(kernels, "get", lambda name: spec)
    rows = compile_check.compile_module("k", tier="representative")
    assert [r.label for r in rows] == [f"k fwd float32 d=64{v} sm_{cc}" for cc in ("75", "90")
                                       for v in (" causal count", " dropout")]
    assert built == ["ptx causal count", "ptx dropout"] * 2
    assert not compile_check._pending
    built.clear()
    rows = compile_check.compile_module("k", tier="all")
    assert len(rows) == len(built) == len(variants) * sum(len(ds) * len(dt) for dt, ds in compile_check.GROUPS) * 2


def test_flash_decode_copies_ask_the_l2_for_128_bytes_and_its_cuda_core_blocks_fit_four_an_sm():
    """flash_decode's tensor-core kernel issues every cp.async with ``.L2::128B`` (tc.L2_PREFETCH, measured on the
    H200); its CUDA-core split kernel ships capped so that the split rule's RESIDENT_BLOCKS blocks of NT threads
    fit an SM's 65,536 registers (uncapped, the fused build had grown to 148: three blocks an SM, 1.3 waves)."""
    code = ("from flash_numba.kernels import flash_decode as fd\n"
            "from flash_numba.kernels.flash_decode import tc, kernels\n"
            "ptx = fd._tc_builds((9, 0), 'float16', 64)[0].ptx\n"
            "caps = [kernels.split_kernel(128, 'float16', rt, False, True, False, False, None, True)"
            ".targetoptions.get('max_registers') for rt in (1, 2, 4)]\n"
            "print('decode', tc.L2_PREFETCH, ptx.count('cp.async.cg.shared.global.L2::128B'),"
            " ptx.count('cp.async.cg.shared.global ['), fd.RESIDENT_BLOCKS * kernels.NT * max(caps))\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _, prefetch, hinted, plain, registers = proc.stdout.split()[-5:]
    assert int(prefetch) == 128
    assert int(hinted) > 0 and int(plain) == 0, proc.stdout
    assert int(registers) <= 65536, proc.stdout
