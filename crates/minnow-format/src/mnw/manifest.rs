//! The manifest: a MessagePack map with named fields (docs/model-format.md §2). `tensors` is a
//! map from each tensor's original checkpoint name to its record, written in sorted name order,
//! which is the published form; the array of named records that minnow wrote before is still
//! read. Unknown fields are ignored (forward compatible within version 1); `version` is read
//! first on its own so that a newer file gets "unsupported version" rather than a parse error.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// The only manifest version.
pub const VERSION: u64 = 1;

/// The whole manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u64,
    pub architecture: String,
    pub model_id: String,
    /// The source's text files by file name.
    pub assets: BTreeMap<String, AssetText>,
    /// Every tensor by its original checkpoint name (`BTreeMap`: bytewise sorted, the order the
    /// published files use).
    #[serde(deserialize_with = "tensors_map_or_array")]
    pub tensors: BTreeMap<String, TensorRecord>,
}

/// One tensor's record: exactly the published fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorRecord {
    pub shape: Vec<u64>,
    /// The snake_case encoding name (`bf16`, `i4_mma`, `nvfp4`, ...).
    pub encoding: String,
    pub data: Region,
    /// Absent (the key is not written) when the encoding has no scales.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scales: Option<Region>,
    /// Always written; 0 for floating-point data.
    #[serde(default)]
    pub group_size: u64,
    /// NVFP4 only; a MessagePack float32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_scale: Option<f32>,
}

/// A record as minnow wrote it before the published form was known: an element of an array,
/// carrying its own name.
#[derive(Deserialize)]
struct NamedRecord {
    name: String,
    shape: Vec<u64>,
    encoding: String,
    data: Region,
    #[serde(default)]
    scales: Option<Region>,
    #[serde(default)]
    group_size: u64,
    #[serde(default)]
    global_scale: Option<f32>,
}

impl NamedRecord {
    fn split(self) -> (String, TensorRecord) {
        (
            self.name,
            TensorRecord {
                shape: self.shape,
                encoding: self.encoding,
                data: self.data,
                scales: self.scales,
                group_size: self.group_size,
                global_scale: self.global_scale,
            },
        )
    }
}

/// A byte range of the file with its BLAKE3 digest: 64 hex characters, written lowercase,
/// compared case-insensitively.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    pub offset: u64,
    pub bytes: u64,
    pub blake3: String,
}

/// An asset's text. Written as a MessagePack string; a binary value holding UTF-8 is read too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct AssetText(pub String);

impl<'de> Deserialize<'de> for AssetText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = AssetText;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an asset's text (string or UTF-8 bytes)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<AssetText, E> {
                Ok(AssetText(v.to_string()))
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<AssetText, E> {
                std::str::from_utf8(v)
                    .map(|s| AssetText(s.to_string()))
                    .map_err(|_| E::custom("asset bytes are not UTF-8"))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// `tensors` as the published map `{name: record}`, or as the array of named records older
/// minnow files have. A name given twice is an error in both forms (a map decoded naively would
/// keep the last one silently).
fn tensors_map_or_array<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, TensorRecord>, D::Error> {
    struct TensorsVisitor;
    fn insert<E: serde::de::Error>(
        out: &mut BTreeMap<String, TensorRecord>,
        (name, record): (String, TensorRecord),
    ) -> Result<(), E> {
        if name.is_empty() {
            return Err(E::custom("a tensor has no name"));
        }
        if out.contains_key(&name) {
            return Err(E::custom(format!(
                "tensor '{name}' appears twice in the manifest"
            )));
        }
        out.insert(name, record);
        Ok(())
    }
    impl<'de> Visitor<'de> for TensorsVisitor {
        type Value = BTreeMap<String, TensorRecord>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map from tensor name to tensor record")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(entry) = map.next_entry::<String, TensorRecord>()? {
                insert(&mut out, entry)?;
            }
            Ok(out)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(record) = seq.next_element::<NamedRecord>()? {
                insert(&mut out, record.split())?;
            }
            Ok(out)
        }
    }
    d.deserialize_any(TensorsVisitor)
}

#[derive(Deserialize)]
struct VersionOnly {
    version: u64,
}

impl Manifest {
    /// Serializes with field names (a map, not a positional array).
    pub fn to_bytes(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("a manifest always serializes")
    }

