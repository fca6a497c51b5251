#!/usr/bin/env bash
# One device call for the router chain's two levers (MINNOW_ROUTE_SHARED: route_block's admission
# loops shared by several threads per expert; MINNOW_ROUTER_STAGED: a denoising step's router
# logits staged in shared memory): compiles kernels/router.cu into the tree's PTX directory (and
# $OUT/ptx, for adoption with xtask/device/fake_nvcc.sh), prints ptxas's registers, runs the
# router kernel tests with the levers on and off, benches off / route_block only / both with the
# same binaries, then the engine suites on the new PTX. Every row must give one digest.
#   Stage first (scripts/device/stage.sh debug, tar bin | xz > out/bin.tar.xz); carry
#   ["out/bin.tar.xz"]. Env: EXPERTS (default "bf16 int4"), ROUNDS (2), SUITES (default
#   "gpu_invariance cuda_invariance cuda_fixtures").
exec > >(tee "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
mkdir -p "$OUT/ptx"
nvcc -ptx -arch=sm_80 -std=c++17 kernels/router.cu -o "$OUT/ptx/router.ptx" || echo "!! nvcc sm_80 failed"
nvcc -ptx -arch=sm_90 -std=c++17 kernels/router.cu -o "$OUT/ptx/router.sm90.ptx" || echo "!! nvcc sm_90 failed"
cp "$OUT/ptx/router.ptx" "$OUT/ptx/router.sm90.ptx" "$T/"
for f in router.ptx router.sm90.ptx; do
  arch=$([ $f = router.ptx ] && echo sm_80 || echo sm_90)
  echo "== ptxas $f"
  ptxas -arch=$arch -v "$T/$f" -o /dev/null 2>&1 | grep -E "entry|registers|spill|smem" | grep -A2 -E "route_block|e8s" | sed -E 's/ptxas info *: //g; s/ +/ /g' | cut -c1-200
done
export MINNOW_PTX_DIR=$T
for levers in "1 1" "0 0"; do
  set -- $levers
  echo "== router tests, MINNOW_ROUTE_SHARED=$1 MINNOW_ROUTER_STAGED=$2"
  MINNOW_ROUTE_SHARED=$1 MINNOW_ROUTER_STAGED=$2 KERNEL_FILTER=rout run_suites "cuda_kernels cuda_routing"
done
ARGS="--quick --prefill 4096 --prefix 1024 --concurrency 16,64"
for e in ${EXPERTS:-bf16 int4}; do
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for levers in "0 0" "1 0" "1 1"; do
      set -- $levers
      echo "== $e route_shared=$1 staged=$2 round $round t=$SECONDS"
      MINNOW_ROUTE_SHARED=$1 MINNOW_ROUTER_STAGED=$2 timeout 60 bin/xtask bench --experts "$e" $ARGS 2>&1 | grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)"
    done
  done
done
run_suites "${SUITES:-gpu_invariance cuda_invariance cuda_fixtures}"
echo "end t=$SECONDS"
