//! The CPU forward pass: the numerical reference of minnow. F32 arithmetic throughout, from
//! weights kept in their stored type (model doc §7 with every BF16 rounding replaced by F32,
//! i.e. the fixtures' "F32 reference": BF16 weights upcast, whole model in F32).

mod attention;
mod ffn;
mod kv_cache;
mod profile;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use minnow_format::TensorSource;
use minnow_runtime::cpu::{linear, rms_norm_rows, Par};

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::runner::{LogitsRows, ModelRunner, SeqId};
use crate::trace::{RouterTrace, Trace};
use crate::weights::{FeedForward, Weights};

pub use kv_cache::KvCache;

/// A loaded model: config plus validated weights. Stateless; caches live in [`KvCache`].
pub struct CpuModel {
    config: Config,
    weights: Weights,
}

impl CpuModel {
    /// Loads `dir` (config.json plus safetensors, single or sharded) after validating every
    /// tensor.
    pub fn load(dir: &Path) -> Result<CpuModel> {
        let (config, source) = crate::checkpoint::open(dir)?;
        CpuModel::from_source(config, Arc::new(source))
    }

    /// Builds a model from any tensor source (safetensors today, `.mnw` later).
    pub fn from_source(config: Config, source: Arc<dyn TensorSource>) -> Result<CpuModel> {
        let weights = Weights::load(&config, source)?;
        Ok(CpuModel { config, weights })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// An empty cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        let c = &self.config;
        KvCache::new(c.num_hidden_layers, c.num_key_value_heads, c.head_dim)
    }

    /// Runs `ids` at positions `cache.len()..`, appends their K/V to `cache` and returns F32
    /// logits `[rows, vocab]` for the requested rows. With `trace`, records every intermediate
    /// (and computes the final norm of every row).
    pub fn forward(
        &self,
        cache: &mut KvCache,
        ids: &[u32],
        rows: LogitsRows,
        mut trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let w = &self.weights;
        let (n, dm) = (ids.len(), c.hidden_size);
        let start = cache.len();
        self.check_input(start, ids)?;
        let rows = rows.resolve(n);
        // An inverted range asks for no rows (rather than slicing out of order).
        let rows = rows.start.min(rows.end)..rows.end;
        if n == 0 {
            return Ok(Vec::new());
        }

        // Embedding: widen the looked-up rows.
        let embed = w.embed.view();
        let mut h = vec![0.0f32; n * dm];
        for (row, &id) in h.chunks_exact_mut(dm).zip(ids) {
            embed.widen_row(id as usize, row);
        }
        if let Some(t) = trace.as_deref_mut() {
            t.embed = h.clone();
        }

        let mut profile = profile::StageTimes::start(n, start);
        let rope = attention::RopeTable::new(c, start, n);
        for (i, layer) in w.layers.iter().enumerate() {
            let mut a = h.clone();
            rms_norm_rows(&mut a, &layer.input_norm, c.rms_norm_eps);
            let (k_cache, v_cache) = &mut cache.layers[i];
            let o =
                attention::attention(c, &layer.attention, &a, n, start, &rope, k_cache, v_cache);
            add_in_place(&mut h, &o);
            profile.lap("attention");

            let mut m = h.clone();
            rms_norm_rows(&mut m, &layer.post_attention_norm, c.rms_norm_eps);
            let f = match &layer.ffn {
                FeedForward::Dense(mlp) => ffn::mlp(mlp, &m, n, Par::Rayon),
                FeedForward::Moe(moe) => {
                    let mut rt = trace.as_ref().map(|_| RouterTrace::default());
                    let out = ffn::moe(c, moe, &m, n, rt.as_mut());
                    if let (Some(t), Some(rt)) = (trace.as_deref_mut(), rt) {
                        t.routers.insert(i, rt);
                    }
                    out
                }
            };
            add_in_place(&mut h, &f);
            profile.lap(if c.is_dense_layer(i) { "mlp" } else { "moe" });
            if let Some(t) = trace.as_deref_mut() {
                t.layers.push(h.clone());
            }
        }
        cache.commit_appended(n);

        // Final norm and lm_head only for the rows that need logits (all rows when tracing).
        let norm_rows = if trace.is_some() { 0..n } else { rows.clone() };
        let mut hf = h[norm_rows.start * dm..norm_rows.end * dm].to_vec();
        rms_norm_rows(&mut hf, &w.final_norm, c.rms_norm_eps);
        if let Some(t) = trace {
            t.final_norm = hf.clone();
        }
        let hf = &hf[(rows.start - norm_rows.start) * dm..(rows.end - norm_rows.start) * dm];
        let mut logits = vec![0.0f32; rows.len() * c.vocab_size];
        linear(hf, rows.len(), w.lm_head.view(), &mut logits, Par::Rayon);
        profile.lap("lm_head");
        profile.finish();
        Ok(logits)
    }

