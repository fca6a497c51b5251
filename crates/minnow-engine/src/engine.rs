//! The embeddable engine: load a checkpoint, render prompts, submit requests, stream events,
//! cancel. One worker thread owns the model runner; up to `parallel` requests are decoded at once,
//! their forwards batched into one per step over a shared paged K/V pool with a prefix cache;
//! the rest wait in a bounded FIFO queue.
//!
//! ```no_run
//! use minnow_engine::{ChatMessage, ChatPrompt, Engine, EngineOptions, Event, GenerateRequest};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::load("path/to/checkpoint".as_ref(), EngineOptions::default())?;
//! let chat = ChatPrompt {
//!     messages: vec![ChatMessage {
//!         role: "user".into(),
//!         content: "Hello".into(),
//!         ..Default::default()
//!     }],
//!     ..Default::default()
//! };
//! let (prompt_ids, rendered) = engine.chat_prompt_ids(&chat)?;
//! let mut handle = engine.submit(GenerateRequest {
//!     prompt_ids,
//!     forced_prefix: rendered.forced_prefix,
//!     max_tokens: Some(64),
//!     ..Default::default()
//! })?;
//! while let Some(event) = handle.blocking_next_event() {
//!     match event {
//!         Event::Block { text_delta, .. } => print!("{text_delta}"),
//!         Event::Done { finish_reason, .. } => println!("\n[{finish_reason:?}]"),
//!         Event::Error(error) => eprintln!("error: {error}"),
//!         Event::PrefillProgress { .. } => {}
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! CONTRACT: the signatures in this file are what minnow-server and the CLI are written against.

mod core;
mod handle;
mod output_thread;
mod worker;

pub use self::core::BATCH_SIZE_BUCKETS;
pub use handle::{CancelToken, RequestHandle, TraceLog};
pub use worker::EngineStats;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use minnow_format::LoadProgress;
use minnow_format::ProgressSource;
use minnow_model::{Family, ModelRunner};
use minnow_runtime::device::DeviceRequest;

use crate::api::{ChatPrompt, DecodeParams, GenerateRequest, RenderedPrompt};
use crate::constraint::GrammarCompiler;
use crate::decode::constrained::Constrained;
use crate::decode::layout::{Layout, LayoutError};
use crate::decode::params::{family_defaults, overlay, resolve, ResolvedParams};
use crate::decode::request::{check_algorithm, DecoderContext};
use crate::decode::stop_tokens::StopTokens;
use crate::decode::ControlTokens;
use crate::text::chat_template::ChatTemplate;
use crate::text::tokenizer::Tokenizer;
use crate::text::tool_format::ToolCallFormat;

pub use crate::error::{EngineError, EngineResult};

/// How to load an engine.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub device: DeviceRequest,
    /// CPU worker threads; `None` = all cores.
    pub threads: Option<usize>,
    /// Requests decoded at once: the most sequences in one batched forward. 0 = the device's
    /// default ([`default_parallel`]).
    pub parallel: usize,
    /// Tokens of prefill one step's batch may hold (besides every request's denoising block).
    pub step_tokens: usize,
    /// K/V cache budget in bytes; `None` = the device's default (the GPU: what is left after
    /// weights and workspace minus a margin; the CPU: a fixed budget).
    pub kv_cache_bytes: Option<usize>,
    /// Requests that may wait for a free slot; more are refused with `QueueFull`.
    pub queue_capacity: usize,
    /// Context limit in tokens; `None` = the checkpoint's `max_position_embeddings`.
    pub max_context: Option<usize>,
    /// Server/CLI-wide decode defaults; per-request values override them.
    pub defaults: DecodeParams,
    /// Refresh a final block's K/V in a forward of its own instead of in the next block's first
    /// forward (docs/decoding.md section 8): the same tokens, one forward more per block; for
    /// comparisons. `MINNOW_SEPARATE_COMMITS=1` sets it too.
    pub separate_commits: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            device: DeviceRequest::Auto,
            threads: None,
            parallel: 0,
            step_tokens: 512,
            kv_cache_bytes: None,
            queue_capacity: 64,
            max_context: None,
            defaults: DecodeParams::default(),
            separate_commits: false,
        }
    }
}

