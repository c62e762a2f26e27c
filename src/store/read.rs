//! Reads from one session file (any connection: writer, pooled reader, untrusted file).

use std::path::Path;
use std::sync::Arc;

use rusqlite::types::{ToSqlOutput, Type, Value, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{Error, Result, WriterOwner};
use crate::model::event::{commit_row_digest, commit_row_hash, derived_event_id, operation_key};
use crate::model::header::{Header, Origin};
use crate::model::ids::{derived_turn_id, lower_hex};
use crate::model::projection::{HistoryChange, ModelRef};
use crate::model::transcript_index::{ENTRY, IndexLoader};
use crate::model::{Commit, ContentRef, Event, Projection, SessionId, TurnBoundary};
use crate::store::event_row::{self, StoredKind};
use crate::store::operation_keys::ChunkCache;
use crate::store::row_check::{self, EventColumns, Stored};
use crate::store::schema::{self, Access, CODEC};
use crate::store::{blob, content};

/// Media type of payload blobs.
pub(crate) const JSON_MEDIA_TYPE: &str = "application/json";

/// Payload bytes one page of commits holds at most before it is cut at the next commit
/// boundary (a page holds at least one commit, whatever its size). Many commits that
/// share one large blob would otherwise each bring a decoded copy into the page.
pub(crate) const PAGE_BYTES: u64 = 32 << 20;

/// One ancestor of a fork and the range of sequences it supplies: `(after_seq, through_seq]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LineageEntry {
    /// The ancestor session.
    pub ancestor_id: SessionId,
    /// The range starts after this sequence.
    pub after_seq: u64,
    /// The last sequence read from that ancestor's file.
    pub through_seq: u64,
}

/// A session that inherits from this one, up to `through_seq`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DependentFork {
    /// The inheriting session.
    pub child_id: SessionId,
    /// The last inherited sequence.
    pub through_seq: u64,
}

/// A stored session id (always a query's first column).
fn session_id(value: String) -> rusqlite::Result<SessionId> {
    let why = format!("{} is not a valid session id", crate::error::quoted(&value));
    SessionId::new(value).map_err(|_| undecodable(0, Type::Text, why))
}

/// What reading a row of `table` (its query's `columns`, in order) in the file `conn`
/// reads failed with: a value that cannot be decoded in plain words, [`Error::Corrupt`]
/// naming the session (see [`file_session`]), the column and what it holds (`session s:
/// lease.pid holds text, not the type of that column`, `session s: commits.row_hash does
/// not match the commit at 5`), not rusqlite's wording; any other error as it is.
fn undecodable_in(conn: &Connection, table: &str, columns: &str, e: rusqlite::Error) -> Error {
    undecodable_value(table, columns, e).corrupt_in(|| file_session(conn))
}

/// [`undecodable_in`] without the session: its table, column and value.
fn undecodable_value(table: &str, columns: &str, e: rusqlite::Error) -> Error {
    let column = |i: usize| {
        columns
            .split(',')
            .nth(i)
            .map(str::trim)
            .filter(|c| *c != "*")
            .map_or_else(|| format!("column {i}"), str::to_owned)
    };
    let what = match &e {
        rusqlite::Error::FromSqlConversionFailure(i, _, why) => {
            format!("{table}.{} {why}", column(*i))
        }
        rusqlite::Error::InvalidColumnType(_, name, kind) => format!(
            "{table}.{name} holds {}, not the type of that column",
            kind.to_string().to_lowercase()
        ),
        rusqlite::Error::IntegralValueOutOfRange(i, v) => {
            format!("{table}.{} holds {v}, out of its range", column(*i))
        }
        rusqlite::Error::Utf8Error(i, _) => {
            format!("{table}.{} holds text that is not UTF-8", column(*i))
        }
        _ => return e.into(),
    };
    Error::corrupt(what)
}

/// The header row.
pub(crate) fn read_header(conn: &Connection) -> Result<Header> {
    const COLUMNS: &str =
        "session_id, codec, created_at, cwd, parent_id, origin, provenance, inherited_events";
    let row = conn
        .query_row(
            &format!("SELECT {COLUMNS} FROM header WHERE singleton = 1"),
            [],
            |r| {
                Ok((
                    session_id(r.get(0)?)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, Option<String>>(6)?,
                    r.get::<_, u64>(7)?,
                ))
            },
        )
        .optional()
        .map_err(|e| undecodable_value("header", COLUMNS, e).corrupt_in(|| file_name(conn)))?
        .ok_or_else(|| Error::corrupt("header row is missing"))?;
    let (session_id, codec, created_at_ms, cwd, parent, origin, provenance, inherited_events) = row;
    if codec != CODEC {
        // Another format (or a later one under the same schema version) is not read as
        // this one.
        return Err(Error::unsupported(format!(
            "storage codec {} (this build reads {CODEC})",
            crate::error::quoted(&codec)
        )));
    }
    Ok(Header {
        session_id,
        codec,
        created_at_ms,
        cwd,
        parent_id: parent
            .map(SessionId::new)
            .transpose()
            .map_err(|e| Error::corrupt_from("header parent", e))?,
        origin: Origin::parse(&origin).ok_or_else(|| {
            Error::corrupt(format!("header origin {}", crate::error::quoted(&origin)))
        })?,
        provenance: provenance
            .map(|p| serde_json::from_str(&p))
            .transpose()
            .map_err(|e| Error::corrupt_from("header provenance", e))?,
        inherited_events,
    })
}

/// The lineage rows, in sequence order.
pub(crate) fn read_lineage(conn: &Connection) -> Result<Vec<LineageEntry>> {
    let mut stmt = conn.prepare_cached(
        "SELECT ancestor_id, after_seq, through_seq FROM lineage ORDER BY after_seq",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(LineageEntry {
            ancestor_id: session_id(r.get(0)?)?,
            after_seq: r.get(1)?,
            through_seq: r.get(2)?,
        })
    })?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| undecodable_in(conn, "lineage", "ancestor_id, after_seq, through_seq", e))
}

/// The lineage rows of the session file `file`, read without opening its ancestors (a
/// file staged away from them, e.g. a restored copy not yet published).
///
/// # Errors
/// [`Error::SessionNotFound`] when `file` is missing; [`Error::InvalidInput`] for a
/// symlink; [`Error::Corrupt`] or [`Error::UnsupportedVersion`] for a file that is not a
/// session file this build reads.
pub(crate) fn read_file_lineage(file: &Path) -> Result<Vec<LineageEntry>> {
    schema::check_file(file)?;
    let conn = schema::open_reader_with(file, Access::for_user_file(file))?;
    read_lineage(&conn)
}

