#!/usr/bin/env bash
# One device call: the bench's decodes first run and warm (BF16 and INT4, the standard shapes),
# the user-level invariance check over HTTP (`minnow serve --device cuda --parallel 16` on the
# three bundled fixtures), then compute-sanitizer's memcheck over the F32 residual stream's
# kernels and one fixture, then the engine-level GPU suites with the time left. Every part
# writes its whole output under $OUT (the call's returned tail keeps only the end).
#   Stage first (scripts/device/stage.sh debug, plus bin/minnow), carry ["out/bin.tar.xz"].
#   WHAT: all (default), bench, http, sanitize, suites.
what=${1:-all}
exec > >(tee "$OUT/log-$what.txt") 2>&1
set -uo pipefail
source scripts/device/suites.sh
device_prelude
part() { [ "$what" = all ] || [ "$what" = "$1" ]; }

if part bench; then
  for enc in bf16 int4; do
    echo "== bench $enc t=$SECONDS"
    timeout 150 bin/xtask bench --experts $enc --quick --prefill 4096 --prefix 1024 --concurrency 16,64 \
      > "$OUT/bench-$enc.txt" 2>&1
    echo "rc=$?"
    grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0|decode)" "$OUT/bench-$enc.txt"
  done
fi

if part http; then
  echo "== http t=$SECONDS"
  timeout 240 python3 scripts/device/http_invariance.py --minnow bin/minnow --device cuda --parallel 16 \
    --log "$OUT/http-server.log" tests/fixtures/llada2-tiny-v20 tests/fixtures/llada2-tiny-v21 \
    tests/fixtures/llada2-tiny-v22
  echo "http rc=$?"
fi

if part sanitize; then
  # Session forty-two's call has this mode: memcheck over the F32 stream's kernel tests and a fixture.
  bash scripts/device/residual_check.sh sanitize
fi

if part suites; then
  SUITES_END=${SUITES_END:-570} run_suites "gpu_invariance cuda_invariance cuda_fixtures cuda_other_shapes gpu_draws cuda_quant cuda_routing"
fi
echo "done t=$SECONDS"
