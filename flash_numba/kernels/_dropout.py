"""Attention dropout's keep mask, as a counter-based random number generator, in one place.

The FlashAttention paper (Algorithms 2 and 4) applies dropout to the softmax
probabilities, O = dropout(P) V, with m, l and L taken from the undropped scores,
and stores no mask: the backward regenerates it, as it recomputes P.  So the mask
must be a pure function of where an entry is, not of a random stream consumed in
some order: entry (i, j) of query head bh is kept iff

    hash(seed, bh, i, j) >= threshold,    threshold = round(p * 2**32),

with ``hash`` a 32-bit integer hash and p the drop rate (kept with probability
1 - threshold / 2**32, within 2**-33 of 1 - p).  A kept entry is scaled by
1 / (1 - p), so the output's expectation is the undropped one.

The hash: Chris Wellons' ``lowbias32`` mixer (two multiply-xorshift rounds, one of the
lowest-bias 32-bit mixers his search found: flipping one input bit flips each output
bit with probability within 0.2% of 1/2), applied four times, folding in one
coordinate each time (seed, bh, i, j).  It is cheap on a GPU (two integer multiplies
a round, no state, no table) and simpler to read than Philox, whose statistical
strength a dropout mask does not need.  tests/test_dropout.py checks the keep rate
and that neighbouring rows, columns and seeds are not correlated.

Written once, as plain Python on integers with explicit ``& 0xFFFFFFFF`` after each
multiply (the low 32 bits of a product are exact in Python ints, in the device's int64
arithmetic, which wraps modulo 2**64, and in uint64 NumPy arrays), so the same function is the
host's scalar version, the kernels' device version (compiled with
``jit(device=True, forceinline=True)``, as :mod:`.causal` does) and, called on NumPy
arrays, the float64 reference's vectorised version: bit-identical masks everywhere.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import types

from ..device import SIMULATOR, jit

M32 = 0xFFFFFFFF


def mix32(x):
    """lowbias32 (Wellons): a bijective 32-bit integer hash of x (0 <= x < 2**32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def _rules(mix, wrap):
    """``row_hash``, ``keep_hash`` and ``keep_scale`` built on the mixer ``mix``, each passed through ``wrap``
    (a device function may only call device functions: the device versions are built from the device mixer)."""

    @wrap
    def head_hash(seed, bh):
        """The hash of (seed, bh): the part of every entry's hash that query head bh shares."""
        return mix(mix(seed & M32) ^ (bh & M32))

    @wrap
    def row_of_head(head, i):
        """The hash of row i from ``head = head_hash(seed, bh)``."""
        return mix(head ^ (i & M32))

    @wrap
    def row_hash(seed, bh, i):
        """The hash of (seed, bh, i): the part of every entry's hash that row i of head bh shares."""
        return row_of_head(head_hash(seed, bh), i)

    @wrap
    def keep_hash(seed, bh, i, j):
        """The 32-bit hash of entry (i, j) of query head bh under ``seed``."""
        return mix(row_hash(seed, bh, i) ^ (j & M32))

    @wrap
    def keep_scale(row, j, threshold, inv_keep):
        """The factor dropout applies to entry (i, j), given ``row = row_hash(seed, bh, i)``:
        ``inv_keep`` = 1 / (1 - p) if kept, else 0 (of its type)."""
        return inv_keep if mix(row ^ (j & M32)) >= threshold else inv_keep - inv_keep

    return head_hash, row_of_head, row_hash, keep_hash, keep_scale


head_hash, row_of_head, row_hash, keep_hash, keep_scale = _rules(mix32, lambda f: f)


def check_p(p) -> float:
    """``dropout_p`` as a float in [0, 1); TypeError or ValueError naming the argument otherwise."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"dropout_p: expected a float in [0, 1), got {p!r}")
    if not 0.0 <= float(p) < 1.0:  # also refuses NaN
        raise ValueError(f"dropout_p: expected a drop rate in [0, 1), got {p!r}")
    return float(p)


def check_seed(seed, required: bool):
    """``dropout_seed`` as an int in [0, 2**32), or None when not ``required``; TypeError/ValueError otherwise."""
    if seed is None:
        if required:
            raise ValueError("dropout_seed: dropout_p > 0 needs the forward's seed (ForwardResult.dropout_seed)")
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"dropout_seed: expected an int in [0, 2**32), got {seed!r}")
    if not 0 <= int(seed) < 2**32:
        raise ValueError(f"dropout_seed: expected an int in [0, 2**32), got {seed}")
    return int(seed)


def draw_seed() -> int:
    """A fresh seed from NumPy's default generator (the forward's choice when none is given)."""
    return int(np.random.default_rng().integers(0, 2**32, dtype=np.uint64))


def threshold(p: float) -> int:
    """round(p * 2**32): an entry whose hash is below it is dropped."""
    return int(round(float(p) * 2.0**32))


def keep_mask(seed: int, bh, Nq: int, Nk: int, p: float) -> np.ndarray:
    """Bool ``(..., Nq, Nk)``: True where entry (i, j) of query head ``bh`` (an int or an array of them) is kept."""
    bh = np.asarray(bh, dtype=np.uint64)[..., None, None]
    i = np.arange(Nq, dtype=np.uint64)[:, None]
    j = np.arange(Nk, dtype=np.uint64)[None, :]
    return keep_hash(np.uint64(seed), bh, i, j) >= np.uint64(threshold(p))


# The device version (the kernels call it; the simulator runs the same Python code).
_device = jit(device=True, forceinline=True)


def _mix32_sim(x):
    """mix32 on a Python int: the simulator hands kernels NumPy integers, whose products overflow int64
    (wrapping, so with the same low 32 bits, but with a warning each time)."""
    return mix32(int(x))


mix32_dev = _device(_mix32_sim if SIMULATOR else mix32)
head_hash_dev, row_of_head_dev, row_hash_dev, keep_hash_dev, keep_scale_dev = _rules(mix32_dev, _device)


@functools.lru_cache(maxsize=None)
def factor(dropout: bool, acc_name: str):
    """The kernels' device functions ``(head, row, drop)``: ``head(seed, bh)`` the hash query head bh shares,
    ``row(head(seed, bh), i)`` the hash row i shares (each computed once), and
    ``drop(row(...), j, threshold, inv_keep) -> Zs``, dropout's factor on P[bh, i, j].

    With ``dropout``, :func:`head_hash`, :func:`row_of_head` and :func:`keep_scale` (1 / (1 - p) or 0);
    without, 0, 0 and the constant 1 of the accumulation dtype, which the compiler folds away (x * 1 is x):
    a kernel specialised with ``dropout=False`` compiles to the code it had before dropout existed.
    """
    if dropout:
        return head_hash_dev, row_of_head_dev, keep_scale_dev
    ONE = np.dtype(acc_name).type(1)

    @_device
    def no_hash(a, b):
        return 0

    @_device
    def no_dropout(row, j, threshold, inv_keep):
        return ONE

    return no_hash, no_hash, no_dropout


def arg_types(acc_nb_type) -> tuple:
    """Numba types of the three trailing kernel arguments ``(seed, threshold, inv_keep)``, for compile signatures."""
    return (types.int64, types.int64, acc_nb_type)


def launch_args(prob) -> tuple[bool, tuple]:
    """``(dropout, (seed, threshold, inv_keep))``: the kernel factories' flag and a launch's trailing arguments."""
    p = prob.dropout_p
    # Python ints: int64 on the device; exact (no NumPy overflow warning) in the simulator
    return p > 0, (int(prob.dropout_seed), threshold(p), prob.acc.type(1.0 / (1.0 - p)))


#: The one (dtype, head dim) group whose dropout variants the compile tier builds (both
#: ccs, causal or not, not counting): each kernel's dropout code is type-checked and
#: assembled (registers, spills) without doubling the tier's time.
COMPILED_WITH_DROPOUT = ("float32", 64)


def compile_variants(dtype, d: int, count: bool) -> tuple[bool, ...]:
    """The ``dropout`` flags a kernel's ``compile_all`` builds for (dtype, d, count)."""
    return (False, True) if (str(dtype), d, count) == (*COMPILED_WITH_DROPOUT, False) else (False,)
