"""The causal rule (flash_numba.kernels.causal): host against a brute-force NumPy mask, device against host."""

import itertools

import numpy as np
from numba import cuda

from flash_numba.kernels import causal

# (Nq, Nk, Br, Bc): equal and unequal lengths, partial last blocks, more queries than keys
CASES = [
    (Nq, Nk, Br, Bc)
    for Nq, Nk in ((1, 1), (17, 17), (17, 5), (5, 17), (33, 64), (64, 33), (40, 97))
    for Br, Bc in ((1, 1), (8, 16), (16, 8), (32, 32))
]


def mask(Nq, Nk):
    """visible[r, c]: query r sees key c (bottom-right aligned), from its definition."""
    r = np.arange(Nq)[:, None]
    c = np.arange(Nk)[None, :]
    return c - r <= Nk - Nq


def test_last_visible_key_is_the_last_true_of_each_row():
    for Nq, Nk in ((1, 1), (17, 5), (5, 17), (40, 97)):
        vis = mask(Nq, Nk)
        for r in range(Nq):
            cols = np.flatnonzero(vis[r])
            got = causal.last_visible_key(r, Nq, Nk)
            assert (got < 0) == (cols.size == 0), (Nq, Nk, r)
            if cols.size:
                assert cols[-1] == min(got, Nk - 1), (Nq, Nk, r)


def test_visible_is_the_mask():
    for Nq, Nk in ((1, 1), (17, 5), (5, 17), (40, 97)):
        vis = mask(Nq, Nk)
        for r, c in itertools.product(range(Nq + 2), range(Nk + 2)):
            inside = r < Nq and c < Nk
            assert causal.visible(r, c, Nq, Nk, True) == (inside and vis[r, c]), (Nq, Nk, r, c)
            assert causal.visible(r, c, Nq, Nk, False) == inside


def test_key_limit_bounds_the_visible_keys_from_c_on():
    """Key c + a is visible to query r (and exists) exactly when 0 <= a <= key_limit(r, c): the rule the kernels use
    to zero the keys of a thread's run past the limit."""
    for Nq, Nk in ((1, 1), (17, 5), (5, 17), (40, 97)):
        for r, c in itertools.product(range(Nq), range(Nk + 2)):
            for causal_ in (True, False):
                lim = causal.key_limit(r, c, Nq, Nk, causal_)
                want = [causal.visible(r, c + a, Nq, Nk, causal_) for a in range(Nk + 2)]
                assert want == [a <= lim for a in range(Nk + 2)], (Nq, Nk, r, c, causal_)


def test_block_rules_match_the_brute_force_mask():
    for Nq, Nk, Br, Bc in CASES:
        vis = mask(Nq, Nk)
        Tr, Tc = -(-Nq // Br), -(-Nk // Bc)
        pair = np.zeros((Tr, Tc), dtype=bool)  # some query of block i sees some key of block j
        for i, j in itertools.product(range(Tr), range(Tc)):
            pair[i, j] = vis[i * Br : (i + 1) * Br, j * Bc : (j + 1) * Bc].any()
        for i in range(Tr):
            n = causal.visible_kv_blocks(i * Br, Br, Bc, Nq, Nk, True)
            # the visible key blocks of a query block are a prefix 0 .. n - 1
            assert list(pair[i]) == [j < n for j in range(Tc)], (Nq, Nk, Br, Bc, i)
            assert causal.visible_kv_blocks(i * Br, Br, Bc, Nq, Nk, False) == Tc
        for j in range(Tc):
            i0 = causal.first_visible_q_block(j * Bc, Br, Nq, Nk, True)
            # the query blocks that see key block j are a suffix i0 .. Tr - 1 (empty when i0 == Tr)
            assert list(pair[:, j]) == [i >= i0 for i in range(Tr)], (Nq, Nk, Br, Bc, j)
            assert causal.first_visible_q_block(j * Bc, Br, Nq, Nk, False) == 0
        for i, j in itertools.product(range(Tr), range(Tc)):
            # crosses_diagonal: query row i*Br misses a key of block j (keys past Nk included)
            want = any(c - i * Br > Nk - Nq for c in range(j * Bc, (j + 1) * Bc))
            assert causal.crosses_diagonal(i * Br, j * Bc, Bc, Nq, Nk) == want, (Nq, Nk, Br, Bc, i, j)


def test_a_pair_without_crossing_needs_no_mask():
    """crosses_diagonal False: every entry of the (in-range part of the) block pair is visible."""
    for Nq, Nk, Br, Bc in CASES:
        vis = mask(Nq, Nk)
        for i0, j0 in itertools.product(range(0, Nq, Br), range(0, Nk, Bc)):
            if not causal.crosses_diagonal(i0, j0, Bc, Nq, Nk):
                assert vis[i0 : i0 + Br, j0 : j0 + Bc].all()


@cuda.jit
def _device_rules(cases, out):
    t = cuda.grid(1)
    if t < cases.shape[0]:
        Nq, Nk, Br, Bc, i0, j0 = cases[t, 0], cases[t, 1], cases[t, 2], cases[t, 3], cases[t, 4], cases[t, 5]
        out[t, 0] = causal.visible_kv_blocks_dev(i0, Br, Bc, Nq, Nk, True)
        out[t, 1] = causal.visible_kv_blocks_dev(i0, Br, Bc, Nq, Nk, False)
        out[t, 2] = causal.first_visible_q_block_dev(j0, Br, Nq, Nk, True)
        out[t, 3] = causal.crosses_diagonal_dev(i0, j0, Bc, Nq, Nk)
        out[t, 4] = causal.last_visible_key_dev(i0, Nq, Nk)
        out[t, 5] = causal.visible_dev(i0 + Br - 1, j0 + Bc - 1, Nq, Nk, True)
        out[t, 6] = causal.key_limit_dev(i0, j0, Nq, Nk, True)
        out[t, 7] = causal.key_limit_dev(i0, j0, Nq, Nk, False)


def test_device_versions_equal_the_host_versions():
    rows = [
        (Nq, Nk, Br, Bc, i0, j0)
        for Nq, Nk, Br, Bc in CASES[::3]
        for i0 in range(0, Nq, Br)
        for j0 in range(0, Nk, Bc)
    ]
    cases = np.array(rows, dtype=np.int64)
    out = np.full((len(rows), 8), -99, dtype=np.int64)
    _device_rules[-(-len(rows) // 64), 64](cases, out)
    for (Nq, Nk, Br, Bc, i0, j0), got in zip(rows, out):
        want = (
            causal.visible_kv_blocks(i0, Br, Bc, Nq, Nk, True),
            causal.visible_kv_blocks(i0, Br, Bc, Nq, Nk, False),
            causal.first_visible_q_block(j0, Br, Nq, Nk, True),
            int(causal.crosses_diagonal(i0, j0, Bc, Nq, Nk)),
            causal.last_visible_key(i0, Nq, Nk),
            int(causal.visible(i0 + Br - 1, j0 + Bc - 1, Nq, Nk, True)),
            causal.key_limit(i0, j0, Nq, Nk, True),
            causal.key_limit(i0, j0, Nq, Nk, False),
        )
        assert tuple(got) == want, (Nq, Nk, Br, Bc, i0, j0)
