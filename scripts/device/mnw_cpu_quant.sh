#!/usr/bin/env bash
# CPU forwards from quantized experts against BF16, on the mini-2layer checkpoint (real mini
# shapes, one MoE layer): `xtask bench-cpu` (full forward over 1,056 tokens, 32-token refinement
# over a cached 1,024) on the BF16 directory and on int8 and int4 `.mnw` conversions of it,
# interleaved over two rounds so that drift on the host shows. No GPU is used.
#
# Usage, from the repository root, with release binaries in ./bin (or BIN=...):
#   OUT=/some/dir bash scripts/device/mnw_cpu_quant.sh
# Results are appended to $OUT/mnw_cpu.txt as they come. Scratch: $MNW_WORK (removed at the end).
# THREADS=N limits the threads (default: all cores).

set -euo pipefail

BIN=${BIN:-./bin}
OUT=${OUT:?set OUT to the directory for mnw_cpu.txt}
WORK=${MNW_WORK:-$PWD/mnw_cpu_work}
FIXTURE=tests/fixtures/llada2-tiny-v21
REPORT=$OUT/mnw_cpu.txt
mkdir -p "$OUT"
: >"$REPORT"
for exe in minnow xtask; do
  [[ -x $BIN/$exe ]] || { echo "missing $BIN/$exe" >&2; exit 1; }
done
rm -rf "$WORK"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
[[ -n ${THREADS:-} ]] && export RAYON_NUM_THREADS=$THREADS

say() { echo "$*" | tee -a "$REPORT"; }
say "== quantized CPU forwards, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores, flags: $(grep -m1 -o -w 'avx512f\|avx512_vnni\|avx2\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"

SRC=$WORK/mini-2layer
"$BIN/xtask" make-checkpoint --out "$SRC" --preset mini-2layer >>"$REPORT" 2>&1
cp "$FIXTURE/tokenizer.json" "$FIXTURE/tokenizer_config.json" "$SRC/"
for experts in int8 int4; do
  "$BIN/minnow" --model "$SRC" convert "$WORK/$experts.mnw" --experts "$experts" >>"$REPORT" 2>&1
done

for round in 1 2; do
  for model in "$SRC" "$WORK/int8.mnw" "$WORK/int4.mnw"; do
    say "-- round $round: $(basename "$model")"
    "$BIN/xtask" bench-cpu --model "$model" --reps 2 2>>"$WORK/bench.log" | tee -a "$REPORT"
  done
done
say "== done"
