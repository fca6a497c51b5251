//! The validated weight set of a checkpoint: every tensor the forward pass reads, checked for
//! presence, element type and shape before any compute (model doc §4).
//!
//! Matrices are borrowed from the tensor source in their stored type (BF16/F16/F32 via mmap) and
//! widened where they are used, so a 16B checkpoint runs without an F32 copy. MLP projections
//! (routed experts in practice) may also be quantized in a `.mnw`: they stay compressed, and the
//! product that reads them decodes one block of rows at a time ([`MlpMat::linear`]). Small
//! vectors (norm weights, `expert_bias`) and the F32 router matrix are widened once at load.

use std::sync::Arc;

use minnow_format::{TensorRef, TensorSource};
use minnow_runtime::cpu::{linear, linear_quant, Par};
use minnow_runtime::quant::{QuantEncoding, QuantMat};
use minnow_runtime::{dtype::widen, DType, MatRef};

use crate::config::Config;
use crate::error::{ModelError, Result};

/// A stored matrix `[rows, cols]`: a slice of a tensor source, which it keeps alive.
pub struct StoredMat {
    dtype: DType,
    rows: usize,
    cols: usize,
    ptr: *const u8,
    len: usize,
    /// Owner of the bytes at `ptr` (a memory map, which never moves while it lives).
    _source: Arc<dyn TensorSource>,
}

// SAFETY: the bytes are immutable (read-only mmap or owned buffer) and owned by `_source`,
// which is `Send + Sync`.
unsafe impl Send for StoredMat {}
unsafe impl Sync for StoredMat {}

impl StoredMat {
    /// The matrix, borrowed for as long as `self` is.
    pub fn view(&self) -> MatRef<'_> {
        // SAFETY: `ptr/len` describe a slice of `_source`'s data, alive as long as `self`
        // holds it; the returned borrow cannot outlive `self`.
        let data = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        MatRef {
            dtype: self.dtype,
            rows: self.rows,
            cols: self.cols,
            data,
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

/// A stored quantized matrix: codes and scales borrowed from a tensor source, which it keeps
/// alive.
pub struct QuantStoredMat {
    encoding: QuantEncoding,
    rows: usize,
    cols: usize,
    group_size: usize,
    global_scale: f32,
    codes: (*const u8, usize),
    scales: (*const u8, usize),
    _source: Arc<dyn TensorSource>,
}

// SAFETY: as for `StoredMat`: immutable bytes owned by the `Send + Sync` source.
unsafe impl Send for QuantStoredMat {}
unsafe impl Sync for QuantStoredMat {}

impl QuantStoredMat {
    pub fn view(&self) -> QuantMat<'_> {
        // SAFETY: both ranges are slices of `_source`'s data, alive as long as `self`.
        let (codes, scales) = unsafe {
            (
                std::slice::from_raw_parts(self.codes.0, self.codes.1),
                std::slice::from_raw_parts(self.scales.0, self.scales.1),
            )
        };
        QuantMat {
            encoding: self.encoding,
            rows: self.rows,
            cols: self.cols,
            group_size: self.group_size,
            codes,
            scales,
            global_scale: self.global_scale,
        }
    }
}

/// One projection of an MLP, floating point or quantized.
pub enum MlpMat {
    Float(StoredMat),
    Quant(QuantStoredMat),
}

impl MlpMat {
    /// Output features (rows of the weight).
    pub fn rows(&self) -> usize {
        match self {
            MlpMat::Float(m) => m.rows,
            MlpMat::Quant(q) => q.rows,
        }
    }

