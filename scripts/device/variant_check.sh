#!/usr/bin/env bash
# One device call that measures kernel variants against the tree, with the same binaries: each
# variant is either one module's source edited by a sed expression (compiled here for the sm_90
# target; every other module is the tree's PTX) or environment settings over the tree's PTX. The
# bench runs once per variant per round, the tree first in each round, and ptxas reports each
# edited module's registers and spills. Every variant should give the tree's decode digest.
#   Stage first: scripts/device/stage.sh debug, tar bin | xz > out/bin.tar.xz; carry
#   ["out/bin.tar.xz"].
# Env: VARIANTS (a file of lines "NAME MODULE SED-EXPRESSION" or "NAME - VAR=VALUE ...";
# default scripts/device/variants.txt), ROUNDS (2), ARGS (the bench's arguments), SUITES (ignored
# GPU suites to run on the tree's PTX at the end, default none), LOG (the log's name under $OUT,
# default log.txt: two runs in one call keep both).
exec > >(tee "$OUT/${LOG:-log.txt}") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
LIST=${VARIANTS:-scripts/device/variants.txt}
ARGS=${ARGS:---experts bf16 --quick --prefill 4096 --prefix 1024 --concurrency 16,64}
names=""
while read -r name module expr; do
  case "$name" in ''|'#'*) continue ;; esac
  names="$names $name"
  [ "$module" = - ] && continue
  arch=sm_90; case "$module" in attention_wgmma|expert_wgmma) arch=sm_90a ;; esac
  mkdir -p /tmp/var/$name && cp "$T"/*.ptx /tmp/var/$name/
  sed -e "$expr" kernels/$module.cu > kernels/${module}_$name.cu
  if cmp -s kernels/$module.cu kernels/${module}_$name.cu; then echo "!! $name: the expression changed nothing"; fi
  nvcc -ptx -arch=$arch -std=c++17 kernels/${module}_$name.cu -o /tmp/var/$name/$module.sm90.ptx || echo "!! $name: nvcc failed"
  echo "== ptxas $name ($module, $arch)"
  ptxas -arch=$arch -v /tmp/var/$name/$module.sm90.ptx -o /dev/null 2>&1 | grep -E "entry|registers|spill" | paste - - - | sed -E 's/ptxas info *: //g; s/ +/ /g' | cut -c1-220
done < "$LIST"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for name in tree $names; do
    line=$(grep -E "^$name " "$LIST" | head -1)
    module=$(echo "$line" | awk '{print $2}')
    envs=""
    if [ "$name" = tree ]; then export MINNOW_PTX_DIR=$T
    elif [ "$module" = - ]; then export MINNOW_PTX_DIR=$T; envs=$(echo "$line" | cut -d' ' -f3-)
    else export MINNOW_PTX_DIR=/tmp/var/$name; fi
    echo "== $name round $round t=$SECONDS $envs"
    env $envs timeout 60 bin/xtask bench $ARGS 2>&1 | grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0)|^profile"
  done
done
export MINNOW_PTX_DIR=$T
[ -n "${SUITES:-}" ] && run_suites "$SUITES"
echo "end t=$SECONDS"
