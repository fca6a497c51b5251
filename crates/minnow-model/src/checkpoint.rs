//! Opening a checkpoint: a directory (config.json + safetensors) or a `.mnw` file (config as an
//! asset), with the family settled from config and tensors (config.json cannot tell 2.0 from
//! 2.1; the stored type of `expert_bias` does). Every device's loader starts here.

use std::path::Path;

use minnow_format::Checkpoint;

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::weights::expert_bias_dtype;

/// Reads the config and memory-maps the tensors of `path`: a directory (safetensors, single
/// file or sharded) or a `.mnw` file, whose structure is checked before anything is returned.
pub fn open(path: &Path) -> Result<(Config, Checkpoint)> {
    let weights_error = |e: minnow_format::FormatError| ModelError::Weights(e.to_string());
    let (mut config, source) = if path.is_dir() {
        // The config first: its errors are the likelier ones and name the file.
        let config = Config::from_dir(path)?;
        (config, Checkpoint::open(path).map_err(weights_error)?)
    } else {
        let source = Checkpoint::open(path).map_err(weights_error)?;
        let text = source
            .asset("config.json")
            .map_err(weights_error)?
            .ok_or_else(|| {
                ModelError::Weights(format!("{}: no config.json asset", path.display()))
            })?;
        let config = Config::from_json_str(&text, &path.join("config.json"))?;
        (config, source)
    };
    config.refine_family(expert_bias_dtype(&config, &source));
    Ok((config, source))
}
