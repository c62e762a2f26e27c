//! Read-only connections to session files kept open between searches, to read search
//! hits' messages back: opening a session file (its schema parsed and checked, its WAL
//! index set up) is most of what a hit costs, and a user paging through results or
//! refining a query reads the same few sessions again.
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
//!
//! A *quiet* file is read without locks (`immutable=1`): one that is complete by itself
//! (an empty or no `-wal`, no `-journal`: every commit is in the main file) and whose
//! inode has not changed for [`QUIET`] (its change time, which any write to the file, a
//! truncation or a replacement moves; a writer's commits go to the `-wal` first, and its
//! checkpoints write the file). That is most of a root's files (every closed session), and
//! it saves the setup of the file's WAL index (SQLite truncates and rebuilds the `-shm` of
//! a file no other connection has open) and its locks, about half of what opening it cost.
//! Such a read is checked afterwards: when the file's [`Stamp`] (inode, size, change time,
//! the `-wal` still empty) is not what it was before, a writer may have committed or
//! checkpointed during the read, and the hits are read again on a connection with locks.
//! The file having been left alone for [`QUIET`], a write after the first stat moves the
//! change time even on a file system with coarse timestamps. A connection without locks is
//! used again only while the file's stamp is unchanged. A file in a folder that refuses
//! this process the `-wal` a read with locks needs ([`Access::for_root_file`]) is read the
//! same way, quiet or not.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::error::{Error, Result};
use crate::model::Message;
use crate::store::reader::own_messages_at;
use crate::store::schema::{self, Access};

/// How long a file's inode must have been left unchanged before the file is read without
/// locks.
const QUIET: Duration = Duration::from_secs(1);

/// A file's identity: device and inode.
type Identity = (u64, u64);

/// What a read without locks is checked against: the file's identity, size and inode
/// change time, and whether it is complete by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    identity: Identity,
    size: u64,
    /// `st_ctime` (seconds, nanoseconds).
    changed: (i64, i64),
    /// No `-journal`, and an empty or no `-wal`: every commit is in the main file.
    complete: bool,
}

impl Stamp {
    /// The stamp of the regular file at `file` (a symlink is not followed).
    fn of(file: &Path) -> Result<Stamp> {
        let m = regular_file(file)?;
        let absent = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let wal_empty = match std::fs::symlink_metadata(schema::sidecar(file, "-wal")) {
            Ok(wal) => wal.is_file() && wal.len() == 0,
            Err(e) => absent(&e),
        };
        let no_journal =
            std::fs::symlink_metadata(schema::sidecar(file, "-journal")).is_err_and(|e| absent(&e));
        Ok(Stamp {
            identity: (m.dev(), m.ino()),
            size: m.size(),
            changed: (m.ctime(), m.ctime_nsec()),
            complete: wal_empty && no_journal,
        })
    }

    /// Whether the file may be read without locks at `now`: complete by itself, and its
    /// inode unchanged for `quiet`.
    fn quiet(&self, quiet: Duration, now: SystemTime) -> bool {
        let (Ok(secs), Ok(nanos)) = (u64::try_from(self.changed.0), u32::try_from(self.changed.1))
        else {
            return false;
        };
        self.complete
            && UNIX_EPOCH
                .checked_add(Duration::new(secs, nanos))
                .and_then(|changed| changed.checked_add(quiet))
                .is_some_and(|settled| settled <= now)
    }
}

/// The kept connections, by session file path.
#[derive(Debug)]
pub(crate) struct HitFiles {
    capacity: usize,
    /// How long a file must be left alone before it is read without locks ([`QUIET`]).
    quiet: Duration,
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
    /// The file the connection was opened on.
    identity: Identity,
    /// For a connection without locks: the stamp of the file it reads, which it is used
    /// for only while the file's is the same.
    unlocked: Option<Stamp>,
    /// `PRAGMA schema_version` when the format was last checked.
    checked_cookie: i64,
    used: u64,
}

/// The metadata of the regular file at `file` (a symlink is not followed).
fn regular_file(file: &Path) -> Result<std::fs::Metadata> {
    match std::fs::symlink_metadata(file) {
        Ok(m) if m.is_file() => Ok(m),
        _ => Err(Error::SessionNotFound(file.display().to_string())),
    }
}

