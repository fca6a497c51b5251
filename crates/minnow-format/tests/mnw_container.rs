//! The `.mnw` container end to end: write with the converter, read back, and every way a file
//! can be broken: caught by `validate` (any flipped byte) or refused on open (structure).

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use common::{assets, expert_family, source, write};
use minnow_format::mnw::convert::{
    convert, ConvertInput, ConvertOptions, ExpertChoice, ExpertFamilies, TensorRule,
};
use minnow_format::mnw::layout::Header;
use minnow_format::mnw::manifest::{Manifest, TensorRecord};
use minnow_format::mnw::validate::validate_file;
use minnow_format::{MnwFile, TensorSource};
use minnow_runtime::quant::{Encoding, QuantEncoding};
use minnow_runtime::DType;

fn int4(workers: usize) -> ConvertOptions {
    ConvertOptions {
        experts: ExpertChoice::Int4,
        group_size: Some(32),
        workers,
        ..ConvertOptions::default()
    }
}

#[test]
fn original_round_trips_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "a.mnw", &ConvertOptions::default());
    let f = MnwFile::open(&path).unwrap();
    let src = source();
    assert_eq!(f.names(), src.names());
    for name in src.names() {
        let (a, b) = (f.tensor(name).unwrap(), src.tensor(name).unwrap());
        assert_eq!(a.data, b.data, "{name}");
        assert_eq!(a.shape, b.shape);
        assert_eq!(a.encoding(), Some(Encoding::Float(DType::BF16)));
        // Regions start on 4096-byte boundaries of the file.
        assert_eq!((a.data.as_ptr() as usize) % 4096, 0);
    }
    assert_eq!(
        f.asset("generation_config.json"),
        Some("contents of generation_config.json")
    );
    assert_eq!(f.manifest().model_id, "memory-model");
    let header = f.header();
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(header.file_len, len);
    assert_eq!(header.manifest_offset + header.manifest_len, len);
    assert!(validate_file(&path, &|_, _| {}).unwrap().is_ok());
}

#[test]
fn quantized_experts_keep_their_encoding_and_the_rest_stays_original() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "q.mnw", &int4(2));
    let f = MnwFile::open(&path).unwrap();
    let gate = f
        .tensor("model.layers.1.mlp.experts.0.gate_proj.weight")
        .unwrap();
    assert_eq!(gate.encoding(), Some(Encoding::Quant(QuantEncoding::I4Mma)));
    let q = gate.quant_mat().unwrap();
    assert_eq!((q.rows, q.cols, q.group_size), (32, 64, 32));
    assert_eq!(q.codes.len(), 32 * 64 / 2);
    let embed = f.tensor("model.word_embeddings.weight").unwrap();
    assert_eq!(
        embed.data,
        source()
            .tensor("model.word_embeddings.weight")
            .unwrap()
            .data
    );
    assert!(validate_file(&path, &|_, _| {}).unwrap().is_ok());
}

/// `--experts` re-encodes what the caller's family function names (the model's tensor schema, in
/// `minnow convert`), not what a name looks like: naming only the gate projections quantizes
/// only them, and naming nothing keeps every tensor as it is.
#[test]
fn experts_are_the_tensors_the_caller_names() {
    let dir = tempfile::tempdir().unwrap();
    let src = source();
    let gates_only = |name: &str| expert_family(name).filter(|f| f.contains("gate_proj"));
    let nothing = |_: &str| -> Option<String> { None };
    let cases: [(&str, ExpertFamilies, usize); 2] =
        [("gates.mnw", &gates_only, 3), ("none.mnw", &nothing, 0)];
    for (file, families, quantized) in cases {
        let input = ConvertInput {
            source: &src,
            expert_families: families,
            assets: assets(),
            model_id: "m".into(),
        };
        let out = dir.path().join(file);
        convert(&input, &out, &int4(1), &AtomicBool::new(false), &|_, _| {}).unwrap();
        let f = MnwFile::open(&out).unwrap();
        let mut found = 0;
        for name in f.names() {
            let encoding = f.tensor(name).unwrap().encoding();
            if encoding == Some(Encoding::Quant(QuantEncoding::I4Mma)) {
                assert!(name.contains("gate_proj"), "{file}: {name} quantized");
                found += 1;
            } else {
                assert_eq!(
                    encoding,
                    Some(Encoding::Float(DType::BF16)),
                    "{file}: {name}"
                );
            }
        }
        assert_eq!(found, quantized, "{file}");
    }
}

