//! Greedy 2.2 requests, and 2.0/2.1 requests that sample with a top-k under 64, read each row's
//! best ids instead of the block's full logits on a runner whose full logits are not cheap (the
//! GPU: 64 (id, logit) pairs per row instead of a vocabulary-wide F32 row), and decode exactly
//! the tokens the full logits give. Checked on the
//! CPU runner made to ask for best ids, against the plain CPU runner, through the engine with
//! requests batched together.

#[path = "support/best_ids_runner.rs"]
mod best_ids_runner;
#[path = "support/finished.rs"]
mod finished;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::path::Path;
use std::sync::Arc;

use best_ids_runner::{BestIdsRunner, WantCounts};
use fixtures::fixture;
use minnow_engine::{Algorithm, DecodeParams, Engine, EngineOptions, GenerateRequest};
use minnow_runtime::device::DeviceRequest;

/// The output ids and finish reason of every request, submitted all at once.
fn run_all(engine: &Engine, requests: &[GenerateRequest]) -> Vec<(Vec<u32>, String)> {
    finished::run_all(engine, requests)
        .into_iter()
        .map(|f| (f.ids, f.reason))
        .collect()
}

/// The fixture on the plain CPU runner, and on the CPU runner made to ask for best ids (with
/// its counts of what the forwards returned), both batching four requests.
fn full_and_best_ids_engines(dir: &Path) -> (Engine, Engine, Arc<WantCounts>) {
    let options = EngineOptions {
        parallel: 4,
        ..Default::default()
    };
    let cpu = EngineOptions {
        device: DeviceRequest::Cpu,
        ..options.clone()
    };
    let full = Engine::load(dir, cpu).unwrap();
    let runner = BestIdsRunner::new(minnow_model::cpu::CpuRunner::load(dir).unwrap());
    let counts = runner.counts.clone();
    let best = Engine::with_runner(dir, Box::new(runner), options).unwrap();
    (full, best, counts)
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
    let requests = requests();
    let (full, engine, counts) = full_and_best_ids_engines(&fixture("llada2-tiny-v22"));
    let full = run_all(&full, &requests);
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

/// Settings of a sampling request: temperature, top-k, top-p.
type Sampling = (f32, Option<usize>, Option<f32>);

/// `count` sampling requests of `algorithm`, taking `settings` in turn, each with its own
/// prompt (from `salt`) and seed.
fn sampling_requests(
    algorithm: Algorithm,
    settings: &[Sampling],
    count: u32,
    salt: u32,
) -> Vec<GenerateRequest> {
    (0..count)
        .map(|i| {
            let (temperature, top_k, top_p) = settings[i as usize % settings.len()];
            GenerateRequest {
                prompt_ids: (0..4 + i * (3 + salt % 2))
                    .map(|j| (i * (53 + salt) + j * 7) % 400)
                    .collect(),
                max_tokens: Some(64),
                params: DecodeParams {
                    algorithm: Some(algorithm),
                    temperature: Some(temperature),
                    top_k,
                    top_p,
                    seed: Some(u64::from(i + salt) + 100),
                    ..Default::default()
                },
                ..Default::default()
            }
        })
        .collect()
}

/// 2.0 and 2.1 requests that sample, with and without a top-k (and top-p) the best ids can answer.
fn official_sampling_requests(algorithm: Algorithm) -> Vec<GenerateRequest> {
    let settings: [Sampling; 5] = [
        (0.8, Some(40), None),
        (1.2, Some(5), Some(0.9)),
        (0.7, Some(1), None),
        (0.0, Some(3), None),
        // Without a top-k every runner reads full logits.
        (0.9, None, Some(0.95)),
    ];
    sampling_requests(algorithm, &settings, 10, 0)
}

#[test]
fn sampling_with_a_small_top_k_decodes_the_same_tokens_from_best_ids_as_from_full_logits() {
    for (name, algorithm) in [
        ("llada2-tiny-v20", Algorithm::LowConfidence),
        ("llada2-tiny-v21", Algorithm::Joint),
    ] {
        let requests = official_sampling_requests(algorithm);
        let (full, engine, counts) = full_and_best_ids_engines(&fixture(name));
        let full = run_all(&full, &requests);
        let with_top_k: Vec<GenerateRequest> = requests
            .iter()
            .filter(|r| r.params.top_k.is_some())
            .cloned()
            .collect();
        let best = run_all(&engine, &with_top_k);
        assert!(counts.best_ids() > 0, "{name}");
        assert_eq!(counts.rows(), 0, "{name}: no row needed reading in full");
        let best_all = run_all(&engine, &requests);
        assert!(
            counts.logits() > 0,
            "{name}: sampling without a top-k reads full logits"
        );

        let full_with_top_k: Vec<_> = full
            .iter()
            .zip(&requests)
            .filter(|(_, r)| r.params.top_k.is_some())
            .map(|(a, _)| a.clone())
            .collect();
        assert_eq!(best, full_with_top_k, "{name}");
        assert_eq!(best_all, full, "{name}");
        assert!(full.iter().all(|(ids, _)| !ids.is_empty()), "{name}");
    }
}

/// Sampling requests of every algorithm, with settings no best ids answer (no top-k, a top-k of
/// 100, top-p, the official rule's filters at temperature 0) and one they do.
fn drawn_requests(algorithm: Algorithm) -> Vec<GenerateRequest> {
    let settings: [Sampling; 6] = [
        (0.8, None, None),
        (1.1, None, Some(0.9)),
        (0.7, Some(100), Some(0.95)),
        (1.0, Some(100), None),
        (0.0, None, Some(0.5)),
        (0.9, Some(10), None),
    ];
    sampling_requests(algorithm, &settings, 12, 7)
}

/// A runner that draws sampled candidates itself (the GPU, here the CPU runner answering with
/// the host samplers) gets each step's uniforms in the order the host samplers take them, so
/// its requests decode the tokens that full logits give, batched four at a time, every
/// forward's draws in one call.
#[test]
fn sampling_with_device_draws_decodes_the_tokens_full_logits_give() {
    for (name, algorithm) in [
        ("llada2-tiny-v20", Algorithm::LowConfidence),
        ("llada2-tiny-v21", Algorithm::Joint),
        ("llada2-tiny-v22", Algorithm::Indel),
    ] {
        let dir = fixture(name);
        let requests = drawn_requests(algorithm);
        let (full, _, _) = full_and_best_ids_engines(&dir);
        let full = run_all(&full, &requests);
        let runner = BestIdsRunner::drawing(minnow_model::cpu::CpuRunner::load(&dir).unwrap());
        let counts = runner.counts.clone();
        let options = EngineOptions {
            parallel: 4,
            ..Default::default()
        };
        let drawing = Engine::with_runner(&dir, Box::new(runner), options).unwrap();
        let drawn = run_all(&drawing, &requests);
        assert!(
            counts.draws() > 0,
            "{name}: no candidate was drawn by the runner"
        );
        assert!(counts.best_ids() > 0, "{name}");
        // A forward's sampling steps draw their rows in one call, whichever requests they are.
        assert!(
            counts.draw_calls() <= counts.forwards(),
            "{name}: {} draw calls for {} forwards",
            counts.draw_calls(),
            counts.forwards()
        );
        assert_eq!(drawn, full, "{name}");
        assert!(full.iter().all(|(ids, _)| !ids.is_empty()), "{name}");
    }
}
