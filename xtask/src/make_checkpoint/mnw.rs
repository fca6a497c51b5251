//! `make-checkpoint --out FILE.mnw`: the random checkpoint written straight into one `.mnw`,
//! its routed experts already in `--experts`' encoding; no BF16 checkpoint is written first.
//!
//! The layout is `minnow convert`'s: the same plan (`minnow_format::mnw::convert::plan` over the
//! tensors' shapes) and the same parallel writer (`minnow_format::mnw::planned`), each tensor's
//! regions filled by a worker from the tensor's own random stream:
//! - other tensors: their BF16 (F32 for `expert_bias` of 2.1/2.2) values, exactly the bytes the
//!   safetensors directory of the same seed holds;
//! - routed experts: one band of rows at a time (at most `BAND_BYTES` of F32 per worker) drawn
//!   from the stream, rounded as the directory stores them, and quantized by the converter's
//!   own encoder, so the codes and scales are the ones `minnow convert --experts E` writes from
//!   that directory (a test checks it), never held as a whole BF16 matrix.
//!
//! The file carries what `serve` reads besides the weights: `config.json`,
//! `generation_config.json`, and the tiny fixtures' `tokenizer.json` and chat template (no
//! full-size tokenizer ships with the repository). Their 493 tokens are ids of every preset's
//! vocabulary, so the config's special ids are moved to the fixtures' (bos 480, eos/pad 481,
//! mask 482, delete 486, split 487); a generated id past the tokenizer decodes to no text.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use half::bf16;
use minnow_format::mnw::convert::{plan, ConvertOptions, ExpertChoice, QuantLayout, BAND_BYTES};
use minnow_format::mnw::planned::{
    write_planned, Digests, ModelText, PlannedTensor, Stage, Summary, TensorOutput, Workers,
};
use minnow_format::{FormatError, TensorRef, TensorSource};
use minnow_model::schema;
use minnow_runtime::quant::{global_scale_for, quantize_rows, Encoding, QuantEncoding, ROW_BAND};
use minnow_runtime::DType;

use super::{tensor_list, Args, Spec, JOB_ELEMENTS};

/// The tiny fixtures' tokenizer and the chat template of their `tokenizer_config.json`.
const FIXTURE_TOKENIZER: &str =
    include_str!("../../../tests/fixtures/llada2-tiny-v21/tokenizer.json");
const FIXTURE_TOKENIZER_CONFIG: &str =
    include_str!("../../../tests/fixtures/llada2-tiny-v21/tokenizer_config.json");

/// The fixtures' special ids (tests/fixtures/README.md).
const FIXTURE_IDS: [(&str, u32); 3] = [
    ("bos_token_id", 480),
    ("eos_token_id", 481),
    ("pad_token_id", 481),
];
const FIXTURE_MASK_ID: u32 = 482;
const FIXTURE_EDIT_IDS: [(&str, u32); 2] = [("delete_token_id", 486), ("split_token_id", 487)];

/// What `--experts` names.
fn expert_choice(name: &str) -> Result<ExpertChoice, String> {
    Ok(match name {
        "bf16" => ExpertChoice::Original,
        "int8" => ExpertChoice::Int8,
        "int4" => ExpertChoice::Int4,
        "nvfp4" => ExpertChoice::Nvfp4,
        "fp8" => ExpertChoice::Fp8,
        other => {
            return Err(format!(
                "unknown --experts '{other}' (bf16, int8, int4, nvfp4, fp8)"
            ))
        }
    })
}

/// Writes the checkpoint of `args` with `config` as `args.out` (a new `.mnw`).
pub(super) fn write(args: &Args, mut config: serde_json::Value) -> Result<(), String> {
    let experts = expert_choice(&args.experts)?;
    let assets = assets(&mut config)?;
    let tensors = tensor_list(&config, &args.family)?;
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(64)
    });
    let model_id = format!(
        "random {} LLaDA{} weights (cargo xtask make-checkpoint, seed {})",
        args.preset, args.family, args.seed
    );
    let started = Instant::now();
    let summary = write_file(
        &tensors,
        &args.out,
        experts,
        args.seed,
        &ModelText {
            model_id: &model_id,
            assets: &assets,
        },
        workers,
    )
    .map_err(|e| e.to_string())?;
    let params: usize = tensors.iter().map(Spec::numel).sum();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let parts: Vec<String> = summary
        .per_encoding
        .iter()
        .map(|(name, (count, bytes))| format!("{count} tensors in {name} {:.2} GiB", gib(*bytes)))
        .collect();
    let t = &summary.timings;
    eprintln!(
        "{}: {:.3}B parameters, {:.2} GiB ({}), {:.1} s ({:.1} s generating and writing, {:.1} s \
         waiting for the disk, {:.1} s verifying; {workers} workers)",
        args.out.display(),
        params as f64 / 1e9,
        gib(summary.file_bytes),
        parts.join(", "),
        started.elapsed().as_secs_f64(),
        t.writing.as_secs_f64(),
        t.sync.as_secs_f64(),
        t.verifying.as_secs_f64(),
    );
    for note in &summary.notes {
        eprintln!("note: {note}");
    }
    Ok(())
}

