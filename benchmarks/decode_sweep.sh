#!/usr/bin/env bash
# The decode sweep of issue 34 in one command: the CSV and the figure.
#
#   bash benchmarks/decode_sweep.sh OUTDIR
#
# One decoding step, B = 8, Hq = 32, Hkv = 8, d = 128, Nq = 1, cache 4k ... 128k tokens, float16 and bfloat16:
# flash_decode on tensor cores (contiguous and paged, the split rule's splits and num_splits = 1; the combine fused
# into the split kernel, the default, and launched after it: flash_decode-unfused), the CUDA-core
# kernel, the prefill kernels at Nq = 1 (flash2_fast: float16 only; flash2_tc) and PyTorch SDPA's backends where they
# accept the call.  Every row timed the same way (bench_decode's `ms`: calls queued back to back behind a sleep
# kernel, the GPU's time a call; its docstring names the other columns).  Writes
#   OUTDIR/decode.csv          the rows (python -m flash_numba.tools.bench_decode --csv)
#   OUTDIR/bench_decode.txt    its tables; bench_decode.err its warnings
#   OUTDIR/fig_decode.png      the figure (python -m flash_numba.tools.figures.fig_decode; needs matplotlib,
#   OUTDIR/fig_decode.csv      else run that command on the CSV where matplotlib is)
#
# Narrower runs through the environment (defaults in brackets):
#   DECODE_N        cache lengths [4096 8192 16384 32768 65536 131072]
#   DECODE_DTYPES   [float16 bfloat16]
#   DECODE_KERNELS  implementations [the list below]
#   DECODE_REPEATS  calls a timing window [10]
#   DECODE_COUNT    dtypes whose flash_decode rows are counted against the IO model [float16]
#   DECODE_FIGURE   0: no figure (a device run that brings back few files) [1]
set -u
if [ $# -ne 1 ]; then
  sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
out=$1
mkdir -p "$out"
export PYTHONUNBUFFERED=1
DECODE_N=${DECODE_N:-4096 8192 16384 32768 65536 131072}
DECODE_DTYPES=${DECODE_DTYPES:-float16 bfloat16}
DECODE_KERNELS=${DECODE_KERNELS:-flash_decode flash_decode-paged flash_decode-s1 flash_decode-paged-s1 \
flash_decode-unfused flash_decode-cuda flash2_fast flash2_tc torch-flash torch-cudnn torch-efficient torch-math}
DECODE_REPEATS=${DECODE_REPEATS:-10}
DECODE_COUNT=${DECODE_COUNT:-float16}
DECODE_FIGURE=${DECODE_FIGURE:-1}

# shellcheck disable=SC2086  (lists of words)
python3 -m flash_numba.tools.bench_decode --n $DECODE_N --dtype $DECODE_DTYPES --kernels $DECODE_KERNELS \
  --repeats "$DECODE_REPEATS" --count $DECODE_COUNT --csv "$out/decode.csv" \
  > "$out/bench_decode.txt" 2> "$out/bench_decode.err"
rc=$?
echo "bench_decode rc=$rc"
if [ "$DECODE_FIGURE" = 0 ]; then
  echo "no figure (DECODE_FIGURE=0): python -m flash_numba.tools.figures.fig_decode $out/decode.csv --out $out"
elif python3 -c "import matplotlib" 2> /dev/null; then
  python3 -m flash_numba.tools.figures.fig_decode "$out/decode.csv" --out "$out"
else
  echo "no matplotlib here: python -m flash_numba.tools.figures.fig_decode $out/decode.csv --out $out elsewhere"
fi
grep -v "^$" "$out/bench_decode.txt" | tail -n 40
exit $rc
