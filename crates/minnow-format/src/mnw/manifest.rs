//! The manifest: a MessagePack map with named fields (docs/model-format.md §Manifest).
//! Unknown fields are ignored (forward compatible within version 1); `version` is read first on
//! its own so that a newer file gets "unsupported version" rather than a parse error.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// The whole manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u64,
    pub architecture: String,
    pub model_id: String,
    /// The source's text files by file name.
    pub assets: BTreeMap<String, AssetText>,
    /// In file order. A map keyed by tensor name is accepted as well when reading (the facts
    /// say each tensor carries its name; they do not say whether `tensors` is an array or a
    /// map, so both are read and an array is written).
    #[serde(deserialize_with = "tensors_list_or_map")]
    pub tensors: Vec<TensorRecord>,
}

/// One tensor's entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorRecord {
    /// The original checkpoint name.
    #[serde(default)]
    pub name: String,
    pub shape: Vec<u64>,
    pub encoding: String,
    pub data: Region,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scales: Option<Region>,
    /// 0 for floating-point data.
    #[serde(default)]
    pub group_size: u64,
    /// NVFP4 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_scale: Option<f32>,
}

/// A byte range of the file with its BLAKE3 digest (64 lowercase hex characters).
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

fn tensors_list_or_map<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<TensorRecord>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Tensors {
        List(Vec<TensorRecord>),
        Map(BTreeMap<String, TensorRecord>),
    }
    Ok(match Tensors::deserialize(d)? {
        Tensors::List(list) => list,
        Tensors::Map(map) => map
            .into_iter()
            .map(|(name, mut t)| {
                if t.name.is_empty() {
                    t.name = name;
                }
                t
            })
            .collect(),
    })
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
        if version.version != super::VERSION {
            return Err(format!(
                "unsupported .mnw manifest version {} (this minnow reads version {})",
                version.version,
                super::VERSION
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

    fn sample() -> Manifest {
        Manifest {
            version: 1,
            architecture: "llada2_moe".into(),
            model_id: "tiny".into(),
            assets: BTreeMap::from([("config.json".into(), AssetText("{}".into()))]),
            tensors: vec![TensorRecord {
                name: "a".into(),
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
            }],
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

    #[test]
    fn reads_tensors_as_a_map_and_ignores_unknown_fields() {
        #[derive(Serialize)]
        struct Other<'a> {
            version: u64,
            architecture: &'a str,
            model_id: &'a str,
            assets: BTreeMap<String, String>,
            tensors: BTreeMap<String, TensorRecord>,
            extra: u32,
        }
        let mut t = sample().tensors.remove(0);
        t.name.clear();
        let other = Other {
            version: 1,
            architecture: "llada2_moe",
            model_id: "x",
            assets: BTreeMap::new(),
            tensors: BTreeMap::from([("w".to_string(), t)]),
            extra: 7,
        };
        let m = Manifest::from_bytes(&rmp_serde::to_vec_named(&other).unwrap()).unwrap();
        assert_eq!(m.tensors[0].name, "w");
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
