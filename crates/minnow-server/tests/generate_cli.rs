//! `minnow generate` end to end on the tiny fixtures: output modes, prompt sources, decode flags,
//! the 2.2 indel decoder, and one-line errors.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn minnow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minnow"))
        .env_remove("MINNOW_MODEL")
        .args(args)
        .output()
        .unwrap()
}

fn with_model(name: &str, args: &[&str]) -> Output {
    let dir = fixture(name);
    let mut all = vec![
        "--model",
        dir.to_str().unwrap(),
        "--device",
        "cpu",
        "generate",
    ];
    all.extend_from_slice(args);
    minnow(&all)
}

fn json_of(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "minnow failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON object")
}

fn error_line(output: &Output) -> String {
    assert!(!output.status.success(), "expected a failure");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let line = stderr.lines().last().unwrap_or_default().to_string();
    assert!(line.starts_with("minnow: error: "), "{stderr}");
    line
}

/// The golden prompt as an --input-ids file.
fn golden_prompt_file(dir: &tempfile::TempDir) -> PathBuf {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("llada2-tiny-v21").join("golden_decode.json")).unwrap(),
    )
    .unwrap();
    let path = dir.path().join("prompt.json");
    std::fs::write(
        &path,
        serde_json::json!({"input_ids": golden["prompt_ids"]}).to_string(),
    )
    .unwrap();
    path
}

