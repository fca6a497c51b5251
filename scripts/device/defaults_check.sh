#!/usr/bin/env bash
# One device call on the tree as committed (its PTX, default knobs): the engine-level and
# fixture suites, one bench table per encoding beside its floors, Nsight Compute on chosen
# kernels, then the whole kernel suite in the time left.
#   Stage first (scripts/device/stage.sh debug; bin/xtask and the test binaries into
#   out/bin.tar.xz); carry ["out/bin.tar.xz"]. Env: BUDGET (seconds, default 560), ENCODINGS
#   (default "int4 int8 fp8 nvfp4 bf16"), KERNELS (lines "NAME REGEX N COUNT" as in
#   ncu_kernel.sh; default: INT4's batched-step tiles, 32 rows at x16 and 64 rows at x64; a blank
#   line: none), SUITES (the suites run first; default the engine-level and fixture ones).
exec > >(tee "$OUT/${LOG:-defaults.txt}") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
budget=${BUDGET:-560}
export SUITES_END=$((budget - 10)) MINNOW_PTX_DIR=$T
run_suites "${SUITES:-cuda_quant gpu_invariance cuda_fixtures cuda_routing cuda_invariance}"
for enc in ${ENCODINGS:-int4 int8 fp8 nvfp4 bf16}; do
  [ $SECONDS -gt $((budget - 60)) ] && { echo "stop (time)"; break; }
  echo "== $enc t=$SECONDS"
  bench_table $enc
done
KERNELS=${KERNELS:-"i4_r32_x16 grouped_gemm_i4_r32 16 2
i4_r64_x64 grouped_gemm_i4_r64 64 2"}
while read -r name regex n count; do
  [ -z "$name" ] && continue
  left=$((budget - 120 - SECONDS)); [ $left -lt 40 ] && { echo "skip ncu $name (time)"; continue; }
  ncu_kernel "ncu_$name" "$regex" "$n" "$count" int4 $((left < 150 ? left : 150))
done <<< "$KERNELS"
run_suites cuda_kernels
echo "end t=$SECONDS"
