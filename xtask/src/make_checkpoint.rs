//! `cargo xtask make-checkpoint --out DIR|FILE.mnw --preset P [--family 2.0|2.1|2.2]
//! [--layers N] [--seed S] [--experts bf16|int8|int4|nvfp4|fp8] [--shard-gib G] [--workers N]`:
//! a random-weight LLaDA2 checkpoint at real shapes. For benchmarks and loader tests at scale;
//! the weights are random, so is any text.
//!
//! - `--out DIR`: the Hugging Face layout (config.json, generation_config.json, sharded BF16
//!   safetensors with model.safetensors.index.json); BF16 experts only.
//! - `--out FILE.mnw`: one `.mnw` written directly (`make_checkpoint/mnw.rs`), its routed experts
//!   in `--experts`' encoding, with the assets `serve` needs (the tiny fixtures' tokenizer and
//!   chat template).
//!
//! Presets: `mini-2layer` (the CPU benchmark model: real mini shapes, layer 0 dense, layer 1
//! MoE; ≈1.5B parameters), `mini` (20 layers, ≈16B), `flash-2layer` (flash widths, 2 layers),
//! `flash` (32 layers, ≈100B), `tiny` (the shapes of tests/fixtures: vocabulary 512, hidden 64,
//! 16 experts; for quick tests of the whole path).
//! Weights are uniform with the standard deviations of the tiny fixtures' generator scaled to
//! the width (projections 1/√fan_in, embeddings 1, norms 1 ± 0.1, expert_bias 0.1); `expert_bias`
//! is stored BF16 for 2.0 and F32 otherwise, like the real checkpoints. Every tensor's values
//! are one stream of its own (seeded by `--seed` and its name), whatever the container.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use clap::Parser;
use minnow_model::schema::{self, Role};
use rayon::prelude::*;

mod mnw;

