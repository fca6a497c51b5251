#!/usr/bin/env bash
# (Session thirty-nine: the canonical order landed; the attention candidates were measured and
# dropped, docs/performance.md; their PTX came from a branch that is gone.)
# One device call for attention kernel candidates over the tree's PTX (out/attn_diet_ptx.tar.xz
# and out/attn_pp_ptx.tar.xz, each an attention_wgmma.sm90.ptx): the bench with the tree's PTX and
# each candidate's alternating (stage profiles included, two rounds), then each candidate's bits
# against a CTA per chunk (cuda_kernels), then Nsight Compute's full set on the tree's x64
# attention launch if time is left.
#   Stage (stage.sh debug; xtask and test-cuda_kernels as out/bin.tar.xz); carry
#   ["out/bin.tar.xz", "out/attn_diet_ptx.tar.xz", "out/attn_pp_ptx.tar.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
A=/tmp/attn_ptx P=/tmp/attn_pp
candidate_ptx attn_diet $A
candidate_ptx attn_pp $P
bench() { bench_labelled "$1" bf16 "${@:2}"; }  # label, then environment assignments
for round in 1 2; do
  bench tree
  bench new MINNOW_PTX_DIR=$A
  bench turns MINNOW_PTX_DIR=$P
done
echo "-- new"
MINNOW_PTX_DIR=$A KERNEL_FILTER=attention_in_one SUITES_END=250 run_suites cuda_kernels
echo "-- turns"
MINNOW_PTX_DIR=$P KERNEL_FILTER=attention_in_one SUITES_END=380 run_suites cuda_kernels
left=$((580 - SECONDS))
[ $left -gt 60 ] && ncu_kernel attention attention_wgmma 64 1 int4 $left
echo "end t=$SECONDS"
