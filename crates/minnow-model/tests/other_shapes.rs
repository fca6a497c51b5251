//! The CPU forward on random checkpoints of shapes the fixtures do not have (MHA, other GQA
//! ratios, expert counts, groups, top-k, shared-expert widths, several or no dense layers,
//! partial rotary factors, block sizes, BF16 or F32 `expert_bias`), against a naive
//! transcription of model doc §7 written for this test: scalar loops, f64 sums, no cache, no
//! kernels. The naive reference is itself checked against the official goldens first.

// The naive reference indexes positions, heads and dims like the formulas it transcribes.
#![allow(clippy::needless_range_loop)]

mod common;

use std::path::Path;

use common::*;
use minnow_model::schema::{Mlp, Projection, Tensor};
use minnow_model::{Config, CpuModel, CpuRunner, LogitsRows, SingleSequence};
use safetensors::{Dtype, SafeTensors};

/// All tensors of a checkpoint, widened to f64, by name.
struct Tensors(std::collections::HashMap<String, (Vec<usize>, Vec<f64>)>);

impl Tensors {
    fn load(dir: &Path) -> Tensors {
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut map = std::collections::HashMap::new();
        for (name, v) in st.tensors() {
            let vals: Vec<f64> = match v.dtype() {
                Dtype::BF16 => v
                    .data()
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64())
                    .collect(),
                Dtype::F32 => v
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
                    .collect(),
                d => panic!("{name}: {d:?}"),
            };
            map.insert(name, (v.shape().to_vec(), vals));
        }
        Tensors(map)
    }

    fn get(&self, tensor: Tensor) -> &[f64] {
        let name = tensor.name();
        &self.0.get(&name).unwrap_or_else(|| panic!("{name}")).1
    }
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
}

/// `y = x · Wᵀ` for one row, W `[out, in]`.
fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn mlp(t: &Tensors, layer: usize, mlp: Mlp, x: &[f64]) -> Vec<f64> {
    let w = |projection| {
        t.get(Tensor::MlpProjection {
            layer,
            mlp,
            projection,
        })
    };
    let g = matvec(w(Projection::Gate), x);
    let u = matvec(w(Projection::Up), x);
    let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
    matvec(w(Projection::Down), &a)
}

/// Indices of the `k` largest values among `cand`, largest first, ties to the lower index.
fn top_k(v: &[f64], cand: &[usize], k: usize) -> Vec<usize> {
    let mut c = cand.to_vec();
    c.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap().then(a.cmp(&b)));
    c.truncate(k);
    c
}

