//! A 2.0 step reads the scores of its masked slots only, so on a runner where fewer rows cost
//! less (the CPU, whose lm_head runs on the wanted rows alone, and the GPU, whose graphs are keyed
//! by how many rows a forward wants) each forward asks for the rows from the block's first to its
//! last mask. Checked through the engine with requests batched together (greedy, sampled from
//! full logits, from best ids, and from candidates the runner draws; prompts that end inside a
//! block, merged commits) on a CPU runner that answers as the GPU runner does: they decode
//! exactly the tokens that whole-block forwards give, with fewer rows.

#[path = "support/best_ids_runner.rs"]
mod best_ids_runner;
#[path = "support/finished.rs"]
mod finished;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::path::Path;

use best_ids_runner::BestIdsRunner;
use fixtures::fixture;
use minnow_engine::{Algorithm, DecodeParams, Engine, EngineOptions, GenerateRequest};
use minnow_model::cpu::CpuRunner;

/// What a decode of [`decode`] returned: every request's output ids and finish reason, and what
/// its forwards asked for.
struct Decoded {
    outputs: Vec<(Vec<u32>, String)>,
    wanted_rows: usize,
    best_ids: usize,
    draws: usize,
}

/// The requests submitted together to an engine of four parallel requests over the fixture on a
/// CPU runner that answers as the GPU runner does, saying fewer rows cost less (`narrow`) or not
/// (then the engine asks for whole blocks), and drawing sampling steps' candidates (`draws`) or
/// not.
fn decode(dir: &Path, narrow: bool, draws: bool, requests: &[GenerateRequest]) -> Decoded {
    let mut runner = BestIdsRunner::new(CpuRunner::load(dir).unwrap());
    runner.narrow = narrow;
    runner.draws = draws;
    let counts = runner.counts.clone();
    let options = EngineOptions {
        parallel: 4,
        ..Default::default()
    };
    let engine = Engine::with_runner(dir, Box::new(runner), options).unwrap();
    let outputs = finished::run_all(&engine, requests)
        .into_iter()
        .map(|f| (f.ids, f.reason))
        .collect();
    Decoded {
        outputs,
        wanted_rows: counts.wanted_rows(),
        best_ids: counts.best_ids(),
        draws: counts.draws(),
    }
}

/// 2.0 requests: greedy at two thresholds, sampled without top-k (full logits, or candidates the
/// runner draws) and with top-k 20 (best ids); prompts of 3 to 38 tokens, so most end inside a
/// block whose first slots are prompt ids.
fn requests() -> Vec<GenerateRequest> {
    let settings: [(f32, Option<f32>, Option<usize>); 4] = [
        (0.95, None, None),
        (0.5, None, None),
        (0.7, Some(0.8), None),
        (0.7, Some(0.9), Some(20)),
    ];
    (0..8u32)
        .map(|i| {
            let (threshold, temperature, top_k) = settings[i as usize % 4];
            GenerateRequest {
                prompt_ids: (0..3 + i * 5).map(|j| (i * 41 + j * 13) % 400).collect(),
                max_tokens: Some(96),
                params: DecodeParams {
                    algorithm: Some(Algorithm::LowConfidence),
                    threshold: Some(threshold),
                    temperature,
                    top_k,
                    seed: Some(u64::from(i)),
                    ..Default::default()
                },
                ..Default::default()
            }
        })
        .collect()
}

/// Decodes the requests with whole blocks and with masked spans on a runner that draws or not:
/// the same tokens, fewer rows asked for, and best ids among the narrowed forwards.
fn spans_decode_what_whole_blocks_decode(draws: bool) -> Decoded {
    let dir = fixture("llada2-tiny-v20");
    let requests = requests();
    let whole = decode(&dir, false, draws, &requests);
    let narrow = decode(&dir, true, draws, &requests);
    println!(
        "rows asked for: whole blocks {}, masked spans {}",
        whole.wanted_rows, narrow.wanted_rows
    );
    assert!(whole.outputs.iter().all(|(ids, _)| !ids.is_empty()));
    assert_eq!(narrow.outputs, whole.outputs);
    assert!(
        narrow.wanted_rows < whole.wanted_rows,
        "narrowed forwards asked for {} rows, whole blocks {}",
        narrow.wanted_rows,
        whole.wanted_rows
    );
    assert!(narrow.best_ids > 0, "no forward asked for best ids");
    narrow
}

#[test]
fn low_confidence_steps_ask_for_their_masked_span_and_decode_the_same_tokens() {
    let narrow = spans_decode_what_whole_blocks_decode(false);
    assert_eq!(narrow.draws, 0);
}

#[test]
fn sampling_steps_drawing_on_the_device_ask_for_their_masked_span_too() {
    let narrow = spans_decode_what_whole_blocks_decode(true);
    assert!(narrow.draws > 0, "no candidate was drawn on the runner");
}
