"""The two memory stories of one attention layer, in bytes: the KV cache a generation grows, and the S and P
that FlashAttention removes.

For a published configuration (Llama-3-8B's attention: 32 layers, 32 query heads, 8 KV heads, d = 128,
float16, one sequence) against the tokens in the context, N:

* **KV cache held**: ``2 * layers * Hkv * N * d * 2`` bytes, 128 KiB a token: 16 GiB at 128k.  It grows with
  every generated token, and every decoding step reads all of it again.
* **read by one decoding step** (flash_decode, every layer): the IO model of
  :mod:`flash_numba.iomodel.flash_decode` (the cache once, q, o, the lengths and the partials of the rule's
  splits on a 132-SM H200), which the counters equal (tests/test_decode.py asserts counted == model).
* **S and P of the prefill** (the standard kernels' forward over the N-token prompt, causal, every layer):
  :func:`flash_numba.iomodel.standard.sp_bytes`, the N x N matrices written and read back, Theta(N^2):
  what FlashAttention never stores.  FlashAttention removes this one; the KV cache it leaves as it is.
* **S and P of one decoding step** with the standard kernels: Theta(N), small beside the cache.

    python -m flash_numba.tools.figures.fig_kv_cache --out figures/out

Arithmetic from the IO models only: no GPU, no kernel runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .. import csvfile
from .common import pyplot

LAYERS, HQ, HKV, D = 32, 32, 8, 128
DTYPE = np.float16
SMS = 132
NS = tuple(2**k for k in range(10, 18))  # 1k .. 128k tokens
STANDARD_BLOCK = (64, 64)


def rows(Ns=NS) -> list[dict]:
    from ...decode import DecodeProblem
    from ...iomodel import flash_decode as decode_model
    from ...iomodel.standard import sp_bytes
    from ...kernels import flash_decode as fd

    out = []
    for N in Ns:
        kv = LAYERS * decode_model.kv_bytes(1, HKV, N, D, np.dtype(DTYPE).itemsize)
        splits = fd.choose_splits(1, HKV, 1, N, None, SMS)
        prob = DecodeProblem(1, HQ, HKV, 1, D, np.dtype(DTYPE), False, N, 1, 1, np.array([N], np.int32), False,
                             D**-0.5, num_splits=splits)
        step = LAYERS * decode_model.decode(prob).total
        prefill_sp = LAYERS * sp_bytes(HQ, N, N, D, DTYPE, True, STANDARD_BLOCK, "forward")
        step_sp = LAYERS * sp_bytes(HQ, 1, N, D, DTYPE, True, STANDARD_BLOCK, "forward")
        out.append({"N": N, "kv_cache_bytes": kv, "decode_step_bytes": step, "decode_splits": splits,
                    "prefill_S_P_bytes": prefill_sp, "decode_step_S_P_bytes": step_sp})
    return out


def make(out_dir) -> list[Path]:
    data = rows()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    Ns = [r["N"] for r in data]
    for key, label, style in (
        ("prefill_S_P_bytes", "S and P of the prefill (standard attention; FlashAttention: 0)", "tab:red"),
        ("kv_cache_bytes", "KV cache held (grows with every token)", "tab:blue"),
        ("decode_step_bytes", "read by one decoding step (flash_decode, IO model = counters)", "tab:cyan"),
        ("decode_step_S_P_bytes", "S and P of one decoding step (standard attention)", "tab:orange"),
    ):
        ax.plot(Ns, [r[key] / 2**30 for r in data], marker="o", ms=3, color=style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the context N")
    ax.set_ylabel("GiB (all 32 layers)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"Two memory stories: {LAYERS} layers, Hq = {HQ}, Hkv = {HKV}, d = {D}, float16, one sequence",
                 fontsize=9)
    fig.tight_layout()
    png = out / "fig_kv_cache.png"
    fig.savefig(png, dpi=130)
    plt.close(fig)
    notes = [f"Llama-3-8B attention: {LAYERS} layers, Hq = {HQ}, Hkv = {HKV}, d = {D}, float16, batch 1",
             "kv_cache_bytes = 2 layers Hkv N d 2; decode_step_bytes: iomodel.flash_decode (splits for 132 SMs); "
             f"S/P: iomodel.standard.sp_bytes, causal, block {STANDARD_BLOCK}"]
    data_path = csvfile.write_csv(out / "fig_kv_cache.csv", notes, data)
    return [png, data_path]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flash_numba.tools.figures.fig_kv_cache",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default="figures/out", help="folder for fig_kv_cache.png and fig_kv_cache.csv")
    args = p.parse_args(argv)
    for path in make(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
