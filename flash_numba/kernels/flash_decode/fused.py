"""The combine folded into the split kernel: the last block of a group merges the group's partials.

With ``num_splits`` S > 1 the S blocks of a group (one sequence, one KV head, one row tile: the blocks ``(s, y)``,
s = 0 .. S - 1, of grid row y) each write their partial (``O_s / l_s`` and ``lse2_s`` of the group's rows,
:func:`.kernels.result_writer`).  Instead of a second launch that merges them (:func:`.kernels.combine_kernel`),
each block, once its partials are written, counts itself in: ``__threadfence()`` (its writes reach every block
before its count does), then one ``atomicAdd`` on the group's counter ``sem[y]``.  The block that finds S - 1
blocks counted before it is the group's last: every partial of the group is written, so it merges them, with the
combine kernel's rule (lesson 3's rescale, one warp a row)::

    LSE2 = log2(sum_s 2^lse2_s),  O = sum_s 2^(lse2_s - LSE2) O_s,  lse = LSE2 ln 2

and sets ``sem[y]`` back to 0 (every block of the group has counted itself: the counters are zero again for
the next launch on the stream, so no launch clears them).  The same pattern as CUDA's threadFenceReduction
sample, FlashInfer's and vLLM's "last block reduces" variants.  One launch a call instead of two: no second
launch's gap, no combine grid to schedule, and the merge of a group starts as soon as its last block ends,
while other groups still read the cache.

Counted bytes: the combine's (each ``lse2_s`` read once a row, ``O_s`` of each split that saw a key of the row
read once, o and lse written) and the counters: 4 read and 4 written by each block's ``atomicAdd``, 4 written by
the last block's reset (:mod:`flash_numba.iomodel.flash_decode`'s term "split counters").
"""

from __future__ import annotations

from functools import lru_cache

from numba import cuda, int32, int64, uint32, uint64

from ...device import jit
from .kernels import FASTMATH, MAX_SPLITS, NT, row_merger, splits_that_see

WARPS = NT // 32
#: The counter name of the fused split kernel's launch (the split kernel and the combine in one).
FUSED_NAME = "flash_decode split-KV + combine"
#: Floats of the shared arrays the last block's merge uses (``lse2_s`` and the weights, a row of each a warp).
SHARED_FLOATS = 2 * WARPS * MAX_SPLITS


@lru_cache(maxsize=None)
def combine_tail(d: int, dtype_name: str, count: bool):
    """``tail(o_part, lse_part, o, lse, sem, group, row0, nrows, rows, S, L, Nq, causal, sh_flag, sh_x, sh_w) ->
    (nr, nw)``: the end of a split block with S > 1, called by all its threads after its partials are written.
    ``group`` its grid row y, ``row0`` .. ``row0 + nrows - 1`` the group's rows (global (b, h, i) rows of ``rows``,
    all of one sequence, whose cache holds ``L`` keys; ``Nq`` new tokens, ``causal``), ``sh_flag`` one int32 of
    shared memory, ``sh_x``, ``sh_w`` :data:`SHARED_FLOATS` // 2 float32 each.  The rows are merged by the combine
    kernel's :func:`.kernels.row_merger`.  Returns the bytes it read and wrote when counting, else zeros."""
    COUNT = count
    merge = row_merger(d, dtype_name, count)

    @jit(device=True, forceinline=True, fastmath=FASTMATH)
    def tail(o_part, lse_part, o, lse, sem, group, row0, nrows, rows, S, L, Nq, causal, sh_flag, sh_x, sh_w):
        tid = cuda.threadIdx.x
        warp = uint32(tid) >> uint32(5)
        nr = int64(0)
        nw = int64(0)
        cuda.threadfence()  # this thread's partials reach every block before the block counts itself in
        cuda.syncthreads()
        if tid == 0:
            before = cuda.atomic.add(sem, group, int32(1))
            last = int64(before) == int64(S) - 1
            sh_flag[0] = int32(1) if last else int32(0)
            if COUNT:
                nr += 4
                nw += 4
            if last:  # every block of the group has counted itself in: zero for the next launch
                sem[group] = int32(0)
                if COUNT:
                    nw += 4
        cuda.syncthreads()
        if sh_flag[0] == int32(0):
            return nr, nw
        cuda.threadfence()  # the other blocks' partials, seen through their counts
        for it in range((nrows + WARPS - 1) // WARPS):  # warp w merges rows w, w + 4, ... (the same trips for all)
            r = int64(it) * WARPS + int64(warp)
            row = uint64(row0 + r)
            n_seen = splits_that_see(L, int64(row % uint64(Nq)), Nq, int64(S), causal)
            tr, tw = merge(o_part, lse_part, o, lse, row, r < nrows, rows, S, n_seen, sh_x, sh_w)
            nr += tr
            nw += tw
            cuda.syncthreads()  # every lane done with this row's weights before the next row's
        return nr, nw

    return tail
