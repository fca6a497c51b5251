//! The CUDA runner on the tiny fixtures against the golden logits of the official code
//! (ignored: needs a GPU; `cargo test -p minnow-model --test cuda_fixtures -- --ignored`).
//!
//! Against the goldens the GPU forward is BF16, so it is compared the way the fixtures' README
//! advises for a BF16 engine: tokens whose router margin is above 0.01 within 0.5 of the BF16
//! reference logits, the same argmax wherever the reference's is clear, no NaN. The K/V cache is
//! checked by running the last block alone over the cached prefix, and replay (CUDA graphs,
//! truncation) by repeating a forward exactly. GPU against GPU, a segment inside a batch must be
//! bit-identical to the same segment alone (docs/performance.md, "Batch invariance"); the
//! comparisons behind that claim are themselves tested on the CPU at the end of this file.

use std::path::PathBuf;

use minnow_model::batch::{Segment, SegmentOutput, Want};
use minnow_model::cuda::CudaRunner;
use minnow_model::{LogitsRows, ModelRunner, SingleSequence};
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

/// A row's argmax and runner-up (the larger logit among the others).
fn top2(row: &[f32]) -> (usize, usize) {
    let best = argmax(row);
    let second = (0..row.len())
        .filter(|&c| c != best)
        .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
        .unwrap();
    (best, second)
}

/// A row's top-1/top-2 logit gap.
fn top2_gap(row: &[f32]) -> f32 {
    let (best, second) = top2(row);
    row[best] - row[second]
}

/// A token's F32 top-1 is decided when its F32 top-1/top-2 logit gap is at least this...
const DECIDED_GAP: f32 = 0.5;
/// ...and its router margin (every MoE layer) at least this.
const DECIDED_MARGIN: f32 = 0.01;

/// Item 7 of issue 17 in the form BF16 arithmetic can meet: on every token whose F32 top-1 is
/// decided (`DECIDED_GAP`, `DECIDED_MARGIN`), `got` (rows `rows` of the forward) has the F32
/// reference's argmax. The other tokens are near a tie: which way a BF16 forward sends them
/// depends on which values happen to round up, not on how precise the forward is. The
/// emulation in scripts/fidelity/emulate.py found the official BF16 run's rounding and minnow's
/// GPU path with a BF16 residual stream equally likely to keep the F32 top-1 (v20: 93.5 of 96
/// tokens on average over 300 dithered runs of each, anywhere from 91 to 96; with the F32 stream
/// the GPU has now, 94.0 over 40 runs, 92 to 96), and no dithered run of either that flipped a
/// decided token (its gap moved by at most 0.38). Returns how many of the rows are decided,
/// or names the first decided token whose argmax differs.
fn f32_top1_on_decided_rows(
    g: &Golden,
    got: &[f32],
    rows: std::ops::Range<usize>,
    vocab: usize,
) -> Result<usize, String> {
    let mut decided = 0;
    for (k, t) in rows.enumerate() {
        let want = &g.logits_f32[t * vocab..(t + 1) * vocab];
        let (best, second) = top2(want);
        let gap = want[best] - want[second];
        if gap < DECIDED_GAP || g.margin[t] < DECIDED_MARGIN {
            continue;
        }
        decided += 1;
        let got_top = argmax(&got[k * vocab..(k + 1) * vocab]);
        if got_top != best {
            return Err(format!(
                "token {t}: argmax {got_top} where the F32 reference's is {best} (F32 gap {:.3}, router margin {:.4})",
                gap,
                g.margin[t]
            ));
        }
    }
    Ok(decided)
}

