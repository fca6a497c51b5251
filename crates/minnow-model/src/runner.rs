//! The device-independent interface every forward implementation offers to the engine.
//!
//! A runner owns the weights and a K/V pool of fixed-size pages (one page per block), and runs
//! whatever batch it is given ([`ModelRunner::forward_batch`]): who owns which page is decided by
//! the caller (the engine's page pool, or [`crate::SingleSequence`] for programs that drive one
//! sequence at a time).

use crate::batch::{Segment, SegmentOutput};
use crate::error::Result;

/// A LLaDA2 forward implementation (CPU reference or CUDA) with the K/V pool it owns.
pub trait ModelRunner: Send {
    /// The parsed checkpoint configuration.
    fn config(&self) -> &crate::config::Config;
    /// A short human-readable description of the device, e.g. "cpu (2 threads, f32)".
    fn device_name(&self) -> String;
    /// Pages in the K/V pool (page size = the checkpoint's block size).
    fn kv_pages(&self) -> usize;
    /// Bytes of one page in the pool's storage type.
    fn kv_page_bytes(&self) -> usize;
    /// Runs every segment of the batch in one forward (validated by [`crate::batch::validate`]
    /// first): the weights are read once for all rows; positions, attention and 2.2 block
    /// routing stay per segment. Returns one output per segment, in order.
    fn forward_batch(&mut self, segments: &[Segment<'_>]) -> Result<Vec<SegmentOutput>>;
}

/// A boxed runner (what the engine's device selection returns) is a runner.
impl<R: ModelRunner + ?Sized> ModelRunner for Box<R> {
    fn config(&self) -> &crate::config::Config {
        (**self).config()
    }
    fn device_name(&self) -> String {
        (**self).device_name()
    }
    fn kv_pages(&self) -> usize {
        (**self).kv_pages()
    }
    fn kv_page_bytes(&self) -> usize {
        (**self).kv_page_bytes()
    }
    fn forward_batch(&mut self, segments: &[Segment<'_>]) -> Result<Vec<SegmentOutput>> {
        (**self).forward_batch(segments)
    }
}

/// Argmax (lowest index on ties) of a logits row and its softmax probability
/// `1 / sum_j exp(x_j - max)`, in F32 like the reference's softmax.
pub fn top1(row: &[f32]) -> (u32, f32) {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    let max = row[best];
    let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
    (best as u32, 1.0 / sum)
}

#[cfg(test)]
mod top1_tests {
    use super::top1;

    #[test]
    fn top1_takes_the_lowest_index_on_ties_and_the_softmax_probability() {
        let (tok, p) = top1(&[1.0, 3.0, 3.0, -2.0]);
        assert_eq!(tok, 1);
        let z = (1.0f32 - 3.0).exp() + 2.0 + (-5.0f32).exp();
        assert!((p - 1.0 / z).abs() < 1e-7);
        assert_eq!(top1(&[0.5]), (0, 1.0));
    }
}
