//! A Hugging Face checkpoint directory: `model.safetensors`, or the shards listed by
//! `model.safetensors.index.json`. Every file is memory-mapped; tensors are borrowed from the
//! maps without copying.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use minnow_runtime::DType;
use safetensors::tensor::SafeTensorError;
use safetensors::SafeTensors;

use crate::error::{FormatError, Result};
use crate::source::{TensorRef, TensorSource};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor's location inside a mapped file.
#[derive(Debug)]
struct Entry {
    file: usize,
    dtype_name: String,
    dtype: Option<DType>,
    shape: Vec<usize>,
    /// Byte range inside the file (absolute, header included).
    start: usize,
    end: usize,
}

/// The memory-mapped safetensors files of one checkpoint directory.
pub struct SafetensorsDir {
    dir: PathBuf,
    maps: Vec<Mmap>,
    tensors: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for SafetensorsDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl SafetensorsDir {
    /// Opens `dir/model.safetensors.index.json` (sharded) or `dir/model.safetensors`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let files: Vec<PathBuf> = if index_path.is_file() {
            shards_from_index(&index_path)?
                .into_iter()
                .map(|f| dir.join(f))
                .collect()
        } else if dir.join(SINGLE_FILE).is_file() {
            vec![dir.join(SINGLE_FILE)]
        } else {
            return Err(FormatError::invalid(
                dir,
                format!("no {SINGLE_FILE} or {INDEX_FILE} in the checkpoint directory"),
            ));
        };
        let mut out = SafetensorsDir {
            dir: dir.to_path_buf(),
            maps: Vec::new(),
            tensors: BTreeMap::new(),
        };
        for path in &files {
            out.add_file(path)?;
        }
        if index_path.is_file() {
            out.check_index(&index_path, &files)?;
        }
        Ok(out)
    }

    /// Maps one file and records its tensors.
    fn add_file(&mut self, path: &Path) -> Result<()> {
        let io = |source| FormatError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 8 {
            return Err(FormatError::invalid(
                path,
                format!("truncated safetensors file ({len} bytes, shorter than its 8-byte header length)"),
            ));
        }
        // SAFETY: the checkpoint is treated as read-only; like every mmap-based loader we assume
        // nobody truncates the file while it is mapped.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| describe_header_error(path, &map, e))?;
        let data_start = 8 + header_len;
        let file_index = self.maps.len();
        for (name, info) in metadata.tensors() {
            let dtype_name = format!("{:?}", info.dtype);
            let dtype = match info.dtype {
                safetensors::Dtype::BF16 => Some(DType::BF16),
                safetensors::Dtype::F16 => Some(DType::F16),
                safetensors::Dtype::F32 => Some(DType::F32),
                _ => None,
            };
            if self.tensors.contains_key(&name) {
                return Err(FormatError::invalid(
                    path,
                    format!("tensor '{name}' is stored in more than one file"),
                ));
            }
            self.tensors.insert(
                name,
                Entry {
                    file: file_index,
                    dtype_name,
                    dtype,
                    shape: info.shape.clone(),
                    start: data_start + info.data_offsets.0,
                    end: data_start + info.data_offsets.1,
                },
            );
        }
        self.maps.push(map);
        Ok(())
    }

    /// Every tensor the index names must be in the shard it names.
    fn check_index(&self, index_path: &Path, files: &[PathBuf]) -> Result<()> {
        for (name, file) in read_weight_map(index_path)? {
            let want = files
                .iter()
                .position(|f| f.file_name() == Some(file.as_ref()));
            let found = self.tensors.get(&name).map(|e| e.file);
            if found.is_none() || found != want {
                return Err(FormatError::invalid(
                    index_path,
                    format!("weight_map puts tensor '{name}' in {file}, which does not contain it"),
                ));
            }
        }
        Ok(())
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of mapped files.
    pub fn file_count(&self) -> usize {
        self.maps.len()
    }
}

impl TensorSource for SafetensorsDir {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        let e = self.tensors.get(name)?;
        Some(TensorRef {
            dtype: e.dtype,
            dtype_name: &e.dtype_name,
            shape: &e.shape,
            data: &self.maps[e.file][e.start..e.end],
            quant: None,
        })
    }

    fn names(&self) -> Vec<&str> {
        self.tensors.keys().map(String::as_str).collect()
    }

    fn describe(&self) -> String {
        match self.maps.len() {
            1 => format!("{}", self.dir.display()),
            n => format!("{} ({n} shards)", self.dir.display()),
        }
    }

    fn release(&self, name: &str) {
        if let Some(e) = self.tensors.get(name) {
            crate::source::release_pages(&self.maps[e.file], e.start..e.end);
        }
    }
}

