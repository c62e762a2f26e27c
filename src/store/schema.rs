//! The session file format: identity pragmas, migrations and connection settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use rusqlite_migration::{M, Migrations};

use crate::error::{Error, Result};
use crate::store::folder_swap;

pub(crate) use crate::format::{APPLICATION_ID, CODEC, SCHEMA_VERSION, SESSION_FILE, WAL_FILE};

/// The writer lock file inside a session folder.
pub(crate) const LOCK_FILE: &str = "writer.lock";

/// The folder Litestream keeps beside a session file it replicates.
pub(crate) const LITESTREAM_DIR: &str = ".session.sqlite-litestream";

/// Schema migrations, one numbered SQL file each; `user_version` is their count.
const MIGRATION_SQL: [&str; 9] = [
    include_str!("../../migrations/0001_initial.sql"),
    include_str!("../../migrations/0002_checkpoint.sql"),
    include_str!("../../migrations/0003_lean.sql"),
    include_str!("../../migrations/0004_operation_filter.sql"),
    include_str!("../../migrations/0005_kind_codes.sql"),
    include_str!("../../migrations/0006_operation_key_chunks.sql"),
    include_str!("../../migrations/0007_row_check.sql"),
    include_str!("../../migrations/0008_checkpoint_order.sql"),
    include_str!("../../migrations/0009_kind_list.sql"),
];

// `user_version` is the number of migrations: one more migration is one more version.
const _: () = assert!(MIGRATION_SQL.len() as i64 == SCHEMA_VERSION);

/// The migrations, with the Rust part of 0003 (what SQL cannot compute: the operation
/// keys of converted commit rows, and which turn ids are derived).
fn migrations() -> Migrations<'static> {
    Migrations::new(vec![
        M::up(MIGRATION_SQL[0]),
        M::up(MIGRATION_SQL[1]),
        M::up_with_hook(MIGRATION_SQL[2], |tx: &rusqlite::Transaction<'_>| {
            crate::store::write::compact_converted_commits(tx)
                .map_err(rusqlite_migration::HookError::from)
        }),
        M::up(MIGRATION_SQL[3]),
        M::up(MIGRATION_SQL[4]),
        M::up(MIGRATION_SQL[5]),
        M::up(MIGRATION_SQL[6]),
        M::up(MIGRATION_SQL[7]),
        M::up(MIGRATION_SQL[8]),
    ])
}

/// Free pages a writer keeps for reuse (1 MiB of 4 KiB pages); beyond that it gives the
/// excess back to the file system ([`release_free_pages`]).
const FREE_PAGES_KEPT: i64 = 256;

/// How long any connection waits for a lock held by another connection.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What a session survives once `flush` has returned.
///
/// ```
/// use session_store::Durability;
/// assert_eq!(Durability::default(), Durability::PowerLoss);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// `synchronous=FULL`: a durable commit survives power loss and OS crashes.
    #[default]
    PowerLoss,
    /// `synchronous=NORMAL`: a durable commit survives a process crash (SIGKILL, panic);
    /// an OS crash or power loss may roll back the most recent commits, never corrupt.
    ProcessCrash,
}

impl Durability {
    /// The `PRAGMA synchronous` setting of this durability.
    pub(crate) fn synchronous(self) -> &'static str {
        match self {
            Durability::PowerLoss => "FULL",
            Durability::ProcessCrash => "NORMAL",
        }
    }
}

/// The files SQLite keeps beside a database file `F`: `F-wal`, `F-shm`, `F-journal`.
pub(crate) const SIDECARS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// `file` with `suffix` appended (one of [`SIDECARS`]).
pub(crate) fn sidecar(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Checks, without following any symlink, that `file` is a regular file and that none of
/// SQLite's files beside it ([`SIDECARS`]) is a symlink or anything but a regular file.
/// (SQLite opens those with `O_NOFOLLOW` and would fail with a bare "unable to open
/// database file"; this names the culprit before anything is opened.)
///
/// # Errors
/// [`Error::SessionNotFound`] when `file` is missing; [`Error::InvalidInput`] naming the
/// symlink or other non-regular file.
pub(crate) fn check_file(file: &Path) -> Result<()> {
    match std::fs::symlink_metadata(file) {
        Ok(m) if m.is_file() => {}
        Ok(m) => return Err(not_regular(file, &m)),
        Err(e) => return Err(missing_or_unreadable(file, e)),
    }
    for suffix in SIDECARS {
        let side = sidecar(file, suffix);
        if let Ok(m) = std::fs::symlink_metadata(&side)
            && !m.is_file()
        {
            return Err(not_regular(&side, &m));
        }
    }
    Ok(())
}

/// Whether `e`, met looking at a path, says nothing is there (`ENOENT`, `ENOTDIR`), not
/// that the path cannot be looked at (a folder the process may not read).
pub(crate) fn is_missing(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
}

/// [`Error::SessionNotFound`] for a session file that is missing ([`is_missing`]); else
/// the system's reason it cannot be looked at (a folder the process may not read:
/// permission denied), as [`Error::Io`], not "not found".
pub(crate) fn missing_or_unreadable(file: &Path, e: std::io::Error) -> Error {
    if is_missing(&e) {
        Error::SessionNotFound(file.display().to_string())
    } else {
        Error::io(format!("open {}", file.display()), e)
    }
}

/// Checks that `file` is a file this process may open (`std::fs::metadata`: a symlink is
/// followed, as [`Path::is_file`] does).
///
/// # Errors
/// As [`missing_or_unreadable`]; [`Error::SessionNotFound`] for anything but a file.
pub(crate) fn require_file(file: &Path) -> Result<()> {
    match std::fs::metadata(file) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(Error::SessionNotFound(file.display().to_string())),
        Err(e) => Err(missing_or_unreadable(file, e)),
    }
}