/// The identity of the regular file at `file` (a symlink is not followed): one `lstat`,
/// not the three of a [`Stamp`].
fn identity_of(file: &Path) -> Result<Identity> {
    regular_file(file).map(|m| (m.dev(), m.ino()))
}

fn schema_cookie(conn: &Connection) -> Result<i64> {
    Ok(conn.pragma_query_value(None, "schema_version", |r| r.get(0))?)
}

impl Entry {
    /// A new connection to `file`, whose stamp was `stamp` just before: without locks
    /// when `unlocked`, else as [`Access::for_root_file`] says (also without locks in a
    /// folder that refuses the `-wal` a shared read needs; checked the same way).
    fn open(file: &Path, stamp: Stamp, unlocked: bool) -> Result<Entry> {
        let access = if unlocked {
            Access::Immutable
        } else {
            Access::for_root_file(file)
        };
        let conn = schema::open_unchecked_reader(file, access)?;
        Ok(Entry {
            conn,
            identity: stamp.identity,
            unlocked: (access == Access::Immutable).then_some(stamp),
            // Checked at its first read.
            checked_cookie: -1,
            used: 0,
        })
    }

    /// Whether this connection reads the file whose stamp is now `stamp`.
    fn reads(&self, stamp: &Stamp) -> bool {
        match &self.unlocked {
            None => self.identity == stamp.identity,
            Some(opened) => opened == stamp,
        }
    }

    /// The messages at `wanted` (only current ones with `current`), in one read
    /// transaction that first checks the file's format when its schema changed since the
    /// last check.
    fn read(&mut self, wanted: &[(u64, u64)], current: bool) -> Result<Vec<Option<Arc<Message>>>> {
        let tx = Transaction::new_unchecked(&self.conn, TransactionBehavior::Deferred)?;
        let cookie = schema_cookie(&tx)?;
        if cookie != self.checked_cookie {
            schema::check_format(&tx)?;
            self.checked_cookie = cookie;
        }
        let found = own_messages_at(&tx, wanted, current)?;
        tx.finish()?;
        Ok(found)
    }
}

/// Connections waiting for the closing thread at most; more are closed by the caller.
/// Searches reading many sessions on several threads evict faster than one thread closes,
/// and the queue held up to 70 files' descriptors (a server limited to 64 failed).
const MAX_QUEUED_CLOSES: usize = 16;

/// Connections sent to the closing thread and not closed yet.
static QUEUED_CLOSES: AtomicUsize = AtomicUsize::new(0);

/// The closing thread's sender and the id of the process that started the thread
/// ([`close_later`]).
type Closer = Option<(u32, Option<Sender<Entry>>)>;
static CLOSER: Mutex<Closer> = Mutex::new(None);

/// Takes the closer's lock for a `fork()` (`persistence::fork_hold`).
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    Box::new(CLOSER.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Closes `entries` off the caller's path, on a thread that only closes connections
/// (started on first use; inline when it cannot be, or when [`MAX_QUEUED_CLOSES`] wait
/// already): closing one frees its parsed schema, as much work as a search's read of it.
/// The thread is the process's: a child made by `fork()` (which inherits the sender
/// without the thread) starts its own.
fn close_later(entries: impl IntoIterator<Item = Entry>) {
    let pid = std::process::id();
    let send = {
        let mut closer = CLOSER.lock().unwrap_or_else(|e| e.into_inner());
        if closer.as_ref().is_none_or(|(owner, _)| *owner != pid) {
            let (send, receive) = channel::<Entry>();
            let started = std::thread::Builder::new()
                .name("search-close".to_owned())
                .spawn(move || {
                    for entry in receive {
                        drop(entry);
                        QUEUED_CLOSES.fetch_sub(1, Ordering::SeqCst);
                    }
                })
                .ok()
                .map(|_| send);
            // An inherited sender's entries are the parent's connections: never closed here.
            std::mem::forget(closer.replace((pid, started)));
        }
        closer.as_ref().and_then(|(_, send)| send.clone())
    };
    for entry in entries {
        let unsent = match &send {
            Some(send) if take_queue_slot() => match send.send(entry) {
                Ok(()) => continue,
                Err(e) => {
                    QUEUED_CLOSES.fetch_sub(1, Ordering::SeqCst);
                    e.0
                }
            },
            _ => entry,
        };
        drop(unsent);
    }
}

/// Takes one of the [`MAX_QUEUED_CLOSES`] places in the closing thread's queue, if one is
/// free (the thread gives it back once it closed the connection).
fn take_queue_slot() -> bool {
    QUEUED_CLOSES
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < MAX_QUEUED_CLOSES).then_some(n + 1)
        })
        .is_ok()
}

