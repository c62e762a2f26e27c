//! Content parts: long JSON string values of a payload stored once in the `blobs` table.
//!
//! At write, every string *value* (not an object key) of a payload whose raw text between
//! its quotes (escapes kept as written) is longer than the inline threshold is replaced by
//! the placeholder string `"sse-blob:<sha-256 hex of that raw text>"`; the raw text goes to
//! the content-addressed blob table, so equal content in two payloads is stored once. The
//! stored payload stays valid JSON (`json_extract` shows the placeholder) and the event's
//! `payload_parts` column lists the byte offsets of the placeholders' opening quotes, in
//! ascending order. A payload string that merely looks like a placeholder is left alone:
//! only the listed offsets are placeholders. Reading splices the blob bytes back, byte for
//! byte.

use crate::error::{Error, Result};
use crate::model::ContentRef;
use crate::model::event::sha256_hex;

/// What a placeholder string starts with, after its opening quote.
pub(crate) const PLACEHOLDER_PREFIX: &str = "sse-blob:";

/// Bytes of a placeholder with its quotes: `"`, the prefix, 64 hex digits, `"`.
pub(crate) const PLACEHOLDER_LEN: usize = 1 + PLACEHOLDER_PREFIX.len() + 64 + 1;

use crate::format::{MAX_INLINE_THRESHOLD, MIN_INLINE_THRESHOLD};

/// Checks an inline threshold against [`MIN_INLINE_THRESHOLD`]..=[`MAX_INLINE_THRESHOLD`].
///
/// # Errors
/// [`Error::InvalidInput`] naming the accepted range.
pub(crate) fn check_threshold(threshold: usize) -> Result<()> {
    if (MIN_INLINE_THRESHOLD..=MAX_INLINE_THRESHOLD).contains(&threshold) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "inline threshold {threshold} is out of range: give {MIN_INLINE_THRESHOLD} to \
             {MAX_INLINE_THRESHOLD} bytes"
        )))
    }
}

/// A payload with its long string values taken out.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Externalised<'a> {
    /// The payload with placeholders.
    pub text: String,
    /// Byte offsets of the placeholders' opening quotes in `text`, ascending.
    pub offsets: Vec<usize>,
    /// Each part's digest and raw text (between the quotes), in the same order.
    pub parts: Vec<(String, &'a str)>,
}

/// Takes the string values of `json` (valid JSON text) whose raw text is longer than
/// `threshold` bytes out into parts; `None` when there is none.
pub(crate) fn externalise(json: &str, threshold: usize) -> Option<Externalised<'_>> {
    // A string value needs its two quotes: nothing shorter can hold one over the threshold.
    if json.len() <= threshold + 2 {
        return None;
    }
    let ranges = long_string_values(json.as_bytes(), threshold);
    if ranges.is_empty() {
        return None;
    }
    let mut text = String::with_capacity(json.len().min(ranges.len() * PLACEHOLDER_LEN + 1024));
    let (mut offsets, mut parts) = (Vec::new(), Vec::new());
    let mut done = 0;
    for (start, end) in ranges {
        // `start` is the opening quote, `end` the closing one: both ASCII, so these are
        // character boundaries.
        text.push_str(&json[done..start]);
        let raw = &json[start + 1..end];
        let digest = sha256_hex(raw.as_bytes());
        offsets.push(text.len());
        text.push('"');
        text.push_str(PLACEHOLDER_PREFIX);
        text.push_str(&digest);
        text.push('"');
        parts.push((digest, raw));
        done = end + 1;
    }
    text.push_str(&json[done..]);
    Some(Externalised {
        text,
        offsets,
        parts,
    })
}

/// The string values (not object keys) of valid JSON text whose raw text is longer than
/// `threshold`, as (opening quote, closing quote) byte positions.
fn long_string_values(json: &[u8], threshold: usize) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < json.len() {
        if json[i] != b'"' {
            i += 1;
            continue;
        }
        let start = i;
        i += 1;
        // Inside a string: a backslash escapes the next byte (`\"`, `\\`, and the `u`
        // of `\uXXXX`, whose hex digits are neither a quote nor a backslash).
        while i < json.len() && json[i] != b'"' {
            i += if json[i] == b'\\' { 2 } else { 1 };
        }
        let end = i;
        i += 1;
        if end >= json.len() || end - start - 1 <= threshold {
            continue;
        }
        let next = json[i.min(json.len())..]
            .iter()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
        if next != Some(&b':') {
            found.push((start, end));
        }
    }
    found
}

/// Parses an event's `payload_parts` column: placeholder offsets, ascending, each one
/// inside `stored` and after the previous placeholder.
///
/// # Errors
/// [`Error::Corrupt`] naming event `seq` for anything else.
pub(crate) fn parse_offsets(seq: u64, parts: &str, stored: &str) -> Result<Vec<usize>> {
    let offsets: Vec<usize> = serde_json::from_str(parts).map_err(|e| {
        Error::corrupt_from(
            format!("event {seq}: payload_parts is not a list of offsets"),
            e,
        )
    })?;
    let mut next = 0usize;
    for &offset in &offsets {
        if offset < next || offset.saturating_add(PLACEHOLDER_LEN) > stored.len() {
            return Err(Error::corrupt(format!(
                "event {seq}: content part offset {offset} is out of order or out of bounds"
            )));
        }
        next = offset + PLACEHOLDER_LEN;
    }
    Ok(offsets)
}

