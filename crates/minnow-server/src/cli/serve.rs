//! `minnow serve`: the OpenAI-compatible HTTP server (see `crate::server` and docs/api.md).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use minnow_engine::{DecodeParams, EngineOptions};
use minnow_runtime::device::DeviceRequest;

use super::decode_flags::DecodeFlags;
use super::global::{Global, BUNDLED_FIXTURE};
use crate::server::{
    self, ConnectionLimits, OriginPolicy, ServerConfig, DEFAULT_BODY_LIMIT, DEFAULT_RESPONSES_MAX,
    DEFAULT_RESPONSES_MAX_MIB,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dtype {
    /// BF16 on a GPU, F32 on the CPU.
    Auto,
    Bf16,
    F32,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on (port 0: any free port; the bound address is logged).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Require `Authorization: Bearer KEY` on every API route (/health stays open).
    #[arg(long, env = "MINNOW_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// While bound to a loopback address, also accept requests whose Host is NAME (the guard
    /// against DNS rebinding refuses other names); repeatable, `*` accepts any.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_hosts: Vec<String>,
    /// Let browser pages from ORIGIN (`https://app.example:8443`) call the API (CORS); other
    /// cross-origin requests are refused. Repeatable; `*` allows every origin.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Model id reported by the API (default: the checkpoint directory name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Context limit in tokens (default: the checkpoint's max_position_embeddings).
    #[arg(long)]
    pub max_context: Option<usize>,
    /// Requests decoded at once: the most sequences batched into one forward (default: 16 on a
    /// GPU, 4 on the CPU).
    #[arg(long)]
    pub parallel: Option<usize>,
    /// K/V cache budget in MiB (fractions allowed), shared by every request and the prefix
    /// cache (default: on a GPU what is left after weights and workspace, minus a margin; on the
    /// CPU 4096).
    #[arg(long)]
    pub kv_cache_mib: Option<f64>,
    /// Requests that may wait for a free slot; more get HTTP 429.
    #[arg(long, default_value_t = 64)]
    pub queue_capacity: usize,
    /// Serve a built web UI (e.g. llama.cpp's) from this directory.
    #[arg(long)]
    pub ui_dir: Option<PathBuf>,
    /// Weight/compute dtype.
    #[arg(long, value_enum, default_value = "auto")]
    pub dtype: Dtype,
    /// Largest accepted request body in bytes (larger: HTTP 413).
    #[arg(long, default_value_t = DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
    /// Seconds between SSE keep-alive comments on an otherwise idle stream.
    #[arg(long, default_value_t = 5.0)]
    pub keep_alive: f64,
    /// Responses API responses kept in memory for `previous_response_id` and GET
    /// /v1/responses/{id}; the least recently used are evicted beyond it (0: keep none).
    #[arg(long, default_value_t = DEFAULT_RESPONSES_MAX)]
    pub responses_max: usize,
    /// Memory the stored Responses API responses may take, in MiB; the least recently used are
    /// evicted beyond it.
    #[arg(long, default_value_t = DEFAULT_RESPONSES_MAX_MIB, value_name = "MIB")]
    pub responses_max_mib: usize,
    /// Refuse (HTTP 400) request fields this server does not know, instead of ignoring them and
    /// listing them in the `x-minnow-ignored-fields` response header.
    #[arg(long)]
    pub strict_fields: bool,
    /// Let special-token strings inside chat messages (`<role>`, `<|role_end|>`, ...) act as the
    /// control tokens they name. By default they are plain text, so a user cannot forge turns.
    #[arg(long)]
    pub allow_special_in_content: bool,
    /// Seconds a connection may take to send its first byte and then its request headers.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    pub header_timeout: f64,
    /// Seconds a connection (HTTP/1 or HTTP/2) may stay open with no request in flight before
    /// it is closed.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    pub idle_timeout: f64,
    /// Seconds a request body may pause between pieces before the request gets HTTP 408.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    pub body_timeout: f64,
    /// Bytes per second a request body must average from its first byte on (after a 2-second
    /// allowance); slower bodies get HTTP 408 and the connection is closed. 0: no minimum.
    #[arg(long, default_value_t = 1024, value_name = "BYTES")]
    pub min_body_rate: u64,
    /// Connections open at once; more are answered 503 and closed (default: sized to the
    /// open-files limit).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Connections open at once from one IP address; more are answered 503 and closed
    /// (default: half of --max-connections).
    #[arg(long, value_name = "N")]
    pub max_connections_per_peer: Option<usize>,
    /// Seconds a shutdown waits for open requests before cutting them (exit status 1 then).
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    pub shutdown_grace: f64,
    /// Seconds one engine step (a batched forward) may run before /health and new generation
    /// requests answer 503: a step that long means the device no longer answers (a hung GPU
    /// kernel cannot be interrupted), and the server should be restarted.
    #[arg(long, default_value_t = 600.0, value_name = "SECS")]
    pub stall_limit: f64,
    #[command(flatten)]
    pub decode: DecodeArgs,
}

/// Server-wide decode defaults; requests override them field by field.
#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub flags: DecodeFlags,
    /// Output cap for requests that set none (default: the rest of the context).
    #[arg(long)]
    pub max_tokens: Option<usize>,
}

