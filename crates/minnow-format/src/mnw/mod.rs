//! The `.mnw` container, version 1 (docs/model-format.md): a 64-byte header, 4096-aligned
//! tensor regions, and a MessagePack manifest as the last region. One file holds the weights in
//! their encodings plus the text assets (config, tokenizer, chat template) a model needs.
//!
//! - [`layout`]: the header and the structural checks every reader runs before any compute;
//! - [`manifest`]: the manifest's fields;
//! - [`reader`]: [`MnwFile`], a memory-mapped [`crate::TensorSource`];
//! - [`writer`]: region placement and the atomic, verified write of a new file;
//! - [`validate`]: the full BLAKE3 check with bounded memory;
//! - [`convert`]: streaming conversion from any source, quantizing routed experts.

pub mod convert;
pub mod layout;
pub mod manifest;
pub mod reader;
pub mod validate;
pub mod writer;

pub use reader::MnwFile;

/// The first eight bytes of every version-1 file.
pub const MAGIC: &[u8; 8] = b"MINNOW01";
/// Bytes of the header.
pub const HEADER_LEN: usize = 64;
/// Every region (and the first one, at 4096) starts on this boundary.
pub const ALIGN: u64 = 4096;
/// The largest manifest a reader accepts.
pub const MAX_MANIFEST: u64 = 128 << 20;
/// The only manifest version.
pub const VERSION: u64 = 1;
/// The architecture string of LLaDA2.x models.
pub const ARCHITECTURE: &str = "llada2_moe";
/// Assets a file must carry.
pub const REQUIRED_ASSETS: [&str; 3] = ["config.json", "tokenizer.json", "chat_template.jinja"];
/// Assets a converter keeps when the source has them.
pub const OPTIONAL_ASSETS: [&str; 3] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
];

/// `n` rounded up to the region alignment.
pub fn align_up(n: u64) -> Option<u64> {
    n.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}
