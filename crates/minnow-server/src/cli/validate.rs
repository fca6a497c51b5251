//! `minnow validate [FILE]`: checks a `.mnw` file completely (structure, the manifest's and
//! every region's BLAKE3, zero padding, quantized scales, and that the assets a load reads
//! parse: `config.json`, `tokenizer.json` with its special tokens, the chat template) with
//! bounded memory and no GPU. Each problem is printed naming its tensor or asset; any problem
//! makes the exit status non-zero. FILE
//! defaults to `--model`, then to the bundled fixture like every command; a checkpoint
//! directory (the fixture is one) has no digests, so it gets what can be checked: its
//! safetensors headers and the model's tensor set, as loading checks them.

use std::path::{Path, PathBuf};

use minnow_format::mnw::validate::validate_file;
use minnow_format::TensorSource;

use super::global::{file_or_model, Global};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The .mnw file (or checkpoint directory) to check; default: --model, else the bundled
    /// fixture.
    pub file: Option<PathBuf>,
}

pub fn run(cli: &Global, args: &Args) -> Result<(), String> {
    let path = &file_or_model(cli, args.file.as_ref());
    if path.is_dir() {
        return validate_directory(path);
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(super::convert::steady_style("validating")?);
    let report = validate_file(path, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    let mut report = report;
    if report.is_ok() {
        report.problems.extend(asset_problems(path));
    }
    if report.is_ok() {
        println!(
            "{}: ok ({} tensors, {} regions hashed, {} read)",
            path.display(),
            report.tensors,
            report.regions_checked,
            super::inspect::human_bytes(report.bytes_read as usize)
        );
        return Ok(());
    }
    for problem in &report.problems {
        eprintln!("{}: {problem}", path.display());
    }
    Err(format!(
        "{}: {} problem{} found",
        path.display(),
        report.problems.len(),
        if report.problems.len() == 1 { "" } else { "s" }
    ))
}

/// A safetensors directory: the headers, offsets and lengths (checked when it opens) and every
/// tensor the model needs, with its type and shape.
fn validate_directory(path: &Path) -> Result<(), String> {
    let (config, source) = minnow_model::checkpoint::open(path).map_err(|e| e.to_string())?;
    minnow_model::weights::validate(&config, &source).map_err(|e| e.to_string())?;
    println!(
        "{}: ok ({} tensors; a checkpoint directory has no digests, so its safetensors headers \
         and tensor set were checked)",
        path.display(),
        source.names().len()
    );
    Ok(())
}

/// What a load would refuse in the assets: `config.json` (strict, as the model loader reads it),
/// `tokenizer.json` and its special ids, the chat template (when there is one).
fn asset_problems(path: &std::path::Path) -> Vec<String> {
    use minnow_engine::text::chat_template::ChatTemplate;
    use minnow_engine::Tokenizer;

    let (_, source) = match minnow_model::checkpoint::open(path) {
        Ok(opened) => opened,
        Err(e) => return vec![format!("config.json: {e}")],
    };
    let mut problems = Vec::new();
    let asset = |name: &str| source.asset(name).ok().flatten();
    let json = |name: &str| -> Result<Option<serde_json::Value>, String> {
        asset(name)
            .map(|text| {
                serde_json::from_str(&text).map_err(|e| format!("{name}: not valid JSON: {e}"))
            })
            .transpose()
    };
    let config = json("config.json").unwrap_or_else(|e| {
        problems.push(e);
        None
    });
    let generation = json("generation_config.json").unwrap_or_else(|e| {
        problems.push(e);
        None
    });
    match asset("tokenizer.json") {
        None => problems.push("tokenizer.json: missing".into()),
        Some(text) => {
            if let Err(e) = Tokenizer::from_json(&text, config.as_ref(), generation.as_ref()) {
                problems.push(format!("tokenizer.json: {e}"));
            }
        }
    }
    let tokenizer_config = json("tokenizer_config.json").unwrap_or_else(|e| {
        problems.push(e);
        None
    });
    let template = asset("chat_template.jinja").or_else(|| {
        tokenizer_config
            .as_ref()
            .and_then(|c| c.get("chat_template"))
            .and_then(|t| t.as_str())
            .map(str::to_string)
    });
    if let Some(template) = template {
        if let Err(e) = ChatTemplate::from_source(&template, serde_json::Map::new()) {
            problems.push(format!("chat template: {e}"));
        }
    }
    problems
}
