//! The tensors of a LLaDA2 checkpoint: every name, shape and role a [`Config`] implies
//! (docs/model.md §4). Tensor names are spelled here and nowhere else: both loaders, the
//! random-checkpoint writer of `cargo xtask make-checkpoint`, `minnow inspect` and the test
//! helpers all take them from [`Tensor::name`]. `minnow convert` lives in minnow-format, below
//! this crate, and is handed [`routed_expert_family`] to find the routed experts by role.

use std::fmt::Write as _;

use crate::config::Config;

/// One projection of a SwiGLU MLP: `down(silu(gate(x)) ⊙ up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Projection {
    Gate,
    Up,
    Down,
}

impl Projection {
    /// In checkpoint order.
    pub const ALL: [Projection; 3] = [Projection::Gate, Projection::Up, Projection::Down];

    fn stem(self) -> &'static str {
        match self {
            Projection::Gate => "gate_proj",
            Projection::Up => "up_proj",
            Projection::Down => "down_proj",
        }
    }
}

/// Which MLP of a layer a projection belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mlp {
    /// The MLP of a dense layer (`i < first_k_dense_replace`).
    Dense,
    /// Routed expert `e` of a MoE layer.
    Expert(usize),
    /// The shared expert(s) of a MoE layer, stored as one MLP of `moe_intermediate_size ×
    /// num_shared_experts` rows.
    Shared,
}

/// What a tensor is for, which decides the element types a loader accepts and keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Embedding,
    /// An RMSNorm weight (layer norms, the per-head Q/K norms, the final norm).
    Norm,
    /// The fused QKV projection or the attention output projection.
    Attention,
    /// A projection of a dense layer's MLP.
    DenseMlp,
    /// The router matrix `[E, D]` (router math is F32 end to end).
    Router,
    /// The router's `expert_bias` `[E]` (BF16 in 2.0 checkpoints, F32 in 2.1/2.2).
    RouterBias,
    /// A projection of a routed expert.
    RoutedExpert,
    /// A projection of a shared expert.
    SharedExpert,
    LmHead,
}

impl Role {
    /// MLP projections may be stored quantized (a `.mnw`); every other tensor is a float.
    pub fn may_be_quantized(self) -> bool {
        matches!(
            self,
            Role::DenseMlp | Role::RoutedExpert | Role::SharedExpert
        )
    }
}

/// One tensor of a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tensor {
    Embedding,
    InputNorm(usize),
    /// Fused `[(H + 2G)·d, D]`, rows `[Q heads | K heads | V heads]`.
    Qkv(usize),
    QueryNorm(usize),
    KeyNorm(usize),
    /// Attention output `[D, H·d]`.
    AttentionOut(usize),
    PostAttentionNorm(usize),
    MlpProjection {
        layer: usize,
        mlp: Mlp,
        projection: Projection,
    },
    Router(usize),
    RouterBias(usize),
    FinalNorm,
    LmHead,
}

const LAYERS: &str = "model.layers.";

impl Tensor {
    /// The tensor's name in a checkpoint.
    pub fn name(&self) -> String {
        let layer = |i: usize, rest: &str| format!("{LAYERS}{i}.{rest}");
        match *self {
            Tensor::Embedding => "model.word_embeddings.weight".into(),
            Tensor::InputNorm(i) => layer(i, "input_layernorm.weight"),
            Tensor::Qkv(i) => layer(i, "attention.query_key_value.weight"),
            Tensor::QueryNorm(i) => layer(i, "attention.query_layernorm.weight"),
            Tensor::KeyNorm(i) => layer(i, "attention.key_layernorm.weight"),
            Tensor::AttentionOut(i) => layer(i, "attention.dense.weight"),
            Tensor::PostAttentionNorm(i) => layer(i, "post_attention_layernorm.weight"),
            Tensor::MlpProjection {
                layer: i,
                mlp,
                projection,
            } => {
                let mut name = format!("{LAYERS}{i}.mlp.");
                match mlp {
                    Mlp::Dense => {}
                    Mlp::Expert(e) => write!(name, "experts.{e}.").expect("String"),
                    Mlp::Shared => name.push_str("shared_experts."),
                }
                name.push_str(projection.stem());
                name.push_str(".weight");
                name
            }
            Tensor::Router(i) => layer(i, "mlp.gate.weight"),
            Tensor::RouterBias(i) => layer(i, "mlp.gate.expert_bias"),
            Tensor::FinalNorm => "model.norm.weight".into(),
            Tensor::LmHead => "lm_head.weight".into(),
        }
    }

