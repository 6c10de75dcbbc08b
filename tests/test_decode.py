"""flash_decode (``flash_numba.attention_decode``): one decoding step over a KV cache, in the simulator.

Against the float64 reference (:func:`flash_numba.reference.decode_reference`): ragged lengths with a
length of 0, a paged cache with its pages shuffled and a page size that does not divide the lengths,
Nq = 1 and Nq = 3 causal (bottom-right among the new tokens, a row before the cache included),
grouped-query heads (G = 4, whose 12 rows at Nq = 3 take two row tiles on CUDA cores and one m16 tile on
tensor cores; G = 8, 24 rows, two tiles on either), float16, bfloat16 and float32, each split-kernel path
(the tensor-core kernel for float16 and bfloat16, the CUDA-core kernel for all three), one, two and three
splits (the same answer within rounding), the tensor-core kernel's pipeline (2, 3 and 4 stages, static and
dynamic shared memory, two table segments), poisoned outputs (conftest), counted bytes equal to the IO model
per launch and by term; every bad argument refused on the host, naming it.  NaN and Inf (docs/RELIABILITY.md,
section 2) on both paths, one split and several: a visible P of 0 meets an Inf in v; an Inf or NaN in v at a key
causal masking hides from some new tokens reaches only those that see it; a row whose visible scores are all
-inf is NaN, a split that sees only -inf scores of a row still hands its 0 * v to the combine, and a row that
sees no key stays 0 with lse = -inf.
"""

import numpy as np
import pytest

import flash_numba as fn
from conftest import FULL
from flash_numba import _switches, decode, device
from flash_numba.iomodel import flash_decode as model
from flash_numba.kernels import flash_decode as fd
from flash_numba.reference import decode_reference

from flash_numba.kernels._bf16 import from_bf16_bits

U = {np.float16: 2.0**-11, "bfloat16": 2.0**-8, np.float32: 2.0**-24}  # unit roundoff of the storage dtype


def tolerance(dtype, o_ref, q, k, v, L, d, scale, path="cuda"):
    """The error the arithmetic allows: o rounded once to the storage dtype (u_s |o|), and fp32 sums over d
    products for a score and over L keys for O and l, with a score error of (d + 8) u_32 |s| moving each
    weight by that much relatively (exp2's approximation included): (d + L + 8) u_32 (1 + max |s|) max |v|,
    four times over.  The tensor-core path rounds each weight P to the storage dtype before P V (as
    FlashAttention-2 does): a relative error of u_s per weight, and the weights sum to 1: u_s max |v| more."""
    u32 = 2.0**-24
    smax = scale * float(np.abs(q.astype(np.float64)).max()) * float(np.abs(k.astype(np.float64)).max()) * d
    vmax = float(np.abs(v.astype(np.float64)).max())
    p_rounding = U[dtype] * vmax if path == "tc" else 0.0
    return U[dtype] * np.abs(o_ref) + 4 * (d + L + 8) * u32 * (1 + smax) * vmax + p_rounding


