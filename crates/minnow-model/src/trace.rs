//! Intermediate values of one forward, recorded on request so tests can compare every stage
//! against the reference goldens (`hidden.*`, `router.layer{i}.*` of the fixtures).

use std::collections::BTreeMap;

/// What a traced forward recorded. All matrices are row-major over the forward's rows.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// `[n, D]` embedding output.
    pub embed: Vec<f32>,
    /// `[n, D]` residual stream after each decoder layer.
    pub layers: Vec<Vec<f32>>,
    /// `[n, D]` after the final RMSNorm (every row, not only the logits rows).
    pub final_norm: Vec<f32>,
    /// Router outputs of each MoE layer, by layer index.
    pub routers: BTreeMap<usize, RouterTrace>,
}

#[derive(Clone, Debug, Default)]
pub struct RouterTrace {
    /// `[n, E]` raw router logits (before the sigmoid).
    pub logits: Vec<f32>,
    /// `[n, k]` chosen experts, best biased score first.
    pub topk_ids: Vec<u32>,
    /// `[n, k]` mixing weights aligned with `topk_ids`.
    pub topk_weights: Vec<f32>,
    /// 2.2 only: `[blocks, E]` admission of each block.
    pub block_admitted: Option<Vec<bool>>,
}
