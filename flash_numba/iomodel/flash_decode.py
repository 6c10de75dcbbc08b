"""HBM bytes of a flash_decode call, in closed form, by term.

A call on B sequences (lengths L_b), Hq query heads and Hkv KV heads (G = Hq / Hkv), Nq new tokens a
sequence, head dim d, item size s, ``S`` splits, ``RT`` rows a block (:func:`~flash_numba.kernels.flash_decode.row_tile`
of R = G Nq: 16 on the tensor-core path, :func:`~flash_numba.kernels.flash_decode.kernels.rows_per_block` on the
CUDA-core path) and ``row_tiles = ceil(R / RT)``; rows = B Hq Nq output rows.  The two paths move the same bytes
for the same ``row_tiles``.  Terms:

``KV cache``      ``row_tiles * Hkv * 2 d s * sum_b L_b``: every visible key and value element once per row tile
                  (once, when the group's rows fit one block: R <= 16 on the tensor-core path, R <= 8 on the
                  CUDA-core path); the keys of a split are read by its block
``q``             ``S * rows * d * s``: each split block reads its rows of q (into shared memory) once
``lengths``       ``4 * blocks``: one ``cache_seqlens`` entry per block (S * B * Hkv * row_tiles blocks); with
                  S > 1 and the combine kernel (not fused) also ``4 * rows``, one per row read by the combine
                  (which splits saw a key of the row)
``page table``    ``4 * row_tiles * Hkv * sum over (b, split) of the pages the split's keys touch``
                  (``(end - 1) // P - start // P + 1`` for a non-empty split; paged caches only)
``o and lse``     ``rows * (d s + 4)``: the output and its log-sum-exp, written once
``partials``      S > 1 only: ``lse2_s`` written and read (``2 * 4 * S * rows``), and ``O_s / l_s`` written and
                  read (``2 * 4 d`` per row and split that saw one of the row's keys: the geometry, whatever
                  the scores, so a split whose scores of the row are all -inf has its partial too)
``split counters`` S > 1 with the combine fused into the split kernel (``flash_decode.kernels.combine_tail``)
                  only: each block's ``atomicAdd`` on its group's counter (4 read, 4 written) and each group's last
                  block's reset (4 written): ``8 * blocks + 4 * blocks / S``

The split kernel's launch holds the first four terms' reads (less the combine's lengths) and its writes (or,
with S > 1, the partials' writes); the combine reads the partials and its lengths and writes o and lse.  Fused,
one launch holds them all, the counters too, and no length is read twice (the group's last block merges with the
length its split already read).  Split s
of sequence b reads keys ``s*chunk .. min(L, (s+1)*chunk) - 1``, ``chunk = ceil(L / S)``.  Causal (bottom-right
among the new tokens): row i of a sequence sees keys ``j <= L - Nq + i``; the block still reads its whole chunk.
"""

from __future__ import annotations

from ..hbm import HBMCount, KernelBytes
from ..kernels.flash_decode import COMBINE_NAME, SPLIT_NAME, SPLIT_ONE_NAME, FUSED_NAME, fused_of, path_of, row_tile

TERMS = ("KV cache", "q", "lengths", "page table", "o and lse", "partials", "split counters")


def _splits(L: int, S: int):
    """(start, end) of each split of a sequence of L keys."""
    chunk = -(-L // S) if L else 0
    return [(min(L, s * chunk), min(L, (s + 1) * chunk)) for s in range(S)]


def _last_key(L: int, Nq: int, i: int, causal: bool) -> int:
    return min(L - 1, i + (L - Nq)) if causal else L - 1  # causal.last_visible_key(i, Nq, L), capped


def visible_pairs(prob) -> int:
    """(query row, visible key) pairs of the call: the attention's work."""
    n = 0
    for L in prob.seqlens:
        n += sum(max(0, _last_key(int(L), prob.Nq, i, prob.causal) + 1) for i in range(prob.Nq))
    return n * prob.Hq


def partial_rows(prob) -> int:
    """(row, split) pairs whose split saw a key of the row: the partial O rows written and read."""
    n = 0
    for L in prob.seqlens:
        L = int(L)
        for start, end in _splits(L, prob.num_splits):
            if start < end:
                n += sum(1 for i in range(prob.Nq) if start <= _last_key(L, prob.Nq, i, prob.causal))
    return n * prob.Hq


def _groups(prob) -> int:
    """Grid rows of the split kernel, B Hkv row_tiles: the groups of S blocks that split one cache."""
    return prob.B * prob.Hkv * -(-prob.G * prob.Nq // row_tile(prob.G * prob.Nq, path_of(prob)))


def terms(prob) -> dict[str, int]:
    """The model's bytes of the call by term (see the module docstring); they sum to :func:`decode`'s total."""
    s = prob.dtype.itemsize
    d, S, rows = prob.d, prob.num_splits, prob.rows
    RT = row_tile(prob.G * prob.Nq, path_of(prob))
    row_tiles = -(-prob.G * prob.Nq // RT)
    Lsum = sum(int(L) for L in prob.seqlens)
    pages = 0
    if prob.paged:
        for L in prob.seqlens:
            pages += sum((e - 1) // prob.page_size - a // prob.page_size + 1
                         for a, e in _splits(int(L), S) if a < e)
    groups = _groups(prob)
    out = {
        "KV cache": row_tiles * prob.Hkv * 2 * d * s * Lsum,
        "q": S * rows * d * s,
        "lengths": 4 * S * prob.B * prob.Hkv * row_tiles + _combine_lengths(prob),
        "page table": 4 * row_tiles * prob.Hkv * pages,
        "o and lse": rows * (d * s + 4),
        "partials": 0 if S == 1 else 2 * 4 * S * rows + 2 * 4 * d * partial_rows(prob),
        "split counters": 8 * S * groups + 4 * groups if fused_of(prob) else 0,
    }
    return out


def _combine_lengths(prob) -> int:
    """The combine kernel's reads of ``cache_seqlens``: one per output row (none with one split, or fused: no
    combine kernel)."""
    return 0 if prob.num_splits == 1 or fused_of(prob) else 4 * prob.rows


def decode(prob) -> HBMCount:
    """Bytes per launch of the call, with :func:`terms` attached."""
    t = terms(prob)
    lengths = _combine_lengths(prob)
    reads = t["KV cache"] + t["q"] + t["lengths"] - lengths + t["page table"]
    if prob.num_splits == 1:
        per = {SPLIT_ONE_NAME: KernelBytes(reads, t["o and lse"])}
    elif fused_of(prob):  # the partials written and read in one launch; the counters: 4 read a block, the rest written
        half = t["partials"] // 2
        counter_reads = 4 * prob.num_splits * _groups(prob)
        per = {FUSED_NAME: KernelBytes(reads + half + counter_reads,
                                       half + t["o and lse"] + t["split counters"] - counter_reads)}
    else:
        half = t["partials"] // 2  # written by the split kernel, read by the combine
        per = {SPLIT_NAME: KernelBytes(reads, half), COMBINE_NAME: KernelBytes(half + lengths, t["o and lse"])}
    return HBMCount(per, t)


def kv_bytes(B: int, Hkv: int, L: int, d: int, itemsize: int) -> int:
    """The KV cache of B sequences of L keys: what a decode step must read (the harness's GB/s numerator)."""
    return 2 * B * Hkv * L * d * itemsize
