//! The GPU's paged K/V pool.

use half::bf16;
use minnow_runtime::cuda::{CudaResult, DeviceBuffer, Gpu};

use crate::config::Config;

/// The GPU's K/V pool: `pages` pages of `block_size` positions each, allocated once. One BF16
/// allocation laid out `[layer][K | V][page][position in page][KV head][head_dim]`, so each
/// layer's K (and V) is one `[pages * block_size, G, d]` array that the kernels index by
/// `page * block_size + offset`, and a page id names the same positions in every layer.
pub(crate) struct KvPool {
    buf: DeviceBuffer<bf16>,
    pages: usize,
    /// Elements of one layer's K (or V).
    half: usize,
}

impl KvPool {
    /// Bytes of one page: every layer's K and V of `block_size` positions.
    pub fn page_bytes(c: &Config) -> usize {
        c.num_hidden_layers * 2 * c.block_size * c.num_key_value_heads * c.head_dim * 2
    }

    pub fn new(gpu: &Gpu, c: &Config, pages: usize) -> CudaResult<Self> {
        let half = pages * c.block_size * c.num_key_value_heads * c.head_dim;
        Ok(Self {
            buf: gpu.alloc(2 * c.num_hidden_layers * half)?,
            pages,
            half,
        })
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn bytes(&self) -> usize {
        self.buf.bytes()
    }

    /// Layer `l`'s K rows `[pages * block_size, G, d]`.
    pub fn k(&self, l: usize) -> u64 {
        self.buf.ptr_at(2 * l * self.half)
    }

    /// Layer `l`'s V rows.
    pub fn v(&self, l: usize) -> u64 {
        self.buf.ptr_at((2 * l + 1) * self.half)
    }
}