/// Static facts about the loaded model, for `inspect`, `/props` and `/v1/models`.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub path: PathBuf,
    /// "LLaDA2.0", "LLaDA2.1" or "LLaDA2.2".
    pub family: String,
    pub block_size: usize,
    pub vocab_size: usize,
    pub n_ctx: usize,
    pub device: String,
    /// The template source that `render_chat` uses ("" when the checkpoint has none).
    pub chat_template: String,
    /// The checkpoint family's defaults merged with `EngineOptions::defaults`, all fields set
    /// except `seed` (none: greedy requests then use a fixed seed, sampling ones fresh entropy).
    pub default_params: DecodeParams,
    pub mask_token_id: u32,
    pub eos_token_id: u32,
    pub role_end_token_id: Option<u32>,
    /// Requests decoded at once (the resolved `EngineOptions::parallel`).
    pub parallel: usize,
}

/// A check of a rendered prompt before it is tokenized (see [`ChatIdsOptions`]).
pub type RenderedCheck<'a> = &'a dyn Fn(&RenderedPrompt) -> EngineResult<()>;

/// The controls of [`Engine::chat_prompt_ids_with`]; the default tokenizes, checks nothing and
/// cannot be cancelled (what [`Engine::chat_prompt_ids`] does).
#[derive(Clone, Copy)]
pub struct ChatIdsOptions<'a> {
    /// Tokenize the rendered prompt (`false`: render only).
    pub tokenize: bool,
    /// Called with the rendered prompt (client text still protected) before tokenizing: a size
    /// bound, say; its error is returned.
    pub check_rendered: Option<RenderedCheck<'a>>,
    /// Polled between pieces of tokenization; `true` stops it with an error.
    pub cancelled: Option<&'a dyn Fn() -> bool>,
}

impl Default for ChatIdsOptions<'_> {
    fn default() -> Self {
        ChatIdsOptions {
            tokenize: true,
            check_rendered: None,
            cancelled: None,
        }
    }
}

/// A request that passed [`Engine::validate`]: its decoding parameters with every default
/// applied, its block layout on the canvas and its compiled output grammar.
pub struct ValidatedRequest {
    params: ResolvedParams,
    layout: Layout,
    constraint: Option<Constrained>,
}

impl ValidatedRequest {
    /// New tokens the request may produce at most (its `max_tokens`, or the rest of the context).
    pub fn max_new_tokens(&self) -> usize {
        self.layout.max_new
    }

    /// Positions of its canvas: prompt plus output, rounded up to whole blocks.
    pub fn canvas_tokens(&self) -> usize {
        self.layout.total_len
    }

    /// The decoding algorithm it runs (the request's, else the engine's or the family's default).
    pub fn algorithm(&self) -> crate::api::Algorithm {
        self.params.algorithm
    }
}

/// Requests batched at once when none is asked for: a GPU's forward costs about the same for
/// 16 blocks as for one (it is bound by reading the weights), a CPU's grows with every row.
pub fn default_parallel(device: &str) -> usize {
    if device.starts_with("cuda") {
        16
    } else {
        4
    }
}

/// Picks and loads the model runner for `options.device`: the hook where device backends are
/// chosen.
///
/// - `cpu`: the F32 CPU reference runner.
/// - `cuda[:N]`: the BF16 CUDA runner on GPU `N`; an error when no usable GPU exists.
/// - `auto`: the CUDA runner on GPU 0 when a GPU is usable, else (or when loading there fails)
///   the CPU runner, with one log line saying which was picked.
pub fn select_runner(path: &Path, options: &EngineOptions) -> EngineResult<Box<dyn ModelRunner>> {
    select_runner_with_progress(path, options, &|_| {})
}

