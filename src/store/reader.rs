//! Cold reads of a session: pooled read-only connections to its file and to the
//! files of its ancestors. Never touches the writer lock or the lease.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use r2d2::{Pool, PooledConnection};
use r2d2_sqlite::SqliteConnectionManager;
use scheduled_thread_pool::ScheduledThreadPool;

use crate::error::{Error, Result, WriterOwner};
use crate::model::header::Header;
use crate::model::{Commit, Projection, SessionId};
use crate::store::read::{self, LineageEntry};
use crate::store::schema::{self, SESSION_FILE};

/// One thread, shared by every read pool of the process, for r2d2's housekeeping.
static POOL_THREADS: LazyLock<Arc<ScheduledThreadPool>> = LazyLock::new(|| {
    Arc::new(
        ScheduledThreadPool::builder()
            .num_threads(1)
            .thread_name_pattern("session-store-read-pool-{}")
            .build(),
    )
});

/// Read connections per session file at most.
const MAX_READERS: u32 = 4;

type ReadPool = Pool<SqliteConnectionManager>;

fn read_pool(file: &Path) -> Result<ReadPool> {
    if !file.is_file() {
        return Err(Error::SessionNotFound(file.display().to_string()));
    }
    let manager = SqliteConnectionManager::file(file)
        .with_flags(schema::reader_flags())
        .with_init(schema::init_reader);
    let pool = Pool::builder()
        .max_size(MAX_READERS)
        .min_idle(Some(0))
        .idle_timeout(Some(Duration::from_secs(30)))
        .test_on_check_out(false)
        .connection_timeout(Duration::from_secs(10))
        .thread_pool(Arc::clone(&POOL_THREADS))
        .build_unchecked(manager);
    Ok(pool)
}

/// One file the session's events come from, and the last sequence it supplies.
#[derive(Clone, Debug)]
struct Segment {
    id: SessionId,
    through: u64,
    pool: ReadPool,
}

/// A read-only view of a session's durable prefix (its own file plus its ancestors').
///
/// Sees only committed transactions: a live writer's accepted-but-undrained commits are
/// invisible here.
#[derive(Clone, Debug)]
pub struct SessionReader {
    header: Header,
    file: PathBuf,
    /// Ancestors oldest first, then this session's own file (through = u64::MAX).
    segments: Vec<Segment>,
}

impl SessionReader {
    /// Opens the session file in the session folder `dir` (ancestors are its siblings).
    pub(crate) fn open(dir: &Path) -> Result<SessionReader> {
        Self::open_file(&dir.join(SESSION_FILE), dir.parent().unwrap_or(dir))
    }

    /// Opens a session file, resolving ancestors as `<root>/<ancestor>/session.sqlite`.
    pub(crate) fn open_file(file: &Path, root: &Path) -> Result<SessionReader> {
        let own = read_pool(file)?;
        let conn = own.get()?;
        schema::check_format(&conn)?;
        let header = read::read_header(&conn)?;
        let lineage = read::read_lineage(&conn)?;
        drop(conn);
        let mut segments = Vec::with_capacity(lineage.len() + 1);
        for LineageEntry {
            ancestor_id,
            through_seq,
        } in lineage
        {
            let file = root.join(ancestor_id.as_str()).join(SESSION_FILE);
            let pool = read_pool(&file).map_err(|_| {
                Error::corrupt(format!(
                    "session {} inherits from {ancestor_id}, which is missing",
                    header.session_id
                ))
            })?;
            segments.push(Segment {
                id: ancestor_id,
                through: through_seq,
                pool,
            });
        }
        segments.push(Segment {
            id: header.session_id.clone(),
            through: u64::MAX,
            pool: own,
        });
        Ok(SessionReader {
            header,
            file: file.to_path_buf(),
            segments,
        })
    }

    /// The header row.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The session file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The ancestors this session inherits from, oldest first.
    pub fn lineage(&self) -> Vec<LineageEntry> {
        self.ancestors()
            .iter()
            .map(|s| LineageEntry {
                ancestor_id: s.id.clone(),
                through_seq: s.through,
            })
            .collect()
    }

    fn ancestors(&self) -> &[Segment] {
        &self.segments[..self.segments.len() - 1]
    }

    fn own(&self) -> Result<PooledConnection<SqliteConnectionManager>> {
        let own = self
            .segments
            .last()
            .ok_or_else(|| Error::corrupt("no segments"))?;
        Ok(own.pool.get()?)
    }

    /// Events inherited from ancestors (0 for a root session).
    pub fn inherited_events(&self) -> u64 {
        self.ancestors().last().map_or(0, |s| s.through)
    }

    /// The last durable sequence.
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn durable_sequence(&self) -> Result<u64> {
        read::last_seq(&*self.own()?, self.inherited_events())
    }

    /// The lease row: the last (or current) writer.
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn lease(&self) -> Result<WriterOwner> {
        read::read_lease(&*self.own()?)
    }

    /// Sessions that inherit from this one.
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn dependents(&self) -> Result<Vec<LineageEntry>> {
        read::read_dependents(&*self.own()?)
    }

    /// Whole durable commits with `last_seq > after`, at most `limit`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for damaged rows or blobs, or SQLite errors.
    pub fn commits(&self, after: u64, limit: usize) -> Result<Vec<Commit>> {
        let mut out = Vec::new();
        let mut floor = 0u64;
        for segment in &self.segments {
            if out.len() >= limit {
                break;
            }
            if segment.through > after {
                let conn = segment.pool.get()?;
                let from = after.max(floor);
                out.extend(read::read_commits(
                    &conn,
                    from,
                    segment.through,
                    limit - out.len(),
                )?);
            }
            floor = segment.through;
        }
        Ok(out)
    }

    /// Every durable commit, in order.
    ///
    /// # Errors
    /// As [`SessionReader::commits`].
    pub fn replay(&self) -> Result<Vec<Commit>> {
        let mut all = Vec::new();
        self.visit(|c| {
            all.push(c);
            Ok(())
        })?;
        Ok(all)
    }

    /// Streams every durable commit, in order, in pages.
    ///
    /// # Errors
    /// As [`SessionReader::commits`], or whatever `f` returns.
    pub fn visit(&self, mut f: impl FnMut(Commit) -> Result<()>) -> Result<()> {
        const PAGE: usize = 1000;
        let mut after = 0;
        loop {
            let page = self.commits(after, PAGE)?;
            let Some(last) = page.last() else {
                return Ok(());
            };
            let next = last.last_seq();
            if next <= after {
                return Err(Error::corrupt("commit cursor did not advance"));
            }
            after = next;
            for c in page {
                f(c)?;
            }
        }
    }

    /// The projection of the durable prefix.
    ///
    /// # Errors
    /// As [`SessionReader::commits`], or a fold error for an invalid stored payload.
    pub fn projection(&self) -> Result<Projection> {
        let mut p = Projection::default();
        self.visit(|c| p.apply_commit(&c))?;
        Ok(p)
    }

    /// The raw bytes of a blob referenced by this session (searching its ancestors too).
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the stored bytes do not match the digest.
    pub fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        for segment in self.segments.iter().rev() {
            if let Some(bytes) = read::read_blob(&*segment.pool.get()?, digest)? {
                return Ok(Some(bytes));
            }
        }
        Ok(None)
    }

    /// The commit that recorded `operation_id` in this session's own file.
    pub(crate) fn lookup_operation(&self, operation_id: &str) -> Result<Option<Commit>> {
        read::lookup_operation(&*self.own()?, operation_id)
    }
}