/// SQLite's bare "unable to open database file" for `file` replaced by the system's
/// reason (`EACCES` for a file the process may not read, or with `write` not write), probed
/// with `access(2)`: no descriptor is opened, so no POSIX lock of another connection of
/// this process on the file is dropped. Any other error is returned as it is.
fn explain_cant_open(file: &Path, write: bool, e: Error) -> Error {
    use rustix::fs::{Access as Mode, AtFlags, CWD, accessat};
    let cant_open = matches!(&e, Error::Sqlite(cause)
        if cause.cause().sqlite_error_code() == Some(rusqlite::ErrorCode::CannotOpen));
    let mode = if write {
        Mode::READ_OK | Mode::WRITE_OK
    } else {
        Mode::READ_OK
    };
    match accessat(CWD, file, mode, AtFlags::EACCESS) {
        Err(errno) if cant_open && errno != rustix::io::Errno::NOENT => {
            Error::io(format!("open {}", file.display()), errno.into())
        }
        _ => e,
    }
}

/// `O_NOFOLLOW` for `OpenOptionsExt::custom_flags` (a C `int` flag).
pub(crate) const NO_FOLLOW: i32 = rustix::fs::OFlags::NOFOLLOW.bits().cast_signed();

/// Opens `path` read-only without following a symlink (`O_NOFOLLOW`; std adds
/// `O_CLOEXEC`): a symlink is an error (`ELOOP`), never followed.
pub(crate) fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(NO_FOLLOW)
        .open(path)
}

/// Whether SQLite's failure to open `file` (a regular file: [`check_file`]) was the
/// process's, not the file's: the file opens now, or fails for want of a file descriptor.
/// Threads reading at once free descriptors between one's failed open and its check of
/// the limit (`descriptors_exhausted`), and a search passed such a session over as
/// unreadable.
pub(crate) fn open_failure_was_the_process(file: &Path) -> bool {
    match open_no_follow(file) {
        Ok(_) => true,
        Err(e) => crate::error::is_out_of_descriptors(&e),
    }
}

/// Checks, without following any symlink, that `dir` is a real folder (not a symlink)
/// holding a session file that passes [`check_file`].
///
/// # Errors
/// [`Error::SessionNotFound`] when the folder or its file is missing;
/// [`Error::InvalidInput`] naming a symlink or other file where a folder or a regular
/// file must be.
pub(crate) fn check_session_dir(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => check_file(&dir.join(SESSION_FILE)),
        Ok(m) if m.is_symlink() => Err(Error::invalid(format!(
            "{} is a symlink; sessions are folders of the root; refused",
            dir.display()
        ))),
        Ok(_) => Err(Error::invalid(format!(
            "{} is not a directory of the root (a symlink or another file); refused",
            dir.display()
        ))),
        Err(_) => Err(Error::SessionNotFound(dir.display().to_string())),
    }
}

/// Whether SQLite finds the file of `conn` damaged: `PRAGMA quick_check` says anything
/// but `ok`, or fails. Asked of a derived file (the catalog, the search index) after one
/// of its statements reported corruption, to tell damage in that file from damage in a
/// session file read alongside it.
pub(crate) fn is_damaged(conn: &Connection) -> bool {
    conn.query_row("PRAGMA quick_check(1)", [], |r| r.get::<_, String>(0))
        .map_or(true, |verdict| verdict != "ok")
}

/// The error for a path that must be a regular file and is not.
pub(crate) fn not_regular(path: &Path, m: &std::fs::Metadata) -> Error {
    use std::os::unix::fs::FileTypeExt;
    let kind = m.file_type();
    let what = if kind.is_symlink() {
        "a symlink"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a pipe, not a regular file"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device, not a regular file"
    } else {
        "not a regular file"
    };
    Error::invalid(format!("{} is {what}; refused", path.display()))
}

/// Settings of every connection the store opens: busy timeout, defensive mode, no trusted
/// schema, [`stable_plans`], no memory map. Writing connections get these alone
/// (`cell_size_check` is for files from outside; [`init_reader`] adds it for every reader).
fn harden(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    stable_plans(conn)?;
    conn.pragma_update(None, "mmap_size", 0)?;
    Ok(())
}

