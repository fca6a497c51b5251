//! The options every subcommand shares (`--model`, `--device`, `--threads`) and the checkpoint
//! they name.

use std::path::PathBuf;

use clap::Args;
use minnow_runtime::device::DeviceRequest;

/// The tiny LLaDA2.1 fixture in the source tree, used by every command when no `--model` is given
/// (random weights: its text is noise).
pub const BUNDLED_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/llada2-tiny-v21"
);

/// Options shared by every subcommand.
#[derive(Args, Debug)]
pub struct Global {
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
}

/// A command's positional FILE (`minnow validate FILE`, `minnow inspect FILE`), which wins over
/// `--model` and `MINNOW_MODEL`; else [`model_or_fixture`].
pub fn file_or_model(cli: &Global, file: Option<&PathBuf>) -> PathBuf {
    match file {
        Some(path) => path.clone(),
        None => model_or_fixture(cli),
    }
}

/// `--model`, or the bundled tiny fixture (announced on stderr) when it is omitted.
pub fn model_or_fixture(cli: &Global) -> PathBuf {
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
