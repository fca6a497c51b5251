//! The llama.cpp web UI end to end in a real browser: `minnow serve --ui-dir` with a current
//! build of llama.cpp's UI, driven in Debian's headless Chromium by `tests/webui/chat.mjs`
//! (npm `puppeteer-core`, which never downloads a browser): load, type, send, see the streamed
//! content on screen, regenerate, press stop while a long answer streams (and the server counts
//! that request as cancelled), no unknown field in what the UI sends, no error dialog, no failed
//! API call.
//!
//! The UI is never part of this repository: `MINNOW_WEBUI_DIR` names a build (default
//! `../shared/webui/llama-ui-2026-08` beside the repository), `MINNOW_CHROMIUM` the browser
//! (default `/usr/bin/chromium`). A missing UI, browser or `tests/webui/node_modules` (`npm ci`)
//! fails the test; `MINNOW_SKIP_BROWSER_TEST=1` is the explicit opt-out.

#[path = "server_harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use harness::*;

const REPO_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const SCRIPT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/webui");

/// What the browser test needs, or why it cannot run.
struct Setup {
    ui_dir: PathBuf,
    chromium: PathBuf,
}

fn setup() -> Result<Setup, String> {
    let ui_dir = match std::env::var_os("MINNOW_WEBUI_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(REPO_ROOT).join("../shared/webui/llama-ui-2026-08"),
    };
    if !ui_dir.join("index.html").is_file() {
        return Err(format!(
            "no web UI build at {} (set MINNOW_WEBUI_DIR to a build of llama.cpp's tools/ui)",
            ui_dir.display()
        ));
    }
    let chromium = std::env::var_os("MINNOW_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    if !chromium.is_file() {
        return Err(format!(
            "no browser at {} (apt-get install chromium, or set MINNOW_CHROMIUM)",
            chromium.display()
        ));
    }
    if !Path::new(SCRIPT_DIR)
        .join("node_modules/puppeteer-core")
        .is_dir()
    {
        return Err(format!(
            "puppeteer-core is not installed (run `npm ci` in {SCRIPT_DIR})"
        ));
    }
    Ok(Setup { ui_dir, chromium })
}

/// The tiny fixture with a 4096-token context: the UI declares two tools of its own (date and
/// runtime info) with every message, which alone outgrows the fixture's 512 positions. RoPE
/// works at any position, and the weights are random anyway.
fn roomy_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(FIXTURE_V21).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["max_position_embeddings"] = serde_json::json!(4096);
    std::fs::write(&path, config.to_string()).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn llama_web_ui_chats_in_headless_chromium() {
    let setup = match setup() {
        Ok(setup) => setup,
        Err(reason) if std::env::var("MINNOW_SKIP_BROWSER_TEST").as_deref() == Ok("1") => {
            eprintln!("skipping the browser test (MINNOW_SKIP_BROWSER_TEST=1): {reason}");
            return;
        }
        Err(reason) => panic!(
            "the browser test cannot run: {reason}; set MINNOW_SKIP_BROWSER_TEST=1 to skip it"
        ),
    };
    let ui = setup.ui_dir.to_str().unwrap().to_string();
    let model = roomy_fixture();
    let model_arg = model.path().to_str().unwrap().to_string();
    // The script sets the answers' lengths in the UI's settings (short ones, then a long one to
    // stop). One position per forward (low-confidence decoding, a threshold nothing reaches, 32
    // steps a block) keeps the long one streaming for seconds, so the click lands mid-generation.
    let server = Server::start(
        Some(&model_arg),
        &[
            "--ui-dir",
            &ui,
            "--seed",
            "7",
            "--algorithm",
            "low-confidence",
            "--threshold",
            "1",
            "--steps",
            "32",
        ],
    )
    .await;
    let profile = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output = tokio::task::spawn_blocking({
        let base = server.base.clone();
        let chromium = setup.chromium.clone();
        let profile = profile.path().to_path_buf();
        move || {
            Command::new("node")
                .arg(Path::new(SCRIPT_DIR).join("chat.mjs"))
                .env("MINNOW_BASE_URL", base)
                .env("MINNOW_CHROMIUM", chromium)
                .env("MINNOW_PROFILE_DIR", profile)
                .output()
                .expect("run node (is Node.js installed?)")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the web UI check failed after {:?}:\n{stdout}\n{stderr}\nserver log:\n{}",
        started.elapsed(),
        server.logs().join("\n")
    );
    assert!(started.elapsed() < Duration::from_secs(120));
    // The stopped answer was cancelled on the server, not generated to its end: the server saw
    // the client go and cancelled exactly that one generation.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let cancelled = server.metric("minnow_requests_cancelled_total").await;
        if cancelled == 1.0 {
            break;
        }
        assert!(
            cancelled == 0.0 && Instant::now() < deadline,
            "{cancelled} generations cancelled, 1 expected:\n{stdout}\nserver log:\n{}",
            server.logs().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("{stdout}");
}