    /// The tensor a checkpoint name spells (the inverse of [`Tensor::name`]); `None` for a name
    /// that is no LLaDA2 tensor.
    pub fn parse(name: &str) -> Option<Tensor> {
        match name {
            "model.word_embeddings.weight" => return Some(Tensor::Embedding),
            "model.norm.weight" => return Some(Tensor::FinalNorm),
            "lm_head.weight" => return Some(Tensor::LmHead),
            _ => {}
        }
        let (index, rest) = name.strip_prefix(LAYERS)?.split_once('.')?;
        let i = parse_index(index)?;
        let tensor = match rest {
            "input_layernorm.weight" => Tensor::InputNorm(i),
            "attention.query_key_value.weight" => Tensor::Qkv(i),
            "attention.query_layernorm.weight" => Tensor::QueryNorm(i),
            "attention.key_layernorm.weight" => Tensor::KeyNorm(i),
            "attention.dense.weight" => Tensor::AttentionOut(i),
            "post_attention_layernorm.weight" => Tensor::PostAttentionNorm(i),
            "mlp.gate.weight" => Tensor::Router(i),
            "mlp.gate.expert_bias" => Tensor::RouterBias(i),
            _ => {
                let stem = rest.strip_prefix("mlp.")?.strip_suffix(".weight")?;
                let (mlp, stem) = if let Some(s) = stem.strip_prefix("shared_experts.") {
                    (Mlp::Shared, s)
                } else if let Some(s) = stem.strip_prefix("experts.") {
                    let (e, s) = s.split_once('.')?;
                    (Mlp::Expert(parse_index(e)?), s)
                } else {
                    (Mlp::Dense, stem)
                };
                let projection = Projection::ALL.into_iter().find(|p| p.stem() == stem)?;
                Tensor::MlpProjection {
                    layer: i,
                    mlp,
                    projection,
                }
            }
        };
        Some(tensor)
    }

    pub fn role(&self) -> Role {
        match self {
            Tensor::Embedding => Role::Embedding,
            Tensor::InputNorm(_)
            | Tensor::QueryNorm(_)
            | Tensor::KeyNorm(_)
            | Tensor::PostAttentionNorm(_)
            | Tensor::FinalNorm => Role::Norm,
            Tensor::Qkv(_) | Tensor::AttentionOut(_) => Role::Attention,
            Tensor::MlpProjection { mlp, .. } => match mlp {
                Mlp::Dense => Role::DenseMlp,
                Mlp::Expert(_) => Role::RoutedExpert,
                Mlp::Shared => Role::SharedExpert,
            },
            Tensor::Router(_) => Role::Router,
            Tensor::RouterBias(_) => Role::RouterBias,
            Tensor::LmHead => Role::LmHead,
        }
    }

    /// The shape `c` implies, in PyTorch `[out, in]` order for matrices.
    pub fn shape(&self, c: &Config) -> Vec<usize> {
        let (d, v) = (c.hidden_size, c.vocab_size);
        match *self {
            Tensor::Embedding | Tensor::LmHead => vec![v, d],
            Tensor::InputNorm(_) | Tensor::PostAttentionNorm(_) | Tensor::FinalNorm => vec![d],
            Tensor::QueryNorm(_) | Tensor::KeyNorm(_) => vec![c.head_dim],
            Tensor::Qkv(_) => vec![c.qkv_rows(), d],
            Tensor::AttentionOut(_) => vec![d, c.num_attention_heads * c.head_dim],
            Tensor::MlpProjection {
                mlp, projection, ..
            } => {
                let width = match mlp {
                    Mlp::Dense => c.intermediate_size,
                    Mlp::Expert(_) => c.moe_intermediate_size,
                    Mlp::Shared => c.shared_intermediate_size(),
                };
                match projection {
                    Projection::Gate | Projection::Up => vec![width, d],
                    Projection::Down => vec![d, width],
                }
            }
            Tensor::Router(_) => vec![c.num_experts, d],
            Tensor::RouterBias(_) => vec![c.num_experts],
        }
    }

