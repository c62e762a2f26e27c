//! The check of an event row (schema version 7, `events.payload_check`): a 32-bit hash of
//! what a payload read takes from the row, so that a read by sequence (a transcript page,
//! the search's read-back, a payload) notices a damaged row without reading the rest of
//! its commit. A commit read rehashes the whole commit against its operation hash as well.
//!
//! The check is the low 32 bits of a chain of XXH3-64 hashes: starting from the sequence,
//! each of the stored `kind`, `payload`, `payload_ref` and `payload_parts` in turn is
//! hashed (one-shot, its length part of the hash) with the hash so far, plus its type tag
//! (0 NULL, 1 text, 2 BLOB, 3 a number, which no checked column holds as written), as the
//! seed. It is stored as a signed 32-bit INTEGER (4
//! bytes in the record). NULL: a row written before schema 7, not checked. Like the other
//! hashes here it is unkeyed: it notices damage, not a deliberate edit.

use rusqlite::types::{ToSqlOutput, Value, ValueRef};

use crate::error::{Error, Result};

/// What a column holds, as the check hashes it.
#[derive(Clone, Copy)]
pub(crate) enum Stored<'a> {
    /// NULL.
    Null,
    /// TEXT, its UTF-8 bytes.
    Text(&'a [u8]),
    /// A BLOB.
    Blob(&'a [u8]),
    /// An INTEGER or a REAL, which no checked column holds as written.
    Other,
}

impl<'a> Stored<'a> {
    /// A column as SQLite returned it.
    pub(crate) fn of(value: ValueRef<'a>) -> Stored<'a> {
        match value {
            ValueRef::Null => Stored::Null,
            ValueRef::Text(t) => Stored::Text(t),
            ValueRef::Blob(b) => Stored::Blob(b),
            ValueRef::Integer(_) | ValueRef::Real(_) => Stored::Other,
        }
    }

    /// A value about to be bound (a kind's code or text).
    pub(crate) fn bound(value: &'a ToSqlOutput<'a>) -> Stored<'a> {
        match value {
            ToSqlOutput::Borrowed(v) => Stored::of(*v),
            ToSqlOutput::Owned(Value::Text(t)) => Stored::Text(t.as_bytes()),
            ToSqlOutput::Owned(Value::Blob(b)) => Stored::Blob(b),
            ToSqlOutput::Owned(Value::Null) => Stored::Null,
            _ => Stored::Other,
        }
    }

    /// An optional text.
    pub(crate) fn text(value: Option<&'a str>) -> Stored<'a> {
        value.map_or(Stored::Null, |t| Stored::Text(t.as_bytes()))
    }
}

/// The columns of an event row the check covers, as stored.
#[derive(Clone, Copy)]
pub(crate) struct EventColumns<'a> {
    /// `kind`: a code (BLOB) or text.
    pub kind: Stored<'a>,
    /// `payload`.
    pub payload: Stored<'a>,
    /// `payload_ref`.
    pub reference: Stored<'a>,
    /// `payload_parts`.
    pub parts: Stored<'a>,
}

/// The check of the row of event `seq` holding `columns`.
pub(crate) fn row_check(seq: u64, columns: EventColumns<'_>) -> i64 {
    let mut hash = seq;
    for column in [
        columns.kind,
        columns.payload,
        columns.reference,
        columns.parts,
    ] {
        let (tag, bytes): (u64, &[u8]) = match column {
            Stored::Null => (0, &[]),
            Stored::Text(t) => (1, t),
            Stored::Blob(b) => (2, b),
            Stored::Other => (3, &[]),
        };
        hash = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, hash.rotate_left(2) ^ tag);
    }
    i64::from(hash as u32 as i32)
}

/// Checks the row of event `seq` against its stored check (`None`: a row of an older
/// schema, or a file without the column, not checked).
///
/// # Errors
/// [`Error::Corrupt`] naming the event when the row does not match its check.
pub(crate) fn verify(seq: u64, stored: Option<i64>, columns: EventColumns<'_>) -> Result<()> {
    match stored {
        Some(check) if check != row_check(seq, columns) => Err(Error::corrupt(format!(
            "event {seq}: the row does not match its check (payload_check): the file is \
             damaged"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(kind: &'a [u8], payload: Option<&'a str>) -> EventColumns<'a> {
        EventColumns {
            kind: Stored::Blob(kind),
            payload: Stored::text(payload),
            reference: Stored::Null,
            parts: Stored::Null,
        }
    }

    #[test]
    fn the_check_is_pinned_and_fits_in_32_bits() {
        // A changed check function would make every file written before refuse to read.
        let check = row_check(7, row(&[0], Some(r#"{"id":"m1"}"#)));
        assert_eq!(check, row_check(7, row(&[0], Some(r#"{"id":"m1"}"#))));
        assert!(i64::from(i32::MIN) <= check && check <= i64::from(i32::MAX));
        assert_eq!(check, 305_894_926, "the check of a fixed row changed");
    }

    #[test]
    fn every_covered_column_and_the_sequence_change_the_check() {
        let base = row(&[0], Some(r#"{"id":"m1"}"#));
        let check = row_check(7, base);
        assert_ne!(check, row_check(8, base), "sequence");
        assert_ne!(
            check,
            row_check(7, row(&[1], Some(r#"{"id":"m1"}"#))),
            "kind"
        );
        assert_ne!(
            check,
            row_check(7, row(&[0], Some(r#"{"id":"m2"}"#))),
            "payload"
        );
        let text_kind = EventColumns {
            kind: Stored::Text(&[0]),
            ..base
        };
        assert_ne!(
            check,
            row_check(7, text_kind),
            "a text kind is not its code"
        );
        let empty = row(&[0], Some(""));
        assert_ne!(row_check(7, empty), row_check(7, row(&[0], None)), "NULL");
        let number = EventColumns {
            payload: Stored::of(ValueRef::Integer(0)),
            ..base
        };
        assert_ne!(
            row_check(7, row(&[0], None)),
            row_check(7, number),
            "a number"
        );
        let referenced = EventColumns {
            reference: Stored::text(Some("ab")),
            ..base
        };
        assert_ne!(check, row_check(7, referenced), "payload_ref");
        let parts = EventColumns {
            parts: Stored::text(Some("[3]")),
            ..base
        };
        assert_ne!(check, row_check(7, parts), "payload_parts");
        // Where one column ends and the next starts is part of what is hashed.
        let split = |payload, reference| EventColumns {
            payload: Stored::text(Some(payload)),
            reference: Stored::text(Some(reference)),
            ..base
        };
        assert_ne!(
            row_check(7, split("ab", "c")),
            row_check(7, split("a", "bc"))
        );
    }

    #[test]
    fn verify_refuses_a_mismatch_and_skips_an_unchecked_row() {
        let columns = row(&[0], Some("{}"));
        let check = row_check(3, columns);
        assert!(verify(3, Some(check), columns).is_ok());
        assert!(verify(3, None, columns).is_ok(), "NULL: not checked");
        let err = verify(3, Some(check ^ 1), columns).expect_err("mismatch");
        assert!(err.is_corrupt(), "{err}");
        assert!(err.to_string().contains("event 3"), "{err}");
    }
}
