#!/usr/bin/env bash
# One device call for both waiting candidates when there is time for only one: branch
# codes-hoist's PTX and the streaming dense GEMM of few rows
# (MINNOW_DENSE_SKINNY_ROWS, off by default). In order, each step only if the call has time:
#   1. the bit tests: the codes kernel test and cuda_quant on the branch's PTX, the skinny
#      kernel's test against the dense tiles;
#   2. benches, same binaries: INT4 on the tree's PTX and on the branch's, BF16 with the skinny
#      kernel (width SKINNY_WARPS, default 2) off and on;
#   3. whole requests on the branch's PTX with the skinny kernel on: the engine's invariance
#      suite (alone, batched, beside prefills, warm and cold);
#   4. a second round of those benches, then INT4 on the branch's PTX with the skinny kernel and
#      with the 32-row tiles for batches (MINNOW_CODES32_BELOW=64: their registers fell 111 ->
#      80 on the branch), INT8 and FP8 on each PTX, and the fixtures against their goldens.
# Every request-0 digest must be the same within an encoding and PTX.
# Stage first (scripts/device/stage.sh debug, then bin/xtask and bin/test-{cuda_kernels,
# cuda_quant, cuda_fixtures, gpu_invariance} into out/bin.tar.xz); carry ["out/bin.tar.xz"], and
# out/codes_hoist_ptx.tar.xz if it was made (suites.sh's branch_ptx: else the branch's PTX is
# compiled here from its patch). Env: BUDGET (seconds the script may take, default 570).
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
# One bench: "ENCODING VARIANT" (tree: the tree's PTX; hoisted: the branch's; +skinny: the skinny
# kernel on; +r32: the 32-row tiles for batches). ~8 s, ~40 s more for each PTX set's first load.
bench_variant() {
  local enc=$1 variant=$2 ptx=$H knobs=MINNOW_DENSE_SKINNY_ROWS=0
  [ $variant = tree ] && ptx=$T
  case $variant in *skinny) knobs=$SKINNY ;; *r32) knobs="$knobs MINNOW_CODES32_BELOW=64" ;; esac
  echo "== $enc $variant t=$SECONDS"
  bench_table $enc MINNOW_PTX_DIR=$ptx $knobs
}
# The deciding pairs first, then the engine-level suite, then the rest while there is time.
for v in "int4 tree" "int4 hoisted" "bf16 off" "bf16 skinny"; do bench_variant $v; done
(export $SKINNY SUITES_END=$((budget * 70 / 100)); run_suites gpu_invariance)
for v in "int4 hoisted" "int4 tree" "bf16 skinny" "bf16 off" "int4 hoisted+skinny" "int4 hoisted+r32" \
  "int8 tree" "int8 hoisted" "fp8 tree" "fp8 hoisted"; do
  [ $SECONDS -gt $((budget - 60)) ] && { echo "stop (time)"; break; }
  bench_variant $v
done
(export $SKINNY; run_suites cuda_fixtures)
echo "end t=$SECONDS"
