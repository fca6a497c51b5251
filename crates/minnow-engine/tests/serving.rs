//! Serving on the real CPU model (F32, the tiny fixtures): requests batched together, warm
//! (prefix-cached) requests and requests squeezed by a tiny K/V budget all produce exactly the
//! tokens each request produces alone and cold.

#[path = "support/fixtures.rs"]
mod fixtures;

use fixtures::fixture;
use minnow_engine::{
    Algorithm, DecodeParams, Engine, EngineError, EngineOptions, Event, FinishReason,
    GenerateRequest, GenerationStats,
};
use minnow_runtime::device::DeviceRequest;
use rand::{Rng, SeedableRng};

fn engine(name: &str, parallel: usize, kv_cache_bytes: Option<usize>) -> Engine {
    engine_with(
        name,
        EngineOptions {
            parallel,
            kv_cache_bytes,
            ..Default::default()
        },
    )
}

fn engine_with(name: &str, options: EngineOptions) -> Engine {
    Engine::load(
        &fixture(name),
        EngineOptions {
            device: DeviceRequest::Cpu,
            ..options
        },
    )
    .unwrap()
}

/// Bytes of one K/V page of the tiny fixtures: 2 layers x K and V x 2 heads x 32 positions x
/// 16 dims x 4 bytes = 16 KiB.
const TINY_PAGE: usize = 2 * 2 * 2 * 32 * 16 * 4;

/// What a finished request produced.
#[derive(Debug, PartialEq)]
struct Outcome {
    ids: Vec<u32>,
    reason: FinishReason,
}

fn finish(handle: &mut minnow_engine::RequestHandle) -> (Outcome, GenerationStats) {
    while let Some(event) = handle.blocking_next_event() {
        match event {
            Event::Done {
                output_ids,
                finish_reason,
                stats,
                ..
            } => {
                return (
                    Outcome {
                        ids: output_ids,
                        reason: finish_reason,
                    },
                    stats,
                )
            }
            Event::Error(e) => panic!("request failed: {e}"),
            _ => {}
        }
    }
    panic!("the stream ended without Done");
}

/// `n` greedy requests of mixed prompt lengths, output lengths and algorithm settings; every
/// third one shares a 64-token prefix with the others of its kind (so batched runs also take
/// prefix-cache hits).
fn mixed_requests(n: usize, family: &str, seed: u64) -> Vec<GenerateRequest> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let shared: Vec<u32> = (0..64).map(|_| rng.gen_range(0..400)).collect();
    (0..n)
        .map(|i| {
            let len = rng.gen_range(3..120);
            let mut prompt: Vec<u32> = (0..len).map(|_| rng.gen_range(0..400)).collect();
            if i.is_multiple_of(3) {
                prompt = [shared.clone(), prompt].concat();
            }
            let algorithm = match (family, i % 2) {
                ("v20", _) => Algorithm::LowConfidence,
                ("v22", 0) => Algorithm::Indel,
                (_, 0) => Algorithm::Joint,
                _ => Algorithm::LowConfidence,
            };
            GenerateRequest {
                prompt_ids: prompt,
                max_tokens: Some(rng.gen_range(1..80)),
                params: DecodeParams {
                    algorithm: Some(algorithm),
                    threshold: Some([0.5, 0.7, 0.95][i % 3]),
                    temperature: Some(0.0),
                    ..Default::default()
                },
                ..Default::default()
            }
        })
        .collect()
}

fn alone(name: &str, requests: &[GenerateRequest]) -> Vec<Outcome> {
    let engine = engine(name, 1, None);
    requests
        .iter()
        .map(|r| {
            let request = GenerateRequest {
                cache_prompt: Some(false),
                ..r.clone()
            };
            finish(&mut engine.submit(request).unwrap()).0
        })
        .collect()
}

