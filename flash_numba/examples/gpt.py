"""A small character-level GPT (nanoGPT-style) that trains with PyTorch's SDPA or with flash_numba.

The model is Karpathy's nanoGPT (pre-LayerNorm decoder blocks, GELU MLP, tied embeddings) at a
few million parameters; the data is tiny Shakespeare (``data/tinyshakespeare.txt``, public
domain). The only difference between the two runs is the attention function, one line in
:class:`CausalSelfAttention`: ``torch.nn.functional.scaled_dot_product_attention`` or
``flash_numba.torch.scaled_dot_product_attention``. The same seed gives both runs the same
initial weights and the same batches, so their loss curves can be laid over each other.

    python -m flash_numba.examples.gpt train --attn flash_numba --steps 500 --csv flash_numba.csv
    python -m flash_numba.examples.gpt train --attn sdpa --steps 500 --csv sdpa.csv
    python -m flash_numba.examples.gpt plot sdpa.csv flash_numba.csv --out gpt_loss.png
    python -m flash_numba.examples.gpt train --attn flash_numba --compile --csv compiled.csv   # torch.compile
    python -m flash_numba.examples.gpt generate --tokens 200 --csv generate.csv

Each training run writes one CSV row per step: ``step, loss, lr, ms, tokens_per_s`` (the first
step includes the kernels' compilation), and prints the validation loss at the end.

Generation (:func:`generate`) with a KV cache: the prompt runs once through the model (its keys and
values written to a :class:`KVCache`), then every new token is one decoding step, its attention
``flash_numba.attention_decode`` (``--attn flash_numba``) or SDPA over the cache (``--attn sdpa``); without
the cache every token recomputes the whole sequence.  ``generate --check`` compares each step's logits
with a full recomputation; the CSV holds tokens/s with and without the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

DATA = Path(__file__).resolve().parent / "data" / "tinyshakespeare.txt"
ATTENTIONS = ("sdpa", "flash_numba")


# ----------------------------------------------------------------------------- data


class CharData:
    """A text as character ids: the first 90% for training, the rest for validation."""

    def __init__(self, text: str, device="cpu"):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        n = int(0.9 * len(ids))
        self.splits = {"train": ids[:n].to(device), "val": ids[n:].to(device)}
        self.device = device

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, split: str, batch_size: int, block_size: int, generator: torch.Generator):
        """Inputs x and targets y (x shifted by one), both (B, N), at random offsets from ``generator``."""
        data = self.splits[split]
        starts = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator).tolist()
        x = torch.stack([data[s : s + block_size] for s in starts])  # (B, N)
        y = torch.stack([data[s + 1 : s + 1 + block_size] for s in starts])  # (B, N)
        return x, y


def load_text(path=DATA, chars: int | None = None) -> str:
    """The training text (tiny Shakespeare by default), its first ``chars`` characters if given."""
    text = Path(path).read_text(encoding="utf-8")
    return text if chars is None else text[:chars]


# ----------------------------------------------------------------------------- the model


@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 256  # N, the context length
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256  # C; head dim d = C / n_head
    attn: str = "flash_numba"  # "sdpa" or "flash_numba"
    kernel: str | None = None  # flash_numba's kernel (None: its default)


def attention_function(attn: str, kernel: str | None = None):
    """The SDPA-like function ``f(q, k, v, is_causal=...)`` that a model calls."""
    if attn == "sdpa":
        return F.scaled_dot_product_attention
    if attn == "flash_numba":
        from flash_numba.torch import scaled_dot_product_attention

        return lambda q, k, v, is_causal: scaled_dot_product_attention(q, k, v, is_causal=is_causal, kernel=kernel)
    raise ValueError(f"attn: expected one of {', '.join(ATTENTIONS)}, got {attn!r}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attend = attention_function(cfg.attn, cfg.kernel)  # the one line that differs

        self.attn_name = cfg.attn

    def forward(self, x, cache=None, layer: int = 0):
        B, N, C = x.shape
        H, d = self.n_head, C // self.n_head
        q, k, v = self.c_attn(x).view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)  # each (B, H, N, d), a view
        if cache is None or cache.length == 0:  # training, or the prompt: attention over the new tokens only
            if cache is not None:
                cache.write(layer, k, v)
            y = self.attend(q, k, v, is_causal=True)  # (B, H, N, d)
        else:  # a decoding step: the new tokens' k, v appended, q attends to the whole cache
            cache.write(layer, k, v)
            y = decode_attention(self.attn_name, q, cache, layer)  # (B, H, N, d)
        return self.c_proj(y.transpose(1, 2).reshape(B, N, C))  # (B, N, C)


class KVCache:
    """Keys and values of every layer, ``(B, H, block_size, d)`` each, and how many positions hold tokens.

    A decoding step appends its tokens' k and v (:meth:`write`, every layer) and then moves ``length`` on
    (:meth:`advance`, once the step's layers have run).  Its bytes grow by ``2 * n_layer * H * d * itemsize``
    a token: what every later step reads again (:func:`flash_numba.iomodel.flash_decode.kv_bytes`).
    """

    def __init__(self, cfg: "GPTConfig", batch: int, device, dtype):
        d = cfg.n_embd // cfg.n_head
        shape = (batch, cfg.n_head, cfg.block_size, d)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.length = 0  # positions written by earlier steps
        self.new = 0  # tokens of the step running now

    def write(self, layer: int, k, v) -> None:
        n = k.shape[2]
        if self.length + n > self.k[layer].shape[2]:
            raise ValueError(f"KVCache: {self.length} + {n} tokens exceed the block size {self.k[layer].shape[2]}")
        self.k[layer][:, :, self.length:self.length + n] = k
        self.v[layer][:, :, self.length:self.length + n] = v
        self.new = n

    def advance(self) -> None:
        self.length += self.new
        self.new = 0

    def nbytes(self) -> int:
        """Bytes of keys and values the cache holds now."""
        return sum(x[:, :, :self.length].numel() * x.element_size() for x in self.k + self.v)


def decode_attention(attn: str, q, cache: KVCache, layer: int):
    """Attention of the step's Nq new tokens (q: (B, H, Nq, d)) to the cache's length + Nq keys, causal
    among the new tokens: ``flash_numba.attention_decode`` or SDPA on the cache's first positions."""
    L = cache.length + q.shape[2]
    k, v = cache.k[layer], cache.v[layer]
    if attn == "flash_numba":
        import flash_numba

        B = q.shape[0]
        lens = torch.full((B,), L, dtype=torch.int32, device=q.device)
        if q.is_cuda:
            return flash_numba.attention_decode(q, k, v, cache_seqlens=lens, causal=True).o
        o = flash_numba.attention_decode(q.numpy(), k.numpy(), v.numpy(), cache_seqlens=lens.numpy(), causal=True).o
        return torch.from_numpy(o)
    Nq = q.shape[2]
    visible = torch.arange(L, device=q.device)[None, :] <= torch.arange(Nq, device=q.device)[:, None] + (L - Nq)
    return F.scaled_dot_product_attention(q, k[:, :, :L], v[:, :, :L], attn_mask=visible)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        C = cfg.n_embd
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x, cache=None, layer: int = 0):
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, cache: KVCache | None = None):
        """Logits of every position of ``idx`` (B, N); with ``cache``, ``idx`` holds the tokens after the cache's
        ``length`` (the prompt into an empty cache, then one step's tokens), whose k and v join the cache."""
        B, N = idx.shape
        start = 0 if cache is None else cache.length
        x = self.wte(idx) + self.wpe(torch.arange(start, start + N, device=idx.device))  # (B, N, C)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)
        if cache is not None:
            cache.advance()
        logits = self.lm_head(self.ln_f(x))  # (B, N, vocab)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