/// Compares rows `rows` of `got` (which starts at row `rows.start`) with the goldens, the way
/// the fixture README advises for a BF16 engine: on tokens whose router margin is above 0.01,
/// every logit within 0.5 of the BF16 reference, and the same argmax wherever the reference's
/// top-1/top-2 gap exceeds 1.0 (far beyond BF16 noise); plus the F32 reference's argmax on every
/// token whose F32 top-1 is decided (`f32_top1_on_decided_rows`). Returns how many tokens were
/// compared (those with router margin above 0.01); the overall argmax agreement is printed, not
/// asserted.
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
    let (mut agree_f32, mut bf16_agree_f32) = (0, 0);
    for (k, t) in rows.clone().enumerate() {
        let row = &got[k * vocab..(k + 1) * vocab];
        let want = &g.logits_bf16[t * vocab..(t + 1) * vocab];
        let want_f32 = &g.logits_f32[t * vocab..(t + 1) * vocab];
        let (best, got_top, f32_top) = (argmax(want), argmax(row), argmax(want_f32));
        agree += usize::from(got_top == best);
        agree_f32 += usize::from(got_top == f32_top);
        bf16_agree_f32 += usize::from(best == f32_top);
        if g.margin[t] > 0.01 {
            compared += 1;
            for c in 0..vocab {
                worst = worst.max((row[c] - want[c]).abs());
                worst_f32 = worst_f32.max((row[c] - want_f32[c]).abs());
            }
            if top2_gap(want) > 1.0 {
                assert_eq!(
                    got_top, best,
                    "{name}: token {t} has a clear reference argmax"
                );
            }
        }
    }
    let n = rows.len();
    let decided = f32_top1_on_decided_rows(g, got, rows, vocab)
        .unwrap_or_else(|e| panic!("{name}: decided F32 top-1 lost: {e}"));
    println!(
        "{name}: {compared}/{n} tokens with router margin > 0.01: max |gpu - bf16 ref| {worst:.3}, max |gpu - f32 ref| {worst_f32:.3}; argmax agrees on {agree}/{n}; \
         with the F32 reference's argmax: gpu {agree_f32}/{n} (all {decided} decided tokens), official BF16 run {bf16_agree_f32}/{n}"
    );
    // MINNOW_DUMP_DIR=D writes these logits as little-endian F32 rows to D/<name>.f32, for
    // offline comparison with the goldens (scripts/fidelity).
    if let Some(dir) = std::env::var_os("MINNOW_DUMP_DIR") {
        let file = std::path::Path::new(&dir).join(format!("{}.f32", name.replace(' ', "_")));
        let bytes: Vec<u8> = got.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&file, bytes).expect("write the dumped logits");
    }
    assert!(
        worst <= 0.5,
        "{name}: logits differ from the BF16 reference by {worst}"
    );
    compared
}

