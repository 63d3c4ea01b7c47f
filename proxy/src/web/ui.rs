//! The web UI's pages and files, from the bytes embedded at compile time (`proxy/build.rs`
//! walks `web/`); nothing is read from disk at run time, in debug builds too.
//!
//! - `/` → `/web/`. Every page path under `/web/` is the one `index.html`, whose module routes
//!   in the browser (an unknown page is its not-found page).
//! - `/web/assets/PATH` is `web/PATH`; an unknown one is a 404.
//! - gzip when the browser takes it (made at build time); a strong `ETag` per encoding and
//!   `If-None-Match` → 304; `Cache-Control: no-cache` (the names carry no hash, so a browser
//!   asks again each time and gets a 304 while nothing changed).
//! - Every answer carries the issue's security headers: the CSP below (with
//!   `'wasm-unsafe-eval'` added on the player page only: asciinema-player's terminal is WASM),
//!   `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`.
//!   `style-src 'unsafe-inline'` is xterm.js's: it sizes its rows with inline styles.

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One embedded file of `web/`.
pub struct Asset {
    /// Relative to `web/`, with `/`.
    pub path: &'static str,
    pub body: &'static [u8],
    /// The same bytes gzipped, when that is smaller.
    pub gzip: Option<&'static [u8]>,
    /// Hex of the first 16 bytes of the body's SHA-256.
    pub etag: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'";
/// The player page's: the same, with `'wasm-unsafe-eval'` in `script-src`.
pub const CSP_PLAYER: &str = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'";

pub const PAGES: &str = "/web";
pub const ASSETS_PREFIX: &str = "/web/assets/";

/// The UI's routes, merged beside the API (which has the fallback).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(root))
        .route("/web", get(page))
        .route("/web/", get(page))
        .route("/web/{*path}", get(page))
}

async fn root() -> Response {
    with_security(
        (StatusCode::FOUND, [(header::LOCATION, "/web/")]).into_response(),
        CSP,
    )
}

async fn page(uri: Uri, headers: HeaderMap) -> Response {
    serve(uri.path(), &headers)
}

fn find(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

/// The player page (`/web/recordings/{id}`) is the only one that runs WASM. The page's router
/// loads it as a new document, never by `pushState`, so that it gets this header.
fn is_player(path: &str) -> bool {
    path.strip_prefix("/web/recordings/")
        .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// The answer to `GET path` under `/web` (and `HEAD`: axum drops the body).
pub fn serve(path: &str, headers: &HeaderMap) -> Response {
    let csp = if is_player(path) { CSP_PLAYER } else { CSP };
    let asset = match path.strip_prefix(ASSETS_PREFIX) {
        Some(rel) => find(rel),
        None => find("index.html"),
    };
    let Some(asset) = asset else {
        return with_security(
            (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                format!("no such file of the web UI: {path}\n"),
            )
                .into_response(),
            csp,
        );
    };
    let gzip = asset.gzip.filter(|_| accepts_gzip(headers));
    let etag = match gzip {
        Some(_) => format!("\"{}-gz\"", asset.etag),
        None => format!("\"{}\"", asset.etag),
    };
    let mut resp = if none_match(headers, asset.etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = gzip.unwrap_or(asset.body).into_response();
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(asset.path)),
        );
        if gzip.is_some() {
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        r
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    with_security(resp, csp)
}

fn with_security(mut resp: Response, csp: &'static str) -> Response {
    let h = resp.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, csp),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    resp
}

/// Whether `Accept-Encoding` names gzip with a q above 0 (or `*`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .filter_map(|q| q.trim().parse::<f32>().ok())
                .next()
                .unwrap_or(1.0);
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && q > 0.0
        })
}

