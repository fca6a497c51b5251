#!/usr/bin/env bash
# One device call for the F32 residual stream: its kernel tests, the fixtures against the goldens
# (their logits dumped to $OUT/dumps for scripts/fidelity/emulate.py), the quantized files'
# agreement with the CPU path, every engine- and model-level GPU suite, then the bench against the
# tree before it (out/xtask-old.xz: the xtask of a07a78e, whose kernels with
# MINNOW_ROUTE_DISPATCH=1 are 314bf9e's: a BF16 residual stream), alternating, two rounds.
# WHAT: all (default), tests, bench (ROUNDS rounds, default 2), or sanitize (compute-sanitizer's
# memcheck over the changed kernels' tests and one fixture). Everything goes to $OUT/log-WHAT.txt too.
#   bash scripts/device/residual_check.sh [all|tests|bench|sanitize]
what=${1:-all}
exec > >(tee "$OUT/log-$what.txt") 2>&1
set -uo pipefail
source scripts/device/suites.sh
device_prelude
if [ "$what" = sanitize ]; then
  # The tree's PTX (newer than the staged binaries' when a kernel changed since staging).
  export MINNOW_PTX_DIR=$T
  for t in "cuda_kernels embed_rows_gathers add_rmsnorm_matches_reference graph_replay_reads_new_inputs moe_dispatch_grouped_gemm_and_combine_match_reference" \
           "cuda_fixtures v20_fixture_matches_golden"; do
    echo "-- memcheck $t t=$SECONDS"
    set -- $t
    bin=$1; shift
    timeout 100 compute-sanitizer --tool memcheck --print-limit 20 bin/test-$bin --ignored --test-threads 1 "$@" 2>&1 |
      grep -E "ERROR SUMMARY|^test .*(ok|FAILED)$|test result|=========  (Invalid|Program hit)" | head -20
  done
  exit 0
fi
if [ "$what" != bench ]; then
echo "-- kernels t=$SECONDS"
timeout 200 bin/test-cuda_kernels --ignored --test-threads 1 embed_rows_gathers add_rmsnorm_matches_reference \
  graph_replay_reads_new_inputs moe_dispatch_grouped_gemm_and_combine_match_reference 2>&1 |
  grep -E "^test |test result|panicked" -A1 | tail -12
echo "-- cuda_fixtures t=$SECONDS"
mkdir -p "$OUT/dumps"
MINNOW_DUMP_DIR=$OUT/dumps timeout 200 bin/test-cuda_fixtures --ignored --nocapture --test-threads 1 2>&1 |
  grep -E "argmax agrees|^test .*(ok|FAILED)$|test result|panicked" -A1 | grep -v "^--" | tail -40
echo "-- cuda_quant t=$SECONDS"
timeout 200 bin/test-cuda_quant --ignored --nocapture --test-threads 1 2>&1 |
  grep -E "agrees|agreement|mean \|gpu|^test .*(ok|FAILED)$|test result|panicked" -A1 | grep -v "^--" | tail -60
echo "-- cuda_routing t=$SECONDS"
timeout 120 bin/test-cuda_routing --ignored --nocapture --test-threads 1 2>&1 |
  grep -E "expert sets differ|test result|panicked" -A1 | tail -8
SUITES_END=420 run_suites "gpu_invariance cuda_invariance cuda_other_shapes gpu_draws"
fi
[ "$what" = tests ] && exit 0
echo "-- bench t=$SECONDS"
xz -dc out/xtask-old.xz > bin/xtask-old && chmod +x bin/xtask-old
export MINNOW_ROUTE_DISPATCH=1
ROUNDS=${ROUNDS:-2} EXTRA='^profile' bench_ab old bin/xtask-old new bin/xtask --quick --prefill 4096 --prefix 1024 --concurrency 16,64
echo "done t=$SECONDS"