def make(rng, B, Hq, Hkv, Nq, d, lengths, dtype, page_size=None):
    """q, k_cache, v_cache, cache_seqlens, block_table (None when unpaged): a paged cache's pages shuffled,
    its spare pages filled with NaN (read by nobody), each table row's unused entries -1."""
    q = rng.standard_normal((B, Hq, Nq, d)).astype(dtype)
    seqlens = np.array(lengths, dtype=np.int32)
    if page_size is None:
        Nmax = max(max(lengths), 1) + 3
        k, v = (rng.standard_normal((B, Hkv, Nmax, d)).astype(dtype) for _ in range(2))
        return q, k, v, seqlens, None
    used = [-(-L // page_size) for L in lengths]
    max_pages = max(max(used), 1) + 1
    num_pages = sum(used) + 2
    k, v = (np.full((num_pages, Hkv, page_size, d), np.nan, dtype=dtype) for _ in range(2))
    order = rng.permutation(num_pages)
    table = np.full((B, max_pages), -1, dtype=np.int32)
    n = 0
    for b, u in enumerate(used):
        for p in range(u):
            page = order[n]
            n += 1
            table[b, p] = page
            k[page] = rng.standard_normal((Hkv, page_size, d)).astype(dtype)
            v[page] = rng.standard_normal((Hkv, page_size, d)).astype(dtype)
    return q, k, v, seqlens, table


def as_words(dtype, *arrays):
    """bfloat16: the arrays rounded to bfloat16 words (:func:`flash_numba.as_bfloat16`); else as they are."""
    return [fn.as_bfloat16(x) if dtype == "bfloat16" else x for x in arrays]


def as_float(dtype, x):
    """An output (or input) as floats: bfloat16 words widened exactly."""
    return from_bf16_bits(x) if dtype == "bfloat16" else np.asarray(x)


def model_of(result, q, k, seqlens, table, causal, dtype_name=""):
    """The IO model of a call (the problem rebuilt from its arguments)."""
    B, Hq, Nq, d = q.shape
    Hkv, P = k.shape[1], k.shape[2]
    prob = decode.DecodeProblem(B, Hq, Hkv, Nq, d, q.dtype, table is not None, P,
                                1 if table is None else table.shape[1], k.shape[0], seqlens, causal, 1 / np.sqrt(d),
                                num_splits=result.num_splits, dtype_name=dtype_name)
    return fd.SPEC.io_model(prob)


CASES = [  # (Nq, causal, Hq, Hkv, lengths, page_size)
    (1, False, 4, 1, (13, 0, 6), None),  # G = 4: one block reads the KV head for four query heads
    (3, True, 8, 2, (13, 0, 2), None),  # G = 4, Nq = 3: 12 rows (CUDA cores: two row tiles; tensor cores: one m16
    #                                     tile, both halves); L = 2 < Nq: a row sees no key
    (1, False, 4, 2, (13, 0, 6), 5),  # paged, shuffled, P = 5 divides none of the lengths
    (3, True, 4, 1, (11, 0, 7), 4),
]
#: (dtype, path): the tensor-core path runs float16 and bfloat16; the CUDA-core path every dtype (forced with
#: ``_switches.DECODE_PATH`` where the tensor-core path would run)
DTYPE_PATHS = [(np.float16, "tc"), ("bfloat16", "tc"), (np.float16, "cuda"), ("bfloat16", "cuda"), (np.float32, "cuda")]
#: G = 8, Nq = 3: 24 rows, two row tiles on either path (one dtype a path: the simulator's time)
TWO_TILES = (3, True, 8, 1, (21, 0, 5), 3)
#: make test runs each case at one (dtype, path), in turn, and the first case at float32 too (every dtype and path
#: once); make test-all every pair
def _split_param(i, dp, case):
    keep = dp == DTYPE_PATHS[i % len(DTYPE_PATHS)] or (i == 0 and dp == DTYPE_PATHS[-1]) or case == TWO_TILES
    return pytest.param(*dp, *case, marks=() if keep else FULL)


SPLIT_PARAMS = [_split_param(i, dp, case) for i, case in enumerate(CASES) for dp in DTYPE_PATHS] + [
    _split_param(len(CASES), (np.float16, "tc"), TWO_TILES), _split_param(len(CASES), ("bfloat16", "cuda"), TWO_TILES)]


@pytest.mark.parametrize("dtype, path, Nq, causal, Hq, Hkv, lengths, page_size", SPLIT_PARAMS)
def test_matches_float64_reference_in_one_two_and_three_splits(monkeypatch, rng, dtype, path, Nq, causal, Hq, Hkv,
                                                               lengths, page_size):
    d = 16
    monkeypatch.setattr(_switches, "DECODE_PATH", path)
    q, k, v, seqlens, table = make(rng, 3, Hq, Hkv, Nq, d, lengths, np.float32 if dtype == "bfloat16" else dtype,
                                   page_size)
    q, k, v = as_words(dtype, q, k, v)  # bfloat16: words, and the reference reads their values
    o_ref, lse_ref = decode_reference(*(as_float(dtype, x) for x in (q, k, v)), seqlens, table, causal=causal)
    scale = 1 / np.sqrt(d)
    tol = tolerance(dtype, o_ref, as_float(dtype, q), np.nan_to_num(as_float(dtype, k)),
                    np.nan_to_num(as_float(dtype, v)), max(lengths), d, scale, path)
    row_tiles = -(-Hq // Hkv * Nq // (16 if path == "tc" else fd.rows_per_block(Hq // Hkv * Nq)))
    outs = []
    for S in (1, 2, 3):
        r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=S, causal=causal,
                                count_hbm=True)
        assert r.kernel == "flash_decode" and r.num_splits == S
        assert r.o.shape == q.shape and r.o.dtype == (np.uint16 if dtype == "bfloat16" else dtype)
        assert r.lse.shape == q.shape[:3] and r.lse.dtype == np.float32
        o = as_float(dtype, r.o).astype(np.float64)
        assert not np.isnan(o).any() and not np.isnan(r.lse).any()
        assert (np.abs(o - o_ref) <= tol).all(), S
        none = np.isneginf(lse_ref)  # rows that see no key: the sequence of length 0, causal rows before the cache
        assert none[:, :, :].any()
        assert (o[none] == 0).all() and np.isneginf(r.lse[none]).all()
        assert np.abs(r.lse[~none] - lse_ref[~none]).max() <= 4 * (d + max(lengths) + 8) * 2.0**-24 * (
            1 + np.abs(lse_ref[~none]).max()) * 8
        want = model_of(r, q, k, seqlens, table, causal, "bfloat16" if dtype == "bfloat16" else "")
        assert r.hbm == want, (S, r.hbm.table(), want.table())
        assert sum(r.hbm.terms.values()) == r.hbm.total
        itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
        assert r.hbm.terms["KV cache"] == model.kv_bytes(1, Hkv, sum(lengths), d, itemsize) * row_tiles
        assert (r.hbm.terms["page table"] > 0) == (page_size is not None)
        assert (r.hbm.terms["partials"] > 0) == (S > 1)
        outs.append(o)
    for o in outs[1:]:  # the splits change the order of the sums only
        assert (np.abs(o - outs[0]) <= 2 * tol).all()


FUSED_CASES = [  # (dtype, path, Nq, causal, Hq, Hkv, lengths, page_size, splits)
    (np.float16, "tc", 3, True, 8, 2, (13, 0, 2), 5, (2, 3)),  # 12 rows a group: 3 trips of the 4 warps' merge
    (np.float32, "cuda", 3, True, 8, 2, (13, 0, 2), None, (2, 3)),  # two row tiles (8 + 4 rows) a KV head
    pytest.param("bfloat16", "tc", 1, False, 4, 1, (45, 7), None, (40,), marks=FULL),  # 40 splits: two a lane
]


@pytest.mark.parametrize("dtype, path, Nq, causal, Hq, Hkv, lengths, page_size, splits", FUSED_CASES)
def test_the_combine_fused_into_the_split_kernel_gives_the_combine_kernels_bits(monkeypatch, rng, dtype, path, Nq,
                                                                               causal, Hq, Hkv, lengths, page_size,
                                                                               splits):
    """The last block of each group merges the partials (kernels.combine_tail): the same o and lse, bit
    for bit, as the combine kernel launched after the split kernel (the same sums in the same order), in one
    launch; its counted bytes equal the IO model's (the group counters' term included); the counters are zero
    again after the call (the next launch on the stream finds them so).  Empty splits (a length of 0, causal rows
    before the cache, 40 splits of 45 and 7 keys) included."""
    monkeypatch.setattr(_switches, "DECODE_PATH", path)
    q, k, v, seqlens, table = make(rng, len(lengths), Hq, Hkv, Nq, 16, lengths,
                                   np.float32 if dtype == "bfloat16" else dtype, page_size)
    q, k, v = as_words(dtype, q, k, v)
    o_ref, _ = decode_reference(*(as_float(dtype, x) for x in (q, k, v)), seqlens, table, causal=causal)
    tol = tolerance(dtype, o_ref, as_float(dtype, q), np.nan_to_num(as_float(dtype, k)),
                    np.nan_to_num(as_float(dtype, v)), max(lengths), 16, 0.25, path)
    for S in splits:
        got = {}
        for fused in (False, True):
            monkeypatch.setattr(_switches, "DECODE_FUSED", fused)
            r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=S, causal=causal,
                                    count_hbm=True)
            assert tuple(r.hbm.per_kernel) == fd.launches(S, fused)
            assert r.hbm == model_of(r, q, k, seqlens, table, causal, "bfloat16" if dtype == "bfloat16" else "")
            assert (r.hbm.terms["split counters"] > 0) == fused
            got[fused] = r
        assert np.array_equal(got[True].o, got[False].o) and np.array_equal(got[True].lse, got[False].lse), S
        o = as_float(dtype, got[True].o).astype(np.float64)
        assert (np.abs(o - o_ref) <= tol).all(), S
        assert not np.asarray(fd.semaphores(0)).any()


def test_many_pages_one_sequence_page_size_one(rng):
    """Page size 1 and 140 keys: the block stages the table 128 entries at a time (two batches)."""
    q, k, v, seqlens, table = make(rng, 1, 2, 1, 1, 8, (140,), np.float32, page_size=1)
    r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=1, count_hbm=True)
    o_ref, _ = decode_reference(q, k, v, seqlens, table)
    assert np.abs(r.o - o_ref).max() < 1e-5
    assert r.hbm == model_of(r, q, k, seqlens, table, False)
    assert r.hbm.terms["page table"] == 4 * 140