impl DecodeArgs {
    /// The defaults, checked at start-up so that a bad flag fails the command rather than every
    /// request.
    fn params(&self) -> Result<DecodeParams, String> {
        let params = self.flags.params()?;
        if self.max_tokens == Some(0) {
            return Err("--max-tokens must be at least 1".into());
        }
        Ok(params)
    }
}

pub fn run(cli: &Global, args: &Args) -> Result<(), String> {
    init_logging();
    let config = build_config(cli, args)?;
    server::run(config)
}

fn build_config(cli: &Global, args: &Args) -> Result<ServerConfig, String> {
    if args.parallel == Some(0) {
        return Err("--parallel must be at least 1".into());
    }
    if args
        .kv_cache_mib
        .is_some_and(|mib| !(mib.is_finite() && mib > 0.0))
    {
        return Err("--kv-cache-mib must be a positive number".into());
    }
    if args.max_context == Some(0) {
        return Err("--max-context must be at least 1".into());
    }
    if !(args.keep_alive.is_finite() && args.keep_alive > 0.0) {
        return Err("--keep-alive must be a positive number of seconds".into());
    }
    // An empty key would silently mean "no authentication"; say so instead.
    if args
        .api_key
        .as_deref()
        .is_some_and(|key| key.trim().is_empty())
    {
        return Err(
            "--api-key (or MINNOW_API_KEY) is empty; give a key, or leave it unset to serve without one"
                .into(),
        );
    }
    check_dtype(args.dtype, cli.device)?;
    if let Some(dir) = &args.ui_dir {
        if !dir.is_dir() {
            return Err(format!("--ui-dir {} is not a directory", dir.display()));
        }
    }
    let (model_path, model_is_fixture) = match &cli.model {
        Some(path) => (path.clone(), false),
        None => {
            let fixture = PathBuf::from(BUNDLED_FIXTURE);
            (fixture.canonicalize().unwrap_or(fixture), true)
        }
    };
    Ok(ServerConfig {
        listen: args.listen.clone(),
        model_path,
        model_is_fixture,
        api_key: args.api_key.clone(),
        alias: args.alias.clone(),
        ui_dir: args.ui_dir.clone(),
        body_limit: args.body_limit,
        max_tokens: args.decode.max_tokens,
        keep_alive: Duration::from_secs_f64(args.keep_alive),
        show_progress: std::io::stderr().is_terminal(),
        responses_max: args.responses_max,
        responses_max_bytes: args.responses_max_mib.saturating_mul(1 << 20),
        strict_fields: args.strict_fields,
        allow_special_in_content: args.allow_special_in_content,
        limits: connection_limits(args)?,
        origin: OriginPolicy {
            loopback_only: false,
            allowed_hosts: args
                .allow_hosts
                .iter()
                .map(|h| crate::server::host_name(h.trim()).to_ascii_lowercase())
                .collect(),
            cors_origins: args
                .cors_origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .collect(),
        },
        engine: EngineOptions {
            device: cli.device,
            threads: cli.threads,
            // 0: the engine picks the device's default.
            parallel: args.parallel.unwrap_or(0),
            kv_cache_bytes: args
                .kv_cache_mib
                .map(|mib| (mib * (1u64 << 20) as f64) as usize),
            step_tokens: EngineOptions::default().step_tokens,
            queue_capacity: args.queue_capacity,
            max_context: args.max_context,
            defaults: args.decode.params()?,
            ..EngineOptions::default()
        },
    })
}

