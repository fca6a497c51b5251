//! The CPU forward with the AVX-512 kernels switched off (`MINNOW_CPU_PORTABLE`), i.e. the path
//! every CPU without AVX-512 takes, against the same goldens and tolerances as `golden.rs`. Its
//! own test binary, because the switch is read once per process.

mod common;

use std::sync::Once;

use common::*;
use minnow_model::{CpuRunner, LogitsRows, ModelRunner, SingleSequence};

fn portable() {
    static SET: Once = Once::new();
    // Every test calls this before touching a kernel, so the switch is set before it is read.
    SET.call_once(|| std::env::set_var("MINNOW_CPU_PORTABLE", "1"));
}

#[test]
fn portable_path_is_selected() {
    portable();
    assert!(!minnow_runtime::cpu::uses_avx512());
    let runner = CpuRunner::load(&fixture("llada2-tiny-v21")).unwrap();
    assert!(runner.device_name().contains("portable"));
}

#[test]
fn portable_forward_matches_the_goldens() {
    portable();
    for name in ALL {
        let golden = Golden::load(name);
        let ids = golden.input_ids();
        let reference = golden.f32("logits");
        let mut runner = SingleSequence::new(CpuRunner::load(&fixture(name)).unwrap());
        let vocab = runner.config().vocab_size;

        // One 96-row forward (the many-rows kernels).
        let seq = runner.create_sequence();
        let full = runner.forward(seq, &ids, LogitsRows::All).unwrap();
        assert_close(&format!("{name} portable logits"), &full, &reference, 1e-3);

        // Two committed blocks, then the last block over the cache (the few-rows kernels).
        let seq = runner.create_sequence();
        runner.forward(seq, &ids[..64], LogitsRows::None).unwrap();
        let last = runner.forward(seq, &ids[64..], LogitsRows::All).unwrap();
        assert_close(
            &format!("{name} portable cached block"),
            &last,
            &reference[64 * vocab..],
            1e-3,
        );
    }
}

#[path = "support/batched.rs"]
mod support;

/// The portable kernels are batch-invariant too: a segment's outputs inside a batch are the
/// bits of its own forward.
#[test]
fn portable_batched_segments_are_bit_identical_to_unbatched() {
    portable();
    support::every_segment_gets_its_unbatched_outputs();
}
