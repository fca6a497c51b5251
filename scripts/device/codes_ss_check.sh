#!/usr/bin/env bash
# One device call for the INT4 kernel that decodes its codes into shared memory
# (`grouped_gemm_i4_wgmma_ss`, written in session forty-three without a GPU): its bits against
# the mma.sync codes tiles (the codes kernel test calls it directly), compute-sanitizer's memcheck
# of that test over INT4 alone, then the INT4 bench with the default kernels, with the
# register-decoding wgmma kernel (MINNOW_CODES_WGMMA=1) and with the new one
# (MINNOW_CODES_SS=1), alternating. The new kernel gives the tiles' bits,
# so every decode digest must be the default's. Every part writes its output under $OUT.
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
echo "-- memcheck t=$SECONDS"
MINNOW_TEST_ENCODING=i4_mma timeout 150 compute-sanitizer --tool memcheck --print-limit 20 bin/test-cuda_kernels \
  --ignored --test-threads 1 grouped_gemm_over_codes_matches_reference > "$OUT/codes-memcheck.txt" 2>&1
grep -E "ERROR SUMMARY|^test .*(ok|FAILED)$|=========  (Invalid|Program hit)" "$OUT/codes-memcheck.txt" | head -12
for round in 1 2; do
  for v in "default" "rs MINNOW_CODES_WGMMA=1" "ss MINNOW_CODES_SS=1"; do
    set -- $v
    label=$1; shift
    [ $SECONDS -gt 540 ] && { echo "skip $label round $round (time)"; continue; }
    echo "== $label int4 round $round t=$SECONDS"
    env "$@" timeout 90 bin/xtask bench --experts int4 --quick --prefill 4096 --prefix 1024 --concurrency 16,64 \
      > "$OUT/bench-$label-$round.txt" 2>&1
    echo "rc=$?"
    grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0|decode of (16|64) concurrent)" \
      "$OUT/bench-$label-$round.txt"
  done
done
echo "done t=$SECONDS"
