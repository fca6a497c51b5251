#!/usr/bin/env bash
# Full-size .mnw conversion, measured on the machine's CPU and disk (no GPU is used):
# `make-checkpoint --preset mini` (random BF16 weights at the real LLaDA2.x-mini shapes,
# ~32.5 GB), then `minnow convert` to int8, int4, nvfp4 and fp8 and `minnow validate` of each
# output: output size, convert wall time, output rate, peak RSS, validate wall time, one
# markdown table row per encoding. Each output's size is recorded and the output deleted once
# validated (the source plus the largest output, int8 or fp8, need ~51 GB of disk).
#
# Before the conversions the source is flushed to the disk (`sync`, timed) so that its writeback
# does not compete with theirs, and the disk's own write rate is measured (2 GiB of the source
# copied with O_DIRECT): an output rate can only be read against that rate, since every output
# is synced before the converter publishes it.
#
# Usage, from the repository root, with the binaries minnow and xtask (any profile, stripped or
# not; no Rust or network needed) in ./bin (or BIN=...):
#   OUT=/some/dir bash scripts/device/mnw_full_size.sh
# Options (environment): ENCODINGS="int8 ..." (default all four), PRESET (default mini),
# WORKERS=N (convert workers; default the converter's own, every core).
# Results are appended to $OUT/mnw.txt step by step, so a run cut short keeps what it measured;
# the table is printed at the end (and each row as soon as it is known).
# Scratch space: $MNW_WORK (default ./mnw_full_work, removed at the end).
# Time on the 16-core device machine: ~110 s for int8 and nvfp4 (make-checkpoint 26 s, each
# conversion 12-15 s, each validate ~1 s); all four fit one 10-minute call.

set -euo pipefail

BIN=${BIN:-./bin}
OUT=${OUT:?set OUT to the directory for mnw.txt}
WORK=${MNW_WORK:-$PWD/mnw_full_work}
PRESET=${PRESET:-mini}
ENCODINGS=${ENCODINGS:-int8 int4 nvfp4 fp8}
FIXTURE=tests/fixtures/llada2-tiny-v21
REPORT=$OUT/mnw.txt
mkdir -p "$OUT"
: >"$REPORT"

for exe in minnow xtask; do
  [[ -x $BIN/$exe ]] || { echo "missing $BIN/$exe (build it and copy it there)" >&2; exit 1; }
done
rm -rf "$WORK"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT

say() { echo "$*" | tee -a "$REPORT"; }

