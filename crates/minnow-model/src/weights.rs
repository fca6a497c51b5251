//! The validated weight set of a checkpoint: every tensor the forward pass reads, checked for
//! presence, element type and shape ([`crate::schema`]) before any compute.
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
use crate::schema::{self, Projection, Tensor};

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

/// Checks presence, element type and shape of every expected tensor; the error names the first
/// bad one.
pub fn validate(c: &Config, source: &dyn TensorSource) -> Result<()> {
    for t in schema::tensors(c) {
        check(source, &t.name(), &t.shape(c), t.role().may_be_quantized())?;
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
        let get = |t: Tensor| src.tensor(&t.name()).expect("validated tensor");
        let mat = |t: Tensor| {
            let t = get(t);
            StoredMat {
                dtype: t.dtype.expect("validated dtype"),
                rows: t.shape[0],
                cols: t.shape[1],
                ptr: t.data.as_ptr(),
                len: t.data.len(),
                _source: Arc::clone(&source),
            }
        };
        let vector = |t: Tensor| {
            let t = get(t);
            widen(t.dtype.expect("validated dtype"), t.data)
        };
        let mlp_mat = |t: Tensor| {
            let stored = get(t);
            match stored.quant {
                None => MlpMat::Float(mat(t)),
                Some(q) => MlpMat::Quant(QuantStoredMat {
                    encoding: q.encoding,
                    rows: stored.shape[0],
                    cols: stored.shape[1],
                    group_size: q.group_size,
                    global_scale: q.global_scale,
                    codes: (stored.data.as_ptr(), stored.data.len()),
                    scales: (q.scales.as_ptr(), q.scales.len()),
                    _source: Arc::clone(&source),
                }),
            }
        };
        let mlp = |layer: usize, mlp: schema::Mlp| {
            let projection = |projection| {
                mlp_mat(Tensor::MlpProjection {
                    layer,
                    mlp,
                    projection,
                })
            };
            Mlp {
                gate: projection(Projection::Gate),
                up: projection(Projection::Up),
                down: projection(Projection::Down),
            }
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let attention = Attention {
                qkv: mat(Tensor::Qkv(i)),
                q_norm: c.use_qk_norm.then(|| vector(Tensor::QueryNorm(i))),
                k_norm: c.use_qk_norm.then(|| vector(Tensor::KeyNorm(i))),
                dense: mat(Tensor::AttentionOut(i)),
            };
            let ffn = if c.is_dense_layer(i) {
                FeedForward::Dense(mlp(i, schema::Mlp::Dense))
            } else {
                FeedForward::Moe(Moe {
                    router: vector(Tensor::Router(i)),
                    expert_bias: if c.moe_router_enable_expert_bias {
                        vector(Tensor::RouterBias(i))
                    } else {
                        vec![0.0; c.num_experts]
                    },
                    experts: (0..c.num_experts)
                        .map(|e| mlp(i, schema::Mlp::Expert(e)))
                        .collect(),
                    shared: (c.num_shared_experts > 0).then(|| mlp(i, schema::Mlp::Shared)),
                })
            };
            layers.push(Layer {
                input_norm: vector(Tensor::InputNorm(i)),
                attention,
                post_attention_norm: vector(Tensor::PostAttentionNorm(i)),
                ffn,
            });
        }
        Ok(Weights {
            embed: mat(Tensor::Embedding),
            layers,
            final_norm: vector(Tensor::FinalNorm),
            lm_head: mat(Tensor::LmHead),
        })
    }
}

/// The element type of the first MoE layer's `expert_bias`, which tells 2.0 from 2.1
/// (see [`Config::refine_family`]).
pub fn expert_bias_dtype(c: &Config, source: &dyn TensorSource) -> Option<DType> {
    source
        .tensor(&Tensor::RouterBias(c.first_k_dense_replace).name())
        .and_then(|t| t.dtype)
}
