//! Server counters and histograms, rendered in the Prometheus text exposition format by
//! `GET /metrics`. Gauges that the engine owns (queue depth, busy slots) are read at render time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use minnow_engine::{EngineStats, GenerationStats, BATCH_SIZE_BUCKETS};

/// Upper bounds (seconds) of the latency histogram buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

struct Histogram {
    counts: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    const fn new() -> Self {
        Self {
            counts: [0; LATENCY_BUCKETS.len()],
            count: 0,
            sum: 0.0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        for (bound, count) in LATENCY_BUCKETS.iter().zip(self.counts.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (bound, count) in LATENCY_BUCKETS.iter().zip(self.counts.iter()) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Default)]
pub struct Metrics {
    /// (route, status) -> requests answered.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    denoise_forwards: AtomicU64,
    commit_forwards: AtomicU64,
    merged_commits: AtomicU64,
    blocks: AtomicU64,
    cancelled: AtomicU64,
    generations: AtomicU64,
    /// Finished generations whose prompt took at least one block from the prefix cache.
    cache_hit_generations: AtomicU64,
    latency: Mutex<Option<Histogram>>,
    prefill: Mutex<Option<Histogram>>,
}

/// Engine gauges sampled when `/metrics` is rendered.
pub struct Gauges {
    pub queue_depth: usize,
    pub busy_slots: usize,
    pub total_slots: usize,
    /// Loaded and not draining: what `/health` answers.
    pub ready: bool,
    /// A shutdown signal arrived: no new generation is admitted.
    pub draining: bool,
    /// Generation requests admitted and not yet fully answered (`lifecycle.rs`).
    pub admitted: usize,
    /// The engine's K/V cache and batch statistics (zero while loading).
    pub engine: EngineStats,
}

impl Metrics {
    pub fn record_request(&self, route: &str, status: u16, seconds: f64) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((route.to_string(), status)).or_insert(0) += 1;
        }
        if let Ok(mut latency) = self.latency.lock() {
            latency.get_or_insert_with(Histogram::new).observe(seconds);
        }
    }

    pub fn record_generation(&self, stats: &GenerationStats) {
        self.generations.fetch_add(1, Ordering::Relaxed);
        if stats.cached_tokens > 0 {
            self.cache_hit_generations.fetch_add(1, Ordering::Relaxed);
        }
        self.prompt_tokens
            .fetch_add(stats.prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(stats.cached_tokens as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(stats.completion_tokens as u64, Ordering::Relaxed);
        self.denoise_forwards
            .fetch_add(stats.denoise_forwards as u64, Ordering::Relaxed);
        self.commit_forwards
            .fetch_add(stats.commit_forwards as u64, Ordering::Relaxed);
        self.merged_commits
            .fetch_add(stats.merged_commits as u64, Ordering::Relaxed);
        self.blocks
            .fetch_add(stats.blocks as u64, Ordering::Relaxed);
        if let Ok(mut prefill) = self.prefill.lock() {
            prefill
                .get_or_insert_with(Histogram::new)
                .observe(stats.prefill_seconds);
        }
    }

    /// A generation ended because its client went away.
    pub fn record_cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {value}");
        };
        let gauge = |out: &mut String, name: &str, help: &str, value: usize| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {value}");
        };

