//! `cargo xtask bench`: the GPU numbers of docs/performance.md. Builds a random-weight model at
//! the real LLaDA2.2-mini shapes directly in device memory (no checkpoint file, no Python), then
//! measures the device copy bandwidth, prefill throughput, one 32-token refinement forward over a
//! cached prefix (with the bytes it must read and the resulting bandwidth floor), and the decode
//! of 8 blocks with a fixed schedule. Prints a Markdown table with the device, commit and command.
//!
//! Options: `--commit SHA` (else `git rev-parse`), `--quick` (fewer repetitions),
//! `--prefill 512,2048,...`, `--prefix 1024,8192`, `--profile-one` (only one refinement forward
//! at the first prefix, without a graph, between `cuProfilerStart`/`Stop`: for
//! `ncu --profile-from-start off`; with `--concurrency N` first in the list, N > 1, one batched
//! step of N requests instead), `--concurrency 1,4,16,64` (the batched steps), `--separate-commits` (the decodes
//! refresh each block's K/V in a forward of its own instead of in the next block's first step),
//! `--experts bf16|int8|int4|nvfp4|fp8` (random routed experts in that encoding: `i8_mma` /
//! `i4_mma` codes with groups of 128, or NVFP4 and FP8 as the loader repacks them: E2M1 codes
//! with a BF16 scale per 16, E4M3 codes with an F32 scale per 128 x 128 block), `--preset
//! mini|flash` (the shapes; flash needs quantized experts to fit one GPU).

use std::time::Instant;

use minnow_model::cuda::CudaRunner;
use minnow_model::{Config, LogitsRows, ModelRunner, PageId, Segment, SeqId, SingleSequence, Want};
use minnow_runtime::cuda::Gpu;
use minnow_runtime::quant::QuantEncoding;

/// LLaDA2.2-mini (docs/model.md §3.1).
pub(crate) const MINI_22: &str = r#"{
  "model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"],
  "vocab_size": 157184, "hidden_size": 2048, "intermediate_size": 5120,
  "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
  "moe_intermediate_size": 512, "num_experts": 256, "num_experts_per_tok": 8, "num_shared_experts": 1,
  "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
  "moe_router_enable_expert_bias": true, "norm_topk_prob": true, "score_function": "sigmoid",
  "router_dtype": "fp32", "rms_norm_eps": 1e-6, "rope_theta": 3000000,
  "rope_parameters": {"rope_type": "default", "rope_theta": 3000000, "partial_rotary_factor": 0.5},
  "partial_rotary_factor": 0.5, "rotary_dim": 64, "rope_scaling": null,
  "max_position_embeddings": 131072, "use_qk_norm": true, "use_qkv_bias": false, "use_bias": false,
  "norm_head": false, "tie_word_embeddings": false, "hidden_act": "silu", "pad_token_id": 156892,
  "block_size": 32, "expert_capacity": 48, "delete_token_id": 156930, "split_token_id": 156931,
  "use_sliding_window": false, "torch_dtype": "bfloat16"
}"#;

/// LLaDA2.2-flash at the shapes docs/model.md gives: mini's config with flash's widths
/// (hidden 4,096, 32 layers, 32 query heads, dense MLP 9,216, 256 experts of width 1,024, top-8,
/// block routing with 48 admitted experts; the values it marks unconfirmed are
/// Ling-flash-2.0's). BF16 experts would need ~200 GB: run it with `--experts int4|int8|nvfp4|fp8`.
fn flash_22() -> String {
    let mut config: serde_json::Value = serde_json::from_str(MINI_22).expect("MINI_22 is JSON");
    for (key, value) in [
        ("hidden_size", 4096),
        ("intermediate_size", 9216),
        ("num_hidden_layers", 32),
        ("num_attention_heads", 32),
        ("moe_intermediate_size", 1024),
    ] {
        config[key] = value.into();
    }
    config.to_string()
}

struct Opts {
    /// `mini` or `flash` (the shapes of the random model).
    preset: String,
    commit: String,
    reps: usize,
    prefill: Vec<usize>,
    prefixes: Vec<usize>,
    profile_one: bool,
    /// The decodes run each block's commit refresh as a forward of its own (the engine's
    /// schedule before commits rode on the next block's first step).
    separate_commits: bool,
    concurrency: Vec<usize>,
    /// The routed experts' encoding: `None` BF16, else random codes of an integer encoding.
    experts: Option<QuantEncoding>,
}

impl Opts {
    /// Bytes per routed-expert weight on the device: codes plus one FP16 scale per 128 of them
    /// (NVFP4: one BF16 scale per 16; FP8: an F32 block scale per 8 rows x 128 columns, as
    /// `ops::fp8_fragment_order` repacks it, 4x over).
    fn expert_bytes_per_weight(&self) -> f64 {
        match self.experts {
            None => 2.0,
            Some(QuantEncoding::I8Mma) => 1.0 + 2.0 / 128.0,
            Some(QuantEncoding::Nvfp4) => 0.5 + 2.0 / 16.0,
            Some(QuantEncoding::Fp8Block) => 1.0 + 16.0 / (8.0 * 128.0),
            Some(_) => 0.5 + 2.0 / 128.0,
        }
    }

    fn experts_label(&self) -> &'static str {
        match self.experts {
            None => "bf16",
            Some(e) => e.name(),
        }
    }
}

