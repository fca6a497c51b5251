#!/usr/bin/env bash
# LLaDA2.2-flash from a file on one GPU (issue 21, item 6) and the GPU load rate of a full-size
# mini `.mnw` (item 8), in one device-machine call:
#   1. `xtask make-checkpoint --preset flash --layers 8 --experts int4 --out FILE.mnw`: the
#      flash-width file (15.2 GB) written directly, no BF16 checkpoint first; `minnow validate`;
#      `minnow serve --model FILE --device cuda` on a loopback port, one chat completion
#      (max_tokens 32) once /health says ready, the load line of the log (bytes per encoding,
#      wall time, GB/s); the server stopped and the file deleted;
#   2. the same for a full-size `mini` INT4 file (9.8 GB), loaded twice: the first time after
#      dropping the page cache where the machine allows it (else it is warm from the writing),
#      the second from the page cache.
# The weights are random, so the answer is noise (and ids past the fixtures' 493-token
# tokenizer decode to no text): what counts is that the request is answered.
#
# Usage, from the repository root, with the binaries minnow and xtask (any profile, stripped or not)
# in ./bin (or BIN=...):
#   OUT=/some/dir bash scripts/device/flash_int4_file.sh
# Results go to $OUT/flash_int4.txt step by step (a run cut short keeps what it measured), the
# servers' logs to $OUT/serve-*.log. Scratch: $MNW_WORK (default ./flash_int4_work, removed at
# the end). Options (environment): DEVICE (default cuda), EXPERTS (int4), FAMILY (2.2), LAYERS
# (8), FLASH_PRESET (flash), MINI_PRESET (mini; empty: skip part 2), PORT (18431), READY_S (300),
# DROP_CACHE (1; 0 keeps the page cache, e.g. on a shared machine).
# A dry run of the CPU side at small sizes (no GPU):
#   DEVICE=cpu FLASH_PRESET=tiny MINI_PRESET=tiny DROP_CACHE=0 OUT=/tmp/x \
#     bash scripts/device/flash_int4_file.sh
# Time: made for ~400 s on the 16-core device machine (not yet measured there).

set -euo pipefail

BIN=${BIN:-./bin}
OUT=${OUT:?set OUT to the directory for flash_int4.txt}
WORK=${MNW_WORK:-$PWD/flash_int4_work}
DEVICE=${DEVICE:-cuda}
EXPERTS=${EXPERTS:-int4}
FAMILY=${FAMILY:-2.2}
LAYERS=${LAYERS:-8}
FLASH_PRESET=${FLASH_PRESET-flash}
MINI_PRESET=${MINI_PRESET-mini}
PORT=${PORT:-18431}
READY_S=${READY_S:-300}
REPORT=$OUT/flash_int4.txt
mkdir -p "$OUT"
: >"$REPORT"

for exe in minnow xtask; do
  [[ -x $BIN/$exe ]] || { echo "missing $BIN/$exe (build it and copy it there)" >&2; exit 1; }
