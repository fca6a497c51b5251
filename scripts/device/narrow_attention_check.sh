#!/usr/bin/env bash
# One device call for the narrow wgmma attention (one consumer warpgroup per CTA, two CTAs per
# SM, for forwards whose wide tiles leave SMs idle): the attention kernel tests (bits against a
# CTA per chunk, both wgmma kernels), gpu_invariance and cuda_fixtures, then the BF16 and INT4
# refinement and batched steps with the narrow kernel off (MINNOW_ATTN_NARROW_PERCENT=0) and on
# (the default), alternately, and once with one CTA per tile at every size.
#   On a tree with patches/narrow-attention.diff applied (and its PTX made, cargo xtask kernels):
#   stage first (stage.sh debug, the selected binaries as out/bin.tar.xz); carry ["out/bin.tar.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
SUITES_END=${TESTS_END:-120}
KERNEL_FILTER=attention run_suites cuda_kernels
run_suites "gpu_invariance cuda_fixtures"
rows() { grep -E "^\| (refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)"; }
ARGS="--quick --prefill 512 --prefix 1024 --concurrency 4,8,16,64"
for round in 1 2; do
  for enc in bf16 int4; do
    for p in 0 100; do
      [ $SECONDS -gt ${BENCH_END:-240} ] && { echo "skip (time)"; continue; }
      echo "== $enc MINNOW_ATTN_NARROW_PERCENT=$p round $round t=$SECONDS"
      MINNOW_ATTN_NARROW_PERCENT=$p timeout 60 bin/xtask bench --experts $enc $ARGS 2>&1 | rows
    done
  done
done
[ $SECONDS -le ${BENCH_END:-240} ] && echo "== bf16 MINNOW_ATTN_ONE_CTA_PERCENT=0 (one CTA per tile at every size) t=$SECONDS"
[ $SECONDS -le ${BENCH_END:-240} ] && MINNOW_ATTN_ONE_CTA_PERCENT=0 timeout 60 bin/xtask bench --experts bf16 $ARGS 2>&1 | rows
echo "end t=$SECONDS"
