"""HBM bytes by term (compulsory, re-reads, S/P) for every kernel: flash_numba.iomodel.terms."""

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import api, iomodel, kernels
from flash_numba.iomodel import terms
from conftest import skip_unless_runs

# (BH, Nq, Nk, d, causal, dtype, block)
CASES = [
    (2, 17, 23, 5, False, np.float32, (8, 16)),
    (1, 23, 17, 16, True, np.float16, (16, 16)),
    (3, 64, 64, 64, True, np.float64, (32, 32)),
    (1, 4096, 4096, 64, False, np.float32, (64, 32)),
]


@pytest.mark.parametrize("BH, Nq, Nk, d, causal, dtype, block", CASES)
@pytest.mark.parametrize("kernel", kernels.NAMES)
@pytest.mark.parametrize("pass_", ["forward", "backward"])
def test_terms_add_up_to_the_model_total(kernel, pass_, BH, Nq, Nk, d, causal, dtype, block):
    model = getattr(iomodel, pass_)(kernel, BH, Nq, Nk, d, dtype, causal, block)
    assert model.terms == terms.split(kernel, pass_, BH, Nq, Nk, d, dtype, causal, block)
    assert sum(model.terms.values()) == model.total
    assert model.terms["compulsory"] == terms.compulsory_bytes(BH, Nq, Nk, d, dtype, pass_)
    assert model.terms["re-reads"] >= 0
    assert (model.terms["S/P"] > 0) == (kernel == "standard")


def test_compulsory_by_hand():
    s, a = 2, 4  # float16 storage, float32 L
    assert terms.compulsory_bytes(3, 10, 20, 8, np.float16) == 3 * (s * (2 * 10 * 8 + 2 * 20 * 8) + a * 10)
    assert terms.compulsory_bytes(3, 10, 20, 8, np.float16, "backward") == 3 * (s * (4 * 80 + 4 * 160) + a * 10)


def test_theorem_2_the_re_reads_shrink_with_M_the_sp_term_does_not():
    """flash1 with the paper's rule: the re-reads fall as M grows; standard's S/P term stays (N = 4096)."""
    by_M = {}
    for M in (8 * 1024, 16 * 1024, 48 * 1024):
        for kernel in ("flash1", "standard"):
            block = terms.block_for(kernel, 64, np.float32, M)
            by_M[kernel, M] = terms.split(kernel, "forward", 1, 4096, 4096, 64, np.float32, False, block)
    assert by_M["flash1", 8 * 1024]["re-reads"] > by_M["flash1", 16 * 1024]["re-reads"] > by_M["flash1", 48 * 1024][
        "re-reads"]
    sp = {M: by_M["standard", M]["S/P"] for M in (8 * 1024, 16 * 1024, 48 * 1024)}
    assert len(set(sp.values())) == 1 and sp[48 * 1024] == 4 * 4 * 4096 * 4096 + 4 * 4 * 4096


@pytest.mark.parametrize("kernel", ["flash1", "flash2"])
def test_counted_results_carry_the_split(rng, kernel):
    q, k, v = (rng.standard_normal((1, 9, 4)).astype(np.float32) for _ in range(3))
    fwd = api._forward(kernel, q, k, v, True, None, (8, 8), True)
    want = iomodel.forward(kernel, 1, 9, 9, 4, np.float32, True, (8, 8))
    assert fwd.hbm == want and fwd.hbm.terms == want.terms
    assert "term S/P" in fwd.hbm.table()
    assert (fwd.hbm + fwd.hbm).terms == {t: 2 * b for t, b in want.terms.items()}
    assert fn.flash_attention_forward(q, k, v).hbm is None


def test_figure_and_rows():
    import matplotlib

    matplotlib.use("Agg")
    fig, rows = terms.figure(BH=2, Ns=(256, 1024), N_fixed=1024, Ms=(16 * 1024, 48 * 1024))
    assert len(fig.axes) == 2
    assert {r["kernel"] for r in rows} == set(kernels.NAMES) and {r["axis"] for r in rows} == {"N", "M"}
    for r in rows:
        assert r["total"] == sum(r[t] for t in terms.TERMS)
        want = iomodel.forward(r["kernel"], 2, r["N"], r["N"], 64, np.float32, False, (r["Br"], r["Bc"]))
        assert r["total"] == want.total


@pytest.mark.parametrize("kernel", kernels.NAMES)
@pytest.mark.slow
def test_every_kernels_counted_bytes_carry_the_split(kernel):
    """api attaches the IO model's split to every counted result: its terms add up to the bytes counted."""
    skip_unless_runs(kernel, 8, np.float32)
    rng = np.random.default_rng(7)
    q, k, v, do = (rng.standard_normal((1, 2, n, 8)).astype(np.float32) for n in (13, 17, 17, 13))
    f = fn.attention_forward(q, k, v, kernel=kernel, causal=True, count_hbm=True)
    assert set(f.hbm.terms) == {"compulsory", "re-reads", "S/P"} and sum(f.hbm.terms.values()) == f.hbm.total
    for deterministic in (True, False):
        b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=kernel, causal=True, count_hbm=True,
                                  deterministic=deterministic)
        assert sum(b.hbm.terms.values()) == b.hbm.total