    /// For a routed expert's projection, its layer and projection: every expert of one layer
    /// shares them (what `minnow convert` quantizes with one shared global scale).
    pub fn routed_expert_group(&self) -> Option<(usize, Projection)> {
        match *self {
            Tensor::MlpProjection {
                layer,
                mlp: Mlp::Expert(_),
                projection,
            } => Some((layer, projection)),
            _ => None,
        }
    }
}

/// What `minnow convert` (minnow-format's `ConvertInput::expert_families`) asks of a checkpoint
/// name: for a tensor whose role is [`Role::RoutedExpert`], its family, the name with the expert
/// index as `*` (`model.layers.1.mlp.experts.*.down_proj.weight`: every expert of one layer and
/// projection, which share one encoding); `None` for every other name.
pub fn routed_expert_family(name: &str) -> Option<String> {
    let tensor = Tensor::parse(name).filter(|t| t.role() == Role::RoutedExpert)?;
    let (layer, projection) = tensor.routed_expert_group()?;
    Some(format!(
        "{LAYERS}{layer}.mlp.experts.*.{}.weight",
        projection.stem()
    ))
}

/// A decimal index without sign or leading zeros (so that a parsed name spells back the same).
fn parse_index(s: &str) -> Option<usize> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

/// Every tensor `c` implies, in checkpoint order: the embedding; per layer its norms and
/// attention, then the dense MLP or the router, its bias (when the config enables it), the
/// routed experts and the shared expert (when there is one); the final norm and the lm_head.
/// The Q/K norms are present only when `use_qk_norm` is set.
pub fn tensors(c: &Config) -> Vec<Tensor> {
    let mut out = vec![Tensor::Embedding];
    let mlp = |out: &mut Vec<Tensor>, layer: usize, mlp: Mlp| {
        out.extend(Projection::ALL.map(|projection| Tensor::MlpProjection {
            layer,
            mlp,
            projection,
        }));
    };
    for i in 0..c.num_hidden_layers {
        out.push(Tensor::InputNorm(i));
        out.push(Tensor::Qkv(i));
        if c.use_qk_norm {
            out.extend([Tensor::QueryNorm(i), Tensor::KeyNorm(i)]);
        }
        out.extend([Tensor::AttentionOut(i), Tensor::PostAttentionNorm(i)]);
        if c.is_dense_layer(i) {
            mlp(&mut out, i, Mlp::Dense);
        } else {
            out.push(Tensor::Router(i));
            if c.moe_router_enable_expert_bias {
                out.push(Tensor::RouterBias(i));
            }
            for e in 0..c.num_experts {
                mlp(&mut out, i, Mlp::Expert(e));
            }
            if c.num_shared_experts > 0 {
                mlp(&mut out, i, Mlp::Shared);
            }
        }
    }
    out.extend([Tensor::FinalNorm, Tensor::LmHead]);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use minnow_format::{Checkpoint, TensorSource};

    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(name)
    }

    /// Each fixture's safetensors file holds exactly the schema's tensors, with its shapes.
    #[test]
    fn every_fixture_holds_exactly_the_schema_tensors() {
        for name in ["llada2-tiny-v20", "llada2-tiny-v21", "llada2-tiny-v22"] {
            let dir = fixture(name);
            let c = Config::from_dir(&dir).unwrap();
            let source = Checkpoint::open(&dir).unwrap();
            let stored: BTreeMap<String, Vec<usize>> = source
                .names()
                .into_iter()
                .map(|n| (n.to_string(), source.tensor(n).unwrap().shape.to_vec()))
                .collect();
            let expected: BTreeMap<String, Vec<usize>> = tensors(&c)
                .iter()
                .map(|t| (t.name(), t.shape(&c)))
                .collect();
            assert_eq!(tensors(&c).len(), expected.len(), "{name}: a name twice");
            assert_eq!(stored, expected, "{name}");
        }
    }

    /// Names parse back to the tensor that spelled them; other names do not parse.
    #[test]
    fn names_parse_back_to_their_tensor() {
        let c = Config::from_dir(&fixture("llada2-tiny-v21")).unwrap();
        for t in tensors(&c) {
            assert_eq!(Tensor::parse(&t.name()), Some(t), "{}", t.name());
        }
        for bad in [
            "",
            "model.layers.0",
            "model.layers.x.input_layernorm.weight",
            "model.layers.01.input_layernorm.weight",
            "model.layers.-1.input_layernorm.weight",
            "model.layers.0.mlp.experts.1.gate_proj.bias",
            "model.layers.0.mlp.experts.gate_proj.weight",
            "model.layers.0.mlp.experts.07.gate_proj.weight",
            "model.layers.0.mlp.shared_experts.1.up_proj.weight",
            "model.layers.0.mlp.mid_proj.weight",
            "lm_head.bias",
        ] {
            assert_eq!(Tensor::parse(bad), None, "{bad}");
        }
    }

    /// Roles: what may be quantized, and which tensors are routed experts.
    #[test]
    fn roles_decide_quantization_and_expert_groups() {
        let c = Config::from_dir(&fixture("llada2-tiny-v21")).unwrap();
        let all = tensors(&c);
        let quantizable = all.iter().filter(|t| t.role().may_be_quantized()).count();
        // Layer 0: one dense MLP; layer 1: 16 routed experts and the shared expert.
        assert_eq!(quantizable, 3 * (1 + c.num_experts + 1));
        let routed: Vec<_> = all.iter().filter_map(|t| t.routed_expert_group()).collect();
        assert_eq!(routed.len(), 3 * c.num_experts);
        assert!(routed.iter().all(|&(layer, _)| layer == 1));
        assert_eq!(
            Tensor::parse("model.layers.1.mlp.experts.3.down_proj.weight")
                .and_then(|t| t.routed_expert_group()),
            Some((1, Projection::Down))
        );
        assert_eq!(Tensor::Router(1).role(), Role::Router);
        assert!(!Tensor::Router(1).role().may_be_quantized());
    }

    /// The family function `minnow convert` is handed finds exactly the tensors whose role is
    /// `RoutedExpert`, and gives one family per layer and projection.
    #[test]
    fn convert_finds_the_routed_experts_by_role() {
        for name in ["llada2-tiny-v20", "llada2-tiny-v22"] {
            let c = Config::from_dir(&fixture(name)).unwrap();
            let mut families = BTreeMap::<String, Vec<(usize, Projection)>>::new();
            for t in tensors(&c) {
                let family = routed_expert_family(&t.name());
                assert_eq!(
                    family.is_some(),
                    t.role() == Role::RoutedExpert,
                    "{}",
                    t.name()
                );
                if let Some(family) = family {
                    families
                        .entry(family)
                        .or_default()
                        .push(t.routed_expert_group().unwrap());
                }
            }
            // One family per (MoE layer, projection), each holding every expert of it.
            let moe_layers = (0..c.num_hidden_layers)
                .filter(|&i| !c.is_dense_layer(i))
                .count();
            assert_eq!(families.len(), 3 * moe_layers, "{name}");
            for (family, members) in &families {
                assert_eq!(members.len(), c.num_experts, "{family}");
                assert!(members.iter().all(|m| *m == members[0]), "{family}");
            }
        }
        assert_eq!(
            routed_expert_family("model.layers.1.mlp.experts.3.down_proj.weight").as_deref(),
            Some("model.layers.1.mlp.experts.*.down_proj.weight")
        );
        for other in [
            "model.layers.1.mlp.shared_experts.up_proj.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.1.mlp.gate.weight",
            "model.layers.1.mlp.experts.07.up_proj.weight",
            "model.layers.1.mlp.experts.3.mid_proj.weight",
        ] {
            assert_eq!(routed_expert_family(other), None, "{other}");
        }
    }

    /// Optional tensors follow the config's flags.
    #[test]
    fn flags_drop_the_optional_tensors() {
        let mut c = Config::from_dir(&fixture("llada2-tiny-v21")).unwrap();
        c.use_qk_norm = false;
        c.moe_router_enable_expert_bias = false;
        c.num_shared_experts = 0;
        let all = tensors(&c);
        assert!(!all.iter().any(|t| matches!(
            t,
            Tensor::QueryNorm(_) | Tensor::KeyNorm(_) | Tensor::RouterBias(_)
        )));
        assert!(!all.iter().any(|t| t.role() == Role::SharedExpert));
    }
}
