//! The one error type of the crate.

use std::fmt;

/// Who holds a session's writer lock, as recorded by the holder.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct WriterOwner {
    /// Random id of the owning writer instance.
    pub owner_id: String,
    /// Host name of the owning process.
    pub host: String,
    /// Process id of the owning process.
    pub pid: u32,
    /// Lease generation the owner holds.
    pub generation: u64,
    /// When the owner took the lease, milliseconds since the Unix epoch.
    pub since_ms: i64,
    /// What the holder holds the lock for when it is no writer and takes no lease:
    /// `"delete"` while a delete (also `gc`'s) copies the session into its forks and
    /// removes it; `None` for a writer. Not written for a writer, so an earlier build
    /// reads every record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holding_for: Option<String>,
}

impl fmt::Display for WriterOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = match (&self.holding_for, self.generation) {
            (Some(what), _) => format!("a {what} in progress,"),
            // A provisional record: the lock's holder has no lease (a delete, which never
            // takes one, or a writer still opening); "generation 0" read as a writer's.
            (None, 0) => {
                "holding the writer lock without a lease: a delete, or a writer still opening;"
                    .to_owned()
            }
            (None, generation) => format!("generation {generation},"),
        };
        // A writer of this very process (a prepared runtime not published yet, a session
        // opened twice) read as some other program's.
        let own = if self.pid == std::process::id() && self.host == host_name() {
            " (this process)"
        } else {
            ""
        };
        write!(
            f,
            "pid {}{own} on host {} ({held} since {} UTC)",
            self.pid,
            self.host,
            utc(self.since_ms)
        )
    }
}

/// This machine's host name, as a writer records it in its lock ([`WriterOwner::host`]).
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS` (UTC), as messages and the
/// CLI print times.
///
/// ```
/// assert_eq!(session_store::utc(0), "1970-01-01 00:00:00");
/// assert_eq!(session_store::utc(1_796_336_102_082), "2026-12-03 22:15:02");
/// ```
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Characters of a caller's value an error message quotes at most.
const QUOTED_CHARS: usize = 64;

/// `value` quoted for an error message (Rust string escapes, so control characters are
/// visible), cut to its first 64 characters plus `… (N bytes)` when longer: a huge kind,
/// id or cursor is never echoed whole.
///
/// ```
/// assert_eq!(session_store::quoted("a\nb"), r#""a\nb""#);
/// let long = "k".repeat(5_000_000);
/// assert_eq!(session_store::quoted(&long), format!("{:?}… (5000000 bytes)", "k".repeat(64)));
/// ```
pub fn quoted(value: &str) -> String {
    match value.char_indices().nth(QUOTED_CHARS) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &value[..cut], value.len()),
    }
}

/// `message`, an error's text, naming the process's file size limit (`ulimit -f`,
/// `prlimit --fsize`) when one is set and the text is of a write that may have met it
/// (SQLite's "disk I/O error" or "disk full", the OS's "File too large"): a write past the
/// limit fails with `EFBIG` (once SIGXFSZ is caught or ignored), which SQLite reports as a
/// plain "disk I/O error", not saying why a small file could not grow. Any other text, or
/// no limit, is returned as it is. The CLI's error line and the Python package's
/// exceptions both go through it.
pub fn naming_file_size_limit(message: String) -> String {
    let Some(limit) = rustix::process::getrlimit(rustix::process::Resource::Fsize).current else {
        return message;
    };
    if ["disk I/O error", "disk full", "File too large"]
        .iter()
        .any(|sign| message.contains(sign))
    {
        format!("{message} (this process may write no file over {limit} bytes: see `ulimit -f`)")
    } else {
        message
    }
}

