"""The split kernel on tensor cores, its K and V tiles streamed through a cp.async pipeline (sm_80+).

Same grid, same partials, same counted bytes as :func:`.kernels.split_kernel` (read its docstring first); what
differs is how a block reads and multiplies its chunk.  The CUDA-core kernel keeps a key in flight a lane group
in registers and issues ~108 instructions a key (the H200 profile of 2026-12-01: 121 registers, 4 warps a
scheduler, 54% of the issue slots busy at 1,736 GB/s): it cannot have more bytes in flight and could not issue
the instructions of a faster read anyway.  Here:

* **Rows**: one m16 tile of the mma, ``MMA_ROWS = 16`` query rows a block (the G heads x Nq tokens of the group,
  zero-padded; the rows past 8 are skipped where the group has at most 8: ``NR = 1``).  Every warp holds Q as A
  fragments (ldmatrix, once).
* **Keys**: warp w of 4 takes tiles w, w + 4, w + 8, ... of ``KT = 16`` keys of the chunk, each its own
  online-softmax state (m, l and O of its rows in mma accumulators), merged through shared memory at the end.
* **Pipeline**: each warp has ``stages`` buffers of a K tile and a V tile (16 rows of d + 8 elements: the pad
  makes the 8 rows an ldmatrix phase reads fall in 8 different bank groups).  cp.async (16 bytes a lane, no
  register; ``.L2::128B``: the L2 fetches the aligned 128 bytes around each copy, :data:`L2_PREFETCH`) fills
  tile i + stages - 1 while the warp computes tile i; ``cp.async.wait_group stages - 2`` and a ``__syncwarp``
  make tile i visible to the warp.  No block barrier inside the loop: the warps run apart.  Every
  warp runs the same number of tiles (a warp past the chunk's end computes a zero tile whose keys are all
  masked), so that the warp operations of the simulator, which wait for the whole block, stay in step.
* **Products** (mma.m16n8k16, fp32 accumulation), per tile: S = Q K^T (d/16 k-steps, two n8 tiles of keys: K
  from shared memory by ldmatrix, no transpose), the online softmax on the accumulator fragments (a quad of lanes
  holds a row), P rounded to the storage type in registers and O += P V (V by ldmatrix.trans; d/8 n8 tiles): the
  fragment layouts of :mod:`flash_numba.kernels.flash2_tc.forward`.  The loop's PTX at d = 128 (one row half,
  unpaged): ~460 instructions a 16-key tile, ~29 a key (16 mma, 16 ldmatrix, 16 cp.async with their addresses,
  the softmax and the rescale of O), against ~108 a key issued by the CUDA-core kernel.
* **Paged cache**: the table entries of a segment of the chunk (:data:`TABLE_BATCH` pages) are staged in shared
  memory, each read once per block, as in the CUDA-core kernel (the same IO model); lanes 0..15 each find the
  cache row of one key of a tile (one division a tile) and pass it to the lanes that copy it (``shfl``).

Numerics: as flash2_tc, P is rounded to float16 (bfloat16) before P V, a relative error of the storage type's
unit roundoff per weight.  The non-finite rule is the CUDA-core kernel's (docs/RELIABILITY.md, section 2): a
masked key adds nothing, a visible one multiplies (p = 0 or not).  A tensor core multiplies every entry, so the
keys that causal masking hides from some of the Nq new tokens (the last Nq - 1 keys of the sequence, in the last
tile or two of the last split) do not go through it: on the steps that hold them, each such key's P V is added
on CUDA cores to the rows that see it, and its V row is zeroed in shared memory before the mma.  At Nq = 1
nothing is masked and the non-causal build runs (:func:`flash_numba.kernels.flash_decode.run`).  Keys past the
chunk are zero-filled in shared memory and add 0.
"""

from __future__ import annotations

import math
from functools import lru_cache

from numba import cuda, float32, int32, int64, uint32, uint64

