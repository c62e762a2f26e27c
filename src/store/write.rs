//! Writes to one session file: initialisation, the lease, and the drain transaction.

use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::error::{Error, Result, WriterOwner};
use crate::model::event::INLINE_PAYLOAD_LIMIT;
use crate::model::header::Header;
use crate::model::{Commit, TurnBoundary};
use crate::store::blob;

/// An accepted commit on its way to disk, with the turns it closes.
#[derive(Debug)]
pub(crate) struct Accepted {
    pub commit: Arc<Commit>,
    pub closed_turns: Vec<TurnBoundary>,
    /// Bytes charged against the queue budget.
    pub charge: usize,
}

/// Writes the header row and an empty lease into a freshly created file.
pub(crate) fn init_file(conn: &mut Connection, header: &Header) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute(
        "INSERT INTO header (singleton, session_id, codec, created_at, cwd, parent_id, origin, provenance)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            header.session_id.as_str(),
            header.codec,
            header.created_at_ms,
            header.cwd,
            header.parent_id.as_ref().map(|p| p.as_str()),
            header.origin.as_str(),
            header.provenance.as_ref().map(|v| v.to_string()),
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
/// checking that the lease is still at `generation` (fencing).
pub(crate) fn write_commits(
    conn: &mut Connection,
    generation: u64,
    batch: &[Arc<Accepted>],
) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current: i64 = tx.query_row(
        "SELECT generation FROM lease WHERE singleton = 1",
        [],
        |r| r.get(0),
    )?;
    if current != generation as i64 {
        return Err(Error::StaleGeneration {
            ours: generation,
            current: current.max(0) as u64,
        });
    }
    {
        let mut insert_commit = tx.prepare_cached(
            "INSERT INTO commits (first_seq, last_seq, commit_id, operation_id, operation_hash,
                                  turn_id, writer_generation, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        let mut insert_event = tx.prepare_cached(
            "INSERT INTO events (seq, first_seq, event_id, kind, optional, payload, payload_ref)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        let mut blob_exists = tx.prepare_cached("SELECT 1 FROM blobs WHERE digest = ?1")?;
        let mut insert_blob = tx.prepare_cached(
            "INSERT INTO blobs (digest, bytes, encoding, data) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut insert_turn = tx.prepare_cached(
            "INSERT OR REPLACE INTO turns (start_seq, turn_id, end_seq, boundary_seq, status)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for accepted in batch {
            let c = &accepted.commit;
            insert_commit.execute(params![
                c.first_seq as i64,
                c.last_seq() as i64,
                c.commit_id,
                c.operation_id,
                c.operation_hash,
                c.turn_id,
                c.writer_generation as i64,
                c.created_at_ms,
            ])?;
            for e in &c.events {
                let text = e.payload_str();
                let (inline, reference) = match text {
                    Some(t) if t.len() > INLINE_PAYLOAD_LIMIT => {
                        let digest = crate::model::event::sha256_hex(t.as_bytes());
                        if !blob_exists.exists([&digest])? {
                            let (encoding, data) = blob::encode(t.as_bytes());
                            insert_blob.execute(params![digest, t.len() as i64, encoding, data])?;
                        }
                        (None, Some(digest))
                    }
                    other => (other, None),
                };
                insert_event.execute(params![
                    e.seq as i64,
                    c.first_seq as i64,
                    e.id,
                    e.kind,
                    e.optional,
                    inline,
                    reference,
                ])?;
            }
            for t in &accepted.closed_turns {
                insert_turn.execute(params![
                    t.start_sequence as i64,
                    t.turn_id,
                    t.end_sequence as i64,
                    t.boundary_sequence as i64,
                    t.status,
                ])?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}
