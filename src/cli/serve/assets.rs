//! The static assets, compiled into the binary (no CDN, no build step): the stylesheet and
//! the icon.
//! The pages need no script (collapsing is `<details>`, blobs are links).

use std::sync::OnceLock;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The stylesheet.
const STYLE: &str = include_str!("style.css");

/// The stylesheet's entity tag: a hash of its text, so a browser asks again after an
/// upgrade and is answered 304 while it is unchanged.
fn style_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| format!("\"{:016x}\"", xxhash_rust::xxh3::xxh3_64(STYLE.as_bytes())))
}

/// Whether an `If-None-Match` value names `tag` (weak comparison, RFC 9110 §13.1.2).
fn names_tag(if_none_match: &str, tag: &str) -> bool {
    if_none_match
        .split(',')
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag)
}

/// `GET /assets/style.css`: revalidated on every use (`no-cache` with its entity tag; it
/// was cached for an hour at the same URL, so a browser kept an upgraded binary's old
/// stylesheet for up to an hour).
pub async fn style(headers: HeaderMap) -> Response {
    let tag = style_tag();
    let cached = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| names_tag(v, tag));
    let cache = [(header::CACHE_CONTROL, "no-cache"), (header::ETAG, tag)];
    if cached {
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        cache,
        STYLE,
    )
        .into_response()
}

/// The pages' icon: a small square in the stylesheet's accent colour (a browser asked for
/// `/favicon.ico` on every page and logged its 404).
const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">\
                    <rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#2f5f8f\"/></svg>";

/// `GET /assets/icon.svg`: the pages' icon, cached for a day (it never changes).
pub async fn icon() -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "max-age=86400"),
        ],
        ICON,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_is_compared_weakly() {
        let tag = "\"00ff\"";
        assert!(names_tag("\"00ff\"", tag));
        assert!(names_tag("W/\"00ff\"", tag));
        assert!(names_tag("\"aa\", \"00ff\"", tag));
        assert!(names_tag("*", tag));
        assert!(!names_tag("\"00fe\"", tag));
        assert!(!names_tag("", tag));
    }
}
