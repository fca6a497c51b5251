//! The CPU's K/V pool: a fixed number of pages allocated once at load, each holding one block
//! (`P` = block size positions) of K (after QK-norm and RoPE) and V for every layer and KV head.
//!
//! Within a page, one (layer, K or V, KV head) is a contiguous `[P, head_dim]` run, so attention
//! gathers a head's keys page by page with one copy per page. The pool is zeroed lazily by the
//! allocator (a calloc), so an untouched page costs no resident memory.

use crate::batch::PageId;
use crate::config::Config;

pub struct KvPool {
    data: Vec<f32>,
    pages: usize,
    layers: usize,
    kv_heads: usize,
    page_size: usize,
    head_dim: usize,
}

/// Which half of a layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Half {
    K = 0,
    V = 1,
}

impl KvPool {
    /// A pool of `pages` pages shaped for `config`.
    pub fn new(config: &Config, pages: usize) -> KvPool {
        let mut pool = KvPool {
            data: Vec::new(),
            pages,
            layers: config.num_hidden_layers,
            kv_heads: config.num_key_value_heads,
            page_size: config.block_size,
            head_dim: config.head_dim,
        };
        pool.data = vec![0.0; pages * pool.page_floats()];
        pool
    }

    /// F32 values of one page.
    fn page_floats(&self) -> usize {
        self.layers * 2 * self.kv_heads * self.run_floats()
    }

    fn run_floats(&self) -> usize {
        self.page_size * self.head_dim
    }

    /// Bytes of one page.
    pub fn page_bytes(config: &Config) -> usize {
        config.num_hidden_layers
            * 2
            * config.num_key_value_heads
            * config.block_size
            * config.head_dim
            * std::mem::size_of::<f32>()
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    fn run_offset(&self, page: PageId, layer: usize, half: Half, head: usize) -> usize {
        (((page as usize * self.layers + layer) * 2 + half as usize) * self.kv_heads + head)
            * self.run_floats()
    }

    /// Stores one position's K or V row of `head` in `layer`.
    pub(crate) fn write(
        &mut self,
        pages: &[PageId],
        pos: usize,
        layer: usize,
        half: Half,
        head: usize,
        row: &[f32],
    ) {
        let d = self.head_dim;
        let at = self.run_offset(pages[pos / self.page_size], layer, half, head)
            + (pos % self.page_size) * d;
        self.data[at..at + d].copy_from_slice(row);
    }

    /// Positions `0..len` of `head`'s K or V in `layer`, as one `[len, head_dim]` matrix.
    pub(crate) fn gather(
        &self,
        pages: &[PageId],
        len: usize,
        layer: usize,
        half: Half,
        head: usize,
    ) -> Vec<f32> {
        let d = self.head_dim;
        let mut out = Vec::with_capacity(len * d);
        let mut pos = 0;
        for &page in pages {
            if pos >= len {
                break;
            }
            let take = (len - pos).min(self.page_size);
            let at = self.run_offset(page, layer, half, head);
            out.extend_from_slice(&self.data[at..at + take * d]);
            pos += take;
        }
        debug_assert_eq!(out.len(), len * d, "block table shorter than the keys");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_land_in_their_page_and_gather_in_position_order() {
        let text = include_str!("../../../../tests/fixtures/llada2-tiny-v21/config.json");
        let c = Config::from_json_str(text, std::path::Path::new("config.json")).unwrap();
        let d = c.head_dim;
        let mut pool = KvPool::new(&c, 4);
        // A sequence on pages 3 then 1; positions 0..40 crosses the page boundary at 32.
        let table = [3, 1];
        for pos in 0..40 {
            let row = vec![pos as f32; d];
            pool.write(&table, pos, 1, Half::V, 1, &row);
        }
        let got = pool.gather(&table, 40, 1, Half::V, 1);
        for pos in 0..40 {
            assert!(got[pos * d..(pos + 1) * d].iter().all(|&v| v == pos as f32));
        }
        // Nothing leaked into another layer, half or head.
        assert!(pool
            .gather(&table, 40, 0, Half::V, 1)
            .iter()
            .all(|&v| v == 0.0));
        assert!(pool
            .gather(&table, 40, 1, Half::K, 1)
            .iter()
            .all(|&v| v == 0.0));
        assert!(pool
            .gather(&table, 40, 1, Half::V, 0)
            .iter()
            .all(|&v| v == 0.0));
    }
}
