//! A session file's pool of read-only connections, on the standard library's `Mutex` and
//! `Condvar` only.
//!
//! It replaced `r2d2` (with its `scheduled-thread-pool`), whose `parking_lot` keeps every
//! waiting thread in one process-wide table of wait queues, linked through memory of that
//! thread (its thread-local storage). r2d2's housekeeping thread waited there for good. A
//! child made by `fork()` inherits the table without the thread; once the child started a
//! thread of its own (a new pool's), the C library reused the dead thread's stack and
//! freed its thread-local storage, the memory was handed out again (to SQLite, for a
//! schema's text), and the child's next wait or wake-up in that queue followed a "pointer"
//! read from that text: a segmentation fault (the Python test forking a child crashed in
//! about 1 of 40 runs). A waiter on a standard `Condvar` is a counter in the condvar
//! itself: a child made by `fork()` inherits no other thread's memory through it.
//!
//! A connection is opened on the thread that asks for one, at most [`MAX_READERS`] per
//! file; a caller finding them all in use waits up to [`CONNECTION_TIMEOUT`] for one to
//! come back. A connection idle for [`IDLE_TIMEOUT`] is closed at the pool's next use (no
//! thread watches the pools), and every idle one when the pool is dropped.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::error::{Error, Result};
use crate::store::schema::{self, Access};

/// Read connections per session file at most.
const MAX_READERS: usize = 4;

/// How long a caller waits for a connection when [`MAX_READERS`] are in use.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection stays open unused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A session file's pool of read-only connections (cheap to clone: clones share it).
#[derive(Clone, Debug)]
pub(crate) struct ReadPool {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    file: Arc<Path>,
    access: Access,
    /// How long a caller waits when every connection is in use ([`CONNECTION_TIMEOUT`]).
    timeout: Duration,
    state: Mutex<State>,
    /// Notified when a connection comes back or a slot frees up.
    returned: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Idle connections, the least recently returned first.
    idle: Vec<Idle>,
    /// Connections open or being opened: idle, handed out, or being opened.
    open: usize,
}

#[derive(Debug)]
struct Idle {
    conn: Connection,
    since: Instant,
}

impl State {
    /// Takes out the idle connections unused for [`IDLE_TIMEOUT`] (the caller closes them
    /// once the lock is released).
    fn expired(&mut self) -> Vec<Idle> {
        let fresh = self
            .idle
            .iter()
            .position(|i| i.since.elapsed() < IDLE_TIMEOUT)
            .unwrap_or(self.idle.len());
        self.open -= fresh;
        self.idle.drain(..fresh).collect()
    }
}

impl ReadPool {
    /// The pool of `file` (opened with `access`); no connection is opened yet.
    ///
    /// # Errors
    /// [`Error::SessionNotFound`] when no file is at `file`.
    pub(crate) fn new(file: &Path, access: Access) -> Result<ReadPool> {
        schema::require_file(file)?;
        Ok(ReadPool::with_timeout(file, access, CONNECTION_TIMEOUT))
    }

