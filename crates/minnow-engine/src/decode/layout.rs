//! Request layout (decoding doc §1): which prompt blocks are prefilled, which blocks are decoded,
//! and where the answer lies on the canvas.

/// Why a request cannot be laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    EmptyPrompt,
    /// `ceil((P + N) / B) · B` exceeds the context.
    ContextExceeded {
        needed: usize,
        n_ctx: usize,
    },
}

/// The block geometry of one request. All positions are absolute canvas positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Block size `B`.
    pub block: usize,
    /// Prompt length `P`.
    pub prompt_len: usize,
    /// New tokens at most, `N`.
    pub max_new: usize,
    /// `floor(P / B) · B`: the complete prompt blocks, prefilled and committed at once.
    pub prefill_len: usize,
    /// `ceil((P + N) / B) · B`: end of the last decoded block.
    pub total_len: usize,
}

impl Layout {
    /// Lays out `prompt_len` prompt tokens plus `max_new` new ones in blocks of `block`.
    /// `max_new == 0` is valid (an empty completion that decodes no block).
    pub fn new(
        prompt_len: usize,
        max_new: usize,
        block: usize,
        n_ctx: usize,
    ) -> Result<Layout, LayoutError> {
        if prompt_len == 0 {
            return Err(LayoutError::EmptyPrompt);
        }
        let prefill_len = prompt_len / block * block;
        let total_len = if max_new == 0 {
            prefill_len
        } else {
            (prompt_len + max_new).div_ceil(block) * block
        };
        if total_len > n_ctx || prompt_len > n_ctx {
            return Err(LayoutError::ContextExceeded {
                needed: total_len.max(prompt_len),
                n_ctx,
            });
        }
        Ok(Layout {
            block,
            prompt_len,
            max_new,
            prefill_len,
            total_len,
        })
    }

    /// Number of blocks to decode.
    pub fn decode_blocks(&self) -> usize {
        (self.total_len - self.prefill_len) / self.block
    }

    /// Absolute start of the `i`-th decoded block (`i` from 0).
    pub fn block_start(&self, i: usize) -> usize {
        self.prefill_len + i * self.block
    }

    /// Canvas index of block `i` as the model sees it (`start / B`).
    pub fn block_index(&self, i: usize) -> usize {
        self.block_start(i) / self.block
    }

    /// Prompt tokens at the head of decoded block `i`, tracked by count (§1): only the first
    /// decoded block can hold any.
    pub fn prompt_in_block(&self, i: usize) -> usize {
        self.prompt_len
            .saturating_sub(self.block_start(i))
            .min(self.block)
    }

    /// The slots of decoded block `i` that belong to the answer `canvas[P .. P+N)`, relative to
    /// the block start. Tokens past `P + N` are decoded but discarded.
    pub fn output_slots(&self, i: usize) -> std::ops::Range<usize> {
        let start = self.block_start(i);
        let lo = self.prompt_len.max(start) - start;
        let hi = (self.prompt_len + self.max_new).min(start + self.block);
        lo..hi.saturating_sub(start).max(lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_fixture_layout() {
        // 40-token prompt, 64 new tokens, B = 32 (fixtures README).
        let l = Layout::new(40, 64, 32, 512).unwrap();
        assert_eq!((l.prefill_len, l.total_len), (32, 128));
        assert_eq!(l.decode_blocks(), 3);
        assert_eq!(l.block_index(0), 1);
        assert_eq!(l.prompt_in_block(0), 8);
        assert_eq!(l.prompt_in_block(1), 0);
        assert_eq!(l.output_slots(0), 8..32);
        assert_eq!(l.output_slots(1), 0..32);
        // P + N = 104: the last block keeps 8 of its 32 slots.
        assert_eq!(l.output_slots(2), 0..8);
    }

    #[test]
    fn aligned_prompt_starts_with_an_all_mask_block() {
        let l = Layout::new(64, 1, 32, 512).unwrap();
        assert_eq!((l.prefill_len, l.total_len, l.decode_blocks()), (64, 96, 1));
        assert_eq!(l.prompt_in_block(0), 0);
        assert_eq!(l.output_slots(0), 0..1);
    }

    #[test]
    fn context_and_empty_prompt_are_checked() {
        assert_eq!(Layout::new(0, 4, 32, 512), Err(LayoutError::EmptyPrompt));
        assert_eq!(
            Layout::new(500, 20, 32, 512),
            Err(LayoutError::ContextExceeded {
                needed: 544,
                n_ctx: 512
            })
        );
        assert!(Layout::new(500, 12, 32, 512).is_ok());
    }

    #[test]
    fn zero_new_tokens_decode_nothing() {
        let l = Layout::new(40, 0, 32, 512).unwrap();
        assert_eq!(l.decode_blocks(), 0);
    }
}
