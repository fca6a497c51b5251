//! Batch invariance of the CUDA runner, bit for bit: a row's logits do not depend on the other
//! segments of its forward (how many, how long, what they want) nor on how its prompt was cut
//! into prefill chunks. Random checkpoints with a 4,096-token context (several of the attention's
//! fixed 512-key splits), on the fast-kernel shapes with 2.1 group routing and 2.2 block routing,
//! and on the general shapes (GQA group 3, 24-wide experts). Ignored: needs a GPU;
//! `cargo test --release -p minnow-model --test cuda_invariance -- --ignored --nocapture`.
//! `MINNOW_TEST_SEED` changes the random ids (the seed is printed on failure).

mod common;

use std::ops::Range;

use common::{assert_bit_identical, random_checkpoint, Rng};
use minnow_model::cuda::CudaRunner;
use minnow_model::{ModelRunner, PageId, Segment, SegmentOutput, Want};
use safetensors::Dtype;

const BLOCK: usize = 32;

fn config(overrides: &[(&str, serde_json::Value)]) -> serde_json::Value {
    let mut v = serde_json::json!({
        "model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"],
        "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
        "moe_intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4,
        "num_shared_experts": 1, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5, "max_position_embeddings": 4096, "hidden_act": "silu",
        "score_function": "sigmoid", "use_qk_norm": true, "use_qkv_bias": false,
        "use_bias": false, "norm_head": false, "tie_word_embeddings": false,
        "use_sliding_window": false, "rope_scaling": null, "moe_router_enable_expert_bias": true,
        "n_group": 4, "topk_group": 2
    });
    for (k, val) in overrides {
        v[*k] = val.clone();
    }
    v
}

fn shapes() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        ("fast shapes, 2.1 group routing", config(&[])),
        (
            "fast shapes, 2.2 block routing",
            config(&[
                ("expert_capacity", 6.into()),
                ("block_size", 32.into()),
                ("n_group", serde_json::Value::Null),
                ("topk_group", serde_json::Value::Null),
            ]),
        ),
        (
            "general shapes (GQA 3, 24-wide experts)",
            config(&[
                ("num_attention_heads", 6.into()),
                ("moe_intermediate_size", 24.into()),
                ("head_dim", 32.into()),
                ("hidden_size", 192.into()),
            ]),
        ),
    ]
}

