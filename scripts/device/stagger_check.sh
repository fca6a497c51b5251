#!/usr/bin/env bash
# One device call (session forty): the routing that dispatches in its own launch
# (route_block_dispatch) against two launches (MINNOW_ROUTE_DISPATCH=0) -- its kernel test, the
# engine-level gpu_invariance with it (and with the canonical order's review mend), the bench
# both ways for BF16 and INT4 -- and the bench's staggered decodes with the canonical order off
# (MINNOW_CANONICAL_ORDER=0) beside the default's: rates, graphs captured for their launches, ids
# against lockstep. Then the suites not run on the ordered tree, as far as time allows.
#   Stage (stage.sh debug; xtask and test-{gpu_invariance,cuda_fixtures,cuda_invariance,
#   gpu_draws,cuda_quant,cuda_routing,cuda_other_shapes,cuda_kernels} as out/bin.tar.xz); carry
#   ["out/bin.tar.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
END=${DEADLINE:-590}  # seconds this call may run (less when the session's device time is short)
echo "-- cuda_kernels (routing) t=$SECONDS"
timeout 90 bin/test-cuda_kernels --ignored --test-threads 1 routing_that_dispatches router_matches moe_dispatch_grouped 2>&1 |
  awk '/^test .*(FAILED|ok)$|test result|replay with/ {print} /panicked/ {print; getline; print}' | tail -12
echo "== gpu_invariance (routing and dispatch in one launch) t=$SECONDS"
MINNOW_ROUTE_DISPATCH=1 timeout 170 bin/test-gpu_invariance --ignored --nocapture 2>&1 |
  grep -E "graphs captured|differing|test result|panicked" -A1
bench() {  # label, encoding, then environment assignments
  [ $SECONDS -gt $((END - 90)) ] && { echo "skip $1 $2 (time)"; return; }
  echo "== $1 $2 t=$SECONDS"
  env "${@:3}" timeout 100 bin/xtask bench --experts "$2" --quick --prefill 4096 --prefix 1024 --concurrency 16,64 2>&1 |
    grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0|decode)|^profile (refinement|batched step x16)"
}
bench "one launch" bf16 MINNOW_ROUTE_DISPATCH=1
bench "two launches" bf16 MINNOW_ROUTE_DISPATCH=0
bench "one launch" int4 MINNOW_ROUTE_DISPATCH=1
bench "two launches" int4 MINNOW_ROUTE_DISPATCH=0
bench "order off" bf16 MINNOW_CANONICAL_ORDER=0
SUITES_END=$END run_suites "cuda_fixtures cuda_invariance gpu_draws cuda_routing cuda_quant cuda_other_shapes"
echo "end t=$SECONDS"
