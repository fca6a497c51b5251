#![allow(dead_code)] // each test file that includes this module uses a part of it
//! A CPU runner that says its full logits are not cheap, as the GPU's are not: steps that can
//! then read each row's best ids (`Want::TopK`) ask for those instead of full logits, as they do
//! on the GPU. It counts which kinds of scores its forwards returned.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use minnow_model::cpu::CpuRunner;
use minnow_model::{Config, ModelRunner, Segment, SegmentOutput, Want};

/// Forwards' segments by what they asked for.
#[derive(Default)]
pub struct WantCounts {
    pub logits: AtomicUsize,
    pub best_ids: AtomicUsize,
    /// Rows read in full after a forward (`logits_row`).
    pub rows: AtomicUsize,
}

impl WantCounts {
    pub fn logits(&self) -> usize {
        self.logits.load(Ordering::Relaxed)
    }
    pub fn best_ids(&self) -> usize {
        self.best_ids.load(Ordering::Relaxed)
    }
    pub fn rows(&self) -> usize {
        self.rows.load(Ordering::Relaxed)
    }
}

pub struct BestIdsRunner {
    pub cpu: CpuRunner,
    pub counts: Arc<WantCounts>,
}

impl BestIdsRunner {
    pub fn new(cpu: CpuRunner) -> Self {
        Self {
            cpu,
            counts: Arc::default(),
        }
    }
}

impl ModelRunner for BestIdsRunner {
    fn config(&self) -> &Config {
        self.cpu.config()
    }
    fn device_name(&self) -> String {
        self.cpu.device_name()
    }
    fn kv_pages(&self) -> usize {
        self.cpu.kv_pages()
    }
    fn kv_page_bytes(&self) -> usize {
        self.cpu.kv_page_bytes()
    }
    fn forward_batch(
        &mut self,
        segments: &[Segment<'_>],
    ) -> minnow_model::Result<Vec<SegmentOutput>> {
        for segment in segments {
            match segment.want {
                Want::Logits(_) => &self.counts.logits,
                Want::TopK(_) => &self.counts.best_ids,
                Want::Nothing | Want::Top1(_) => continue,
            }
            .fetch_add(1, Ordering::Relaxed);
        }
        self.cpu.forward_batch(segments)
    }
    fn logits_row(&mut self, segment: usize, row: usize) -> minnow_model::Result<Vec<f32>> {
        self.counts.rows.fetch_add(1, Ordering::Relaxed);
        self.cpu.logits_row(segment, row)
    }
    fn full_logits_cheap(&self) -> bool {
        false
    }
}