fn parse_list(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| x.trim().parse::<usize>().map_err(|e| format!("{x}: {e}")))
        .collect()
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        preset: "mini".into(),
        commit: String::new(),
        reps: 20,
        prefill: vec![512, 2048, 4096, 8192],
        prefixes: vec![1024, 8192],
        profile_one: false,
        separate_commits: false,
        concurrency: vec![1, 4, 16, 64],
        experts: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--commit" => o.commit = it.next().ok_or("--commit needs a value")?.clone(),
            "--quick" => o.reps = 5,
            "--profile-one" => o.profile_one = true,
            "--separate-commits" => o.separate_commits = true,
            "--prefill" => o.prefill = parse_list(it.next().ok_or("--prefill needs a list")?)?,
            "--prefix" => o.prefixes = parse_list(it.next().ok_or("--prefix needs a list")?)?,
            "--preset" => {
                o.preset = match it.next().map(String::as_str) {
                    Some(p @ ("mini" | "flash")) => p.to_string(),
                    other => return Err(format!("--preset mini|flash, got {other:?}")),
                }
            }
            "--experts" => {
                o.experts = match it.next().map(String::as_str) {
                    Some("bf16") => None,
                    Some("int8") => Some(QuantEncoding::I8Mma),
                    Some("int4") => Some(QuantEncoding::I4Mma),
                    Some("nvfp4") => Some(QuantEncoding::Nvfp4),
                    Some("fp8") => Some(QuantEncoding::Fp8Block),
                    other => {
                        return Err(format!("--experts bf16|int8|int4|nvfp4|fp8, got {other:?}"))
                    }
                }
            }
            "--concurrency" => {
                o.concurrency = parse_list(it.next().ok_or("--concurrency needs a list")?)?
            }
            other => return Err(format!("unknown bench option {other}")),
        }
    }
    if o.commit.is_empty() {
        o.commit = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into());
    }
    Ok(o)
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Pseudo-random token ids (never special: below 150000).
fn ids(n: usize, salt: u64) -> Vec<u32> {
    (0..n as u64)
        .map(|i| {
            ((i.wrapping_add(salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % 150_000) as u32
        })
        .collect()
}

/// Device-to-device copy bandwidth, counting bytes read plus bytes written.
fn copy_bandwidth(gpu: &Gpu) -> Result<f64, String> {
    let n = 1usize << 30; // 1 GiB each way
    let a = gpu.alloc::<u8>(n).map_err(err)?;
    let b = gpu.alloc::<u8>(n).map_err(err)?;
    minnow_runtime::cuda::ops::fill_random_bf16(gpu, a.ptr(), n / 2, 1, 1.0).map_err(err)?;
    let mut times = vec![];
    for i in 0..12 {
        let timer = gpu.timer().map_err(err)?;
        timer.start().map_err(err)?;
        gpu.copy_bytes(b.ptr(), a.ptr(), n).map_err(err)?;
        let ms = timer.stop_ms().map_err(err)? as f64;
        if i >= 2 {
            times.push(ms);
        }
    }
    Ok(2.0 * n as f64 / (median(times) * 1e-3))
}

/// Bytes one refinement forward of `t` tokens over `prefix` cached positions must read at least:
/// attention and norms of every layer, the dense MLP, per MoE layer the router (BF16, as loaded
/// from BF16 checkpoints), the shared expert
/// and at most `expert_capacity` admitted experts (all of them for 32 random tokens), the K/V of
/// prefix + block, and the whole lm_head (every row of the block needs logits).
fn refinement_bytes(c: &Config, prefix: usize, t: usize, expert_weight_bytes: f64) -> f64 {
    let d = c.hidden_size as f64;
    let bf = 2.0;
    let attn = (c.qkv_rows() as f64 * d + d * (c.num_attention_heads * c.head_dim) as f64) * bf;
    let expert = 3.0 * c.moe_intermediate_size as f64 * d * expert_weight_bytes;
    let admitted = c
        .expert_capacity
        .unwrap_or(c.num_experts_per_tok * t)
        .min(c.num_experts) as f64;
    let moe_layers = (c.num_hidden_layers - c.first_k_dense_replace) as f64;
    let dense = c.first_k_dense_replace as f64 * 3.0 * c.intermediate_size as f64 * d * bf;
    let moe = moe_layers
        * (c.num_experts as f64 * d * bf
            + admitted * expert
            + c.shared_intermediate_size() as f64 * 3.0 * d * bf);
    let kv = c.num_hidden_layers as f64
        * (prefix + t) as f64
        * (2 * c.num_key_value_heads * c.head_dim) as f64
        * bf;
    let lm_head = c.vocab_size as f64 * d * bf;
    c.num_hidden_layers as f64 * attn + dense + moe + kv + lm_head
}

/// Dense bf16 matrix rate (cuBLAS, 8192^3 on random data), the arithmetic ceiling of a floor.
fn matmul_rate(gpu: &Gpu) -> Result<f64, String> {
    let n = 8192usize;
    let a = gpu.alloc::<half::bf16>(n * n).map_err(err)?;
    let b = gpu.alloc::<half::bf16>(n * n).map_err(err)?;
    let c = gpu.alloc::<half::bf16>(n * n).map_err(err)?;
    minnow_runtime::cuda::ops::fill_random_bf16(gpu, a.ptr(), n * n, 3, 1.0).map_err(err)?;
    minnow_runtime::cuda::ops::fill_random_bf16(gpu, b.ptr(), n * n, 4, 1.0).map_err(err)?;
    let mut times = vec![];
    for i in 0..12 {
        let timer = gpu.timer().map_err(err)?;
        timer.start().map_err(err)?;
        gpu.blas()
            .gemm_bf16(a.ptr(), b.ptr(), c.ptr(), n, n, n, n)
            .map_err(err)?;
        let ms = timer.stop_ms().map_err(err)? as f64;
        if i >= 2 {
            times.push(ms);
        }
    }
    Ok(2.0 * (n as f64).powi(3) / (median(times) * 1e-3))
}

/// What one phase of a forward must move and compute at least: bytes from device memory and
/// FLOPs on the tensor cores.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Cost {
    bytes: f64,
    flops: f64,
}

impl Cost {
    /// The phase alone at `bw` bytes/s and `peak` FLOP/s: its bytes and its products overlap.
    fn seconds(&self, bw: f64, peak: f64) -> f64 {
        (self.bytes / bw).max(self.flops / peak)
    }
}

/// The least one batched denoising step must read and compute, in the three phases every MoE
/// layer passes through one after the other.
#[derive(Clone, Copy, Debug)]
struct StepCost {
    /// The routed experts of the step (the union its tokens use per layer) and the shared expert
    /// beside them (it may run on a side stream, overlapping them).
    experts: Cost,
    /// Every other weight once: attention projections, the dense MLP, the routers, the lm_head;
    /// every row through them.
    dense: Cost,
    /// Each request's K/V, and every query row against its request's keys.
    attention: Cost,
}

impl StepCost {
    fn bytes(&self) -> f64 {
        self.experts.bytes + self.dense.bytes + self.attention.bytes
    }

    fn flops(&self) -> f64 {
        self.experts.flops + self.dense.flops + self.attention.flops
    }

    /// The floor of docs/performance.md: the step's bytes over the copy rate or its FLOPs over
    /// the matrix rate, whichever is longer, as if every phase overlapped every other.
    fn floor(&self, bw: f64, peak: f64) -> f64 {
        (self.bytes() / bw).max(self.flops() / peak)
    }

    /// The phases one after the other, each at its own floor. A layer's experts wait for its
    /// attention, which waits for the layer before; the lm_head waits for the last layer. So no
    /// compute-bound GEMM of one phase can hide under another phase's weight stream, and a step
    /// of one batch cannot run faster than this (it leaves out the activations each kernel
    /// writes and the next reads, and every launch gap).
    fn serial_floor(&self, bw: f64, peak: f64) -> f64 {
        self.experts.seconds(bw, peak)
            + self.dense.seconds(bw, peak)
            + self.attention.seconds(bw, peak)
    }
}

/// What one batched denoising step of `n` requests (32 tokens each over its own `prefix`) must
/// read and compute at least, by phase: every dense weight once (attention projections, the
/// dense MLP, routers, shared experts, the lm_head: every row wants its top-1), the union of the
/// experts its tokens use in each MoE layer (`experts_used`, measured on the device), and each
/// request's K/V; FLOPs of every row through its weights plus each request's attention over its
/// keys.
fn batched_step_cost(
    c: &Config,
    n: usize,
    prefix: usize,
    experts_used: &[usize],
    expert_weight_bytes: f64,
) -> StepCost {
    let d = c.hidden_size as f64;
    let bf = 2.0;
    let t = (32 * n) as f64;
    let attn_params = c.qkv_rows() as f64 * d + d * (c.num_attention_heads * c.head_dim) as f64;
    let expert_params = 3.0 * c.moe_intermediate_size as f64 * d;
    let shared_params = c.shared_intermediate_size() as f64 * 3.0 * d;
    let moe_layers = (c.num_hidden_layers - c.first_k_dense_replace) as f64;
    let dense_params = c.first_k_dense_replace as f64 * 3.0 * c.intermediate_size as f64 * d;
    let router_params = moe_layers * c.num_experts as f64 * d;
    let lm_head = c.vocab_size as f64 * d;
    let used: f64 = experts_used.iter().map(|&u| u as f64).sum();
    let keys = (prefix + 32) as f64;
    let kv_row = (2 * c.num_key_value_heads * c.head_dim) as f64 * bf;
    let other_params =
        c.num_hidden_layers as f64 * attn_params + dense_params + router_params + lm_head;
    StepCost {
        experts: Cost {
            bytes: used * expert_params * expert_weight_bytes + moe_layers * shared_params * bf,
            flops: t
                * 2.0
                * moe_layers
                * (shared_params + c.num_experts_per_tok as f64 * expert_params),
        },
        dense: Cost {
            bytes: other_params * bf,
            flops: t * 2.0 * other_params,
        },
        // Q.K and P.V of every query row over its request's keys (the block-causal mask ignored).
        attention: Cost {
            bytes: n as f64 * c.num_hidden_layers as f64 * keys * kv_row,
            flops: t
                * c.num_hidden_layers as f64
                * 4.0
                * (c.num_attention_heads * c.head_dim) as f64
                * keys,
        },
    }
}

/// Pages `first..first + n` of the pool (the batched benchmarks manage their own pages, from the
/// top of the pool, after the single-sequence measurements released theirs).
fn page_run(first: usize, n: usize) -> Vec<PageId> {
    (first as PageId..(first + n) as PageId).collect()
}

/// `n` requests, each with its own `prefix`-token prompt prefilled (eight per forward) on pages
/// of its own; returns their block tables (room for `blocks` more blocks each).
fn prefill_requests(
    runner: &mut CudaRunner,
    n: usize,
    prefix: usize,
    blocks: usize,
) -> Result<Vec<Vec<PageId>>, String> {
    let p = runner.config().block_size;
    let per = (prefix + blocks * p).div_ceil(p);
    let top = runner.kv_pages();
    if top < n * per {
        return Err(format!(
            "the K/V pool holds {top} pages, {} needed",
            n * per
        ));
    }
    let tables: Vec<Vec<PageId>> = (0..n).map(|r| page_run(top - (r + 1) * per, per)).collect();
    let prompts: Vec<Vec<u32>> = (0..n).map(|r| ids(prefix, 7 + 31 * r as u64)).collect();
    for chunk in (0..n).collect::<Vec<_>>().chunks(8) {
        let segs: Vec<Segment<'_>> = chunk
            .iter()
            .map(|&r| Segment {
                pages: &tables[r],
                start: 0,
                ids: &prompts[r],
                want: Want::Nothing,
            })
            .collect();
        runner.forward_batch(&segs).map_err(err)?;
    }
    Ok(tables)
}

/// One segment per request: its block at `start` over its own pages.
fn step<'a>(
    tables: &'a [Vec<PageId>],
    blocks: &'a [Vec<u32>],
    start: usize,
    want: Want,
) -> Vec<Segment<'a>> {
    tables
        .iter()
        .zip(blocks)
        .map(|(t, b)| Segment {
            pages: t,
            start,
            ids: b,
            want: want.clone(),
        })
        .collect()
}

