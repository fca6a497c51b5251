//! The header and the structural rules of a file: everything a reader checks before it hands
//! out a tensor (docs/model-format.md §Layout). No checksum is computed here; [`super::validate`]
//! does that.

use std::collections::BTreeMap;

use minnow_runtime::quant::{Encoding, QuantEncoding};

use super::manifest::{Manifest, Region, TensorRecord};

/// The first eight bytes of every version-1 file.
pub const MAGIC: &[u8; 8] = b"MINNOW01";
/// Bytes of the header.
pub const HEADER_LEN: usize = 64;
/// Every region (and the first one, at 4096) starts on this boundary.
pub const ALIGN: u64 = 4096;
/// The largest manifest a reader accepts.
pub const MAX_MANIFEST: u64 = 128 << 20;
/// The architecture string of LLaDA2.x models.
pub const ARCHITECTURE: &str = "llada2_moe";
/// Assets a file must carry.
pub const REQUIRED_ASSETS: [&str; 3] = ["config.json", "tokenizer.json", "chat_template.jinja"];
/// Assets a converter keeps when the source has them.
pub const OPTIONAL_ASSETS: [&str; 3] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
];

/// `n` rounded up to the region alignment.
pub fn align_up(n: u64) -> Option<u64> {
    n.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

/// The 64-byte header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub manifest_offset: u64,
    pub manifest_len: u64,
    pub file_len: u64,
    /// BLAKE3 of the serialized manifest.
    pub manifest_blake3: [u8; 32],
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..8].copy_from_slice(MAGIC);
        out[8..16].copy_from_slice(&self.manifest_offset.to_le_bytes());
        out[16..24].copy_from_slice(&self.manifest_len.to_le_bytes());
        out[24..32].copy_from_slice(&self.file_len.to_le_bytes());
        out[32..64].copy_from_slice(&self.manifest_blake3);
        out
    }

    /// Decodes the header of a file that is `actual_len` bytes long and checks that the
    /// manifest it points to is where the format puts it.
    pub fn decode(bytes: &[u8], actual_len: u64) -> Result<Header, String> {
        if bytes.len() < HEADER_LEN || actual_len < HEADER_LEN as u64 {
            return Err(format!(
                "truncated .mnw file: {actual_len} bytes, shorter than the 64-byte header"
            ));
        }
        if &bytes[..8] != MAGIC {
            return Err(if bytes[..6] == MAGIC[..6] {
                format!(
                    "unsupported .mnw container version '{}' (this minnow reads MINNOW01)",
                    String::from_utf8_lossy(&bytes[..8])
                )
            } else {
                "not a .mnw file (its first bytes are not MINNOW01)".to_string()
            });
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let header = Header {
            manifest_offset: u64_at(8),
            manifest_len: u64_at(16),
            file_len: u64_at(24),
            manifest_blake3: bytes[32..64].try_into().expect("32 bytes"),
        };
        if header.file_len != actual_len {
            return Err(format!(
                "the header records a file of {} bytes but the file has {actual_len} (truncated or \
                 appended to)",
                header.file_len
            ));
        }
        if header.manifest_len > MAX_MANIFEST {
            return Err(format!(
                "the manifest is {} bytes, over the 128 MiB limit",
                header.manifest_len
            ));
        }
        if header.manifest_len == 0 {
            return Err("the header records an empty manifest".into());
        }
        if header.manifest_offset < ALIGN || !header.manifest_offset.is_multiple_of(ALIGN) {
            return Err(format!(
                "the manifest offset {} is not a multiple of 4096 after the header",
                header.manifest_offset
            ));
        }
        if header.manifest_offset.checked_add(header.manifest_len) != Some(actual_len) {
            return Err(format!(
                "the manifest ({} bytes at offset {}) does not end at the end of the file ({actual_len} bytes)",
                header.manifest_len, header.manifest_offset
            ));
        }
        Ok(header)
    }
}

/// Which part of a tensor a region holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionKind {
    Data,
    Scales,
}

/// A region of the file with what it belongs to.
#[derive(Clone, Debug)]
pub struct Span {
    pub start: u64,
    pub end: u64,
    pub tensor: String,
    pub kind: RegionKind,
    pub blake3: String,
    /// For scale regions of quantized tensors: the encoding (validate checks the values).
    pub encoding: Option<QuantEncoding>,
}

impl Span {
    /// "tensor 'x' data" / "tensor 'x' scales".
    pub fn label(&self) -> String {
        let kind = match self.kind {
            RegionKind::Data => "data",
            RegionKind::Scales => "scales",
        };
        format!("tensor '{}' {kind}", self.tensor)
    }
}

/// One checked tensor.
#[derive(Clone, Debug)]
pub struct Entry {
    pub encoding: Encoding,
    pub shape: Vec<usize>,
    pub data: std::ops::Range<usize>,
    pub scales: Option<std::ops::Range<usize>>,
    pub group_size: usize,
    pub global_scale: f32,
}

/// A manifest that passed every structural rule.
pub struct Checked {
    pub manifest: Manifest,
    pub entries: BTreeMap<String, Entry>,
    /// Every non-empty region, sorted by offset.
    pub spans: Vec<Span>,
}

