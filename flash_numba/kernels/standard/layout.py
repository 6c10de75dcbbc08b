"""Standard attention's launch names, micro-tile geometry and block rule (host side), shared by its kernels."""

from __future__ import annotations

import numpy as np

from ... import _inputs
from ...device import SIMULATOR, STATIC_SHARED_LIMIT, jit
from .. import _rowsum
from .._tile_ops import NT, TX, TY, check_micro_tile_block

USES_BLOCKS = True
FULL_MASK = 0xFFFFFFFF
#: Kernel names, as the counters and the IO model call them.
FORWARD_NAMES = ("S = scale*Q@K^T", "P = softmax(S)", "O = P@V")
#: The backward's launches where its P and dS kernel recomputes S on CUDA cores (float32, float64, and float16
#: where the forward's S runs on CUDA cores too: below compute capability 7.5).
BACKWARD_NAMES = (_rowsum.NAME, "P, dS = P*(dP-D)", "dV = P^T@dO", "dK = scale*dS^T@Q", "dQ = scale*dS@K")
#: The backward's launches where the forward computes S on tensor cores (float16, :func:`tensor_cores`): the forward's
#: own S launch again (the same build, into the P buffer), then P and dS from that S; P = exp(S - L) must come from
#: the forward's S bit for bit (a float32 sum in another order rounds, now and then, to the neighbouring float16).
BACKWARD_TC_NAMES = (_rowsum.NAME, FORWARD_NAMES[0], "P, dS = P*(dP-D) from S", *BACKWARD_NAMES[2:])
#: Rows of the softmax per thread block: one warp per row.
SOFTMAX_ROWS = NT // 32
#: Blocks in order of preference (the largest query block first: K and V are read once per query block).
_PREFERENCE = ((64, 32), (64, 16), (32, 32), (32, 16), (16, 32), (16, 16), (8, 16))


#: The tensor-core forward (:mod:`.tensor`): Br = 64 query rows (four warps of 16), Bc one of these.
TC_BR = 64
TC_BCS = (64, 32, 16)
#: Elements of padding at the end of each of its shared rows (16 bytes: ldmatrix's 8 rows in 8 bank groups).
TC_PAD = 8


def tensor_cores(dtype, pass_: str = "forward", cc=None) -> bool:
    """Whether that pass runs its products on tensor cores: the forward in float16 or bfloat16 (``dtype`` a name,
    or the storage dtype: uint16 for bfloat16) on a GPU of compute capability 7.5 or later (``cc``: that GPU's;
    default this one's; the simulator stands in for every cc).  float16 below 7.5 (no mma.m16n8k8, no
    ldmatrix) runs the CUDA-core kernels."""
    name = dtype if isinstance(dtype, str) else str(np.dtype(dtype))
    if pass_ != "forward" or name not in ("float16", "bfloat16", "uint16"):
        return False
    if cc is None and not SIMULATOR:
        from ...device import info

        cc = info().compute_capability
    return cc is None or tuple(cc) >= (7, 5)


def backward_names(dtype, cc=None) -> tuple[str, ...]:
    """The backward's launches, in order, in storage ``dtype`` on a GPU of compute capability ``cc`` (default:
    this one's): :data:`BACKWARD_TC_NAMES` where the forward's S runs on tensor cores, else :data:`BACKWARD_NAMES`."""
    return BACKWARD_TC_NAMES if tensor_cores(dtype, "forward", cc) else BACKWARD_NAMES


def scores_block(d: int, dtype, cc=None):
    """The block at which the backward runs the forward's tensor-core S launch (:data:`BACKWARD_TC_NAMES`): the
    forward's own choice for 48 KB, (64, Bc); None where the backward recomputes S (:data:`BACKWARD_NAMES`).  Any
    (64, Bc) gives the same S, element for element (an element of an mma's result depends on its row of Q, its
    column of K^T and the k-steps, in the same order at every Bc); the block only sets the tiles written."""
    if not tensor_cores(dtype, "forward", cc):
        return None
    return choose_block(d, dtype, STATIC_SHARED_LIMIT, "forward", cc)


