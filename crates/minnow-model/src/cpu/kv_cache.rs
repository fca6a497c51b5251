//! Per-sequence K/V cache: for every layer and KV head, K (after QK-norm and RoPE) and V of each
//! cached position as a contiguous `[position, head_dim]` run, so attention reads one head's keys
//! as a plain matrix, a forward appends by extending and a truncation is a `Vec::truncate`.

/// One layer's cache: `(K, V)`, each one `[len · head_dim]` vector per KV head.
pub(crate) type LayerKv = (Vec<Vec<f32>>, Vec<Vec<f32>>);

#[derive(Debug, Default)]
pub struct KvCache {
    /// `layers[i].0[g]` / `layers[i].1[g]`: K / V of layer `i`, KV head `g`.
    pub(crate) layers: Vec<LayerKv>,
    head_dim: usize,
    len: usize,
}

impl KvCache {
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        let heads = || (0..kv_heads).map(|_| Vec::new()).collect::<Vec<_>>();
        KvCache {
            layers: (0..layers).map(|_| (heads(), heads())).collect(),
            head_dim,
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
            for head in k.iter_mut().chain(v.iter_mut()) {
                head.truncate(len * self.head_dim);
            }
        }
        self.len = len;
    }

    /// Records that a forward appended `n` positions to every layer and head.
    pub(crate) fn commit_appended(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.layers.iter().all(|(k, v)| k
            .iter()
            .chain(v)
            .all(|h| h.len() == self.len * self.head_dim)));
    }

    /// Layer `i`'s cached K and V, one `[len, head_dim]` matrix per KV head.
    pub fn layer(&self, i: usize) -> (&[Vec<f32>], &[Vec<f32>]) {
        let (k, v) = &self.layers[i];
        (k, v)
    }

    /// Bytes held (capacity, not only length).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|(k, v)| k.iter().chain(v))
            .map(|h| h.capacity() * 4)
            .sum()
    }
}
