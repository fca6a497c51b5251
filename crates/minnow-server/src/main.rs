//! The `minnow` command-line tool: `inspect`, `forward`, `generate` and `serve` over one
//! checkpoint. Every failure is printed as one line on stderr with a non-zero exit status.

mod cli;
#[cfg(test)]
mod import_graph;
mod server;

fn main() {
    if let Err(message) = cli::run() {
        eprintln!("minnow: error: {message}");
        std::process::exit(1);
    }
}
