#!/usr/bin/env bash
# One device call for the tree's defaults and branch codes-settled together (session thirty-four,
# when the device time left allowed one call), all on the branch's binaries (out/bin.tar.xz, built
# at /work/settled; with MINNOW_CODES_SETTLED=0, the default, their launches are main's): first
# over main's PTX (the engine-level and fixture suites, a bench table per encoding), then over
# the branch's PTX (out/codes_settled_ptx.tar.xz): the codes kernel test
# (every tile height with its tiles read before the wait, bit for bit), INT4 and INT8 with
# MINNOW_CODES_SETTLED=0 / 1, two rounds, the engine suite with it on, then Nsight Compute on
# INT4's 32-row tiles at x16 in the time left.
#   Carry ["out/bin.tar.xz", "out/codes_settled_ptx.tar.xz"].
#   Env: BUDGET (seconds, default 500).
exec > >(tee "$OUT/${LOG:-settled.txt}") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
ln -sfn "$PWD" /work/settled  # where the test binaries were built (their fixtures' path)
budget=${BUDGET:-500}
export SUITES_END=$((budget - 10))
echo "#### main t=$SECONDS"
(export MINNOW_PTX_DIR=$T; run_suites "cuda_quant gpu_invariance cuda_fixtures")
for enc in int4 int8 fp8 nvfp4 bf16; do
  echo "== main $enc t=$SECONDS"
  MINNOW_PTX_DIR=$T bench_table $enc
done
echo "#### codes-settled t=$SECONDS"
S=/tmp/settled_ptx
branch_ptx codes-settled $S
(export MINNOW_PTX_DIR=$S; KERNEL_FILTER=grouped_gemm_over_codes run_suites cuda_kernels)
for round in 1 2; do
  for enc in int4 int8; do
    for v in 0 1; do
      [ $SECONDS -gt $((budget - 60)) ] && { echo "stop (time)"; break 3; }
      echo "== settled=$v $enc t=$SECONDS"
      bench_table $enc MINNOW_PTX_DIR=$S MINNOW_CODES_SETTLED=$v
    done
  done
done
(export MINNOW_PTX_DIR=$S MINNOW_CODES_SETTLED=1 SUITES_END=$((budget - 5)); run_suites "gpu_invariance cuda_quant")
left=$((budget - 20 - SECONDS))
if [ $left -gt 60 ]; then
  echo "== ncu i4_r32 x16 (branch binaries and PTX, settled on) t=$SECONDS"
  MINNOW_PTX_DIR=$S MINNOW_CODES_SETTLED=1 MINNOW_PDL=0 timeout $left ncu --profile-from-start off \
    -k "regex:grouped_gemm_i4_r32" -c 2 --set full --print-units base bin/xtask bench --quick --experts int4 \
    --profile-one --prefix 1024 --concurrency 16 > "$OUT/ncu_i4_r32.txt" 2>&1
  echo "rc=$?"
  grep -E "^  [a-z_0-9]+ \(|^\s+(Duration|Registers Per Thread|Achieved Occupancy|Warp Cycles Per Issued Instruction|Issue Slots Busy|L2 Cache Throughput|DRAM Throughput|Local Memory Spilling Requests|Block Limit Registers|Block Limit Shared Mem) " \
    "$OUT/ncu_i4_r32.txt" | awk '{$1=$1; print}'
fi
echo "end t=$SECONDS"
