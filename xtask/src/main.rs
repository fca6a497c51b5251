//! `cargo xtask <task>`: kernels (CUDA C to committed PTX), kernel-syntax (a host-compiler parse
//! of the same sources), make-checkpoint (random weights at real LLaDA2 shapes), bench, bench-cpu, bench-sampling, bench-turns and bench-structured (the numbers in docs/performance.md).
//!
//! One module per task; each parses its own options, this file only dispatches.

mod bench;
mod bench_cpu;
mod bench_sampling;
mod bench_structured;
mod bench_turns;
mod kernel_syntax;
mod kernels;
mod make_checkpoint;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "minnow project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Compile kernels/*.cu to the committed PTX (`--check`: verify it is up to date).
    #[command(disable_help_flag = true)]
    Kernels(Rest),
    /// Parse kernels/*.cu with the host C++ compiler (no nvcc needed; front-end errors only).
    KernelSyntax,
    /// GPU benchmark (`--quick`, `--commit SHA`, ...).
    #[command(disable_help_flag = true)]
    Bench(Rest),
    /// CPU benchmark on a checkpoint (`--model DIR [--reps N]`).
    #[command(disable_help_flag = true)]
    BenchCpu(Rest),
    /// Host samplers: one block's rows of logits to candidates, per rule and filter setting.
    #[command(disable_help_flag = true)]
    BenchSampling(Rest),
    /// Warm vs cold second chat turn through the engine's prefix cache (`--model DIR`).
    #[command(disable_help_flag = true)]
    BenchTurns(Rest),
    /// Structured outputs: compile + first mask, constrained vs plain decode throughput.
    #[command(disable_help_flag = true)]
    BenchStructured(Rest),
    /// Random-weight checkpoint at real shapes (`--out DIR [--preset P] [--family F] ...`).
    #[command(disable_help_flag = true)]
    MakeCheckpoint(Rest),
}

/// The task's own options, passed through unparsed.
#[derive(clap::Args)]
struct Rest {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

fn main() {
    // The libraries' logs (e.g. the CUDA runner's load log with its dense GEMM plans) on stderr,
    // warnings only unless RUST_LOG asks for more.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let result = match Cli::parse().task {
        Task::Kernels(r) => kernels::run(&r.args),
        Task::KernelSyntax => kernel_syntax::run(),
        Task::Bench(r) => bench::run(&r.args),
        Task::BenchCpu(r) => bench_cpu::run(&r.args),
        Task::BenchSampling(r) => bench_sampling::run(&r.args),
        Task::BenchTurns(r) => bench_turns::run(&r.args),
        Task::BenchStructured(r) => bench_structured::run(&r.args),
        Task::MakeCheckpoint(r) => make_checkpoint::run(&r.args),
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        std::process::exit(1);
    }
}
