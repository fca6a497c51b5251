//! The CPU forward pass: the numerical reference of minnow. F32 arithmetic throughout, from
//! weights kept in their stored type (model doc §7 with every BF16 rounding replaced by F32,
//! i.e. the fixtures' "F32 reference": BF16 weights upcast, whole model in F32).

mod attention;
mod ffn;
mod kv_pool;
mod profile;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use minnow_format::TensorSource;
use minnow_runtime::cpu::{linear, rms_norm_rows, Par};

use crate::batch::{pages_for, Segment, SegmentOutput, Want};
use crate::config::Config;
use crate::error::Result;
use crate::runner::{top1, top_k_of_rows, ModelRunner, TopKRows};
use crate::trace::{RouterTrace, Trace};
use crate::weights::{FeedForward, Weights};
use attention::SegmentRows;

pub use kv_pool::KvPool;

/// A loaded model: config plus validated weights. Stateless; K/V live in a [`KvPool`].
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

    /// Runs a batch (see [`ModelRunner::forward_batch`]) over `pool`. With `trace`, records
    /// every intermediate over the batch's concatenated rows (and computes the final norm of
    /// every row).
    pub fn forward_batch(
        &self,
        pool: &mut KvPool,
        segments: &[Segment<'_>],
        trace: Option<&mut Trace>,
    ) -> Result<Vec<SegmentOutput>> {
        Ok(self.forward_rows(pool, segments, trace)?.0)
    }

    /// [`CpuModel::forward_batch`], also returning the logits of every wanted row `[rows,
    /// vocab]` in batch order (of every row when tracing).
    fn forward_rows(
        &self,
        pool: &mut KvPool,
        segments: &[Segment<'_>],
        mut trace: Option<&mut Trace>,
    ) -> Result<(Vec<SegmentOutput>, Vec<f32>)> {
        let c = &self.config;
        let w = &self.weights;
        let dm = c.hidden_size;
        crate::batch::validate(c, pool.pages(), segments)?;

        // The batch's rows: every segment's ids, concatenated.
        let mut rows = Vec::with_capacity(segments.len());
        let mut ids = Vec::new();
        for seg in segments {
            rows.push(SegmentRows {
                rows: ids.len()..ids.len() + seg.ids.len(),
                start: seg.start,
                pages: seg.pages,
            });
            ids.extend_from_slice(seg.ids);
        }
        let n = ids.len();
        if n == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        // 2.2 routing blocks: each segment's rows cut at its own block boundaries.
        let routing_blocks: Vec<Range<usize>> = rows
            .iter()
            .flat_map(|r| {
                (r.rows.start..r.rows.end)
                    .step_by(c.block_size)
                    .map(move |b0| b0..(b0 + c.block_size).min(r.rows.end))
            })
            .collect();

        // Embedding: widen the looked-up rows.
        let embed = w.embed.view();
        let mut h = vec![0.0f32; n * dm];
        for (row, &id) in h.chunks_exact_mut(dm).zip(&ids) {
            embed.widen_row(id as usize, row);
        }
        if let Some(t) = trace.as_deref_mut() {
            t.embed = h.clone();
        }

        let first_start = segments.first().map_or(0, |s| s.start);
        let mut profile = profile::StageTimes::start(n, first_start);
        let rope = attention::RopeTable::for_positions(
            c,
            segments.iter().flat_map(|s| s.start..s.start + s.ids.len()),
        );
        for (i, layer) in w.layers.iter().enumerate() {
            let mut a = h.clone();
            rms_norm_rows(&mut a, &layer.input_norm, c.rms_norm_eps);
            let o = attention::attention(c, &layer.attention, &a, &rows, &rope, pool, i);
            add_in_place(&mut h, &o);
            profile.lap("attention");

            let mut m = h.clone();
            rms_norm_rows(&mut m, &layer.post_attention_norm, c.rms_norm_eps);
            let f = match &layer.ffn {
                FeedForward::Dense(mlp) => ffn::mlp(mlp, &m, n, Par::Rayon),
                FeedForward::Moe(moe) => {
                    let mut rt = trace.as_ref().map(|_| RouterTrace::default());
                    let out = ffn::moe(c, moe, &m, n, &routing_blocks, rt.as_mut());
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

        // Final norm and lm_head only for the rows that need logits (all rows when tracing).
        let wanted: Vec<Range<usize>> = segments
            .iter()
            .zip(&rows)
            .map(|(seg, r)| {
                let want = seg.want.rows();
                r.rows.start + want.start..r.rows.start + want.end
            })
            .collect();
        let head_rows: Vec<usize> = if trace.is_some() {
            (0..n).collect()
        } else {
            wanted.iter().flat_map(|r| r.clone()).collect()
        };
        let mut hf = Vec::with_capacity(head_rows.len() * dm);
        for &r in &head_rows {
            hf.extend_from_slice(&h[r * dm..(r + 1) * dm]);
        }
        rms_norm_rows(&mut hf, &w.final_norm, c.rms_norm_eps);
        if let Some(t) = trace.as_deref_mut() {
            t.final_norm = hf.clone();
        }
        let mut logits = vec![0.0f32; head_rows.len() * c.vocab_size];
        linear(
            &hf,
            head_rows.len(),
            w.lm_head.view(),
            &mut logits,
            Par::Rayon,
        );
        profile.lap("lm_head");
        profile.finish();

        // Hand each segment its rows; `head_rows` lists the wanted rows in batch order (or
        // every row when tracing).
        let v = c.vocab_size;
        let row_logits = |r: usize| {
            let at = if trace.is_some() {
                r
            } else {
                head_rows.partition_point(|&x| x < r)
            };
            &logits[at * v..(at + 1) * v]
        };
        let outputs = segments
            .iter()
            .zip(&wanted)
            .map(|(seg, rows)| {
                // The segment's wanted rows, copied a row (a slice) at a time.
                let data = || {
                    let mut data = Vec::with_capacity(rows.len() * v);
                    rows.clone()
                        .for_each(|r| data.extend_from_slice(row_logits(r)));
                    data
                };
                match seg.want {
                    Want::Nothing => SegmentOutput::Nothing,
                    Want::Logits(_) => SegmentOutput::Logits(data()),
                    Want::Top1(_) => {
                        SegmentOutput::Top1(rows.clone().map(|r| top1(row_logits(r))).collect())
                    }
                    Want::TopK(_) => SegmentOutput::TopK(top_k_of_rows(&data(), v)),
                }
            })
            .collect();
        Ok((outputs, logits))
    }
}

fn add_in_place(h: &mut [f32], x: &[f32]) {
    for (a, b) in h.iter_mut().zip(x) {
        *a += b;
    }
}

/// Default K/V budget of a CPU runner: the pool is zeroed lazily, so only pages in use cost
/// resident memory, and the budget only caps how much can be cached.
pub const DEFAULT_CPU_KV_BYTES: usize = 4 << 30;

/// [`ModelRunner`] on the CPU: one model and one K/V pool.
pub struct CpuRunner {
    model: Arc<CpuModel>,
    pool: KvPool,
    /// The latest forward's wanted logits rows `[rows, vocab]` when some were asked for with
    /// [`Want::TopK`] (else empty), and where those are.
    kept: (TopKRows, Vec<f32>),
}

impl CpuRunner {
    /// Loads a checkpoint directory; see [`CpuModel::load`].
    pub fn load(dir: &Path) -> Result<CpuRunner> {
        Ok(CpuRunner::new(Arc::new(CpuModel::load(dir)?)))
    }

    /// A runner with the default K/V budget.
    pub fn new(model: Arc<CpuModel>) -> CpuRunner {
        Self::with_kv_budget(model, DEFAULT_CPU_KV_BYTES)
    }

    /// A runner whose pool holds as many pages as fit in `bytes`, capped at what 64 sequences
    /// of the full context would use (and at least one full-context sequence).
    pub fn with_kv_budget(model: Arc<CpuModel>, bytes: usize) -> CpuRunner {
        let c = model.config();
        let per_context = pages_for(c.max_position_embeddings, c.block_size);
        let pages = (bytes / KvPool::page_bytes(c).max(1))
            .min(64 * per_context)
            .max(1);
        Self::with_pages(model, pages)
    }

    /// A runner whose pool holds exactly `pages` pages.
    pub fn with_pages(model: Arc<CpuModel>, pages: usize) -> CpuRunner {
        let pool = KvPool::new(model.config(), pages);
        CpuRunner {
            model,
            pool,
            kept: Default::default(),
        }
    }

    pub fn model(&self) -> &Arc<CpuModel> {
        &self.model
    }

    /// [`ModelRunner::forward_batch`] that also records the intermediates into `trace`.
    pub fn forward_batch_traced(
        &mut self,
        segments: &[Segment<'_>],
        trace: &mut Trace,
    ) -> Result<Vec<SegmentOutput>> {
        self.kept = Default::default();
        self.model
            .forward_batch(&mut self.pool, segments, Some(trace))
    }
}

impl ModelRunner for CpuRunner {
    fn config(&self) -> &Config {
        self.model.config()
    }

    fn device_name(&self) -> String {
        let kernels = minnow_runtime::cpu::kernel_name();
        format!(
            "cpu ({} threads, f32, {kernels})",
            rayon::current_num_threads()
        )
    }

    fn kv_pages(&self) -> usize {
        self.pool.pages()
    }

    fn kv_page_bytes(&self) -> usize {
        KvPool::page_bytes(self.model.config())
    }

    fn forward_batch(&mut self, segments: &[Segment<'_>]) -> Result<Vec<SegmentOutput>> {
        self.kept = Default::default();
        let (outputs, logits) = self.model.forward_rows(&mut self.pool, segments, None)?;
        if segments.iter().any(|s| matches!(s.want, Want::TopK(_))) {
            self.kept = (TopKRows::new(segments), logits);
        }
        Ok(outputs)
    }

    fn logits_row(&mut self, segment: usize, row: usize) -> Result<Vec<f32>> {
        let at = self.kept.0.index(segment, row)?;
        let v = self.model.config().vocab_size;
        Ok(self.kept.1[at * v..(at + 1) * v].to_vec())
    }

    /// The logits are computed in host memory: handing them over is a copy.
    fn full_logits_cheap(&self) -> bool {
        true
    }

    /// The final norm and the lm_head run on the wanted rows only.
    fn narrow_rows_pay(&self) -> bool {
        true
    }
}
