#!/usr/bin/env bash
# One device-machine call for GPU work: compile the kernels with nvcc (cargo xtask kernels, from a
# carried xtask binary), run the carried GPU test binaries against the fresh PTX
# (MINNOW_PTX_DIR), then optionally the benchmark. Binaries come from `scripts/device/stage.sh`,
# which copies them (stripped) into ./bin. The fresh PTX comes back as $OUT/ptx.tar.
#
#   bash scripts/device/gpu_check.sh [tests|bench|all|quant|structured] [extra bench args]
# `quant`: the quantized-expert kernel and model tests, then the bench with BF16, INT8, INT4 and NVFP4
# routed experts. `structured`: the top-k kernel's test, then bench-structured on random mini
# weights (constrained vs plain decode at concurrency 1 and 16).
set -uo pipefail
what=${1:-all}; shift || true
root=$PWD
# Test binaries locate fixtures through the path they were built at.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$root" /work/main; fi
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
echo "== kernels"
bin/xtask kernels 2>&1 | tail -3 || { echo "KERNELS FAILED"; exit 1; }
tar cf "$OUT/ptx.tar" -C crates/minnow-runtime/src/cuda ptx
# ptxas's advisories about serialised wgmmas (C75xx: registers it cannot track, a branch around
# them, too few registers): a wgmma kernel that gets one runs its products one at a time.
echo "== ptxas wgmma advisories (sm_90a modules)"
for ptx in crates/minnow-runtime/src/cuda/ptx/{expert,attention}_wgmma.sm90.ptx; do
  echo "-- $(basename "$ptx")"
  ptxas -arch=sm_90a -v "$ptx" -o /dev/null 2>&1 | grep -E "C75[0-9][0-9]" | sed 's/^ptxas info    : //'
done
export MINNOW_PTX_DIR=$root/crates/minnow-runtime/src/cuda/ptx
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  grep -m1 "model name" /proc/cpuinfo; grep -o -m1 "avx512f" /proc/cpuinfo
  for t in bin/cpu-*; do
    echo "== $t"
    "$t" 2>&1 | grep -E "^test |test result" | tail -8
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  for t in bin/test-*; do
    echo "== $t"
    timeout 300 "$t" --ignored --nocapture --test-threads 1 2>&1 | grep -vE "^\s*$" | tail -40
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  echo "== bench (batch-invariant, the default)"
  bin/xtask bench "$@" 2>&1 | tee "$OUT/bench_invariant.txt" | grep -E "^\|" 
  echo "== bench (MINNOW_BATCH_INVARIANT=0)"
  MINNOW_BATCH_INVARIANT=0 bin/xtask bench "$@" 2>&1 | tee "$OUT/bench_variant.txt" | grep -E "^\|"
fi
if [ "$what" = quant ]; then
  echo "== quantized kernels"
  timeout 300 bin/test-cuda_kernels --ignored --nocapture grouped_gemm 2>&1 | grep -vE "^\s*$" | tail -20
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  echo "== quantized fixtures"
  timeout 300 bin/test-cuda_quant --ignored --nocapture 2>&1 | grep -vE "^\s*$" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  for e in bf16 int8 int4 nvfp4; do
    echo "== bench --experts $e"
    bin/xtask bench --experts "$e" "$@" 2>&1 | tee "$OUT/bench_$e.txt" | grep -E "^\||weights"
  done
fi
if [ "$what" = structured ]; then
  echo "== top-k kernel"
  timeout 300 bin/test-cuda_kernels --ignored --nocapture topk 2>&1 | grep -vE "^\s*$" | tail -20
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  echo "== bench-structured"
  timeout 300 bin/xtask bench-structured --random-mini --concurrency 1,16 --tokens 128 "$@" 2>&1 \
    | tee "$OUT/bench_structured.txt" | grep -E "^\||vocabulary"
fi
exit $status
