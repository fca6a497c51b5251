//! `minnow --model SRC convert OUT.mnw`: writes a `.mnw` container from a safetensors directory
//! or a floating-point `.mnw`, optionally quantizing the routed experts (docs/model-format.md).
//! The work is `minnow_format::mnw::convert`; this module parses the flags, shows a progress bar
//! and turns Ctrl-C into a clean stop (the temporary file is removed, OUT never appears).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use minnow_format::mnw::convert::{
    convert, ConvertInput, ConvertOptions, ExpertChoice, QuantLayout, TensorRule,
};
use minnow_format::Checkpoint;

use super::{required_model, Cli};

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Experts {
    /// Keep every tensor's source type.
    Original,
    /// INT8, FP16 scale per group.
    Int8,
    /// INT4, FP16 scale per group.
    Int4,
    /// NVFP4 (E2M1 codes, E4M3 block scales, F32 global scale).
    Nvfp4,
    /// minnow's own block-scaled FP8 (fp8_e4m3_b128); other .mnw readers do not read it.
    Fp8,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Layout {
    /// Tensor-core fragment order (i8_mma, i4_mma).
    Mma,
    /// Row-major (i8_sym, i4_sym).
    Row,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The file to write; it must not exist.
    pub out: PathBuf,
    /// Encoding of the routed experts; everything else keeps its source type.
    #[arg(long, value_enum, default_value = "original")]
    pub experts: Experts,
    /// Layout of INT8/INT4 codes.
    #[arg(long, value_enum, default_value = "mma")]
    pub quant_layout: Layout,
    /// Weights per scale along K for INT8/INT4: 16, 32, 64 or 128 (default 128, or the largest
    /// of those that divides a matrix's K).
    #[arg(long)]
    pub group_size: Option<usize>,
    /// Parallel workers, 1..=64 (default: the cores, at most 8). The output does not depend on it.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: Option<u16>,
    /// JSON array of {"prefix", "encoding" (a name or null for the source's), "group_size"}
    /// applied after --experts, later rules winning; every rule must match a tensor.
    #[arg(long)]
    pub tensor_rules: Option<PathBuf>,
}

pub fn run(cli: &Cli, args: &Args) -> Result<(), String> {
    let model = required_model(cli)?;
    let source = Checkpoint::open(model).map_err(|e| e.to_string())?;
    let assets = source.assets().map_err(|e| e.to_string())?;
    let rules = match &args.tensor_rules {
        Some(path) => TensorRule::parse_file(path).map_err(|e| e.to_string())?,
        None => Vec::new(),
    };
    let workers = match args.workers {
        Some(n) => n as usize,
        None => std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
    };
    let options = ConvertOptions {
        experts: match args.experts {
            Experts::Original => ExpertChoice::Original,
            Experts::Int8 => ExpertChoice::Int8,
            Experts::Int4 => ExpertChoice::Int4,
            Experts::Nvfp4 => ExpertChoice::Nvfp4,
            Experts::Fp8 => ExpertChoice::Fp8,
        },
        layout: match args.quant_layout {
            Layout::Mma => QuantLayout::Mma,
            Layout::Row => QuantLayout::Row,
        },
        group_size: args.group_size,
        workers,
        rules,
    };

    // Ctrl-C (or a TERM) sets the flag; the workers stop at their next chunk and the temporary
    // file is deleted as the conversion unwinds.
    let cancel = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&cancel))
            .map_err(|e| format!("cannot install the Ctrl-C handler: {e}"))?;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "converting [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .map_err(|e| e.to_string())?
        .progress_chars("=> "),
    );
    let input = ConvertInput {
        source: &source,
        assets,
        model_id: source.model_id(),
    };
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let result = convert(&input, &args.out, &options, &cancel, &progress);
    bar.finish_and_clear();
    if cancel.load(Ordering::Relaxed) {
        return Err(format!(
            "interrupted; {} was not written",
            args.out.display()
        ));
    }
    let summary = result.map_err(|e| e.to_string())?;
    for note in &summary.notes {
        eprintln!("note: {note}");
    }
    println!(
        "wrote {} ({}, {workers} workers)",
        args.out.display(),
        super::inspect::human_bytes(summary.file_bytes as usize)
    );
    for (encoding, (tensors, bytes)) in &summary.per_encoding {
        println!(
            "  {encoding:<14} {tensors:>6} tensors  {}",
            super::inspect::human_bytes(*bytes as usize)
        );
    }
    Ok(())
}
