"""Source of lessons/13_tensor_cores.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 13: Tensor cores
#
# FlashAttention's premise is that attention is memory-bound. The matrix products are fast, so the time goes
# into moving $S$ and $P$ through HBM. That premise holds only where the products really are fast: on
# *tensor cores*, the units that multiply small matrices in one instruction.
#
# Our kernels so far multiply on CUDA cores, one fused multiply-add (FFMA) per thread per instruction. This
# lesson moves the products onto tensor cores. You will:
#
# 1. compare the two ceilings on an H200;
# 2. see which lane of a warp holds which element of a tensor-core product;
# 3. write a 16 x 16 tile product with the `mma.sync` instruction yourself;
# 4. follow $P$ from the scores to $P V$ without leaving registers;
# 5. read what our standard attention does on tensor cores, measured launch by launch.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import numpy as np
from numba import cuda, float32  # noqa: F401  (float32: for your kernel)
from numba.types import float16

import flash_numba
from flash_numba import device, iomodel, reference
from flash_numba.course import lessonkit
from flash_numba.course import exercises as ex
from flash_numba.course import tensor_cores as tcx
from flash_numba.course.tensor_cores import mma_m16n8k16_f16, pack_f16x2  # noqa: F401  (for your kernel)

SIM = device.SIMULATOR
print(device.describe())

# %% [markdown]
# ## Two ceilings
#
# How fast can one SM multiply? We measured it on an H200 with small Numba kernels that issue one
# instruction over and over, with many independent chains in flight:

# %%
for r in tcx.ceilings():
    print(f"{r['instruction']:<44} {r['unit']:<12} {r['warps_per_sm']:>2} warps/SM  {float(r['tflops']):6.1f} TFLOP/s"
          f"   ({r['date']}, {r['source']})")

# %% [markdown]
# The float16 `mma.sync` reaches about 600 TFLOP/s, almost ten times the FFMA ceiling of 62.
#
# Put attention's forward against both. At $B \cdot H = 32$, $N = 4096$, $d = 64$ it does $4 N^2 d$ FLOPs a
# head. The fewest bytes it can move are $Q$, $K$, $V$ and $O$ once.

# %%
BH_, N_, d_ = 32, 4096, 64
flops = 4 * BH_ * N_**2 * d_
rates = {r["instruction"]: float(r["tflops"]) for r in tcx.ceilings() if r["warps_per_sm"] == "32"}
ffma, mma = rates["FFMA (float32 multiply-add)"], rates["mma.sync m16n8k16 float16"]
copy_gbps = 4166  # a device-to-device copy on the H200 (read + write), 2026-12-01
fewest = 4 * BH_ * N_ * d_ * 2  # Q, K, V, O in float16
standard_bytes = iomodel.forward("standard", BH_, N_, N_, d_, np.float16).total
print(f"FLOPs {flops / 1e9:.1f} G: {flops / ffma / 1e9:.2f} ms on CUDA cores, "
      f"{flops / mma / 1e9:.2f} ms on tensor cores")
print(f"fewest bytes {fewest / 1e9:.2f} GB: {fewest / copy_gbps / 1e6:.3f} ms at the copy rate")
print(f"standard attention's bytes {standard_bytes / 1e9:.2f} GB: {standard_bytes / copy_gbps / 1e6:.2f} ms")

# %% [markdown]
# On CUDA cores the products alone take 2.2 ms: more than standard attention's bytes. Saving bytes can only
# win a little there, which is what our float32 kernels showed (flash2_fast only 1.5x faster than standard).
# On tensor cores the products take a fifth of a millisecond, and the bytes of $S$ and $P$ dominate. That is
# the paper's setting. The recorded float16 times (H200, PyTorch 2.11, $N = 4096$, $B \cdot H = 32$):

# %%
for r in tcx.half_precision_peers():
    print(f"d = {r['d']:>3}  {r['implementation']:<16} forward {float(r['forward_ms']):6.3f} ms "
          f"({r['forward_tflops']:>3} TFLOP/s)  on {r['units']}")
print("(recorded on an NVIDIA H200, 2026-12-01; flash_numba/course/data/h200-2026-12-01-ceilings/)")

# %% [markdown]
# PyTorch's flash backend runs FlashAttention-2 on tensor cores: 7.5x faster than our flash2_fast on CUDA
# cores. The rest of this lesson is how to use the same instruction from Numba.

# %% [markdown]
# ## One instruction, one warp
#
# `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (PTX ISA section 9.7.14.5.8) computes
# $D = A B + C$ with $A$ 16 x 16, $B$ 16 x 8, and $C$, $D$ 16 x 8. It is a *warp* instruction. All 32
# lanes call it together, and each lane holds a few elements of each matrix in its registers:
#
# * four 32-bit registers `a0..a3` of $A$, each a pair of float16 values;
# * two registers `b0, b1` of $B$, also pairs;
# * four float32 registers `c0..c3` of $C$, and four of $D$ come back.
#
# Which lane holds which element is fixed by the hardware. With `g = lane >> 2` and `t = lane % 4`, lane
# `4g + t` holds row `g` (and `g + 8`) of $A$, columns `2t, 2t+1` (and `+8`). The picture:

# %%
lessonkit.show(tcx.fragment_figure())

# %% [markdown]
# Look at one lane. Lane 5 has `g = 1`, `t = 1`:

# %%
lane = 5
for name, rows, cols in (("A", 16, 16), ("B", 16, 8), ("C", 16, 8)):
    held = [(r, c, *tcx.fragment_of(name, r, c)[1:]) for r in range(rows) for c in range(cols)
            if tcx.fragment_of(name, r, c)[0] == lane]
    print(f"lane {lane}, {name}: " + ", ".join(f"{reg}{'.' + half if half else ''}={name}[{r}][{c}]"
                                              for r, c, reg, half in held))
lessonkit.show(tcx.fragment_figure(lanes={lane}))

# %% [markdown]
# Three things to notice:
#
# * $A$ is `.row`: a register holds two neighbours *along a row*, `A[g][2t]` and `A[g][2t+1]`.
# * $B$ is `.col`: a register holds two neighbours *down a column*, `B[2t][g]` and `B[2t+1][g]`.
# * The lower 16 bits of a register hold the element with the lower index. `pack_f16x2(lo, hi)` builds one.

# %% [markdown]
# ## Your turn: a tile product on the tensor core
#
# Write a kernel that computes `C = A @ B` for 16 x 16 tiles: `A`, `B` float16, `C` float32. It runs as one
# block of one warp, `tile_product[1, 32](A, B, C)`. $C$ is 16 wide, so it takes two instructions: one for
# $C$'s columns 0..7 (B's columns 0..7), one for columns 8..15.
#
# * Load $A$ and $B$ into shared memory first: 32 lanes, 8 elements each, every element read from HBM once.
#   A barrier before any lane reads a tile.
# * Build each lane's registers from shared memory with `pack_f16x2(float32(lo), float32(hi))`.
# * Call `mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)` with zero accumulators.
# * Write the four results of each product where the C map of the picture says.
#
# The checker runs three cases. The first uses coded inputs: $A[i][k] = 1 + 16i + k$ and
# $B[k][n] = 512 + 16k + n$. In the simulator it reads the registers every lane hands to the instruction,
# so it can say which element went into the wrong register. `tcx.hints("mma_tile")` helps, one at a time.

# %%
@cuda.jit
def tile_product(A, B, C):
    """C (16, 16) float32 = A (16, 16) float16 @ B (16, 16) float16; launched as tile_product[1, 32]."""
    As = cuda.shared.array(256, float16)  # noqa: F841  (A row-major: As[16 * row + k])
    Bs = cuda.shared.array(256, float16)  # noqa: F841  (B row-major: Bs[16 * k + n])
    lane = cuda.threadIdx.x  # noqa: F841
    # Your turn: the loads, a barrier, the registers of A and B, two mma calls, the writes of C
    raise NotImplementedError("the 16 x 16 tile product on mma_m16n8k16_f16")


# %%
mine = ex.check("mma_tile", tile_product)
assert ex.check_solution("mma_tile")
# tcx.hints("mma_tile", upto=1)  # uncomment for a hint; upto=2 for two, and so on

# %%
product = tile_product if mine else ex.solution_fn("mma_tile")
print("below:", "your kernel" if mine else "the packaged solution (yours is not done yet)")
rng = np.random.default_rng(13)
A = rng.standard_normal((16, 16)).astype(np.float16)
B = rng.standard_normal((16, 16)).astype(np.float16)
C = np.full((16, 16), np.nan, dtype=np.float32)
dC = cuda.to_device(C)
product[1, 32](cuda.to_device(A), cuda.to_device(B), dC)
C = dC.copy_to_host()
exact = A.astype(np.float64) @ B.astype(np.float64)
tile_err = float(np.abs(C - exact).max())
print(f"max |C - A B| = {tile_err:.1e} (the products of float16 numbers are exact; one float32 rounding of the sum)")

# %% [markdown]
# Sixteen multiply-adds per output element, 4,096 in all, in two instructions per lane.

# %% [markdown]
# ## P stays in registers
#
# In FlashAttention-2 on tensor cores a warp owns 16 query rows. For a block of 16 keys it computes
# $S = Q K^T$ with two instructions, one per 8 keys. $Q$ is the $A$ operand. $K$ is stored row by row, one
# key a row, and that is exactly $K^T$ in the `.col` layout $B$ asks for: no transpose.
#
# Then the online softmax turns the accumulators of $S$ into $P$. The next product is $P V$, and there $P$
# is the $A$ operand. Compare the C map (two 16 x 8 tiles side by side) with the A map (16 x 16): lane
# `4g + t` holds `S[g][2t], S[g][2t+1]` and `S[g+8][2t], S[g+8][2t+1]` in each tile. Those are exactly the
# elements of $P$ its A registers need. So $P$ goes from one product to the next without touching shared
# memory: round to float16, pack, multiply.

# %% [markdown]
# ## Your turn: the accumulators as A registers
#
# Write the rearrangement for one lane. `s_lo` is its `(c0, c1, c2, c3)` for keys 0..7, `s_hi` the same for
# keys 8..15. Return `(a0, a1, a2, a3)`, each a pair `(lo, hi)` of floats. The checker runs all 32 lanes
# and packs your pairs into $P$'s fragment.

# %%
def p_in_registers(s_lo, s_hi):
    """One lane's A registers of P, as (lo, hi) pairs, from its accumulators of S for keys 0..7 and 8..15."""
    # Your turn
    raise NotImplementedError("a0 = (?, ?), a1 = ..., a2 = ..., a3 = ...")


