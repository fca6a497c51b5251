//! Opening a checkpoint path of either kind: a directory of safetensors (plus its config and
//! tokenizer files) or a single `.mnw` file (which carries them as assets).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{FormatError, Result};
use crate::mnw::{MnwFile, OPTIONAL_ASSETS, REQUIRED_ASSETS};
use crate::safetensors_dir::SafetensorsDir;
use crate::source::{TensorRef, TensorSource};

/// A checkpoint's tensors and text files, whatever the container.
#[derive(Debug)]
pub enum Checkpoint {
    Safetensors(SafetensorsDir),
    Mnw(MnwFile),
}

impl Checkpoint {
    /// A directory opens as safetensors, a file as `.mnw`.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        if path.is_dir() {
            SafetensorsDir::open(path).map(Checkpoint::Safetensors)
        } else if path.is_file() {
            MnwFile::open(path).map(Checkpoint::Mnw)
        } else {
            Err(FormatError::invalid(
                path,
                "no such checkpoint (expected a directory or a .mnw file)",
            ))
        }
    }

    /// A text file of the checkpoint (`config.json`, ...): a file of the directory, or an asset.
    pub fn asset(&self, name: &str) -> Result<Option<String>> {
        match self {
            Checkpoint::Mnw(f) => Ok(f.asset(name).map(str::to_string)),
            Checkpoint::Safetensors(d) => {
                let path = d.dir().join(name);
                match std::fs::read_to_string(&path) {
                    Ok(text) => Ok(Some(text)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(source) => Err(FormatError::Io { path, source }),
                }
            }
        }
    }

    /// The assets a `.mnw` written from this checkpoint carries: the required ones (an error
    /// names the first missing one) and the optional ones that exist. A directory without
    /// `chat_template.jinja` gives the `chat_template` string of its `tokenizer_config.json`
    /// instead (older Hugging Face checkpoints keep it there).
    pub fn assets(&self) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for name in OPTIONAL_ASSETS {
            if let Some(text) = self.asset(name)? {
                out.insert(name.to_string(), text);
            }
        }
        for name in REQUIRED_ASSETS {
            let text = match self.asset(name)? {
                Some(text) => Some(text),
                None if name == "chat_template.jinja" => out
                    .get("tokenizer_config.json")
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
                    .and_then(|j| j.get("chat_template")?.as_str().map(str::to_string)),
                None => None,
            };
            let text = text.ok_or_else(|| {
                FormatError::invalid(
                    self.path(),
                    format!("the checkpoint has no {name}, which a .mnw file must carry"),
                )
            })?;
            out.insert(name.to_string(), text);
        }
        Ok(out)
    }

    /// The directory or file.
    pub fn path(&self) -> &Path {
        match self {
            Checkpoint::Safetensors(d) => d.dir(),
            Checkpoint::Mnw(f) => f.path(),
        }
    }

    /// A name for the source: a `.mnw`'s own `model_id`, else the directory's name.
    pub fn model_id(&self) -> String {
        match self {
            Checkpoint::Mnw(f) => f.manifest().model_id.clone(),
            Checkpoint::Safetensors(d) => d
                .dir()
                .canonicalize()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| d.dir().display().to_string()),
        }
    }

    fn inner(&self) -> &dyn TensorSource {
        match self {
            Checkpoint::Safetensors(d) => d,
            Checkpoint::Mnw(f) => f,
        }
    }
}

impl TensorSource for Checkpoint {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        self.inner().tensor(name)
    }

    fn names(&self) -> Vec<&str> {
        self.inner().names()
    }

    fn describe(&self) -> String {
        self.inner().describe()
    }

    fn release(&self, name: &str) {
        self.inner().release(name)
    }
}