/// Turns on SQLite's query planner stability guarantee (`SQLITE_DBCONFIG_ENABLE_QPSG`) on
/// every connection the store opens. Without it, a statement whose `LIMIT` is a bound
/// parameter (a history page's, a commit page's, a list page's, a search page's) is
/// marked to be compiled again whenever that parameter is bound, so each call prepared
/// its cached statement anew (about 0.15-0.2 ms of every search, session 21). No plan
/// here depends on a bound value, so nothing is lost.
fn stable_plans(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

/// Creates a new session file at `path` (which must not exist) with the current schema.
///
/// The file is being staged (invisible until renamed into place), so it is built with
/// `synchronous=OFF`; [`finish_staged`] makes it durable with one fsync. Until then it is
/// no session file to any reader: its `application_id` is set by [`finish_staged`], last.
/// An export killed (or still running) left a temporary file beside its destination that
/// read as a whole session of no commits, which `verify` called sound and `import`
/// published as an empty session, exit 0 (outside testing C1, session 41).
pub(crate) fn create_file(path: &Path) -> Result<Connection> {
    create_file_with(path, false)
}

/// As [`create_file`], for a file no other connection may open until this one is closed
/// (`locking_mode=EXCLUSIVE` before its first access, so no `-shm` is ever used): an
/// export's temporary file is no session yet, and a reader of it (a backup tool, an
/// indexer, `verify` run on it) held the shared lock that the switch to a rollback journal
/// at the export's end needs, and the export failed with "database is locked" after all
/// its work (outside testing C6, session 41). Such a reader gets "database is locked"
/// instead.
pub(crate) fn create_private_file(path: &Path) -> Result<Connection> {
    create_file_with(path, true)
}

fn create_file_with(path: &Path, private: bool) -> Result<Connection> {
    let mut conn = open_creating(path)?;
    harden(&conn)?;
    if private {
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    }
    // OFF before the switch to WAL: switching a new file's journal mode is itself a
    // rollback-journal transaction, which would otherwise cost four fsyncs.
    conn.pragma_update(None, "synchronous", "OFF")?;
    // Before the first table: SQLite only changes auto_vacuum of a file that has none
    // (or with a VACUUM). Older files keep theirs; `incremental_vacuum` is a no-op there.
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    migrations().to_latest(&mut conn)?;
    Ok(conn)
}

/// Closes our only connection to a staged file (which checkpoints it into the main file)
/// and fsyncs the file, and its WAL when one is left: a replicator watching the root
/// (Litestream) may hold a connection too, and then the close does not checkpoint.
pub(crate) fn finish_staged(conn: Connection, path: &Path) -> Result<()> {
    // What makes it a session file, once everything else is written (see `create_file`).
    conn.pragma_update(None, "application_id", APPLICATION_ID)?;
    conn.close().map_err(|(_, e)| Error::from(e))?;
    // This process has no other connection to a staged file, so opening (and closing) a
    // descriptor on it cannot drop another connection's POSIX locks.
    let wal = sidecar(path, "-wal");
    for file in [path, wal.as_path()] {
        match open_no_follow(file) {
            Ok(f) => f.sync_all(),
            Err(e) if file == wal && e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
        .map_err(|e| Error::io(format!("fsync {}", file.display()), e))?;
    }
    Ok(())
}

/// Checkpoints the WAL into the main file and truncates it, so the file is complete on
/// its own once the writer is gone (readers still open cannot do this on close).
pub(crate) fn checkpoint_truncate(conn: &Connection) -> Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

/// Gives free pages beyond [`FREE_PAGES_KEPT`] back to the file system
/// (`incremental_vacuum`), so pages freed by rewrites (the projection checkpoint) do not
/// pile up. Free pages up to that count stay for the next rewrite to reuse. A no-op for a
/// file without `auto_vacuum=INCREMENTAL` (files made before schema version 3).
pub(crate) fn release_free_pages(conn: &Connection) -> Result<()> {
    let free: i64 = conn.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
    if free > FREE_PAGES_KEPT {
        incremental_vacuum(conn, free - FREE_PAGES_KEPT)?;
    }
    Ok(())
}

/// Gives `pages` free pages back to the file system (all of them when `pages` is 0) with
/// `PRAGMA incremental_vacuum`, run to its end: it frees one page a step (run once, as
/// `execute_batch` runs it, a rebuild of the search index gave back one page of the
/// thousands it freed: outside testing, session 45).
pub(crate) fn incremental_vacuum(conn: &Connection, pages: i64) -> Result<()> {
    let mut step = conn.prepare(&format!("PRAGMA incremental_vacuum({pages})"))?;
    let mut rows = step.query([])?;
    while rows.next()?.is_some() {}
    Ok(())
}

/// Switches a freshly built file (an export) to `journal_mode=DELETE`, so that it is one
/// self-contained file with no WAL beside it.
pub(crate) fn use_rollback_journal(conn: &Connection) -> Result<()> {
    conn.pragma_update_and_check(None, "journal_mode", "DELETE", |r| r.get::<_, String>(0))?;
    Ok(())
}

/// `e` of a write to the session file `file`: a file another process held a write on for
/// the whole busy timeout (its writer, stopped inside a drain; a delete of a session it
/// inherits from, copying that history in; a fork recording itself) is said to be busy,
/// naming it; still SQLite's busy error, which a caller may retry. It said only "database
/// is locked" (outside testing, signals: a delete stopped with Ctrl-Z; W6: a fork, rewind,
/// delete or gc meeting a writer stopped inside its drain).
pub(crate) fn busy_file(e: Error, file: &Path) -> Error {
    e.busy_saying(|| {
        format!(
            "{} is busy: another process held a write on it for {} s (its writer, or a \
             delete or fork of a session it shares history with); try again",
            file.display(),
            BUSY_TIMEOUT.as_secs()
        )
    })
}

/// A writing connection for a short side update (a `dependents` row) of a session file
/// at any version this build reads, which it leaves at that version: a side update holds
/// no writer lock, and an older build's writer may be writing the file (upgraded under it,
/// its next commit failed, or it went on writing rows without the newer version's checks).
/// Every version has the `dependents` table as the first made it. It never checkpoints on
/// close, so it costs one commit and nothing more.
pub(crate) fn open_side_writer(path: &Path) -> Result<Connection> {
    let conn = open_read_write(path)?;
    check_format(&conn)?;
    if conn.is_readonly(rusqlite::MAIN_DB)? {
        return Err(not_writable(path));
    }
    conn.pragma_update(None, "synchronous", Durability::PowerLoss.synchronous())?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    Ok(conn)
}

/// Whether the session file at `path` is of an older schema version than this build's:
/// what its next [`open_writer`] upgrades, which only the holder of its writer lock may
/// do.
///
/// # Errors
/// The file cannot be read, or is no session file of a version this build reads.
pub(crate) fn is_older_version(path: &Path) -> Result<bool> {
    let conn = open_unchecked_reader(path, Access::for_root_file(path))?;
    Ok(check_format(&conn)? < SCHEMA_VERSION)
}

/// A read-write connection to an existing session file, hardened, nothing read yet.
fn open_read_write(path: &Path) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NOFOLLOW
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| explain_cant_open(path, true, e.into()))?;
    harden(&conn)?;
    Ok(conn)
}

