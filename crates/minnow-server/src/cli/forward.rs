//! `minnow forward`: one block-causal forward over given ids (positions 0..n-1), logits saved as
//! `logits` F32 `[n, vocab]` in a safetensors file. The contract later checks use to compare
//! minnow with the official implementation on arbitrary checkpoints.

use std::path::{Path, PathBuf};

use minnow_engine::{select_runner, DeviceRequest, EngineOptions};
use minnow_model::{LogitsRows, ModelRunner, SingleSequence};
use safetensors::tensor::TensorView;

use super::global::{model_or_fixture, Global};
use super::output_file;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// JSON file of the form {"input_ids": [..]}.
    #[arg(long)]
    pub input: PathBuf,
    /// Safetensors file to write (tensor `logits`, F32 [n, vocab]).
    #[arg(long)]
    pub output: PathBuf,
    /// Overwrite OUTPUT if it exists.
    #[arg(long)]
    pub force: bool,
}

pub fn run(cli: &Global, args: &Args) -> Result<(), String> {
    show_warnings();
    let model = &model_or_fixture(cli);
    output_file::check_writable(&args.output, args.force)?;
    let ids = read_input_ids(&args.input)?;
    let mut runner = SingleSequence::new(open_runner(cli.device, model)?);
    let vocab = runner.config().vocab_size;
    let seq = runner.create_sequence();
    let logits = runner
        .forward(seq, &ids, LogitsRows::All)
        .map_err(|e| e.to_string())?;
    write_logits(&args.output, args.force, &logits, ids.len(), vocab)
}

/// The runner for `--device`, through the engine's device selection. `forward` is the validation
/// command, so `auto` means the F32 CPU reference (the numbers the official F32 implementation is
/// compared with); the BF16 CUDA runner is used only when asked for by name.
fn open_runner(device: DeviceRequest, model: &Path) -> Result<Box<dyn ModelRunner>, String> {
    let device = match device {
        DeviceRequest::Auto => DeviceRequest::Cpu,
        named => named,
    };
    let options = EngineOptions {
        device,
        ..EngineOptions::default()
    };
    select_runner(model, &options).map_err(|e| e.to_string())
}

/// Sends warnings (e.g. config flags that fell back to checkpoint values) to stderr; `RUST_LOG`
/// overrides the level.
pub(super) fn show_warnings() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Parses `{"input_ids": [..]}`: a non-empty list of non-negative integers.
fn read_input_ids(path: &Path) -> Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not valid JSON: {e}", path.display()))?;
    let list = json
        .get("input_ids")
        .and_then(|v| v.as_array())
        .ok_or_else(|| {
            format!(
                "{}: expected an object with an array 'input_ids'",
                path.display()
            )
        })?;
    if list.is_empty() {
        return Err(format!("{}: 'input_ids' is empty", path.display()));
    }
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .filter(|&n| n <= u32::MAX as u64)
                .map(|n| n as u32)
                .ok_or_else(|| {
                    format!("{}: input_ids[{i}] = {v} is not a token id", path.display())
                })
        })
        .collect()
}

/// The little-endian bytes of `values`: borrowed on little-endian machines (logits of a long
/// input are gigabytes), copied elsewhere.
fn le_bytes(values: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 has no padding and any byte pattern is a valid u8; the slice covers
        // exactly the memory of `values` and borrows it.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
        })
    }
    #[cfg(not(target_endian = "little"))]
    {
        std::borrow::Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

/// Writes `logits` as a safetensors file (`output_file` guards the path and renames a complete
/// temporary file into place).
fn write_logits(
    output: &Path,
    force: bool,
    logits: &[f32],
    n: usize,
    vocab: usize,
) -> Result<(), String> {
    let bytes = le_bytes(logits);
    let view = TensorView::new(safetensors::Dtype::F32, vec![n, vocab], &bytes)
        .map_err(|e| format!("building the logits tensor: {e}"))?;
    output_file::write_atomically(output, force, |tmp| {
        safetensors::serialize_to_file([("logits", view)], None, tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))
    })
}
