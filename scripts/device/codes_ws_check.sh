#!/usr/bin/env bash
# One device call (session thirty-nine; its candidate, measured and dropped, is in docs/performance.md)
# for the quantized wgmma kernel with the codes decoded by its producer
# warpgroup (out/codes_ws_ptx.tar.xz: expert_wgmma.sm90.ptx built with -DCODES_WS, over the
# tree's PTX): its bits against the mma.sync codes tiles (cuda_kernels), then the bench per
# encoding with the tree's defaults (mma.sync tiles), MINNOW_CODES_WGMMA=1 on the tree's PTX
# (the consumers decode) and MINNOW_CODES_WGMMA=1 on the new PTX, alternating; then cuda_quant
# (the fixtures' quantized files against the CPU path) with the new kernel taken wherever it
# can be, and the tree's suites that had not run since its canonical segment order landed.
#   Stage (stage.sh debug; xtask and test-{cuda_kernels,gpu_draws,cuda_quant,cuda_routing,
#   cuda_other_shapes} as out/bin.tar.xz); carry
#   ["out/bin.tar.xz", "out/codes_ws_ptx.tar.xz"]. ROUNDS (default 2), SUITES= (empty: skip the
#   suites after the bench).
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
W=/tmp/ws_ptx
candidate_ptx codes_ws $W
MINNOW_PTX_DIR=$W KERNEL_FILTER=grouped_gemm_over_codes SUITES_END=200 run_suites cuda_kernels
export BENCH_END=330
bench() { bench_labelled "$@"; }  # label, encoding, then environment assignments
bench tree bf16
for round in $(seq "${ROUNDS:-2}"); do
  for enc in fp8 int4 int8 nvfp4; do
    [ $round = 2 ] && [ $enc != fp8 ] && [ $enc != int4 ] && continue
    bench tree $enc
    bench old-wgmma $enc MINNOW_CODES_WGMMA=1
    bench producer-decode $enc MINNOW_CODES_WGMMA=1 MINNOW_PTX_DIR=$W
  done
done
[ -z "${SUITES-1}" ] && { echo "end t=$SECONDS"; exit 0; }
echo "-- cuda_quant, producer decode"
MINNOW_CODES_WGMMA=1 MINNOW_PTX_DIR=$W SUITES_END=590 run_suites cuda_quant
echo "-- the tree"
SUITES_END=590 run_suites "gpu_draws cuda_routing cuda_other_shapes cuda_quant"
echo "end t=$SECONDS"