/// One batched denoising step at each concurrency (every request a 32-token block over its own
/// 1,024-token prefix, top-1 of every row read back, CUDA graph), against its floor and its
/// serial floor ([`StepCost`]); then the aggregate generated tokens/s of a fixed-schedule decode
/// (8 blocks of 8 steps, see [`schedule_label`]) of that many requests in lockstep, against
/// `single_rate` (the single-sequence decode of the same schedule measured before: its first
/// run and its warm run), and of the same requests staggered ([`decode_schedule`]: every forward
/// mixes the steps of a block, with the graphs it captured); each decode twice, the first run
/// (new batch shapes: their graph captures) and warm. Each lockstep decode's first and last
/// request are decoded again alone and must generate the same ids, the warm run the first run's,
/// and every staggered request its lockstep ids: a mismatch is reported in its row and returned
/// as an error once every concurrency has run.
fn batched_benchmarks(
    runner: &mut CudaRunner,
    o: &Opts,
    bw: f64,
    peak: f64,
    single_rate: (f64, f64),
    rows: &mut Vec<String>,
) -> Result<(), String> {
    let config = runner.config().clone();
    let prefix = 1024;
    // Request 0 has the same prompt, pages and schedule at every concurrency: its decode digest
    // must not change with the batch around it (batch invariance, checked at every size).
    let mut first_digest: Option<(usize, u64)> = None;
    let mut mismatches = Vec::new();
    for &n in &o.concurrency {
        let tables = prefill_requests(runner, n, prefix, 8)?;
        let blocks: Vec<Vec<u32>> = (0..n).map(|r| ids(32, 5000 + r as u64)).collect();
        let segs = step(&tables, &blocks, prefix, Want::Top1(0..32));
        let used = runner.experts_used(&segs).map_err(err)?;
        let cost = batched_step_cost(&config, n, prefix, &used, o.expert_bytes_per_weight());
        let (bytes, flops) = (cost.bytes(), cost.flops());
        let floor = cost.floor(bw, peak);
        let serial = cost.serial_floor(bw, peak);
        let mut times = vec![];
        for rep in 0..o.reps + 3 {
            let start = Instant::now();
            runner.forward_batch(&segs).map_err(err)?;
            if rep >= 3 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        let s = median(times);
        let mean_used = used.iter().sum::<usize>() as f64 / used.len().max(1) as f64;
        println!(
            "batched step x{n} (32 tokens each @ {prefix} prefix): {:.3} ms; reads >= {:.2} GB ({mean_used:.1} experts per MoE layer), {:.2} TFLOP; floor {:.3} ms ({}), ratio {:.2}; serial floor {:.3} ms (experts {:.3}, dense GEMMs {:.3}, attention {:.3}), ratio {:.2}",
            s * 1e3,
            bytes / 1e9,
            flops / 1e12,
            floor * 1e3,
            if bytes / bw >= flops / peak { "bandwidth" } else { "compute" },
            s / floor,
            serial * 1e3,
            cost.experts.seconds(bw, peak) * 1e3,
            cost.dense.seconds(bw, peak) * 1e3,
            cost.attention.seconds(bw, peak) * 1e3,
            s / serial
        );
        rows.push(format!(
            "| batched denoising step, {n} x 32 tokens @ {prefix} prefix (graph, top-1) | {:.3} ms | floor {:.3} ms ({:.2} GB, {:.2} TFLOP; {mean_used:.1} experts/layer); serial floor {:.3} ms | {:.2}x floor, {:.2}x serial floor |",
            s * 1e3,
            floor * 1e3,
            bytes / 1e9,
            flops / 1e12,
            serial * 1e3,
            s / floor,
            s / serial
        ));
        if n > 1 {
            print_profile(
                &format!("batched step x{n}"),
                runner.profile_batch(&segs).map_err(err)?,
            );
        }
        // Fixed-schedule decode of all n requests in lockstep, twice (first run, then warm:
        // see `run`'s single-request decode).
        let everyone: Vec<usize> = (0..n).collect();
        let lockstep = twice(runner, |runner| {
            lockstep_decode(runner, &tables, &everyone, prefix, o.separate_commits)
        })?;
        let together = lockstep[0].2.clone();
        let digest = fnv1a(together.iter().flatten());
        let digest0 = fnv1a(&together[0]);
        // A speed-up over one request only counts if batching leaves what each request generates
        // unchanged: the first and the last request, decoded again alone on the same pages, must
        // generate the same ids (every request alone would take n times the decode's time).
        let checked: Vec<usize> = if n > 1 { vec![0, n - 1] } else { vec![0] };
        let mut differing = Vec::new();
        for &r in &checked {
            if lockstep_decode(runner, &tables, &[r], prefix, o.separate_commits)?[0] != together[r]
            {
                differing.push(r);
            }
        }
        let mut outputs = if differing.is_empty() {
            format!("requests {checked:?} generate the same ids alone")
        } else {
            format!("OUTPUTS DIFFER: requests {differing:?} generate other ids alone")
        };
        let warm_differs = lockstep[1].2 != together;
        if warm_differs {
            outputs.push_str("; OUTPUTS DIFFER between the first and the warm run");
        }
        for (run, (secs, captured, _)) in lockstep.iter().enumerate() {
            let label = decode_run_label(run, *captured);
            let (rate, ratio) = aggregate_rate(n, run, *secs, single_rate);
            println!(
                "decode x{n} ({}, lockstep), {label}: {:.2} ms, {rate:.0} generated tok/s aggregate ({:.2}x one request's {label}; digest {digest:016x}); {outputs}",
                schedule_label(o.separate_commits),
                secs * 1e3,
                ratio
            );
            rows.push(format!(
                "| decode of {n} concurrent requests, {}, 1024 prompts, {label} | {:.2} ms | {rate:.0} generated tok/s aggregate | {:.2}x one request's {label}; {outputs} |",
                schedule_label(o.separate_commits),
                secs * 1e3,
                ratio
            ));
        }
        if n > 1 && !o.separate_commits {
            // The same requests staggered, request r starting r mod 8 steps late: every forward
            // mixes 64-token merged commits and 32-token steps, in an order that rotates, as a
            // server's would. Each request must generate what it did in lockstep; the graphs
            // captured say how often the forwards met a shape they had run before.
            let offsets: Vec<usize> = (0..n).map(|r| r % 8).collect();
            let forwards = decode_schedule(&offsets).len();
            let (_, launched0) = CudaRunner::graph_counts();
            let staggered = twice(runner, |runner| {
                scheduled_decode(runner, &tables, &everyone, &offsets, prefix, false)
            })?;
            let launched = (CudaRunner::graph_counts().1 - launched0) / 2;
            let differ: Vec<usize> = (0..n)
                .filter(|&r| staggered.iter().any(|run| run.2[r] != together[r]))
                .collect();
            let outputs = if differ.is_empty() {
                "every request generates its lockstep ids".to_string()
            } else {
                format!("OUTPUTS DIFFER: requests {differ:?} generate other ids than in lockstep")
            };
            for (run, (secs, captured, _)) in staggered.iter().enumerate() {
                let label = decode_run_label(run, *captured);
                let (rate, ratio) = aggregate_rate(n, run, *secs, single_rate);
                println!(
                    "decode x{n} staggered ({forwards} forwards), {label}: {:.2} ms, {rate:.0} generated tok/s aggregate ({:.2}x one request's {label}); {launched} graph launches; {outputs}",
                    secs * 1e3,
                    ratio,
                );
                rows.push(format!(
                    "| decode of {n} staggered requests (request r starts r mod 8 steps late; {forwards} forwards), 1024 prompts, {label} | {:.2} ms | {rate:.0} generated tok/s aggregate | {:.2}x one request's {label}; {launched} graph launches; {outputs} |",
                    secs * 1e3,
                    ratio,
                ));
            }
            if !differ.is_empty() {
                mismatches.push(format!("x{n} staggered: {outputs}"));
            }
        }
        match first_digest {
            None => first_digest = Some((n, digest0)),
            Some((n0, d0)) => {
                let verdict = if d0 == digest0 { "equal" } else { "DIFFERS" };
                println!(
                    "request 0 decode digest: x{n0} {d0:016x}, x{n} {digest0:016x}: {verdict}"
                );
                rows.push(format!(
                    "| request 0's decode digest, alone (x{n0}) vs inside x{n} | {verdict} | {d0:016x} / {digest0:016x} | batch invariance |"
                ));
            }
        }
        if !differing.is_empty() || warm_differs {
            mismatches.push(format!("x{n}: {outputs}"));
        }
    }
    if !mismatches.is_empty() {
        return Err(format!(
            "batched decodes generated other ids than the same requests alone ({}); the speed-ups above compare different work",
            mismatches.join("; ")
        ));
    }
    Ok(())
}

/// What a decode runs on: the runner, or the single-sequence wrapper around it.
trait OnDevice {
    fn device(&self) -> &Gpu;
}

impl OnDevice for CudaRunner {
    fn device(&self) -> &Gpu {
        self.gpu()
    }
}

impl OnDevice for SingleSequence<CudaRunner> {
    fn device(&self) -> &Gpu {
        self.gpu()
    }
}

/// Runs a decode twice, each timed between device synchronisations: (seconds, graphs captured,
/// what it generated) of the first run and of the second.
fn twice<R: OnDevice, T>(
    runner: &mut R,
    mut decode: impl FnMut(&mut R) -> Result<T, String>,
) -> Result<Vec<(f64, usize, T)>, String> {
    let mut runs = Vec::with_capacity(2);
    for _ in 0..2 {
        runner.device().synchronize().map_err(err)?;
        let (captured0, _) = CudaRunner::graph_counts();
        let start = Instant::now();
        let out = decode(runner)?;
        runner.device().synchronize().map_err(err)?;
        let secs = start.elapsed().as_secs_f64();
        runs.push((secs, CudaRunner::graph_counts().0 - captured0, out));
    }
    Ok(runs)
}

/// Generated tokens/s of `n` requests' decode (8 blocks of 32 each) that took `secs`, and its
/// ratio to one request's decode rate of the same run kind (`single_rate`: first run, warm).
fn aggregate_rate(n: usize, run: usize, secs: f64, single_rate: (f64, f64)) -> (f64, f64) {
    let rate = (n * 8 * 32) as f64 / secs;
    let base = if run == 0 {
        single_rate.0
    } else {
        single_rate.1
    };
    (rate, rate / base)
}

/// How a decode's row names its run: the first meets new batch shapes (it captures their graphs,
/// once per process; the cuBLASLt plans were all made at load), the second is the steady state.
fn decode_run_label(run: usize, captured: usize) -> String {
    match run {
        0 => format!("first run ({captured} graphs captured)"),
        _ => format!("warm ({captured} graphs captured)"),
    }
}

/// What step `step` of block `b` (at position `pos`) forwards under the decodes' schedule: the
/// block alone from `pos`, or, for a block's first step when commits are not `separate`, the
/// block before's final ids (`previous`) then the block from `pos - 32`, the block's rows wanted.
fn step_input(
    previous: &[u32],
    block: &[u32],
    pos: usize,
    b: usize,
    step: usize,
    separate: bool,
) -> (usize, Vec<u32>, std::ops::Range<usize>) {
    // Step `step` fixes slots 4 step .. 4 step + 3, so its masked span (the rows a 2.0 step asks
    // for, as the engine does) starts at slot 4 step.
    let first = 4 * step;
    if step == 0 && b > 0 && !separate {
        (pos - 32, [previous, block].concat(), 32 + first..64)
    } else {
        (pos, block.to_vec(), first..32)
    }
}

/// How the decodes commit a block's K/V, for their table rows.
fn schedule_label(separate: bool) -> &'static str {
    if separate {
        "8 blocks x (8 steps + 1 commit forward, none after the last)"
    } else {
        "8 blocks x 8 steps, each commit in the next block's first step"
    }
}

