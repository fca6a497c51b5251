#!/usr/bin/env bash
# One device call for the merged commit (a final block's K/V refresh in the next block's first
# forward): the GPU test that the merged forward gives the bits of the two it replaces, the
# engine-level invariance suites, then the bench's decodes with the engine's schedule and with
# `--separate-commits`, alternately: the digests must be equal and the decode rates compared.
#   Stage first (scripts/device/stage.sh debug, tar bin | xz > out/bin.tar.xz); carry
#   ["out/bin.tar.xz"]. Env: EXPERTS (default "bf16 int4"), ROUNDS (2).
exec > >(tee "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
run_suites "cuda_invariance gpu_invariance cuda_fixtures"
ARGS="--quick --prefill 4096 --prefix 1024 --concurrency 16,64"
for e in ${EXPERTS:-bf16 int4}; do
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for flag in "" --separate-commits; do
      echo "== $e ${flag:-merged} round $round t=$SECONDS"
      timeout 60 bin/xtask bench --experts "$e" $ARGS $flag 2>&1 | grep -E "^\| (decode|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)|digest"
    done
  done
done
echo "end t=$SECONDS"