/// The naive forward: logits `[n, vocab]` for `ids` at positions 0..n.
fn naive_forward(c: &Config, t: &Tensors, ids: &[u32]) -> Vec<f64> {
    let (n, dm, h, g, d) = (
        ids.len(),
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    );
    let eps = c.rms_norm_eps as f64;
    let emb = t.get(Tensor::Embedding);
    let mut hs: Vec<Vec<f64>> = ids
        .iter()
        .map(|&i| emb[i as usize * dm..(i as usize + 1) * dm].to_vec())
        .collect();
    let r = c.rotary_dim;
    for layer in 0..c.num_hidden_layers {
        // Attention.
        let mut q = vec![vec![vec![0.0; d]; h]; n];
        let mut k = vec![vec![vec![0.0; d]; g]; n];
        let mut v = vec![vec![vec![0.0; d]; g]; n];
        for i in 0..n {
            let a = rms_norm(&hs[i], t.get(Tensor::InputNorm(layer)), eps);
            let qkv = matvec(t.get(Tensor::Qkv(layer)), &a);
            for head in 0..h + 2 * g {
                let mut x = qkv[head * d..(head + 1) * d].to_vec();
                if head < h + g {
                    let norm = if head < h {
                        Tensor::QueryNorm(layer)
                    } else {
                        Tensor::KeyNorm(layer)
                    };
                    x = rms_norm(&x, t.get(norm), eps);
                    let x0 = x.clone();
                    for j in 0..r / 2 {
                        let inv = 1.0 / (c.rope_theta as f64).powf(2.0 * j as f64 / r as f64);
                        let (s, co) = (i as f64 * inv).sin_cos();
                        x[j] = x0[j] * co - x0[j + r / 2] * s;
                        x[j + r / 2] = x0[j + r / 2] * co + x0[j] * s;
                    }
                }
                match head {
                    hh if hh < h => q[i][hh] = x,
                    hh if hh < h + g => k[i][hh - h] = x,
                    hh => v[i][hh - h - g] = x,
                }
            }
        }
        for i in 0..n {
            let mut out = Vec::with_capacity(h * d);
            for head in 0..h {
                let kv = head / (h / g);
                let allowed: Vec<usize> = (0..n)
                    .filter(|&j| j / c.block_size <= i / c.block_size)
                    .collect();
                let scores: Vec<f64> = allowed
                    .iter()
                    .map(|&j| {
                        q[i][head]
                            .iter()
                            .zip(&k[j][kv])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for dd in 0..d {
                    out.push(
                        allowed
                            .iter()
                            .zip(&e)
                            .map(|(&j, w)| w / sum * v[j][kv][dd])
                            .sum(),
                    );
                }
            }
            let o = matvec(t.get(Tensor::AttentionOut(layer)), &out);
            for (a, b) in hs[i].iter_mut().zip(o) {
                *a += b;
            }
        }
        // Feed-forward.
        let ms: Vec<Vec<f64>> = hs
            .iter()
            .map(|x| rms_norm(x, t.get(Tensor::PostAttentionNorm(layer)), eps))
            .collect();
        let ffn: Vec<Vec<f64>> = if layer < c.first_k_dense_replace {
            ms.iter().map(|m| mlp(t, layer, Mlp::Dense, m)).collect()
        } else {
            let e = c.num_experts;
            let bias = t.get(Tensor::RouterBias(layer));
            let scores: Vec<Vec<f64>> = ms
                .iter()
                .map(|m| {
                    matvec(t.get(Tensor::Router(layer)), m)
                        .iter()
                        .map(|l| 1.0 / (1.0 + (-l).exp()))
                        .collect()
                })
                .collect();
            let biased: Vec<Vec<f64>> = scores
                .iter()
                .map(|s| s.iter().zip(bias).map(|(a, b)| a + b).collect())
                .collect();
            let all: Vec<usize> = (0..e).collect();
            let chosen: Vec<Vec<usize>> = match c.expert_capacity {
                Some(cap) => (0..n)
                    .map(|i| {
                        let blk = i / c.block_size;
                        let rows = (blk * c.block_size..((blk + 1) * c.block_size).min(n))
                            .collect::<Vec<_>>();
                        let gmax: Vec<f64> = (0..e)
                            .map(|j| rows.iter().map(|&r| biased[r][j]).fold(f64::MIN, f64::max))
                            .collect();
                        let pool = top_k(&gmax, &all, cap);
                        top_k(&biased[i], &pool, c.num_experts_per_tok)
                    })
                    .collect(),
                None => {
                    let (ng, tg) = (c.n_group.unwrap(), c.topk_group.unwrap());
                    let gs = e / ng;
                    (0..n)
                        .map(|i| {
                            let b = &biased[i];
                            let group_scores: Vec<f64> = (0..ng)
                                .map(|gi| {
                                    let members: Vec<usize> = (gi * gs..(gi + 1) * gs).collect();
                                    top_k(b, &members, 2).iter().map(|&j| b[j]).sum()
                                })
                                .collect();
                            let groups = top_k(&group_scores, &(0..ng).collect::<Vec<_>>(), tg);
                            let cand: Vec<usize> = groups
                                .iter()
                                .flat_map(|&gi| gi * gs..(gi + 1) * gs)
                                .collect();
                            top_k(b, &cand, c.num_experts_per_tok)
                        })
                        .collect()
                }
            };
            (0..n)
                .map(|i| {
                    let gsum: f64 = chosen[i].iter().map(|&j| scores[i][j]).sum();
                    let mut out = vec![0.0; dm];
                    for &j in &chosen[i] {
                        let w = scores[i][j] / (gsum + 1e-20) * c.routed_scaling_factor as f64;
                        let y = mlp(t, layer, Mlp::Expert(j), &ms[i]);
                        for (o, y) in out.iter_mut().zip(y) {
                            *o += w * y;
                        }
                    }
                    if c.num_shared_experts > 0 {
                        let s = mlp(t, layer, Mlp::Shared, &ms[i]);
                        for (o, s) in out.iter_mut().zip(s) {
                            *o += s;
                        }
                    }
                    out
                })
                .collect()
        };
        for (hrow, f) in hs.iter_mut().zip(ffn) {
            for (a, b) in hrow.iter_mut().zip(f) {
                *a += b;
            }
        }
    }
    let mut logits = Vec::with_capacity(n * c.vocab_size);
    for x in &hs {
        let hf = rms_norm(x, t.get(Tensor::FinalNorm), eps);
        logits.extend(matvec(t.get(Tensor::LmHead), &hf));
    }
    logits
}

fn compare(dir: &Path, ids: &[u32], what: &str) {
    let mut runner = SingleSequence::new(CpuRunner::load(dir).unwrap());
    let seq = runner.create_sequence();
    let got = runner.forward(seq, ids, LogitsRows::All).unwrap();
    let want: Vec<f32> = naive_forward(runner.config(), &Tensors::load(dir), ids)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    assert_close(what, &got, &want, 1e-3);
}

/// The naive reference reproduces the official goldens, so it can judge other shapes.
#[test]
fn naive_reference_matches_the_goldens() {
    for name in ALL {
        let g = Golden::load(name);
        let c = CpuModel::load(&fixture(name)).unwrap().config().clone();
        let want = g.f32("logits");
        let got: Vec<f32> = naive_forward(&c, &Tensors::load(&fixture(name)), &g.input_ids())
            .into_iter()
            .map(|v| v as f32)
            .collect();
        assert_close(&format!("{name} naive vs golden"), &got, &want, 1e-3);
    }
}

fn base_config() -> serde_json::Value {
    serde_json::json!({
        "model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"],
        "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "num_experts": 8, "num_experts_per_tok": 2,
        "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
        "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5, "max_position_embeddings": 256, "hidden_act": "silu",
        "score_function": "sigmoid", "use_qk_norm": true, "use_qkv_bias": false,
        "use_bias": false, "norm_head": false, "tie_word_embeddings": false,
        "use_sliding_window": false, "rope_scaling": null, "moe_router_enable_expert_bias": true
    })
}

fn with(mut v: serde_json::Value, pairs: &[(&str, serde_json::Value)]) -> serde_json::Value {
    for (k, val) in pairs {
        if val.is_null() {
            v.as_object_mut().unwrap().remove(*k);
        } else {
            v[*k] = val.clone();
        }
    }
    v
}

fn ids(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| ((rng.next() + 1.0) * 0.5 * vocab as f32) as u32 % vocab)
        .collect()
}

