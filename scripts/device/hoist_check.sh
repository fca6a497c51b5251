#!/usr/bin/env bash
# One device call for branch codes-hoist (a PTX-only change: the codes tiles' copy sources worked
# out once per tile instead of per stage, group quotients as shifts, INT8's and E4M3's 16-row
# tiles held to four CTAs per SM; same bits by construction): the codes kernel test and the quantized fixtures on the branch's
# PTX, then the INT4, INT8 and FP8 benches with the tree's PTX and the branch's, same binaries,
# two rounds (every digest must be equal between the two), and INT4 x16 on the branch's 32-row
# tiles.
#   Stage first (scripts/device/stage.sh debug; bin/xtask, bin/test-cuda_kernels and
#   bin/test-cuda_quant in out/bin.tar.xz); carry ["out/bin.tar.xz"], and
#   out/codes_hoist_ptx.tar.xz if it was made (suites.sh's branch_ptx: else the branch's PTX is
#   compiled here from scripts/device/patches/codes-hoist.patch). Env: BUDGET (seconds this
#   script may take, default 560).
exec > >(tee "$OUT/${LOG:-hoist.txt}") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
budget=${BUDGET:-560}
H=/tmp/hoist_ptx
branch_ptx codes-hoist $H
# Main's default since session thirty-two, whatever the staged binaries were built with.
export MINNOW_SHARED_IN_CODES=0 MINNOW_PTX_DIR=$H
KERNEL_FILTER=grouped_gemm_over_codes run_suites "cuda_kernels cuda_quant"
# ~8 s a run, ~40 s more for each PTX set's first load.
for enc in int4 int8 fp8; do
  for round in 1 2; do
    for ptx in $T $H; do
      [ $SECONDS -gt $((budget - 70)) ] && { echo "stop (time)"; break 3; }
      echo "== $enc $([ $ptx = $T ] && echo tree || echo hoisted) round $round t=$SECONDS"
      bench_table $enc MINNOW_PTX_DIR=$ptx
    done
  done
done
# The 32-row tiles for x16: slower when i4_r32 took 111 registers (two CTAs per SM); hoisted, 80.
for round in 1 2; do
  [ $SECONDS -gt $((budget - 30)) ] && break
  echo "== int4 hoisted MINNOW_CODES32_BELOW=64 round $round t=$SECONDS"
  bench_table int4 MINNOW_PTX_DIR=$H MINNOW_CODES32_BELOW=64
done
echo "end t=$SECONDS"