from ...device import jit
from .. import _bf16, _mma, _smem
from .._common import add_counts, exp2_ieee, nan_max, nb_type
from .kernels import (FASTMATH, NT, SHARED_FLOATS, combine_tail, log2_or_minus_inf, result_writer,
                      split_sees_key, state_merger)

WARPS = NT // 32
FULL = 0xFFFFFFFF
#: Query rows a block computes: one m16 tile of the mma.
MMA_ROWS = 16
#: Keys a warp's tile: two n8 tiles of S, one k16 step of P V.
KT = 16
#: Elements of padding a shared row (16 bytes): the rows of an ldmatrix phase on 8 different bank groups.
PAD = 8
#: Page-table entries a block stages in shared memory at a time (a segment of the chunk; the pipeline drains at
#: a segment's end, every 512 pages: 131,072 keys in pages of 256, 8,192 in pages of 16).
TABLE_BATCH = 512
#: Pipeline stages a warp (buffers of a K and a V tile).  Measured on the H200 at d = 128, float16, G = 4
#: (benchmarks/results/h200-2026-12-01-decode-pipeline): 2 stages (two blocks an SM, 4 splits) 2,943 and 3,795
#: GB/s at 32k and 128k, 3 stages (two blocks, 4 splits) 2,993 and 3,786, 4 stages (one block, 2 splits) 2,998
#: and 3,786: within 2%, so the fewest, which leave the most shared memory and fit an A100's 164 KB an SM.
STAGES = 2
#: cp.async's L2 prefetch size in bytes: each 16-byte copy asks the L2 for its aligned 128 bytes
#: (``.L2::128B``, as CUTLASS's cp.async; 0: no qualifier; :func:`.._mma.cp_async_16_l2`).  Measured on the
#: H200 at d = 128, float16, 4 splits, alternated in one device call (benchmarks/results/h200-2026-12-02-decode-l2):
#: 128 bytes 4,057-4,074 GB/s at 32k and 4,239-4,240 at 128k; none 3,973-3,980 and 4,132-4,141; 64 bytes as none;
#: 256 (the call before) as none.  ``benchmarks/decode_knobs.py`` sets it before a kernel is built.
L2_PREFETCH = 128


def runs(d: int, dtype_name: str) -> bool:
    """Whether the tensor-core kernel runs head dim d and ``dtype_name``: float16 or bfloat16, d = 16 .. 128
    a multiple of 16 (whole k16 steps)."""
    return dtype_name in ("float16", "bfloat16") and 16 <= d <= 128 and d % 16 == 0


def half_rows(R: int) -> int:
    """NR: halves of the m16 tile that hold rows (1 where the group's R = G * Nq rows fit 8)."""
    return 1 if R <= 8 else 2


def tile_sizes(d: int, stages: int) -> tuple[int, int]:
    """16-bit elements of the block's shared tiles: the warps' K/V buffers, and Q (16 rows)."""
    DS = d + PAD
    return WARPS * stages * 2 * KT * DS, MMA_ROWS * DS


def static_bytes(d: int, NR: int, fused: bool = False) -> int:
    """Bytes of the kernel's static shared arrays: the table batch, the length, O and the row statistics of the
    merge (float32); ``fused``: the last block's merge of the partials too (:func:`.kernels.combine_tail`)."""
    MR = 8 * NR
    merge = 4 + 4 * SHARED_FLOATS if fused else 0  # combine_tail's flag and two arrays
    return 4 * (TABLE_BATCH + 1 + MR * d + 2 * WARPS * MR + 2 * MR) + merge


def dynamic(d: int, stages: int, NR: int, fused: bool = False) -> bool:
    """Whether the tiles go to dynamic shared memory (the block's shared memory passes 48 KB)."""
    return _smem.is_dynamic(_smem.total_bytes(tile_sizes(d, stages), 2) + static_bytes(d, NR, fused))


