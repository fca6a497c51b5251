//! Per-sequence K/V cache: for every layer, K (after QK-norm and RoPE) and V of each cached
//! position, laid out `[position, kv_head, head_dim]` so a forward appends by extending and a
//! truncation is a `Vec::truncate`.

#[derive(Debug, Default)]
pub struct KvCache {
    /// One `(k, v)` pair per layer.
    pub(crate) layers: Vec<(Vec<f32>, Vec<f32>)>,
    /// Values per position in one layer's K (= `G · d`).
    pub(crate) row: usize,
    len: usize,
}

impl KvCache {
    pub fn new(layers: usize, row: usize) -> Self {
        KvCache {
            layers: (0..layers).map(|_| (Vec::new(), Vec::new())).collect(),
            row,
            len: 0,
        }
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps positions `0..len` (`len <= self.len()`).
    pub fn truncate(&mut self, len: usize) {
        debug_assert!(len <= self.len);
        for (k, v) in &mut self.layers {
            k.truncate(len * self.row);
            v.truncate(len * self.row);
        }
        self.len = len;
    }

    /// Records that a forward appended `n` positions to every layer.
    pub(crate) fn commit_appended(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self
            .layers
            .iter()
            .all(|(k, v)| k.len() == self.len * self.row && v.len() == self.len * self.row));
    }

    /// Layer `i`'s cached K and V, `[len, kv_heads · head_dim]` each.
    pub fn layer(&self, i: usize) -> (&[f32], &[f32]) {
        let (k, v) = &self.layers[i];
        (k, v)
    }

    /// Bytes held (capacity, not only length).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| (k.capacity() + v.capacity()) * 4)
            .sum()
    }
}
