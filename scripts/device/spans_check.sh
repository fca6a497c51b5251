#!/usr/bin/env bash
# One device call for masked spans on the GPU (scripts/device/patches/gpu-spans.diff: a 2.0 step
# asks for the rows from its first masked slot, the lm_head runs on the wanted rows gathered from
# the batch, and a graph is keyed by how many rows are wanted, cuda/batch_layout.rs). First the
# suites that see it (cuda_invariance: a span's rows have the whole block's bits inside mixed
# batches; gpu_invariance: the engine's requests alone, together, beside prefills, warm and cold;
# cuda_fixtures, cuda_routing), then the bench of main's xtask (out/xtask_prev.xz, whole blocks in
# its decodes) and the patched tree's (spans), alternating: the decode digests must match (the
# same tokens), the decode times show the gain; then the other GPU suites and the whole kernel
# suite in the time left.
# QUICK=1 stops after the bench; ROUNDS (default 2) sets its rounds.
#   On a branch with the patch applied: stage (stage.sh debug; xtask and the test binaries the
#   script runs as out/bin.tar.xz) and put main's xtask in out/xtask_prev.xz; carry
#   ["out/bin.tar.xz", "out/xtask_prev.xz"].
exec > >(tee "$OUT/log") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
xz -dc out/xtask_prev.xz > bin/xtask-prev && chmod +x bin/xtask-prev
SUITES_END=130 run_suites "cuda_invariance gpu_invariance cuda_fixtures cuda_routing"
EXTRA='^decode' bench_ab prev bin/xtask-prev new bin/xtask --quick --prefill 4096 --prefix 1024 --concurrency 16,64
[ -n "${QUICK:-}" ] && { echo "end t=$SECONDS"; exit 0; }
SUITES_END=330 run_suites "cuda_quant cuda_other_shapes"
SUITES_END=480 run_suites cuda_kernels
echo "end t=$SECONDS"
