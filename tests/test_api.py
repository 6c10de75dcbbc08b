"""The one entry point per pass: ``attention_forward`` / ``attention_backward(..., kernel=...)``.

Every kernel, standard included, goes through the same two functions and returns the
same result types; the names of earlier releases are aliases that give bitwise the
same results.
"""

import numpy as np
import pytest

import flash_numba
from flash_numba import kernels, reference
from conftest import skip_unless_runs


def _inputs(seed, Nq=9, Nk=13, d=8, lead=()):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(lead + (n, d)).astype(np.float32) for n in (Nq, Nk, Nk))
    do = rng.standard_normal(q.shape).astype(np.float32)
    return q, k, v, do


@pytest.mark.parametrize("kernel", kernels.NAMES)
def test_every_kernel_through_one_entry_point(kernel):
    q, k, v, do = _inputs(1)
    skip_unless_runs(kernel, q.shape[-1], q.dtype)
    fwd = flash_numba.attention_forward(q, k, v, kernel=kernel, causal=True)
    bwd = flash_numba.attention_backward(q, k, v, fwd.o, fwd.lse, do, kernel=kernel, causal=True)
    assert isinstance(fwd, flash_numba.ForwardResult) and isinstance(bwd, flash_numba.BackwardResult)
    assert fwd.kernel == bwd.kernel == kernel
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=True)
    dq_ref, dk_ref, dv_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=True)
    # float32 storage, accumulation over at most 13 keys of d = 8: errors of a few float32 ulps
    # of the largest terms; 1e-4 relative to the largest reference value is far above that and
    # far below any indexing or masking mistake.
    for got, want in ((fwd.o, o_ref), (fwd.lse, lse_ref), (bwd.dq, dq_ref), (bwd.dk, dk_ref), (bwd.dv, dv_ref)):
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_old_names_are_aliases():
    q, k, v, do = _inputs(2)
    std = flash_numba.standard_attention_forward(q, k, v)
    one = flash_numba.attention_forward(q, k, v, kernel="standard")
    assert np.array_equal(std.o, one.o) and np.array_equal(std.lse, one.lse)
    fl = flash_numba.flash_attention_forward(q, k, v, kernel="flash1")
    one = flash_numba.attention_forward(q, k, v, kernel="flash1")
    assert np.array_equal(fl.o, one.o) and fl.block == one.block
    b_old = flash_numba.standard_attention_backward(q, k, v, std.o, std.lse, do)
    b_new = flash_numba.attention_backward(q, k, v, std.o, std.lse, do, kernel="standard")
    assert all(np.array_equal(x, y) for x, y in zip((b_old.dq, b_old.dk, b_old.dv), (b_new.dq, b_new.dk, b_new.dv)))


def test_default_kernel_is_named_once():
    q, k, v, _ = _inputs(3)
    assert flash_numba.attention_forward(q, k, v).kernel == flash_numba.DEFAULT_KERNEL
    assert flash_numba.flash_attention_forward(q, k, v).kernel == flash_numba.DEFAULT_KERNEL


def test_bad_kernel_names_the_argument():
    q, k, v, _ = _inputs(4)
    with pytest.raises(ValueError, match=r"^kernel: unknown kernel 'nope'"):
        flash_numba.attention_forward(q, k, v, kernel="nope")
    with pytest.raises(ValueError, match=r"^kernel: 'standard' is not a FlashAttention kernel"):
        flash_numba.flash_attention_forward(q, k, v, kernel="standard")


def test_calls_from_several_threads_agree_with_one_thread():
    """In the simulator calls take turns (it runs one kernel at a time); on a GPU they run side by
    side.  Either way every thread gets the single-threaded answer, bit for bit."""
    from concurrent.futures import ThreadPoolExecutor

    q, k, v, do = _inputs(5, Nq=6, Nk=7, d=4)
    want = flash_numba.attention_forward(q, k, v, kernel="flash2").o

    def call(_):
        return flash_numba.attention_forward(q, k, v, kernel="flash2").o

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(call, range(8)))
    assert all(np.array_equal(g, want) for g in got)


@pytest.mark.parametrize("d, dtype, exc, match", [
    (0, np.float32, ValueError, r"^d: head dim d = 0"),
    (129, np.float32, ValueError, r"^d: head dim d = 129"),
    (64.0, np.float32, TypeError, r"^d: expected an integer"),
    (64, np.int32, TypeError, r"^dtype: int32 is not supported"),
    (64, "nope", TypeError, r"^dtype: 'nope' is not a dtype"),
])
def test_resolve_block_checks_its_arguments(d, dtype, exc, match):
    with pytest.raises(exc, match=match):
        flash_numba.resolve_block("flash2_fast", d, dtype)


def test_resolve_block_takes_numpy_integers():
    want = flash_numba.resolve_block("flash2_fast", 64, np.float32, block=(32, 16))
    got = flash_numba.resolve_block("flash2_fast", np.int64(64), np.float32, block=(np.int64(32), np.int64(16)))
    assert got == want and all(type(x) is int for x in got)