#[test]
fn json_output_has_ids_text_reason_and_stats() {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.json");
    std::fs::write(&ids, r#"{"input_ids": [10, 20, 30, 40, 50]}"#).unwrap();
    let out = json_of(&with_model(
        "llada2-tiny-v21",
        &[
            "--input-ids",
            ids.to_str().unwrap(),
            "--max-tokens",
            "40",
            "--json",
        ],
    ));
    assert_eq!(out["output_ids"].as_array().unwrap().len(), 40);
    assert_eq!(out["finish_reason"], "length");
    assert!(out["text"].is_string());
    let stats = &out["stats"];
    assert_eq!(stats["completion_tokens"], 40);
    assert_eq!(stats["prompt_tokens"], 5);
    // P = 5, N = 40: canvas [0, 64), two blocks, nothing prefilled.
    assert_eq!(stats["blocks"], 2);
    assert_eq!(stats["steps_per_block"].as_array().unwrap().len(), 2);
    assert!(out.get("trace").is_none(), "trace only with --trace");
}

#[test]
fn streamed_text_equals_the_json_text() {
    let args = ["hello", "--system", "Be brief.", "--max-tokens", "70"];
    let streamed = with_model("llada2-tiny-v21", &args);
    assert!(
        streamed.status.success(),
        "{}",
        String::from_utf8_lossy(&streamed.stderr)
    );
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = json_of(&with_model("llada2-tiny-v21", &json_args));
    let stdout = String::from_utf8(streamed.stdout).unwrap();
    assert_eq!(
        stdout.strip_suffix('\n').unwrap(),
        out["text"].as_str().unwrap()
    );
    let stderr = String::from_utf8_lossy(&streamed.stderr);
    assert!(stderr.contains("completion 70 tokens"), "{stderr}");
}

#[test]
fn stop_string_ends_the_text() {
    let full = json_of(&with_model(
        "llada2-tiny-v21",
        &["--raw", "hello", "--max-tokens", "60", "--json"],
    ));
    let text = full["text"].as_str().unwrap();
    // Take a 3-character stop string from the middle of the greedy output.
    let start = text
        .char_indices()
        .map(|(i, _)| i)
        .nth(text.chars().count() / 2)
        .unwrap();
    let stop: String = text[start..].chars().take(3).collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let out = json_of(&with_model(
        "llada2-tiny-v21",
        &[
            "--raw",
            "hello",
            "--max-tokens",
            "60",
            "--json",
            "--stop",
            &stop,
        ],
    ));
    assert_eq!(out["finish_reason"], "stop");
    assert_eq!(out["text"].as_str().unwrap(), cut);
    assert!(out["output_ids"].as_array().unwrap().len() < 60);
}

#[test]
fn indel_on_the_v22_fixture_terminates_with_clean_output() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = golden_prompt_file(&dir);
    let out = json_of(&with_model(
        "llada2-tiny-v22",
        &[
            "--input-ids",
            prompt.to_str().unwrap(),
            "--max-tokens",
            "64",
            "--json",
            "--trace",
        ],
    ));
    let ids: Vec<u64> = out["output_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(!ids.is_empty());
    // No MASK (482), DELETE (486) or SPLIT (487) in the answer.
    assert!(
        ids.iter().all(|id| ![482, 486, 487].contains(id)),
        "{ids:?}"
    );
    let trace = out["trace"].as_array().unwrap();
    assert_eq!(
        out["stats"]["denoise_forwards"].as_u64(),
        Some(trace.len() as u64)
    );
    // Every block ends within the forward limit B + max_post_steps + steps (+1 forced round).
    for n in out["stats"]["steps_per_block"].as_array().unwrap() {
        assert!(n.as_u64().unwrap() <= 32 + 16 + 32 + 1);
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    let args = [
        "--raw",
        "hello",
        "--max-tokens",
        "48",
        "--json",
        "--temperature",
        "0.9",
        "--top-k",
        "40",
        "--top-p",
        "0.95",
        "--seed",
        "11",
    ];
    let a = json_of(&with_model("llada2-tiny-v21", &args));
    let b = json_of(&with_model("llada2-tiny-v21", &args));
    assert_eq!(a["output_ids"], b["output_ids"]);
    let greedy = json_of(&with_model(
        "llada2-tiny-v21",
        &["--raw", "hello", "--max-tokens", "48", "--json"],
    ));
    assert_ne!(
        a["output_ids"], greedy["output_ids"],
        "temperature 0.9 should leave the greedy path"
    );
}

#[test]
fn every_algorithm_runs_on_a_v21_checkpoint_but_indel() {
    for algorithm in ["low-confidence", "joint"] {
        let out = json_of(&with_model(
            "llada2-tiny-v21",
            &[
                "--raw",
                "hi",
                "--max-tokens",
                "20",
                "--json",
                "--algorithm",
                algorithm,
            ],
        ));
        assert_eq!(
            out["output_ids"].as_array().unwrap().len(),
            20,
            "{algorithm}"
        );
    }
    let err = error_line(&with_model(
        "llada2-tiny-v21",
        &["--raw", "hi", "--algorithm", "indel"],
    ));
    assert!(err.contains("indel"), "{err}");
}

#[test]
fn bad_inputs_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "[1, 2, 3]").unwrap();
    let err = error_line(&with_model(
        "llada2-tiny-v21",
        &["--input-ids", bad.to_str().unwrap()],
    ));
    assert!(err.contains("input_ids"), "{err}");

    let masked = dir.path().join("masked.json");
    std::fs::write(&masked, r#"{"input_ids": [1, 482, 2]}"#).unwrap();
    let err = error_line(&with_model(
        "llada2-tiny-v21",
        &["--input-ids", masked.to_str().unwrap()],
    ));
    assert!(err.contains("mask"), "{err}");

    let ok = golden_prompt_file(&dir);
    let err = error_line(&with_model(
        "llada2-tiny-v21",
        &["hi", "--input-ids", ok.to_str().unwrap()],
    ));
    assert!(err.contains("--input-ids"), "{err}");

    let err = error_line(&with_model(
        "llada2-tiny-v21",
        &["--raw", "hi", "--max-tokens", "600"],
    ));
    assert!(err.contains("context"), "{err}");

    let err = error_line(&with_model(
        "llada2-tiny-v21",
        &["--raw", "hi", "--threshold", "2"],
    ));
    assert!(err.contains("threshold"), "{err}");

    let err = error_line(&with_model("llada2-tiny-v21", &[]));
    assert!(err.contains("PROMPT"), "{err}");
}

#[test]
fn without_model_the_bundled_fixture_is_used_and_announced() {
    let out = minnow(&[
        "--device",
        "cpu",
        "generate",
        "--raw",
        "hi",
        "--max-tokens",
        "4",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("bundled tiny fixture"), "{stderr}");
    assert_eq!(json_of(&out)["output_ids"].as_array().unwrap().len(), 4);
}

#[test]
fn greedy_indel_is_deterministic_despite_its_random_anti_loop() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = golden_prompt_file(&dir);
    let args = [
        "--input-ids",
        prompt.to_str().unwrap(),
        "--max-tokens",
        "64",
        "--json",
        "--trace",
    ];
    let a = json_of(&with_model("llada2-tiny-v22", &args));
    let b = json_of(&with_model("llada2-tiny-v22", &args));
    assert_eq!(a["trace"], b["trace"]);
    assert_eq!(a["output_ids"], b["output_ids"]);
}
