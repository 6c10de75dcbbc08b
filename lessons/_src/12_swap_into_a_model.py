"""Source of lessons/12_swap_into_a_model.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402
# requires: torch, flash_numba.torch, flash_numba.examples.gpt

# %% [markdown]
# # Lesson 12: Swap it into a model
#
# A kernel is finished when a model trains on it. Models do not call `flash_attention_forward` and
# `flash_attention_backward`: they call PyTorch's `torch.nn.functional.scaled_dot_product_attention`
# (SDPA) and let autograd find the backward. `flash_numba.torch` offers the same function, with SDPA's
# arguments and meaning, running our kernels:
#
# ```python
# from flash_numba.torch import scaled_dot_product_attention
# y = scaled_dot_product_attention(q, k, v, is_causal=True)   # q, k, v: (B, H, N, d) tensors
# y.sum().backward()                                           # dq, dk, dv from our backward kernels
# ```
#
# Inside is a `torch.autograd.Function`. Its forward runs our forward kernel and saves, for the backward,
# the inputs, the output $O$ and the log-sum-exp $L$ (one number per query row): exactly what the
# paper's Algorithm 4 reads. Its backward hands them to our backward kernel, which recomputes $P$ block by
# block. This lesson checks the swap against SDPA, looks at what autograd keeps, meets the two meanings
# of "causal", and trains a small GPT on our attention.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import flash_numba.torch as fnt
from flash_numba import device
from flash_numba.course import lessonkit, pictures, recorded
from flash_numba.course import exercises as ex
from flash_numba.examples import gpt

SIM = device.SIMULATOR
print(device.describe())
DEV = "cpu" if SIM or not torch.cuda.is_available() else "cuda"
# the simulator runs each CUDA thread as Python code: flash1 is its cheapest kernel; on a GPU, the default
KERNEL = "flash1" if SIM else None
print(f"PyTorch {torch.__version__}, tensors on {DEV}, kernel {KERNEL or fnt.DEFAULT_KERNEL}")

# %% [markdown]
# ## The swap, checked against SDPA
#
# Same inputs, same output gradient, once through PyTorch's SDPA and once through ours. In the simulator
# the tensors live on the CPU and are tiny; on a GPU they are CUDA tensors of a real size, which our
# kernels read in place. The errors are measured against SDPA run in float64.

# %%
B, H, N, d = (1, 2, 8, 4) if SIM else (4, 8, 1024, 64)
gen = torch.Generator().manual_seed(12)
q, k, v, do = (torch.randn(B, H, N, d, generator=gen, dtype=torch.float64) for _ in range(4))
q, k, v = (x.to(DEV).float().requires_grad_() for x in (q, k, v))
do = do.to(DEV).float()


def output_and_grads(attend, q, k, v):
    o = attend(q, k, v, is_causal=True)
    return (o, *torch.autograd.grad(o, (q, k, v), do.to(o.dtype)))


ours = output_and_grads(lambda *a, **kw: fnt.scaled_dot_product_attention(*a, **kw, kernel=KERNEL), q, k, v)
theirs = output_and_grads(F.scaled_dot_product_attention, q, k, v)
exact = output_and_grads(F.scaled_dot_product_attention, *(x.detach().double().requires_grad_() for x in (q, k, v)))
swap_err = {}
for name, a, b, e in zip(("O", "dQ", "dK", "dV"), ours, theirs, exact):
    # float32 sums of up to N + d terms: each result is within a few (N + d) float32 ulps of its largest terms
    bound = 8 * 2.0**-24 * (q.shape[-2] + q.shape[-1]) * e.abs().max().item()
    swap_err[name] = ((a.double() - e).abs().max().item(), (b.double() - e).abs().max().item(), bound)
    print(f"{name}: max |ours - exact| = {swap_err[name][0]:.1e}   max |SDPA - exact| = {swap_err[name][1]:.1e}"
          f"   (float32 bound {bound:.1e})")

# %% [markdown]
# Both float32 implementations sit at float32 rounding from the float64 result, ours no further than
# SDPA's own. (Which SDPA backend ran on a GPU: lesson 10.)

# %% [markdown]
# ## What autograd keeps
#
# The graph node of our function holds five tensors until the backward runs. SDPA's math backend keeps
# $P$, an $N \times N$ matrix per head, instead of $L$ (our `standard` kernels recompute $P$ from $L$).
#
# **Predict, then run.** How many bytes does our function keep for the backward of this call ($Q$, $K$,
# $V$, $O$ and $L$, float32, at this lesson's $B$, $H$, $N$, $d$)?

# %%
my_prediction = None  # bytes saved for the backward

# %%
o = fnt.scaled_dot_product_attention(q, k, v, is_causal=True, kernel=KERNEL)  # a fresh graph (grad() freed the first)
node = o.grad_fn
while type(node).__name__ != "FlashAttentionFunctionBackward":  # past the reshapes around it
    node = node.next_functions[0][0]
saved = {name: tuple(t.shape) for name, t in zip(("Q", "K", "V", "O", "L"), node.saved_tensors)}
print("saved for the backward:", saved)
saved_bytes = sum(t.numel() * t.element_size() for t in node.saved_tensors)
P_bytes = B * H * N * N * 4
print(f"{saved_bytes:,} bytes saved; P in float32 would add {P_bytes:,} bytes")
lessonkit.compare_prediction("bytes saved for the backward", my_prediction, saved_bytes)
print(f"per layer of a model at N = 8192 (B = 1, H = 32): P = {32 * 8192**2 * 4 / 2**30:.0f} GiB, "
      f"L = {32 * 8192 * 4 / 2**20:.0f} MiB")
lessonkit.show(pictures.saved_for_backward(H=32, d=128))

# %% [markdown]
# ## Two meanings of "causal"
#
# With as many queries as keys ($N_q = N_k$) there is one causal mask. When they differ, two conventions
# exist. SDPA's `is_causal=True` is **top-left** aligned: query $i$ sees keys $j \le i$. Our kernels, like
# FlashAttention from version 2.1 on, are **bottom-right** aligned: query $i$ sees keys
# $j \le i + N_k - N_q$, so the *last* query sees every key, which is what decoding with a KV cache needs
# (lesson 8). `flash_numba.torch` keeps SDPA's meaning for `is_causal` and computes it exactly with our
# kernels (for $N_q < N_k$ no query sees past key $N_q - 1$: causal attention on the first $N_q$ keys;
# for $N_q > N_k$ the rows from $N_k$ on see every key: a second, non-causal call). Our own mask is
# PyTorch's `causal_lower_right(N_q, N_k)`:

# %%
Nq_, Nk_ = 3, 5
i, j = np.arange(Nq_)[:, None], np.arange(Nk_)[None, :]
print("top-left (is_causal=True):\n", (j <= i).astype(int))
print("bottom-right (causal_lower_right, our kernels):\n", (j <= i + Nk_ - Nq_).astype(int))
qs, ks, vs = (torch.randn(1, n, 4, generator=gen, dtype=torch.float64) for n in (Nq_, Nk_, Nk_))
causal_err = {}
for label, kw in (("top-left", {"is_causal": True}), ("bottom-right", {"attn_mask": causal_lower_right(Nq_, Nk_)})):
    a = fnt.scaled_dot_product_attention(qs, ks, vs, **kw, kernel="flash1")
    causal_err[label] = (a - F.scaled_dot_product_attention(qs, ks, vs, **kw)).abs().max().item()
    print(f"{label}: max |ours - SDPA| = {causal_err[label]:.1e} (float64)")

# %% [markdown]
# ## Your turn: split the heads
#
# A model projects its input $x$ of shape (B, N, C) once, to (B, N, 3C): the channels are $[q \mid k
# \mid v]$, each cut into H heads of $d = C/H$ channels. Attention wants (B, H, N, d). Write
# `split_heads(qkv, n_head)` in NumPy returning `(q, k, v)`.

# %%
def split_heads(qkv, n_head):
    """(B, N, 3C) -> q, k, v, each (B, H, N, d) with d = C / n_head."""
    # Your turn
    raise NotImplementedError("reshape to (B, N, 3, H, d), then move the axes")


# %%
mine = ex.check("split_heads", split_heads)
assert ex.check_solution("split_heads")
split = split_heads if mine else ex.solution_fn("split_heads")

# %% [markdown]
# In PyTorch the same two steps are a `view` and a `permute`: no data moves, and q, k and v are *views*
# of the projection with strides that are not those of a (B, H, N, d) array. SDPA accepts any strides.
# Our kernels read contiguous arrays, so `flash_numba.torch` copies such views first (one copy of q, k and
# v per call: kernels that take strides are on the project's list, issue #16). The answer is the same:

# %%
qkv = torch.randn(2, 5, 3 * 8, generator=gen, dtype=torch.float64)  # (B, N, 3C), C = 8, H = 2
tq, tk, tv = qkv.view(2, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)  # each (B, H, N, d), a view
print("a view, not contiguous:", not tq.is_contiguous(), "; strides", tq.stride())
split_ok = all(np.array_equal(t.numpy(), s) for t, s in zip((tq, tk, tv), split(qkv.numpy(), 2)))
print("view + permute gives your split:", split_ok)

# %% [markdown]
# ## A GPT on our attention
#
# `flash_numba/examples/gpt.py` is a character-level GPT in the style of Karpathy's nanoGPT: embeddings,
# decoder blocks (LayerNorm, causal self-attention, MLP), trained on tiny Shakespeare, which ships with
# the package. Its attention block is the whole story of this lesson:
#
# ```python
# q, k, v = self.c_attn(x).view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)  # each (B, H, N, d), a view
# y = self.attend(q, k, v, is_causal=True)   # F.scaled_dot_product_attention, or ours
# ```
#
# Two training steps of a toy version (one layer, two heads of $d = 8$, $N = 16$) with each
# attention, from the same initial weights on the same batches:

# %%
toy = dict(block_size=16, n_layer=1, n_head=2, n_embd=16, kernel="flash1")
tc = gpt.TrainConfig(steps=2, batch_size=2, warmup=1, device="cpu", dtype="float32", eval_batches=1,
                     text_chars=20_000)
toy_runs = {attn: gpt.train(gpt.GPTConfig(attn=attn, **toy), tc, log_every=1) for attn in gpt.ATTENTIONS}

# %% [markdown]
# And one step in float64, where the two must agree to rounding: every parameter's gradient, ours
# against SDPA's.

# %%
cfg64 = gpt.GPTConfig(attn="sdpa", **toy)
tc64 = gpt.TrainConfig(steps=1, batch_size=2, device="cpu", dtype="float64", text_chars=20_000)
data, model_sdpa = gpt.build(cfg64, tc64)
_, model_ours = gpt.build(gpt.GPTConfig(attn="flash_numba", **toy), tc64)  # same seed: same weights
x, y = data.batch("train", 2, 16, torch.Generator().manual_seed(0))
for model in (model_sdpa, model_ours):
    model(x, y)[1].backward()
grad_err = max(
    ((a.grad - b.grad).abs().max() / b.grad.abs().max()).item()
    for a, b in zip(model_ours.parameters(), model_sdpa.parameters())
)
print(f"largest relative difference of a parameter's gradient: {grad_err:.1e}")

# %% [markdown]
# ## The full run
#
# `benchmarks/train_gpt_h200.sh` trains a 3.2-million-parameter version (4 layers, 4 heads of $d = 64$,
# $N = 256$, batch 64) for 500 steps on a GPU, once with SDPA and once with ours, and overlays the loss
# curves. On a GPU the next cell runs a shorter version of it here; without one it shows the recorded
# run (`benchmarks/results/gpt-h200/`, shipped with the package as `flash_numba/course/data/gpt-h200/`).

# %%
csvs = recorded.gpt_csvs(gpt.ATTENTIONS)
where = recorded.gpt_provenance()
work = Path(tempfile.mkdtemp())  # this cell's files
full = None
if not SIM and DEV == "cuda":
    big = dict(block_size=256, n_layer=4, n_head=4, n_embd=256)
    tc_gpu = gpt.TrainConfig(steps=150, batch_size=64, device="cuda", eval_batches=5)
    csvs = [work / f"gpt_{attn}.csv" for attn in gpt.ATTENTIONS]
    where = f"measured now: {device.describe()}, {tc_gpu.steps} steps"
    for attn, path in zip(gpt.ATTENTIONS, csvs):
        gpt.train(gpt.GPTConfig(attn=attn, **big), tc_gpu, path)
if all(p.exists() for p in csvs):
    full = gpt.plot_runs(csvs, work / "gpt_loss.png", labels=list(gpt.ATTENTIONS))
    if "IPython" in sys.modules:  # in a notebook: show the figure
        from IPython.display import Image, display

        display(Image(str(work / "gpt_loss.png")))
    print(where)
    for attn, s in full.items():
        print(f"{attn:<12} {s['steps']} steps, final loss {s['final_loss']:.3f}, {s['tokens_per_s']:,.0f} tokens/s")
else:
    print(f"the recorded runs are not installed ({csvs[0].parent}): run benchmarks/train_gpt_h200.sh on a GPU")

# %% [markdown]
# ## What to take away
#
# * A drop-in for SDPA is a `torch.autograd.Function` whose forward saves $O$ and $L$ and whose backward
#   calls the backward kernel: autograd never sees $P$, so memory stays linear in $N$.
# * Match the interface exactly, including what it means: SDPA's causal mask is top-left aligned,
#   FlashAttention's bottom-right; they agree only when $N_q = N_k$.
# * Refuse what you do not support (a mask tensor, dropout, bfloat16, grouped-query heads) with an error,
#   rather than quietly running something else: a silent fallback is how a model ends up on the slow path.
# * Real models hand attention strided views; a kernel that needs contiguous inputs costs a copy per call.
# * The test of a swap is a model that trains: same weights and batches, same gradients to rounding,
#   loss curves on top of each other.

# %% [markdown]
# ## Check

# %%
for name, (ours_e, sdpa_e, bound) in swap_err.items():
    assert ours_e <= bound, (name, ours_e, bound)
assert tuple(saved["L"]) == (B, H, N)  # L per query row, shaped as the call
assert max(causal_err.values()) < 1e-13, causal_err
assert split_ok
assert all(np.isfinite(r["final_loss"]) for r in toy_runs.values())
assert abs(toy_runs["sdpa"]["final_loss"] - toy_runs["flash_numba"]["final_loss"]) < 1e-4
assert grad_err < 1e-11, grad_err
if full is not None:
    assert abs(full["flash_numba"]["final_loss"] / full["sdpa"]["final_loss"] - 1) < 0.01, full
print("lesson 12: all checks passed")
