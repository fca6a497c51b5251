//! Broken checkpoints give one clear error naming what is wrong, never a panic; a sharded copy
//! of a fixture loads and computes the same logits as the single file.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use minnow_model::{CpuModel, CpuRunner, LogitsRows, SingleSequence};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

const NAME: &str = "llada2-tiny-v21";

/// One stored tensor, owned.
struct Owned {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn read_tensors() -> Vec<(String, Owned)> {
    let bytes = std::fs::read(fixture(NAME).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Owned)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let o = Owned {
                dtype: v.dtype(),
                shape: v.shape().to_vec(),
                data: v.data().to_vec(),
            };
            (n, o)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn write_tensors(path: &Path, tensors: &[(String, Owned)]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, o)| {
            (
                n.clone(),
                TensorView::new(o.dtype, o.shape.clone(), &o.data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A temp copy of the fixture's config.json with `tensors` as its weights.
fn checkpoint(tensors: &[(String, Owned)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture(NAME).join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    write_tensors(&dir.path().join("model.safetensors"), tensors);
    dir
}

fn load_err(dir: &Path) -> String {
    let err = match CpuModel::load(dir) {
        Ok(_) => panic!("{} loaded although it is broken", dir.display()),
        Err(e) => e.to_string(),
    };
    assert!(!err.contains('\n'), "one line: {err}");
    err
}

const VICTIM: &str = "model.layers.1.mlp.experts.3.up_proj.weight";

#[test]
fn missing_tensor_is_named() {
    let mut t = read_tensors();
    t.retain(|(n, _)| n != VICTIM);
    let err = load_err(checkpoint(&t).path());
    assert!(err.contains(VICTIM) && err.contains("missing"), "{err}");
}

#[test]
fn wrong_shape_is_named() {
    let mut t = read_tensors();
    let o = &mut t.iter_mut().find(|(n, _)| n == VICTIM).unwrap().1;
    o.shape = vec![o.shape[1], o.shape[0]];
    let err = load_err(checkpoint(&t).path());
    assert!(
        err.contains(VICTIM) && err.contains("shape [64, 32]"),
        "{err}"
    );
}

#[test]
fn wrong_dtype_is_named() {
    let mut t = read_tensors();
    let o = &mut t
        .iter_mut()
        .find(|(n, _)| n == "model.norm.weight")
        .unwrap()
        .1;
    o.dtype = Dtype::I16;
    let err = load_err(checkpoint(&t).path());
    assert!(
        err.contains("model.norm.weight") && err.contains("I16"),
        "{err}"
    );
}

#[test]
fn truncated_safetensors_is_an_error() {
    let dir = checkpoint(&read_tensors());
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("truncated") && err.contains("model.safetensors"),
        "{err}"
    );
}

#[test]
fn bad_config_is_an_error_naming_the_key() {
    let dir = checkpoint(&read_tensors());
    let path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("num_experts");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("'num_experts'") && err.contains("config.json"),
        "{err}"
    );

    // A config whose shapes disagree with the weights names the first mismatching tensor.
    cfg["num_experts"] = 16.into();
    cfg["hidden_size"] = 128.into();
    std::fs::write(&path, cfg.to_string()).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("model.word_embeddings.weight"), "{err}");

    std::fs::write(&path, "{not json").unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("not valid JSON"), "{err}");
    std::fs::remove_file(&path).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("config.json"), "{err}");
}

#[test]
fn sharded_checkpoint_with_mixed_dtypes_matches_single_file() {
    let mut t = read_tensors();
    // Store some tensors as F32 (BF16 → F32 is exact, so the goldens still apply).
    for (n, o) in t.iter_mut() {
        if n.ends_with("layernorm.weight") || n.ends_with("experts.0.down_proj.weight") {
            let vals: Vec<u8> = o
                .data
                .chunks_exact(2)
                .flat_map(|b| {
                    half::bf16::from_le_bytes([b[0], b[1]])
                        .to_f32()
                        .to_le_bytes()
                })
                .collect();
            o.dtype = Dtype::F32;
            o.data = vals;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture(NAME).join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let (a, b) = t.split_at(t.len() / 2);
    write_tensors(&dir.path().join("model-00001-of-00002.safetensors"), a);
    write_tensors(&dir.path().join("model-00002-of-00002.safetensors"), b);
    let mut map = HashMap::new();
    for (n, _) in a {
        map.insert(n.clone(), "model-00001-of-00002.safetensors");
    }
    for (n, _) in b {
        map.insert(n.clone(), "model-00002-of-00002.safetensors");
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();

    let mut runner = SingleSequence::new(CpuRunner::load(dir.path()).unwrap());
    let g = Golden::load(NAME);
    let seq = runner.create_sequence();
    let logits = runner
        .forward(seq, &g.input_ids(), LogitsRows::All)
        .unwrap();
    assert_close("sharded logits", &logits, &g.f32("logits"), 1e-3);

    // A shard listed by the index but absent is named.
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");
}
