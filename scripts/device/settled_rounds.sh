#!/usr/bin/env bash
# One device call: branch codes-settled's refinement step, MINNOW_CODES_SETTLED=0 against 1,
# interleaved rounds (the first call's single pairs differed by less than their noise). Same
# staging and carry as settled_check.sh. Env: BUDGET (seconds, default 200), ROUNDS (default 5).
exec > >(tee "$OUT/${LOG:-rounds.txt}") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
ln -sfn "$PWD" /work/settled
budget=${BUDGET:-200}
S=/tmp/settled_ptx
branch_ptx codes-settled $S
for enc in int4 int8; do
  for round in $(seq ${ROUNDS:-5}); do
    [ $enc = int8 ] && [ $round -gt 2 ] && break
    for v in 0 1; do
      [ $SECONDS -gt $((budget - 15)) ] && { echo "stop (time)"; break 3; }
      printf "%s settled=%s round %s: " $enc $v $round
      MINNOW_PTX_DIR=$S MINNOW_CODES_SETTLED=$v timeout 40 bin/xtask bench --experts $enc --prefill 512 \
        --prefix 1024 --concurrency 1 2>&1 | grep -E "^\| refinement 32 tokens @ 1024 prefix \(graph, top-1" | cut -d'|' -f3,5
    done
  done
done
echo "end t=$SECONDS"
