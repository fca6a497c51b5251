//! Argument parsing and dispatch. Each subcommand lives in its own module with its own `Args`.

use clap::{Parser, Subcommand};

use global::Global;

mod convert;
mod decode_flags;
mod forward;
mod generate;
mod global;
mod inspect;
mod output_file;
mod serve;
mod validate;

/// The command line: the options every subcommand shares, and the subcommand.
#[derive(Parser, Debug)]
#[command(
    name = "minnow",
    version,
    about = "Fast inference for LLaDA2.x block-diffusion models"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
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
    let global = &cli.global;
    if let Some(threads) = global.threads {
        if threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        rayon_threads(threads)?;
    }
    match &cli.command {
        Command::Inspect(args) => inspect::run(global, args),
        Command::Forward(args) => forward::run(global, args),
        Command::Generate(args) => generate::run(global, args),
        Command::Serve(args) => serve::run(global, args),
        Command::Convert(args) => convert::run(global, args),
        Command::Validate(args) => validate::run(global, args),
    }
}

fn rayon_threads(n: usize) -> Result<(), String> {
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    Ok(())
}
