"""The decode benchmark: ``flash-numba bench --pass decode`` (or ``python -m flash_numba.tools.bench_decode``).

One decoding step, B = 8 sequences, Hq = 32 query heads, Hkv = 8 KV heads (grouped-query attention, G = 4),
d = 128, float16 and bfloat16 (``--dtype``), one new token (Nq = 1), a KV cache of N = 4k ... 128k tokens.  The
same three steps as :mod:`flash_numba.tools.bench`:

1. **Validate**: ``flash_decode`` against the float64 reference (:func:`flash_numba.reference.decode_reference`)
   on a small ragged, paged problem, and at every benchmark size against PyTorch's math path upcast to float32
   (two sequences); its counted bytes against the IO model at every size (``--count``: the dtypes counted).
2. **Time**, every implementation the same way (:func:`queued_ms`): ``--repeats`` calls queued back to back on
   the default stream between two CUDA events, behind a sleep kernel that holds the GPU until the host has queued
   them all, so the GPU runs them back to back: ``ms`` is the GPU's time a call (kernels and the gaps between
   launches), no host latency in it, for ours and PyTorch's alike.  Beside it: ``host_ms``, the host's time to
   queue one call; ``loop_ms``, the same calls without the sleep (where the host takes longer per call than the
   GPU, the GPU waits: what a loop of calls sees); ``launch_ms`` (ours), the previous method, each launch bracketed
   by its own two events around Numba's Python launch path (:class:`~flash_numba.tools.timing.LaunchTimer`), which
   counts the host's launch work as GPU time; ``call_ms`` (``flash_decode``, ``flash_decode-paged``), whole
   ``attention_decode`` calls back to back, host checks included (they copy the lengths back to the host: a
   synchronisation each call).  Our calls in ``ms``, ``host_ms``, ``loop_ms``: the launches of a call checked once
   per input set (:func:`prepared`), as PyTorch's calls check nothing on the host, then launched as
   :func:`flash_numba.attention_decode` launches them (its launch plan replayed: :func:`step`).  Calls rotate among
   KV caches that together exceed 3x the L2 cache (the paged cache and the repeated K, V for memory-efficient: one
   copy).
3. **Report**: a fixed-width table per cache length and a CSV with the harness's columns
   (:data:`flash_numba.tools.bench_report.CSV_FIELDS`: ``pass`` = ``decode``, ``H`` = query heads, ``N`` =
   cache length, ``flops`` = 4 B Hq N d) and two more: ``kv_gbps`` (the KV bytes of the Hkv heads,
   2 B Hkv N d s, over ``ms``: how fast the cache streams), ``num_splits``, ``host_ms``, ``loop_ms``,
   ``launch_ms`` and ``call_ms``.  ``benchmarks/decode_sweep.sh OUT`` runs the issue's sweep and draws its figure.

Implementations: ``flash_decode`` (``num_splits=None``: the rule's choice, the default path: tensor cores on
sm_80+), ``flash_decode-paged`` (the same cache in shuffled pages of 256 rows), ``flash_decode-s<S>`` (S splits
forced; ``-s1`` is "without splits"), ``flash_decode-cuda`` and ``flash_decode-paged-cuda`` (the CUDA-core split
kernel, forced with ``_switches.DECODE_PATH``; its own split rule), ``flash_decode-st<n>`` (the tensor-core kernel
with n pipeline stages a warp instead of :data:`~flash_numba.kernels.flash_decode.tc.STAGES`; the split rule for
that many), ``flash_decode-t4`` (the CUDA-core kernel with four keys in flight a lane group instead of its rule's
two at four rows a block: a measurement of that choice), ``-unfused`` / ``-fused`` (the partials merged by a
combine kernel launched after the split kernel, or by the split kernel's last block of each group:
:data:`~flash_numba.kernels.flash_decode.FUSE_COMBINE` is the default),
``flash2_fast`` and ``flash2_tc`` (the prefill kernels at Nq = 1, for contrast: B*Hq blocks; flash2_fast has no
bfloat16), and PyTorch SDPA pinned to a
backend: ``torch-flash`` and ``torch-cudnn`` (``enable_gqa=True``), ``torch-efficient`` (it refuses
``enable_gqa``: K and V repeated to Hq heads before timing) and ``torch-math`` (``enable_gqa=True``).
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys

import numpy as np

from .. import device
from ..decode import attention_decode
from ..iomodel import flash_decode as model
from ..reference import decode_reference
from . import csvfile

B, HQ, HKV, D = 8, 32, 8, 128
DEFAULT_N = (4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_SPLITS = (1, 4, 8, 32, 64)
PAGE_SIZE = 256
WARMUP, REPEATS = 3, 10
TOLERANCE = 2e-2  # max |x - ref| / max |ref| for float16 outputs (the harness's float16 rule)
TORCH = {"torch-flash": "FLASH_ATTENTION", "torch-cudnn": "CUDNN_ATTENTION", "torch-efficient": "EFFICIENT_ATTENTION",
         "torch-math": "MATH"}
FIELDS = ("implementation", "B", "H", "N", "d", "dtype", "causal", "pass", "ms", "tflops", "peak_fraction", "flops",
          "hbm_bytes", "hbm_source", "peak_mem_bytes", "status", "kv_gbps", "num_splits", "host_ms", "loop_ms",
          "launch_ms", "call_ms")
#: The implementations whose whole public call is timed too (``call_ms``).
PUBLIC = ("flash_decode", "flash_decode-paged")
#: The prefill kernels called with one query token, for contrast (flash2_fast: CUDA cores, float16; flash2_tc:
#: tensor cores, float16 and bfloat16).
PREFILL = ("flash2_fast", "flash2_tc")


class Case:
    """The caches of one length: ``sets`` of (q, k, v) torch tensors, the paged copies, the repeated K, V."""

    def __init__(self, torch, N: int, dtype: str, n_sets: int):
        self.N, self.dtype = N, dtype
        tdt = getattr(torch, dtype)
        g = torch.Generator(device="cuda").manual_seed(N)
        self.sets = []
        for _ in range(n_sets):
            q = torch.randn(B, HQ, 1, D, device="cuda", dtype=tdt, generator=g)
            k = torch.randn(B, HKV, N, D, device="cuda", dtype=tdt, generator=g)
            v = torch.randn(B, HKV, N, D, device="cuda", dtype=tdt, generator=g)
            self.sets.append((q, k, v))
        self.seqlens = torch.full((B,), N, dtype=torch.int32, device="cuda")
        self._paged = self._rep = None
        self.torch = torch

    def paged(self):
        """Set 0's cache as shuffled pages of PAGE_SIZE rows and its block table (built once)."""
        if self._paged is None:
            torch = self.torch
            q, k, v = self.sets[0]
            per = -(-self.N // PAGE_SIZE)
            perm = torch.randperm(B * per, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
            table = perm.view(B, per).to(torch.int32)

            def pages(x):
                x = torch.nn.functional.pad(x, (0, 0, 0, per * PAGE_SIZE - self.N))  # (B, Hkv, per*P, d)
                x = x.view(B, HKV, per, PAGE_SIZE, D).permute(0, 2, 1, 3, 4).reshape(B * per, HKV, PAGE_SIZE, D)
                out = torch.empty_like(x)
                out[perm] = x  # sequence b's page p lands at perm[b*per + p]
                return out

            self._paged = (q, pages(k), pages(v), table)
        return self._paged

    def repeated(self, i):
        """K and V of set i repeated to Hq heads (memory-efficient refuses enable_gqa); set 0 only, kept."""
        if self._rep is None:
            q, k, v = self.sets[0]
            self._rep = (q, k.repeat_interleave(HQ // HKV, dim=1), v.repeat_interleave(HQ // HKV, dim=1))
        return self._rep


def implementations(splits) -> list[str]:
    return (["flash_decode", "flash_decode-paged", "flash_decode-paged-s1", "flash_decode-cuda",
             "flash_decode-paged-cuda", "flash_decode-unfused", "flash_decode-st3", "flash_decode-t4"]
            + [f"flash_decode-s{s}" for s in splits]
            + list(PREFILL) + list(TORCH))


def variant(name: str) -> dict:
    """What a ``flash_decode...`` name asks for: paged, path (None: the default), stages, splits, keys in flight,
    fused (None: the default; ``-unfused``: the combine kernel launched after the split kernel, ``-fused``: merged
    by its last blocks)."""
    parts = name.split("-")[1:]
    out = {"paged": "paged" in parts, "path": "cuda" if "cuda" in parts or "t4" in parts else None,
           "stages": None, "splits": None, "keys_in_flight": 4 if "t4" in parts else None,
           "fused": False if "unfused" in parts else True if "fused" in parts else None}
    for p in parts:
        if p.startswith("st") and p[2:].isdigit():
            out["stages"] = int(p[2:])
        elif p.startswith("s") and p[1:].isdigit():
            out["splits"] = int(p[1:])
    return out


def prepared(name: str, case: Case, i: int):
    """(prob, ops) of a ``flash_decode...`` name on input set i: checked once, its variant's settings applied (the
    path switch set while the split rule runs)."""
    from .. import _switches
    from .. import decode as _decode

    var = variant(name)
    q, k, v = case.sets[i]
    table = None
    if var["paged"]:
        q, k, v, table = case.paged()
    saved = _switches.DECODE_PATH
    _switches.DECODE_PATH = var["path"] or saved
    try:
        prob, ops = _decode.prepare(q, k, v, case.seqlens, table, None, False, None, None)
        prob.stages, prob.keys_in_flight, prob.fused = var["stages"], var["keys_in_flight"], var["fused"]
        prob.num_splits = var["splits"] or _decode._num_splits(None, prob, case.N)
    finally:
        _switches.DECODE_PATH = saved
    return prob, ops


def call(name: str, case: Case, i: int, count_hbm: bool = False):
    """One decode step of ``name`` on input set i: (o, DecodeResult or None)."""
    torch = case.torch
    q, k, v = case.sets[i]
    if name == "flash_decode" or name == "flash_decode-paged":  # the public call
        table = None
        if name == "flash_decode-paged":
            q, k, v, table = case.paged()
        r = attention_decode(q, k, v, cache_seqlens=case.seqlens, block_table=table, count_hbm=count_hbm)
        return r.o, r
    if ours(name):  # a variant: the kernels of a prepared call
        import dataclasses

        from .. import _inputs
        from .. import decode as _decode
        from ..hbm import Counters

        prob, ops = prepared(name, case, i)
        counters = Counters(count_hbm)
        with _inputs.allocate_like(prob):
            o, lse = _decode.SPEC.run(prob, ops, counters)
        hbm = counters.result()
        if hbm is not None:
            hbm = dataclasses.replace(hbm, terms=_decode.SPEC.io_model(prob).terms)
        r = _decode.DecodeResult(_inputs.finish(prob, o, (1, D)), _inputs.finish(prob, lse, (1,)), hbm,
                                 _decode.KERNEL, prob.num_splits)
        return r.o, r
    if name in PREFILL:
        from ..api import attention_forward

        return attention_forward(q, k, v, kernel=name).o, None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(getattr(SDPBackend, TORCH[name])), torch.no_grad():
        if name == "torch-efficient":
            q, kr, vr = case.repeated(i)
            return sdpa(q, kr, vr), None
        return sdpa(q, k, v, enable_gqa=True), None


def n_calls_sets(name: str, case: Case) -> int:
    """Input sets a name rotates through (the paged and repeated copies exist for set 0 only)."""
    return 1 if "-paged" in name or name == "torch-efficient" else len(case.sets)


def ours(name: str) -> bool:
    return name.startswith("flash_decode")


def launch_ms(name: str, case: Case, repeats: int) -> float:
    """A flash_decode call's launches, each bracketed by two events (:class:`~flash_numba.tools.timing.LaunchTimer`),
    summed per call; median of ``repeats`` calls after :data:`WARMUP`, the arguments checked once per input set.

    Kept as the ``launch_ms`` column to show what it measured: the start event is recorded before Numba's Python
    launch path (typing and packing the arguments, 20-50 us a launch on the H200's host) and the GPU, idle after the
    previous call's synchronisation, reaches it at once, so the host's launch work lands inside the time; torch's
    calls, queued back to back, never had theirs counted.  ``ms`` (:func:`queued_ms`, blocked) times both the same
    way."""
    from .. import _inputs
    from .. import decode as _decode
    from .timing import LaunchTimer

    probs = [prepared(name, case, i) for i in range(n_calls_sets(name, case))]

    def once(j):
        prob, ops = probs[j % len(probs)]
        with LaunchTimer() as timer, _inputs.allocate_like(prob):
            _decode.SPEC.run(prob, ops, timer)
        return sum(timer.stop().values())

    for j in range(WARMUP):
        once(j)
    return statistics.median(once(WARMUP + r) for r in range(repeats))


def step(name: str, case: Case):
    """``fn(i)``: one decode step of ``name`` on input set i, as the timing loops call it.  flash_decode variants:
    the launches of a call checked once per input set (:func:`prepared`: no host checks, no synchronisation, so
    calls queue back to back like PyTorch's); the public call with ``name + ":call"`` (host checks included)."""
    if name.endswith(":call"):
        base = name[:-len(":call")]
        return lambda i: call(base, case, i % n_calls_sets(base, case))
    if not ours(name):
        return lambda i: call(name, case, i % n_calls_sets(name, case))
    from .. import _launch_plan
    from .. import decode as _decode

    calls = []
    for i in range(n_calls_sets(name, case)):
        prob, ops = prepared(name, case, i)
        q, k, v = case.sets[i]
        table = case.paged()[3] if variant(name)["paged"] else None
        if table is not None:
            q, k, v = case.paged()[:3]
        tensors = (q, k, v, case.seqlens) + (() if table is None else (table,))
        calls.append((prob, ops, tensors, _decode.plan_key(prob, tensors)))

    def fn(i):  # as attention_decode after its checks: the launch plan's replay, recorded at the first call
        prob, ops, tensors, key = calls[i % len(calls)]
        plan = _launch_plan.lookup(key)
        if plan:
            return plan.replay(tensors)
        with _launch_plan.recording(key if plan is None else None, tensors) as recording:
            r = _decode._run(prob, ops, False)
            recording.finish((r.o, r.lse), None)
    return fn


_SLEEP: list = []


def _sleep_units_per_ms(torch) -> tuple:
    """``(sleep(n), units a millisecond)``: a kernel on the default stream that keeps the GPU busy for n units
    (``torch.cuda._sleep``'s clock cycles; where PyTorch lacks it, a one-thread Numba kernel of n 1-us
    nanosleeps), calibrated once with events."""
    if not _SLEEP:
        sleep = getattr(torch.cuda, "_sleep", None)
        n = 2_000_000
        if sleep is None:
            from numba import cuda

            @cuda.jit
            def spin(count):
                for _ in range(count):
                    cuda.nanosleep(1000)

            def sleep(units):
                spin[1, 1, 0](int(units))
            n = 2_000
        sleep(n)  # compiled, warm
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        sleep(n)
        b.record()
        b.synchronize()
        _SLEEP.append((sleep, n / a.elapsed_time(b)))
    return _SLEEP[0]


def queued_ms(fn, torch, repeats: int, blocked: bool) -> tuple[float, float, bool]:
    """``(GPU ms, host ms, held)`` a call: ``repeats`` calls ``fn(i)`` queued back to back on the default stream
    between two events (GPU ms: the events' time / repeats; host ms: the host's time to queue them / repeats), after
    :data:`WARMUP` calls.

    ``blocked``: a sleep kernel queued first holds the GPU until the host has queued every call (checked: the start
    event has not run when the host is done, else the sleep is doubled and the window run again; ``held`` says
    whether it was, at the last try), so the GPU runs the calls back to back and the time is the GPU's alone: the
    kernels and the gaps between them, no host latency (the ``ms`` column).  Not blocked: the GPU waits for the host
    wherever the host takes longer per call than the kernels, as in a loop of calls (the ``loop_ms`` column)."""
    import time

    host_once = []
    for i in range(WARMUP):
        t0 = time.perf_counter()
        fn(i)
        host_once.append((time.perf_counter() - t0) * 1e3)
    hold = max(1.0, 2 * repeats * min(host_once))  # ms of sleep: twice the host's time to queue the window
    for attempt in range(5):
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if blocked:
            sleep, per_ms = _sleep_units_per_ms(torch)
            sleep(int(hold * per_ms))
        start.record()
        t0 = time.perf_counter()
        for r in range(repeats):
            fn(WARMUP + r)
        host = (time.perf_counter() - t0) * 1e3
        early = blocked and start.query()  # the GPU left the sleep before the host had queued every call
        stop.record()
        stop.synchronize()
        if not early or attempt == 4:
            return start.elapsed_time(stop) / repeats, host / repeats, not early
        hold = 2 * max(hold, host)


def loop_ms(name: str, case: Case, repeats: int) -> float:
    """Whole calls of ``name`` (:func:`step`) queued back to back, not blocked (:func:`queued_ms`)."""
    return queued_ms(step(name, case), case.torch, repeats, blocked=False)[0]


def max_rel_error(x, ref) -> float:
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-30))


def validate_small(torch) -> list[str]:
    """flash_decode on a small ragged, paged, causal problem with three new tokens, against float64."""
    rng = np.random.default_rng(0)
    Bs, P, lengths = 3, 16, (1000, 0, 333)
    q = rng.standard_normal((Bs, 8, 3, 64)).astype(np.float16)
    per = [-(-L // P) for L in lengths]
    k = rng.standard_normal((sum(per) + 1, 2, P, 64)).astype(np.float16)
    v = rng.standard_normal(k.shape).astype(np.float16)
    order = rng.permutation(k.shape[0])
    table = np.zeros((Bs, max(per)), np.int32)
    n = 0
    for b, u in enumerate(per):
        table[b, :u] = order[n:n + u]
        n += u
    seqlens = np.array(lengths, np.int32)
    bad = []
    for splits in (1, 3, None):
        r = attention_decode(q, k, v, cache_seqlens=seqlens, block_table=table, causal=True, num_splits=splits)
        o_ref, lse_ref = decode_reference(q, k, v, seqlens, table, causal=True)
        err = max_rel_error(r.o, o_ref)
        fin = np.isfinite(lse_ref)
        if err > TOLERANCE or not np.array_equal(np.isfinite(r.lse), fin):
            bad.append(f"MISMATCH flash_decode small problem num_splits={splits}: o error {err:.3g}")
    return bad


def validate_case(name: str, case: Case) -> list[str]:
    """``name`` against PyTorch's math path in float32 on sequences 0 and B - 1 of set 0."""
    torch = case.torch
    q, k, v = case.sets[0]
    o, _ = call(name, case, 0)
    idx = [0, B - 1]
    qf, kf, vf = (x[idx].float() for x in (q, k, v))
    kf, vf = (x.repeat_interleave(HQ // HKV, dim=1) for x in (kf, vf))
    ref = torch.softmax(qf @ kf.transpose(-1, -2) / math.sqrt(D), dim=-1) @ vf
    got = torch.as_tensor(o, device="cuda")[idx].float()
    err = float((got - ref).abs().max() / ref.abs().max())
    return [] if err <= TOLERANCE else [f"MISMATCH {name} N={case.N}: error {err:.3g} against float32 math"]


def kv_sets(N: int, dtype: str) -> int:
    from .microbench import l2_cache_bytes

    nbytes = model.kv_bytes(B, HKV, N, D, 2 if dtype in ("float16", "bfloat16") else 4)
    return max(1, min(4, math.ceil(3 * (l2_cache_bytes() or 0) / nbytes)))


def run(Ns, names, dtypes, repeats: int, csv_path: str | None, command: str, count_dtypes=("float16",)) -> int:
    """The sweep: every dtype, cache length and implementation; ``count_dtypes``: the dtypes whose flash_decode rows
    are also counted and compared with the IO model (a counting build of each kernel: compile time)."""
    import torch

    print(device.describe())
    bad = validate_small(torch)
    if bad:
        print("\n".join(bad))
        return 1
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    header = [f"device: {device.describe()}", f"date: {date}", f"command: {command}",
              f"decode: B = {B}, Hq = {HQ}, Hkv = {HKV}, d = {D}, Nq = 1, {' and '.join(dtypes)}; "
              f"kv_gbps = 2 B Hkv N d s / ms; caches rotated (3x L2); {repeats} calls a window after {WARMUP}",
              "ms: GPU time a call, calls queued back to back behind a sleep kernel (the host queues them all before "
              "the GPU starts: no host latency), the same for every implementation; host_ms: the host's time to "
              "queue one call; loop_ms: the same calls without the sleep (the GPU waits where the host is slower); "
              "launch_ms (ours): each launch bracketed by its own events around Numba's launch path (the old "
              "method: host launch work inside); call_ms: whole attention_decode calls (host checks, a sync)"]
    out = csvfile.RowWriter(csv_path, header, FIELDS) if csv_path else None
    status = 0
    try:
        for dtype in dtypes:
            for N in Ns:
                status |= _sweep_one(torch, N, dtype, names, repeats, out, dtype in count_dtypes)
    finally:
        if out:
            out.close()
    return status


def _sweep_one(torch, N, dtype, names, repeats, out, count: bool) -> int:
    status = 0
    case = Case(torch, N, dtype, kv_sets(N, dtype))
    kvb = model.kv_bytes(B, HKV, N, D, 2)
    flops = 4 * B * HQ * N * D
    lines = [f"N = {N}, {dtype}: KV cache {kvb / 1e9:.3f} GB",
             f"{'implementation':<24} {'splits':>6} {'ms':>9} {'GB/s':>8} {'host_ms':>8} {'loop_ms':>8} "
             f"{'launch_ms':>9} {'call_ms':>8} {'status':>10}"]
    for name in names:
        row = dict(implementation=name, B=B, H=HQ, N=N, d=D, dtype=dtype, causal=False, flops=flops,
                   status="ok", hbm_source="n/a")
        row["pass"] = "decode"
        try:
            mism = validate_case(name, case)
            if mism:
                print("\n".join(mism))
                row["status"], status = "mismatch", 1
            if ours(name):
                _, r = call(name, case, 0, count_hbm=count)
                row["num_splits"] = r.num_splits
                if count:
                    want = attention_model(r, case, name)
                    row.update(hbm_bytes=r.hbm.total, hbm_source="counted")
                    if r.hbm != want:
                        print(f"MISMATCH {name} N={N}: counted {r.hbm} != model {want}")
                        row["status"], status = "count != model", 1
            fn = step(name, case)
            ms, host, held = queued_ms(fn, torch, repeats, blocked=True)
            if not held:  # a call that waits for the GPU on the host (none should): ms holds host time
                print(f"NOT HELD {name} N={N} {dtype}: the GPU ran before the host had queued the window")
                row["status"] = "not held" if row["status"] == "ok" else row["status"]
            row.update(ms=ms, host_ms=host, tflops=flops / (ms * 1e-3) / 1e12, kv_gbps=kvb / (ms * 1e-3) / 1e9)
            row["loop_ms"] = queued_ms(fn, torch, repeats, blocked=False)[0]
            if ours(name):
                row["launch_ms"] = launch_ms(name, case, repeats)
            if name in PUBLIC:  # the whole API call: host checks (the metadata copied back), launches
                row["call_ms"] = loop_ms(name + ":call", case, repeats)
        except Exception as exc:  # a backend that refuses the call: its status, the sweep goes on
            if ours(name):
                raise
            row["status"] = f"not available: {str(exc).splitlines()[0][:80]}"
        if out:
            out.write(row)

        def f(key, fmt):
            x = row.get(key)
            return "" if x is None else format(x, fmt)
        lines.append(f"{name:<24} {row.get('num_splits', ''):>6} {f('ms', '.4f'):>9} {f('kv_gbps', '.0f'):>8} "
                     f"{f('host_ms', '.4f'):>8} {f('loop_ms', '.4f'):>8} {f('launch_ms', '.4f'):>9} "
                     f"{f('call_ms', '.4f'):>8} {row['status'][:10]:>10}")
    print("\n".join(lines), flush=True)
    del case
    torch.cuda.empty_cache()
    return status


def attention_model(r, case: Case, name: str):
    """The IO model of a flash_decode call of the benchmark."""
    from .. import decode as _decode

    from ..kernels import flash_decode as fd

    var = variant(name)
    paged = var["paged"]
    seqlens = np.full(B, case.N, np.int32)
    P = PAGE_SIZE if paged else case.N
    per = -(-case.N // PAGE_SIZE)
    from .. import _inputs

    storage = _inputs.BF16_STORAGE if case.dtype == "bfloat16" else np.dtype(case.dtype)
    prob = _decode.DecodeProblem(B, HQ, HKV, 1, D, storage, paged, P, per if paged else 1,
                                 B * per if paged else B, seqlens, False, 1 / math.sqrt(D), num_splits=r.num_splits,
                                 dtype_name=case.dtype, fused=var["fused"])
    prob.path = var["path"] or fd.path_of(prob)
    return model.decode(prob)


def main(argv=None, command: str | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flash_numba.tools.bench_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=list(DEFAULT_N), help="cache lengths")
    p.add_argument("--splits", type=int, nargs="*", default=list(DEFAULT_SPLITS), help="forced num_splits rows")
    p.add_argument("--kernels", nargs="+", help="implementations (default: all)")
    p.add_argument("--dtype", nargs="+", choices=("float16", "bfloat16"), default=["float16"],
                   help="one sweep per dtype, in order, into one CSV")
    p.add_argument("--count", nargs="*", choices=("float16", "bfloat16"), default=["float16"],
                   help="dtypes whose flash_decode rows are counted against the IO model (a counting build each)")
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--csv", help="write the rows here")
    args = p.parse_args(argv)
    if device.SIMULATOR:
        print("the decode benchmark needs a GPU (and PyTorch with CUDA)", file=sys.stderr)
        return 2
    names = args.kernels or implementations(args.splits)
    return run(args.n, names, args.dtype, args.repeats, args.csv,
               command or "python -m flash_numba.tools.bench_decode " + " ".join(argv or sys.argv[1:]), args.count)


if __name__ == "__main__":
    sys.exit(main())