        let _ = writeln!(
            out,
            "# HELP minnow_requests_total HTTP requests answered, by route and status."
        );
        let _ = writeln!(out, "# TYPE minnow_requests_total counter");
        if let Ok(map) = self.requests.lock() {
            for ((route, status), count) in map.iter() {
                let _ = writeln!(
                    out,
                    "minnow_requests_total{{route=\"{route}\",status=\"{status}\"}} {count}"
                );
            }
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        counter(
            &mut out,
            "minnow_prompt_tokens_total",
            "Prompt tokens of finished generations.",
            load(&self.prompt_tokens),
        );
        counter(
            &mut out,
            "minnow_prompt_cached_tokens_total",
            "Prompt tokens served from the prefix cache.",
            load(&self.cached_tokens),
        );
        counter(
            &mut out,
            "minnow_generated_tokens_total",
            "Tokens generated by finished generations.",
            load(&self.generated_tokens),
        );
        counter(
            &mut out,
            "minnow_denoise_forwards_total",
            "Denoising forward passes.",
            load(&self.denoise_forwards),
        );
        counter(
            &mut out,
            "minnow_commit_forwards_total",
            "Commit (cache refresh) forward passes.",
            load(&self.commit_forwards),
        );
        counter(
            &mut out,
            "minnow_merged_commits_total",
            "Cache refreshes that rode on the next block's first denoising forward.",
            load(&self.merged_commits),
        );
        counter(
            &mut out,
            "minnow_blocks_total",
            "Generated blocks.",
            load(&self.blocks),
        );
        counter(
            &mut out,
            "minnow_generations_total",
            "Generations that finished (every endpoint, streamed or not).",
            load(&self.generations),
        );
        counter(
            &mut out,
            "minnow_prefix_cache_hit_generations_total",
            "Finished generations whose prompt reused at least one block from the prefix cache.",
            load(&self.cache_hit_generations),
        );
        counter(
            &mut out,
            "minnow_requests_cancelled_total",
            "Generations cancelled because the client disconnected.",
            load(&self.cancelled),
        );
        gauge(
            &mut out,
            "minnow_queue_depth",
            "Requests waiting for a slot.",
            gauges.queue_depth,
        );
        gauge(
            &mut out,
            "minnow_busy_slots",
            "Requests being decoded now.",
            gauges.busy_slots,
        );
        gauge(
            &mut out,
            "minnow_total_slots",
            "Requests that can be decoded at once (--parallel).",
            gauges.total_slots,
        );
        gauge(
            &mut out,
            "minnow_ready",
            "1 once the model is loaded, 0 again while draining (what /health answers).",
            usize::from(gauges.ready),
        );
        gauge(
            &mut out,
            "minnow_draining",
            "1 after a shutdown signal: in-flight requests finish, new ones get 503.",
            usize::from(gauges.draining),
        );
        gauge(
            &mut out,
            "minnow_requests_in_flight",
            "Generation requests admitted and not yet fully answered (streams included).",
            gauges.admitted,
        );
        let cache = &gauges.engine.cache;
        gauge(
            &mut out,
            "minnow_kv_pages_total",
            "Pages (one 32-token block each) in the K/V pool.",
            cache.pages_total,
        );
        gauge(
            &mut out,
            "minnow_kv_pages_used",
            "K/V pages held by running requests.",
            cache.pages_held,
        );
        gauge(
            &mut out,
            "minnow_kv_pages_cached",
            "Unreferenced K/V pages kept for prefix-cache hits.",
            cache.pages_cached,
        );
        counter(
            &mut out,
            "minnow_prefix_cache_hit_tokens_total",
            "Prompt tokens whose K/V came from the prefix cache.",
            cache.hit_tokens,
        );
        counter(
            &mut out,
            "minnow_prefix_cache_evicted_pages_total",
            "Cached K/V pages evicted to make room.",
            cache.evicted_pages,
        );
        counter(
            &mut out,
            "minnow_preemptions_total",
            "Requests preempted (pages given back, recomputed on resume) when the K/V cache was full.",
            gauges.engine.preemptions,
        );
        render_batch_sizes(&mut out, &gauges.engine);
        if let Ok(latency) = self.latency.lock() {
            latency.as_ref().unwrap_or(&Histogram::new()).render(
                &mut out,
                "minnow_request_duration_seconds",
                "Time from request arrival to the end of its response.",
            );
        }
        if let Ok(prefill) = self.prefill.lock() {
            prefill.as_ref().unwrap_or(&Histogram::new()).render(
                &mut out,
                "minnow_prefill_duration_seconds",
                "Prompt processing time of finished generations.",
            );
        }
        out
    }
}

/// `minnow_forward_batch_size`: sequences per batched forward, as a cumulative histogram.
fn render_batch_sizes(out: &mut String, stats: &EngineStats) {
    let name = "minnow_forward_batch_size";
    let _ = writeln!(out, "# HELP {name} Sequences per batched forward.");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0;
    for (i, bound) in BATCH_SIZE_BUCKETS.iter().enumerate() {
        cumulative += stats.batch_size_counts.get(i).copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let count: u64 = stats.batch_size_counts.iter().sum();
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {}", stats.batch_size_sum);
    let _ = writeln!(out, "{name}_count {count}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let metrics = Metrics::default();
        metrics.record_request("/v1/chat/completions", 200, 0.3);
        metrics.record_request("/v1/chat/completions", 200, 0.02);
        metrics.record_generation(&GenerationStats {
            prompt_tokens: 10,
            completion_tokens: 32,
            denoise_forwards: 5,
            ..GenerationStats::default()
        });
        // A second turn whose prompt found one block in the prefix cache.
        metrics.record_generation(&GenerationStats {
            cached_tokens: 32,
            ..GenerationStats::default()
        });
        let text = metrics.render(&Gauges {
            queue_depth: 1,
            busy_slots: 2,
            total_slots: 4,
            ready: true,
            draining: false,
            admitted: 3,
            engine: EngineStats {
                cache: minnow_engine::CacheStats {
                    pages_total: 100,
                    pages_held: 7,
                    pages_cached: 3,
                    hit_tokens: 64,
                    evicted_pages: 2,
                },
                batch_size_counts: vec![2, 0, 1, 0, 0, 0, 0, 0, 0],
                batch_size_sum: 6,
                preemptions: 5,
            },
        });
        assert!(text.contains("minnow_preemptions_total 5"));
        assert!(text.contains("minnow_requests_in_flight 3"));
        assert!(text.contains("minnow_draining 0"));
        assert!(text.contains("minnow_generations_total 2"));
        assert!(text.contains("minnow_prefix_cache_hit_generations_total 1"));
        assert!(text.contains("minnow_kv_pages_total 100"));
        assert!(text.contains("minnow_kv_pages_used 7"));
        assert!(text.contains("minnow_prefix_cache_hit_tokens_total 64"));
        assert!(text.contains("minnow_prefix_cache_evicted_pages_total 2"));
        assert!(text.contains("minnow_forward_batch_size_bucket{le=\"2\"} 2"));
        assert!(text.contains("minnow_forward_batch_size_bucket{le=\"4\"} 3"));
        assert!(text.contains("minnow_forward_batch_size_count 3"));
        assert!(
            text.contains("minnow_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2")
        );
        assert!(text.contains("minnow_prompt_tokens_total 10"));
        assert!(text.contains("minnow_generated_tokens_total 32"));
        assert!(text.contains("minnow_busy_slots 2"));
        assert!(text.contains("minnow_request_duration_seconds_bucket{le=\"0.025\"} 1"));
        assert!(text.contains("minnow_request_duration_seconds_bucket{le=\"0.5\"} 2"));
        assert!(text.contains("minnow_request_duration_seconds_count 2"));
        assert!(text.contains("minnow_prefill_duration_seconds_count 2"));
    }
}