/// [`select_runner`], reporting the bytes of weights loaded so far (the GPU upload is what takes
/// time; the CPU path maps the files and reports completion at once).
pub fn select_runner_with_progress(
    path: &Path,
    options: &EngineOptions,
    progress: &(dyn Fn(LoadProgress) + Sync),
) -> EngineResult<Box<dyn ModelRunner>> {
    let load_error = |e: minnow_model::ModelError| EngineError::Load(e.to_string());
    match options.device {
        DeviceRequest::Cpu => load_cpu_runner(path, options, progress),
        DeviceRequest::Cuda(n) => {
            if !minnow_model::cuda::is_available() {
                return Err(EngineError::Load(format!(
                    "device cuda:{n} was requested, but no usable CUDA GPU was found; use --device cpu"
                )));
            }
            Ok(Box::new(
                load_cuda_runner(path, n, options, progress).map_err(load_error)?,
            ))
        }
        DeviceRequest::Auto => {
            if minnow_model::cuda::is_available() {
                match load_cuda_runner(path, 0, options, progress) {
                    Ok(runner) => {
                        tracing::info!("device auto: using CUDA GPU 0");
                        return Ok(Box::new(runner));
                    }
                    Err(e) => {
                        tracing::warn!("device auto: CUDA GPU 0 unusable ({e}); using the CPU")
                    }
                }
            } else {
                tracing::info!("device auto: no usable CUDA GPU; using the CPU");
            }
            load_cpu_runner(path, options, progress)
        }
    }
}

fn load_cuda_runner(
    path: &Path,
    ordinal: usize,
    options: &EngineOptions,
    progress: &(dyn Fn(LoadProgress) + Sync),
) -> minnow_model::Result<minnow_model::cuda::CudaRunner> {
    let (config, source) = minnow_model::checkpoint::open(path)?;
    let counted = ProgressSource::new(&source, progress);
    minnow_model::cuda::CudaRunner::new_with_kv_budget(
        config,
        &counted,
        ordinal,
        options.kv_cache_bytes,
    )
}

fn load_cpu_runner(
    path: &Path,
    options: &EngineOptions,
    progress: &(dyn Fn(LoadProgress) + Sync),
) -> EngineResult<Box<dyn ModelRunner>> {
    if let Some(threads) = options.threads {
        // The CPU runner computes on rayon's global pool; it can be sized once per process.
        if rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
            .is_err()
        {
            tracing::debug!("the CPU thread pool already exists; threads = {threads} not applied");
        }
    }
    let started = std::time::Instant::now();
    let (config, source) =
        minnow_model::checkpoint::open(path).map_err(|e| EngineError::Load(e.to_string()))?;
    // The CPU reads weights through the memory map as it computes: nothing to copy here.
    let bytes_total = minnow_format::total_bytes(&source);
    let parts = minnow_format::bytes_by_encoding(&source);
    let place = format!(
        "mapped {} for the CPU (its pages are read as the forward first touches them)",
        minnow_format::TensorSource::describe(&source)
    );
    let model = minnow_model::cpu::CpuModel::from_source(config, std::sync::Arc::new(source))
        .map_err(|e| EngineError::Load(e.to_string()))?;
    tracing::info!(
        "{}",
        minnow_model::load_report::line(&place, &parts, started.elapsed())
    );
    progress(LoadProgress {
        bytes_done: bytes_total,
        bytes_total,
    });
    let budget = options
        .kv_cache_bytes
        .unwrap_or(minnow_model::cpu::DEFAULT_CPU_KV_BYTES);
    Ok(Box::new(minnow_model::cpu::CpuRunner::with_kv_budget(
        std::sync::Arc::new(model),
        budget,
    )))
}

/// Whether a checkpoint directory carries a chat template at all (the 2.2 fixture has none; the
/// engine still generates from ids then).
fn has_chat_template(dir: &Path) -> bool {
    if dir.join("chat_template.jinja").exists() {
        return true;
    }
    std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .is_some_and(|config| config.get("chat_template").is_some())
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::V20 => "LLaDA2.0",
        Family::V21 => "LLaDA2.1",
        Family::V22 => "LLaDA2.2",
    }
}

