"""The causal mask, in one place: which keys, and which key blocks, a query sees.

Bottom-right aligned, as FlashAttention >= 2.1: with Nq queries and Nk keys, key c
is visible to query r iff ``c <= r + Nk - Nq``.  A query row with no visible key
(r < Nq - Nk) gives O = 0 and L = -inf (:func:`sees_no_key`); no other row does.

Each rule is written once, as a plain Python function (calling no other: a device
function can only call device functions): the host calls it (launch geometry, the
IO models) and the kernels call its device version, the same code compiled with
``jit(device=True, forceinline=True)``.  Block rules count in units
of blocks of Br query rows (i) and Bc key rows (j)::

          keys ->   j = 0    j = 1    j = 2          visible_kv_blocks(i0 = 0)  = 1
        queries   +--------+--------+--------+       visible_kv_blocks(i0 = Br) = 2
        i = 0     | \\ mask |        |        |       first_visible_q_block(j0 = Bc) = 1
        i = 1     |  full  | \\ mask |        |       crosses_diagonal: the "mask" blocks
                  +--------+--------+--------+

``tests/test_causal.py`` checks the host and device versions against each other and
against a brute-force NumPy mask.
"""

from __future__ import annotations

from ..device import jit


def last_visible_key(r, Nq, Nk):
    """The last key that query r sees (negative: none)."""
    return r + (Nk - Nq)


def key_limit(r, c, Nq, Nk, causal):
    """The largest offset a for which query r sees key c + a (both exist: c + a < Nk; with ``causal``,
    c + a <= r + Nk - Nq); negative: none from c on.  A thread holding keys c, c + 1, .. zeroes those past it."""
    lim = Nk - 1 - c
    if causal:
        lim = min(lim, r + (Nk - Nq) - c)  # last_visible_key(r, ..) - c (device code calls no host function)
    return lim


def visible(r, c, Nq, Nk, causal):
    """Whether query r sees key c: both exist (r < Nq, c < Nk) and, with ``causal``, c <= r + Nk - Nq."""
    return r < Nq and c < Nk and (not causal or c <= r + (Nk - Nq))


def sees_no_key(r, Nq, Nk, causal):
    """Whether query r sees no key at all (with ``causal``, r < Nq - Nk): the rows that get O = 0 and L = -inf."""
    return causal and r + (Nk - Nq) < 0


def visible_kv_blocks(i0, Br, Bc, Nq, Nk, causal):
    """How many key blocks (0, 1, ...) the query block of rows i0 .. i0 + Br - 1 visits.

    All Tc = ceil(Nk / Bc) of them; with ``causal`` those up to the block of the
    last key its last row (< Nq) sees; 0 when no row of the block sees a key.
    """
    Tc = (Nk + Bc - 1) // Bc
    if not causal:
        return Tc
    last = min(i0 + Br, Nq) - 1 + (Nk - Nq)  # the last key the block's last row sees
    if last < 0:
        return 0
    return min(Tc, last // Bc + 1)


def first_visible_q_block(j0, Br, Nq, Nk, causal):
    """The first query block (of Br rows) that sees a key of the key block starting at key j0.

    0 without ``causal``; Tr = ceil(Nq / Br) (no query block) when no query sees key j0.
    The query blocks from there to Tr - 1 all see it.
    """
    if not causal:
        return 0
    first = j0 - (Nk - Nq)  # the first query that sees key j0
    if first >= Nq:
        return (Nq + Br - 1) // Br
    return max(first, 0) // Br


def crosses_diagonal(i0, j0, Bc, Nq, Nk):
    """Whether query i0 misses a key of the key block j0 .. j0 + Bc - 1.

    For a block pair that is visited, True means that the block holds masked
    entries (its rows from i0 on see fewer keys); False means none is masked.
    """
    return j0 + Bc - 1 > i0 + (Nk - Nq)


# The device versions, for kernels (the simulator runs the same Python code).
last_visible_key_dev = jit(device=True, forceinline=True)(last_visible_key)
visible_dev = jit(device=True, forceinline=True)(visible)
key_limit_dev = jit(device=True, forceinline=True)(key_limit)
sees_no_key_dev = jit(device=True, forceinline=True)(sees_no_key)
visible_kv_blocks_dev = jit(device=True, forceinline=True)(visible_kv_blocks)
first_visible_q_block_dev = jit(device=True, forceinline=True)(first_visible_q_block)
crosses_diagonal_dev = jit(device=True, forceinline=True)(crosses_diagonal)