fn check_fixture(name: &str) {
    let dir = fixture(name);
    let g = golden(&dir);
    let mut runner =
        SingleSequence::new(CudaRunner::load(&dir, 0).expect("load the fixture onto the GPU"));
    let vocab = runner.config().vocab_size;
    let n = g.ids.len();
    println!("{name} on {}", runner.device_name());

    // One forward over all 96 tokens.
    let seq = runner.create_sequence();
    let full = runner.forward(seq, &g.ids, LogitsRows::All).unwrap();
    // At least a third of the tokens have clear routing in every fixture (v22's block admission
    // margins are small for two of its three blocks).
    assert!(compare(&format!("{name} full"), &g, &full, 0..n, vocab) >= n / 3);

    // The last block over the cached first two blocks.
    let seq2 = runner.create_sequence();
    assert!(runner
        .forward(seq2, &g.ids[..64], LogitsRows::None)
        .unwrap()
        .is_empty());
    assert_eq!(runner.sequence_len(seq2), 64);
    let last = runner.forward(seq2, &g.ids[64..], LogitsRows::All).unwrap();
    // Every fixture has clear routing on most of its last block (29-32 of 32 tokens), so this
    // comparison is never empty.
    assert!(compare(&format!("{name} cached"), &g, &last, 64..n, vocab) > 0);

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
    assert!(compare(&format!("{name} rows 67..73"), &g, &some, 67..73, vocab) > 0);
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
    let mut runner = SingleSequence::new(CudaRunner::load(&dir, 0).unwrap());
    let vocab = runner.config().vocab_size;
    let long_seq = runner.create_sequence();
    let long = runner.forward(long_seq, &ids, LogitsRows::All).unwrap();
    let short_seq = runner.create_sequence();
    let mut short = Vec::new();
    for chunk in ids.chunks(32) {
        short.extend(runner.forward(short_seq, chunk, LogitsRows::All).unwrap());
    }
    assert_eq!(long.len(), short.len());
    assert!(long.iter().chain(&short).all(|x| x.is_finite()));
    // Different kernels (tile shapes, reduction orders), so not bit-identical: every row within
    // the BF16 tolerance of the golden comparisons (docs/performance.md says "every row").
    let rows = long.len() / vocab;
    let mut far = Vec::new();
    let mut worst = 0f32;
    for (r, (x, y)) in long
        .chunks_exact(vocab)
        .zip(short.chunks_exact(vocab))
        .enumerate()
    {
        let d = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        worst = worst.max(d);
        if d > 0.5 {
            far.push(r);
        }
    }
    println!(
        "long vs short forwards: max |difference| {worst:.4} over {rows} rows{}",
        if long == short {
            " (bit-identical)"
        } else {
            ""
        }
    );
    assert!(
        far.is_empty(),
        "long vs short forwards: rows {far:?} of {rows} differ by more than 0.5"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rejects_bad_input() {
    let dir = fixture("llada2-tiny-v22");
    let mut runner = SingleSequence::new(CudaRunner::load(&dir, 0).unwrap());
    let seq = runner.create_sequence();
    assert!(
        runner.forward(seq, &[100_000], LogitsRows::All).is_err(),
        "id outside the vocabulary"
    );
    // An empty single-sequence forward is a no-op of the wrapper; an empty segment is an error.
    assert!(runner
        .forward(seq, &[], LogitsRows::All)
        .unwrap()
        .is_empty());
    let pages = [0u32];
    let empty = Segment {
        pages: &pages,
        start: 0,
        ids: &[],
        want: Want::Nothing,
    };
    assert!(
        runner.runner_mut().forward_batch(&[empty]).is_err(),
        "empty segment"
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

/// Pages `first .. first + n` of the pool: the batch tests manage their own pages (they use
/// `forward_batch` directly, not the single-sequence table).
fn page_run(first: usize, n: usize) -> Vec<u32> {
    (first as u32..(first + n) as u32).collect()
}

/// `Ok` when `a` and `b` are the same bits; otherwise how many of their `vocab`-wide rows
/// differ, the first one and the largest difference.
fn bit_identical(what: &str, a: &[f32], b: &[f32], vocab: usize) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{what}: {} vs {} logits", a.len(), b.len()));
    }
    let differing: Vec<usize> = a
        .chunks_exact(vocab)
        .zip(b.chunks_exact(vocab))
        .enumerate()
        .filter(|(_, (x, y))| x.iter().zip(*y).any(|(p, q)| p.to_bits() != q.to_bits()))
        .map(|(r, _)| r)
        .collect();
    if differing.is_empty() {
        return Ok(());
    }
    let worst = a
        .iter()
        .zip(b)
        .map(|(p, q)| (p - q).abs())
        .fold(0f32, f32::max);
    Err(format!(
        "{what}: {}/{} rows not bit-identical (first row {}, max |difference| {worst:e})",
        differing.len(),
        a.len() / vocab,
        differing[0]
    ))
}

/// `Ok` when both lists hold the same top-1 tokens and the same confidences (bit for bit);
/// otherwise how many rows differ in each.
fn top1_identical(what: &str, a: &[(u32, f32)], b: &[(u32, f32)]) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{what}: {} vs {} rows", a.len(), b.len()));
    }
    let tokens = a.iter().zip(b).filter(|(x, y)| x.0 != y.0).count();
    let confidences = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.1.to_bits() != y.1.to_bits())
        .count();
    if tokens == 0 && confidences == 0 {
        return Ok(());
    }
    Err(format!(
        "{what}: top-1 tokens differ on {tokens}/{n} rows, confidences on {confidences}/{n}",
        n = a.len()
    ))
}

/// Ids of segment `i`: the golden ids shifted per segment, so that two segments never hold the
/// same ids at the same positions (outputs handed to the wrong segment would show).
fn segment_ids(golden: &[u32], i: usize, vocab: usize) -> Vec<u32> {
    golden
        .iter()
        .map(|&t| (t + 11 * i as u32) % vocab as u32)
        .collect()
}