/// The dependents rows: children that inherit from this file.
pub(crate) fn read_dependents(conn: &Connection) -> Result<Vec<DependentFork>> {
    let mut stmt =
        conn.prepare_cached("SELECT child_id, through_seq FROM dependents ORDER BY child_id")?;
    let rows = stmt.query_map([], |r| {
        Ok(DependentFork {
            child_id: session_id(r.get(0)?)?,
            through_seq: r.get(1)?,
        })
    })?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| undecodable_in(conn, "dependents", "child_id, through_seq", e))
}

/// How far `child` is recorded as inheriting from this file: its `dependents` row's
/// `through_seq`, if it has one.
pub(crate) fn dependent_through(conn: &Connection, child: &SessionId) -> Result<Option<u64>> {
    conn.prepare_cached("SELECT through_seq FROM dependents WHERE child_id = ?1")?
        .query_row([child.as_str()], |r| r.get(0))
        .optional()
        .map_err(|e| undecodable_in(conn, "dependents", "through_seq", e))
}

const TURN_COLUMNS: &str =
    "turn_id, start_seq, end_seq, boundary_seq, status, fork_safe, rewind_safe";

fn turn_row(r: &Row<'_>) -> rusqlite::Result<TurnBoundary> {
    Ok(TurnBoundary {
        turn_id: r.get(0)?,
        start_sequence: r.get(1)?,
        end_sequence: r.get(2)?,
        boundary_sequence: r.get(3)?,
        status: r.get(4)?,
        fork_safe: r.get(5)?,
        rewind_safe: r.get(6)?,
    })
}

/// The ended turn `turn_id` recorded in this file (the first one, if repeated).
pub(crate) fn read_turn(conn: &Connection, turn_id: &str) -> Result<Option<TurnBoundary>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {TURN_COLUMNS} FROM turns WHERE turn_id = ?1 ORDER BY start_seq LIMIT 1"
        ))?
        .query_row([turn_id], turn_row)
        .optional()?)
}

/// The ended turns of this file whose `turn/end` falls in `(after, through]`.
pub(crate) fn read_turns_ending_in(
    conn: &Connection,
    after: u64,
    through: u64,
) -> Result<Vec<TurnBoundary>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {TURN_COLUMNS} FROM turns WHERE end_seq > ?1 AND end_seq <= ?2 ORDER BY start_seq"
    ))?;
    let rows = stmt.query_map(params![after, through], turn_row)?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// The ended turns of this file whose `turn/end` falls in `(after, through]` and that
/// overlap the sequences `first..=last`: the turn holding `first` (if any) and those
/// starting up to `last`. Two lookups on the `start_seq` key, whatever the file's size.
pub(crate) fn read_turns_overlapping(
    conn: &Connection,
    (after, through): (u64, u64),
    first: u64,
    last: u64,
) -> Result<Vec<TurnBoundary>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {TURN_COLUMNS} FROM turns
         WHERE start_seq >= coalesce((SELECT max(start_seq) FROM turns WHERE start_seq <= ?3), 0)
           AND start_seq <= ?4 AND end_seq >= ?3 AND end_seq > ?1 AND end_seq <= ?2
         ORDER BY start_seq"
    ))?;
    let rows = stmt.query_map(params![after, through, first, last], turn_row)?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// The checkpoint stored at or below `through`: its sequence, its projection (workset
/// still to be read) and the workset's references; `None` when there is none, it is
/// damaged or of another form (an older file's checkpoint has no `message_ids`).
///
/// The transcript index (20 bytes per message) is read through SQLite's incremental blob
/// I/O in pieces of [`INDEX_PIECE`] bytes, hashed and decoded as it comes, in one read
/// transaction with the row. Read as a value, SQLite assembled it whole in a buffer of its
/// own and rusqlite copied it again before the decode: three copies of 2 MB of memory new
/// to the process at each open of a 100,000-message session, whose page faults were most
/// of the read (`bench --suite lean` row 5).
pub(crate) fn read_checkpoint(
    conn: &Connection,
    through: u64,
) -> Option<(u64, Projection, Vec<ModelRef>)> {
    let tx = conn.unchecked_transaction().ok()?;
    let (rowid, seq, text, digest, ids_len): (i64, u64, String, String, usize) = tx
        .query_row(
            "SELECT singleton, through_seq, projection, digest, length(message_ids)
             FROM checkpoint WHERE through_seq <= ?1 AND message_ids IS NOT NULL",
            [through.min(i64::MAX as u64)],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .ok()?;
    let (mut p, refs) = crate::store::checkpoint::decode_state(&text)?;
    let mut hash = crate::store::checkpoint::Digest::new(seq, &text);
    let mut index = IndexLoader::new(ids_len, p.transcript_len)?;
    let blob = tx
        .blob_open(rusqlite::MAIN_DB, "checkpoint", "message_ids", rowid, true)
        .ok()?;
    let mut piece = vec![0; INDEX_PIECE.min(ids_len)];
    let mut at = 0;
    while at < ids_len {
        let n = INDEX_PIECE.min(ids_len - at);
        let bytes = piece.get_mut(..n)?;
        blob.read_at_exact(bytes, at).ok()?;
        hash.update(bytes);
        index.push(bytes)?;
        at += n;
    }
    if digest != hash.hex() {
        return None;
    }
    p.restore_transcript_ids(index.finish()?);
    (p.committed_sequence == seq).then_some((seq, p, refs))
}

/// The sequence of this file's checkpoint row that [`read_checkpoint`] does not use at
/// `through`, the end of its log (its digest, its form or its sequence does not check
/// out, or it names a sequence past the log: a writer writes a checkpoint with the
/// commits it covers, so that is damage, which was ignored without a word; outside
/// testing H4); `None` for a usable one, none, or a file without the table or column (an
/// older schema, whose rows are no damage).
pub(crate) fn unusable_checkpoint(conn: &Connection, through: u64) -> Option<u64> {
    let seq: u64 = conn
        .query_row(
            "SELECT through_seq FROM checkpoint WHERE message_ids IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .ok()?;
    (seq > through || read_checkpoint(conn, through).is_none()).then_some(seq)
}

/// The operation filter of the checkpoint as of `through_seq` (see
/// `migrations/0004_operation_filter.sql`), its check verified and removed; `None` for
/// an older file, another checkpoint, none stored, one longer than `max_bytes` (not read:
/// a damaged or hostile length costs no memory) or one that does not check out.
pub(crate) fn read_operation_filter(
    conn: &Connection,
    through_seq: u64,
    max_bytes: usize,
) -> Option<Vec<u8>> {
    if schema_version(conn).ok()? < 4 {
        return None;
    }
    let stored: Vec<u8> = conn
        .query_row(
            "SELECT operation_filter FROM checkpoint
             WHERE through_seq = ?1 AND operation_filter IS NOT NULL
               AND length(operation_filter) <= ?2",
            params![through_seq.min(i64::MAX as u64), max_bytes as u64],
            |r| r.get(0),
        )
        .ok()?;
    crate::store::checkpoint::unsealed_filter(through_seq, stored)
}

/// Bytes of the transcript index read at a time: a whole number of entries, about 64 KiB.
const INDEX_PIECE: usize = (64 * 1024 / ENTRY) * ENTRY;

/// One entry of the history index: which event put which message at a position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HistoryRow {
    pub position: u64,
    pub event_seq: u64,
    pub item: Option<u64>,
    pub message_id: String,
    pub role: Option<String>,
    pub bytes: u64,
}

impl HistoryRow {
    /// The row a transcript change puts in the index (`None` for a reset).
    pub(crate) fn of(change: &HistoryChange) -> Option<HistoryRow> {
        match change {
            HistoryChange::Reset { .. } => None,
            HistoryChange::Put {
                seq,
                position,
                item,
                message,
            } => Some(HistoryRow {
                position: *position,
                event_seq: *seq,
                item: *item,
                message_id: message.id().to_owned(),
                role: message.role().map(str::to_owned),
                bytes: message.json().len() as u64,
            }),
        }
    }
}

/// A history row from `position, event_seq, item, message_id, role, bytes`.
fn history_row(r: &Row<'_>) -> rusqlite::Result<HistoryRow> {
    Ok(HistoryRow {
        position: r.get(0)?,
        event_seq: r.get(1)?,
        item: r.get(2)?,
        message_id: r.get(3)?,
        role: r.get(4)?,
        bytes: r.get(5)?,
    })
}

/// The newest transcript reset of this file with `after < seq <= through`.
pub(crate) fn read_history_epoch(
    conn: &Connection,
    after: u64,
    through: u64,
) -> Result<Option<u64>> {
    Ok(conn
        .prepare_cached("SELECT max(seq) FROM history_resets WHERE seq > ?1 AND seq <= ?2")?
        .query_row(params![after, through.min(i64::MAX as u64)], |r| r.get(0))?)
}

/// The newest entry per position below `before`, for events in `(after, through]` at or
/// after `epoch`, newest positions first, at most `limit`.
pub(crate) fn read_history_rows(
    conn: &Connection,
    (after, through): (u64, u64),
    epoch: u64,
    before: u64,
    limit: usize,
) -> Result<Vec<HistoryRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT position, max(event_seq), item, message_id, role, bytes FROM history
         WHERE position < ?1 AND event_seq > ?2 AND event_seq <= ?3 AND event_seq >= ?4
         GROUP BY position ORDER BY position DESC LIMIT ?5",
    )?;
    let rows = stmt.query_map(
        params![
            before.min(i64::MAX as u64),
            after,
            through.min(i64::MAX as u64),
            epoch,
            limit as i64
        ],
        history_row,
    )?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// A transcript entry as [`read_history_texts`] reads it: the event that put a message at
