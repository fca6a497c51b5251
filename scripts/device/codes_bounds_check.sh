#!/usr/bin/env bash
# One device call: the quantized-codes kernels with 16-row tiles held to 64 registers so four CTAs
# fit a multiprocessor instead of three (`__launch_bounds__(256, 4)`; a refinement's gate/up
# launch of ~400 CTAs otherwise leaves a second wave of a few CTAs), measured against the tree
# with the shared expert inside the codes launch and beside it (MINNOW_SHARED_IN_CODES=0). The
# variant's PTX (both targets) goes to $OUT/ptx for adoption; the codes kernel test and the
# quantized fixtures run on it, both shared-expert placements.
#   Stage first (scripts/device/stage.sh debug; bin/test-cuda_kernels and bin/test-cuda_quant in
#   out/bin.tar.xz); carry ["out/bin.tar.xz"]. Env: ROUNDS (2).
exec > >(tee "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
V=/tmp/lb4
mkdir -p $V "$OUT/ptx" && cp "$T"/*.ptx $V/
sed -e '/^#define GROUPED_CODES_ENTRY/,+1s/__launch_bounds__(minnow_codes::THREADS)/__launch_bounds__(minnow_codes::THREADS, NT == 2 ? 4 : 1)/' \
  kernels/moe.cu > kernels/moe_lb4.cu
cmp -s kernels/moe.cu kernels/moe_lb4.cu && echo "!! the expression changed nothing"
nvcc -ptx -arch=sm_80 -std=c++17 kernels/moe_lb4.cu -o $V/moe.ptx || echo "!! nvcc sm_80 failed"
nvcc -ptx -arch=sm_90 -std=c++17 kernels/moe_lb4.cu -o $V/moe.sm90.ptx || echo "!! nvcc sm_90 failed"
cp $V/moe.ptx $V/moe.sm90.ptx "$OUT/ptx/"
for p in "$T/moe.sm90.ptx" "$V/moe.sm90.ptx"; do
  echo "== ptxas $p"
  ptxas -arch=sm_90 -v "$p" -o /dev/null 2>&1 | grep -E "entry|registers|spill" | paste - - - |
    sed -E 's/ptxas info *: //g; s/ +/ /g' | grep -E "grouped_gemm_(i4|i8)_r(16|32)" | cut -c1-200
done
ARGS="--experts int4 --quick --prefill 4096 --prefix 1024 --concurrency 16,64"
echo "t=$SECONDS"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for ptx in $T $V; do
    for inside in 1 0; do
      echo "== $([ $ptx = $T ] && echo tree || echo lb4) shared_in_codes=$inside round $round t=$SECONDS"
      MINNOW_PTX_DIR=$ptx MINNOW_SHARED_IN_CODES=$inside timeout 60 bin/xtask bench $ARGS 2>&1 |
        grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)"
    done
  done
done
export MINNOW_PTX_DIR=$V
KERNEL_FILTER=grouped_gemm_over_codes run_suites cuda_kernels
for inside in 1 0; do
  echo "== cuda_quant shared_in_codes=$inside"
  export MINNOW_SHARED_IN_CODES=$inside
  run_suites cuda_quant
done
unset MINNOW_SHARED_IN_CODES
echo "end t=$SECONDS"
