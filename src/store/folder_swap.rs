//! Opening a shared read connection to a root's file while its folder may be swapped: a
//! delete renames a session's folder away and a create, import, fork or restore renames a
//! new one into its place.
//!
//! SQLite opens a file's `-wal` and `-shm` by name, at the connection's first read, not
//! when it opens the file. A reader that opened the file of a folder deleted since, and
//! made its first read after a new folder took the name, paired the old file with the new
//! folder's `-wal` and `-shm`:
//!
//! - In another process it read pages of the new log over the old file (a wrong answer, or
//!   "database disk image is malformed"). [`open_shared`] catches it: the file at the path
//!   must be the same one before the open and after the first read, else it opens again.
//! - In the same process it also broke the new file's writer. SQLite tells whether another
//!   connection uses a `-shm` by a POSIX lock, which never conflicts with the process's own
//!   locks, and it keys its in-process bookkeeping by the file's inode, here the old one:
//!   the reader took itself for the only user, emptied the `-shm` and rebuilt it, under the
//!   writer's open connection, whose next read missed its own commits (a writer's close
//!   failed with "stale writer generation 1: the lease is now at 0"). A process-wide
//!   read-write lock keeps that from happening: an open up to its first read holds it
//!   shared ([`open_shared`]), a rename into the root holds it exclusively
//!   ([`publishing`]), so a new folder never takes a name between a reader's open and its
//!   first read in this process.
//!
//! A process that calls `fork()` while other threads may be in [`open_shared`] takes the
//! lock around it ([`hold_for_fork`]): a child that inherited it held by a thread it does
//! not have would wait for it for good.

use std::any::Any;
use std::path::Path;
use std::sync::RwLock;

use rusqlite::Connection;

use crate::error::{Error, Result};

/// Held shared from a reader's open to its first read, exclusively by a rename into a root.
static SWAP: RwLock<()> = RwLock::new(());

/// How many times [`open_shared`] opens a file that was replaced during each open.
const OPEN_ATTEMPTS: usize = 3;

/// Which file is at `path` now (device, inode and, where the file system keeps it, the
/// time it was made: a file made after a delete may get the freed inode number), `None`
/// when there is none. A symlink is not followed.
pub(crate) fn file_identity(path: &Path) -> Option<(u64, u64, Option<std::time::SystemTime>)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.created().ok()))
}

/// Runs `rename`, a rename that puts a folder at a name in a root, while no reader of this
/// process is between its open and its first read.
pub(crate) fn publishing<T>(rename: impl FnOnce() -> T) -> T {
    let _swap = SWAP.write().unwrap_or_else(|e| e.into_inner());
    rename()
}

/// Opens `path` with `open`, runs `first_read` on it (which opens its `-wal` and `-shm`),
/// and returns the connection once the file at `path` was the same before the open and
/// after that read. Opens again when it was not, up to [`OPEN_ATTEMPTS`] times.
///
/// # Errors
/// [`Error::SessionNotFound`] when no file is at `path`, or a different one each time;
/// `open`'s and `first_read`'s errors.
pub(crate) fn open_shared(
    path: &Path,
    open: impl Fn() -> Result<Connection>,
    first_read: impl Fn(&Connection) -> Result<()>,
) -> Result<Connection> {
    for _ in 0..OPEN_ATTEMPTS {
        let Some(before) = file_identity(path) else {
            break;
        };
        let conn = {
            let _swap = SWAP.read().unwrap_or_else(|e| e.into_inner());
            let conn = open()?;
            first_read(&conn)?;
            conn
        };
        if file_identity(path) == Some(before) {
            return Ok(conn);
        }
    }
    Err(Error::SessionNotFound(path.display().to_string()))
}

/// Takes the lock for a `fork()` (`persistence::fork_hold`): held, no reader of this
/// process is between its open and its first read, and no rename into a root is under way.
pub(crate) fn hold_for_fork() -> Box<dyn Any> {
    Box::new(SWAP.write().unwrap_or_else(|e| e.into_inner()))
}

/// Whether no thread holds the lock (a test's check of [`hold_for_fork`]).
#[cfg(test)]
pub(crate) fn is_free() -> bool {
    SWAP.try_write().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_replaced_during_each_open_is_not_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f.sqlite");
        Connection::open(&file).expect("make");
        let opens = std::cell::Cell::new(0);
        let replacing = |conn: &Connection| {
            opens.set(opens.get() + 1);
            let _ = conn;
            let next = dir.path().join("next.sqlite");
            Connection::open(&next).expect("make");
            std::fs::rename(&next, &file).expect("replace");
            Ok(())
        };
        let open = || Ok(Connection::open(&file)?);
        assert!(matches!(
            open_shared(&file, open, replacing),
            Err(Error::SessionNotFound(_))
        ));
        assert_eq!(opens.get(), OPEN_ATTEMPTS);
        // Left alone, the first open is the one.
        let kept = open_shared(&file, open, |_| Ok(())).expect("open");
        drop(kept);
        std::fs::remove_file(&file).expect("rm");
        assert!(matches!(
            open_shared(&file, open, |_| Ok(())),
            Err(Error::SessionNotFound(_))
        ));
    }
}