/// a position, and the message's source text.
#[derive(Debug)]
pub(crate) struct HistoryText {
    /// 1-based transcript position.
    pub position: u64,
    /// The event that put the message there.
    pub event_seq: u64,
    /// Index in the payload's `messages` array (replacements only).
    pub item: Option<u64>,
    /// For a message event (`item` None) whose payload is inline: its text, content parts
    /// spliced back. `None` for a replacement's item (its `messages` payload is shared by
    /// many entries: read it once, by sequence) and for a payload stored as a blob.
    pub payload: Option<String>,
    /// The kind of the event an entry without `item` names (`None` for a replacement's
    /// item, and when the file holds no such event).
    pub kind: Option<std::borrow::Cow<'static, str>>,
}

/// The entries [`read_history_rows`] reads and the payloads of the message events they
/// name, in one statement: the newest entry per position below `before`, for events in
/// `(after, through]` at or after `epoch`, newest positions first, at most `limit`.
pub(crate) fn read_history_texts(
    conn: &Connection,
    (after, through): (u64, u64),
    epoch: u64,
    before: u64,
    limit: usize,
) -> Result<Vec<HistoryText>> {
    // The index in its key order (position, then event, both descending) joined to the
    // events: no grouping, no sort; the first row of a position is its current entry and
    // the read stops after `limit` positions. The event's columns are read for an entry of
    // a whole message (`item` NULL) only. `payload_parts` exists from schema version 3 on
    // and `payload_check` from version 7: a file older than that (until a writer upgrades
    // it) is read without them.
    let sql = |parts: &str, check: &str| {
        format!(
            "SELECT h.position, h.event_seq, h.item,
                    CASE WHEN h.item IS NULL THEN e.payload END,
                    CASE WHEN h.item IS NULL THEN {parts} END,
                    CASE WHEN h.item IS NULL THEN e.kind END,
                    CASE WHEN h.item IS NULL THEN e.payload_ref END,
                    CASE WHEN h.item IS NULL THEN {check} END
             FROM history h LEFT JOIN events e ON e.seq = h.event_seq
             WHERE h.position < ?1 AND h.event_seq > ?2 AND h.event_seq <= ?3
               AND h.event_seq >= ?4
             ORDER BY h.position DESC, h.event_seq DESC"
        )
    };
    let mut stmt = match conn.prepare_cached(&sql("e.payload_parts", "e.payload_check")) {
        Ok(stmt) => stmt,
        Err(_) => match conn.prepare_cached(&sql("e.payload_parts", "NULL")) {
            Ok(stmt) => stmt,
            Err(_) => conn.prepare_cached(&sql("NULL", "NULL"))?,
        },
    };
    let mut rows = stmt.query(params![
        before.min(i64::MAX as u64),
        after,
        through.min(i64::MAX as u64),
        epoch
    ])?;
    let mut out: Vec<HistoryText> = Vec::new();
    let mut cache = PartCache::default();
    while out.len() < limit
        && let Some(r) = rows.next()?
    {
        let position = r.get(0)?;
        if out.last().is_some_and(|t| t.position == position) {
            continue; // an older entry of the same position
        }
        let event_seq = r.get(1)?;
        let (text, parts): (Option<String>, Option<String>) = (r.get(3)?, r.get(4)?);
        verify_row(
            event_seq,
            r,
            &HISTORY_TEXT_CHECKED_AT,
            parts.as_deref(),
            r.get(7)?,
        )??;
        let payload = stored_text(conn, event_seq, text, parts, &mut cache)?;
        let kind = match r.get_ref(HISTORY_TEXT_CHECKED_AT.kind)? {
            ValueRef::Null => None,
            kind => Some(event_row::decode_kind(event_seq, kind)?),
        };
        let payload = match (payload, &kind) {
            (Some(text), Some(kind)) => Some(event_row::whole_payload(text, kind.bare)),
            (payload, _) => payload,
        };
        out.push(HistoryText {
            position,
            event_seq,
            item: r.get(2)?,
            payload,
            kind: kind.map(|k| k.kind),
        });
    }
    Ok(out)
}

