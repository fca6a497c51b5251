#!/usr/bin/env bash
# One device call for the streaming dense GEMM of few rows (kernels/dense.cu, off by default):
# its bit test against the dense tiles, cuda_blaslt with it on (every row count's bits against
# minnow's kernel, and each row count's time beside the tiles'), then the BF16 and INT4 benches
# with it off and on for each CTA width, two rounds (every digest must be equal), and the fixture
# and engine invariance suites with it on in the time left.
#   Stage first (scripts/device/stage.sh debug; bin/xtask and bin/test-{cuda_kernels,
#   cuda_blaslt, cuda_fixtures, gpu_invariance} in out/bin.tar.xz, built from a tree that has
#   kernels/dense.cu); carry ["out/bin.tar.xz"]. Env: BUDGET (seconds this script may take, default 560), WARPS (the CTA
#   widths to bench, default "1 2 4"), EXPERTS (default "bf16 int4").
exec > >(tee "$OUT/${LOG:-skinny.txt}") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
budget=${BUDGET:-560}
export MINNOW_PTX_DIR=$T
KERNEL_FILTER=skinny_dense run_suites cuda_kernels
echo "-- cuda_blaslt with MINNOW_DENSE_SKINNY_ROWS=32 t=$SECONDS"
MINNOW_DENSE_SKINNY_ROWS=32 timeout 120 bin/test-cuda_blaslt --ignored --nocapture --test-threads 1 2>&1 |
  grep -E "^(qkv|o|shared|dense|lm_head)|test result|panicked|differ" | cut -c1-400
for enc in ${EXPERTS:-bf16 int4}; do
  for round in 1 2; do
    for warps in 0 ${WARPS:-1 2 4}; do  # 0: the kernel off
      [ $SECONDS -gt $((budget - 150)) ] && { echo "stop (time)"; break 3; }
      knobs="MINNOW_DENSE_SKINNY_ROWS=0"
      [ $warps = 0 ] || knobs="MINNOW_DENSE_SKINNY_ROWS=32 MINNOW_DENSE_SKINNY_WARPS=$warps"
      echo "== $enc $knobs round $round t=$SECONDS"
      bench_table $enc $knobs
    done
  done
done
# Whole requests with it on, in the time left: the fixtures against their goldens, and the engine's
# invariance suite (alone, batched, beside prefills, warm and cold).
export MINNOW_DENSE_SKINNY_ROWS=32
run_suites "cuda_fixtures gpu_invariance"
echo "end t=$SECONDS"
