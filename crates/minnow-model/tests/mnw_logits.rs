//! The CPU forward from `.mnw` files written by our converter: the original encoding must give
//! bit-identical logits to the safetensors directory, and quantized experts must stay within
//! each encoding's stated tolerance of the BF16 model (with top-1 agreement reported).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use common::*;
use minnow_format::mnw::convert::{convert, ConvertInput, ConvertOptions, ExpertChoice};
use minnow_format::{Checkpoint, TensorSource};
use minnow_model::{CpuModel, CpuRunner, LogitsRows, SingleSequence};
use minnow_runtime::quant::Encoding;

/// The fixture's text files as assets; the 2.2 fixture has no chat template, so one of the
/// bundled test templates stands in (the format requires the asset).
fn assets(name: &str, source: &Checkpoint) -> BTreeMap<String, String> {
    source.assets().unwrap_or_else(|_| {
        let mut out = BTreeMap::new();
        for file in [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ] {
            out.insert(
                file.to_string(),
                std::fs::read_to_string(fixture(name).join(file)).unwrap(),
            );
        }
        let template = fixture("templates").join("llada2.2-native-tools.test.jinja");
        out.insert(
            "chat_template.jinja".into(),
            std::fs::read_to_string(template).unwrap(),
        );
        out
    })
}

fn write_mnw(name: &str, out: &Path, options: &ConvertOptions) {
    let source = Checkpoint::open(&fixture(name)).unwrap();
    let input = ConvertInput {
        source: &source,
        expert_families: &minnow_model::schema::routed_expert_family,
        assets: assets(name, &source),
        model_id: name.to_string(),
    };
    convert(&input, out, options, &AtomicBool::new(false), &|_, _| {}).unwrap();
}

fn logits(path: &Path, ids: &[u32]) -> Vec<f32> {
    let (config, source) = minnow_model::checkpoint::open(path).unwrap();
    let model = CpuModel::from_source(config, Arc::new(source)).unwrap();
    let mut runner = SingleSequence::new(CpuRunner::new(Arc::new(model)));
    let seq = runner.create_sequence();
    runner.forward(seq, ids, LogitsRows::All).unwrap()
}

#[test]
fn original_mnw_gives_bit_identical_logits() {
    let dir = tempfile::tempdir().unwrap();
    for name in ALL {
        let out = dir.path().join(format!("{name}.mnw"));
        write_mnw(name, &out, &ConvertOptions::default());
        let ids = Golden::load(name).input_ids();
        let want = logits(&fixture(name), &ids);
        let got = logits(&out, &ids);
        assert_eq!(want.len(), got.len());
        let same = want
            .iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{name}: logits from the .mnw differ from the safetensors ones"
        );
        // The family (2.0 vs 2.1 from expert_bias's type) survives the container.
        let (c1, _) = minnow_model::checkpoint::open(&out).unwrap();
        let (c2, _) = minnow_model::checkpoint::open(&fixture(name)).unwrap();
        assert_eq!(c1.family, c2.family, "{name}");
    }
}

/// Per encoding: the bound on the relative L2 error of all logits against the BF16 model, and
/// the least top-1 agreement over the 288 rows of the three fixtures. The L2 bounds are those a
/// single quantized product meets in the runtime's `quant_layouts` test (the model's error is of
/// the same order; measured 0.0043 / 0.076 / 0.059 / 0.021). INT8 must also meet the project's
/// target: mean |logit difference| within 5e-2 of BF16 and top-1 agreement of at least 95 %.
/// (The largest single difference is reported, not bounded: on these random weights with
/// logits up to ±34 it is about 0.16 for INT8, which is 0.5 % of the logit range, what
/// INT8 rounding of the weights predicts.)
const BOUNDS: [(ExpertChoice, f64, f32); 4] = [
    (ExpertChoice::Int8, 0.012, 0.95),
    (ExpertChoice::Int4, 0.14, 0.85),
    (ExpertChoice::Nvfp4, 0.08, 0.85),
    (ExpertChoice::Fp8, 0.025, 0.95),
];

#[test]
fn quantized_experts_stay_close_to_bf16() {
    let dir = tempfile::tempdir().unwrap();
    for (choice, max_rel_l2, min_top1) in BOUNDS {
        let (mut worst, mut agree, mut rows) = (0.0f32, 0usize, 0usize);
        let (mut d2, mut r2, mut sum_abs, mut count) = (0.0f64, 0.0f64, 0.0f64, 0usize);
        for name in ALL {
            let out = dir.path().join(format!("{name}-{choice:?}.mnw"));
            let options = ConvertOptions {
                experts: choice,
                group_size: Some(32),
                workers: 2,
                ..ConvertOptions::default()
            };
            write_mnw(name, &out, &options);
            // The experts really are quantized (not silently kept in BF16).
            let file = Checkpoint::open(&out).unwrap();
            let quantized = file
                .names()
                .iter()
                .filter(|n| matches!(file.tensor(n).unwrap().encoding(), Some(Encoding::Quant(_))))
                .count();
            assert!(quantized > 0, "{name} {choice:?}: no quantized tensor");

            let ids = Golden::load(name).input_ids();
            let want = logits(&fixture(name), &ids);
            let got = logits(&out, &ids);
            let vocab = want.len() / ids.len();
            for (w, g) in want.chunks_exact(vocab).zip(got.chunks_exact(vocab)) {
                for (a, b) in w.iter().zip(g) {
                    worst = worst.max((a - b).abs());
                    d2 += ((a - b) as f64).powi(2);
                    r2 += (*a as f64).powi(2);
                    sum_abs += (a - b).abs() as f64;
                    count += 1;
                }
                agree += (argmax(w) == argmax(g)) as usize;
                rows += 1;
            }
        }
        let top1 = agree as f32 / rows as f32;
        let rel_l2 = (d2 / r2).sqrt();
        let mean_abs = sum_abs / count as f64;
        eprintln!(
            "{choice:?}: relative L2 {rel_l2:.4}, mean |diff| {mean_abs:.4}, max |diff| {worst:.3}, \
             top-1 agreement {:.1} % ({agree}/{rows})",
            top1 * 100.0
        );
        assert!(
            rel_l2 <= max_rel_l2,
            "{choice:?}: relative L2 error {rel_l2} over {max_rel_l2}"
        );
        assert!(
            top1 >= min_top1,
            "{choice:?}: top-1 agreement {top1} under {min_top1}"
        );
        if choice == ExpertChoice::Int8 {
            assert!(
                mean_abs <= 5e-2,
                "int8: mean |logit diff| {mean_abs} over 5e-2"
            );
        }
    }
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::MIN),
            |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) },
        )
        .0
}
