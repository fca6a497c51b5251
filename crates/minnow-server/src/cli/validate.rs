//! `minnow --model X.mnw validate`: checks a `.mnw` file completely (structure, the manifest's
//! and every region's BLAKE3, zero padding, quantized scales) with bounded memory and no GPU.
//! Each problem is printed naming its tensor; any problem makes the exit status non-zero.

use minnow_format::mnw::validate::validate_file;

use super::{required_model, Cli};

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(cli: &Cli, _args: &Args) -> Result<(), String> {
    let path = required_model(cli)?;
    if path.is_dir() {
        return Err(format!(
            "{} is a directory; validate checks .mnw files",
            path.display()
        ));
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "validating [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
        )
        .map_err(|e| e.to_string())?
        .progress_chars("=> "),
    );
    let report = validate_file(path, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
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
