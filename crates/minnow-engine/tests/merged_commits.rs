//! A final block's K/V refresh carried by the next block's first forward (docs/decoding.md
//! section 8) decodes every request exactly as a refresh forward of its own does: on each fixture
//! family, through the engine, greedy and seeded sampling requests of the family's algorithm
//! batched together, on the CPU runner (whose forward is batch-invariant, as the GPU's is).

#[path = "support/finished.rs"]
mod finished;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::path::Path;

use finished::run_all;
use fixtures::fixture;
use minnow_engine::{DecodeParams, Engine, EngineOptions, GenerateRequest};
use minnow_runtime::device::DeviceRequest;

fn engine(dir: &Path, separate_commits: bool) -> Engine {
    let options = EngineOptions {
        device: DeviceRequest::Cpu,
        parallel: 4,
        separate_commits,
        ..Default::default()
    };
    Engine::load(dir, options).unwrap()
}

/// Eight requests of three to five blocks: greedy at several thresholds and seeded sampling.
fn requests() -> Vec<GenerateRequest> {
    let settings: [(Option<f32>, Option<f32>); 4] = [
        (None, None),
        (Some(0.5), None),
        (Some(0.9), None),
        (None, Some(0.8)),
    ];
    (0..8u32)
        .map(|i| {
            let (threshold, temperature) = settings[i as usize % 4];
            GenerateRequest {
                prompt_ids: (0..5 + i * 9).map(|j| (i * 41 + j * 13) % 400).collect(),
                max_tokens: Some(96 + 16 * (i as usize % 3)),
                params: DecodeParams {
                    threshold,
                    temperature,
                    seed: Some(u64::from(i) + 7),
                    ..Default::default()
                },
                ..Default::default()
            }
        })
        .collect()
}

#[test]
fn a_refresh_in_the_next_blocks_forward_decodes_the_tokens_of_a_forward_of_its_own() {
    for name in ["llada2-tiny-v20", "llada2-tiny-v21", "llada2-tiny-v22"] {
        let dir = fixture(name);
        let requests = requests();
        let merged = run_all(&engine(&dir, false), &requests);
        let separate = run_all(&engine(&dir, true), &requests);
        for (i, (m, s)) in merged.iter().zip(&separate).enumerate() {
            assert_eq!(
                (&m.ids, &m.reason),
                (&s.ids, &s.reason),
                "{name}: request {i}"
            );
            assert_eq!(s.stats.merged_commits, 0, "{name}: request {i}");
            // The merged refreshes are the separate schedule's commit forwards, carried.
            assert_eq!(
                m.stats.merged_commits + m.stats.commit_forwards,
                s.stats.commit_forwards,
                "{name}: request {i}"
            );
        }
        let carried: usize = merged.iter().map(|m| m.stats.merged_commits).sum();
        assert!(
            carried > 0,
            "{name}: no refresh was carried by a next block's forward"
        );
        println!("{name}: {carried} refreshes carried, the same tokens");
    }
}
