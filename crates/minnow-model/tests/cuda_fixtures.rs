//! The CUDA runner on the tiny fixtures against the golden logits of the official code
//! (ignored: needs a GPU; `cargo test -p minnow-model --test cuda_fixtures -- --ignored`).
//!
//! The GPU forward is BF16, so it is compared the way ../shared/fixtures/README.md advises for a
//! BF16 engine: tokens whose router margin is above 0.01 within 0.5 of the BF16 reference logits,
//! most argmaxes equal, no NaN. The K/V cache is checked by running the last block alone over
//! the cached prefix, and replay (CUDA graphs, truncation) by repeating a forward exactly.

use std::path::PathBuf;

use minnow_model::cuda::CudaRunner;
use minnow_model::{LogitsRows, ModelRunner};
use safetensors::SafeTensors;

fn fixture(name: &str) -> PathBuf {
    // The manifest path when run where it was built; the working directory (the repository
    // root) when the test binary was copied to a GPU machine.
    let built =
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(name);
    if built.is_dir() {
        built
    } else {
        std::env::current_dir()
            .unwrap()
            .join("tests/fixtures")
            .join(name)
    }
}

struct Golden {
    ids: Vec<u32>,
    logits_f32: Vec<f32>,
    logits_bf16: Vec<f32>,
    /// Smallest router margin of each token over the MoE layers.
    margin: Vec<f32>,
}

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn golden(dir: &std::path::Path) -> Golden {
    let bytes = std::fs::read(dir.join("golden.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids: Vec<u32> = st
        .tensor("input_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    let mut margin = vec![f32::INFINITY; ids.len()];
    for name in st.names() {
        if name.starts_with("router.") && name.ends_with(".margin") {
            for (m, v) in margin.iter_mut().zip(f32s(&st, name)) {
                *m = m.min(v);
            }
        }
    }
    Golden {
        ids,
        logits_f32: f32s(&st, "logits"),
        logits_bf16: f32s(&st, "logits_bf16"),
        margin,
    }
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Compares rows `rows` of `got` (which starts at row `rows.start`) with the goldens, the way
/// the fixture README advises for a BF16 engine: on tokens whose router margin is above 0.01,
/// every logit within 0.5 of the BF16 reference, and the same argmax wherever the reference's
/// top-1/top-2 gap exceeds 1.0 (far beyond BF16 noise). Returns how many tokens were compared.
fn compare(
    name: &str,
    g: &Golden,
    got: &[f32],
    rows: std::ops::Range<usize>,
    vocab: usize,
) -> usize {
    assert!(
        got.iter().all(|x| x.is_finite()),
        "{name}: non-finite logits"
    );
    let (mut worst, mut worst_f32, mut compared, mut agree) = (0f32, 0f32, 0, 0);
    for (k, t) in rows.clone().enumerate() {
        let row = &got[k * vocab..(k + 1) * vocab];
        let want = &g.logits_bf16[t * vocab..(t + 1) * vocab];
        let want_f32 = &g.logits_f32[t * vocab..(t + 1) * vocab];
        let best = argmax(want);
        if argmax(row) == best {
            agree += 1;
        }
        if g.margin[t] > 0.01 {
            compared += 1;
            for c in 0..vocab {
                worst = worst.max((row[c] - want[c]).abs());
                worst_f32 = worst_f32.max((row[c] - want_f32[c]).abs());
            }
            let second = (0..vocab)
                .filter(|&c| c != best)
                .map(|c| want[c])
                .fold(f32::NEG_INFINITY, f32::max);
            if want[best] - second > 1.0 {
                assert_eq!(
                    argmax(row),
                    best,
                    "{name}: token {t} has a clear reference argmax"
                );
            }
        }
    }
    let n = rows.len();
    println!(
        "{name}: {compared}/{n} tokens with router margin > 0.01: max |gpu - bf16 ref| {worst:.3}, max |gpu - f32 ref| {worst_f32:.3}; argmax agrees on {agree}/{n}"
    );
    assert!(
        worst <= 0.5,
        "{name}: logits differ from the BF16 reference by {worst}"
    );
    compared
}

fn check_fixture(name: &str) {
    let dir = fixture(name);
    let g = golden(&dir);
    let mut runner = CudaRunner::load(&dir, 0).expect("load the fixture onto the GPU");
    let vocab = runner.config().vocab_size;
    let n = g.ids.len();
    println!("{name} on {}", runner.device_name());

    // One forward over all 96 tokens.
    let seq = runner.create_sequence().unwrap();
    let full = runner.forward(seq, &g.ids, LogitsRows::All).unwrap();
    // At least a third of the tokens have clear routing in every fixture (v22's block admission
    // margins are small for two of its three blocks).
    assert!(compare(&format!("{name} full"), &g, &full, 0..n, vocab) >= n / 3);

    // The last block over the cached first two blocks.
    let seq2 = runner.create_sequence().unwrap();
    assert!(runner
        .forward(seq2, &g.ids[..64], LogitsRows::None)
        .unwrap()
        .is_empty());
    assert_eq!(runner.sequence_len(seq2), 64);
    let last = runner.forward(seq2, &g.ids[64..], LogitsRows::All).unwrap();
    compare(&format!("{name} cached"), &g, &last, 64..n, vocab);

    // Denoising-style repetition: truncate and run the same block again (a graph replay): the
    // result must be bit-identical.
    for _ in 0..2 {
        runner.truncate_sequence(seq2, 64).unwrap();
        let again = runner.forward(seq2, &g.ids[64..], LogitsRows::All).unwrap();
        assert_eq!(again, last, "{name}: repeated forward differs");
    }
    // The GPU argmax/confidence agrees with the logits of the same forward.
    runner.truncate_sequence(seq2, 64).unwrap();
    let top = runner
        .forward_top1(seq2, &g.ids[64..], LogitsRows::All)
        .unwrap();
    for (k, (tok, conf)) in top.iter().enumerate() {
        let row = &last[k * vocab..(k + 1) * vocab];
        let best = argmax(row);
        assert_eq!(*tok as usize, best, "{name}: GPU argmax of row {k}");
        let s: f64 = row.iter().map(|&v| ((v - row[best]) as f64).exp()).sum();
        assert!(
            (*conf as f64 - 1.0 / s).abs() <= 1e-5,
            "{name}: confidence of row {k}"
        );
    }
    // Sub-range of rows.
    runner.truncate_sequence(seq2, 64).unwrap();
    let some = runner
        .forward(seq2, &g.ids[64..], LogitsRows::Range(3..9))
        .unwrap();
    assert_eq!(some.len(), 6 * vocab);
    compare(&format!("{name} rows 67..73"), &g, &some, 67..73, vocab);
    runner.release_sequence(seq);
    runner.release_sequence(seq2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn v21_fixture_matches_golden() {
    check_fixture("llada2-tiny-v21");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn v20_fixture_matches_golden() {
    check_fixture("llada2-tiny-v20");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn v22_fixture_matches_golden() {
    check_fixture("llada2-tiny-v22");
}

/// Long forwards (many rows per expert: 64-row expert tiles, the shared expert through cuBLAS)
/// and short ones (16-row tiles, the shared expert inside the grouped GEMM) compute the same
/// model: 256 tokens in one forward against the same tokens in eight 32-token forwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn long_and_short_forwards_agree() {
    let dir = fixture("llada2-tiny-v21");
    let g = golden(&dir);
    let ids: Vec<u32> = g.ids.iter().cycle().take(256).copied().collect();
    let mut runner = CudaRunner::load(&dir, 0).unwrap();
    let vocab = runner.config().vocab_size;
    let long_seq = runner.create_sequence().unwrap();
    let long = runner.forward(long_seq, &ids, LogitsRows::All).unwrap();
    let short_seq = runner.create_sequence().unwrap();
    let mut short = Vec::new();
    for chunk in ids.chunks(32) {
        short.extend(runner.forward(short_seq, chunk, LogitsRows::All).unwrap());
    }
    assert_eq!(long.len(), short.len());
    assert!(long.iter().chain(&short).all(|x| x.is_finite()));
    // BF16 noise (different GEMM shapes and reduction orders) may flip an expert choice near a
    // routing tie; every other row agrees closely.
    let close = (0..256)
        .filter(|&r| {
            (0..vocab)
                .map(|c| (long[r * vocab + c] - short[r * vocab + c]).abs())
                .fold(0f32, f32::max)
                <= 0.5
        })
        .count();
    println!("long vs short forwards: {close}/256 rows within 0.5");
    assert!(close >= 230, "only {close}/256 rows agree");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rejects_bad_input() {
    let dir = fixture("llada2-tiny-v22");
    let mut runner = CudaRunner::load(&dir, 0).unwrap();
    let seq = runner.create_sequence().unwrap();
    assert!(
        runner.forward(seq, &[100_000], LogitsRows::All).is_err(),
        "id outside the vocabulary"
    );
    assert!(
        runner.forward(seq, &[], LogitsRows::All).is_err(),
        "empty forward"
    );
    runner.forward(seq, &[1, 2, 3], LogitsRows::None).unwrap();
    // 2.2 block routing: a forward must start on a block boundary.
    assert!(runner.forward(seq, &[4], LogitsRows::All).is_err());
    assert!(runner.truncate_sequence(seq, 10).is_err());
}

/// Runs in CI (no GPU): asking for the GPU runner there is a clear error, not a panic.
#[test]
fn without_a_gpu_loading_is_an_error() {
    if minnow_model::cuda::is_available() {
        return; // covered by the fixture tests above
    }
    let err = CudaRunner::load(&fixture("llada2-tiny-v21"), 0)
        .err()
        .expect("loading onto a missing GPU must fail");
    assert!(err.to_string().contains("CUDA"), "{err}");
}