impl HitFiles {
    /// Keeps at most `capacity` connections open.
    pub(crate) fn new(capacity: usize) -> HitFiles {
        HitFiles::with_quiet(capacity, QUIET)
    }

    /// As [`HitFiles::new`], reading files without locks once left alone for `quiet`.
    fn with_quiet(capacity: usize, quiet: Duration) -> HitFiles {
        HitFiles {
            capacity,
            quiet,
            kept: Mutex::new(Kept::default()),
        }
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The messages that events put at transcript positions of the session file `file`'s
    /// own history, for `wanted` `(position, event seq)` pairs, in order: each `None` when
    /// that row is gone or (with `current`) no longer current (see [`own_messages_at`]):
    /// without `current`, also a message that forks cut before its session replaced it
    /// still show. Uses the kept
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
        current: bool,
    ) -> Result<Vec<Option<Arc<Message>>>> {
        let stamp = match Stamp::of(file) {
            Ok(stamp) => stamp,
            Err(e) => {
                self.release(file);
                return Err(e);
            }
        };
        // Taken out while in use: the lock is not held during the read, and two searches
        // reading the same file at once each have a connection of their own.
        let kept = self.kept().entries.remove(file);
        let (mut entry, mut fresh) = match kept {
            Some(entry) if entry.reads(&stamp) => (entry, false),
            // Another file at that path now, the file changed under a connection without
            // locks, or none kept.
            other => {
                close_later(other);
                let unlocked = stamp.quiet(self.quiet, SystemTime::now());
                (self.open_entry(file, stamp, unlocked)?, true)
            }
        };
        let mut found = entry.read(wanted, current);
        if let Some(before) = entry.unlocked
            && Stamp::of(file).ok() != Some(before)
        {
            // Changed while read without locks: the read may be torn; read again, with
            // locks where the folder allows them (a file replaced meanwhile is caught
            // below).
            close_later(Some(entry));
            entry = self.open_entry(file, Stamp::of(file)?, false)?;
            fresh = true;
            found = entry.read(wanted, current);
        }
        let found = found?;
        // A file replaced while it was being opened: the connection may be on either, so
        // it is not kept.
        if fresh && identity_of(file).ok() != Some(stamp.identity) {
            return Ok(found);
        }
        self.keep(file, entry);
        Ok(found)
    }

