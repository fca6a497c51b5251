#!/usr/bin/env bash
# One device call for 4-bit codes in the word order (kernels/codes.cuh): the codes kernel test
# and the router tests, the quantized fixtures against the CPU path, then the INT4 and NVFP4
# bench tables of the previous tree's xtask (out/xtask_old.xz, its PTX embedded, settled down
# projections on as this tree's default) and this tree's, alternately, then gpu_invariance.
# (Session thirty-five's call also timed the dropped route-dispatch patch; docs/performance.md.)
#   Stage first (stage.sh debug, the selected binaries as out/bin.tar.xz); carry ["out/bin.tar.xz",
#   "out/xtask_old.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
xz -dc out/xtask_old.xz > bin/xtask-old && chmod +x bin/xtask-old
SUITES_END=${TESTS_END:-200}
KERNEL_FILTER=grouped_gemm_over_codes run_suites cuda_kernels
KERNEL_FILTER=rout run_suites cuda_kernels
run_suites "cuda_routing cuda_quant"
for round in 1 2; do
  for enc in int4 nvfp4; do
    echo "== old $enc round $round t=$SECONDS"
    MINNOW_CODES_SETTLED=1 timeout 60 bin/xtask-old bench --experts "$enc" --quick --prefill 4096 --prefix 1024 --concurrency 16,64 2>&1 |
      grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)"
    echo "== new $enc round $round t=$SECONDS"
    bench_table "$enc"
  done
done
SUITES_END=585 run_suites gpu_invariance
echo "end t=$SECONDS"