# ----------------------------------------------------------------------------- training


@dataclass
class TrainConfig:
    steps: int = 500
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 50
    seed: int = 0
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    dtype: str = "float32"
    eval_batches: int = 20
    text_chars: int | None = None  # train on the first characters only (tests)
    compile: str | None = None  # torch.compile's mode ("default", "reduce-overhead", ...); None: eager
    autocast: str | None = None  # "bfloat16" or "float16": mixed precision (weights stay in ``dtype``); None: off


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = (step - tc.warmup) / max(tc.steps - tc.warmup, 1)
    return tc.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))


def build(cfg: GPTConfig, tc: TrainConfig):
    """The data and a model initialised from ``tc.seed`` (identical for both attentions)."""
    data = CharData(load_text(chars=tc.text_chars), tc.device)
    cfg.vocab_size = data.vocab_size
    torch.manual_seed(tc.seed)
    model = GPT(cfg).to(device=tc.device, dtype=getattr(torch, tc.dtype))
    return data, model


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _autocast(tc: TrainConfig):
    """``torch.autocast`` in ``tc.autocast``'s dtype (the matrix products and our attention run in it), or nothing."""
    if tc.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(tc.device).type, dtype=getattr(torch, tc.autocast))


def train(cfg: GPTConfig, tc: TrainConfig, csv_path=None, log_every: int = 50) -> dict:
    """Train for ``tc.steps`` steps; one CSV row per step; returns a summary (losses, tokens/s)."""
    data, model = build(cfg, tc)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=(0.9, 0.99), weight_decay=0.1)
    step_model = model if tc.compile is None else torch.compile(model, mode=tc.compile)  # the same parameters
    batches = torch.Generator().manual_seed(tc.seed)
    tokens = tc.batch_size * cfg.block_size
    rows = []
    print(f"GPT, {model.num_params():,} parameters, {asdict(cfg)}, {asdict(tc)}")
    if cfg.attn == "flash_numba":
        from flash_numba import api, device

        gpu = None if device.SIMULATOR else device.info()
        kernel = cfg.kernel or api.default_kernel(tc.autocast or tc.dtype, cfg.n_embd // cfg.n_head,
                                                  gpu and gpu.compute_capability, gpu and gpu.name)
        print(f"attention: flash_numba's {kernel} kernel ({tc.autocast or tc.dtype})")
    for step in range(tc.steps):
        x, y = data.batch("train", tc.batch_size, cfg.block_size, batches)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        _sync(tc.device)
        t0 = time.perf_counter()
        if tc.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the CUDA graphs' outputs may be overwritten
        with _autocast(tc):
            _, loss = step_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        _sync(tc.device)
        ms = 1e3 * (time.perf_counter() - t0)
        row = {"step": step, "loss": loss.item(), "lr": lr_at(step, tc), "ms": ms, "tokens_per_s": tokens / ms * 1e3}
        rows.append(row)
        if step % log_every == 0 or step == tc.steps - 1:
            print(f"step {step:5d}  loss {row['loss']:.4f}  {ms:8.1f} ms  {row['tokens_per_s']:10.0f} tokens/s")
    if csv_path is not None:
        write_csv(rows, csv_path)
    summary = summarize(rows)
    summary["val_loss"] = evaluate(model, data, cfg, tc)
    print(f"final train loss {summary['final_loss']:.4f}  val loss {summary['val_loss']:.4f}  "
          f"median {summary['tokens_per_s']:.0f} tokens/s")
    return summary