def shared_bytes(d: int, stages: int, NR: int, fused: bool = False) -> int:
    """A block's shared memory, static and dynamic."""
    return _smem.total_bytes(tile_sizes(d, stages), 2) + static_bytes(d, NR, fused)


def resident_blocks(d: int, stages: int, NR: int, shared_per_sm: int, fused: bool = False) -> int:
    """Blocks an SM holds at once, by shared memory (1 KB a block reserved by the driver), at most 4 (the
    registers of 128 threads at up to 128 a thread)."""
    return max(1, min(4, shared_per_sm // (shared_bytes(d, stages, NR, fused) + 1024)))


@lru_cache(maxsize=None)
def split_tc_kernel(d: int, dtype_name: str, NR: int, paged: bool, split: bool, causal: bool, count: bool,
                    stages: int = STAGES, fused: bool = False):
    """The tensor-core split kernel: head dim d (16 .. 128, a multiple of 16), ``dtype_name`` float16 or bfloat16,
    ``NR`` halves of the row tile in use (:func:`half_rows`), ``paged``, ``split`` (partials out), ``causal``,
    ``count``, ``stages`` (2 .. 8) buffers a warp, ``fused`` (with ``split``: the last block of a group merges
    the partials, :func:`.kernels.combine_tail`).  Arguments as :func:`.kernels.split_kernel`'s."""
    if not runs(d, dtype_name):
        raise ValueError(f"flash_decode's tensor-core kernel runs float16 and bfloat16 at d = 16 .. 128, a multiple "
                         f"of 16, not {dtype_name} at d = {d}")
    if not 2 <= stages <= 8:
        raise ValueError(f"stages: {stages} is not 2 .. 8")
    BF16 = dtype_name == "bfloat16"
    STORE = "uint16" if BF16 else dtype_name
    DT = nb_type(STORE)
    S_ITEM = 2
    write_result = result_writer(d, dtype_name, split, count)
    FUSED = fused and split
    tail = combine_tail(d, dtype_name, count)
    pack = _mma.pack_bf16x2 if BF16 else _mma.pack_f16x2
    to_f32 = _bf16.bf16_to_f32 if BF16 else float32
    mma = _mma.mma_m16n8k16_bf16 if BF16 else _mma.mma_m16n8k16_f16
    ldsm, ldsm_t = _mma.ldmatrix_x4, _mma.ldmatrix_x4_trans
    cp_async, zero_16 = _mma.cp_async_16_l2(L2_PREFETCH), _mma.zero_16
    commit, wait_pipe = _mma.cp_async_commit, _mma.cp_async_wait_group(stages - 2)
    DYN = dynamic(d, stages, NR, FUSED)
    block_tiles = _smem.tiles(tile_sizes(d, stages), STORE, DYN)
    D = d
    D_U = uint32(d)
    DS = d + PAD
    DS_U = uint32(DS)
    STAGE = 2 * KT * DS  # a K tile and a V tile
    WARP_AREA = stages * STAGE
    V_OFF = KT * DS
    NS = stages
    CR = d // 8  # 16-byte chunks a row
    CPL = KT * CR // 32  # chunks a lane copies a tile (of K, and as many of V)
    KSTEPS = d // 16
    DTILES = d // 8
    ACC = NR * 2 * DTILES
    MR = 8 * NR  # rows of the tile in use
    merge_states = state_merger(WARPS, MR)
    MRD = MR * d
    WMR = WARPS * MR
    MR2 = 2 * MR
    QREGS = 4 * (d // 16)
    QROWS_D = MMA_ROWS * d
    TB = TABLE_BATCH
    PAGED, CAUSAL, COUNT = paged, causal, count
    NEG_INF = float32(-math.inf)
    ZERO = float32(0.0)
    ZERO_U = uint32(0)

    @jit(device=True, forceinline=True)
    def load_tile(sm, buf, k, v, sh_pages, kb, hi, pb, P, Hkv, hkv, head_row, lane):
        """cp.async the K and V rows of keys kb .. kb + 15 (below hi) into the buffer at ``buf``; rows from hi on
        zero-filled.  Returns the bytes read."""
        nr = int64(0)
        rowidx = int64(0)
        if PAGED:  # lane l (and l + 16) finds key kb + l % 16: page table entry, then the cache row
            j = kb + int64(lane & uint32(15))
            if j < hi:
                pj = uint32(j) // uint32(P)
                page = uint32(sh_pages[pj - uint32(pb)])
                rowidx = int64((uint64(page) * uint64(Hkv) + uint64(hkv)) * uint64(P)
                               + uint64(uint32(j) - pj * uint32(P)))
        for u in range(CPL):
            c = lane + uint32(32 * u)
            kr = c // uint32(CR)
            cc = c - kr * uint32(CR)
            s_at = uint32(buf) + kr * DS_U + cc * uint32(8)
            row = int64(0)
            if PAGED:
                row = cuda.shfl_sync(FULL, rowidx, int32(kr))
            j = kb + int64(kr)
            if j < hi:
                if not PAGED:
                    row = head_row + j
                g_at = uint64(row) * uint64(D) + uint64(cc * uint32(8))
                cp_async(sm, s_at, k, g_at)
                cp_async(sm, s_at + uint32(V_OFF), v, g_at)
                if COUNT:
                    nr += 32
            else:
                zero_16(sm, s_at)
                zero_16(sm, s_at + uint32(V_OFF))
        return nr

    @jit(fastmath=FASTMATH)
    def kernel(q, k, v, table, seqlens, o, lse, o_out, lse_out, sem, Hkv, G, Nq, P, max_pages, rows, row_tiles,
               scale_log2, counter):
        sm, sh_q = block_tiles()
        sh_pages = cuda.shared.array(TB, int32)
        sh_len = cuda.shared.array(1, int32)
        sh_o = cuda.shared.array(MRD, float32)
        sh_m = cuda.shared.array(WMR, float32)
        sh_l = cuda.shared.array(WMR, float32)
        sh_stat = cuda.shared.array(MR2, float32)
        qf = cuda.local.array(QREGS, uint32)
        s = cuda.local.array(8, float32)
        acc = cuda.local.array(ACC, float32)
        m = cuda.local.array(2, float32)
        l = cuda.local.array(2, float32)
        lim = cuda.local.array(2, int64)

        tid = cuda.threadIdx.x
        warp = uint32(tid) >> uint32(5)
        lane = uint32(tid) & uint32(31)
        g = lane >> uint32(2)
        t = lane & uint32(3)
        sp = uint32(cuda.blockIdx.x)
        y = uint32(cuda.blockIdx.y)
        S = uint32(cuda.gridDim.x)
        bhkv = y // uint32(row_tiles)
        rt = y - bhkv * uint32(row_tiles)
        b = bhkv // uint32(Hkv)
        hkv = bhkv - b * uint32(Hkv)
        RG = int64(G) * int64(Nq)
        r0 = int64(rt) * MMA_ROWS
        nrows = min(int64(MMA_ROWS), RG - r0)
        grow0 = int64(bhkv) * RG + r0
        nr = int64(0)
        nw = int64(0)

        if tid == 0:
            sh_len[0] = seqlens[b]
            if COUNT:
                nr += 4
        e = uint32(tid)
        while e < uint32(QROWS_D):  # Q's rows -> shared (storage type), rows past the group's zero
            r = e // D_U
            c = e - r * D_U
            if int64(r) < nrows:
                sh_q[r * DS_U + c] = q[uint64(grow0 + int64(r)) * uint64(D) + uint64(c)]
                if COUNT:
                    nr += S_ITEM
            else:
                sh_q[r * DS_U + c] = DT(0)
            e += uint32(NT)
        cuda.syncthreads()

        L = int64(sh_len[0])
        chunk = (L + int64(S) - 1) // int64(S)
        start = int64(sp) * chunk
        end = min(L, start + chunk)

        # Q as A fragments: rows lane % 16, columns 16 kk + 8 (lane / 16)
        a_row = (lane & uint32(15)) * DS_U + (lane >> uint32(4)) * uint32(8)
        for kk in range(KSTEPS):
            qf[4 * kk], qf[4 * kk + 1], qf[4 * kk + 2], qf[4 * kk + 3] = ldsm(sh_q, a_row + uint32(16 * kk))
        for r in range(NR):
            rr = r0 + int64(g) + 8 * r  # this lane's rows g, g + 8
            last = L - 1
            if CAUSAL:
                last = min(last, rr % int64(Nq) + (L - int64(Nq)))  # causal.last_visible_key(i, Nq, L)
            lim[r] = last if rr < r0 + nrows else int64(-1)
            m[r] = NEG_INF
            l[r] = ZERO
        for x in range(ACC):
            acc[x] = ZERO
        first_masked = L - int64(Nq) + 1 if CAUSAL else L  # the first key some row of the group cannot see

        # ldmatrix row addresses (flash2_tc's): K tile, no transpose: key (lane % 8) + 8 (lane / 16), column
        # 8 ((lane / 8) % 2); V tile, transposed: key (lane % 8) + 8 ((lane / 8) % 2), column 8 (lane / 16)
        k_off = ((lane & uint32(7)) + ((lane >> uint32(4)) << uint32(3))) * DS_U \
            + ((lane >> uint32(3)) & uint32(1)) * uint32(8)
        v_off = uint32(V_OFF) + ((lane & uint32(7)) + (((lane >> uint32(3)) & uint32(1)) << uint32(3))) * DS_U \
            + (lane >> uint32(4)) * uint32(8)
        wbase = warp * uint32(WARP_AREA)
        head_row = int64(0)
        if not PAGED:  # sequence b's slab (Hkv, Nmax, d): rows of KV head hkv
            head_row = (int64(b) * int64(Hkv) + int64(hkv)) * int64(P)

        lo = start
        pb = int64(0)
        while lo < end:
            hi = end
            if PAGED:  # a segment: the keys of pages pb .. pb + TB - 1, their table entries in shared memory
                pb = lo // int64(P)
                hi = min(end, (pb + TB) * int64(P))
                p_last = (hi - 1) // int64(P)
                cuda.syncthreads()
                e = uint32(tid)
                while e < uint32(TB) and pb + int64(e) <= p_last:
                    sh_pages[e] = table[uint64(b) * uint64(max_pages) + uint64(pb + int64(e))]
                    if COUNT:
                        nr += 4
                    e += uint32(NT)
                cuda.syncthreads()
            n_tiles = (hi - lo + KT - 1) // KT
            steps = (n_tiles + WARPS - 1) // WARPS  # tiles each warp runs (the same for all)
            kw = lo + int64(warp) * KT  # this warp's first tile; then every WARPS * KT keys
            cuda.syncwarp()  # the warp is done with its buffers (the previous segment's last tile)
            for st in range(NS - 1):  # prologue: tiles 0 .. NS - 2 in flight
                if st < steps:
                    nr += load_tile(sm, wbase + uint32(st * STAGE), k, v, sh_pages, kw + st * WARPS * KT, hi, pb,
                                    P, Hkv, hkv, head_row, lane)
                commit()
            for i in range(steps):
                wait_pipe()  # this lane's copies of tile i have landed ...
                cuda.syncwarp()  # ... and the warp's; every lane is done with tile i - 1's buffer
                nxt = i + NS - 1
                if nxt < steps:
                    nr += load_tile(sm, wbase + uint32((nxt % NS) * STAGE), k, v, sh_pages,
                                    kw + nxt * WARPS * KT, hi, pb, P, Hkv, hkv, head_row, lane)
                commit()
                buf = wbase + uint32((i % NS) * STAGE)
                kb = kw + i * WARPS * KT

                # S = Q K^T: n8 tiles of keys kb .. kb + 7 (s[0:4]) and kb + 8 .. kb + 15 (s[4:8])
                for x in range(8):
                    s[x] = ZERO
                for kk in range(KSTEPS):
                    b0, b1, b2, b3 = ldsm(sm, buf + k_off + uint32(16 * kk))
                    a1 = qf[4 * kk + 1] if NR == 2 else ZERO_U
                    a3 = qf[4 * kk + 3] if NR == 2 else ZERO_U
                    s[0], s[1], s[2], s[3] = mma(qf[4 * kk], a1, qf[4 * kk + 2], a3, b0, b1, s[0], s[1], s[2], s[3])
                    s[4], s[5], s[6], s[7] = mma(qf[4 * kk], a1, qf[4 * kk + 2], a3, b2, b3, s[4], s[5], s[6], s[7])
                for x in range(8):
                    s[x] *= scale_log2
                if kb + KT > hi or kb + KT > first_masked:  # keys past the segment; causal: past a row's diagonal
                    for nt in range(2):
                        for e4 in range(4):
                            j = kb + 8 * nt + 2 * int64(t) + (e4 & 1)
                            if e4 >> 1 < NR and (j >= hi or j > lim[e4 >> 1]):
                                s[4 * nt + e4] = NEG_INF

                # online softmax of rows g (r = 0: c0, c1) and g + 8 (r = 1: c2, c3); a row's 4 lanes are a quad
                for r in range(NR):
                    mx = nan_max(nan_max(s[2 * r], s[2 * r + 1]), nan_max(s[4 + 2 * r], s[5 + 2 * r]))
                    mx = nan_max(mx, cuda.shfl_xor_sync(FULL, mx, 1))
                    mx = nan_max(mx, cuda.shfl_xor_sync(FULL, mx, 2))
                    m_new = nan_max(m[r], mx)
                    m_use = ZERO if m_new == NEG_INF else m_new  # nothing visible yet: P = 0, alpha = 0, no NaN
                    alpha = exp2_ieee(m[r] - m_use)
                    m[r] = m_new
                    lsum = ZERO
                    for x in (0, 1, 4, 5):
                        p = exp2_ieee(s[x + 2 * r] - m_use)
                        s[x + 2 * r] = p
                        lsum += p
                    l[r] = l[r] * alpha + lsum
                    for dt in range(DTILES):
                        acc[(dt * NR + r) * 2] *= alpha
                        acc[(dt * NR + r) * 2 + 1] *= alpha

                if CAUSAL and first_masked < min(hi, lo + (i + 1) * (WARPS * KT)):
                    # the step holds some of the last Nq - 1 keys, each hidden from some rows: a masked key adds
                    # nothing, even an Inf or NaN value, and a tensor core would multiply its P = 0 by it.  So these
                    # keys leave P V: each is added here, on CUDA cores, to the rows that see it (p = 0 or not, as
                    # IEEE arithmetic), and its V row is zeroed before the mma.  The condition holds for every warp
                    # of the step alike (the simulator's warp operations wait for the whole block).
                    vbuf = buf + uint32(V_OFF)
                    for jj in range(KT):
                        j = kb + jj
                        take = j >= first_masked and j < hi
                        src = (lane & uint32(28)) | uint32((jj & 7) >> 1)  # the quad's lane holding key jj's P
                        for r in range(NR):
                            p_lo = s[2 * r + 1] if jj & 1 else s[2 * r]  # keys kb + 2t, 2t + 1 ...
                            p_hi = s[5 + 2 * r] if jj & 1 else s[4 + 2 * r]  # ... and kb + 8 + 2t, 9 + 2t
                            p = cuda.shfl_sync(FULL, p_hi if jj >= 8 else p_lo, src)
                            if take and j <= lim[r]:
                                v_at = vbuf + uint32(jj) * DS_U + uint32(2) * t
                                for dt in range(DTILES):
                                    for e2 in range(2):
                                        acc[(dt * NR + r) * 2 + e2] += p * to_f32(sm[v_at + uint32(8 * dt + e2)])
                    cuda.syncwarp()  # every lane has read the rows ...
                    for u in range(CPL):  # ... which are zeroed for the mma
                        c = lane + uint32(32 * u)
                        kr = c // uint32(CR)
                        if kb + int64(kr) >= first_masked and kb + int64(kr) < hi:
                            zero_16(sm, vbuf + kr * DS_U + (c - kr * uint32(CR)) * uint32(8))
                    cuda.syncwarp()

                # O += P V: P in registers, rounded to the storage type (the accumulators are the A fragment)
                p0 = pack(s[0], s[1])
                p1 = pack(s[2], s[3]) if NR == 2 else ZERO_U
                p2 = pack(s[4], s[5])
                p3 = pack(s[6], s[7]) if NR == 2 else ZERO_U
                for dp in range(DTILES // 2):
                    b0, b1, b2, b3 = ldsm_t(sm, buf + v_off + uint32(16 * dp))
                    for h in range(2):
                        dt = 2 * dp + h
                        lo0 = (dt * NR) * 2
                        hi0 = (dt * NR + 1) * 2
                        c2 = acc[hi0] if NR == 2 else ZERO
                        c3 = acc[hi0 + 1] if NR == 2 else ZERO
                        bb0 = b0 if h == 0 else b2
                        bb1 = b1 if h == 0 else b3
                        d0, d1, d2, d3 = mma(p0, p1, p2, p3, bb0, bb1, acc[lo0], acc[lo0 + 1], c2, c3)
                        acc[lo0] = d0
                        acc[lo0 + 1] = d1
                        if NR == 2:
                            acc[hi0] = d2
                            acc[hi0 + 1] = d3
            lo = hi

        # merge the warps: M = max m_w, L = sum l_w 2^(m_w - M), O = sum O_w 2^(m_w - M)
        for r in range(NR):
            lt = l[r]
            lt += cuda.shfl_xor_sync(FULL, lt, 1)
            lt += cuda.shfl_xor_sync(FULL, lt, 2)
            l[r] = lt
        if t == 0:
            for r in range(NR):
                sh_m[warp * uint32(MR) + g + uint32(8 * r)] = m[r]
                sh_l[warp * uint32(MR) + g + uint32(8 * r)] = l[r]
        cuda.syncthreads()
        merge_states(sh_m, sh_l, sh_stat, tid)
        cuda.syncthreads()
        for wr in range(WARPS):  # warp by warp, in order: the same sums every run
            if warp == uint32(wr):
                for r in range(NR):
                    row = g + uint32(8 * r)
                    a = sh_m[warp * uint32(MR) + row]
                    for dt in range(DTILES):
                        for e2 in range(2):
                            at = row * D_U + uint32(8 * dt + e2) + uint32(2) * t
                            val = acc[(dt * NR + r) * 2 + e2] * a
                            sh_o[at] = val if wr == 0 else sh_o[at] + val
            cuda.syncthreads()
        e = uint32(tid)
        while int64(e) < nrows * int64(D):
            r = e // D_U
            c = e - r * D_U
            accv = sh_o[e]
            ll = sh_stat[MR + r]
            lse2 = sh_stat[r] + log2_or_minus_inf(ll)
            seen = split_sees_key(int64(sh_len[0]), sp, S, int64(uint32(r0 + int64(r)) % uint32(Nq)), int64(Nq),
                                  CAUSAL)
            nw += write_result(o, lse, uint64(grow0 + int64(r)), sp, rows, c, accv, ll, lse2, seen)
            e += uint32(NT)
        if FUSED:  # the group's last block merges its partials into o_out, lse_out
            tr, tw = tail(o, lse, o_out, lse_out, sem, y, grow0, nrows, rows, S, int64(sh_len[0]), int64(Nq), CAUSAL)
            nr += tr
            nw += tw
        if COUNT:
            add_counts(counter, nr, nw)

    return kernel