/// The text files of the `.mnw`: the config with the fixtures' special ids, its generation
/// config, the fixtures' tokenizer and chat template.
fn assets(config: &mut serde_json::Value) -> Result<BTreeMap<String, String>, String> {
    let o = config.as_object_mut().expect("config_for makes an object");
    for (key, id) in FIXTURE_IDS {
        o.insert(key.into(), id.into());
    }
    for (key, id) in FIXTURE_EDIT_IDS {
        // Only 2.2 configs name edit tokens.
        if o.contains_key(key) {
            o.insert(key.into(), id.into());
        }
    }
    let mut generation = serde_json::json!({ "mask_token_id": FIXTURE_MASK_ID });
    for (key, id) in FIXTURE_IDS {
        generation[key] = id.into();
    }
    let tokenizer_config: serde_json::Value =
        serde_json::from_str(FIXTURE_TOKENIZER_CONFIG).map_err(|e| e.to_string())?;
    let template = tokenizer_config["chat_template"]
        .as_str()
        .ok_or("the fixture's tokenizer_config.json has no chat_template")?;
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).map(|t| t + "\n");
    Ok(BTreeMap::from([
        (
            "config.json".to_string(),
            pretty(config).map_err(|e| e.to_string())?,
        ),
        (
            "generation_config.json".to_string(),
            pretty(&generation).map_err(|e| e.to_string())?,
        ),
        ("tokenizer.json".to_string(), FIXTURE_TOKENIZER.to_string()),
        ("chat_template.jinja".to_string(), template.to_string()),
    ]))
}

/// Plans and writes the file: `experts` encodes the routed experts (mma layouts, default group
/// sizes, as `minnow convert` would), every other tensor keeps its stored type.
fn write_file(
    tensors: &[Spec],
    out: &Path,
    experts: ExpertChoice,
    seed: u64,
    text: &ModelText<'_>,
    workers: usize,
) -> minnow_format::Result<Summary> {
    let shapes = Shapes::new(tensors);
    let options = ConvertOptions {
        experts,
        layout: QuantLayout::Mma,
        group_size: None,
        workers,
        rules: Vec::new(),
    };
    let plan = plan(&shapes, &schema::routed_expert_family, &options)?;
    let specs: HashMap<&str, &Spec> = tensors.iter().map(|s| (s.name.as_str(), s)).collect();
    let cancel = AtomicBool::new(false);
    write_planned(
        &plan,
        out,
        text,
        &Workers {
            count: workers,
            cancel: &cancel,
            progress: &|_: Stage, _, _| {},
        },
        &|output, t| fill(output, t, specs[t.name.as_str()], seed),
        &|_| {},
    )
}

/// Writes one tensor's regions from its random stream.
fn fill(
    output: &TensorOutput<'_>,
    t: &PlannedTensor,
    spec: &Spec,
    seed: u64,
) -> minnow_format::Result<Digests> {
    let Encoding::Quant(q) = t.target else {
        let mut data = output.data(t);
        let mut buf = Vec::new();
        for first in (0..spec.numel()).step_by(JOB_ELEMENTS) {
            spec.stored_bytes(
                seed,
                first,
                JOB_ELEMENTS.min(spec.numel() - first),
                &mut buf,
            );
            data.write(&buf)?;
        }
        return Ok(Digests {
            data: data.finish()?,
            scales: None,
            global_scale: None,
        });
    };
    let (rows, cols) = (t.shape[0], t.shape[1]);
    // Whole 128-row bands, as the converter cuts them (the bytes do not depend on the cut).
    let band = (BAND_BYTES / (cols.max(1) * 4) / ROW_BAND).max(1) * ROW_BAND;
    let mut values = vec![0.0f32; band.min(rows) * cols];
    // The values the directory of the same seed stores (rounded to BF16 unless F32).
    let stored = |first: usize, out: &mut [f32]| {
        for (o, v) in out.iter_mut().zip(spec.draw(seed, first)) {
            *o = if spec.f32 {
                v
            } else {
                bf16::from_f32(v).to_f32()
            };
        }
    };
    let global = (q == QuantEncoding::Nvfp4).then(|| {
        // NVFP4's per-matrix scale needs the largest magnitude first: one more pass over the
        // stream (drawing is cheap next to keeping the matrix).
        let mut max_abs = 0.0f32;
        for r0 in (0..rows).step_by(band) {
            let n = band.min(rows - r0) * cols;
            stored(r0 * cols, &mut values[..n]);
            max_abs = values[..n].iter().fold(max_abs, |m, v| m.max(v.abs()));
        }
        global_scale_for(q, max_abs)
    });
    let mut codes = output.data(t);
    let mut scales = output.scales(t).expect("quantized tensors have scales");
    for r0 in (0..rows).step_by(band) {
        let n = band.min(rows - r0) * cols;
        stored(r0 * cols, &mut values[..n]);
        let qz =
            quantize_rows(q, n / cols, cols, t.group_size, &values[..n], global).map_err(|e| {
                FormatError::Invalid {
                    path: PathBuf::from(&t.name),
                    message: format!("cannot quantize (rows from {r0}): {e}"),
                }
            })?;
        codes.write(&qz.codes)?;
        scales.write(&qz.scales)?;
    }
    Ok(Digests {
        data: codes.finish()?,
        scales: Some(scales.finish()?),
        global_scale: global,
    })
}

