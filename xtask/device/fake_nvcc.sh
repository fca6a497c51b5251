#!/bin/bash
# Stands in for nvcc under `cargo xtask kernels` on a machine without it: copies the PTX that
# xtask/device/ptx.sh compiled on the device machine (unpacked under $PTX_DIR) to the `-o` path.
set -e
arch=""; cu=""; out=""
while [ $# -gt 0 ]; do
  case "$1" in
    -arch=*) arch=${1#-arch=} ;;
    -o) out=$2; shift ;;
    *.cu) cu=$1 ;;
  esac
  shift
done
stem=$(basename "$cu" .cu)
suffix=""; case "$arch" in sm_90*) suffix=".sm90" ;; esac  # sm_90a too (ptx::SM90A_MODULES)
cp "$PTX_DIR/$stem$suffix.ptx" "$out"
