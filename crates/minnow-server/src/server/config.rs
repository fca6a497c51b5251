//! Everything `minnow serve` was told on its command line, in the form the server uses.

use std::path::PathBuf;
use std::time::Duration;

use minnow_engine::EngineOptions;

/// Default cap on request bodies (issue: 8 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 8 * 1024 * 1024;

/// Default number of stored Responses API responses.
pub const DEFAULT_RESPONSES_MAX: usize = 1024;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to bind ("127.0.0.1:8080"; port 0 picks a free port, logged at startup).
    pub listen: String,
    pub model_path: PathBuf,
    /// The model is the bundled tiny fixture because no --model was given.
    pub model_is_fixture: bool,
    pub api_key: Option<String>,
    /// Model id reported by the API; defaults to the checkpoint directory name.
    pub alias: Option<String>,
    pub ui_dir: Option<PathBuf>,
    pub body_limit: usize,
    /// Server-wide output cap; `None`: the rest of the context.
    pub max_tokens: Option<usize>,
    /// Interval of SSE keep-alive comments while a stream has nothing else to send.
    pub keep_alive: Duration,
    /// Draw a progress bar while the weights load (stderr is a terminal).
    pub show_progress: bool,
    /// Responses API responses kept for `previous_response_id` and GET (LRU beyond).
    pub responses_max: usize,
    pub engine: EngineOptions,
}

impl ServerConfig {
    /// The model id clients see in `/v1/models` and in responses.
    pub fn model_id(&self) -> String {
        if let Some(alias) = &self.alias {
            return alias.clone();
        }
        self.model_path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.model_path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &str, alias: Option<&str>) -> ServerConfig {
        ServerConfig {
            listen: "127.0.0.1:0".into(),
            model_path: PathBuf::from(path),
            model_is_fixture: false,
            api_key: None,
            alias: alias.map(str::to_string),
            ui_dir: None,
            body_limit: DEFAULT_BODY_LIMIT,
            max_tokens: None,
            keep_alive: Duration::from_secs(5),
            show_progress: false,
            responses_max: DEFAULT_RESPONSES_MAX,
            engine: EngineOptions::default(),
        }
    }

    #[test]
    fn model_id_prefers_alias() {
        assert_eq!(config("/m/LLaDA2.1-mini", None).model_id(), "LLaDA2.1-mini");
        assert_eq!(
            config("/m/LLaDA2.1-mini/", None).model_id(),
            "LLaDA2.1-mini"
        );
        assert_eq!(config("/m/x", Some("mini")).model_id(), "mini");
    }
}