# %%
mine_p = ex.check("p_in_registers", p_in_registers)
assert ex.check_solution("p_in_registers")
# tcx.hints("p_in_registers", upto=1)  # uncomment for a hint

# %% [markdown]
# This is what `flash2_tc` does (`flash_numba/kernels/flash2_tc/forward.py`): $Q$ in registers as A
# fragments, $S$ on `mma`, the row max and sum over the four lanes of a quad with warp shuffles, $P$
# rounded to float16 and used straight away as the A operand of $P V$. It runs in the simulator, where the
# stand-ins of `flash_numba.kernels._mma` follow the same fragment maps:

# %%
Hq, Ntc, dtc = (2, 33, 16) if SIM else (4, 1024, 64)
q, k, v = (rng.standard_normal((Hq, Ntc, dtc)).astype(np.float16) for _ in range(3))
res = flash_numba.attention_forward(q, k, v, kernel="flash2_tc", count_hbm=True)
o64, _ = reference.attention_forward(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
s16 = (q.astype(np.float32) @ k.astype(np.float32).transpose(0, 2, 1) / np.sqrt(dtc)).astype(np.float16)
p16 = np.exp(s16.astype(np.float32) - s16.max(-1, keepdims=True)).astype(np.float16)  # plain float16 attention
plain = ((p16.astype(np.float32) @ v.astype(np.float32)) / p16.astype(np.float32).sum(-1, keepdims=True))
err_tc = float(np.abs(res.o.astype(np.float64) - o64).max())
err_plain = float(np.abs(plain.astype(np.float16).astype(np.float64) - o64).max())
print(f"kernel that ran: {res.kernel}; max |O - O64| = {err_tc:.1e}, plain float16 attention {err_plain:.1e}")
tc_model = iomodel.forward("flash2_tc", Hq, Ntc, Ntc, dtc, np.float16)
print(f"counted HBM bytes {res.hbm.total:,}, IO model {tc_model.total:,}")
if not SIM:  # B*H = 32, N = 4096, d = 64 on this GPU, inputs already on the device
    qd, kd, vd = (cuda.to_device(rng.standard_normal((32, 4096, 64)).astype(np.float16)) for _ in range(3))
    for name in ("flash2_tc", "flash2_fast", "standard"):
        ms = float(np.median(device.time_ms(lambda: flash_numba.attention_forward(qd, kd, vd, kernel=name))))
        print(f"{name:<12} {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s on this GPU")

# %% [markdown]
# ## Standard attention on tensor cores, launch by launch
#
# In float16 our standard attention also runs its two products on `mma.sync`. Only the softmax stays an
# elementwise pass. Its three launches were timed one by one on the H200.
#
# **Predict, then run.** At $N = 4096$, $d = 64$, what share of the forward's time is the softmax launch
# (percent)?

# %%
my_prediction = None  # the softmax's share, in percent

# %%
shares = {(N, d): tcx.standard_launch_shares(N, d) for N in (1024, 4096, 16384) for d in (64, 128)}
print(tcx.SHARES_SOURCE)
print(f"(that run's device-to-device copy: {float(shares[(4096, 64)][0]['copy_GBps']):,.0f} GB/s)")
for r in shares[(4096, 64)]:
    fl = 2 * 32 * 4096**2 * 64 if "@" in r["launch"] else 0
    print(f"{r['launch']:<18} {float(r['ms']):6.3f} ms ({float(r['share']):4.0%})   "
          f"bytes {int(r['model_bytes']) / 1e9:.2f} GB -> at that run's copy rate {float(r['bound_ms']):.3f} ms;  "
          f"FLOPs at {mma:.0f} TFLOP/s {fl / mma / 1e9:.3f} ms")
softmax_share = 100 * float(next(r["share"] for r in shares[(4096, 64)] if "softmax" in r["launch"]))
lessonkit.compare_prediction("the softmax's share (%)", my_prediction, round(softmax_share))
lessonkit.show(tcx.shares_figure({f"N = {N}, d = {d}": rows for (N, d), rows in shares.items()}))

# %% [markdown]
# The softmax takes only a fifth of the time, less than the paper's Figure 1 suggests. The reason is in the
# bytes column. Each of the three launches moves about the same 2.15 GB: the first writes $S$, the softmax
# reads $S$ and writes $P$, the last reads $P$. On tensor cores the FLOPs of a product take 0.1 ms; each
# product launch still takes more than 1 ms. So every launch is paying for $S$ and $P$ in HBM, not for
# arithmetic. The products are the larger share only because they move those bytes less efficiently. With
# every load of a tile issued before its stores (commit 6992544; `benchmarks/results/h200-2026-12-01-harness/`,
# H200, c6f8000) the forward at $N = 4096$, $d = 64$ took 2.070 ms, 1.07x its byte bound, the softmax 28% of it.

# %% [markdown]
# ## Flash against standard, both on tensor cores
#
# A fused kernel removes all three trips. Here is flash2_tc on the H200, beside PyTorch's two fused
# backends and our two other kernels, float16, $d = 64$, $N = 4096$, $B \cdot H = 32$:

# %%
print(tcx.TC_SOURCE)
fwd = tcx.forward_times(d=64, dtype="float16", causal=False)
standard_tc = sum(float(r["ms"]) for r in shares[(4096, 64)])  # its three launches, the run above
fwd["standard (tensor cores, three launches)"] = (standard_tc, flops / standard_tc / 1e9)
for r in tcx.half_precision_peers():
    if r["implementation"] == "flash2_fast" and r["d"] == "64":
        fwd["flash2_fast (CUDA cores)"] = (float(r["forward_ms"]), float(r["forward_tflops"]))
for name, (ms, tf) in sorted(fwd.items(), key=lambda kv: kv[1][0]):
    print(f"{name:<40} {ms:6.3f} ms  {tf:5.0f} TFLOP/s")
flash_speedup = standard_tc / fwd["flash2_tc (sm80 path)"][0]
print(f"flash2_tc against our standard on the same tensor cores: {flash_speedup:.1f}x")
run2 = tcx.forward_times(d=64, dtype="float16", causal=False, path=tcx.TC_FORWARD_RUN2_CSV)
print(f"a second run ({tcx.TC_RUN2_SOURCE}): flash2_tc {run2['flash2_tc (sm80 path)'][0]:.3f} ms, "
      f"torch-flash {run2['torch-flash'][0]:.3f} ms: {standard_tc / run2['flash2_tc (sm80 path)'][0]:.1f}x")

# %% [markdown]
# Same instruction for the products, same GPU: flash2_tc is 4.3 to 4.5 times faster than standard attention
# (two runs), because $S$ and $P$ never reach HBM. That is the paper's 2-4x, and more. It reaches 72-77% of
# PyTorch's flash backend. On CUDA cores the same algorithm, flash2_fast, was only 1.5 times faster than
# standard in float32.
# The sm75 row is flash2_tc on the T4's smaller `m16n8k8` instruction, forced on the H200.

# %% [markdown]
# ## What to take away
#
# * On tensor cores the products are about ten times faster than on CUDA cores, so attention's time is its
#   bytes: this is where FlashAttention's premise holds.
# * `mma.sync` is a warp instruction: each lane holds fixed pieces of $A$, $B$ and $C$, given by
#   `g = lane >> 2` and `t = lane % 4`; $A$ pairs run along rows, $B$ pairs down columns.
# * The accumulator layout of two 16 x 8 products equals the A layout of a 16 x 16 operand, so $P$ goes
#   from $S$ to $P V$ in registers.
# * Standard attention on tensor cores spends its time moving $S$ and $P$. flash2_tc never writes them and
#   is over 4 times faster on the same instruction.

# %% [markdown]
# ## Check

# %%
abs_sum = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))  # sum |a b| of each output element
assert tile_err <= 16 * np.finfo(np.float32).eps * float(abs_sum.max())
assert res.kernel == "flash2_tc", res.kernel
assert err_tc <= 2 * err_plain, (err_tc, err_plain)  # Dao-AILab's rule
assert res.hbm == tc_model
assert 10 < softmax_share < 25, softmax_share
assert mma / ffma > 9
assert 4 < flash_speedup < 5, flash_speedup
print("lesson 13: all checks passed")
