//! The writer lock: an OS advisory lock (`flock` on Linux) on `writer.lock`.
//!
//! The kernel releases it when the holder dies, so a crashed writer never strands a
//! session. The holder writes who it is into the lock file (never a SQLite file, so
//! plain `std::fs` I/O is safe here) so that a refused opener can name it.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::cancel::CancelToken;
use crate::error::{Error, Result, WriterOwner};
use crate::store::schema::NO_FOLLOW;

/// How often a blocking acquire polls the lock.
const POLL: Duration = Duration::from_millis(10);

/// A held writer lock; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct WriterLock {
    /// The locked file.
    file: LockFd,
    /// Whether the owner record stays in the file when the lock is released
    /// ([`WriterLock::keep_record`]).
    keep_record: bool,
}

/// A descriptor of a lock file, in [`HELD`] from its open to its close. `flock` belongs to
/// the open file description, which a child made by `fork()` shares: while the child's
/// copy of the descriptor is open, the lock outlives the parent's release (a session
/// stayed locked for as long as a forked worker lived), even a lock the parent took after
/// the fork on a descriptor it had opened before. So every descriptor that may hold a
/// lock is recorded before any `fork()` can copy it, and used only under [`HELD`]'s lock,
/// which [`hold_for_fork`] takes across a fork: the child's [`close_inherited_locks`] then
/// finds each one free to close (outside testing P1, session 48: a descriptor locked but
/// not yet recorded, one whose mutex a parent thread held at the fork, and every
/// `dependents.lock` stayed open in children, refusing the parent its own session).
#[derive(Debug)]
struct LockFd {
    /// The file; `None` once [`close_inherited_locks`] closed it in a child.
    file: Arc<Mutex<Option<File>>>,
}

/// A lock file's descriptor this process holds, for [`close_inherited_locks`].
struct Held {
    pid: u32,
    file: Weak<Mutex<Option<File>>>,
}

/// Every lock file descriptor open in this process (writer locks, staging guards,
/// `dependents.lock`), with the id of the process that opened it. Its lock is taken
/// before any descriptor's own.
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// The registry of lock file descriptors, locked.
fn registry() -> std::sync::MutexGuard<'static, Vec<Held>> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes the registry's lock for a `fork()` (`persistence::fork_hold`), so that the child's
/// [`close_inherited_locks`] finds every lock file its parent held, none in use.
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    Box::new(registry())
}

impl LockFd {
    /// Opens the lock file at `path` with `open` ([`open_lock_file`] or
    /// [`open_lock_file_to_read`]) and records it, both under the registry's lock.
    fn open(path: &Path, open: fn(&Path) -> Result<File>) -> Result<LockFd> {
        let mut all = registry();
        let file = Arc::new(Mutex::new(Some(open(path)?)));
        all.retain(|h| h.file.strong_count() > 0);
        all.push(Held {
            pid: std::process::id(),
            file: Arc::downgrade(&file),
        });
        Ok(LockFd { file })
    }

    /// `f` of the file, under the registry's lock; `None` when the file was inherited
    /// through `fork()` and closed in this process.
    fn with<R>(&self, f: impl FnOnce(&mut File) -> R) -> Option<R> {
        let _all = registry();
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.as_mut().map(f)
    }

    /// Tries the lock, `shared` or exclusive: `Ok(false)` when another holder's lock
    /// refuses it.
    fn try_lock(&self, path: &Path, shared: bool) -> Result<bool> {
        let tried = self.with(|f| {
            if shared {
                f.try_lock_shared()
            } else {
                f.try_lock()
            }
        });
        match tried {
            Some(Ok(())) => Ok(true),
            Some(Err(TryLockError::WouldBlock)) | None => Ok(false),
            Some(Err(TryLockError::Error(e))) => {
                Err(Error::io(format!("lock {}", path.display()), e))
            }
        }
    }
}

