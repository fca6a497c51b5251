//! The kernels' view of a config: attention and router shapes, and the attention's key splits.

use minnow_runtime::cuda::ops::{AttentionShape, RouterShape};

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
