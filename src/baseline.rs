//! Raw-SQLite baselines that the benchmarks (`session-store bench`, `bench --suite lean`,
//! `cargo bench --bench append`) measure the library against, so that every figure is
//! printed beside a same-run baseline. These are not a way to store sessions: plain tables
//! written with plain SQL, nothing the library reads. Built with the `cli` feature (the
//! benchmarks' feature); a host that embeds the library does not get them.

use std::path::Path;
use std::time::Instant;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::{Error, Result};
use crate::store::schema::Durability;

/// The raw baseline's file: one table `events(seq INTEGER PRIMARY KEY, payload TEXT)` in
/// WAL mode, at the `synchronous` setting of a [`Durability`] (`FULL` for
/// [`Durability::PowerLoss`], `NORMAL` for [`Durability::ProcessCrash`]), as the library
/// uses for the same durability.
#[derive(Debug)]
pub struct RawTable {
    conn: Connection,
}

impl RawTable {
    /// Creates the file `file` (which must not hold a table `events`) with its table.
    ///
    /// # Errors
    /// SQLite errors (e.g. `file` already holds an `events` table, or its folder is
    /// missing).
    pub fn create(file: &Path, durability: Durability) -> Result<RawTable> {
        let conn = Connection::open(file)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", durability.synchronous())?;
        conn.execute(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, payload TEXT)",
            [],
        )?;
        Ok(RawTable { conn })
    }

    /// Inserts `payloads` after the rows the table holds (`seq` is the next rowid), one
    /// `BEGIN IMMEDIATE` transaction per `batch` rows (a `batch` of 0 counts as 1).
    ///
    /// # Errors
    /// SQLite errors; the transactions committed before one fails stay.
    pub fn insert(&mut self, payloads: &[String], batch: usize) -> Result<()> {
        for chunk in payloads.chunks(batch.max(1)) {
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut insert = tx.prepare_cached("INSERT INTO events (payload) VALUES (?1)")?;
                for p in chunk {
                    insert.execute([p.as_str()])?;
                }
            }
            tx.commit()?;
        }
        Ok(())
    }
}

/// Events per second of [`RawTable::insert`] into a new [`RawTable`] at `durability`, one
/// transaction per `batch` rows. The file's creation and its first `untimed` payloads (a
/// warm-up on the same file, so that its WAL has wrapped as a long-lived file's has) are
/// not timed.
///
/// # Errors
/// As [`RawTable::create`] and [`RawTable::insert`].
pub fn raw_rate(
    file: &Path,
    payloads: &[String],
    batch: usize,
    durability: Durability,
    untimed: usize,
) -> Result<f64> {
    let mut table = RawTable::create(file, durability)?;
    let (warm, timed) = payloads.split_at(untimed.min(payloads.len()));
    table.insert(warm, batch)?;
    let t = Instant::now();
    table.insert(timed, batch)?;
    Ok(timed.len() as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

/// The session id [`sqlite_session_bytes`] stores under: the openai-agents SDK
/// documentation's example.
const SQLITE_SESSION_ID: &str = "conversation_123";

/// The bytes on disk (the file and its `-wal`, after close) of `messages` stored in a new
/// file `file` shaped as the openai-agents SDK's `SQLiteSession`: its two tables
/// (`agent_sessions`, `agent_messages`) and its `(session_id, id)` index in WAL mode, one
/// transaction per turn of two messages with an insert per message and the session's
/// `updated_at` bumped, under the SDK documentation's session id `conversation_123`. A peer for the library's bytes on
/// disk.
///
/// # Errors
/// SQLite errors (e.g. `file` already holds those tables); [`Error::Io`] when the file
/// cannot be measured.
pub fn sqlite_session_bytes(file: &Path, messages: &[String]) -> Result<u64> {
    let mut conn = Connection::open(file)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.execute_batch(
        "CREATE TABLE agent_sessions (session_id TEXT PRIMARY KEY,
             created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
             updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP);
         CREATE TABLE agent_messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
             session_id TEXT NOT NULL, message_data TEXT NOT NULL,
             created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
             FOREIGN KEY (session_id) REFERENCES agent_sessions (session_id) ON DELETE CASCADE);
         CREATE INDEX idx_agent_messages_session_id ON agent_messages (session_id, id);",
    )?;
    for pair in messages.chunks(2) {
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT OR IGNORE INTO agent_sessions (session_id) VALUES (?1)",
            [SQLITE_SESSION_ID],
        )?;
        for m in pair {
            tx.execute(
                "INSERT INTO agent_messages (session_id, message_data) VALUES (?1, ?2)",
                [SQLITE_SESSION_ID, m.as_str()],
            )?;
        }
        tx.execute(
            "UPDATE agent_sessions SET updated_at = CURRENT_TIMESTAMP WHERE session_id = ?1",
            [SQLITE_SESSION_ID],
        )?;
        tx.commit()?;
    }
    conn.close().map_err(|(_, e)| Error::from(e))?;
    let mut wal = file.as_os_str().to_owned();
    wal.push("-wal");
    let main = std::fs::metadata(file)
        .map_err(|e| Error::io(format!("stat {}", file.display()), e))?
        .len();
    Ok(main + std::fs::metadata(&wal).map_or(0, |m| m.len()))
}