/// Everything that can go wrong, as variants a caller can match, and classifiers
/// ([`Error::is_retryable`], [`Error::is_not_found`], [`Error::writer_owner`],
/// [`Error::is_corrupt`], [`Error::is_caller_error`], …) a host can branch on instead.
///
/// Bad input (`InvalidInput`, `InvalidPayload`, `UnsupportedVersion` for an unknown
/// required kind, `OperationConflict`) never changes anything on disk. Where a failure has a
/// cause (an OS error, an SQLite error, the JSON parse error of a corrupt row or of a
/// payload that is not JSON, the failed write behind a poisoned session), the cause is the
/// error's [`source`](std::error::Error::source), typed; an [`Error::InvalidPayload`] (JSON
/// its kind's schema refuses) says why in its `reason` and has none. `Error` is `Clone`:
/// its OS and SQLite causes are shared.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something malformed or not allowed: an id, a batch, an option, a
    /// cursor, a call the handle's state forbids, or a path that is not what it must be (a
    /// symlink, a non-regular file). Nothing changed on disk; sending the same again fails
    /// the same way.
    InvalidInput {
        /// What is wrong with the input.
        what: String,
        /// Why it was refused, when a lower-level error said so (the `serde_json::Error`
        /// of a payload or line that is not JSON).
        source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// An event payload does not match its kind's schema.
    InvalidPayload {
        /// The event kind.
        kind: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No session with this id exists under the root.
    SessionNotFound(String),
    /// A session with this id already exists.
    SessionExists(String),
    /// The id's name in the root is taken by something that is no session (a folder
    /// without a session file, a file, a symlink): nothing can list, open or delete it, so
    /// no session of that id can be made until it is moved or removed.
    /// [`Error::is_already_exists`] is true, as for [`Error::SessionExists`].
    InTheWay {
        /// The id that was to be made.
        id: String,
        /// What is in the way: its path in the root.
        path: std::path::PathBuf,
        /// What it is ("a folder without a session file (session.sqlite)", "a file").
        what: String,
    },
    /// The file an export was to write already exists (a file or a symlink): the path as
    /// given.
    DestinationExists(std::path::PathBuf),
    /// Another writer (in this process or another) owns the session.
    WriterOwned {
        /// The session.
        session: String,
        /// The current owner, as it recorded itself.
        owner: WriterOwner,
    },
    /// The operation id was used before with different content.
    OperationConflict {
        /// The reused operation id.
        operation_id: String,
    },
    /// A file, schema or event kind newer than this build understands.
    UnsupportedVersion {
        /// What is newer (a schema version, an event kind).
        what: String,
        /// The error that refused it, when a lower-level one did (the schema migrations'
        /// `rusqlite_migration::Error` for a file of a newer schema).
        source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// A file that is damaged or not a session file.
    Corrupt {
        /// What is wrong where (the file, event, blob, row or index).
        what: String,
        /// The error that found the damage, when a lower-level one did: SQLite's
        /// (`SQLITE_CORRUPT`, `SQLITE_NOTADB`, an undecodable value), a `serde_json::Error`
        /// (a stored payload or row that is not the JSON it must be), the `std::io::Error` of
        /// a blob that does not decompress.
        source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// The session (a writer, a runtime, a prepared runtime) was closed; it accepts
    /// nothing more.
    Closed,
    /// The [`Service`](crate::Service) was shut down: it opens, creates and publishes
    /// nothing more (a new service over the root does).
    ServiceShutDown,
    /// Another writer took the lease: this handle is fenced off.
    StaleGeneration {
        /// The generation this handle holds.
        ours: u64,
        /// The generation in the file.
        current: u64,
    },
    /// An earlier write failed in a way that leaves its outcome unknown; reopen the session.
    /// The source is that write's error.
    Poisoned(Box<Error>),
    /// The last write failed cleanly; the accepted tail is kept and the next `flush`
    /// retries. The source is that write's error (e.g. [`Error::DiskFull`]).
    PersistenceFailed(Box<Error>),
    /// The disk (or its quota) is full. The source is SQLite's `SQLITE_FULL` error (or, for
    /// a reader that could not grow the file's `-shm`, `SQLITE_IOERR_SHMSIZE`).
    DiskFull(SqliteError),
    /// The wait was cancelled by the caller.
    Cancelled,
    /// The fork or rewind cut does not fall on a commit boundary.
    ForkBoundaryNotAtomic(String),
    /// The fork or rewind prefix leaves an open turn or a pending interaction.
    ForkActiveAuthority(String),
    /// The runtime is running, cancelling or needs recovery: the session id.
    RuntimeBusy(String),
    /// Client bindings are still attached to the runtime: the session id.
    RuntimeBound(String),
    /// No runtime is attached for this session: the session id.
    SessionNotRunning(String),
    /// The execution no longer owns commit authority (it was cancelled or replaced): the
    /// session id.
    StaleExecution(String),
    /// The runtime needs a recovery decision before new work: the session id.
    RecoveryRequired(String),
    /// No read connection to a session file could be had in time: the pool's every
    /// connection stayed in use for its whole timeout (5 s). The source says so.
    ReadConnection(std::sync::Arc<dyn std::error::Error + Send + Sync>),
    /// An invariant inside the library broke (a bug, or a worker task that panicked), not
    /// anything the caller did. The source, when there is one, is what failed.
    Internal {
        /// What the library was doing.
        context: String,
        /// What failed, when a lower-level error did.
        source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// An operating-system I/O error.
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::sync::Arc<std::io::Error>,
    },
    /// Any other SQLite error.
    Sqlite(SqliteError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidInput { what, source } => {
                write!(f, "invalid input: {what}")?;
                with_cause(f, source)
            }
            Error::InvalidPayload { kind, reason } => write!(f, "invalid {kind} payload: {reason}"),
            Error::SessionNotFound(id) => write!(f, "session {id} not found"),
            Error::SessionExists(id) => write!(f, "session {id} already exists"),
            Error::InTheWay { id, path, what } => write!(
                f,
                "{} is in the way: {what}, so session {id} cannot be made there; move or \
                 remove it",
                path.display()
            ),
            Error::DestinationExists(path) => write!(
                f,
                "export destination {} already exists; give the path of a new file",
                path.display()
            ),
            Error::WriterOwned { session, owner } => {
                write!(f, "session {session} is owned by another writer: {owner}")
            }
            Error::OperationConflict { operation_id } => write!(
                f,
                "operation id {} conflicts with an earlier batch",
                quoted(operation_id)
            ),
            Error::UnsupportedVersion { what, source } => {
                write!(f, "not supported by this build: {what}")?;
                with_cause(f, source)
            }
            Error::Corrupt { what, source } => {
                write!(f, "corrupt session store: {what}")?;
                with_cause(f, source)
            }
            Error::Closed => f.write_str("session is closed"),
            Error::ServiceShutDown => f.write_str(
                "the service is shut down: it opens, creates and publishes nothing more",
            ),
            Error::StaleGeneration { ours, current } => write!(
                f,
                "stale writer generation {ours}: the lease is now at {current}"
            ),
            Error::Poisoned(cause) => write!(
                f,
                "writer poisoned by an earlier failure, reopen the session: {cause}"
            ),
            Error::PersistenceFailed(cause) => {
                write!(f, "persistence failed, accepted tail kept: {cause}")
            }
            Error::DiskFull(cause) => write!(f, "disk full: {cause}"),
            Error::Cancelled => f.write_str("operation cancelled"),
            Error::ForkBoundaryNotAtomic(what) => {
                write!(f, "the cut is not at a batch boundary: {what}")
            }
            Error::ForkActiveAuthority(what) => {
                write!(
                    f,
                    "the cut leaves a turn open or an interaction pending: {what}"
                )
            }
            Error::RuntimeBusy(id) => write!(
                f,
                "session {id}: runtime is busy (an execution runs or is being cancelled)"
            ),
            Error::RuntimeBound(id) => {
                write!(f, "session {id}: runtime still has client bindings")
            }
            Error::SessionNotRunning(id) => {
                write!(f, "session {id} is not running (no runtime attached)")
            }
            Error::StaleExecution(id) => write!(
                f,
                "session {id}: execution no longer owns commit authority (cancelled or \
                 replaced)"
            ),
            Error::RecoveryRequired(id) => {
                write!(f, "session {id}: runtime requires recovery")
            }
            Error::ReadConnection(cause) => {
                write!(f, "no read connection to the session file: {cause}")
            }
            Error::Internal { context, source } => {
                write!(f, "internal error: {context}")?;
                with_cause(f, source)
            }
            Error::Io { context, source } => write!(f, "{context}: {source}"),
            Error::Sqlite(cause) => write!(f, "sqlite: {cause}"),
        }
    }
}

/// A message's `: cause` ending, when there is a cause: every variant with a source ends
/// its message with it (the CLI's one-line chain knows and does not repeat it).
fn with_cause(
    f: &mut fmt::Formatter<'_>,
    source: &Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
) -> fmt::Result {
    match source {
        Some(cause) => write!(f, ": {cause}"),
        None => Ok(()),
    }
}

/// The source is the cause itself (an [`std::io::Error`], the SQLite binding's error, the
/// [`Error`] of the failed write, the pool's error, the `serde_json::Error` behind a corrupt
/// row or a refused input), not the `Arc` that shares it, so
/// `source().and_then(|s| s.downcast_ref::<std::io::Error>())` works.
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Poisoned(cause) | Error::PersistenceFailed(cause) => Some(&**cause),
            Error::DiskFull(cause) | Error::Sqlite(cause) => Some(cause.cause()),
            Error::Io { source, .. } => Some(&**source),
            Error::ReadConnection(cause) => Some(&**cause),
            Error::InvalidInput { source, .. }
            | Error::UnsupportedVersion { source, .. }
            | Error::Corrupt { source, .. }
            | Error::Internal { source, .. } => source.as_deref().map(|s| s as _),
            _ => None,
        }
    }
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Classifiers: what a host (and the CLI's exit codes) needs to decide, without matching
/// variants or text. Each looks at this error only, not at its sources: a
/// [`Error::Poisoned`] whose cause was corrupt is "reopen", not "corrupt".
impl Error {
    /// True when the same call may succeed later without reopening anything: nothing was
    /// lost and nothing needs a decision, only time or space. Covers [`Error::DiskFull`],
    /// an [`Error::Io`] of a full disk or quota (`ENOSPC`, `EDQUOT`: what a writer open,
    /// a staging folder or an export's file met outside SQLite), [`Error::PersistenceFailed`]
    /// (the accepted tail is kept; `flush` retries it), SQLite's `SQLITE_BUSY` /
    /// `SQLITE_LOCKED` ([`Error::Sqlite`]) and [`Error::ReadConnection`].
    pub fn is_retryable(&self) -> bool {
        self.is_retryable_write()
            || self.is_disk_full_io()
            || matches!(self, Error::PersistenceFailed(_) | Error::ReadConnection(_))
    }

    /// True for an [`Error::Io`] whose OS error is a full disk or quota.
    fn is_disk_full_io(&self) -> bool {
        use rustix::io::Errno;
        self.is_io_errno(&[Errno::NOSPC, Errno::DQUOT])
    }

    /// True for an [`Error::Io`] whose OS error is one of `errnos`.
    fn is_io_errno(&self, errnos: &[rustix::io::Errno]) -> bool {
        match self {
            Error::Io { source, .. } => source
                .raw_os_error()
                .is_some_and(|code| errnos.iter().any(|e| e.raw_os_error() == code)),
            _ => false,
        }
    }

    /// True when what was asked for does not exist: [`Error::SessionNotFound`], or an
    /// [`Error::Io`] of kind `NotFound` (a file or folder the caller named is missing).
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::SessionNotFound(_) => true,
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            _ => false,
        }
    }

    /// True when the name to create is taken: [`Error::SessionExists`] (a session id, a
    /// published runtime), [`Error::InTheWay`] (a session id taken by something that is no
    /// session) or [`Error::DestinationExists`] (an export's file).
    pub fn is_already_exists(&self) -> bool {
        matches!(
            self,
            Error::SessionExists(_) | Error::InTheWay { .. } | Error::DestinationExists(_)
        )
    }

    /// The writer that owns the session, for [`Error::WriterOwned`] (another writer, in
    /// this process or another, holds the session's writer lock); `None` otherwise.
    pub fn writer_owner(&self) -> Option<&WriterOwner> {
        match self {
            Error::WriterOwned { owner, .. } => Some(owner),
            _ => None,
        }
    }

    /// True for [`Error::WriterOwned`]: [`Error::writer_owner`] says who.
    pub fn is_writer_owned(&self) -> bool {
        self.writer_owner().is_some()
    }

    /// True when a file is damaged or is not a session file: [`Error::Corrupt`] (SQLite's
    /// `SQLITE_CORRUPT` / `SQLITE_NOTADB`, undecodable rows, hash, sequence, blob or index
    /// mismatches). Retrying does not help; `verify` names the problem.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }

    /// True when a file, schema or event kind is newer than this build:
    /// [`Error::UnsupportedVersion`]. A newer build may read it.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::UnsupportedVersion { .. })
    }

    /// True when the caller's request is refused as given and nothing changed on disk:
    /// [`Error::InvalidInput`], [`Error::InvalidPayload`], [`Error::OperationConflict`],
    /// [`Error::ForkBoundaryNotAtomic`] and [`Error::ForkActiveAuthority`]. Sending the
    /// same again fails the same way; fix the request. (An unknown required event kind is
    /// [`Error::is_unsupported`].)
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            Error::InvalidInput { .. }
                | Error::InvalidPayload { .. }
                | Error::OperationConflict { .. }
                | Error::ForkBoundaryNotAtomic(_)
                | Error::ForkActiveAuthority(_)
        )
    }

    /// True when this handle can do no more writes and the session must be opened again
    /// (after the owner, if any, lets go): [`Error::Poisoned`] (an uncertain write),
    /// [`Error::StaleGeneration`] (another writer took the lease) and [`Error::Closed`].
    pub fn needs_reopen(&self) -> bool {
        matches!(
            self,
            Error::Poisoned(_) | Error::StaleGeneration { .. } | Error::Closed
        )
    }

    /// True for [`Error::Internal`]: an invariant inside the library broke (a bug to
    /// report), not anything the caller did.
    pub fn is_internal(&self) -> bool {
        matches!(self, Error::Internal { .. })
    }
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source: std::sync::Arc::new(source),
        }
    }

    /// An [`Error::InvalidInput`] without a lower-level cause: `what` says what is wrong.
    pub(crate) fn invalid(what: impl Into<String>) -> Self {
        Error::InvalidInput {
            what: what.into(),
            source: None,
        }
    }

    /// An [`Error::InvalidInput`] whose cause is `source` (the parse error of the input):
    /// `what` says which input.
    pub(crate) fn invalid_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::InvalidInput {
            what: what.into(),
            source: Some(std::sync::Arc::new(source)),
        }
    }

    /// An [`Error::Corrupt`] the library found itself: `what` says what is wrong where.
    pub(crate) fn corrupt(what: impl Into<String>) -> Self {
        Error::Corrupt {
            what: what.into(),
            source: None,
        }
    }

    /// An [`Error::Corrupt`] that `source` found (SQLite's error, a JSON parse error, a
    /// decompression error): `what` says what was being read.
    pub(crate) fn corrupt_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Corrupt {
            what: what.into(),
            source: Some(std::sync::Arc::new(source)),
        }
    }

    /// This error with `context()` put before what an [`Error::Corrupt`] says (where the
    /// damage is: the session, the position); any other error unchanged.
    pub(crate) fn corrupt_in(self, context: impl FnOnce() -> String) -> Self {
        match self {
            Error::Corrupt { what, source } => Error::Corrupt {
                what: format!("{}: {what}", context()),
                source,
            },
            other => other,
        }
    }

    /// An [`Error::UnsupportedVersion`] without a lower-level cause: `what` is newer than
    /// this build.
    pub(crate) fn unsupported(what: impl Into<String>) -> Self {
        Error::UnsupportedVersion {
            what: what.into(),
            source: None,
        }
    }

    /// An [`Error::Internal`] without a lower-level cause: `context` says what broke.
    pub(crate) fn internal(context: impl Into<String>) -> Self {
        Error::Internal {
            context: context.into(),
            source: None,
        }
    }

    /// An [`Error::Internal`] whose cause is `source`: `context` says what the library was
    /// doing.
    pub(crate) fn internal_from(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Internal {
            context: context.into(),
            source: Some(std::sync::Arc::new(source)),
        }
    }

    /// True when the process, not the file it was reading, ran out of something: the
    /// disk or its quota ([`Error::DiskFull`], `ENOSPC`, `EDQUOT`), file descriptors
    /// (`EMFILE`, `ENFILE`), threads (`EAGAIN`, [`no_thread`]), memory (`ENOMEM`,
    /// SQLite's `SQLITE_NOMEM`), or a read connection in time
    /// ([`Error::ReadConnection`]). A session that fails so is not unreadable: a listing
    /// or an index fill must not pass over it as if it were.
    pub(crate) fn is_exhaustion(&self) -> bool {
        use rustix::io::Errno;
        match self {
            Error::DiskFull(_) | Error::ReadConnection(_) => true,
            Error::Io { source, .. } => {
                matches!(
                    source.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::OutOfMemory
                ) || self.is_disk_full_io()
                    || self.is_io_errno(&[Errno::MFILE, Errno::NFILE, Errno::NOMEM])
            }
            Error::Sqlite(e) => {
                e.cause().sqlite_error_code() == Some(rusqlite::ErrorCode::OutOfMemory)
            }
            _ => false,
        }
    }

    /// True when SQLite could not open a file (`SQLITE_CANTOPEN`): the file's fault
    /// (unreadable) or the process's (out of file descriptors).
    pub(crate) fn is_cannot_open(&self) -> bool {
        matches!(self, Error::Sqlite(e)
            if e.cause().sqlite_error_code() == Some(rusqlite::ErrorCode::CannotOpen))
    }

    /// True when retrying the same write later can succeed without reopening
    /// (the transaction rolled back cleanly: full disk, busy database).
    pub(crate) fn is_retryable_write(&self) -> bool {
        matches!(self, Error::DiskFull(_)) || self.is_busy()
    }

    /// `self` with SQLite's message replaced by `message()` when it is a file found busy or
    /// locked ([`Error::is_busy`]; its result codes kept, so it stays retryable): SQLite's
    /// "database is locked" names neither the file nor what it means for the caller. Any
    /// other error as it is.
    pub(crate) fn busy_saying(self, message: impl FnOnce() -> String) -> Error {
        if !self.is_busy() {
            return self;
        }
        match self {
            Error::Sqlite(busy) => Error::Sqlite(SqliteError::new(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(
                    busy.extended_code().unwrap_or(rusqlite::ffi::SQLITE_BUSY),
                ),
                Some(message()),
            ))),
            other => other,
        }
    }

    /// True when SQLite found the database busy or locked (another connection held it for
    /// the whole busy timeout).
    pub(crate) fn is_busy(&self) -> bool {
        matches!(self, Error::Sqlite(e) if matches!(
            e.cause().sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        ))
    }
}