#[test]
fn mha_several_dense_layers_bf16_bias() {
    // H == G, three layers of which two dense, a quarter of each head rotated, wide groups.
    let cfg = with(
        base_config(),
        &[
            ("num_key_value_heads", 4.into()),
            ("num_hidden_layers", 3.into()),
            ("first_k_dense_replace", 2.into()),
            ("partial_rotary_factor", 0.25.into()),
            ("n_group", 2.into()),
            ("topk_group", 1.into()),
            ("num_experts_per_tok", 3.into()),
        ],
    );
    let dir = random_checkpoint(cfg, Dtype::BF16, 11);
    compare(dir.path(), &ids(70, 96, 1), "MHA, 2 dense layers");
}

#[test]
fn gqa_4_to_1_all_moe_f32_bias_wide_shared_expert() {
    // GQA 8:2, head_dim derived from hidden/heads (64/8), every layer MoE, 12 experts in 4
    // groups of 3, top-3, two shared experts, full rotary.
    let cfg = with(
        base_config(),
        &[
            ("hidden_size", 64.into()),
            ("num_attention_heads", 8.into()),
            ("num_key_value_heads", 2.into()),
            ("head_dim", serde_json::Value::Null),
            ("first_k_dense_replace", 0.into()),
            ("num_experts", 12.into()),
            ("num_experts_per_tok", 3.into()),
            ("n_group", 4.into()),
            ("topk_group", 2.into()),
            ("num_shared_experts", 2.into()),
            ("partial_rotary_factor", 1.0.into()),
        ],
    );
    let dir = random_checkpoint(cfg, Dtype::F32, 22);
    compare(dir.path(), &ids(64, 96, 2), "GQA 4:1, all MoE");
}

#[test]
fn block_routing_with_block_size_16_and_a_partial_block() {
    let cfg = with(
        base_config(),
        &[
            ("n_group", serde_json::Value::Null),
            ("topk_group", serde_json::Value::Null),
            ("expert_capacity", 3.into()),
            ("block_size", 16.into()),
            ("num_experts", 8.into()),
            ("num_experts_per_tok", 2.into()),
            ("num_shared_experts", 0.into()),
        ],
    );
    let dir = random_checkpoint(cfg, Dtype::F32, 33);
    compare(dir.path(), &ids(57, 96, 3), "2.2 block size 16");
}
