"""The exercises whose answer is a closed-form count: ``matmul_intensity`` (lesson 1), ``theorem2`` (lesson 6),
``kv_cache_bytes`` (lesson 10); ``tile_bytes``, ``blocks_per_sm``, ``loads_per_madd``,
``dq_loads_per_madd`` (appendix 1)."""

from __future__ import annotations

from ..checking import _compare, _register


# ============================================================================= lesson 1: arithmetic intensity


def _matmul_intensity_solution(M, N, K, itemsize):
    flops = 2 * M * N * K  # one multiply and one add per (i, j, k)
    bytes_moved = (M * K + K * N + M * N) * itemsize  # read A and B once, write C once
    return flops / bytes_moved


@_register("matmul_intensity", 1, "FLOPs per byte of C = A B at minimum traffic", _matmul_intensity_solution)
def _run_matmul_intensity(answer):
    cases = [
        ("M = N = K = 1024, float32", (1024, 1024, 1024, 4)),
        ("M = N = K = 1024, float16", (1024, 1024, 1024, 2)),
        ("S = Q K^T: M = N = 4096, K = 64, float32", (4096, 4096, 64, 4)),
        ("a matrix-vector product: M = 4096, N = 1, K = 4096, float32", (4096, 1, 4096, 4)),
        ("M = 3, N = 5, K = 7, float64", (3, 5, 7, 8)),
    ]
    return _compare(cases, answer, _matmul_intensity_solution, rtol=1e-12)


# ============================================================================= lesson 6: Theorem 2