#[derive(Parser, Debug)]
#[command(name = "make-checkpoint")]
struct Args {
    /// Output directory (created; must be empty or absent), or a new FILE.mnw.
    #[arg(long)]
    out: PathBuf,
    /// mini-2layer, mini, flash-2layer, flash or tiny.
    #[arg(long, default_value = "mini-2layer")]
    preset: String,
    /// 2.0, 2.1 or 2.2 (2.2: block routing with expert_capacity 48, rope_theta 3e6).
    #[arg(long, default_value = "2.1")]
    family: String,
    /// Override the number of layers (layer 0 stays dense).
    #[arg(long)]
    layers: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Target shard size in GiB (a directory's safetensors shards).
    #[arg(long, default_value_t = 2.0)]
    shard_gib: f64,
    /// The routed experts' encoding: bf16, or (in a .mnw only) int8, int4 (`i8_mma`, `i4_mma`,
    /// groups of 128), nvfp4 or fp8.
    #[arg(long, default_value = "bf16")]
    experts: String,
    /// Threads writing a .mnw (default: every core, at most 64).
    #[arg(long)]
    workers: Option<usize>,
}

impl Args {
    /// Whether `--out` names a `.mnw` file rather than a directory.
    fn writes_mnw(&self) -> bool {
        self.out.extension().is_some_and(|e| e == "mnw")
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let args = Args::try_parse_from(
        std::iter::once("make-checkpoint".to_string()).chain(args.iter().cloned()),
    )
    .map_err(|e| e.to_string())?;
    let config = config_for(&args)?;
    if args.writes_mnw() {
        return mnw::write(&args, config);
    }
    if args.experts != "bf16" {
        return Err(format!(
            "--experts {} needs a .mnw output (--out FILE.mnw); a safetensors directory holds \
             BF16 experts only",
            args.experts
        ));
    }
    if args.out.exists()
        && std::fs::read_dir(&args.out)
            .map_err(|e| format!("{}: {e}", args.out.display()))?
            .next()
            .is_some()
    {
        return Err(format!("{} exists and is not empty", args.out.display()));
    }
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    write_json(&args.out.join("config.json"), &config)?;
    write_json(
        &args.out.join("generation_config.json"),
        &serde_json::json!({"bos_token_id": 156891, "eos_token_id": 156892, "pad_token_id": 156892, "mask_token_id": 156895}),
    )?;
    let tensors = tensor_list(&config, &args.family)?;
    let total: usize = tensors.iter().map(|t| t.bytes()).sum();
    let shard_bytes = (args.shard_gib * (1u64 << 30) as f64) as usize;
    let shards = split(&tensors, shard_bytes);
    let mut weight_map = serde_json::Map::new();
    let started = std::time::Instant::now();
    let named: Vec<(String, &[Spec])> = shards
        .iter()
        .enumerate()
        .map(|(i, shard)| {
            let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards.len());
            for t in shard.iter() {
                weight_map.insert(t.name.clone(), file.clone().into());
            }
            (file, *shard)
        })
        .collect();
    write_shards(&args.out, &named, args.seed, JOB_ELEMENTS)?;
    write_json(
        &args.out.join("model.safetensors.index.json"),
        &serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
    )?;
    let params: usize = tensors.iter().map(|t| t.numel()).sum();
    eprintln!(
        "{}: {:.3}B parameters, {:.2} GiB in {} shards, {:.1} s",
        args.out.display(),
        params as f64 / 1e9,
        total as f64 / (1u64 << 30) as f64,
        shards.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
}

/// config.json for a preset and family, with the real checkpoints' keys and values.
fn config_for(args: &Args) -> Result<serde_json::Value, String> {
    let (hidden, inter, moe_inter, layers, heads) = match args.preset.as_str() {
        "mini-2layer" => (2048, 5120, 512, 2, 16),
        "mini" => (2048, 5120, 512, 20, 16),
        "flash-2layer" => (4096, 9216, 1024, 2, 32),
        "flash" => (4096, 9216, 1024, 32, 32),
        "tiny" => (64, 128, 32, 2, 4),
        p => {
            return Err(format!(
                "unknown preset '{p}' (mini-2layer, mini, flash-2layer, flash, tiny)"
            ))
        }
    };
    let layers = args.layers.unwrap_or(layers);
    if layers == 0 {
        return Err("--layers must be at least 1".into());
    }
    let mut c = serde_json::json!({
        "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
        "vocab_size": 157184, "hidden_size": hidden, "intermediate_size": inter,
        "moe_intermediate_size": moe_inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": 4, "head_dim": 128,
        "hidden_act": "silu", "num_experts": 256, "num_experts_per_tok": 8,
        "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 8, "topk_group": 4,
        "routed_scaling_factor": 2.5, "score_function": "sigmoid", "norm_topk_prob": true,
        "moe_router_enable_expert_bias": true, "router_dtype": "fp32", "use_qk_norm": true,
        "use_qkv_bias": false, "use_bias": false, "use_rmsnorm": true, "norm_head": false,
        "partial_rotary_factor": 0.5, "rotary_dim": 64, "rope_theta": 600000,
        "rope_scaling": null, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false, "use_sliding_window": false, "sliding_window": 4096,
        "max_window_layers": 28, "pad_token_id": 156892, "eos_token_id": 156892,
        "torch_dtype": "bfloat16", "use_cache": true
    });
    let o = c.as_object_mut().expect("object");
    match args.family.as_str() {
        "2.0" | "2.1" => {}
        "2.2" => {
            o.insert("rope_theta".into(), 3000000.into());
            o.insert("max_position_embeddings".into(), 131072.into());
            o.insert(
                "rope_parameters".into(),
                serde_json::json!({"rope_type": "default", "rope_theta": 3000000, "partial_rotary_factor": 0.5}),
            );
            o.insert("block_size".into(), 32.into());
            o.insert("expert_capacity".into(), 48.into());
            o.insert("delete_token_id".into(), 156930.into());
            o.insert("split_token_id".into(), 156931.into());
        }
        f => return Err(format!("unknown family '{f}' (2.0, 2.1, 2.2)")),
    }
    if args.preset == "tiny" {
        // The rest of tests/fixtures' shapes (their README): small enough for a unit test.
        for (key, value) in [
            ("vocab_size", 512),
            ("num_key_value_heads", 2),
            ("head_dim", 16),
            ("rotary_dim", 8),
            ("num_experts", 16),
            ("num_experts_per_tok", 4),
            ("n_group", 4),
            ("topk_group", 2),
            ("max_position_embeddings", 512),
            ("max_window_layers", 2),
        ] {
            o.insert(key.into(), value.into());
        }
        if o.contains_key("expert_capacity") {
            o.insert("expert_capacity".into(), 6.into());
        }
    }
    Ok(c)
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy)]
enum Init {
    /// Uniform with this standard deviation.
    Std(f32),
    /// 1 + uniform with std 0.1 (RMSNorm weights).
    Norm,
}

struct Spec {
    name: String,
    shape: Vec<usize>,
    f32: bool,
    init: Init,
}

impl Spec {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    fn bytes(&self) -> usize {
        self.numel() * if self.f32 { 4 } else { 2 }
    }