/// Whether `If-None-Match` names this file's ETag (either encoding's: the bytes are the same),
/// or `*`. Weak tags compare weakly, as RFC 9110 says for `If-None-Match`.
fn none_match(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim())
        .any(|t| {
            let t = t.strip_prefix("W/").unwrap_or(t);
            t == "*"
                || t.strip_prefix('"')
                    .and_then(|t| t.strip_suffix('"'))
                    .is_some_and(|t| t == etag || t.strip_suffix("-gz") == Some(etag))
        })
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("json") => "application/json",
        Some("wasm") => "application/wasm",
        Some("txt" | "md") => "text/plain; charset=utf-8",
        _ if path.ends_with("LICENSE") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn get(path: &str, headers: &[(&str, &str)]) -> Response {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        serve(path, &h)
    }

    fn header<'a>(r: &'a Response, name: &str) -> &'a str {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap())
            .unwrap_or("")
    }

    #[test]
    fn every_page_is_index_html_and_files_are_under_assets() {
        let index = find("index.html").unwrap();
        for page in [
            "/web",
            "/web/",
            "/web/login",
            "/web/nodes/n1/terminal",
            "/web/nope",
        ] {
            let r = get(page, &[]);
            assert_eq!(r.status(), StatusCode::OK, "{page}");
            assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8");
            assert_eq!(header(&r, "etag"), format!("\"{}\"", index.etag));
        }
        let r = get("/web/assets/vendor/xterm/xterm.mjs", &[]);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "content-type"), "text/javascript; charset=utf-8");
        for missing in [
            "/web/assets/nope.js",
            "/web/assets/",
            "/web/assets/../index.html",
            "/web/assets/package.json",
            "/web/assets/vendor/FILES",
        ] {
            assert_eq!(
                get(missing, &[]).status(),
                StatusCode::NOT_FOUND,
                "{missing}"
            );
        }
    }

    #[test]
    fn gzip_when_accepted_and_etags_answer_304() {
        let a = find("vendor/xterm/xterm.mjs").unwrap();
        let gz = get(
            "/web/assets/vendor/xterm/xterm.mjs",
            &[("accept-encoding", "gzip, deflate, br")],
        );
        assert_eq!(header(&gz, "content-encoding"), "gzip");
        assert_eq!(header(&gz, "etag"), format!("\"{}-gz\"", a.etag));
        assert_eq!(header(&gz, "vary"), "Accept-Encoding");
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(a.gzip.unwrap()), &mut out)
            .unwrap();
        assert_eq!(out, a.body);
        for refused in ["identity", "gzip;q=0", ""] {
            let r = get(
                "/web/assets/vendor/xterm/xterm.mjs",
                &[("accept-encoding", refused)],
            );
            assert_eq!(header(&r, "content-encoding"), "", "{refused}");
        }
        for tag in [
            format!("\"{}\"", a.etag),
            format!("\"{}-gz\"", a.etag),
            format!("\"other\", W/\"{}\"", a.etag),
            "*".to_string(),
        ] {
            let r = get(
                "/web/assets/vendor/xterm/xterm.mjs",
                &[("if-none-match", &tag), ("accept-encoding", "gzip")],
            );
            assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{tag}");
            assert_eq!(header(&r, "etag"), format!("\"{}-gz\"", a.etag));
        }
        let r = get(
            "/web/assets/vendor/xterm/xterm.mjs",
            &[("if-none-match", "\"deadbeef\"")],
        );
        assert_eq!(r.status(), StatusCode::OK);
    }

    #[test]
    fn security_headers_and_wasm_only_on_the_player() {
        for path in [
            "/web/login",
            "/web/recordings",
            "/web/recordings/",
            "/web/recordings/abc/cast",
            "/web/audit",
            "/web/admin/roles/staging",
            "/web/assets/app/main.js",
            "/web/assets/nope",
        ] {
            let r = get(path, &[]);
            assert_eq!(header(&r, "content-security-policy"), CSP, "{path}");
            assert_eq!(header(&r, "x-frame-options"), "DENY");
            assert_eq!(header(&r, "x-content-type-options"), "nosniff");
            assert_eq!(header(&r, "referrer-policy"), "no-referrer");
        }
        let r = get("/web/recordings/abc", &[]);
        assert_eq!(header(&r, "content-security-policy"), CSP_PLAYER);
        assert_eq!(
            CSP_PLAYER.replace(" 'wasm-unsafe-eval'", ""),
            CSP,
            "the player's CSP is the same but for WASM"
        );
    }
}
