"""flash_numba.examples.gpt: a toy GPT trains on our attention in the simulator, with SDPA's gradients.

Toy sizes (1 layer, 2 heads of d = 8, N = 16, batch 2) keep each attention call to about a second
in the simulator; the full run is ``benchmarks/train_gpt_h200.sh`` on a GPU.
"""

import copy
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[dev]' brings torch==2.13.0)")

from flash_numba.examples import gpt  # noqa: E402

U64 = 2.0**-53


def toy(attn, dtype="float32", steps=2):
    cfg = gpt.GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=16, attn=attn, kernel="flash1")
    tc = gpt.TrainConfig(steps=steps, batch_size=2, warmup=1, device="cpu", dtype=dtype, eval_batches=1,
                         text_chars=20_000)
    return cfg, tc


def test_two_training_steps_on_our_attention(tmp_path):
    cfg, tc = toy("flash_numba")
    summary = gpt.train(cfg, tc, tmp_path / "run.csv")
    rows = gpt.read_csv(tmp_path / "run.csv")
    assert [r["step"] for r in rows] == [0, 1]
    assert all(math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 for r in rows)
    # a fresh model predicts about uniformly: loss near log(vocab) (init std 0.02 keeps logits ~0.1)
    vocab = cfg.vocab_size
    assert abs(rows[0]["loss"] - math.log(vocab)) < 0.1, (rows[0]["loss"], math.log(vocab))
    assert math.isfinite(summary["val_loss"])


def test_one_step_gives_sdpas_gradients():
    """Same weights and batch: every parameter's gradient with our attention equals SDPA's in float64.

    Float64 rounding (u = 1.1e-16) through sums of at most vocab + 4C = 129 terms per layer, a few
    layers deep, moves a gradient by ~1e-13 of its size; a wrong mask or scale moves it by ~1e-2.
    """
    cfg, tc = toy("sdpa", dtype="float64")
    data, sdpa_model = gpt.build(cfg, tc)
    ours_model = copy.deepcopy(sdpa_model)
    for block in ours_model.blocks:
        block.attn.attend = gpt.attention_function("flash_numba", "flash1")
    x, y = data.batch("train", tc.batch_size, cfg.block_size, torch.Generator().manual_seed(0))
    losses = []
    for model in (sdpa_model, ours_model):
        _, loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) <= 64 * U64 * abs(losses[0])
    for (name, p_sdpa), p_ours in zip(sdpa_model.named_parameters(), ours_model.parameters()):
        err = (p_ours.grad - p_sdpa.grad).abs().max().item() / max(p_sdpa.grad.abs().max().item(), 1e-30)
        assert err < 1e-11, (name, err)


def test_plot_runs_on_synthetic_csvs(tmp_path):
    """The figure of the GPU script, from two made-up runs: summaries computed from the rows."""
    paths = []
    for name, speed in (("sdpa", 3e5), ("flash_numba", 1e5)):
        rows = [{"step": s, "loss": 4.0 - 0.01 * s, "lr": 1e-3, "ms": 1.0, "tokens_per_s": speed}
                for s in range(20)]
        rows[0]["tokens_per_s"] = 1.0  # the compiling first step is left out of the median
        paths.append(tmp_path / f"{name}.csv")
        gpt.write_csv(rows, paths[-1])
    out = tmp_path / "loss.png"
    summaries = gpt.plot_runs(paths, out, labels=["sdpa", "flash_numba"])
    assert out.stat().st_size > 10_000
    assert summaries["sdpa"]["tokens_per_s"] == 3e5 and summaries["flash_numba"]["tokens_per_s"] == 1e5
    assert summaries["sdpa"]["final_loss"] == pytest.approx(4.0 - 0.01 * 18.5)  # mean of the last 2 steps
    assert gpt.main(["plot", str(paths[0]), str(paths[1]), "--out", str(out)]) == 0


def test_compiled_training_takes_the_eager_steps(tmp_path, monkeypatch):
    """``--compile``: the model under torch.compile, here with the aot_eager backend and fullgraph=True (a
    graph break raises; Inductor needs a C++ compiler and minutes on this CPU): the two steps' losses equal
    eager's to float32 rounding (the same operations; aot_eager may order the backward's additions
    differently, so not bit for bit)."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: real_compile(model, backend="aot_eager",
                                                                                fullgraph=True))
    torch._dynamo.reset()
    losses = []
    for compile_mode in (None, "default"):
        cfg, tc = toy("flash_numba")
        tc.compile = compile_mode
        gpt.train(cfg, tc, tmp_path / "run.csv")
        losses.append([r["loss"] for r in gpt.read_csv(tmp_path / "run.csv")])
    torch._dynamo.reset()
    assert losses[1] == pytest.approx(losses[0], rel=1e-5), losses


def test_generation_with_a_kv_cache_matches_full_recomputation():
    """Greedy decoding through flash_numba.attention_decode over the KV cache: each step's logits equal a full
    recomputation (SDPA over the whole sequence, no cache) within float32 rounding, and so do the tokens."""
    cfg = gpt.GPTConfig(block_size=12, n_layer=1, n_head=2, n_embd=16, attn="flash_numba", kernel="flash1")
    torch.manual_seed(0)
    model = gpt.GPT(cfg).eval()
    prompt = torch.tensor([[1, 5, 9, 2, 7], [3, 3, 8, 0, 4]])
    errors = gpt.cached_logit_errors(model, prompt, 3)
    # logits are ~0.1 (init std 0.02); float32 sums over C = 16 and 8 keys: a few ulps of 1
    assert max(errors) < 1e-5, errors
    with_cache = gpt.generate(model, prompt, 3, use_cache=True)
    sdpa = copy.deepcopy(model)
    for block in sdpa.blocks:
        block.attn.attn_name = "sdpa"
        block.attn.attend = gpt.attention_function("sdpa")
    without = gpt.generate(sdpa, prompt, 3, use_cache=False)
    assert torch.equal(with_cache["tokens"], without["tokens"])
    assert with_cache["cache_bytes"] == 2 * 1 * 2 * (5 + 2) * 8 * 4 * 2  # k and v, B = 2, 7 positions, d = 8, fp32
    cache = gpt.KVCache(cfg, 2, "cpu", torch.float32)
    with pytest.raises(ValueError, match="exceed the block size"):
        cache.write(0, torch.zeros(2, 2, 13, 8), torch.zeros(2, 2, 13, 8))


def test_training_under_autocast_runs_attention_in_the_autocast_dtype(tmp_path, monkeypatch):
    """``--autocast bfloat16``: q, k, v reach our attention in bfloat16 (the weights stay float32), and the loss
    of a few steps is finite."""
    import flash_numba.torch as fnt

    seen = []
    real = fnt.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append(q.dtype)
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(fnt, "scaled_dot_product_attention", spy)
    cfg, tc = toy("flash_numba")
    cfg.kernel, cfg.n_embd = None, 32  # the default kernel for bfloat16 (tensor cores: head dims of 16 and up)
    tc.autocast, tc.steps = "bfloat16", 2
    summary = gpt.train(cfg, tc, tmp_path / "run.csv")
    assert seen and set(seen) == {torch.bfloat16}
    assert math.isfinite(summary["final_loss"])
