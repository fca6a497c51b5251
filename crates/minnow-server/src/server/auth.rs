//! `--api-key`: Bearer-token check. Health probes (readiness and liveness) and the static web UI
//! stay open (a browser must load the UI before the user can type a key into it); every API route
//! needs the key.

use hyper::header::AUTHORIZATION;
use hyper::HeaderMap;

/// Routes answered without a key.
pub fn is_public(path: &str) -> bool {
    matches!(
        path,
        "/health" | "/v1/health" | "/health_generate" | "/livez"
    )
}

/// True when no key is configured or the request carries `Authorization: Bearer KEY`
/// (llama-server also accepts an `X-Api-Key: KEY` header; so does this).
pub fn authorized(expected: Option<&str>, headers: &HeaderMap) -> bool {
    let Some(expected) = expected else {
        return true;
    };
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_token);
    let header_key = headers
        .get("x-api-key")
        .and_then(|value| value.to_str().ok());
    bearer
        .or(header_key)
        .is_some_and(|given| same_secret(given, expected))
}

/// The credentials of `Bearer TOKEN`; the scheme is case-insensitive (RFC 9110 §11.1), and
/// any amount of whitespace may separate it from the token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once([' ', '\t'])?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|token| !token.is_empty())
}

/// The `WWW-Authenticate` challenge every 401 carries.
pub const CHALLENGE: &str = "Bearer";

/// Compares without an early exit, so the time taken does not reveal how much of a guess matched.
fn same_secret(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let mut difference = a.len() ^ b.len();
    for (i, byte) in b.iter().enumerate() {
        difference |= usize::from(a.get(i).copied().unwrap_or(0) ^ byte);
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(auth: &str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        map
    }

    #[test]
    fn checks_bearer_keys() {
        assert!(authorized(None, &HeaderMap::new()));
        assert!(authorized(Some("k1"), &headers("Bearer k1")));
        assert!(!authorized(Some("k1"), &headers("Bearer k2")));
        assert!(!authorized(Some("k1"), &headers("Bearer k1x")));
        assert!(!authorized(Some("k1"), &headers("Basic k1")));
        assert!(authorized(Some("k1"), &headers("BEARER k1")));
        assert!(authorized(Some("k1"), &headers("bEaReR   k1 ")));
        assert!(!authorized(Some("k1"), &headers("Bearer")));
        assert!(!authorized(Some("k1"), &headers("Bearerk1")));
        assert!(!authorized(Some("k1"), &HeaderMap::new()));
        let mut x = HeaderMap::new();
        x.insert("x-api-key", HeaderValue::from_static("k1"));
        assert!(authorized(Some("k1"), &x));
    }

    #[test]
    fn health_is_public() {
        assert!(is_public("/health"));
        assert!(is_public("/v1/health"));
        assert!(is_public("/livez"));
        assert!(!is_public("/get_load"));
        assert!(!is_public("/v1/models"));
    }
}
