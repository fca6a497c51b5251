//! The dense GEMMs' cuBLASLt plans, made at load for the model's shapes.

use minnow_runtime::cuda::{CudaResult, Gpu};

use super::weights::{Mlp, SharedExpert, Weights};
use crate::config::Config;

/// Plans the model's dense GEMMs (`minnow_runtime::cuda::plan_dense_gemms`): each distinct
/// (n, k) of the layers' QKV, O, dense MLP and shared expert up to `tokens` rows, the lm_head up
/// to `logit_rows`. Returns the load log's lines. Only in batch-invariant mode, and not with
/// `MINNOW_DENSE_LT=0`.
pub(crate) fn plan_dense_gemms(
    gpu: &Gpu,
    c: &Config,
    weights: &Weights,
    tokens: usize,
    logit_rows: usize,
) -> CudaResult<Vec<String>> {
    use minnow_runtime::cuda::DenseShape;
    if !minnow_runtime::cuda::tuning::tuning().invariant
        || std::env::var("MINNOW_DENSE_LT").is_ok_and(|v| v == "0")
    {
        return Ok(Vec::new());
    }
    let mut shapes: Vec<DenseShape> = Vec::new();
    let mut add = |name: &'static str, n: usize, k: usize, w: u64| {
        if !shapes.iter().any(|s| (s.n, s.k) == (n, k)) {
            shapes.push(DenseShape { name, n, k, w });
        }
    };
    for layer in &weights.layers {
        let d = layer.post_norm.len();
        add("qkv", layer.qkv.len() / d, d, layer.qkv.ptr());
        add("o", d, layer.dense.len() / d, layer.dense.ptr());
        let mlp = match &layer.mlp {
            Mlp::Dense(mlp) => Some(("dense mlp", mlp)),
            Mlp::Moe(moe) => match &moe.shared {
                SharedExpert::Separate(mlp) => Some(("shared expert", mlp)),
                _ => None,
            },
        };
        if let Some((name, mlp)) = mlp {
            add(name, 2 * mlp.width, d, mlp.gate_up.ptr());
            add(name, d, mlp.width, mlp.down.ptr());
        }
        // A packed shared expert runs as dense GEMMs over its slice of the expert buffers in
        // forwards too long for the grouped GEMM to take it (queue_grouped_experts).
        if let Mlp::Moe(moe) = &layer.mlp {
            if let (SharedExpert::Packed, Some((gate_up, down))) = (&moe.shared, moe.bf16_experts())
            {
                let (e, iw) = (c.num_experts, c.moe_intermediate_size);
                add("shared expert", 2 * iw, d, gate_up.ptr_at(e * 2 * iw * d));
                add("shared expert", d, iw, down.ptr_at(e * d * iw));
            }
        }
    }
    let mut report = minnow_runtime::cuda::plan_dense_gemms(gpu, &shapes, tokens)?;
    if let Some(layer) = weights.layers.first() {
        let d = layer.post_norm.len();
        let lm_head = DenseShape {
            name: "lm_head",
            n: weights.lm_head.len() / d,
            k: d,
            w: weights.lm_head.ptr(),
        };
        report.extend(minnow_runtime::cuda::plan_dense_gemms(
            gpu,
            &[lm_head],
            logit_rows,
        )?);
    }
    Ok(report)
}
