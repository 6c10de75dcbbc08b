"""flash_decode under compute-sanitizer: hostile metadata refused on the host, valid ragged paged calls clean.

    compute-sanitizer --tool memcheck python benchmarks/decode_sanitize.py
    compute-sanitizer --tool racecheck python benchmarks/decode_sanitize.py --small

Each hostile table or length must raise (ValueError / TypeError) before any launch; then valid calls run:
a ragged paged cache in shuffled pages of 16 (lengths 300, 0, 1, 77), causal Nq = 3, GQA G = 4, with 1
and 5 splits, and an unpaged one, on the default path (the tensor-core kernel on sm_80+) and the CUDA-core one.
Prints one line per case and "sanitize cases done".
"""

import sys

import numpy as np

import flash_numba as fn
from flash_numba import _switches

rng = np.random.default_rng(7)
small = "--small" in sys.argv
P, lengths, d = 16, ((40, 0, 1, 17) if small else (300, 0, 1, 77)), 64
B, Hq, Hkv, Nq = 4, 8, 2, 3
per = [-(-L // P) for L in lengths]
num_pages = sum(per) + 1
q = rng.standard_normal((B, Hq, Nq, d)).astype(np.float16)
k = rng.standard_normal((num_pages, Hkv, P, d)).astype(np.float16)
v = rng.standard_normal((num_pages, Hkv, P, d)).astype(np.float16)
table = np.zeros((B, max(per)), np.int32)
order = rng.permutation(num_pages)
n = 0
for b, u in enumerate(per):
    table[b, :u] = order[n:n + u]
    n += u
seqlens = np.array(lengths, np.int32)

hostile = {
    "page index past the cache": (seqlens, np.where(table == table[0, 1], num_pages + 1000, table).astype(np.int32)),
    "negative page index": (seqlens, np.where(table == table[0, 0], -1, table).astype(np.int32)),
    "huge page index": (seqlens, np.where(table == table[3, 0], 2**31 - 1, table).astype(np.int32)),
    "length past the pages": (np.array([lengths[0] + P * 50, 0, 1, 17], np.int32), table),
    "negative length": (np.array([-5, 0, 1, 17], np.int32), table),
    "int64 table": (seqlens, table.astype(np.int64)),
    "short table": (seqlens, table[:2]),
}
for name, (sl, tb) in hostile.items():
    try:
        fn.attention_decode(q, k, v, cache_seqlens=sl, block_table=tb, causal=True, num_splits=3)
    except (ValueError, TypeError) as exc:
        print(f"refused on the host: {name}: {exc}")
    else:
        print(f"NOT REFUSED: {name}")
        sys.exit(1)

kc = rng.standard_normal((B, Hkv, 310, d)).astype(np.float16)
for path in (None, "cuda"):  # the default (tensor cores on sm_80+: cp.async, ldmatrix, mma) and the CUDA-core kernel
    _switches.DECODE_PATH = path
    for S in (1, 5):
        r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, block_table=table, causal=True, num_splits=S)
        print(f"path {path or 'default'}: paged causal num_splits={S}: finite {bool(np.isfinite(r.o).all())}")
    r = fn.attention_decode(q[:, :, :1], kc, kc, cache_seqlens=seqlens, num_splits=None)
    print(f"path {path or 'default'}: unpaged num_splits={r.num_splits}: finite {bool(np.isfinite(r.o).all())}")
_switches.DECODE_PATH = None
print("sanitize cases done")
