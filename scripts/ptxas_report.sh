#!/usr/bin/env bash
# Registers, spills and SASS size of a module's kernels, without a GPU: the committed sm_90 PTX
# against the working tree's source compiled by a local nvcc 13.0 (the pip wheels of
# docs/performance.md put one in DIR/nvidia/cu13/bin; PATH must reach it, and cuobjdump with
# nvdisasm for the SASS counts, which are left out when they are missing).
#   bash scripts/ptxas_report.sh MODULE [REGEX]   (REGEX: part of the kernels' names, e.g. 'grouped_gemm_i4_r(16|64)')
set -euo pipefail
module=$1
filter=${2:-.}
arch=sm_90
case "$module" in attention_wgmma | expert_wgmma) arch=sm_90a ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 1d "crates/minnow-runtime/src/cuda/ptx/$module.sm90.ptx" > "$tmp/committed.ptx"
nvcc -ptx -arch=$arch -std=c++17 "kernels/$module.cu" -o "$tmp/tree.ptx" 2> "$tmp/nvcc.log" ||
  { cat "$tmp/nvcc.log"; exit 1; }
cmp -s "$tmp/committed.ptx" "$tmp/tree.ptx" && echo "(the tree's source gives the committed PTX)"
for side in committed tree; do
  echo "== $side"
  ptxas -arch=$arch -v "$tmp/$side.ptx" -o "$tmp/$side.cubin" 2>&1 |
    awk '/Compiling entry function/ {name = $7; gsub(/\x27/, "", name)}
         /bytes stack frame/ {spill = $5 " B spilled"}
         /Used [0-9]+ registers/ {for (i = 1; i <= NF; i++) if ($i == "Used") regs = $(i + 1); print name, regs " registers,", spill}' |
    grep -E "^[^ ]*($filter)" | sort > "$tmp/$side.regs" || true
  if command -v cuobjdump > /dev/null && command -v nvdisasm > /dev/null; then
    while read -r name rest; do
      n=$(cuobjdump -sass -fun "$name" "$tmp/$side.cubin" | grep -cE '^\s+/\*[0-9a-f]{4,6}\*/')
      echo "$name $rest $n SASS instructions"
    done < "$tmp/$side.regs"
  else
    cat "$tmp/$side.regs"
  fi
done