/// The first history row of this file at a position above `position` that names an event
/// past the file's last commit (`after`, the start of its own range, when it has none):
/// `(position, event_seq)`. One statement, so a writer's commit cannot fall between the
/// two reads. A scan of the positions above `position` only.
pub(crate) fn history_row_beyond_log(
    conn: &Connection,
    position: u64,
    after: u64,
) -> Result<Option<(u64, u64)>> {
    Ok(conn
        .prepare_cached(
            "SELECT position, event_seq FROM history
             WHERE position > ?1 AND event_seq > coalesce(
                 (SELECT last_seq FROM commits ORDER BY first_seq DESC LIMIT 1), ?2)
             ORDER BY position LIMIT 1",
        )?
        .query_row(
            params![position.min(i64::MAX as u64), after.min(i64::MAX as u64)],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?)
}

/// The current entry at `position` for events in `(after, through]` at or after `epoch`.
pub(crate) fn read_history_at(
    conn: &Connection,
    (after, through): (u64, u64),
    epoch: u64,
    position: u64,
) -> Result<Option<HistoryRow>> {
    Ok(conn
        .prepare_cached(
            "SELECT position, event_seq, item, message_id, role, bytes FROM history
             WHERE position = ?1 AND event_seq > ?2 AND event_seq <= ?3 AND event_seq >= ?4
             ORDER BY event_seq DESC LIMIT 1",
        )?
        .query_row(
            params![
                position.min(i64::MAX as u64),
                after,
                through.min(i64::MAX as u64),
                epoch
            ],
            history_row,
        )
        .optional()?)
}

/// The newest entry of the message `message_id` for events in `(after, through]` at or
/// after `epoch` (a scan of the index: it has no key on message ids).
pub(crate) fn read_history_of(
    conn: &Connection,
    (after, through): (u64, u64),
    epoch: u64,
    message_id: &str,
) -> Result<Option<HistoryRow>> {
    Ok(conn
        .prepare_cached(
            "SELECT position, event_seq, item, message_id, role, bytes FROM history
             WHERE message_id = ?1 AND event_seq > ?2 AND event_seq <= ?3 AND event_seq >= ?4
             ORDER BY event_seq DESC LIMIT 1",
        )?
        .query_row(
            params![message_id, after, through.min(i64::MAX as u64), epoch],
            history_row,
        )
        .optional()?)
}

/// The highest position with an entry for events in `(after, through]` at or after
/// `epoch` (read from the top of the index down to the first such entry).
pub(crate) fn read_history_len(
    conn: &Connection,
    (after, through): (u64, u64),
    epoch: u64,
) -> Result<Option<u64>> {
    Ok(conn
        .prepare_cached(
            "SELECT position FROM history
             WHERE event_seq > ?1 AND event_seq <= ?2 AND event_seq >= ?3
             ORDER BY position DESC LIMIT 1",
        )?
        .query_row(params![after, through.min(i64::MAX as u64), epoch], |r| {
            r.get(0)
        })
        .optional()?)
}

/// Whether an entry at a position up to `position` was written by an event in
/// `(after, through]`.
pub(crate) fn history_changed_through(
    conn: &Connection,
    (after, through): (u64, u64),
    position: u64,
) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM history WHERE position <= ?1 AND event_seq > ?2 AND event_seq <= ?3",
        )?
        .exists(params![
            position.min(i64::MAX as u64),
            after,
            through.min(i64::MAX as u64)
        ])?)
}

/// The ended turn of this file that started last at or before `seq`.
pub(crate) fn read_turn_started_by(conn: &Connection, seq: u64) -> Result<Option<TurnBoundary>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {TURN_COLUMNS} FROM turns WHERE start_seq <= ?1 ORDER BY start_seq DESC LIMIT 1"
        ))?
        .query_row([seq.min(i64::MAX as u64)], turn_row)
        .optional()?)
}