done
server=
cleanup() {
  if [[ -n $server ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
rm -rf "$WORK"
mkdir -p "$WORK"

say() { echo "$*" | tee -a "$REPORT"; }
# HTTP without assuming curl: status of a GET, body of a JSON POST.
http_status() {
  if command -v curl >/dev/null; then
    curl -s -o /dev/null -w '%{http_code}' "$1" || true
  else
    python3 -c 'import sys, urllib.request
try: print(urllib.request.urlopen(sys.argv[1], timeout=2).status)
except Exception: print(0)' "$1"
  fi
}
post_json() {
  if command -v curl >/dev/null; then
    curl -s -m 120 "$1" -H 'content-type: application/json' -d "$2" || true
  else
    python3 -c 'import sys, urllib.request
r = urllib.request.Request(sys.argv[1], sys.argv[2].encode(), {"content-type": "application/json"})
try: print(urllib.request.urlopen(r, timeout=120).read().decode())
except Exception as e: print(e)' "$1" "$2"
  fi
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

# make_file FILE PRESET [extra args]: writes the .mnw directly and reports size, wall time and
# rate.
make_file() {
  local file=$1 preset=$2 t0
  shift 2
  t0=$(now)
  "$BIN/xtask" make-checkpoint --out "$file" --preset "$preset" --family "$FAMILY" \
    --experts "$EXPERTS" "$@" 2>&1 | tee -a "$REPORT" | tail -n 3
  local wall bytes
  wall=$(since "$t0")
  bytes=$(stat -c %s "$file")
  say "make $preset $*: $(awk -v b="$bytes" 'BEGIN {printf "%.2f GB", b / 1e9}') in ${wall} s = $(awk -v b="$bytes" -v t="$wall" 'BEGIN {printf "%.2f GB/s", b / t / 1e9}') (generated, written, synced and verified; disk free now $(df -h --output=avail "$WORK" | tail -n 1 | tr -d ' '))"
}

validate() {
  local t0
  t0=$(now)
  "$BIN/minnow" validate "$1" 2>&1 | tee -a "$REPORT" | tail -n 3
  # (a failure has stopped the script above: pipefail)
  say "validate $(basename "$1"): ok in $(since "$t0") s"
}

# serve FILE LABEL ASK: starts the server, waits for readiness, records the load line, asks one
# chat completion when ASK is 1, stops the server.
serve() {
  local file=$1 label=$2 ask=$3 log=$OUT/serve-$2.log t0 code
  t0=$(now)
  "$BIN/minnow" serve --model "$file" --device "$DEVICE" --listen "127.0.0.1:$PORT" 2>"$log" >/dev/null &
  server=$!
  while :; do
    code=$(http_status "http://127.0.0.1:$PORT/health")
    [[ $code == 200 ]] && break
    if ! kill -0 "$server" 2>/dev/null; then
      say "$label: the server exited while loading:"; tail -n 5 "$log" | tee -a "$REPORT"; server=; return 1
    fi
    if (( $(awk -v a="$t0" -v b="$(now)" -v m="$READY_S" 'BEGIN {print (b - a > m)}') )); then
      say "$label: not ready after $READY_S s:"; tail -n 5 "$log" | tee -a "$REPORT"; return 1
    fi
    sleep 0.2
  done
  say "$label: ready after $(since "$t0") s (process start to /health 200)"
  grep -E "loaded .* GB/s|mapped .* GB/s|weights on" "$log" | sed 's/^/  | /' | tee -a "$REPORT"
  if [[ $ask == 1 ]]; then
    t0=$(now)
    post_json "http://127.0.0.1:$PORT/v1/chat/completions" \
      '{"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 32, "temperature": 0}' \
      >"$WORK/answer.json"
    say "$label: chat completion in $(since "$t0") s: $(head -c 1500 "$WORK/answer.json")"
    grep -q '"finish_reason"' "$WORK/answer.json" || { say "$label: no answer"; return 1; }
  fi
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=
}

drop_cache() {
  sync
  if [[ ${DROP_CACHE:-1} != 1 ]]; then
    echo "page cache kept (DROP_CACHE=0): warm from the writing"
  elif echo 1 >/proc/sys/vm/drop_caches 2>/dev/null; then
    echo "page cache dropped"
  else
    echo "page cache not dropped (no permission): warm from the writing"
  fi
}

say "== flash INT4 from a file, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; memory $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); disk free at $WORK: $(df -h --output=avail "$WORK" | tail -n 1 | tr -d ' ')"
command -v nvidia-smi >/dev/null && say "gpu: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1)"

if [[ -n $FLASH_PRESET ]]; then
  flash=$WORK/flash-$LAYERS-$EXPERTS.mnw
  make_file "$flash" "$FLASH_PRESET" --layers "$LAYERS"
  validate "$flash"
  serve "$flash" "flash-$LAYERS-$EXPERTS" 1
  rm -f "$flash"
fi

if [[ -n $MINI_PRESET ]]; then
  mini=$WORK/mini-$EXPERTS.mnw
  make_file "$mini" "$MINI_PRESET"
  say "mini first load: $(drop_cache)"
  serve "$mini" "mini-$EXPERTS-first" 0
  serve "$mini" "mini-$EXPERTS-cached" 0
  rm -f "$mini"
fi
say "== done"
