//! Batch invariance on the GPU at the level a user sees: whole requests through the engine give
//! the same tokens alone, sixteen at once, next to long prefills, warm (their prefixes served
//! by the prefix cache) as cold, and with each block's K/V refresh as a forward of its own
//! instead of in the next block's first forward. Ignored in CI (no GPU); on a CUDA machine:
//!
//! ```sh
//! cargo test --release -p minnow-engine --test gpu_invariance -- --ignored --nocapture
//! ```
//!
//! The fixtures are copied with a 4,096-token context so that prompts cross several of the
//! attention's fixed 512-key splits (the fixtures' own context is 512).

use std::path::{Path, PathBuf};

use minnow_engine::{
    Algorithm, DecodeParams, Engine, EngineOptions, Event, FinishReason, GenerateRequest,
};
use minnow_runtime::device::DeviceRequest;
use rand::{Rng, SeedableRng};

const FIXTURES: [(&str, &str); 3] = [
    ("llada2-tiny-v20", "v20"),
    ("llada2-tiny-v21", "v21"),
    ("llada2-tiny-v22", "v22"),
];

/// A copy of fixture `name` whose config allows 4,096 positions.
fn roomy_fixture(name: &str) -> tempfile::TempDir {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let config_path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = serde_json::json!(4096);
    std::fs::write(&config_path, config.to_string()).unwrap();
    dir
}

fn engine(dir: &Path, parallel: usize) -> Engine {
    engine_with(dir, parallel, false)
}

/// `separate_commits`: each final block's K/V refresh as a forward of its own instead of in the
/// next block's first forward (docs/decoding.md section 8).
fn engine_with(dir: &Path, parallel: usize, separate_commits: bool) -> Engine {
    Engine::load(
        dir,
        EngineOptions {
            device: DeviceRequest::Cuda(0),
            parallel,
            separate_commits,
            ..Default::default()
        },
    )
    .unwrap()
}

/// What a finished request produced.
#[derive(Debug, PartialEq)]
struct Outcome {
    ids: Vec<u32>,
    reason: FinishReason,
    cached_tokens: usize,
}

fn finish(handle: &mut minnow_engine::RequestHandle) -> Outcome {
    while let Some(event) = handle.blocking_next_event() {
        match event {
            Event::Done {
                output_ids,
                finish_reason,
                stats,
                ..
            } => {
                return Outcome {
                    ids: output_ids,
                    reason: finish_reason,
                    cached_tokens: stats.cached_tokens,
                }
            }
            Event::Error(e) => panic!("request failed: {e}"),
            _ => {}
        }
    }
    panic!("the stream ended without Done");
}

/// Sixteen requests of mixed prompt lengths (a few past 512 tokens, every fourth sharing a
/// 96-token prefix), output lengths, algorithms, thresholds and sampling (greedy, and seeded
/// sampling with top-k / top-p).
fn mixed_requests(family: &str, seed: u64) -> Vec<GenerateRequest> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let shared: Vec<u32> = (0..96).map(|_| rng.gen_range(0..400)).collect();
    (0..16)
        .map(|i| {
            let len = if i % 5 == 4 {
                rng.gen_range(520..1400)
            } else {
                rng.gen_range(3..200)
            };
            let mut prompt: Vec<u32> = (0..len).map(|_| rng.gen_range(0..400)).collect();
            if i % 4 == 0 {
                prompt = [shared.clone(), prompt].concat();
            }
            let algorithm = match (family, i % 2) {
                ("v20", _) => Algorithm::LowConfidence,
                ("v22", 0) => Algorithm::Indel,
                (_, 0) => Algorithm::Joint,
                _ => Algorithm::LowConfidence,
            };
            let sampled = i % 3 == 2;
            GenerateRequest {
                prompt_ids: prompt,
                max_tokens: Some(rng.gen_range(1..100)),
                params: DecodeParams {
                    algorithm: Some(algorithm),
                    threshold: Some([0.5, 0.7, 0.95][i % 3]),
                    temperature: Some(if sampled { 0.8 } else { 0.0 }),
                    // Half the sampled requests read best ids (top-k 20), half draw their
                    // candidates on the GPU (no top-k).
                    top_k: (sampled && i % 2 == 0).then_some(20),
                    top_p: sampled.then_some(0.9),
                    seed: Some(1000 + i as u64),
                    ..Default::default()
                },
                ..Default::default()
            }
        })
        .collect()
}

