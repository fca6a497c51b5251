//! A 2.0 step reads the scores of its masked slots only, so on a runner where fewer rows cost
//! less (the CPU, whose lm_head runs on the wanted rows alone, and the GPU, whose graphs are keyed
//! by how many rows a forward wants) each forward asks for the rows from the block's first to its
//! last mask. Checked through the engine with requests batched together (greedy and sampled,
//! prompts that end inside a block, merged commits) on a CPU runner that answers as the GPU
//! runner does: they decode exactly the tokens that whole-block forwards give, with fewer rows.

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

/// Every request's output ids and finish reason, submitted together to an engine of four
/// parallel requests over the fixture on a CPU runner that answers as the GPU runner does,
/// saying fewer rows cost less (`narrow`) or not (then the engine asks for whole blocks), and
/// the rows its forwards asked for.
fn decode(
    dir: &Path,
    narrow: bool,
    requests: &[GenerateRequest],
) -> (Vec<(Vec<u32>, String)>, usize) {
    let cpu = CpuRunner::load(dir).unwrap();
    let runner = if narrow {
        BestIdsRunner::narrowing(cpu)
    } else {
        BestIdsRunner::new(cpu)
    };
    let counts = runner.counts.clone();
    let options = EngineOptions {
        parallel: 4,
        ..Default::default()
    };
    let engine = Engine::with_runner(dir, Box::new(runner), options).unwrap();
    let out = finished::run_all(&engine, requests)
        .into_iter()
        .map(|f| (f.ids, f.reason))
        .collect();
    (out, counts.wanted_rows())
}

/// 2.0 requests: greedy at two thresholds, and sampled; prompts of 3 to 38 tokens, so most end
/// inside a block whose first slots are prompt ids.
fn requests() -> Vec<GenerateRequest> {
    let settings: [(Option<f32>, Option<f32>); 3] = [
        (Some(0.95), None),
        (Some(0.5), None),
        (Some(0.7), Some(0.8)),
    ];
    (0..8u32)
        .map(|i| {
            let (threshold, temperature) = settings[i as usize % 3];
            GenerateRequest {
                prompt_ids: (0..3 + i * 5).map(|j| (i * 41 + j * 13) % 400).collect(),
                max_tokens: Some(96),
                params: DecodeParams {
                    algorithm: Some(Algorithm::LowConfidence),
                    threshold,
                    temperature,
                    seed: Some(u64::from(i)),
                    ..Default::default()
                },
                ..Default::default()
            }
        })
        .collect()
}

#[test]
fn low_confidence_steps_ask_for_their_masked_span_and_decode_the_same_tokens() {
    let dir = fixture("llada2-tiny-v20");
    let requests = requests();
    let (whole, whole_rows) = decode(&dir, false, &requests);
    let (narrow, narrow_rows) = decode(&dir, true, &requests);
    println!("rows asked for: whole blocks {whole_rows}, masked spans {narrow_rows}");
    assert!(whole.iter().all(|(ids, _)| !ids.is_empty()));
    assert_eq!(narrow, whole);
    assert!(
        narrow_rows < whole_rows,
        "narrowed forwards asked for {narrow_rows} rows, whole blocks {whole_rows}"
    );
}
