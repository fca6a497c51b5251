#!/usr/bin/env bash
# One device call for the codes kernels that decode into shared memory
# (`grouped_gemm_{i4,i8,f8}_wgmma_ss`, written in session forty-three without a GPU): their bits
# against the mma.sync codes tiles (the codes kernel test calls them directly), then the bench
# of each encoding with the default kernels and with MINNOW_CODES_SS=1 (INT4 also with =2, the
# refinement's experts on them too, and with the register-decoding wgmma kernel,
# MINNOW_CODES_WGMMA=1, as time allows), then compute-sanitizer's
# memcheck of the codes test over INT4 with the time left. The new kernels give the tiles'
# bits, so every decode digest must be the default's. Every part writes its output under $OUT.
#   Stage first (scripts/device/stage.sh debug), carry ["out/bin.tar.xz"].
exec > >(tee "$OUT/log-ss.txt") 2>&1
set -uo pipefail
source scripts/device/suites.sh
device_prelude
echo "-- codes test t=$SECONDS"
timeout 150 bin/test-cuda_kernels --ignored --nocapture --test-threads 1 grouped_gemm_over_codes_matches_reference \
  > "$OUT/codes-test.txt" 2>&1
echo "rc=$?"
grep -E "cases compared|^test .*(ok|FAILED)$|test result|panicked" -A1 "$OUT/codes-test.txt" | head -20
bench() {  # label encoding env...
  local label=$1 enc=$2
  shift 2
  [ $SECONDS -gt 520 ] && { echo "skip $label $enc (time)"; return; }
  echo "== $label $enc t=$SECONDS"
  env "$@" timeout 90 bin/xtask bench --experts "$enc" --quick --prefill 4096 --prefix 1024 --concurrency 16,64 \
    > "$OUT/bench-$label-$enc.txt" 2>&1
  echo "rc=$?"
  grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0|decode of (16|64) concurrent)" \
    "$OUT/bench-$label-$enc.txt"
}
bench default int4
bench ss int4 MINNOW_CODES_SS=1
bench ss-all int4 MINNOW_CODES_SS=2
bench default int8
bench ss int8 MINNOW_CODES_SS=1
bench default fp8
bench ss fp8 MINNOW_CODES_SS=1
bench rs int4 MINNOW_CODES_WGMMA=1
left=$((590 - SECONDS))
if [ $left -gt 60 ]; then
  echo "-- memcheck (${left} s) t=$SECONDS"
  MINNOW_TEST_ENCODING=i4_mma timeout $left compute-sanitizer --tool memcheck --print-limit 20 bin/test-cuda_kernels \
    --ignored --test-threads 1 grouped_gemm_over_codes_matches_reference > "$OUT/codes-memcheck.txt" 2>&1
  grep -E "ERROR SUMMARY|^test .*(ok|FAILED)$|=========  (Invalid|Program hit)" "$OUT/codes-memcheck.txt" | head -12
fi
echo "done t=$SECONDS"
