#!/usr/bin/env bash
# One device call after branch codes-hoist measured faster (session thirty-four): which tile
# choices its leaner codes tiles now favour, and where INT4's 16-row kernel stands.
#   1. INT4 on the branch's PTX with 32-row tiles for batches below 0 / 64 / 128 rows per expert
#      (MINNOW_CODES32_BELOW), two rounds;
#   2. INT8 and FP8 on the branch's PTX: default (wgmma from 32 rows per expert), the mma.sync
#      tiles everywhere (MINNOW_CODES_WGMMA=0: the 64-row tiles fell 168 -> 128 registers), and
#      32-row tiles below 64 rows; INT8's prefill on the tree's PTX once more (noise check);
#   3. BF16 with the skinny dense kernel at 1 and 4 warps (2 lost, 3.58 -> 3.86 ms);
#   4. Nsight Compute on the refinement's grouped_gemm_i4_r16 (branch PTX) in the time left.
# Stage as for candidates_check.sh; carry ["out/bin.tar.xz", "out/codes_hoist_ptx.tar.xz"].
# Env: BUDGET (seconds, default 540).
exec > >(tee "$OUT/${LOG:-followup.txt}") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
budget=${BUDGET:-540}
H=/tmp/hoist_ptx
branch_ptx codes-hoist $H
bench() {  # ENCODING PTXDIR KNOBS...
  local enc=$1 ptx=$2
  shift 2
  [ $SECONDS -gt $((budget - 40)) ] && { echo "stop (time): $enc $*"; return; }
  echo "== $enc $([ $ptx = $T ] && echo tree || echo hoisted) ${*:-default} t=$SECONDS"
  bench_table $enc MINNOW_PTX_DIR=$ptx MINNOW_DENSE_SKINNY_ROWS=0 "$@"
}
for round in 1 2; do
  for below in 0 64 128; do bench int4 $H MINNOW_CODES32_BELOW=$below; done
done
for enc in int8 fp8; do
  bench $enc $H
  bench $enc $H MINNOW_CODES_WGMMA=0
  bench $enc $H MINNOW_CODES32_BELOW=64
done
bench int8 $T
bench int8 $H
bench bf16 $H MINNOW_DENSE_SKINNY_ROWS=32 MINNOW_DENSE_SKINNY_WARPS=1
bench bf16 $H MINNOW_DENSE_SKINNY_ROWS=32 MINNOW_DENSE_SKINNY_WARPS=4
left=$((budget - SECONDS))
if [ $left -gt 60 ]; then
  echo "== ncu grouped_gemm_i4_r16 t=$SECONDS"
  MINNOW_PTX_DIR=$H MINNOW_PDL=0 timeout $((left - 10)) ncu --profile-from-start off -k "regex:grouped_gemm_i4_r16" -c 2 \
    --set full --print-units base bin/xtask bench --quick --experts int4 --profile-one --prefix 1024 \
    --concurrency 1 > "$OUT/ncu_i4_r16.txt" 2>&1
  echo "rc=$?"
  grep -E "^  [a-z_0-9]+ \(|^\s+(Duration|Registers Per Thread|Achieved Occupancy|Warp Cycles Per Issued Instruction|Issue Slots Busy|Executed Ipc Active|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Local Memory Spilling Requests) " \
    "$OUT/ncu_i4_r16.txt" | awk '{$1=$1; print}'
fi
echo "end t=$SECONDS"