/// Which requests step in each forward of a decode whose request `i` starts `offsets[i]`
/// forwards late and then runs the 64 steps of its 8 blocks: entry `g` lists the (member, block,
/// step) of forward `g`. All offsets 0 is lockstep; offsets `r mod 8` put the requests at
/// different steps of their blocks in every forward, as a server's requests are (a block's
/// first step, which also commits the block before, is a 64-token segment, the others 32).
fn decode_schedule(offsets: &[usize]) -> Vec<Vec<(usize, usize, usize)>> {
    let forwards = offsets.iter().max().map_or(0, |last| last + 64);
    (0..forwards)
        .map(|g| {
            offsets
                .iter()
                .enumerate()
                .filter(|&(_, &o)| (o..o + 64).contains(&g))
                .map(|(i, &o)| (i, (g - o) / 8, (g - o) % 8))
                .collect()
        })
        .collect()
}

/// The fixed-schedule decode of requests `members` (indices into `tables`, each prefilled to
/// `prefix`) on [`decode_schedule`]'s forwards for `offsets` (one per member): 8 blocks of 8
/// top-1 steps (each fixing the next 4 positions with the model's choice, and asking, as the
/// engine asks a 2.0 step, for the rows from its first masked slot to the block's end), each
/// block's K/V committed as the engine does (see [`schedule_label`]; `separate` commit forwards
/// need lockstep). Returns each member's 256 generated ids; the starting blocks depend on the
/// request's index only, so a request decodes the same work alone as in any batch, in lockstep
/// or staggered.
fn scheduled_decode(
    runner: &mut CudaRunner,
    tables: &[Vec<PageId>],
    members: &[usize],
    offsets: &[usize],
    prefix: usize,
    separate: bool,
) -> Result<Vec<Vec<u32>>, String> {
    if separate && offsets.iter().any(|&o| o != offsets[0]) {
        return Err("separate commit forwards need the requests in lockstep".into());
    }
    let tables: Vec<Vec<PageId>> = members.iter().map(|&r| tables[r].clone()).collect();
    let mut generated = vec![Vec::with_capacity(8 * 32); members.len()];
    let mut blocks = vec![Vec::new(); members.len()];
    let mut previous = vec![Vec::new(); members.len()];
    for forward in decode_schedule(offsets) {
        for &(i, b, s) in &forward {
            if s == 0 {
                let next = ids(32, 1000 + b as u64 + 97 * members[i] as u64);
                previous[i] = std::mem::replace(&mut blocks[i], next);
            }
        }
        // The engine's schedule: a block's first step also commits the block before (its final
        // ids ahead of this block in one forward), unless `separate` asks for the refresh
        // forwards on their own.
        let inputs: Vec<_> = forward
            .iter()
            .map(|&(i, b, s)| step_input(&previous[i], &blocks[i], prefix + 32 * b, b, s, separate))
            .collect();
        let segments: Vec<Segment> = forward
            .iter()
            .zip(&inputs)
            .map(|(&(i, _, _), (start, ids, rows))| Segment {
                pages: &tables[i],
                start: *start,
                ids,
                want: Want::Top1(rows.clone()),
            })
            .collect();
        let out = runner.forward_batch(&segments).map_err(err)?;
        for (&(i, _, s), o) in forward.iter().zip(out) {
            // The rows returned start at the step's first masked slot, 4 s.
            let top = o.into_top1().unwrap_or_default();
            for (j, (tok, _)) in top.iter().enumerate().take(4) {
                blocks[i][s * 4 + j] = (*tok).min(149_999);
            }
            if s == 7 {
                generated[i].extend_from_slice(&blocks[i]);
            }
        }
        // In lockstep every member ends its block in the same forward.
        if let Some(&(_, b, 7)) = forward.first() {
            if separate && b + 1 < 8 {
                let pos = prefix + 32 * b;
                let commits: Vec<Segment> = forward
                    .iter()
                    .map(|&(i, _, _)| Segment {
                        pages: &tables[i],
                        start: pos,
                        ids: &blocks[i],
                        want: Want::Nothing,
                    })
                    .collect();
                runner.forward_batch(&commits).map_err(err)?;
            }
        }
    }
    Ok(generated)
}

