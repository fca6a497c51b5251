//! Everything `minnow serve` was told on its command line, in the form the server uses.

use std::path::PathBuf;
use std::time::Duration;

use minnow_engine::EngineOptions;

use super::origin::OriginPolicy;

/// Default cap on request bodies (issue: 8 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 8 * 1024 * 1024;

/// Default number of stored Responses API responses.
pub const DEFAULT_RESPONSES_MAX: usize = 1024;

/// Default memory of the stored Responses API responses, in MiB (`--responses-max-mib`).
pub const DEFAULT_RESPONSES_MAX_MIB: usize = 256;

/// Connection-level limits (`connections.rs`, `routes::read_json`).
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// `--header-timeout`: time to the first byte, to the end of the request head, and to the
    /// start of a connection's first request (either protocol).
    pub header_timeout: Duration,
    /// `--idle-timeout`: a connection with no request in flight for this long is closed (HTTP/2
    /// with a GOAWAY first).
    pub idle_timeout: Duration,
    /// `--body-timeout`: longest wait for the next piece of a request body.
    pub body_timeout: Duration,
    /// `--min-body-rate`: bytes per second a request body must average once its first byte has
    /// arrived (after a short allowance); 0 turns the check off.
    pub min_body_rate: u64,
    /// `--max-connections`: connections open at once; more get a 503 and are closed.
    pub max_connections: usize,
    /// `--max-connections-per-peer`: connections open at once from one IP address.
    pub max_connections_per_peer: usize,
    /// `--shutdown-grace`: how long a shutdown waits for open requests.
    pub shutdown_grace: Duration,
    /// `--stall-limit`: how long one engine step (a batched forward) may run before `/health`
    /// and new generation requests answer 503: the device no longer answers.
    pub stall_limit: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            min_body_rate: 1024,
            max_connections: 1024,
            max_connections_per_peer: 512,
            shutdown_grace: Duration::from_secs(30),
            stall_limit: Duration::from_secs(600),
        }
    }
}

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
    /// `--responses-max-mib`: memory the stored responses may take, in bytes (LRU beyond).
    pub responses_max_bytes: usize,
    /// `--strict-fields`: an unknown request field is a 400 instead of being ignored and listed.
    pub strict_fields: bool,
    /// `--allow-host` / `--cors-origin`; `loopback_only` is set from the bound address.
    pub origin: OriginPolicy,
    /// `--allow-special-in-content`: special-token strings in chat messages act as control
    /// tokens (off by default: they are plain text, see minnow-engine's `text/client_text.rs`).
    pub allow_special_in_content: bool,
    pub limits: ConnectionLimits,
    pub engine: EngineOptions,
}

impl ServerConfig {
    /// The model id clients see in `/v1/models` and in responses: the alias, else the
    /// directory's name, or a `.mnw` file's name without its extension.
    pub fn model_id(&self) -> String {
        if let Some(alias) = &self.alias {
            return alias.clone();
        }
        let path = &self.model_path;
        let name = match path.extension() {
            Some(ext) if ext.eq_ignore_ascii_case("mnw") => path.file_stem(),
            _ => path.file_name(),
        };
        name.map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string())
    }
}

/// The command line's defaults for `model_path`, on a free loopback port: what unit tests start
/// from (struct update syntax for what they change).
#[cfg(test)]
pub(crate) fn test_config(model_path: PathBuf) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".into(),
        model_path,
        model_is_fixture: false,
        api_key: None,
        alias: None,
        ui_dir: None,
        body_limit: DEFAULT_BODY_LIMIT,
        max_tokens: None,
        keep_alive: Duration::from_secs(5),
        show_progress: false,
        responses_max: DEFAULT_RESPONSES_MAX,
        responses_max_bytes: DEFAULT_RESPONSES_MAX_MIB << 20,
        strict_fields: false,
        origin: OriginPolicy::default(),
        allow_special_in_content: false,
        limits: ConnectionLimits::default(),
        engine: EngineOptions::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &str, alias: Option<&str>) -> ServerConfig {
        ServerConfig {
            alias: alias.map(str::to_string),
            ..test_config(PathBuf::from(path))
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
        assert_eq!(
            config("/m/LLaDA2.2-mini-int4.mnw", None).model_id(),
            "LLaDA2.2-mini-int4"
        );
        assert_eq!(config("/m/mini.MNW", None).model_id(), "mini");
        // Only the container's extension goes; a directory's dots stay.
        assert_eq!(config("/m/LLaDA2.2-mini", None).model_id(), "LLaDA2.2-mini");
    }
}