/// Opens an existing session file for writing, upgrading an older one (the caller holds
/// the writer lock).
pub(crate) fn open_writer(path: &Path, durability: Durability) -> Result<Connection> {
    let mut conn = open_read_write(path)?;
    // An older file is upgraded here: one this process may not write is named as such
    // (SQLite opened it read-only, and the migration's first write said "attempt to write
    // a readonly database", naming nothing).
    if check_format(&conn)? < SCHEMA_VERSION && conn.is_readonly(rusqlite::MAIN_DB)? {
        return Err(not_writable(path));
    }
    conn.pragma_update(None, "journal_mode", "WAL")?;
    migrations().to_latest(&mut conn)?;
    conn.pragma_update(None, "synchronous", durability.synchronous())?;
    Ok(conn)
}

/// [`open_writer`] for a connection that will write: a file this process may not write
/// (SQLite then opens it read-only, and the first write failed with "attempt to write a
/// readonly database", naming nothing) is [`Error::Io`] naming it and the system's
/// reason, before anything is written.
pub(crate) fn open_writable(path: &Path, durability: Durability) -> Result<Connection> {
    let conn = open_writer(path, durability)?;
    if conn.is_readonly(rusqlite::MAIN_DB)? {
        return Err(not_writable(path));
    }
    // A `-wal` or `-shm` another user's reader made and this process may not write: the
    // first write said "attempt to write a readonly database", naming nothing (outside
    // testing, users and permissions).
    if let Some((side, e)) = unwritable_side_file(path) {
        return Err(Error::io(format!("open {} for writing", side.display()), e));
    }
    Ok(conn)
}

/// The first of the `-wal` and `-shm` beside the database at `path` that is there and that
/// this process may not write, with the system's reason.
fn unwritable_side_file(path: &Path) -> Option<(PathBuf, std::io::Error)> {
    ["-wal", "-shm"].into_iter().find_map(|suffix| {
        let side = sidecar(path, suffix);
        match write_denied(&side) {
            Some(e) if e.kind() != std::io::ErrorKind::NotFound => Some((side, e)),
            _ => None,
        }
    })
}

/// [`Error::Io`] naming the session file at `path`, which SQLite opened read-only, and the
/// system's reason.
fn not_writable(path: &Path) -> Error {
    use rustix::fs::{Access, AtFlags, CWD, accessat};
    let reason = match accessat(CWD, path, Access::WRITE_OK, AtFlags::EACCESS) {
        Err(errno) => errno.into(),
        Ok(()) => std::io::Error::from(std::io::ErrorKind::PermissionDenied),
    };
    Error::io(format!("open {} for writing", path.display()), reason)
}

/// Opens the database at `path` with [`create_flags`], making the file first when it is
/// missing, as other Unix programs make files: mode 0666 less the umask, and when this
/// process runs as root, owned by the owner of the folder that takes it. SQLite makes a
/// new database 0644 whatever the umask (its `-wal` and `-shm` then take the database's
/// mode), so the members of a group sharing a root (umask 002, a setgid folder) could not
/// write each other's files, and one member's reader left side files that locked the
/// others out of a session or the search index; and root's first search left a
/// root-owned index that the root's owner could no longer update (outside testing,
/// users and permissions). SQLite gives side files it makes as root to the database's
/// owner itself.
pub(crate) fn open_creating(path: &Path) -> rusqlite::Result<Connection> {
    // Only a file made here is changed; when it cannot be made, SQLite's open says why.
    if let Ok(made) = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        give_to_folder_owner(&made, path.parent());
    }
    Connection::open_with_flags(path, create_flags())
}