/// An error SQLite reported (or met while its answer was read): its message, and SQLite's
/// result codes when it gave them. It keeps the SQLite binding's own types out of the
/// store's public API, so a new version of that binding is not a breaking change of this
/// crate. [`Error::source`](std::error::Error::source) of the [`Error`] holding it is the
/// binding's error itself, for a program that wants to look closer.
#[derive(Debug, Clone)]
pub struct SqliteError(std::sync::Arc<rusqlite::Error>);

impl SqliteError {
    pub(crate) fn new(cause: rusqlite::Error) -> SqliteError {
        SqliteError(std::sync::Arc::new(cause))
    }

    /// The binding's error.
    pub(crate) fn cause(&self) -> &rusqlite::Error {
        &self.0
    }

    /// SQLite's primary result code (`SQLITE_FULL` is 13, `SQLITE_BUSY` 5: see
    /// <https://sqlite.org/rescode.html>); `None` when the error did not come from SQLite
    /// itself (a value of an unexpected type, say).
    pub fn code(&self) -> Option<i32> {
        self.extended_code().map(|code| code & 0xff)
    }

    /// SQLite's extended result code (`SQLITE_IOERR_SHMSIZE` is 4874); `None` as for
    /// [`SqliteError::code`].
    pub fn extended_code(&self) -> Option<i32> {
        match &*self.0 {
            rusqlite::Error::SqliteFailure(failure, _) => Some(failure.extended_code),
            _ => None,
        }
    }
}

