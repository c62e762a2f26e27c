//! What every request passes through: the Host check (loopback names only unless
//! `--allow-remote`, against DNS rebinding), the token check (with `--allow-remote`: the
//! `token` query parameter, an `Authorization: Bearer` header or the cookie set by the
//! first authorised answer) and the security headers on every answer (a CSP without
//! inline scripts, `nosniff`, no framing, no referrer, no caching), plus a
//! `Server-Timing` header with the time spent serving the request. Every refusal axum
//! makes itself (a path or query it cannot parse, a wrong method) is rewritten into the
//! server's own error body by [`own_errors`].

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;
use super::problem::{ApiError, PageError, Problem};

/// The Content-Security-Policy of every answer: scripts, styles and images only from the
/// server itself (no inline script or style), nothing embedded, no `<base>`, no framing.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
                       img-src 'self' data:; object-src 'none'; base-uri 'none'; \
                       form-action 'self'; frame-ancestors 'none'";

/// The cookie that carries the token after a request with `?token=`.
const COOKIE: &str = "session_store_token";

/// Whether two byte strings are equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The tokens a request presents: query parameter, bearer header, cookie.
fn presented(request: &Request) -> impl Iterator<Item = &str> {
    let query = request
        .uri()
        .query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter_map(|pair| pair.strip_prefix("token="));
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let cookies = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='));
    query.chain(bearer).chain(cookies)
}

/// The host a request is for, as RFC 9112 §3.2 says: the authority of an absolute-form
/// target (`GET http://host/…`, whose Host header a server must ignore), else its one Host
/// header (`None` when it has none). Two or more Host headers, or one that is no
/// `host[:port]` (a user part `a@b`, a port that is no number), are refused with 400.
fn requested_host(request: &Request) -> Result<Option<String>, Problem> {
    if let Some(authority) = request.uri().authority() {
        return Ok(Some(authority.host().to_owned()));
    }
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let (Some(host), None) = (hosts.next(), hosts.next()) else {
        return match request.headers().contains_key(header::HOST) {
            true => Err(Problem::bad_request("more than one Host header")),
            false => Ok(None),
        };
    };
    host.to_str()
        .ok()
        .filter(|h| !h.contains('@'))
        .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
        .filter(|a| {
            // What follows the host is nothing or `:` and a port number (or no port,
            // which RFC 3986 allows).
            let rest = a.as_str().get(a.host().len()..).unwrap_or("");
            rest.is_empty()
                || rest
                    .strip_prefix(':')
                    .is_some_and(|p| p.is_empty() || p.parse::<u16>().is_ok())
        })
        .map(|a| Some(a.host().to_owned()))
        .ok_or_else(|| Problem::bad_request("the Host header is no host[:port]"))
}

