//! Read-only connections to session files kept open between searches, to read search
//! hits' messages back: opening a session file (its schema parsed and checked) is most of
//! what a hit costs, and a user paging through results or refining a query reads the
//! same few sessions again.
//!
//! A kept connection is used again only for the same file: the path's device and inode
//! must still be the ones it was opened on. While the connection is open its file
//! descriptor holds that inode, so no other file can get the number: a session deleted
//! (and re-created under the same id, or restored from a replica) is a new inode and
//! gets a new connection, and one whose folder is gone is [`Error::SessionNotFound`].
//! The file's format is checked when the connection is opened and again whenever its
//! schema cookie (`PRAGMA schema_version`) has moved since; each read is one read
//! transaction, which sees the file's latest commit. At most [`HitFiles::new`]'s
//! capacity stay open (least recently used closed first, on a thread of its own, off the
//! search's path), each holding its file's descriptors and a small page cache; a deleted
//! session's connection is closed by [`HitFiles::release`] (else by its next use or
//! eviction, until when its disk space stays allocated).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::error::{Error, Result};
use crate::model::Message;
use crate::store::reader::own_messages_at;
use crate::store::schema::{self, Access};

/// A file's identity: device and inode.
type Identity = (u64, u64);

/// The kept connections, by session file path.
#[derive(Debug)]
pub(crate) struct HitFiles {
    capacity: usize,
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    /// Bumped at each use: the entry with the smallest is the least recently used.
    clock: u64,
    entries: HashMap<PathBuf, Entry>,
}

#[derive(Debug)]
struct Entry {
    conn: Connection,
    /// How it was opened: an immutable connection is not kept ([`Access::for_root_file`]).
    access: Access,
    /// The file the connection was opened on.
    identity: Identity,
    /// `PRAGMA schema_version` when the format was last checked.
    checked_cookie: i64,
    used: u64,
}

/// The identity of the regular file at `file` (a symlink is not followed).
fn identity_of(file: &Path) -> Result<Identity> {
    match std::fs::symlink_metadata(file) {
        Ok(m) if m.is_file() => Ok((m.dev(), m.ino())),
        _ => Err(Error::SessionNotFound(file.display().to_string())),
    }
}

fn schema_cookie(conn: &Connection) -> Result<i64> {
    Ok(conn.pragma_query_value(None, "schema_version", |r| r.get(0))?)
}

impl Entry {
    /// A new connection to `file`, whose identity was `identity` just before.
    fn open(file: &Path, identity: Identity) -> Result<Entry> {
        let access = Access::for_root_file(file);
        let conn = schema::open_unchecked_reader(file, access)?;
        Ok(Entry {
            conn,
            access,
            identity,
            // Checked at its first read.
            checked_cookie: -1,
            used: 0,
        })
    }

    /// The messages at `wanted`, in one read transaction that first checks the file's
    /// format when its schema changed since the last check.
    fn read(&mut self, wanted: &[(u64, u64)]) -> Result<Vec<Option<Arc<Message>>>> {
        let tx = Transaction::new_unchecked(&self.conn, TransactionBehavior::Deferred)?;
        let cookie = schema_cookie(&tx)?;
        if cookie != self.checked_cookie {
            schema::check_format(&tx)?;
            self.checked_cookie = cookie;
        }
        let found = own_messages_at(&tx, wanted)?;
        tx.finish()?;
        Ok(found)
    }
}

/// Closes `entries` off the caller's path, on a thread that only closes connections
/// (started on first use; inline when it cannot be): closing one frees its parsed schema,
/// as much work as a search's read of it.
fn close_later(entries: impl IntoIterator<Item = Entry>) {
    static CLOSER: OnceLock<Option<Mutex<Sender<Entry>>>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (send, receive) = channel::<Entry>();
        std::thread::Builder::new()
            .name("search-close".to_owned())
            .spawn(move || receive.into_iter().for_each(drop))
            .ok()
            .map(|_| Mutex::new(send))
    });
    for entry in entries {
        let unsent = match closer {
            Some(send) => send
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(entry)
                .err()
                .map(|e| e.0),
            None => Some(entry),
        };
        drop(unsent);
    }
}

impl HitFiles {
    /// Keeps at most `capacity` connections open.
    pub(crate) fn new(capacity: usize) -> HitFiles {
        HitFiles {
            capacity,
            kept: Mutex::new(Kept::default()),
        }
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The messages that events put at transcript positions of the session file `file`'s
    /// own history, for `wanted` `(position, event seq)` pairs, in order: each `None` when
    /// that row is gone or no longer current (see [`own_messages_at`]). Uses the kept
    /// connection to that same file, else opens one (and keeps it).
    ///
    /// # Errors
    /// [`Error::SessionNotFound`] when no regular file is at `file`; [`Error::Corrupt`] or
    /// [`Error::UnsupportedVersion`] for a file that is not a session file this build
    /// reads; read errors. A connection that failed is not kept.
    pub(crate) fn messages_at(
        &self,
        file: &Path,
        wanted: &[(u64, u64)],
    ) -> Result<Vec<Option<Arc<Message>>>> {
        let identity = match identity_of(file) {
            Ok(identity) => identity,
            Err(e) => {
                self.release(file);
                return Err(e);
            }
        };
        // Taken out while in use: the lock is not held during the read, and two searches
        // reading the same file at once each have a connection of their own.
        let kept = self.kept().entries.remove(file);
        let (mut entry, fresh) = match kept {
            Some(entry) if entry.identity == identity => (entry, false),
            // Another file at that path now (closed here), or none kept.
            _ => (Entry::open(file, identity)?, true),
        };
        let found = entry.read(wanted)?;
        // A file replaced while it was being opened: the connection may be on either, so
        // it is not kept; nor an immutable one, which would not see a writer that starts.
        if entry.access == Access::Immutable || fresh && identity_of(file).ok() != Some(identity) {
            return Ok(found);
        }
        self.keep(file, entry);
        Ok(found)
    }

    fn keep(&self, file: &Path, mut entry: Entry) {
        let mut closed = Vec::new();
        {
            let mut kept = self.kept();
            kept.clock += 1;
            entry.used = kept.clock;
            closed.extend(kept.entries.insert(file.to_path_buf(), entry));
            while kept.entries.len() > self.capacity {
                let Some(oldest) = kept
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.used)
                    .map(|(path, _)| path.clone())
                else {
                    break;
                };
                closed.extend(kept.entries.remove(&oldest));
            }
        }
        close_later(closed);
    }

