"""Grouped-query and multi-query attention: k and v with Hkv heads, q with Hq = G * Hkv.

Query head h attends with key/value head h // G; dK and dV sum over the G query heads of
a group.  Every kernel at every dtype, forward and every backward against the float64 reference
(which repeats K and V over each group and sums dK, dV), the counted bytes against the IO model
with G, and GQA against the same kernel run on K and V repeated in memory, are in the test matrix
(tests/test_kernels.py).  Here: the IO model's terms with G, the shapes that are refused, flash2's
kernels compiled for its group.  Simulator sizes.
"""

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import iomodel, kernels, reference
from flash_numba.iomodel import terms

from test_flash2 import err64

# (lead of q, heads of k and v, Nq, Nk, d): G = 2, and multi-query (G = Hq) with a single query row
SHAPES = [((2, 2), 1, 17, 17, 8), ((1, 4), 1, 1, 17, 16)]  # batch 2 with G = 2: kv head b*Hkv + h // G
#: Every kernel takes it: Tr = Tc = 2 at N = 17, so a key block walks two query blocks of each query
#: head of its group (one when causal, from the first query block that sees it).
BLOCK = (16, 16)


def make(rng, lead, Hkv, Nq, Nk, d, dtype):
    """q, do (lead + (Nq, d)) and k, v (lead[:-1] + (Hkv, Nk, d)), standard normal."""
    kv_lead = lead[:-1] + (Hkv,)
    q, do = (rng.standard_normal(lead + (Nq, d)).astype(dtype) for _ in range(2))
    k, v = (rng.standard_normal(kv_lead + (Nk, d)).astype(dtype) for _ in range(2))
    return q, k, v, do


def runs(kernel):
    """(deterministic, ...) the backward variants of ``kernel``."""
    return (True, False) if kernels.get(kernel).supports_atomic else (True,)


def test_three_dim_inputs_group_the_heads(rng):
    """(H, N, d) inputs: k, v with Hkv heads; flattened (B*H, N, d) inputs group the same way."""
    q, k, v, do = make(rng, (4,), 2, 9, 9, 8, np.float64)
    f = fn.attention_forward(q, k, v, kernel="flash2", causal=True)
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=True)
    assert err64(f.o, o_ref) < 1e-13
    b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2", causal=True)
    for g, g_ref in zip((b.dq, b.dk, b.dv), reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=True)):
        assert g.shape == g_ref.shape and err64(g, g_ref) < 1e-12


@pytest.mark.parametrize("G", [1, 2])
def test_flash2_launches_the_kernels_compiled_for_its_group(rng, monkeypatch, G):
    """flash2 compiles its forward and dQ kernels apart for G = 1 (``grouped`` False: the key/value head is
    the query head, no register holds it) and for G > 1; a call launches the ones for its G, and they agree
    with the float64 reference."""
    from flash_numba.kernels import flash2

    calls = []

    def spy(name):
        factory = getattr(flash2, name)

        def traced(d, Br, Bc, dtype, causal, count, dropout, grouped):
            calls.append((name, grouped))
            return factory(d, Br, Bc, dtype, causal, count, dropout, grouped)
        return traced

    for name in ("_forward_kernel", "_dq_kernel"):
        monkeypatch.setattr(flash2, name, spy(name))
    q, k, v, do = make(rng, (1, 2), 2 // G, 17, 17, 8, np.float64)
    f = fn.attention_forward(q, k, v, kernel="flash2", causal=True)
    b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2", causal=True)
    assert calls == [("_forward_kernel", G > 1), ("_dq_kernel", G > 1)]
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=True)
    assert err64(f.o, o_ref) < 1e-13 and err64(f.lse, lse_ref) < 1e-13
    for g, g_ref in zip((b.dq, b.dk, b.dv), reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=True)):
        assert err64(g, g_ref) < 1e-12


# ----------------------------------------------------------------------------- IO model with G


