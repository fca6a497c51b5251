//! Test helpers: a toy vocabulary, scripted logits, and a scripted [`ModelRunner`] that records
//! every forward (used to test the block loop, the K/V commit rule and requests
//! without a model).

use minnow_model::runner::{top1, top_k_of_rows, TopKRows};
use minnow_model::{Config, Family, LogitsRows, ModelRunner, Segment, SegmentOutput, Want};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::{BlockAlgorithm, BlockLogits, ScoreKind, StepOutcome, StepScores, Top1Rows};

/// Toy vocabulary of decoding doc §12: MASK = 7, DELETE = 8, SPLIT = 9.
pub const VOCAB: usize = 10;
pub const M: u32 = 7;
pub const D: u32 = 8;
pub const S: u32 = 9;

/// A logit row whose softmax gives `token` probability `p` and spreads the rest evenly.
pub fn row(token: u32, p: f32) -> Vec<f32> {
    let rest = ((1.0 - p) / (VOCAB as f32 - 1.0)).max(1e-12);
    (0..VOCAB as u32)
        .map(|t| if t == token { p.ln() } else { rest.ln() })
        .collect()
}

/// Like [`row`], but `runner_up` takes 90% of the remaining mass (a clear second choice).
pub fn row_with_runner_up(token: u32, p: f32, runner_up: u32) -> Vec<f32> {
    let rest = 1.0 - p;
    let others = (rest * 0.1 / (VOCAB as f32 - 2.0)).max(1e-12);
    (0..VOCAB as u32)
        .map(|t| {
            if t == token {
                p.ln()
            } else if t == runner_up {
                (rest * 0.9).ln()
            } else {
                others.ln()
            }
        })
        .collect()
}

/// Block logits `[slots, VOCAB]`, one `(argmax token, probability)` per slot.
pub fn logits_for(slots: &[(u32, f32)]) -> Vec<f32> {
    slots.iter().flat_map(|&(t, p)| row(t, p)).collect()
}

/// Full-logits scores of toy-vocabulary logits `[slots, VOCAB]`.
pub fn full_scores(logits: &[f32]) -> StepScores<'_> {
    StepScores::Logits(BlockLogits::new(logits, VOCAB))
}

/// Each row's top-1 pair, as the default `ModelRunner::forward_top1` computes it.
pub fn top1_pairs(logits: &[f32]) -> Vec<(u32, f32)> {
    logits.chunks_exact(VOCAB).map(top1).collect()
}

/// Drives an algorithm like the block loop does (pre-forward check, step with the scores the
/// algorithm asks for, convergence), feeding the scripted logits in order (as top-1 pairs or each
/// row's best ids when it asks for those). Returns the final block and the number of forwards.
pub fn run_block(
    algorithm: &mut dyn BlockAlgorithm,
    mut block: Vec<u32>,
    script: &[Vec<f32>],
) -> (Vec<u32>, usize) {
    let mut rng = StdRng::seed_from_u64(0);
    let mut forwards = 0;
    loop {
        if algorithm.exit_before_forward(&block) {
            break;
        }
        let logits = script.get(forwards).unwrap_or_else(|| {
            panic!(
                "the block wanted forward #{} beyond the script",
                forwards + 1
            )
        });
        forwards += 1;
        let (pairs, top);
        let scores = match algorithm.scores_needed(false) {
            ScoreKind::Logits | ScoreKind::Sampled => full_scores(logits),
            ScoreKind::Top1 => {
                pairs = top1_pairs(logits);
                StepScores::Top1(Top1Rows::new(&pairs))
            }
            ScoreKind::TopK => {
                top = top_k_of_rows(logits, VOCAB);
                StepScores::TopK(super::BestIds::new(&top))
            }
        };
        if algorithm.step(&mut block, scores, &mut rng, false) == StepOutcome::Converged {
            break;
        }
    }
    (block, forwards)
}

/// A config with the toy vocabulary: the tiny fixture's parsed config (so new config fields
/// need no test changes) with the vocabulary, block size and edit ids the decoder tests use.
pub fn toy_config(family: Family, block_size: usize) -> Config {
    let name = if family == Family::V22 {
        "llada2-tiny-v22"
    } else {
        "llada2-tiny-v21"
    };
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    let mut config = Config::from_dir(&dir).expect("fixture config parses");
    config.family = family;
    config.vocab_size = VOCAB;
    config.block_size = block_size;
    // Room for the long-prompt tests (the fixture's own context is 512).
    config.max_position_embeddings = 1 << 16;
    config.delete_token_id = (family == Family::V22).then_some(D);
    config.split_token_id = (family == Family::V22).then_some(S);
    config
}

