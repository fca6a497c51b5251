//! [`MnwFile`]: a `.mnw` container memory-mapped as a [`TensorSource`]. Opening checks the
//! header and every structural rule ([`super::layout`]) before any tensor is handed out;
//! checksums are `validate`'s job.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use minnow_runtime::quant::Encoding;

use super::layout::{check, Entry, Header, HEADER_LEN};
use super::manifest::Manifest;
use crate::error::{FormatError, Result};
use crate::source::{QuantParts, TensorRef, TensorSource};

/// An open `.mnw` file.
pub struct MnwFile {
    path: PathBuf,
    map: Mmap,
    header: Header,
    manifest: Manifest,
    entries: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for MnwFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl MnwFile {
    /// Maps `path` and checks its structure.
    pub fn open(path: &Path) -> Result<MnwFile> {
        let io = |source| FormatError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < HEADER_LEN as u64 {
            return Err(FormatError::invalid(
                path,
                format!("truncated .mnw file: {len} bytes, shorter than the 64-byte header"),
            ));
        }
        // SAFETY: the file is treated as read-only; like every mmap-based loader we assume
        // nobody truncates it while it is mapped.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = Header::decode(&map, len).map_err(|e| FormatError::invalid(path, e))?;
        let start = header.manifest_offset as usize;
        let manifest_bytes = &map[start..start + header.manifest_len as usize];
        let checked = check(&header, manifest_bytes).map_err(|e| FormatError::invalid(path, e))?;
        Ok(MnwFile {
            path: path.to_path_buf(),
            map,
            header,
            manifest: checked.manifest,
            entries: checked.entries,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// An asset's text (`config.json`, `tokenizer.json`, ...).
    pub fn asset(&self, name: &str) -> Option<&str> {
        self.manifest.asset(name)
    }

    /// The encoding and group size of every tensor, by name.
    pub fn encodings(&self) -> impl Iterator<Item = (&str, Encoding, usize)> {
        self.entries
            .iter()
            .map(|(n, e)| (n.as_str(), e.encoding, e.group_size))
    }

    /// Bytes of a tensor's regions (data plus scales).
    pub fn stored_bytes(&self, name: &str) -> Option<usize> {
        let e = self.entries.get(name)?;
        Some(e.data.len() + e.scales.as_ref().map_or(0, |s| s.len()))
    }
}

impl TensorSource for MnwFile {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        let e = self.entries.get(name)?;
        let data = &self.map[e.data.clone()];
        Some(match e.encoding {
            Encoding::Float(dtype) => TensorRef {
                dtype: Some(dtype),
                dtype_name: dtype.name(),
                shape: &e.shape,
                data,
                quant: None,
            },
            Encoding::Quant(q) => TensorRef {
                dtype: None,
                dtype_name: q.name(),
                shape: &e.shape,
                data,
                quant: Some(QuantParts {
                    encoding: q,
                    group_size: e.group_size,
                    scales: e.scales.clone().map_or(&[][..], |r| &self.map[r]),
                    global_scale: e.global_scale,
                }),
            },
        })
    }

    fn names(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }

    fn describe(&self) -> String {
        format!("{}", self.path.display())
    }

    fn release(&self, name: &str) {
        if let Some(e) = self.entries.get(name) {
            crate::source::release_pages(&self.map, e.data.clone());
            if let Some(scales) = &e.scales {
                crate::source::release_pages(&self.map, scales.clone());
            }
        }
    }
}