/// The engine's statistics once its worker has reported the end of every request (it reports
/// after each step, just after the step's last events went out).
fn settled(engine: &Engine) -> minnow_engine::EngineStats {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let stats = engine.stats();
        if (stats.cache.pages_held == 0 && engine.busy_slots() == 0)
            || std::time::Instant::now() > deadline
        {
            return stats;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn together(engine: &Engine, requests: &[GenerateRequest]) -> Vec<(Outcome, GenerationStats)> {
    let mut handles: Vec<_> = requests
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    handles.iter_mut().map(finish).collect()
}

#[test]
fn batched_decodes_equal_decodes_alone() {
    for (name, family) in [
        ("llada2-tiny-v21", "v21"),
        ("llada2-tiny-v20", "v20"),
        ("llada2-tiny-v22", "v22"),
    ] {
        let requests = mixed_requests(16, family, 7);
        let expected = alone(name, &requests);
        for parallel in [1, 4, 16] {
            let engine = engine(name, parallel, None);
            let got = together(&engine, &requests);
            for (i, ((g, _), e)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(g, e, "{name}, {parallel} at once: request {i} differs");
            }
            let stats = settled(&engine);
            if parallel > 1 {
                let batches: u64 = stats.batch_size_counts[1..].iter().sum();
                assert!(batches > 0, "{name}: no forward ever held two sequences");
            }
        }
    }
}

#[test]
fn warm_requests_equal_cold_and_report_the_hit() {
    let name = "llada2-tiny-v21";
    let engine = engine(name, 1, None);
    let mut request = mixed_requests(1, "v21", 3).remove(0);
    request.prompt_ids = (0..150).map(|i| (i * 7 % 400) as u32).collect();
    request.max_tokens = Some(70);
    let (cold, cold_stats) = finish(&mut engine.submit(request.clone()).unwrap());
    assert_eq!(cold_stats.cached_tokens, 0);
    let (warm, warm_stats) = finish(&mut engine.submit(request.clone()).unwrap());
    assert_eq!(
        warm, cold,
        "a warm request must decode exactly like a cold one"
    );
    assert_eq!(
        warm_stats.cached_tokens, 128,
        "the four complete prompt blocks hit"
    );

    // A second turn: the first turn's prompt and answer, then more. Its prompt blocks and the
    // committed answer blocks hit.
    let mut turn2 = request.clone();
    turn2.prompt_ids = [request.prompt_ids.clone(), cold.ids.clone(), vec![5; 20]].concat();
    let (second, second_stats) = finish(&mut engine.submit(turn2.clone()).unwrap());
    // Every answer block but the last was committed with the ids the second turn repeats.
    let prefill_blocks = turn2.prompt_ids.len() / 32;
    let expected_hit = prefill_blocks.min(4 + cold_stats.blocks - 1) * 32;
    assert!(
        cold_stats.blocks >= 2,
        "the first answer should span blocks"
    );
    assert_eq!(
        second_stats.cached_tokens, expected_hit,
        "answer blocks hit too"
    );
    let fresh = self::engine(name, 1, None);
    turn2.cache_prompt = Some(false);
    let (second_cold, stats) = finish(&mut fresh.submit(turn2).unwrap());
    assert_eq!(stats.cached_tokens, 0);
    assert_eq!(second, second_cold);
    assert_eq!(
        settled(&engine).cache.hit_tokens as usize,
        warm_stats.cached_tokens + second_stats.cached_tokens
    );
}

#[test]
fn a_shared_system_prompt_is_stored_once() {
    let name = "llada2-tiny-v21";
    let engine = engine(name, 4, None);
    let system: Vec<u32> = (0..128).map(|i| (i * 13 % 400) as u32).collect();
    let request = |k: u32| GenerateRequest {
        prompt_ids: [
            system.clone(),
            (0..40).map(|i| (i + 50 * k) % 400).collect(),
        ]
        .concat(),
        max_tokens: Some(30),
        params: DecodeParams {
            temperature: Some(0.0),
            ..Default::default()
        },
        ..Default::default()
    };
    let (_, first) = finish(&mut engine.submit(request(0)).unwrap());
    let after_first = settled(&engine).cache;
    let later: Vec<_> = (1..4).map(request).collect();
    let results = together(&engine, &later);
    for (_, stats) in &results {
        assert_eq!(
            stats.cached_tokens, 128,
            "the system prompt's four blocks hit"
        );
    }
    // Every request published its fifth prompt block and its committed answer blocks; the four
    // system blocks exist once. (Each request's last answer block is never committed.)
    let own_blocks = |s: &GenerationStats| 1 + (s.blocks - 1);
    let expected =
        4 + own_blocks(&first) + results.iter().map(|(_, s)| own_blocks(s)).sum::<usize>();
    let cache = settled(&engine).cache;
    assert_eq!(cache.pages_held, 0);
    assert_eq!(cache.pages_cached, expected);
    assert_eq!(after_first.pages_cached, 4 + own_blocks(&first));
}

#[test]
fn a_tiny_budget_evicts_and_keeps_every_request_correct() {
    let name = "llada2-tiny-v21";
    let requests = mixed_requests(10, "v21", 11);
    let expected = alone(name, &requests);
    // Page = 2 layers x 2 x 2 heads x 32 x 16 x 4 bytes = 16 KiB; 12 pages hold three canvases
    // of up to 4 blocks at a time, so requests wait their turn and cached pages are evicted.
    let engine = engine(name, 4, Some(12 * TINY_PAGE));
    let got = together(&engine, &requests);
    for (i, ((g, _), e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "request {i} differs under a tiny budget");
    }
    let cache = settled(&engine).cache;
    assert_eq!(cache.pages_total, 12);
    assert!(
        cache.evicted_pages > 0,
        "the budget should have forced evictions"
    );
    assert_eq!(cache.pages_held, 0);
}

#[test]
fn a_request_larger_than_the_pool_is_refused_and_the_engine_recovers() {
    let name = "llada2-tiny-v21";
    let engine = engine(name, 2, Some(3 * TINY_PAGE));
    let big = GenerateRequest {
        prompt_ids: vec![7; 100],
        max_tokens: Some(64),
        ..Default::default()
    };
    match engine.submit(big) {
        Err(EngineError::Overloaded(message)) => {
            assert!(message.contains("K/V"), "{message}")
        }
        other => panic!("expected Overloaded, got {:?}", other.map(|h| h.id)),
    }
    let small = GenerateRequest {
        prompt_ids: vec![7; 10],
        max_tokens: Some(20),
        ..Default::default()
    };
    let (outcome, _) = finish(&mut engine.submit(small).unwrap());
    assert!(!outcome.ids.is_empty());
}

#[test]
fn cancelling_one_request_leaves_the_others_unchanged() {
    let name = "llada2-tiny-v21";
    let mut requests: Vec<GenerateRequest> = mixed_requests(4, "v21", 5)
        .into_iter()
        .map(|mut r| {
            r.max_tokens = Some(90);
            r
        })
        .collect();
    // Request 1 runs long (ten blocks alone), so that it is still decoding when it is cancelled
    // after its first block: the worker would have to finish nine more blocks in the moment
    // between that block's event and the cancel.
    requests[1].max_tokens = Some(320);
    let expected = alone(name, &requests);
    assert_eq!(
        (expected[1].reason, expected[1].ids.len()),
        (FinishReason::Length, 320),
        "request 1 must not end by itself (pick another seed)"
    );
    let engine = engine(name, 4, None);
    let mut handles: Vec<_> = requests
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    // Cancel request 1 once its first block is out, while the others are mid-decode.
    let mut streamed = Vec::new();
    loop {
        match handles[1].blocking_next_event() {
            Some(Event::Block { tokens, .. }) => {
                streamed.extend(tokens);
                break;
            }
            Some(Event::Done { .. }) | Some(Event::Error(_)) | None => {
                panic!("request 1 ended before it could be cancelled")
            }
            _ => {}
        }
    }
    handles[1].cancel();
    let mut finished = None;
    while let Some(event) = handles[1].blocking_next_event() {
        match event {
            Event::Block { tokens, .. } => streamed.extend(tokens),
            Event::Done { finish_reason, .. } => finished = Some(finish_reason),
            _ => {}
        }
    }
    assert_eq!(
        finished,
        Some(FinishReason::Cancelled),
        "the cancelled request ends as cancelled ({} of its 320 tokens were out)",
        streamed.len()
    );
    assert!(streamed.len() < 320);
    assert_eq!(
        streamed,
        expected[1].ids[..streamed.len()],
        "what request 1 streamed before the cancel is what it writes alone"
    );
    for i in [0, 2, 3] {
        let (got, _) = finish(&mut handles[i]);
        assert_eq!(
            got, expected[i],
            "request {i} changed when request 1 was cancelled"
        );
    }
    assert_eq!(settled(&engine).cache.pages_held, 0);
}

#[test]
fn preempted_requests_decode_exactly_as_uninterrupted() {
    // Four requests whose canvases take 6 pages each, on a pool of 10: they start together
    // (pages are taken block by block), and the older ones preempt the newer ones as they grow.
    for (name, family) in [("llada2-tiny-v21", "v21"), ("llada2-tiny-v22", "v22")] {
        let requests: Vec<GenerateRequest> = mixed_requests(4, family, 13)
            .into_iter()
            .enumerate()
            .map(|(i, mut r)| {
                r.prompt_ids.truncate(40);
                r.prompt_ids[0] = i as u32;
                r.max_tokens = Some(150);
                r
            })
            .collect();
        let expected = alone(name, &requests);
        let engine = engine(name, 4, Some(10 * TINY_PAGE));
        let got = together(&engine, &requests);
        for (i, ((g, _), e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "{name}: request {i} changed by preemption");
        }
        let stats = settled(&engine);
        assert!(
            stats.preemptions > 0,
            "{name}: the pool should have run out"
        );
        assert_eq!(stats.cache.pages_held, 0);
    }
}

#[test]
fn requests_without_max_tokens_take_pages_as_they_go() {
    // A context of 128 tokens (4 pages); the pool holds 16 full contexts. 64 requests without
    // max_tokens all run at once and all complete, none refused.
    let name = "llada2-tiny-v21";
    let options = EngineOptions {
        parallel: 64,
        max_context: Some(128),
        kv_cache_bytes: Some(16 * 4 * TINY_PAGE),
        ..Default::default()
    };
    let requests: Vec<GenerateRequest> = (0..64u32)
        .map(|i| GenerateRequest {
            prompt_ids: (0..20).map(|k| (i * 31 + k * 7) % 400).collect(),
            max_tokens: None,
            params: DecodeParams {
                temperature: Some(0.0),
                ..Default::default()
            },
            ..Default::default()
        })
        .collect();
    let engine = engine_with(name, options.clone());
    let mut handles: Vec<_> = requests
        .iter()
        .map(|r| engine.submit(r.clone()).expect("none refused"))
        .collect();
    let got: Vec<_> = handles.iter_mut().map(|h| finish(h).0).collect();
    // Some forward held more requests than the pool holds full contexts: each held only the
    // pages it had reached.
    let stats = settled(&engine);
    let over_16 = minnow_engine::BATCH_SIZE_BUCKETS
        .iter()
        .position(|&b| b == 16)
        .unwrap()
        + 1;
    let large: u64 = stats.batch_size_counts[over_16..].iter().sum();
    assert!(
        large > 0,
        "no forward held more than 16 requests: {:?}",
        stats.batch_size_counts
    );
    // A sample decodes as it does alone.
    let alone_engine = engine_with(
        name,
        EngineOptions {
            parallel: 1,
            ..options
        },
    );
    for i in [0, 21, 63] {
        let request = GenerateRequest {
            cache_prompt: Some(false),
            ..requests[i].clone()
        };
        let (expected, _) = finish(&mut alone_engine.submit(request).unwrap());
        assert_eq!(got[i], expected, "request {i} differs from its run alone");
    }
    assert_eq!(settled(&engine).cache.pages_held, 0);
}
