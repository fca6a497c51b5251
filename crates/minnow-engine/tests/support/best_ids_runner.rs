#![allow(dead_code)] // each test file that includes this module uses a part of it
//! A CPU runner that says its full logits are not cheap, as the GPU's are not: steps that can
//! then read each row's best ids (`Want::TopK`) ask for those instead of full logits, as they do
//! on the GPU, and ask for whole blocks. Made to draw rows (`BestIdsRunner::drawing`), it answers
//! sampling steps' device draws as the GPU does, with the host samplers; made narrowing
//! (`BestIdsRunner::narrowing`), it says fewer rows cost less, as the GPU does, and steps ask for
//! the rows they read. It counts which kinds of scores its forwards returned, and their rows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use minnow_model::cpu::CpuRunner;
use minnow_model::{Config, ModelRunner, RowDraw, Segment, SegmentOutput, Want};

/// Forwards' segments by what they asked for.
#[derive(Default)]
pub struct WantCounts {
    pub logits: AtomicUsize,
    pub best_ids: AtomicUsize,
    /// Rows read in full after a forward (`logits_row`).
    pub rows: AtomicUsize,
    /// Candidates drawn (`draw_rows`), and the calls that drew them.
    pub draws: AtomicUsize,
    pub draw_calls: AtomicUsize,
    /// Forwards (`forward_batch` calls).
    pub forwards: AtomicUsize,
    /// Rows the forwards' segments asked for, of every kind.
    pub wanted_rows: AtomicUsize,
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
    pub fn draws(&self) -> usize {
        self.draws.load(Ordering::Relaxed)
    }
    pub fn draw_calls(&self) -> usize {
        self.draw_calls.load(Ordering::Relaxed)
    }
    pub fn forwards(&self) -> usize {
        self.forwards.load(Ordering::Relaxed)
    }
    pub fn wanted_rows(&self) -> usize {
        self.wanted_rows.load(Ordering::Relaxed)
    }
}

pub struct BestIdsRunner {
    pub cpu: CpuRunner,
    pub counts: Arc<WantCounts>,
    /// Whether it answers `draw_rows`.
    pub draws: bool,
    /// What `narrow_rows_pay` says.
    pub narrow: bool,
}

impl BestIdsRunner {
    pub fn new(cpu: CpuRunner) -> Self {
        Self {
            cpu,
            counts: Arc::default(),
            draws: false,
            narrow: false,
        }
    }

    /// The runner that says fewer rows cost less, as the GPU runner does.
    pub fn narrowing(cpu: CpuRunner) -> Self {
        Self {
            narrow: true,
            ..Self::new(cpu)
        }
    }

    /// The runner that also draws sampling steps' candidates.
    pub fn drawing(cpu: CpuRunner) -> Self {
        Self {
            draws: true,
            ..Self::new(cpu)
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
        self.counts.forwards.fetch_add(1, Ordering::Relaxed);
        for segment in segments {
            self.counts
                .wanted_rows
                .fetch_add(segment.want.rows().len(), Ordering::Relaxed);
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
    fn narrow_rows_pay(&self) -> bool {
        self.narrow
    }
    fn draws_rows(&self) -> bool {
        self.draws
    }
    fn draw_rows(&mut self, draws: &[RowDraw]) -> minnow_model::Result<Vec<(u32, f32)>> {
        assert!(self.draws, "draw_rows on a runner that says it draws none");
        self.counts.draws.fetch_add(draws.len(), Ordering::Relaxed);
        self.counts.draw_calls.fetch_add(1, Ordering::Relaxed);
        draws
            .iter()
            .map(|d| {
                let row = self.cpu.logits_row(d.segment, d.row)?;
                let c = minnow_engine::sampling::draw_on_host(d, &row);
                Ok((c.token, c.confidence))
            })
            .collect()
    }
}