/// Every history row and transcript reset of this file for events in `(after, through]`,
/// in `(event_seq, position)` order; `None` for a file older than the history index
/// (schema version 1).
pub(crate) fn read_history_index(
    conn: &Connection,
    after: u64,
    through: u64,
) -> Result<Option<(Vec<HistoryRow>, Vec<u64>)>> {
    let indexed = conn
        .prepare_cached("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'history'")?
        .exists([])?;
    if !indexed {
        return Ok(None);
    }
    let through = through.min(i64::MAX as u64);
    let rows = conn
        .prepare_cached(
            "SELECT position, event_seq, item, message_id, role, bytes FROM history
             WHERE event_seq > ?1 AND event_seq <= ?2 ORDER BY event_seq, position",
        )?
        .query_map(params![after, through], history_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let resets = conn
        .prepare_cached("SELECT seq FROM history_resets WHERE seq > ?1 AND seq <= ?2 ORDER BY seq")?
        .query_map(params![after, through], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<u64>>>()?;
    Ok(Some((rows, resets)))
}

/// What [`read_event_payload`] reads: the event's kind, its inline JSON text (content parts
/// spliced back) or the digest of its blob.
pub(crate) type EventPayload = (
    std::borrow::Cow<'static, str>,
    Option<String>,
    Option<String>,
);

/// The kind and payload of event `seq`: inline JSON text (its content parts spliced back),
/// or the digest of its blob.
pub(crate) fn read_event_payload(conn: &Connection, seq: u64) -> Result<EventPayload> {
    type Row = (
        Result<StoredKind>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let (kind, text, reference, parts): Row = conn
        .prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE seq = ?1"
        ))?
        .query_row([seq], |r| {
            let parts: Option<String> = AddedColumn::parts().get(r)?;
            let checked = check_event_row(seq, r, parts.as_deref(), &mut AddedColumn::check())?;
            Ok((
                checked.and_then(|()| event_row::decode_kind(seq, r.get_ref(2)?)),
                r.get(4)?,
                r.get(5)?,
                parts,
            ))
        })
        .optional()
        .map_err(|e| undecodable_in(conn, "events", EVENT_COLUMNS, e))?
        .ok_or_else(|| Error::corrupt(format!("history names event {seq}, which is missing")))?;
    let kind = kind?;
    let mut cache = PartCache::default();
    let text = stored_text(conn, seq, text, parts, &mut cache)?;
    Ok((
        kind.kind,
        text.map(|t| event_row::whole_payload(t, kind.bare)),
        reference,
    ))
}

/// The columns an events row is read with: the six of every schema version by name, then
/// all of them, so that `payload_parts` (schema version 3) is found by name when the
/// file has it (see [`AddedColumn`]), whatever version the file had when prepared.
const EVENT_COLUMNS: &str = "seq, event_id, kind, optional, payload, payload_ref, *";

/// Where a column that later schema versions added (`payload_parts` from version 3,
/// `payload_check` from version 7) is among the columns of one run of a statement read
/// with [`EVENT_COLUMNS`]: looked up by name on its first row (a statement is re-prepared,
/// e.g. after a writer upgraded the file, only when a run starts, so the columns stay put
/// for the rest of the run).
struct AddedColumn {
    name: &'static str,
    at: Option<Option<usize>>,
}

impl AddedColumn {
    /// `payload_parts`.
    const fn parts() -> AddedColumn {
        AddedColumn {
            name: "payload_parts",
            at: None,
        }
    }

    /// `payload_check`.
    const fn check() -> AddedColumn {
        AddedColumn {
            name: "payload_check",
            at: None,
        }
    }

    /// The column's value in `r` (`None` when the file has no such column).
    fn get<T: rusqlite::types::FromSql>(&mut self, r: &Row<'_>) -> rusqlite::Result<Option<T>> {
        let name = self.name;
        let at = *self
            .at
            .get_or_insert_with(|| r.as_ref().column_index(name).ok());
        at.map_or(Ok(None), |i| r.get(i))
    }
}

/// Where a statement's row holds the columns of an event row that its check covers
/// (`payload_parts` is read by the caller: its place varies with the file's schema).
struct CheckedAt {
    kind: usize,
    payload: usize,
    reference: usize,
}

/// The check-covered columns of an events row read with [`EVENT_COLUMNS`].
const EVENT_CHECKED_AT: CheckedAt = CheckedAt {
    kind: 2,
    payload: 4,
    reference: 5,
};

/// The check-covered columns of a row of [`read_history_texts`]'s statement (its check at
/// 7, its `payload_parts` at 4).
const HISTORY_TEXT_CHECKED_AT: CheckedAt = CheckedAt {
    kind: 5,
    payload: 3,
    reference: 6,
};

/// The event row of `seq` in `r` (its columns `at`, `parts` its `payload_parts`)
/// verified against its stored check `stored` ([`row_check`]; `None`: not checked).
///
/// # Errors
/// [`Error::Corrupt`] naming the event when the row does not match its check;
/// `rusqlite`'s error when a column cannot be read.
fn verify_row(
    seq: u64,
    r: &Row<'_>,
    at: &CheckedAt,
    parts: Option<&str>,
    stored: Option<i64>,
) -> rusqlite::Result<Result<()>> {
    if stored.is_none() {
        return Ok(Ok(()));
    }
    let columns = EventColumns {
        kind: Stored::of(r.get_ref(at.kind)?),
        payload: Stored::of(r.get_ref(at.payload)?),
        reference: Stored::of(r.get_ref(at.reference)?),
        parts: Stored::text(parts),
    };
    Ok(row_check::verify(seq, stored, columns))
}

/// [`verify_row`] on an events row read with [`EVENT_COLUMNS`], its check found by
/// `check`.
fn check_event_row(
    seq: u64,
    r: &Row<'_>,
    parts: Option<&str>,
    check: &mut AddedColumn,
) -> rusqlite::Result<Result<()>> {
    verify_row(seq, r, &EVENT_CHECKED_AT, parts, check.get(r)?)
}

/// Content part bytes already read, by digest.
type PartCache = rustc_hash::FxHashMap<String, Arc<[u8]>>;

/// Stored payload `text` (of the event or blob `what` names) as one JSON value.
///
/// # Errors
/// [`Error::Corrupt`] naming `what` when it is not one JSON value, the parse error its
/// source.
fn stored_json(what: String, text: String) -> Result<Box<RawValue>> {
    RawValue::from_string(text)
        .map_err(|e| Error::corrupt_from(format!("{what}: payload is not JSON"), e))
}

/// An event's inline payload text with its content parts (if any) spliced back, each
/// part read once per `cache`.
///
/// # Errors
/// [`Error::Corrupt`] naming the event for parts without an inline payload, a bad offset
/// or placeholder, a missing or damaged blob.
fn stored_text(
    conn: &Connection,
    seq: u64,
    text: Option<String>,
    parts: Option<String>,
    cache: &mut PartCache,
) -> Result<Option<String>> {
    let (text, parts) = match (text, parts) {
        (text, None) => return Ok(text),
        (None, Some(_)) => {
            return Err(Error::corrupt(format!(
                "event {seq} has content parts but no inline payload"
            )));
        }
        (Some(text), Some(parts)) => (text, parts),
    };
    content::reassemble(seq, &text, &parts, |digest| {
        if let Some(raw) = cache.get(digest) {
            return Ok(Some(Arc::clone(raw)));
        }
        let Some(raw) = read_blob(conn, digest, blob::Holds::Part)
            .map_err(|e| e.corrupt_in(|| format!("event {seq}")))?
        else {
            return Ok(None);
        };
        let raw: Arc<[u8]> = raw.into();
        cache.insert(digest.to_owned(), Arc::clone(&raw));
        Ok(Some(raw))
    })
    .map(Some)
}

/// Whether the file's events have the `payload_parts` column (schema version 3 on).
pub(crate) fn has_content_parts(conn: &Connection) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM pragma_table_info('events') WHERE name = 'payload_parts'")?
        .exists([])?)
}

/// The payload text of event `seq`, read from its blob when it is stored as one.
pub(crate) fn read_payload_text(conn: &Connection, seq: u64) -> Result<String> {
    let (_, text, reference) = read_event_payload(conn, seq)?;
    payload_text(conn, seq, text, reference)
}

/// The JSON text of the payload of event `seq` read by [`read_event_payload`]: `text`, or
/// the blob `reference` names.
pub(crate) fn payload_text(
    conn: &Connection,
    seq: u64,
    text: Option<String>,
    reference: Option<String>,
) -> Result<String> {
    match (text, reference) {
        (Some(text), None) => Ok(text),
        (_, Some(digest)) => {
            let raw = read_blob(conn, &digest, blob::Holds::Any)?
                .ok_or_else(|| Error::corrupt(format!("missing blob {digest}")))?;
            String::from_utf8(raw)
                .map_err(|e| Error::corrupt_from(format!("blob {digest} is not UTF-8"), e))
        }
        (None, None) => Err(Error::corrupt(format!("event {seq} has no payload"))),
    }
}

/// The creation time (ms) of the commit holding event `seq` in this file.
pub(crate) fn commit_time(conn: &Connection, seq: u64) -> Result<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT created_at FROM commits WHERE first_seq <= ?1 ORDER BY first_seq DESC LIMIT 1",
        )?
        .query_row([seq], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// The latest time of any commit in this file (0 for none): above the last commit's when
/// a writer's clock went back between them.
pub(crate) fn newest_commit_time(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT coalesce(max(created_at), 0) FROM commits")?
        .query_row([], |r| r.get(0))?)
}

/// Sequences of this file's events of `kind` in `(after, through]`, in order.
pub(crate) fn events_of_kind(
    conn: &Connection,
    kind: &str,
    after: u64,
    through: u64,
    folded_only: bool,
) -> Result<Vec<u64>> {
    // Rows of both forms: the kind's text (rows before schema 5, and forms a code does
    // not take) and its code.
    let code = event_row::code_for_query(kind).unwrap_or(ToSqlOutput::Owned(Value::Null));
    Ok(conn
        .prepare_cached(
            "SELECT seq FROM events WHERE kind IN (?1, ?4) AND seq > ?2 AND seq <= ?3
             AND NOT (?5 AND optional) ORDER BY seq",
        )?
        .query_map(
            params![kind, after, through.min(i64::MAX as u64), code, folded_only],
            |r| r.get(0),
        )?
        .collect::<rusqlite::Result<Vec<u64>>>()?)
}

