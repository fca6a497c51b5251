//! [`CudaRunner`]: the [`ModelRunner`] of the GPU. It owns the device, the weights, one K/V cache
//! per sequence, a workspace sized for the largest forward seen, and CUDA graphs of short
//! (denoising-sized) forwards, replayed on later steps with the same shape.

use std::collections::HashMap;
use std::path::Path;

use minnow_format::TensorSource;
use minnow_runtime::cuda::{Gpu, Graph, Profile};

use super::forward::{queue_forward, KvCache, Output, Workspace};
use super::weights::{device_err, Weights};
use crate::config::Config;
use crate::runner::{LogitsRows, ModelRunner, SeqId};
use crate::{ModelError, Result};

/// Forwards of at most this many tokens are captured as CUDA graphs and replayed.
const GRAPH_MAX_TOKENS: usize = 128;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct GraphKey {
    seq: SeqId,
    tokens: usize,
    output: Output,
}

pub struct CudaRunner {
    // Field order matters for drop: graphs and buffers go before the device.
    graphs: HashMap<GraphKey, Graph>,
    sequences: HashMap<SeqId, KvCache>,
    workspace: Option<Workspace>,
    weights: Weights,
    config: Config,
    next_seq: u64,
    table: crate::runner::SequenceTable,
    use_graphs: bool,
    gpu: Gpu,
}

impl CudaRunner {
    /// Opens GPU `ordinal` and uploads the checkpoint's weights (BF16; the router kept exact).
    pub fn new(config: Config, source: &dyn TensorSource, ordinal: usize) -> Result<Self> {
        let gpu = Gpu::new(ordinal).map_err(device_err)?;
        check_supported(&config)?;
        let weights = Weights::load(&gpu, &config, source)?;
        Ok(Self::with_weights(gpu, config, weights))
    }

    /// TRANSITIONAL: [`CudaRunner::new`] with a K/V budget (the paged runner sizes its pool).
    pub fn new_with_kv_budget(
        config: Config,
        source: &dyn TensorSource,
        ordinal: usize,
        _kv_budget_bytes: Option<usize>,
    ) -> Result<Self> {
        Self::new(config, source, ordinal)
    }

    /// Reads `dir/config.json` and the safetensors weights of `dir` onto GPU `ordinal`.
    pub fn load(dir: &Path, ordinal: usize) -> Result<Self> {
        let (config, source) = crate::checkpoint::open(dir)?;
        Self::new(config, &source, ordinal)
    }

    /// Random weights at the config's shapes, generated on the device (benchmarks).
    pub fn random(config: Config, ordinal: usize, seed: u64) -> Result<Self> {
        let gpu = Gpu::new(ordinal).map_err(device_err)?;
        check_supported(&config)?;
        let weights = Weights::random(&gpu, &config, seed)?;
        Ok(Self::with_weights(gpu, config, weights))
    }

    fn with_weights(gpu: Gpu, config: Config, weights: Weights) -> Self {
        let use_graphs = std::env::var("MINNOW_CUDA_GRAPHS").map_or(true, |v| v != "0");
        Self {
            graphs: HashMap::new(),
            sequences: HashMap::new(),
            workspace: None,
            weights,
            config,
            next_seq: 0,
            table: Default::default(),
            use_graphs,
            gpu,
        }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Bytes of the weights in device memory.
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes()
    }