/// Reads `weight_map` of an index file.
fn read_weight_map(index_path: &Path) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(index_path).map_err(|source| FormatError::Io {
        path: index_path.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| FormatError::invalid(index_path, format!("not valid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| FormatError::invalid(index_path, "missing object 'weight_map'"))?;
    map.iter()
        .map(|(name, file)| {
            let file = file.as_str().ok_or_else(|| {
                FormatError::invalid(index_path, format!("weight_map['{name}'] is not a string"))
            })?;
            if file.contains('/') || file.contains('\\') || file == ".." {
                return Err(FormatError::invalid(
                    index_path,
                    format!("weight_map['{name}'] = '{file}' is not a file name in the directory"),
                ));
            }
            Ok((name.clone(), file.to_string()))
        })
        .collect()
}

/// The distinct shard files of an index, in a stable order.
fn shards_from_index(index_path: &Path) -> Result<Vec<String>> {
    let files: BTreeSet<String> = read_weight_map(index_path)?.into_values().collect();
    if files.is_empty() {
        return Err(FormatError::invalid(index_path, "weight_map is empty"));
    }
    Ok(files.into_iter().collect())
}

/// Turns a safetensors parse error into a sentence that says what is wrong with the file.
fn describe_header_error(path: &Path, map: &[u8], e: SafeTensorError) -> FormatError {
    let message = match e {
        SafeTensorError::MetadataIncompleteBuffer => {
            let header_len = u64::from_le_bytes(map[..8].try_into().unwrap_or([0; 8]));
            format!(
                "truncated or corrupt safetensors file: its header (length {header_len}) describes \
                 more or fewer data bytes than the file's {} bytes",
                map.len()
            )
        }
        SafeTensorError::InvalidHeaderLength | SafeTensorError::HeaderTooSmall => {
            format!(
                "truncated safetensors file: the header does not fit in the file's {} bytes",
                map.len()
            )
        }
        other => format!("invalid safetensors file: {other}"),
    };
    FormatError::invalid(path, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn write_file(path: &Path, tensors: &[(&str, Vec<usize>)]) {
        let bufs: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
            .iter()
            .map(|(n, s)| {
                (
                    n.to_string(),
                    vec![0u8; s.iter().product::<usize>() * 2],
                    s.clone(),
                )
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = bufs
            .iter()
            .map(|(n, b, s)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), b)
                        .unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn opens_single_file() {
        let dir = tempfile::tempdir().unwrap();
        write_file(
            &dir.path().join(SINGLE_FILE),
            &[("a", vec![2, 3]), ("b", vec![4])],
        );
        let st = SafetensorsDir::open(dir.path()).unwrap();
        let a = st.tensor("a").unwrap();
        assert_eq!(a.shape, &[2, 3]);
        assert_eq!(a.dtype, Some(DType::BF16));
        assert_eq!(a.data.len(), 12);
        assert_eq!(st.names(), vec!["a", "b"]);
        assert!(st.tensor("c").is_none());
    }

    #[test]
    fn opens_shards_through_the_index() {
        let dir = tempfile::tempdir().unwrap();
        write_file(&dir.path().join("s1.safetensors"), &[("a", vec![2])]);
        write_file(&dir.path().join("s2.safetensors"), &[("b", vec![3])]);
        let map: HashMap<&str, &str> = [("a", "s1.safetensors"), ("b", "s2.safetensors")].into();
        let index = serde_json::json!({"metadata": {}, "weight_map": map});
        std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
        let st = SafetensorsDir::open(dir.path()).unwrap();
        assert_eq!(st.file_count(), 2);
        assert_eq!(st.tensor("b").unwrap().shape, &[3]);

        // An index entry pointing at the wrong shard is reported by name.
        let bad: HashMap<&str, &str> = [("a", "s2.safetensors"), ("b", "s2.safetensors")].into();
        let index = serde_json::json!({"weight_map": bad});
        std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
        let err = SafetensorsDir::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("'a'"), "{err}");
    }

    #[test]
    fn truncated_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SINGLE_FILE);
        write_file(&path, &[("a", vec![64])]);
        let bytes = std::fs::read(&path).unwrap();
        for cut in [bytes.len() - 10, 20, 4] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let err = SafetensorsDir::open(dir.path()).unwrap_err().to_string();
            assert!(err.contains("truncated"), "cut {cut}: {err}");
            assert!(err.contains("model.safetensors"), "{err}");
        }
    }

    #[test]
    fn missing_weights_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = SafetensorsDir::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no model.safetensors"), "{err}");
    }
}
