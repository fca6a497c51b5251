//! `minnow inspect [FILE]`: what a checkpoint is (family, shapes, parameter count, bytes per stored
//! dtype or encoding, group sizes, special token ids) and whether every tensor the forward pass
//! needs is present with the right type and shape. A directory or a `.mnw` file; reads headers
//! and the manifest only, computes nothing.

use std::collections::BTreeMap;

use minnow_format::{Checkpoint, TensorSource};
use minnow_model::schema::{Role, Tensor};
use minnow_model::weights::validate;
use minnow_model::Config;

use super::global::{file_or_model, Global};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The checkpoint (directory or .mnw file); default: --model, else the bundled fixture.
    pub file: Option<std::path::PathBuf>,
}

pub fn run(cli: &Global, args: &Args) -> Result<(), String> {
    super::forward::show_warnings();
    let path = &file_or_model(cli, args.file.as_ref());
    let (c, source) = minnow_model::checkpoint::open(path).map_err(|e| e.to_string())?;
    validate(&c, &source).map_err(|e| e.to_string())?;
    print!("{}", report(&c, &source));
    Ok(())
}

fn report(c: &Config, source: &Checkpoint) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("checkpoint     {}", source.describe()));
    line(format!(
        "family         LLaDA{} ({})",
        c.family.version(),
        if c.block_routing() {
            format!(
                "block routing, expert_capacity {}",
                c.expert_capacity.unwrap_or(0)
            )
        } else {
            format!(
                "group-limited routing, n_group {} topk_group {}",
                c.n_group.unwrap_or(0),
                c.topk_group.unwrap_or(0)
            )
        }
    ));
    let moe_layers = c.num_hidden_layers - c.first_k_dense_replace;
    line(format!(
        "layers         {} ({} dense, {moe_layers} MoE)",
        c.num_hidden_layers, c.first_k_dense_replace
    ));
    line(format!(
        "hidden         {} (dense MLP {}, expert {}, shared experts {})",
        c.hidden_size, c.intermediate_size, c.moe_intermediate_size, c.num_shared_experts
    ));
    line(format!(
        "attention      {} query / {} kv heads, head_dim {}, rotary {} dims, rope_theta {}",
        c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim, c.rope_theta
    ));
    line(format!(
        "experts        {} routed, top-{}, routed_scaling_factor {}",
        c.num_experts, c.num_experts_per_tok, c.routed_scaling_factor
    ));
    line(format!(
        "vocab          {}; context {}; block size {}",
        c.vocab_size, c.max_position_embeddings, c.block_size
    ));

    // Parameter counts from the stored tensors; routed experts are active k of E per token.
    let mut total = 0usize;
    let mut routed = 0usize;
    let mut bytes: BTreeMap<String, usize> = BTreeMap::new();
    // Per encoding and group size: tensors and bytes (codes plus scales).
    let mut encodings: BTreeMap<(String, usize), (usize, usize)> = BTreeMap::new();
    // What the CUDA loader holds on the GPU, per form: integer expert codes and scales as
    // stored, NVFP4 and FP8 experts repacked (E2M1 codes with BF16 block scales; E4M3 codes with
    // an F32 block scale per 8-row band and group) where the kernels take their shape, the
    // router's bias (and a router not stored in BF16) in F32, everything else in BF16.
    let mut on_gpu: BTreeMap<&'static str, usize> = BTreeMap::new();
    for name in source.names() {
        let t = source.tensor(name).expect("listed tensor");
        let role = Tensor::parse(name).map(|t| t.role());
        let (rows, cols) = match t.shape[..] {
            [r, c] => (r, c),
            _ => (0, 0),
        };
        let repacked = t
            .quant
            .and_then(|q| minnow_runtime::cuda::ops::repacked_bytes(q.encoding, rows, cols));
        let gpu_form = match (t.quant.map(|q| q.encoding), repacked) {
            (Some(minnow_runtime::QuantEncoding::Nvfp4), Some((codes, scales))) => {
                ("e2m1", codes + scales)
            }
            (Some(minnow_runtime::QuantEncoding::Fp8Block), Some((codes, scales))) => {
                ("e4m3", codes + scales)
            }
            (
                Some(
                    e @ (minnow_runtime::QuantEncoding::I8Mma
                    | minnow_runtime::QuantEncoding::I4Mma
                    | minnow_runtime::QuantEncoding::I8Sym
                    | minnow_runtime::QuantEncoding::I4Sym),
                ),
                _,
            ) => {
                let form = if matches!(
                    e,
                    minnow_runtime::QuantEncoding::I8Mma | minnow_runtime::QuantEncoding::I8Sym
                ) {
                    "i8_mma"
                } else {
                    "i4_mma"
                };
                (form, t.data.len() + t.quant.map_or(0, |q| q.scales.len()))
            }
            // The router (when not stored in BF16) and its bias stay F32.
            _ if role == Some(Role::RouterBias)
                || (role == Some(Role::Router) && t.dtype_name != "BF16") =>
            {
                ("f32", t.numel() * 4)
            }
            _ => ("bf16", t.numel() * 2),
        };
        *on_gpu.entry(gpu_form.0).or_default() += gpu_form.1;
        total += t.numel();
        if role == Some(Role::RoutedExpert) {
            routed += t.numel();
        }
        let stored = t.data.len() + t.quant.map_or(0, |q| q.scales.len());
        *bytes.entry(t.dtype_name.to_string()).or_default() += stored;
        let group = t.quant.map_or(0, |q| q.group_size);
        let entry = encodings
            .entry((t.dtype_name.to_string(), group))
            .or_default();
        entry.0 += 1;
        entry.1 += stored;
    }
    let active =
        total - routed + routed / c.num_experts.max(1) * c.num_experts_per_tok.min(c.num_experts);
    line(format!(
        "parameters     {} total, {} active per token ({} in routed experts)",
        human(total),
        human(active),
        human(routed)
    ));
    let per_dtype: Vec<String> = bytes
        .iter()
        .map(|(d, b)| format!("{d} {}", human_bytes(*b)))
        .collect();
    line(format!("stored bytes   {}", per_dtype.join(", ")));
    let gpu_total: usize = on_gpu.values().sum();
    let gpu_parts: Vec<String> = on_gpu
        .iter()
        .map(|(form, b)| format!("{form} {}", human_bytes(*b)))
        .collect();
    line(format!(
        "weights on GPU {} ({})",
        human_bytes(gpu_total),
        gpu_parts.join(", ")
    ));
    if let Checkpoint::Mnw(file) = source {
        line(format!(
            "container      .mnw version {}, model_id {:?}, {} assets ({})",
            file.manifest().version,
            file.manifest().model_id,
            file.manifest().assets.len(),
            file.manifest()
                .assets
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for ((encoding, group), (tensors, stored)) in &encodings {
            let group = if *group > 0 {
                format!(", group size {group}")
            } else {
                String::new()
            };
            let ours = match minnow_runtime::QuantEncoding::parse(encoding) {
                Some(q) if !q.is_published() => {
                    " (minnow's own encoding; other .mnw readers do not read it)"
                }
                _ => "",
            };
            line(format!(
                "encoding       {encoding}{group}: {tensors} tensors, {}{ours}",
                human_bytes(*stored)
            ));
        }
    }

    let tokens = special_tokens(source, c);
    line(format!("special tokens {}", tokens.join(", ")));
    line("tensors        all expected tensors present with the right dtype and shape".into());
    out
}

/// Special token ids (model doc §8): by content from tokenizer.json `added_tokens`, else from
/// generation_config.json / config.json, else the documented LLaDA2 constant (marked as such).
/// DELETE/SPLIT come from config.json (2.2).
fn special_tokens(source: &Checkpoint, c: &Config) -> Vec<String> {
    let read_json = |file: &str| -> Option<serde_json::Value> {
        serde_json::from_str(&source.asset(file).ok()??).ok()
    };
    let added: BTreeMap<String, u64> = read_json("tokenizer.json")
        .and_then(|j| j.get("added_tokens").and_then(|a| a.as_array()).cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|t| {
            Some((
                t.get("content")?.as_str()?.to_string(),
                t.get("id")?.as_u64()?,
            ))
        })
        .collect();
    let generation = read_json("generation_config.json");
    let from_generation = |key: &str| {
        generation
            .as_ref()
            .and_then(|g| g.get(key))
            .and_then(|v| v.as_u64().or_else(|| v.as_array()?.first()?.as_u64()))
    };
    let mut out = Vec::new();
    for (label, content, fallback, constant) in [
        (
            "mask",
            "<|mask|>",
            from_generation("mask_token_id"),
            Some(156895),
        ),
        (
            "eos",
            "<|endoftext|>",
            c.eos_token_id
                .map(u64::from)
                .or(from_generation("eos_token_id")),
            Some(156892),
        ),
        ("role_end", "<|role_end|>", None, None),
        (
            "bos",
            "<|startoftext|>",
            from_generation("bos_token_id"),
            Some(156891),
        ),
    ] {
        let text = match (added.get(content), fallback, constant) {
            (Some(id), _, _) => format!("{label} {id} {content}"),
            (None, Some(id), _) => format!("{label} {id} (from the config files)"),
            (None, None, Some(id)) => {
                format!("{label} {id} (LLaDA2 default; not named by the checkpoint)")
            }
            (None, None, None) => format!("{label} unknown ({content} not in tokenizer.json)"),
        };
        out.push(text);
    }
    if let Some(id) = c.delete_token_id {
        out.push(format!("delete {id}"));
    }
    if let Some(id) = c.split_token_id {
        out.push(format!("split {id}"));
    }
    out
}

fn human(n: usize) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

pub fn human_bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.2} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}