@pytest.mark.parametrize("stages, dynamic", [(2, False), (3, True), (4, False)])
def test_tensor_cores_pipeline_segments_and_stages(monkeypatch, rng, stages, dynamic):
    """The tensor-core kernel over 600 keys in pages of one row: two segments of the table (512 pages, then 88),
    ten tiles a warp, through 2, 3 and 4 pipeline stages (3: its tiles in dynamic shared memory); one and two
    splits, counted bytes equal to the model."""
    from flash_numba import _inputs
    from flash_numba.hbm import Counters

    if dynamic:
        monkeypatch.setattr(_switches, "DYNAMIC_ABOVE", 0)
    q, k, v, seqlens, table = make(rng, 1, 4, 1, 1, 16, (600,), np.float16, page_size=1)
    o_ref, lse_ref = decode_reference(q, k, v, seqlens, table)
    tol = tolerance(np.float16, o_ref, q, np.nan_to_num(k), np.nan_to_num(v), 600, 16, 0.25, "tc")
    for S in (1, 2):
        prob, ops = decode.prepare(q, k, v, seqlens, table, S, False, None, None)
        assert prob.path == "tc"
        prob.stages = stages
        counters = Counters(True)
        with _inputs.allocate_like(prob):
            o, lse = fd.SPEC.run(prob, ops, counters)
        o = np.asarray(_inputs.finish(prob, o, (1, 16))).astype(np.float64)
        lse = np.asarray(_inputs.finish(prob, lse, (1,)))
        assert (np.abs(o - o_ref) <= tol).all(), S
        assert np.abs(lse - lse_ref).max() < 1e-4
        assert counters.result() == fd.SPEC.io_model(prob)
        assert fd.SPEC.io_model(prob).terms["page table"] == 4 * 600 * 1


def test_default_lengths_and_splits_and_a_stream(rng):
    """No cache_seqlens: every sequence is the whole cache; num_splits=None takes the rule's choice."""
    from numba import cuda

    q, k, v, _, _ = make(rng, 2, 2, 2, 1, 8, (9, 9), np.float32)
    r = fn.attention_decode(q, k, v, stream=cuda.stream())
    o_ref, lse_ref = decode_reference(q, k, v)
    assert np.abs(r.o - o_ref).max() < 1e-5 and np.abs(r.lse - lse_ref).max() < 1e-5
    assert r.num_splits == fd.choose_splits(2, 2, 1, k.shape[2], None, device.info().sm_count)


