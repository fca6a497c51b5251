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

/// The binary with no --model (and no MINNOW_MODEL).
fn minnow_bare(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minnow"))
        .env_remove("MINNOW_MODEL")
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
    // FILE as a positional argument, without --model.
    let report = ok(minnow_bare(&["validate", one.to_str().unwrap()]));
    assert!(report.contains(": ok ("), "{report}");
    let inspect = ok(minnow_bare(&["inspect", one.to_str().unwrap()]));
    assert!(
        inspect.contains("encoding       i8_mma, group size 32: 48 tensors"),
        "{inspect}"
    );
    assert!(inspect.contains("LLaDA2.1"), "{inspect}");
    // The GPU keeps the INT8 codes and scales as stored: the same bytes as the file's.
    let stored = inspect
        .lines()
        .find_map(|l| l.strip_prefix("encoding       i8_mma, group size 32: 48 tensors, "))
        .expect("an i8_mma line");
    let on_gpu = inspect
        .lines()
        .find(|l| l.starts_with("weights on GPU "))
        .expect("a GPU line");
    assert!(on_gpu.contains(&format!("i8_mma {stored}")), "{inspect}");
    // Only the .mnw and nothing temporary is left in the directory.
    let mut left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["w1.mnw", "w4.mnw"]);
}

/// `inspect` counts what the GPU loader keeps of repacked encodings. The v21 fixture's MoE layer
/// has 16 experts with gate and up of 32 x 64 and down of 64 x 32. FP8 keeps every code byte
/// plus 16 bytes of scales per 8-row band and group (groups of 64 for gate/up, 32 for down):
/// 16 x (2 x (2,048 + 64) + (2,048 + 128)) = 102,400 bytes. NVFP4 keeps gate/up as E2M1 with
/// BF16 block scales (2 x 16 x (1,024 + 256) = 40,960 bytes) and widens down (K = 32 is not a
/// multiple of 64).
#[test]
fn inspect_counts_the_gpu_bytes_of_repacked_experts() {
    let dir = tempfile::tempdir().unwrap();
    for (experts, form) in [("fp8", "e4m3 100.0 KiB"), ("nvfp4", "e2m1 40.0 KiB")] {
        let file = convert(
            dir.path(),
            &format!("{experts}.mnw"),
            &["--experts", experts],
        );
        let inspect = ok(minnow_bare(&["inspect", file.to_str().unwrap()]));
        let on_gpu = inspect
            .lines()
            .find(|l| l.starts_with("weights on GPU "))
            .expect("a GPU line");
        assert!(on_gpu.contains(form), "{experts}: {on_gpu}");
    }
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
    signal_mid_convert_leaves_nothing("-INT");
}

/// A closed terminal (HUP) and a QUIT are cleaned up like Ctrl-C.
#[test]
fn hangup_and_quit_mid_convert_leave_nothing() {
    signal_mid_convert_leaves_nothing("-HUP");
    signal_mid_convert_leaves_nothing("-QUIT");
}

fn signal_mid_convert_leaves_nothing(signal: &str) {
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
        .args([signal, &child.id().to_string()])
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

/// Without --model, convert and validate use the bundled fixture like every other command; the
/// file is created with the process umask (027 here: 0640, neither 0600 nor a fixed 0644).
#[test]
fn convert_and_validate_fall_back_to_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fixture.mnw");
    let output = Command::new("sh")
        .arg("-c")
        .arg("umask 027 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_minnow"))
        .args(["convert", out.to_str().unwrap()])
        .env_remove("MINNOW_MODEL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    ok(output);
    assert!(stderr.contains("bundled tiny fixture"), "{stderr}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    let report = ok(minnow_bare(&["validate", out.to_str().unwrap()]));
    assert!(report.contains(": ok ("), "{report}");
    // The fixture itself is a directory: its structure is checked (it has no digests).
    let report = ok(minnow_bare(&["validate"]));
    assert!(report.contains("llada2-tiny-v21: ok ("), "{report}");
    assert!(report.contains("no digests"), "{report}");
}

/// Re-quantizing a quantized file is refused in one line naming the tensor; nothing is written.
#[test]
fn convert_refuses_to_re_encode_a_quantized_file() {
    let dir = tempfile::tempdir().unwrap();
    let int8 = convert(dir.path(), "int8.mnw", &["--experts", "int8"]);
    let out = dir.path().join("int4.mnw");
    let err = error_text(&minnow(
        &int8,
        &["convert", out.to_str().unwrap(), "--experts", "int4"],
    ));
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("is already quantized (i8_mma, group size") && err.contains("round twice"),
        "{err}"
    );
    assert!(!out.exists());
}
