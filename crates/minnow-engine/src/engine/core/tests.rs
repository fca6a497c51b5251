//! The core on a scripted runner: admission order and page use, the step's token budget and its
//! fairness, preemption and resumption.

use std::collections::{HashMap, VecDeque};

use minnow_model::{Family, ModelRunner, Want};

use super::*;
use crate::api::DecodeParams;
use crate::decode::params::resolve;
use crate::decode::stop_tokens::StopTokens;
use crate::decode::testing::{logits_for, toy_config, ScriptedRunner, M, VOCAB};
use crate::decode::ControlTokens;

const B: usize = 4;

fn core(pages: usize, token_budget: usize) -> Core {
    Core::new(
        BlockPool::new(pages, B),
        CoreSettings {
            token_budget,
            model_identity: "test".into(),
        },
    )
}

/// Request `id`: a prompt of `prompt_len` ids of its own (no two requests share a block), at
/// most `max_new` new tokens.
fn sequence(id: u64, prompt_len: usize, max_new: usize) -> NewSequence {
    NewSequence {
        id,
        prompt_ids: (0..prompt_len)
            .map(|i| ((i + id as usize) % 5) as u32)
            .collect(),
        layout: Layout::new(prompt_len, max_new, B, 1 << 16).unwrap(),
        params: resolve(
            &DecodeParams::default(),
            &DecodeParams::default(),
            Family::V21,
        )
        .unwrap(),
        decoder: DecoderContext {
            control: ControlTokens {
                mask: M,
                delete: None,
                split: None,
            },
            stops: StopTokens::new(6, Some(5)),
            vocab_size: VOCAB,
            full_logits_cheap: false,
            narrow_rows: false,
            draws_rows: false,
            merge_commits: true,
        },
        trace: false,
        cache_prompt: true,
        cache_salt: None,
        cancel: CancelToken::default(),
        stop_signal: StopSignal::default(),
        constraint: None,
    }
}

/// A model that confidently writes a token that depends on the position and on the id before it
/// (never a stop token), so a forward at a wrong position or over wrong ids changes the output.
fn runner() -> ScriptedRunner {
    ScriptedRunner::new(toy_config(Family::V21, B), |start, ids| {
        let slots: Vec<(u32, f32)> = (0..ids.len())
            .map(|i| {
                let before = if i == 0 { 3 } else { ids[i - 1] };
                (((start + i + before as usize) % 5) as u32, 0.99)
            })
            .collect();
        logits_for(&slots)
    })
}

/// How one request ended.
#[derive(Debug, PartialEq)]
struct Ending {
    reason: FinishReason,
    output: Vec<u32>,
    denoise_forwards: usize,
}

/// Drives a core the way the worker does, without text.
struct Harness {
    core: Core,
    runner: ScriptedRunner,
    waiting: VecDeque<NewSequence>,
    ended: HashMap<u64, Ending>,
    plans: Vec<StepPlan>,
}

impl Harness {
    fn new(core: Core) -> Self {
        Harness {
            core,
            runner: runner(),
            waiting: VecDeque::new(),
            ended: HashMap::new(),
            plans: Vec::new(),
        }
    }

    /// The worker's admission: preempted requests first, then queued ones in order.
    fn admit(&mut self) {
        while self.core.has_preempted() {
            if !self.core.resume_oldest() {
                return;
            }
        }
        while let Some(next) = self.waiting.pop_front() {
            match self.core.admit(next) {
                Ok(()) => {}
                Err(Refusal::Wait(next)) => {
                    self.waiting.push_front(*next);
                    break;
                }
                Err(Refusal::Never(error)) => panic!("refused: {error}"),
            }
        }
        self.collect();
    }

    fn step(&mut self) {
        self.admit();
        let plan = self.core.schedule();
        self.collect();
        if !plan.is_empty() {
            let outputs = self
                .runner
                .forward_batch(&plan.segments())
                .map_err(|e| e.to_string());
            self.core
                .apply(plan.clone(), outputs, Duration::ZERO, &mut self.runner);
            self.collect();
        }
        self.plans.push(plan);
    }

    fn collect(&mut self) {
        for update in self.core.take_updates() {
            match update {
                SequenceUpdate::Ended {
                    id,
                    reason,
                    decoder,
                    ..
                } => {
                    let ending = Ending {
                        reason,
                        output: decoder.output().to_vec(),
                        denoise_forwards: decoder.stats().denoise_forwards,
                    };
                    assert!(self.ended.insert(id, ending).is_none(), "{id} ended twice");
                }
                SequenceUpdate::Failed { id, error } => panic!("request {id} failed: {error}"),
                _ => {}
            }
        }
    }

    fn run(&mut self, max_steps: usize) {
        for _ in 0..max_steps {
            if self.core.active() == 0 && self.waiting.is_empty() {
                return;
            }
            self.step();
        }
        panic!("not done after {max_steps} steps: a deadlock?");
    }