def test_split_rule():
    """As many splits as fill one wave (4 blocks an SM on CUDA cores; the tensor-core kernel's by its shared
    memory), no split under 256 keys (or two pages), at most 128."""
    assert fd.choose_splits(8, 8, 1, 32768, None, 132) == 8  # 4 * 132 // 64: 512 blocks of a 528-block wave
    assert fd.choose_splits(8, 8, 1, 131072, None, 132) == 8
    assert fd.choose_splits(8, 8, 1, 4096, None, 132) == 8
    assert fd.choose_splits(8, 8, 1, 1024, None, 132) == 4  # 1024 / 256
    assert fd.choose_splits(8, 8, 1, 256, None, 132) == 1
    assert fd.choose_splits(8, 8, 1, 100, None, 132) == 1
    assert fd.choose_splits(8, 8, 2, 32768, None, 132) == 4  # two row tiles a KV head
    assert fd.choose_splits(64, 16, 1, 32768, None, 132) == 1  # 1,024 blocks: a wave without splitting
    assert fd.choose_splits(1, 1, 1, 10**6, None, 132) == fd.MAX_SPLITS
    assert fd.choose_splits(8, 8, 1, 4096, 1024, 132) == 2  # two pages a split
    # the tensor-core kernel at d = 128, float16, G = 4 on an H200 (228 KB of shared memory an SM): 2 stages,
    # 80 KB a block, two blocks an SM: 264 // 64 = 4 splits; 4 stages, one block: 2 splits
    assert fd.tc.resident_blocks(128, 2, 1, 228 * 1024) == 2 and fd.tc.resident_blocks(128, 4, 1, 228 * 1024) == 1
    assert fd.tc.resident_blocks(128, 2, 1, 228 * 1024, fused=True) == 2  # the merge's 4 KB keep two blocks an SM
    assert fd.choose_splits(8, 8, 1, 32768, None, 132, fd.tc.resident_blocks(128, 2, 1, 228 * 1024)) == 4


def test_large_scores_and_a_masked_infinite_value(rng):
    """Scores of 1e3 (the online rescale), and an Inf in a value only a masked (causal) row would read."""
    q, k, v, seqlens, _ = make(rng, 1, 1, 1, 2, 8, (7,), np.float32)
    q *= 30
    v[0, 0, 6] = np.inf  # key 6 is visible to new token 1 only
    r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, num_splits=2, causal=True)
    o_ref, _ = decode_reference(q, k, v, seqlens, causal=True)
    assert np.isfinite(r.o[0, 0, 0]).all()
    assert np.abs(r.o[0, 0, 0] - o_ref[0, 0, 0]).max() < 1e-3


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_visible_probability_of_zero_meets_inf(rng):
    """Causal, L = 9, two new tokens (token 0 sees keys 0..7, token 1 keys 0..8).  Key 3's score is -1e4 below the
    others (q[:, 0] = 1, k[:, 0] = 0 but k[3, 0] = -1e4 sqrt(d)): its P underflows to 0 (in float64 too), and
    against +Inf in v[3, 2] gives NaN in o[:, 2], as IEEE arithmetic and the reference do (docs/RELIABILITY.md,
    section 2).  At d = 128 (float32) the block's 4 lane groups take keys 4 apart: key 3 shares its group's
    online softmax with key 7, whose score is O(1), so its p is 0 in the group's P V too.  +Inf in v[8, 1],
    which token 0 does not see: its o stays finite there, token 1's is +Inf.  One split and two (the combine's
    weight 2^(lse2_s - LSE2) of 0 against a split's NaN or Inf is NaN too)."""
    d = 128
    q, k, v, seqlens, _ = make(rng, 1, 1, 1, 2, d, (9,), np.float32)
    q[..., 0], k[..., 0] = 1.0, 0.0
    k[0, 0, 3, 0] = -1e4 * np.sqrt(d)
    v[0, 0, 3, 2], v[0, 0, 8, 1] = np.inf, np.inf
    o_ref, lse_ref = decode_reference(q, k, v, seqlens, causal=True)
    assert np.isnan(o_ref[0, 0, :, 2]).all() and np.isfinite(o_ref[0, 0, 0, [0, 1, 3]]).all()  # the case is drawn
    assert np.isposinf(o_ref[0, 0, 1, 1])
    for splits in (1, 2):
        r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, num_splits=splits, causal=True)
        o = np.asarray(r.o, np.float64)
        assert np.array_equal(np.isnan(o), np.isnan(o_ref)) and np.array_equal(np.isinf(o), np.isinf(o_ref))
        fin = np.isfinite(o_ref)
        assert np.abs(o[fin] - o_ref[fin]).max() < 1e-5 and np.abs(r.lse - lse_ref).max() < 1e-3


def assert_like_reference(o, lse, o_ref, lse_ref, tol):
    """NaN, +Inf and -Inf exactly where the reference has them, in o and lse; the finite values within ``tol``
    (o) and 1e-2 (lse)."""
    for got, want in ((o, o_ref), (lse, lse_ref)):
        assert np.array_equal(np.isnan(got), np.isnan(want)), np.argwhere(np.isnan(got) != np.isnan(want))
        assert np.array_equal(np.isposinf(got), np.isposinf(want)) and np.array_equal(np.isneginf(got),
                                                                                       np.isneginf(want))
    fin = np.isfinite(o_ref)
    assert (np.abs(o[fin] - o_ref[fin]) <= np.broadcast_to(tol, o_ref.shape)[fin]).all()
    fin = np.isfinite(lse_ref)
    assert np.abs(lse[fin] - lse_ref[fin]).max(initial=0.0) < 1e-2


