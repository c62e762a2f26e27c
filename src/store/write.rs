//! Writes to one session file: initialisation, the lease, and the drain transaction.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use rusqlite::types::{ToSqlOutput, Value};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::error::{Error, Result, WriterOwner};
use crate::model::event::{
    INLINE_PAYLOAD_LIMIT, commit_row_digest, is_derived_event_id, operation_key, sha256_hex,
};
use crate::model::header::Header;
use crate::model::ids::derived_turn_id;
use crate::model::projection::HistoryChange;
use crate::model::{Commit, TurnBoundary};
use crate::store::chunked::{ChunkSql, ChunkedInsert, opt_text, owned_text, value};
use crate::store::operation_keys::ChunkMark;
use crate::store::row_check::{self, EventColumns, Stored};
use crate::store::{blob, content, event_row};

/// An accepted commit on its way to disk, with the turns it closes.
#[derive(Debug)]
pub(crate) struct Accepted {
    pub commit: Arc<Commit>,
    pub closed_turns: Vec<TurnBoundary>,
    /// Transcript changes for the history index.
    pub history: Vec<HistoryChange>,
    /// Bytes charged against the queue budget.
    pub charge: usize,
}

/// Writes the header row and an empty lease into a freshly created file.
pub(crate) fn init_file(conn: &mut Connection, header: &Header) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute(
        "INSERT INTO header (singleton, session_id, codec, created_at, cwd, parent_id, origin, provenance,
                             inherited_events)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            header.session_id.as_str(),
            header.codec,
            header.created_at_ms,
            header.cwd,
            header.parent_id.as_ref().map(|p| p.as_str()),
            header.origin.as_str(),
            header.provenance.as_ref().map(|v| v.to_string()),
            header.inherited_events,
        ],
    )?;
    tx.execute(
        "INSERT INTO lease (singleton, owner_id, host_id, pid, generation, acquired_at)
         VALUES (1, '', '', 0, 0, 0)",
        [],
    )?;
    tx.commit()?;
    Ok(())
}

/// Runs `body` in one `BEGIN IMMEDIATE` transaction on `conn`, committed when it succeeds
/// (rolled back otherwise).
pub(crate) fn in_transaction<T>(
    conn: &mut Connection,
    body: impl FnOnce(&Transaction<'_>) -> Result<T>,
) -> Result<T> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let out = body(&tx)?;
    tx.commit()?;
    Ok(out)
}

/// Bumps the lease generation and records `owner` (the caller holds the writer lock).
/// Returns the new generation.
pub(crate) fn take_lease(conn: &mut Connection, owner: &WriterOwner) -> Result<u64> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let generation: Option<i64> = tx
        .query_row(
            "SELECT generation FROM lease WHERE singleton = 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let next = u64::try_from(generation.ok_or_else(|| Error::corrupt("lease row is missing"))?)
        .map_err(|_| Error::corrupt("negative lease generation"))?
        + 1;
    tx.execute(
        "UPDATE lease SET owner_id = ?1, host_id = ?2, pid = ?3, generation = ?4, acquired_at = ?5
         WHERE singleton = 1",
        params![
            owner.owner_id,
            owner.host,
            owner.pid,
            next as i64,
            owner.since_ms
        ],
    )?;
    tx.commit()?;
    Ok(next)
}

/// The drain: writes accepted commits in one `BEGIN IMMEDIATE` transaction, after
/// checking that the lease is still at `generation` (fencing); string values longer than
/// `inline_threshold` bytes become content parts.
///
/// `chunks` is where the file's operation-key chunks end; the mark to keep after the
/// drain is returned (a chunk is written once enough commits are after it).
pub(crate) fn write_commits(
    conn: &mut Connection,
    generation: u64,
    batch: &[Arc<Accepted>],
    inline_threshold: usize,
    chunks: ChunkMark,
) -> Result<ChunkMark> {
    let tx = DrainTransaction::begin(conn)?;
    let current: u64 = tx
        .conn
        .prepare_cached("SELECT generation FROM lease WHERE singleton = 1")?
        .query_row([], |r| r.get(0))?;
    if current != generation {
        return Err(Error::StaleGeneration {
            ours: generation,
            current,
        });
    }
    insert_commits(tx.conn, batch, inline_threshold)?;
    let chunks = match batch.last() {
        Some(last) => chunks.after_drain(tx.conn, batch.len(), last.commit.last_seq())?,
        None => chunks,
    };
    tx.commit()?;
    Ok(chunks)
}

