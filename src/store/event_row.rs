//! How an event's kind and payload sit in an `events` row (schema version 5).
//!
//! A kind the projection knows is stored as a one-byte BLOB code (`x'00'` for
//! `message/complete`, …; the file's `event_kinds` view lists them for the `sqlite3`
//! shell), any other kind as its text. A BLOB never equals a TEXT, so a code cannot be
//! taken for a caller's kind named `"0"`, and the column's TEXT affinity leaves a BLOB as
//! it is (an integer would have been stored as text).
//!
//! The payload of a coded `message/complete` or `message/upsert` is stored *bare*: the
//! value of `{"message":…}` without those 12 bytes around it, when the payload is exactly
//! that text (`{"message":` + one JSON object + `}`, no other key, no white space around the
//! object). Reading puts them back, so the payload read is byte for byte the one written. A
//! message payload of any other form, or stored as a whole blob (its digest is the
//! payload's, [`crate::ContentRef`]), keeps its text kind and its payload as written.
//!
//! Rows written before schema 5 hold text kinds and whole payloads: they read as before,
//! so a file upgraded to schema 5 mixes both forms and nothing is rewritten.

use std::borrow::Cow;

use rusqlite::types::{ToSqlOutput, ValueRef};

use crate::error::{Error, Result};
use crate::model::event::INLINE_PAYLOAD_LIMIT;
use crate::model::json_scan::{BARE_HEAD, BARE_TAIL, bare_message};
use crate::model::kind;

/// The coded kinds: code `i` is `CODED_KINDS[i]`. A code never changes meaning (files on
/// disk hold them); a new kind gets the next code, and a new migration gives the
/// `event_kinds` view its row.
const CODED_KINDS: [&str; 24] = [
    kind::MESSAGE_COMPLETE,
    kind::TOOL_RESULT,
    kind::TURN_START,
    kind::TURN_END,
    kind::TOOL_START,
    kind::TOOL_CALL,
    kind::MESSAGE_UPSERT,
    kind::STEP_START,
    kind::STEP_END,
    kind::SESSION_TITLE,
    kind::USAGE,
    kind::ASSISTANT_ATTEMPT,
    kind::HISTORY_REPLACE,
    kind::MODEL_CONTEXT_REPLACE,
    kind::COMPACTION,
    kind::LEGACY_IMPORT,
    kind::SESSION_CONFIG,
    kind::TODO_WRITE,
    kind::INTERACTION_CREATED,
    kind::INTERACTION_RESOLVED,
    kind::RUNTIME_RECOVERY,
    kind::PLAN_STATE,
    kind::GOAL_STATE,
    kind::DIAGNOSTIC,
];

/// The codes as one-byte slices to bind (`CODE_BYTES[i..=i]` is code `i`).
const CODE_BYTES: [u8; CODED_KINDS.len()] = {
    let mut bytes = [0u8; CODED_KINDS.len()];
    let mut i = 0;
    while i < bytes.len() {
        bytes[i] = i as u8;
        i += 1;
    }
    bytes
};

/// The code of `kind`, if it has one.
fn code_of(kind: &str) -> Option<usize> {
    CODED_KINDS.iter().position(|k| *k == kind)
}

/// Whether payloads of the coded kind `code` are stored bare.
fn is_bare(code: usize) -> bool {
    matches!(CODED_KINDS.get(code), Some(&k) if k == kind::MESSAGE_COMPLETE || k == kind::MESSAGE_UPSERT)
}

/// The `kind` value to bind for a kind stored as `code` (a one-byte BLOB).
fn code_value(code: usize) -> ToSqlOutput<'static> {
    ToSqlOutput::Borrowed(ValueRef::Blob(&CODE_BYTES[code..=code]))
}

/// The `kind` value that selects rows of `kind` written as a code (`None`: the kind has no
/// code, only text rows hold it).
pub(crate) fn code_for_query(kind: &str) -> Option<ToSqlOutput<'static>> {
    code_of(kind).map(code_value)
}

/// The `kind` value of a kind stored as its text.
fn text_value(kind: &str) -> ToSqlOutput<'_> {
    ToSqlOutput::Borrowed(ValueRef::Text(kind.as_bytes()))
}

/// The row form of an event: the `kind` value and the payload text to store (bare for a
/// message payload of the exact form, see the module doc). A payload over
/// [`INLINE_PAYLOAD_LIMIT`], which the caller stores whole as a blob, is returned as it
/// is, with the text of a message kind (its code would say the blob holds a bare message).
pub(crate) fn encode<'a>(
    kind: &'a str,
    payload: Option<&'a str>,
) -> (ToSqlOutput<'a>, Option<&'a str>) {
    let Some(code) = code_of(kind) else {
        return (text_value(kind), payload);
    };
    if !is_bare(code) {
        return (code_value(code), payload);
    }
    match payload
        .filter(|p| p.len() <= INLINE_PAYLOAD_LIMIT)
        .and_then(bare_message)
    {
        Some(bare) => (code_value(code), Some(bare)),
        None => (text_value(kind), payload),
    }
}