/// The payload item of the history row that event `seq` wrote at `position` in this
/// file, when that row is still the current one there (or, unless `current`, whatever
/// came after it: forks cut before may still show it): `Some(None)` for a message event,
/// `Some(Some(i))` for item `i` of a replacement; `None` when there is no such row or
/// (with `current`) a newer row or a transcript reset of this file came after it.
pub(crate) fn current_history_item(
    conn: &Connection,
    position: u64,
    seq: u64,
    current: bool,
) -> Result<Option<Option<u64>>> {
    let item: Option<Option<u64>> = conn
        .prepare_cached(
            "SELECT item FROM history h WHERE position = ?1 AND event_seq = ?2
               AND (NOT ?3 OR (
                   NOT EXISTS (SELECT 1 FROM history n WHERE n.position = ?1 AND n.event_seq > ?2)
                   AND NOT EXISTS (SELECT 1 FROM history_resets WHERE seq > ?2)))",
        )?
        .query_row(params![position, seq, current], |r| r.get(0))
        .optional()?;
    Ok(item)
}

/// Whether one of this file's commits ends at `seq`.
pub(crate) fn commit_ends_at(conn: &Connection, seq: u64) -> Result<bool> {
    // No stored sequence is past SQLite's integers (binding one failed the read).
    let Ok(seq) = i64::try_from(seq) else {
        return Ok(false);
    };
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM (SELECT last_seq FROM commits WHERE first_seq <= ?1
                            ORDER BY first_seq DESC LIMIT 1) WHERE last_seq = ?1",
        )?
        .exists([seq])?)
}

/// The last sequence of the commits stored in this file, if any.
pub(crate) fn last_own_seq(conn: &Connection) -> Result<Option<u64>> {
    Ok(conn
        .prepare_cached("SELECT last_seq FROM commits ORDER BY first_seq DESC LIMIT 1")?
        .query_row([], |r| r.get(0))
        .optional()?)
}

/// The lease row as an owner record.
pub(crate) fn read_lease(conn: &Connection) -> Result<WriterOwner> {
    const COLUMNS: &str = "owner_id, host_id, pid, generation, acquired_at";
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM lease WHERE singleton = 1"),
        [],
        |r| {
            Ok(WriterOwner {
                owner_id: r.get(0)?,
                host: r.get(1)?,
                pid: r.get(2)?,
                generation: r.get(3)?,
                since_ms: r.get(4)?,
                holding_for: None,
            })
        },
    )
    .optional()
    .map_err(|e| undecodable_in(conn, "lease", COLUMNS, e))?
    .ok_or_else(|| Error::corrupt("lease row is missing"))
}

/// A column that holds hex text in one of its stored forms: TEXT as it is, a BLOB of
/// `lengths` bytes as lowercase hex; `None` for NULL.
fn hex_column(r: &Row<'_>, i: usize, lengths: &[usize]) -> rusqlite::Result<Option<String>> {
    match r.get_ref(i)? {
        ValueRef::Null => Ok(None),
        ValueRef::Blob(b) if lengths.contains(&b.len()) => Ok(Some(lower_hex(b))),
        ValueRef::Blob(b) => Err(undecodable(
            i,
            Type::Blob,
            format!(
                "holds a {}-byte value, not a digest or id of {lengths:?} bytes",
                b.len()
            ),
        )),
        _ => r.get(i),
    }
}

/// The error for a stored value that cannot be what its column holds.
fn undecodable(i: usize, kind: Type, why: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(i, kind, why.into())
}

/// A commit row of any schema version: version 3 stores ids and digests as BLOBs, leaves
/// a derived commit id out (it is the hex of the 16-byte row hash) and a derived turn id
/// empty; versions 1 and 2 store hex text (version 1 without a row hash). The row hash is
/// checked in the form the row has.
fn commit_row(r: &Row<'_>) -> rusqlite::Result<(Commit, u64)> {
    let first_seq: u64 = r.get(0)?;
    let last: u64 = r.get(1)?;
    let stored_id = hex_column(r, 2, &[16])?;
    let operation_id: String = r.get(3)?;
    let operation_hash = hex_column(r, 4, &[32])?.ok_or_else(|| {
        undecodable(
            4,
            Type::Null,
            format!("is empty in the commit at {first_seq}"),
        )
    })?;
    let turn_id = r.get::<_, Option<String>>(5)?.map(|t| {
        if t.is_empty() {
            derived_turn_id(&operation_id)
        } else {
            t
        }
    });
    let row_hash = r.get_ref(8)?;
    let mut commit = Commit {
        first_seq,
        commit_id: String::new(),
        operation_id,
        operation_hash,
        turn_id,
        writer_generation: r.get(6)?,
        created_at_ms: r.get(7)?,
        events: Vec::new(),
    };
    let intact = match (stored_id, row_hash) {
        // Schema 3: the 16-byte digest of the row; with no stored id, the id itself.
        (stored, ValueRef::Blob(digest)) if digest.len() == 16 => {
            let intact = commit_row_digest(&commit, last, stored.as_deref())[..] == *digest;
            commit.commit_id = stored.unwrap_or_else(|| lower_hex(digest));
            intact
        }
        (None, _) => {
            return Err(undecodable(
                2,
                Type::Null,
                format!("is empty in the commit at {first_seq}, as is its row_hash"),
            ));
        }
        // Schema 1: no row hash.
        (Some(id), ValueRef::Null) => {
            commit.commit_id = id;
            true
        }
        // Schema 2, as written (TEXT) or converted by migration 0003 (32 bytes).
        (Some(id), _) => {
            commit.commit_id = id;
            let stored = hex_column(r, 8, &[32])?;
            stored.is_some_and(|h| h == commit_row_hash(&commit, last))
        }
    };
    if !intact {
        return Err(undecodable(
            8,
            Type::Blob,
            format!("does not match the commit at {first_seq} (the row was changed)"),
        ));
    }
    Ok((commit, last))
}

const COMMIT_COLUMNS: &str = "first_seq, last_seq, commit_id, operation_id, operation_hash, turn_id, writer_generation, created_at, row_hash";