#: (dtype, path): both split kernels; float16 on each, bfloat16 on tensor cores, float32 on CUDA cores
NONFINITE_PATHS = [(np.float16, "tc"), ("bfloat16", "tc"), (np.float16, "cuda"), (np.float32, "cuda")]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype, path", NONFINITE_PATHS)
def test_a_masked_key_adds_nothing_on_either_path_even_an_inf_or_nan_value(monkeypatch, rng, dtype, path):
    """Causal, Nq = 3 new tokens, L = 17: token 0 sees keys 0..14, token 1 keys 0..15, token 2 all.  Keys 15 and 16
    (the last Nq - 1, in the tensor-core kernel's first and second tiles of 16) are each hidden from some tokens:
    +Inf in v[16, 1] and NaN in v[16, 3] reach token 2 only (+Inf, NaN); key 15's score is 1e4 below the others
    (P = 0 in float64 too) and +Inf in v[15, 2] gives NaN to tokens 1 and 2, which see it (a visible entry
    multiplies, 0 * Inf), and nothing to token 0, which does not.  The tensor cores would multiply token 0's
    P = 0 by key 15's Inf (and tokens 0 and 1's by key 16's): docs/RELIABILITY.md, section 2.  Two query heads of
    one KV head; one, two and three splits."""
    d = 16
    monkeypatch.setattr(_switches, "DECODE_PATH", path)
    q, k, v, seqlens, _ = make(rng, 1, 2, 1, 3, d, (17,), np.float32 if dtype == "bfloat16" else dtype)
    q[..., 0], k[..., 0] = 1.0, 0.0
    k[0, 0, 15, 0] = -1e4 * np.sqrt(d)
    v[0, 0, 16, 1], v[0, 0, 16, 3], v[0, 0, 15, 2] = np.inf, np.nan, np.inf
    q, k, v = as_words(dtype, q, k, v)
    o_ref, lse_ref = decode_reference(*(as_float(dtype, x) for x in (q, k, v)), seqlens, causal=True)
    assert np.isposinf(o_ref[0, :, 2, 1]).all() and np.isnan(o_ref[0, :, 2, 3]).all()  # the case is drawn
    assert np.isnan(o_ref[0, :, 1:, 2]).all() and np.isfinite(o_ref[0, :, 0]).all()
    assert np.isfinite(o_ref[0, :, 1, [0, 1, 3]]).all()
    kf, vf = (as_float(dtype, x) for x in (k, v))
    tol = tolerance(dtype, np.nan_to_num(o_ref), as_float(dtype, q), np.where(np.abs(kf) < 1e3, kf, 0),
                    np.where(np.isfinite(vf), vf, 0), 17, d, 1 / np.sqrt(d), path)  # key 15's P is 0: no error
    for S in (1, 2, 3):
        r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, num_splits=S, causal=True, count_hbm=True)
        assert_like_reference(as_float(dtype, r.o).astype(np.float64), r.lse, o_ref, lse_ref, tol)
        assert r.hbm == model_of(r, q, k, seqlens, None, True, "bfloat16" if dtype == "bfloat16" else ""), S


def test_one_new_token_runs_the_plain_build_causal_or_not(monkeypatch, rng):
    """At Nq = 1 the causal mask hides no key: causal=True runs the non-causal build (no diagonal code), bit for bit
    the same result and bytes, with an Inf in the last key's v (visible: +Inf in o)."""
    q, k, v, seqlens, _ = make(rng, 2, 4, 1, 1, 16, (17, 5), np.float16)
    v[0, 0, 16, 3] = np.inf
    built = []
    real = fd.split_tc_kernel
    monkeypatch.setattr(fd, "split_tc_kernel", lambda *a: built.append(a[5]) or real(*a))
    a, b = (fn.attention_decode(q, k, v, cache_seqlens=seqlens, num_splits=2, causal=c, count_hbm=True)
            for c in (True, False))
    assert built == [False, False]  # causal argument of both builds
    assert np.array_equal(a.o, b.o, equal_nan=True) and np.array_equal(a.lse, b.lse) and a.hbm == b.hbm
    assert np.isposinf(a.o[0, :, 0, 3]).all() and np.isfinite(np.delete(a.o, 3, axis=-1)).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype, path", NONFINITE_PATHS)
def test_rows_whose_visible_scores_are_all_minus_inf_are_nan_and_rows_that_see_no_key_stay_zero(
        monkeypatch, rng, dtype, path):
    """docs/RELIABILITY.md, section 2: a row whose visible scores are all -inf (an infinite q or k made them so)
    has no softmax: o = lse = NaN, as the reference; a row that sees no key (a length of 0, a causal row before
    the cache; the geometry) gets o = 0, lse = -inf, whatever its q.  Causal, Nq = 3, two query heads, lengths 17,
    0, 2.  Sequence 0: q[h = 0, token 1] has +Inf where every k is negative: its scores are all -inf (NaN row);
    keys 0..8 have k = -Inf where every other q is 1: their scores are -inf on every row, so with two or three
    splits the first split sees only -inf scores of every row, and +Inf in v[3, 2] meets their P = 0: NaN in
    column 2 of every row (the combine weighs that split by 0, and 0 * NaN stays NaN).  Sequence 2 (L = 2):
    token 0 sees no key, its q holds +Inf and NaN: o = 0, lse = -inf.  One, two and three splits; counted bytes
    equal to the IO model."""
    d = 16
    monkeypatch.setattr(_switches, "DECODE_PATH", path)
    q, k, v, seqlens, _ = make(rng, 3, 2, 1, 3, d, (17, 0, 2), np.float32 if dtype == "bfloat16" else dtype)
    k[:, :, :, 0] = -np.abs(k[:, :, :, 0]) - 0.5
    q[0, 0, 1, 0] = np.inf
    q[:, :, :, 1] = 1.0
    k[0, 0, :9, 1] = -np.inf
    v[0, 0, 3, 2] = np.inf
    q[2, :, 0, 2], q[2, :, 0, 3] = np.inf, np.nan
    q, k, v = as_words(dtype, q, k, v)
    o_ref, lse_ref = decode_reference(*(as_float(dtype, x) for x in (q, k, v)), seqlens, causal=True)
    assert np.isnan(o_ref[0, 0, 1]).all() and np.isnan(lse_ref[0, 0, 1])  # the case is drawn
    assert np.isnan(o_ref[0, :, :, 2]).all() and np.isfinite(np.delete(o_ref[0, 1], 2, axis=1)).all()
    assert (o_ref[1] == 0).all() and (o_ref[2, :, 0] == 0).all() and np.isneginf(lse_ref[2, :, 0]).all()
    qf, kf, vf = (np.where(np.isfinite(x), x, 0) for x in (as_float(dtype, y) for y in (q, k, v)))
    tol = tolerance(dtype, np.nan_to_num(o_ref), qf, kf, vf, 17, d, 1 / np.sqrt(d), path)
    for S in (1, 2, 3):
        r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, num_splits=S, causal=True, count_hbm=True)
        assert_like_reference(as_float(dtype, r.o).astype(np.float64), r.lse, o_ref, lse_ref, tol)
        assert r.hbm == model_of(r, q, k, seqlens, None, True, "bfloat16" if dtype == "bfloat16" else ""), S


