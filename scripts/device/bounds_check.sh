#!/usr/bin/env bash
# One device call: named 16-row codes kernels held to four CTAs per SM (`__launch_bounds__(256,
# 4)`, as `grouped_gemm_i4_r16` is), measured against the tree on the refinement (and a batch of
# 4) of their encodings, two rounds; ptxas reports their registers and spills, the codes kernel
# test runs on the variant, and the variant's source and PTX (both targets) go to $OUT for
# adoption.
#   Stage first (scripts/device/stage.sh debug, bin/test-cuda_kernels in out/bin.tar.xz); carry
#   ["out/bin.tar.xz"]. Env: BOUND (kernel names without grouped_gemm_, default "i8_r16
#   f4_r16"), EXPERTS (the bench's encodings, default "int8 nvfp4"), TEST (0 skips the test).
exec > >(tee "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
V=/tmp/bounds
mkdir -p $V "$OUT/ptx" && cp "$T"/*.ptx $V/ && cp kernels/moe.cu /tmp/moe_tree.cu
for k in ${BOUND:-i8_r16 f4_r16}; do
  sed -i -E "s/^GROUPED_CODES_ENTRY\(grouped_gemm_$k, ([^)]*)\)$/GROUPED_CODES_ENTRY_BOUNDS(grouped_gemm_$k, \1, (minnow_codes::THREADS, 4))/" kernels/moe.cu
done
diff /tmp/moe_tree.cu kernels/moe.cu || true
cp kernels/moe.cu "$OUT/moe.cu"
nvcc -ptx -arch=sm_80 -std=c++17 kernels/moe.cu -o "$OUT/ptx/moe.ptx" &
sm80=$!
nvcc -ptx -arch=sm_90 -std=c++17 kernels/moe.cu -o $V/moe.sm90.ptx || echo "!! nvcc sm_90 failed"
cp $V/moe.sm90.ptx "$OUT/ptx/"
for p in "$T/moe.sm90.ptx" "$V/moe.sm90.ptx"; do
  echo "== ptxas $p"
  ptxas -arch=sm_90 -v "$p" -o /dev/null 2>&1 | grep -E "entry|registers|spill" | paste - - - |
    sed -E 's/ptxas info *: //g; s/ +/ /g' | grep -E "_r16'" | cut -c1-200
done
export MINNOW_SHARED_IN_CODES=0
for enc in ${EXPERTS:-int8 nvfp4}; do
  for round in 1 2; do
    for ptx in $T $V; do
      echo "== $enc $([ $ptx = $T ] && echo tree || echo bounded) round $round t=$SECONDS"
      MINNOW_PTX_DIR=$ptx timeout 60 bin/xtask bench --experts $enc --quick --prefill 512 --prefix 1024 --concurrency 4 2>&1 |
        grep -E "^\| (refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)"
    done
  done
done
[ "${TEST:-1}" = 1 ] && MINNOW_PTX_DIR=$V KERNEL_FILTER=grouped_gemm_over_codes run_suites cuda_kernels
wait $sm80 || echo "!! nvcc sm_80 failed"
echo "end t=$SECONDS"