fn seed() -> u64 {
    std::env::var("MINNOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261201)
}

fn ids(n: usize, vocab: u32, rng: &mut Rng) -> Vec<u32> {
    (0..n)
        .map(|_| ((rng.next() + 1.0) * 0.5 * vocab as f32) as u32 % vocab)
        .collect()
}

/// Pages of the runner's pool handed out in order (tests never free them).
struct Pages(PageId);

impl Pages {
    fn take(&mut self, n: usize) -> Vec<PageId> {
        let out = (0..n as PageId).map(|i| self.0 + i).collect();
        self.0 += n as PageId;
        out
    }
}

/// A random checkpoint of `cfg` (weights from `weights_seed`) on the GPU, and its vocabulary.
/// The directory lives as long as the runner may read it.
fn runner_for(cfg: serde_json::Value, weights_seed: u64) -> (tempfile::TempDir, CudaRunner, u32) {
    let dir = random_checkpoint(cfg, Dtype::F32, weights_seed);
    let runner = CudaRunner::load(dir.path(), 0).expect("the GPU takes this shape");
    let vocab = runner.config().vocab_size as u32;
    (dir, runner, vocab)
}

/// One segment alone in a forward: its output.
fn forward_one(
    runner: &mut CudaRunner,
    pages: &[PageId],
    start: usize,
    ids: &[u32],
    want: Want,
) -> SegmentOutput {
    runner
        .forward_batch(&[Segment {
            pages,
            start,
            ids,
            want,
        }])
        .unwrap()
        .remove(0)
}

/// Prefills `ids` into `pages` with forwards of `chunk` tokens.
fn prefill(runner: &mut CudaRunner, pages: &[PageId], ids: &[u32], chunk: usize) {
    for start in (0..ids.len()).step_by(chunk) {
        let end = (start + chunk).min(ids.len());
        forward_one(runner, pages, start, &ids[start..end], Want::Nothing);
    }
}

fn logits(out: SegmentOutput) -> Vec<f32> {
    match out {
        SegmentOutput::Logits(l) => l,
        other => panic!("expected logits, got {other:?}"),
    }
}

/// A 32-row denoising segment over a 1,024-token prefix gives the same logit bits alone and
/// inside forwards of 2, 4, 16 and 64 segments mixing denoising blocks at other prefixes (some
/// asking for a span of their rows, as 2.0 steps do), prefill chunks and K/V-only commits; and
/// asking for a span of its own rows gives those rows' bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_segment_gets_the_same_bits_in_any_batch() {
    let seed = seed();
    for (name, cfg) in shapes() {
        let (_dir, mut runner, vocab) = runner_for(cfg, 7);
        let mut rng = Rng(seed);
        let mut pages = Pages(0);
        let prefix = 1024;
        let probe_ids = ids(prefix + BLOCK, vocab, &mut rng);
        let probe_pages = pages.take((prefix + BLOCK).div_ceil(BLOCK));
        prefill(&mut runner, &probe_pages, &probe_ids[..prefix], 512);
        let probe = |runner: &mut CudaRunner, others: &[Segment<'_>], rows: Range<usize>| {
            let mut batch = vec![Segment {
                pages: &probe_pages,
                start: prefix,
                ids: &probe_ids[prefix..],
                want: Want::Logits(rows),
            }];
            batch.extend(others.iter().cloned());
            // The probe goes in the middle of the batch, not always first.
            let at = batch.len() / 2;
            batch.swap(0, at);
            let mut out = runner.forward_batch(&batch).unwrap();
            logits(out.swap_remove(at))
        };
        let alone = probe(&mut runner, &[], 0..BLOCK);
        // The rows from slot 7 on, as a 2.0 step whose first masked slot is 7 asks for them.
        let span_start = 7;
        let span = &alone[span_start * vocab as usize..];
        for others in [1usize, 3, 15, 63] {
            // Other sequences: each with its own prefix already prefilled.
            let mut seqs = Vec::new();
            for i in 0..others {
                let pre = [0, 32, 224, 704, 1696][i % 5];
                let len = match i % 3 {
                    1 => [32, 96, 480][(i / 3) % 3],
                    _ => BLOCK,
                };
                let seq_ids = ids(pre + len, vocab, &mut rng);
                let seq_pages = pages.take((pre + len).div_ceil(BLOCK));
                if pre > 0 {
                    prefill(&mut runner, &seq_pages, &seq_ids[..pre], 512);
                }
                let want = match i % 3 {
                    0 => Want::Logits(0..len),
                    1 => Want::Nothing,
                    // Spans of other lengths: other counts of rows in the lm_head.
                    _ => Want::Top1((i * 5) % len..len),
                };
                seqs.push((seq_pages, pre, seq_ids, want));
            }
            let segments: Vec<Segment<'_>> = seqs
                .iter()
                .map(|(p, pre, ids, want)| Segment {
                    pages: p,
                    start: *pre,
                    ids: &ids[*pre..],
                    want: want.clone(),
                })
                .collect();
            let got = probe(&mut runner, &segments, 0..BLOCK);
            assert_bit_identical(
                &format!("{name}: probe among {others} others (MINNOW_TEST_SEED={seed})"),
                &got,
                &alone,
            );
            let got = probe(&mut runner, &segments, span_start..BLOCK);
            assert_bit_identical(
                &format!("{name}: probe's span among {others} others (MINNOW_TEST_SEED={seed})"),
                &got,
                span,
            );
            println!("{name}: probe among {others} others: bit-identical");
        }
    }
}

