#!/usr/bin/env bash
# (Session thirty-nine: the canonical order landed; the attention candidates were measured and
# dropped, docs/performance.md; their PTX came from a branch that is gone.)
# One device call for two candidates: the canonical segment order (cuda/batch_layout.rs
# canonical_order; gpu_invariance with it on and off, and how many graphs the 16-at-once decodes
# captured for how many launches) and an attention kernel whose consumers issue tile t's P.V and
# tile t + 1's scores together (out/attn_diet_ptx.tar.xz: its attention_wgmma.sm90.ptx over the
# tree's PTX): its bits test against a CTA per chunk, gpu_invariance on it, and the bench with
# the tree's PTX and the new one alternating (stage profiles included); the same kernel with
# its two consumer warpgroups taking turns on the tensor cores (out/attn_pp_ptx.tar.xz) too.
#   Stage (stage.sh debug; xtask and test-{cuda_kernels,gpu_invariance,cuda_fixtures,
#   cuda_invariance} as out/bin.tar.xz); carry ["out/bin.tar.xz", "out/attn_diet_ptx.tar.xz",
#   "out/attn_pp_ptx.tar.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
A=/tmp/attn_ptx P=/tmp/attn_pp
candidate_ptx attn_diet $A
candidate_ptx attn_pp $P
invariance() {  # label, then environment assignments
  local label=$1
  shift
  [ $SECONDS -gt 480 ] && { echo "skip gpu_invariance $label (time)"; return; }
  echo "== gpu_invariance $label t=$SECONDS"
  env "$@" timeout 150 bin/test-gpu_invariance --ignored --nocapture 2>&1 |
    grep -E "graphs captured|differing|test result|panicked" -A1
}
export BENCH_END=520 ROWS=decode
bench() { bench_labelled "$1" bf16 "${@:2}"; }  # label, then environment assignments
echo "-- new attention"
MINNOW_PTX_DIR=$A KERNEL_FILTER=attention_in_one SUITES_END=110 run_suites cuda_kernels
invariance "canonical order on" MINNOW_CANONICAL_ORDER=1
bench tree
bench new MINNOW_PTX_DIR=$A
bench turns MINNOW_PTX_DIR=$P
invariance "new attention" MINNOW_PTX_DIR=$A
invariance "canonical order off" MINNOW_CANONICAL_ORDER=0
bench tree
bench new MINNOW_PTX_DIR=$A
bench turns MINNOW_PTX_DIR=$P
SUITES_END=590 run_suites "cuda_fixtures cuda_invariance"
echo "end t=$SECONDS"
