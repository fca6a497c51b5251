//! `minnow forward` and `minnow inspect` through the built binary, on the bundled fixtures:
//! forward's logits must match the official F32 reference (`golden.safetensors` `logits`,
//! atol 1e-3 as in tests/fixtures/README.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use safetensors::SafeTensors;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");

fn minnow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minnow"))
        .args(args)
        .env_remove("MINNOW_MODEL")
        .output()
        .unwrap()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(FIXTURES).join(name)
}

fn tensor_f32(bytes: &[u8], key: &str) -> (Vec<usize>, Vec<f32>) {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let t = st.tensor(key).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    let vals = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (t.shape().to_vec(), vals)
}

fn golden_ids(name: &str) -> Vec<i64> {
    let bytes = std::fs::read(fixture(name).join("golden.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensor("input_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn forward_matches_golden_logits() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["llada2-tiny-v20", "llada2-tiny-v21", "llada2-tiny-v22"] {
        let input = tmp.path().join(format!("{name}.json"));
        let output = tmp.path().join(format!("{name}.safetensors"));
        let ids = serde_json::json!({ "input_ids": golden_ids(name) });
        std::fs::write(&input, ids.to_string()).unwrap();
        let model = fixture(name);
        let args = [
            "--model",
            model.to_str().unwrap(),
            "--device",
            "cpu",
            "forward",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ];
        let o = minnow(&args);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let (shape, logits) = tensor_f32(&std::fs::read(&output).unwrap(), "logits");
        assert_eq!(shape, vec![96, 512]);
        let golden = std::fs::read(fixture(name).join("golden.safetensors")).unwrap();
        let (_, want) = tensor_f32(&golden, "logits");
        let err = logits
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err <= 1e-3, "{name}: max abs error {err}");

        // The output exists now: refused without --force, replaced with it.
        let o = minnow(&args);
        assert!(!o.status.success());
        assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
        let mut forced = args.to_vec();
        forced.push("--force");
        assert!(minnow(&forced).status.success());
        // No temporary file is left behind.
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty());
    }
}

#[test]
fn forward_errors_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("llada2-tiny-v21");
    let model = model.to_str().unwrap();
    let out = tmp.path().join("out.safetensors");
    let out = out.to_str().unwrap();
    let mut cases = vec![
        (
            "{\"input_ids\": [1, 2, 600]}",
            "cpu",
            "outside the vocabulary",
        ),
        ("{\"input_ids\": []}", "cpu", "empty"),
        ("{\"ids\": [1]}", "cpu", "input_ids"),
    ];
    if !minnow_model::cuda::is_available() {
        cases.push(("{\"input_ids\": [1, 2]}", "cuda", "no usable CUDA GPU"));
    }
    for (json, device, want) in cases {
        let input = tmp.path().join("in.json");
        std::fs::write(&input, json).unwrap();
        let o = minnow(&[
            "--model",
            model,
            "--device",
            device,
            "forward",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out,
        ]);
        assert!(!o.status.success());
        let e = stderr(&o);
        assert!(e.contains(want), "{json}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
        assert!(!Path::new(out).exists());
    }
}

#[test]
fn inspect_reports_family_and_tokens() {
    for (name, family) in [
        ("llada2-tiny-v20", "LLaDA2.0"),
        ("llada2-tiny-v21", "LLaDA2.1"),
        ("llada2-tiny-v22", "LLaDA2.2"),
    ] {
        let model = fixture(name);
        let o = minnow(&["--model", model.to_str().unwrap(), "inspect"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = String::from_utf8(o.stdout).unwrap();
        assert!(text.contains(family), "{text}");
        assert!(text.contains("mask 482"), "{text}");
        assert!(text.contains("role_end 485"), "{text}");
        assert!(text.contains("parameters"), "{text}");
    }
}