/// A 2,048-token prompt prefilled in chunks of 32, 96, 512 or 2,048 tokens leaves K/V that give
/// the next block the same logit bits (and the prompt's last rows the same bits too).
#[test]
#[ignore = "needs a CUDA GPU"]
fn prefill_chunking_never_changes_a_rows_bits() {
    let seed = seed();
    for (name, cfg) in shapes() {
        let (_dir, mut runner, vocab) = runner_for(cfg, 9);
        let mut rng = Rng(seed ^ 0x5eed);
        let prompt = 2048;
        let all_ids = ids(prompt + BLOCK, vocab, &mut rng);
        let mut pages = Pages(0);
        let mut reference: Option<(Vec<f32>, Vec<f32>)> = None;
        for chunk in [2048, 512, 96, 32] {
            let p = pages.take((prompt + BLOCK).div_ceil(BLOCK));
            prefill(&mut runner, &p, &all_ids[..prompt - BLOCK], chunk);
            // The prompt's last block with logits, then the next block.
            let last = logits(forward_one(
                &mut runner,
                &p,
                prompt - BLOCK,
                &all_ids[prompt - BLOCK..prompt],
                Want::Logits(0..BLOCK),
            ));
            let next = logits(forward_one(
                &mut runner,
                &p,
                prompt,
                &all_ids[prompt..],
                Want::Logits(0..BLOCK),
            ));
            match &reference {
                None => reference = Some((last, next)),
                Some((want_last, want_next)) => {
                    let what = format!("{name}, chunks of {chunk} (MINNOW_TEST_SEED={seed})");
                    assert_bit_identical(&format!("{what}: last prompt block"), &last, want_last);
                    assert_bit_identical(&format!("{what}: next block"), &next, want_next);
                    println!("{name}: chunks of {chunk}: bit-identical");
                }
            }
        }
    }
}

/// What the engine's merged commit relies on, on the GPU: a final block's refresh and the next
/// block's first step in one forward (the final ids, then the next block, its rows wanted) give
/// the next block's logits of a refresh forward followed by a step, bit for bit, and leave the
/// same K/V behind (a further block's logits are the same too).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_refresh_in_the_next_blocks_forward_gives_the_bits_of_two_forwards() {
    let seed = seed();
    for (name, cfg) in shapes() {
        let (_dir, mut runner, vocab) = runner_for(cfg, 9);
        let mut rng = Rng(seed ^ 0xc011);
        let prompt = 1024;
        let all = ids(prompt + 3 * BLOCK, vocab, &mut rng);
        let (done, next, later) = (
            prompt..prompt + BLOCK,
            prompt + BLOCK..prompt + 2 * BLOCK,
            prompt + 2 * BLOCK..prompt + 3 * BLOCK,
        );
        let mut pages = Pages(0);
        let two = pages.take(all.len().div_ceil(BLOCK));
        prefill(&mut runner, &two, &all[..prompt], prompt);
        forward_one(
            &mut runner,
            &two,
            done.start,
            &all[done.clone()],
            Want::Nothing,
        );
        let first = logits(forward_one(
            &mut runner,
            &two,
            next.start,
            &all[next.clone()],
            Want::Logits(0..BLOCK),
        ));
        let after = logits(forward_one(
            &mut runner,
            &two,
            later.start,
            &all[later.clone()],
            Want::Logits(0..BLOCK),
        ));

        let one = pages.take(all.len().div_ceil(BLOCK));
        prefill(&mut runner, &one, &all[..prompt], prompt);
        let both = &all[done.start..next.end];
        let merged = logits(forward_one(
            &mut runner,
            &one,
            done.start,
            both,
            Want::Logits(BLOCK..2 * BLOCK),
        ));
        let merged_after = logits(forward_one(
            &mut runner,
            &one,
            later.start,
            &all[later.clone()],
            Want::Logits(0..BLOCK),
        ));

        let what = format!("{name} (MINNOW_TEST_SEED={seed})");
        assert_bit_identical(
            &format!("{what}: the next block's first step"),
            &merged,
            &first,
        );
        assert_bit_identical(&format!("{what}: the block after"), &merged_after, &after);
        println!("{name}: a refresh merged into the next block's forward: bit-identical");
    }
}
