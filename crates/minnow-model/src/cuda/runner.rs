//! [`CudaRunner`]: the [`ModelRunner`] of the GPU. It owns the device, the weights, one K/V pool
//! of BF16 pages allocated at construction, a workspace sized for the largest forward planned
//! (grown if a larger one comes), and CUDA graphs of short forwards keyed by the batch's shape
//! (segment lengths, wanted rows and what they want), replayed on later steps of the same shape
//! with new ids, positions and block tables.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use minnow_format::TensorSource;
use minnow_runtime::cuda::{ops, DeviceBuffer, Gpu, Graph, Profile};

use super::batch_layout::{canonical_order, BatchShape, Layout};
use super::device_error::device_err;
use super::forward::queue_forward;
use super::kv_pool::KvPool;
use super::shapes::invariant_attention_splits;
use super::weights::Weights;
use super::workspace::Workspace;
use crate::batch::{pages_for, Segment, SegmentOutput, TopK, Want, TOP_K};
use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::runner::{DrawRule, ModelRunner, RowDraw, TopKRows};

/// Batches whose segments are all at most this long (denoising steps, commits) and whose rows
/// total at most [`GRAPH_MAX_TOKENS`] are captured as CUDA graphs and replayed; longer ones
/// (prefill chunks, whose shapes rarely repeat) are queued launch by launch.
const GRAPH_MAX_SEGMENT_TOKENS: usize = 128;
const GRAPH_MAX_TOKENS: usize = 4096;
/// Captured graphs kept at once (all are dropped when the cache is full).
const GRAPH_CACHE: usize = 256;

/// Graphs captured and graph launches by every runner of the process ([`CudaRunner::graph_counts`]).
static GRAPHS_CAPTURED: AtomicUsize = AtomicUsize::new(0);
static GRAPHS_LAUNCHED: AtomicUsize = AtomicUsize::new(0);

/// The workspace allocated at construction: forwards of up to this many rows (prefill chunks of
/// 8K tokens, or 64 denoising blocks at once plus prefill) and this many rows of logits (64
/// blocks of 32), so the default K/V budget is what is left after the largest workspace the
/// engine plans to use. Larger forwards grow it (and may fail for memory, with a clear error).
const PLANNED_TOKENS: usize = 8192;
const PLANNED_LOGIT_ROWS: usize = 2048;
/// Attention partials planned for: (token x fixed-position key split) rows, e.g. 64 denoising
/// blocks at 8K context or a 4K prefill chunk at 4K context (256 MiB on LLaDA2-mini); larger
/// forwards grow the workspace.
const PLANNED_ATTENTION_ROWS: usize = 32768;

/// Device memory the default K/V budget leaves free: the larger of 4 GiB and 1/32 of the GPU,
/// for cuBLAS's workspaces, captured graphs, the metadata buffer, a grown workspace and other
/// programs' small allocations.
fn safety_margin(total: usize) -> usize {
    (4usize << 30).max(total / 32)
}

pub struct CudaRunner {
    // Field order matters for drop: graphs and buffers go before the device.
    graphs: HashMap<BatchShape, Graph>,
    /// Per-forward metadata (`Layout::fill`), one upload per forward.
    meta: DeviceBuffer<u32>,
    workspace: Workspace,
    pool: KvPool,
    weights: Weights,
    config: Config,
    use_graphs: bool,
    /// Where the latest forward's `Want::TopK` rows are in the workspace's logits.
    topk_rows: TopKRows,
    /// The latest forward's lm_head rows (`Layout::head_rows`: its wanted rows, rounded up to
    /// the graph's bucket when gathered): the row pitch of its top-1 and best-ids outputs, which
    /// store ids first and then the scores, `head_rows` apart.
    head_rows: usize,
    /// Whether `forward_batch` runs the segments in [`canonical_order`] (default; the
    /// environment variable `MINNOW_CANONICAL_ORDER=0` keeps the caller's order).
    reorder: bool,
    /// The latest forward's place of each of the caller's segments (empty: the caller's order),
    /// for the rows `draw_rows` and `logits_row` name by the caller's segment index.
    forward_place: Vec<usize>,
    gpu: Gpu,
}

