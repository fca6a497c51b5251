#!/usr/bin/env bash
# One device call that decides a lever kept behind a tuning knob of the same binary: compile the
# tree's kernels, run the bench with the knob off and on alternately (same binary, same fresh PTX,
# same machine), then the ignored GPU suites against that PTX, as long as the call's 600 s last.
#   Stage first: scripts/device/stage.sh debug, tar bin | xz > out/bin.tar.xz. Run with carry
#   ["out"]. The fresh PTX comes back as $OUT/ptx.tar.xz, to be adopted with
#   xtask/device/fake_nvcc.sh.
# Env: KNOB (the variable, e.g. MINNOW_CODES_GATED; several, space-separated, each NAME or
#   NAME:OFF:ON, or NAME:OFF:ON:ENC,ENC to bench that knob on its own encodings, e.g.
#   "MINNOW_CODES_GATED MINNOW_CODES32_BELOW:0:32 MINNOW_SHARED_BESIDE:0:1:bf16"), COMPILE=0 (keep the
#   committed PTX: no nvcc step, for host-side levers), ENCODINGS (default "int4 nvfp4"; bf16
#   too), ROUNDS (default 2), ARGS (the bench's other arguments), SUITES (default: the suites
#   that cover the quantized experts; SUITES= for none), KERNEL_FILTER (a name filter for
#   cuda_kernels).
exec > >(tee "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
: "${KNOB:?name the knob(s) to A/B, e.g. KNOB=MINNOW_CODES_GATED}"
tar xJf out/bin.tar.xz
# Test binaries find the fixtures through the path they were built at.
mkdir -p /work && ln -sfn "$PWD" /work/main
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# COMPILE=0: the tree's kernels are the committed PTX (a host-side lever): use the embedded one.
if [ "${COMPILE:-1}" = 1 ]; then
  echo "== kernels t=$SECONDS"
  bin/xtask kernels 2>&1 | grep -E "error|warning" | head -20
  tar cJf "$OUT/ptx.tar.xz" -C crates/minnow-runtime/src/cuda ptx
  export MINNOW_PTX_DIR=$PWD/crates/minnow-runtime/src/cuda/ptx
fi
ARGS=${ARGS:---quick --prefill 4096 --prefix 1024 --concurrency 16,64}
# KNOB: one or more knobs, each NAME (values 0 then 1), NAME:OFF:ON or NAME:OFF:ON:ENC,ENC; each
# is A/B'd with the others at their defaults.
for knob in $KNOB; do
  IFS=: read -r name off on encs <<< "$knob"
  encs=${encs:-${ENCODINGS:-int4 nvfp4}}
  for round in $(seq "${ROUNDS:-2}"); do
    for enc in ${encs//,/ }; do
      for v in "${off:-0}" "${on:-1}"; do
        echo "== $enc $name=$v round $round t=$SECONDS"
        env "$name=$v" timeout 90 bin/xtask bench --experts "$enc" $ARGS 2>&1 | grep -E "^\||^profile"
      done
    done
  done
done
run_suites "${SUITES-cuda_kernels cuda_quant gpu_invariance cuda_fixtures}"
echo "end t=$SECONDS"
