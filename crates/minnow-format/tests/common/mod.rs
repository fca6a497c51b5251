//! What the `.mnw` tests share: a small in-memory BF16 checkpoint with routed-expert-shaped
//! tensors, its assets, and a converter call that writes it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use minnow_format::mnw::convert::{convert, ConvertInput, ConvertOptions};
use minnow_format::{TensorRef, TensorSource};
use minnow_runtime::DType;

/// An in-memory BF16 source with expert-shaped and other tensors.
pub struct Memory(BTreeMap<String, (Vec<usize>, Vec<u8>)>);

impl TensorSource for Memory {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        self.0.get(name).map(|(shape, data)| TensorRef {
            dtype: Some(DType::BF16),
            dtype_name: "BF16",
            shape,
            data,
            quant: None,
        })
    }
    fn names(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

pub fn bf16_bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            half::bf16::from_f32((s % 2001) as f32 / 1000.0 - 1.0).to_le_bytes()
        })
        .collect()
}

pub fn source() -> Memory {
    let mut m = BTreeMap::new();
    let mut add = |name: &str, shape: Vec<usize>, seed| {
        let n = shape.iter().product();
        m.insert(name.to_string(), (shape, bf16_bytes(n, seed)));
    };
    add("model.word_embeddings.weight", vec![40, 64], 1);
    add("model.norm.weight", vec![64], 2);
    for e in 0..3 {
        add(
            &format!("model.layers.1.mlp.experts.{e}.gate_proj.weight"),
            vec![32, 64],
            10 + e as u32,
        );
        add(
            &format!("model.layers.1.mlp.experts.{e}.down_proj.weight"),
            vec![64, 32],
            20 + e as u32,
        );
    }
    Memory(m)
}

/// The routed-expert families of [`source`]'s tensors (for a real checkpoint the model's tensor
/// schema answers this): its `experts.E.` tensors, grouped by layer and projection.
pub fn expert_family(name: &str) -> Option<String> {
    let (head, rest) = name.split_once(".experts.")?;
    let (_expert, tail) = rest.split_once('.')?;
    Some(format!("{head}.experts.*.{tail}"))
}

pub fn assets() -> BTreeMap<String, String> {
    [
        "config.json",
        "tokenizer.json",
        "chat_template.jinja",
        "generation_config.json",
    ]
    .iter()
    .map(|n| (n.to_string(), format!("contents of {n}")))
    .collect()
}

pub fn write(dir: &Path, name: &str, options: &ConvertOptions) -> PathBuf {
    let src = source();
    let input = ConvertInput {
        source: &src,
        expert_families: &expert_family,
        assets: assets(),
        model_id: "memory-model".into(),
    };
    let out = dir.join(name);
    convert(&input, &out, options, &AtomicBool::new(false), &|_, _| {}).unwrap();
    out
}
