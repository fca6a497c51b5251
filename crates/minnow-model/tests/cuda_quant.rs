//! Quantized experts on the GPU (ignored: needs a GPU; `cargo test -p minnow-model --test
//! cuda_quant -- --ignored --nocapture`). Each tiny fixture is converted to `.mnw` files with
//! INT8, INT4 (fragment order, and row-major, which the loader repacks), NVFP4 experts
//! (repacked for the E2M1 kernels where the shape allows) and our FP8 (repacked for the E4M3
//! kernels), loaded on the
//! GPU with the codes kept as stored, and compared with the CPU path of the same file (F32
//! activations, weights code x scale in F32). The quantized kernels multiply the exact codes and
//! apply each group's scale to the F32 partial sum, so no weight is rounded: their logits must be
//! at least as close to the CPU path (mean absolute difference) as the GPU forward of the same
//! file whose experts were widened to BF16(code x scale) on the host. The argmax must agree
//! wherever the CPU's top-1/top-2 gap is clear (above 2.0) on tokens whose router margin is
//! stable (the BF16 activations of the GPU flip expert choices of near-tied tokens in these
//! random models, as they do for the BF16 checkpoint), and the overall agreement is printed next
//! to that of the BF16 checkpoint on the same GPU. A segment's logits must be bit-identical alone
//! and inside a batch.
mod common;

use std::sync::Arc;

use common::*;
use minnow_format::mnw::convert::{ExpertChoice, QuantLayout};
use minnow_format::TensorSource;
use minnow_model::cuda::CudaRunner;
use minnow_model::{
    Config, CpuModel, CpuRunner, LogitsRows, ModelRunner, Segment, SegmentOutput, SingleSequence,
    Want,
};

fn cpu_logits(config: Config, source: Arc<dyn TensorSource>, ids: &[u32]) -> Vec<f32> {
    let model = CpuModel::from_source(config, source).unwrap();
    let mut runner = SingleSequence::new(CpuRunner::new(Arc::new(model)));
    let seq = runner.create_sequence();
    runner.forward(seq, ids, LogitsRows::All).unwrap()
}

/// Logits of every row of `ids` at positions `0..`, in pages `0..` of the pool.
fn gpu_logits(runner: &mut CudaRunner, ids: &[u32]) -> Vec<f32> {
    let pages: Vec<u32> = (0..ids.len().div_ceil(runner.config().block_size) as u32).collect();
    let segment = Segment {
        pages: &pages,
        start: 0,
        ids,
        want: Want::Logits(0..ids.len()),
    };
    let out = runner.forward_batch(&[segment]).unwrap().remove(0);
    out.into_logits().unwrap()
}

/// A CPU top-1/top-2 gap the GPU's BF16 activations cannot close.
const CLEAR_GAP: f32 = 2.0;

fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
}

