//! Argument parsing and dispatch. Each subcommand lives in its own module with its own `Args`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use minnow_runtime::device::DeviceRequest;

mod convert;
mod decode_flags;
mod forward;
mod generate;
mod inspect;
mod output_file;
mod serve;
mod validate;

/// The tiny LLaDA2.1 fixture in the source tree, used by every command when no `--model` is given
/// (random weights: its text is noise).
pub const BUNDLED_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/llada2-tiny-v21"
);

/// Options shared by every subcommand.
#[derive(Parser, Debug)]
#[command(
    name = "minnow",
    version,
    about = "Fast inference for LLaDA2.x block-diffusion models"
)]
pub struct Cli {
    /// Checkpoint: a directory (Hugging Face layout) or a .mnw file. Every command falls back to
    /// the bundled tiny fixture when omitted.
    #[arg(long, global = true, env = "MINNOW_MODEL")]
    pub model: Option<PathBuf>,
    /// auto (a CUDA GPU when usable, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, global = true, default_value = "auto")]
    pub device: DeviceRequest,
    /// CPU worker threads (default: all cores).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
// Parsed once at startup: the size of the largest variant (serve's flags) costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Print the checkpoint's family, shapes, parameter count and special tokens.
    Inspect(inspect::Args),
    /// Run one block-causal forward over given ids and save the logits.
    Forward(forward::Args),
    /// Generate text from a prompt, streaming each finished block.
    Generate(generate::Args),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(serve::Args),
    /// Write the checkpoint as a .mnw file, optionally with quantized experts.
    Convert(convert::Args),
    /// Check every byte of a .mnw file (digests, padding, structure); a checkpoint directory
    /// gets the structural checks (it has no digests).
    Validate(validate::Args),
}

pub fn run() -> Result<(), String> {
    let cli = Cli::parse();
    if let Some(threads) = cli.threads {
        if threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        rayon_threads(threads)?;
    }
    match &cli.command {
        Command::Inspect(args) => inspect::run(&cli, args),
        Command::Forward(args) => forward::run(&cli, args),
        Command::Generate(args) => generate::run(&cli, args),
        Command::Serve(args) => serve::run(&cli, args),
        Command::Convert(args) => convert::run(&cli, args),
        Command::Validate(args) => validate::run(&cli, args),
    }
}

fn rayon_threads(n: usize) -> Result<(), String> {
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    Ok(())
}

/// A command's positional FILE (`minnow validate FILE`, `minnow inspect FILE`), which wins over
/// `--model` and `MINNOW_MODEL`; else [`model_or_fixture`].
pub fn file_or_model(cli: &Cli, file: Option<&PathBuf>) -> PathBuf {
    match file {
        Some(path) => path.clone(),
        None => model_or_fixture(cli),
    }
}

/// `--model`, or the bundled tiny fixture (announced on stderr) when it is omitted.
pub fn model_or_fixture(cli: &Cli) -> PathBuf {
    match &cli.model {
        Some(path) => path.clone(),
        None => {
            eprintln!(
                "minnow: no --model given; using the bundled tiny fixture {BUNDLED_FIXTURE} (random weights, the text is noise)"
            );
            PathBuf::from(BUNDLED_FIXTURE)
        }
    }
}
