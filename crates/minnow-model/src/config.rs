//! LLaDA2 `config.json`: parsed strictly (model doc §3). Structural keys are required; flags fall
//! back to the documented checkpoint values (never to the Python class defaults) with a warning;
//! values this engine does not implement are rejected with an error naming the key.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{ModelError, Result};

/// Which generation of LLaDA2 a checkpoint belongs to. Decides the router (2.2: block routing)
/// and the default decoding algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V20,
    V21,
    V22,
}

impl Family {
    /// "2.0", "2.1" or "2.2".
    pub fn version(self) -> &'static str {
        match self {
            Family::V20 => "2.0",
            Family::V21 => "2.1",
            Family::V22 => "2.2",
        }
    }
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
    /// Per-head RMSNorm on Q and K before RoPE (true in every released checkpoint).
    pub use_qk_norm: bool,
    /// The router adds `expert_bias` to the scores it selects experts by.
    pub moe_router_enable_expert_bias: bool,
}

/// Block size used by 2.0/2.1 decoding, which have no `block_size` key (model doc §3.1 notes).
pub const DEFAULT_BLOCK_SIZE: usize = 32;

/// Upper bounds of the counts in `config.json`: generous multiples of the largest LLaDA2.x
/// checkpoints (flash: 32 layers, 256 experts, hidden 4096, vocab 157184, 128k context), far
/// below what would exhaust memory when shapes are derived from them. The tensors actually
/// present are checked against the config afterwards (`weights.rs`).
pub const COUNT_BOUNDS: &[(&str, u64)] = &[
    ("vocab_size", 1 << 22),
    ("hidden_size", 1 << 16),
    ("intermediate_size", 1 << 20),
    ("moe_intermediate_size", 1 << 18),
    ("num_hidden_layers", 1024),
    ("num_attention_heads", 1024),
    ("num_key_value_heads", 1024),
    ("head_dim", 4096),
    ("num_experts", 4096),
    ("num_experts_per_tok", 4096),
    ("num_shared_experts", 64),
    ("first_k_dense_replace", 1024),
    ("max_position_embeddings", 1 << 24),
    ("block_size", 4096),
    ("expert_capacity", 4096),
    ("n_group", 4096),
    ("topk_group", 4096),
];

impl Config {
    /// Reads and validates `dir/config.json`. The family is 2.2 when the config has
    /// `expert_capacity`; otherwise 2.1 until [`Config::refine_family`] looks at the weights.
    pub fn from_dir(dir: &Path) -> Result<Config> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        Config::from_json_str(&text, &path)
    }

    /// Parses the text of a `config.json`; `path` is only used in messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Config> {
        let value: Value = serde_json::from_str(text).map_err(|e| ModelError::Config {
            path: path.to_path_buf(),
            message: format!("not valid JSON: {e}"),
        })?;
        let obj = value.as_object().ok_or_else(|| ModelError::Config {
            path: path.to_path_buf(),
            message: "the top level is not a JSON object".into(),
        })?;
        Parser {
            obj,
            path: path.to_path_buf(),
        }
        .parse()
    }

    /// config.json cannot tell 2.0 from 2.1 (same keys, same values). The weights can: 2.0
    /// checkpoints store `expert_bias` in BF16, 2.1 in F32 (model doc §10 item 12; the fixtures
    /// agree). **Unconfirmed** for every real checkpoint, so this is a heuristic: a F32 (or
    /// absent) bias keeps 2.1, the newer and more common choice.
    pub fn refine_family(&mut self, expert_bias_dtype: Option<minnow_runtime::DType>) {
        if self.family != Family::V22 && expert_bias_dtype == Some(minnow_runtime::DType::BF16) {
            self.family = Family::V20;
        }
    }

    /// Whether the router is 2.2 block routing.
    pub fn block_routing(&self) -> bool {
        self.expert_capacity.is_some()
    }

    /// Whether layer `i` is a dense MLP layer (else MoE).
    pub fn is_dense_layer(&self, i: usize) -> bool {
        i < self.first_k_dense_replace
    }

    /// Width of the shared expert (0 when there is none).
    pub fn shared_intermediate_size(&self) -> usize {
        self.moe_intermediate_size * self.num_shared_experts
    }

    /// Rows of the fused QKV projection: `(H + 2G) · d`.
    pub fn qkv_rows(&self) -> usize {
        (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
    }
}

