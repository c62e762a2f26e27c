//! The browser's URLs, built from validated ids with every byte outside the unreserved
//! set percent-encoded (an id or a filter may hold `#`, `?`, `%`, spaces or any Unicode).

use std::fmt::Write;

use session_store::SessionId;

/// `text` with every byte but `A-Z a-z 0-9 - . _ ~` written as `%XX`.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `path` with the given query parameters (those with a value), encoded.
pub fn with_query(path: &str, params: &[(&str, Option<&str>)]) -> String {
    let mut out = path.to_owned();
    for (i, (key, value)) in params
        .iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .enumerate()
    {
        out.push(if i == 0 { '?' } else { '&' });
        out.push_str(key);
        out.push('=');
        out.push_str(&encode(value));
    }
    out
}

/// The session page.
pub fn session(id: &SessionId) -> String {
    format!("/sessions/{}", encode(id.as_str()))
}

/// A message: the session page that holds it, scrolled to its anchor (a permalink).
pub fn message(id: &SessionId, position: u64) -> String {
    format!("{}?at={position}#m{position}", session(id))
}

/// The fork tree page.
pub fn tree(id: &SessionId) -> String {
    format!("{}/tree", session(id))
}

/// The storage stats page.
pub fn stats(id: &SessionId) -> String {
    format!("{}/stats", session(id))
}

/// The page of a large message of the session, stored as a blob.
pub fn content(id: &SessionId, digest: &str) -> String {
    format!("{}/content/{}", session(id), encode(digest))
}

/// The bytes of a blob of the session.
pub fn api_content(id: &SessionId, digest: &str) -> String {
    format!("/api{}", content(id, digest))
}

/// The session's JSON.
pub fn api_session(id: &SessionId) -> String {
    format!("/api{}", session(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_everything_but_unreserved_bytes() {
        assert_eq!(encode("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(encode("a b/#?%\"<é"), "a%20b%2F%23%3F%25%22%3C%C3%A9");
        assert_eq!(
            with_query(
                "/",
                &[("q", Some("x&y=z")), ("cwd", None), ("o", Some("f"))]
            ),
            "/?q=x%26y%3Dz&o=f"
        );
    }
}