    /// `out[n, rows] = x[n, cols] · Wᵀ`; a quantized weight's rows are decoded as the product
    /// reads them.
    pub fn linear(&self, x: &[f32], n: usize, out: &mut [f32], par: Par) {
        match self {
            MlpMat::Float(m) => linear(x, n, m.view(), out, par),
            MlpMat::Quant(q) => linear_quant(x, n, &q.view(), out, par),
        }
    }
}

/// A SwiGLU MLP: `down(silu(gate(x)) ⊙ up(x))`.
pub struct Mlp {
    pub gate: MlpMat,
    pub up: MlpMat,
    pub down: MlpMat,
}

pub struct Attention {
    /// Fused `[(H + 2G)·d, D]`, rows `[Q heads | K heads | V heads]`.
    pub qkv: StoredMat,
    /// Per-head norms `[d]` (absent when `use_qk_norm` is false).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Output projection `[D, H·d]`.
    pub dense: StoredMat,
}

pub struct Moe {
    /// Router `[E, D]` in F32 (router math stays F32 end to end).
    pub router: Vec<f32>,
    /// `[E]`, zeros when the router has no bias.
    pub expert_bias: Vec<f32>,
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
}

pub enum FeedForward {
    Dense(Mlp),
    Moe(Moe),
}

pub struct Layer {
    pub input_norm: Vec<f32>,
    pub attention: Attention,
    pub post_attention_norm: Vec<f32>,
    pub ffn: FeedForward,
}

/// Every weight of the model, validated against the config.
pub struct Weights {
    pub embed: StoredMat,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    pub lm_head: StoredMat,
}

/// One tensor the model expects.
struct Expected {
    name: String,
    shape: Vec<usize>,
    /// An MLP projection, which may be stored quantized.
    mlp: bool,
}

/// Every tensor name and shape the config implies, in checkpoint order (model doc §4).
fn expected_tensors(c: &Config) -> Vec<Expected> {
    let (d_model, v) = (c.hidden_size, c.vocab_size);
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>| {
        let mlp = name.ends_with("_proj.weight");
        out.push(Expected { name, shape, mlp })
    };
    push("model.word_embeddings.weight".into(), vec![v, d_model]);
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}");
        push(format!("{p}.input_layernorm.weight"), vec![d_model]);
        push(
            format!("{p}.attention.query_key_value.weight"),
            vec![c.qkv_rows(), d_model],
        );
        if c.use_qk_norm {
            push(
                format!("{p}.attention.query_layernorm.weight"),
                vec![c.head_dim],
            );
            push(
                format!("{p}.attention.key_layernorm.weight"),
                vec![c.head_dim],
            );
        }
        push(
            format!("{p}.attention.dense.weight"),
            vec![d_model, c.num_attention_heads * c.head_dim],
        );
        push(
            format!("{p}.post_attention_layernorm.weight"),
            vec![d_model],
        );
        let mlp = |push: &mut dyn FnMut(String, Vec<usize>), q: String, width: usize| {
            push(format!("{q}.gate_proj.weight"), vec![width, d_model]);
            push(format!("{q}.up_proj.weight"), vec![width, d_model]);
            push(format!("{q}.down_proj.weight"), vec![d_model, width]);
        };
        if c.is_dense_layer(i) {
            mlp(&mut push, format!("{p}.mlp"), c.intermediate_size);
        } else {
            push(format!("{p}.mlp.gate.weight"), vec![c.num_experts, d_model]);
            if c.moe_router_enable_expert_bias {
                push(format!("{p}.mlp.gate.expert_bias"), vec![c.num_experts]);
            }
            for e in 0..c.num_experts {
                mlp(
                    &mut push,
                    format!("{p}.mlp.experts.{e}"),
                    c.moe_intermediate_size,
                );
            }
            if c.num_shared_experts > 0 {
                mlp(
                    &mut push,
                    format!("{p}.mlp.shared_experts"),
                    c.shared_intermediate_size(),
                );
            }
        }
    }
    push("model.norm.weight".into(), vec![d_model]);
    push("lm_head.weight".into(), vec![v, d_model]);
    out
}

/// Checks presence, element type and shape of every expected tensor; the error names the first
/// bad one.
pub fn validate(c: &Config, source: &dyn TensorSource) -> Result<()> {
    for e in expected_tensors(c) {
        check(source, &e.name, &e.shape, e.mlp)?;
    }
    Ok(())
}

fn check<'a>(
    source: &'a dyn TensorSource,
    name: &str,
    shape: &[usize],
    may_be_quantized: bool,
) -> Result<TensorRef<'a>> {
    let t = source.tensor(name).ok_or_else(|| {
        ModelError::Weights(format!(
            "tensor '{name}' is missing from {}",
            source.describe()
        ))
    })?;
    if let Some(q) = t.quant {
        if !may_be_quantized {
            return Err(ModelError::Weights(format!(
                "tensor '{name}' is stored as {}; minnow runs quantized weights only in MLP projections",
                q.encoding
            )));
        }
        if t.quant_mat().is_none() {
            return Err(ModelError::Weights(format!(
                "tensor '{name}' ({}, shape {:?}) is not a well-formed quantized matrix",
                q.encoding, t.shape
            )));
        }
    } else if t.dtype.is_none() {
        return Err(ModelError::Weights(format!(
            "tensor '{name}' has dtype {}; expected BF16, F16 or F32",
            t.dtype_name
        )));
    }
    if t.shape != shape {
        return Err(ModelError::Weights(format!(
            "tensor '{name}' has shape {:?}; the config implies {shape:?}",
            t.shape
        )));
    }
    Ok(t)
}

