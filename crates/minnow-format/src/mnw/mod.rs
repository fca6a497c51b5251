//! The `.mnw` container, version 1 (docs/model-format.md): a 64-byte header, 4096-aligned
//! tensor regions, and a MessagePack manifest as the last region. One file holds the weights in
//! their encodings plus the text assets (config, tokenizer, chat template) a model needs.
//!
//! - [`layout`]: the format's constants, the header and the structural checks every reader runs
//!   before any compute;
//! - [`manifest`]: the manifest's fields;
//! - [`reader`]: [`MnwFile`], a memory-mapped [`crate::TensorSource`];
//! - [`writer`]: region placement and the atomic, verified write of a new file;
//! - [`validate`]: the full BLAKE3 check with bounded memory;
//! - [`planned`]: writing a planned file on several threads, each tensor's regions filled by the
//!   caller (a conversion, or `cargo xtask make-checkpoint`'s random weights) and hashed as they
//!   stream;
//! - [`convert`]: streaming conversion from any source, quantizing routed experts.
//!
//! This file only declares and re-exports: the children import from each other, never from
//! here, so the modules form no import circle (`src/import_graph.rs`).

pub mod convert;
pub mod layout;
pub mod manifest;
pub mod planned;
pub mod reader;
pub mod validate;
pub mod writer;

pub use layout::{
    align_up, ALIGN, ARCHITECTURE, HEADER_LEN, MAGIC, MAX_MANIFEST, OPTIONAL_ASSETS,
    REQUIRED_ASSETS,
};
pub use manifest::VERSION;
pub use reader::MnwFile;