#[test]
fn output_bytes_do_not_depend_on_the_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    for options in [
        int4(1),
        ConvertOptions {
            experts: ExpertChoice::Nvfp4,
            ..int4(1)
        },
    ] {
        let one = std::fs::read(write(dir.path(), "w1.mnw", &options)).unwrap();
        let four = std::fs::read(write(
            dir.path(),
            "w4.mnw",
            &ConvertOptions {
                workers: 4,
                ..options.clone()
            },
        ))
        .unwrap();
        assert!(one == four, "{:?}", options.experts);
        std::fs::remove_file(dir.path().join("w1.mnw")).unwrap();
        std::fs::remove_file(dir.path().join("w4.mnw")).unwrap();
    }
}

#[test]
fn never_overwrites_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.mnw");
    std::fs::write(&out, b"precious").unwrap();
    let src = source();
    let input = ConvertInput {
        source: &src,
        expert_families: &expert_family,
        assets: assets(),
        model_id: "m".into(),
    };
    let err = convert(&input, &out, &int4(1), &AtomicBool::new(false), &|_, _| {}).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");

    // Cancelled: no output, no temporary file.
    let out = dir.path().join("y.mnw");
    let err = convert(&input, &out, &int4(2), &AtomicBool::new(true), &|_, _| {}).unwrap_err();
    assert!(err.to_string().contains("interrupted"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("x.mnw")]);
}

#[test]
fn tensor_rules_apply_in_order_and_must_match() {
    let dir = tempfile::tempdir().unwrap();
    let rules: Vec<TensorRule> = serde_json::from_str(
        r#"[{"prefix": "model.layers.1.mlp.experts.", "encoding": "i8_sym", "group_size": 16},
            {"prefix": "model.word_embeddings", "encoding": "f32"}]"#,
    )
    .unwrap();
    let options = ConvertOptions {
        experts: ExpertChoice::Int4,
        rules,
        ..ConvertOptions::default()
    };
    let f = MnwFile::open(&write(dir.path(), "r.mnw", &options)).unwrap();
    let down = f
        .tensor("model.layers.1.mlp.experts.2.down_proj.weight")
        .unwrap();
    assert_eq!(down.encoding(), Some(Encoding::Quant(QuantEncoding::I8Sym)));
    assert_eq!(down.quant.unwrap().group_size, 16);
    assert_eq!(
        f.tensor("model.word_embeddings.weight").unwrap().dtype,
        Some(DType::F32)
    );

    let src = source();
    let input = ConvertInput {
        source: &src,
        expert_families: &expert_family,
        assets: assets(),
        model_id: "m".into(),
    };
    for (rules, want) in [
        (
            r#"[{"prefix": "nothing.", "encoding": null}]"#,
            "matches no tensor",
        ),
        (
            r#"[{"prefix": "model.layers.1.mlp.experts.1.", "encoding": "i8_mma"}]"#,
            "must share an encoding",
        ),
        (
            r#"[{"prefix": "model.norm", "encoding": "i8_sym"}]"#,
            "only matrices",
        ),
    ] {
        let options = ConvertOptions {
            rules: serde_json::from_str(rules).unwrap(),
            ..ConvertOptions::default()
        };
        let err = convert(
            &input,
            &dir.path().join("bad.mnw"),
            &options,
            &AtomicBool::new(false),
            &|_, _| {},
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(want), "{rules}: {err}");
        assert!(!dir.path().join("bad.mnw").exists());
    }
}