impl Drop for LockFd {
    /// Closes the file under the registry's lock, so that no `fork()` copies it between
    /// the last use and the close.
    fn drop(&mut self) {
        let _all = registry();
        drop(self.file.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// Closes this process's copies of the lock files another process (the parent it was forked
/// from) held at the `fork()`, without touching them otherwise: the parent keeps its locks,
/// and they are released when the parent lets them go. Call it in the child right after a
/// `fork()` (the Python package does, through `os.register_at_fork`); the locks this process
/// took itself are left alone, so calling it elsewhere does nothing.
pub fn close_inherited_locks() {
    let pid = std::process::id();
    // The registry held by a parent thread at a fork made without `hold_for_fork` is never
    // released in the child: nothing can be found then.
    let mut all = match HELD.try_lock() {
        Ok(all) => all,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    all.retain(|h| {
        if h.pid == pid {
            return h.file.strong_count() > 0;
        }
        // Every use of a file is under the registry's lock, which this thread holds: none
        // is in use.
        if let Some(file) = h.file.upgrade()
            && let Ok(mut file) = file.try_lock()
        {
            drop(file.take());
        }
        false
    });
}

/// Opens (creating) a lock file without following a symlink and without waiting: a
/// symlink, a folder, a FIFO or any other file that is not a regular one there is
/// [`Error::InvalidInput`] and left untouched (a FIFO planted as `writer.lock` made every
/// command that looked at the session's writer, `list` of the whole root included, wait
/// forever reading it).
fn open_lock_file(path: &Path) -> Result<File> {
    open_checked(
        path,
        OpenOptions::new().write(true).create(true).truncate(false),
    )
}

/// Opens a lock file read-only (`flock` needs no write access), as [`open_lock_file`] does
/// otherwise: never created, never through a symlink, refused unless a regular file.
fn open_lock_file_to_read(path: &Path) -> Result<File> {
    open_checked(path, &mut OpenOptions::new())
}

/// Opens `path` for reading with `options` besides, `O_NOFOLLOW` and `O_NONBLOCK`, and
/// refuses it unless it is a regular file.
fn open_checked(path: &Path, options: &mut OpenOptions) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = options
        .read(true)
        .custom_flags(NO_FOLLOW | NON_BLOCKING)
        .open(path)
        .map_err(|e| refused_or_io(path, e))?;
    match file.metadata() {
        Ok(m) if m.is_file() => Ok(file),
        Ok(m) if m.is_dir() => Err(not_a_lock_file(path, "a directory")),
        Ok(_) => Err(not_a_lock_file(path, "not a regular file")),
        Err(e) => Err(Error::io(format!("stat {}", path.display()), e)),
    }
}

/// `O_NONBLOCK`: an open of a FIFO or device does not wait for its other end.
const NON_BLOCKING: i32 = rustix::fs::OFlags::NONBLOCK.bits().cast_signed();

/// `ELOOP` from an `O_NOFOLLOW` open is a symlink and `EISDIR` a folder: clear refusals;
/// anything else is I/O.
fn refused_or_io(path: &Path, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => {
            not_a_lock_file(path, "a symlink")
        }
        Some(code) if code == rustix::io::Errno::ISDIR.raw_os_error() => {
            not_a_lock_file(path, "a directory")
        }
        _ => Error::io(format!("open {}", path.display()), e),
    }
}

/// The refusal of a lock file that is `what` instead of a regular file.
fn not_a_lock_file(path: &Path, what: &str) -> Error {
    Error::invalid(format!(
        "{} is {what}; refused (a lock file must be a regular file of the session folder)",
        path.display()
    ))
}

impl WriterLock {
    /// Takes the lock without waiting; `None` when someone else holds it.
    pub(crate) fn try_acquire(path: &Path) -> Result<Option<WriterLock>> {
        let file = LockFd::open(path, open_lock_file)?;
        // Made only once locked: a `WriterLock` dropped clears the record in the file.
        Ok(file.try_lock(path, false)?.then(|| WriterLock {
            file,
            keep_record: false,
        }))
    }

    /// Whether `path` still names the file this lock holds (same device and inode). A
    /// lock taken on a file that another process unlinked meanwhile guards nothing: the
    /// next opener of `path` creates a new file and locks that one.
    pub(crate) fn is_at(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some(Ok(held)) = self.file.with(|f| f.metadata()) else {
            return false;
        };
        match std::fs::symlink_metadata(path) {
            Ok(named) => held.dev() == named.dev() && held.ino() == named.ino(),
            Err(_) => false,
        }
    }

    /// Waits for the lock until it is free or `cancel` fires ([`Error::Cancelled`]).
    pub(crate) fn acquire(path: &Path, cancel: &CancelToken) -> Result<WriterLock> {
        loop {
            if cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            if let Some(lock) = Self::try_acquire(path)? {
                return Ok(lock);
            }
            std::thread::sleep(POLL);
        }
    }

    /// Leaves the owner record in the file when the lock is released, as a writer that
    /// died leaves it: for a writer that closed with commits the search index could not
    /// take (another process held the index meanwhile), so that searches catch the session
    /// up as they catch up a dead writer's (outside testing, session 43: no search found
    /// those commits until a rebuild or the session's next writer). A later
    /// [`WriterLock::record_owner`] undoes it.
    pub(crate) fn keep_record(&mut self) {
        self.keep_record = true;
    }

    /// Records the owner in the lock file for diagnostics.
    pub(crate) fn record_owner(&mut self, owner: &WriterOwner) -> Result<()> {
        self.keep_record = false;
        let text = serde_json::to_vec(owner).unwrap_or_default();
        let write = |f: &mut File| -> std::io::Result<()> {
            f.set_len(0)?;
            f.seek(SeekFrom::Start(0))?;
            f.write_all(&text)
        };
        match self.file.with(write) {
            Some(written) => written.map_err(|e| Error::io("record writer owner", e)),
            None => Err(Error::invalid(
                "the writer lock was inherited through fork() and closed in this process",
            )),
        }
    }

    /// Syncs the owner record to disk. A record left in an unlocked file is how searches
    /// learn that a writer died with commits the search index may lack, so a writer's must
    /// outlive a power cut as its commits do (outside testing, power loss: unsynced, it
    /// could be lost while they survived, and no search found them until a rebuild).
    pub(crate) fn sync_record(&self) -> Result<()> {
        self.file
            .with(|f| f.sync_data())
            .unwrap_or(Ok(()))
            .map_err(|e| Error::io("sync writer owner record", e))
    }
}

impl Drop for WriterLock {
    /// Clears the owner record before the lock is released, so a record found in an
    /// unlocked file can only come from a holder that died (or one that closed with
    /// commits the search index lacks, [`WriterLock::keep_record`]).
    fn drop(&mut self) {
        if self.keep_record {
            return;
        }
        let _ = self.file.with(|f| f.set_len(0));
    }
}

/// Whether a writer holds the lock at `path` now. Probes through a read-only descriptor
/// (`flock` needs no write access), never creates or writes the file, so it works on a
/// root the caller can only read; a missing lock file is a free lock.
pub(crate) fn is_held(path: &Path) -> Result<bool> {
    let file = match LockFd::open(path, open_lock_file_to_read) {
        Ok(file) => file,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    Ok(!file.try_lock(path, false)?)
}

fn process_alive(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}

/// How long a refused opener waits for the holder's final record (a holder that just
/// took the lock writes a provisional record at once and the final one after its lease
/// transaction, which a loaded machine can delay).
const RECORD_WAIT: Duration = Duration::from_secs(2);

/// Whether [`recorded_owner`] waits for a holder's final record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordWait {
    /// Up to [`RECORD_WAIT`]: a refusal names the writer by its lease.
    ForFinal,
    /// A provisional record as it is: a listing of who writes what now does not wait for
    /// the final one (a session list of `serve` waited 2 s whenever a writer had just
    /// taken a lock: outside testing, a soak). An empty record is waited for all the same.
    AsItIs,
}

/// The owner recorded in a held lock file. A holder writes a provisional record
/// (generation 0) right after taking the lock and the final one once its lease is
/// committed; an empty or dead-process record is not written yet. With
/// [`RecordWait::ForFinal`], waits briefly for the final record, then settles for the
/// provisional one; `None` at once when the file is gone (a delete moved its folder away).
pub(crate) fn recorded_owner(path: &Path, wait: RecordWait) -> Option<WriterOwner> {
    let deadline = std::time::Instant::now() + RECORD_WAIT;
    let mut provisional = None;
    loop {
        let mut text = String::new();
        let read = match open_lock_file_to_read(path) {
            Ok(mut file) => file
                .read_to_string(&mut text)
                .map_err(|e| Error::io("read", e)),
            Err(e) => Err(e),
        };
        // The folder was moved away (its session deleted), or the file is none a writer
        // records itself in: no record will come.
        if matches!(&read, Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound)
            || matches!(&read, Err(Error::InvalidInput { .. }))
        {
            return None;
        }
        if let (Ok(_), Ok(owner)) = (read, serde_json::from_str::<WriterOwner>(&text))
            && process_alive(owner.pid)
        {
            // A writer's record once its lease is committed; a delete's at once.
            if owner.generation > 0 || owner.holding_for.is_some() {
                return Some(owner);
            }
            provisional = Some(owner);
        }
        // Nothing readable yet (the holder has just taken the lock): waited for as a final
        // record is, else the file's lease, the last writer's, was named instead.
        if (wait == RecordWait::AsItIs && provisional.is_some())
            || std::time::Instant::now() >= deadline
        {
            return provisional;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The lock file that orders forks against deletion of the sessions they inherit from.
pub(crate) const DEPENDENTS_LOCK_FILE: &str = "dependents.lock";

/// A held lock on a session's `dependents.lock`: shared while a fork records itself and
/// publishes, exclusive while a delete materialises dependents and removes the session.
#[derive(Debug)]
pub(crate) struct DependentsLock {
    _file: LockFd,
}

impl DependentsLock {
    /// Takes the shared lock, waiting up to `wait` for a delete in progress to finish:
    /// `None` when the delete still holds it then.
    pub(crate) fn shared_within(path: &Path, wait: Duration) -> Result<Option<DependentsLock>> {
        let file = LockFd::open(path, open_lock_file)?;
        let deadline = std::time::Instant::now() + wait;
        while !file.try_lock(path, true)? {
            if std::time::Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
        Ok(Some(DependentsLock { _file: file }))
    }

    /// Takes the exclusive lock, waiting for forks in progress until `cancel` fires.
    pub(crate) fn exclusive(path: &Path, cancel: &CancelToken) -> Result<DependentsLock> {
        let file = LockFd::open(path, open_lock_file)?;
        loop {
            if cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            if file.try_lock(path, false)? {
                return Ok(DependentsLock { _file: file });
            }
            std::thread::sleep(POLL);
        }
    }
}