    /// Closes the kept connection to `file`, if any (its session was deleted).
    pub(crate) fn release(&self, file: &Path) {
        let entry = self.kept().entries.remove(file);
        close_later(entry);
    }

    /// The files with a kept connection, sorted (for tests).
    #[cfg(test)]
    fn kept_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.kept().entries.keys().cloned().collect();
        files.sort();
        files
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SessionId;
    use crate::store::schema::SESSION_FILE;
    use crate::{Batch, CancelToken, CreateOptions, Event, Root};

    /// Creates session `name` holding one user message `text`; returns its file and the
    /// `(position, seq)` of the message.
    fn session(root: &Root, name: &str, text: &str) -> (PathBuf, (u64, u64)) {
        let id = SessionId::new(name).expect("id");
        let s = root
            .create(CreateOptions::with_id(id.clone()))
            .expect("create");
        let event = Event::new("message/complete")
            .with_payload(
                &serde_json::json!({"message": {"id": text, "role": "user", "content": text}}),
            )
            .expect("payload");
        s.append(Batch::new(format!("{name}-{text}"), vec![event]))
            .expect("append");
        s.close().expect("close");
        let own = root
            .open_reader(&id)
            .expect("reader")
            .own_changes(0)
            .expect("changes");
        let (row, _, _) = own.rows.last().expect("a row");
        (
            root.session_dir(&id).join(SESSION_FILE),
            (row.position, row.event_seq),
        )
    }

    fn text_at(files: &HitFiles, file: &Path, at: (u64, u64)) -> Result<Option<String>> {
        Ok(files.messages_at(file, &[at])?[0]
            .as_ref()
            .map(|m| m.id().to_owned()))
    }

    #[test]
    fn a_file_replaced_at_the_same_path_is_read_on_a_new_connection() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = Root::open(dir.path()).expect("root");
        let files = HitFiles::new(4);
        let (file, at) = session(&root, "a", "before");
        assert_eq!(
            text_at(&files, &file, at).expect("read").as_deref(),
            Some("before")
        );
        assert_eq!(files.kept_files(), std::slice::from_ref(&file));
        // Deleted and created again under the same id: the same path, position and
        // sequence, another file. The kept connection still holds the old one open.
        root.delete(&SessionId::new("a").expect("id"), &CancelToken::new())
            .expect("delete");
        let (again, at_again) = session(&root, "a", "after");
        assert_eq!((&again, at_again), (&file, at));
        assert_eq!(
            text_at(&files, &file, at).expect("read").as_deref(),
            Some("after")
        );
        assert_eq!(files.kept_files(), std::slice::from_ref(&file));
        // Gone: not found, and its connection closed.
        std::fs::remove_dir_all(file.parent().expect("dir")).expect("rm");
        assert!(matches!(
            text_at(&files, &file, at),
            Err(Error::SessionNotFound(_))
        ));
        assert!(files.kept_files().is_empty());
    }

    #[test]
    fn a_schema_changed_in_place_is_checked_again() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = Root::open(dir.path()).expect("root");
        let files = HitFiles::new(4);
        let (file, at) = session(&root, "a", "text");
        assert!(text_at(&files, &file, at).expect("read").is_some());
        Connection::open(&file)
            .expect("open")
            .execute_batch("CREATE TABLE intruder (x)")
            .expect("alter");
        assert!(matches!(
            text_at(&files, &file, at),
            Err(Error::Corrupt { .. })
        ));
        assert!(
            files.kept_files().is_empty(),
            "a failed connection is not kept"
        );
        assert!(matches!(
            text_at(&files, &file, at),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn the_least_recently_used_connection_is_closed_first() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = Root::open(dir.path()).expect("root");
        let files = HitFiles::new(2);
        let (a, at_a) = session(&root, "a", "x");
        let (b, at_b) = session(&root, "b", "y");
        let (c, at_c) = session(&root, "c", "z");
        for (file, at) in [(&a, at_a), (&b, at_b), (&a, at_a), (&c, at_c)] {
            assert!(text_at(&files, file, at).expect("read").is_some());
        }
        assert_eq!(files.kept_files(), [a.clone(), c.clone()]);
        files.release(&a);
        assert_eq!(files.kept_files(), [c]);
    }
}
