//! Helpers shared by the model's integration tests: fixture paths and golden tensors.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use minnow_format::mnw::convert::{
    convert, ConvertInput, ConvertOptions, ExpertChoice, QuantLayout,
};
use minnow_format::{Checkpoint, TensorRef, TensorSource};
use minnow_runtime::DType;

use minnow_model::schema::{self, Role, Tensor};
use minnow_model::Config;
use safetensors::{Dtype, SafeTensors};

pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");
pub const ALL: [&str; 3] = ["llada2-tiny-v20", "llada2-tiny-v21", "llada2-tiny-v22"];

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(FIXTURES).join(name)
}

/// The tensors of a fixture's `golden.safetensors`, widened to F32 / I64.
pub struct Golden {
    bytes: Vec<u8>,
}

impl Golden {
    pub fn load(name: &str) -> Golden {
        Golden {
            bytes: std::fs::read(fixture(name).join("golden.safetensors")).unwrap(),
        }
    }

    fn view(&self, key: &str) -> safetensors::tensor::TensorView<'_> {
        SafeTensors::deserialize(&self.bytes)
            .unwrap()
            .tensor(key)
            .unwrap_or_else(|e| panic!("golden tensor {key}: {e}"))
    }

    pub fn has(&self, key: &str) -> bool {
        SafeTensors::deserialize(&self.bytes)
            .unwrap()
            .tensor(key)
            .is_ok()
    }

    pub fn f32(&self, key: &str) -> Vec<f32> {
        let v = self.view(key);
        assert_eq!(v.dtype(), Dtype::F32, "{key}");
        v.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn i64(&self, key: &str) -> Vec<i64> {
        let v = self.view(key);
        assert_eq!(v.dtype(), Dtype::I64, "{key}");
        v.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn u8(&self, key: &str) -> Vec<u8> {
        self.view(key).data().to_vec()
    }

    pub fn shape(&self, key: &str) -> Vec<usize> {
        self.view(key).shape().to_vec()
    }

    pub fn input_ids(&self) -> Vec<u32> {
        self.i64("input_ids").iter().map(|&v| v as u32).collect()
    }
}

/// Largest absolute difference; panics on a length mismatch.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0.0f32,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}

pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32) {
    let d = max_abs_diff(got, want);
    assert!(d <= atol, "{what}: max abs error {d:e} > {atol:e}");
}

/// Asserts that `got` and `want` have the same length and the same bits in every element.
pub fn assert_bit_identical(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let differ: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&first) = differ.first() {
        panic!(
            "{what}: {} of {} values differ in their bits (first at {first}: {} vs {}; max abs \
             error {:e})",
            differ.len(),
            got.len(),
            got[first],
            want[first],
            max_abs_diff(got, want)
        );
    }
}

pub struct Rng(pub u64);

impl Rng {
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (v >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Writes a random checkpoint for `config` (BF16 weights; `expert_bias` in `bias_dtype`).
pub fn random_checkpoint(
    config: serde_json::Value,
    bias_dtype: Dtype,
    seed: u64,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let c = Config::from_dir(dir.path()).unwrap();
    // Scale of each tensor's uniform values; a negative scale marks norm weights.
    let shapes: Vec<(Tensor, Vec<usize>, f32)> = schema::tensors(&c)
        .into_iter()
        .map(|t| {
            let scale = match t.role() {
                Role::Embedding => 1.0,
                Role::Norm => -1.0,
                Role::LmHead | Role::Router => 0.5,
                Role::RouterBias => 0.1,
                Role::Attention | Role::DenseMlp | Role::RoutedExpert | Role::SharedExpert => 0.3,
            };
            (t, t.shape(&c), scale)
        })
        .collect();
    let mut rng = Rng(seed | 1);
    let data: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = shapes
        .into_iter()
        .map(|(tensor, shape, scale)| {
            let count: usize = shape.iter().product();
            // scale < 0 marks norm weights: 1 + 0.1·u.
            let vals: Vec<f32> = (0..count)
                .map(|_| {
                    if scale < 0.0 {
                        1.0 + 0.1 * rng.next()
                    } else {
                        scale * rng.next()
                    }
                })
                .collect();
            let dtype = if tensor.role() == Role::RouterBias {
                bias_dtype
            } else {
                Dtype::BF16
            };
            let bytes: Vec<u8> = match dtype {
                Dtype::F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
                _ => vals
                    .iter()
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect(),
            };
            (tensor.name(), shape, dtype, bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, s, dt, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

/// A source that serves every quantized tensor of `inner` as F32 (dequantized once, here) and
/// every other tensor as it is stored.
pub struct Dequantized {
    inner: Arc<Checkpoint>,
    widened: BTreeMap<String, (Vec<usize>, Vec<u8>)>,
}

impl Dequantized {
    pub fn new(inner: Arc<Checkpoint>) -> Self {
        let mut widened = BTreeMap::new();
        for name in inner.names() {
            let t = inner.tensor(name).unwrap();
            if let Some(q) = t.quant_mat() {
                let mut values = vec![0.0f32; q.rows * q.cols];
                q.dequantize(&mut values);
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                widened.insert(name.to_string(), (t.shape.to_vec(), bytes));
            }
        }
        assert!(!widened.is_empty(), "no quantized tensor to compare");
        Self { inner, widened }
    }
}

impl TensorSource for Dequantized {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        match self.widened.get(name) {
            Some((shape, data)) => Some(TensorRef {
                dtype: Some(DType::F32),
                dtype_name: "F32",
                shape,
                data,
                quant: None,
            }),
            None => self.inner.tensor(name),
        }
    }
    fn names(&self) -> Vec<&str> {
        self.inner.names()
    }
    fn describe(&self) -> String {
        format!("{} (dequantized)", self.inner.describe())
    }
}

/// Converts fixture `name` into a `.mnw` at `out`: its config and tokenizer as assets, and a
/// stand-in chat template (the format requires one; the forward does not read it).
pub fn write_fixture_mnw(name: &str, out: &std::path::Path, options: &ConvertOptions) {
    let source = Checkpoint::open(&fixture(name)).unwrap();
    let mut assets = BTreeMap::new();
    for file in ["config.json", "tokenizer.json"] {
        let text = std::fs::read_to_string(fixture(name).join(file)).unwrap();
        assets.insert(file.to_string(), text);
    }
    assets.insert("chat_template.jinja".into(), "{{ messages }}".into());
    let input = ConvertInput {
        source: &source,
        expert_families: &minnow_model::schema::routed_expert_family,
        assets,
        model_id: name.into(),
    };
    let cancel = std::sync::atomic::AtomicBool::new(false);
    convert(&input, out, options, &cancel, &|_, _| {}).unwrap();
}

/// Conversion options quantizing the routed experts with groups of 32 (the fixtures' expert
/// matrices have K of 32 or 64).
pub fn quantized_options(experts: ExpertChoice, layout: QuantLayout) -> ConvertOptions {
    ConvertOptions {
        experts,
        layout,
        group_size: Some(32),
        workers: 2,
        ..ConvertOptions::default()
    }
}
