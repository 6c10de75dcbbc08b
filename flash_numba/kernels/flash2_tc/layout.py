"""flash2_tc's shapes: the block, the shared-memory tiles, the instruction path, the head dims it runs.

Forward block: Br = 64 query rows (4 warps x 16 rows, one m16 tile per warp), Bc = 64 keys a K/V tile.
Shared memory holds K_j and V_j row-major, each row padded by 8 elements (16 bytes)::

    row stride DS = d + 8 elements: the 8 rows an ldmatrix phase reads start 16 (d + 8) bytes apart, which
    is 4 banks more than a multiple of 128 bytes (d a multiple of 16): 8 rows on 8 different 16-byte bank
    groups, no conflict (without the pad, rows 128 bytes apart all hit the same 4 banks: 8-way).

    sm[0 : Bc*DS]        K_j (Bc x d)
    sm[Bc*DS : 2*Bc*DS]  V_j (Bc x d)   (before the loop: Q_i, loaded once into registers from here)

2 x 64 x 136 x 2 bytes = 34,816 bytes at d = 128: static shared memory, within a T4's 48 KB.

Instruction paths (:func:`path`): "sm80" (mma.m16n8k16, float16 and bfloat16; cc >= 8.0) and "sm75"
(two mma.m16n8k8 for each k16 step, float16 only: a T4 has neither m16n8k16 nor bfloat16).  The sm_75 path
runs on every later GPU too; ``FLASH_NUMBA_TC_PATH=sm75`` in the environment (read at each launch) or
``flash_numba._switches.TC_PATH`` forces it, so an H200 can run what a T4 runs.
"""

from __future__ import annotations

import os

import numpy as np

from ... import _switches

FORWARD_NAME = "flash2_tc forward"
Br = 64  # query rows a block: 4 warps x 16
Bc = 64  # keys a K/V tile
NT = 128  # threads a block
WARPS = NT // 32
PAD = 8  # elements of padding per shared row (16 bytes)
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FASTMATH = {"contract", "afn", "arcp", "nsz", "reassoc"}  # no nnan/ninf: masked scores stay -inf
MAX_HEAD_DIM = 128
HEAD_DIMS_TEXT = "16 to 128, a multiple of 16"
PATHS = ("sm80", "sm75")


def runs_head_dim(d: int) -> bool:
    """Head dims the tensor-core kernels run: 16, 32, ..., 128 (whole k16 steps of the mma)."""
    return 16 <= d <= MAX_HEAD_DIM and d % 16 == 0


def path(cc) -> str:
    """The instruction path for a GPU of compute capability ``cc`` (None: the simulator): "sm75" below 8.0,
    "sm80" from 8.0; ``_switches.TC_PATH`` or the environment's ``FLASH_NUMBA_TC_PATH`` override it."""
    forced = _switches.TC_PATH or os.environ.get("FLASH_NUMBA_TC_PATH") or None
    if forced is not None:
        if forced not in PATHS:
            raise ValueError(f"FLASH_NUMBA_TC_PATH: {forced!r} is not an instruction path; use sm80 or sm75")
        return forced
    return "sm75" if cc is not None and tuple(cc) < (8, 0) else "sm80"


def row_stride(d: int) -> int:
    """DS: elements from one shared row of K_j (V_j) to the next."""
    return d + PAD


def smem_elements(d: int) -> int:
    """16-bit elements of a block's shared memory: K_j and V_j."""
    return 2 * Bc * row_stride(d)


def shared_bytes_forward(d: int) -> int:
    return 2 * smem_elements(d)


def storage_name(dtype_name: str) -> str:
    """The NumPy name of the 16-bit storage of a dtype name ("float16" or "bfloat16" -> "uint16")."""
    return "uint16" if dtype_name == "bfloat16" else np.dtype(dtype_name).name
