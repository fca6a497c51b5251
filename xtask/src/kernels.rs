//! `cargo xtask kernels`: compiles every `kernels/*.cu` with nvcc into PTX under
//! `crates/minnow-runtime/src/cuda/ptx/`, each file headed by the BLAKE3 hash of its source
//! (`ptx::kernel_source_hash`: the `.cu` file, then every `kernels/*.cuh`). The PTX is committed so users need no nvcc; a
//! minnow-runtime test fails when a source and its PTX disagree.
//!
//! Environment: `NVCC` (default `nvcc`), `NVCC_FLAGS` (extra flags, whitespace separated, e.g.
//! `-I/opt/cuda13/include/cccl` for a pip-installed nvcc). Each source becomes two PTX files
//! (see `ARCHS`): `<name>.ptx` for sm_80 and `<name>.sm90.ptx` for sm_90; the driver JIT-compiles
//! the one the GPU loads.
//!
//! Adding a kernel file: xtask links minnow-runtime, which embeds every PTX with `include_str!`,
//! so create the new `ptx/<name>.ptx` and `ptx/<name>.sm90.ptx` empty and declare the module in
//! the kernel table (`crates/minnow-runtime/src/cuda/kernels.rs`) before running this task.

use std::path::PathBuf;
use std::process::Command;

const PTX_DIR: &str = "crates/minnow-runtime/src/cuda/ptx";
const HASH_LINE_PREFIX: &str = "// minnow-kernel-source-blake3: ";
/// (nvcc target, file suffix): sm_80 PTX runs on every supported GPU (the driver JIT-compiles it
/// for newer ones); the sm_90 build adds Hopper's programmatic-dependent-launch instructions
/// (`pdl_enter` in kernels/common.cuh) and is what sm_90+ GPUs load.
const ARCHS: [(&str, &str); 2] = [("sm_80", ""), ("sm_90", ".sm90")];

/// The nvcc target of a module's `.sm90` build: `sm_90a` for the modules that use Hopper's
/// arch-specific instructions (wgmma; the runtime loads them only on compute capability 9.0),
/// else `arch`.
fn target(stem: &str, arch: &'static str) -> &'static str {
    if arch == "sm_90" && minnow_runtime::cuda::ptx::SM90A_MODULES.contains(&stem) {
        "sm_90a"
    } else {
        arch
    }
}

/// The workspace root: the nearest ancestor of the current directory holding `kernels/`.
pub(crate) fn workspace_root() -> Result<PathBuf, String> {
    let mut dir = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    loop {
        if dir.join("kernels/common.cuh").is_file() {
            return Ok(dir);
        }
        if !dir.pop() {
            return Err(
                "run from inside the minnow repository (no kernels/common.cuh found)".into(),
            );
        }
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let check_only = args.iter().any(|a| a == "--check");
    let root = workspace_root()?;
    let mut sources: Vec<PathBuf> = std::fs::read_dir(root.join("kernels"))
        .map_err(|e| format!("kernels/: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let extra: Vec<String> = std::env::var("NVCC_FLAGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    let mut stale = Vec::new();
    for cu in &sources {
        let stem = cu.file_stem().unwrap().to_string_lossy().to_string();
        let hash = minnow_runtime::cuda::ptx::kernel_source_hash(&root.join("kernels"), &stem)?;
        for (arch, suffix) in ARCHS {
            let arch = target(&stem, arch);
            let out = root.join(PTX_DIR).join(format!("{stem}{suffix}.ptx"));
            if check_only {
                let current = std::fs::read_to_string(&out).unwrap_or_default();
                let recorded = current
                    .lines()
                    .next()
                    .and_then(|l| l.strip_prefix(HASH_LINE_PREFIX));
                if recorded.map(str::trim) != Some(hash.as_str()) {
                    stale.push(format!("{stem}{suffix}"));
                }
                continue;
            }
            let tmp = std::env::temp_dir()
                .join(format!("minnow-{stem}{suffix}-{}.ptx", std::process::id()));
            let status = Command::new(&nvcc)
                .arg("-ptx")
                .arg(format!("-arch={arch}"))
                .arg("-std=c++17")
                .args(&extra)
                .arg(cu)
                .arg("-o")
                .arg(&tmp)
                .status()
                .map_err(|e| format!("running {nvcc}: {e} (set NVCC to the compiler's path)"))?;
            if !status.success() {
                return Err(format!("{nvcc} failed on {} for {arch}", cu.display()));
            }
            let ptx =
                std::fs::read_to_string(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
            let _ = std::fs::remove_file(&tmp);
            std::fs::create_dir_all(out.parent().unwrap())
                .map_err(|e| format!("{PTX_DIR}: {e}"))?;
            std::fs::write(&out, format!("{HASH_LINE_PREFIX}{hash}\n{ptx}"))
                .map_err(|e| format!("{}: {e}", out.display()))?;
            println!(
                "kernels/{stem}.cu -> {PTX_DIR}/{stem}{suffix}.ptx ({arch}, {} bytes)",
                ptx.len()
            );
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "stale PTX (run `cargo xtask kernels`): {}",
            stale.join(", ")
        ));
    }
    Ok(())
}