struct Inner {
    info: ModelInfo,
    family: Family,
    /// The checkpoint's configuration (its vocabulary is the embedding table's rows, which may
    /// exceed the tokenizer's).
    config: minnow_model::Config,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    tool_format: ToolCallFormat,
    decoder: DecoderContext,
    /// Structured outputs: the checkpoint's grammar compiler.
    grammars: GrammarCompiler,
    defaults: DecodeParams,
    /// Pages in the runner's K/V pool.
    kv_pages: usize,
    queue: Arc<worker::Queue>,
    next_id: AtomicU64,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.queue.shut_down();
        if let Ok(mut worker) = self.worker.lock() {
            if let Some(handle) = worker.take() {
                let _ = handle.join();
            }
        }
    }
}

/// A loaded model, cheap to clone and shareable across threads.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Loads a checkpoint directory (config, weights, tokenizer, chat template) on the device that
    /// `options.device` selects (see [`select_runner`]).
    pub fn load(path: &Path, options: EngineOptions) -> EngineResult<Engine> {
        Self::load_with_progress(path, options, &|_| {})
    }

    /// [`Engine::load`], calling `progress` as weights are loaded (for a progress bar).
    pub fn load_with_progress(
        path: &Path,
        options: EngineOptions,
        progress: &(dyn Fn(LoadProgress) + Sync),
    ) -> EngineResult<Engine> {
        let runner = select_runner_with_progress(path, &options, progress)?;
        Self::with_runner(path, runner, options)
    }

    /// Builds an engine around an already loaded runner; tokenizer and chat template come from
    /// `path`. Useful for custom runners and tests.
    pub fn with_runner(
        path: &Path,
        runner: Box<dyn ModelRunner>,
        options: EngineOptions,
    ) -> EngineResult<Engine> {
        let config = runner.config().clone();
        // A `.mnw` carries these files as assets.
        let files = crate::model_files::ModelFiles::for_model(path)?;
        let tokenizer = Tokenizer::from_dir(files.dir())?;
        let template = if has_chat_template(files.dir()) {
            Some(ChatTemplate::from_dir(files.dir())?)
        } else {
            tracing::warn!(path = %path.display(), "the checkpoint has no chat template; only raw prompts and token ids can be used");
            None
        };
        let template_source = template
            .as_ref()
            .map(|t| t.source().to_string())
            .unwrap_or_default();
        let tool_format = ToolCallFormat::detect(&tokenizer, &template_source);
        let tokenizer_json = std::fs::read(files.dir().join("tokenizer.json"))
            .map_err(|e| EngineError::Load(format!("cannot read tokenizer.json: {e}")))?;
        let grammars = GrammarCompiler::new(
            tokenizer_json.into(),
            config.vocab_size,
            tokenizer.stop_token_ids(),
            tool_format,
        );
        let special = tokenizer.special().clone();
        // DELETE/SPLIT only mean something to 2.2 checkpoints (the 2.0/2.1 fixtures carry the
        // tokens in their vocabulary, but their decoders treat them as ordinary ids).
        let is_v22 = config.family == Family::V22;
        let control = ControlTokens {
            mask: special.mask,
            delete: if is_v22 { special.delete } else { None },
            split: if is_v22 { special.split } else { None },
        };
        let decoder = DecoderContext {
            control,
            stops: StopTokens::from_ids(tokenizer.stop_token_ids()),
            vocab_size: config.vocab_size,
            full_logits_cheap: runner.full_logits_cheap(),
            narrow_rows: runner.narrow_rows_pay(),
            draws_rows: runner.draws_rows(),
            merge_commits: !(options.separate_commits
                || std::env::var("MINNOW_SEPARATE_COMMITS").is_ok_and(|v| v == "1")),
        };
        let max_pos = config.max_position_embeddings;
        let n_ctx = options.max_context.map_or(max_pos, |m| m.min(max_pos));
        let default_params = overlay(&options.defaults, &family_defaults(config.family));
        // Validate the engine-wide defaults once, so a bad CLI/server default fails at load.
        let resolved = resolve(&DecodeParams::default(), &options.defaults, config.family)
            .map_err(|e| EngineError::Load(format!("decode defaults: {e}")))?;
        check_algorithm(&resolved, control)
            .map_err(|e| EngineError::Load(format!("decode defaults: {e}")))?;
        let info = ModelInfo {
            path: path.to_path_buf(),
            family: family_name(config.family).to_string(),
            block_size: config.block_size,
            vocab_size: config.vocab_size,
            n_ctx,
            device: runner.device_name(),
            chat_template: template_source,
            default_params,
            mask_token_id: special.mask,
            eos_token_id: special.eos,
            role_end_token_id: special.role_end,
            parallel: options.parallel,
        };
        let tokenizer = Arc::new(tokenizer);
        let kv_pages = runner.kv_pages();
        let parallel = match options.parallel {
            0 => default_parallel(&info.device),
            n => n,
        };
        let info = ModelInfo { parallel, ..info };
        let queue = Arc::new(worker::Queue::new(parallel, options.queue_capacity));
        let settings = self::core::CoreSettings {
            token_budget: options.step_tokens.max(config.block_size),
            model_identity: format!("{} {}", path.display(), info.device),
        };
        let worker = worker::spawn(runner, Arc::clone(&queue), Arc::clone(&tokenizer), settings)?;
        Ok(Engine {
            inner: Arc::new(Inner {
                info,
                family: config.family,
                config: config.clone(),
                tokenizer,
                template,
                tool_format,
                decoder,
                grammars,
                defaults: options.defaults,
                kv_pages,
                queue,
                next_id: AtomicU64::new(1),
                worker: Mutex::new(Some(worker)),
            }),
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    /// The checkpoint's tokenizer and special ids.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// Tokenizes text without adding special tokens; special-token strings map to their ids (a
    /// raw prompt that is wholly the caller's; for a chat, see [`Engine::chat_prompt_ids`]).
    pub fn tokenize(&self, text: &str) -> EngineResult<Vec<u32>> {
        self.inner.tokenizer.encode(text)
    }

    /// Decodes ids to text; `keep_special` keeps special-token strings.
    pub fn detokenize(&self, ids: &[u32], keep_special: bool) -> EngineResult<String> {
        self.inner.tokenizer.decode(ids, keep_special)
    }

    /// Renders a conversation and tokenizes it: the way to turn a chat into prompt ids. Every
    /// string a client wrote (message contents and names, reasoning, tool calls, tool
    /// definitions, template variables) stays plain text, special-token strings included, so a
    /// user cannot open a system turn by typing `<role>SYSTEM</role>`; only the template's own
    /// markup becomes control tokens. Returns the ids and the rendered prompt (whose
    /// `forced_prefix` goes into [`GenerateRequest::forced_prefix`]).
    pub fn chat_prompt_ids(&self, prompt: &ChatPrompt) -> EngineResult<(Vec<u32>, RenderedPrompt)> {
        self.chat_prompt_ids_with(prompt, &ChatIdsOptions::default())
    }

    /// [`Engine::chat_prompt_ids`] with a server's controls: a check of the rendered prompt
    /// before it is tokenized, a cancellation flag polled while tokenizing, or no tokenizing at
    /// all (the ids are then empty: the prompt as a chat request would render it).
    pub fn chat_prompt_ids_with(
        &self,
        prompt: &ChatPrompt,
        options: &ChatIdsOptions<'_>,
    ) -> EngineResult<(Vec<u32>, RenderedPrompt)> {
        let tokenizer = &self.inner.tokenizer;
        let mut protected = prompt.clone();
        crate::text::client_text::protect_prompt(tokenizer, &mut protected);
        let rendered = self.render_chat(&protected)?;
        if let Some(check) = options.check_rendered {
            check(&rendered)?;
        }
        let ids = if options.tokenize {
            let never = || false;
            let cancelled = options.cancelled.unwrap_or(&never);
            tokenizer.encode_protected_unless(&rendered.text, cancelled)?
        } else {
            Vec::new()
        };
        let rendered = RenderedPrompt {
            text: tokenizer.unprotect(&rendered.text),
            forced_prefix: rendered.forced_prefix.map(|p| tokenizer.unprotect(&p)),
        };
        Ok((ids, rendered))
    }

    /// Renders a conversation with the checkpoint's own chat template, as text. To generate from
    /// it, use [`Engine::chat_prompt_ids`]: tokenizing this text with [`Engine::tokenize`] would
    /// turn special-token strings that a user typed into control tokens.
    pub fn render_chat(&self, prompt: &ChatPrompt) -> EngineResult<RenderedPrompt> {
        let template = self.inner.template.as_ref().ok_or_else(|| {
            EngineError::Template(format!(
                "{} has no chat template; send a raw prompt instead",
                self.inner.info.path.display()
            ))
        })?;
        template.render(prompt, self.inner.tool_format)
    }

    /// The one check of prompt ids, shared by [`Engine::submit`] and callers that want to refuse
    /// a prompt early: not empty, inside the model's vocabulary, and free of the decoder-internal
    /// MASK/DELETE/SPLIT tokens.
    pub fn check_prompt(&self, ids: &[u32]) -> EngineResult<()> {
        if ids.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        minnow_model::batch::check_ids(&self.inner.config, ids)
            .map_err(|e| EngineError::InvalidRequest(format!("prompt: {e}")))?;
        self.inner.tokenizer.check_prompt(ids)
    }

    /// Validates and queues a request. Errors here are the request's fault (or `QueueFull`);
    /// errors during generation arrive as `Event::Error`.
    pub fn submit(&self, request: GenerateRequest) -> EngineResult<RequestHandle> {
        self.submit_inner(request, None)
    }

    /// Like [`Engine::submit`], and records the block tokens after every denoising forward (for
    /// debugging against reference trajectories; `minnow generate --trace`).
    pub fn submit_traced(
        &self,
        request: GenerateRequest,
    ) -> EngineResult<(RequestHandle, TraceLog)> {
        let trace = TraceLog::default();
        let handle = self.submit_inner(request, Some(trace.clone()))?;
        Ok((handle, trace))
    }

    /// The one validation of a request, everything [`Engine::submit`] checks before queueing it:
    /// the prompt ([`Engine::check_prompt`]), the decoding parameters (the ranges of
    /// [`DECODE_PARAMS`](crate::DECODE_PARAMS) and an algorithm the checkpoint can run), the
    /// context and the K/V pool the canvas needs, and the output grammar (compiled here). Errors
    /// name the field at fault where one is ([`EngineError::InvalidParam`]).
    pub fn validate(&self, request: &GenerateRequest) -> EngineResult<ValidatedRequest> {
        let inner = &self.inner;
        let prompt = &request.prompt_ids;
        self.check_prompt(prompt)?;
        let params = self.resolve_params(&request.params)?;
        let n_ctx = inner.info.n_ctx;
        let max_new = match request.max_tokens {
            Some(n) => n,
            // The rest of the context, in whole blocks (the canvas ends on a block boundary).
            None => {
                (n_ctx / inner.info.block_size * inner.info.block_size).saturating_sub(prompt.len())
            }
        };
        let context_exceeded = EngineError::ContextExceeded {
            n_prompt_tokens: prompt.len(),
            n_ctx,
        };
        if request.max_tokens.is_none() && max_new == 0 {
            return Err(context_exceeded);
        }
        let layout = match Layout::new(prompt.len(), max_new, inner.info.block_size, n_ctx) {
            Ok(layout) => layout,
            Err(LayoutError::ContextExceeded { .. }) => return Err(context_exceeded),
            Err(LayoutError::EmptyPrompt) => {
                return Err(EngineError::InvalidRequest("the prompt is empty".into()))
            }
        };
        // Pages are taken as the request reaches its blocks, but its whole canvas must fit the
        // pool at once (its last block attends to every block before it).
        let pages = minnow_model::batch::pages_for(layout.total_len, layout.block);
        if pages > inner.kv_pages {
            return Err(EngineError::Overloaded(format!(
                "the request needs {pages} K/V pages ({} tokens) but the K/V cache holds {}; raise --kv-cache-mib or send less",
                layout.total_len, inner.kv_pages
            )));
        }
        let constraint = match &request.constraint {
            Some(spec) => {
                let matcher = inner
                    .grammars
                    .matcher(spec)
                    .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
                Some(Constrained::new(
                    matcher,
                    params.sampler,
                    inner.decoder.control,
                    inner.tokenizer.stop_token_ids(),
                ))
            }
            None => None,
        };
        Ok(ValidatedRequest {
            params,
            layout,
            constraint,
        })
    }

    /// The decoding-parameter part of [`Engine::validate`] (no prompt needed), for callers that
    /// refuse a request before the work of tokenizing it: the request's values over the
    /// engine's and the family's defaults, in range, with an algorithm this checkpoint can run.
    pub fn check_params(&self, params: &DecodeParams) -> EngineResult<()> {
        self.resolve_params(params).map(|_| ())
    }

    fn resolve_params(&self, params: &DecodeParams) -> EngineResult<ResolvedParams> {
        let inner = &self.inner;
        let params = resolve(params, &inner.defaults, inner.family)?;
        check_algorithm(&params, inner.decoder.control).map_err(|e| EngineError::InvalidParam {
            param: "algorithm",
            message: e.to_string(),
        })?;
        Ok(params)
    }

    fn submit_inner(
        &self,
        request: GenerateRequest,
        trace: Option<TraceLog>,
    ) -> EngineResult<RequestHandle> {
        let inner = &self.inner;
        let ValidatedRequest {
            params,
            layout,
            constraint,
        } = self.validate(&request)?;
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancelToken::default();
        let stop_signal = handle::StopSignal::default();
        let GenerateRequest {
            prompt_ids,
            stop,
            forced_prefix,
            tool_names,
            cache_prompt,
            cache_salt,
            ..
        } = request;
        let job = worker::Job {
            sequence: self::core::NewSequence {
                id,
                prompt_ids,
                layout,
                params,
                decoder: inner.decoder.clone(),
                trace: trace.is_some(),
                cache_prompt: cache_prompt != Some(false),
                cache_salt,
                cancel: cancel.clone(),
                stop_signal: stop_signal.clone(),
                constraint,
            },
            output: output_thread::OutputRequest {
                stop,
                tool_names,
                forced_prefix,
                tool_format: inner.tool_format,
                events: sender,
                trace,
                stop_signal,
            },
        };
        inner.queue.push(job)?;
        Ok(RequestHandle { id, events, cancel })
    }

    /// Requests waiting for a slot.
    pub fn queue_depth(&self) -> usize {
        self.inner.queue.depth()
    }

    /// Requests being decoded now.
    pub fn busy_slots(&self) -> usize {
        self.inner.queue.busy()
    }

    /// The K/V cache and batch statistics, as of the worker's last step.
    pub fn stats(&self) -> EngineStats {
        self.inner.queue.stats()
    }

    /// How long the step now running (one batched forward and what the engine does with its
    /// outputs) has run, or None between steps. A step far longer than any forward takes means
    /// the device no longer answers (a hung GPU kernel cannot be interrupted); a server can
    /// report itself unhealthy so that it is restarted.
    pub fn step_running(&self) -> Option<std::time::Duration> {
        self.inner.queue.step_running()
    }
}

#[cfg(test)]
mod tests;