    /// Parses manifest bytes; the error says what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Manifest, String> {
        let version: VersionOnly = rmp_serde::from_slice(bytes)
            .map_err(|e| format!("the manifest is not a MessagePack map with a version: {e}"))?;
        if version.version != VERSION {
            return Err(format!(
                "unsupported .mnw manifest version {} (this minnow reads version {})",
                version.version, VERSION
            ));
        }
        rmp_serde::from_slice(bytes).map_err(|e| format!("the manifest is malformed: {e}"))
    }

    /// An asset's text, if the file has it.
    pub fn asset(&self, name: &str) -> Option<&str> {
        self.assets.get(name).map(|a| a.0.as_str())
    }
}

/// BLAKE3 of `bytes` as 64 lowercase hex characters.
pub fn blake3_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TensorRecord {
        TensorRecord {
            shape: vec![2, 3],
            encoding: "bf16".into(),
            data: Region {
                offset: 4096,
                bytes: 12,
                blake3: blake3_hex(b""),
            },
            scales: None,
            group_size: 0,
            global_scale: None,
        }
    }

    fn sample() -> Manifest {
        Manifest {
            version: 1,
            architecture: "llada2_moe".into(),
            model_id: "tiny".into(),
            assets: BTreeMap::from([("config.json".into(), AssetText("{}".into()))]),
            tensors: BTreeMap::from([("b".into(), record()), ("a".into(), record())]),
        }
    }

    #[test]
    fn round_trips_as_a_named_map() {
        let m = sample();
        let bytes = m.to_bytes();
        // A fixmap (0x8N) at the top, not an array.
        assert_eq!(bytes[0] & 0xF0, 0x80);
        assert_eq!(Manifest::from_bytes(&bytes).unwrap(), m);
    }

    /// The array of named records minnow wrote before, with an unknown field beside.
    #[test]
    fn reads_the_older_array_form_and_ignores_unknown_fields() {
        #[derive(Serialize)]
        struct Named {
            name: String,
            #[serde(flatten)]
            record: TensorRecord,
        }
        #[derive(Serialize)]
        struct Older {
            version: u64,
            architecture: &'static str,
            model_id: &'static str,
            assets: BTreeMap<String, String>,
            tensors: Vec<Named>,
            extra: u32,
        }
        let named = |name: &str| Named {
            name: name.into(),
            record: record(),
        };
        let older = Older {
            version: 1,
            architecture: "llada2_moe",
            model_id: "x",
            assets: BTreeMap::new(),
            tensors: vec![named("w"), named("v")],
            extra: 7,
        };
        let m = Manifest::from_bytes(&rmp_serde::to_vec_named(&older).unwrap()).unwrap();
        assert_eq!(m.tensors.keys().collect::<Vec<_>>(), ["v", "w"]);
        assert_eq!(m.tensors["w"], record());

        let twice = Older {
            tensors: vec![named("w"), named("w")],
            ..older
        };
        let err = Manifest::from_bytes(&rmp_serde::to_vec_named(&twice).unwrap()).unwrap_err();
        assert!(err.contains("tensor 'w' appears twice"), "{err}");
    }

    /// A MessagePack map may repeat a key; the reader refuses that instead of keeping one.
    #[test]
    fn a_name_repeated_in_the_map_is_refused() {
        struct Repeated(Vec<(&'static str, TensorRecord)>);
        impl Serialize for Repeated {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
            }
        }
        #[derive(Serialize)]
        struct WithRepeat {
            version: u64,
            architecture: &'static str,
            model_id: &'static str,
            assets: BTreeMap<String, String>,
            tensors: Repeated,
        }
        let bytes = rmp_serde::to_vec_named(&WithRepeat {
            version: 1,
            architecture: "llada2_moe",
            model_id: "x",
            assets: BTreeMap::new(),
            tensors: Repeated(vec![("a", record()), ("a", record())]),
        })
        .unwrap();
        let err = Manifest::from_bytes(&bytes).unwrap_err();
        assert!(err.contains("tensor 'a' appears twice"), "{err}");
    }

    #[test]
    fn other_versions_are_named() {
        let mut m = sample();
        m.version = 2;
        let err = Manifest::from_bytes(&m.to_bytes()).unwrap_err();
        assert!(err.contains("version 2"), "{err}");
        assert!(Manifest::from_bytes(b"\xc1garbage").is_err());
    }
}