    /// Turns CUDA-graph replay of short forwards on or off (on by default; the environment
    /// variable `MINNOW_CUDA_GRAPHS=0` starts with it off).
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
        if !on {
            self.graphs.clear();
        }
    }

    /// Queues and runs one forward and advances the sequence; outputs stay in the workspace.
    fn run(&mut self, seq: SeqId, ids: &[u32], output: Output) -> Result<()> {
        self.run_profiled(seq, ids, output, None)
    }

    /// One forward without graph replay, timed stage by stage on the device: (stage, total ms).
    /// With `top1` the logits rows end in the GPU argmax, else in F32 logits (not read back).
    pub fn profile_forward(
        &mut self,
        seq: SeqId,
        ids: &[u32],
        rows: LogitsRows,
        top1: bool,
    ) -> Result<Vec<(&'static str, f32)>> {
        let r = rows.resolve(ids.len());
        let output = match (r.is_empty(), top1) {
            (true, _) => Output::None,
            (false, true) => Output::Top1 {
                start: r.start,
                end: r.end,
            },
            (false, false) => Output::Logits {
                start: r.start,
                end: r.end,
            },
        };
        let mut prof = self.gpu.profile().map_err(device_err)?;
        self.run_profiled(seq, ids, output, Some(&mut prof))?;
        prof.report().map_err(device_err)
    }

    fn run_profiled(
        &mut self,
        seq: SeqId,
        ids: &[u32],
        output: Output,
        prof: Option<&mut Profile>,
    ) -> Result<()> {
        // The runner may have moved to another thread since its last call.
        self.gpu.bind().map_err(device_err)?;
        let t = ids.len();
        if t == 0 {
            return Err(ModelError::InvalidInput("forward of zero tokens".into()));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.config.vocab_size) {
            return Err(ModelError::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let pos0 = self.sequence_len(seq);
        if !self.sequences.contains_key(&seq) {
            return Err(ModelError::InvalidInput(format!(
                "unknown sequence {seq:?}"
            )));
        }
        if self.config.expert_capacity.is_some() && !pos0.is_multiple_of(self.config.block_size) {
            return Err(ModelError::InvalidInput(format!(
                "block routing needs forwards that start at a block boundary; start {pos0} is not a multiple of {}",
                self.config.block_size
            )));
        }
        if pos0 + t > self.config.max_position_embeddings {
            return Err(ModelError::InvalidInput(format!(
                "positions up to {} exceed max_position_embeddings {}",
                pos0 + t,
                self.config.max_position_embeddings
            )));
        }
        let rows = match output {
            Output::None => 0,
            Output::Logits { start, end } | Output::Top1 { start, end } => end - start,
        };
        let gpu = &self.gpu;
        let cache = self.sequences.get_mut(&seq).expect("checked above");
        if cache
            .reserve(gpu, &self.config, pos0 + t)
            .map_err(device_err)?
        {
            self.graphs.retain(|k, _| k.seq != seq);
        }
        let grow = self
            .workspace
            .as_ref()
            .is_none_or(|ws| ws.tokens < t || ws.logit_rows < rows);
        if grow {
            let (old_t, old_r) = self
                .workspace
                .as_ref()
                .map_or((0, 0), |ws| (ws.tokens, ws.logit_rows));
            self.graphs.clear();
            self.workspace = None;
            self.workspace = Some(
                Workspace::new(gpu, &self.config, t.max(old_t), rows.max(old_r))
                    .map_err(device_err)?,
            );
        }
        let ws = self.workspace.as_ref().expect("created above");
        let cache = &self.sequences[&seq];
        gpu.write(&ws.ids, 0, ids).map_err(device_err)?;
        gpu.write(&ws.pos0, 0, &[pos0 as i32]).map_err(device_err)?;
        let key = GraphKey {
            seq,
            tokens: t,
            output,
        };
        if self.use_graphs && t <= GRAPH_MAX_TOKENS && prof.is_none() {
            if !self.graphs.contains_key(&key) {
                let (config, weights) = (&self.config, &self.weights);
                let graph = Graph::capture(gpu, || {
                    queue_forward(gpu, config, weights, cache, ws, t, output, None)
                })
                .map_err(device_err)?;
                self.graphs.insert(key, graph);
            }
            self.graphs[&key].launch(gpu).map_err(device_err)?;
        } else {
            queue_forward(gpu, &self.config, &self.weights, cache, ws, t, output, prof)
                .map_err(device_err)?;
        }
        self.sequences.get_mut(&seq).expect("checked above").len = pos0 + t;
        Ok(())
    }
}

/// Rejects configurations the kernels cannot run, before anything is uploaded.
fn check_supported(c: &Config) -> Result<()> {
    super::forward::attention_shape(c)
        .check()
        .map_err(device_err)?;
    if c.num_experts > 0 && c.first_k_dense_replace < c.num_hidden_layers {
        super::forward::router_shape(c)
            .check()
            .map_err(device_err)?;
    }
    let iw = c.moe_intermediate_size;
    if !c.hidden_size.is_multiple_of(64) || !iw.is_multiple_of(32) || !(2 * iw).is_multiple_of(64) {
        return Err(ModelError::Device(format!(
            "hidden size {} / expert width {iw}: the expert GEMM needs multiples of 64 / 32",
            c.hidden_size
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
        0
    }

    fn kv_page_bytes(&self) -> usize {
        0
    }

    // TRANSITIONAL: the paged, batched GPU forward replaces this (the per-sequence path above
    // is what it is rebuilt from).
    fn forward_batch(
        &mut self,
        _segments: &[crate::batch::Segment<'_>],
    ) -> Result<Vec<crate::batch::SegmentOutput>> {
        let _ = (Self::run, Self::read_top1, self.next_seq);
        let _ = super::forward::Output::for_rows;
        Err(ModelError::Device(
            "the paged GPU forward is not built yet".into(),
        ))
    }

    fn sequence_table(&mut self) -> &mut crate::runner::SequenceTable {
        &mut self.table
    }

    fn sequence_table_ref(&self) -> &crate::runner::SequenceTable {
        &self.table
    }
}

impl CudaRunner {
    fn read_top1(&mut self, n: usize) -> Result<Vec<(u32, f32)>> {
        let ws = self
            .workspace
            .as_ref()
            .expect("run() creates the workspace");
        let mut tokens = vec![0u32; n];
        let mut conf = vec![0f32; n];
        if n > 0 {
            self.gpu
                .read(&ws.top_token, 0, &mut tokens)
                .map_err(device_err)?;
            self.gpu
                .read(&ws.top_conf, 0, &mut conf)
                .map_err(device_err)?;
        }
        Ok(tokens.into_iter().zip(conf).collect())
    }
}
