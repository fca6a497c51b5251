#!/usr/bin/env bash
# One device call for the rotary table and the vector accesses of qk_norm_rope (kernels/rope.cu:
# rope_cos_sin once per forward; each lane's head elements, angles and outputs in one access):
# the RoPE kernel test, then the bench of the previous tree's xtask (out/xtask_old.xz, its PTX
# embedded) and this tree's, alternately (the digests must match: the same bits), then
# gpu_invariance and cuda_fixtures, then Nsight Compute on the x64 BF16 step kernel by kernel.
# (Session thirty-six's first call of it, before the vector accesses, also profiled the INT4
# refinement and one x64 attention launch: docs/performance.md.)
#   On a tree with patches/rope-vector.diff applied (and its PTX made, cargo xtask kernels): stage
#   first (stage.sh debug, the selected binaries as out/bin.tar.xz) and put the tree's xtask
#   without the patch in out/xtask_old.xz; carry ["out/bin.tar.xz", "out/xtask_old.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
xz -dc out/xtask_old.xz > bin/xtask-old && chmod +x bin/xtask-old
SUITES_END=70 KERNEL_FILTER=qk_norm_rope run_suites cuda_kernels
rows() { grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)"; }
ARGS="--quick --prefill 4096 --prefix 1024 --concurrency 16,64"
for round in 1 2; do
  for enc in bf16 int4; do
    echo "== old $enc round $round t=$SECONDS"
    timeout 60 bin/xtask-old bench --experts $enc $ARGS 2>&1 | rows
    echo "== new $enc round $round t=$SECONDS"
    timeout 60 bin/xtask bench --experts $enc $ARGS 2>&1 | rows
  done
done
SUITES_END=${TESTS_END:-200} run_suites "gpu_invariance cuda_fixtures"
[ $SECONDS -lt 230 ] && N=64 EXPERTS=bf16 NCU_LIMIT=60 bash scripts/device/ncu_step.sh
echo "end t=$SECONDS"
