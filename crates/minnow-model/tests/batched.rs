//! The batched forward: several sequences of different lengths and starts in one forward give
//! each sequence the outputs of its own unbatched forward, bit for bit, on every fixture family
//! (the CPU forward is batch-invariant by construction: `minnow_runtime::cpu::linear`).

mod common;

use common::*;
use minnow_model::{CpuRunner, ModelRunner, Segment, Want};

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
