#!/usr/bin/env bash
# Train the example GPT (flash_numba/examples/gpt.py) twice on a GPU, with PyTorch's SDPA and with
# flash_numba's attention: same seed, so the same initial weights and the same batches; fp32.
#
#   bash benchmarks/train_gpt_h200.sh OUTDIR [STEPS]     # STEPS defaults to 500
#
# Writes to OUTDIR: gpt_sdpa.csv and gpt_flash_numba.csv (one row per step: loss, lr, ms, tokens/s),
# their logs (parameter count, validation loss at the end), gpt_loss.png (the loss curves overlaid,
# and tokens/s) and gpt_summary.txt (final loss = mean of the last 10% of steps, median tokens/s).
#
# Model: 4 layers, 4 heads of d = 64 (C = 256), context N = 256, batch 64: 3.2 M parameters,
# 16,384 tokens a step; attention calls at B*H = 256, N = 256, d = 64, causal.
# Expected time on an H200: about 8-10 ms a step with SDPA and 12-20 ms with flash_numba (our causal
# forward + backward at this size is ~1 ms per layer; the fp32 matrix products ~6 ms a step), so
# 500 steps take ~5 s and ~10 s; with Python and CUDA start-up (~10 s a run) and the first-call
# compilation of our kernels (~10-30 s) the whole script should take 1-1.5 minutes (each run is
# capped at 120 s).
set -u
out=${1:?usage: bash benchmarks/train_gpt_h200.sh OUTDIR [STEPS]}
steps=${2:-500}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
common=(--steps "$steps" --batch-size 64 --block-size 256 --n-layer 4 --n-head 4 --n-embd 256
        --lr 1e-3 --warmup 50 --seed 0 --dtype float32 --device cuda)
for attn in sdpa flash_numba; do
  t0=$(date +%s)
  timeout 120 python3 -m flash_numba.examples.gpt train --attn "$attn" "${common[@]}" --csv "$out/gpt_$attn.csv" \
    > "$out/gpt_$attn.log" 2>&1
  echo "$attn rc=$? $(( $(date +%s) - t0 ))s"
  tail -n 1 "$out/gpt_$attn.log"
done
python3 -m flash_numba.examples.gpt plot "$out/gpt_sdpa.csv" "$out/gpt_flash_numba.csv" --out "$out/gpt_loss.png" \
  | tee "$out/gpt_summary.txt"
