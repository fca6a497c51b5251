//! The CPU forward against the fixtures' goldens (official LLaDA2 code, F32 reference):
//! logits, every hidden state, router logits, expert sets, mixing weights and 2.2 block
//! admission. Tolerances are those of tests/fixtures/README.md; observed kernel noise between
//! two correct F32 implementations is ≤ 2e-5.

mod common;

use common::*;
use minnow_model::{CpuRunner, Family, LogitsRows, SegmentOutput, SingleSequence, Trace, Want};

fn run_traced(name: &str) -> (SingleSequence<CpuRunner>, Golden, Vec<f32>, Trace) {
    let mut runner = SingleSequence::new(CpuRunner::load(&fixture(name)).unwrap());
    let golden = Golden::load(name);
    let seq = runner.create_sequence();
    let mut trace = Trace::default();
    let ids = golden.input_ids();
    let logits = runner
        .forward_segment(seq, &ids, Want::Logits(0..ids.len()), |r, segment| {
            r.forward_batch_traced(std::slice::from_ref(segment), &mut trace)
        })
        .unwrap()
        .pop()
        .and_then(SegmentOutput::into_logits)
        .unwrap();
    (runner, golden, logits, trace)
}

fn check_fixture(name: &str, family: Family) {
    let (runner, g, logits, trace) = run_traced(name);
    let c = runner.config().clone();
    assert_eq!(c.family, family, "{name}: family");
    assert_close(&format!("{name} logits"), &logits, &g.f32("logits"), 1e-3);
    assert_close(
        &format!("{name} hidden.embed"),
        &trace.embed,
        &g.f32("hidden.embed"),
        1e-4,
    );
    assert_eq!(trace.layers.len(), c.num_hidden_layers);
    for (i, h) in trace.layers.iter().enumerate() {
        let key = format!("hidden.layer{i}");
        assert_close(&format!("{name} {key}"), h, &g.f32(&key), 1e-4);
    }
    assert_close(
        &format!("{name} hidden.final_norm"),
        &trace.final_norm,
        &g.f32("hidden.final_norm"),
        1e-4,
    );

    let k = c.num_experts_per_tok;
    let moe_layers: Vec<usize> = (c.first_k_dense_replace..c.num_hidden_layers).collect();
    assert_eq!(
        trace.routers.keys().copied().collect::<Vec<_>>(),
        moe_layers
    );
    for (&i, r) in &trace.routers {
        let p = format!("router.layer{i}");
        assert_close(
            &format!("{name} {p}.logits"),
            &r.logits,
            &g.f32(&format!("{p}.logits")),
            1e-4,
        );
        let want_ids = g.i64(&format!("{p}.topk_ids"));
        let want_w = g.f32(&format!("{p}.topk_weights"));
        for t in 0..want_ids.len() / k {
            // Expert sets equal; weights compared per expert id (order within the set is the
            // biased-score order in both, but a set comparison does not depend on it).
            let mut got: Vec<(u32, f32)> = (0..k)
                .map(|j| (r.topk_ids[t * k + j], r.topk_weights[t * k + j]))
                .collect();
            let mut want: Vec<(u32, f32)> = (0..k)
                .map(|j| (want_ids[t * k + j] as u32, want_w[t * k + j]))
                .collect();
            got.sort_by_key(|p| p.0);
            want.sort_by_key(|p| p.0);
            let got_ids: Vec<u32> = got.iter().map(|p| p.0).collect();
            let want_ids_t: Vec<u32> = want.iter().map(|p| p.0).collect();
            assert_eq!(got_ids, want_ids_t, "{name} {p}: experts of token {t}");
            for ((_, a), (_, b)) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "{name} {p}: weight of token {t}: {a} vs {b}"
                );
            }
        }
        let key = format!("{p}.block_admitted");
        if family == Family::V22 {
            let want: Vec<bool> = g.u8(&key).iter().map(|&b| b != 0).collect();
            assert_eq!(
                g.shape(&key),
                vec![want.len() / c.num_experts, c.num_experts]
            );
            assert_eq!(r.block_admitted.as_ref(), Some(&want), "{name} {key}");
        } else {
            assert!(!g.has(&key) && r.block_admitted.is_none());
        }
    }
}

#[test]
fn v20_matches_reference() {
    check_fixture("llada2-tiny-v20", Family::V20);
}

#[test]
fn v21_matches_reference() {
    check_fixture("llada2-tiny-v21", Family::V21);
}

#[test]
fn v22_matches_reference() {
    check_fixture("llada2-tiny-v22", Family::V22);
}

/// Only the requested rows pay for the lm_head, and they are the same values.
#[test]
fn logits_rows_subset_matches_all_rows() {
    let name = "llada2-tiny-v21";
    let mut runner = SingleSequence::new(CpuRunner::load(&fixture(name)).unwrap());
    let g = Golden::load(name);
    let ids = g.input_ids();
    let vocab = runner.config().vocab_size;
    let seq = runner.create_sequence();
    let sub = runner
        .forward(seq, &ids, LogitsRows::Range(64..96))
        .unwrap();
    assert_eq!(sub.len(), 32 * vocab);
    assert_close("rows 64..96", &sub, &g.f32("logits")[64 * vocab..], 1e-3);
    runner.truncate_sequence(seq, 0).unwrap();
    assert!(runner
        .forward(seq, &ids, LogitsRows::None)
        .unwrap()
        .is_empty());
    // Out-of-range and inverted ranges are clamped, never a panic.
    runner.truncate_sequence(seq, 0).unwrap();
    let tail = runner
        .forward(seq, &ids, LogitsRows::Range(90..200))
        .unwrap();
    assert_eq!(tail.len(), 6 * vocab);
    runner.truncate_sequence(seq, 0).unwrap();
    #[allow(clippy::reversed_empty_ranges)]
    let inverted = LogitsRows::Range(50..10);
    assert!(runner.forward(seq, &ids, inverted).unwrap().is_empty());
    assert!(runner.truncate_sequence(seq, 97).is_err());
    assert!(runner
        .forward(minnow_model::SeqId(999), &ids, LogitsRows::None)
        .is_err());
    assert_eq!(runner.sequence_len(seq), 96);
}