def padded_d(d: int) -> int:
    """Head dim rounded up to a multiple of 16 (the k of m16n8k16): the tensor-core tiles' columns."""
    return -(-d // 16) * 16


def tc_shared_bytes(Bc: int, d: int) -> int:
    """Static shared memory of the larger tensor-core kernel at key block Bc (2-byte elements)."""
    RS = padded_d(d) + TC_PAD
    scores = 2 * (TC_BR * RS + Bc * RS + TC_BR * (Bc + TC_PAD))  # Q_i, K_j, the S_ij staging tile
    rowprod = 2 * (TC_BR * (Bc + TC_PAD) + Bc * RS)  # P_ij, V_j
    return max(scores, rowprod)


def mma_path(cc=None) -> str:
    """The tensor-core instructions the kernels use, as flash2_tc's (:func:`..flash2_tc.layout.path`, the one
    switch: ``FLASH_NUMBA_TC_PATH=sm75`` forces the T4's on a later GPU): ``"sm75"`` (m16n8k8) below compute
    capability 8.0, else ``"sm80"`` (m16n8k16).  ``cc``: that device's (default: this one's; the simulator's
    is sm_80's path unless forced)."""
    from ..flash2_tc.layout import path

    if cc is None and not SIMULATOR:
        from ...device import info

        cc = info().compute_capability
    return path(cc)


def _consts(dtype):
    """-inf, +inf, 0 as scalars of the accumulation dtype (typed: a Python float means float64 math)."""
    f = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    return f(-np.inf), f(np.inf), f(0)


def geometry(Br: int, Bc: int, d: int, dtype) -> dict:
    """Micro-tiles, padded sizes and shared-memory bytes of every kernel for block (Br, Bc)."""
    a = _inputs.acc_dtype(dtype).itemsize
    vec = 16 // a  # pad rows by one 16-byte vector
    TD = -(-d // TX)
    DP = TD * TX
    QS, KS = Br + vec, Bc + vec
    return dict(
        TM=Br // TY, TN=Bc // TX, TMc=Bc // TY, TD=TD, DP=DP, QS=QS, KS=KS,
        scores=a * DP * (QS + KS),  # Q_i^T, K_j^T
        rowprod=a * Bc * (QS + DP),  # A_ij^T, B_j
        colprod=a * Br * (KS + DP),  # A_ij, B_i
        grad=a * (DP * (2 * QS + KS) + 2 * Br),  # Q_i^T, dO_i^T, K_j^T or V_j^T, L_i, D_i
    )


def shared_bytes(Br: int, Bc: int, d: int, dtype, pass_: str = "forward") -> int:
    """Static shared memory of the largest kernel of the pass (huge if (Br, Bc) is not a micro-tile shape)."""
    if pass_ not in ("forward", "backward"):
        raise ValueError(f"pass_: expected 'forward' or 'backward', got {pass_!r}")
    if tensor_cores(dtype, pass_):
        return tc_shared_bytes(Bc, d) if Br == TC_BR and Bc in TC_BCS else 1 << 40
    if Br % TY or Bc % TX or Br < 1 or Bc < 1:
        return 1 << 40
    g = geometry(Br, Bc, d, dtype)
    if pass_ == "forward":
        return max(g["scores"], g["rowprod"])
    return max(g["grad"], g["colprod"], g["rowprod"])


def block_limits(d: int, dtype, pass_: str = "forward") -> tuple[int, int]:
    """Br = 8 TM <= 64 and Bc = 16 TN <= 64 (register micro-tiles of at most 8 x 4)."""
    return TY * 8, TX * 4


def check_block(block, d: int, dtype, pass_: str = "forward") -> None:
    """Refuse, by name, a block that is not a micro-tile shape (api.py calls this first)."""
    if block is not None and tensor_cores(dtype, pass_):
        Br, Bc = block
        if Br != TC_BR or Bc not in TC_BCS:
            raise ValueError(f"block: standard's float16 and bfloat16 forward runs on tensor cores with Br = {TC_BR} "
                             f"(four warps of 16 rows) and Bc = 16, 32 or 64, got ({Br}, {Bc})")
    elif block is not None:
        check_micro_tile_block(block, "standard")


def choose_block(d: int, dtype, budget: int, pass_: str = "forward", cc=None) -> tuple[int, int]:
    """The first block of ``_PREFERENCE`` whose kernels fit ``budget`` bytes of shared memory.

    The same rule as flash2_fast's forward (register micro-tiles bound the block,
    not the paper's Bc = ceil(M / 4d)); at d = 64, float32 both pick (64, 32).  The float16
    forward (tensor cores) takes Br = 64 and the largest Bc of :data:`TC_BCS` that fits (``cc``: on a GPU of that
    compute capability; default this one).
    """
    if tensor_cores(dtype, pass_, cc):
        for Bc in TC_BCS:
            if tc_shared_bytes(Bc, d) <= budget:
                return TC_BR, Bc
    for Br, Bc in _PREFERENCE:
        if shared_bytes(Br, Bc, d, dtype, pass_) <= budget:
            return Br, Bc
    raise ValueError(f"no block fits d = {d} ({np.dtype(dtype)}) in {budget} bytes of shared memory")


def n_key_blocks(r0: int, Br: int, Bc: int, Nq: int, Nk: int, causal: bool) -> int:
    """Key blocks the query block starting at row ``r0`` visits: all, or (causal) up to
    the one holding the last key its last row sees (host twin of :func:`_n_visible`)."""
    Tc = -(-Nk // Bc)
    if not causal:
        return Tc
    last = r0 + Br - 1 + Nk - Nq
    return 0 if last < 0 else min(Tc, last // Bc + 1)


@jit(device=True)
def _n_visible(r0, Br, Bc, Nq, Nk):
    """Causal: key blocks visible to the query block starting at row ``r0``."""
    Tc = (Nk + Bc - 1) // Bc
    last = r0 + Br - 1 + Nk - Nq
    return 0 if last < 0 else min(Tc, last // Bc + 1)


def _align():
    return None if SIMULATOR else 16
