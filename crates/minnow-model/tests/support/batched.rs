//! The batched-equals-unbatched check, shared by `batched.rs` (the host's SIMD kernels) and
//! `portable_cpu.rs` (the portable kernels).

use crate::common::*;
use minnow_model::runner::top_k_of_rows;
use minnow_model::{
    CpuRunner, LogitsRows, ModelRunner, PageId, Segment, SegmentOutput, SingleSequence, Want,
};

/// One sequence of the test: its cached prefix, then the forward under test.
struct Case {
    prefix: usize,
    len: usize,
    want: Want,
}

fn cases() -> Vec<Case> {
    vec![
        // A denoising-sized block over a 64-token prefix.
        Case {
            prefix: 64,
            len: 32,
            want: Want::Logits(0..32),
        },
        // A prefill-sized forward from position 0, every row.
        Case {
            prefix: 0,
            len: 96,
            want: Want::Logits(0..96),
        },
        // A partial last block over one cached block, some rows only.
        Case {
            prefix: 32,
            len: 40,
            want: Want::Logits(5..40),
        },
        // Top-1 pairs of a block.
        Case {
            prefix: 32,
            len: 32,
            want: Want::Top1(0..32),
        },
        // K/V only.
        Case {
            prefix: 0,
            len: 64,
            want: Want::Nothing,
        },
        // The best ids of some rows of a block (their full rows read after the forward).
        Case {
            prefix: 32,
            len: 32,
            want: Want::TopK(3..30),
        },
    ]
}

/// Ids of case `i`: the golden ids, shifted per case so that sequences differ.
fn ids_of(golden: &[u32], i: usize, vocab: u32) -> Vec<u32> {
    let base: Vec<u32> = golden
        .iter()
        .map(|&t| (t + 11 * i as u32) % vocab)
        .collect();
    base.repeat(2)
}

fn rows_of(want: &Want) -> LogitsRows {
    match want {
        Want::Nothing => LogitsRows::None,
        Want::Logits(r) | Want::Top1(r) | Want::TopK(r) => LogitsRows::Range(r.clone()),
    }
}

/// Runs the check on every fixture with whichever CPU kernels this process selected.
pub fn every_segment_gets_its_unbatched_outputs() {
    for name in ALL {
        segments_get_their_unbatched_outputs(name, &fixture(name));
    }
}

/// The check on the checkpoint at `path` (fixture `name`, or a conversion of it: the golden
/// ids of `name` are the inputs).
pub fn segments_get_their_unbatched_outputs(name: &str, path: &std::path::Path) {
    {
        let golden = Golden::load(name).input_ids();
        let mut alone = SingleSequence::new(CpuRunner::load(path).unwrap());
        let mut batched = CpuRunner::load(path).unwrap();
        let vocab = alone.config().vocab_size as u32;
        let cases = cases();
        let ids: Vec<Vec<u32>> = (0..cases.len())
            .map(|i| ids_of(&golden, i, vocab))
            .collect();

        // Unbatched: each sequence on its own.
        let mut expected = Vec::new();
        // The full logits of each `Want::TopK` case.
        let mut full_rows = Vec::new();
        for (case, ids) in cases.iter().zip(&ids) {
            let seq = alone.create_sequence();
            if case.prefix > 0 {
                alone
                    .forward(seq, &ids[..case.prefix], LogitsRows::None)
                    .unwrap();
            }
            let input = &ids[case.prefix..case.prefix + case.len];
            expected.push(match &case.want {
                Want::Top1(_) => SegmentOutput::Top1(
                    alone.forward_top1(seq, input, rows_of(&case.want)).unwrap(),
                ),
                Want::Nothing => {
                    alone.forward(seq, input, LogitsRows::None).unwrap();
                    SegmentOutput::Nothing
                }
                Want::Logits(_) => {
                    SegmentOutput::Logits(alone.forward(seq, input, rows_of(&case.want)).unwrap())
                }
                Want::TopK(_) => {
                    let logits = alone.forward(seq, input, rows_of(&case.want)).unwrap();
                    let top = top_k_of_rows(&logits, vocab as usize);
                    full_rows.push(logits);
                    SegmentOutput::TopK(top)
                }
            });
        }

        // Batched: pages handed out by hand (in a scrambled order, so no sequence's pages are
        // contiguous), every prefix in one forward, then every forward under test in another.
        let mut next: PageId = 40;
        let tables: Vec<Vec<PageId>> = cases
            .iter()
            .map(|c| {
                (0..(c.prefix + c.len).div_ceil(32))
                    .map(|_| {
                        next = (next + 7) % 64;
                        next
                    })
                    .collect()
            })
            .collect();
        let prefixes: Vec<Segment<'_>> = cases
            .iter()
            .zip(&ids)
            .zip(&tables)
            .filter(|((c, _), _)| c.prefix > 0)
            .map(|((c, ids), pages)| Segment {
                pages,
                start: 0,
                ids: &ids[..c.prefix],
                want: Want::Nothing,
            })
            .collect();
        batched.forward_batch(&prefixes).unwrap();
        let segments: Vec<Segment<'_>> = cases
            .iter()
            .zip(&ids)
            .zip(&tables)
            .map(|((c, ids), pages)| Segment {
                pages,
                start: c.prefix,
                ids: &ids[c.prefix..c.prefix + c.len],
                want: c.want.clone(),
            })
            .collect();
        let got = batched.forward_batch(&segments).unwrap();
        // The full rows of the `Want::TopK` segments are those of the forward alone.
        let mut full_rows = full_rows.into_iter();
        for (i, case) in cases.iter().enumerate() {
            if let Want::TopK(rows) = &case.want {
                let full = full_rows.next().unwrap();
                let v = vocab as usize;
                for (j, r) in rows.clone().enumerate() {
                    let row = batched.logits_row(i, r).unwrap();
                    assert_bit_identical(
                        &format!("{name} row {r}"),
                        &row,
                        &full[j * v..(j + 1) * v],
                    );
                }
                assert!(
                    batched.logits_row(i, rows.end).is_err(),
                    "a row not asked for"
                );
            } else {
                assert!(
                    batched.logits_row(i, 0).is_err(),
                    "segment {i} kept no rows"
                );
            }
        }

        assert_eq!(got.len(), expected.len());
        for (i, (g, e)) in got.into_iter().zip(expected).enumerate() {
            let what = format!("{name} segment {i}");
            match (g, e) {
                (SegmentOutput::Logits(g), SegmentOutput::Logits(e)) => {
                    assert_bit_identical(&what, &g, &e)
                }
                (SegmentOutput::Top1(g), SegmentOutput::Top1(e)) => {
                    assert_eq!(g.len(), e.len(), "{what}");
                    for (a, b) in g.iter().zip(&e) {
                        assert_eq!(a.0, b.0, "{what}: top-1 token");
                        assert_eq!(a.1.to_bits(), b.1.to_bits(), "{what}: {a:?} vs {b:?}");
                    }
                }
                (SegmentOutput::TopK(g), SegmentOutput::TopK(e)) => assert_eq!(g, e, "{what}"),
                (SegmentOutput::Nothing, SegmentOutput::Nothing) => {}
                (g, e) => panic!("{what}: got {g:?}, expected {e:?}"),
            }
        }
    }
}