/// [`scheduled_decode`] in lockstep.
fn lockstep_decode(
    runner: &mut CudaRunner,
    tables: &[Vec<PageId>],
    members: &[usize],
    prefix: usize,
    separate: bool,
) -> Result<Vec<Vec<u32>>, String> {
    scheduled_decode(
        runner,
        tables,
        members,
        &vec![0; members.len()],
        prefix,
        separate,
    )
}

/// FNV-1a over token ids: a short fingerprint of what a decode generated.
fn fnv1a<'a>(tokens: impl IntoIterator<Item = &'a u32>) -> u64 {
    tokens
        .into_iter()
        .fold(0xcbf2_9ce4_8422_2325, |digest, &tok| {
            (digest ^ tok as u64).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Prints a per-stage device-time breakdown (events between stages; a few µs of overhead each).
/// One forward of `seq` without graph replay, timed stage by stage on the device.
fn profile_one(
    runner: &mut SingleSequence<CudaRunner>,
    seq: SeqId,
    ids: &[u32],
    want: Want,
) -> Result<Vec<(&'static str, f32)>, String> {
    runner
        .forward_segment(seq, ids, want, |r, segment| {
            r.profile_batch(std::slice::from_ref(segment))
        })
        .map_err(err)
}

fn print_profile(what: &str, stages: Vec<(&'static str, f32)>) {
    let total: f32 = stages.iter().map(|s| s.1).sum();
    let parts: Vec<String> = stages
        .iter()
        .map(|(l, ms)| format!("{l} {ms:.3}"))
        .collect();
    println!("profile {what}: total {total:.3} ms = {}", parts.join(", "));
}

pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let (shapes, label) = match o.preset.as_str() {
        "flash" => (flash_22(), "LLaDA2.2-flash"),
        _ => (MINI_22.to_string(), "LLaDA2.2-mini"),
    };
    let config = Config::from_json_str(&shapes, std::path::Path::new(&format!("<{label} shapes>")))
        .map_err(err)?;
    let t0 = Instant::now();
    let mut runner = SingleSequence::new(
        CudaRunner::random_with_experts(
            config.clone(),
            0,
            2201,
            o.experts,
            // A profiler replaying kernels saves the memory they write: leave it room.
            o.profile_one.then_some(12 << 30),
        )
        .map_err(err)?,
    );
    let device = runner.gpu().name().to_string();
    println!(
        "random {label} weights ({} routed experts) on {device}: {:.2} GB in {:.1} s",
        o.experts_label(),
        runner.weight_bytes() as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    let bw = copy_bandwidth(runner.gpu())?;
    println!(
        "device copy bandwidth (read + write): {:.2} TB/s",
        bw / 1e12
    );
    let peak = matmul_rate(runner.gpu())?;
    println!(
        "bf16 matrix rate (cuBLAS 8192^3, random data): {:.0} TFLOP/s",
        peak / 1e12
    );
    let mut rows: Vec<String> = vec![];

    // `--profile-one` profiles the list's first concurrency: a refinement forward unless that is
    // above 1 (the default list starts at 1, so a batched step only when asked for by name).
    let batched_profile = o.concurrency.first().copied().filter(|&n| n > 1);
    if let Some(n) = batched_profile.filter(|_| o.profile_one) {
        // One batched denoising step of the first concurrency above 1 (every request a 32-token
        // block over its own 1,024-token prefix, top-1 of every row), without a graph.
        let cuda = runner.runner_mut();
        let tables = prefill_requests(cuda, n, 1024, 8)?;
        let blocks: Vec<Vec<u32>> = (0..n).map(|r| ids(32, 5000 + r as u64)).collect();
        let segs = step(&tables, &blocks, 1024, Want::Top1(0..32));
        cuda.set_graphs(false);
        cuda.forward_batch(&segs).map_err(err)?; // warm-up
        cuda.gpu().synchronize().map_err(err)?;
        minnow_runtime::cuda::profiler(true).map_err(err)?;
        cuda.forward_batch(&segs).map_err(err)?;
        cuda.gpu().synchronize().map_err(err)?;
        minnow_runtime::cuda::profiler(false).map_err(err)?;
        println!("profiled one batched step of {n} x 32 tokens at prefix 1024");
        return Ok(());
    }
    if o.profile_one {
        let prefix = o.prefixes.first().copied().unwrap_or(1024);
        let seq = runner.create_sequence();
        runner
            .forward(seq, &ids(prefix, 7), LogitsRows::None)
            .map_err(err)?;
        runner.runner_mut().set_graphs(false);
        let block = ids(32, prefix as u64 + 1);
        // Warm-up, then the profiled forward.
        runner
            .forward_top1(seq, &block, LogitsRows::All)
            .map_err(err)?;
        runner.truncate_sequence(seq, prefix).map_err(err)?;
        runner.gpu().synchronize().map_err(err)?;
        minnow_runtime::cuda::profiler(true).map_err(err)?;
        runner
            .forward_top1(seq, &block, LogitsRows::All)
            .map_err(err)?;
        runner.gpu().synchronize().map_err(err)?;
        minnow_runtime::cuda::profiler(false).map_err(err)?;
        println!("profiled one refinement forward of 32 tokens at prefix {prefix}");
        return Ok(());
    }

    // Prefill: whole prompt in one forward, no logits.
    for &n in &o.prefill {
        let seq = runner.create_sequence();
        let prompt = ids(n, n as u64);
        let mut times = vec![];
        for rep in 0..(o.reps / 4).max(2) + 1 {
            runner.truncate_sequence(seq, 0).map_err(err)?;
            let start = Instant::now();
            runner
                .forward(seq, &prompt, LogitsRows::None)
                .map_err(err)?;
            runner.gpu().synchronize().map_err(err)?;
            if rep > 0 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        let s = median(times);
        println!("prefill {n}: {:.2} ms, {:.0} tok/s", s * 1e3, n as f64 / s);
        rows.push(format!(
            "| prefill {n} tokens | {:.2} ms | {:.0} tok/s | |",
            s * 1e3,
            n as f64 / s
        ));
        runner.truncate_sequence(seq, 0).map_err(err)?;
        print_profile(
            &format!("prefill {n}"),
            profile_one(&mut runner, seq, &prompt, Want::Nothing)?,
        );
        runner.release_sequence(seq);
    }

    // One refinement forward (32 tokens, every row's argmax + confidence) over a cached prefix.
    for &prefix in &o.prefixes {
        let seq = runner.create_sequence();
        runner
            .forward(seq, &ids(prefix, 7), LogitsRows::None)
            .map_err(err)?;
        let block = ids(32, prefix as u64 + 1);
        let bytes = refinement_bytes(&config, prefix, 32, o.expert_bytes_per_weight());
        let floor = bytes / bw;
        // A sampling step's reads: every row's F32 logits to the host (where it samples), or
        // each row's best ids and a candidate drawn on the GPU per row (temperature 0.8, with and
        // without top-p 0.95; these random-weight rows are flat, so top-p takes the draw
        // kernel's long-nucleus passes).
        let draws = |top_p: f32| -> Vec<minnow_model::RowDraw> {
            (0..32)
                .map(|row| minnow_model::RowDraw {
                    segment: 0,
                    row,
                    rule: minnow_model::DrawRule::Official,
                    temperature: 0.8,
                    top_k: 0,
                    top_p,
                    uniform: (row as f64 + 0.5) / 32.0,
                })
                .collect()
        };
        let (plain_draws, nucleus_draws) = (draws(1.0), draws(0.95));
        for (label, graphs, reads) in [
            ("graph, top-1 on GPU", true, Reads::Top1),
            ("no graph, top-1 on GPU", false, Reads::Top1),
            ("graph, F32 logits to host", true, Reads::Logits),
            ("graph, best ids", true, Reads::BestIds),
            (
                "graph, best ids + 32 draws on GPU, temperature 0.8",
                true,
                Reads::Drawn(&plain_draws),
            ),
            (
                "graph, best ids + 32 draws on GPU, temperature 0.8, top-p 0.95",
                true,
                Reads::Drawn(&nucleus_draws),
            ),
        ] {
            runner.runner_mut().set_graphs(graphs);
            let mut times = vec![];
            for rep in 0..o.reps + 3 {
                runner.truncate_sequence(seq, prefix).map_err(err)?;
                let start = Instant::now();
                match reads {
                    Reads::Top1 => {
                        runner
                            .forward_top1(seq, &block, LogitsRows::All)
                            .map_err(err)?;
                    }
                    Reads::Logits => {
                        runner.forward(seq, &block, LogitsRows::All).map_err(err)?;
                    }
                    Reads::BestIds | Reads::Drawn(_) => {
                        runner
                            .forward_one(seq, &block, Want::TopK(0..32))
                            .map_err(err)?;
                        if let Reads::Drawn(draws) = reads {
                            runner.runner_mut().draw_rows(draws).map_err(err)?;
                        }
                    }
                }
                if rep >= 3 {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
            let s = median(times);
            println!(
                "refinement 32 @ prefix {prefix} ({label}): {:.3} ms; reads >= {:.2} GB, floor {:.3} ms, ratio {:.2}",
                s * 1e3,
                bytes / 1e9,
                floor * 1e3,
                s / floor
            );
            rows.push(format!(
                "| refinement 32 tokens @ {prefix} prefix ({label}) | {:.3} ms | floor {:.3} ms ({:.2} GB at {:.2} TB/s) | {:.2}x floor |",
                s * 1e3,
                floor * 1e3,
                bytes / 1e9,
                bw / 1e12,
                s / floor
            ));
        }
        runner.truncate_sequence(seq, prefix).map_err(err)?;
        print_profile(
            &format!("refinement 32 @ prefix {prefix}"),
            profile_one(&mut runner, seq, &block, Want::Top1(0..block.len()))?,
        );
        runner.runner_mut().set_graphs(true);
        runner.release_sequence(seq);
    }

    // Decode 8 blocks after a 1024-token prompt with a fixed schedule: 8 refinement forwards
    // (top-1 readback) per block, each block's commit as the engine runs it (schedule_label).
    // Twice: the first run meets batch shapes no forward had (it captures their graphs, once
    // per process, as a server does in its first minutes; the cuBLASLt plans were all made at
    // load); the second is the steady state a serving process runs at. Both must generate the
    // same ids (a graph replays the launches it captured).
    let single_rate = {
        let seq = runner.create_sequence();
        runner
            .forward(seq, &ids(1024, 3), LogitsRows::None)
            .map_err(err)?;
        let runs = twice(&mut runner, |runner| {
            runner.truncate_sequence(seq, 1024).map_err(err)?;
            // FNV-1a over the committed blocks: A/B runs of kernels that should agree (e.g.
            // MINNOW_POOL_GEMM=0/1) can compare what the model generated, not only how fast.
            let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
            let mut forwards = 0;
            let mut previous: Vec<u32> = Vec::new();
            for b in 0..8 {
                let pos = 1024 + 32 * b as usize;
                let mut block = ids(32, 1000 + b);
                for step in 0..8 {
                    let (start, input, rows) =
                        step_input(&previous, &block, pos, b as usize, step, o.separate_commits);
                    runner.truncate_sequence(seq, start).map_err(err)?;
                    let top = runner
                        .forward_top1(seq, &input, LogitsRows::Range(rows))
                        .map_err(err)?;
                    forwards += 1;
                    // Fill 4 positions per step with the model's choice (fixed schedule; the
                    // rows returned start at the step's first masked slot).
                    for (i, (tok, _)) in top.iter().enumerate().take(4) {
                        block[step * 4 + i] = (*tok).min(149_999);
                    }
                }
                if o.separate_commits && b + 1 < 8 {
                    runner.truncate_sequence(seq, pos).map_err(err)?;
                    runner.forward(seq, &block, LogitsRows::None).map_err(err)?;
                    forwards += 1;
                }
                for &tok in &block {
                    digest = (digest ^ tok as u64).wrapping_mul(0x0100_0000_01b3);
                }
                previous = block;
            }
            Ok((digest, forwards))
        })?;
        for (run, &(s, captured, (digest, forwards))) in runs.iter().enumerate() {
            let label = decode_run_label(run, captured);
            println!(
                "decode ({}) after 1024 prompt, {label}: {:.2} ms, {:.0} tok/s (tokens digest {digest:016x})",
                schedule_label(o.separate_commits),
                s * 1e3,
                256.0 / s
            );
            rows.push(format!(
                "| decode {}, 1024 prompt, {label} | {:.2} ms | {:.0} generated tok/s | {:.3} ms per forward |",
                schedule_label(o.separate_commits),
                s * 1e3,
                256.0 / s,
                s * 1e3 / forwards as f64
            ));
        }
        let (first, warm) = (runs[0].2 .0, runs[1].2 .0);
        if first != warm {
            return Err(format!(
                "one request's decode generated other ids when run again (digests {first:016x} / {warm:016x})"
            ));
        }
        (256.0 / runs[0].0, 256.0 / runs[1].0)
    };

    // Printed before any mismatch fails the command, so the numbers are never lost.
    let mut runner = runner.into_inner();
    let invariance = batched_benchmarks(&mut runner, &o, bw, peak, single_rate, &mut rows);

    println!();
    println!(
        "device: {device}; commit: {}; command: cargo xtask bench {}",
        o.commit,
        args.join(" ")
    );
    println!("| measurement | time | rate / floor | note |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| device copy bandwidth | | {:.2} TB/s | 1 GiB D2D copy, read + write |",
        bw / 1e12
    );
    println!(
        "| bf16 matrix rate | | {:.0} TFLOP/s | cuBLAS 8192^3, random data |",
        peak / 1e12
    );
    for r in rows {
        println!("{r}");
    }
    invariance
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steps_serial_floor_adds_its_phases_and_is_never_below_the_floor() {
        let c = Config::from_json_str(MINI_22, std::path::Path::new("mini")).unwrap();
        // Every one of the 19 MoE layers uses all 256 experts (a batch of 64 blocks).
        let cost = batched_step_cost(&c, 64, 1024, &[256; 19], 2.0);
        let (bw, peak) = (4.17e12, 798e12);
        // The H200's figures: the experts stream ~30 GB; the lm_head alone is 1.32 TFLOP.
        assert!((cost.experts.bytes / 1e9 - 30.7).abs() < 0.1, "{cost:?}");
        assert!(cost.dense.flops > 2.048e3 * 2.0 * 157_184.0 * 2048.0);
        let phases = cost.experts.seconds(bw, peak)
            + cost.dense.seconds(bw, peak)
            + cost.attention.seconds(bw, peak);
        assert_eq!(cost.serial_floor(bw, peak), phases);
        assert!(cost.serial_floor(bw, peak) > cost.floor(bw, peak));
        // The experts are bound by their bytes, the dense GEMMs by their products.
        assert!(cost.experts.bytes / bw > cost.experts.flops / peak);
        assert!(cost.dense.flops / peak > cost.dense.bytes / bw);
        // One request alone: the floor and the serial floor are the same bytes, phase by phase.
        let one = batched_step_cost(&c, 1, 1024, &[48; 19], 2.0);
        let bytes_only = one.experts.bytes / bw + one.dense.bytes / bw + one.attention.bytes / bw;
        assert!((one.serial_floor(bw, peak) - bytes_only).abs() < 1e-12);
        assert!((one.floor(bw, peak) - bytes_only).abs() < 1e-12);
    }

    #[test]
    fn a_staggered_schedule_runs_every_step_of_every_request_once_in_order() {
        let offsets = [0, 1, 7, 3];
        let forwards = decode_schedule(&offsets);
        assert_eq!(forwards.len(), 7 + 64);
        for (i, &o) in offsets.iter().enumerate() {
            let steps: Vec<(usize, usize, usize)> = forwards
                .iter()
                .enumerate()
                .filter_map(|(g, f)| f.iter().find(|e| e.0 == i).map(|&(_, b, s)| (g, b, s)))
                .collect();
            let expected: Vec<(usize, usize, usize)> =
                (0..64).map(|k| (o + k, k / 8, k % 8)).collect();
            assert_eq!(steps, expected, "request {i}");
        }
        // In lockstep every forward holds every request at the same step.
        let lockstep = decode_schedule(&[0; 5]);
        assert_eq!(lockstep.len(), 64);
        assert!(lockstep
            .iter()
            .all(|f| f.len() == 5 && f.iter().all(|e| e.1 == f[0].1 && e.2 == f[0].2)));
        // Staggered by r mod 8, a full forward mixes every step of a block.
        let mixed = decode_schedule(&(0..16).map(|r| r % 8).collect::<Vec<_>>());
        let steps: std::collections::BTreeSet<usize> = mixed[10].iter().map(|e| e.2).collect();
        assert_eq!(steps.len(), 8);
    }

    #[test]
    fn the_flash_preset_is_mini_at_flash_widths() {
        let flash = Config::from_json_str(&flash_22(), std::path::Path::new("flash")).unwrap();
        let mini = Config::from_json_str(MINI_22, std::path::Path::new("mini")).unwrap();
        assert_eq!(
            (
                flash.hidden_size,
                flash.num_hidden_layers,
                flash.moe_intermediate_size
            ),
            (4096, 32, 1024)
        );
        assert_eq!(flash.num_attention_heads, 32);
        assert_eq!(flash.num_experts, mini.num_experts);
        assert_eq!(flash.expert_capacity, Some(48));
    }
}

/// What a timed refinement forward reads back.
#[derive(Clone, Copy)]
enum Reads<'a> {
    Top1,
    Logits,
    BestIds,
    /// Best ids, then these draws on the GPU (random weights: flat rows, whose top-p nucleus
    /// is long).
    Drawn(&'a [minnow_model::RowDraw]),
}