struct Parser<'a> {
    obj: &'a Map<String, Value>,
    path: PathBuf,
}

impl Parser<'_> {
    fn err(&self, message: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    /// A key that is present and not null.
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                let n = v.as_u64().ok_or_else(|| {
                    self.err(format!("'{key}' must be a non-negative integer, got {v}"))
                })?;
                // Every count is bounded before anything is sized from it, so a hostile or broken
                // config fails here in microseconds instead of allocating for 10^9 layers.
                if let Some(&(_, max)) = COUNT_BOUNDS.iter().find(|(k, _)| *k == key) {
                    if n > max {
                        return Err(self.err(format!(
                            "'{key}' = {n} exceeds the largest supported value {max}"
                        )));
                    }
                }
                usize::try_from(n)
                    .map(Some)
                    .map_err(|_| self.err(format!("'{key}' = {n} does not fit this machine")))
            }
        }
    }

    fn usize_req(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?
            .ok_or_else(|| self.err(format!("missing required key '{key}'")))
    }

    fn f64_of(&self, key: &str, v: &Value) -> Result<f64> {
        v.as_f64()
            .ok_or_else(|| self.err(format!("'{key}' must be a number, got {v}")))
    }

    fn f64_req(&self, key: &str) -> Result<f64> {
        let v = self
            .get(key)
            .ok_or_else(|| self.err(format!("missing required key '{key}'")))?;
        self.f64_of(key, v)
    }

    fn u32_opt(&self, key: &str) -> Result<Option<u32>> {
        match self.usize_opt(key)? {
            Some(n) if n > u32::MAX as usize => {
                Err(self.err(format!("'{key}' = {n} is too large")))
            }
            other => Ok(other.map(|n| n as u32)),
        }
    }

    /// A boolean flag; absent means the documented checkpoint value, with a warning.
    fn flag(&self, key: &str, checkpoint_value: bool) -> Result<bool> {
        match self.get(key) {
            None => {
                tracing::warn!(
                    "{}: '{key}' is missing; using the LLaDA2 checkpoint value {checkpoint_value}",
                    self.path.display()
                );
                Ok(checkpoint_value)
            }
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(format!("'{key}' must be true or false, got {v}"))),
        }
    }

    /// A flag this engine only implements at its checkpoint value.
    fn require_flag(&self, key: &str, supported: bool) -> Result<()> {
        if self.flag(key, supported)? != supported {
            return Err(self.err(format!("'{key}' = {} is not supported", !supported)));
        }
        Ok(())
    }

    /// A string setting this engine only implements at one value.
    fn require_str(&self, key: &str, supported: &str) -> Result<()> {
        match self.get(key) {
            None => {
                tracing::warn!(
                    "{}: '{key}' is missing; using the LLaDA2 checkpoint value \"{supported}\"",
                    self.path.display()
                );
                Ok(())
            }
            Some(Value::String(s)) if s == supported => Ok(()),
            Some(v) => Err(self.err(format!(
                "'{key}' = {v} is not supported (only \"{supported}\")"
            ))),
        }
    }

    fn parse(&self) -> Result<Config> {
        match self.get("model_type") {
            Some(Value::String(s)) if s == "llada2_moe" => {}
            Some(v) => {
                return Err(self.err(format!(
                    "'model_type' = {v} is not supported (only \"llada2_moe\")"
                )))
            }
            None => return Err(self.err("missing required key 'model_type'")),
        }

        // Settings whose other values this engine does not implement (model doc §3.2).
        self.require_flag("use_qkv_bias", false)?;
        self.require_flag("use_bias", false)?;
        self.require_flag("norm_head", false)?;
        self.require_flag("tie_word_embeddings", false)?;
        self.require_flag("use_sliding_window", false)?;
        self.require_str("hidden_act", "silu")?;
        self.require_str("score_function", "sigmoid")?;
        if let Some(v) = self.get("rope_scaling") {
            return Err(self.err(format!(
                "'rope_scaling' = {v} is not supported (RoPE scaling is not implemented; it must be null)"
            )));
        }
        let use_qk_norm = self.flag("use_qk_norm", true)?;
        let moe_router_enable_expert_bias = self.flag("moe_router_enable_expert_bias", true)?;
        // The reference always normalizes the top-k weights when k > 1 and keeps router math in
        // F32 whatever these say; read them only to warn about surprising values.
        if !self.flag("norm_topk_prob", true)? {
            tracing::warn!(
                "{}: 'norm_topk_prob' is false, but the reference normalizes anyway; so does minnow",
                self.path.display()
            );
        }
        if let Some(v) = self.get("router_dtype") {
            if v.as_str() != Some("fp32") {
                tracing::warn!(
                    "{}: 'router_dtype' = {v}; minnow computes the router in F32 regardless",
                    self.path.display()
                );
            }
        }

        let vocab_size = self.usize_req("vocab_size")?;
        let hidden_size = self.usize_req("hidden_size")?;
        let intermediate_size = self.usize_req("intermediate_size")?;
        let moe_intermediate_size = self.usize_req("moe_intermediate_size")?;
        let num_hidden_layers = self.usize_req("num_hidden_layers")?;
        let num_attention_heads = self.usize_req("num_attention_heads")?;
        let mut num_key_value_heads = self.usize_req("num_key_value_heads")?;
        let num_experts = self.usize_req("num_experts")?;
        let num_experts_per_tok = self.usize_req("num_experts_per_tok")?;
        let num_shared_experts = self.usize_req("num_shared_experts")?;
        let first_k_dense_replace = self.usize_req("first_k_dense_replace")?;
        let max_position_embeddings = self.usize_req("max_position_embeddings")?;
        let rms_norm_eps = self.f64_req("rms_norm_eps")?;
        let routed_scaling_factor = self.f64_req("routed_scaling_factor")?;

        for (key, v) in [
            ("vocab_size", vocab_size),
            ("hidden_size", hidden_size),
            ("num_hidden_layers", num_hidden_layers),
            ("num_attention_heads", num_attention_heads),
            ("max_position_embeddings", max_position_embeddings),
        ] {
            if v == 0 {
                return Err(self.err(format!("'{key}' must be at least 1")));
            }
        }
        if num_key_value_heads == 0 {
            tracing::warn!(
                "{}: 'num_key_value_heads' is 0; treating it as num_attention_heads ({num_attention_heads}) as the 2.1 reference does",
                self.path.display()
            );
            num_key_value_heads = num_attention_heads;
        }
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(self.err(format!(
                "'num_key_value_heads' = {num_key_value_heads} does not divide num_attention_heads = {num_attention_heads}"
            )));
        }
        let head_dim = match self.usize_opt("head_dim")? {
            Some(d) => d,
            None => {
                if hidden_size % num_attention_heads != 0 {
                    return Err(self.err(
                        "'head_dim' is missing and hidden_size is not a multiple of num_attention_heads",
                    ));
                }
                hidden_size / num_attention_heads
            }
        };
        if head_dim == 0 {
            return Err(self.err("'head_dim' must be at least 1"));
        }
        if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
            return Err(self.err(format!("'rms_norm_eps' = {rms_norm_eps} must be positive")));
        }
        if !routed_scaling_factor.is_finite() {
            return Err(self.err("'routed_scaling_factor' must be finite"));
        }

        let (rope_theta, partial_rotary_factor) = self.rope()?;
        let rotary_dim = (head_dim as f64 * partial_rotary_factor) as usize;
        if !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(self.err(format!(
                "'partial_rotary_factor' = {partial_rotary_factor} gives {rotary_dim} rotary dims of head_dim {head_dim}; it must be even and at most head_dim"
            )));
        }

        if first_k_dense_replace > num_hidden_layers {
            return Err(self.err(format!(
                "'first_k_dense_replace' = {first_k_dense_replace} exceeds num_hidden_layers = {num_hidden_layers}"
            )));
        }
        let has_moe = first_k_dense_replace < num_hidden_layers;
        if first_k_dense_replace > 0 && intermediate_size == 0 {
            return Err(self.err("'intermediate_size' must be at least 1 when dense layers exist"));
        }
        if has_moe {
            if num_experts == 0 || moe_intermediate_size == 0 {
                return Err(
                    self.err("'num_experts' and 'moe_intermediate_size' must be at least 1")
                );
            }
            if num_experts_per_tok == 0 || num_experts_per_tok > num_experts {
                return Err(self.err(format!(
                    "'num_experts_per_tok' = {num_experts_per_tok} must be between 1 and num_experts = {num_experts}"
                )));
            }
        }

        let expert_capacity = self.usize_opt("expert_capacity")?;
        let block_size_key = self.usize_opt("block_size")?;
        let block_size = block_size_key.unwrap_or(DEFAULT_BLOCK_SIZE);
        if block_size == 0 {
            return Err(self.err("'block_size' must be at least 1"));
        }
        let (n_group, topk_group) = match expert_capacity {
            Some(c) => {
                if block_size_key.is_none() {
                    tracing::warn!(
                        "{}: 'expert_capacity' without 'block_size'; block routing uses {DEFAULT_BLOCK_SIZE}",
                        self.path.display()
                    );
                }
                if has_moe && (c < num_experts_per_tok || c > num_experts) {
                    return Err(self.err(format!(
                        "'expert_capacity' = {c} must be between num_experts_per_tok = {num_experts_per_tok} and num_experts = {num_experts}"
                    )));
                }
                // Present in 2.2 configs but unused by block routing (model doc §7.8).
                (None, None)
            }
            None => {
                let n_group = self.usize_req("n_group")?;
                let topk_group = self.usize_req("topk_group")?;
                if has_moe {
                    self.check_groups(num_experts, num_experts_per_tok, n_group, topk_group)?;
                }
                (Some(n_group), Some(topk_group))
            }
        };

        Ok(Config {
            family: if expert_capacity.is_some() {
                Family::V22
            } else {
                Family::V21
            },
            vocab_size,
            hidden_size,
            intermediate_size,
            moe_intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rotary_dim,
            rope_theta: rope_theta as f32,
            rms_norm_eps: rms_norm_eps as f32,
            max_position_embeddings,
            num_experts,
            num_experts_per_tok,
            num_shared_experts,
            first_k_dense_replace,
            routed_scaling_factor: routed_scaling_factor as f32,
            n_group,
            topk_group,
            expert_capacity,
            block_size,
            delete_token_id: self.u32_opt("delete_token_id")?,
            split_token_id: self.u32_opt("split_token_id")?,
            pad_token_id: self.u32_opt("pad_token_id")?,
            eos_token_id: self.eos_token_id()?,
            use_qk_norm,
            moe_router_enable_expert_bias,
        })
    }

    /// `(rope_theta, partial_rotary_factor)`, from `rope_parameters` (2.2, preferred) or the
    /// flat keys; when both exist they must agree.
    fn rope(&self) -> Result<(f64, f64)> {
        let flat_theta = match self.get("rope_theta") {
            Some(v) => Some(self.f64_of("rope_theta", v)?),
            None => None,
        };
        let flat_factor = match self.get("partial_rotary_factor") {
            Some(v) => Some(self.f64_of("partial_rotary_factor", v)?),
            None => None,
        };
        let (theta, factor) = match self.get("rope_parameters") {
            Some(Value::Object(p)) => {
                match p.get("rope_type").and_then(Value::as_str) {
                    Some("default") | None => {}
                    Some(other) => {
                        return Err(self.err(format!(
                            "'rope_parameters.rope_type' = \"{other}\" is not supported (only \"default\")"
                        )))
                    }
                }
                let theta = match p.get("rope_theta") {
                    Some(v) => self.f64_of("rope_parameters.rope_theta", v)?,
                    None => flat_theta.ok_or_else(|| {
                        self.err("missing required key 'rope_parameters.rope_theta'")
                    })?,
                };
                let factor = match p.get("partial_rotary_factor") {
                    Some(v) => Some(self.f64_of("rope_parameters.partial_rotary_factor", v)?),
                    None => flat_factor,
                };
                if let Some(flat) = flat_theta {
                    if flat != theta {
                        return Err(self.err(format!(
                            "'rope_theta' = {flat} disagrees with 'rope_parameters.rope_theta' = {theta}"
                        )));
                    }
                }
                if let (Some(flat), Some(f)) = (flat_factor, factor) {
                    if flat != f {
                        return Err(self.err(format!(
                            "'partial_rotary_factor' = {flat} disagrees with 'rope_parameters.partial_rotary_factor' = {f}"
                        )));
                    }
                }
                (theta, factor)
            }
            Some(v) => {
                return Err(self.err(format!("'rope_parameters' must be an object, got {v}")))
            }
            None => (
                flat_theta.ok_or_else(|| self.err("missing required key 'rope_theta'"))?,
                flat_factor,
            ),
        };
        if !(theta > 0.0 && theta.is_finite()) {
            return Err(self.err(format!("'rope_theta' = {theta} must be positive")));
        }
        // Absent: the reference class default 0.5, which every checkpoint also uses (§3.3 rule 2).
        let factor = factor.unwrap_or(0.5);
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(self.err(format!(
                "'partial_rotary_factor' = {factor} must be in (0, 1]"
            )));
        }
        Ok((theta, factor))
    }

    fn check_groups(&self, e: usize, k: usize, n_group: usize, topk_group: usize) -> Result<()> {
        if n_group == 0 || !e.is_multiple_of(n_group) {
            return Err(self.err(format!(
                "'n_group' = {n_group} must divide num_experts = {e}"
            )));
        }
        // The group score is the sum of each group's two best experts.
        if e / n_group < 2 {
            return Err(self.err(format!(
                "'n_group' = {n_group} leaves fewer than 2 experts per group"
            )));
        }
        if topk_group == 0 || topk_group > n_group || topk_group * (e / n_group) < k {
            return Err(self.err(format!(
                "'topk_group' = {topk_group} must be between 1 and n_group = {n_group} and keep at least num_experts_per_tok = {k} experts"
            )));
        }
        Ok(())
    }

    /// `eos_token_id` may be a number or a list (HF allows both); the first entry is kept.
    fn eos_token_id(&self) -> Result<Option<u32>> {
        match self.get("eos_token_id") {
            Some(Value::Array(a)) => Ok(a.first().and_then(Value::as_u64).map(|n| n as u32)),
            _ => self.u32_opt("eos_token_id"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");

    fn fixture(name: &str) -> Value {
        let text = std::fs::read_to_string(format!("{FIXTURES}/{name}/config.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn parse(v: &Value) -> Result<Config> {
        Config::from_json_str(&v.to_string(), Path::new("config.json"))
    }

    /// The published LLaDA2.1-mini config.json (model doc §3.1).
    fn real_v21_mini() -> Value {
        serde_json::from_str(
            r#"{
            "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
            "attention_dropout": 0.0, "embedding_dropout": 0.0, "output_dropout": 0.0,
            "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5120,
            "max_position_embeddings": 32768, "max_window_layers": 28,
            "moe_intermediate_size": 512, "moe_router_enable_expert_bias": true,
            "n_group": 8, "norm_head": false, "norm_softmax": false, "norm_topk_prob": true,
            "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8,
            "num_hidden_layers": 20, "num_key_value_heads": 4, "num_shared_experts": 1,
            "output_router_logits": false, "pad_token_id": 156892, "partial_rotary_factor": 0.5,
            "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 600000, "rotary_dim": 64,
            "routed_scaling_factor": 2.5, "router_dtype": "fp32", "score_function": "sigmoid",
            "sliding_window": 4096, "tie_word_embeddings": false, "topk_group": 4,
            "torch_dtype": "bfloat16", "use_bias": false, "use_cache": true,
            "use_qk_norm": true, "use_qkv_bias": false, "use_rmsnorm": true,
            "use_sliding_window": false, "using_split_qkv_in_self_attention": false,
            "vocab_size": 157184
        }"#,
        )
        .unwrap()
    }

    /// 2.2-mini as documented: flat keys plus rope_parameters and the block-routing keys.
    fn real_v22_mini() -> Value {
        let mut v = real_v21_mini();
        let o = v.as_object_mut().unwrap();
        o.insert("rope_theta".into(), 3000000.into());
        o.insert("max_position_embeddings".into(), 131072.into());
        o.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "default", "rope_theta": 3000000, "partial_rotary_factor": 0.5}),
        );
        o.insert("block_size".into(), 32.into());
        o.insert("expert_capacity".into(), 48.into());
        o.insert("delete_token_id".into(), 156930.into());
        o.insert("split_token_id".into(), 156931.into());
        v
    }

    #[test]
    fn parses_real_mini_configs() {
        let c = parse(&real_v21_mini()).unwrap();
        assert_eq!(c.family, Family::V21);
        assert_eq!((c.head_dim, c.rotary_dim, c.qkv_rows()), (128, 64, 3072));
        assert_eq!(
            (c.n_group, c.topk_group, c.block_size),
            (Some(8), Some(4), 32)
        );
        assert_eq!(c.rope_theta, 600000.0);
        let c = parse(&real_v22_mini()).unwrap();
        assert_eq!(c.family, Family::V22);
        assert_eq!(c.expert_capacity, Some(48));
        assert_eq!((c.n_group, c.topk_group), (None, None));
        assert_eq!(c.rope_theta, 3000000.0);
        assert_eq!(
            (c.delete_token_id, c.split_token_id),
            (Some(156930), Some(156931))
        );
    }

    #[test]
    fn counts_are_bounded_before_use() {
        let started = std::time::Instant::now();
        for (key, _) in COUNT_BOUNDS {
            // 2.2 configs do not read the group keys; 2.1 configs do.
            let base = if key.ends_with("group") {
                real_v21_mini()
            } else {
                real_v22_mini()
            };
            let error = err_of(&with(base, key, 1_000_000_000u64.into()));
            assert!(
                error.contains(key) && error.contains("exceeds"),
                "{key}: {error}"
            );
            assert_eq!(error.lines().count(), 1, "{error}");
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // The real configs sit well inside the bounds.
        assert!(parse(&real_v21_mini()).is_ok());
    }

    #[test]
    fn parses_fixture_configs() {
        for (name, family) in [
            ("llada2-tiny-v20", Family::V21), // 2.0 is recognized from the weights, not here
            ("llada2-tiny-v21", Family::V21),
            ("llada2-tiny-v22", Family::V22),
        ] {
            let c = parse(&fixture(name)).unwrap();
            assert_eq!(c.family, family, "{name}");
            assert_eq!((c.hidden_size, c.head_dim, c.rotary_dim), (64, 16, 8));
            assert_eq!(c.eos_token_id, Some(481));
        }
        let mut c = parse(&fixture("llada2-tiny-v20")).unwrap();
        c.refine_family(Some(minnow_runtime::DType::BF16));
        assert_eq!(c.family, Family::V20);
    }

    fn with(mut v: Value, key: &str, val: Value) -> Value {
        v.as_object_mut().unwrap().insert(key.into(), val);
        v
    }

    fn without(mut v: Value, key: &str) -> Value {
        v.as_object_mut().unwrap().remove(key);
        v
    }

    fn err_of(v: &Value) -> String {
        parse(v).unwrap_err().to_string()
    }

    #[test]
    fn missing_structural_keys_are_errors_naming_the_key() {
        for key in [
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "moe_intermediate_size",
            "num_experts",
            "num_experts_per_tok",
            "num_shared_experts",
            "first_k_dense_replace",
            "rms_norm_eps",
            "rope_theta",
            "max_position_embeddings",
            "routed_scaling_factor",
            "n_group",
            "topk_group",
            "model_type",
        ] {
            let e = err_of(&without(real_v21_mini(), key));
            assert!(e.contains(&format!("'{key}'")), "{key}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        // 2.2 needs no groups, and rope_theta may come from rope_parameters alone.
        let v22 = without(
            without(without(real_v22_mini(), "n_group"), "topk_group"),
            "rope_theta",
        );
        assert_eq!(parse(&v22).unwrap().rope_theta, 3000000.0);
    }

    #[test]
    fn unsupported_values_are_rejected_by_key() {
        let cases = [
            ("model_type", Value::from("llama")),
            (
                "rope_scaling",
                serde_json::json!({"type": "yarn", "factor": 2.0}),
            ),
            ("use_qkv_bias", Value::from(true)),
            ("use_bias", Value::from(true)),
            ("norm_head", Value::from(true)),
            ("tie_word_embeddings", Value::from(true)),
            ("use_sliding_window", Value::from(true)),
            ("hidden_act", Value::from("gelu")),
            ("score_function", Value::from("softmax")),
            ("num_key_value_heads", Value::from(3)),
            ("n_group", Value::from(7)),
            ("topk_group", Value::from(0)),
            ("num_experts_per_tok", Value::from(300)),
            ("hidden_size", Value::from("2048")),
            ("partial_rotary_factor", Value::from(1.5)),
        ];
        for (key, val) in cases {
            let e = err_of(&with(real_v21_mini(), key, val));
            assert!(e.contains(key), "{key}: {e}");
        }
        let bad_rope = serde_json::json!({"rope_type": "yarn", "rope_theta": 3000000});
        let e = err_of(&with(real_v22_mini(), "rope_parameters", bad_rope));
        assert!(e.contains("rope_type"), "{e}");
        let e = err_of(&with(real_v22_mini(), "rope_theta", Value::from(600000)));
        assert!(e.contains("disagrees"), "{e}");
        let e = err_of(&with(real_v22_mini(), "expert_capacity", Value::from(4)));
        assert!(e.contains("expert_capacity"), "{e}");
        assert!(Config::from_json_str("{", Path::new("c.json")).is_err());
    }

    #[test]
    fn flags_and_defaults_follow_the_checkpoints_not_the_class() {
        let v = without(
            without(real_v21_mini(), "use_qk_norm"),
            "partial_rotary_factor",
        );
        let v = without(without(v, "head_dim"), "use_bias");
        let c = parse(&v).unwrap();
        assert!(c.use_qk_norm);
        assert_eq!(c.rotary_dim, 64); // 0.5 of head_dim 2048/16
        assert_eq!(c.head_dim, 128);
        let c = parse(&with(
            real_v21_mini(),
            "num_key_value_heads",
            Value::from(0),
        ))
        .unwrap();
        assert_eq!(c.num_key_value_heads, 16);
    }
}
