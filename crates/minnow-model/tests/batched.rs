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
