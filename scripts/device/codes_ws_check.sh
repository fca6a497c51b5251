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
mkdir -p $W && cp "$T"/*.ptx $W/ && tar xJf out/codes_ws_ptx.tar.xz -C $W
cmp -s $W/expert_wgmma.sm90.ptx "$T/expert_wgmma.sm90.ptx" && echo "!! the tree's PTX"
MINNOW_PTX_DIR=$W KERNEL_FILTER=grouped_gemm_over_codes SUITES_END=200 run_suites cuda_kernels
bench() {  # label, encoding, then environment assignments
  local label=$1 enc=$2
  shift 2
  [ $SECONDS -gt 330 ] && { echo "skip $label $enc (time)"; return; }
  echo "== $label $enc t=$SECONDS"
  env "$@" timeout 60 bin/xtask bench --experts "$enc" --quick --prefill 4096 --prefix 1024 --concurrency 16,64 2>&1 |
    grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)|^profile (prefill|batched step x64)"
}
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
