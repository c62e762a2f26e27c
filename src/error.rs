//! The one error type of the crate.

use std::fmt;

/// Who holds a session's writer lock, as recorded by the holder.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
}

impl fmt::Display for WriterOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} on host {} (generation {}, since {} ms)",
            self.pid, self.host, self.generation, self.since_ms
        )
    }
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

/// Everything that can go wrong, as variants a caller can match.
///
/// Bad input (`InvalidInput`, `InvalidPayload`, `UnsupportedVersion` for an unknown
/// required kind, `OperationConflict`) never changes anything on disk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something malformed: an id, a batch, an option.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// An event payload does not match its kind's schema.
    #[error("invalid {kind} payload: {reason}")]
    InvalidPayload {
        /// The event kind.
        kind: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No session with this id exists under the root.
    #[error("session {0} not found")]
    SessionNotFound(String),
    /// A session (or export destination) with this name already exists.
    #[error("session {0} already exists")]
    SessionExists(String),
    /// Another writer (in this process or another) owns the session.
    #[error("session writer is owned by {owner}")]
    WriterOwned {
        /// The current owner, as it recorded itself.
        owner: WriterOwner,
    },
    /// The operation id was used before with different content.
    #[error("operation id {} conflicts with an earlier batch", quoted(.operation_id))]
    OperationConflict {
        /// The reused operation id.
        operation_id: String,
    },
    /// A file, schema or event kind newer than this build understands.
    #[error("unsupported session storage version: {0}")]
    UnsupportedVersion(String),
    /// A file that is damaged or not a session file.
    #[error("corrupt session store: {0}")]
    Corrupt(String),
    /// The handle is read-only.
    #[error("session handle is read-only")]
    ReadOnly,
    /// The session was closed; it accepts nothing more.
    #[error("session runtime is closed")]
    Closed,
    /// Another writer took the lease: this handle is fenced off.
    #[error("stale writer generation {ours}: the lease is now at {current}")]
    StaleGeneration {
        /// The generation this handle holds.
        ours: u64,
        /// The generation in the file.
        current: u64,
    },
    /// An earlier commit failed in a way that leaves its outcome unknown; reopen the session.
    #[error("writer poisoned by an earlier failure, reopen the session: {0}")]
    Poisoned(String),
    /// The last write failed; the accepted tail is kept and the next `flush` retries.
    #[error("persistence failed, accepted tail kept: {0}")]
    PersistenceFailed(String),
    /// The disk (or its quota) is full.
    #[error("disk full: {0}")]
    DiskFull(String),
    /// The wait was cancelled by the caller.
    #[error("operation cancelled")]
    Cancelled,
    /// The fork or rewind cut does not fall on a commit boundary.
    #[error("fork boundary is not an atomic batch boundary: {0}")]
    ForkBoundaryNotAtomic(String),
    /// The fork or rewind prefix leaves an open turn or a pending interaction.
    #[error("fork boundary retains active runtime authority: {0}")]
    ForkActiveAuthority(String),
    /// The runtime is running, cancelling or needs recovery.
    #[error("session runtime is busy")]
    RuntimeBusy,
    /// Client bindings are still attached to the runtime.
    #[error("session runtime still has client bindings")]
    RuntimeBound,
    /// No runtime is attached for this session.
    #[error("session is not running")]
    SessionNotRunning,
    /// The execution no longer owns commit authority (it was cancelled or replaced).
    #[error("execution no longer owns commit authority")]
    StaleExecution,
    /// The runtime needs a recovery decision before new work.
    #[error("session runtime requires recovery")]
    RecoveryRequired,
    /// An operating-system I/O error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Any other SQLite error.
    #[error("sqlite: {0}")]
    Sqlite(#[source] rusqlite::Error),
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidInput(msg.into())
    }

    pub(crate) fn corrupt(msg: impl Into<String>) -> Self {
        Error::Corrupt(msg.into())
    }

    /// True when retrying the same write later can succeed without reopening
    /// (the transaction rolled back cleanly: full disk, busy database).
    pub(crate) fn is_retryable_write(&self) -> bool {
        matches!(self, Error::DiskFull(_))
            || matches!(self, Error::Sqlite(rusqlite::Error::SqliteFailure(e, _))
                if matches!(e.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        match &e {
            rusqlite::Error::SqliteFailure(f, msg) => match f.code {
                ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                    Error::Corrupt(e.to_string())
                }
                ErrorCode::DiskFull => Error::DiskFull(e.to_string()),
                // A schema that lacks what this build's statements name: a damaged or
                // foreign file (our own statements are fixed and tested).
                ErrorCode::Unknown
                    if msg.as_deref().is_some_and(|m| {
                        m.starts_with("no such column") || m.starts_with("no such table")
                    }) =>
                {
                    Error::Corrupt(e.to_string())
                }
                _ => Error::Sqlite(e),
            },
            // A stored value of the wrong type or encoding.
            rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..) => Error::Corrupt(format!("undecodable row: {e}")),
            _ => Error::Sqlite(e),
        }
    }
}

impl From<rusqlite_migration::Error> for Error {
    fn from(e: rusqlite_migration::Error) -> Self {
        match e {
            rusqlite_migration::Error::RusqliteError { err, .. } => err.into(),
            other => Error::UnsupportedVersion(other.to_string()),
        }
    }
}

impl From<r2d2::Error> for Error {
    fn from(e: r2d2::Error) -> Self {
        Error::io("open read connection", std::io::Error::other(e.to_string()))
    }
}
