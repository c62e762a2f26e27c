//! The catalog: `<root>/catalog.sqlite`, a derived index of per-session summaries that
//! makes `list` one keyset query. Rebuildable at any time from the session files.
//!
//! An entry is trusted only while the session file's stamp (size and mtime of
//! `session.sqlite` and `-wal`, read with `stat`, never by opening the file) is
//! unchanged; otherwise it is recomputed from the file. Every page checks that each
//! listed folder still exists, so a stale entry never revives a deleted session.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::UNIX_EPOCH;

use rusqlite::{Connection, OpenFlags, params};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::header::Origin;
use crate::model::{Projection, SessionId};
use crate::persistence::Root;
use crate::store::reader::SessionReader;
use crate::store::schema::{self, SESSION_FILE, WAL_FILE};

/// The catalog file in a root.
pub(crate) const CATALOG_FILE: &str = "catalog.sqlite";

/// What the catalog knows about a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// The session id.
    pub session_id: SessionId,
    /// Storage codec.
    pub codec: String,
    /// Title from the last `session/title`.
    pub title: String,
    /// Ended turns.
    pub turns: u64,
    /// First user message, cut to 240 characters.
    pub preview: Option<String>,
    /// Last durable sequence.
    pub durable_sequence: u64,
    /// Creation time (ms since the Unix epoch).
    pub created_at_ms: i64,
    /// Last change of the session's files (ms since the Unix epoch).
    pub updated_at_ms: i64,
    /// Working directory from the header.
    pub cwd: Option<String>,
    /// Parent session from the header.
    pub parent_id: Option<SessionId>,
    /// Origin from the header.
    pub origin: Origin,
}

impl CatalogEntry {
    /// The entry of a session whose projection is `projection` at `durable_sequence`.
    pub(crate) fn new(
        reader: &SessionReader,
        projection: &Projection,
        durable_sequence: u64,
        dir: &Path,
    ) -> Self {
        let h = reader.header();
        CatalogEntry {
            session_id: h.session_id.clone(),
            codec: h.codec.clone(),
            title: projection.title.clone(),
            turns: projection.ended_turns() as u64,
            preview: projection.preview(),
            durable_sequence,
            created_at_ms: h.created_at_ms,
            updated_at_ms: modified_ms(dir).max(h.created_at_ms),
            cwd: h.cwd.clone(),
            parent_id: h.parent_id.clone(),
            origin: h.origin,
        }
    }
}