/// A row's kind as read: its text, and whether its payload is stored bare.
pub(crate) struct StoredKind {
    /// The event kind.
    pub kind: Cow<'static, str>,
    /// Whether the stored payload is the message object alone ([`whole_payload`] restores
    /// it).
    pub bare: bool,
}

/// Reads the `kind` column of the row of event `seq`.
///
/// # Errors
/// [`Error::Corrupt`] naming the event for a code this build does not know or a value
/// that is neither a code nor text.
pub(crate) fn decode_kind(seq: u64, value: ValueRef<'_>) -> Result<StoredKind> {
    match value {
        ValueRef::Text(text) => std::str::from_utf8(text)
            .map(|k| StoredKind {
                kind: Cow::Owned(k.to_owned()),
                bare: false,
            })
            .map_err(|e| Error::corrupt_from(format!("event {seq}: kind is not UTF-8"), e)),
        ValueRef::Blob(&[code]) if usize::from(code) < CODED_KINDS.len() => {
            let code = usize::from(code);
            Ok(StoredKind {
                kind: Cow::Borrowed(CODED_KINDS[code]),
                bare: is_bare(code),
            })
        }
        ValueRef::Blob(code) => Err(Error::corrupt(format!(
            "event {seq}: unknown kind code x'{}'",
            hex::encode(code)
        ))),
        other => Err(Error::corrupt(format!(
            "event {seq}: kind is {}, neither text nor a kind code",
            other.data_type()
        ))),
    }
}

/// The payload as written from its stored text: a bare message put back inside
/// `{"message":…}`.
pub(crate) fn whole_payload(stored: String, bare: bool) -> String {
    if !bare {
        return stored;
    }
    let mut whole = String::with_capacity(BARE_HEAD.len() + stored.len() + BARE_TAIL.len());
    whole.push_str(BARE_HEAD);
    whole.push_str(&stored);
    whole.push_str(BARE_TAIL);
    whole
}