    /// The tensor's values from element `first` on, in F32 before rounding to the stored type.
    /// Each tensor has its own stream, so its values do not depend on the sharding or the
    /// container; the stream is jumped to `first`, so they do not depend on how the writing is
    /// cut into jobs either.
    fn draw(&self, seed: u64, first: usize) -> impl Iterator<Item = f32> {
        let mut rng = SplitMix::at(seed ^ fnv1a(&self.name), first as u64);
        let (std, base) = match self.init {
            Init::Std(s) => (s, 0.0),
            Init::Norm => (0.1, 1.0),
        };
        // Uniform on [-√3σ, √3σ] has standard deviation σ.
        let half_width = std * 3f32.sqrt();
        std::iter::repeat_with(move || base + half_width * rng.unit())
    }

    /// Writes elements `first..first + count` in the stored type (F32 or BF16, little-endian).
    fn stored_bytes(&self, seed: u64, first: usize, count: usize, buf: &mut Vec<u8>) {
        let values = self.draw(seed, first);
        if self.f32 {
            buf.resize(count * 4, 0);
            for (out, v) in buf.chunks_exact_mut(4).zip(values) {
                out.copy_from_slice(&v.to_le_bytes());
            }
        } else {
            buf.resize(count * 2, 0);
            for (out, v) in buf.chunks_exact_mut(2).zip(values) {
                out.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
        }
    }
}

/// Every tensor of the config (`minnow_model::schema`), in checkpoint order.
fn tensor_list(c: &serde_json::Value, family: &str) -> Result<Vec<Spec>, String> {
    let config = minnow_model::Config::from_json_str(&c.to_string(), Path::new("config.json"))
        .map_err(|e| e.to_string())?;
    Ok(schema::tensors(&config)
        .into_iter()
        .map(|t| {
            let shape = t.shape(&config);
            let init = match t.role() {
                Role::Embedding => Init::Std(1.0),
                Role::Norm => Init::Norm,
                Role::RouterBias => Init::Std(0.1),
                // Matrices: 1/√fan_in, the fan-in being the `[out, in]` shape's second entry.
                _ => Init::Std(1.0 / (shape[1] as f32).sqrt()),
            };
            Spec {
                name: t.name(),
                shape,
                f32: t.role() == Role::RouterBias && family != "2.0",
                init,
            }
        })
        .collect())
}

/// Consecutive groups of tensors of about `max_bytes` each.
fn split(tensors: &[Spec], max_bytes: usize) -> Vec<&[Spec]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, t) in tensors.iter().enumerate() {
        if bytes > 0 && bytes + t.bytes() > max_bytes {
            out.push(&tensors[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += t.bytes();
    }
    out.push(&tensors[start..]);
    out
}

/// Elements generated per job: one job is one write of at most 16 MiB (8 MiB for BF16).
const JOB_ELEMENTS: usize = 4 << 20;

/// A run of consecutive elements of one tensor, and where their bytes go.
struct Job<'a> {
    file: &'a std::fs::File,
    path: &'a Path,
    spec: &'a Spec,
    seed: u64,
    /// Index of the first element within the tensor.
    first: usize,
    count: usize,
    /// Byte offset of the first element in the file.
    offset: u64,
}

/// Writes every shard: each file gets its header and its final length first, then jobs of
/// `job_elements` values ([`JOB_ELEMENTS`]) from every shard are generated and written on all
/// cores (each job at its own offset, so the order they finish in does not matter).
fn write_shards(
    out: &Path,
    shards: &[(String, &[Spec])],
    seed: u64,
    job_elements: usize,
) -> Result<(), String> {
    let mut files = Vec::new();
    for (name, tensors) in shards {
        let path = out.join(name);
        let (file, data_start) = create_shard(&path, tensors)?;
        files.push((path, file, data_start));
    }
    let mut jobs = Vec::new();
    for ((path, file, data_start), (_, tensors)) in files.iter().zip(shards) {
        let mut offset = *data_start;
        for spec in tensors.iter() {
            let size = spec.bytes() / spec.numel().max(1);
            for first in (0..spec.numel()).step_by(job_elements) {
                let count = job_elements.min(spec.numel() - first);
                jobs.push(Job {
                    file,
                    path,
                    spec,
                    seed,
                    first,
                    count,
                    offset: offset + (first * size) as u64,
                });
            }
            offset += spec.bytes() as u64;
        }
    }
    jobs.par_iter()
        .try_for_each_init(Vec::new, |buf, job| job.run(buf))
}

/// Creates a shard file with its safetensors header, sized to hold every tensor's data.
/// Returns the file and the offset where the data starts.
fn create_shard(path: &Path, tensors: &[Spec]) -> Result<(std::fs::File, u64), String> {
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for t in tensors {
        header.insert(
            t.name.clone(),
            serde_json::json!({
                "dtype": if t.f32 { "F32" } else { "BF16" },
                "shape": t.shape,
                "data_offsets": [offset, offset + t.bytes()],
            }),
        );
        offset += t.bytes();
    }
    let mut text = serde_json::to_string(&header).map_err(|e| e.to_string())?;
    // Pad the header so the data starts 8-byte aligned, as the reference writer does.
    while (8 + text.len()) % 8 != 0 {
        text.push(' ');
    }
    let mut file = std::fs::File::create_new(path).map_err(io)?;
    file.write_all(&(text.len() as u64).to_le_bytes())
        .map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)?;
    let data_start = (8 + text.len()) as u64;
    file.set_len(data_start + offset as u64).map_err(io)?;
    Ok((file, data_start))
}

impl Job<'_> {
    /// Generates this job's values into `buf` and writes them at the job's offset.
    fn run(&self, buf: &mut Vec<u8>) -> Result<(), String> {
        self.spec
            .stored_bytes(self.seed, self.first, self.count, buf);
        self.file
            .write_all_at(buf, self.offset)
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

/// SplitMix64: small, fast and good enough for random weights. Its state advances by a
/// constant per value, so any position of a stream can be reached in one step.
struct SplitMix(u64);

const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix {
    /// The stream seeded with `seed`, positioned before its value number `index`.
    fn at(seed: u64, index: u64) -> Self {
        SplitMix(seed.wrapping_add(index.wrapping_mul(SPLITMIX_GAMMA)))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(SPLITMIX_GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every preset and family yields a config minnow parses and exactly the tensors it expects,
    /// with the right family detected (2.0 from its BF16 expert_bias).
    #[test]
    fn presets_match_what_the_loader_expects() {
        for preset in ["mini-2layer", "mini", "flash-2layer", "flash", "tiny"] {
            for (family, want) in [("2.0", "2.0"), ("2.1", "2.1"), ("2.2", "2.2")] {
                let args = Args::try_parse_from([
                    "make-checkpoint",
                    "--out",
                    "/unused",
                    "--preset",
                    preset,
                    "--family",
                    family,
                ])
                .unwrap();
                let json = config_for(&args).unwrap();
                let mut c = minnow_model::Config::from_json_str(
                    &json.to_string(),
                    Path::new("config.json"),
                )
                .unwrap();
                let tensors = tensor_list(&json, family).unwrap();
                let specs = mnw::Shapes::new(&tensors);
                minnow_model::weights::validate(&c, &specs).unwrap();
                c.refine_family(minnow_model::weights::expert_bias_dtype(&c, &specs));
                assert_eq!(c.family.version(), want, "{preset} {family}");
            }
        }
        let args = Args::try_parse_from(["m", "--out", "/x", "--preset", "huge"]).unwrap();
        assert!(config_for(&args).is_err());
    }

    /// The values of one tensor's stream, drawn one after another from its start (how the
    /// single-threaded writer drew them).
    fn sequential(spec: &Spec, seed: u64) -> Vec<u8> {
        let mut rng = SplitMix(seed ^ fnv1a(&spec.name));
        let (std, base) = match spec.init {
            Init::Std(s) => (s, 0.0),
            Init::Norm => (0.1, 1.0),
        };
        let half_width = std * 3f32.sqrt();
        let mut out = Vec::new();
        for _ in 0..spec.numel() {
            let v = base + half_width * rng.unit();
            if spec.f32 {
                out.extend_from_slice(&v.to_le_bytes());
            } else {
                out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
        }
        out
    }

    /// Jobs that split tensors at any element give the bytes of one sequential stream per
    /// tensor, in a file the safetensors reader opens.
    #[test]
    fn parallel_jobs_write_each_tensors_sequential_stream() {
        let specs = vec![
            Spec {
                name: "a".into(),
                shape: vec![7, 5],
                f32: false,
                init: Init::Std(0.5),
            },
            Spec {
                name: "b".into(),
                shape: vec![11],
                f32: true,
                init: Init::Std(0.1),
            },
            Spec {
                name: "c".into(),
                shape: vec![9],
                f32: false,
                init: Init::Norm,
            },
        ];
        let shards = split(&specs, 80);
        assert_eq!(shards.len(), 2);
        let named: Vec<(String, &[Spec])> = shards
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("s{i}.safetensors"), *s))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        // 3 values per job: jobs end inside tensors and tensors end inside jobs' spans.
        write_shards(dir.path(), &named, 42, 3).unwrap();
        for (file, tensors) in &named {
            let bytes = std::fs::read(dir.path().join(file)).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for spec in tensors.iter() {
                let view = st.tensor(&spec.name).unwrap();
                assert_eq!(view.shape(), spec.shape.as_slice());
                assert_eq!(
                    view.data(),
                    sequential(spec, 42).as_slice(),
                    "{}",
                    spec.name
                );
            }
        }
        // Another seed, other values.
        assert_ne!(sequential(&specs[0], 42), sequential(&specs[0], 43));
        // A second run refuses to overwrite the shards.
        assert!(write_shards(dir.path(), &named, 42, 3).is_err());
    }

    #[test]
    fn shards_split_by_size_and_keep_order() {
        let specs: Vec<Spec> = (0..5)
            .map(|i| Spec {
                name: format!("t{i}"),
                shape: vec![10],
                f32: false,
                init: Init::Norm,
            })
            .collect();
        let shards = split(&specs, 45);
        let names: Vec<Vec<&str>> = shards
            .iter()
            .map(|s| s.iter().map(|t| t.name.as_str()).collect())
            .collect();
        assert_eq!(names, vec![vec!["t0", "t1"], vec!["t2", "t3"], vec!["t4"]]);
    }
}
