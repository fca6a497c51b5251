//! LLaDA2 `config.json`: parsed strictly (model doc §3). Structural keys are required; flags fall
//! back to the documented checkpoint values (never to the Python class defaults) with a warning.
//!
//! [core] fills in parsing and validation; the public fields below are the contract other crates
//! use.

/// Which generation of LLaDA2 a checkpoint belongs to. Decides the router (2.2: block routing)
/// and the default decoding algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V20,
    V21,
    V22,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Rotated dims per head: `int(head_dim * partial_rotary_factor)`.
    pub rotary_dim: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub num_shared_experts: usize,
    pub first_k_dense_replace: usize,
    pub routed_scaling_factor: f32,
    /// Group-limited routing (2.0/2.1); `None` when the checkpoint uses block routing.
    pub n_group: Option<usize>,
    pub topk_group: Option<usize>,
    /// 2.2 block routing: experts admitted per block.
    pub expert_capacity: Option<usize>,
    /// Block size of decoding and of 2.2 routing (32 when the config has no key).
    pub block_size: usize,
    pub delete_token_id: Option<u32>,
    pub split_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
}