impl CudaRunner {
    /// Opens GPU `ordinal` and uploads the checkpoint's weights (BF16; the router kept exact),
    /// with the default K/V budget (see [`CudaRunner::new_with_kv_budget`]).
    pub fn new(config: Config, source: &dyn TensorSource, ordinal: usize) -> Result<Self> {
        Self::new_with_kv_budget(config, source, ordinal, None)
    }

    /// [`CudaRunner::new`] with a K/V pool of at most `kv_budget_bytes` (whole pages of
    /// [`ModelRunner::kv_page_bytes`]). `None`: the device memory still free after the weights
    /// and the planned workspace, minus a safety margin (the larger of 4 GiB and 1/32 of the
    /// GPU). Either way the pool is capped at what 64 sequences of the full context would use,
    /// like the CPU runner's.
    pub fn new_with_kv_budget(
        config: Config,
        source: &dyn TensorSource,
        ordinal: usize,
        kv_budget_bytes: Option<usize>,
    ) -> Result<Self> {
        let gpu = Gpu::new(ordinal).map_err(device_err)?;
        check_supported(&config)?;
        let weights = Weights::load(&gpu, &config, source)?;
        Self::with_weights(gpu, config, weights, kv_budget_bytes)
    }

    /// Reads `dir/config.json` and the safetensors weights of `dir` onto GPU `ordinal`.
    pub fn load(dir: &Path, ordinal: usize) -> Result<Self> {
        let (config, source) = crate::checkpoint::open(dir)?;
        Self::new(config, &source, ordinal)
    }

    /// Random weights at the config's shapes, generated on the device (benchmarks).
    pub fn random(config: Config, ordinal: usize, seed: u64) -> Result<Self> {
        Self::random_with_kv_budget(config, ordinal, seed, None)
    }

    /// [`CudaRunner::random`] with a K/V budget as in [`CudaRunner::new_with_kv_budget`].
    pub fn random_with_kv_budget(
        config: Config,
        ordinal: usize,
        seed: u64,
        kv_budget_bytes: Option<usize>,
    ) -> Result<Self> {
        Self::random_with_experts(config, ordinal, seed, None, kv_budget_bytes)
    }

    /// [`CudaRunner::random_with_kv_budget`] with the routed experts as random codes of an
    /// integer `*_mma` encoding (`None`: BF16), as a quantized checkpoint would load.
    pub fn random_with_experts(
        config: Config,
        ordinal: usize,
        seed: u64,
        experts: Option<minnow_runtime::quant::QuantEncoding>,
        kv_budget_bytes: Option<usize>,
    ) -> Result<Self> {
        let gpu = Gpu::new(ordinal).map_err(device_err)?;
        check_supported(&config)?;
        let weights = Weights::random(&gpu, &config, seed, experts)?;
        Self::with_weights(gpu, config, weights, kv_budget_bytes)
    }

