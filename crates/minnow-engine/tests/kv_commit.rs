//! The K/V commit rule (decoding doc §8, §12.7) on the real CPU model: a block that converged
//! keeps its last forward's K/V, a block that ended on its post-step budget is refreshed once, and
//! either way the next block sees exactly the K/V a cold prefill of the same ids produces.

use std::path::PathBuf;

use minnow_engine::decode::block::{BlockRun, BlockState, Commit};
use minnow_engine::decode::joint::{Joint, JointSettings};
use minnow_engine::decode::ControlTokens;
use minnow_engine::sampling::SamplerSettings;
use minnow_model::cpu::CpuRunner;
use minnow_model::{LogitsRows, SeqId, SingleSequence};
use rand::SeedableRng;
use serde_json::Value;

const MASK: u32 = 482;
const B: usize = 32;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llada2-tiny-v21")
}

fn golden_prompt() -> Vec<u32> {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture().join("golden_decode.json")).unwrap(),
    )
    .unwrap();
    serde_json::from_value(golden["prompt_ids"].clone()).unwrap()
}

/// Decodes block 1 of the golden prompt with the joint algorithm; returns the final ids, the ids
/// of the last denoising forward, and how the block was committed.
fn decode_block_one(
    runner: &mut SingleSequence<CpuRunner>,
    seq: SeqId,
    prompt: &[u32],
    editing_threshold: f32,
) -> (Vec<u32>, Vec<u32>, Commit) {
    runner.forward(seq, &prompt[..B], LogitsRows::None).unwrap();
    let mut block = prompt[B..].to_vec();
    let tail = block.len();
    block.resize(B, MASK);
    let control = ControlTokens {
        mask: MASK,
        delete: None,
        split: None,
    };
    let joint = Joint::new(
        tail,
        B,
        JointSettings {
            threshold: 0.5,
            editing_threshold,
            max_post_steps: 16,
            num_to_transfer: 1,
            sampler: SamplerSettings::GREEDY,
        },
        control,
    );
    let mut run = BlockRun::new(B, block, tail, Box::new(joint), control);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut last_input = run.tokens().to_vec();
    loop {
        let before = (run.forwards(), run.tokens().to_vec());
        let state = run.advance(runner, seq, &mut rng).unwrap();
        if run.forwards() > before.0 {
            last_input = before.1;
        }
        if state == BlockState::Final {
            break;
        }
    }
    let commit = run.commit(runner, seq).unwrap();
    (run.tokens().to_vec(), last_input, commit)
}

/// Logits of an all-mask block at position 64 after the given cache.
fn probe(runner: &mut SingleSequence<CpuRunner>, seq: SeqId) -> Vec<f32> {
    assert_eq!(runner.sequence_len(seq), 2 * B);
    runner.forward(seq, &[MASK; B], LogitsRows::All).unwrap()
}

/// A cold cache: prompt block, then `block_one` in one forward.
fn cold_probe(
    runner: &mut SingleSequence<CpuRunner>,
    prompt: &[u32],
    block_one: &[u32],
) -> Vec<f32> {
    let seq = runner.create_sequence();
    runner.forward(seq, &prompt[..B], LogitsRows::None).unwrap();
    runner.forward(seq, block_one, LogitsRows::None).unwrap();
    probe(runner, seq)
}

#[test]
fn budget_exit_refreshes_once_and_matches_a_cold_prefill() {
    let mut runner = SingleSequence::new(CpuRunner::load(&fixture()).unwrap());
    let prompt = golden_prompt();
    let seq = runner.create_sequence();
    // τe = 0: block 1 of this prompt keeps editing until max_post_steps (fixture README).
    let (final_ids, last_input, commit) = decode_block_one(&mut runner, seq, &prompt, 0.0);
    assert_eq!(commit, Commit::Refreshed);
    assert_ne!(final_ids, last_input, "the last edits were never forwarded");
    let warm = probe(&mut runner, seq);
    assert_eq!(
        warm,
        cold_probe(&mut runner, &prompt, &final_ids),
        "bit-exact with a cold prefill"
    );
    // Committing the stale K/V of the last forward instead would change the next block.
    assert_ne!(warm, cold_probe(&mut runner, &prompt, &last_input));
}

#[test]
fn converged_block_reuses_its_last_forward() {
    let mut runner = SingleSequence::new(CpuRunner::load(&fixture()).unwrap());
    let prompt = golden_prompt();
    let seq = runner.create_sequence();
    // τe = 0.9: block 1 converges (its last step changes nothing).
    let (final_ids, last_input, commit) = decode_block_one(&mut runner, seq, &prompt, 0.9);
    assert_eq!(commit, Commit::Reused);
    assert_eq!(final_ids, last_input);
    let warm = probe(&mut runner, seq);
    assert_eq!(warm, cold_probe(&mut runner, &prompt, &final_ids));
}
