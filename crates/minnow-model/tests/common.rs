//! Helpers shared by the model's integration tests: fixture paths and golden tensors.

#![allow(dead_code)]

use std::path::PathBuf;

use safetensors::SafeTensors;

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
        assert_eq!(v.dtype(), safetensors::Dtype::F32, "{key}");
        v.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn i64(&self, key: &str) -> Vec<i64> {
        let v = self.view(key);
        assert_eq!(v.dtype(), safetensors::Dtype::I64, "{key}");
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