/// Replaces the manifest of a file with `edit`'s version, keeping everything else consistent
/// (header lengths and digest), to build structurally broken files.
fn rewrite_manifest(path: &Path, edit: impl FnOnce(&mut Manifest)) {
    let bytes = std::fs::read(path).unwrap();
    let h = Header::decode(&bytes, bytes.len() as u64).unwrap();
    let mut m = Manifest::from_bytes(&bytes[h.manifest_offset as usize..]).unwrap();
    edit(&mut m);
    let new = m.to_bytes();
    let mut out = bytes[..h.manifest_offset as usize].to_vec();
    out.extend_from_slice(&new);
    let header = Header {
        manifest_offset: h.manifest_offset,
        manifest_len: new.len() as u64,
        file_len: out.len() as u64,
        manifest_blake3: *blake3::hash(&new).as_bytes(),
    };
    out[..64].copy_from_slice(&header.encode());
    std::fs::write(path, out).unwrap();
}

/// The record of the first tensor in name order.
fn first(m: &mut Manifest) -> &mut TensorRecord {
    m.tensors.values_mut().next().unwrap()
}

fn open_err(path: &Path) -> String {
    MnwFile::open(path).unwrap_err().to_string()
}

#[test]
fn structurally_broken_files_are_refused_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(write(dir.path(), "g.mnw", &int4(1))).unwrap();
    let p = dir.path().join("b.mnw");
    let fresh = || std::fs::write(&p, &good).unwrap();

    fresh();
    let mut bytes = good.clone();
    bytes[0] = b'X';
    std::fs::write(&p, &bytes).unwrap();
    assert!(open_err(&p).contains("not a .mnw file"));
    bytes[0..8].copy_from_slice(b"MINNOW02");
    std::fs::write(&p, &bytes).unwrap();
    assert!(open_err(&p).contains("unsupported .mnw container version"));

    let mut longer = good.clone();
    longer.push(0);
    std::fs::write(&p, &longer).unwrap();
    assert!(open_err(&p).contains("the file has"), "{}", open_err(&p));

    let mut huge = good.clone();
    huge[16..24].copy_from_slice(&(129u64 << 20).to_le_bytes());
    std::fs::write(&p, &huge).unwrap();
    assert!(open_err(&p).contains("over the 128 MiB limit"));

    type Edit = Box<dyn Fn(&mut Manifest)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("version 7", Box::new(|m| m.version = 7)),
        (
            "unknown encoding 'q5_k'",
            Box::new(|m| first(m).encoding = "q5_k".into()),
        ),
        (
            "overlap",
            Box::new(|m| {
                let offset = first(m).data.offset;
                m.tensors.values_mut().nth(1).unwrap().data.offset = offset;
            }),
        ),
        ("needs", Box::new(|m| first(m).shape[0] += 1)),
        (
            "not a multiple of 4096",
            Box::new(|m| first(m).data.offset += 8),
        ),
        (
            "past the start of the manifest",
            Box::new(|m| first(m).data.bytes = u64::MAX),
        ),
        (
            "no scales region",
            Box::new(|m| {
                let t = m.tensors.values_mut().find(|t| t.scales.is_some()).unwrap();
                t.scales = None;
            }),
        ),
        (
            "group size",
            Box::new(|m| {
                let t = m.tensors.values_mut().find(|t| t.scales.is_some()).unwrap();
                t.group_size = 48;
            }),
        ),
        (
            "architecture",
            Box::new(|m| m.architecture = "llama".into()),
        ),
        (
            "'tokenizer.json' asset",
            Box::new(|m| {
                m.assets.remove("tokenizer.json");
            }),
        ),
        (
            "64 hex characters",
            Box::new(|m| first(m).data.blake3 = "ABC".into()),
        ),
        (
            "64 hex characters",
            Box::new(|m| first(m).data.blake3 = "g".repeat(64)),
        ),
    ];
    for (want, edit) in cases {
        fresh();
        rewrite_manifest(&p, edit);
        let err = open_err(&p);
        assert!(err.contains(want), "{want}: {err}");
        // validate says so too, and exits with a problem rather than an error.
        let report = validate_file(&p, &|_, _| {}).unwrap();
        assert!(!report.is_ok(), "{want}");
    }
}

#[test]
fn truncated_files_are_refused_at_every_length() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(write(dir.path(), "g.mnw", &int4(1))).unwrap();
    let p = dir.path().join("t.mnw");
    let len = good.len();
    let mut cuts: Vec<usize> = (0..200).collect();
    cuts.extend((1..200).map(|i| len * i / 200));
    cuts.extend(len - 64..len);
    for cut in cuts {
        std::fs::write(&p, &good[..cut]).unwrap();
        assert!(MnwFile::open(&p).is_err(), "cut at {cut}");
        assert!(
            !validate_file(&p, &|_, _| {}).unwrap().is_ok(),
            "cut at {cut}"
        );
    }
}