/// The digest named by the placeholder at `offset` of `stored`.
///
/// # Errors
/// [`Error::Corrupt`] naming event `seq` when no placeholder starts there.
pub(crate) fn placeholder_at(seq: u64, stored: &str, offset: usize) -> Result<&str> {
    let bad = || {
        Error::corrupt(format!(
            "event {seq}: no content placeholder at offset {offset}"
        ))
    };
    let token = stored
        .as_bytes()
        .get(offset..offset + PLACEHOLDER_LEN)
        .ok_or_else(bad)?;
    let digest = &token[1 + PLACEHOLDER_PREFIX.len()..PLACEHOLDER_LEN - 1];
    let well_formed = token[0] == b'"'
        && token[PLACEHOLDER_LEN - 1] == b'"'
        && token[1..].starts_with(PLACEHOLDER_PREFIX.as_bytes())
        && std::str::from_utf8(digest).is_ok_and(ContentRef::is_digest);
    if !well_formed {
        return Err(bad());
    }
    // All ASCII hex, so a character boundary on both sides.
    Ok(&stored[offset + 1 + PLACEHOLDER_PREFIX.len()..offset + PLACEHOLDER_LEN - 1])
}

/// Rebuilds a payload from its stored text and `payload_parts`, reading each part's raw
/// bytes with `part` (given the digest; it checks them against it, as `blob::decode`
/// does). The result is checked to be UTF-8; the caller parses it as JSON.
///
/// # Errors
/// [`Error::Corrupt`] naming event `seq` for a bad offset, a malformed placeholder, a
/// missing part or a part that is not UTF-8; `part`'s errors.
pub(crate) fn reassemble(
    seq: u64,
    stored: &str,
    parts: &str,
    mut part: impl FnMut(&str) -> Result<Option<std::sync::Arc<[u8]>>>,
) -> Result<String> {
    let offsets = parse_offsets(seq, parts, stored)?;
    let mut out: Vec<u8> = Vec::with_capacity(stored.len());
    let mut done = 0;
    for offset in offsets {
        let digest = placeholder_at(seq, stored, offset)?;
        let raw = part(digest)?.ok_or_else(|| {
            Error::corrupt(format!(
                "event {seq} references missing content blob {digest}"
            ))
        })?;
        out.extend_from_slice(&stored.as_bytes()[done..offset]);
        out.push(b'"');
        out.extend_from_slice(&raw);
        out.push(b'"');
        done = offset + PLACEHOLDER_LEN;
    }
    out.extend_from_slice(&stored.as_bytes()[done..]);
    String::from_utf8(out)
        .map_err(|e| Error::corrupt_from(format!("event {seq}: a content part is not UTF-8"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn round_trip(json: &str, threshold: usize) -> Option<usize> {
        let ext = externalise(json, threshold)?;
        let store: HashMap<String, Arc<[u8]>> = ext
            .parts
            .iter()
            .map(|(d, raw)| (d.clone(), Arc::from(raw.as_bytes())))
            .collect();
        serde_json::from_str::<serde_json::Value>(&ext.text).expect("stored text is JSON");
        let parts = serde_json::to_string(&ext.offsets).unwrap();
        let back = reassemble(7, &ext.text, &parts, |d| Ok(store.get(d).cloned())).unwrap();
        assert_eq!(back, json);
        Some(ext.parts.len())
    }

    #[test]
    fn values_over_the_threshold_go_out_byte_exact() {
        let long = "x".repeat(200);
        let esc = format!("{}\\\"q\\\\\\u0000\\ud83d\\ude00é", "y".repeat(190));
        let json = format!(
            "{{ \"a\" : \"{long}\" , \"{long}\":1, \"b\":[\"{esc}\", \"short\", \"{long}\"],\n\"c\":\"{}\"}}",
            "z".repeat(128)
        );
        // Two copies of `long` as values and the escaped one; not the key, not 128 bytes.
        assert_eq!(round_trip(&json, 128), Some(3));
        assert_eq!(round_trip(&json, 127), Some(4));
        assert_eq!(round_trip(&json, 1000), None);
        assert_eq!(round_trip("\"just a string value\"", 5), Some(1));
    }

    #[test]
    fn bad_parts_are_corrupt() {
        let json = format!("{{\"a\":\"{}\"}}", "x".repeat(300));
        let ext = externalise(&json, 128).unwrap();
        let none = |_: &str| Ok(None);
        let some = |_: &str| Ok(Some(Arc::from(&b"x"[..])));
        for parts in ["[6]", "[4]", "x", "[-1]", "[5,5]", "[99999]"] {
            let e = reassemble(9, &ext.text, parts, some).unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "{parts}: {e}");
            assert!(e.to_string().contains("event 9"), "{e}");
        }
        let e = reassemble(9, &ext.text, "[5]", none).unwrap_err();
        assert!(e.to_string().contains("missing content blob"), "{e}");
        assert_eq!(
            reassemble(9, &ext.text, "[5]", some).unwrap(),
            "{\"a\":\"x\"}"
        );
    }

    #[test]
    fn threshold_bounds() {
        assert!(check_threshold(0).is_err());
        assert!(check_threshold(MIN_INLINE_THRESHOLD - 1).is_err());
        assert!(check_threshold(MAX_INLINE_THRESHOLD + 1).is_err());
        assert!(check_threshold(crate::format::DEFAULT_INLINE_THRESHOLD).is_ok());
    }
}