/// Each token's smallest router margin over the MoE layers, from the fixture's goldens: where
/// it is tiny, BF16 rounding may flip an expert choice and move the logits far.
fn router_margins(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixture(name).join("golden.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tokens = Golden::load(name).input_ids().len();
    let mut margin = vec![f32::INFINITY; tokens];
    for key in st.names() {
        if key.starts_with("router.") && key.ends_with(".margin") {
            let data = st.tensor(key).unwrap();
            for (m, c) in margin.iter_mut().zip(data.data().chunks_exact(4)) {
                *m = m.min(f32::from_le_bytes(c.try_into().unwrap()));
            }
        }
    }
    margin
}

/// A router margin above which the original model's expert choices are stable.
const STABLE_MARGIN: f32 = 0.05;

/// (rows whose argmax agrees, rows); with `clear_gap`, asserts agreement on every row whose CPU
/// top-1/top-2 gap is larger and whose router margin is stable.
fn agreement(
    what: &str,
    gpu: &[f32],
    cpu: &[f32],
    vocab: usize,
    clear_gap: Option<(f32, &[f32])>,
) -> (usize, usize) {
    assert!(
        gpu.iter().all(|v| v.is_finite()),
        "{what}: non-finite logits"
    );
    let rows = cpu.len() / vocab;
    let mut agree = 0;
    for r in 0..rows {
        let (g, c) = (
            &gpu[r * vocab..(r + 1) * vocab],
            &cpu[r * vocab..(r + 1) * vocab],
        );
        let best = argmax(c);
        if argmax(g) == best {
            agree += 1;
            continue;
        }
        let second = (0..vocab)
            .filter(|&i| i != best)
            .map(|i| c[i])
            .fold(f32::NEG_INFINITY, f32::max);
        assert!(
            clear_gap.is_none_or(|(gap, margins)| {
                c[best] - second <= gap || margins[r] <= STABLE_MARGIN
            }),
            "{what}: row {r} has a clear CPU argmax {best} (gap {}) but the GPU chose {}",
            c[best] - second,
            argmax(g)
        );
    }
    (agree, rows)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quantized_experts_on_the_gpu_agree_with_the_cpu_path_of_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let (mut total_agree, mut total_rows) = (0, 0);
    for name in ALL {
        let ids = Golden::load(name).input_ids();
        let margins = router_margins(name);
        // The BF16 checkpoint's own GPU-vs-CPU agreement, the baseline.
        let (config, source) = minnow_model::checkpoint::open(&fixture(name)).unwrap();
        let source: Arc<dyn TensorSource> = Arc::new(source);
        let vocab = config.vocab_size;
        let cpu = cpu_logits(config.clone(), source.clone(), &ids);
        let mut runner = CudaRunner::new(config, source.as_ref(), 0).unwrap();
        let gpu = gpu_logits(&mut runner, &ids);
        let (a, n) = agreement(&format!("{name} bf16"), &gpu, &cpu, vocab, None);
        println!("{name} bf16: GPU argmax agrees with the CPU on {a}/{n} rows");
        drop(runner);
        for (experts, layout, label) in [
            (ExpertChoice::Int8, QuantLayout::Mma, "i8_mma"),
            (ExpertChoice::Int4, QuantLayout::Mma, "i4_mma"),
            (ExpertChoice::Int8, QuantLayout::Row, "i8_sym (repacked)"),
            (ExpertChoice::Int4, QuantLayout::Row, "i4_sym (repacked)"),
            // The fixtures' gate/up (32 x 64) take the E2M1 kernels; their down projections
            // (64 x 32: K is not a multiple of 64) are widened.
            (ExpertChoice::Nvfp4, QuantLayout::Mma, "nvfp4 (repacked)"),
            // Both projections take the E4M3 kernels (groups of 64 and 32 inside the blocks).
            (
                ExpertChoice::Fp8,
                QuantLayout::Mma,
                "fp8_e4m3_b128 (repacked)",
            ),
        ] {
            let path = dir.path().join(format!("{name}-{label}.mnw"));
            write_fixture_mnw(name, &path, &quantized_options(experts, layout));
            let (config, file) = minnow_model::checkpoint::open(&path).unwrap();
            let file = Arc::new(file);
            let cpu = cpu_logits(config.clone(), file.clone(), &ids);
            // The same file with its experts widened to BF16(code x scale) on the host: what
            // the GPU gives when each weight is rounded to BF16 first.
            let widened = Dequantized::new(file.clone());
            let mut runner = CudaRunner::new(config.clone(), &widened, 0).unwrap();
            let rounded = gpu_logits(&mut runner, &ids);
            drop(runner);
            let mut runner = CudaRunner::new(config, file.as_ref(), 0).unwrap();
            let gpu = gpu_logits(&mut runner, &ids);
            let mean_abs = |x: &[f32]| {
                x.iter()
                    .zip(&cpu)
                    .map(|(g, c)| (g - c).abs() as f64)
                    .sum::<f64>()
                    / x.len() as f64
            };
            let (exact_err, rounded_err) = (mean_abs(&gpu), mean_abs(&rounded));
            println!(
                "{name} {label}: mean |gpu - cpu| {exact_err:.5} (BF16-rounded weights: {rounded_err:.5})"
            );
            // NVFP4's E2M1 x E4M3 products are BF16 values already: widening rounds only the
            // final multiplication by the global scale, which moves the logits far less than
            // the BF16 activations both GPU runs share (v20: 0.10723 against 0.10722), so the
            // comparison says nothing there; the kernel test checks the E2M1 kernels' products
            // against the stored values instead (`grouped_gemm_over_codes_matches_reference`).
            // With MINNOW_FP8_ACTIVATIONS=1 the FP8 experts multiply E4M3 activations (W8A8),
            // an approximation the CPU path does not make: the comparison does not apply.
            let w8a8 = experts == ExpertChoice::Fp8
                && minnow_runtime::cuda::tuning::tuning().fp8_activations;
            if experts != ExpertChoice::Nvfp4 && !w8a8 {
                assert!(
                    exact_err <= rounded_err,
                    "{name} {label}: the quantized kernels ({exact_err}) are farther from the CPU \
                     path than BF16-rounded weights ({rounded_err})"
                );
            }
            let (a, n) = agreement(
                &format!("{name} {label}"),
                &gpu,
                &cpu,
                vocab,
                (!w8a8).then_some((CLEAR_GAP, &margins[..])),
            );
            let worst = gpu
                .iter()
                .zip(&cpu)
                .fold(0f32, |m, (g, c)| m.max((g - c).abs()));
            println!(
                "{name} {label}: GPU argmax agrees with the CPU path of the same file on {a}/{n} rows; max |gpu - cpu| {worst:.3}"
            );
            total_agree += a;
            total_rows += n;

            // Batch invariance: the last 32 rows over the cached prefix, alone and beside
            // other segments.
            let prefix = ids.len() - 32;
            let pages: Vec<u32> = (0..ids.len().div_ceil(32) as u32).collect();
            let other: Vec<u32> = (100..100 + ids.len().div_ceil(32) as u32).collect();
            runner
                .forward_batch(&[Segment {
                    pages: &pages,
                    start: 0,
                    ids: &ids[..prefix],
                    want: Want::Nothing,
                }])
                .unwrap();
            let probe = Segment {
                pages: &pages,
                start: prefix,
                ids: &ids[prefix..],
                want: Want::Logits(0..32),
            };
            let alone = runner.forward_batch(std::slice::from_ref(&probe)).unwrap();
            let noise: Vec<u32> = ids.iter().rev().copied().collect();
            let together = runner
                .forward_batch(&[
                    Segment {
                        pages: &other,
                        start: 0,
                        ids: &noise,
                        want: Want::Logits(0..noise.len()),
                    },
                    probe.clone(),
                ])
                .unwrap();
            let bits = |o: &SegmentOutput| match o {
                SegmentOutput::Logits(l) => l.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                other => panic!("expected logits, got {other:?}"),
            };
            assert!(
                bits(&alone[0]) == bits(&together[1]),
                "{name} {label}: the probe segment's logits differ alone vs in a batch"
            );
        }
    }
    let rate = total_agree as f64 / total_rows as f64;
    println!("quantized GPU vs CPU argmax agreement over all fixtures: {total_agree}/{total_rows} ({:.1} %)", 100.0 * rate);
}
