#!/usr/bin/env bash
# One device call (session forty-one): two launches fewer per MoE layer and attention layer,
# both off by default until this call measures them -- the routing that dispatches in its own
# launch (MINNOW_ROUTE_DISPATCH=1, route_block_dispatch) and the split attention folded in a
# cluster instead of by attention_combine (MINNOW_ATTN_CLUSTER_FOLD=1, attention_fa_cluster_d*):
# their kernel tests, the engine-level gpu_invariance with both on (which also covers session
# thirty-nine's canonical order mend), the bench with each on and off for BF16 and INT4 (the
# staggered decodes' rows included), then the suites not run on the ordered tree, as far as
# time allows.
#   Stage (stage.sh debug; xtask and test-{gpu_invariance,cuda_fixtures,cuda_invariance,
#   gpu_draws,cuda_quant,cuda_routing,cuda_other_shapes,cuda_kernels} as out/bin.tar.xz); carry
#   ["out/bin.tar.xz"]. DEADLINE=N when less than ten minutes of device time are left.
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
END=${DEADLINE:-590}  # seconds this call may run
echo "-- cuda_kernels (routing, attention) t=$SECONDS"
timeout 120 bin/test-cuda_kernels --ignored --test-threads 1 routing_that_dispatches router_matches moe_dispatch_grouped \
  attention_folded_in_a_cluster attention_in_one_cta 2>&1 |
  awk '/^test .*(FAILED|ok)$|test result|replay with/ {print} /panicked/ {print; getline; print}' | tail -14
echo "== gpu_invariance (both launches saved) t=$SECONDS"
MINNOW_ROUTE_DISPATCH=1 MINNOW_ATTN_CLUSTER_FOLD=1 timeout $(( END - SECONDS < 170 ? END - SECONDS : 170 )) bin/test-gpu_invariance --ignored --nocapture 2>&1 |
  grep -E "graphs captured|differing|test result|panicked" -A1
bench() {  # label, encoding, then environment assignments
  [ $SECONDS -gt $((END - 80)) ] && { echo "skip $1 $2 (time)"; return; }
  echo "== $1 $2 t=$SECONDS"
  env "${@:3}" timeout 80 bin/xtask bench --experts "$2" --quick --prefill 4096 --prefix 1024 --concurrency 16,64 2>&1 |
    grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0|decode)|^profile (refinement|batched step x16)"
}
bench tree bf16
bench both bf16 MINNOW_ROUTE_DISPATCH=1 MINNOW_ATTN_CLUSTER_FOLD=1
# Batched steps walk a tile's chunks in one CTA because a CTA per chunk paid for its partials'
# round trip through memory (84 MB a layer at x64); folded in a cluster they stay on chip.
bench "fold, no one-CTA tiles" bf16 MINNOW_ATTN_CLUSTER_FOLD=1 MINNOW_ATTN_ONE_CTA_PERCENT=100000
bench tree int4
bench both int4 MINNOW_ROUTE_DISPATCH=1 MINNOW_ATTN_CLUSTER_FOLD=1
bench fold-only int4 MINNOW_ATTN_CLUSTER_FOLD=1
bench "order off" bf16 MINNOW_CANONICAL_ORDER=0
SUITES_END=$END run_suites "cuda_fixtures cuda_invariance gpu_draws cuda_routing cuda_quant cuda_other_shapes"
echo "end t=$SECONDS"
