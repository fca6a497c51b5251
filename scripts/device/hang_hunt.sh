#!/usr/bin/env bash
# One device call that looks for an intermittent hang of the bench under a knob setting: the bench
# run again and again with a watchdog (a run that outlives WATCH seconds gets cuda-gdb attached:
# the kernels on the GPU and every host thread's backtrace, into $OUT/hang_N.txt; then it is
# killed), until BENCH_UNTIL seconds into the call (420), then the kernel tests named by SANITIZE
# (a cuda_kernels name filter, default the wgmma bit test) under compute-sanitizer (racecheck, synccheck,
# memcheck) in the time left.
#   Stage first (scripts/device/stage.sh debug, tar bin | xz > out/bin.tar.xz); carry
#   ["out/bin.tar.xz"]. Env: SETTINGS (environment assignments of the runs, default none),
#   RUNS (12), WATCH (40; the first run JIT-compiles the PTX and takes
#   longer), ARGS (the bench's arguments), COMPILE (kernels/X.cu modules to compile into the
#   tree's PTX first, and into $OUT/ptx for adoption; default none), SUITES and KERNEL_FILTER
#   (ignored GPU suites run before the bench loop, as run_suites takes them; default none).
exec > >(tee "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
for m in ${COMPILE:-}; do
  arch=sm_90; case "$m" in attention_wgmma|expert_wgmma) arch=sm_90a ;; esac
  nvcc -ptx -arch=sm_80 -std=c++17 kernels/$m.cu -o $T/$m.ptx && nvcc -ptx -arch=$arch -std=c++17 kernels/$m.cu -o $T/$m.sm90.ptx || echo "!! nvcc $m failed"
  mkdir -p "$OUT/ptx" && cp $T/$m.ptx $T/$m.sm90.ptx "$OUT/ptx/"
done
export MINNOW_PTX_DIR=$T
# Suites first (KERNEL_FILTER narrows cuda_kernels), with the time they need.
[ -n "${SUITES:-}" ] && run_suites "$SUITES"
ARGS=${ARGS:---experts bf16 --quick --prefill 4096 --prefix 1024 --concurrency 16,64}
for i in $(seq 1 "${RUNS:-12}"); do
  [ $((SECONDS + ${WATCH:-40} + 40)) -gt ${BENCH_UNTIL:-420} ] && { echo "stop (time)"; break; }
  env ${SETTINGS:-} bin/xtask bench $ARGS > /tmp/run.txt 2>&1 &
  pid=$!
  waited=0
  while kill -0 $pid 2>/dev/null && [ $waited -lt "${WATCH:-40}" ]; do sleep 1; waited=$((waited + 1)); done
  if kill -0 $pid 2>/dev/null; then
    echo "run $i: HUNG after $waited s; last lines:"; tail -3 /tmp/run.txt
    timeout 60 cuda-gdb -p $pid -batch -ex "info cuda kernels" -ex "info cuda blocks" \
      -ex "thread apply all bt 12" \
      -ex "cuda kernel 1" -ex "info cuda blocks" -ex "info cuda warps" -ex "bt" -ex "x/6i \$pc" > "$OUT/hang_$i.txt" 2>&1
    grep -E "Kernel|^\s*\*?\s*[0-9]+ .*(route|router|moe|attention|gemm|<<<)" "$OUT/hang_$i.txt" | head -12
    grep -qE "Kernel" "$OUT/hang_$i.txt" || { tail -5 "$OUT/hang_$i.txt"; timeout 30 gdb -p $pid -batch -ex "thread apply all bt 10" > "$OUT/hang_${i}_gdb.txt" 2>&1; grep -E "^#[0-9]+ .* in (minnow|xtask|cu[A-Z])" "$OUT/hang_${i}_gdb.txt" | head -12; }
    cp /tmp/run.txt "$OUT/hang_${i}_bench.txt"
    kill -9 $pid; wait $pid 2>/dev/null
  else
    wait $pid; echo "run $i: rc=$? t=$SECONDS $(grep -E '^refinement 32 @ prefix 1024 \(graph, top-1' /tmp/run.txt | cut -c50-62)"
  fi
done
for tool in racecheck synccheck memcheck; do
  echo "== compute-sanitizer $tool t=$SECONDS"
  env ${SETTINGS:-} timeout $(( (585 - SECONDS) / 3 )) compute-sanitizer --tool $tool --print-limit 20 \
    bin/test-cuda_kernels --ignored --test-threads 1 ${SANITIZE:-grouped_gemm_wgmma_gives} 2>&1 | grep -vE "^\s*$" | tail -15
done
echo "end t=$SECONDS"