/// When this process runs as root, gives `made` (a file or folder it just made) to the
/// owner of `folder`, the folder holding it: files root makes in a user's root are the
/// user's, as SQLite does with the side files it makes as root. Best effort: a file left
/// root's is what it was before.
pub(crate) fn give_to_folder_owner(made: impl rustix::fd::AsFd, folder: Option<&Path>) {
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let Some(Ok(owner)) = folder.map(rustix::fs::stat) else {
        return;
    };
    if owner.st_uid != 0 {
        let _ = rustix::fs::fchown(
            made,
            Some(rustix::fs::Uid::from_raw(owner.st_uid)),
            Some(rustix::fs::Gid::from_raw(owner.st_gid)),
        );
    }
}

/// Flags of a connection that may create its file (never through a symlink).
pub(crate) fn create_flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NOFOLLOW
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
}

/// A derived file of a root that is not a session file (the catalog, the search index):
/// what [`open_derived`] checks and creates.
pub(crate) struct DerivedFile<'a> {
    /// Its `PRAGMA application_id`.
    pub application_id: i32,
    /// Its tables, created in a new file.
    pub schema: &'a str,
    /// A statement naming every table and column it reads (prepared, never run).
    pub probe: &'a str,
    /// What it is, for errors ("a catalog").
    pub what: &'a str,
    /// Whether a new file gives freed pages back on `PRAGMA incremental_vacuum`.
    pub incremental_vacuum: bool,
}

/// Opens the derived file at `path` (WAL, `synchronous=NORMAL`, busy timeout 5 s),
/// creating its schema in one immediate transaction when the file is new (so two
/// processes creating it at once agree). A file that is not such a file (another
/// application's database, random bytes, a missing table or column) is
/// [`Error::Corrupt`]: the owner replaces it, the file being derived.
///
/// An existing file that this process may not write (or its `-wal`, `-shm` or folder) is
/// [`Error::Io`] naming it before it is opened: SQLite opened it and read it, and every
/// write to it failed, so a search answered from an index that could not take what was new
/// ("no matches", without a word) where the caller falls back to a private index or to the
/// session files (outside testing, users and permissions).
pub(crate) fn open_derived(path: &Path, file: &DerivedFile<'_>) -> Result<Connection> {
    if path.exists()
        && let Some((what, os)) = unwritable(path)
    {
        return Err(Error::io(format!("write {}", what.display()), os));
    }
    open_derived_file(path, file).map_err(|e| match (&e, unwritable(path)) {
        // SQLite says "unable to open database file" or "attempt to write a readonly
        // database": the system says what and why.
        (Error::Sqlite(_), Some((what, os))) => Error::io(format!("write {}", what.display()), os),
        _ => e,
    })
}

/// What keeps the derived file at `path` from being written, with the system's reason: the
/// file itself, its `-wal` or `-shm` (another user's reader made them), or its folder,
/// which must take it when it is missing and its `-wal` and `-shm` (a read-only file
/// system, no permission). `None` when all are writable. Asked
/// with `access(2)`, never by opening the file: closing a descriptor of a database file
/// would drop the POSIX locks this process's SQLite connections hold on it.
fn unwritable(path: &Path) -> Option<(PathBuf, std::io::Error)> {
    match write_denied(path) {
        Some(e) if e.kind() != std::io::ErrorKind::NotFound => return Some((path.into(), e)),
        _ => {}
    }
    if let Some(side) = unwritable_side_file(path) {
        return Some(side);
    }
    let folder = path.parent()?;
    write_denied(folder).map(|e| (folder.into(), e))
}

/// Why this process may not write `path` (for a folder: create, rename or remove what it
/// holds), with the system's reason (a read-only file system, no permission, not found);
/// `None` when it may.
pub(crate) fn write_denied(path: &Path) -> Option<std::io::Error> {
    use rustix::fs::{Access as Mode, access};
    access(path, Mode::WRITE_OK).err().map(std::io::Error::from)
}