    /// Pages request `id` holds now (0 when it holds none).
    fn held(&self, id: u64) -> usize {
        self.core
            .running
            .iter()
            .find(|s| s.id == id)
            .map_or(0, |s| s.pages.pages().len())
    }
}

/// Each request run alone on a pool that never runs out.
fn alone(requests: &[(u64, usize, usize)]) -> HashMap<u64, Ending> {
    let mut out = HashMap::new();
    for &(id, prompt, max_new) in requests {
        let mut h = Harness::new(core(4096, 512));
        h.waiting.push_back(sequence(id, prompt, max_new));
        h.run(10_000);
        out.extend(h.ended);
    }
    out
}

#[test]
fn a_request_holds_its_prompt_and_current_block_plus_a_reserve() {
    let mut h = Harness::new(core(64, 512));
    // Canvas: ceil((10 + 100) / 4) = 28 pages; the prompt's two blocks, the first decoded block
    // (holding the prompt's tail) and one reserve page are all it takes at admission.
    h.waiting.push_back(sequence(1, 10, 100));
    h.admit();
    assert_eq!(h.held(1), 4);
    while h.core.active() > 0 {
        h.step();
        if let Some(seq) = h.core.running.first() {
            let written = 10 + seq.decoder.output().len();
            assert!(
                seq.pages.pages().len() <= written.div_ceil(B) + 2,
                "{} pages for {written} positions written",
                seq.pages.pages().len()
            );
        }
    }
    assert_eq!(h.ended[&1].output.len(), 100);
    assert_eq!(h.core.cache_stats().pages_held, 0);
}

#[test]
fn admission_is_in_order_and_a_request_that_can_never_fit_is_refused() {
    let mut core = core(5, 512);
    core.admit(sequence(1, 10, 8)).ok().unwrap();
    // Request 1 holds 3 pages + 1 reserve; request 2 wants as many.
    let waiting = match core.admit(sequence(2, 10, 4)) {
        Err(Refusal::Wait(next)) => *next,
        _ => panic!("request 2 should wait"),
    };
    match core.admit(sequence(3, 30, 4)) {
        Err(Refusal::Never(EngineError::Overloaded(message))) => {
            assert!(message.contains("K/V"), "{message}")
        }
        _ => panic!("a canvas larger than the pool is refused"),
    }
    let mut h = Harness::new(core);
    h.waiting.push_back(waiting);
    h.step();
    assert_eq!(h.core.running(), 1, "request 2 still waits");
    h.run(1000);
    assert_eq!(h.ended.len(), 2);
}

#[test]
fn denoising_comes_first_and_prefill_turns_rotate_within_the_budget() {
    let mut h = Harness::new(core(4096, 8));
    // Request 1 decodes from the start (a prompt shorter than a block); 2 and 3 prefill 40
    // tokens each, two blocks per step between them.
    for (id, prompt, max_new) in [(1, 3, 400), (2, 40, 4), (3, 40, 4)] {
        h.waiting.push_back(sequence(id, prompt, max_new));
    }
    let mut prefill_order = Vec::new();
    for _ in 0..6 {
        h.step();
        let plan = h.plans.last().unwrap();
        assert_eq!(plan.segments[0].id, 1, "the denoising forward comes first");
        assert!(matches!(
            plan.segments[0].forward.want,
            Want::Top1(_) | Want::Logits(_)
        ));
        let prefill: Vec<&PlannedSegment> = plan.segments[1..].iter().collect();
        let tokens: usize = prefill.iter().map(|s| s.forward.ids.len()).sum();
        assert_eq!(tokens, 8, "prefill fills the step's budget");
        prefill_order.push(prefill[0].id);
    }
    assert_eq!(
        prefill_order,
        [2, 3, 2, 3, 2, 3],
        "prefilling requests take turns"
    );
}

#[test]
fn a_lone_prefill_takes_up_to_8192_tokens_and_shares_under_load() {
    let mut h = Harness::new(core(8192, 512));
    h.waiting.push_back(sequence(1, 10_000, 4));
    h.step();
    let first = &h.plans[0].segments;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].forward.ids.len(), LONE_PREFILL_TOKENS);

    // Under load (another request is denoising) a chunk is at most the budget.
    let mut h = Harness::new(core(8192, 512));
    h.waiting.push_back(sequence(1, 3, 400));
    h.waiting.push_back(sequence(2, 10_000, 4));
    h.step();
    let segments = &h.plans[0].segments;
    assert_eq!(segments.len(), 2);
    assert_eq!(segments[1].forward.ids.len(), PREFILL_CHUNK_TOKENS);
}

