//! Opt-in stage timings of CPU forwards: with `MINNOW_CPU_PROFILE=1` in the environment every
//! forward prints one line to stderr (rows, start position, milliseconds per stage summed over
//! layers). Used to produce the breakdown in docs/performance.md; costs one branch otherwise.

use std::sync::OnceLock;
use std::time::Instant;

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MINNOW_CPU_PROFILE").is_some_and(|v| v != "0"))
}

pub struct StageTimes {
    on: bool,
    rows: usize,
    start: usize,
    begun: Instant,
    last: Instant,
    stages: Vec<(&'static str, f64)>,
}

impl StageTimes {
    pub fn start(rows: usize, start: usize) -> Self {
        let now = Instant::now();
        StageTimes {
            on: enabled(),
            rows,
            start,
            begun: now,
            last: now,
            stages: Vec::new(),
        }
    }

    /// Charges the time since the previous lap to `stage`.
    pub fn lap(&mut self, stage: &'static str) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        let ms = (now - self.last).as_secs_f64() * 1e3;
        self.last = now;
        match self.stages.iter_mut().find(|(s, _)| *s == stage) {
            Some((_, t)) => *t += ms,
            None => self.stages.push((stage, ms)),
        }
    }

    pub fn finish(self) {
        if !self.on {
            return;
        }
        let parts: Vec<String> = self
            .stages
            .iter()
            .map(|(s, t)| format!("{s} {t:.1}"))
            .collect();
        eprintln!(
            "cpu forward: {} rows at {}: {:.1} ms ({} ms)",
            self.rows,
            self.start,
            self.begun.elapsed().as_secs_f64() * 1e3,
            parts.join(", ")
        );
    }
}
