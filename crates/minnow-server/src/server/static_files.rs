//! `--ui-dir`: serves a built web UI (e.g. llama.cpp's) from a directory. Unknown paths without a
//! file extension fall back to `index.html` so client-side routes work; a `.gz` sibling is served
//! with `Content-Encoding: gzip` when the file itself is missing (llama.cpp ships
//! `index.html.gz`). Paths are checked component by component and the resolved file must stay
//! inside the directory, so `..`, encoded `..` and symlinks out of it are refused.

use std::path::{Component, Path, PathBuf};

use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use hyper::{Response, StatusCode};

use super::errors::ApiError;
use super::http::{full, Body};

/// A static-file answer, or `None` when the directory has nothing for this path.
pub async fn serve(
    root: &Path,
    url_path: &str,
    accepts_gzip: bool,
) -> Result<Option<Response<Body>>, ApiError> {
    let relative = match safe_relative_path(url_path) {
        Some(path) => path,
        None => {
            return Err(ApiError::invalid("path", "the path is not allowed"));
        }
    };
    let root = match tokio::fs::canonicalize(root).await {
        Ok(root) => root,
        Err(e) => return Err(ApiError::internal(format!("--ui-dir is unreadable: {e}"))),
    };
    let target = if relative.as_os_str().is_empty() {
        root.join("index.html")
    } else {
        root.join(&relative)
    };
    if let Some(response) = try_file(&root, &target, accepts_gzip).await {
        return Ok(Some(response));
    }
    // A client-side route ("/chat/abc") gets the app's entry point; a missing asset ("x.js") 404s,
    // and so does an API path the server lacks (a client must get JSON it can read, not the UI).
    if relative.extension().is_none() && !looks_like_api(url_path) {
        return Ok(try_file(&root, &root.join("index.html"), accepts_gzip).await);
    }
    Ok(None)
}

async fn try_file(root: &Path, target: &Path, accepts_gzip: bool) -> Option<Response<Body>> {
    if let Some(bytes) = read_inside(root, target).await {
        return Some(file_response(target, bytes, false));
    }
    if accepts_gzip {
        let mut gz = target.as_os_str().to_owned();
        gz.push(".gz");
        let gz = PathBuf::from(gz);
        if let Some(bytes) = read_inside(root, &gz).await {
            return Some(file_response(target, bytes, true));
        }
    }
    None
}

/// Reads a regular file whose real location is inside `root`.
async fn read_inside(root: &Path, target: &Path) -> Option<Vec<u8>> {
    let real = tokio::fs::canonicalize(target).await.ok()?;
    if !real.starts_with(root) {
        return None;
    }
    let metadata = tokio::fs::metadata(&real).await.ok()?;
    if !metadata.is_file() {
        return None;
    }
    tokio::fs::read(&real).await.ok()
}

fn file_response(path: &Path, bytes: Vec<u8>, gzip: bool) -> Response<Body> {
    let mut response = Response::new(full(bytes));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type(path)));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if gzip {
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        headers.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    response
}

/// First path segments of llama-server's and OpenAI's APIs (and their `/v1` prefix; `/chat/...`
/// stays a client-side route, the API's `/chat/completions` is matched before any file). Such a path
/// is never answered with the UI's `index.html`: an endpoint this server lacks must be a JSON 404,
/// which is also what llama-server answers for a feature that is off (`/tools` without
/// `--tools`, `/cors-proxy` without its proxy, stream resumption, model loading).
const API_SEGMENTS: &[&str] = &[
    "v1",
    "api",
    "health",
    "props",
    "slots",
    "metrics",
    "models",
    "tools",
    "cors-proxy",
    "completion",
    "completions",
    "embedding",
    "embeddings",
    "rerank",
    "reranking",
    "infill",
    "tokenize",
    "detokenize",
    "apply-template",
    "lora-adapters",
    "stream",
    "streams",
    "mcp",
];

/// True for a path under one of the API's first segments (`/tools`, `/v1/streams/lookup`, ...).
pub fn looks_like_api(url_path: &str) -> bool {
    let first = url_path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    API_SEGMENTS.contains(&first.to_ascii_lowercase().as_str())
}

