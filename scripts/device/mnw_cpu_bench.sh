#!/usr/bin/env bash
# The CPU numbers of docs/performance.md on this machine (no GPU is used), as one compact table:
#
# 1. `xtask make-checkpoint --preset mini-2layer` (random BF16 weights at the real mini shapes,
#    2 layers, 2.8 GiB), then `minnow convert` of it to int8, int4, nvfp4 and fp8 experts:
#    wall time and output rate (bytes of output per second of wall time);
# 2. `xtask bench-cpu` (full forward over 1,056 tokens; 32-token refinement over 1,024 cached)
#    on the BF16 directory and the int8 and int4 files, interleaved over ROUNDS rounds so that
#    drift on the host shows in the table.
#
# Usage, from the repository root, with the release binaries minnow and xtask in ./bin (or BIN=...):
#   OUT=/some/dir bash scripts/device/mnw_cpu_bench.sh
# Options (environment): THREADS=N (rayon threads; default all cores), ROUNDS=N (default 2),
# REPS=N (full forwards per bench-cpu run, default 2), WORKERS=N (convert workers; default the
# converter's own), PRESET=mini (convert the full 20-layer mini instead, conversions only: the
# source takes ~6 minutes to write, so run it as its own call), ENCODINGS="int8 ..." (default all
# four), KEEP=1 (keep $MNW_WORK, and reuse a source already there, for a second call),
# BENCH_ARGS="--full 64 --prefix 32" (extra bench-cpu flags, for a quick check of the script).
# The log of every command goes to $OUT/mnw_cpu_bench.log; the table to stdout and
# $OUT/mnw_cpu_bench.txt.

set -euo pipefail

BIN=${BIN:-./bin}
OUT=${OUT:?set OUT to a directory for the results}
WORK=${MNW_WORK:-$PWD/mnw_cpu_bench_work}
PRESET=${PRESET:-mini-2layer}
ROUNDS=${ROUNDS:-2}
REPS=${REPS:-2}
ENCODINGS=${ENCODINGS:-int8 int4 nvfp4 fp8}
FIXTURE=tests/fixtures/llada2-tiny-v21
mkdir -p "$OUT"
LOG=$OUT/mnw_cpu_bench.log
TABLE=$OUT/mnw_cpu_bench.txt
: >"$LOG"
: >"$TABLE"
for exe in minnow xtask; do
  [[ -x $BIN/$exe ]] || { echo "missing $BIN/$exe" >&2; exit 1; }
done
mkdir -p "$WORK"
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$WORK"' EXIT
[[ -n ${THREADS:-} ]] && export RAYON_NUM_THREADS=$THREADS
workers_flag=()
[[ -n ${WORKERS:-} ]] && workers_flag=(--workers "$WORKERS")

row() { echo "$*" | tee -a "$TABLE"; }
now() { date +%s.%N; }

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
flags=$(grep -m1 -o -w 'avx512f\|avx512_vnni\|avx512_bf16\|avx2\|fma\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')
row "# mnw_cpu_bench $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
row "# cpu: $cpu; $(nproc) cores; flags: $flags; threads ${THREADS:-all}; preset $PRESET"

SRC=$WORK/$PRESET
if [[ ! -f $SRC/config.json ]]; then
  rm -rf "$SRC"
  t0=$(now)
  "$BIN/xtask" make-checkpoint --out "$SRC" --preset "$PRESET" >>"$LOG" 2>&1
  row "# make-checkpoint --preset $PRESET: $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f s", b - a}')"
fi
cp "$FIXTURE/tokenizer.json" "$FIXTURE/tokenizer_config.json" "$SRC/"
src_bytes=$(du -sbL "$SRC" | cut -f1)

row ""
row "| convert --experts | output | wall | output rate | source rate | validate wall |"
row "|---|---|---|---|---|---|"
for e in $ENCODINGS; do
  file=$WORK/$PRESET-$e.mnw
  rm -f "$file"
  t0=$(now)
  if "$BIN/minnow" --model "$SRC" convert "$file" --experts "$e" "${workers_flag[@]}" >>"$LOG" 2>&1; then
    t1=$(now)
    bytes=$(stat -c %s "$file")
    "$BIN/minnow" validate "$file" >>"$LOG" 2>&1 || echo "validate $file FAILED" >>"$LOG"
    t2=$(now)
    row "$(awk -v e="$e" -v b="$bytes" -v s="$src_bytes" -v a="$t0" -v z="$t1" -v v="$t2" 'BEGIN {
      t = z - a; printf "| %s | %.2f GiB | %.1f s | %.0f MB/s | %.0f MB/s | %.1f s |", e, b / 2^30, t, b / t / 1e6, s / t / 1e6, v - z }')"
  else
    row "| $e | FAILED (see the log) | | | | |"
  fi
  # Only mini-2layer's int8 and int4 are benchmarked below; every other output goes now (a
  # full-size source and two of its outputs would not fit a 64 GiB disk).
  [[ $PRESET == mini-2layer && ($e == int8 || $e == int4) ]] || rm -f "$file"
done

if [[ $PRESET == mini-2layer ]]; then
  row ""
  row "| round | model | full forward (median / min) | prefill, no logits | refinement, 32 tokens (median / min) |"
  row "|---|---|---|---|---|"
  for round in $(seq 1 "$ROUNDS"); do
    for model in "$SRC" "$WORK/$PRESET-int8.mnw" "$WORK/$PRESET-int4.mnw"; do
      [[ -e $model ]] || continue
      name=$(basename "$model")
      out=$("$BIN/xtask" bench-cpu --model "$model" --reps "$REPS" ${BENCH_ARGS:-} 2>>"$LOG") || { row "| $round | $name | FAILED | | |"; continue; }
      echo "$out" >>"$LOG"
      full=$(echo "$out" | grep '^| full forward' | sed -E 's/.*\| median ([0-9.]+ s), min ([0-9.]+ s).*/\1 \/ \2/')
      prefill=$(echo "$out" | grep '^| prefill' | sed -E 's/.*\| ([0-9.]+ s) \|$/\1/')
      refine=$(echo "$out" | grep '^| refinement' | sed -E 's/.*\| median ([0-9.]+ ms), min ([0-9.]+ ms).*/\1 \/ \2/')
      row "| $round | $name | $full | $prefill | $refine |"
    done
  done
fi
row ""
row "# done $(date -u +%FT%TZ)"