@pytest.mark.parametrize("pass_", ["forward", "backward"])
@pytest.mark.parametrize("kernel", kernels.NAMES)
def test_compulsory_term_reads_k_and_v_once_per_group(kernel, pass_):
    """The compulsory term counts K, V (and dK, dV) per key/value head; the rest of the model's total
    moves to the re-reads (every query head still reads K and V in the forward)."""
    BH, N, d, s, a = 8, 256, 64, 4, 4
    for G in (1, 2, 8):
        kv_arrays = 2 if pass_ == "forward" else 4  # K, V; backward also dK, dV
        q_arrays = 2 if pass_ == "forward" else 4  # Q, O; backward Q, O, dO, dQ
        want = BH * (q_arrays * s * N * d + a * N) + BH // G * kv_arrays * s * N * d
        assert terms.compulsory_bytes(BH, N, N, d, np.float32, pass_, G=G) == want
        model = (iomodel.forward if pass_ == "forward" else iomodel.backward)(kernel, BH, N, N, d, np.float32, G=G)
        assert model.terms["compulsory"] == want and model.terms["re-reads"] >= 0
        assert sum(model.terms.values()) == model.total


@pytest.mark.parametrize("kernel", kernels.NAMES)
def test_backward_saves_the_kv_traffic_of_the_dkdv_kernel(kernel):
    """Backward bytes with G: the forward total is unchanged; the backward's K, V reads and dK, dV
    writes in the kernel that owns key blocks shrink from BH to BH / G heads (K, V read once and dK,
    dV written once per key block: 4 s Nk d per head, or 2 s Nk d for standard's dV and dK kernels)."""
    BH, N, d, s = 8, 256, 64, 4
    for G in (2, 8):
        assert iomodel.forward(kernel, BH, N, N, d, np.float32, G=G) == iomodel.forward(kernel, BH, N, N, d,
                                                                                         np.float32)
        saved = iomodel.backward(kernel, BH, N, N, d, np.float32).total - iomodel.backward(
            kernel, BH, N, N, d, np.float32, G=G).total
        per_head = 2 * s * N * d if kernel == "standard" else 4 * s * N * d  # standard: dV and dK written only
        assert saved == (BH - BH // G) * per_head


def test_io_model_refuses_a_group_that_does_not_divide_bh():
    with pytest.raises(ValueError, match="^G:"):
        iomodel.forward("flash2", 6, 16, 16, 8, np.float32, G=4)
    with pytest.raises(ValueError, match="^G:"):
        iomodel.backward("flash2", 6, 16, 16, 8, np.float32, G=0)


# ----------------------------------------------------------------------------- bad input


def _bad(rng):
    q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
    kv = {h: rng.standard_normal((2, h, 5, 8)).astype(np.float32) for h in (1, 2, 3)}
    other_batch = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    return [
        ((q, kv[3], kv[3]), "k", "3.*differ from q's"),  # 3 key/value heads do not divide 4
        ((q, other_batch, other_batch), "k", "differ from q's"),  # batch dims differ
        ((q, kv[2], kv[1]), "v", "differ from k's"),  # k and v with different head counts
        ((q[0], kv[3][0], kv[3][0]), "k", "differ from q's"),  # (H, N, d) inputs: 3 does not divide 4 either
    ]


@pytest.mark.parametrize("case", range(4))
def test_bad_group_shapes_name_the_argument(rng, case):
    args, name, detail = _bad(rng)[case]
    with pytest.raises(ValueError, match=f"^{name}: .*({detail})"):
        fn.attention_forward(*args, kernel="flash2")


def test_backward_checks_o_and_lse_against_q_not_k(rng):
    q, k, v, do = make(rng, (1, 4), 2, 5, 7, 8, np.float32)
    f = fn.attention_forward(q, k, v, kernel="flash1")
    with pytest.raises(ValueError, match="^lse: expected shape"):
        fn.attention_backward(q, k, v, f.o, f.lse[:, :2], do, kernel="flash1")


def test_reference_refuses_heads_that_do_not_divide(rng):
    q, k, _, _ = make(rng, (1, 4), 3, 5, 5, 8, np.float64)
    with pytest.raises(ValueError, match="heads dividing"):
        reference.attention_forward(q, k, k)