/// [`open_derived`] before its error is explained.
fn open_derived_file(path: &Path, file: &DerivedFile<'_>) -> Result<Connection> {
    let mut conn = open_creating(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    stable_plans(&conn)?;
    // Takes effect only in a new, empty file (before its first table). Set only when the
    // file does not have it: setting it writes, so on a file another process was writing
    // (a rebuild of the search index holds it for the whole rebuild) the open waited out
    // the busy timeout and failed, and a search built a private index of the whole root.
    const INCREMENTAL: i64 = 2;
    if file.incremental_vacuum
        && conn.pragma_query_value(None, "auto_vacuum", |r| r.get::<_, i64>(0))? != INCREMENTAL
    {
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    }
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // A file that is already ours is checked in a read transaction: a write lock would
    // wait for another process's long write (a rebuild of the search index holds it for
    // the whole rebuild), and after the busy timeout a search built a private index of
    // the whole root. Only a new file takes the write lock, to create its schema.
    let new = |tx: &rusqlite::Transaction<'_>| -> Result<(i32, bool)> {
        let app: i32 = tx.pragma_query_value(None, "application_id", |r| r.get(0))?;
        let objects: i64 = tx.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))?;
        Ok((app, app == 0 && objects == 0))
    };
    let mut tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Deferred)?;
    let (mut app, mut empty) = new(&tx)?;
    if empty {
        drop(tx);
        tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        (app, empty) = new(&tx)?;
    }
    if empty {
        tx.pragma_update(None, "application_id", file.application_id)?;
        tx.execute_batch(file.schema)?;
    } else if app != file.application_id {
        return Err(Error::corrupt(format!(
            "{} is not {} (application_id {app:#x})",
            path.display(),
            file.what
        )));
    }
    tx.prepare(file.probe)
        .map_err(|e| Error::corrupt_from(path.display().to_string(), e))?;
    // A derived file has no trigger or view of ours: a planted trigger would run on our
    // writes (one deleting every row it inserts made `list` say "no sessions"), a view
    // could shadow what we read.
    let planted: Option<(String, String)> = tx
        .query_row(
            "SELECT type, name FROM sqlite_schema WHERE type IN ('trigger', 'view') LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((kind, name)) = planted {
        return Err(Error::corrupt(format!(
            "{} holds a {kind} {} that session-store did not make",
            path.display(),
            crate::error::quoted(&name)
        )));
    }
    tx.commit()?;
    Ok(conn)
}

/// Flags of a read-only connection. `SQLITE_OPEN_URI` only matters for the names
/// [`Access::name`] builds: every path the store opens is absolute (the root is resolved,
/// a user's file too), so no plain path starts with `file:`.
pub(crate) fn reader_flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NOFOLLOW
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI
}

/// How a read-only connection opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Shared with writers (locks, WAL index): the files of a root, and a user's file that
    /// already has a `-wal` or `-journal` beside it.
    Shared,
    /// `immutable=1`: no locks, no WAL and no `-shm` file, so nothing is created beside
    /// the file (a read-only connection to a WAL-mode file otherwise leaves `-wal` and
    /// `-shm` behind). Only for a file with no `-wal` or `-journal` beside it, which is
    /// then complete in itself and not being written: a user's file; a root's file in a
    /// folder this process cannot add files to ([`Access::for_root_file`]); and a search
    /// hit's session file in that state and left alone for a while, whose read is then
    /// checked against the file's inode afterwards (`store::hit_files`).
    Immutable,
}

impl Access {
    /// The access for a user's file: [`Access::Shared`] when SQLite's files beside it
    /// hold part of its content (a `-wal` or a hot `-journal`), else [`Access::Immutable`].
    pub(crate) fn for_user_file(file: &Path) -> Access {
        if live_beside(file) {
            Access::Shared
        } else {
            Access::Immutable
        }
    }

    /// The access for a file of a root: [`Access::Shared`], unless the file has no `-wal`
    /// beside it and its folder refuses this process new files. SQLite cannot then create
    /// the `-wal` and `-shm` that a shared read of a WAL-mode file needs
    /// (SQLITE_READONLY_DIRECTORY): the file is complete in itself (a closed session whose
    /// last connection removed its `-wal`), and no writer can be adding to it, since a
    /// writer's first write creates the `-wal`; it is read [`Access::Immutable`]. A
    /// connection kept open on such a file is checked before each read: once a `-wal`
    /// has appeared it is not used again ([`Access::still_valid`]).
    pub(crate) fn for_root_file(file: &Path) -> Access {
        use rustix::fs::{Access as Mode, AtFlags, CWD, accessat};
        let folder = file.parent().unwrap_or(Path::new("."));
        let writable = accessat(
            CWD,
            folder,
            Mode::WRITE_OK | Mode::EXEC_OK,
            AtFlags::EACCESS,
        );
        if writable.is_ok() || live_beside(file) {
            Access::Shared
        } else {
            Access::Immutable
        }
    }

    /// False when a connection opened with this access to `file` must not be used again:
    /// an immutable one once a `-wal` or `-journal` is beside the file (a writer has
    /// started on it).
    pub(crate) fn still_valid(self, file: &Path) -> bool {
        self == Access::Shared || !live_beside(file)
    }

    /// The name SQLite is given for `path` (absolute): the path itself, or a `file:` URI
    /// with `immutable=1`.
    pub(crate) fn name(self, path: &Path) -> PathBuf {
        match self {
            Access::Shared => path.to_path_buf(),
            Access::Immutable => {
                use std::os::unix::ffi::OsStrExt;
                let mut uri = String::from("file:");
                for &b in path.as_os_str().as_bytes() {
                    if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
                        uri.push(char::from(b));
                    } else {
                        uri.push_str(&format!("%{b:02X}"));
                    }
                }
                uri.push_str("?immutable=1");
                PathBuf::from(uri)
            }
        }
    }
}

/// Per-connection setup of a read-only connection: [`harden`]'s settings and
/// `cell_size_check`.
pub(crate) fn init_reader(conn: &mut Connection) -> rusqlite::Result<()> {
    harden(conn)?;
    conn.pragma_update(None, "cell_size_check", true)
}

/// Opens a standalone read-only connection to a file of a root.
pub(crate) fn open_reader(path: &Path) -> Result<Connection> {
    open_reader_with(path, Access::for_root_file(path))
}