impl fmt::Display for SqliteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Transparent: its message is the binding's, so its source is the binding error's own
/// (a chain printed from it does not say the same thing twice).
impl std::error::Error for SqliteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        match &e {
            rusqlite::Error::SqliteFailure(f, msg) => match f.code {
                ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                    Error::corrupt_from("SQLite reports", e)
                }
                ErrorCode::DiskFull => Error::DiskFull(SqliteError::new(e)),
                // SQLite could not open a file (the database, its `-wal` or `-shm`) because
                // the process or the system has no descriptor left: the process's limit,
                // not the file's fault (a list skipped every session as unreadable).
                ErrorCode::CannotOpen if let Some(os) = descriptors_exhausted() => {
                    Error::io(e.to_string(), os)
                }
                // The `-shm` file could not be grown: on a full disk (or quota) a reader
                // that must make it fails here, before any page is read.
                ErrorCode::SystemIoFailure
                    if f.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE =>
                {
                    Error::DiskFull(SqliteError::new(e))
                }
                // A schema that lacks what this build's statements name: a damaged or
                // foreign file (our own statements are fixed and tested).
                ErrorCode::Unknown
                    if msg.as_deref().is_some_and(|m| {
                        m.starts_with("no such column") || m.starts_with("no such table")
                    }) =>
                {
                    Error::corrupt_from("the schema lacks what this build reads", e)
                }
                _ => Error::Sqlite(SqliteError::new(e)),
            },
            // A stored value of the wrong type or encoding.
            rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..) => Error::corrupt_from("undecodable row", e),
            _ => Error::Sqlite(SqliteError::new(e)),
        }
    }
}

