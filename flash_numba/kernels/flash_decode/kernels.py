"""The two kernels of a decode step: split-KV attention over one chunk of a KV cache, and the combine.

**Split kernel** (grid ``(num_splits, B*Hkv*row_tiles)``, 128 threads).  Block ``(s, y)`` owns KV head ``hkv``
of sequence ``b`` and keys ``start .. end - 1`` of that sequence's ``L = cache_seqlens[b]`` keys
(``chunk = ceil(L / num_splits)``, ``start = s * chunk``).  It computes *all* the query rows that read this KV
head, the ``R = G * Nq`` rows of the group (G = Hq / Hkv query heads, Nq new tokens), ``RT`` of them per block
(:func:`rows_per_block`): each key and value element of the chunk is read from HBM once per block, not once
per query head (grouped-query attention saves the bytes).  One key row is read by ``LPR`` lanes, 16 bytes each
(:mod:`flash_numba.kernels._vec`); a warp holds ``32 / LPR`` such lane groups, the block ``NG = 128 / LPR``::

      d = 128, float16: LPR = 16 lanes x 8 halves = one 256-byte key row
      warp 0: lanes 0-15 key j0 + 0, lanes 16-31 key j0 + 1       (group = tid // LPR)
      warp 1: key j0 + 2, j0 + 3      ...      warp 3: key j0 + 6, j0 + 7
      then key j0 + 8 + group, ... : T keys a group a step, loaded before any is used

Each lane group keeps its own online-softmax state (``m``, ``l`` and its LPR lanes' columns of ``O`` for the RT
rows, fp32 registers) over the keys it visits; per key, S_r = q_r . k is one partial dot product per lane and
``log2(LPR)`` ``shfl_xor`` steps.  At the end the NG states of the block are merged through shared memory (the
same rescale as the combine, lesson 3's rule).  Scores are in base 2 (q is scaled by ``scale * log2(e)``).

Paged cache: key ``j`` of sequence ``b`` lives in page ``block_table[b, j // P]`` at row ``j % P``; a block stages
the table entries of its chunk in shared memory, :data:`TABLE_BATCH` at a time (each entry read once per block).
Unpaged (``PAGED = False``) the "page" is the sequence's own ``(Hkv, Nmax, d)`` slab, no table.

With one split the kernel writes ``o`` (storage dtype) and ``lse`` (natural log) itself; with more it writes,
per split and row, ``lse2_s = m_s + log2(l_s)`` (base 2, -inf for a split that sees no key of that row) and the
normalised partial ``O_s / l_s`` (float32, only where the split sees a key of the row).

"Saw no key" is the geometry (a length of 0, a causal row before the cache, a split whose keys all lie past a
row's last visible key), never the scores (docs/RELIABILITY.md, section 2).  A row that sees keys whose scores
are all -inf (an infinite q or k made them so) has l = 0 and no defined softmax: o = lse = NaN, as in the
reference and the attention kernels.  A split that sees keys of a row, all of them at -inf, has l_s = 0 and
lse2_s = -inf; its partial is then its unnormalised sum of 0 * v (0, or NaN where a v was Inf or NaN), which
the combine weighs by 0: the visible products reach the result as IEEE arithmetic has them.

**Combine kernel** (one warp per output row, 4 rows a block): ``LSE2 = log2(sum_s 2^lse2_s)``,
``O = sum_s 2^(lse2_s - LSE2) O_s`` over the splits that saw a key of the row (from the geometry: the row's
length, read once per row, and its last visible key), ``lse = LSE2 * ln 2``; a row no split saw (a length of 0,
or a causal row before the cache) gets ``O = 0`` and ``lse = -inf``; a row that saw keys, only at -inf
(LSE2 = -inf), gets ``O = lse = NaN``.

Counted bytes (``COUNT``): what each thread's code reads and writes in global memory (see
:mod:`flash_numba.hbm`); :mod:`flash_numba.iomodel.flash_decode` gives the same numbers term by term.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32, int64, uint16, uint32, uint64

from ...device import jit
from .. import _bf16, _vec
from .._common import add_counts, exp2_ieee, nan_max, nb_type

NT = 128  # threads a block
WARPS = NT // 32
FULL = 0xFFFFFFFF
#: Page-table entries a block stages in shared memory at a time.
TABLE_BATCH = 128
#: The most splits a call may ask for (the combine's weights of a row sit in shared memory).
MAX_SPLITS = 128
#: The counter name of the fused split kernel's launch (the split kernel and the combine in one: :func:`combine_tail`).
FUSED_NAME = "flash_decode split-KV + combine"
#: Floats of the shared arrays the last block's merge uses (``lse2_s`` and the weights, a row of each a warp).
SHARED_FLOATS = 2 * (NT // 32) * MAX_SPLITS
#: Query rows a split block computes at most (its O accumulator lives in registers).
MAX_ROWS = 8
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FASTMATH = {"contract", "afn", "arcp", "nsz", "reassoc"}  # no ninf/nnan: masked scores keep their -inf
#: Register cap of the split kernel's builds of up to 4 rows: 128 a thread, so that 4 blocks of 128 threads fit an
#: SM's 65,536 registers (the split rule's ``RESIDENT_BLOCKS``).  Uncapped, the fused builds (the merge of
#: :func:`combine_tail` after the loop) took 147-155 on sm_90 and sm_75 (ptxas 13.5): 3 blocks an SM, so the rule's
#: 8 splits ran 1.3 waves (H200, 2026-12-02: 1,503 GB/s at 32k against 2,402 before the merge grew).  At 128 ptxas
#: spills nothing in any of them (tests/test_compile.py checks every build).  Eight rows (~210) stay uncapped.
MAX_REGISTERS = 128

SPLIT_NAME = "flash_decode split-KV"
SPLIT_ONE_NAME = "flash_decode (one split)"
COMBINE_NAME = "flash_decode combine"


def geometry(d: int, dtype_name: str) -> dict:
    """The lane layout of a key row: V elements a lane (16 bytes), C lanes hold data, LPR (a power of 2) lanes
    a row, NG lane groups (keys in flight) a block."""
    V = _vec.lanes("uint16" if dtype_name == "bfloat16" else dtype_name)  # bfloat16: its 16-bit words
    C = d // V
    LPR = 1
    while LPR < C:
        LPR *= 2
    return {"V": V, "C": C, "LPR": LPR, "NG": NT // LPR}


def rows_per_block(R: int) -> int:
    """RT: query rows a split block computes, for R = G * Nq rows that read one KV head: the smallest of
    1, 2, 4, 8 that holds them, else 8 (then ceil(R / 8) row tiles each read the chunk)."""
    for rt in (1, 2, 4):
        if R <= rt:
            return rt
    return MAX_ROWS


def keys_in_flight(RT: int) -> int:
    """T: keys a lane group loads before it uses any (more bytes in flight; registers grow with T * RT):
    4 for one or two rows a block, 2 for four, 1 for eight (ptxas: 122 registers at d = 128, float16, four rows)."""
    return max(1, min(4, 8 // RT))


@jit(device=True, forceinline=True)
def log2_or_minus_inf(x):
    """log2(x) for x > 0, -inf for x = 0 (the simulator's math.log2(0) raises), in x's own dtype."""
    return math.log2(x) if x > float32(0.0) else float32(-math.inf)


@jit(device=True, forceinline=True)
def split_sees_key(L, s, S, i, Nq, causal):
    """Whether split s of S (keys ``s * chunk .. min(L, (s + 1) * chunk) - 1``, ``chunk = ceil(L / S)``) holds a key
    that new token i sees (all L keys, or with ``causal`` keys up to ``L - Nq + i``): the geometry, never the
    scores.  The split kernels ask it at their end (recomputing from L, so that nothing stays live in their loop);
    the combine asks it as ``s <= last // chunk``."""
    last = L - 1
    if causal:
        last = min(last, i + (L - Nq))  # causal.last_visible_key(i, Nq, L)
    first = uint32(s) * ((uint32(L) + uint32(S - 1)) // uint32(S))  # 32-bit: a 64-bit division costs registers
    return int64(first) <= last  # and so < L: the split is not empty


@lru_cache(maxsize=None)
def state_merger(P: int, R: int):
    """``merge(sh_m, sh_l, sh_stat, tid)``: the online-softmax states of R rows held by P parts of a block (lane groups
    or warps; part p's m and l of row r at ``sh_m[p R + r]``, ``sh_l[p R + r]``) merged by threads 0 .. R - 1, a row
    each: ``M = max_p m_p``, ``L = sum_p l_p 2^(m_p - M)`` into ``sh_stat[r]``, ``sh_stat[R + r]``, and each part's
    factor ``2^(m_p - M)`` over its m in ``sh_m`` (by which its O is scaled next).  Both split kernels' end."""
    NEG_INF = float32(-math.inf)
    ZERO = float32(0.0)

    @jit(device=True, forceinline=True, fastmath=FASTMATH)
    def merge(sh_m, sh_l, sh_stat, tid):
        if tid < R:
            mm = NEG_INF
            for p in range(P):
                mm = nan_max(mm, sh_m[p * R + tid])
            m_use = mm if mm != NEG_INF else ZERO
            ll = ZERO
            for p in range(P):
                a = exp2_ieee(sh_m[p * R + tid] - m_use)
                sh_m[p * R + tid] = a
                ll += sh_l[p * R + tid] * a
            sh_stat[tid] = mm
            sh_stat[R + tid] = ll

    return merge


@lru_cache(maxsize=None)
def result_writer(d: int, dtype_name: str, split: bool, count: bool):
    """``write(o, lse, row, s, rows, c, acc, ll, lse2, seen) -> bytes``: column c of query row ``row``'s result,
    from the unnormalised ``acc``, the row's sum ``ll``, its log2-sum-exp ``lse2`` and ``seen``, whether the block
    saw a key of the row (the geometry; column 0 also writes the lse), shared by both split kernels.  ``split``:
    split s's partial (float32 O_s / l_s where the split saw a key of the row, ``acc`` itself where l_s = 0, and
    lse2_s always, at ``s * rows + row``); else the final output in the storage dtype (0 where the row saw no key,
    NaN where it saw only -inf scores) and lse in natural-log units (-inf there, NaN there).  Returns the bytes
    written when counting, else 0."""
    BF16 = dtype_name == "bfloat16"
    STORE = "uint16" if BF16 else dtype_name
    DT = uint16 if BF16 else nb_type(STORE)
    S_ITEM = np.dtype(STORE).itemsize
    D = d
    SPLIT, COUNT = split, count
    NEG_INF = float32(-math.inf)
    NAN = float32(math.nan)
    ZERO = float32(0.0)
    F_LN2 = float32(LN2)

    @jit(device=True, forceinline=True, fastmath=FASTMATH)  # the kernels' division (div.approx), as inline
    def write(o, lse, row, s, rows, c, acc, ll, lse2, seen):
        nw = 0
        if SPLIT:  # partials: lse2_s always, O_s / l_s where the split saw a key of the row
            at = uint64(s) * uint64(rows) + row
            if seen:  # l_s = 0 (every score it saw -inf): its sum of 0 * v (0 or NaN), which the combine weighs by 0
                o[at * uint64(D) + uint64(c)] = acc if ll == ZERO else acc / ll
                if COUNT:
                    nw += 4
            if c == 0:
                lse[at] = lse2
                if COUNT:
                    nw += 4
        else:  # saw no key: 0 and -inf; saw only -inf scores (l = 0): no softmax, NaN and NaN (0 / 0, as IEEE)
            val = acc / ll if ll > ZERO else (NAN if seen else ZERO)
            o[row * uint64(D) + uint64(c)] = _bf16.f32_to_bf16(val) if BF16 else DT(val)
            if COUNT:
                nw += S_ITEM
            if c == 0:
                lse[row] = lse2 * F_LN2 if ll > ZERO else (NAN if seen else NEG_INF)
                if COUNT:
                    nw += 4
        return nw

    return write


@lru_cache(maxsize=None)
def split_kernel(d: int, dtype_name: str, RT: int, paged: bool, split: bool, causal: bool, count: bool,
                 T: int | None = None, fused: bool = False):
    """The split kernel for head dim d (a multiple of 16 bytes), storage ``dtype_name``, ``RT`` rows a block,
    a ``paged`` cache, ``split`` (partials out) or not (o and lse out), ``causal`` (bottom-right among the new
    tokens; only then can a key the block reads be masked for a row, so only then does P V test the mask: a
    masked key adds nothing, a visible one multiplies, p = 0 or not, as IEEE arithmetic and the reference do),
    ``count``ing bytes; ``T`` keys in flight a lane group (None: :func:`keys_in_flight`; the benchmark measures
    others); ``fused`` (with ``split``): the last block of a group merges the group's partials into ``o_out``,
    ``lse_out`` (:func:`combine_tail`; ``sem`` its counters), else those three arguments are not read."""
    g = geometry(d, dtype_name)
    V, C, LPR, NG = g["V"], g["C"], g["LPR"], g["NG"]
    T = keys_in_flight(RT) if T is None else T
    merge_states = state_merger(NG, RT)
    BF16 = dtype_name == "bfloat16"  # stored as uint16 words: converted by _bf16 (bits << 16, round to even)
    STORE = "uint16" if BF16 else dtype_name
    S_ITEM = np.dtype(STORE).itemsize
    D = d
    D_U = uint32(d)
    RTD = RT * d
    RTV = RT * V
    TV = T * V
    TRT = T * RT
    NGRT = NG * RT
    NGD = NG * d
    RT2 = 2 * RT
    STEPS = LPR.bit_length() - 1  # log2(LPR) butterfly steps
    KEYS = NG * T  # keys a block step
    PAGED, CAUSAL, COUNT = paged, causal, count
    load16 = _vec.loader(STORE)
    NEG_INF = float32(-math.inf)
    ZERO = float32(0.0)
    write_result = result_writer(d, dtype_name, split, count)
    VB = V * S_ITEM  # 16 bytes a load

    FUSED = fused and split
    tail = combine_tail(d, dtype_name, count)
    cap = {"max_registers": MAX_REGISTERS} if RT <= 4 else {}

    @jit(fastmath=FASTMATH, **cap)
    def kernel(q, k, v, table, seqlens, o, lse, o_out, lse_out, sem, Hkv, G, Nq, P, max_pages, rows, row_tiles,
               scale_log2, counter):
        tid = cuda.threadIdx.x
        s = uint32(cuda.blockIdx.x)
        y = uint32(cuda.blockIdx.y)
        S = uint32(cuda.gridDim.x)
        bhkv = y // uint32(row_tiles)
        rt = y - bhkv * uint32(row_tiles)
        b = bhkv // uint32(Hkv)
        hkv = bhkv - b * uint32(Hkv)
        RG = int64(G) * int64(Nq)  # rows that read this KV head
        r0 = int64(rt) * RT
        nrows = min(int64(RT), RG - r0)
        grow0 = int64(bhkv) * RG + r0  # global row (b, h, i) of the block's first row

        sh_q = cuda.shared.array(RTD, float32)
        sh_len = cuda.shared.array(1, int32)
        sh_pages = cuda.shared.array(TABLE_BATCH, int32)
        sh_m = cuda.shared.array(NGRT, float32)
        sh_l = cuda.shared.array(NGRT, float32)
        sh_o = cuda.shared.array(NGD, float32)
        sh_stat = cuda.shared.array(RT2, float32)
        nr = int64(0)
        nw = int64(0)

        if tid == 0:
            sh_len[0] = seqlens[b]
            if COUNT:
                nr += 4
        e = uint32(tid)
        while e < uint32(RTD):  # Q_i -> shared, scaled by scale * log2(e)
            r = e // D_U
            if int64(r) < nrows:
                qe = q[uint64(grow0 + int64(r)) * uint64(D) + uint64(e - r * D_U)]
                sh_q[e] = (_bf16.bf16_to_f32(qe) if BF16 else float32(qe)) * scale_log2
                if COUNT:
                    nr += S_ITEM
            else:
                sh_q[e] = ZERO
            e += uint32(NT)
        cuda.syncthreads()

        L = int64(sh_len[0])
        chunk = (L + int64(S) - 1) // int64(S)
        start = int64(s) * chunk
        end = min(L, start + chunk)

        gl = uint32(tid) % uint32(LPR)  # this lane's 16 bytes of a key row
        grp = uint32(tid) // uint32(LPR)  # its lane group
        active = gl < uint32(C)
        col = gl * uint32(V)

        lim = cuda.local.array(RT, int64)  # the last key each row sees
        qr = cuda.local.array(RTV, float32)
        oacc = cuda.local.array(RTV, float32)
        m = cuda.local.array(RT, float32)
        l = cuda.local.array(RT, float32)
        for r in range(RT):
            rr = r0 + r
            last = L - 1
            if CAUSAL:
                last = min(last, rr % int64(Nq) + (L - int64(Nq)))  # causal.last_visible_key(i, Nq, L)
            lim[r] = last if r < nrows else int64(-1)
            m[r] = NEG_INF
            l[r] = ZERO
            for x in range(V):
                qr[r * V + x] = sh_q[r * D + col + x] if active else ZERO
                oacc[r * V + x] = ZERO

        kf = cuda.local.array(TV, float32)
        vf = cuda.local.array(TV, float32)
        sc = cuda.local.array(TRT, float32)
        head_base = uint64(0)
        if not PAGED:  # sequence b's slab (Hkv, Nmax, d): one "page" of P = Nmax rows
            head_base = uint64(uint32(b) * uint32(Hkv) + hkv) * uint64(P) * uint64(D)
        lo = start
        pb = int64(0)
        while lo < end:
            hi = end
            if PAGED:  # stage the table entries of pages pb .. pb + TABLE_BATCH - 1
                pb = lo // int64(P)
                hi = min(end, (pb + TABLE_BATCH) * int64(P))
                p_last = (hi - 1) // int64(P)
                cuda.syncthreads()
                if tid < TABLE_BATCH and pb + tid <= p_last:
                    sh_pages[tid] = table[uint64(b) * uint64(max_pages) + uint64(pb + tid)]
                    if COUNT:
                        nr += 4
                cuda.syncthreads()
            j0 = lo
            while j0 < hi:  # KEYS keys a step, T a lane group
                for t in range(T):
                    j = j0 + int64(grp) + NG * t
                    if j < hi and active:
                        if PAGED:
                            pj = uint32(j) // uint32(P)
                            page = uint32(sh_pages[pj - uint32(pb)])
                            at = ((uint64(page * uint32(Hkv) + hkv) * uint64(P) + uint64(uint32(j) - pj * uint32(P)))
                                  * uint64(D) + uint64(col))
                        else:
                            at = head_base + uint64(uint32(j) * D_U + col)
                        kt = load16(k, at)
                        vt = load16(v, at)
                        for x in range(V):
                            if BF16:
                                kf[t * V + x] = _bf16.bf16_to_f32(kt[x])
                                vf[t * V + x] = _bf16.bf16_to_f32(vt[x])
                            else:
                                kf[t * V + x] = float32(kt[x])
                                vf[t * V + x] = float32(vt[x])
                        if COUNT:
                            nr += 2 * VB
                    else:
                        for x in range(V):
                            kf[t * V + x] = ZERO
                            vf[t * V + x] = ZERO
                for t in range(T):  # S_r = q_r . k_j, this lane's V columns
                    for r in range(RT):
                        acc = ZERO
                        for x in range(V):
                            acc += qr[r * V + x] * kf[t * V + x]
                        sc[t * RT + r] = acc
                for st in range(STEPS):  # ... summed over the LPR lanes of the row (all of them get the sum)
                    mask = LPR >> (st + 1)
                    for t in range(T):
                        for r in range(RT):
                            sc[t * RT + r] += cuda.shfl_xor_sync(FULL, sc[t * RT + r], mask)
                for r in range(RT):  # online softmax over the T keys (lesson 3), base 2
                    mx = m[r]
                    for t in range(T):
                        j = j0 + int64(grp) + NG * t
                        x_ = sc[t * RT + r] if (j < hi and j <= lim[r]) else NEG_INF
                        sc[t * RT + r] = x_
                        mx = nan_max(mx, x_)
                    m_use = mx if mx != NEG_INF else ZERO  # no key seen yet: exp2(-inf - 0) = 0, no NaN
                    alpha = exp2_ieee(m[r] - m_use)
                    m[r] = mx
                    lsum = ZERO
                    for t in range(T):
                        p = exp2_ieee(sc[t * RT + r] - m_use)
                        sc[t * RT + r] = p
                        lsum += p
                    l[r] = l[r] * alpha + lsum
                    for x in range(V):
                        ov = oacc[r * V + x] * alpha
                        for t in range(T):
                            p = sc[t * RT + r]
                            if not CAUSAL:  # every key read is visible (a key past the chunk has p = 0, v = 0)
                                ov += p * vf[t * V + x]
                            elif j0 + int64(grp) + NG * t <= lim[r]:  # a masked key adds nothing, even an Inf
                                ov += p * vf[t * V + x]  # or NaN value; a visible one multiplies, p = 0 or not
                        oacc[r * V + x] = ov
                j0 += KEYS
            lo = hi

        # merge the NG lane groups' states: M = max m_g, L = sum l_g 2^(m_g - M), O = sum O_g 2^(m_g - M)
        if gl == 0:
            for r in range(RT):
                sh_m[grp * RT + r] = m[r]
                sh_l[grp * RT + r] = l[r]
        cuda.syncthreads()
        merge_states(sh_m, sh_l, sh_stat, tid)
        cuda.syncthreads()
        for r in range(RT):
            if active:
                a = sh_m[grp * RT + r]
                for x in range(V):
                    sh_o[grp * D + col + x] = oacc[r * V + x] * a
            cuda.syncthreads()
            if r < nrows and tid < D:
                acc = ZERO
                for gi in range(NG):
                    acc += sh_o[gi * D + tid]
                ll = sh_stat[RT + r]
                lse2 = sh_stat[r] + log2_or_minus_inf(ll)
                seen = split_sees_key(int64(sh_len[0]), s, S, int64(uint32(r0 + r) % uint32(Nq)), int64(Nq), CAUSAL)
                nw += write_result(o, lse, uint64(grow0 + r), s, rows, tid, acc, ll, lse2, seen)
            cuda.syncthreads()
        if FUSED:  # the group's last block merges its partials into o_out, lse_out
            tr, tw = tail(o, lse, o_out, lse_out, sem, y, grow0, nrows, rows, S, int64(sh_len[0]), int64(Nq), CAUSAL)
            nr += tr
            nw += tw
        if COUNT:
            add_counts(counter, nr, nw)

    return kernel


@jit(device=True, forceinline=True)
def splits_that_see(L, i, Nq, S, causal):
    """How many of the S splits of a length-L cache hold a key that new token i sees: splits 0 .. last // chunk
    (``chunk = ceil(L / S)``, ``last`` the row's last visible key), each one for which :func:`split_sees_key` holds;
    0 where the row sees no key.  The geometry, never the scores."""
    last = L - 1
    if causal:
        last = min(last, i + (L - Nq))  # causal.last_visible_key(i, Nq, L)
    n_seen = int64(0)
    if last >= 0:
        n_seen = last // ((L + S - 1) // S) + 1
    return n_seen


@lru_cache(maxsize=None)
def row_merger(d: int, dtype_name: str, count: bool):
    """``merge(o_part, lse_part, o, lse, row, ok, rows, S, n_seen, sh_x, sh_w) -> (nr, nw)``: one warp merges the S
    partials of query row ``row`` with the online-softmax rescale (lesson 3's rule) and writes its o and lse::

        LSE2 = log2(sum_s 2^lse2_s),  O = sum_s 2^(lse2_s - LSE2) O_s,  lse = LSE2 ln 2

    ``n_seen``: the splits that saw a key of the row (:func:`splits_that_see`), which wrote O_s (weight 0 where
    lse2_s = -inf: then 0 * O_s keeps a NaN of its 0 * v); where they saw only -inf scores there is no softmax: o and
    lse are NaN; where none saw a key, 0 and -inf.  ``sh_x``, ``sh_w``: :data:`MAX_SPLITS` float32 of shared memory
    a warp (at ``warp * MAX_SPLITS``).  ``ok`` False: a row past the end, whose warp still takes the block-wide
    barrier inside (every warp of the block calls it the same number of times).  Shared by the combine kernel and
    the fused split kernel's last block (:func:`combine_tail`).  Returns the bytes read and written when counting."""
    BF16 = dtype_name == "bfloat16"
    STORE = "uint16" if BF16 else dtype_name
    DT = uint16 if BF16 else nb_type(STORE)
    S_ITEM = np.dtype(STORE).itemsize
    D = d
    COUNT = count
    NEG_INF = float32(-math.inf)
    NAN = float32(math.nan)
    ZERO = float32(0.0)
    F_LN2 = float32(LN2)

    @jit(device=True, forceinline=True, fastmath=FASTMATH)
    def merge(o_part, lse_part, o, lse, row, ok, rows, S, n_seen, sh_x, sh_w):
        lane = uint32(cuda.threadIdx.x) % uint32(32)
        base = (uint32(cuda.threadIdx.x) // uint32(32)) * uint32(MAX_SPLITS)
        nr = int64(0)
        nw = int64(0)
        mm = NEG_INF
        s = lane
        while s < uint32(S):
            x = NEG_INF
            if ok:
                x = lse_part[uint64(s) * uint64(rows) + row]
                if COUNT:
                    nr += 4
            sh_x[base + s] = x
            mm = nan_max(mm, x)
            s += uint32(32)
        for st in range(5):
            mm = nan_max(mm, cuda.shfl_xor_sync(FULL, mm, 16 >> st))
        m_use = mm if mm != NEG_INF else ZERO
        w = ZERO
        s = lane
        while s < uint32(S):
            w += exp2_ieee(sh_x[base + s] - m_use)
            s += uint32(32)
        for st in range(5):
            w += cuda.shfl_xor_sync(FULL, w, 16 >> st)
        lse2 = mm + log2_or_minus_inf(w)
        s = lane
        while s < uint32(S):
            x = sh_x[base + s]
            sh_w[base + s] = exp2_ieee(x - lse2) if x != NEG_INF else ZERO
            s += uint32(32)
        cuda.syncthreads()  # the weights written before any lane reads them
        only_minus_inf = n_seen > 0 and lse2 == NEG_INF  # saw keys, every score -inf: no softmax, NaN
        if ok:
            c = lane
            while c < uint32(D):
                acc = ZERO
                for si in range(n_seen):  # the splits that saw a key of the row wrote O_s
                    acc += sh_w[base + si] * o_part[(uint64(si) * uint64(rows) + row) * uint64(D) + uint64(c)]
                    if COUNT:
                        nr += 4
                if only_minus_inf:
                    acc = NAN
                o[row * uint64(D) + uint64(c)] = _bf16.f32_to_bf16(acc) if BF16 else DT(acc)
                if COUNT:
                    nw += S_ITEM
                c += uint32(32)
            if lane == 0:
                lse[row] = NAN if only_minus_inf else (lse2 * F_LN2 if lse2 != NEG_INF else NEG_INF)
                if COUNT:
                    nw += 4
        return nr, nw

    return merge


@lru_cache(maxsize=None)
def combine_kernel(d: int, dtype_name: str, count: bool):
    """The combine kernel: one warp per output row, the splits' partials merged with the online-softmax rescale
    (:func:`row_merger`).

    Which splits saw a key of a row is the geometry, as in the split kernel: the row's length L (``seqlens``, read
    once per row), its last visible key ``last`` (L - 1, or with ``causal`` L - Nq + i for new token i) and the
    splits' chunk ``ceil(L / num_splits)``: splits 0 .. last // chunk saw keys (and wrote a partial O_s), the
    others none (:func:`splits_that_see`)."""
    COUNT = count
    W_SPLITS = WARPS * MAX_SPLITS
    merge = row_merger(d, dtype_name, count)

    @jit(fastmath=FASTMATH)
    def combine(o_part, lse_part, seqlens, o, lse, rows, num_splits, Hq, Nq, causal, counter):
        tid = cuda.threadIdx.x
        warp = uint32(tid) // uint32(32)
        lane = uint32(tid) % uint32(32)
        row = uint64(cuda.blockIdx.x) * uint64(WARPS) + uint64(warp)
        ok = row < uint64(rows)
        sh_x = cuda.shared.array(W_SPLITS, float32)  # lse2_s of the warp's row
        sh_w = cuda.shared.array(W_SPLITS, float32)  # its weights 2^(lse2_s - LSE2)
        nr = int64(0)
        seq = uint64(Hq) * uint64(Nq)  # rows (b, h, i) a sequence
        len0 = int32(0)
        if ok and lane == 0:
            len0 = seqlens[row // seq]
            if COUNT:
                nr += 4
        L = int64(cuda.shfl_sync(FULL, len0, 0))
        n_seen = splits_that_see(L, int64(row % uint64(Nq)), int64(Nq), int64(num_splits), causal)
        tr, nw = merge(o_part, lse_part, o, lse, row, ok, rows, num_splits, n_seen, sh_x, sh_w)
        if COUNT:
            add_counts(counter, nr + tr, nw)

    return combine


@lru_cache(maxsize=None)
def combine_tail(d: int, dtype_name: str, count: bool):
    """``tail(o_part, lse_part, o, lse, sem, group, row0, nrows, rows, S, L, Nq, causal) -> (nr, nw)``: the end of
    a split block with S > 1, called by all its threads after its partials are written.
    ``group`` its grid row y, ``row0`` .. ``row0 + nrows - 1`` the group's rows (global (b, h, i) rows of ``rows``,
    all of one sequence, whose cache holds ``L`` keys; ``Nq`` new tokens, ``causal``); its shared memory (a flag,
    and :data:`SHARED_FLOATS` // 2 float32 twice for the merge's exponents and weights) is its own.  The rows are
    merged by the combine kernel's :func:`row_merger`.  Returns the bytes it read and wrote when counting, else zeros.

    The combine folded into the split kernel (``fused``, the default with S > 1: :data:`FUSE_COMBINE` of the
    package):
    With ``num_splits`` S > 1 the S blocks of a group (one sequence, one KV head, one row tile: the blocks ``(s, y)``,
    s = 0 .. S - 1, of grid row y) each write their partial (``O_s / l_s`` and ``lse2_s`` of the group's rows,
    :func:`result_writer`).  Instead of a second launch that merges them (:func:`combine_kernel`),
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
    COUNT = count
    SHX = SHARED_FLOATS // 2
    merge = row_merger(d, dtype_name, count)

    @jit(device=True, forceinline=True, fastmath=FASTMATH)
    def tail(o_part, lse_part, o, lse, sem, group, row0, nrows, rows, S, L, Nq, causal):
        sh_flag = cuda.shared.array(1, int32)
        sh_x = cuda.shared.array(SHX, float32)
        sh_w = cuda.shared.array(SHX, float32)
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
