//! The kernels of `kernels/*.cu`, compiled by `cargo xtask kernels` (nvcc; sm_80 PTX, and sm_90
//! PTX for Hopper and newer, or sm_90a for the modules of [`SM90A_MODULES`], which the driver
//! JIT-compiles for the device at load) and committed,
//! so users need no nvcc; the kernel table (`kernels.rs`) embeds them. Each PTX
//! file starts with a line naming the BLAKE3 hash of its source ([`kernel_source_hash`]: the
//! `.cu` file followed by every header of `kernels/`); a test fails when a source changed without regenerating its PTX, and
//! another when a kernel's parameters in the table differ from its PTX entry's.

use super::error::{CudaError, CudaResult};

/// Prefix of the first line of every generated PTX file; the hex hash follows.
pub const HASH_LINE_PREFIX: &str = "// minnow-kernel-source-blake3: ";

/// Modules whose Hopper build targets `sm_90a` (wgmma and other arch-specific instructions)
/// instead of `sm_90`: such PTX runs on compute capability 9.0 only, so other GPUs load the
/// module's portable build, whose kernels trap (their launchers check first).
pub const SM90A_MODULES: &[&str] = &["attention_wgmma", "expert_wgmma"];

/// Kernel developers' switch: with `MINNOW_PTX_DIR` set, modules load `<dir>/<name>.ptx` (or
/// `<name>.sm90.ptx`) from disk instead of the embedded text, so kernels compiled on a GPU
/// machine (`cargo xtask kernels` there) run with binaries built before them. Unset in normal
/// use; a missing file is an error, never a silent fallback.
pub fn override_text(name: &str, sm90: bool) -> CudaResult<Option<String>> {
    let Some(dir) = std::env::var_os("MINNOW_PTX_DIR") else {
        return Ok(None);
    };
    let path =
        std::path::Path::new(&dir).join(format!("{name}{}.ptx", if sm90 { ".sm90" } else { "" }));
    std::fs::read_to_string(&path)
        .map(Some)
        .map_err(|e| CudaError::Unsupported(format!("MINNOW_PTX_DIR: {}: {e}", path.display())))
}

/// The hash a PTX file of module `name` records: BLAKE3 over `kernels/<name>.cu` followed by
/// every `kernels/*.cuh` in name order (all of them, included or not, so no header edit can
/// leave a stale PTX behind). `cargo xtask kernels` writes it; a test checks it.
pub fn kernel_source_hash(kernels_dir: &std::path::Path, name: &str) -> Result<String, String> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let mut headers: Vec<std::path::PathBuf> = std::fs::read_dir(kernels_dir)
        .map_err(|e| format!("{}: {e}", kernels_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cuh"))
        .collect();
    headers.sort();
    let mut hasher = blake3::Hasher::new();
    hasher.update(&read(&kernels_dir.join(format!("{name}.cu")))?);
    for header in &headers {
        hasher.update(&read(header)?);
    }
    Ok(hasher.finalize().to_hex().to_string())
}

/// The hash recorded in a PTX file's first line, if it has one.
pub fn recorded_hash(ptx: &str) -> Option<&str> {
    ptx.lines()
        .next()?
        .strip_prefix(HASH_LINE_PREFIX)
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::super::kernels::{self, MODULES};
    use super::*;

    fn kernels_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels")
    }

    /// Runs in CI without a GPU: the committed PTX must have been generated from the committed
    /// sources (`cargo xtask kernels` regenerates it).
    #[test]
    fn committed_ptx_matches_kernel_sources() {
        for module in MODULES {
            let expected = kernel_source_hash(&kernels_dir(), module.name).unwrap();
            for (ptx, suffix) in [(module.ptx, ""), (module.ptx_sm90, ".sm90")] {
                assert_eq!(
                    recorded_hash(ptx),
                    Some(expected.as_str()),
                    "ptx/{}{suffix}.ptx is stale: run `cargo xtask kernels`",
                    module.name
                );
            }
        }
    }

    #[test]
    fn every_listed_function_is_in_its_ptx() {
        for module in MODULES {
            for f in module.functions {
                for ptx in [module.ptx, module.ptx_sm90] {
                    assert!(
                        ptx.contains(&format!(".entry {f}(")),
                        "{f} missing from the PTX of kernels/{}.cu",
                        module.name
                    );
                }
            }
        }
    }

    /// The parameters of the `.entry NAME(...)` of `ptx`: each one's type (`u64`, `u32`, `f32`).
    fn entry_params<'a>(ptx: &'a str, name: &str) -> Option<Vec<&'a str>> {
        let start = ptx.find(&format!(".entry {name}("))?;
        let body = &ptx[start..];
        let end = body.find(')')?;
        Some(
            body[..end]
                .lines()
                .filter_map(|line| line.trim().strip_prefix(".param ."))
                .map(|rest| rest.split_whitespace().next().unwrap_or(""))
                .collect(),
        )
    }

    /// Each kernel of the table takes the parameters its PTX entry declares, in number and in
    /// type, in both builds: the typed launchers pass exactly what the kernel reads.
    #[test]
    fn table_parameters_match_the_ptx_entries() {
        let families = [
            kernels::elementwise::PARAMS,
            kernels::rope::PARAMS,
            kernels::attention::PARAMS,
            kernels::attention_wgmma::PARAMS,
            kernels::router::PARAMS,
            kernels::pool_gemm::PARAMS,
            kernels::expert_wgmma::PARAMS,
            kernels::moe::PARAMS,
            kernels::sample::PARAMS,
        ];
        assert_eq!(families.len(), MODULES.len());
        for (module, families) in MODULES.iter().zip(families) {
            let declared: usize = families.iter().map(|(names, _)| names.len()).sum();
            assert_eq!(declared, module.functions.len(), "{}", module.name);
            for (names, params) in families {
                for name in *names {
                    for ptx in [module.ptx, module.ptx_sm90] {
                        let found = entry_params(ptx, name)
                            .unwrap_or_else(|| panic!("{name} missing from {}", module.name));
                        assert_eq!(
                            &found, params,
                            "parameters of {name} (kernels/{}.cu)",
                            module.name
                        );
                    }
                }
            }
        }
    }

    /// The arch-specific modules' Hopper PTX was built for sm_90a and every other module's for
    /// sm_90: the loader's choice of build (`Gpu::load_module`) relies on it.
    #[test]
    fn hopper_builds_target_what_the_loader_expects() {
        for module in MODULES {
            let want = if SM90A_MODULES.contains(&module.name) {
                ".target sm_90a"
            } else {
                ".target sm_90"
            };
            let target = module
                .ptx_sm90
                .lines()
                .find(|l| l.starts_with(".target"))
                .unwrap_or_else(|| panic!("no .target in ptx/{}.sm90.ptx", module.name));
            assert_eq!(target.trim(), want, "ptx/{}.sm90.ptx", module.name);
        }
    }

    /// The parser above reads what nvcc writes.
    #[test]
    fn entry_params_reads_a_ptx_entry() {
        let ptx = ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .u32 k_param_1,\n\t.param .f32 k_param_2\n)\n{";
        assert_eq!(entry_params(ptx, "k"), Some(vec!["u64", "u32", "f32"]));
        assert_eq!(entry_params(ptx, "other"), None);
    }
}
