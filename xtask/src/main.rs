//! `cargo xtask <task>`: kernels (CUDA C to committed PTX), make-checkpoint (random weights at real
//! LLaDA2 shapes), bench (the numbers in docs/performance.md).

fn main() {
    eprintln!("xtask: no tasks yet");
    std::process::exit(2);
}
