"""Reliability (issue 6): bad input, and the scripts benchmarks/sanitize.py and benchmarks/reliability.py.

docs/RELIABILITY.md lists every bad-input case with its behaviour; the first test checks that
each row of that table names tests that exist (here, in tests/test_inputs.py, tests/test_strides.py or
the test matrix tests/test_kernels.py) and that the exception it states is the one those tests expect.
The numerics at the edges (large scores, one query or key, scale 0), NaN and Inf, and the kernels at
sizes that fit no block run for every kernel and dtype in the test matrix; the plain same-precision
baselines below serve tests/test_fuzz.py.
"""

import csv
import importlib.util
import math
import os
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest
from numba import cuda

import flash_numba
import test_inputs as inputs_tests  # tests/ is on sys.path (pytest's default rootdir import)
import test_strides as strides_tests
from flash_numba import _inputs, blocks, kernels, reference
from flash_numba.kernels import flash2_fast

ON_GPU = not flash_numba.device.SIMULATOR
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the kernels these float32 cases run (flash2_tc runs float16 and bfloat16: tests/test_flash2_tc.py, and its
# sanitizer run is benchmarks/tc_check.py)
KERNELS = tuple(name for name in kernels.NAMES if "float32" in kernels.get(name).dtypes)
ALL, FWD, BWD, FLASH = inputs_tests.ALL, inputs_tests.FWD, inputs_tests.BWD, inputs_tests.FLASH
make_args, call = inputs_tests.make_args, inputs_tests.call


def forward(kernel, q, k, v, **kw):
    return flash_numba.attention_forward(q, k, v, kernel=kernel, **kw)


def backward(kernel, q, k, v, o, lse, do, **kw):
    return flash_numba.attention_backward(q, k, v, o, lse, do, kernel=kernel, **kw)


def rel_err(got, want):
    """Max absolute error over max |want| (both as float64)."""
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def qkv(rng, Nq, Nk, d, dtype=np.float32, lead=(1,)):
    """q, k, v and dO of one (batch, head) by default."""
    q, k, v, do = (rng.standard_normal(lead + (n, d)) for n in (Nq, Nk, Nk, Nq))
    return tuple(x.astype(dtype) for x in (q, k, v, do))


def tiny_call_works():
    """The cheapest real kernel path (flash1, 1 x 1 blocks, Nq = 1, Nk = 2, d = 1) gives the right answer."""
    q, k, v = np.array([[0.5]]), np.array([[1.0], [-1.0]]), np.array([[2.0], [4.0]])
    res = flash_numba.flash_attention_forward(q, k, v, kernel="flash1", block=(1, 1))
    np.testing.assert_allclose(res.o, reference.attention_forward(q, k, v)[0], rtol=1e-12)


# ----------------------------------------------------------------------- the table in RELIABILITY.md


def _table_rows():
    """(case, functions, behaviour, tests) of each row of the bad-input table in docs/RELIABILITY.md."""
    with open(os.path.join(ROOT, "docs", "RELIABILITY.md")) as f:
        text = f.read()
    table = text.split("<!-- bad-input table -->")[1]
    rows = []
    for line in table.strip().splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if cells[0] == "case" or set(line.strip()) <= set("|-"):  # header, separator
            continue
        assert len(cells) == 4, line
        rows.append(cells)
    return rows


def test_every_table_row_names_tests_that_exist():
    rows = _table_rows()
    assert len(rows) >= 30
    import test_decode as decode_tests
    import test_flash2_tc as tc_tests
    import test_kernels as matrix_tests
    import test_spec as spec_tests

    cases = {"inputs": {c[0]: c[2] for c in inputs_tests.CASES}, "reliability": {c[0]: c[2] for c in NEW_CASES},
             "strides": {}, "kernels": {}, "tc": {}, "spec": {}, "decode": {}}
    modules = {"inputs": inputs_tests, "reliability": sys.modules[__name__], "strides": strides_tests,
               "kernels": matrix_tests, "tc": tc_tests, "spec": spec_tests, "decode": decode_tests}
    cited = {where: set() for where in cases}
    for case, functions, behaviour, tests in rows:
        names = re.findall(r"`([^`]+)`", tests)
        assert names, f"row {case!r} names no test"
        stated = re.match(r"\*\*(\w+)\*\*", behaviour)
        for name in names:
            where, _, test = name.partition(":")
            assert where in cases, name
            cited[where].add(test)
            if test in cases[where]:
                assert stated and stated.group(1) == cases[where][test].__name__, (case, test)
            else:
                assert test.startswith("test_") and callable(getattr(modules[where], test, None)), name
    for where in cases:
        missing = set(cases[where]) - cited[where]
        assert not missing, f"cases of {where} missing from the table: {missing}"


# ------------------------------------------------------------------------ bad input not in test_inputs


class _FakeGpuArray:
    """An object that says it lives on a GPU (``__cuda_array_interface__``), as a torch CUDA tensor does."""

    def __init__(self, x):
        self.shape, self.dtype = x.shape, x.dtype
        self.__cuda_array_interface__ = {"shape": x.shape, "typestr": x.dtype.str, "data": (0, False), "version": 3}


LONGDOUBLE = np.dtype(np.longdouble)
_all3 = inputs_tests._all3

NEW_CASES = [
    # (id, functions, exception, message regex, changes) as in test_inputs.CASES
    (
        "uint8",
        ALL,
        TypeError,
        r"^q: dtype uint8 is not supported; use float16, bfloat16, float32 or float64",
        _all3(lambda x: (x > 0).astype(np.uint8)),
    ),
    ("object", ALL, TypeError, r"^k: dtype object is not supported", {"k": lambda a: a["k"].astype(object)}),
    (
        "bfloat16-as-V2",
        ALL,
        TypeError,
        r"^q: dtype \|V2 is not supported",
        _all3(lambda x: x.astype(np.float16).view("V2")),
    ),
    (
        "d-over-block-limits",
        FLASH,
        ValueError,
        r"^block: \(Br, Bc\) = \(64, 8\) exceeds this kernel's limits Br <= 32",
        {"*": lambda a: make_args(np.random.default_rng(0), d=128), "kernel": "flash2", "block": (64, 8)},
    ),
    (
        "do-on-device",
        BWD,
        TypeError,
        r"^q, k, v, o, lse on the host but do on the device",
        {"do": lambda a: cuda.to_device(a["do"])},
    ),
    (
        "longdouble",
        ALL,
        TypeError,
        rf"^q: dtype {LONGDOUBLE.name} is not supported",
        _all3(lambda x: x.astype(np.longdouble)),
    ),
    (
        "kv-heads-not-dividing-q-heads",
        ALL,
        ValueError,
        r"^k: leading \(batch, head\) dims \(3,\) differ from q's \(2,\); only the head count may differ",
        {name: (lambda a, name=name: np.concatenate([a[name], a[name][:1]])) for name in ("k", "v")},
    ),
    (
        "gpu-array-in-simulator",
        ALL,
        TypeError,
        r"^q: a GPU array was given but flash_numba runs in the CUDA simulator",
        {"q": lambda a: _FakeGpuArray(a["q"])},
    ),
]
NEW_CASE_SKIPS = {
    "longdouble": (LONGDOUBLE.itemsize <= 8, "long double is float64 on this platform"),
    "gpu-array-in-simulator": (ON_GPU, "runs in the simulator only"),
}


def _skip_mark(case_id):
    skip, why = NEW_CASE_SKIPS.get(case_id, (False, "applies here"))
    return pytest.mark.skipif(skip, reason=why)


def _new_params():
    return [pytest.param(f, c, id=f"{f}-{c[0]}", marks=_skip_mark(c[0])) for c in NEW_CASES for f in ALL if f in c[1]]


@pytest.mark.parametrize("fname, case", _new_params())
def test_bad_argument_raises_and_the_next_call_works(rng, fname, case):
    _, _, exc, match, changes = case
    args, kwargs = inputs_tests.apply(changes, make_args(rng))
    with pytest.raises(exc, match=match):
        call(fname, args, **kwargs)
    tiny_call_works()


@pytest.mark.parametrize("pass_", ("forward", "backward"))
def test_flash2_fast_block_too_big_for_shared_memory(rng, monkeypatch, pass_):
    """The largest block flash2_fast's limits allow, at d = 128 in float64, needs more than 48 KB: refused on a
    device whose blocks get 48 KB (a T4's budget, stood in for here: an H200 opts in to 227 KB and runs it)."""
    monkeypatch.setattr(blocks, "dynamic_budget", blocks.shared_budget)
    d, dt = 128, np.float64
    Br, Bc = flash2_fast.block_limits(d, dt, pass_)
    need = flash2_fast.shared_bytes(Br, Bc, d, dt, pass_)
    assert need > blocks.shared_budget()
    args = make_args(rng, dtype=dt, Nq=3, Nk=3, d=d)
    fname = "flash_attention_forward" if pass_ == "forward" else "flash_attention_backward"
    with pytest.raises(ValueError, match=rf"^block: \(Br, Bc\) = \({Br}, {Bc}\) needs {need} bytes of shared memory"):
        call(fname, args, kernel="flash2_fast", block=(Br, Bc))
    tiny_call_works()


def test_flash2_fast_block_that_is_not_a_micro_tile(rng):
    with pytest.raises(ValueError, match=r"^block: .*multiple"):
        call("flash_attention_forward", make_args(rng), kernel="flash2_fast", block=(8, 24))


@pytest.mark.parametrize("kernel", ("flash1", "flash2", "flash2_fast"))
@pytest.mark.parametrize("dtype", ("float16", "float32", "float64"))
def test_every_head_dim_gets_a_block_that_fits(kernel, dtype):
    """d = 1..128 in every dtype: the default block of both passes exists and fits the shared memory a block of
    that kernel gets here (48 KB, or the opt-in limit for kernels with dynamic shared memory from cc 9.0)."""
    mod = kernels.get(kernel)
    budget = blocks.dynamic_budget() if mod.dynamic_shared else blocks.shared_budget()
    for d in range(1, _inputs.MAX_HEAD_DIM + 1):
        for pass_ in ("forward", "backward"):
            Br, Bc = flash_numba.resolve_block(kernel, d, dtype, pass_=pass_)
            assert mod.shared_bytes(Br, Bc, d, np.dtype(dtype), pass_) <= budget, (d, pass_)


@pytest.mark.parametrize("fname", ALL)
def test_arrays_on_another_gpu_are_refused(rng, fname, monkeypatch):
    """k on GPU 1 while the kernels run on GPU 0 (the device query is stubbed: one GPU here)."""
    args = inputs_tests.on_device(make_args(rng))
    k_ptr = None if not ON_GPU else args["k"].device_ctypes_pointer.value

    def ordinal(arr):  # the simulator hands the array itself on; a GPU, a view of the same memory
        is_k = arr is args["k"] if k_ptr is None else arr.device_ctypes_pointer.value == k_ptr
        return 1 if is_k else 0

    monkeypatch.setattr(_inputs, "_device_ordinal", ordinal)
    monkeypatch.setattr(_inputs, "_current_device", lambda: 0)
    with pytest.raises(ValueError, match=r"^k: on GPU 1 but flash_numba runs on GPU 0 .*select_device\(1\)"):
        call(fname, args)
    monkeypatch.undo()
    tiny_call_works()


@pytest.mark.gpu
def test_arrays_on_another_gpu_are_refused_on_a_real_second_gpu(rng):
    if len(cuda.gpus) < 2:
        pytest.skip("needs two GPUs")
    args = make_args(rng)
    with cuda.gpus[1]:
        k1 = cuda.to_device(args["k"])
    with cuda.gpus[0]:
        dev = inputs_tests.on_device(args)
        dev["k"] = k1
        with pytest.raises(ValueError, match=r"^k: on GPU 1 but flash_numba runs on GPU 0"):
            call("flash_attention_forward", dev)
        tiny_call_works()


# ----------------------------------------------------------------------------- numerics at the edges


def _plain_scale(dtype, d, scale):
    return dtype(1 / math.sqrt(d) if scale is None else scale)


def plain_forward(q, k, v, *, causal=False, dtype=np.float32, scale=None):
    """o and lse of attention done and rounded entirely in ``dtype``: the baseline of Dao-AILab's rule."""
    dtype = np.dtype(dtype).type
    q, k, v = (np.asarray(x).astype(dtype) for x in (q, k, v))
    S = reference.plain_matmul(q * _plain_scale(dtype, q.shape[-1], scale), k.swapaxes(-1, -2))  # (.., Nq, Nk)
    if causal:
        S = np.where(reference.causal_mask(q.shape[-2], k.shape[-2]), S, dtype(-np.inf))
    m = S.max(axis=-1, keepdims=True)
    P = np.exp(S - m)  # no row is fully masked in these tests
    l = P.sum(axis=-1, keepdims=True)
    return reference.plain_matmul(P / l, v), (m + np.log(l))[..., 0]


def plain_backward(q, k, v, do, *, causal=False, dtype=np.float32, scale=None):
    """dq, dk, dv done and rounded entirely in ``dtype`` (from P = softmax(S), as autograd keeps it)."""
    dtype = np.dtype(dtype).type
    q, k, v, do = (np.asarray(x).astype(dtype) for x in (q, k, v, do))
    s = _plain_scale(dtype, q.shape[-1], scale)
    S = reference.plain_matmul(q * s, k.swapaxes(-1, -2))  # (.., Nq, Nk)
    if causal:
        S = np.where(reference.causal_mask(q.shape[-2], k.shape[-2]), S, dtype(-np.inf))
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    P = P / P.sum(axis=-1, keepdims=True)
    mm = reference.plain_matmul  # the BLAS's rounding depends on the machine; this one does not
    o = mm(P, v)
    dS = P * (mm(do, v.swapaxes(-1, -2)) - (do * o).sum(axis=-1, keepdims=True))  # (.., Nq, Nk)
    return mm(dS, k) * s, mm(dS.swapaxes(-1, -2), q) * s, mm(P.swapaxes(-1, -2), do)


def run_both(kernel, q, k, v, do, **kw):
    f = forward(kernel, q, k, v, **kw)
    return f, backward(kernel, q, k, v, f.o, f.lse, do, **kw)


# ------------------------------------------------------------------------------------------ atomics


def test_deterministic_is_the_default():
    """Floating-point atomics run only behind ``deterministic=False`` (the compile tier reads them in each kernel's
    PTX: tests/test_compile.py); the default backward is the deterministic one."""
    import inspect

    for fname in ("attention_backward", "flash_attention_backward"):
        assert inspect.signature(getattr(flash_numba, fname)).parameters["deterministic"].default is True


# --------------------------------------------------------------------------------------- the scripts


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _script(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(ON_GPU, reason="checks what the scripts do without a GPU")
@pytest.mark.slow
def test_scripts_without_a_gpu_say_so_list_their_work_and_exit_0(tmp_path):
    out = _script("benchmarks/sanitize.py", "--quick")
    assert out.returncode == 0, out.stderr
    assert "no CUDA GPU" in out.stdout
    quick = _load("sanitize").cases(quick=True)
    assert {c.kernel for c in quick} == set(_load("sanitize").KERNELS)
    assert all(c.label in out.stdout for c in quick)

    out = _script("benchmarks/sanitize.py", "--matrix", str(tmp_path / "m"))
    assert out.returncode == 0, out.stderr
    assert "no CUDA GPU" in out.stdout and not (tmp_path / "m").exists()
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert re.search(rf"--tool {tool} --error-exitcode 1 \S*python\S* \S*benchmarks/sanitize.py", out.stdout)

    for what in ("determinism", "leaks"):
        out = _script("benchmarks/reliability.py", what, str(tmp_path / what))
        assert out.returncode == 0 and "no CUDA GPU" in out.stdout, out.stderr
        assert not (tmp_path / what).exists()


def test_sanitize_cases_cover_every_size_flag_and_kernel():
    san = _load("sanitize")
    assert {"flash2_fast-atomic", "flash2_tc", "flash2_tc-atomic"} <= set(san.KERNELS)
    assert set(kernels.NAMES) <= set(san.KERNELS)
    for quick in (False, True):
        todo = san.cases(quick)
        for kernel in san.KERNELS:
            mine = [c for c in todo if c.kernel == kernel]
            spec = kernels.get(kernel.removesuffix("-atomic"))
            assert all(spec.supports(c.d, c.dtype) is None for c in mine)
            assert {c.Nq for c in mine} | {c.Nk for c in mine} == {17, 97, 1000}
            assert {c.d for c in mine} == {16, 80, 128}
            assert {(c.causal, c.count) for c in mine} == {(False, False), (False, True), (True, False), (True, True)}
            assert any(c.Nq > c.Nk for c in mine) and any(c.Nq < c.Nk for c in mine)
    assert len(san.cases(quick=True)) < len(san.cases()) / 5


def test_sanitize_workload_case_runs_and_checks_its_outputs():
    san = _load("sanitize")
    assert san.run_case(san.Case("flash1", "float32", 3, 2, 2, True, True)) == ""


def test_sanitize_driver_parses_logs_and_writes_the_summary(tmp_path):
    san = _load("sanitize")
    log = "ok [1/3] flash1 float32 Nq=17\nok [2/3] flash2 float32 Nq=17\nFAILED [3/3] flash2 x\n"
    log += "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    log += "========= ERROR SUMMARY: 1,024 errors\n"
    assert san.parse_errors(log) == 1024 and san.parse_errors("no summary") is None
    assert san.parse_errors("========= ERROR SUMMARY: 1 error\n") == 1
    assert san.parse_covered(log) == {"flash1": 1, "flash2": 1}
    # run_tool on a stand-in for the sanitizer: streams, logs, returns the exit status
    fake = [
        sys.executable,
        "-c",
        "print('ok [1/1] standard float32 Nq=17'); print('========= ERROR SUMMARY: 0 errors')",
    ]
    text, rc, _ = san.run_tool(fake, str(tmp_path / "memcheck.log"), 60, "memcheck")
    assert rc == 0 and (tmp_path / "memcheck.log").read_text() == text
    clean = san.ToolResult(
        "memcheck", san.parse_covered(text), 1, san.parse_errors(text), rc, 1.0, "today", "GPU", "cmd"
    )
    _, rc_hung, _ = san.run_tool(
        [sys.executable, "-c", "import time; time.sleep(30)"], str(tmp_path / "x.log"), 0.5, "x"
    )
    assert rc_hung is None
    dirty = san.ToolResult("racecheck", san.parse_covered(log), 3, san.parse_errors(log), 1, 2.0, "today", "GPU", "cmd")
    assert clean.clean and not dirty.clean
    md, csv_path = san.write_summary([clean, dirty], str(tmp_path))
    table = pathlib.Path(md).read_text()
    assert "| memcheck | standard (1); 1/1 cases | 0 | 0 |" in table and "NOT clean" in table
    header = pathlib.Path(csv_path).read_text().splitlines()[0].split(",")
    assert header == [
        "tool",
        "kernels covered (cases ok)",
        "errors",
        "exit status",
        "wall time (s)",
        "date",
        "GPU",
        "command",
    ]


def test_sanitize_matrix_runs_every_tool_and_summarises(tmp_path, monkeypatch):
    """The driver's GPU path, with a stand-in compute-sanitizer that finds 2 errors with racecheck."""
    san = _load("sanitize")
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "tool = sys.argv[sys.argv.index('--tool') + 1]\n"
        "for i in range(1, 8):\n"
        "    print(f'ok [{i}/7] flash2 float32 Nq=17')\n"
        "n = 2 if tool == 'racecheck' else 0\n"
        "print(f'========= ERROR SUMMARY: {n} errors')\n"
        "sys.exit(1 if n else 0)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(flash_numba.device, "SIMULATOR", False)
    monkeypatch.setattr(flash_numba.device, "info", lambda: types.SimpleNamespace(name="Fake GPU"))
    out = tmp_path / "out"
    assert san.matrix(str(out), True, list(san.TOOLS), ("flash2",), str(fake), 60, 3) == 1
    with open(out / "sanitize.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["tool"], r["errors"], r["exit status"]) for r in rows] == [
        ("memcheck", "0", "0"),
        ("racecheck", "2", "1"),
        ("synccheck", "0", "0"),
    ]
    assert all(r["kernels covered (cases ok)"] == "flash2 (7); 7/7 cases" and r["GPU"] == "Fake GPU" for r in rows)
    assert all((out / f"{tool}.log").exists() for tool in san.TOOLS)


def test_reliability_determinism_and_leak_tables(tmp_path, monkeypatch):
    rel = _load("reliability")
    rows = rel.determinism_rows(("flash1",), N=3, d=2, repeats=2, causals=(True,))
    assert [(r["pass"], r["identical"], r["distinct results"]) for r in rows] == [
        ("forward", True, 1),
        ("backward", True, 1),
    ]
    paths = rel.write(str(tmp_path), "determinism", "Determinism", [("results", "results", rows)])
    assert pathlib.Path(paths[1]).read_text().startswith("kernel,pass,causal,N,d,repeats,identical")
    assert rel._max_diff([(np.array([1.0, -np.inf, np.nan]),), (np.array([1.5, -np.inf, np.nan]),)]) == 0.5
    assert rel._max_diff([(np.array([np.nan]),), (np.array([0.0]),)]) == np.inf
    # the leak verdict, with the kernels and the memory query stubbed
    monkeypatch.setattr(rel, "_forward", lambda *a: types.SimpleNamespace(o=None, lse=None))
    monkeypatch.setattr(rel, "_backward", lambda *a: None)
    flat, shrinking, growing = (
        (lambda i: 1e9, lambda i: 5),
        (lambda i: 1e9 - i * 2**16, lambda i: 5),
        (lambda i: 1e9, lambda i: 5 + i),
    )
    for (free, live), verdict in ((flat, "flat"), (shrinking, "LEAK?"), (growing, "LEAK?")):
        records = ((free(i), live(i)) for i in range(0, 1001, 10))  # (free bytes, live allocations) at call i
        monkeypatch.setattr(rel, "_flush_and_free", lambda records=records: next(records))
        rows, summary = rel.leak_rows(calls=100, every=10, N=4, d=4, warmup=0)
        assert len(rows) == 11 and summary["verdict"] == verdict, (verdict, summary)


def test_sanitize_reads_the_racecheck_summary():
    san = _load("sanitize")
    line = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert san.parse_errors(line) == 0
    assert san.parse_errors("========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)") == 2


# ---------------------------------------------------------------- memory exhaustion


def test_an_allocation_that_cannot_fit_is_one_clear_error(monkeypatch):
    """Checked against the free memory before allocating (large buffers), and a failed allocation is explained."""
    from flash_numba import _memory as _inputs

    monkeypatch.setattr(_inputs, "SIMULATOR", False)  # the check itself is host code: run it here too
    monkeypatch.setattr(_inputs, "free_bytes", lambda torch_device=None: (1000, 8000))
    made = []
    with pytest.raises(_inputs.DeviceMemoryError, match=r"needs 268,435,456 bytes, and 1,000 of the GPU's 8,000"):
        _inputs.allocate(lambda: made.append(1), (1 << 26,), np.float32)
    assert made == []  # refused before allocating

    class CudaAPIError(Exception):
        pass

    def fails():
        raise CudaAPIError("[2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY")

    with pytest.raises(_inputs.DeviceMemoryError, match=r"a \(4, 8\) float16 buffer of this call needs 64 bytes"):
        _inputs.allocate(fails, (4, 8), np.float16)

    def bug():
        raise CudaAPIError("CUDA_ERROR_ILLEGAL_ADDRESS")

    with pytest.raises(CudaAPIError):  # not an allocation failure: not ours to explain
        _inputs.allocate(bug, (4, 8), np.float16)


@pytest.mark.gpu
def test_out_of_memory_on_the_gpu_then_the_next_call_runs():
    """standard's S and P at a size that cannot fit (Numba arrays and PyTorch tensors), and an output that cannot
    fit: a DeviceMemoryError naming the bytes, before any launch; then an ordinary call gives the right result."""
    from numba import cuda

    from flash_numba import DeviceMemoryError, device

    total = device.info().total_memory
    if total is None or total > 200 * 2**30:
        pytest.skip("sized for GPUs of at most 200 GiB")
    rng = np.random.default_rng(5)
    small = [rng.standard_normal((2, 64, 32)).astype(np.float32) for _ in range(3)]
    want = flash_numba.attention_forward(*small, kernel="flash2").o
    N = 1 << 16  # S and P: 2 * 64 * N^2 * 4 bytes = 2.2 TB
    big = cuda.device_array((64, N, 16), dtype=np.float32)
    with pytest.raises(DeviceMemoryError, match="bytes"):
        flash_numba.attention_forward(big, big, big, kernel="standard")
    np.testing.assert_array_equal(flash_numba.attention_forward(*small, kernel="flash2").o, want)
    del big
    try:
        import torch
    except ImportError:
        return
    rows = int(0.6 * total) // (2 * 128)  # q (= k = v) 60% of the GPU: o cannot fit beside it
    q = torch.empty((1, 1, rows, 128), dtype=torch.float16, device="cuda")
    with pytest.raises(DeviceMemoryError, match="free"):
        flash_numba.attention_forward(q, q, q, kernel="flash2")  # (flash2_fast refuses a head this long first)
    with pytest.raises(ValueError, match="over flash2_fast's limit"):  # refused before any copy of q
        flash_numba.attention_forward(q, q, q, kernel="flash2_fast")
    del q
    torch.cuda.empty_cache()
    np.testing.assert_array_equal(flash_numba.attention_forward(*small, kernel="flash2").o, want)
