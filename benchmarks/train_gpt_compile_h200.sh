#!/usr/bin/env bash
# Train the example GPT (flash_numba/examples/gpt.py) eager and under torch.compile, on flash_numba's
# attention and on PyTorch's SDPA: same seed, so the same initial weights and batches; fp32.
#
#   bash benchmarks/train_gpt_compile_h200.sh OUTDIR [STEPS] [MODE]   # STEPS: 200; MODE: torch.compile's, default
#
# Runs, in this order (each capped at 90 s; the first step of a compiled run includes Inductor's compilation,
# which the median tokens/s leaves out): flash_numba eager, flash_numba compiled, sdpa compiled, sdpa eager.
# Writes to OUTDIR: gpt_<run>.csv (one row per step: loss, lr, ms, tokens/s), runs.log (each run's log: the
# kernel that ran, parameters, validation loss; then the summary: final loss = mean of the last 10% of steps,
# median tokens/s) and gpt_loss.png (loss curves overlaid, tokens/s).
# Model as benchmarks/train_gpt_h200.sh: 4 layers, 4 heads of d = 64, N = 256, batch 64 (16,384 tokens a step).
set -u
out=${1:?usage: bash benchmarks/train_gpt_compile_h200.sh OUTDIR [STEPS] [MODE]}
steps=${2:-200}
mode=${3:-default}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
common=(--steps "$steps" --batch-size 64 --block-size 256 --n-layer 4 --n-head 4 --n-embd 256
        --lr 1e-3 --warmup 50 --seed 0 --dtype float32 --device cuda)
csvs=()
run() {  # run NAME ARGS...
  local name=$1 t0
  shift
  t0=$(date +%s)
  echo "=== $name: $*" >> "$out/runs.log"
  timeout 90 python3 -m flash_numba.examples.gpt train "$@" "${common[@]}" --csv "$out/gpt_$name.csv" \
    >> "$out/runs.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$out/runs.log"
  [ -s "$out/gpt_$name.csv" ] && csvs+=("$out/gpt_$name.csv")
}
run flash_numba_eager --attn flash_numba
run flash_numba_compiled --attn flash_numba --compile "$mode"
run sdpa_compiled --attn sdpa --compile "$mode"
run sdpa_eager --attn sdpa
python3 -m flash_numba.examples.gpt plot "${csvs[@]}" --out "$out/gpt_loss.png" | tee -a "$out/runs.log"
