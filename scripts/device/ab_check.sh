#!/usr/bin/env bash
# One device call that decides whether a candidate tree may replace the baseline: compile the
# candidate's kernels, run the BF16 bench table of the baseline's xtask (its PTX embedded) and the
# candidate's (the fresh PTX) alternately on the same machine, then every ignored GPU suite of the
# candidate against the fresh PTX, as long as the call's 600 s last.
#   Stage first: scripts/device/stage.sh debug, tar bin | xz > out/bin.tar.xz; the baseline's
#   stripped xtask as out/xtask-main.xz. Run with carry ["out"]. The fresh PTX comes back as
#   $OUT/ptx.tar.xz, to be adopted with xtask/device/fake_nvcc.sh.
# Env: SUITES (default: every ignored GPU suite), KERNEL_FILTER (a name filter for cuda_kernels),
# NVFP4=1 (also NVFP4 experts with the codes wgmma kernel off and forced on).
exec > >(tee "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
tar xJf out/bin.tar.xz
xz -dc out/xtask-main.xz > bin/xtask-main && chmod +x bin/xtask-main
# Test binaries find the fixtures through the path they were built at.
mkdir -p /work && ln -sfn "$PWD" /work/main
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "== kernels t=$SECONDS"
bin/xtask kernels 2>&1 | grep -E "error" | head -20
tar cJf "$OUT/ptx.tar.xz" -C crates/minnow-runtime/src/cuda ptx
P=$PWD/crates/minnow-runtime/src/cuda/ptx
ARGS="--quick --experts bf16 --prefill 4096,8192 --prefix 1024 --concurrency 4,8,16,64"
for round in 1 2; do
  echo "== baseline round $round t=$SECONDS"
  timeout 90 bin/xtask-main bench $ARGS 2>&1 | grep -E "^\||^profile"
  echo "== candidate round $round t=$SECONDS"
  MINNOW_PTX_DIR=$P timeout 90 bin/xtask bench $ARGS 2>&1 | grep -E "^\||^profile"
done
export MINNOW_PTX_DIR=$P
# NVFP4 experts on the codes wgmma kernel, never measured: off (the default), then forced on.
[ "${NVFP4:-0}" = 1 ] && for v in 0 1; do
  echo "== nvfp4 MINNOW_CODES_WGMMA=$v t=$SECONDS"
  MINNOW_CODES_WGMMA=$v timeout 60 bin/xtask bench --quick --experts nvfp4 --prefill 4096 --prefix 1024 --concurrency 16,64 2>&1 | grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)"
done
run_suites "${SUITES:-gpu_invariance cuda_fixtures cuda_invariance cuda_routing cuda_other_shapes cuda_blaslt cuda_quant cuda_kernels}"
echo "end t=$SECONDS"