/// The tensors' names, types and shapes without data: what the converter's plan reads.
pub(super) struct Shapes<'a> {
    specs: Vec<&'a Spec>,
}

impl<'a> Shapes<'a> {
    pub(super) fn new(tensors: &'a [Spec]) -> Self {
        let mut specs: Vec<&Spec> = tensors.iter().collect();
        // `TensorSource::names` is sorted (the file's region order).
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        Shapes { specs }
    }
}

impl TensorSource for Shapes<'_> {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        let i = self
            .specs
            .binary_search_by(|s| s.name.as_str().cmp(name))
            .ok()?;
        let s = self.specs[i];
        Some(TensorRef {
            dtype: Some(if s.f32 { DType::F32 } else { DType::BF16 }),
            dtype_name: if s.f32 { "F32" } else { "BF16" },
            shape: &s.shape,
            data: &[],
            quant: None,
        })
    }
    fn names(&self) -> Vec<&str> {
        self.specs.iter().map(|s| s.name.as_str()).collect()
    }
    fn describe(&self) -> String {
        "the random checkpoint's tensors".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minnow_engine::{
        ChatMessage, ChatPrompt, DecodeParams, DeviceRequest, Engine, EngineOptions, Event,
        GenerateRequest,
    };
    use minnow_format::mnw::convert::{convert, ConvertInput};
    use minnow_format::MnwFile;

    fn make(out: &Path, family: &str, experts: &str) {
        let args: Vec<String> = [
            "--out",
            out.to_str().unwrap(),
            "--preset",
            "tiny",
            "--family",
            family,
            "--seed",
            "7",
            "--experts",
            experts,
            "--workers",
            "3",
        ]
        .map(String::from)
        .to_vec();
        super::super::run(&args).unwrap();
    }

    /// `minnow convert --experts E` of the safetensors directory of the same preset and seed.
    /// (With `like`'s assets, which a directory without tokenizer lacks.)
    fn converted(dir: &Path, out: &Path, experts: ExpertChoice, like: &MnwFile) -> MnwFile {
        let (_, source) = minnow_model::checkpoint::open(dir).unwrap();
        let assets = like.manifest().assets.iter();
        let input = ConvertInput {
            source: &source,
            expert_families: &schema::routed_expert_family,
            assets: assets.map(|(k, v)| (k.clone(), v.0.clone())).collect(),
            model_id: "reference".into(),
        };
        let options = ConvertOptions {
            experts,
            workers: 2,
            ..Default::default()
        };
        convert(&input, out, &options, &AtomicBool::new(false), &|_, _| {}).unwrap();
        MnwFile::open(out).unwrap()
    }

    /// A quantized tiny `.mnw` (int4, int8, nvfp4, fp8; the three families) validates, holds exactly what `minnow convert` makes of the BF16
    /// directory of the same seed (every tensor's bytes, codes and scales included), its expert
    /// codes decode to finite values of the generator's spread, and the engine loads it and
    /// answers a chat message with its assets (tokenizer, template, special ids).
    #[test]
    fn a_quantized_mnw_is_what_convert_makes_of_the_directory_and_serves() {
        let dir = tempfile::tempdir().unwrap();
        // (NVFP4 needs K % 64 == 0: the tiny down projections, K = 32, stay BF16, as convert
        // leaves them.)
        for (family, experts, choice, encoding, matrices) in [
            ("2.1", "int4", ExpertChoice::Int4, QuantEncoding::I4Mma, 48),
            ("2.2", "int8", ExpertChoice::Int8, QuantEncoding::I8Mma, 48),
            (
                "2.0",
                "nvfp4",
                ExpertChoice::Nvfp4,
                QuantEncoding::Nvfp4,
                32,
            ),
            ("2.1", "fp8", ExpertChoice::Fp8, QuantEncoding::Fp8Block, 48),
        ] {
            let file = dir.path().join(format!("{experts}.mnw"));
            make(&file, family, experts);
            let report = minnow_format::mnw::validate::validate_file(&file, &|_, _| {}).unwrap();
            assert!(report.problems.is_empty(), "{:?}", report.problems);

            let safetensors = dir.path().join(format!("bf16-{family}-for-{experts}"));
            make(&safetensors, family, "bf16");
            let reference = converted(
                &safetensors,
                &dir.path().join(format!("reference-{experts}.mnw")),
                choice,
                &MnwFile::open(&file).unwrap(),
            );
            let (config, source) = minnow_model::checkpoint::open(&file).unwrap();
            minnow_model::weights::validate(&config, &source).unwrap();
            assert_eq!(source.names(), reference.names());
            let mut quantized = 0;
            for name in source.names() {
                let (ours, theirs) = (
                    source.tensor(name).unwrap(),
                    reference.tensor(name).unwrap(),
                );
                assert_eq!(ours.dtype_name, theirs.dtype_name, "{name}");
                assert!(ours.data == theirs.data, "{name}: data differs");
                assert_eq!(
                    ours.quant.map(|q| (q.group_size, q.scales)),
                    theirs.quant.map(|q| (q.group_size, q.scales)),
                    "{name}"
                );
                let Some(mat) = ours.quant_mat() else {
                    continue;
                };
                assert!(schema::routed_expert_family(name).is_some(), "{name}");
                assert_eq!(mat.encoding, encoding, "{name}");
                quantized += 1;
                // Uniform with σ = 1/√fan_in: decoded values stay within √3σ (plus the
                // rounding of the scale: FP16 for the integers, E4M3 blocks for NVFP4) and keep
                // σ within the quantization noise.
                let mut values = vec![0.0f32; mat.rows * mat.cols];
                mat.dequantize(&mut values);
                let sigma = 1.0 / (mat.cols as f32).sqrt();
                assert!(values.iter().all(|v| v.is_finite()), "{name}");
                let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let slack = if encoding == QuantEncoding::Nvfp4 {
                    1.07
                } else {
                    1.01
                };
                assert!(max <= 3f32.sqrt() * sigma * slack, "{name}: max {max}");
                let mean = values.iter().sum::<f32>() / values.len() as f32;
                let var =
                    values.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / values.len() as f32;
                let ratio = var.sqrt() / sigma;
                assert!((0.9..1.1).contains(&ratio), "{name}: std/σ {ratio}");
            }
            // Of the 16 experts × 3 projections of the one MoE layer.
            assert_eq!(quantized, matrices, "{experts}");

            let engine = Engine::load(
                &file,
                EngineOptions {
                    device: DeviceRequest::Cpu,
                    ..Default::default()
                },
            )
            .unwrap();
            let prompt = ChatPrompt {
                messages: vec![ChatMessage {
                    role: "user".into(),
                    content: "Say hello.".into(),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let (ids, _) = engine.chat_prompt_ids(&prompt).unwrap();
            assert!(!ids.is_empty());
            let mut handle = engine
                .submit(GenerateRequest {
                    prompt_ids: ids,
                    max_tokens: Some(8),
                    params: DecodeParams {
                        temperature: Some(0.0),
                        ..Default::default()
                    },
                    ..Default::default()
                })
                .unwrap();
            let done = loop {
                match handle.blocking_next_event() {
                    Some(Event::Done { output_ids, .. }) => break output_ids,
                    Some(Event::Error(e)) => panic!("{family} {experts}: {e}"),
                    Some(_) => {}
                    None => panic!("the stream ended without Done"),
                }
            };
            assert!(!done.is_empty() && done.len() <= 8, "{done:?}");
        }
    }

    /// A safetensors directory holds BF16 experts only; a .mnw that exists is never replaced.
    #[test]
    fn quantized_experts_need_a_mnw_and_no_file_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let args = |out: &Path, experts: &str| -> Vec<String> {
            [
                "--out",
                out.to_str().unwrap(),
                "--preset",
                "tiny",
                "--experts",
                experts,
            ]
            .map(String::from)
            .to_vec()
        };
        let err = super::super::run(&args(&dir.path().join("d"), "int4")).unwrap_err();
        assert!(err.contains("needs a .mnw output"), "{err}");
        assert!(!dir.path().join("d").exists());
        let err = super::super::run(&args(&dir.path().join("x.mnw"), "int3")).unwrap_err();
        assert!(err.contains("unknown --experts"), "{err}");
        let file = dir.path().join("x.mnw");
        std::fs::write(&file, b"mine").unwrap();
        let err = super::super::run(&args(&file, "int4")).unwrap_err();
        assert!(err.contains("already exists"), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"mine");
    }
}