# measure LABEL CMD...: runs CMD, appends its last output lines, wall time and peak RSS to the
# report, and prints "wall_s rss_mib exit_status". Peak RSS is the process's VmHWM (mapped file
# pages included) sampled from /proc every 50 ms (it only grows, so the last sample is within
# 50 ms of the end), with the largest anonymous and file-backed parts seen.
measure() {
  local label=$1
  shift
  if command -v python3 >/dev/null; then
    python3 - "$REPORT" "$label" "$@" <<'PY'
import resource, subprocess, sys, time
report, label, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
start = time.monotonic()
child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
peak = {"VmHWM:": 0, "RssAnon:": 0, "RssFile:": 0}
def sample():
    try:
        with open(f"/proc/{child.pid}/status") as f:
            for line in f:
                key = line.split(maxsplit=1)[0] if line.strip() else ""
                if key in peak:
                    peak[key] = max(peak[key], int(line.split()[1]))
    except OSError:
        pass
while child.poll() is None:
    sample()
    time.sleep(0.05)
wall = time.monotonic() - start
out = child.stdout.read().decode(errors="replace")
# rusage's maxrss also counts the forked launcher before exec (a floor of its own size).
rusage = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
hwm = peak["VmHWM:"] or rusage
with open(report, "a") as r:
    for line in out.strip().splitlines()[-8:]:
        print(f"  | {line}", file=r)
    print(f"{label}: exit {child.returncode}, wall {wall:.1f} s, peak RSS {hwm / 1024:.0f} MiB "
          f"(VmHWM sampled every 50 ms; rusage maxrss {rusage / 1024:.0f} MiB; largest anon "
          f"{peak['RssAnon:'] / 1024:.0f} MiB, file-backed {peak['RssFile:'] / 1024:.0f} MiB)",
          file=r)
print(f"{wall:.3f} {hwm / 1024:.0f} {child.returncode}")
PY
  else
    local log=$WORK/measure.log start end hwm=0 anon=0 filed=0 v pid rc=0
    start=$(date +%s.%N)
    "$@" >"$log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      v=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
      [[ -n $v && $v -gt $hwm ]] && hwm=$v
      v=$(awk '/^RssAnon:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
      [[ -n $v && $v -gt $anon ]] && anon=$v
      v=$(awk '/^RssFile:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
      [[ -n $v && $v -gt $filed ]] && filed=$v
      sleep 0.05
    done
    wait "$pid" || rc=$?
    end=$(date +%s.%N)
    {
      tail -n 8 "$log" | sed 's/^/  | /'
      awk -v l="$label" -v rc="$rc" -v s="$start" -v e="$end" -v h="$hwm" -v a="$anon" -v f="$filed" \
        'BEGIN {printf "%s: exit %d, wall %.1f s, peak RSS %.0f MiB (VmHWM sampled every 50 ms; largest anon %.0f MiB, file-backed %.0f MiB)\n", l, rc, e - s, h / 1024, a / 1024, f / 1024}'
    } >>"$REPORT" 2>&1
    awk -v s="$start" -v e="$end" -v h="$hwm" -v rc="$rc" 'BEGIN {printf "%.3f %.0f %d\n", e - s, h / 1024, rc}'
  fi
}

# run_measured VAR_PREFIX LABEL CMD...: measure, stopping the script if the command failed.
run_measured() {
  local prefix=$1 rc
  shift
  read -r "${prefix}_wall" "${prefix}_rss" rc <<<"$(measure "$@")"
  [[ $rc == 0 ]] || { say "stopping: $1 failed"; exit 1; }
}

# validate_measured FILE: run_measured for `minnow validate FILE`, into val_wall and val_rss.
# The source's tokenizer is the tiny fixture's (493 tokens: no full-size tokenizer ships with the
# repository), so validate's asset check, which runs after every byte has been checked, finds the
# mini config's mask token id missing from it. That problem alone is recorded, not a failure.
validate_measured() {
  local rc
  read -r val_wall val_rss rc <<<"$(measure "validate $(basename "$1")" "$BIN/minnow" validate "$1")"
  [[ $rc == 0 ]] && return
  if tail -n 3 "$REPORT" | grep -q '1 problem found' &&
    tail -n 3 "$REPORT" | grep -q 'tokenizer.json: the mask token id .* is not in the vocabulary'; then
    say "  (validate: every byte checked; the one problem is the tiny tokenizer's missing mask id, as expected)"
    return
  fi
  say "stopping: validate $(basename "$1") failed"
  exit 1
}

say "== mnw full-size conversion, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
say "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); disk free at $WORK: $(df -h --output=avail "$WORK" | tail -n 1 | tr -d ' ')"
say "note: the source is read warm from the page cache (it was just written); each output is written and synced to disk before it is verified and published"

SRC=$WORK/src
run_measured make "make-checkpoint --preset $PRESET" "$BIN/xtask" make-checkpoint --out "$SRC" --preset "$PRESET"
# make-checkpoint writes config and weights only; convert needs the tokenizer and a chat template
# (the v2.1 fixture's tokenizer_config.json carries one).
cp "$FIXTURE/tokenizer.json" "$FIXTURE/tokenizer_config.json" "$SRC/"
say "source: $(du -sb "$SRC" | cut -f1) bytes in $(ls "$SRC"/*.safetensors | wc -l) shards; make-checkpoint wall ${make_wall} s, peak RSS ${make_rss} MiB"

now() { date +%s.%N; }
dirty=$(awk '/^(Dirty|Writeback):/ {s += $2} END {printf "%.0f", s / 1024}' /proc/meminfo)
t0=$(now)
sync
say "sync after make-checkpoint: $(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f s", b - a}') (${dirty} MiB dirty or in writeback when it began)"
# The disk's sequential write rate, the bound of any synced output: 2 GiB (or the first shard, if
# smaller) copied from the page cache with O_DIRECT, so none of it waits in memory.
probe_src=$(ls "$SRC"/*.safetensors | head -n 1)
probe_mib=$(( $(stat -c %s "$probe_src") / 1048576 / 64 * 64 ))
(( probe_mib > 2048 )) && probe_mib=2048
if (( probe_mib >= 64 )); then
  t0=$(now)
  if dd if="$probe_src" of="$WORK/disk_probe" bs=64M count=$(( probe_mib / 64 )) iflag=fullblock oflag=direct conv=fsync status=none 2>>"$REPORT"; then
    say "disk write rate: $(awk -v a="$t0" -v b="$(now)" -v m="$probe_mib" 'BEGIN {printf "%.0f MB/s", m * 1048576 / (b - a) / 1e6}') (${probe_mib} MiB with O_DIRECT)"
  else
    say "disk write rate: not measured (dd with O_DIRECT failed)"
  fi
  rm -f "$WORK/disk_probe"
fi

workers=()
[[ -n ${WORKERS:-} ]] && workers=(--workers "$WORKERS")
rows=()
table_head="| experts | output | convert wall | output rate | peak RSS (VmHWM) | writing / disk wait / verifying (the converter's own) | validate wall |"
table_rule="| --- | --- | --- | --- | --- | --- | --- |"
for experts in $ENCODINGS; do
  file=$WORK/$experts.mnw
  run_measured conv "convert --experts $experts" "$BIN/minnow" --model "$SRC" convert "$file" --experts "$experts" "${workers[@]}"
  bytes=$(stat -c %s "$file")
  phases=$(grep 'waiting for the disk' "$REPORT" | tail -n 1 | sed 's/^ *| *//; s/ writing,/ \//; s/ waiting for the disk,/ \//; s/ verifying//')
  rate=$(awk -v b="$bytes" -v t="$conv_wall" 'BEGIN {printf "%.0f MB/s", b / t / 1e6}')
  size=$(awk -v b="$bytes" 'BEGIN {printf "%.2f GiB", b / 2^30}')
  say "$experts: output $bytes bytes ($size), wall ${conv_wall} s, peak RSS ${conv_rss} MiB, $rate of output"
  validate_measured "$file"
  say "$experts: validate wall ${val_wall} s, peak RSS ${val_rss} MiB"
  rm -f "$file"
  row=$(printf '| %s | %s | %.1f s | %s | %s MiB | %s | %.1f s |' "$experts" "$size" "$conv_wall" "$rate" "$conv_rss" "$phases" "$val_wall")
  rows+=("$row")
  say "$row"
done
say ""
say "$table_head"
say "$table_rule"
for row in "${rows[@]}"; do say "$row"; done
say "== done"
