//! minnow as a worker behind a real router (docs/deploy.md): sglang-router (the `sglang_router`
//! Python package, whose router is Rust) in front of three CPU replicas of the tiny fixture.
//!
//! One test, in phases over the same replicas:
//! 1. cache-aware policy, 24 three-turn conversations: second and third turns land on the
//!    replica that holds their prefix (`usage.prompt_tokens_details.cached_tokens`, and the
//!    replicas' `minnow_prefix_cache_hit_generations_total` agree), and load spreads;
//! 2. round-robin, 24 new conversations: the same measurement, for comparison (not asserted:
//!    which replica a turn meets depends on how the conversations interleave);
//! 3. a rolling restart under load (cache-aware, half the clients streaming): each replica in
//!    turn gets SIGTERM while it is decoding, drains (its requests finish), exits 0 and comes
//!    back on its port; no request fails;
//! 4. a replica killed (SIGKILL) under the same load: requests in flight on it may fail (the
//!    router cannot replay a stream it has started forwarding); every later request succeeds.
//!
//! Replicas and router share one API key, as docs/deploy.md sets them up.
//!
//! The router comes from `MINNOW_ROUTER_PYTHON` (default `python3`) with `sglang-router` installed
//! (`pip install sglang-router==0.3.2`); without it the test fails and says so, unless
//! `MINNOW_SKIP_ROUTER_TEST=1`.

#[path = "server_harness.rs"]
mod harness;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use harness::{parse_sse, Server, Sse, FIXTURE_V21};
use serde_json::{json, Value};

/// The router release the test and docs/deploy.md were checked with.
const ROUTER_VERSION: &str = "0.3.2";

const REPLICAS: usize = 3;
const CONVERSATIONS: usize = 24;
const TURNS: usize = 3;
const MODEL: &str = "tiny";

/// The key the replicas require and the router both requires from clients and sends on
/// (sglang-router's `--api-key` is one key for both sides).
const API_KEY: &str = "replica-key";

/// Replica flags: the model under a short id, the key, a drain bound, one thread each (three
/// replicas share the host).
const REPLICA_ARGS: &[&str] = &[
    "--threads",
    "1",
    "--alias",
    MODEL,
    "--api-key",
    API_KEY,
    "--shutdown-grace",
    "20",
];