/// Decodes the URL path and returns it as a relative path of plain components, or `None` if it
/// tries to leave the directory (`..`, absolute segments, backslashes, NUL).
pub fn safe_relative_path(url_path: &str) -> Option<PathBuf> {
    let decoded = percent_decode(url_path)?;
    let mut relative = PathBuf::new();
    for segment in decoded.split('/') {
        if segment.is_empty() || segment == "." {
            continue;
        }
        if segment == ".."
            || segment.contains('\\')
            || segment.contains('\0')
            || segment.contains(':')
        {
            return None;
        }
        let mut components = Path::new(segment).components();
        match (components.next(), components.next()) {
            (Some(Component::Normal(part)), None) => relative.push(part),
            _ => return None,
        }
    }
    Some(relative)
}

/// Decodes `%XX` escapes; `None` for a malformed escape or non-UTF-8 result.
pub fn percent_decode(input: &str) -> Option<String> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "webmanifest" => "application/manifest+json",
        "xml" => "application/xml",
        "pdf" => "application/pdf",
        "md" => "text/markdown; charset=utf-8",
        "csv" => "text/csv; charset=utf-8",
        "avif" => "image/avif",
        "bmp" => "image/bmp",
        "otf" => "font/otf",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        "ogg" => "audio/ogg",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "ico" => "image/x-icon",
        "webp" => "image/webp",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        "ttf" => "font/ttf",
        "txt" => "text/plain; charset=utf-8",
        "wasm" => "application/wasm",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traversal_is_refused() {
        assert_eq!(safe_relative_path("/a/b.js"), Some(PathBuf::from("a/b.js")));
        assert_eq!(safe_relative_path("/"), Some(PathBuf::new()));
        assert_eq!(safe_relative_path("/./a//b"), Some(PathBuf::from("a/b")));
        assert_eq!(safe_relative_path("/../etc/passwd"), None);
        assert_eq!(safe_relative_path("/a/%2e%2e/%2e%2e/etc"), None);
        assert_eq!(safe_relative_path("/a%2f..%2f..%2fetc"), None);
        assert_eq!(safe_relative_path("/a\\..\\b"), None);
        assert_eq!(safe_relative_path("/%00"), None);
        assert_eq!(safe_relative_path("/%zz"), None);
        assert_eq!(safe_relative_path("/C:/x"), None);
    }

    #[tokio::test]
    async fn serves_files_and_falls_back_to_index() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "<html>app</html>").unwrap();
        std::fs::write(dir.path().join("app.js"), "js").unwrap();
        let ok = serve(dir.path(), "/app.js", false).await.unwrap().unwrap();
        assert_eq!(ok.headers()[CONTENT_TYPE], "text/javascript; charset=utf-8");
        let route = serve(dir.path(), "/chat/42", false).await.unwrap().unwrap();
        assert_eq!(route.headers()[CONTENT_TYPE], "text/html; charset=utf-8");
        assert!(serve(dir.path(), "/missing.js", false)
            .await
            .unwrap()
            .is_none());
        // API paths the server lacks never get the app's HTML.
        for api in [
            "/tools",
            "/cors-proxy",
            "/v1/streams/lookup",
            "/v1/stream",
            "/models/load",
        ] {
            assert!(
                serve(dir.path(), api, false).await.unwrap().is_none(),
                "{api}"
            );
        }
        assert!(serve(dir.path(), "/../x", false).await.is_err());
    }

    #[test]
    fn content_types_of_web_app_files() {
        for (name, expected) in [
            ("manifest.webmanifest", "application/manifest+json"),
            ("a.wasm", "application/wasm"),
            ("icon.svg", "image/svg+xml"),
            ("sw.js", "text/javascript; charset=utf-8"),
            ("favicon.ico", "image/x-icon"),
            ("x.mjs", "text/javascript; charset=utf-8"),
        ] {
            assert_eq!(content_type(Path::new(name)), expected, "{name}");
        }
        assert!(looks_like_api("/tools"));
        assert!(looks_like_api("/V1/anything"));
        assert!(!looks_like_api("/c/123"));
        assert!(!looks_like_api("/"));
    }

    #[tokio::test]
    async fn serves_gzip_sibling() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html.gz"), [0x1f, 0x8b]).unwrap();
        let response = serve(dir.path(), "/", true).await.unwrap().unwrap();
        assert_eq!(response.headers()[CONTENT_ENCODING], "gzip");
        assert!(serve(dir.path(), "/", false).await.unwrap().is_none());
    }
}
