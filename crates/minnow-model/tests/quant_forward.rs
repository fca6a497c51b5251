//! The CPU forward with quantized experts read straight from their codes equals the forward of
//! the same model whose quantized tensors were dequantized to F32 up front and run as ordinary
//! F32 weights: the quantized products decode exactly the rows they need and multiply them the
//! same way, so the two agree to well within 1e-5 (relative to the largest logit).

mod common;

use std::sync::Arc;

use common::*;
use minnow_format::mnw::convert::{ExpertChoice, QuantLayout};
use minnow_format::TensorSource;
use minnow_model::{Config, CpuModel, CpuRunner, LogitsRows, SingleSequence};

fn logits(config: Config, source: Arc<dyn TensorSource>, ids: &[u32]) -> Vec<f32> {
    let model = CpuModel::from_source(config, source).unwrap();
    let mut runner = SingleSequence::new(CpuRunner::new(Arc::new(model)));
    let seq = runner.create_sequence();
    runner.forward(seq, ids, LogitsRows::All).unwrap()
}

#[test]
fn quantized_forward_equals_the_dequantized_f32_forward() {
    let dir = tempfile::tempdir().unwrap();
    for experts in [
        ExpertChoice::Int8,
        ExpertChoice::Int4,
        ExpertChoice::Nvfp4,
        ExpertChoice::Fp8,
    ] {
        for name in ALL {
            let path = dir.path().join(format!("{name}-{experts:?}.mnw"));
            write_fixture_mnw(name, &path, &quantized_options(experts, QuantLayout::Mma));
            let ids = Golden::load(name).input_ids();
            let (config, file) = minnow_model::checkpoint::open(&path).unwrap();
            let file = Arc::new(file);
            let quantized = logits(config.clone(), file.clone(), &ids);
            let reference = logits(config, Arc::new(Dequantized::new(file)), &ids);
            let scale = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let worst = quantized
                .iter()
                .zip(&reference)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            eprintln!("{name} {experts:?}: max |diff| {worst:e} (largest logit {scale})");
            assert!(
                worst <= 1e-5 * scale,
                "{name} {experts:?}: max |diff| {worst} over 1e-5 x {scale}"
            );
        }
    }
}
