//! Greedy 2.2 requests read each row's best ids instead of the block's full logits on a runner
//! whose full logits are not cheap (the GPU: 64 (id, logit) pairs per row instead of a
//! vocabulary-wide F32 row), and decode exactly the tokens the full logits give. Checked on the
//! CPU runner made to ask for best ids, against the plain CPU runner, through the engine with
//! requests batched together.

#[path = "support/best_ids_runner.rs"]
mod best_ids_runner;

use std::path::PathBuf;

use best_ids_runner::BestIdsRunner;
use minnow_engine::{Algorithm, DecodeParams, Engine, EngineOptions, Event, GenerateRequest};
use minnow_runtime::device::DeviceRequest;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// The output ids and finish reason of every request, submitted all at once.
fn run_all(engine: &Engine, requests: &[GenerateRequest]) -> Vec<(Vec<u32>, String)> {
    let mut handles: Vec<_> = requests
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    handles
        .iter_mut()
        .map(|handle| loop {
            match handle.blocking_next_event() {
                Some(Event::Done {
                    output_ids,
                    finish_reason,
                    ..
                }) => break (output_ids, format!("{finish_reason:?}")),
                Some(Event::Error(e)) => panic!("request failed: {e}"),
                Some(_) => {}
                None => panic!("the stream ended without Done"),
            }
        })
        .collect()
}

fn requests() -> Vec<GenerateRequest> {
    let settings: [(Option<f32>, Option<f32>, Option<f32>); 4] = [
        (None, None, None),
        (Some(0.5), Some(0.9), None),
        (Some(0.9), Some(0.0), None),
        // Sampling reads full logits on every runner.
        (None, None, Some(0.8)),
    ];
    (0..8u32)
        .map(|i| {
            let (threshold, editing_threshold, temperature) = settings[i as usize % 4];
            GenerateRequest {
                prompt_ids: (0..3 + i * 5).map(|j| (i * 37 + j * 11) % 400).collect(),
                max_tokens: Some(96),
                params: DecodeParams {
                    algorithm: Some(Algorithm::Indel),
                    threshold,
                    editing_threshold,
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
fn greedy_indel_decodes_the_same_tokens_from_best_ids_as_from_full_logits() {
    let dir = fixture("llada2-tiny-v22");
    let requests = requests();
    let options = EngineOptions {
        parallel: 4,
        ..Default::default()
    };
    let full = Engine::load(
        &dir,
        EngineOptions {
            device: DeviceRequest::Cpu,
            ..options.clone()
        },
    )
    .unwrap();
    let full = run_all(&full, &requests);

    let runner = BestIdsRunner::new(minnow_model::cpu::CpuRunner::load(&dir).unwrap());
    let counts = runner.counts.clone();
    let engine = Engine::with_runner(&dir, Box::new(runner), options).unwrap();
    let greedy_only: Vec<GenerateRequest> = requests
        .iter()
        .filter(|r| r.params.temperature.is_none())
        .cloned()
        .collect();
    let best = run_all(&engine, &greedy_only);
    assert!(counts.best_ids() > 0);
    assert_eq!(
        counts.logits(),
        0,
        "a greedy 2.2 request read a block's full logits"
    );
    let best_all = run_all(&engine, &requests);
    assert!(
        counts.logits() > 0,
        "the sampling requests read full logits"
    );

    let greedy_full: Vec<_> = full
        .iter()
        .zip(&requests)
        .filter(|(_, r)| r.params.temperature.is_none())
        .map(|(a, _)| a.clone())
        .collect();
    assert_eq!(best, greedy_full);
    assert_eq!(best_all, full);
    assert!(full.iter().all(|(ids, _)| !ids.is_empty()));
}