/// The `event_kinds` rows migrations 0005 and 0009 write, as `(code, kind, bare)`: checked
/// against [`CODED_KINDS`] by the tests, so the file's view tells the shell what this build
/// reads.
#[cfg(test)]
pub(crate) fn event_kinds_rows() -> Vec<(Vec<u8>, String, bool)> {
    (0..CODED_KINDS.len())
        .map(|code| {
            (
                vec![code as u8],
                CODED_KINDS[code].to_owned(),
                is_bare(code),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(kind: &str, payload: &str) -> (Option<Vec<u8>>, String) {
        let (value, text) = encode(kind, Some(payload));
        let code = match value {
            ToSqlOutput::Borrowed(ValueRef::Blob(b)) => Some(b.to_vec()),
            ToSqlOutput::Borrowed(ValueRef::Text(t)) => {
                assert_eq!(t, kind.as_bytes());
                None
            }
            other => panic!("unexpected kind value {other:?}"),
        };
        (code, text.expect("payload").to_owned())
    }

    fn read_back(seq: u64, code: &Option<Vec<u8>>, kind: &str, text: String) -> (String, String) {
        let value = match code {
            Some(b) => ValueRef::Blob(b),
            None => ValueRef::Text(kind.as_bytes()),
        };
        let k = decode_kind(seq, value).expect("decode");
        (k.kind.into_owned(), whole_payload(text, k.bare))
    }

    #[test]
    fn a_message_payload_of_the_exact_form_is_stored_bare_and_read_back_whole() {
        let payload = r#"{"message":{"id":"m1","role":"user","content":"a } \" { ] [ \\"}}"#;
        for kind in [kind::MESSAGE_COMPLETE, kind::MESSAGE_UPSERT] {
            let (code, text) = stored(kind, payload);
            assert!(code.is_some(), "{kind} is coded");
            assert_eq!(
                text,
                r#"{"id":"m1","role":"user","content":"a } \" { ] [ \\"}"#
            );
            assert_eq!(
                read_back(7, &code, kind, text),
                (kind.to_owned(), payload.to_owned())
            );
        }
    }

    #[test]
    fn other_message_payload_forms_keep_their_text_kind_and_whole_payload() {
        for payload in [
            r#"{"message":{"id":"m1"},"extra":1}"#,
            r#"{"message": {"id":"m1"}}"#,
            r#"{"message":{"id":"m1"} }"#,
            r#"{"message":{"id":"m1"}}}"#,
            r#"{"message":[1,2]}"#,
            r#"{"message":"text"}"#,
            r#"{"message":{"id":"}"}"#,
            r#"{"other":{"id":"m1"}}"#,
            r#"{"message":{"a":{"b":1}},"c":{}}"#,
            "",
        ] {
            let (code, text) = stored(kind::MESSAGE_COMPLETE, payload);
            assert_eq!(code, None, "{payload}");
            assert_eq!(text, payload);
            assert_eq!(
                read_back(1, &code, kind::MESSAGE_COMPLETE, text),
                (kind::MESSAGE_COMPLETE.to_owned(), payload.to_owned())
            );
        }
    }

    /// JSON values whose strings are full of what the scan must skip.
    fn arb_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            "[\"\\\\{}\\[\\]a\u{e9}\u{1}]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-z\"\\\\}]{1,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn any_message_object_is_stored_bare_and_nothing_after_it_is(
            message in proptest::collection::btree_map("[a-z\"]{1,4}", arb_json(), 0..5),
            extra in arb_json(),
        ) {
            let message = serde_json::Value::Object(message.into_iter().collect()).to_string();
            let payload = format!(r#"{{"message":{message}}}"#);
            let (code, text) = stored(kind::MESSAGE_COMPLETE, &payload);
            proptest::prop_assert!(code.is_some());
            proptest::prop_assert_eq!(&text, &message);
            let payload = format!(r#"{{"message":{message},"x":{extra}}}"#);
            let (code, text) = stored(kind::MESSAGE_COMPLETE, &payload);
            proptest::prop_assert!(code.is_none());
            proptest::prop_assert_eq!(text, payload);
        }
    }

    #[test]
    fn known_kinds_are_coded_and_others_kept_as_text() {
        for (i, k) in CODED_KINDS.iter().enumerate() {
            if is_bare(i) {
                continue;
            }
            let (code, text) = stored(k, r#"{"x":1}"#);
            assert_eq!(code, Some(vec![i as u8]));
            assert_eq!(
                read_back(3, &code, k, text),
                ((*k).to_owned(), r#"{"x":1}"#.to_owned())
            );
        }
        for custom in ["0", "x/custom", "\u{1}", "message/complete "] {
            let (code, text) = stored(custom, "{}");
            assert_eq!(code, None, "{custom:?}");
            assert_eq!(
                read_back(3, &code, custom, text),
                (custom.to_owned(), "{}".to_owned())
            );
        }
        assert_eq!(
            CODED_KINDS.len(),
            crate::model::kind::PROJECTION_KINDS.len()
        );
        for k in crate::model::kind::PROJECTION_KINDS {
            assert!(code_of(k).is_some(), "{k} has a code");
        }
    }

    #[test]
    fn a_payload_stored_whole_keeps_a_code_but_for_message_kinds() {
        let whole = format!(
            r#"{{"message":{{"content":"{}"}}}}"#,
            "x".repeat(INLINE_PAYLOAD_LIMIT)
        );
        let text = |k: &str| {
            let (v, payload) = encode(k, Some(&whole));
            assert_eq!(payload, Some(whole.as_str()), "{k}: stored whole");
            matches!(v, ToSqlOutput::Borrowed(ValueRef::Text(_)))
        };
        assert!(!text(kind::TOOL_RESULT));
        assert!(text(kind::MESSAGE_COMPLETE));
        assert!(text(kind::MESSAGE_UPSERT));
        assert!(text("host/attachment"));
    }

    #[test]
    fn unknown_codes_and_other_values_are_corrupt_naming_the_event() {
        for value in [
            ValueRef::Blob(&[24]),
            ValueRef::Blob(&[255]),
            ValueRef::Blob(&[0, 0]),
            ValueRef::Blob(&[]),
            ValueRef::Integer(0),
            ValueRef::Real(1.5),
            ValueRef::Null,
            ValueRef::Text(&[0xff]),
        ] {
            let e = decode_kind(42, value).err().expect("refused");
            assert!(e.is_corrupt(), "{value:?}: {e}");
            assert!(e.to_string().contains("event 42"), "{e}");
        }
    }

    #[test]
    fn the_migration_lists_the_codes_this_build_reads() {
        let sql = include_str!("../../migrations/0005_kind_codes.sql");
        for (code, kind, bare) in event_kinds_rows() {
            let row = format!("(x'{}', '{kind}', {})", hex::encode(&code), u8::from(bare));
            assert!(sql.contains(&row), "0005 lacks {row}");
        }
        assert_eq!(sql.matches("(x'").count(), CODED_KINDS.len());
    }
}
