//! Every run of the fixtures' `golden_decode.json` (official LLaDA2.0/2.1 `generate` on the F32
//! model) reproduced token-exactly through `minnow generate --input-ids ... --json --trace`: the
//! output ids, and the block tokens after every forward (`steps`).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// The `generate` flags equivalent to one golden run's `generate_kwargs`.
fn flags_for(run: &Value) -> Vec<String> {
    let kwargs = &run["generate_kwargs"];
    let num = |key: &str| kwargs[key].to_string();
    assert_eq!(
        kwargs["temperature"].as_f64(),
        Some(0.0),
        "golden runs are greedy"
    );
    assert_eq!(kwargs["block_length"].as_u64(), Some(32));
    assert_eq!(kwargs["minimal_topk"].as_u64(), Some(1));
    assert_eq!(kwargs["eos_early_stop"], Value::Bool(false));
    let mut flags = vec![
        "--max-tokens".to_string(),
        num("gen_length"),
        "--threshold".into(),
        num("threshold"),
    ];
    match run["algorithm"].as_str() {
        Some("LLaDA2.0") => {
            flags.extend([
                "--algorithm".into(),
                "low-confidence".into(),
                "--steps".into(),
                num("steps"),
            ]);
        }
        Some("LLaDA2.1") => {
            flags.extend([
                "--algorithm".into(),
                "joint".into(),
                "--editing-threshold".into(),
                num("editing_threshold"),
                "--max-post-steps".into(),
                num("max_post_steps"),
                "--num-to-transfer".into(),
                num("num_to_transfer"),
            ]);
        }
        other => panic!("unknown golden algorithm {other:?}"),
    }
    flags
}

fn check_fixture(name: &str) {
    let dir = fixture(name);
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden_decode.json")).unwrap())
            .unwrap();
    let work = tempfile::tempdir().unwrap();
    let ids_path = work.path().join("prompt.json");
    std::fs::write(
        &ids_path,
        serde_json::json!({ "input_ids": golden["prompt_ids"] }).to_string(),
    )
    .unwrap();
    let runs = golden["runs"].as_array().unwrap();
    assert!(!runs.is_empty());
    for run in runs {
        let run_name = run["name"].as_str().unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_minnow"))
            .args([
                "--model",
                dir.to_str().unwrap(),
                "--device",
                "cpu",
                "generate",
            ])
            .args([
                "--input-ids",
                ids_path.to_str().unwrap(),
                "--json",
                "--trace",
            ])
            .args(flags_for(run))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{run_name}: minnow failed: {stderr}"
        );
        let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!("{run_name}: stdout is not one JSON object ({e}): {stderr}")
        });

        let expected_steps = run["steps"].as_array().unwrap();
        let got_steps = result["trace"].as_array().unwrap();
        for (i, (want, got)) in expected_steps.iter().zip(got_steps).enumerate() {
            assert_eq!(
                (&got["block"], &got["block_tokens"]),
                (&want["block"], &want["block_tokens"]),
                "{run_name}: forward {i} differs"
            );
        }
        assert_eq!(
            got_steps.len(),
            expected_steps.len(),
            "{run_name}: number of forwards"
        );
        assert_eq!(
            result["output_ids"], run["output_ids"],
            "{run_name}: output ids"
        );
        assert_eq!(result["finish_reason"], "length", "{run_name}");
        let stats = &result["stats"];
        assert_eq!(stats["completion_tokens"], 64, "{run_name}");
        assert_eq!(
            stats["denoise_forwards"].as_u64(),
            Some(expected_steps.len() as u64)
        );
        assert_eq!(stats["blocks"], 3, "{run_name}");
    }
}

#[test]
fn golden_decode_llada2_0() {
    check_fixture("llada2-tiny-v20");
}

#[test]
fn golden_decode_llada2_1() {
    check_fixture("llada2-tiny-v21");
}
