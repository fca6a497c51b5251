#!/usr/bin/env bash
# One device call: Nsight Compute's full section set on single kernels of one bench forward (a
# refinement, or a batched step of N requests), each kernel replayed for every pass. Replay saves
# the device memory a kernel may write, so it needs room beside the weights and the K/V pool: the
# INT4 bench (9 GB of weights, the pool capped at 12 GiB by --profile-one) leaves it; BF16 mini
# (32 GB) did not (session 29). Prints each kernel's throughput lines; the whole report per
# kernel is $OUT/NAME.txt.
#   Stage first (scripts/device/stage.sh), carry ["out/bin.tar.xz"]. Env: KERNELS (lines
#   "NAME REGEX N COUNT", N the concurrency, 1: the refinement; default: the refinement's router
#   chain and attention), EXPERTS (default int4), LOG (the log's name under $OUT, default log.txt).
exec > >(tee "$OUT/${LOG:-log.txt}") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
KERNELS=${KERNELS:-"route_block ^route_block 1 1
router_logits router_logits_mma_bf16w_e8 1 1
attention attention_fa_d128 1 1
attention_combine attention_combine 1 1"}
while read -r name regex n count; do
  [ -z "$name" ] && continue
  left=$((580 - SECONDS)); [ $left -lt 20 ] && { echo "skip $name (time)"; continue; }
  ncu_kernel "$name" "$regex" "$n" "$count" "${EXPERTS:-int4}" $((left < 150 ? left : 150))
done <<< "$KERNELS"
echo "end t=$SECONDS"