#[test]
fn the_newest_request_is_preempted_and_resumes_exactly_where_it_stopped() {
    // Two requests whose canvases take 8 pages each, on a pool of 10: both start, and the
    // older one takes the newer one's pages as it grows.
    let requests = [(1, 6, 26), (2, 6, 26)];
    let expected = alone(&requests);
    let mut h = Harness::new(core(10, 512));
    for &(id, prompt, max_new) in &requests {
        h.waiting.push_back(sequence(id, prompt, max_new));
    }
    let mut calls_before_preemption = None;
    let mut resumed_with = None;
    while h.core.active() > 0 || !h.waiting.is_empty() {
        h.step();
        assert!(
            h.core.preempted.iter().all(|s| s.id != 1),
            "the oldest request is never preempted"
        );
        if h.core.counters.preemptions > 0 && calls_before_preemption.is_none() {
            calls_before_preemption = Some(h.runner.calls.len());
        }
        if resumed_with.is_none() && calls_before_preemption.is_some() {
            if let Some(seq) = h.core.running.iter().find(|s| s.id == 2) {
                resumed_with = Some(seq.decoder.committed().to_vec());
            }
        }
        assert!(h.plans.len() < 1000, "no progress");
    }
    assert!(
        h.core.counters.preemptions > 0,
        "the pool should have run out"
    );
    assert_eq!(
        h.ended, expected,
        "preempted and resumed equals uninterrupted"
    );
    // Once resumed, the request recomputed the committed ids the cache no longer held.
    let committed = resumed_with.expect("request 2 resumed");
    let restored = h.runner.calls[calls_before_preemption.unwrap()..]
        .iter()
        .any(|c| {
            c.rows == minnow_model::LogitsRows::None
                && c.start + c.ids.len() == committed.len()
                && c.ids == committed[c.start..]
        });
    assert!(restored, "no forward recomputed {committed:?}");
    assert_eq!(h.core.cache_stats().pages_held, 0);
}

#[test]
fn requests_that_all_grow_past_the_pool_all_finish() {
    // Six requests whose canvases take 10 of the 12 pages each: they can only finish one or
    // two at a time, by preempting and resuming each other.
    let requests: Vec<(u64, usize, usize)> = (1..=6).map(|id| (id, 5, 35)).collect();
    let expected = alone(&requests);
    let mut h = Harness::new(core(12, 512));
    for &(id, prompt, max_new) in &requests {
        h.waiting.push_back(sequence(id, prompt, max_new));
    }
    h.run(10_000);
    assert_eq!(h.ended, expected);
    assert_eq!(h.core.cache_stats().pages_held, 0);
}

#[test]
fn a_cancelled_preempted_request_ends_as_cancelled() {
    let mut h = Harness::new(core(10, 512));
    h.waiting.push_back(sequence(1, 6, 26));
    let second = sequence(2, 6, 26);
    let cancel = second.cancel.clone();
    h.waiting.push_back(second);
    while h.core.preempted.is_empty() {
        h.step();
        assert!(h.plans.len() < 1000, "request 2 was never preempted");
    }
    cancel.cancel();
    h.run(1000);
    assert_eq!(h.ended[&2].reason, FinishReason::Cancelled);
    assert_eq!(h.ended[&1].reason, FinishReason::Length);
}

#[test]
fn a_stop_signal_ends_a_request_at_the_next_schedule_and_frees_its_pages() {
    let mut h = Harness::new(core(64, 512));
    let first = sequence(1, 10, 100);
    let stop = first.stop_signal.clone();
    h.waiting.push_back(first);
    h.waiting.push_back(sequence(2, 10, 20));
    while h
        .core
        .running
        .first()
        .is_none_or(|s| s.decoder.output().is_empty())
    {
        h.step();
        assert!(h.plans.len() < 1000, "request 1 never finished a block");
    }
    stop.stop();
    let plan = h.core.schedule();
    h.collect();
    assert!(
        plan.segments.iter().all(|s| s.id != 1),
        "a stopped request gets no forward"
    );
    assert_eq!(h.ended[&1].reason, FinishReason::Stop);
    assert!(h.ended[&1].output.len() < 100);
    assert_eq!(h.held(1), 0, "its pages are released at once");
    // The step goes on for the other request.
    let outputs = h
        .runner
        .forward_batch(&plan.segments())
        .map_err(|e| e.to_string());
    h.core.apply(plan, outputs, Duration::ZERO, &mut h.runner);
    h.run(1000);
    assert_eq!(h.ended[&2].reason, FinishReason::Length);
    assert_eq!(h.core.cache_stats().pages_held, 0);

    // A preempted request hears its stop signal too.
    let mut h = Harness::new(core(10, 512));
    h.waiting.push_back(sequence(1, 6, 26));
    let second = sequence(2, 6, 26);
    let stop = second.stop_signal.clone();
    h.waiting.push_back(second);
    while h.core.preempted.is_empty() {
        h.step();
        assert!(h.plans.len() < 1000, "request 2 was never preempted");
    }
    stop.stop();
    h.run(1000);
    assert_eq!(h.ended[&2].reason, FinishReason::Stop);
    assert_eq!(h.ended[&1].reason, FinishReason::Length);
}
