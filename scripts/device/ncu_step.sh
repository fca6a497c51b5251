#!/usr/bin/env bash
# One device call: Nsight Compute over one forward of the bench's (a refinement, or a batched step
# of N requests with N=...), one line per kernel launch: its time, registers, what limits its
# resident CTAs, waves per SM and achieved occupancy. Only metrics that need no kernel replay,
# so the profiler saves no device memory (session 29's section sets needed replays: out of
# memory with the default K/V pool, then no kernel profiled in 300 s), and without programmatic
# dependent launch (MINNOW_PDL=0), whose overlap a kernel-by-kernel profile cannot show anyway.
#   Stage first (scripts/device/stage.sh), carry ["out/bin.tar.xz"]. Env: N (default 64; 1: the
#   refinement at a 1,024 prefix), EXPERTS (default bf16), NCU_LIMIT (seconds, default 500).
exec > >(tee "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
set -u
source scripts/device/suites.sh
device_prelude
N=${N:-64}
M=gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__occupancy_limit_blocks,launch__waves_per_multiprocessor,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active
MINNOW_PDL=0 timeout "${NCU_LIMIT:-500}" ncu --profile-from-start off --metrics $M --csv --page raw --print-units base \
  bin/xtask bench --quick --experts "${EXPERTS:-bf16}" --profile-one --prefix 1024 --concurrency "$N" > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu.csv")"
tail -5 "$OUT/ncu.err"
# Per kernel name: launches, total time, registers, occupancy limits, achieved occupancy.
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no rows")
head = rows[0]; col = {h: i for i, h in enumerate(head)}
agg = collections.OrderedDict()
for r in rows[2:]:
    try: t = float(r[col["gpu__time_duration.sum"]].replace(",", ""))
    except (ValueError, KeyError): continue
    k = r[col["Kernel Name"]]
    a = agg.setdefault(k, [0, 0.0, r])
    a[0] += 1; a[1] += t
for k, (n, t, r) in sorted(agg.items(), key=lambda x: -x[1][1]):
    g = lambda m: r[col[m]] if m in col else "?"
    print(f"{t/1e3:9.1f} us {n:4d}x {k[:40]:40s} regs {g('launch__registers_per_thread'):>4} "
          f"lim(reg {g('launch__occupancy_limit_registers')}, smem {g('launch__occupancy_limit_shared_mem')}, "
          f"blocks {g('launch__occupancy_limit_blocks')}) waves {g('launch__waves_per_multiprocessor')} "
          f"active {g('sm__warps_active.avg.pct_of_peak_sustained_active')} %")
PY
xz -T4 "$OUT/ncu.csv"
echo "end t=$SECONDS"
