//! minnow-model is the LLaDA2.x network (2.0, 2.1 and 2.2; mini and flash): the parsed
//! `config.json`, the validated weight set, and the forward pass with the block-causal mask,
//! partial RoPE, GQA attention, the dense MLP and the MoE layers (group-limited router for
//! 2.0/2.1, block router for 2.2), plus the paged K/V pool and the batched forward over it.
//!
//! Decoding code talks to a model only through [`ModelRunner`], so the CPU reference path and the
//! CUDA path are interchangeable; the engine owns the pages of its sequences without knowing
//! which device holds them.

pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod cpu;
pub mod cuda;
pub mod error;
#[cfg(test)]
mod import_graph;
pub mod load_report;
pub mod router;
pub mod runner;
pub mod schema;
pub mod single_sequence;
pub mod trace;
pub mod weights;

pub use batch::{PageId, Segment, SegmentOutput, TopK, Want, TOP_K};
pub use config::{Config, Family};
pub use cpu::{CpuModel, CpuRunner, KvPool};
pub use error::{ModelError, Result};
pub use runner::{DrawRule, ModelRunner, RowDraw};
pub use single_sequence::{LogitsRows, SeqId, SingleSequence};
pub use trace::{RouterTrace, Trace};
