//! `--fake-runner`: a [`ModelRunner`] whose forward computes nothing but answers like random
//! LLaDA2.2-mini weights do (157,184 logits per row, near-uniform, BF16-rounded), so the bench
//! measures what the engine itself spends per answer token on the host: the decoder, the grammar
//! layer and the copies of what a forward returns.
//!
//! Each wanted row is one of a fixed bank of random rows, picked by a hash of the row's position
//! and id (so the answer depends on the input as a model's does); the bank's per-row answers
//! (top-1, best ids) are computed once, so a forward costs only the copies of what it returns,
//! and a row read after it ([`ModelRunner::logits_row`]) the copy of that row. The time spent
//! inside the runner is counted apart ([`FakeRunner::runner_time`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use minnow_model::batch::{Segment, SegmentOutput, TopK, Want, TOP_K};
use minnow_model::runner::TopKRows;
use minnow_model::{Config, ModelRunner};

/// Distinct random rows the forward picks from.
const BANK_ROWS: usize = 64;
/// Pages of the (absent) K/V pool.
const PAGES: usize = 4096;

pub struct FakeRunner {
    config: Config,
    bank: Vec<Vec<f32>>,
    top1: Vec<(u32, f32)>,
    best: Vec<Vec<(u32, f32)>>,
    /// The bank rows of the latest forward's wanted rows (batch order), and where its
    /// `Want::TopK` rows are among them.
    last_picks: Vec<usize>,
    last_topk: TopKRows,
    /// Nanoseconds spent inside the runner, shared with the bench.
    inside: Arc<AtomicU64>,
}

/// The time the runner has spent in its calls so far (read by the bench while the engine holds
/// the runner).
#[derive(Clone)]
pub struct RunnerTime(Arc<AtomicU64>);

impl RunnerTime {
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

impl FakeRunner {
    pub fn new(config: Config) -> Self {
        let v = config.vocab_size;
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let bank: Vec<Vec<f32>> = (0..BANK_ROWS)
            .map(|_| {
                (0..v)
                    .map(|_| {
                        // Uniform in [-2, 2), rounded to BF16 as the GPU's logits are.
                        let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                        half::bf16::from_f32(4.0 * u - 2.0).to_f32()
                    })
                    .collect()
            })
            .collect();
        let top1 = bank.iter().map(|r| minnow_model::runner::top1(r)).collect();
        let k = TOP_K.min(v);
        let best = bank
            .iter()
            .map(|r| minnow_model::runner::top_k(r, k))
            .collect();
        Self {
            config,
            bank,
            top1,
            best,
            last_picks: Vec::new(),
            last_topk: TopKRows::default(),
            inside: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn runner_time(&self) -> RunnerTime {
        RunnerTime(self.inside.clone())
    }

    /// The bank row answering the row at `position` holding `id`.
    fn pick(position: usize, id: u32) -> usize {
        let mut h = (position as u64) << 32 | id as u64;
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (h ^ (h >> 31)) as usize % BANK_ROWS
    }

    fn output(&mut self, seg: &Segment<'_>) -> SegmentOutput {
        let picks: Vec<usize> = seg
            .want
            .rows()
            .map(|r| Self::pick(seg.start + r, seg.ids[r]))
            .collect();
        self.last_picks.extend_from_slice(&picks);
        let picks = picks.into_iter();
        match seg.want {
            Want::Nothing => SegmentOutput::Nothing,
            Want::Logits(_) => {
                let mut data = Vec::with_capacity(seg.want.rows().len() * self.config.vocab_size);
                for b in picks {
                    data.extend_from_slice(&self.bank[b]);
                }
                SegmentOutput::Logits(data)
            }
            Want::Top1(_) => SegmentOutput::Top1(picks.map(|b| self.top1[b]).collect()),
            Want::TopK(_) => {
                let picks: Vec<usize> = picks.collect();
                SegmentOutput::TopK(TopK {
                    k: TOP_K.min(self.config.vocab_size),
                    entries: picks.iter().flat_map(|&b| self.best[b].clone()).collect(),
                    top1: picks.iter().map(|&b| self.top1[b]).collect(),
                })
            }
        }
    }

    fn timed<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let began = Instant::now();
        let out = f(self);
        self.inside
            .fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

impl ModelRunner for FakeRunner {
    fn config(&self) -> &Config {
        &self.config
    }

    fn device_name(&self) -> String {
        "fake (random mini-shaped logits, no compute)".into()
    }

    fn kv_pages(&self) -> usize {
        PAGES
    }

    fn kv_page_bytes(&self) -> usize {
        1
    }

    fn forward_batch(
        &mut self,
        segments: &[Segment<'_>],
    ) -> minnow_model::Result<Vec<SegmentOutput>> {
        self.timed(|runner| {
            minnow_model::batch::validate(&runner.config, PAGES, segments)?;
            runner.last_picks.clear();
            runner.last_topk = TopKRows::new(segments);
            Ok(segments.iter().map(|s| runner.output(s)).collect())
        })
    }

    fn logits_row(&mut self, segment: usize, row: usize) -> minnow_model::Result<Vec<f32>> {
        self.timed(|runner| {
            let at = runner.last_topk.index(segment, row)?;
            Ok(runner.bank[runner.last_picks[at]].clone())
        })
    }
}
