#!/bin/bash
# Compiles kernels/*.cu to PTX on a machine with nvcc (the device machine) into $1/ptx.tar.gz:
# raw PTX named <stem><suffix>.ptx, as `cargo xtask kernels` names them. Bring the archive back and
# run `NVCC=xtask/device/fake_nvcc.sh PTX_DIR=<unpacked> cargo xtask kernels` to commit them with
# their source hashes.
set -e
src=${KERNELS:-kernels}
out=$1
tmp=$(mktemp -d)
for cu in "$src"/*.cu; do
  stem=$(basename "$cu" .cu)
  nvcc -ptx -arch=sm_80 -std=c++17 "$cu" -o "$tmp/$stem.ptx"
  # Modules with arch-specific instructions (wgmma) build for sm_90a: ptx::SM90A_MODULES.
  arch90=sm_90; case "$stem" in expert_wgmma|attention_wgmma) arch90=sm_90a ;; esac
  nvcc -ptx -arch=$arch90 -std=c++17 "$cu" -o "$tmp/$stem.sm90.ptx"
  ptxas -arch=$arch90 -v "$tmp/$stem.sm90.ptx" -o /dev/null 2>&1 | grep -E "error|spill|Used" | grep -E "attention|route_block|qk_norm|grouped_gemm_any|error" | head -20 || true
done
tar -C "$tmp" -czf "$out/ptx.tar.gz" .
