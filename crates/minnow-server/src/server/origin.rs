//! Who may talk to the server from a browser. Two guards against web pages the user happens to
//! visit (the server often runs without a key on the user's own machine):
//!
//! - DNS rebinding: a page on `evil.example` whose name is re-pointed at 127.0.0.1 reaches a
//!   loopback server with `Host: evil.example`. While the server is bound to a loopback address,
//!   only loopback names and addresses (and the `--allow-host` names) are accepted as `Host`.
//! - Cross-origin requests: a browser attaches `Origin` to them. A page served by the server itself
//!   (the `--ui-dir` UI) is same-origin and always fine; any other origin is refused unless
//!   `--cors-origin` lists it, and only then gets CORS headers. Refusing (rather than only omitting
//!   CORS headers) matters: a "simple" cross-origin POST would otherwise still run a generation.

use std::net::IpAddr;

use hyper::header::{HeaderValue, HOST, ORIGIN};
use hyper::Request;

use super::errors::ApiError;

/// The browser-facing policy, fixed at startup.
#[derive(Clone, Debug, Default)]
pub struct OriginPolicy {
    /// The server is bound to a loopback address: `Host` must name the loopback.
    pub loopback_only: bool,
    /// `--allow-host` names (lower case, no port); `*` accepts any host.
    pub allowed_hosts: Vec<String>,
    /// `--cors-origin` origins (`scheme://host[:port]`, lower case); `*` allows any origin.
    pub cors_origins: Vec<String>,
}

/// What a request may do, decided before routing.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not cross-origin (no `Origin`, or the server's own origin): no CORS headers.
    SameOrigin,
    /// A cross-origin request `--cors-origin` allows; the value for `Access-Control-Allow-Origin`.
    Cors(HeaderValue),
}

impl OriginPolicy {
    pub fn check<B>(&self, request: &Request<B>) -> Result<Verdict, ApiError> {
        let host = request_host(request)?;
        if self.loopback_only {
            if let Some(host) = &host {
                if !self.host_allowed(host) {
                    return Err(ApiError::forbidden(
                        "host_not_allowed",
                        format!(
                            "the Host '{host}' is not a loopback name; start the server with --allow-host {} to accept it",
                            host_name(host)
                        ),
                    ));
                }
            }
        }
        let Some(origin) = request.headers().get(ORIGIN) else {
            return Ok(Verdict::SameOrigin);
        };
        let origin_text = origin.to_str().unwrap_or_default().to_ascii_lowercase();
        let same = host.as_deref().is_some_and(|host| {
            origin_text
                .split_once("://")
                .is_some_and(|(_, authority)| authority == host.to_ascii_lowercase())
        });
        if same {
            return Ok(Verdict::SameOrigin);
        }
        if self.cors_origins.iter().any(|o| o == "*") {
            return Ok(Verdict::Cors(HeaderValue::from_static("*")));
        }
        if self.cors_origins.contains(&origin_text) {
            return Ok(Verdict::Cors(origin.clone()));
        }
        Err(ApiError::forbidden(
            "origin_not_allowed",
            format!(
                "cross-origin requests from '{origin_text}' are not allowed; start the server with --cors-origin {origin_text} to allow them"
            ),
        ))
    }

    fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        if name == "localhost" || name.ends_with(".localhost") {
            return true;
        }
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()) {
            return true;
        }
        self.allowed_hosts.iter().any(|h| h == "*" || *h == name)
    }
}

/// `Host` (HTTP/1) or the URI authority (HTTP/2), as sent. A request with several `Host`
/// headers, or one that is not visible ASCII, is refused (400, as RFC 9112 §3.2 asks): a guard
/// that skipped it would let a DNS-rebinding page through with `Host: evil.example` twice or in
/// non-ASCII bytes.
fn request_host<B>(request: &Request<B>) -> Result<Option<String>, ApiError> {
    let mut hosts = request.headers().get_all(HOST).iter();
    let Some(value) = hosts.next() else {
        return Ok(request.uri().authority().map(|a| a.as_str().to_string()));
    };
    if hosts.next().is_some() {
        return Err(ApiError::bad_request(
            "the request has more than one Host header",
        ));
    }
    let host = value
        .to_str()
        .ok()
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| ApiError::bad_request("the Host header is not a valid host name"))?;
    Ok(Some(host.to_string()))
}