/// Opens a standalone read-only connection (e.g. to a user's file for `replay_file`).
pub(crate) fn open_reader_with(path: &Path, access: Access) -> Result<Connection> {
    let conn = open_unchecked_reader(path, access)?;
    check_format(&conn)?;
    Ok(conn)
}

/// As [`open_reader_with`], the format not checked yet: the caller runs [`check_format`]
/// before its first read (e.g. inside the read transaction it opens anyway).
pub(crate) fn open_unchecked_reader(path: &Path, access: Access) -> Result<Connection> {
    require_file(path)?;
    let open = || -> Result<Connection> {
        let mut conn = Connection::open_with_flags(access.name(path), reader_flags())?;
        init_reader(&mut conn)?;
        Ok(conn)
    };
    match access {
        // No `-wal` or `-shm` is ever opened.
        Access::Immutable => open(),
        // The first read opens the `-wal` and `-shm` beside the path (`store::folder_swap`).
        Access::Shared => folder_swap::open_shared(path, open, |conn| {
            conn.pragma_query_value(None, "schema_version", |_| Ok(()))?;
            Ok(())
        }),
    }
    .map_err(|e| explain_hot_journal(path, explain_cant_open(path, false, e)))
}

/// SQLite's "attempt to write a readonly database" for a read of `file` that finds a hot
/// journal beside it (`SQLITE_READONLY_ROLLBACK`: a write that did not finish, which only a
/// connection that may write can roll back) replaced by an [`Error::InvalidInput`] saying
/// so, naming the file and how to roll it back. Any other error is returned as it is.
fn explain_hot_journal(file: &Path, e: Error) -> Error {
    let hot = matches!(&e, Error::Sqlite(cause) if matches!(cause.cause(),
        rusqlite::Error::SqliteFailure(f, _)
            if f.extended_code == rusqlite::ffi::SQLITE_READONLY_ROLLBACK));
    if !hot {
        return e;
    }
    Error::invalid(format!(
        "{} has a hot journal beside it ({}: a write to it did not finish), which a \
             read-only open cannot roll back; open the file once for writing (e.g. \
             `sqlite3 FILE 'PRAGMA user_version'`) to roll it back, then try again",
        file.display(),
        sidecar(file, "-journal").display()
    ))
}

/// True when a `-wal` or `-journal` is beside `file`: SQLite's files that hold part of
/// its content (a symlink counts: SQLite refuses it).
fn live_beside(file: &Path) -> bool {
    ["-wal", "-journal"]
        .iter()
        .any(|s| std::fs::symlink_metadata(sidecar(file, s)).is_ok())
}

/// Refuses files that are not session files or are newer than this build; returns the
/// file's schema version.
pub(crate) fn check_format(conn: &Connection) -> Result<i64> {
    let app: i32 = conn
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(Error::from)?;
    if app != APPLICATION_ID {
        let unfinished = if app == 0 {
            " or one whose making did not finish (an export or a copy stopped before its end)"
        } else {
            ""
        };
        return Err(Error::corrupt(format!(
            "not a session file{unfinished} (application_id {app:#x}, expected \
             {APPLICATION_ID:#x})"
        )));
    }
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        // Named, and what to do about it: the CLI's `show ID` said only "schema version 9
        // is newer than 5", naming no file.
        return Err(Error::unsupported(format!(
            "file {} has schema version {version}, newer than {SCHEMA_VERSION} (the newest \
             this build reads): a newer session-store reads it",
            conn.path().unwrap_or("(in memory)")
        )));
    }
    if version < 1 {
        return Err(Error::corrupt(format!(
            "schema version {version} is not initialised"
        )));
    }
    check_schema(conn, version)?;
    Ok(version)
}

/// One schema object: type, name, table, SQL text.
type SchemaObject = (String, String, String, Option<String>);

