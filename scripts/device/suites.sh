# Sourced by the one-call device scripts: run_suites runs the ignored GPU test binaries that
# stage.sh copied into bin/ (test-NAME), one test at a time, against whatever PTX the caller
# exported in MINNOW_PTX_DIR, each with the time left until SUITES_END seconds into the script
# (default 585), and prints their verdict lines (and each failure's message and seed);
# bench_table runs one bench, bench_labelled one under a label with an environment, bench_ab two
# binaries alternately; branch_ptx and candidate_ptx make a kernel candidate's PTX directory;
# device_prelude (at the end) is how each such script starts.
#   run_suites "cuda_kernels cuda_quant ..."    (KERNEL_FILTER: a name filter for cuda_kernels)
run_suites() {
  local t left filter
  for t in $1; do
    left=$((${SUITES_END:-585} - SECONDS)); [ $left -lt 15 ] && { echo "skip $t (time)"; continue; }
    echo "-- $t t=$SECONDS"
    filter=$([ "$t" = cuda_kernels ] && echo "${KERNEL_FILTER:-}")
    # A failure's message is the line after "panicked at"; its seed line replays its inputs.
    timeout $left bin/test-$t --ignored --test-threads 1 $filter 2>&1 | awk '/^test .*(FAILED|ok)$|test result|replay with/ {print} /panicked/ {print; getline; print}' | tail -25
  done
}

# One bench run of the standard shapes (prefill 4,096, refinement over a 1,024 prefix, x16 and
# x64) with experts in ENCODING and the given environment assignments; prints its table rows
# (and those starting with ROWS, a regex: e.g. decode for the decodes and their aggregate rates).
#   bench_table int4 MINNOW_PTX_DIR=/tmp/x MINNOW_CODES32_BELOW=64
bench_table() {
  local enc=$1
  shift
  env "$@" timeout 60 bin/xtask bench --experts "$enc" --quick --prefill 4096 --prefix 1024 --concurrency 16,64 2>&1 |
    grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0${ROWS:+|$ROWS})"
}

# One bench run under "== LABEL ENCODING" with experts in ENCODING and the given environment
# assignments (e.g. MINNOW_PTX_DIR=DIR for a candidate's kernels), skipped once BENCH_END seconds
# (default 560) of the script have passed; prints the table rows (and those matching ROWS, a
# regex) and the stage profiles.
#   bench_labelled tree bf16; bench_labelled new int4 MINNOW_PTX_DIR=/tmp/x
bench_labelled() {
  local label=$1 enc=$2
  shift 2
  [ $SECONDS -gt "${BENCH_END:-560}" ] && { echo "skip $label $enc (time)"; return; }
  echo "== $label $enc t=$SECONDS"
  env "$@" timeout 80 bin/xtask bench --experts "$enc" --quick --prefill 4096 --prefix 1024 --concurrency 16,64 2>&1 |
    grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0${ROWS:+|$ROWS})|^profile"
}