/// The host part of `host[:port]` (an IPv6 literal keeps its brackets).
pub fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(host: Option<&str>, origin: Option<&str>) -> Request<()> {
        let mut builder = Request::builder().uri("/v1/models");
        if let Some(host) = host {
            builder = builder.header(HOST, host);
        }
        if let Some(origin) = origin {
            builder = builder.header(ORIGIN, origin);
        }
        builder.body(()).unwrap()
    }

    fn loopback() -> OriginPolicy {
        OriginPolicy {
            loopback_only: true,
            ..OriginPolicy::default()
        }
    }

    #[test]
    fn loopback_hosts_pass_and_rebinding_fails() {
        let policy = loopback();
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:1",
            "[::1]:8080",
            "127.1.2.3",
        ] {
            assert_eq!(
                policy.check(&request(Some(host), None)),
                Ok(Verdict::SameOrigin),
                "{host}"
            );
        }
        for host in [
            "evil.example:8080",
            "192.168.1.4:8080",
            "[::2]:80",
            "localhost.evil",
        ] {
            let error = policy.check(&request(Some(host), None)).unwrap_err();
            assert_eq!(error.status, hyper::StatusCode::FORBIDDEN, "{host}");
            assert_eq!(error.code, Some("host_not_allowed"));
        }
        let extended = OriginPolicy {
            allowed_hosts: vec!["box.lan".into()],
            ..loopback()
        };
        assert!(extended.check(&request(Some("box.lan:8080"), None)).is_ok());
        // Bound to all interfaces: no Host guard.
        assert!(OriginPolicy::default()
            .check(&request(Some("evil.example"), None))
            .is_ok());
    }

    #[test]
    fn a_doubled_or_non_ascii_host_is_refused() {
        let doubled = Request::builder()
            .uri("/v1/models")
            .header(HOST, "127.0.0.1:8080")
            .header(HOST, "evil.example")
            .body(())
            .unwrap();
        let non_ascii = Request::builder()
            .uri("/v1/models")
            .header(HOST, HeaderValue::from_bytes(b"evil.example\xff").unwrap())
            .body(())
            .unwrap();
        let empty = request(Some(""), None);
        for policy in [loopback(), OriginPolicy::default()] {
            for bad in [&doubled, &non_ascii, &empty] {
                let error = policy.check(bad).unwrap_err();
                assert_eq!(error.status, hyper::StatusCode::BAD_REQUEST);
            }
        }
    }

    #[test]
    fn cross_origin_needs_cors_origin() {
        let policy = loopback();
        let same = request(Some("127.0.0.1:8080"), Some("http://127.0.0.1:8080"));
        assert_eq!(policy.check(&same), Ok(Verdict::SameOrigin));
        let other = request(Some("127.0.0.1:8080"), Some("https://evil.example"));
        let error = policy.check(&other).unwrap_err();
        assert_eq!(error.code, Some("origin_not_allowed"));
        let allowed = OriginPolicy {
            cors_origins: vec!["https://evil.example".into()],
            ..loopback()
        };
        assert_eq!(
            allowed.check(&other),
            Ok(Verdict::Cors(HeaderValue::from_static(
                "https://evil.example"
            )))
        );
        let any = OriginPolicy {
            cors_origins: vec!["*".into()],
            ..loopback()
        };
        assert_eq!(
            any.check(&other),
            Ok(Verdict::Cors(HeaderValue::from_static("*")))
        );
        // Another port of the same host is another origin.
        let port = request(Some("127.0.0.1:8080"), Some("http://127.0.0.1:9999"));
        assert!(policy.check(&port).is_err());
    }

    #[test]
    fn host_names_drop_the_port() {
        assert_eq!(host_name("a.b:80"), "a.b");
        assert_eq!(host_name("[::1]:80"), "[::1]");
        assert_eq!(host_name("a.b"), "a.b");
    }
}
