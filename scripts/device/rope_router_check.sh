#!/usr/bin/env bash
# One device call for three small kernels of batched steps and prefill: qk_norm_rope reading the
# rotary table (rope_cos_sin, once per forward) with its head in one vector access; the router
# logits' cluster kernel (router_logits_mma_cluster_bf16w: the tiled kernel's eight K ranges on
# eight CTAs, from 256 to 4,095 rows; MINNOW_ROUTER_CLUSTER_ROWS=100000: the kernels before);
# route_block without spills (one CTA per SM asked for). First the kernel tests (RoPE, the
# router choices, the router bits with the cluster kernel and again with the tiled one) and the
# model-level invariance tests, then the bench: main's xtask (out/xtask_old.xz) and this tree's,
# alternating, with prefills of 4,096 and 8,192 tokens (the digests must all match: the same
# bits), then gpu_invariance and cuda_fixtures, then Nsight Compute on the refinement's
# route_block and on the x64 BF16 step kernel by kernel.
#   Stage first (stage.sh debug; the selected binaries as out/bin.tar.xz, cuda_invariance and
#   cuda_routing among them) and put main's xtask in out/xtask_old.xz; carry
#   ["out/bin.tar.xz", "out/xtask_old.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
xz -dc out/xtask_old.xz > bin/xtask-old && chmod +x bin/xtask-old
SUITES_END=90 KERNEL_FILTER="qk_norm_rope router_logits_are router_matches pooled_experts_route" run_suites cuda_kernels
(export MINNOW_ROUTER_CLUSTER_ROWS=100000; echo "(tiled router)"; SUITES_END=110 KERNEL_FILTER=router_logits_are run_suites cuda_kernels)
SUITES_END=170 run_suites "cuda_invariance cuda_routing"
EXTRA='^profile' bench_ab old bin/xtask-old new bin/xtask --quick --prefill 4096,8192 --prefix 1024 --concurrency 16,64
SUITES_END=${TESTS_END:-430} run_suites "gpu_invariance cuda_fixtures"
[ $SECONDS -lt 450 ] && ncu_kernel route_block route_block 1 2 int4 50
[ $SECONDS -lt 490 ] && N=64 EXPERTS=bf16 NCU_LIMIT=70 bash scripts/device/ncu_step.sh
echo "end t=$SECONDS"
