//! Our files against the published `.mnw` schema, read independently of our own types: the
//! header by its byte offsets, the manifest as generic MessagePack values (`rmpv`), every field
//! checked by name and wire type, and every region's digest recomputed from the file. Also: the
//! array-form manifests minnow wrote before still open, and uppercase digests are accepted.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::write;
use minnow_format::mnw::convert::{ConvertOptions, ExpertChoice, QuantLayout, TensorRule};
use minnow_format::mnw::validate::validate_file;
use minnow_format::{MnwFile, TensorSource};
use rmpv::Value;

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// The manifest bytes, located through the header's fields.
fn manifest_bytes(file: &[u8]) -> &[u8] {
    let (offset, len) = (u64_at(file, 8) as usize, u64_at(file, 16) as usize);
    &file[offset..offset + len]
}

fn parse(bytes: &[u8]) -> Value {
    let mut rest = bytes;
    let value = rmpv::decode::read_value(&mut rest).expect("the manifest is MessagePack");
    assert!(rest.is_empty(), "bytes after the manifest's value");
    value
}

/// A MessagePack map's entries by string key (every key must be a string, none repeated).
fn fields<'a>(value: &'a Value, what: &str) -> Vec<(&'a str, &'a Value)> {
    let Value::Map(entries) = value else {
        panic!("{what} is not a MessagePack map: {value:?}");
    };
    let mut seen = BTreeSet::new();
    entries
        .iter()
        .map(|(k, v)| {
            let k = k
                .as_str()
                .unwrap_or_else(|| panic!("{what}: key {k:?} is not a string"));
            assert!(seen.insert(k), "{what}: key '{k}' repeated");
            (k, v)
        })
        .collect()
}

fn field<'a>(map: &[(&str, &'a Value)], key: &str, what: &str) -> &'a Value {
    map.iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("{what}: no '{key}'"))
}

fn unsigned(value: &Value, what: &str) -> u64 {
    match value {
        Value::Integer(i) if i.is_u64() => i.as_u64().unwrap(),
        other => panic!("{what} is not an unsigned integer: {other:?}"),
    }
}

/// Checks a region `{offset, bytes, blake3}` and returns its byte range.
fn region(value: &Value, file: &[u8], what: &str) -> std::ops::Range<usize> {
    let map = fields(value, what);
    let keys: BTreeSet<&str> = map.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        BTreeSet::from(["offset", "bytes", "blake3"]),
        "{what}"
    );
    let offset = unsigned(field(&map, "offset", what), what);
    let bytes = unsigned(field(&map, "bytes", what), what);
    assert_eq!(offset % 4096, 0, "{what}: offset {offset} not 4096-aligned");
    assert!(bytes > 0, "{what}: empty region");
    let range = offset as usize..(offset + bytes) as usize;
    let digest = field(&map, "blake3", what)
        .as_str()
        .unwrap_or_else(|| panic!("{what}: blake3 is not a string"));
    assert_eq!(digest.len(), 64, "{what}");
    assert!(
        digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{what}: blake3 is not lowercase hex"
    );
    assert_eq!(
        digest,
        blake3::hash(&file[range.clone()]).to_hex().as_str(),
        "{what}: digest"
    );
    range
}

