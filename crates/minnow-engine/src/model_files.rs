//! The text files of a model (tokenizer, chat template, generation config) as a directory the
//! tokenizer and template loaders can read: a checkpoint directory is used as it is; a `.mnw`
//! file's assets are written into a private temporary directory that lives while the engine
//! loads (they are a few MiB of text, and this keeps one loading path for both containers).

use std::path::{Path, PathBuf};

use minnow_format::{Checkpoint, MnwFile};

use crate::error::{EngineError, EngineResult};

/// Where a model's text files can be read from.
pub struct ModelFiles {
    dir: PathBuf,
    _extracted: Option<tempfile::TempDir>,
}

impl ModelFiles {
    /// For a directory, the directory; for a `.mnw` file, its assets.
    pub fn for_model(path: &Path) -> EngineResult<ModelFiles> {
        if path.is_dir() {
            return Ok(ModelFiles {
                dir: path.to_path_buf(),
                _extracted: None,
            });
        }
        let load = |e: String| EngineError::Load(e);
        let file = match Checkpoint::open(path).map_err(|e| load(e.to_string()))? {
            Checkpoint::Mnw(f) => f,
            Checkpoint::Safetensors(_) => unreachable!("a file opens as .mnw"),
        };
        let temp = tempfile::Builder::new()
            .prefix("minnow-assets-")
            .tempdir()
            .map_err(|e| {
                load(format!(
                    "cannot create a directory for the model's assets: {e}"
                ))
            })?;
        extract(&file, temp.path()).map_err(load)?;
        Ok(ModelFiles {
            dir: temp.path().to_path_buf(),
            _extracted: Some(temp),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn extract(file: &MnwFile, dir: &Path) -> Result<(), String> {
    for (name, text) in &file.manifest().assets {
        // Asset names are file names; anything with a path in it is not one of ours.
        if name.contains(['/', '\\']) || name.starts_with('.') {
            continue;
        }
        std::fs::write(dir.join(name), &text.0)
            .map_err(|e| format!("cannot write the model's asset {name}: {e}"))?;
    }
    Ok(())
}
