#!/usr/bin/env bash
# One device call for both waiting candidates when there is time for only one: branch
# codes-hoist's PTX and the streaming dense GEMM of few rows
# (MINNOW_DENSE_SKINNY_ROWS, off by default). In order, each step only if the call has time:
#   1. the bit tests: the codes kernel test and cuda_quant on the branch's PTX, the skinny
#      kernel's test against the dense tiles;
#   2. benches, same binaries, two rounds: INT4 on the tree's PTX, on the branch's, on the
#      branch's with the skinny kernel (width SKINNY_WARPS, default 2) and with the 32-row tiles
#      for batches (MINNOW_CODES32_BELOW=64: their registers fell 111 -> 80 on the branch); BF16
#      with the kernel off and on; every request-0 digest must be the same within an encoding
#      and PTX;
#   3. INT8 once on each PTX;
#   4. whole requests on the branch's PTX with the skinny kernel on: the fixtures against their
#      goldens and the engine's invariance suite (alone, batched, beside prefills, warm and cold).
# Stage first (scripts/device/stage.sh debug, then bin/xtask and bin/test-{cuda_kernels,
# cuda_quant, cuda_fixtures, gpu_invariance} into out/bin.tar.xz); carry ["out/bin.tar.xz"], and
# out/codes_hoist_ptx.tar.xz if it was made (suites.sh's branch_ptx: else the branch's PTX is
# compiled here from its patch). Env: BUDGET (seconds the script may take, default 570: the
# benches stop at 58 % of it, INT8 at 63 %).
exec > >(tee "$OUT/${LOG:-candidates.txt}") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
budget=${BUDGET:-570}
export SUITES_END=$((budget - 10))
H=/tmp/hoist_ptx
branch_ptx codes-hoist $H
W=${SKINNY_WARPS:-2}
SKINNY="MINNOW_DENSE_SKINNY_ROWS=32 MINNOW_DENSE_SKINNY_WARPS=$W"
export MINNOW_PTX_DIR=$H
KERNEL_FILTER="grouped_gemm_over_codes" run_suites "cuda_kernels cuda_quant"
KERNEL_FILTER="skinny_dense" run_suites cuda_kernels
# ~8 s a bench, ~40 s more for each PTX set's first load.
for round in 1 2; do
  for v in "int4 tree" "int4 hoisted" "int4 hoisted+skinny" "int4 hoisted+r32" "bf16 off" "bf16 skinny"; do
    [ $SECONDS -gt $((budget * 58 / 100)) ] && { echo "stop (time)"; break 2; }
    set -- $v
    ptx=$([ $2 = tree ] && echo "$T" || echo $H)
    knobs=$(case $2 in *skinny) echo "$SKINNY" ;; *r32) echo MINNOW_CODES32_BELOW=64 ;; *) echo MINNOW_DENSE_SKINNY_ROWS=0 ;; esac)
    echo "== $1 $2 round $round t=$SECONDS"
    bench_table $1 MINNOW_PTX_DIR=$ptx $knobs
  done
done
for ptx in "$T" $H; do
  [ $SECONDS -gt $((budget * 63 / 100)) ] && break
  echo "== int8 $([ "$ptx" = "$T" ] && echo tree || echo hoisted) t=$SECONDS"
  bench_table int8 MINNOW_PTX_DIR=$ptx
done
export MINNOW_DENSE_SKINNY_ROWS=32 MINNOW_DENSE_SKINNY_WARPS=$W
run_suites "gpu_invariance cuda_fixtures"
echo "end t=$SECONDS"
