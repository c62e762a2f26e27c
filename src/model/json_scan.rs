//! Where values end in JSON text that is known to be valid (a `RawValue`'s, which
//! serde_json checked): strings are skipped with `memchr` to their next quote or
//! backslash, not byte by byte. A function answers `None` for text it does not follow;
//! its caller then reads the text with serde_json, which stays the authority.

/// The text before the message object in a message payload of the common form
/// `{"message":{…}}`, and after it.
pub(crate) const BARE_HEAD: &str = r#"{"message":"#;
pub(crate) const BARE_TAIL: &str = "}";

/// The message object of `payload` (valid JSON text) when `payload` is exactly
/// `{"message":` + an object + `}`: the object's text, itself valid JSON since the whole
/// was. The object ends at the brace that closes the one it opens ([`value_end`]: strings
/// and their escapes skipped); anything after it but the final `}` (another key, white
/// space) answers `None`.
pub(crate) fn bare_message(payload: &str) -> Option<&str> {
    let inner = payload.strip_prefix(BARE_HEAD)?.strip_suffix(BARE_TAIL)?;
    let bytes = inner.as_bytes();
    (bytes.first() == Some(&b'{') && value_end(bytes, 0)? == bytes.len()).then_some(inner)
}

/// The index just past the quote that closes the string whose text starts at `from`
/// (escapes skipped); `None` when the text ends first.
pub(crate) fn string_end(bytes: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let at = from + memchr::memchr2(b'"', b'\\', bytes.get(from..)?)?;
        if bytes.get(at) == Some(&b'"') {
            return Some(at + 1);
        }
        // A backslash: the byte after it is escaped, whatever it is.
        from = at + 2;
    }
}

/// The index just past the value that starts at `at`: a string, an object or an array
/// (to the bracket that closes the one it opens), or a scalar (to the next `,`, `}`, `]`
/// or white space).
pub(crate) fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at)? {
        b'"' => string_end(bytes, at + 1),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            while let Some(&b) = bytes.get(i) {
                match b {
                    b'"' => {
                        i = string_end(bytes, i + 1)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            let rest = bytes.get(at..)?;
            let len = rest
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(rest.len());
            (len > 0).then_some(at + len)
        }
    }
}

/// Whether objects and arrays in `bytes` (valid JSON text) nest more than `limit` deep
/// (strings skipped, so brackets inside them do not count).
pub(crate) fn nests_deeper_than(bytes: &[u8], limit: usize) -> bool {
    if bytes.len() <= limit {
        return false; // more than `limit` deep takes more than `limit` opening brackets
    }
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => match string_end(bytes, i + 1) {
                Some(end) => {
                    i = end;
                    continue;
                }
                None => return false,
            },
            b'{' | b'[' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    false
}

/// The first key that one object in `text` (valid JSON text) holds twice, at any depth,
/// as its text unescaped (`"a"` and `"\u0061"` are one key); `None` when no object
/// repeats a key. Readers disagree on such an object: serde_json and Python keep the last
/// value, SQLite's `json_extract` and a scan for the first key the first.
pub(crate) fn repeated_key(text: &str) -> Option<String> {
    use std::borrow::Cow;
    let bytes = text.as_bytes();
    // The keys of every open object, the innermost last; per open object or array, where
    // its keys start in `keys` (`None` for an array).
    let mut keys: Vec<Cow<'_, str>> = Vec::new();
    let mut open: Vec<Option<usize>> = Vec::new();
    let mut key_next = false;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                let end = string_end(bytes, i + 1)?;
                if key_next && let Some(Some(first)) = open.last() {
                    let raw = text.get(i + 1..end - 1)?;
                    let key = if raw.contains('\\') {
                        Cow::Owned(serde_json::from_str(text.get(i..end)?).ok()?)
                    } else {
                        Cow::Borrowed(raw)
                    };
                    if keys.get(*first..)?.contains(&key) {
                        return Some(key.into_owned());
                    }
                    keys.push(key);
                    key_next = false;
                }
                i = end;
                continue;
            }
            b'{' => {
                open.push(Some(keys.len()));
                key_next = true;
            }
            b'[' => {
                open.push(None);
                key_next = false;
            }
            b'}' | b']' => {
                if let Some(Some(first)) = open.pop() {
                    keys.truncate(first);
                }
                key_next = false;
            }
            b',' => key_next = matches!(open.last(), Some(Some(_))),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the first byte at or after `at` that is not JSON white space.
pub(crate) fn skip_space(bytes: &[u8], at: usize) -> usize {
    let rest = bytes.get(at..).unwrap_or_default();
    at + rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .unwrap_or(rest.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_end_where_serde_json_reads_them_to() {
        for (text, end) in [
            (r#""a\"b" ,"#, 6),
            (r#""a\\" ,"#, 5),
            (r#"{"a":"}","b":[1,{"c":"]"}]} x"#, 27),
            ("[] ,", 2),
            ("12.5e3,", 6),
            ("true}", 4),
            ("null ", 4),
        ] {
            assert_eq!(value_end(text.as_bytes(), 0), Some(end), "{text}");
        }
        for text in [r#""open"#, r#""ends in \"#, "{\"a\":[1,2}", "[[]", "", ","] {
            assert_eq!(value_end(text.as_bytes(), 0), None, "{text}");
        }
        assert_eq!(skip_space(b" \t\r\n x", 0), 5);
        assert_eq!(skip_space(b"  ", 0), 2);
        assert_eq!(skip_space(b"", 3), 3);
    }

    #[test]
    fn a_repeated_key_is_found_at_any_depth_and_only_among_keys() {
        for (text, key) in [
            (r#"{"a":1,"a":2}"#, Some("a")),
            (
                r#"{"a":{"b":1},"c":[{"d":1,"e":{"d":2},"d":3}]}"#,
                Some("d"),
            ),
            (r#"{"k":"x","\u006b":"y"}"#, Some("k")),
            (r#"{ "a" : "a" , "b" : ["a", "a"] }"#, None),
            (r#"{"a":{"a":{"a":1}}}"#, None),
            (r#"[{"a":1},{"a":2}]"#, None),
            (r#"{"a\"b":1,"a\"b":2}"#, Some("a\"b")),
            (r#"{"a":"{\"a\":1}","b":1}"#, None),
            ("[1,2,1]", None),
            (r#""a""#, None),
        ] {
            assert_eq!(repeated_key(text).as_deref(), key, "{text}");
        }
    }

    #[test]
    fn nesting_is_counted_outside_strings() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(!nests_deeper_than(deep(3).as_bytes(), 3));
        assert!(nests_deeper_than(deep(4).as_bytes(), 3));
        assert!(!nests_deeper_than(
            br#"{"a":"[[[[[[","b":[{"c":"}}}"}]}"#,
            3
        ));
        assert!(nests_deeper_than(br#"{"a":"\"[","b":[{"c":[1]}]}"#, 3));
        assert!(!nests_deeper_than(b"[1,[2],[3]]", 2));
    }
}
