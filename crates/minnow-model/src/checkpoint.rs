//! Opening a checkpoint directory: its config and its tensors, with the family settled from both
//! (config.json cannot tell 2.0 from 2.1; the stored type of `expert_bias` does). Every device's
//! loader starts here.

use std::path::Path;

use minnow_format::SafetensorsDir;

use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::weights::expert_bias_dtype;

/// Reads `dir/config.json` and memory-maps the safetensors of `dir` (single file or sharded).
pub fn open(dir: &Path) -> Result<(Config, SafetensorsDir)> {
    let mut config = Config::from_dir(dir)?;
    let source = SafetensorsDir::open(dir).map_err(|e| ModelError::Weights(e.to_string()))?;
    config.refine_family(expert_bias_dtype(&config, &source));
    Ok((config, source))
}