    fn with_timeout(file: &Path, access: Access, timeout: Duration) -> ReadPool {
        ReadPool {
            shared: Arc::new(Shared {
                file: Arc::from(file),
                access,
                timeout,
                state: Mutex::new(State::default()),
                returned: Condvar::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle connection, else a new one (opened on this thread), else the first one
    /// handed back within the pool's timeout.
    ///
    /// # Errors
    /// [`Error::SessionNotFound`] when the file is gone; the open's error (an `Io` when the
    /// process has no descriptor left); [`Error::ReadConnection`] when every connection
    /// stayed in use for the whole timeout; a connection read as immutable of a file a
    /// writer has started on since ([`Access::still_valid`]) is `SQLITE_BUSY`.
    pub(crate) fn get(&self) -> Result<PooledConnection> {
        let file = &self.shared.file;
        if !self.shared.access.still_valid(file) {
            return Err(Error::Sqlite(crate::error::SqliteError::new(
                rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                    Some(format!(
                        "{} was read as immutable (its folder refuses new files) and a writer \
                     has started on it since: open the session again",
                        file.display()
                    )),
                ),
            )));
        }
        let deadline = Instant::now().checked_add(self.shared.timeout);
        let mut state = self.state();
        loop {
            let expired = state.expired();
            if let Some(idle) = state.idle.pop() {
                drop(state);
                drop(expired);
                return Ok(self.handed_out(idle.conn));
            }
            if state.open < MAX_READERS {
                state.open += 1;
                drop(state);
                drop(expired);
                return self.open();
            }
            let left = deadline.and_then(|d| d.checked_duration_since(Instant::now()));
            let Some(left) = left.filter(|left| !left.is_zero()) else {
                drop(state);
                if !file.is_file() {
                    return Err(Error::SessionNotFound(file.display().to_string()));
                }
                return Err(Error::ReadConnection(Arc::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "all {MAX_READERS} connections to {} stayed in use for {} ms",
                        file.display(),
                        self.shared.timeout.as_millis()
                    ),
                ))));
            };
            state = match self.shared.returned.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// Opens a connection in the slot the caller took; gives the slot back when it fails.
    fn open(&self) -> Result<PooledConnection> {
        let file = &self.shared.file;
        match schema::open_unchecked_reader(file, self.shared.access) {
            Ok(conn) => Ok(self.handed_out(conn)),
            Err(e) => {
                self.state().open -= 1;
                self.shared.returned.notify_one();
                // Gone since the pool was made (a delete renamed it away): said so at once.
                if let Err(gone @ Error::SessionNotFound(_)) = schema::require_file(file) {
                    return Err(gone);
                }
                Err(e)
            }
        }
    }

    fn handed_out(&self, conn: Connection) -> PooledConnection {
        PooledConnection {
            conn: Some(conn),
            pool: self.clone(),
        }
    }

    /// Idle connections and connections open (for tests).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let state = self.state();
        (state.idle.len(), state.open)
    }
}

/// A connection handed out by a [`ReadPool`]; back in the pool when dropped.
#[derive(Debug)]
pub(crate) struct PooledConnection {
    /// `None` only while it is being dropped.
    conn: Option<Connection>,
    pool: ReadPool,
}

impl std::ops::Deref for PooledConnection {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        // Some until dropped.
        self.conn.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for PooledConnection {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            let expired = {
                let mut state = self.pool.state();
                state.idle.push(Idle {
                    conn,
                    since: Instant::now(),
                });
                state.expired()
            };
            self.pool.shared.returned.notify_one();
            drop(expired);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("f.sqlite");
        Connection::open(&file)
            .expect("create")
            .execute_batch("CREATE TABLE t (x)")
            .expect("fill");
        (dir, file)
    }

    #[test]
    fn connections_are_used_again_and_at_most_four_are_open() {
        let (_dir, file) = file();
        let pool = ReadPool::with_timeout(&file, Access::Shared, Duration::from_millis(100));
        let first = pool.get().expect("first");
        drop(first);
        assert_eq!(pool.counts(), (1, 1));
        let held: Vec<_> = (0..MAX_READERS)
            .map(|_| pool.get().expect("one of four"))
            .collect();
        assert_eq!(pool.counts(), (0, MAX_READERS));
        // A fifth waits for the timeout: a retryable ReadConnection, its cause the source.
        let started = Instant::now();
        let e = pool.get().expect_err("all in use");
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(matches!(e, Error::ReadConnection(_)), "{e:?}");
        assert!(e.is_retryable());
        let source = std::error::Error::source(&e).expect("a source");
        assert!(source.to_string().contains("stayed in use"), "{source}");
        drop(held);
        // One handed back on another thread is taken by a waiter: a pool that waits long
        // enough for that thread to run on a loaded machine (100 ms was not always).
        let patient = ReadPool::with_timeout(&file, Access::Shared, Duration::from_secs(60));
        let held: Vec<_> = (0..MAX_READERS)
            .map(|_| patient.get().expect("one of four"))
            .collect();
        std::thread::scope(|s| {
            let mut held = held;
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                held.pop();
            });
            assert!(patient.get().is_ok());
        });
        assert_eq!(patient.counts(), (MAX_READERS, MAX_READERS));
    }

    #[test]
    fn a_failed_open_gives_its_slot_back_and_a_vanished_file_is_not_found() {
        let (_dir, file) = file();
        let pool = ReadPool::with_timeout(&file, Access::Shared, Duration::from_millis(100));
        std::fs::remove_file(&file).expect("rm");
        for _ in 0..=MAX_READERS {
            assert!(matches!(pool.get(), Err(Error::SessionNotFound(_))));
        }
        assert_eq!(pool.counts(), (0, 0));
    }
}