impl Weights {
    /// Validates every tensor, then binds them. `source` stays alive as long as any matrix.
    pub fn load(c: &Config, source: Arc<dyn TensorSource>) -> Result<Weights> {
        validate(c, source.as_ref())?;
        let src = source.as_ref();
        // Every lookup below was validated, so `get` cannot fail.
        let get = |name: &str| src.tensor(name).expect("validated tensor");
        let mat = |name: String| {
            let t = get(&name);
            StoredMat {
                dtype: t.dtype.expect("validated dtype"),
                rows: t.shape[0],
                cols: t.shape[1],
                ptr: t.data.as_ptr(),
                len: t.data.len(),
                _source: Arc::clone(&source),
            }
        };
        let vector = |name: String| {
            let t = get(&name);
            widen(t.dtype.expect("validated dtype"), t.data)
        };
        let mlp_mat = |name: String| {
            let t = get(&name);
            match t.quant {
                None => MlpMat::Float(mat(name)),
                Some(q) => MlpMat::Quant(QuantStoredMat {
                    encoding: q.encoding,
                    rows: t.shape[0],
                    cols: t.shape[1],
                    group_size: q.group_size,
                    global_scale: q.global_scale,
                    codes: (t.data.as_ptr(), t.data.len()),
                    scales: (q.scales.as_ptr(), q.scales.len()),
                    _source: Arc::clone(&source),
                }),
            }
        };
        let mlp = |p: &str| Mlp {
            gate: mlp_mat(format!("{p}.gate_proj.weight")),
            up: mlp_mat(format!("{p}.up_proj.weight")),
            down: mlp_mat(format!("{p}.down_proj.weight")),
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let attention = Attention {
                qkv: mat(format!("{p}.attention.query_key_value.weight")),
                q_norm: c
                    .use_qk_norm
                    .then(|| vector(format!("{p}.attention.query_layernorm.weight"))),
                k_norm: c
                    .use_qk_norm
                    .then(|| vector(format!("{p}.attention.key_layernorm.weight"))),
                dense: mat(format!("{p}.attention.dense.weight")),
            };
            let ffn = if c.is_dense_layer(i) {
                FeedForward::Dense(mlp(&format!("{p}.mlp")))
            } else {
                FeedForward::Moe(Moe {
                    router: vector(format!("{p}.mlp.gate.weight")),
                    expert_bias: if c.moe_router_enable_expert_bias {
                        vector(format!("{p}.mlp.gate.expert_bias"))
                    } else {
                        vec![0.0; c.num_experts]
                    },
                    experts: (0..c.num_experts)
                        .map(|e| mlp(&format!("{p}.mlp.experts.{e}")))
                        .collect(),
                    shared: (c.num_shared_experts > 0)
                        .then(|| mlp(&format!("{p}.mlp.shared_experts"))),
                })
            };
            layers.push(Layer {
                input_norm: vector(format!("{p}.input_layernorm.weight")),
                attention,
                post_attention_norm: vector(format!("{p}.post_attention_layernorm.weight")),
                ffn,
            });
        }
        Ok(Weights {
            embed: mat("model.word_embeddings.weight".into()),
            layers,
            final_norm: vector("model.norm.weight".into()),
            lm_head: mat("lm_head.weight".into()),
        })
    }
}

/// The element type of the first MoE layer's `expert_bias`, which tells 2.0 from 2.1
/// (see [`Config::refine_family`]).
pub fn expert_bias_dtype(c: &Config, source: &dyn TensorSource) -> Option<DType> {
    let layer = c.first_k_dense_replace;
    source
        .tensor(&format!("model.layers.{layer}.mlp.gate.expert_bias"))
        .and_then(|t| t.dtype)
}