    fn with_weights(
        gpu: Gpu,
        config: Config,
        weights: Weights,
        kv_budget_bytes: Option<usize>,
    ) -> Result<Self> {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        let parts: Vec<String> = weights
            .bytes_by_encoding()
            .into_iter()
            .map(|(name, b)| match name {
                "other" => format!("other tensors in bf16 {:.2} GiB", gib(b)),
                _ => format!("routed experts in {name} {:.2} GiB", gib(b)),
            })
            .collect();
        tracing::info!(
            "weights on {}: {:.2} GiB ({})",
            gpu.name(),
            gib(weights.bytes()),
            parts.join(", ")
        );
        let use_graphs = std::env::var("MINNOW_CUDA_GRAPHS").map_or(true, |v| v != "0");
        let tokens = PLANNED_TOKENS.min(config.max_position_embeddings.max(1));
        for line in
            super::dense_plan::plan_dense_gemms(&gpu, &config, &weights, tokens, PLANNED_LOGIT_ROWS)
                .map_err(device_err)?
        {
            tracing::info!("dense GEMM plan: {line}");
        }
        let w8a8 = super::moe::runs_w8a8(&gpu, &config, &weights);
        if w8a8 {
            tracing::info!(
                "FP8 experts multiply E4M3 activations on FP8 tensor cores (MINNOW_FP8_ACTIVATIONS=1)"
            );
        }
        let workspace = Workspace::new(
            &gpu,
            &config,
            tokens,
            PLANNED_LOGIT_ROWS,
            PLANNED_ATTENTION_ROWS,
            w8a8,
        )
        .map_err(device_err)?;
        let meta = gpu.alloc(4096).map_err(device_err)?;
        let page_bytes = KvPool::page_bytes(&config).max(1);
        let budget = match kv_budget_bytes {
            Some(b) => b,
            None => {
                let (free, total) = gpu.memory_info().map_err(device_err)?;
                free.saturating_sub(safety_margin(total))
            }
        };
        let per_context = pages_for(config.max_position_embeddings, config.block_size);
        let pages = (budget / page_bytes).min(64 * per_context.max(1));
        if pages == 0 {
            return Err(ModelError::Device(format!(
                "no room for a K/V pool: a budget of {:.2} GiB holds no page of {:.2} MiB",
                budget as f64 / (1u64 << 30) as f64,
                page_bytes as f64 / (1u64 << 20) as f64
            )));
        }
        let pool = KvPool::new(&gpu, &config, pages).map_err(|e| {
            ModelError::Device(format!(
                "allocating a K/V pool of {pages} pages ({:.2} GiB): {e}",
                (pages * page_bytes) as f64 / (1u64 << 30) as f64
            ))
        })?;
        Ok(Self {
            graphs: HashMap::new(),
            meta,
            workspace,
            pool,
            weights,
            config,
            use_graphs,
            topk_rows: TopKRows::default(),
            head_rows: 0,
            reorder: std::env::var("MINNOW_CANONICAL_ORDER").map_or(true, |v| v != "0"),
            forward_place: Vec::new(),
            gpu,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Bytes of the weights in device memory.
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes()
    }

    /// Bytes of the K/V pool in device memory.
    pub fn kv_pool_bytes(&self) -> usize {
        self.pool.bytes()
    }

    /// Graphs captured and graph launches (replays and first runs) so far by every runner of
    /// the process: how often a workload's forwards found their shape's graph.
    pub fn graph_counts() -> (usize, usize) {
        (
            GRAPHS_CAPTURED.load(Ordering::Relaxed),
            GRAPHS_LAUNCHED.load(Ordering::Relaxed),
        )
    }

    /// Turns CUDA-graph replay of short forwards on or off (on by default; the environment
    /// variable `MINNOW_CUDA_GRAPHS=0` starts with it off).
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
        if !on {
            self.graphs.clear();
        }
    }

    /// Runs `segments` like [`ModelRunner::forward_batch`] (no graph) and returns, per MoE layer,
    /// the experts each row was routed to (`rows × top_k` ids, each row's in the router's order):
    /// diagnostics for fidelity tests.
    pub fn routing(&mut self, segments: &[Segment<'_>]) -> Result<Vec<Vec<i32>>> {
        let mut routing = Vec::new();
        self.run_batch(segments, None, Some(&mut routing))?;
        Ok(routing)
    }

    /// Runs `segments` like [`ModelRunner::forward_batch`] (no graph) and returns, per MoE layer,
    /// how many distinct experts the batch's tokens were routed to: the expert weights the step
    /// had to read (benchmarks' floors).
    pub fn experts_used(&mut self, segments: &[Segment<'_>]) -> Result<Vec<usize>> {
        let mut routing = Vec::new();
        self.run_batch(segments, None, Some(&mut routing))?;
        Ok(routing
            .iter()
            .map(|ids| {
                let mut seen = std::collections::HashSet::new();
                ids.iter().filter(|&&e| seen.insert(e)).count()
            })
            .collect())
    }

    /// One batched forward without graph replay, timed stage by stage on the device (the
    /// pages are the caller's, as in [`ModelRunner::forward_batch`]).
    pub fn profile_batch(&mut self, segments: &[Segment<'_>]) -> Result<Vec<(&'static str, f32)>> {
        let mut prof = self.gpu.profile().map_err(device_err)?;
        self.run_batch(segments, Some(&mut prof), None)?;
        prof.report().map_err(device_err)
    }

    /// Where the caller's segment `segment` ran in the latest forward.
    fn place_of(&self, segment: usize) -> usize {
        self.forward_place.get(segment).copied().unwrap_or(segment)
    }

    /// Validates, queues (or replays) and reads back one batched forward.
    fn run_batch(
        &mut self,
        segments: &[Segment<'_>],
        prof: Option<&mut Profile>,
        routing: Option<&mut Vec<Vec<i32>>>,
    ) -> Result<Vec<SegmentOutput>> {
        crate::batch::validate(&self.config, self.pool.pages(), segments)?;
        self.run_validated(segments, prof, routing)
    }

    /// [`Self::run_batch`] for segments the caller has validated.
    fn run_validated(
        &mut self,
        segments: &[Segment<'_>],
        prof: Option<&mut Profile>,
        routing: Option<&mut Vec<Vec<i32>>>,
    ) -> Result<Vec<SegmentOutput>> {
        self.topk_rows = TopKRows::new(segments);
        self.forward_place.clear();
        if segments.is_empty() {
            return Ok(Vec::new());
        }
        // The runner may have moved to another thread since its last call.
        self.gpu.bind().map_err(device_err)?;
        let shape = BatchShape::of(segments);
        let layout = Layout::new(&self.config, &shape);
        let meta = layout.fill(&self.config, segments);
        let t = layout.tokens;
        let rows = layout.head_rows;
        self.head_rows = rows;
        let gpu = &self.gpu;
        // Batch-invariant attention keeps a partial per (token, fixed-position key split) when it
        // runs a CTA per chunk; one CTA per tile keeps none.
        let attn_rows = if minnow_runtime::cuda::tuning::tuning().invariant {
            let splits = invariant_attention_splits(
                &self.config,
                layout.tiles.len(),
                layout.key_chunks,
                gpu.sm_count(),
            );
            t * splits.partials_per_row()
        } else {
            0
        };
        if self.workspace.tokens < t
            || self.workspace.logit_rows < rows
            || self.workspace.attn_rows < attn_rows
        {
            let tokens = t.max(self.workspace.tokens);
            let logit_rows = rows.max(self.workspace.logit_rows);
            let attn_rows = attn_rows.max(self.workspace.attn_rows);
            self.graphs.clear();
            // Free the old workspace before allocating the larger one.
            let w8a8 = self.workspace.e4m3_rows.is_some();
            self.workspace =
                Workspace::new(gpu, &self.config, 1, 1, 0, w8a8).map_err(device_err)?;
            self.workspace = Workspace::new(gpu, &self.config, tokens, logit_rows, attn_rows, w8a8)
                .map_err(device_err)?;
        }
        if self.meta.len() < meta.len() {
            self.graphs.clear();
            self.meta = gpu
                .alloc(meta.len().next_power_of_two())
                .map_err(device_err)?;
        }
        gpu.write(&self.meta, 0, &meta).map_err(device_err)?;
        let ws = &self.workspace;
        let graphable = self.use_graphs
            && prof.is_none()
            && routing.is_none()
            && shape.longest() <= GRAPH_MAX_SEGMENT_TOKENS
            && t <= GRAPH_MAX_TOKENS;
        let meta_ptr = self.meta.ptr();
        if graphable {
            if !self.graphs.contains_key(&shape) {
                if self.graphs.len() >= GRAPH_CACHE {
                    self.graphs.clear();
                }
                let (config, weights, pool) = (&self.config, &self.weights, &self.pool);
                let graph = Graph::capture(gpu, || {
                    queue_forward(
                        gpu, config, weights, pool, ws, meta_ptr, &layout, None, None,
                    )
                })
                .map_err(device_err)?;
                self.graphs.insert(shape.clone(), graph);
                GRAPHS_CAPTURED.fetch_add(1, Ordering::Relaxed);
            }
            self.graphs[&shape].launch(gpu).map_err(device_err)?;
            GRAPHS_LAUNCHED.fetch_add(1, Ordering::Relaxed);
        } else {
            queue_forward(
                gpu,
                &self.config,
                &self.weights,
                &self.pool,
                ws,
                meta_ptr,
                &layout,
                prof,
                routing,
            )
            .map_err(device_err)?;
        }
        self.read_outputs(segments, &layout)
    }

    /// Splits the wanted rows' outputs (in batch order in the workspace) into per-segment outputs.
    fn read_outputs(
        &self,
        segments: &[Segment<'_>],
        layout: &Layout,
    ) -> Result<Vec<SegmentOutput>> {
        let ws = &self.workspace;
        let rows = layout.head_rows;
        let v = self.config.vocab_size;
        let (mut tokens, mut conf) = (Vec::new(), Vec::new());
        if layout.top1 || layout.topk {
            // Tokens then confidences (F32 bits), in one copy.
            tokens = vec![0u32; 2 * rows];
            self.gpu.read(&ws.top, 0, &mut tokens).map_err(device_err)?;
            conf = tokens
                .split_off(rows)
                .into_iter()
                .map(f32::from_bits)
                .collect();
        }
        let k = TOP_K.min(v);
        let mut best = Vec::new();
        if layout.topk {
            // Ids then logits (F32 bits), in one copy.
            best = vec![0u32; 2 * rows * k];
            self.gpu.read(&ws.best, 0, &mut best).map_err(device_err)?;
        }
        if !layout.top1 && !layout.logits && !layout.topk {
            // Nothing to read: still wait, so device faults surface in this call.
            self.gpu.synchronize().map_err(device_err)?;
        }
        let mut at = 0;
        segments
            .iter()
            .map(|seg| {
                let n = seg.want.rows().len();
                let out = match seg.want {
                    Want::Nothing => return Ok(SegmentOutput::Nothing),
                    Want::Logits(_) if n == 0 => SegmentOutput::Logits(Vec::new()),
                    Want::Top1(_) if n == 0 => SegmentOutput::Top1(Vec::new()),
                    Want::TopK(_) if n == 0 => SegmentOutput::TopK(TopK {
                        k,
                        entries: Vec::new(),
                        top1: Vec::new(),
                    }),
                    // Each segment's rows straight into its own vector (20 MB for a block of
                    // the mini model's logits: no second copy).
                    Want::Logits(_) => {
                        let mut logits = vec![0f32; n * v];
                        self.gpu
                            .read(&ws.logits_f32, at * v, &mut logits)
                            .map_err(device_err)?;
                        SegmentOutput::Logits(logits)
                    }
                    Want::Top1(_) => SegmentOutput::Top1(
                        tokens[at..at + n]
                            .iter()
                            .copied()
                            .zip(conf[at..at + n].iter().copied())
                            .collect(),
                    ),
                    Want::TopK(_) => {
                        let (ids, logits) = best.split_at(rows * k);
                        let span = at * k..(at + n) * k;
                        SegmentOutput::TopK(TopK {
                            k,
                            entries: ids[span.clone()]
                                .iter()
                                .zip(&logits[span])
                                .map(|(&id, &bits)| (id, f32::from_bits(bits)))
                                .collect(),
                            top1: tokens[at..at + n]
                                .iter()
                                .copied()
                                .zip(conf[at..at + n].iter().copied())
                                .collect(),
                        })
                    }
                };
                at += n;
                Ok(out)
            })
            .collect()
    }
}

/// Rejects configurations the kernels cannot run, before anything is uploaded.
fn check_supported(c: &Config) -> Result<()> {
    super::shapes::attention_shape(c)
        .check()
        .map_err(device_err)?;
    if c.num_experts > 0 && c.first_k_dense_replace < c.num_hidden_layers {
        super::shapes::router_shape(c).check().map_err(device_err)?;
    }
    if !c.hidden_size.is_multiple_of(8) || !c.moe_intermediate_size.is_multiple_of(8) {
        return Err(ModelError::Device(format!(
            "hidden size {} / expert width {}: the row kernels need multiples of 8",
            c.hidden_size, c.moe_intermediate_size
        )));
    }
    if !c.use_qk_norm {
        return Err(ModelError::Device(
            "use_qk_norm = false is not implemented by the CUDA kernels".into(),
        ));
    }
    Ok(())
}

impl ModelRunner for CudaRunner {
    fn config(&self) -> &Config {
        &self.config
    }

    fn device_name(&self) -> String {
        format!("cuda:{} ({}, bf16)", self.gpu.ordinal(), self.gpu.name())
    }

    fn kv_pages(&self) -> usize {
        self.pool.pages()
    }

    fn kv_page_bytes(&self) -> usize {
        KvPool::page_bytes(&self.config)
    }

    /// Runs the segments in [`canonical_order`], so that batches holding the same segment
    /// shapes in another order replay one captured graph, and returns the outputs in the caller's
    /// order. The batch is validated once, as the caller gave it, so a refusal names the
    /// caller's segment.
    fn forward_batch(&mut self, segments: &[Segment<'_>]) -> Result<Vec<SegmentOutput>> {
        crate::batch::validate(&self.config, self.pool.pages(), segments)?;
        let order = canonical_order(segments);
        if !self.reorder || order.iter().enumerate().all(|(place, &i)| place == i) {
            return self.run_validated(segments, None, None);
        }
        let ordered: Vec<Segment<'_>> = order.iter().map(|&i| segments[i].clone()).collect();
        let outputs = self.run_validated(&ordered, None, None)?;
        let mut place = vec![0; segments.len()];
        for (p, &i) in order.iter().enumerate() {
            place[i] = p;
        }
        // Each output with its caller's index, back in the caller's order.
        let mut outputs: Vec<(usize, SegmentOutput)> = order.into_iter().zip(outputs).collect();
        outputs.sort_by_key(|&(i, _)| i);
        self.forward_place = place;
        Ok(outputs.into_iter().map(|(_, out)| out).collect())
    }

    /// The lm_head runs on the wanted rows only, and a graph is keyed by how many there are
    /// (`BatchShape::head_rows`), not which.
    fn narrow_rows_pay(&self) -> bool {
        true
    }

    fn draws_rows(&self) -> bool {
        self.config.vocab_size <= ops::DRAW_MAX_VOCAB
    }

    /// One CTA per draw over the BF16 logits the forward left in the workspace, with the best
    /// ids and top-1 pairs it computed beside them; the parameters go up and the pairs come back
    /// in one copy each.
    fn draw_rows(&mut self, draws: &[RowDraw]) -> Result<Vec<(u32, f32)>> {
        if draws.is_empty() {
            return Ok(Vec::new());
        }
        // The forward wrote its best ids and their logits, and its top-1 ids and confidences,
        // `head_rows` apart: the padded count, which exceeds the wanted rows when a gathered
        // batch is rounded up to its bucket.
        let rows = self.head_rows;
        let mut params = Vec::with_capacity(draws.len() * ops::DRAW_PARAM_WORDS);
        for d in draws {
            let at = self.topk_rows.index(self.place_of(d.segment), d.row)?;
            let rule = match d.rule {
                DrawRule::Official => ops::DrawRuleCode::Official,
                DrawRule::Port => ops::DrawRuleCode::Port,
            };
            let top_k = u32::try_from(d.top_k).unwrap_or(u32::MAX);
            params.extend(ops::draw_params(
                at as u32,
                rule,
                top_k,
                d.temperature,
                d.top_p,
                d.uniform,
            ));
        }
        let ws = &self.workspace;
        if draws.len() > ws.draw_out.len() / 2 {
            return Err(ModelError::InvalidInput(format!(
                "{} draws from a forward of {rows} lm_head rows",
                draws.len()
            )));
        }
        let v = self.config.vocab_size;
        let k = TOP_K.min(v);
        self.gpu.bind().map_err(device_err)?;
        self.gpu
            .write(&ws.draw_params, 0, &params)
            .map_err(device_err)?;
        ops::draw_rows(
            &self.gpu,
            ws.logits_bf16.ptr(),
            ws.best.ptr(),
            ws.best.ptr_at(rows * k),
            k,
            ws.top.ptr(),
            ws.top.ptr_at(rows),
            ws.draw_params.ptr(),
            ws.draw_out.ptr(),
            draws.len(),
            v,
        )
        .map_err(device_err)?;
        let mut out = vec![0u32; 2 * draws.len()];
        self.gpu
            .read(&ws.draw_out, 0, &mut out)
            .map_err(device_err)?;
        Ok(out
            .chunks_exact(2)
            .map(|pair| (pair[0], f32::from_bits(pair[1])))
            .collect())
    }

    /// Read from the BF16 logits the forward left in the workspace (the values its best ids
    /// were chosen from), widened exactly.
    fn logits_row(&mut self, segment: usize, row: usize) -> Result<Vec<f32>> {
        let at = self.topk_rows.index(self.place_of(segment), row)?;
        let v = self.config.vocab_size;
        self.gpu.bind().map_err(device_err)?;
        let mut data = vec![half::bf16::ZERO; v];
        self.gpu
            .read(&self.workspace.logits_bf16, at * v, &mut data)
            .map_err(device_err)?;
        Ok(half::slice::HalfFloatSliceExt::to_f32_vec(data.as_slice()))
    }
}