def _theorem2_solution(N, d, Bc):
    Tc = -(-N // Bc)  # outer passes (ceil(N / Bc))
    # K and V are read once (2 N d); every outer pass reads Q, O, l, m (2 N d + 2 N)
    # and writes O, l, m (N d + 2 N).
    return 2 * N * d + Tc * (3 * N * d + 4 * N)


@_register("theorem2", 6, "elements Algorithm 1 reads and writes in HBM (Theorem 2)", _theorem2_solution)
def _run_theorem2(answer):
    cases = [
        ("N = 1024, d = 64, Bc = 128", (1024, 64, 128)),
        ("N = 1024, d = 64, Bc = 1024 (one pass)", (1024, 64, 1024)),
        ("N = 100, d = 16, Bc = 48 (Bc does not divide N)", (100, 16, 48)),
        ("N = 1, d = 8, Bc = 16", (1, 8, 16)),
    ]
    n, mismatch = _compare(cases, answer, _theorem2_solution, exact=True)
    if mismatch is not None:
        mismatch.yours += " elements"
        mismatch.spec += " elements"
    return n, mismatch


# ============================================================================= lesson 10: the KV cache


def _kv_cache_bytes_solution(layers, heads, d, context, batch, itemsize):
    # Every layer keeps one key and one value vector (heads x d numbers) per token of every sequence.
    return 2 * layers * heads * d * context * batch * itemsize


@_register("kv_cache_bytes", 10, "bytes of a KV cache", _kv_cache_bytes_solution)
def _run_kv_cache_bytes(answer):
    cases = [
        ("Llama-2-7B: 32 layers, 32 heads, d = 128, 4096 tokens, batch 1, float16", (32, 32, 128, 4096, 1, 2)),
        ("the same, batch 8", (32, 32, 128, 4096, 8, 2)),
        ("1 layer, 1 head, d = 1, 1 token, batch 1, float32", (1, 1, 1, 1, 1, 4)),
        ("12 layers, 12 heads, d = 64, 1024 tokens, batch 3, float32", (12, 12, 64, 1024, 3, 4)),
    ]
    n, mismatch = _compare(cases, answer, _kv_cache_bytes_solution, exact=True)
    if mismatch is not None and not mismatch.yours.startswith("raised"):
        mismatch.notes += ("a cache keeps K and V, for every layer, head, token and sequence",)
    return n, mismatch


# ============================================================================= appendix 1: a block's shared memory


def _tile_bytes_solution(d, TM, TN, itemsize):
    # flash2_fast's forward (flash_numba.kernels.flash2_fast.layout.geometry): 8 x 16 threads, each a TM x TN tile
    # of S, so Br = 8 TM query rows and Bc = 16 TN keys; d padded to DP = 16 ceil(d / 16) columns; the rows of
    # Q_i^T, K_j (row-major) and P_ij^T padded by one 16-byte vector (16 / itemsize elements), V_j's not.
    Br, Bc, DP, pad = 8 * TM, 16 * TN, 16 * -(-d // 16), 16 // itemsize
    QT, K, V, PT = DP * (Br + pad), Bc * (DP + pad), Bc * DP, Bc * (Br + pad)  # Q_i^T, K_j, V_j, P_ij^T
    return (QT + K + V + PT) * itemsize


@_register("tile_bytes", "A1", "shared memory of one flash2_fast forward block", _tile_bytes_solution)
def _run_tile_bytes(answer):
    cases = [
        ("d = 64, 8 x 2 (Br = 64, Bc = 32), float32: the 48 KB block", (64, 8, 2, 4)),
        ("d = 128, 8 x 3 (Br = 64, Bc = 48), float32: an H200's block", (128, 8, 3, 4)),
        ("d = 80 (padded to 96 columns), 8 x 2, float32", (80, 8, 2, 4)),
        ("d = 1, 1 x 1, float64 (a 16-byte vector is 2 numbers)", (1, 1, 1, 8)),
    ]
    n, mismatch = _compare(cases, answer, _tile_bytes_solution, exact=True)
    if mismatch is not None and not mismatch.yours.startswith("raised"):
        mismatch.notes += ("four tiles: Q_i^T, K_j, V_j, P_ij^T, rows but V_j's padded by 16 bytes, "
                           "d rounded up to 16",)
    return n, mismatch


# ============================================================================= appendix 1: blocks an SM holds


def _blocks_per_sm_solution(tile_bytes, registers, threads, smem_per_sm):
    # An SM has 65,536 registers, handed out 8 per thread at a time, and smem_per_sm bytes of shared memory, of which
    # each block also takes 1 KB that the driver reserves.  It holds as many blocks as both allow.
    by_registers = 65536 // (-(-registers // 8) * 8 * threads)
    by_shared = smem_per_sm // (tile_bytes + 1024)
    return min(by_registers, by_shared)


@_register("blocks_per_sm", "A1", "blocks of a kernel one SM holds at once", _blocks_per_sm_solution)
def _run_blocks_per_sm(answer):
    cases = [
        ("d = 128 backward, P and dS in two tiles: 80,128 bytes, 168 registers, 128 threads, H200 (228 KB)",
         (80128, 168, 128, 228 * 1024)),
        ("the same, P and dS in one tile: 75,520 bytes", (75520, 168, 128, 228 * 1024)),
        ("d = 64 forward: 68,608 bytes, 128 registers, 128 threads, H200", (68608, 128, 128, 228 * 1024)),
        ("57,600 bytes of tiles (a quarter of 228 KB, less 768), 128 registers, 128 threads, H200",
         (57600, 128, 128, 228 * 1024)),
        ("24 KB of tiles, 165 registers, 128 threads, T4 (64 KB)", (24576, 165, 128, 64 * 1024)),
        ("85 registers (allocated as 88), 1 KB of tiles, 128 threads, H200", (1024, 85, 128, 228 * 1024)),
        ("no shared memory to speak of: 16 bytes, 32 registers, 256 threads, H200", (16, 32, 256, 228 * 1024)),
    ]
    n, mismatch = _compare(cases, answer, _blocks_per_sm_solution, exact=True)
    if mismatch is not None and not mismatch.yours.startswith("raised"):
        mismatch.notes += ("the fewer of what the registers (65,536, allocated 8 a thread at a time) and the shared "
                           "memory (each block's tiles plus 1 KB reserved) allow",)
    return n, mismatch


# ============================================================================= appendix 1: loads per multiply-add


def _loads_per_madd_solution(TM, TN, split):
    # flash2_fast's dK/dV kernel, per step k of the inner dimension (one column of K_j^T and V_j^T, one element of
    # a row of Q_i and of dO_i).  Not split, a thread owns TM x TN of S^T = K Q^T and TM x TN of dP^T = V dO^T: it
    # loads TM values of K^T, TM of V^T, TN of Q, TN of dO.  Split, a thread owns TM x 2TN of one of them: TM values
    # of K^T (or V^T), 2TN of Q (or dO).  Either way 2 TM TN multiply-adds.
    loads = TM + 2 * TN if split else 2 * TM + 2 * TN
    return loads / (2 * TM * TN)


@_register("loads_per_madd", "A1", "shared loads per multiply-add of the dK/dV kernel's S^T, dP^T loop",
           _loads_per_madd_solution)
def _run_loads_per_madd(answer):
    cases = [
        ("d = 128, 32 x 32 block (TM = 4, TN = 2), each thread both products", (4, 2, False)),
        ("the same, S^T and dP^T in separate warps", (4, 2, True)),
        ("d = 64 atomic, 32 x 64 block (TM = 8, TN = 2), both products", (8, 2, False)),
        ("the same, split", (8, 2, True)),
        ("d = 96, 16 x 32 block (TM = 4, TN = 1), split", (4, 1, True)),
        ("TM = TN = 1, both products", (1, 1, False)),
    ]
    n, mismatch = _compare(cases, answer, _loads_per_madd_solution, rtol=1e-12)
    if mismatch is not None and not mismatch.yours.startswith("raised"):
        mismatch.notes += ("not split, TM values of K^T and of V^T, TN of Q and of dO; split, one product of a "
                           "TM x 2TN tile; 2 TM TN multiply-adds either way",)
    return n, mismatch


# ============================================================================= appendix 1: the dQ loop's loads


def _dq_loads_per_madd_solution(RW, DP, groups):
    # flash2_fast's dK/dV kernel, dQ_i += dS_ij K_j: a warp owns RW query rows and DP columns (d padded to 16); its 32
    # lanes in ``groups`` groups of 32 / groups, group h the RW / groups rows h RW / groups .., lane l of it the
    # columns l, l + 32 / groups, ..  Per 4 keys a lane loads one 16-byte vector of K_j^T per column it holds and one
    # of dS_ij per row: ceil(groups DP / 32) + RW / groups vectors; the multiply-adds that count are those of the
    # columns that exist: (RW / groups) (groups DP / 32) of 4 each.  Vectors per useful multiply-add of 4.
    rows = RW // groups
    cols = -(-groups * DP // 32)  # columns a lane holds (some idle where 32 / groups does not divide DP)
    return (cols + rows) / (rows * groups * DP / 32)


@_register("dq_loads_per_madd", "A1", "16-byte loads per useful multiply-add of 4 in the dK/dV kernel's dQ loop",
           _dq_loads_per_madd_solution)
def _run_dq_loads_per_madd(answer):
    cases = [
        ("d = 64, 8 rows a warp, one group of 32 lanes (8 rows x 2 columns a lane)", (8, 64, 1)),
        ("the same, two groups of 16 (4 x 4)", (8, 64, 2)),
        ("d = 80: one group, the third block of 32 columns half idle", (8, 80, 1)),
        ("d = 80, two groups (5 columns of 16 lanes: no idle lane)", (8, 80, 2)),
        ("d = 128, one group", (8, 128, 1)),
        ("d = 128, two groups", (8, 128, 2)),
        ("d = 96's 16-row steps: 4 rows a warp, two groups", (4, 96, 2)),
    ]
    n, mismatch = _compare(cases, answer, _dq_loads_per_madd_solution, rtol=1e-12)
    if mismatch is not None and not mismatch.yours.startswith("raised"):
        mismatch.notes += ("a lane holds ceil(groups DP / 32) columns and RW / groups rows; count the multiply-adds "
                           "of the DP columns that exist, not of the idle lanes",)
    return n, mismatch
