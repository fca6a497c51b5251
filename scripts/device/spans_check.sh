#!/usr/bin/env bash
# One device call for masked spans on the GPU (a 2.0 step asks for the rows from its first masked
# slot; the lm_head runs on the wanted rows gathered from the batch; a graph is keyed by how many
# rows are wanted, rounded up, cuda/batch_layout.rs). First the suites that see it (gpu_invariance:
# the engine's requests alone, together, beside prefills, warm and cold, the sampled ones drawing
# on the GPU; gpu_draws; cuda_invariance: a span's rows have the whole block's bits inside mixed
# batches), then main's xtask (out/xtask_main.xz: whole blocks in its decodes) and the tree's
# alternating: the decode digests must match (the same tokens), the decode times show the gain.
# Then the dense GEMM planner with 16 cuBLASLt candidates per bucket instead of 4
# (MINNOW_LT_CANDIDATES), its plan lines and its bench, and the other suites in the time left.
# QUICK=1 stops after the bench; ROUNDS (default 2) sets its BF16 rounds.
#   Stage (stage.sh debug; xtask and the test binaries the script runs as out/bin.tar.xz), put
#   main's stripped xtask in out/xtask_main.xz; carry ["out/bin.tar.xz", "out/xtask_main.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
xz -dc out/xtask_main.xz > bin/xtask-main && chmod +x bin/xtask-main
SUITES_END=170 run_suites "gpu_invariance gpu_draws cuda_invariance"
args="--quick --prefill 4096 --prefix 1024 --concurrency 16,64"
ENCS=bf16 EXTRA='^decode' bench_ab main bin/xtask-main spans bin/xtask $args
ROUNDS=1 ENCS=int4 EXTRA='^decode' bench_ab main bin/xtask-main spans bin/xtask $args
[ -n "${QUICK:-}" ] && { echo "end t=$SECONDS"; exit 0; }
for n in 4 16; do
  echo "== lt candidates $n t=$SECONDS"
  RUST_LOG=info MINNOW_LT_CANDIDATES=$n timeout 90 bin/xtask bench --experts bf16 $args > "$OUT/lt$n.txt" 2>&1
  grep -E "dense GEMM plan|^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched)" "$OUT/lt$n.txt" | sed 's/^.*dense GEMM plan/plan/'
done
SUITES_END=575 run_suites "cuda_fixtures cuda_routing cuda_other_shapes cuda_quant"
echo "end t=$SECONDS"