/// Whether `host` (a host without its port) names a loopback host: `localhost` or a name
/// under it (RFC 6761 §6.3 reserves `*.localhost` for loopback; browsers resolve it there
/// without asking DNS, so no rebinding can point it elsewhere), each also in its absolute
/// form with a trailing dot, `127.x.y.z` or `[::1]`.
fn loopback_host(host: &str) -> bool {
    let name = host
        .strip_prefix('[')
        .and_then(|v6| v6.strip_suffix(']'))
        .unwrap_or(host);
    let mut labels = name.strip_suffix('.').unwrap_or(name).rsplit('.');
    let under_localhost = labels
        .next()
        .is_some_and(|last| last.eq_ignore_ascii_case("localhost"))
        && labels.all(|label| !label.is_empty());
    under_localhost
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether the percent-decoded `query` (a request's raw query string) is UTF-8: axum's
/// query extractor decodes invalid sequences as U+FFFD, so `?q=abc%FF` would search for
/// `abc\u{FFFD}` and `?cwd=%FF` filter on it instead of being refused.
fn query_is_utf8(query: &str) -> bool {
    let raw = query.as_bytes();
    let mut bytes = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = raw
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (raw[i], hex) {
            (b'%', Some(byte)) => {
                bytes.push(byte);
                i += 3;
            }
            (byte, _) => {
                bytes.push(byte);
                i += 1;
            }
        }
    }
    std::str::from_utf8(&bytes).is_ok()
}

/// The refusal of a request, as JSON under `/api/`, else as a page.
fn refuse(path: &str, problem: Problem) -> Response {
    if path.starts_with("/api/") {
        ApiError(problem).into_response()
    } else {
        PageError(problem).into_response()
    }
}

/// The longest body of an axum refusal read back to be quoted in the error body.
const REFUSAL_BYTES: usize = 4096;

/// An answer the handlers did not render: an error status whose body is neither HTML nor
/// JSON (axum's own refusals: `400` or `422` for a path or query it cannot parse, `405`
/// for a wrong method) becomes the server's error body, JSON under `/api/`, else a page,
/// its headers (e.g. `Allow`) kept. Any other answer passes unchanged.
async fn own_errors(path: &str, response: Response) -> Response {
    let status = response.status();
    let rendered = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .is_some_and(|t| t.starts_with("text/html") || t.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || rendered {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let said = axum::body::to_bytes(body, REFUSAL_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = match said.is_empty() {
        true => status
            .canonical_reason()
            .unwrap_or("refused")
            .to_lowercase(),
        false => in_own_words(&said),
    };
    let own = refuse(path, Problem::new(status, message));
    let (own_parts, body) = own.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.extend(own_parts.headers);
    Response::from_parts(parts, body)
}

/// axum's wording of a refused query or path said as this server says it: "Failed to
/// deserialize query string: duplicate field `q`" and "Invalid URL: Invalid UTF-8 in `id`"
/// reached the pages and the API as they were (outside testing Z1, fuzzing). Any other text
/// unchanged.
fn in_own_words(said: &str) -> String {
    if let Some(why) = said.strip_prefix("Failed to deserialize query string: ") {
        return match why
            .strip_prefix("duplicate field `")
            .and_then(|rest| rest.strip_suffix('`'))
        {
            Some(name) => format!("the query parameter {name:?} is given more than once"),
            None => format!("the query string cannot be read: {why}"),
        };
    }
    if let Some(name) = said
        .strip_prefix("Invalid URL: Invalid UTF-8 in `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return format!("the {name} in the path is not valid UTF-8");
    }
    said.to_owned()
}

/// The middleware: checks, then the handler, then the headers.
pub async fn check(State(app): State<App>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let path = request.uri().path().to_owned();
    let mut set_cookie = false;
    let host = requested_host(&request);
    let mut response = if let Err(problem) = host {
        refuse(&path, problem)
    } else if app.token.is_none() && !host.ok().flatten().is_some_and(|h| loopback_host(&h)) {
        refuse(
            &path,
            Problem::new(
                StatusCode::MISDIRECTED_REQUEST,
                "this server answers only to localhost, 127.0.0.1 or [::1]",
            ),
        )
    } else if let Some(token) = &app.token
        && !presented(&request).any(|t| same(t.as_bytes(), token.as_bytes()))
    {
        refuse(
            &path,
            Problem::new(
                StatusCode::UNAUTHORIZED,
                "a token is required: open the URL the server printed at start",
            ),
        )
    } else if !path.starts_with("/assets/")
        && super::folder_identity(app.root.path()) != app.root_identity
    {
        // The listing and a session's header came from the catalog and handles of the
        // root served, its history and search from the folder now at its path: a session
        // "not found" was served (outside testing C4, session 41).
        refuse(
            &path,
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the root {} was removed or replaced while it was served; restart \
                     `session-store serve` to serve what is there now",
                    app.root.path().display()
                ),
            ),
        )
    } else if !request.uri().query().is_none_or(query_is_utf8) {
        refuse(
            &path,
            Problem::bad_request("the query string is not UTF-8 once percent-decoded"),
        )
    } else {
        set_cookie = app.token.is_some()
            && request
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|p| p.starts_with("token=")));
        own_errors(&path, next.run(request).await).await
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    if set_cookie
        && let Some(token) = &app.token
        && let Ok(cookie) = HeaderValue::from_str(&format!(
            "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/"
        ))
    {
        headers.insert(header::SET_COOKIE, cookie);
    }
    let elapsed = started.elapsed().as_secs_f64() * 1e3;
    if let Ok(timing) = HeaderValue::from_str(&format!("app;dur={elapsed:.3}")) {
        headers.insert("server-timing", timing);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_whole_tokens() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }

    #[test]
    fn checks_the_decoded_query_is_utf8() {
        assert!(query_is_utf8("q=caf%C3%A9&limit=5"));
        assert!(query_is_utf8("q=100%&x=%4"));
        assert!(query_is_utf8("q=%e2%82%ac"));
        assert!(!query_is_utf8("q=abc%FF"));
        assert!(!query_is_utf8("cwd=%E2%82"));
        assert!(!query_is_utf8("a=1&b=%C0%AF"));
    }

    #[test]
    fn knows_loopback_hosts() {
        let host = |h: &str| {
            let request = Request::builder()
                .uri("/")
                .header(header::HOST, h)
                .body(axum::body::Body::empty())
                .unwrap();
            requested_host(&request)
                .ok()
                .flatten()
                .is_some_and(|h| loopback_host(&h))
        };
        assert!(host("127.0.0.1:8080"));
        assert!(host("localhost:1"));
        assert!(host("[::1]:80"));
        assert!(host("[::1]"));
        assert!(host("localhost:"));
        assert!(host("localhost.:8080"));
        assert!(host("app.LOCALHOST:8080"));
        assert!(host("a.b.localhost."));
        assert!(!host("notlocalhost:8080"));
        assert!(!host(".localhost"));
        assert!(!host("localhost.evil.example"));
        assert!(!host("localhost..:1"));
        assert!(!host("a..localhost"));
        assert!(!host("evil.example:8080"));
        assert!(!host("10.0.0.1"));
        assert!(!host("127.0.0.1.evil.example"));
        assert!(!host("127.0.0.1:80@evil.example"));
        assert!(!host("localhost:evil.example"));
    }
}