fn modified_ms(dir: &Path) -> i64 {
    [SESSION_FILE, WAL_FILE]
        .iter()
        .filter_map(|f| std::fs::symlink_metadata(dir.join(f)).ok()?.modified().ok())
        .filter_map(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .max()
        .unwrap_or(0)
}

/// The stamp of a file that does not exist.
const MISSING: &str = "-";

/// One file's part of a stamp: `<size>@<mtime ns>`, or [`MISSING`].
fn file_stamp(size_and_mtime: Option<(u64, u128)>) -> String {
    size_and_mtime.map_or_else(|| MISSING.to_owned(), |(len, ns)| format!("{len}@{ns}"))
}

/// Stamps of the sessions of one root: size and mtime (ns) of `session.sqlite` and its
/// `-wal`, each read with `fstatat` relative to the root folder (a symlink is not followed) (no walk of the root's own
/// path per file, which is what `list` pays per entry).
struct Stamper {
    root: rustix::fd::OwnedFd,
}

impl Stamper {
    fn open(root: &Path) -> Result<Stamper> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let root = rustix::fs::open(root, flags, Mode::empty())
            .map_err(|e| Error::io(format!("open {}", root.display()), e.into()))?;
        Ok(Stamper { root })
    }

    /// `<size>@<mtime ns>/<size>@<mtime ns>` of the session's file and WAL.
    fn stamp(&self, id: &SessionId) -> String {
        let part = |name: &str| {
            let st = rustix::fs::statat(
                &self.root,
                format!("{id}/{name}"),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .ok()?;
            let ns =
                u128::try_from(st.st_mtime).ok()? * 1_000_000_000 + u128::from(st.st_mtime_nsec);
            Some((u64::try_from(st.st_size).ok()?, ns))
        };
        format!(
            "{}/{}",
            file_stamp(part(SESSION_FILE)),
            file_stamp(part(WAL_FILE))
        )
    }
}

#[derive(Debug)]
pub(crate) struct Catalog {
    path: PathBuf,
    conn: Mutex<Option<Connection>>,
}

impl Catalog {
    pub(crate) fn new(root: &Path) -> Catalog {
        Catalog {
            path: root.join(CATALOG_FILE),
            conn: Mutex::new(None),
        }
    }

    /// Runs `f` on the catalog connection, opening (and, for a new catalog, filling) it first.
    fn with_conn<T>(&self, root: &Root, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let conn = open_confined(root, &self.path)?;
            conn.busy_timeout(std::time::Duration::from_secs(5))?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS sessions (
                     session_id TEXT PRIMARY KEY,
                     stamp      TEXT NOT NULL,
                     entry      TEXT NOT NULL
                 ) WITHOUT ROWID;",
            )?;
            // Index every folder once per process: sessions published before this catalog
            // existed (or by a process that died before recording them) get a stale row.
            let mut add = conn.prepare(
                "INSERT OR IGNORE INTO sessions (session_id, stamp, entry) VALUES (?1, '', '')",
            )?;
            for id in root.list_ids()? {
                add.execute([id.as_str()])?;
            }
            drop(add);
            *guard = Some(conn);
        }
        match guard.as_ref() {
            Some(conn) => f(conn),
            None => Err(Error::corrupt("catalog connection missing")),
        }
    }

    /// Records that a session exists (its entry is computed when first listed).
    pub(crate) fn touch(&self, root: &Root, id: &SessionId) -> Result<()> {
        self.with_conn(root, |c| {
            c.prepare_cached(
                "INSERT OR IGNORE INTO sessions (session_id, stamp, entry) VALUES (?1, '', '')",
            )?
            .execute([id.as_str()])?;
            Ok(())
        })
    }

    /// Stores an entry computed by the caller (e.g. from a live projection after close).
    pub(crate) fn put(&self, root: &Root, entry: &CatalogEntry) -> Result<()> {
        let (stamp, text) = row(&Stamper::open(root.path())?, entry)?;
        self.with_conn(root, |c| {
            c.prepare_cached(
                "INSERT OR REPLACE INTO sessions (session_id, stamp, entry) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![entry.session_id.as_str(), stamp, text])?;
            Ok(())
        })
    }

    /// Drops a session's entry.
    pub(crate) fn forget(&self, root: &Root, id: &SessionId) -> Result<()> {
        self.with_conn(root, |c| {
            c.prepare_cached("DELETE FROM sessions WHERE session_id = ?1")?
                .execute([id.as_str()])?;
            Ok(())
        })
    }

    /// Recomputes a session's entry from its file.
    pub(crate) fn refresh(&self, root: &Root, id: &SessionId) -> Result<CatalogEntry> {
        let entry = compute(root, id)?;
        self.put(root, &entry)?;
        Ok(entry)
    }

    /// Up to `limit` entries with ids after `after`, in id order; stale entries are
    /// recomputed, entries of vanished folders dropped.
    pub(crate) fn page(
        &self,
        root: &Root,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<CatalogEntry>> {
        let mut out = Vec::with_capacity(limit);
        let stamper = Stamper::open(root.path())?;
        let mut cursor = after.unwrap_or("").to_owned();
        while out.len() < limit {
            let rows: Vec<(String, String, String)> = self.with_conn(root, |c| {
                let mut stmt = c.prepare_cached(
                    "SELECT session_id, stamp, entry FROM sessions WHERE session_id > ?1 ORDER BY session_id LIMIT ?2",
                )?;
                let rows = stmt.query_map(params![cursor, (limit - out.len()) as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })?;
            let Some(last) = rows.last() else {
                break;
            };
            cursor = last.0.clone();
            for (sid, stamp, text) in rows {
                let Ok(id) = SessionId::new(sid) else {
                    continue;
                };
                let current = stamper.stamp(&id);
                if current.starts_with(MISSING) {
                    self.forget(root, &id)?;
                    continue;
                }
                let cached = (stamp == current)
                    .then(|| serde_json::from_str::<CatalogEntry>(&text).ok())
                    .flatten();
                match cached {
                    Some(entry) => out.push(entry),
                    None => match self.refresh(root, &id) {
                        Ok(entry) => out.push(entry),
                        Err(Error::SessionNotFound(_)) => self.forget(root, &id)?,
                        Err(e) => return Err(e),
                    },
                }
            }
        }
        Ok(out)
    }

    /// Recomputes one entry per session, then replaces every row in one transaction, so a
    /// rebuild cut short (an error, a crash) leaves the previous catalog whole and no other
    /// process ever lists a half-filled one; returns how many.
    pub(crate) fn rebuild(&self, root: &Root) -> Result<usize> {
        let ids = root.list_ids()?;
        let stamper = Stamper::open(root.path())?;
        let mut rows = Vec::with_capacity(ids.len());
        for id in &ids {
            match compute(root, id) {
                Ok(entry) => rows.push((id, row(&stamper, &entry)?)),
                // Deleted since it was listed: nothing to index.
                Err(Error::SessionNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.with_conn(root, |c| {
            let tx = c.unchecked_transaction()?;
            tx.execute("DELETE FROM sessions", [])?;
            let mut put =
                tx.prepare("INSERT INTO sessions (session_id, stamp, entry) VALUES (?1, ?2, ?3)")?;
            for (id, (stamp, text)) in &rows {
                put.execute(params![id.as_str(), stamp, text])?;
            }
            // Sessions published while the entries were computed: indexed when listed.
            let mut add = tx.prepare(
                "INSERT OR IGNORE INTO sessions (session_id, stamp, entry) VALUES (?1, '', '')",
            )?;
            for id in root.list_ids()? {
                add.execute([id.as_str()])?;
            }
            drop((put, add));
            tx.commit()?;
            Ok(())
        })?;
        Ok(rows.len())
    }
}

/// Opens (creating) the catalog without following a symlink. The catalog is derived: when
/// its file or one of SQLite's files beside it is a symlink (or another non-regular
/// file), those names are unlinked from the root (the links themselves, never what they
/// point to) and a fresh catalog is built.
fn open_confined(root: &Root, path: &Path) -> Result<Connection> {
    if let Err(Error::InvalidInput(_)) = schema::check_file(path) {
        for suffix in std::iter::once("").chain(schema::SIDECARS) {
            let name = format!("{CATALOG_FILE}{suffix}");
            let _ =
                rustix::fs::unlinkat(root.dir_fd(), name.as_str(), rustix::fs::AtFlags::empty());
        }
    }
    Ok(Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NOFOLLOW
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?)
}

/// A session's entry, computed from its file.
fn compute(root: &Root, id: &SessionId) -> Result<CatalogEntry> {
    let dir = root.session_dir(id);
    let reader = root.open_reader(id)?;
    Ok(CatalogEntry::new(
        &reader,
        &reader.projection()?,
        reader.durable_sequence()?,
        &dir,
    ))
}

/// The stamp and the stored text of a session's entry.
fn row(stamper: &Stamper, entry: &CatalogEntry) -> Result<(String, String)> {
    let stamp = stamper.stamp(&entry.session_id);
    let text = serde_json::to_string(entry).map_err(|e| Error::invalid(e.to_string()))?;
    Ok((stamp, text))
}