/// Long prompts that only prefill (one output token): load that cuts other requests' steps.
fn long_prefills(seed: u64) -> Vec<GenerateRequest> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..4)
        .map(|_| GenerateRequest {
            prompt_ids: (0..rng.gen_range(1500..3000))
                .map(|_| rng.gen_range(0..400))
                .collect(),
            max_tokens: Some(1),
            cache_prompt: Some(false),
            ..Default::default()
        })
        .collect()
}

fn alone(engine: &Engine, requests: &[GenerateRequest]) -> Vec<Outcome> {
    requests
        .iter()
        .map(|r| {
            let request = GenerateRequest {
                cache_prompt: Some(false),
                ..r.clone()
            };
            finish(&mut engine.submit(request).unwrap())
        })
        .collect()
}

/// Submits every request at once (with `extra` interleaved, whose outcomes are dropped) and
/// waits for all of them.
fn together(
    engine: &Engine,
    requests: &[GenerateRequest],
    extra: &[GenerateRequest],
) -> Vec<Outcome> {
    let mut handles = Vec::new();
    let mut extra_handles = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        handles.push(engine.submit(r.clone()).unwrap());
        if let Some(x) = extra.get(i / 4).filter(|_| i % 4 == 1) {
            extra_handles.push(engine.submit(x.clone()).unwrap());
        }
    }
    let outcomes = handles.iter_mut().map(finish).collect();
    for mut h in extra_handles {
        finish(&mut h);
    }
    outcomes
}

fn differing(got: &[Outcome], want: &[Outcome]) -> Vec<usize> {
    (0..want.len())
        .filter(|&i| got[i].ids != want[i].ids || got[i].reason != want[i].reason)
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_request_decodes_the_same_alone_together_beside_prefills_and_warm() {
    let mut failures = Vec::new();
    for (name, family) in FIXTURES {
        let dir = roomy_fixture(name);
        let requests = mixed_requests(family, 17);
        let expected = alone(&engine(dir.path(), 1), &requests);
        // Repeated alone on a fresh engine: the baseline itself is reproducible.
        let again = alone(&engine(dir.path(), 1), &requests);
        let repeat = differing(&again, &expected);

        let batched = engine(dir.path(), 16);
        let graphs_before = minnow_model::cuda::CudaRunner::graph_counts();
        let cold = together(&batched, &requests, &[]);
        let graphs = minnow_model::cuda::CudaRunner::graph_counts();
        // How often the batched forwards found their shape's graph (informational: the
        // segments' order in a forward decides whether the same shapes meet again).
        println!(
            "{name}: 16 at once: {} graphs captured for {} graph launches",
            graphs.0 - graphs_before.0,
            graphs.1 - graphs_before.1
        );
        let together_diff = differing(&cold, &expected);
        // The same requests again on the same engine: their prompts' blocks are cached now.
        let warm = together(&batched, &requests, &[]);
        let warm_diff = differing(&warm, &expected);
        let hits: usize = warm.iter().map(|o| o.cached_tokens).sum();

        let mixed = engine(dir.path(), 16);
        let beside = together(&mixed, &requests, &long_prefills(23));
        let beside_diff = differing(&beside, &expected);

        let separate = together(&engine_with(dir.path(), 16, true), &requests, &[]);
        let separate_diff = differing(&separate, &expected);

        println!(
            "{name}: alone twice {} / together {} / warm {} (cached {hits} tokens) / beside long \
             prefills {} / with separate commit forwards {} differing of {}",
            repeat.len(),
            together_diff.len(),
            warm_diff.len(),
            beside_diff.len(),
            separate_diff.len(),
            requests.len()
        );
        assert!(hits > 0, "{name}: the warm run took no prefix-cache hit");
        for (what, diff) in [
            ("alone twice", repeat),
            ("16 at once", together_diff),
            ("warm", warm_diff),
            ("beside long prefills", beside_diff),
            ("with separate commit forwards", separate_diff),
        ] {
            if !diff.is_empty() {
                failures.push(format!("{name} {what}: requests {diff:?} differ"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