/// Logits `[positions, vocab]` where each row makes `token_at(position)` the confident argmax
/// (logit 20 against 0: probability ≈ 1 − vocab·2e-9).
pub fn confident_rows(
    start: usize,
    n: usize,
    vocab: usize,
    token_at: impl Fn(usize) -> u32,
) -> Vec<f32> {
    let mut out = vec![0.0; n * vocab];
    for i in 0..n {
        out[i * vocab + token_at(start + i) as usize] = 20.0;
    }
    out
}

/// One recorded forward.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub start: usize,
    pub ids: Vec<u32>,
    pub rows: LogitsRows,
    /// Whether it asked for top-1 pairs (not logits).
    pub top1: bool,
    /// Whether it asked for each row's best ids.
    pub top_k: bool,
}

type LogitsFn = Box<dyn FnMut(usize, &[u32]) -> Vec<f32> + Send>;

/// A [`ModelRunner`] whose logits come from a closure `(start position, ids) → [ids.len(), V]`
/// with `V` = the config's `vocab_size`. It records every segment it runs.
pub struct ScriptedRunner {
    config: Config,
    logits: LogitsFn,
    pub calls: Vec<Call>,
    /// The latest forward's wanted logits rows, for `logits_row`.
    kept: (TopKRows, Vec<f32>),
    /// Full rows read with `logits_row`.
    pub rows_read: usize,
}

impl ScriptedRunner {
    pub fn new(
        config: Config,
        logits: impl FnMut(usize, &[u32]) -> Vec<f32> + Send + 'static,
    ) -> Self {
        Self {
            config,
            logits: Box::new(logits),
            calls: Vec::new(),
            kept: Default::default(),
            rows_read: 0,
        }
    }

    /// Denoising forwards that returned top-1 pairs instead of logits.
    pub fn top1_calls(&self) -> usize {
        self.calls.iter().filter(|c| c.top1).count()
    }

    /// Forwards that asked for logits or top-1 pairs (denoising steps).
    pub fn denoise_calls(&self) -> Vec<&Call> {
        self.calls
            .iter()
            .filter(|c| c.rows != LogitsRows::None)
            .collect()
    }
}

/// Pages of the scripted pool.
const PAGES: usize = 4096;

impl ModelRunner for ScriptedRunner {
    fn config(&self) -> &Config {
        &self.config
    }
    fn device_name(&self) -> String {
        "scripted".into()
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
        minnow_model::batch::validate(&self.config, PAGES, segments)?;
        let vocab = self.config.vocab_size;
        let mut out = Vec::with_capacity(segments.len());
        let mut kept = Vec::new();
        for seg in segments {
            let rows = seg.want.rows();
            self.calls.push(Call {
                start: seg.start,
                ids: seg.ids.to_vec(),
                rows: if rows.is_empty() {
                    LogitsRows::None
                } else if rows == (0..seg.ids.len()) {
                    LogitsRows::All
                } else {
                    LogitsRows::Range(rows.clone())
                },
                top1: matches!(seg.want, Want::Top1(_)),
                top_k: matches!(seg.want, Want::TopK(_)),
            });
            let all = (self.logits)(seg.start, seg.ids);
            assert_eq!(
                all.len(),
                seg.ids.len() * vocab,
                "scripted logits have the wrong shape"
            );
            let logits = &all[rows.start * vocab..rows.end * vocab];
            out.push(match seg.want {
                Want::Nothing => SegmentOutput::Nothing,
                Want::Logits(_) => SegmentOutput::Logits(logits.to_vec()),
                Want::Top1(_) => {
                    SegmentOutput::Top1(logits.chunks_exact(vocab).map(top1).collect())
                }
                Want::TopK(_) => SegmentOutput::TopK(top_k_of_rows(logits, vocab)),
            });
            kept.extend_from_slice(logits);
        }
        self.kept = (TopKRows::new(segments), kept);
        Ok(out)
    }

    fn logits_row(&mut self, segment: usize, row: usize) -> minnow_model::Result<Vec<f32>> {
        let at = self.kept.0.index(segment, row)?;
        let v = self.config.vocab_size;
        self.rows_read += 1;
        Ok(self.kept.1[at * v..(at + 1) * v].to_vec())
    }
}
