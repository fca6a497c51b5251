//! The device-independent interface every forward implementation offers to the decoder.
//!
//! A runner owns the K/V caches of its sequences. A forward appends the K/V of its input at
//! positions `sequence_len(seq)..` and returns F32 logits for the rows asked for. Nothing is
//! "scratch": to discard a denoising forward the decoder truncates the sequence back to the block
//! start, and to commit a block whose last forward saw exactly its final ids it simply keeps them.
//! This keeps one cache mechanism for prefill, denoising and commit (decoding doc §8).

use std::ops::Range;

/// Handle of one sequence (one request's canvas) inside a runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Which rows of a forward need logits. Prefill and commit-refresh forwards need none, so they
/// never pay for the lm_head; a denoising forward needs every row of its block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogitsRows {
    None,
    All,
    /// Rows relative to the start of the forward's input.
    Range(Range<usize>),
}

impl LogitsRows {
    /// The concrete row range for an input of `n` tokens.
    pub fn resolve(&self, n: usize) -> Range<usize> {
        match self {
            LogitsRows::None => 0..0,
            LogitsRows::All => 0..n,
            LogitsRows::Range(r) => r.start.min(n)..r.end.min(n),
        }
    }
}

/// A LLaDA2 forward implementation (CPU reference or CUDA) with the caches it owns.
pub trait ModelRunner: Send {
    /// The parsed checkpoint configuration.
    fn config(&self) -> &crate::config::Config;
    /// A short human-readable description of the device, e.g. "cpu (2 threads, f32)".
    fn device_name(&self) -> String;
    /// Starts an empty sequence (no cached positions).
    fn create_sequence(&mut self) -> crate::Result<SeqId>;
    /// Frees everything the sequence holds. Unknown ids are ignored.
    fn release_sequence(&mut self, seq: SeqId);
    /// Number of positions whose K/V are cached.
    fn sequence_len(&self, seq: SeqId) -> usize;
    /// Drops cached positions `len..`. `len` greater than the current length is an error.
    fn truncate_sequence(&mut self, seq: SeqId, len: usize) -> crate::Result<()>;
    /// Runs `ids` at absolute positions `sequence_len(seq)..`, attending block-causally to the
    /// cached prefix and to themselves, appends their K/V to the cache, and returns row-major F32
    /// logits `[rows.len(), vocab]` for the requested rows. With 2.2 block routing the start
    /// position must be a multiple of the block size.
    fn forward(&mut self, seq: SeqId, ids: &[u32], rows: LogitsRows) -> crate::Result<Vec<f32>>;

    /// Like [`ModelRunner::forward`], but returns for each requested row only its argmax token
    /// (lowest id on ties) and that token's softmax probability: all a greedy (temperature 0)
    /// denoising step needs. The default derives them from `forward`'s logits; the CUDA runner
    /// computes them on the GPU and reads back only these pairs instead of `rows × vocab` floats.
    fn forward_top1(
        &mut self,
        seq: SeqId,
        ids: &[u32],
        rows: LogitsRows,
    ) -> crate::Result<Vec<(u32, f32)>> {
        let vocab = self.config().vocab_size;
        let logits = self.forward(seq, ids, rows)?;
        Ok(logits.chunks_exact(vocab).map(top1).collect())
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
