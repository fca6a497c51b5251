//! Where the tiny checkpoints the engine tests run on live (the repository's `tests/fixtures`).

use std::path::PathBuf;

/// The fixture checkpoint directory `name` (e.g. `llada2-tiny-v20`).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}