fn router_python() -> Option<String> {
    let python = std::env::var("MINNOW_ROUTER_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args([
            "-c",
            "import sglang_router.version as v; print(v.__version__)",
        ])
        .output();
    match probe {
        Ok(out) if out.status.success() => {
            let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if version != ROUTER_VERSION {
                eprintln!(
                    "note: sglang-router {version} (the test was written for {ROUTER_VERSION})"
                );
            }
            Some(python)
        }
        _ => None,
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_replica(listen: &str) -> Server {
    Server::spawn_at(listen, Some(FIXTURE_V21), REPLICA_ARGS)
}

/// The router process (the Python launcher runs the Rust router in-process).
struct Router {
    child: Child,
    base: String,
    /// The router's own Prometheus endpoint.
    metrics: String,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Router {
    fn start(python: &str, workers: &[String], policy: &str) -> Router {
        let port = free_port();
        let metrics_port = free_port();
        let mut command = Command::new(python);
        command
            .args(["-m", "sglang_router.launch_router"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--prometheus-host", "127.0.0.1"])
            .args(["--prometheus-port", &metrics_port.to_string()])
            .arg("--worker-urls")
            .args(workers)
            .args(["--policy", policy])
            .args(["--api-key", API_KEY])
            // Notice a draining or dead replica within a second, and take it back as soon as it
            // answers again (docs/deploy.md).
            .args(["--health-check-interval-secs", "1"])
            .args(["--health-failure-threshold", "1"])
            .args(["--health-success-threshold", "1"])
            // Retries spread over ~2.5 s, longer than the health check takes to notice.
            .args(["--retry-max-retries", "6"])
            .args(["--retry-initial-backoff-ms", "200"])
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start the router");
        let logs = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    logs.lock().unwrap().push(line);
                }
            });
        }
        Router {
            child,
            base: format!("http://127.0.0.1:{port}"),
            metrics: format!("http://127.0.0.1:{metrics_port}/metrics"),
            logs,
        }
    }

    /// The router's count of retried requests, for the record.
    async fn retries(&self) -> Vec<String> {
        let text = match reqwest::get(&self.metrics).await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(e) => return vec![format!("no router metrics: {e}")],
        };
        text.lines()
            .filter(|l| l.starts_with("smg_worker_retries_total"))
            .map(str::to_string)
            .collect()
    }

    /// Waits until the router counts `n` healthy workers.
    async fn wait_healthy(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let client = reqwest::Client::new();
        loop {
            if let Ok(response) = client.get(format!("{}/readiness", self.base)).send().await {
                if let Ok(body) = response.json::<Value>().await {
                    if body["healthy_workers"].as_u64() == Some(n) {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "the router did not see {n} healthy workers; log:\n{}",
                self.logs.lock().unwrap().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first message of conversation `id`: distinct from its first characters on (so that no
/// two conversations share a cached block) and long enough to fill complete K/V blocks.
fn opening(id: &str) -> String {
    let mut state = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut words = Vec::new();
    for _ in 0..24 {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        words.push(format!("{:x}", state >> 44));
    }
    format!("{} {id}: {}", &words[0], words[1..].join(" "))
}

/// One turn as the client saw it.
#[derive(Debug, Clone)]
struct Turn {
    turn: usize,
    stream: bool,
    started: Instant,
    ended: Instant,
    /// The answer, or what went wrong.
    outcome: Result<Answer, String>,
}

#[derive(Debug, Clone)]
struct Answer {
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// Runs one conversation of `TURNS` turns through the router; stops at the first failure.
async fn converse(client: &reqwest::Client, router: &str, id: &str, stream: bool) -> Vec<Turn> {
    let mut messages = vec![json!({"role": "user", "content": opening(id)})];
    let mut turns = Vec::new();
    for turn in 0..TURNS {
        if turn > 0 {
            messages.push(json!({
                "role": "user",
                "content": format!("turn {turn} of {id}: go on"),
            }));
        }
        let mut body = json!({
            "model": MODEL,
            "messages": messages,
            "max_tokens": 8,
            "stream": stream,
        });
        if stream {
            // (the router refuses stream_options on a request that does not stream)
            body["stream_options"] = json!({"include_usage": true});
        }
        let started = Instant::now();
        let outcome = ask(client, router, &body, stream).await;
        let ended = Instant::now();
        let failed = outcome.is_err();
        if let Ok((text, _)) = &outcome {
            messages.push(json!({"role": "assistant", "content": text}));
        }
        turns.push(Turn {
            turn,
            stream,
            started,
            ended,
            outcome: outcome.map(|(_, answer)| answer),
        });
        if failed {
            break;
        }
    }
    turns
}

/// One chat request; the answer's text and token counts, or a description of the failure.
async fn ask(
    client: &reqwest::Client,
    router: &str,
    body: &Value,
    stream: bool,
) -> Result<(String, Answer), String> {
    let response = client
        .post(format!("{router}/v1/chat/completions"))
        .bearer_auth(API_KEY)
        .json(body)
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status();
    if !stream || status != 200 {
        let text = response.text().await.map_err(|e| format!("body: {e}"))?;
        if status != 200 {
            return Err(format!("HTTP {status}: {text}"));
        }
        let value: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        let content = value["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        return Ok((content, answer_of(&value["usage"])?));
    }
    let mut raw = String::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| format!("stream broken after {raw:?}: {e}"))?;
        raw.push_str(&String::from_utf8_lossy(&chunk));
    }
    if !raw.ends_with("\n\n") {
        return Err(format!("stream cut: {raw:?}"));
    }
    let events = parse_sse(&raw);
    if events.last() != Some(&Sse::Done) {
        return Err(format!("stream without [DONE]: {raw:?}"));
    }
    let mut text = String::new();
    let mut usage = None;
    for event in &events {
        let Sse::Data(data) = event else { continue };
        if data.get("error").is_some() {
            return Err(format!("error event: {data}"));
        }
        if let Some(delta) = data["choices"][0]["delta"]["content"].as_str() {
            text.push_str(delta);
        }
        if data["usage"].is_object() {
            usage = Some(data["usage"].clone());
        }
    }
    let usage = usage.ok_or_else(|| format!("no usage chunk: {raw:?}"))?;
    Ok((text, answer_of(&usage)?))
}

fn answer_of(usage: &Value) -> Result<Answer, String> {
    Ok(Answer {
        prompt_tokens: usage["prompt_tokens"]
            .as_u64()
            .ok_or_else(|| format!("no prompt_tokens in {usage}"))?,
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    })
}

/// Runs `CONVERSATIONS` conversations, `concurrency` at a time.
async fn run_conversations(router: &str, tag: &str, concurrency: usize) -> Vec<Vec<Turn>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(Mutex::new(vec![Vec::new(); CONVERSATIONS]));
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, router, tag) = (client.clone(), router.to_string(), tag.to_string());
            let (next, results) = (next.clone(), results.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= CONVERSATIONS {
                        return;
                    }
                    let turns = converse(&client, &router, &format!("{tag}-{i}"), false).await;
                    results.lock().unwrap()[i] = turns;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let results = results.lock().unwrap().clone();
    results
}

/// A replica's metric (its `/metrics` needs the key).
async fn metric(replica: &Server, name: &str) -> f64 {
    let text = reqwest::Client::new()
        .get(replica.url("/metrics"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
}

/// A counter of every replica, one entry per replica.
async fn counters(replicas: &[Server], name: &str) -> Vec<f64> {
    let mut values = Vec::new();
    for replica in replicas {
        values.push(metric(replica, name).await);
    }
    values
}

struct HitRate {
    hits: usize,
    later_turns: usize,
}

/// Checks every turn succeeded and that first turns found nothing cached (the conversations
/// share no block); returns how many later turns reused their prefix.
fn hit_rate(conversations: &[Vec<Turn>]) -> HitRate {
    let mut rate = HitRate {
        hits: 0,
        later_turns: 0,
    };
    for turns in conversations {
        assert_eq!(turns.len(), TURNS, "{turns:?}");
        for turn in turns {
            let answer = turn.outcome.as_ref().expect("every turn answered");
            if turn.turn == 0 {
                assert_eq!(answer.cached_tokens, 0, "first turns share no prefix");
                assert!(
                    answer.prompt_tokens >= 64,
                    "a first turn fills whole K/V blocks ({} tokens)",
                    answer.prompt_tokens
                );
            } else {
                rate.later_turns += 1;
                rate.hits += usize::from(answer.cached_tokens > 0);
            }
        }
    }
    rate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_behind_sglang_router() {
    let Some(python) = router_python() else {
        if std::env::var("MINNOW_SKIP_ROUTER_TEST").as_deref() == Ok("1") {
            eprintln!("skipped on purpose (MINNOW_SKIP_ROUTER_TEST=1)");
            return;
        }
        panic!(
            "sglang-router is not installed for {} (set MINNOW_ROUTER_PYTHON, or run \
             `python3 -m pip install sglang-router=={ROUTER_VERSION}`; \
             MINNOW_SKIP_ROUTER_TEST=1 skips this test on purpose)",
            std::env::var("MINNOW_ROUTER_PYTHON").unwrap_or_else(|_| "python3".into())
        );
    };
    let started = Instant::now();
    let mut replicas: Vec<Server> = (0..REPLICAS)
        .map(|_| start_replica("127.0.0.1:0"))
        .collect();
    for replica in &replicas {
        replica.wait_ready().await;
    }
    let urls: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();

    // 1. Cache-aware.
    let router = Router::start(&python, &urls, "cache_aware");
    router.wait_healthy(REPLICAS as u64).await;
    let served_before = counters(&replicas, "minnow_generations_total").await;
    let hits_before = counters(&replicas, "minnow_prefix_cache_hit_generations_total").await;
    let conversations = run_conversations(&router.base, "aware", 6).await;
    let aware = hit_rate(&conversations);
    let served = delta(
        &counters(&replicas, "minnow_generations_total").await,
        &served_before,
    );
    let hits = delta(
        &counters(&replicas, "minnow_prefix_cache_hit_generations_total").await,
        &hits_before,
    );
    eprintln!(
        "cache_aware: {}/{} later turns hit their prefix; generations per replica {served:?}, \
         cache-hit generations per replica {hits:?}",
        aware.hits, aware.later_turns
    );
    assert_eq!(served.iter().sum::<f64>() as usize, CONVERSATIONS * TURNS);
    assert_eq!(
        hits.iter().sum::<f64>() as usize,
        aware.hits,
        "the replicas' metrics count the hits the clients saw"
    );
    assert!(
        aware.hits * 10 >= aware.later_turns * 9,
        "at least 90% of later turns hit their cache: {}/{}",
        aware.hits,
        aware.later_turns
    );
    for (i, n) in served.iter().enumerate() {
        assert!(
            *n as usize >= CONVERSATIONS * TURNS / (2 * REPLICAS),
            "replica {i} served {n} of {} generations: load did not spread ({served:?})",
            CONVERSATIONS * TURNS
        );
    }
    drop(router);

    // 2. Round-robin, measured for comparison.
    let router = Router::start(&python, &urls, "round_robin");
    router.wait_healthy(REPLICAS as u64).await;
    let conversations = run_conversations(&router.base, "round", 6).await;
    let round = hit_rate(&conversations);
    eprintln!(
        "round_robin: {}/{} later turns hit their prefix",
        round.hits, round.later_turns
    );
    drop(router);

    // 3. Rolling restart under load.
    let router = Router::start(&python, &urls, "cache_aware");
    router.wait_healthy(REPLICAS as u64).await;
    let load = Load::start(&router.base, "rolling", 6);
    for (i, replica) in replicas.iter_mut().enumerate() {
        let addr = replica.addr.clone();
        wait_busy(replica).await;
        replica.signal("TERM");
        let status = replica
            .wait_exit(Duration::from_secs(30))
            .expect("a draining replica exits");
        assert!(status.success(), "replica {i} drained cleanly: {status:?}");
        let drained = replica
            .logs()
            .into_iter()
            .find(|l| l.contains("draining"))
            .unwrap_or_default();
        eprintln!("replica {i}: {drained}");
        *replica = start_replica(&addr);
        replica.wait_ready().await;
        router.wait_healthy(REPLICAS as u64).await;
    }
    // The restarted replicas take their share again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let turns = load.stop().await;
    let served = counters(&replicas, "minnow_generations_total").await;
    eprintln!("after the restart, generations per (restarted) replica: {served:?}");
    assert!(served.iter().all(|n| *n > 0.0), "{served:?}");
    let failed: Vec<_> = turns.iter().filter(|t| t.outcome.is_err()).collect();
    eprintln!(
        "rolling restart: {} turns, {} failed; router: {:?}",
        turns.len(),
        failed.len(),
        router.retries().await
    );
    assert!(
        failed.is_empty(),
        "no request fails in a rolling restart: {failed:?}"
    );

    // 4. A replica killed under load.
    let load = Load::start(&router.base, "kill", 6);
    wait_busy(&replicas[0]).await;
    let killed_at = Instant::now();
    replicas[0].signal("KILL");
    tokio::time::sleep(Duration::from_secs(3)).await;
    router.wait_healthy(REPLICAS as u64 - 1).await;
    let turns = load.stop().await;
    let failed: Vec<_> = turns.iter().filter(|t| t.outcome.is_err()).collect();
    let after_kill = turns.iter().filter(|t| t.started > killed_at).count();
    let in_flight = |stream: bool| {
        turns
            .iter()
            .filter(|t| t.stream == stream && t.started < killed_at && t.ended > killed_at)
            .count()
    };
    eprintln!(
        "killed replica 0: {} turns ({after_kill} started after the kill); in flight at the kill \
         (on any replica): {} streamed, {} not; failed: {} streamed, {} not: {:?}",
        turns.len(),
        in_flight(true),
        in_flight(false),
        failed.iter().filter(|t| t.stream).count(),
        failed.iter().filter(|t| !t.stream).count(),
        failed.iter().map(|t| t.outcome.clone()).collect::<Vec<_>>()
    );
    for turn in &failed {
        assert!(
            turn.started < killed_at && turn.ended > killed_at,
            "only requests in flight at the kill may fail: {turn:?}"
        );
    }
    assert!(after_kill > 0, "the load went on after the kill");
    eprintln!("router retry counters: {:?}", router.retries().await);
    eprintln!("router test took {:.1}s", started.elapsed().as_secs_f64());
}

fn delta(now: &[f64], before: &[f64]) -> Vec<f64> {
    now.iter().zip(before).map(|(a, b)| a - b).collect()
}

/// Waits until the replica is decoding something (so that a signal meets work in flight).
async fn wait_busy(replica: &Server) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(replica, "minnow_busy_slots").await < 1.0 {
        assert!(Instant::now() < deadline, "the replica never got work");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Conversations started back to back until `stop`; half the clients stream.
struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<Turn>>>,
}

impl Load {
    fn start(router: &str, tag: &str, concurrency: usize) -> Load {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..concurrency)
            .map(|w| {
                let (client, router, tag) = (client.clone(), router.to_string(), tag.to_string());
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut turns = Vec::new();
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let id = format!("{tag}-{w}-{n}");
                        let stream = w % 2 == 0;
                        turns.extend(converse(&client, &router, &id, stream).await);
                        n += 1;
                    }
                    turns
                })
            })
            .collect();
        Load { stop, workers }
    }

    async fn stop(self) -> Vec<Turn> {
        self.stop.store(true, Ordering::SeqCst);
        let mut turns = Vec::new();
        for worker in self.workers {
            turns.extend(worker.await.unwrap());
        }
        turns
    }
}
