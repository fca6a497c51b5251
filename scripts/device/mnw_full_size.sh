#!/usr/bin/env bash
# Full-size .mnw conversion, measured on the machine's CPU and disk (no GPU is used):
# `make-checkpoint --preset mini` (random BF16 weights at the real LLaDA2.x-mini shapes,
# ~32.5 GB), then `minnow convert` to int8, int4, nvfp4 and fp8 and `minnow validate` of each
# output: wall time, peak RSS, output size, output rate. Each output is deleted once measured
# (the source plus the largest output, int8, need ~50 GB of disk).
#
# Usage, from the repository root, with release binaries in ./bin (or BIN=...):
#   cargo build --release -p minnow-server -p xtask && mkdir -p bin &&
#   cp target/release/minnow target/release/xtask bin/
#   OUT=/some/dir bash scripts/device/mnw_full_size.sh
# Results are appended to $OUT/mnw.txt step by step, so a run cut short keeps what it measured.
# Scratch space: $MNW_WORK (default ./mnw_full_work, removed at the end).

set -euo pipefail

BIN=${BIN:-./bin}
OUT=${OUT:?set OUT to the directory for mnw.txt}
WORK=${MNW_WORK:-$PWD/mnw_full_work}
FIXTURE=tests/fixtures/llada2-tiny-v21
REPORT=$OUT/mnw.txt
mkdir -p "$OUT"
: >"$REPORT"

for exe in minnow xtask; do
  [[ -x $BIN/$exe ]] || { echo "missing $BIN/$exe (build with --release and copy it there)" >&2; exit 1; }
done
rm -rf "$WORK"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT

say() { echo "$*" | tee -a "$REPORT"; }

# measure LABEL CMD...: runs CMD, appends its last output lines, wall time and peak RSS to the
# report, and prints "wall_s rss_mib" (or FAILED). Peak RSS is the process's VmHWM (mapped file
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
print(f"{wall:.3f} {hwm / 1024:.0f}" if child.returncode == 0 else "FAILED")
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
    if [[ $rc == 0 ]]; then awk -v s="$start" -v e="$end" -v h="$hwm" 'BEGIN {printf "%.3f %.0f\n", e - s, h / 1024}'; else echo FAILED; fi
  fi
}

# run_measured VAR_PREFIX LABEL CMD...: measure, stopping the script if the command failed.
run_measured() {
  local prefix=$1 result
  shift
  result=$(measure "$@")
  [[ $result != FAILED ]] || { say "stopping: $2 failed"; exit 1; }
  read -r "${prefix}_wall" "${prefix}_rss" <<<"$result"
}

say "== mnw full-size conversion, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
say "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); disk free at $WORK: $(df -h --output=avail "$WORK" | tail -n 1 | tr -d ' ')"
say "note: the source is read warm from the page cache (it was just written); each output is written and fsynced to disk"

SRC=$WORK/mini
run_measured make "make-checkpoint --preset mini" "$BIN/xtask" make-checkpoint --out "$SRC" --preset mini
# make-checkpoint writes config and weights only; convert needs the tokenizer and a chat template
# (the v2.1 fixture's tokenizer_config.json carries one).
cp "$FIXTURE/tokenizer.json" "$FIXTURE/tokenizer_config.json" "$SRC/"
say "source: $(du -sb "$SRC" | cut -f1) bytes in $(ls "$SRC"/*.safetensors | wc -l) shards"

for experts in int8 int4 nvfp4 fp8; do
  file=$WORK/mini-$experts.mnw
  run_measured conv "convert --experts $experts" "$BIN/minnow" --model "$SRC" convert "$file" --experts "$experts"
  wall=$conv_wall rss=$conv_rss
  bytes=$(stat -c %s "$file")
  say "$experts: output $bytes bytes ($(awk -v b="$bytes" 'BEGIN {printf "%.2f GiB", b / 2^30}')), wall ${wall} s, peak RSS ${rss} MiB, $(awk -v b="$bytes" -v t="$wall" 'BEGIN {printf "%.0f MB/s", b / t / 1e6}') of output"
  run_measured val "validate mini-$experts.mnw" "$BIN/minnow" validate "$file"
  vwall=$val_wall vrss=$val_rss
  say "$experts: validate wall ${vwall} s, peak RSS ${vrss} MiB, $(awk -v b="$bytes" -v t="$vwall" 'BEGIN {printf "%.0f MB/s", b / t / 1e6}')"
  rm -f "$file"
done
say "== done"
