//! `cargo xtask <task>`: kernels (CUDA C to committed PTX), make-checkpoint (random weights at real
//! LLaDA2 shapes), bench (the numbers in docs/performance.md).

mod bench;
mod bench_cpu;
mod kernels;
mod make_checkpoint;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("kernels") => kernels::run(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("bench-cpu") => bench_cpu::run(&args[1..]),
        Some("make-checkpoint") => make_checkpoint::run(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <kernels [--check] | bench [--quick] [--commit SHA] | \
                 make-checkpoint --out DIR [--preset P] [--family F] | bench-cpu --model DIR>"
            );
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        std::process::exit(1);
    }
}