/// The drain's `BEGIN IMMEDIATE` transaction, begun and committed by cached statements
/// (`rusqlite::Transaction` parses `BEGIN IMMEDIATE` and `COMMIT` again on every drain:
/// about 2,000 instructions of a one-event drain's 80,000 under callgrind). Rolled back
/// when dropped uncommitted, also after a failed `COMMIT`.
struct DrainTransaction<'c> {
    conn: &'c Connection,
    committed: bool,
}

impl<'c> DrainTransaction<'c> {
    fn begin(conn: &'c Connection) -> Result<DrainTransaction<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(DrainTransaction {
            conn,
            committed: false,
        })
    }

    fn commit(mut self) -> Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for DrainTransaction<'_> {
    fn drop(&mut self) {
        if !self.committed && !self.conn.is_autocommit() {
            // As `rusqlite::Transaction` does: a failed rollback leaves the connection to
            // SQLite's own recovery (the caller reports the drain's error).
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// The drain's multi-row inserts of event rows and of history rows.
static EVENT_ROWS: LazyLock<ChunkSql> = LazyLock::new(|| {
    ChunkSql::new(
        "INSERT INTO events (seq, event_id, kind, optional, payload, payload_ref, payload_parts,
                             payload_check)
         VALUES ",
        8,
    )
});
static HISTORY_ROWS: LazyLock<ChunkSql> = LazyLock::new(|| {
    ChunkSql::new(
        "INSERT OR REPLACE INTO history (position, event_seq, item, message_id, role, bytes)
         VALUES ",
        6,
    )
});

/// Builds the drain's statements now, for a `fork()` (`persistence::fork_hold`): a child
/// made while another thread built one would wait for that build for ever.
pub(crate) fn build_for_fork() {
    LazyLock::force(&EVENT_ROWS);
    LazyLock::force(&HISTORY_ROWS);
}

/// Inserts commits, their events, the blobs of large payloads and of long string values
/// (once per digest, see [`content`]) and the turns they close, inside the caller's
/// transaction. String values longer than `inline_threshold` bytes become content parts.
pub(crate) fn insert_commits(
    tx: &Connection,
    batch: &[Arc<Accepted>],
    inline_threshold: usize,
) -> Result<()> {
    let mut insert_commit = tx.prepare_cached(
        "INSERT INTO commits (first_seq, last_seq, commit_id, operation_id, operation_key,
                              operation_hash, turn_id, writer_generation, created_at, row_hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    let mut events = ChunkedInsert::new(&EVENT_ROWS);
    let mut history = HistoryWriter::new();
    for accepted in batch {
        let c = &accepted.commit;
        let row = CompactCommit::of(c);
        insert_commit.execute(params![
            c.first_seq,
            c.last_seq(),
            row.commit_id,
            c.operation_id,
            operation_key(&c.operation_id),
            stored_hex(&c.operation_hash),
            row.turn_id,
            c.writer_generation,
            c.created_at_ms,
            row.row_hash,
        ])?;
        for (i, e) in c.events.iter().enumerate() {
            let own_id = (!is_derived_event_id(&e.id, &c.commit_id, i)).then_some(e.id.as_str());
            let (kind, payload) = event_row::encode(&e.kind, e.payload_str());
            let (inline, reference, parts) = match payload {
                Some(text) if text.len() > INLINE_PAYLOAD_LIMIT => {
                    let digest = sha256_hex(text.as_bytes());
                    put_blob(tx, &digest, text.as_bytes())?;
                    (None, Some(digest), None)
                }
                Some(text) => match content::externalise(text, inline_threshold) {
                    Some(ext) => {
                        for (digest, raw) in &ext.parts {
                            put_blob(tx, digest, raw.as_bytes())?;
                        }
                        let offsets = serde_json::to_string(&ext.offsets)
                            .map_err(|e| Error::internal_from("content offsets to JSON", e))?;
                        (Some(Cow::Owned(ext.text)), None, Some(offsets))
                    }
                    None => (Some(Cow::Borrowed(text)), None, None),
                },
                None => (None, None, None),
            };
            let check = row_check::row_check(
                e.seq,
                EventColumns {
                    kind: Stored::bound(&kind),
                    payload: Stored::text(inline.as_deref()),
                    reference: Stored::text(reference.as_deref()),
                    parts: Stored::text(parts.as_deref()),
                },
            );
            let inline = match inline {
                Some(Cow::Borrowed(text)) => value(text)?,
                owned => owned_text(owned.map(Cow::into_owned)),
            };
            events.push(
                tx,
                [
                    value(&e.seq)?,
                    opt_text(own_id),
                    kind,
                    value(&e.optional)?,
                    inline,
                    owned_text(reference),
                    owned_text(parts),
                    ToSqlOutput::Owned(Value::Integer(check)),
                ],
            )?;
        }
        insert_turns(tx, &accepted.closed_turns)?;
        history.add(tx, &accepted.history)?;
    }
    events.finish(tx)?;
    history.finish(tx)
}

/// Stores `raw` under `digest` (its SHA-256) unless the file already holds it. Its
/// statements are looked up in the cache only when a drain has a blob to store (a lookup
/// hashes the statement's text: most drains have none).
fn put_blob(tx: &Connection, digest: &str, raw: &[u8]) -> Result<()> {
    if !tx
        .prepare_cached("SELECT 1 FROM blobs WHERE digest = ?1")?
        .exists([digest])?
    {
        let (encoding, data) = blob::encode(raw);
        tx.prepare_cached(
            "INSERT INTO blobs (digest, bytes, encoding, data) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![digest, raw.len() as u64, encoding, data])?;
    }
    Ok(())
}

/// The stored form of a hex text: a BLOB of its bytes when it is lowercase hex of even
/// length (digests, our ids), else the text itself (an id of another form).
fn stored_hex(text: &str) -> Value {
    // Lowercase only, so the bytes read back as the very same text; an odd length does
    // not fill `bytes` exactly, which `decode_to_slice` refuses.
    let lowercase =
        !text.is_empty() && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if lowercase {
        let mut bytes = vec![0u8; text.len() / 2];
        if hex::decode_to_slice(text, &mut bytes).is_ok() {
            return Value::Blob(bytes);
        }
    }
    Value::Text(text.to_owned())
}

/// The columns of a commit row that schema version 3 stores compactly.
struct CompactCommit {
    /// `None` when the commit id is derived (the hex of the row hash).
    commit_id: Option<Value>,
    /// `Some("")` when the turn id is the one derived from the operation id.
    turn_id: Option<String>,
    /// 16 bytes ([`commit_row_digest`]).
    row_hash: Vec<u8>,
}

impl CompactCommit {
    fn of(c: &Commit) -> CompactCommit {
        let derived = commit_row_digest(c, c.last_seq(), None);
        let (commit_id, row_hash) = if is_hex_of(&c.commit_id, &derived) {
            (None, derived)
        } else {
            let own = commit_row_digest(c, c.last_seq(), Some(&c.commit_id));
            (Some(stored_hex(&c.commit_id)), own)
        };
        let turn_id = c
            .turn_id
            .as_ref()
            .map(|t| compact_turn_id(&c.operation_id, t.clone()));
        CompactCommit {
            commit_id,
            turn_id,
            row_hash: row_hash.to_vec(),
        }
    }
}

/// Whether `text` is `bytes` in lowercase hex (no `String` made to compare).
fn is_hex_of(text: &str, bytes: &[u8; 16]) -> bool {
    let mut hex = [0u8; 32];
    hex::encode_to_slice(bytes, &mut hex).is_ok() && text.as_bytes() == hex
}

/// The stored form of a turn id: `''` when it is the one derived from the operation id
/// (a turn id is never empty: `Batch` drops a blank one).
fn compact_turn_id(operation_id: &str, turn_id: String) -> String {
    if turn_id == derived_turn_id(operation_id) {
        String::new()
    } else {
        turn_id
    }
}

/// The part of migration 0003 that SQL cannot do: fills `operation_key` of the converted
/// commit rows and stores their derived turn ids as `''`. Every value a reader returns
/// stays the same (row hashes of converted rows cover the turn id as read).
pub(crate) fn compact_converted_commits(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    let rows: Vec<(i64, String, Option<String>)> = tx
        .prepare("SELECT first_seq, operation_id, turn_id FROM commits")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut update =
        tx.prepare("UPDATE commits SET operation_key = ?2, turn_id = ?3 WHERE first_seq = ?1")?;
    for (first_seq, operation_id, turn_id) in rows {
        let turn_id = turn_id.map(|t| compact_turn_id(&operation_id, t));
        update.execute(params![first_seq, operation_key(&operation_id), turn_id])?;
    }
    Ok(())
}

/// Replaces the projection checkpoint with `projection` (its text and transcript index,
/// `store::checkpoint`) and the live session's operation filter (`filter`, if it has a
/// complete one) as of `through_seq`, in one transaction. The transcript index (20 bytes
/// per message) is written through SQLite's incremental blob I/O into a `zeroblob` of its
/// size, so SQLite never holds a copy of it whole (bound as a value, it held two: 4 MB at
/// the close of a 100,000-message session, the writer's peak).
pub(crate) fn store_checkpoint(
    conn: &Connection,
    through_seq: u64,
    projection: &str,
    message_ids: &[u8],
    filter: Option<&[u8]>,
) -> Result<()> {
    let tx = conn.unchecked_transaction()?;
    tx.prepare_cached(
        "INSERT OR REPLACE INTO checkpoint
             (singleton, through_seq, projection, digest, message_ids, operation_filter)
         VALUES (1, ?1, ?2, ?3, zeroblob(?4), ?5)",
    )?
    .execute(params![
        through_seq,
        projection,
        crate::store::checkpoint::digest(through_seq, projection, message_ids),
        message_ids.len() as u64,
        filter.map(|f| crate::store::checkpoint::sealed_filter(through_seq, f))
    ])?;
    // The row is the singleton: its rowid is 1.
    tx.blob_open(rusqlite::MAIN_DB, "checkpoint", "message_ids", 1, false)?
        .write_at(message_ids, 0)?;
    tx.commit()?;
    Ok(())
}

/// Transcript changes on their way into the history index: resets at once, rows in
/// chunks ([`ChunkedInsert`]).
struct HistoryWriter<'a> {
    rows: ChunkedInsert<'a>,
}

impl<'a> HistoryWriter<'a> {
    fn new() -> HistoryWriter<'a> {
        HistoryWriter {
            rows: ChunkedInsert::new(&HISTORY_ROWS),
        }
    }

    /// Adds `changes` (in order: a row replaced later in the same drain is replaced in it).
    fn add(&mut self, tx: &Connection, changes: &'a [HistoryChange]) -> Result<()> {
        for change in changes {
            match change {
                HistoryChange::Reset { seq } => {
                    tx.prepare_cached("INSERT OR IGNORE INTO history_resets (seq) VALUES (?1)")?
                        .execute([seq])?;
                }
                HistoryChange::Put {
                    seq,
                    position,
                    item,
                    message,
                } => self.rows.push(
                    tx,
                    [
                        value(position)?,
                        value(seq)?,
                        value(item)?,
                        value(message.id())?,
                        opt_text(message.role()),
                        ToSqlOutput::from(message.json().len() as i64),
                    ],
                )?,
            }
        }
        Ok(())
    }

    fn finish(self, tx: &Connection) -> Result<()> {
        self.rows.finish(tx)
    }
}

/// Copies the history index rows of events in `(after, through]` from another file.
pub(crate) fn copy_history(
    tx: &Transaction<'_>,
    source: &Connection,
    after: u64,
    through: u64,
) -> Result<()> {
    let mut select = source.prepare(
        "SELECT position, event_seq, item, message_id, role, bytes FROM history
         WHERE event_seq > ?1 AND event_seq <= ?2",
    )?;
    let mut put = tx.prepare_cached(
        "INSERT OR REPLACE INTO history (position, event_seq, item, message_id, role, bytes)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut rows = select.query(params![after, through])?;
    while let Some(r) = rows.next()? {
        put.execute(params![
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, Option<i64>>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, Option<String>>(4)?,
            r.get::<_, i64>(5)?
        ])?;
    }
    let mut resets =
        source.prepare("SELECT seq FROM history_resets WHERE seq > ?1 AND seq <= ?2")?;
    let mut reset = tx.prepare_cached("INSERT OR IGNORE INTO history_resets (seq) VALUES (?1)")?;
    for seq in resets.query_map(params![after, through], |r| r.get::<_, i64>(0))? {
        reset.execute([seq?])?;
    }
    Ok(())
}

/// Inserts ended turns into the turn index.
pub(crate) fn insert_turns(tx: &Connection, turns: &[TurnBoundary]) -> Result<()> {
    if turns.is_empty() {
        return Ok(()); // no statement looked up for nothing
    }
    let mut insert_turn = tx.prepare_cached(
        "INSERT OR REPLACE INTO turns (start_seq, turn_id, end_seq, boundary_seq, status, fork_safe, rewind_safe)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for t in turns {
        insert_turn.execute(params![
            t.start_sequence,
            t.turn_id,
            t.end_sequence,
            t.boundary_sequence,
            t.status,
            t.fork_safe,
            t.rewind_safe,
        ])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_text_is_stored_as_bytes_only_when_it_reads_back_the_same() {
        assert_eq!(stored_hex("00ab"), Value::Blob(vec![0x00, 0xab]));
        // Upper case, an odd length, other characters and nothing stay text.
        for text in ["00AB", "abc", "a", "0g", "op-1", ""] {
            assert_eq!(stored_hex(text), Value::Text(text.to_owned()), "{text:?}");
        }
    }

    #[test]
    fn a_commit_id_is_recognised_as_the_hex_of_its_digest_exactly() {
        let digest = [0xabu8; 16];
        assert!(is_hex_of(&"ab".repeat(16), &digest));
        for other in [
            "AB".repeat(16),
            "ab".repeat(15),
            "ab".repeat(17),
            String::new(),
        ] {
            assert!(!is_hex_of(&other, &digest), "{other:?}");
        }
    }
}