/// Checks the manifest against the header and the format's rules.
pub fn check(header: &Header, manifest_bytes: &[u8]) -> Result<Checked, String> {
    let manifest = Manifest::from_bytes(manifest_bytes)?;
    if manifest.architecture != ARCHITECTURE {
        return Err(format!(
            "architecture '{}' is not supported (minnow runs '{ARCHITECTURE}')",
            manifest.architecture
        ));
    }
    for name in REQUIRED_ASSETS {
        if manifest.asset(name).is_none() {
            return Err(format!("the file carries no '{name}' asset"));
        }
    }
    let mut entries = BTreeMap::new();
    let mut spans = Vec::new();
    // Names are unique: the manifest's reader refuses a repeated one.
    for (name, t) in &manifest.tensors {
        let entry = check_tensor(header, name, t, &mut spans)
            .map_err(|e| format!("tensor '{name}': {e}"))?;
        entries.insert(name.clone(), entry);
    }
    spans.sort_by_key(|s| (s.start, s.end));
    for pair in spans.windows(2) {
        if pair[1].start < pair[0].end {
            return Err(format!(
                "the regions of {} and {} overlap",
                pair[0].label(),
                pair[1].label()
            ));
        }
    }
    Ok(Checked {
        manifest,
        entries,
        spans,
    })
}

fn check_tensor(
    header: &Header,
    name: &str,
    t: &TensorRecord,
    spans: &mut Vec<Span>,
) -> Result<Entry, String> {
    let encoding =
        Encoding::parse(&t.encoding).ok_or_else(|| format!("unknown encoding '{}'", t.encoding))?;
    let shape: Vec<usize> = t
        .shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is too large")))
        .collect::<Result<_, _>>()?;
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("its shape overflows")?;
    let group_size = usize::try_from(t.group_size).map_err(|_| "group_size is too large")?;
    let (want_data, want_scales, global_scale) = match encoding {
        Encoding::Float(dtype) => {
            if group_size != 0 {
                return Err(format!(
                    "{encoding} data must have group_size 0, not {group_size}"
                ));
            }
            if t.scales.is_some() {
                return Err(format!("{encoding} data has a scales region"));
            }
            (
                numel
                    .checked_mul(dtype.size())
                    .ok_or("its shape overflows")?,
                None,
                1.0,
            )
        }
        Encoding::Quant(q) => {
            let [n, k] = shape[..] else {
                return Err(format!("{q} needs a 2-D shape, not {shape:?}"));
            };
            q.check_shape(n, k, group_size)?;
            let group = q.manifest_group(group_size);
            let global = match (q, t.global_scale) {
                (QuantEncoding::Nvfp4, Some(g)) if g.is_finite() && g > 0.0 => g,
                (QuantEncoding::Nvfp4, Some(g)) => {
                    return Err(format!("nvfp4 global_scale {g} is not positive and finite"))
                }
                (QuantEncoding::Nvfp4, None) => return Err("nvfp4 data has no global_scale".into()),
                _ => 1.0,
            };
            (
                q.codes_bytes(n, k).ok_or("its shape overflows")?,
                Some(q.scales_bytes(n, k, group).ok_or("its shape overflows")?),
                global,
            )
        }
    };
    let data = check_region(header, &t.data, "data")?;
    if data.len() != want_data {
        return Err(format!(
            "its data region is {} bytes; shape {shape:?} in {encoding} needs {want_data}",
            data.len()
        ));
    }
    let quant = match encoding {
        Encoding::Quant(q) => Some(q),
        Encoding::Float(_) => None,
    };
    let mut push = |range: &std::ops::Range<usize>, kind, region: &Region| {
        if !range.is_empty() {
            spans.push(Span {
                start: range.start as u64,
                end: range.end as u64,
                tensor: name.to_string(),
                kind,
                blake3: region.blake3.clone(),
                encoding: quant.filter(|_| kind == RegionKind::Scales),
            });
        }
    };
    push(&data, RegionKind::Data, &t.data);
    let scales = match (want_scales, &t.scales) {
        (None, _) => None,
        (Some(_), None) => return Err(format!("{encoding} data has no scales region")),
        (Some(want), Some(region)) => {
            let range = check_region(header, region, "scales")?;
            if range.len() != want {
                return Err(format!(
                    "its scales region is {} bytes; {encoding} {shape:?} with group size {group_size} needs {want}",
                    range.len()
                ));
            }
            push(&range, RegionKind::Scales, region);
            Some(range)
        }
    };
    Ok(Entry {
        encoding,
        shape,
        data,
        scales,
        group_size: match encoding {
            Encoding::Quant(q) => q.manifest_group(group_size),
            Encoding::Float(_) => 0,
        },
        global_scale,
    })
}

/// A region's byte range, checked against the alignment and the manifest.
fn check_region(header: &Header, r: &Region, what: &str) -> Result<std::ops::Range<usize>, String> {
    // Written lowercase; either case is read (the published format compares digests
    // case-insensitively).
    if r.blake3.len() != 64 || !r.blake3.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("its {what} digest is not 64 hex characters"));
    }
    if r.offset < ALIGN || !r.offset.is_multiple_of(ALIGN) {
        return Err(format!(
            "its {what} region starts at {}, not a multiple of 4096 after the header",
            r.offset
        ));
    }
    let end = r
        .offset
        .checked_add(r.bytes)
        .filter(|&end| end <= header.manifest_offset)
        .ok_or_else(|| {
            format!(
                "its {what} region ({} bytes at {}) runs past the start of the manifest at {}",
                r.bytes, r.offset, header.manifest_offset
            )
        })?;
    // Both fit in the file, which is mapped, so they fit in usize.
    Ok(r.offset as usize..end as usize)
}

/// The aligned end of a region (where the next one may start).
pub fn next_offset(start: u64, bytes: u64) -> Option<u64> {
    align_up(start.checked_add(bytes)?)
}
