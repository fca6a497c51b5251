#![allow(dead_code)] // each test file that includes this module reads the fields it needs
//! Every request of a list submitted to an engine at once, each followed to its end.

use minnow_engine::{Engine, Event, GenerateRequest, GenerationStats};

/// What a request finished with.
#[derive(Debug)]
pub struct Finished {
    pub ids: Vec<u32>,
    /// The finish reason, as `Debug` prints it.
    pub reason: String,
    pub stats: GenerationStats,
}

/// Submits every request, then reads each one's events to its `Done` (a failed request or a
/// stream without `Done` panics).
pub fn run_all(engine: &Engine, requests: &[GenerateRequest]) -> Vec<Finished> {
    let mut handles: Vec<_> = requests
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    handles
        .iter_mut()
        .map(|handle| loop {
            match handle.blocking_next_event() {
                Some(Event::Done {
                    output_ids,
                    finish_reason,
                    stats,
                    ..
                }) => {
                    break Finished {
                        ids: output_ids,
                        reason: format!("{finish_reason:?}"),
                        stats,
                    }
                }
                Some(Event::Error(e)) => panic!("request failed: {e}"),
                Some(_) => {}
                None => panic!("the stream ended without Done"),
            }
        })
        .collect()
}