/// A batch of six segments of different lengths and starts (each over its own cached prefix)
/// against every segment alone: every output must be bit-identical, and hold only the rows the
/// segment asks for. `Err` names every segment that differs.
fn batched_vs_alone(runner: &mut dyn ModelRunner, golden: &[u32]) -> Result<String, String> {
    let vocab = runner.config().vocab_size;
    let p = runner.config().block_size;
    // (start, tokens, wanted rows): block-aligned starts (2.2 needs them), any lengths.
    let specs: [(usize, usize, std::ops::Range<usize>); 6] = [
        (64, 32, 0..32),
        (0, 96, 0..96),
        (32, 40, 5..40),
        (0, 1, 0..1),
        (32, 32, 0..0),
        (0, 50, 10..20),
    ];
    let ids: Vec<Vec<u32>> = (0..specs.len())
        .map(|i| segment_ids(golden, i, vocab))
        .collect();
    let per_seq = golden.len().div_ceil(p);
    assert!(runner.kv_pages() >= 2 * specs.len() * per_seq);
    let tables: Vec<Vec<u32>> = (0..2 * specs.len())
        .map(|i| page_run(i * per_seq, per_seq))
        .collect();
    let want = |rows: &std::ops::Range<usize>| {
        if rows.is_empty() {
            Want::Nothing
        } else {
            Want::Logits(rows.clone())
        }
    };
    // Each sequence's prefix, alone; then every segment alone (tables 0..) and all of them in
    // one batch (tables specs.len()..), over identical prefixes.
    for (i, (start, _, _)) in specs.iter().enumerate() {
        for table in [&tables[i], &tables[specs.len() + i]] {
            if *start > 0 {
                let prefix = Segment {
                    pages: table,
                    start: 0,
                    ids: &ids[i][..*start],
                    want: Want::Nothing,
                };
                runner.forward_batch(&[prefix]).unwrap();
            }
        }
    }
    let mut alone = Vec::new();
    for (i, (start, n, rows)) in specs.iter().enumerate() {
        let seg = Segment {
            pages: &tables[i],
            start: *start,
            ids: &ids[i][*start..start + n],
            want: want(rows),
        };
        alone.push(runner.forward_batch(&[seg]).unwrap().remove(0));
    }
    let batch: Vec<Segment<'_>> = specs
        .iter()
        .enumerate()
        .map(|(i, (start, n, rows))| Segment {
            pages: &tables[specs.len() + i],
            start: *start,
            ids: &ids[i][*start..start + n],
            want: want(rows),
        })
        .collect();
    let batched = runner.forward_batch(&batch).unwrap();
    assert_eq!(batched.len(), specs.len());
    let mut failures = Vec::new();
    for (i, ((start, _, rows), (a, b))) in specs.iter().zip(alone.iter().zip(&batched)).enumerate()
    {
        let what = format!("segment {i} (start {start}, rows {rows:?})");
        match (a, b) {
            (SegmentOutput::Logits(a), SegmentOutput::Logits(b)) => {
                assert_eq!(a.len(), rows.len() * vocab, "{what}: rows of logits");
                assert!(a.iter().all(|x| x.is_finite()), "{what}: non-finite logits");
                if let Err(e) = bit_identical(&what, a, b, vocab) {
                    failures.push(e);
                }
            }
            (SegmentOutput::Nothing, SegmentOutput::Nothing) => assert!(rows.is_empty()),
            other => failures.push(format!("{what}: unexpected outputs {other:?}")),
        }
    }
    if failures.is_empty() {
        Ok(format!(
            "all {} segments bit-identical batched and alone",
            specs.len()
        ))
    } else {
        Err(failures.join("; "))
    }
}