def _args(rng, paged=True):
    q, k, v, seqlens, table = make(rng, 2, 4, 2, 1, 8, (6, 9), np.float32, page_size=4 if paged else None)
    return dict(q=q, k_cache=k, v_cache=v, cache_seqlens=seqlens, block_table=table)


def _edit(a, **changes):
    a = dict(a)
    a.update(changes)
    return a


BAD = [  # (name, edit of the paged arguments, error, words the message holds)
    ("seqlens dtype", lambda a: _edit(a, cache_seqlens=a["cache_seqlens"].astype(np.int64)), TypeError,
     "cache_seqlens: expected dtype int32"),
    ("seqlens shape", lambda a: _edit(a, cache_seqlens=a["cache_seqlens"][:1]), ValueError,
     "cache_seqlens: expected shape (2,)"),
    ("seqlens negative", lambda a: _edit(a, cache_seqlens=np.array([6, -1], np.int32)), ValueError,
     "cache_seqlens[1] = -1"),
    ("seqlens beyond pages", lambda a: _edit(a, cache_seqlens=np.array([6, 4 * a["block_table"].shape[1] + 1],
                                                                        np.int32)), ValueError,
     "pages of 4 rows in block_table"),
    ("table dtype", lambda a: _edit(a, block_table=a["block_table"].astype(np.int64)), TypeError,
     "block_table: expected dtype int32"),
    ("table shape", lambda a: _edit(a, block_table=a["block_table"][:1]), ValueError, "block_table: expected shape"),
    ("table 1-D", lambda a: _edit(a, block_table=a["block_table"][0]), ValueError, "block_table: expected shape"),
    ("page negative", lambda a: _edit(a, block_table=np.where(np.arange(a["block_table"].shape[1]) == 1, -3,
                                                              a["block_table"]).astype(np.int32)), ValueError,
     "block_table[0, 1] = -3"),
    ("page out of range", lambda a: _edit(a, block_table=np.where(np.arange(a["block_table"].shape[1]) == 2,
                                                                  a["k_cache"].shape[0], a["block_table"]
                                                                  ).astype(np.int32)), ValueError,
     "is not a page of the cache"),
    ("Hkv not dividing", lambda a: _edit(a, q=a["q"][:, :3]), ValueError, "do not divide q's 3 query heads"),
    ("head dim differs", lambda a: _edit(a, q=a["q"][..., :4].copy()), ValueError, "k_cache: head dim"),
    ("head dim unsupported", lambda a: _edit(a, q=a["q"][..., :4].copy(), k_cache=a["k_cache"][..., :4].copy(),
                                             v_cache=a["v_cache"][..., :4].copy()), ValueError,
     "8 to 128, a multiple of 8"),
    ("dtype float64", lambda a: {n: (x.astype(np.float64) if n in ("q", "k_cache", "v_cache") else x)
                                 for n, x in a.items()}, TypeError, "flash_decode runs float16, bfloat16 and float32"),
    ("uint16 words, not bfloat16", lambda a: _edit(a, q=a["q"].view(np.uint32).astype(np.uint16)), TypeError,
     "q: dtype uint16 is not supported"),
    ("bfloat16 and float32", lambda a: _edit(a, q=fn.as_bfloat16(a["q"])), TypeError,
     "k_cache: dtype float32 differs from q's bfloat16"),
    ("dtypes differ", lambda a: _edit(a, q=a["q"].astype(np.float16)), TypeError, "differs from q's"),
    ("v shape", lambda a: _edit(a, v_cache=a["v_cache"][:-1]), ValueError, "v_cache: shape"),
    ("Nq 17", lambda a: _edit(a, q=np.zeros((2, 4, 17, 8), np.float32)), ValueError, "Nq = 17"),
    ("q 3-D", lambda a: _edit(a, q=a["q"][0]), ValueError, "q: expected shape (B, Hq, Nq, d)"),
]


