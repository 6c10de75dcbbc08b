"""The attention kernels, one module per numbered version.

=============  =====================================================================
``standard``   the paper's baseline: S, P = softmax(S) and O = P V as separate
               kernels that write S and P (N x N) to HBM; backward reads them back.
``flash1``     FlashAttention as the paper's Algorithms 1 and 2: K/V blocks outer,
               Q blocks inner, O, l, m read and written in HBM every outer step.
``flash2``     FlashAttention-2 loop order: a thread block owns a block of query
               rows, keeps O, m, l on chip, writes O and L once; backward in two
               deterministic passes (dK/dV per key block, dQ per query block).
=============  =====================================================================

Every module offers the same functions, which :mod:`flash_numba.api` calls::

    forward(prob, ops, block, counters) -> (o, lse)            # device arrays
    backward(prob, ops, block, counters) -> (dq, dk, dv)
    shared_bytes(Br, Bc, d, dtype, pass_) -> int               # static shared memory
    block_limits(d, dtype, pass_) -> (max_Br, max_Bc)
    compile_all(cc, dtypes, ds) -> list of (name, ptx)          # the compile tier

``prob`` is a :class:`flash_numba._inputs.Problem`, ``ops`` maps names
(q, k, v and for the backward o, lse, do) to device arrays of shape
``(B*H, N, d)``, ``counters`` is a :class:`flash_numba.hbm.Counters`.
"""

import importlib

NAMES = ("standard", "flash1", "flash2", "flash2_fast")


def get(name: str):
    """The kernel module called ``name``; ValueError naming the choices otherwise."""
    if name not in NAMES:
        raise ValueError(f"kernel: unknown kernel {name!r}; choose one of {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")