/// Whether `e` says that this process (`EMFILE`) or the system (`ENFILE`) has no file
/// descriptor left.
pub(crate) fn is_out_of_descriptors(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::MFILE, Errno::NFILE]
        .iter()
        .any(|errno| e.raw_os_error() == Some(errno.raw_os_error()))
}

/// How many descriptors an open of a session file may need at once: the database, its
/// `-wal`, its `-shm` and a `-journal`.
const DESCRIPTORS_AN_OPEN_TAKES: usize = 4;

/// The error of opening files now, when it is that this process (`EMFILE`) or the system
/// (`ENFILE`) has no file descriptor left for an open of a session file; `None` when
/// [`DESCRIPTORS_AN_OPEN_TAKES`] can be opened. Probing for one was not enough: SQLite
/// closes what it opened before it reports that it could not open the rest, so one was
/// free again by then, and its "unable to open database file" was taken for the file's
/// fault (outside testing, resource limits: `gc` and `serve` out of descriptors).
pub(crate) fn descriptors_exhausted() -> Option<std::io::Error> {
    let mut held = Vec::with_capacity(DESCRIPTORS_AN_OPEN_TAKES);
    for _ in 0..DESCRIPTORS_AN_OPEN_TAKES {
        match std::fs::File::open("/") {
            Ok(file) => held.push(file),
            Err(e) => return Some(e).filter(is_out_of_descriptors),
        }
    }
    None
}