/// Every rule of the published schema, field by field. Returns the encodings seen.
fn check_published(path: &Path) -> BTreeSet<String> {
    let file = std::fs::read(path).unwrap();
    assert_eq!(&file[..8], b"MINNOW01");
    let (offset, len) = (u64_at(&file, 8), u64_at(&file, 16));
    assert_eq!(u64_at(&file, 24), file.len() as u64, "recorded file length");
    assert_eq!(offset % 4096, 0);
    assert_eq!(
        offset + len,
        file.len() as u64,
        "the manifest ends the file"
    );
    let manifest = manifest_bytes(&file);
    assert_eq!(&file[32..64], blake3::hash(manifest).as_bytes());
    assert!(file[64..4096].iter().all(|&b| b == 0), "header padding");

    let top = parse(manifest);
    let top = fields(&top, "manifest");
    let keys: BTreeSet<&str> = top.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        BTreeSet::from(["version", "architecture", "model_id", "assets", "tensors"]),
        "manifest fields"
    );
    assert_eq!(unsigned(field(&top, "version", "manifest"), "version"), 1);
    assert_eq!(
        field(&top, "architecture", "manifest").as_str(),
        Some("llada2_moe")
    );
    assert!(field(&top, "model_id", "manifest").as_str().is_some());
    let assets = fields(field(&top, "assets", "manifest"), "assets");
    for (name, text) in &assets {
        assert!(text.as_str().is_some(), "asset '{name}' is not a string");
    }
    for required in ["config.json", "tokenizer.json", "chat_template.jinja"] {
        assert!(assets.iter().any(|(k, _)| *k == required), "{required}");
    }

    let tensors = fields(field(&top, "tensors", "manifest"), "tensors");
    let names: Vec<&str> = tensors.iter().map(|(k, _)| *k).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "tensor names in sorted order");
    let published = [
        "bf16", "f16", "f32", "i8_sym", "i4_sym", "i8_mma", "i4_mma", "nvfp4",
    ];
    let mut encodings = BTreeSet::new();
    let mut regions = Vec::new();
    for (name, record) in &tensors {
        let what = format!("tensor '{name}'");
        let map = fields(record, &what);
        for (k, _) in &map {
            assert!(
                [
                    "shape",
                    "encoding",
                    "data",
                    "scales",
                    "group_size",
                    "global_scale"
                ]
                .contains(k),
                "{what}: field '{k}' is not in the schema"
            );
        }
        let Value::Array(shape) = field(&map, "shape", &what) else {
            panic!("{what}: shape is not an array");
        };
        let shape: Vec<u64> = shape.iter().map(|d| unsigned(d, &what)).collect();
        let encoding = field(&map, "encoding", &what).as_str().unwrap();
        assert!(published.contains(&encoding), "{what}: encoding {encoding}");
        encodings.insert(encoding.to_string());
        let floating = ["bf16", "f16", "f32"].contains(&encoding);
        let group = unsigned(field(&map, "group_size", &what), &what);
        let data = region(field(&map, "data", &what), &file, &what);
        let numel: u64 = shape.iter().product();
        let scales = map.iter().find(|(k, _)| *k == "scales");
        let global = map.iter().find(|(k, _)| *k == "global_scale");
        if floating {
            assert_eq!(group, 0, "{what}");
            assert!(scales.is_none() && global.is_none(), "{what}");
            let size = if encoding == "f32" { 4 } else { 2 };
            assert_eq!(data.len() as u64, numel * size, "{what}");
        } else {
            let [n, k] = shape[..] else {
                panic!("{what}: quantized tensors are matrices")
            };
            let scales = region(scales.expect("quantized: scales").1, &file, &what);
            regions.push(scales.clone());
            if encoding == "nvfp4" {
                assert_eq!(group, 16, "{what}");
                match global.expect("nvfp4: global_scale").1 {
                    Value::F32(g) => assert!(g.is_finite() && *g > 0.0, "{what}"),
                    other => panic!("{what}: global_scale is not a float32: {other:?}"),
                }
                assert_eq!(data.len() as u64, n * k / 2, "{what}");
                assert_eq!(scales.len() as u64, n * k / 16, "{what}");
            } else {
                assert!(global.is_none(), "{what}: global_scale outside nvfp4");
                assert!(
                    [16, 32, 64, 128].contains(&group) && k % group == 0,
                    "{what}"
                );
                let per_code = if encoding.starts_with("i8") { 2 } else { 1 };
                assert_eq!(data.len() as u64 * 2, n * k * per_code, "{what}");
                assert_eq!(scales.len() as u64, n * (k / group) * 2, "{what}");
            }
            if encoding.ends_with("_mma") || encoding == "nvfp4" {
                assert!(n % 8 == 0, "{what}");
            }
        }
        regions.push(data);
    }
    // Regions do not overlap, lie between the header and the manifest, and padding is zero.
    regions.sort_by_key(|r| r.start);
    let mut cursor = 4096;
    for r in &regions {
        assert!(r.start >= cursor, "overlap at {}", r.start);
        assert!(file[cursor..r.start].iter().all(|&b| b == 0), "padding");
        cursor = r.end;
    }
    assert!(cursor <= offset as usize);
    assert!(file[cursor..offset as usize].iter().all(|&b| b == 0));
    encodings
}

#[test]
fn every_published_encoding_follows_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let f32_rule = |prefix: &str| TensorRule {
        prefix: prefix.into(),
        encoding: Some("f32".into()),
        group_size: None,
    };
    let cases = [
        (ExpertChoice::Original, QuantLayout::Mma, vec![]),
        (ExpertChoice::Int8, QuantLayout::Mma, vec![]),
        (ExpertChoice::Int4, QuantLayout::Mma, vec![]),
        (ExpertChoice::Int8, QuantLayout::Row, vec![]),
        (
            ExpertChoice::Int4,
            QuantLayout::Row,
            vec![f32_rule("model.norm")],
        ),
        (ExpertChoice::Nvfp4, QuantLayout::Mma, vec![]),
    ];
    let mut seen = BTreeSet::new();
    for (i, (experts, layout, rules)) in cases.into_iter().enumerate() {
        let options = ConvertOptions {
            experts,
            layout,
            group_size: Some(32),
            rules,
            ..ConvertOptions::default()
        };
        let path = write(dir.path(), &format!("{i}.mnw"), &options);
        seen.extend(check_published(&path));
    }
    let want: BTreeSet<String> = [
        "bf16", "f32", "i8_mma", "i4_mma", "i8_sym", "i4_sym", "nvfp4",
    ]
    .map(String::from)
    .into();
    assert_eq!(seen, want);
}

