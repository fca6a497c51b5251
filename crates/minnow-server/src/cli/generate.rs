//! `minnow generate` (not implemented yet).

use super::Cli;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_cli: &Cli, _args: &Args) -> Result<(), String> {
    Err("'generate' is not implemented yet".into())
}
