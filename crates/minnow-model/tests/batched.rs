//! The batched forward: several sequences of different lengths and starts in one forward give
//! each sequence the outputs of its own unbatched forward, bit for bit, on every fixture family
//! (the CPU forward is batch-invariant by construction: `minnow_runtime::cpu::linear`).

mod common;

use common::*;
use minnow_model::{CpuRunner, LogitsRows, ModelRunner, Segment, SingleSequence, Want};

#[path = "support/batched.rs"]
mod support;

#[test]
fn every_segment_gets_its_unbatched_outputs() {
    support::every_segment_gets_its_unbatched_outputs();
}

/// A bad segment fails the whole batch before any compute, naming the segment.
#[test]
fn a_bad_segment_is_named() {
    let mut r = CpuRunner::load(&fixture("llada2-tiny-v22")).unwrap();
    let ids = vec![1u32; 32];
    let err = r
        .forward_batch(&[
            Segment {
                pages: &[0],
                start: 0,
                ids: &ids,
                want: Want::Nothing,
            },
            Segment {
                pages: &[1],
                start: 0,
                ids: &[1, 2, 9999],
                want: Want::Nothing,
            },
        ])
        .unwrap_err()
        .to_string();
    assert!(err.contains("segment 1") && err.contains("9999"), "{err}");
}

/// Quantized experts too: a `.mnw` of every fixture with its experts in INT8 (fragment
/// layout), INT4 (row-major), NVFP4 and FP8 gives each segment of a batch its unbatched
/// outputs bit for bit (the quantized products decode weight rows the same way for any number
/// of input rows).
#[test]
fn quantized_experts_keep_segments_bit_identical() {
    use minnow_format::mnw::convert::{ExpertChoice, QuantLayout};
    let dir = tempfile::tempdir().unwrap();
    for (experts, layout) in [
        (ExpertChoice::Int8, QuantLayout::Mma),
        (ExpertChoice::Int4, QuantLayout::Row),
        (ExpertChoice::Nvfp4, QuantLayout::Mma),
        (ExpertChoice::Fp8, QuantLayout::Row),
    ] {
        for name in ALL {
            let path = dir.path().join(format!("{name}-{experts:?}.mnw"));
            write_fixture_mnw(name, &path, &quantized_options(experts, layout));
            support::segments_get_their_unbatched_outputs(name, &path);
        }
    }
}

/// What the engine's merged commit relies on: a final block's refresh and the next block's first
/// step in one forward (the final ids, then the next block, the next block's rows wanted) give
/// the next block's logits of a refresh forward followed by a step, bit for bit, and leave the
/// same K/V behind (a further block's logits are the same too), on every fixture family.
#[test]
fn a_refresh_in_the_next_blocks_forward_gives_the_bits_of_two_forwards() {
    for name in ALL {
        let mut r = SingleSequence::new(CpuRunner::load(&fixture(name)).unwrap());
        let vocab = r.config().vocab_size as u32;
        let ids: Vec<u32> = (0..160u32).map(|i| (i * 37 + 5) % vocab).collect();
        let (prompt, done, next, later) = (&ids[..64], &ids[64..96], &ids[96..128], &ids[128..]);

        let two = r.create_sequence();
        r.forward(two, prompt, LogitsRows::None).unwrap();
        r.forward(two, done, LogitsRows::None).unwrap();
        let step = r.forward(two, next, LogitsRows::All).unwrap();
        let after = r.forward(two, later, LogitsRows::All).unwrap();

        let one = r.create_sequence();
        r.forward(one, prompt, LogitsRows::None).unwrap();
        let both: Vec<u32> = [done, next].concat();
        let merged_step = r.forward(one, &both, LogitsRows::Range(32..64)).unwrap();
        let merged_after = r.forward(one, later, LogitsRows::All).unwrap();

        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(step.len(), 32 * vocab as usize, "{name}");
        assert!(
            bits(&step) == bits(&merged_step),
            "{name}: the step's logits differ"
        );
        assert!(
            bits(&after) == bits(&merged_after),
            "{name}: the K/V left behind differ"
        );
    }
}