# A PTX directory for a kernel candidate carried as out/NAME_ptx.tar.xz (its modules' PTX
# files, built on the development host): the tree's PTX with the candidate's files over it.
# Warns when a carried file is the tree's.
#   candidate_ptx attn_diet /tmp/attn_ptx
candidate_ptx() {
  local name=$1 dir=$2 f
  mkdir -p "$dir" && cp "$T"/*.ptx "$dir"/ && tar xJf "out/${name}_ptx.tar.xz" -C "$dir"
  for f in $(tar tJf "out/${name}_ptx.tar.xz"); do
    cmp -s "$dir/$f" "$T/$f" && echo "!! $name: $f is the tree's"
  done
}

# Two xtask binaries benched alternately, round after round, each encoding of ENCS (default
# "bf16 int4") with the same arguments, under "== LABEL ENCODING round N" lines; prints the table
# rows and the lines matching EXTRA (a regex: e.g. ^profile for the stage profiles, ^decode for
# the decodes' digests).
#   ROUNDS=2 EXTRA='^profile' bench_ab old bin/xtask-old new bin/xtask --quick --prefill 4096 ...
bench_ab() {
  local a=$1 abin=$2 b=$3 bbin=$4 round enc side
  shift 4
  for round in $(seq "${ROUNDS:-2}"); do
    for enc in ${ENCS:-bf16 int4}; do
      for side in "$a $abin" "$b $bbin"; do
        echo "== ${side%% *} $enc round $round t=$SECONDS"
        timeout 80 ${side#* } bench --experts "$enc" "$@" 2>&1 |
          grep -E "^\| (prefill|refinement 32 tokens @ 1024 prefix \(graph, top-1|batched|request 0|decode)${EXTRA:+|$EXTRA}"
      done
    done
  done
}

# Nsight Compute's full section set on the first COUNT launches of kernels matching REGEX in one
# bench forward (`--profile-one`: the refinement for N = 1, else a batched step of N requests),
# PDL off, at most LIMIT seconds; the whole report goes to $OUT/NAME.txt and its throughput,
# occupancy and spill lines are printed. Extra arguments: environment assignments.
#   ncu_kernel NAME REGEX N COUNT ENCODING LIMIT [VAR=VALUE ...]
ncu_kernel() {
  local name=$1 regex=$2 n=$3 count=$4 enc=$5 limit=$6
  shift 6
  echo "== ncu $name ($regex, N=$n) t=$SECONDS"
  env "$@" MINNOW_PDL=0 timeout "$limit" ncu --profile-from-start off -k "regex:$regex" -c "$count" \
    --set full --print-units base bin/xtask bench --quick --experts "$enc" --profile-one \
    --prefix 1024 --concurrency "$n" > "$OUT/$name.txt" 2>&1
  echo "rc=$?"
  grep -E "^  [a-z_0-9]+ \(|^\s+(Duration|Registers Per Thread|Achieved Occupancy|Warp Cycles Per Issued Instruction|Issue Slots Busy|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Local Memory Spilling Requests|Block Limit Registers|Block Limit Shared Mem) " \
    "$OUT/$name.txt" | awk '{$1=$1; print}'
}

# A PTX directory for a kernel branch: the tree's PTX with the branch's moe module, from
# out/NAME_ptx.tar.xz when it was carried (the branch's compiled PTX, hyphens as underscores),
# else compiled here from scripts/device/patches/NAME.patch (the branch's kernels/moe.cu against
# main's, kept in the tree so a candidate outlives its branch; sm_90 only, the module this card
# loads; ~40 s).
#   branch_ptx NAME /tmp/NAME_ptx
branch_ptx() {
  local name=$1 dir=$2 tarball=out/${1//-/_}_ptx.tar.xz
  mkdir -p "$dir" && cp "$T"/*.ptx "$dir"/
  if [ -f "$tarball" ]; then
    tar xJf "$tarball" -C "$dir"
  else
    # The patched source outside kernels/ (where xtask would take it for a module of its own).
    patch -s -o "$dir/moe_$name.cu" kernels/moe.cu "scripts/device/patches/$name.patch" &&
      nvcc -ptx -arch=sm_90 -std=c++17 -I kernels "$dir/moe_$name.cu" -o "$dir/moe.sm90.ptx" ||
      echo "!! $name: the patch did not build"
    echo "-- $name: moe.sm90.ptx compiled from its patch t=$SECONDS"
  fi
  cmp -s "$dir"/moe.sm90.ptx "$T/moe.sm90.ptx" && echo "!! $name: its moe PTX is the tree's"
}

# The start of a one-call script, run from the repository root: unpack the staged binaries
# (out/bin.tar.xz), let the test binaries find their fixtures through the path they were built
# at, put nvcc and ptxas on PATH, name the GPU, and set T to the tree's PTX directory.
device_prelude() {
  T=$PWD/crates/minnow-runtime/src/cuda/ptx
  tar xJf out/bin.tar.xz
  mkdir -p /work && ln -sfn "$PWD" /work/main
  export PATH=/usr/local/cuda/bin:$PATH
  nvidia-smi --query-gpu=name --format=csv,noheader
}
