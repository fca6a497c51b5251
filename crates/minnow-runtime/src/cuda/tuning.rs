//! Launch-shape knobs that only change speed, read once from the environment so that one bench
//! run can compare variants on the same binary (docs/performance.md records which won):
//! `MINNOW_MOE16_STAGES` (3 or 4: pipeline depth of the 16-row expert GEMM; 3 measured 3 % faster
//! per refinement step on the H200) and `MINNOW_ATTN_MAX_SPLITS` (1..=64: most key splits of a
//! short forward's attention; 16 beat 8 and 32), `MINNOW_MOE64_ROWS` (1..=1024: rows per busy
//! expert from which the grouped expert GEMM takes 64-row tiles); `MINNOW_MOE_POOLED=0` turns off the batched
//! experts of 2.2 denoising steps, and `MINNOW_POOL_GEMM=0` runs them with cuBLAS instead of the
//! bulk-copy kernel, for A/B runs.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    pub moe16_stages: usize,
    pub attn_max_splits: usize,
    /// Rows per busy expert from which the grouped expert GEMM cuts 64-row tiles (else 16).
    pub moe64_rows: usize,
    /// 2.2 denoising steps run their experts as batched cuBLAS GEMMs over the admitted pool
    /// (`MINNOW_MOE_POOLED=0`: the grouped GEMM over dispatched rows instead).
    pub moe_pooled: bool,
    /// The pooled experts use the bulk-copy kernel where it applies (`MINNOW_POOL_GEMM=0`: cuBLAS's
    /// batched GEMM).
    pub pool_gemm: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            moe16_stages: 3,
            attn_max_splits: 16,
            moe64_rows: 12,
            moe_pooled: true,
            pool_gemm: true,
        }
    }
}

fn env_usize(name: &str, allowed: impl Fn(usize) -> bool) -> Option<usize> {
    let value = std::env::var(name).ok()?;
    match value.parse::<usize>() {
        Ok(v) if allowed(v) => Some(v),
        _ => {
            tracing::warn!("ignoring {name}={value}: not an allowed value");
            None
        }
    }
}

/// The knobs in force (defaults unless overridden by the environment).
pub fn tuning() -> &'static Tuning {
    static TUNING: OnceLock<Tuning> = OnceLock::new();
    TUNING.get_or_init(|| {
        let d = Tuning::default();
        Tuning {
            moe16_stages: env_usize("MINNOW_MOE16_STAGES", |v| v == 3 || v == 4)
                .unwrap_or(d.moe16_stages),
            attn_max_splits: env_usize("MINNOW_ATTN_MAX_SPLITS", |v| (1..=64).contains(&v))
                .unwrap_or(d.attn_max_splits),
            moe64_rows: env_usize("MINNOW_MOE64_ROWS", |v| (1..=1024).contains(&v))
                .unwrap_or(d.moe64_rows),
            moe_pooled: env_usize("MINNOW_MOE_POOLED", |v| v <= 1).map_or(d.moe_pooled, |v| v == 1),
            pool_gemm: env_usize("MINNOW_POOL_GEMM", |v| v <= 1).map_or(d.pool_gemm, |v| v == 1),
        }
    })
}
