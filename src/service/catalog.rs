//! The catalog: `<root>/catalog.sqlite`, a derived cache of per-session summaries for
//! `list`. Rebuildable at any time; an entry is valid only while the session file's
//! stamp (size and mtime of `session.sqlite` and `-wal`, read with `stat`, never by
//! opening the file) is unchanged. Listing walks the root folder, so a deleted session
//! is never revived by a stale entry.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::UNIX_EPOCH;

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{Error, Result};
use crate::model::SessionId;
use crate::persistence::Root;
use crate::service::query::SessionSummary;

/// The catalog file in a root.
pub(crate) const CATALOG_FILE: &str = "catalog.sqlite";

pub(crate) struct Catalog {
    path: PathBuf,
    conn: Mutex<Option<Connection>>,
}

fn file_stamp(path: &Path) -> String {
    std::fs::metadata(path).map_or_else(
        |_| "-".to_owned(),
        |m| {
            let mtime = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("{}@{mtime}", m.len())
        },
    )
}

/// The stamp of a session folder's files.
pub(crate) fn session_stamp(dir: &Path) -> String {
    format!(
        "{}/{}",
        file_stamp(&dir.join("session.sqlite")),
        file_stamp(&dir.join("session.sqlite-wal"))
    )
}

impl Catalog {
    pub(crate) fn new(root: &Path) -> Catalog {
        Catalog {
            path: root.join(CATALOG_FILE),
            conn: Mutex::new(None),
        }
    }

    fn with_conn<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let conn = Connection::open(&self.path)?;
            conn.busy_timeout(std::time::Duration::from_secs(5))?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS sessions (
                     session_id TEXT PRIMARY KEY,
                     stamp      TEXT NOT NULL,
                     summary    TEXT NOT NULL
                 ) WITHOUT ROWID;",
            )?;
            *guard = Some(conn);
        }
        match guard.as_ref() {
            Some(conn) => f(conn),
            None => Err(Error::corrupt("catalog connection missing")),
        }
    }

    /// The summary of a cold session: from the catalog when its stamp is current, else
    /// recomputed from the file and stored.
    pub(crate) fn summary(
        &self,
        root: &Root,
        id: &SessionId,
        host: &str,
    ) -> Result<SessionSummary> {
        let stamp = session_stamp(&root.session_dir(id));
        let cached: Option<String> = self.with_conn(|c| {
            Ok(c.prepare_cached(
                "SELECT summary FROM sessions WHERE session_id = ?1 AND stamp = ?2",
            )?
            .query_row(params![id.as_str(), stamp], |r| r.get(0))
            .optional()?)
        })?;
        if let Some(summary) = cached.and_then(|s| serde_json::from_str(&s).ok()) {
            return Ok(summary);
        }
        self.refresh(root, id, host)
    }

    /// Recomputes and stores a session's summary.
    pub(crate) fn refresh(
        &self,
        root: &Root,
        id: &SessionId,
        host: &str,
    ) -> Result<SessionSummary> {
        let dir = root.session_dir(id);
        let stamp = session_stamp(&dir);
        let summary = SessionSummary::from_reader(&root.open_reader(id)?, &dir, host)?;
        let text = serde_json::to_string(&summary).map_err(|e| Error::invalid(e.to_string()))?;
        self.with_conn(|c| {
            c.prepare_cached(
                "INSERT OR REPLACE INTO sessions (session_id, stamp, summary) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![id.as_str(), stamp, text])?;
            Ok(())
        })?;
        Ok(summary)
    }

    /// Drops a session's entry.
    pub(crate) fn forget(&self, id: &SessionId) -> Result<()> {
        self.with_conn(|c| {
            c.execute("DELETE FROM sessions WHERE session_id = ?1", [id.as_str()])?;
            Ok(())
        })
    }

    /// Drops every entry and recomputes one per session; returns how many.
    pub(crate) fn rebuild(&self, root: &Root, host: &str) -> Result<usize> {
        self.with_conn(|c| {
            c.execute("DELETE FROM sessions", [])?;
            Ok(())
        })?;
        let ids = root.list_ids()?;
        for id in &ids {
            self.refresh(root, id, host)?;
        }
        Ok(ids.len())
    }
}
