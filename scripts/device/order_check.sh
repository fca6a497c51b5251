#!/usr/bin/env bash
# One device call for the canonical segment order (cuda/batch_layout.rs canonical_order: a
# forward runs its segments grouped by length and kind, so batches of the same segments in
# another order replay one graph). First gpu_invariance with the order on (default) and off
# (MINNOW_CANONICAL_ORDER=0), printing how many graphs the 16-at-once decodes captured for how
# many launches and whether any request differs; then the suites that run mixed batches through
# forward_batch (FULL=1: every suite, then the bench, whose lockstep decodes keep one order
# either way).
#   On a branch with scripts/device/patches/canonical-order.diff applied: stage (stage.sh debug;
#   xtask and the test binaries it runs as out/bin.tar.xz); carry ["out/bin.tar.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
for order in 1 0; do
  echo "== gpu_invariance, MINNOW_CANONICAL_ORDER=$order t=$SECONDS"
  MINNOW_CANONICAL_ORDER=$order timeout 120 bin/test-gpu_invariance --ignored --nocapture 2>&1 |
    grep -E "graphs captured|differing|test result|panicked" -A1
done
SUITES_END=300 run_suites "cuda_fixtures cuda_invariance ${FULL:+gpu_draws cuda_quant cuda_other_shapes cuda_routing}"
[ -z "${FULL:-}" ] && { echo "end t=$SECONDS"; exit 0; }
for enc in bf16 int4; do
  echo "== $enc t=$SECONDS"
  ROWS=decode bench_table "$enc"
done
echo "end t=$SECONDS"