    fn check_input(&self, start: usize, ids: &[u32]) -> Result<()> {
        let c = &self.config;
        if let Some((i, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= c.vocab_size)
        {
            return Err(ModelError::InvalidInput(format!(
                "token id {id} at input index {i} is outside the vocabulary (size {})",
                c.vocab_size
            )));
        }
        if c.block_routing() && !start.is_multiple_of(c.block_size) && !ids.is_empty() {
            return Err(ModelError::InvalidInput(format!(
                "a forward must start at a multiple of the block size {} with 2.2 block routing (start {start})",
                c.block_size
            )));
        }
        if start + ids.len() > c.max_position_embeddings {
            return Err(ModelError::InvalidInput(format!(
                "positions up to {} exceed max_position_embeddings = {}",
                start + ids.len() - 1,
                c.max_position_embeddings
            )));
        }
        Ok(())
    }
}

fn add_in_place(h: &mut [f32], x: &[f32]) {
    for (a, b) in h.iter_mut().zip(x) {
        *a += b;
    }
}

/// [`ModelRunner`] on the CPU: one model, many sequences each with its own [`KvCache`].
pub struct CpuRunner {
    model: Arc<CpuModel>,
    sequences: HashMap<SeqId, KvCache>,
    next_id: u64,
}

impl CpuRunner {
    /// Loads a checkpoint directory; see [`CpuModel::load`].
    pub fn load(dir: &Path) -> Result<CpuRunner> {
        Ok(CpuRunner::new(Arc::new(CpuModel::load(dir)?)))
    }

    pub fn new(model: Arc<CpuModel>) -> CpuRunner {
        CpuRunner {
            model,
            sequences: HashMap::new(),
            next_id: 0,
        }
    }

    pub fn model(&self) -> &Arc<CpuModel> {
        &self.model
    }

    /// [`ModelRunner::forward`] that also records the intermediates into `trace`.
    pub fn forward_traced(
        &mut self,
        seq: SeqId,
        ids: &[u32],
        rows: LogitsRows,
        trace: &mut Trace,
    ) -> Result<Vec<f32>> {
        let cache = self
            .sequences
            .get_mut(&seq)
            .ok_or_else(|| unknown_sequence(seq))?;
        self.model.forward(cache, ids, rows, Some(trace))
    }
}

fn unknown_sequence(seq: SeqId) -> ModelError {
    ModelError::InvalidInput(format!("unknown sequence {}", seq.0))
}

impl ModelRunner for CpuRunner {
    fn config(&self) -> &Config {
        self.model.config()
    }

    fn device_name(&self) -> String {
        let kernels = if minnow_runtime::cpu::uses_avx512() {
            "avx512"
        } else {
            "portable"
        };
        format!(
            "cpu ({} threads, f32, {kernels})",
            rayon::current_num_threads()
        )
    }

    fn create_sequence(&mut self) -> Result<SeqId> {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.sequences.insert(id, self.model.new_cache());
        Ok(id)
    }

    fn release_sequence(&mut self, seq: SeqId) {
        self.sequences.remove(&seq);
    }

    fn sequence_len(&self, seq: SeqId) -> usize {
        self.sequences.get(&seq).map_or(0, KvCache::len)
    }

    fn truncate_sequence(&mut self, seq: SeqId, len: usize) -> Result<()> {
        let cache = self
            .sequences
            .get_mut(&seq)
            .ok_or_else(|| unknown_sequence(seq))?;
        if len > cache.len() {
            return Err(ModelError::InvalidInput(format!(
                "cannot truncate sequence {} to {len}: it holds {} positions",
                seq.0,
                cache.len()
            )));
        }
        cache.truncate(len);
        Ok(())
    }

    fn forward(&mut self, seq: SeqId, ids: &[u32], rows: LogitsRows) -> Result<Vec<f32>> {
        let cache = self
            .sequences
            .get_mut(&seq)
            .ok_or_else(|| unknown_sequence(seq))?;
        self.model.forward(cache, ids, rows, None)
    }
}