fn schema_objects(conn: &Connection) -> rusqlite::Result<Vec<SchemaObject>> {
    conn.prepare("SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect()
}

/// The objects each schema version's migrations create ([`expected_schema`]).
static BUILT: Mutex<BTreeMap<i64, Arc<Vec<SchemaObject>>>> = Mutex::new(BTreeMap::new());

/// Takes the lock of the expected schemas for a `fork()` (`persistence::fork_hold`).
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    Box::new(BUILT.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The objects that `version` migrations create, from an in-memory database migrated
/// once per process and version.
fn expected_schema(version: i64) -> Result<Arc<Vec<SchemaObject>>> {
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(objects) = built.get(&version) {
        return Ok(Arc::clone(objects));
    }
    let mut conn = Connection::open_in_memory()?;
    let target = usize::try_from(version)
        .map_err(|_| Error::corrupt(format!("schema version {version}")))?;
    migrations().to_version(&mut conn, target)?;
    let objects = Arc::new(schema_objects(&conn)?);
    built.insert(version, Arc::clone(&objects));
    Ok(objects)
}

/// Tables a replicator adds to the files it watches (Litestream's, name and stored SQL
/// text), the only objects a session file may hold besides its own: plain tables, which
/// run nothing.
const REPLICATOR_TABLES: &[(&str, &str)] = &[
    (
        "_litestream_seq",
        "CREATE TABLE _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER)",
    ),
    (
        "_litestream_lock",
        "CREATE TABLE _litestream_lock (id INTEGER)",
    ),
];

/// Refuses a file whose schema is not exactly what its `user_version` says: every table,
/// index and view the migrations create must be there with the very same SQL text (a
/// damaged `CREATE TABLE` text passes `integrity_check` and would otherwise surface later
/// as "no such column"), and nothing else may be: a planted trigger would run on our next
/// write, a planted view or index could shadow or slow what we read. The one exception is a
/// replicator's bookkeeping tables ([`REPLICATOR_TABLES`]).
fn check_schema(conn: &Connection, version: i64) -> Result<()> {
    let expected = expected_schema(version)?;
    let found = schema_objects(conn)?;
    for object in expected.iter() {
        if !found.contains(object) {
            let (kind, name, _, _) = object;
            return Err(Error::corrupt(format!(
                "the schema differs from version {version}: {kind} {name} is missing or altered"
            )));
        }
    }
    let ours = |object: &SchemaObject| {
        let (kind, name, table, sql) = object;
        expected.contains(object)
            || (kind == "table"
                && name == table
                && REPLICATOR_TABLES.contains(&(name.as_str(), sql.as_deref().unwrap_or(""))))
    };
    let foreign = found.iter().find(|object| !ours(object));
    if let Some((kind, name, table, _)) = foreign {
        let on = if name == table {
            String::new()
        } else {
            format!(" on {table:?}")
        };
        return Err(Error::corrupt(format!(
            "the schema differs from version {version}: {kind} {name:?}{on} is not ours"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `event_kinds` view of a new file (migration 0009's JSON list) has the rows of
    /// the kinds this build codes, code by code.
    #[test]
    fn the_event_kinds_view_lists_the_codes_this_build_reads() {
        let mut conn = Connection::open_in_memory().expect("open");
        migrations().to_latest(&mut conn).expect("migrate");
        let rows = conn
            .prepare("SELECT code, kind, bare FROM event_kinds")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .expect("query")
            .collect::<rusqlite::Result<Vec<(Vec<u8>, String, bool)>>>()
            .expect("rows");
        assert_eq!(rows, crate::store::event_row::event_kinds_rows());
    }

    /// `.cargo/config.toml` builds the bundled SQLite without its memory statistics (a
    /// global mutex on every allocation, which the threads reading a page of search hits
    /// back queued on): this fails if that setting is lost.
    #[test]
    fn sqlite_is_built_without_its_memory_statistics() {
        let conn = Connection::open_in_memory().expect("open");
        let options = conn
            .prepare("PRAGMA compile_options")
            .expect("prepare")
            .query_map([], |r| r.get::<_, String>(0))
            .expect("query")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("options");
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "compile options: {options:?}"
        );
    }

    #[test]
    fn an_immutable_connection_is_valid_until_a_wal_appears() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(SESSION_FILE);
        std::fs::write(&file, b"").expect("write");
        assert!(Access::Immutable.still_valid(&file));
        assert!(Access::Shared.still_valid(&file));
        std::fs::write(sidecar(&file, "-wal"), b"").expect("write");
        assert!(!Access::Immutable.still_valid(&file));
        assert!(Access::Shared.still_valid(&file));
        // A folder this process may write to: shared, -wal or not.
        assert_eq!(Access::for_root_file(&file), Access::Shared);
    }

    /// Runs `sql` (one bound parameter, its `LIMIT`) on `conn` with three limits; how
    /// often SQLite compiled the statement again.
    fn recompiles_of_a_bound_limit(conn: &Connection, sql: &str) -> i32 {
        let mut stmt = conn.prepare_cached(sql).expect("prepare");
        for limit in [11, 44, 3] {
            stmt.query_map([limit], |r| r.get::<_, i64>(0))
                .expect("query")
                .for_each(drop);
        }
        stmt.get_status(rusqlite::StatementStatus::RePrepare)
    }

    #[test]
    fn a_statement_with_a_bound_limit_is_compiled_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(SESSION_FILE);
        let writer = create_file(&file).expect("create");
        let sql = "SELECT seq FROM events ORDER BY seq LIMIT ?1";
        assert_eq!(recompiles_of_a_bound_limit(&writer, sql), 0, "writer");
        finish_staged(writer, &file).expect("finish");
        let reader = open_reader(&file).expect("reader");
        assert_eq!(recompiles_of_a_bound_limit(&reader, sql), 0, "reader");
        let derived = open_derived(
            &dir.path().join("derived.sqlite"),
            &DerivedFile {
                application_id: 7,
                schema: "CREATE TABLE t (x INTEGER PRIMARY KEY);",
                probe: "SELECT x FROM t LIMIT 0",
                what: "a test file",
                incremental_vacuum: false,
            },
        )
        .expect("derived");
        let sql = "SELECT x FROM t ORDER BY x LIMIT ?1";
        assert_eq!(recompiles_of_a_bound_limit(&derived, sql), 0, "derived");
    }

    #[test]
    fn migrations_are_valid() {
        assert!(migrations().validate().is_ok());
    }

    #[test]
    fn linked_sqlite_has_the_wal_reset_fix() {
        assert!(
            rusqlite::version_number() >= 3_051_003,
            "{}",
            rusqlite::version()
        );
    }
}
