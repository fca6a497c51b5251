#!/usr/bin/env bash
# One device call that looks for an intermittent hang of the bench under a knob setting: the bench
# run again and again with a watchdog (a run that outlives WATCH seconds gets cuda-gdb attached:
# the kernels on the GPU and every host thread's backtrace, into $OUT/hang_N.txt; then it is
# killed), until BENCH_UNTIL seconds into the call (420), then the router tests under
# compute-sanitizer (racecheck, synccheck, memcheck) in the time left.
#   Stage first (scripts/device/stage.sh debug, tar bin | xz > out/bin.tar.xz); carry
#   ["out/bin.tar.xz"]. Env: SETTINGS (environment assignments of the runs, default
#   "MINNOW_ROUTE_SHARED=1"), RUNS (12), WATCH (40), ARGS (the bench's arguments), COMPILE
#   (kernels/X.cu modules to compile into the tree's PTX first, default "router").
exec > >(tee "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
T=$PWD/crates/minnow-runtime/src/cuda/ptx
for m in ${COMPILE:-router}; do
  nvcc -ptx -arch=sm_80 -std=c++17 kernels/$m.cu -o $T/$m.ptx && nvcc -ptx -arch=sm_90 -std=c++17 kernels/$m.cu -o $T/$m.sm90.ptx || echo "!! nvcc $m failed"
done
export MINNOW_PTX_DIR=$T
ARGS=${ARGS:---experts bf16 --quick --prefill 4096 --prefix 1024 --concurrency 16,64}
for i in $(seq 1 "${RUNS:-12}"); do
  [ $((SECONDS + ${WATCH:-40} + 40)) -gt ${BENCH_UNTIL:-420} ] && { echo "stop (time)"; break; }
  env ${SETTINGS:-MINNOW_ROUTE_SHARED=1} bin/xtask bench $ARGS > /tmp/run.txt 2>&1 &
  pid=$!
  waited=0
  while kill -0 $pid 2>/dev/null && [ $waited -lt "${WATCH:-40}" ]; do sleep 1; waited=$((waited + 1)); done
  if kill -0 $pid 2>/dev/null; then
    echo "run $i: HUNG after $waited s; last lines:"; tail -3 /tmp/run.txt
    timeout 60 cuda-gdb -p $pid -batch -ex "info cuda kernels" -ex "info cuda blocks" \
      -ex "thread apply all bt 12" > "$OUT/hang_$i.txt" 2>&1
    grep -E "Kernel|^\s*\*?\s*[0-9]+ .*(route|router|moe|attention|gemm|<<<)" "$OUT/hang_$i.txt" | head -12
    cp /tmp/run.txt "$OUT/hang_${i}_bench.txt"
    kill -9 $pid; wait $pid 2>/dev/null
  else
    wait $pid; echo "run $i: rc=$? t=$SECONDS $(grep -E '^refinement 32 @ prefix 1024 \(graph, top-1' /tmp/run.txt | cut -c50-62)"
  fi
done
for tool in racecheck synccheck memcheck; do
  echo "== compute-sanitizer $tool t=$SECONDS"
  env ${SETTINGS:-MINNOW_ROUTE_SHARED=1} timeout $(( (585 - SECONDS) / 3 )) compute-sanitizer --tool $tool --print-limit 20 \
    bin/test-cuda_kernels --ignored --test-threads 1 rout 2>&1 | grep -vE "^\s*$" | tail -15
done
echo "end t=$SECONDS"
