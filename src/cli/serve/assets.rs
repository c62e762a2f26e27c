//! The static assets, compiled into the binary (no CDN, no build step): the stylesheet.
//! The pages need no script (collapsing is `<details>`, blobs are links).

use axum::http::header;
use axum::response::IntoResponse;

/// The stylesheet.
const STYLE: &str = include_str!("style.css");

/// `GET /assets/style.css`.
pub async fn style() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        STYLE,
    )
}