fn connection_limits(args: &Args) -> Result<ConnectionLimits, String> {
    let max_connections = match args.max_connections {
        Some(0) => return Err("--max-connections must be at least 1".into()),
        Some(n) => n,
        None => server::default_max_connections(),
    };
    let max_connections_per_peer = match args.max_connections_per_peer {
        Some(0) => return Err("--max-connections-per-peer must be at least 1".into()),
        Some(n) => n.min(max_connections),
        None => max_connections.div_ceil(2),
    };
    Ok(ConnectionLimits {
        header_timeout: seconds("--header-timeout", args.header_timeout)?,
        idle_timeout: seconds("--idle-timeout", args.idle_timeout)?,
        body_timeout: seconds("--body-timeout", args.body_timeout)?,
        min_body_rate: args.min_body_rate,
        max_connections,
        max_connections_per_peer,
        shutdown_grace: seconds("--shutdown-grace", args.shutdown_grace)?,
        stall_limit: seconds("--stall-limit", args.stall_limit)?,
    })
}

/// A positive, finite number of seconds (at most a day).
fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    if value.is_finite() && value > 0.0 && value <= 86_400.0 {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(format!(
            "{flag} must be a number of seconds between 0 and 86400"
        ))
    }
}

/// The engine has no dtype option (yet): the CPU runner computes in F32 and the CUDA runner in
/// BF16, which is exactly `auto`. An explicit dtype is accepted where it names what the device
/// will use anyway, and refused (not ignored) where it would need a conversion the engine lacks.
fn check_dtype(dtype: Dtype, device: DeviceRequest) -> Result<(), String> {
    match (dtype, device) {
        (Dtype::Auto, _) | (Dtype::F32, DeviceRequest::Cpu) | (Dtype::Bf16, DeviceRequest::Cuda(_)) => Ok(()),
        (Dtype::F32, _) => Err(format!(
            "--dtype f32 needs --device cpu (the GPU path computes in BF16); got --device {device}"
        )),
        (Dtype::Bf16, _) => Err(format!(
            "--dtype bf16 needs --device cuda[:N] (the CPU path computes in F32); got --device {device}"
        )),
    }
}

/// One line per event on stderr; `RUST_LOG` overrides the default `info` level.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_must_match_the_device() {
        assert!(check_dtype(Dtype::Auto, DeviceRequest::Auto).is_ok());
        assert!(check_dtype(Dtype::F32, DeviceRequest::Cpu).is_ok());
        assert!(check_dtype(Dtype::Bf16, DeviceRequest::Cuda(1)).is_ok());
        assert!(check_dtype(Dtype::F32, DeviceRequest::Cuda(0)).is_err());
        assert!(check_dtype(Dtype::Bf16, DeviceRequest::Cpu).is_err());
        assert!(check_dtype(Dtype::Bf16, DeviceRequest::Auto).is_err());
    }

    #[test]
    fn decode_flags_are_range_checked() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Probe {
            #[command(flatten)]
            decode: DecodeArgs,
        }
        let parse = |argv: &[&str]| {
            Probe::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))
                .map(|p| p.decode)
        };
        let args = parse(&["--algorithm", "joint", "--threshold", "0.9", "--seed", "3"]).unwrap();
        let params = args.params().unwrap();
        assert_eq!(params.algorithm, Some(minnow_engine::Algorithm::Joint));
        assert_eq!(params.threshold, Some(0.9));
        assert_eq!(params.seed, Some(3));
        let err = parse(&["--threshold", "1.5"])
            .unwrap()
            .params()
            .unwrap_err();
        assert!(err.contains("--threshold"), "{err}");
        assert!(parse(&["--max-tokens", "0"]).unwrap().params().is_err());
        assert!(parse(&["--algorithm", "beam"]).is_err());
    }
}