@torch.no_grad()
def evaluate(model, data: CharData, cfg: GPTConfig, tc: TrainConfig) -> float:
    """Mean loss over ``tc.eval_batches`` validation batches (a fixed generator: the same for every run)."""
    gen = torch.Generator().manual_seed(tc.seed + 1)
    with _autocast(tc):  # the precision the model trained in
        losses = [model(*data.batch("val", tc.batch_size, cfg.block_size, gen))[1].item()
                  for _ in range(tc.eval_batches)]
    return sum(losses) / len(losses)


# ----------------------------------------------------------------------------- generation


@torch.no_grad()
def generate(model: GPT, prompt, new_tokens: int, use_cache: bool = True) -> dict:
    """Greedy decoding of ``new_tokens`` tokens after ``prompt`` (B, N0): ``tokens`` (B, N0 + new_tokens),
    ``seconds``, ``tokens_per_s`` (B * new_tokens / seconds) and ``cache_bytes`` (the KV cache at the end).

    With ``use_cache`` the prompt runs once, then each token is one step of one position (its attention a
    decoding step over the cache); without, each token recomputes the whole sequence so far.
    """
    B, N0 = prompt.shape
    if N0 + new_tokens > model.cfg.block_size:
        raise ValueError(f"new_tokens: {N0} + {new_tokens} tokens exceed the block size {model.cfg.block_size}")
    param = next(model.parameters())
    idx = prompt
    _sync(prompt.device)
    t0 = time.perf_counter()
    cache = KVCache(model.cfg, B, prompt.device, param.dtype) if use_cache else None
    logits = model(idx, cache=cache)[0][:, -1]
    for step in range(new_tokens):
        nxt = logits.argmax(-1, keepdim=True)  # (B, 1)
        idx = torch.cat([idx, nxt], dim=1)
        if step < new_tokens - 1:
            logits = model(nxt, cache=cache)[0][:, -1] if use_cache else model(idx)[0][:, -1]
    _sync(prompt.device)
    seconds = time.perf_counter() - t0
    return {"tokens": idx, "seconds": seconds, "tokens_per_s": B * new_tokens / seconds,
            "cache_bytes": cache.nbytes() if cache is not None else 0}