/// The error of a thread that could not be started where the code that failed panics
/// instead of returning the OS's error (tokio's `spawn_blocking`).
pub(crate) fn no_thread() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::WouldBlock,
        "no thread could be started (the process or its user is out of threads or memory)",
    )
}

impl From<rusqlite_migration::Error> for Error {
    fn from(e: rusqlite_migration::Error) -> Self {
        match e {
            rusqlite_migration::Error::RusqliteError { err, .. } => err.into(),
            other => Error::UnsupportedVersion {
                what: "the schema migrations refuse the file".into(),
                source: Some(std::sync::Arc::new(other)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_without_a_lease_is_not_shown_as_a_generation() {
        let owner = |generation| WriterOwner {
            owner_id: "o".into(),
            host: "h".into(),
            pid: 7,
            generation,
            since_ms: 0,
            holding_for: None,
        };
        assert_eq!(
            owner(3).to_string(),
            "pid 7 on host h (generation 3, since 1970-01-01 00:00:00 UTC)"
        );
        assert_eq!(
            owner(0).to_string(),
            "pid 7 on host h (holding the writer lock without a lease: a delete, or a writer \
             still opening; since 1970-01-01 00:00:00 UTC)"
        );
        let deleting = WriterOwner {
            holding_for: Some("delete".into()),
            ..owner(0)
        };
        assert_eq!(
            deleting.to_string(),
            "pid 7 on host h (a delete in progress, since 1970-01-01 00:00:00 UTC)"
        );
    }

    #[test]
    fn a_sqlite_error_gives_its_primary_and_extended_codes() {
        let shm = SqliteError::new(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR_SHMSIZE),
            None,
        ));
        assert_eq!(shm.extended_code(), Some(4874));
        assert_eq!(shm.code(), Some(rusqlite::ffi::SQLITE_IOERR));
        // An error the binding met, not SQLite: no code, its own text.
        let other = SqliteError::new(rusqlite::Error::InvalidQuery);
        assert_eq!((other.code(), other.extended_code()), (None, None));
        assert_eq!(other.to_string(), rusqlite::Error::InvalidQuery.to_string());
        let error = Error::from(rusqlite::Error::InvalidQuery);
        assert!(
            matches!(&error, Error::Sqlite(e) if e.code().is_none()),
            "{error:?}"
        );
        let source = std::error::Error::source(&error).expect("a source");
        assert!(source.downcast_ref::<rusqlite::Error>().is_some());
        // A standard error of its own, Send and Sync like `Error`.
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(other);
        assert!(boxed.source().is_none());
    }
}