@pytest.mark.parametrize("name, edit, error, words", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_are_refused_on_the_host(rng, name, edit, error, words):
    with pytest.raises(error) as info:
        fn.attention_decode(**edit(_args(rng)))
    assert words in str(info.value), str(info.value)


def test_bad_arguments_unpaged_and_options(rng):
    a = _args(rng, paged=False)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 13 is outside 0 .. 12 \(the cache's 12 rows\)"):
        fn.attention_decode(**_edit(a, cache_seqlens=np.array([13, 1], np.int32)))
    with pytest.raises(ValueError, match="k_cache: batch 1 differs from q's 2"):
        fn.attention_decode(**_edit(a, k_cache=a["k_cache"][:1], v_cache=a["v_cache"][:1]))
    for bad, error, words in ((0, ValueError, "num_splits: 0 is out of range"),
                              (129, ValueError, "num_splits: 129"), (2.0, TypeError, "num_splits: expected")):
        with pytest.raises(error, match=words):
            fn.attention_decode(**a, num_splits=bad)
    with pytest.raises(TypeError, match="causal: expected True or False"):
        fn.attention_decode(**a, causal=1)
    with pytest.raises(TypeError, match="count_hbm: expected True or False"):
        fn.attention_decode(**a, count_hbm="yes")
    with pytest.raises(TypeError, match="stream: expected a Numba CUDA stream"):
        fn.attention_decode(**a, stream="s")
    with pytest.raises(ValueError, match="scale: must be finite"):
        fn.attention_decode(**a, scale=np.inf)
    big = np.zeros((65536, 1, 1, 8), np.float32)  # 65,536 sequences: one block row too many on axis y
    with pytest.raises(ValueError, match="over CUDA's limit of 65,535"):
        fn.attention_decode(big, np.zeros((65536, 1, 1, 8), np.float32), np.zeros((65536, 1, 1, 8), np.float32))


def test_the_spec_describes_the_kernel():
    spec = fn.kernels.get("flash_decode")
    assert spec is fd.SPEC and spec.pass_ == "decode"
    assert spec.supports(128, "float16") is None and spec.supports(64, "float32") is None
    assert spec.supports(12, "float16") == ("flash_decode runs float16, bfloat16 and float32 with head dims 8 to "
                                            "128, a multiple of 8")
    assert spec.launches(1) == (fd.SPLIT_ONE_NAME,) and spec.launches(4, False) == (fd.SPLIT_NAME, fd.COMBINE_NAME)
    assert spec.launches(4, True) == (fd.FUSED_NAME,) and spec.launches(1, True) == (fd.SPLIT_ONE_NAME,)
    assert spec.launches(4) == ((fd.FUSED_NAME,) if fd.FUSE_COMBINE else (fd.SPLIT_NAME, fd.COMBINE_NAME))
    prob = decode.DecodeProblem(1, 4, 1, 1, 16, np.dtype(np.float16), False, 32, 1, 1, np.array([32], np.int32),
                                False, 0.25, num_splits=2, fused=False)
    assert spec.flops(prob) == {fd.SPLIT_NAME: 4 * 16 * 32 * 4, fd.COMBINE_NAME: 2 * 16 * 2 * 4}
    prob.fused = True
    assert spec.flops(prob) == {fd.FUSED_NAME: 4 * 16 * 32 * 4 + 2 * 16 * 2 * 4}
    assert ((("float16",), (128,)) in spec.compile_groups)


# ---------------------------------------------------------------------------- real sizes (GPU only)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, "bfloat16", np.float32])
def test_gpu_ragged_paged_causal_at_real_sizes(rng, dtype):
    """d = 128, Hq = 32, Hkv = 8, Nq = 4 causal, lengths 5000, 1, 0, 3001 in pages of 256 (shuffled).
    (bfloat16 joined after the H200 run of 2026-12-01, which ran float16 and float32.)"""
    lengths, d = (5000, 1, 0, 3001), 128
    q, k, v, seqlens, table = make(rng, 4, 32, 8, 4, d, lengths, np.float32 if dtype == "bfloat16" else dtype,
                                   page_size=256)
    q, k, v = as_words(dtype, q, k, v)
    qf, kf, vf = (as_float(dtype, x) for x in (q, k, v))
    o_ref, lse_ref = decode_reference(qf, kf, vf, seqlens, table, causal=True)
    tol = tolerance(dtype, o_ref, qf, np.nan_to_num(kf), np.nan_to_num(vf), max(lengths), d, 1 / np.sqrt(d))
    for S in (1, 7, None):
        r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, block_table=table, causal=True, num_splits=S,
                                count_hbm=True)
        assert (np.abs(as_float(dtype, r.o).astype(np.float64) - o_ref) <= tol).all(), S
        assert np.array_equal(np.isneginf(r.lse), np.isneginf(lse_ref))
        assert r.hbm == model_of(r, q, k, seqlens, table, True, "bfloat16" if dtype == "bfloat16" else "")


@pytest.mark.gpu
def test_gpu_torch_tensors_side_stream_and_determinism(rng):
    """PyTorch tensors on a side stream (the launches follow torch's current stream), bitwise equal twice."""
    torch = pytest.importorskip("torch")
    q, k, v, seqlens, _ = make(rng, 8, 32, 8, 1, 128, (4096, 17, 0, 1000, 4096, 1, 2048, 333), np.float16)
    t = [torch.from_numpy(x).cuda() for x in (q, k, v, seqlens)]
    o_ref, _ = decode_reference(q, k, v, seqlens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the copies above ran on the default stream
    with torch.cuda.stream(side):
        a = fn.attention_decode(*t[:3], cache_seqlens=t[3])
        b = fn.attention_decode(*t[:3], cache_seqlens=t[3])
    side.synchronize()
    assert isinstance(a.o, torch.Tensor) and a.o.shape == q.shape
    assert torch.equal(a.o, b.o) and torch.equal(a.lse, b.lse)
    tol = tolerance(np.float16, o_ref, q, k, v, 4096, 128, 1 / np.sqrt(128))
    assert (np.abs(a.o.cpu().numpy().astype(np.float64) - o_ref) <= tol).all()


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
def test_gpu_a_launch_plan_replays_a_step_and_still_checks_the_lengths(monkeypatch, rng, paged):
    """PyTorch tensors: the first call records a launch plan, the next ones replay it (no Numba launch path) after
    the host checks.  A replay gives the normal path's bits; lengths changed in place (same shapes: the same plan)
    give the float64 answer of the new lengths; a length past the cache is still refused before any launch."""
    torch = pytest.importorskip("torch")
    from flash_numba import _launch_plan

    lengths = (700, 0, 513)
    q, k, v, seqlens, table = make(rng, 3, 8, 2, 1, 64, lengths, np.float16, page_size=64 if paged else None)
    t = [torch.from_numpy(x).cuda() for x in (q, k, v, seqlens)] + ([torch.from_numpy(table).cuda()] if paged else [])
    kw = dict(cache_seqlens=t[3], block_table=t[4] if paged else None)
    first = fn.attention_decode(*t[:3], **kw)
    prob, _ = decode.check(*t[:3], t[3], kw["block_table"], None, False, None, None)
    key = decode.plan_key(prob, tuple(t))
    assert isinstance(_launch_plan.lookup(key), _launch_plan.Plan)
    again = fn.attention_decode(*t[:3], **kw)  # replayed
    assert torch.equal(first.o, again.o) and torch.equal(first.lse, again.lse)
    t[3].copy_(torch.tensor([5, 0, 576], dtype=torch.int32))  # new lengths within the pages, same shapes and splits
    replayed = fn.attention_decode(*t[:3], **kw)
    monkeypatch.setattr(_launch_plan, "ENABLED", False)
    normal = fn.attention_decode(*t[:3], **kw)
    assert torch.equal(replayed.o, normal.o) and torch.equal(replayed.lse, normal.lse)
    o_ref, _ = decode_reference(q, k, v, np.array([5, 0, 576], np.int32), table)
    tol = tolerance(np.float16, o_ref, q, np.nan_to_num(k), np.nan_to_num(v), 700, 64, 1 / 8, "tc")
    assert (np.abs(replayed.o.cpu().numpy().astype(np.float64) - o_ref) <= tol).all()
    monkeypatch.setattr(_launch_plan, "ENABLED", True)
    t[3][0] = 10**6
    with pytest.raises(ValueError, match="cache_seqlens"):
        fn.attention_decode(*t[:3], **kw)


def test_the_decode_figure_plots_the_benchmark_rows(tmp_path):
    """fig_decode reads the benchmark's CSV (here a made-up one) and writes the PNG and the points it plots."""
    pytest.importorskip("matplotlib")
    from flash_numba.tools import bench_decode, csvfile
    from flash_numba.tools.figures import fig_decode

    rows = []
    for N in (4096, 8192):
        for name, ms, splits in (("flash_decode", 0.3, 17), ("flash_decode-s8", 0.2, 8), ("torch-flash", 0.1, ""),
                                 ("torch-math", 2.0, "")):
            rows.append({"implementation": name, "N": N, "ms": ms * N / 4096, "kv_gbps": 1e3 / ms, "status": "ok",
                         "num_splits": splits})
    src = csvfile.write_csv(tmp_path / "decode.csv", ["device: made up"], rows, bench_decode.FIELDS)
    png, data = fig_decode.make(src, tmp_path / "out", {"flash_decode": {4096: 8, 8192: 8}})
    assert png.stat().st_size > 0
    got = {(r["implementation"], int(r["N"])): r for r in csvfile.read_csv(data)}
    assert got[("flash_decode", 8192)]["row"] == "flash_decode-s8" and float(got[("flash_decode", 8192)]["ms"]) == 0.4
    assert ("torch-math", 4096) in got and ("flash_decode-s8", 4096) not in got


@pytest.mark.skipif(not device.SIMULATOR, reason="on a GPU the harness runs the whole decode benchmark "
                                                 "(benchmarks/decode_sweep.sh does)")
def test_the_harness_forwards_the_decode_pass(capsys):
    """``flash-numba bench --pass decode`` runs the decode benchmark (which needs a GPU: exit 2 in the simulator)."""
    from flash_numba.tools import bench, bench_decode

    assert bench.main(["--pass", "decode", "--n", "4096", "--repeats", "3"]) == 2
    assert "needs a GPU" in capsys.readouterr().err
    names = bench_decode.implementations((1, 8))
    assert names[0] == "flash_decode" and "flash_decode-s1" in names and "flash2_fast" in names
    assert {"torch-flash", "torch-efficient", "torch-math"} <= set(names)


def test_the_kv_cache_figure_counts_two_memory_stories(tmp_path):
    """128 KiB of cache a token for Llama-3-8B's attention; a step reads the cache and a little more; the
    prefill's S and P grow as N^2 (4x per doubling, up to the causal blocks' rounding)."""
    pytest.importorskip("matplotlib")
    from flash_numba.tools.figures import fig_kv_cache

    rows = fig_kv_cache.rows((1024, 2048, 131072))
    assert rows[-1]["kv_cache_bytes"] == 16 * 2**30 and rows[0]["kv_cache_bytes"] == 128 * 2**10 * 1024
    for r in rows:
        assert r["kv_cache_bytes"] < r["decode_step_bytes"] < 1.1 * r["kv_cache_bytes"]
        assert r["decode_step_S_P_bytes"] < r["kv_cache_bytes"]
    assert 3.8 < rows[1]["prefill_S_P_bytes"] / rows[0]["prefill_S_P_bytes"] < 4.0
    png, data = fig_kv_cache.make(tmp_path)
    assert png.stat().st_size > 0 and data.exists()


def test_numba_device_arrays_in_device_arrays_out(rng):
    """Numba device arrays (the metadata too) are read in place; o and lse stay on the device."""
    from numba import cuda

    q, k, v, seqlens, table = make(rng, 2, 4, 2, 1, 8, (7, 3), np.float32, page_size=4)
    r = fn.attention_decode(*(cuda.to_device(x) for x in (q, k, v)), cache_seqlens=cuda.to_device(seqlens),
                            block_table=cuda.to_device(table), num_splits=2)
    assert not isinstance(r.o, np.ndarray) and tuple(r.o.shape) == q.shape
    o_ref, lse_ref = decode_reference(q, k, v, seqlens, table)
    assert np.abs(r.o.copy_to_host() - o_ref).max() < 1e-5
    assert np.abs(r.lse.copy_to_host() - lse_ref).max() < 1e-5
