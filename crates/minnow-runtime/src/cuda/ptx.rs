//! The kernels of `kernels/*.cu`, compiled by `cargo xtask kernels` (nvcc; sm_80 PTX, and sm_90
//! PTX for Hopper and newer, which the driver JIT-compiles for the device at load) and committed,
//! so users need no nvcc. Each PTX
//! file starts with a line naming the BLAKE3 hash of its source (the `.cu` file followed by
//! `kernels/common.cuh`); a test fails when a source changed without regenerating its PTX.

use super::error::{CudaError, CudaResult};

/// One compiled kernel file.
pub struct PtxModule {
    /// File stem under `kernels/` and `ptx/`.
    pub name: &'static str,
    /// sm_80 PTX: runs on every supported GPU.
    pub ptx: &'static str,
    /// sm_90 PTX of the same source: what Hopper and newer GPUs load (it holds the
    /// programmatic-dependent-launch instructions the sm_80 build leaves out).
    pub ptx_sm90: &'static str,
    /// The `extern "C"` entry points the backend looks up.
    pub functions: &'static [&'static str],
    /// Dynamic shared memory the module's kernels may ask for beyond the 48 KiB default
    /// (0: none do).
    pub max_dynamic_shared: u32,
}

/// Dynamic shared memory the router kernels may use: `route_block` holds the F32 scores of 2 x its
/// tokens x the experts (a routing block of 32 tokens over 256 experts; fewer tokens per CTA
/// when there are more experts); its static part is 12 KiB more.
pub const ROUTER_MAX_SHARED: u32 = 64 * 1024;

/// Prefix of the first line of every generated PTX file; the hex hash follows.
pub const HASH_LINE_PREFIX: &str = "// minnow-kernel-source-blake3: ";

pub const MODULES: &[PtxModule] = &[
    PtxModule {
        name: "elementwise",
        ptx: include_str!("ptx/elementwise.ptx"),
        ptx_sm90: include_str!("ptx/elementwise.sm90.ptx"),
        functions: &[
            "embed_rows",
            "add_rmsnorm",
            "silu_mul",
            "moe_combine",
            "moe_combine_add_rmsnorm",
            "bf16_to_f32",
            "top1_partial",
            "top1_finish",
            "fill_random_bf16",
        ],
        max_dynamic_shared: 0,
    },
    PtxModule {
        name: "rope",
        ptx: include_str!("ptx/rope.ptx"),
        ptx_sm90: include_str!("ptx/rope.sm90.ptx"),
        functions: &["qk_norm_rope"],
        max_dynamic_shared: 0,
    },
    PtxModule {
        name: "attention",
        ptx: include_str!("ptx/attention.ptx"),
        ptx_sm90: include_str!("ptx/attention.sm90.ptx"),
        functions: &[
            "attention_d16",
            "attention_d32",
            "attention_d64",
            "attention_d128",
            "attention_d256",
            "attention_fa_d64",
            "attention_fa_d128",
            "attention_combine",
        ],
        max_dynamic_shared: 200 * 1024,
    },
    PtxModule {
        name: "router",
        ptx: include_str!("ptx/router.ptx"),
        ptx_sm90: include_str!("ptx/router.sm90.ptx"),
        functions: &[
            "route_topk",
            "route_block",
            "moe_dispatch",
            "router_logits_f32w",
            "router_logits_bf16w",
            "router_logits_wide_f32w",
            "router_logits_wide_bf16w",
        ],
        max_dynamic_shared: ROUTER_MAX_SHARED,
    },
    PtxModule {
        name: "pool_gemm",
        ptx: include_str!("ptx/pool_gemm.ptx"),
        ptx_sm90: include_str!("ptx/pool_gemm.sm90.ptx"),
        functions: &[
            "pool_gemm_tma",
            "grouped_gemm_tma_r16",
            "grouped_gemm_tma_r64",
        ],
        max_dynamic_shared: 216 * 1024,
    },
    PtxModule {
        name: "moe",
        ptx: include_str!("ptx/moe.ptx"),
        ptx_sm90: include_str!("ptx/moe.sm90.ptx"),
        functions: &[
            "grouped_gemm_m16",
            "grouped_gemm_m16s3",
            "grouped_gemm_m64",
            "grouped_gemm_any",
            "grouped_gemm_i8_r16",
            "grouped_gemm_i8_r64",
            "grouped_gemm_i4_r16",
            "grouped_gemm_i4_r64",
            "grouped_gemm_i8_any",
            "grouped_gemm_i4_any",
            "dense_gemm_m16",
            "dense_gemm_m64",
            "dense_gemm_m128",
            "dense_gemm_any",
        ],
        max_dynamic_shared: 112 * 1024,
    },
];

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

/// The hash recorded in a PTX file's first line, if it has one.
pub fn recorded_hash(ptx: &str) -> Option<&str> {
    ptx.lines()
        .next()?
        .strip_prefix(HASH_LINE_PREFIX)
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernels_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels")
    }

    /// Runs in CI without a GPU: the committed PTX must have been generated from the committed
    /// sources (`cargo xtask kernels` regenerates it).
    #[test]
    fn committed_ptx_matches_kernel_sources() {
        let common = std::fs::read(kernels_dir().join("common.cuh")).expect("kernels/common.cuh");
        for module in MODULES {
            let source = std::fs::read(kernels_dir().join(format!("{}.cu", module.name)))
                .unwrap_or_else(|e| panic!("kernels/{}.cu: {e}", module.name));
            let mut hasher = blake3::Hasher::new();
            hasher.update(&source);
            hasher.update(&common);
            let expected = hasher.finalize().to_hex().to_string();
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
}