    /// [`Entry::open`]; when the process has no file descriptor left, every kept
    /// connection is closed (at once, on this thread) and the open tried once more: the
    /// connections kept for later searches must not hold what the process needs now.
    fn open_entry(&self, file: &Path, stamp: Stamp, unlocked: bool) -> Result<Entry> {
        match Entry::open(file, stamp, unlocked) {
            Err(e) if e.is_exhaustion() => {
                let kept = std::mem::take(&mut self.kept().entries);
                if kept.is_empty() {
                    return Err(e);
                }
                drop(kept);
                Entry::open(file, stamp, unlocked)
            }
            opened => opened,
        }
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

    /// Whether the kept connection to `file` reads it without locks (for tests).
    #[cfg(test)]
    fn kept_unlocked(&self, file: &Path) -> Option<bool> {
        self.kept().entries.get(file).map(|e| e.unlocked.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SessionId;
    use crate::store::schema::SESSION_FILE;
    use crate::{Batch, CancelToken, CreateOptions, Event, Root, Session};

    /// Appends one user message `text` to `s` and flushes it.
    fn say(s: &Session, text: &str) {
        let event = Event::new("message/complete")
            .with_payload(
                &serde_json::json!({"message": {"id": text, "role": "user", "content": text}}),
            )
            .expect("payload");
        s.append(Batch::new(text, vec![event])).expect("append");
        s.flush().expect("flush");
    }

    /// Creates session `name` holding one user message `text`; returns its file and the
    /// `(position, seq)` of the message.
    fn session(root: &Root, name: &str, text: &str) -> (PathBuf, (u64, u64)) {
        let id = SessionId::new(name).expect("id");
        let s = root
            .create(CreateOptions::with_id(id.clone()))
            .expect("create");
        say(&s, text);
        s.close().expect("close");
        last_message(root, name)
    }

    /// The file of session `name` and the `(position, seq)` of its last message.
    fn last_message(root: &Root, name: &str) -> (PathBuf, (u64, u64)) {
        let id = SessionId::new(name).expect("id");
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
        Ok(files.messages_at(file, &[at], true)?[0]
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

    /// Long enough for a file's change time to be past [`HitFiles::with_quiet`]'s period
    /// of the tests below.
    const TEST_QUIET: Duration = Duration::from_millis(100);

    fn settle() {
        std::thread::sleep(TEST_QUIET + Duration::from_millis(50));
    }

    #[test]
    fn a_quiet_file_is_read_without_locks_until_a_writer_changes_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = Root::open(dir.path()).expect("root");
        let files = HitFiles::with_quiet(4, TEST_QUIET);
        let (file, first) = session(&root, "a", "one");
        // Just written: read with locks.
        assert_eq!(
            text_at(&files, &file, first).expect("read").as_deref(),
            Some("one")
        );
        assert_eq!(files.kept_unlocked(&file), Some(false));
        // Left alone: the kept connection still serves it; a new one has no locks.
        settle();
        assert!(text_at(&files, &file, first).expect("read").is_some());
        assert_eq!(files.kept_unlocked(&file), Some(false));
        files.release(&file);
        assert!(text_at(&files, &file, first).expect("read").is_some());
        assert_eq!(files.kept_unlocked(&file), Some(true));
        // A writer's commit, in the WAL only: read with locks, which see it.
        let writer = root
            .open_writer(&SessionId::new("a").expect("id"))
            .expect("writer");
        say(&writer, "two");
        let (_, second) = last_message(&root, "a");
        assert_ne!(first, second);
        assert_eq!(
            text_at(&files, &file, second).expect("read").as_deref(),
            Some("two")
        );
        assert_eq!(files.kept_unlocked(&file), Some(false));
        // Closed (checkpointed into the main file) and left alone: without locks again
        // once the kept connection is gone, and the new message is there.
        writer.close().expect("close");
        settle();
        files.release(&file);
        assert_eq!(
            text_at(&files, &file, second).expect("read").as_deref(),
            Some("two")
        );
        assert_eq!(files.kept_unlocked(&file), Some(true));
        // Written again after that: the connection without locks is not used for it.
        let writer = root
            .open_writer(&SessionId::new("a").expect("id"))
            .expect("writer");
        say(&writer, "three");
        writer.close().expect("close");
        let (_, third) = last_message(&root, "a");
        assert_eq!(
            text_at(&files, &file, third).expect("read").as_deref(),
            Some("three")
        );
        assert_eq!(files.kept_unlocked(&file), Some(false));
    }

    #[test]
    fn a_quiet_file_that_is_not_a_session_file_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = Root::open(dir.path()).expect("root");
        let files = HitFiles::with_quiet(4, TEST_QUIET);
        let (file, at) = session(&root, "a", "text");
        settle();
        assert!(text_at(&files, &file, at).expect("read").is_some());
        assert_eq!(files.kept_unlocked(&file), Some(true));
        // Altered in place (the change checkpointed into the main file on close).
        let conn = Connection::open(&file).expect("open");
        conn.execute_batch("CREATE TABLE intruder (x)")
            .expect("alter");
        conn.close().expect("close");
        for _ in 0..2 {
            assert!(matches!(
                text_at(&files, &file, at),
                Err(Error::Corrupt { .. })
            ));
            assert!(files.kept_files().is_empty());
            // Then again once the file is quiet: refused without locks too.
            settle();
        }
        // Another application's database in its place, quiet.
        std::fs::remove_file(&file).expect("rm");
        let other = Connection::open(&file).expect("create");
        other
            .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (x); INSERT INTO t VALUES (1)")
            .expect("fill");
        other.close().expect("close");
        settle();
        assert!(matches!(
            text_at(&files, &file, at),
            Err(Error::Corrupt { .. })
        ));
        assert!(files.kept_files().is_empty());
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
