//! The kernels' view of a config: attention and router shapes, and the attention's key splits.

use minnow_runtime::cuda::ops::{self, AttentionShape, AttentionSplits, RouterShape};

use crate::config::Config;

/// Key splits of the attention for a forward of `tiles` attention tiles: enough CTAs to fill the
/// GPU (about two per multiprocessor) when the forward itself is short. Depends on the batch's
/// shape only, so a captured graph stays valid as the prefixes grow (the split length adapts
/// in-kernel).
pub(crate) fn attention_splits(config: &Config, tiles: usize, sm_count: u32) -> usize {
    let ctas = tiles * config.num_key_value_heads;
    (2 * sm_count as usize)
        .div_ceil(ctas.max(1))
        .clamp(1, minnow_runtime::cuda::tuning::tuning().attn_max_splits)
}

/// How a batch-invariant forward of `tiles` attention tiles cuts its keys. Both answers give
/// the same bits: one CTA per tile walking every fixed chunk (no partials in memory) once the
/// tiles alone nearly fill the GPU (`Tuning::attn_one_cta_percent`), which prefill and batched
/// steps of 16 or more requests do, else a CTA per fixed chunk (`key_chunks` of them) plus the
/// combine. The forward launches by this answer and the runner sizes the partials' scratch by
/// it, so the two cannot disagree.
pub(crate) fn invariant_attention_splits(
    config: &Config,
    tiles: usize,
    key_chunks: usize,
    sm_count: u32,
) -> AttentionSplits {
    let ctas = tiles * config.num_key_value_heads;
    let percent = minnow_runtime::cuda::tuning::tuning().attn_one_cta_percent;
    if ops::attention_uses_fa(config.head_dim)
        && ctas.saturating_mul(100) >= percent.saturating_mul(sm_count as usize)
    {
        AttentionSplits::FixedChunksInOneCta
    } else {
        AttentionSplits::FixedChunks(key_chunks)
    }
}

pub(crate) fn attention_shape(c: &Config) -> AttentionShape {
    AttentionShape {
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        rotary_dim: c.rotary_dim,
        block: c.block_size,
    }
}

pub(crate) fn router_shape(c: &Config) -> RouterShape {
    RouterShape {
        experts: c.num_experts,
        top_k: c.num_experts_per_tok,
        groups: c.n_group.zip(c.topk_group),
        capacity: c.expert_capacity,
        block: c.block_size,
        scale: c.routed_scaling_factor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny fixture's config with another head dim (4 query heads over 2 KV heads).
    fn config(head_dim: usize) -> Config {
        let text = include_str!("../../../../tests/fixtures/llada2-tiny-v22/config.json");
        let mut json: serde_json::Value = serde_json::from_str(text).unwrap();
        json["head_dim"] = head_dim.into();
        Config::from_json_str(&json.to_string(), std::path::Path::new("config.json")).unwrap()
    }

    #[test]
    fn attention_runs_one_cta_per_tile_only_when_the_tiles_fill_the_gpu() {
        let percent = minnow_runtime::cuda::tuning::tuning().attn_one_cta_percent;
        let c = config(128);
        // 132 SMs: the tiles x 2 KV heads reach `percent` % of them, or fall one tile short.
        let enough = (percent * 132).div_ceil(200);
        assert_eq!(
            invariant_attention_splits(&c, enough, 16, 132),
            AttentionSplits::FixedChunksInOneCta
        );
        if enough > 0 {
            assert_eq!(
                invariant_attention_splits(&c, enough - 1, 16, 132),
                AttentionSplits::FixedChunks(16)
            );
        }
        // Head dims without the tensor-core kernel always take a CTA per chunk.
        assert_eq!(
            invariant_attention_splits(&config(16), 10_000, 5, 132),
            AttentionSplits::FixedChunks(5)
        );
    }
}
