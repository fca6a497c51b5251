//! `minnow --model SRC convert OUT.mnw`: writes a `.mnw` container from a safetensors directory
//! or a `.mnw` (SRC defaults to the bundled fixture, like every command), optionally quantizing
//! the routed experts (docs/model-format.md). The work is `minnow_format::mnw::convert`; this
//! module parses the flags, shows a progress bar per pass (writing, then verifying) and turns
//! Ctrl-C into a clean stop (the temporary file is removed, OUT never appears).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};

use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use minnow_format::mnw::convert::{
    convert_in_stages, ConvertInput, ConvertOptions, ExpertChoice, QuantLayout, Stage, TensorRule,
};
use minnow_format::Checkpoint;

use super::global::{model_or_fixture, Global};

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
    /// Parallel workers, 1..=64 (default: every core, at most 64). The output does not depend on it.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: Option<u16>,
    /// JSON array of {"prefix", "encoding" (a name or null for the source's), "group_size"}
    /// applied after --experts, later rules winning; every rule must match a tensor.
    #[arg(long)]
    pub tensor_rules: Option<PathBuf>,
}

pub fn run(cli: &Global, args: &Args) -> Result<(), String> {
    let model = model_or_fixture(cli);
    let source = Checkpoint::open(&model).map_err(|e| e.to_string())?;
    let assets = source.assets().map_err(|e| e.to_string())?;
    let rules = match &args.tensor_rules {
        Some(path) => TensorRule::parse_file(path).map_err(|e| e.to_string())?,
        None => Vec::new(),
    };
    let workers = match args.workers {
        Some(n) => n as usize,
        // Each worker holds one band of rows (about 50 MiB with its buffers), so even 64 stay
        // well under the converter's memory bound.
        None => std::thread::available_parallelism().map_or(1, |n| n.get().min(64)),
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

    // Ctrl-C (or a TERM, a HUP from a closed terminal, a QUIT) sets the flag; the workers stop
    // at their next chunk and the temporary file is deleted as the conversion unwinds.
    let cancel = Arc::new(AtomicBool::new(false));
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    for signal in [SIGINT, SIGTERM, SIGHUP, SIGQUIT] {
        signal_hook::flag::register(signal, Arc::clone(&cancel))
            .map_err(|e| format!("cannot install the Ctrl-C handler: {e}"))?;
    }
    let input = ConvertInput {
        source: &source,
        // The model's tensor schema says which tensors are routed experts.
        expert_families: &minnow_model::schema::routed_expert_family,
        assets,
        model_id: source.model_id(),
    };
    let bars = StageBars::new()?;
    let result = convert_in_stages(
        &input,
        &args.out,
        &options,
        &cancel,
        &|stage, done, total| bars.show(stage, done, total),
    );
    bars.clear();
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
    let t = &summary.timings;
    println!(
        "  {:.1} s writing, {:.1} s waiting for the disk, {:.1} s verifying",
        t.writing.as_secs_f64(),
        t.sync.as_secs_f64(),
        t.verifying.as_secs_f64()
    );
    Ok(())
}

/// A bar style whose rate and ETA are the average since the bar started (bytes done / time
/// elapsed). indicatif's own estimate weights the last few updates, and the converter's
/// updates come in bursts (one per band of rows, from several workers), so it swung between
/// 0 B/s and huge ETAs; the average is steady and converges on the real throughput.
pub(super) fn steady_style(label: &str) -> Result<ProgressStyle, String> {
    let rate = |state: &ProgressState| {
        let secs = state.elapsed().as_secs_f64();
        (secs > 0.5 && state.pos() > 0).then(|| state.pos() as f64 / secs)
    };
    Ok(ProgressStyle::with_template(&format!(
        "{label} [{{bar:30}}] {{bytes}}/{{total_bytes}} {{avg_rate}} eta {{avg_eta}}"
    ))
    .map_err(|e| e.to_string())?
    .progress_chars("=> ")
    .with_key(
        "avg_rate",
        move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = match rate(state) {
                Some(r) => write!(w, "{}/s", indicatif::BinaryBytes(r as u64)),
                None => write!(w, "-"),
            };
        },
    )
    .with_key(
        "avg_eta",
        move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let left = state.len().unwrap_or(0).saturating_sub(state.pos());
            let _ = match rate(state) {
                Some(r) => write!(
                    w,
                    "{:#}",
                    indicatif::HumanDuration(std::time::Duration::from_secs_f64(left as f64 / r))
                ),
                None => write!(w, "-"),
            };
        },
    ))
}

/// One bar per pass of the conversion; workers report concurrently, so the position only moves
/// forward (a late report of a smaller count is ignored).
struct StageBars {
    writing: ProgressBar,
    verifying: ProgressBar,
    high: [AtomicU64; 2],
    started: [Once; 2],
}

impl StageBars {
    fn new() -> Result<Self, String> {
        let bar = |label: &str| -> Result<ProgressBar, String> {
            let b = ProgressBar::hidden();
            b.set_style(steady_style(label)?);
            Ok(b)
        };
        Ok(Self {
            writing: bar("converting")?,
            verifying: bar("verifying ")?,
            high: [AtomicU64::new(0), AtomicU64::new(0)],
            started: [Once::new(), Once::new()],
        })
    }

    fn show(&self, stage: Stage, done: u64, total: u64) {
        let i = match stage {
            Stage::Writing => 0,
            Stage::Verifying => 1,
        };
        let bar = [&self.writing, &self.verifying][i];
        // The first report of a pass starts its clock (not the bars' creation) and shows it.
        self.started[i].call_once(|| {
            if stage == Stage::Verifying {
                self.writing.finish_and_clear();
            }
            bar.set_length(total);
            bar.reset_elapsed();
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        });
        let high = &self.high[i];
        if high.fetch_max(done, Ordering::Relaxed) < done {
            bar.set_position(done);
        }
    }

    fn clear(&self) {
        self.writing.finish_and_clear();
        self.verifying.finish_and_clear();
    }
}