/// Rewrites a file's manifest with `edit` applied to its generic value, fixing the header.
fn rewrite(path: &Path, edit: impl FnOnce(&mut Value)) {
    let file = std::fs::read(path).unwrap();
    let offset = u64_at(&file, 8) as usize;
    let mut value = parse(manifest_bytes(&file));
    edit(&mut value);
    let mut manifest = Vec::new();
    rmpv::encode::write_value(&mut manifest, &value).unwrap();
    let mut out = file[..offset].to_vec();
    out.extend_from_slice(&manifest);
    let len = out.len() as u64;
    out[16..24].copy_from_slice(&(manifest.len() as u64).to_le_bytes());
    out[24..32].copy_from_slice(&len.to_le_bytes());
    out[32..64].copy_from_slice(blake3::hash(&manifest).as_bytes());
    std::fs::write(path, out).unwrap();
}

fn tensors_mut(value: &mut Value) -> &mut Value {
    let Value::Map(top) = value else {
        unreachable!()
    };
    &mut top
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("tensors"))
        .unwrap()
        .1
}

/// The same tensors, bytes and assets through both files.
fn assert_same_contents(a: &MnwFile, b: &MnwFile) {
    assert_eq!(a.names(), b.names());
    for name in a.names() {
        let (x, y) = (a.tensor(name).unwrap(), b.tensor(name).unwrap());
        assert_eq!(
            (x.shape, x.data, x.encoding()),
            (y.shape, y.data, y.encoding())
        );
        assert_eq!(
            x.quant.map(|q| (q.scales, q.group_size, q.global_scale)),
            y.quant.map(|q| (q.scales, q.group_size, q.global_scale)),
            "{name}"
        );
    }
}

/// Files minnow wrote before the published form was adopted: `tensors` an array of records that
/// carry their own `name`, in file order.
#[test]
fn older_array_manifests_still_open() {
    let dir = tempfile::tempdir().unwrap();
    let options = ConvertOptions {
        experts: ExpertChoice::Nvfp4,
        ..ConvertOptions::default()
    };
    let path = write(dir.path(), "new.mnw", &options);
    let old = dir.path().join("old.mnw");
    std::fs::copy(&path, &old).unwrap();
    rewrite(&old, |v| {
        let tensors = tensors_mut(v);
        let Value::Map(entries) = std::mem::replace(tensors, Value::Nil) else {
            unreachable!()
        };
        // Reverse name order, as a file ordered by offset need not be sorted by name.
        let array = entries
            .into_iter()
            .rev()
            .map(|(name, record)| {
                let Value::Map(mut fields) = record else {
                    unreachable!()
                };
                fields.insert(0, (Value::from("name"), name));
                Value::Map(fields)
            })
            .collect();
        *tensors = Value::Array(array);
    });
    assert!(parse(manifest_bytes(&std::fs::read(&old).unwrap()))
        .as_map()
        .unwrap()
        .iter()
        .any(|(k, v)| k.as_str() == Some("tensors") && v.is_array()));
    let (a, b) = (MnwFile::open(&path).unwrap(), MnwFile::open(&old).unwrap());
    assert_same_contents(&a, &b);
    assert!(validate_file(&old, &|_, _| {}).unwrap().is_ok());
}

/// The format compares digests case-insensitively; files with uppercase ones open and validate.
#[test]
fn uppercase_digests_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let options = ConvertOptions {
        experts: ExpertChoice::Int8,
        ..ConvertOptions::default()
    };
    let path = write(dir.path(), "lower.mnw", &options);
    let upper = dir.path().join("upper.mnw");
    std::fs::copy(&path, &upper).unwrap();
    let mut changed = 0;
    rewrite(&upper, |v| {
        fn upcase(v: &mut Value, changed: &mut usize) {
            match v {
                Value::Map(entries) => {
                    for (k, v) in entries {
                        if k.as_str() == Some("blake3") {
                            *v = Value::from(v.as_str().unwrap().to_ascii_uppercase());
                            *changed += 1;
                        } else {
                            upcase(v, changed);
                        }
                    }
                }
                Value::Array(items) => items.iter_mut().for_each(|v| upcase(v, changed)),
                _ => {}
            }
        }
        upcase(tensors_mut(v), &mut changed);
    });
    assert!(changed > 10, "{changed} digests rewritten");
    let (a, b) = (
        MnwFile::open(&path).unwrap(),
        MnwFile::open(&upper).unwrap(),
    );
    assert_same_contents(&a, &b);
    let report = validate_file(&upper, &|_, _| {}).unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    // A damaged region is still caught with uppercase digests.
    let mut bytes = std::fs::read(&upper).unwrap();
    bytes[4096] ^= 1;
    std::fs::write(&upper, bytes).unwrap();
    assert!(!validate_file(&upper, &|_, _| {}).unwrap().is_ok());
}
