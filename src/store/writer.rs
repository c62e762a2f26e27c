//! The one writer of a session file: its connection, its writer lock and its lease
//! generation; the drain transaction, checkpoint writes and the close policy. A live
//! `Session` owns one and never touches the file otherwise.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::Connection;

use crate::error::{Result, WriterOwner};
use crate::store::lock::WriterLock;
use crate::store::operation_keys::ChunkMark;
use crate::store::schema::{self, Durability, SESSION_FILE};
use crate::store::write::{self, Accepted};

/// What a closing writer does with the session's WAL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckpointPolicy {
    /// `wal_checkpoint(TRUNCATE)` on close: the main file is complete on its own. Skipped
    /// (as with `LeaveToReplicator`) for a session Litestream replicates, i.e. one with a
    /// `.session.sqlite-litestream` folder beside its file.
    #[default]
    TruncateOnClose,
    /// Leave checkpoints to SQLite's automatic (passive) checkpoints and to a replicator
    /// such as Litestream, which must see every WAL frame before it is checkpointed.
    LeaveToReplicator,
}

/// How long a closing writer's checkpoint waits for readers to leave the WAL.
const CLOSE_CHECKPOINT_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// A session file opened for writing under its writer lock, with the lease taken.
pub(crate) struct FileWriter {
    conn: Connection,
    /// Held for as long as the writer lives; dropping it releases the file.
    lock: WriterLock,
    owner: WriterOwner,
    dir: PathBuf,
    policy: CheckpointPolicy,
    /// String values longer than this become content parts (see `store::content`).
    inline_threshold: usize,
    /// Where the file's operation-key chunks end (`store::operation_keys`).
    chunks: ChunkMark,
}

impl FileWriter {
    /// Opens the session file in `dir` under `lock` (already held by the caller, e.g.
    /// handed over from staging), bumps the lease generation and records `owner` with
    /// it, in the lock file and in the `lease` row. String values of payloads longer than
    /// `inline_threshold` bytes are stored as content parts.
    pub(crate) fn open(
        dir: &Path,
        mut lock: WriterLock,
        mut owner: WriterOwner,
        durability: Durability,
        policy: CheckpointPolicy,
        inline_threshold: usize,
    ) -> Result<FileWriter> {
        // Provisional record first, so a refused opener can name us at once.
        lock.record_owner(&owner)?;
        let file = dir.join(SESSION_FILE);
        let mut conn =
            schema::open_writable(&file, durability).map_err(|e| schema::busy_file(e, &file))?;
        owner.generation =
            write::take_lease(&mut conn, &owner).map_err(|e| schema::busy_file(e, &file))?;
        lock.record_owner(&owner)?;
        lock.sync_record()?;
        let chunks = ChunkMark::read(&conn)?;
        Ok(FileWriter {
            conn,
            lock,
            owner,
            dir: dir.to_path_buf(),
            policy,
            inline_threshold,
            chunks,
        })
    }

    /// The lease this writer holds (its generation is the fencing token).
    pub(crate) fn owner(&self) -> &WriterOwner {
        &self.owner
    }

    /// The drain: writes `batch` in one transaction, fenced by this writer's generation.
    pub(crate) fn drain(&mut self, batch: &[Arc<Accepted>]) -> Result<()> {
        self.chunks = write::write_commits(
            &mut self.conn,
            self.owner.generation,
            batch,
            self.inline_threshold,
            self.chunks,
        )
        .map_err(|e| schema::busy_file(e, &self.dir.join(SESSION_FILE)))?;
        Ok(())
    }

    /// Replaces the projection checkpoint (its text and transcript index, and the live
    /// session's operation filter when it has a complete one, as of `through_seq`). The
    /// pages the old one leaves free are reused by the writes that follow; what is still
    /// free at close is given back then.
    pub(crate) fn store_checkpoint(
        &self,
        through_seq: u64,
        projection: &str,
        message_ids: &[u8],
        filter: Option<&[u8]>,
    ) -> Result<()> {
        write::store_checkpoint(&self.conn, through_seq, projection, message_ids, filter)
    }

    /// Closes the file as the policy says (checkpointing and truncating the WAL unless
    /// the WAL is left to a replicator) and hands back the writer lock, still held:
    /// dropping it releases the file, keeping it lets the caller publish or reopen the
    /// file with no gap in which another opener could take it.
    pub(crate) fn close(self) -> WriterLock {
        // Best effort, as the checkpoint below: free pages only cost space. Only here:
        // while the writer runs, SQLite reuses free pages for the rows it appends, and
        // vacuuming then would move pages for nothing.
        let _ = schema::release_free_pages(&self.conn);
        if self.policy == CheckpointPolicy::TruncateOnClose
            && !self.dir.join(schema::LITESTREAM_DIR).is_dir()
        {
            // Best effort: a failed checkpoint leaves a WAL that the next opener replays.
            // A reader inside a read transaction (a sqlite3 shell after `BEGIN`) keeps it
            // from truncating the WAL; waited for the writer's busy timeout, it made every
            // close wait 5 s for it, and fail all the same (outside testing, people and
            // tools: each `append` took 5 s longer while a shell sat in `BEGIN`).
            let _ = self.conn.busy_timeout(CLOSE_CHECKPOINT_WAIT);
            let _ = schema::checkpoint_truncate(&self.conn);
        }
        // The connection is closed before the lock is handed on.
        drop(self.conn);
        self.lock
    }
}