fn check_batched_matches_unbatched(name: &str) {
    let dir = fixture(name);
    let g = golden(&dir);
    let mut runner = CudaRunner::load(&dir, 0).unwrap();
    match batched_vs_alone(&mut runner, &g.ids) {
        Ok(summary) => println!("{name}: {summary}"),
        Err(e) => panic!("{name}: batched differs from alone: {e}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn batched_segments_match_unbatched_v20() {
    check_batched_matches_unbatched("llada2-tiny-v20");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn batched_segments_match_unbatched_v21() {
    check_batched_matches_unbatched("llada2-tiny-v21");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn batched_segments_match_unbatched_v22() {
    check_batched_matches_unbatched("llada2-tiny-v22");
}

/// Sixteen requests, each a 32-token block over its own cached prefix (32 to 96 tokens of
/// pseudo-random ids): each request's top-1 tokens and confidences inside the batch of sixteen
/// must be those it gets alone, on every row.
fn top1_batched_vs_alone(runner: &mut dyn ModelRunner) -> Result<String, String> {
    let c = runner.config().clone();
    let p = c.block_size;
    let vocab = c.vocab_size as u64;
    let id = |i: u64| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 21) % vocab) as u32;
    let requests: Vec<(Vec<u32>, Vec<u32>)> = (0..16u64)
        .map(|r| {
            let prefix_len = p * (1 + (r as usize % 3));
            let prefix = (0..prefix_len as u64).map(|i| id(r * 1000 + i)).collect();
            let block = (0..p as u64).map(|i| id(r * 1000 + 500 + i)).collect();
            (prefix, block)
        })
        .collect();
    let per_seq = 4;
    let tables: Vec<Vec<u32>> = (0..16).map(|r| page_run(r * per_seq, per_seq)).collect();
    for ((prefix, _), table) in requests.iter().zip(&tables) {
        let seg = Segment {
            pages: table,
            start: 0,
            ids: prefix,
            want: Want::Nothing,
        };
        runner.forward_batch(&[seg]).unwrap();
    }
    let segments: Vec<Segment<'_>> = requests
        .iter()
        .zip(&tables)
        .map(|((prefix, block), table)| Segment {
            pages: table,
            start: prefix.len(),
            ids: block,
            want: Want::Top1(0..p),
        })
        .collect();
    let alone: Vec<Vec<(u32, f32)>> = segments
        .iter()
        .map(|s| {
            runner.forward_batch(std::slice::from_ref(s)).unwrap()[0]
                .clone()
                .into_top1()
                .unwrap()
        })
        .collect();
    let batched = runner.forward_batch(&segments).unwrap();
    let mut failures = Vec::new();
    let mut rows = 0;
    for (r, (a, b)) in alone.iter().zip(batched).enumerate() {
        let b = b.into_top1().unwrap();
        assert_eq!(a.len(), p, "request {r}: rows of top-1 pairs");
        rows += a.len();
        if let Err(e) = top1_identical(&format!("request {r}"), a, &b) {
            failures.push(e);
        }
    }
    if failures.is_empty() {
        Ok(format!(
            "top-1 tokens and confidences equal alone and in a batch of 16 on {rows}/{rows} rows"
        ))
    } else {
        Err(failures.join("; "))
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn top1_alone_vs_batch_of_16() {
    let mut failed = Vec::new();
    for name in ["llada2-tiny-v20", "llada2-tiny-v21", "llada2-tiny-v22"] {
        let mut runner = CudaRunner::load(&fixture(name), 0).unwrap();
        match top1_batched_vs_alone(&mut runner) {
            Ok(summary) => println!("{name}: {summary}"),
            Err(e) => {
                println!("{name}: {e}");
                failed.push(format!("{name}: {e}"));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// `Want::TopK` on the GPU: a block's best ids are the first ids of its logits (a forward of
/// the same ids that asked for them) in `top_k`'s order, its top-1 pairs are `Want::Top1`'s,
/// and `logits_row` reads those logits back; in a batch, each segment's rows are its own.
#[test]
#[ignore = "needs a CUDA GPU"]
fn topk_is_the_best_of_the_same_logits() {
    use minnow_model::runner::{top_k, TopKRows};
    for name in ["llada2-tiny-v21", "llada2-tiny-v22"] {
        let mut runner = CudaRunner::load(&fixture(name), 0).unwrap();
        let c = runner.config().clone();
        let (p, v) = (c.block_size, c.vocab_size);
        let ids: Vec<u32> = (0..2 * p as u32).map(|i| i * 7919 % v as u32).collect();
        let table = page_run(0, 2);
        let prefix = Segment {
            pages: &table,
            start: 0,
            ids: &ids[..p],
            want: Want::Nothing,
        };
        runner.forward_batch(&[prefix]).unwrap();
        let block = |want| Segment {
            pages: &table,
            start: p,
            ids: &ids[p..],
            want,
        };
        let mut one = |want| runner.forward_batch(&[block(want)]).unwrap().remove(0);
        let logits = one(Want::Logits(0..p)).into_logits().unwrap();
        let top1 = one(Want::Top1(2..p)).into_top1().unwrap();
        let SegmentOutput::TopK(top) = one(Want::TopK(2..p)) else {
            panic!("{name}: Want::TopK answered with something else");
        };
        assert_eq!(top.top1, top1, "{name}: top-1 pairs");
        for r in 2..p {
            let row = &logits[r * v..(r + 1) * v];
            assert_eq!(
                top.row(r - 2),
                top_k(row, top.k).as_slice(),
                "{name} row {r}"
            );
            let read = runner.logits_row(0, r).unwrap();
            bit_identical(&format!("{name} row {r} read back"), &read, row, v).unwrap();
        }
        assert!(
            runner.logits_row(0, 1).is_err(),
            "{name}: a row not asked for"
        );
        // Two segments: the second one's rows are found among the batch's wanted rows.
        let other = page_run(2, 1);
        let segments = [
            Segment {
                pages: &other,
                start: 0,
                ids: &ids[..p],
                want: Want::Logits(0..3),
            },
            block(Want::TopK(0..p)),
        ];
        let out = runner.forward_batch(&segments).unwrap();
        let SegmentOutput::TopK(top) = &out[1] else {
            panic!("{name}: Want::TopK answered with something else");
        };
        let rows = TopKRows::new(&segments);
        assert_eq!(rows.index(1, 0).unwrap(), 3);
        for r in 0..p {
            let row = runner.logits_row(1, r).unwrap();
            assert_eq!(
                top.row(r),
                top_k(&row, top.k).as_slice(),
                "{name} batched row {r}"
            );
        }
        assert!(
            runner.logits_row(0, 0).is_err(),
            "{name}: logits, not top-k, rows"
        );
    }
}

// Tests of the two comparisons above, on the CPU (so they run in CI): a runner whose batches
// are exactly its lone forwards passes them, and the same runner with one batched value moved
// by one ulp (or one top-1 token changed) fails them. A comparison that cannot fail would let
// a batch-variant GPU path through, as the tolerance these tests replaced did.

/// How [`Perturbed`] changes the first wanted row of the last segment of a batch of several.
#[derive(Clone, Copy)]
enum Perturbation {
    /// Nothing: the runner stays batch-invariant.
    None,
    /// The row's first logit, or its top-1 confidence, one ulp up.
    OneUlp,
    /// The row's top-1 token replaced by the next id (its confidence kept).
    OtherToken,
}

/// The CPU runner, run one segment at a time (so a batch gives exactly the lone outputs), with
/// an optional [`Perturbation`] of batches of more than one segment.
struct Perturbed {
    inner: minnow_model::CpuRunner,
    change: Perturbation,
}

impl ModelRunner for Perturbed {
    fn config(&self) -> &minnow_model::Config {
        self.inner.config()
    }
    fn device_name(&self) -> String {
        "cpu, one segment at a time".into()
    }
    fn kv_pages(&self) -> usize {
        self.inner.kv_pages()
    }
    fn kv_page_bytes(&self) -> usize {
        self.inner.kv_page_bytes()
    }
    fn forward_batch(
        &mut self,
        segments: &[Segment<'_>],
    ) -> minnow_model::Result<Vec<SegmentOutput>> {
        let mut out = Vec::with_capacity(segments.len());
        for seg in segments {
            out.push(
                self.inner
                    .forward_batch(std::slice::from_ref(seg))?
                    .remove(0),
            );
        }
        if segments.len() > 1 {
            let vocab = self.config().vocab_size as u32;
            let last = out
                .iter_mut()
                .rev()
                .find(|o| !matches!(o, SegmentOutput::Nothing))
                .expect("a segment with outputs");
            match (self.change, last) {
                (Perturbation::None, _) => {}
                (Perturbation::OneUlp, SegmentOutput::Logits(l)) => {
                    l[0] = f32::from_bits(l[0].to_bits() + 1)
                }
                (Perturbation::OneUlp, SegmentOutput::Top1(t)) => {
                    t[0].1 = f32::from_bits(t[0].1.to_bits() + 1)
                }
                (Perturbation::OtherToken, SegmentOutput::Top1(t)) => t[0].0 = (t[0].0 + 1) % vocab,
                (Perturbation::OneUlp, SegmentOutput::TopK(_)) => {
                    panic!("no test perturbs top-k outputs")
                }
                (Perturbation::OtherToken, _) => panic!("only top-1 outputs have a token"),
                (_, SegmentOutput::Nothing) => unreachable!(),
            }
        }
        Ok(out)
    }
    fn logits_row(&mut self, _segment: usize, _row: usize) -> minnow_model::Result<Vec<f32>> {
        // Segments run one at a time: the inner runner keeps the last one's rows only.
        Err(minnow_model::ModelError::InvalidInput(
            "the perturbed runner keeps no logits rows".into(),
        ))
    }
}

fn perturbed(name: &str, change: Perturbation) -> Perturbed {
    Perturbed {
        inner: minnow_model::CpuRunner::load(&fixture(name)).unwrap(),
        change,
    }
}

#[test]
fn the_batched_comparison_fails_on_one_ulp() {
    let name = "llada2-tiny-v22";
    let ids = golden(&fixture(name)).ids;
    batched_vs_alone(&mut perturbed(name, Perturbation::None), &ids)
        .expect("an invariant runner passes");
    let err = batched_vs_alone(&mut perturbed(name, Perturbation::OneUlp), &ids)
        .expect_err("one ulp off must fail");
    assert!(
        err.contains("segment 5") && err.contains("1/10 rows"),
        "{err}"
    );
}

#[test]
fn the_top1_comparison_fails_on_one_ulp_or_one_token() {
    let name = "llada2-tiny-v21";
    top1_batched_vs_alone(&mut perturbed(name, Perturbation::None))
        .expect("an invariant runner passes");
    let err = top1_batched_vs_alone(&mut perturbed(name, Perturbation::OneUlp))
        .expect_err("a confidence one ulp off must fail");
    assert!(
        err.contains("tokens differ on 0/32 rows, confidences on 1/32"),
        "{err}"
    );
    let err = top1_batched_vs_alone(&mut perturbed(name, Perturbation::OtherToken))
        .expect_err("another token must fail");
    assert!(err.contains("tokens differ on 1/32 rows"), "{err}");
}

/// The rule the GPU is held to holds for PyTorch's own BF16 run of every fixture (its
/// `logits_bf16`), and has teeth: the F32 logits pass, and fail once a decided token's argmax
/// moves (and only then: moving an undecided token's argmax passes).
#[test]
fn the_official_bf16_run_keeps_every_decided_f32_top1() {
    for (name, want_decided) in [
        ("llada2-tiny-v20", 77),
        ("llada2-tiny-v21", 65),
        ("llada2-tiny-v22", 28),
    ] {
        let g = golden(&fixture(name));
        let n = g.ids.len();
        let vocab = g.logits_f32.len() / n;
        assert_eq!(
            f32_top1_on_decided_rows(&g, &g.logits_bf16, 0..n, vocab),
            Ok(want_decided),
            "{name}"
        );
        assert_eq!(
            f32_top1_on_decided_rows(&g, &g.logits_f32, 0..n, vocab),
            Ok(want_decided),
            "{name}"
        );
        // The last rows alone (a cached forward's rows start at 64).
        let tail = &g.logits_bf16[64 * vocab..];
        assert!(f32_top1_on_decided_rows(&g, tail, 64..n, vocab).is_ok());
        // Swap the top two logits of the first decided token and of the first undecided one.
        let gap = |t: usize| top2_gap(&g.logits_f32[t * vocab..(t + 1) * vocab]);
        let swapped = |t: usize| {
            let mut l = g.logits_f32.clone();
            let row = &mut l[t * vocab..(t + 1) * vocab];
            let (best, second) = top2(row);
            row.swap(best, second);
            l
        };
        let decided = (0..n)
            .find(|&t| gap(t) >= DECIDED_GAP && g.margin[t] >= DECIDED_MARGIN)
            .unwrap();
        let err = f32_top1_on_decided_rows(&g, &swapped(decided), 0..n, vocab).unwrap_err();
        assert!(
            err.starts_with(&format!("token {decided}:")),
            "{name}: {err}"
        );
        let undecided = (0..n).find(|&t| gap(t) < DECIDED_GAP).unwrap();
        assert_eq!(
            f32_top1_on_decided_rows(&g, &swapped(undecided), 0..n, vocab),
            Ok(want_decided),
            "{name}"
        );
    }
}

#[test]
fn bit_identity_is_checked_on_every_row() {
    let a: Vec<f32> = (0..40).map(|i| i as f32 * 0.25).collect();
    assert!(bit_identical("same", &a, &a.clone(), 10).is_ok());
    let mut b = a.clone();
    b[37] = f32::from_bits(b[37].to_bits() + 1);
    let err = bit_identical("last row", &a, &b, 10).unwrap_err();
    assert!(
        err.contains("1/4 rows") && err.contains("first row 3"),
        "{err}"
    );
    // -0.0 == 0.0 as floats, but not as bits.
    let (zero, minus_zero) = (vec![0.0f32; 10], vec![-0.0f32; 10]);
    assert!(bit_identical("signed zero", &zero, &minus_zero, 10).is_err());
}
