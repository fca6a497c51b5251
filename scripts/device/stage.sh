#!/usr/bin/env bash
# Copies the GPU binaries of a workspace build into ./bin (stripped; ignored by git) for
# scripts/device/gpu_check.sh: xtask, minnow (for the HTTP checks), the ignored GPU test binaries and the CPU batch-invariance
# tests (bin/cpu-*, run on the device machine's CPU: an Intel host with AVX-512). Builds the whole workspace
# (one feature resolution for every crate, so no dependency is rebuilt for a subset).
#   bash scripts/device/stage.sh [debug|release]
set -euo pipefail
profile=${1:-release}
flag=$([ "$profile" = release ] && echo --release || true)
rm -rf bin && mkdir -p bin
cargo build $flag --workspace --all-targets
cp target/$profile/xtask bin/xtask
cp target/$profile/minnow bin/minnow
cargo test $flag --workspace --no-run --message-format=json 2>/dev/null | python3 -c '
import json, shutil, sys
wanted = {"cuda_invariance", "cuda_fixtures", "cuda_quant", "cuda_other_shapes", "cuda_kernels", "gpu_invariance",
          "batched", "portable_cpu", "golden", "cuda_blaslt", "cuda_routing", "gpu_draws"}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in wanted and m["target"]["kind"] == ["test"]:
        kind = "test" if m["target"]["name"].startswith(("cuda", "gpu")) else "cpu"
        shutil.copy(m["executable"], "bin/" + kind + "-" + m["target"]["name"])
'
strip bin/*
ls bin; du -sh bin