/// Flip one byte in the header, the header padding, every region, the padding between regions
/// and the manifest: validate names a problem every time, and opening never panics.
#[test]
fn validate_catches_a_flipped_byte_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "g.mnw", &int4(1));
    let good = std::fs::read(&path).unwrap();
    let f = MnwFile::open(&path).unwrap();
    let mut positions: Vec<(usize, String)> = (0..64).map(|i| (i, "header".to_string())).collect();
    positions.push((100, "header padding".into()));
    positions.push((4095, "header padding".into()));
    for (name, m) in &f.manifest().tensors {
        let d = m.data.offset as usize;
        positions.push((d, format!("tensor '{name}' data")));
        positions.push((
            d + m.data.bytes as usize - 1,
            format!("tensor '{name}' data"),
        ));
        positions.push((d + m.data.bytes as usize, "padding after".into()));
        if let Some(s) = &m.scales {
            positions.push((s.offset as usize + 1, format!("tensor '{name}' scales")));
        }
    }
    let mo = f.header().manifest_offset as usize;
    for i in (mo..good.len()).step_by(7) {
        positions.push((i, "manifest".into()));
    }
    drop(f);
    let p = dir.path().join("flip.mnw");
    for (pos, what) in positions {
        for mask in [0x01u8, 0x80] {
            let mut bytes = good.clone();
            bytes[pos] ^= mask;
            std::fs::write(&p, &bytes).unwrap();
            let report = validate_file(&p, &|_, _| {}).unwrap();
            assert!(!report.is_ok(), "flip at {pos} ({what}) not caught");
            if what != "header" && what != "manifest" {
                assert!(
                    report.problems.iter().any(|e| e.contains(&what)),
                    "{pos} {what}: {:?}",
                    report.problems
                );
            }
            let _ = MnwFile::open(&p);
        }
    }
}

/// `--experts int4` from a file whose experts are INT8 is refused naming the tensor (quantizing
/// stored codes again would round twice); the same encoding and `original` copy them.
#[test]
fn quantized_sources_are_copied_never_re_encoded() {
    let dir = tempfile::tempdir().unwrap();
    let int8 = ConvertOptions {
        experts: ExpertChoice::Int8,
        group_size: Some(32),
        ..ConvertOptions::default()
    };
    let first = write(dir.path(), "int8.mnw", &int8);
    let file = MnwFile::open(&first).unwrap();
    let input = ConvertInput {
        source: &file,
        expert_families: &expert_family,
        assets: assets(),
        model_id: "memory-model".into(),
    };
    let run = |name: &str, options: &ConvertOptions| {
        convert(
            &input,
            &dir.path().join(name),
            options,
            &AtomicBool::new(false),
            &|_, _| {},
        )
    };
    for (name, options) in [
        ("int4.mnw", int4(1)),
        (
            "g16.mnw",
            ConvertOptions {
                group_size: Some(16),
                ..int8.clone()
            },
        ),
    ] {
        let err = run(name, &options).unwrap_err().to_string();
        assert!(
            err.contains("is already quantized (i8_mma, group size 32)")
                && err.contains("Convert from the floating-point checkpoint"),
            "{err}"
        );
        assert!(!dir.path().join(name).exists());
    }
    for (name, options) in [
        ("copy.mnw", ConvertOptions::default()),
        ("same.mnw", int8.clone()),
    ] {
        run(name, &options).unwrap();
        let bytes = std::fs::read(dir.path().join(name)).unwrap();
        assert!(bytes == std::fs::read(&first).unwrap(), "{name}");
    }
}

/// The output is created like any new file: mode 0666 less the process umask (read from
/// /proc; tests share the process, so it is not changed here), not a private 0600.
#[test]
fn output_mode_follows_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let umask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
        .expect("Umask in /proc/self/status");
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "m.mnw", &ConvertOptions::default());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666 & !umask, "umask {umask:o}");
}
