//! `minnow convert`, `validate` and `inspect` on `.mnw` files, and generation from one: the
//! binary end to end on the tiny fixtures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn minnow(model: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minnow"))
        .env_remove("MINNOW_MODEL")
        .arg("--model")
        .arg(model)
        .args(args)
        .output()
        .unwrap()
}

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "minnow failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn error_text(output: &Output) -> String {
    assert!(!output.status.success(), "expected a failure");
    String::from_utf8_lossy(&output.stderr).to_string()
}

fn convert(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut all = vec!["convert", out.to_str().unwrap()];
    all.extend_from_slice(args);
    ok(minnow(&fixture("llada2-tiny-v21"), &all));
    out
}

#[test]
fn converts_identically_for_any_worker_count_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--experts", "int8", "--group-size", "32"];
    let one = convert(
        dir.path(),
        "w1.mnw",
        &[&flags[..], &["--workers", "1"]].concat(),
    );
    let four = convert(
        dir.path(),
        "w4.mnw",
        &[&flags[..], &["--workers", "4"]].concat(),
    );
    assert!(std::fs::read(&one).unwrap() == std::fs::read(&four).unwrap());
    let report = ok(minnow(&one, &["validate"]));
    assert!(report.contains(": ok ("), "{report}");
    let inspect = ok(minnow(&one, &["inspect"]));
    assert!(
        inspect.contains("encoding       i8_mma, group size 32: 48 tensors"),
        "{inspect}"
    );
    assert!(inspect.contains("LLaDA2.1"), "{inspect}");
    // Only the .mnw and nothing temporary is left in the directory.
    let mut left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["w1.mnw", "w4.mnw"]);
}

/// A `.mnw` is a complete model: generation from it (tokenizer, template and config from its
/// assets) matches generation from the directory it was written from.
#[test]
fn generates_from_a_mnw_like_from_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = convert(dir.path(), "orig.mnw", &[]);
    let args = [
        "--device",
        "cpu",
        "generate",
        "Hello there",
        "--max-tokens",
        "32",
        "--json",
    ];
    let from_dir = ok(minnow(&fixture("llada2-tiny-v21"), &args));
    let from_file = ok(minnow(&file, &args));
    let strip = |s: &str| {
        let mut v: serde_json::Value = serde_json::from_str(s).unwrap();
        v.as_object_mut().unwrap().remove("stats");
        v
    };
    assert_eq!(strip(&from_dir), strip(&from_file));
}

#[test]
fn never_overwrites_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("taken.mnw");
    std::fs::write(&out, b"keep me").unwrap();
    let output = minnow(
        &fixture("llada2-tiny-v21"),
        &["convert", out.to_str().unwrap()],
    );
    assert!(error_text(&output).contains("already exists"));
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
}

#[test]
fn validate_names_the_damaged_tensor_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let file = convert(
        dir.path(),
        "x.mnw",
        &["--experts", "int4", "--group-size", "32"],
    );
    let mut bytes = std::fs::read(&file).unwrap();
    // The first region after the header belongs to the first tensor in name order.
    bytes[4096 + 3] ^= 0x10;
    std::fs::write(&file, &bytes).unwrap();
    let err = error_text(&minnow(&file, &["validate"]));
    assert!(err.contains("tensor 'lm_head.weight' data"), "{err}");
    assert!(err.contains("BLAKE3"), "{err}");

    // Truncated: validate and every loading command refuse it with one clear line.
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    assert!(error_text(&minnow(&file, &["validate"])).contains("truncated or appended"));
    let err = error_text(&minnow(&file, &["inspect"]));
    assert!(
        err.lines().count() == 1 && err.contains("truncated or appended"),
        "{err}"
    );
}

#[test]
fn bad_rules_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.json");
    std::fs::write(
        &rules,
        r#"[{"prefix": "model.nothing", "encoding": "i8_sym"}]"#,
    )
    .unwrap();
    let out = dir.path().join("r.mnw");
    let output = minnow(
        &fixture("llada2-tiny-v21"),
        &[
            "convert",
            out.to_str().unwrap(),
            "--tensor-rules",
            rules.to_str().unwrap(),
        ],
    );
    assert!(error_text(&output).contains("matches no tensor"));
    assert!(!out.exists());
}

/// A synthetic checkpoint large enough that conversion takes a while: 24 experts of
/// [1024, 2048] BF16 (96 MiB), with stand-in text assets (convert copies them unread).
fn large_checkpoint(dir: &Path) {
    let data = vec![0x3Fu8; 1024 * 2048 * 2];
    let names: Vec<String> = (0..24)
        .map(|e| format!("model.layers.1.mlp.experts.{e}.gate_proj.weight"))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = names
        .iter()
        .map(|n| {
            let v = safetensors::tensor::TensorView::new(
                safetensors::Dtype::BF16,
                vec![1024, 2048],
                &data,
            )
            .unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    for asset in ["config.json", "tokenizer.json", "chat_template.jinja"] {
        std::fs::write(dir.join(asset), "{}").unwrap();
    }
}

#[test]
fn ctrl_c_mid_convert_leaves_nothing() {
    let src = tempfile::tempdir().unwrap();
    large_checkpoint(src.path());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("big.mnw");
    let mut child = Command::new(env!("CARGO_BIN_EXE_minnow"))
        .arg("--model")
        .arg(src.path())
        .args([
            "convert",
            out.to_str().unwrap(),
            "--experts",
            "int4",
            "--workers",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt as soon as the temporary file exists, i.e. mid-conversion.
    let start = Instant::now();
    loop {
        let partial = std::fs::read_dir(dir.path()).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".partial")
        });
        if partial {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no temporary file appeared"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "convert ended before it could be interrupted"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