/// The first sequence and operation key (`model::event::operation_key`) of at most
/// `limit` commits of this file (schema 3) after `after_seq`, in order: one page of a
/// keyset walk, so that no read transaction lasts the whole table.
pub(crate) fn operation_keys_after(
    conn: &Connection,
    after_seq: u64,
    limit: usize,
) -> Result<Vec<(u64, i64)>> {
    let mut select = conn.prepare_cached(
        "SELECT first_seq, operation_key FROM commits WHERE first_seq > ?1
         ORDER BY first_seq LIMIT ?2",
    )?;
    let rows = select.query_map(params![after_seq, limit as i64], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// The commit with this operation id, with its events: the first sequences of its
/// operation key come from the key chunks and the commits after them ([`ChunkCache`]),
/// and each such commit is read by sequence and its text compared. The file is of the
/// current schema: the only caller is a live writer's cold lookup in its own file, which
/// the writer's open upgraded.
pub(crate) fn lookup_operation(
    conn: &Connection,
    operation_id: &str,
    chunks: &mut ChunkCache,
) -> Result<Option<Commit>> {
    let mut by_seq = conn.prepare_cached(&format!(
        "SELECT {COMMIT_COLUMNS} FROM commits WHERE first_seq = ?1 AND operation_id = ?2"
    ))?;
    let mut found = Vec::new();
    for seq in chunks.candidates(conn, operation_key(operation_id))? {
        let row = by_seq
            .query_row(params![seq, operation_id], commit_row)
            .optional()
            .map_err(|e| undecodable_in(conn, "commits", COMMIT_COLUMNS, e))?;
        found.extend(row);
    }
    if found.len() > 1 {
        return Err(Error::corrupt(format!(
            "operation id {} is recorded by two commits",
            crate::error::quoted(operation_id)
        )));
    }
    let Some((commit, last)) = found.pop() else {
        return Ok(None);
    };
    let mut commits = vec![(commit, last)];
    // One commit: read whole, whatever its size.
    let mut unbounded = u64::MAX;
    attach_events(conn, &mut commits, &mut unbounded)?;
    Ok(commits.pop().map(|(c, _)| c))
}

/// Whole commits with `last_seq` in `(after, through]`, at most `limit`, with events.
/// `budget` is the payload bytes the page may still take: the page is cut at the first
/// commit boundary once it is spent (a first commit is always read whole), and what the
/// page took is subtracted. A row in the range whose `last_seq` is not an integer (a
/// damaged record) is read, and so refused as undecodable: compared as stored, such a
/// value fails `last_seq <= ?2`, which dropped the log's last commit without an error.
pub(crate) fn read_commits(
    conn: &Connection,
    after: u64,
    through: u64,
    limit: usize,
    budget: &mut u64,
) -> Result<Vec<Commit>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COMMIT_COLUMNS} FROM commits
         WHERE first_seq >= coalesce((SELECT max(first_seq) FROM commits WHERE first_seq <= ?1 + 1), 0)
           AND first_seq <= ?2
           AND (typeof(last_seq) <> 'integer' OR (last_seq > ?1 AND last_seq <= ?2))
         ORDER BY first_seq LIMIT ?3"
    ))?;
    let mut commits = stmt
        .query_map(
            params![
                after.min(i64::MAX as u64),
                through.min(i64::MAX as u64),
                limit as i64
            ],
            commit_row,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| undecodable_in(conn, "commits", COMMIT_COLUMNS, e))?;
    attach_events(conn, &mut commits, budget)?;
    Ok(commits.into_iter().map(|(c, _)| c).collect())
}

/// Loads the events of `commits` (contiguous, ascending) and checks each commit is whole.
/// Stops at the first commit boundary after `budget` payload bytes (dropping the commits
/// not reached) and subtracts the bytes it loaded. A blob referenced several times (a
/// whole payload or a content part) is read, decompressed and verified once per call.
fn attach_events(
    conn: &Connection,
    commits: &mut Vec<(Commit, u64)>,
    budget: &mut u64,
) -> Result<()> {
    let (Some(first), Some(last)) = (commits.first(), commits.last()) else {
        return Ok(());
    };
    let (from, to) = (first.0.first_seq, last.1);
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {EVENT_COLUMNS} FROM events WHERE seq >= ?1 AND seq <= ?2 ORDER BY seq"
    ))?;
    let mut rows = stmt.query(params![from, to])?;
    let mut index = 0usize;
    // Where the page holds each whole-payload blob it read: (commit, event, bytes). A later
    // event naming it copies that event's payload; the blob is not decoded again. (A cache
    // of its own held a second copy of every blob: 600 MB of a 300 MB one.)
    let mut blobs: rustc_hash::FxHashMap<String, (usize, usize, u64)> = Default::default();
    let mut parts = PartCache::default();
    let (mut parts_column, mut check_column) = (AddedColumn::parts(), AddedColumn::check());
    let bad = |e| undecodable_in(conn, "events", EVENT_COLUMNS, e);
    while let Some(r) = rows.next()? {
        let seq: u64 = r.get(0).map_err(bad)?;
        while index < commits.len() && commits[index].1 < seq {
            index += 1;
        }
        if index > 0 && *budget == 0 && commits.get(index).is_some_and(|c| c.0.first_seq == seq) {
            commits.truncate(index);
            break;
        }
        let Some((first_seq, last)) = commits.get(index).map(|(c, last)| (c.first_seq, *last))
        else {
            break;
        };
        if seq < first_seq || seq > last {
            continue; // an event of a commit outside the page
        }
        let parts_text: Option<String> = parts_column.get(r).map_err(bad)?;
        check_event_row(seq, r, parts_text.as_deref(), &mut check_column).map_err(bad)??;
        let kind = event_row::decode_kind(seq, r.get_ref(2).map_err(bad)?)?;
        let text = r.get(4).map_err(bad)?;
        let payload_text = stored_text(conn, seq, text, parts_text, &mut parts)?
            .map(|text| event_row::whole_payload(text, kind.bare));
        let payload_ref: Option<String> = r.get(5).map_err(bad)?;
        let (payload, content_ref) = match (payload_text, payload_ref) {
            (Some(text), None) => (Some(stored_json(format!("event {seq}"), text)?), None),
            (None, Some(digest)) => {
                let earlier = blobs.get(&digest).and_then(|&(c, e, bytes)| {
                    let payload = commits.get(c)?.0.events.get(e)?.payload.clone()?;
                    Some((payload, bytes))
                });
                let (payload, bytes) = match earlier {
                    Some(found) => found,
                    None => {
                        let raw = read_blob(conn, &digest, blob::Holds::Any)?.ok_or_else(|| {
                            Error::corrupt(format!("event {seq} references missing blob {digest}"))
                        })?;
                        let bytes = raw.len() as u64;
                        let text = String::from_utf8(raw).map_err(|e| {
                            Error::corrupt_from(format!("blob {digest} is not UTF-8"), e)
                        })?;
                        let payload = stored_json(format!("blob {digest}"), text)?;
                        let at = commits.get(index).map_or(0, |c| c.0.events.len());
                        blobs.insert(digest.clone(), (index, at, bytes));
                        (payload, bytes)
                    }
                };
                (
                    Some(payload),
                    Some(ContentRef {
                        digest,
                        bytes,
                        media_type: JSON_MEDIA_TYPE.to_owned(),
                    }),
                )
            }
            (None, None) => (None, None),
            (Some(_), Some(_)) => {
                return Err(Error::corrupt(format!(
                    "event {seq} has payload and payload_ref"
                )));
            }
        };
        let taken = payload.as_deref().map_or(0, |p| p.get().len() as u64);
        *budget = budget.saturating_sub(taken);
        let Some((commit, _)) = commits.get_mut(index) else {
            break;
        };
        let id = match r.get::<_, Option<String>>(1).map_err(bad)? {
            Some(id) => id,
            None => derived_event_id(&commit.commit_id, (seq - commit.first_seq) as usize),
        };
        commit.events.push(Event {
            id,
            seq,
            kind: kind.kind.into_owned(),
            optional: r.get(3).map_err(bad)?,
            payload,
            content_ref,
        });
    }
    for (commit, last) in commits.iter() {
        let expected = last.checked_sub(commit.first_seq).map(|d| d + 1);
        let contiguous = commit
            .events
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == commit.first_seq + i as u64);
        if expected != Some(commit.events.len() as u64) || !contiguous {
            return Err(Error::corrupt(format!(
                "commit {}..={} has {} events",
                commit.first_seq,
                last,
                commit.events.len()
            )));
        }
    }
    Ok(())
}