@torch.no_grad()
def cached_logit_errors(model: GPT, prompt, new_tokens: int) -> list[float]:
    """For each decoding step with the cache, max |logits - logits of a full recomputation| of its position
    (the same tokens: the cached run's greedy choices)."""
    B = prompt.shape[0]
    cache = KVCache(model.cfg, B, prompt.device, next(model.parameters()).dtype)
    idx = prompt
    logits = model(idx, cache=cache)[0][:, -1]
    errors = []
    for _ in range(new_tokens):
        nxt = logits.argmax(-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
        logits = model(nxt, cache=cache)[0][:, -1]
        full = model(idx)[0][:, -1]
        errors.append(float((logits - full).abs().max()))
    return errors


# ----------------------------------------------------------------------------- CSV and figure


FIELDS = ("step", "loss", "lr", "ms", "tokens_per_s")


def write_csv(rows, path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: (int(v) if k == "step" else float(v)) for k, v in row.items()} for row in csv.DictReader(f)]


def summarize(rows) -> dict:
    """``final_loss``: the mean over the last 10% of steps (single steps are noisy); ``tokens_per_s``:
    the median over every step but the first (which compiles the kernels)."""
    tail = rows[-max(1, len(rows) // 10) :]
    timed = rows[1:] or rows
    return {
        "steps": len(rows),
        "final_loss": statistics.fmean(r["loss"] for r in tail),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
    }


def plot_runs(csv_paths, out_png, labels=None) -> dict:
    """Loss against step (overlaid) and tokens/s of each run, from their CSVs; returns label -> summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or [Path(p).stem for p in csv_paths]
    fig, (ax_loss, ax_speed) = plt.subplots(1, 2, figsize=(11, 4))
    summaries = {}
    for path, label in zip(csv_paths, labels):
        rows = read_csv(path)
        s = summaries[label] = summarize(rows)
        steps = [r["step"] for r in rows]
        ax_loss.plot(steps, [r["loss"] for r in rows], label=f"{label} (final {s['final_loss']:.3f})", lw=1)
        speed = [r["tokens_per_s"] for r in rows[1:]]
        ax_speed.plot(steps[1:], speed, label=f"{label} (median {s['tokens_per_s']:.3g})", lw=1)
    ax_loss.set(xlabel="step", ylabel="training loss (cross-entropy, nats)", title="Loss, same seed and batches")
    ax_speed.set(xlabel="step", ylabel="tokens / s", title="Training speed (first step left out)")
    for ax in (ax_loss, ax_speed):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return summaries


# ----------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flash_numba.examples.gpt", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train the GPT, one CSV row per step")
    t.add_argument("--attn", choices=ATTENTIONS, default="flash_numba")
    t.add_argument("--kernel", default=None, help="flash_numba's kernel (default: its fastest)")
    t.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE",
                   help="train the torch.compile'd model (MODE: default, reduce-overhead, max-autotune)")
    for name, default in asdict(TrainConfig()).items():
        if name not in ("text_chars", "compile", "autocast"):
            t.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    t.add_argument("--autocast", choices=("bfloat16", "float16"), default=None,
                   help="mixed precision: the products and attention in this dtype (weights stay in --dtype)")
    t.add_argument("--block-size", type=int, default=GPTConfig.block_size)
    t.add_argument("--n-layer", type=int, default=GPTConfig.n_layer)
    t.add_argument("--n-head", type=int, default=GPTConfig.n_head)
    t.add_argument("--n-embd", type=int, default=GPTConfig.n_embd)
    t.add_argument("--csv", default=None)
    p = sub.add_parser("plot", help="overlay the loss curves of training CSVs")
    p.add_argument("csvs", nargs="+")
    p.add_argument("--out", required=True)
    g = sub.add_parser("generate", help="greedy generation with and without the KV cache: tokens/s, logit check")
    g.add_argument("--attn", choices=ATTENTIONS, default="flash_numba")
    g.add_argument("--tokens", type=int, default=128, help="new tokens a sequence")
    g.add_argument("--prompt", type=int, default=16, help="prompt tokens (from the text)")
    g.add_argument("--batch", type=int, default=8)
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    g.add_argument("--dtype", default="float16" if torch.cuda.is_available() else "float32")
    g.add_argument("--n-layer", type=int, default=GPTConfig.n_layer)
    g.add_argument("--n-head", type=int, default=GPTConfig.n_head)
    g.add_argument("--n-embd", type=int, default=GPTConfig.n_embd)
    g.add_argument("--check", action="store_true", help="also compare each cached step's logits with a full pass")
    g.add_argument("--csv", default=None)
    args = parser.parse_args(argv)
    if args.cmd == "generate":
        return _generate_command(args)
    if args.cmd == "plot":
        summaries = plot_runs(args.csvs, args.out)
        for label, s in summaries.items():
            print(f"{label:<20} steps {s['steps']:5d}  final loss {s['final_loss']:.4f}  "
                  f"{s['tokens_per_s']:10.0f} tokens/s")
        if len(summaries) == 2:
            (a, sa), (b, sb) = summaries.items()
            print(f"{b} / {a}: final loss x {sb['final_loss'] / sa['final_loss']:.4f}, "
                  f"tokens/s x {sb['tokens_per_s'] / sa['tokens_per_s']:.3f}")
        return 0
    cfg = GPTConfig(block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                    attn=args.attn, kernel=args.kernel)
    tc = TrainConfig(**{k: getattr(args, k) for k in asdict(TrainConfig()) if k != "text_chars"})
    train(cfg, tc, args.csv)
    return 0


def _generate_command(args) -> int:
    """``generate``: a model initialised from seed 0 (untrained: the tokens are noise, the work is real)."""
    cfg = GPTConfig(block_size=args.prompt + args.tokens, n_layer=args.n_layer, n_head=args.n_head,
                    n_embd=args.n_embd, attn=args.attn)
    data = CharData(load_text(chars=20_000), args.device)
    cfg.vocab_size = data.vocab_size
    torch.manual_seed(0)
    model = GPT(cfg).to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    prompt = data.splits["train"][: args.prompt].repeat(args.batch, 1)  # (B, prompt)
    rows = []
    for use_cache in (True, False):
        generate(model, prompt, 2, use_cache)  # warm-up: the kernels' compilation
        r = generate(model, prompt, args.tokens, use_cache)
        rows.append({"attn": args.attn, "cache": use_cache, "batch": args.batch, "prompt": args.prompt,
                     "tokens": args.tokens, "seconds": r["seconds"], "tokens_per_s": r["tokens_per_s"],
                     "cache_bytes": r["cache_bytes"], "device": args.device, "dtype": args.dtype})
        print(f"{args.attn:<12} cache={use_cache!s:<5} {r['tokens_per_s']:10.1f} tokens/s "
              f"({args.batch} x {args.tokens} tokens in {r['seconds']:.2f} s; KV cache {r['cache_bytes']:,} B)")
    if args.check:
        errors = cached_logit_errors(model, prompt, min(args.tokens, 16))
        print(f"cached steps against full recomputation: max |logit difference| {max(errors):.3g}")
        for row in rows:
            row["max_logit_error"] = max(errors)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