/// The raw bytes of a blob, verified against its digest.
pub(crate) fn read_blob(
    conn: &Connection,
    digest: &str,
    holds: blob::Holds,
) -> Result<Option<Vec<u8>>> {
    let row = conn
        .prepare_cached("SELECT bytes, encoding, data FROM blobs WHERE digest = ?1")?
        .query_row([digest], |r| {
            Ok((
                r.get::<_, u64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Vec<u8>>(2)?,
            ))
        })
        .optional()?;
    row.map(|(bytes, encoding, data)| blob::decode(digest, bytes, &encoding, data, holds))
        .transpose()
        .map_err(|e| e.corrupt_in(|| file_session(conn)))
}

/// The session whose file `conn` reads, for an error: "session ID" from its header, or
/// "file PATH" when the header cannot be read.
fn file_session(conn: &Connection) -> String {
    match read_header(conn) {
        Ok(header) => format!("session {}", header.session_id),
        Err(_) => file_name(conn),
    }
}

/// "file PATH" of the file `conn` reads, for an error.
fn file_name(conn: &Connection) -> String {
    format!("file {}", conn.path().unwrap_or("(in memory)"))
}

/// `PRAGMA integrity_check` and `foreign_key_check` on an untrusted file, and (schema
/// version 3 on) that every content part placeholder names a stored blob.
pub(crate) fn check_integrity(file: &Path, access: Access) -> Result<()> {
    let conn = schema::open_reader_with(file, access)?;
    let verdict: String = conn.query_row("PRAGMA integrity_check(1)", [], |r| r.get(0))?;
    if verdict != "ok" {
        return Err(Error::corrupt(format!("integrity_check: {verdict}")));
    }
    let dangling: i64 =
        conn.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })?;
    if dangling != 0 {
        return Err(Error::corrupt(format!(
            "{dangling} rows reference missing commits or blobs"
        )));
    }
    if has_content_parts(&conn)? {
        check_part_blobs(&conn)?;
    }
    check_events_in_commits(&conn)?;
    check_operation_keys(&conn)
}

/// Checks that every event row lies in the range of the commit row starting at or before
/// it: a row no commit covers (its commit deleted, one added past the last commit) is part
/// of no log, and a copy of the log would leave it out without a word.
fn check_events_in_commits(conn: &Connection) -> Result<()> {
    let orphan: Option<i64> = conn
        .query_row(
            "SELECT seq FROM events AS e
             WHERE coalesce((SELECT last_seq FROM commits WHERE first_seq <= e.seq
                             ORDER BY first_seq DESC LIMIT 1), e.seq - 1) < e.seq
             LIMIT 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
    match orphan {
        Some(seq) => Err(Error::corrupt(format!(
            "event at sequence {seq} belongs to no commit row"
        ))),
        None => Ok(()),
    }
}

/// The schema version of the file `conn` reads.
fn schema_version(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("PRAGMA user_version")?
        .query_row([], |r| r.get(0))?)
}

/// Checks that every commit row's `operation_key` is the key of its operation id (schema
/// 3; older files have none): a damaged key would hide the operation from retries.
fn check_operation_keys(conn: &Connection) -> Result<()> {
    if schema_version(conn)? < 3 {
        return Ok(());
    }
    let mut stmt = conn.prepare("SELECT first_seq, operation_id, operation_key FROM commits")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let operation_id: String = r.get(1)?;
        if r.get::<_, i64>(2)? != operation_key(&operation_id) {
            return Err(Error::corrupt(format!(
                "commit row at {} has the operation key of another operation id",
                r.get::<_, i64>(0)?
            )));
        }
    }
    Ok(())
}

/// The first event whose `payload_parts` is not a JSON array of integers, or names a
/// placeholder whose blob is missing, is corrupt, named as a read of it names it (the
/// offset that is out of bounds or holds no placeholder, or the missing blob).
fn check_part_blobs(conn: &Connection) -> Result<()> {
    // The placeholder at byte offset `o` is `"sse-blob:` and 64 hex digits: its digest is
    // bytes `o + 10 ..` of the payload, `substr(…, o + 11, 64)` (substr counts from 1).
    let bad: Option<(u64, Option<String>, String)> = conn
        .query_row(
            "WITH parts AS (
                 SELECT seq, payload, payload_parts,
                        CASE WHEN json_valid(payload_parts) THEN json_type(payload_parts) END AS form
                 FROM events WHERE payload_parts IS NOT NULL)
             SELECT p.seq, p.payload, p.payload_parts
             FROM parts p,
                  json_each(CASE WHEN p.form = 'array' THEN p.payload_parts ELSE '[\"\"]' END) j
             WHERE p.form IS NOT 'array' OR j.type IS NOT 'integer'
                OR NOT EXISTS (SELECT 1 FROM blobs b WHERE b.digest =
                               CAST(substr(CAST(p.payload AS BLOB), j.value + 11, 64) AS TEXT))
             LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((seq, payload, parts)) = bad else {
        return Ok(());
    };
    let payload = payload.unwrap_or_default();
    for offset in content::parse_offsets(seq, &parts, &payload)? {
        let digest = content::placeholder_at(seq, &payload, offset)?;
        let stored: Option<i64> = conn
            .query_row("SELECT 1 FROM blobs WHERE digest = ?1", [digest], |r| {
                r.get(0)
            })
            .optional()?;
        if stored.is_none() {
            return Err(Error::corrupt(format!(
                "event {seq} references missing content blob {digest}"
            )));
        }
    }
    Err(Error::corrupt(format!(
        "event {seq}: payload_parts names a content part that is malformed or missing"
    )))
}
