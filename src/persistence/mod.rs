//! A root folder of sessions: create, open, stat, list; staging and atomic publication.
//! Forks, deletion, export/import and replay live in the sub-modules.

mod catalog;
mod confine;
mod delete;
mod export_temp;
mod fork;
mod fork_hold;
mod portable;
mod retention;
mod scan_cache;
mod search;
mod settled;
mod staging;
mod stats;
mod verify;

pub(crate) use catalog::Catalog;
pub use catalog::{
    CatalogEntry, CatalogTotals, ListFilter, ListSort, Listing, RebuildReport, SkippedSession,
    catalog_sequences, catalog_session_ids,
};
pub use fork::ForkPoint;
pub use fork_hold::{hold_for_fork, release_after_fork};
pub use portable::{ExportReport, ImportOptions};
pub use retention::{GcDeleted, GcKept, GcOptions, GcReport};
pub use search::{MAX_SEARCH_LIMIT, SearchOptions};
pub use stats::{BlobStats, KindStats, SessionStats, TableBytes};
pub use verify::{ReplayReport, Verified, replay_file, verify_file};

pub(crate) use staging::Staged;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::cancel::CancelToken;
use crate::error::{Error, Result, WriterOwner};
use crate::format::DEFAULT_INLINE_THRESHOLD;
use crate::model::header::{Header, Origin};
use crate::model::ids::{now_ms, random_hex};
use crate::model::{Batch, Commit, SessionId};
use crate::session::live::{Session, WriteBehind};
use crate::store::content;
use crate::store::lock::{self, RecordWait, WriterLock, recorded_owner};
use crate::store::read::LineageEntry;
use crate::store::reader::SessionReader;
use crate::store::schema::{self, CODEC, Durability, LOCK_FILE, SESSION_FILE, WAL_FILE};
use crate::store::write;
pub use crate::store::writer::CheckpointPolicy;
use crate::store::writer::FileWriter;

/// Folder under the root where deletions land before removal.
pub(crate) const TRASH_DIR: &str = ".trash";

/// Settings of a root. Built from [`StoreOptions::default`] with the `with_*` methods
/// (new settings may be added in a minor release):
///
/// ```
/// use std::time::Duration;
/// use session_store::{Durability, StoreOptions};
/// let options = StoreOptions::default()
///     .with_durability(Durability::ProcessCrash)
///     .with_write_behind(Duration::from_millis(50));
/// assert_eq!(options.durability, Durability::ProcessCrash);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoreOptions {
    /// What a durable commit survives (default: power loss).
    pub durability: Durability,
    /// How long an accepted commit may wait before a timed drain (default 200 ms). A
    /// delay too long to add to the clock (`Duration::MAX`) means no timed drain: commits
    /// are written by `flush`, `close`, the queue budget or the drop of the last handle.
    pub write_behind: Duration,
    /// Byte budget of a session's write queue; `append` waits beyond it (default 4 MiB:
    /// the tail costs about twice its budget in memory, and a drain of 2 MiB already
    /// spreads an fsync over thousands of events).
    pub queue_budget: usize,
    /// What a closing writer does with the WAL (default: truncate it).
    pub checkpoint: CheckpointPolicy,
    /// String values of a payload longer than this many bytes (their JSON text between
    /// the quotes) are stored once per file, zstd-compressed, in the blob table, with a
    /// placeholder in the payload (default [`DEFAULT_INLINE_THRESHOLD`], 1 KiB; accepted
    /// [`format::MIN_INLINE_THRESHOLD`]..=[`format::MAX_INLINE_THRESHOLD`]). Applies to
    /// what this root writes: appends, imports, exports and materialised forks.
    ///
    /// [`format::MIN_INLINE_THRESHOLD`]: crate::format::MIN_INLINE_THRESHOLD
    /// [`format::MAX_INLINE_THRESHOLD`]: crate::format::MAX_INLINE_THRESHOLD
    pub inline_threshold: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::PowerLoss,
            write_behind: Duration::from_millis(200),
            queue_budget: 4 << 20,
            checkpoint: CheckpointPolicy::TruncateOnClose,
            inline_threshold: DEFAULT_INLINE_THRESHOLD,
        }
    }
}

/// What to create: [`CreateOptions::default`] (a random id) or [`CreateOptions::with_id`],
/// then the `with_*` methods (new settings may be added in a minor release).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct CreateOptions {
    /// The id; a random 32-hex id when `None`.
    pub session_id: Option<SessionId>,
    /// Working directory recorded in the header, exactly as given (at most 4,096 bytes).
    /// Listings and searches compare it byte for byte: spell it with
    /// [`absolute_cwd`](crate::absolute_cwd), as the CLI's `--cwd` and Python's `cwd=` do,
    /// so that `/srv/api/`, `/srv//api` and `.` in `/srv/api` are one folder.
    pub cwd: Option<String>,
    /// The session this one derives from.
    pub parent_session_id: Option<SessionId>,
    /// How it came to be (default `new`).
    pub origin: Origin,
    /// Free-form provenance JSON.
    pub provenance: Option<Value>,
}

impl CreateOptions {
    /// Options for a session with this id.
    pub fn with_id(id: SessionId) -> Self {
        CreateOptions {
            session_id: Some(id),
            ..CreateOptions::default()
        }
    }

    /// These options with the working directory `cwd` recorded in the header, exactly as
    /// given (a relative one too): pass it through [`absolute_cwd`](crate::absolute_cwd)
    /// first to record it as the CLI and the Python package do, the absolute folder it
    /// names, which is what their `--cwd` and `cwd=` filters compare.
    pub fn with_cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// These options with the session this one derives from.
    pub fn with_parent(mut self, parent: SessionId) -> Self {
        self.parent_session_id = Some(parent);
        self
    }

    /// These options with how the session came to be.
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }

    /// These options with free-form provenance JSON.
    pub fn with_provenance(mut self, provenance: Value) -> Self {
        self.provenance = Some(provenance);
        self
    }
}

impl StoreOptions {
    /// These options with `durability`.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// These options with the write-behind delay `delay` (`Duration::MAX`: no timed
    /// drain, see [`StoreOptions::write_behind`]).
    pub fn with_write_behind(mut self, delay: Duration) -> Self {
        self.write_behind = delay;
        self
    }

    /// These options with a write-queue budget of `bytes` (refused by
    /// [`Root::with_options`] when 0).
    pub fn with_queue_budget(mut self, bytes: usize) -> Self {
        self.queue_budget = bytes;
        self
    }

    /// These options with the close policy `policy`.
    pub fn with_checkpoint(mut self, policy: CheckpointPolicy) -> Self {
        self.checkpoint = policy;
        self
    }

    /// These options with the inline threshold `bytes` (checked by [`Root::with_options`]).
    pub fn with_inline_threshold(mut self, bytes: usize) -> Self {
        self.inline_threshold = bytes;
        self
    }
}

/// What `stat` reports about a session without reading its events.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct SessionInfo {
    /// The header row.
    pub header: Header,
    /// Last durable sequence.
    pub durable_sequence: u64,
    /// Events read from ancestors' files now: the sum of `lineage`'s ranges (0 once an
    /// import or an ancestor's delete materialised them; the header's `inherited_events`
    /// keeps the count at the cut).
    pub inherited_events: u64,
    /// The ancestors, oldest first.
    pub lineage: Vec<LineageEntry>,
    /// The last writer that took the lease.
    pub last_writer: WriterOwner,
}

/// Which file is at a path ([`Root::session_file_identity`]): its device, inode and,
/// where the file system keeps one, creation time (a file made after another was deleted
/// may get its inode number). Compare two with `==`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity((u64, u64, Option<std::time::SystemTime>));

/// A folder of sessions, one sub-folder each.
///
/// ```
/// use session_store::{Batch, CreateOptions, Event, Root, SessionId};
/// # fn main() -> session_store::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let root = Root::open(dir.path())?;
/// let session = root.create(CreateOptions::with_id(SessionId::new("demo")?))?;
/// session.append(Batch::new("op-1", vec![Event::new("session/title").with_payload(&serde_json::json!({"title": "Hello"}))?]))?;
/// assert_eq!(session.flush()?, 1);
/// session.close()?;
/// assert_eq!(root.open_reader(&SessionId::new("demo")?)?.projection()?.title, "Hello");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Root {
    inner: Arc<RootInner>,
}

/// What one read of a root folder found ([`Root::scan`]).
#[derive(Debug, Default)]
pub(crate) struct RootScan {
    /// The folders named as session ids, sorted, not yet looked into
    /// ([`RootScan::ids`] keeps those holding a session file).
    pub(crate) folders: Vec<SessionId>,
    /// The entries named like sessions that are none of this root's, sorted.
    pub(crate) skipped: Vec<SkippedSession>,
}

impl RootScan {
    /// The ids of the root's sessions, sorted: the folders named as ids that hold a
    /// `session.sqlite` (of any type) or that this process may not look into. One `stat`
    /// per folder, so a listing's first page, which needs only [`RootScan::skipped`],
    /// does not pay it.
    pub(crate) fn ids(&self, root: &Root) -> Vec<SessionId> {
        self.folders
            .iter()
            .filter(|id| holds_session_file(&root.session_dir(id)))
            .cloned()
            .collect()
    }
}

/// Whether the folder `dir` holds a `session.sqlite` (of any type: opening it says what is
/// wrong with it) or cannot be looked into.
fn holds_session_file(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(SESSION_FILE)).map_or_else(
        |e| e.kind() == std::io::ErrorKind::PermissionDenied,
        |_| true,
    )
}

#[derive(Debug)]
struct RootInner {
    /// The root folder, resolved once when opened (no symlink in it).
    path: PathBuf,
    /// The root folder, held open: the store's folders inside it are opened relative to it.
    dir: rustix::fd::OwnedFd,
    options: StoreOptions,
    host: String,
    catalog: Catalog,
    /// The search index once opened (shared with the live sessions, which index drains).
    search: crate::store::search::IndexSlot,
    /// The sessions the search index holds nothing of because their file could not be
    /// read at its last fill or catch-up ([`Root::unsearchable`]).
    unsearchable: std::sync::Mutex<Vec<SkippedSession>>,
    /// The last read of the folder a listing's first page used ([`Root::listing_scan`]).
    scans: scan_cache::ScanCache,
}

/// The header of a new session (a random id unless one is given).
///
/// # Errors
/// [`Error::InvalidInput`] for a working directory [`Header::check_cwd`] refuses, or a
/// session named as its own parent.
fn new_header(options: CreateOptions) -> Result<Header> {
    if let Some(cwd) = &options.cwd {
        Header::check_cwd(cwd)?;
    }
    if let (Some(id), Some(parent)) = (&options.session_id, &options.parent_session_id)
        && id == parent
    {
        return Err(Error::invalid(format!(
            "session {id} cannot be its own parent: give another session, or no parent"
        )));
    }
    Ok(Header {
        session_id: options.session_id.unwrap_or_else(SessionId::random),
        codec: CODEC.to_owned(),
        created_at_ms: now_ms(),
        cwd: options.cwd,
        parent_id: options.parent_session_id,
        origin: options.origin,
        provenance: options.provenance,
        inherited_events: 0,
    })
}

/// Refuses a session folder whose file is another session's (a folder copied or renamed
/// by hand): its header names the session whose file it is, and forks of it would record
/// that session as their ancestor and read its folder instead.
///
/// # Errors
/// [`Error::Corrupt`] naming both ids.
fn check_folder_owner(id: &SessionId, reader: &SessionReader) -> Result<()> {
    let named = &reader.header().session_id;
    if named != id {
        return Err(Error::corrupt(format!(
            "session folder {id} holds the file of session {named} (copied or renamed by \
             hand?); a session file is only valid in the folder of its id"
        )));
    }
    Ok(())
}

/// Whether the session folder `dir` holds no session file now (its session was deleted,
/// or is not there): a failure met while opening or reading it is then the session's
/// [`Error::SessionNotFound`], not the error of a file that went away under it. A folder
/// this process may not look into is not "gone": the failure says why (permission denied).
pub(crate) fn session_file_gone(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(SESSION_FILE)).is_err_and(|e| schema::is_missing(&e))
}

/// `e`, met opening or reading session `id` in `dir`, unless the session was deleted
/// meanwhile: then it is [`Error::SessionNotFound`] naming the session, not the path of
/// a file gone nor SQLite's "unable to open database file".
fn gone_or(id: &SessionId, dir: &Path, e: Error) -> Error {
    if session_file_gone(dir) {
        Error::SessionNotFound(id.to_string())
    } else {
        e
    }
}

/// fsyncs a directory so that renames inside it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(format!("fsync {}", dir.display()), e))
}

/// Renames `from` to `to`, failing with `SessionExists` if `to` exists (never replaces).
pub(crate) fn rename_no_replace(from: &Path, to: &Path, id: &str) -> Result<()> {
    rename_no_replace_at(rustix::fs::CWD, from, rustix::fs::CWD, to, id, (from, to))
}

/// Renames `from` in the folder `from_dir` to `to` in `to_dir` (both names relative to
/// their folder's descriptor, neither followed if a symlink), failing with
/// `SessionExists` naming `id` if `to` exists (never replaces). `shown` are their whole
/// paths, for an error (it named the bare names, "rename create-543b… to b1", and a
/// folder in `.trash` by its random name alone).
pub(crate) fn rename_no_replace_at(
    from_dir: impl rustix::fd::AsFd,
    from: &Path,
    to_dir: impl rustix::fd::AsFd,
    to: &Path,
    id: &str,
    shown: (&Path, &Path),
) -> Result<()> {
    use rustix::fs::{RenameFlags, renameat_with};
    match renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY) => {
            Err(Error::SessionExists(id.to_owned()))
        }
        Err(e) => Err(Error::io(
            format!("rename {} to {}", shown.0.display(), shown.1.display()),
            std::io::Error::from(e),
        )),
    }
}

/// A private folder under the root's `.staging/` (see [`Root::scratch`]), guarded for as
/// long as the handle lives (no `Root::open` in any process removes it) and removed when
/// dropped; after a crash the next `Root::open` removes it.
///
/// Sessions that arrive from outside the library (a restore from a replica) are laid out
/// in it and published into the root one by one: [`Scratch::session_file`] says where
/// to write a session's file, [`Scratch::staged_ancestors`] what it inherits from, and
/// [`Scratch::publish_session`] renames it into place, as `create` and `import` publish
/// what they build.
#[derive(Debug)]
pub struct Scratch {
    staged: Staged,
    root: Root,
}

impl Scratch {
    /// The folder.
    pub fn path(&self) -> &Path {
        self.staged.dir()
    }

    /// Where the session `id` is laid out in this folder: the path of its session file,
    /// `<scratch>/<id>/session.sqlite`, its folder created (an existing one is kept).
    ///
    /// # Errors
    /// [`Error::Io`] when the folder cannot be created.
    pub fn session_file(&self, id: &SessionId) -> Result<PathBuf> {
        Ok(self.staged.make_child(id.as_str())?.join(SESSION_FILE))
    }

    /// The ancestors the session file of `id` in this folder names in its lineage, oldest
    /// first. They are not opened (they may be in the root already, or still to come).
    ///
    /// # Errors
    /// [`Error::SessionNotFound`] when no file of `id` is laid out here;
    /// [`Error::InvalidInput`] for a symlink; [`Error::Corrupt`] or
    /// [`Error::UnsupportedVersion`] for a file that is not a session file this build reads.
    pub fn staged_ancestors(&self, id: &SessionId) -> Result<Vec<SessionId>> {
        let file = self.path().join(id.as_str()).join(SESSION_FILE);
        let mut ids: Vec<SessionId> = Vec::new();
        for entry in crate::store::read::read_file_lineage(&file)? {
            if !ids.contains(&entry.ancestor_id) {
                ids.push(entry.ancestor_id);
            }
        }
        Ok(ids)
    }

    /// Publishes the session `id` laid out in this folder into the root: its file (and a
    /// `-wal` beside it) and its folder are fsynced, the folder is renamed to `<root>/<id>`
    /// without ever replacing a session, the rename is made durable and the catalog and
    /// the search index told.
    /// The file is not verified: check it with [`verify_file`](crate::verify_file) once its ancestors are published.
    ///
    /// # Errors
    /// [`Error::SessionExists`] when the root already has `id` (the copy stays here);
    /// [`Error::SessionNotFound`] when no file of `id` is laid out here;
    /// [`Error::InvalidInput`] for a symlink in the laid-out folder; [`Error::Io`].
    pub fn publish_session(&self, id: &SessionId) -> Result<()> {
        let dir = self.path().join(id.as_str());
        schema::check_session_dir(&dir)?;
        for file in [SESSION_FILE, WAL_FILE] {
            let path = dir.join(file);
            match schema::open_no_follow(&path) {
                Ok(f) => f
                    .sync_all()
                    .map_err(|e| Error::io(format!("fsync {}", path.display()), e))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
            }
        }
        sync_dir(&dir)?;
        let root = &self.root;
        self.staged
            .publish_child(id.as_str(), root.dir_fd(), root.path(), id.as_str())?;
        // The catalog is derived: a session it misses is indexed on the next open.
        drop(root.inner.catalog.touch(root, id));
        // So is the search index (best effort: a session whose ancestors are still to
        // come is indexed on its next writer open or by a rebuild).
        root.index_session(id);
        Ok(())
    }
}

/// How many times a writer open retries a lock held only by a passing probe.
const LOCK_ATTEMPTS: usize = 3;

impl Root {
    /// Opens (creating if needed) a root with default options.
    ///
    /// # Errors
    /// [`Error::Io`] when the folder cannot be created; [`Error::InvalidInput`] for an
    /// empty path or one that is there but is not a folder (a file).
    pub fn open(path: impl AsRef<Path>) -> Result<Root> {
        Self::with_options(path, StoreOptions::default())
    }

    /// Opens (creating if needed) a root with these options.
    ///
    /// # Errors
    /// [`Error::Io`] when the folder cannot be created; [`Error::InvalidInput`] for an empty
    /// path or one that is not a folder, a zero budget or an inline threshold out of range.
    pub fn with_options(path: impl AsRef<Path>, options: StoreOptions) -> Result<Root> {
        if options.queue_budget == 0 {
            return Err(Error::invalid("queue budget must be positive"));
        }
        content::check_threshold(options.inline_threshold)?;
        // Resolved once: a root reached through a symlinked folder works, and no path
        // the store builds below it contains a symlink.
        let (path, dir) = confine::open_root(path.as_ref())?;
        // Tombstones are sessions already deleted, and staging folders of builds whose
        // process died; a crash may leave either behind. A `.trash` that is not a real
        // folder of the root is left alone (never followed).
        if let Ok(trash) = confine::open_dir_at(&dir, TRASH_DIR, &path.join(TRASH_DIR)) {
            for name in confine::entries(&trash).unwrap_or_default() {
                let _ = confine::remove_tree_at(&trash, &name);
            }
        }
        staging::remove_abandoned(&dir, &path);
        Ok(Root {
            inner: Arc::new(RootInner {
                catalog: Catalog::new(&path),
                search: crate::store::search::IndexSlot::default(),
                unsearchable: std::sync::Mutex::default(),
                scans: scan_cache::ScanCache::default(),
                path,
                dir,
                options,
                host: crate::error::host_name(),
            }),
        })
    }

    /// The root folder, resolved (symlinks in the path given to [`Root::open`] followed).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The root folder's descriptor.
    pub(crate) fn dir_fd(&self) -> rustix::fd::BorrowedFd<'_> {
        use rustix::fd::AsFd;
        self.inner.dir.as_fd()
    }

    /// A private scratch folder `.staging/<purpose>-<random>/`, guarded like a session
    /// being built: no `Root::open` (in any process) removes it while the handle lives;
    /// dropped, it is removed (never following a symlink inside it).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a purpose that is not lowercase ASCII letters and `-`,
    /// or a `.staging` that is a symlink; [`Error::Io`] when it cannot be created.
    pub fn scratch(&self, purpose: &str) -> Result<Scratch> {
        if purpose.is_empty() || !purpose.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
            return Err(Error::invalid(format!(
                "{purpose:?} is not a scratch purpose"
            )));
        }
        Staged::new(self.dir_fd(), &self.inner.path, purpose).map(|staged| Scratch {
            staged,
            root: self.clone(),
        })
    }

    /// The folder `name` of the root (e.g. a scratch folder), created when missing. It
    /// must be a real folder: a symlink (or any other file) there is refused, never
    /// followed.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when `name` is not a plain name, or names a symlink or
    /// another file; [`Error::Io`] when it cannot be created.
    pub fn confined_dir(&self, name: &str) -> Result<PathBuf> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::invalid(format!("{name:?} is not a folder name")));
        }
        let path = self.inner.path.join(name);
        confine::ensure_dir_at(self.dir_fd(), name, &path)?;
        Ok(path)
    }

    /// Moves the session `id` out of the session namespace into the folder `folder` of the
    /// root (a dot-name such as `.restore-failed`, created when missing, never a symlink),
    /// as `<folder>/<random>/<id>`, and returns that path: a copy kept for inspection that
    /// listing, opening and deleting no longer see. Its writer lock is taken first.
    /// Sessions that inherit from it are not materialised: they cannot be read while it is
    /// away ([`Root::delete`] keeps them readable instead).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when `folder` is not a dot-name or is a symlink or a file;
    /// [`Error::SessionNotFound`]; [`Error::WriterOwned`] when a writer holds the session;
    /// [`Error::Io`].
    pub fn set_aside(&self, id: &SessionId, folder: &str) -> Result<PathBuf> {
        if folder.len() < 2 || !folder.starts_with('.') || folder == ".." || folder.contains('/') {
            return Err(Error::invalid(format!(
                "{} is not a dot-folder name",
                crate::error::quoted(folder)
            )));
        }
        let folder_path = self.inner.path.join(folder);
        let dir = self.existing_dir(id)?;
        let folder_fd = confine::ensure_dir_at(self.dir_fd(), folder, &folder_path)?;
        let lock = self.take_writer_lock(id, &dir)?;
        // A fresh folder per move: the id is not part of its name, so the longest id fits.
        let holder = random_hex();
        let aside = folder_path.join(&holder);
        confine::ensure_dir_at(&folder_fd, &holder, &aside)?;
        rename_no_replace_at(
            self.dir_fd(),
            Path::new(id.as_str()),
            &folder_fd,
            &Path::new(&holder).join(id.as_str()),
            id.as_str(),
            (&dir, &aside.join(id.as_str())),
        )?;
        drop(lock);
        // Derived index; listing also drops entries whose folder is gone.
        let _ = self.inner.catalog.forget(self, id);
        sync_dir(&self.inner.path)?;
        Ok(aside.join(id.as_str()))
    }

    /// The options in force.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    /// The folder of a session (whether or not it exists).
    pub fn session_dir(&self, id: &SessionId) -> PathBuf {
        self.inner.path.join(id.as_str())
    }

    /// Which file holds session `id` now, `None` when there is none (or it cannot be
    /// looked at). Two answers differ when the session was deleted, or deleted and made
    /// again, in between: a read that fails while this changes met a delete, not damage.
    pub fn session_file_identity(&self, id: &SessionId) -> Option<FileIdentity> {
        crate::store::folder_swap::file_identity(&self.session_dir(id).join(SESSION_FILE))
            .map(FileIdentity)
    }

    /// A session folder that exists and is a real directory (not a symlink), holding a
    /// session file that is a regular file with no symlink beside it (see
    /// [`schema::check_session_dir`]).
    fn existing_dir(&self, id: &SessionId) -> Result<PathBuf> {
        let dir = self.session_dir(id);
        match schema::check_session_dir(&dir) {
            Ok(()) => Ok(dir),
            Err(Error::SessionNotFound(_)) => Err(Error::SessionNotFound(id.to_string())),
            Err(e) => Err(e),
        }
    }

    /// Creates a session and opens it for writing. The folder appears atomically: it is
    /// built under `.staging/` and renamed into place with its writer lock already held.
    ///
    /// # Errors
    /// [`Error::SessionExists`] when the id is taken; [`Error::InTheWay`] when its name in
    /// the root is taken by something that is no session (a folder without a session
    /// file); [`Error::InvalidInput`] for an empty `cwd`, one over 4,096 bytes or one
    /// holding a NUL, or a session given itself as parent; I/O and SQLite errors. A
    /// session whose open for writing fails once it is published (out of inodes for its
    /// `-wal`, say) is taken out again, being empty, so that a failed create leaves no
    /// session whose id its caller never got (outside testing, resource limits); when that
    /// fails too (another opener took it meanwhile), the session stays.
    pub fn create(&self, options: CreateOptions) -> Result<Session> {
        let header = new_header(options)?;
        let id = header.session_id.clone();
        let (staged, lock) = self.stage(&id, "create", |conn| write::init_file(conn, &header))?;
        self.publish(staged, &id, &CancelToken::new())?;
        self.start_writer(&self.session_dir(&id), lock)
            .inspect_err(|_| drop(self.unmake(&id)))
    }

    /// Moves session `id`'s folder out of the session namespace into the root's dot-folder
    /// `folder` (named `folder_name`, open as `into`) as `name`, which must be free: from
    /// then on no command sees the session.
    fn move_out(
        &self,
        id: &SessionId,
        into: &rustix::fd::OwnedFd,
        folder_name: &str,
        name: &str,
    ) -> Result<()> {
        rename_no_replace_at(
            self.dir_fd(),
            Path::new(id.as_str()),
            into,
            Path::new(name),
            id.as_str(),
            (
                &self.session_dir(id),
                &self.inner.path.join(folder_name).join(name),
            ),
        )
    }

    /// Takes a session [`Root::create`] just published, empty, out of the root again: moved
    /// back into `.staging` (which the create made) and removed there. A rename and
    /// unlinks only, since what failed may be the want of an inode (a delete makes `.trash`
    /// when it is missing, which then failed too).
    fn unmake(&self, id: &SessionId) -> Result<()> {
        let dir = self.session_dir(id);
        let lock = self.take_writer_lock(id, &dir)?;
        let staging_path = self.inner.path.join(staging::STAGING_DIR);
        let staging = confine::open_dir_at(self.dir_fd(), staging::STAGING_DIR, &staging_path)?;
        let name = format!("unmade-{}", random_hex());
        self.move_out(id, &staging, staging::STAGING_DIR, &name)?;
        drop(lock);
        let _ = self.inner.catalog.forget(self, id);
        let name = std::ffi::CString::new(name)
            .map_err(|e| Error::internal_from("a staging name holds no NUL", e))?;
        confine::remove_tree_at(&staging, &name)
            .map_err(|e| Error::io(format!("remove {}", staging_path.display()), e))?;
        sync_dir(&self.inner.path)
    }

    /// Creates a session whose first batch is `first` and opens it for writing: the session
    /// is published (as by [`Root::create`]) only once `first` was appended and made
    /// durable, so a batch the writer refuses creates nothing. Returns the session and the
    /// commit of `first`.
    ///
    /// # Errors
    /// As [`Root::create`]; what [`Session::append`] returns for `first`
    /// ([`Error::InvalidInput`], [`Error::InvalidPayload`], …), nothing created.
    pub fn create_with_batch(
        &self,
        options: CreateOptions,
        first: Batch,
    ) -> Result<(Session, Arc<Commit>)> {
        let mut commit = None;
        let session = self.create_filled(options, "create", |s| {
            commit = Some(s.append(first)?);
            Ok(())
        })?;
        let commit = commit.ok_or_else(|| Error::internal("the first batch was not appended"))?;
        Ok((session, commit))
    }

    /// Creates a session and has `fill` write to it while it is still under `.staging/`;
    /// closes it and only then publishes it, so a crash or an error before the end leaves
    /// nothing visible (at most a staging folder). The writer lock is held throughout:
    /// the session is published locked and reopened for writing under that same lock, as
    /// [`Root::create`] does, so no other opener can take it in between.
    ///
    /// # Errors
    /// [`Error::SessionExists`] when the id is taken; `fill`'s error; I/O and SQLite
    /// errors (an error of the final open leaves the session published, unopened).
    pub(crate) fn create_filled(
        &self,
        options: CreateOptions,
        purpose: &str,
        fill: impl FnOnce(&Session) -> Result<()>,
    ) -> Result<Session> {
        let header = new_header(options)?;
        let id = header.session_id.clone();
        let (staged, lock) = self.stage(&id, purpose, |conn| write::init_file(conn, &header))?;
        let filling = self.start_writer(staged.dir(), lock)?;
        fill(&filling)?;
        let lock = filling.close_keeping_lock()?;
        // Nothing of the filling session may stay open on the staged path.
        drop(filling);
        self.publish(staged, &id, &CancelToken::new())?;
        self.start_writer(&self.session_dir(&id), lock)
    }

    /// What takes session `id`'s name in the root when that is no session (a folder
    /// without a session file, a file, a symlink), as the [`Error::InTheWay`] that making
    /// the session there would fail with; `None` when the name is free or a session's.
    /// For a command that fetches a session before it publishes it (`restore`): it fails
    /// so before the download rather than at the publish.
    pub fn in_the_way(&self, id: &SessionId) -> Option<Error> {
        std::fs::symlink_metadata(self.session_dir(id)).ok()?;
        match self.taken(id) {
            in_the_way @ Error::InTheWay { .. } => Some(in_the_way),
            _ => None,
        }
    }

    /// The error of making session `id` where its name in the root is taken:
    /// [`Error::InTheWay`] when what is there is no session (a folder without a session
    /// file, a file, a symlink), else [`Error::SessionExists`].
    pub(crate) fn taken(&self, id: &SessionId) -> Error {
        let path = self.session_dir(id);
        let what = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_symlink() => "a symlink".to_owned(),
            Ok(m) if !m.is_dir() => "a file, not a session folder".to_owned(),
            Ok(_) if session_file_gone(&path) => {
                format!("a folder without a session file ({SESSION_FILE})")
            }
            _ => return Error::SessionExists(id.to_string()),
        };
        Error::InTheWay {
            id: id.to_string(),
            path,
            what,
        }
    }

    /// Builds a new session file in a fresh staging folder and takes its writer lock.
    /// `fill` runs on the new file's connection; the folder is removed on any failure
    /// (when the returned [`Staged`] is dropped unpublished).
    pub(crate) fn stage(
        &self,
        id: &SessionId,
        purpose: &str,
        fill: impl FnOnce(&mut rusqlite::Connection) -> Result<()>,
    ) -> Result<(Staged, WriterLock)> {
        if self.session_dir(id).exists() {
            return Err(self.taken(id));
        }
        let staged = Staged::new(self.dir_fd(), &self.inner.path, purpose)?;
        let file = staged.dir().join(SESSION_FILE);
        let mut conn = schema::create_file(&file)?;
        fill(&mut conn)?;
        schema::finish_staged(conn, &file)?;
        let lock = WriterLock::try_acquire(&staged.dir().join(LOCK_FILE))?
            .ok_or_else(|| Error::internal("lock of a fresh staging folder is held"))?;
        sync_dir(staged.dir())?;
        Ok((staged, lock))
    }

    /// Renames a staged session folder into place (removing it if that fails) and
    /// records it in the catalog and the search index, the latter until `cancel` fires
    /// (both are derived: what they miss is caught up later).
    pub(crate) fn publish(
        &self,
        staged: Staged,
        id: &SessionId,
        cancel: &CancelToken,
    ) -> Result<()> {
        staged
            .publish(self.dir_fd(), &self.inner.path, id.as_str())
            .map_err(|e| match e {
                Error::SessionExists(_) => self.taken(id),
                e => e,
            })?;
        // The catalog is derived: a session it misses is indexed on the next open.
        drop(self.inner.catalog.touch(self, id));
        self.index_session_unless_cancelled(id, cancel);
        Ok(())
    }

    pub(crate) fn catalog(&self) -> &Catalog {
        &self.inner.catalog
    }

    fn index_slot(&self) -> &crate::store::search::IndexSlot {
        &self.inner.search
    }

    /// Catalog entries of the sessions with ids after `after`, in id order, at most
    /// `limit` (stale entries recomputed from their files, vanished ones dropped). A
    /// session that cannot be read (a foreign or newer-schema file) is passed over and
    /// reported in [`Listing::skipped`]; a catalog that cannot be written (a read-only
    /// root, a full disk) is bypassed and reported in [`Listing::catalog_error`].
    ///
    /// # Errors
    /// [`Error::Io`] when the root folder cannot be read.
    pub fn list(&self, after: Option<&str>, limit: usize) -> Result<Listing> {
        self.inner.catalog.page(self, after, limit)
    }

    /// Records a closed writer's session in the catalog from its in-memory projection (no
    /// re-fold), unless it holds commits never written (a poisoned session's).
    ///
    /// # Errors
    /// When the catalog cannot be written (it is derived: the entry is recomputed when
    /// next listed).
    pub(crate) fn record_closed(&self, session: &Session) -> Result<()> {
        let (accepted, durable) = session.sequences();
        if accepted != durable {
            // Released with commits never written (a poisoned session): its projection
            // is not the file's. The entry is recomputed from the file when next listed.
            return Ok(());
        }
        let updated_at_ms = session.updated_at_ms()?;
        let entry = session
            .with_projection(|p| CatalogEntry::new(session.reader(), p, durable, updated_at_ms));
        self.inner.catalog.put(self, &entry)
    }

    /// Renames a session as its writer: opens it for writing, appends a `session/title`
    /// event ([`Session::rename`]), closes it and records the new title in the catalog, so
    /// `list` shows it at once.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a blank title, one holding NUL or one over 1,024 bytes
    /// (nothing changes);
    /// [`Error::SessionNotFound`]; [`Error::WriterOwned`] when another writer has it; as
    /// [`Session::append`] and [`Session::close`].
    pub fn rename(&self, id: &SessionId, title: &str) -> Result<()> {
        // Checked before the writer is taken, so a bad title changes nothing (not even the
        // lease generation).
        crate::model::payload::title_event(title)?;
        let session = self.open_writer(id)?;
        let appended = session.rename(title);
        let closed = self.close(&session);
        appended?;
        closed
    }

    /// Closes `session`, one of this root's writers ([`Session::close`]), and records its
    /// catalog entry from its projection, as [`crate::Service::close`] does: the next
    /// listing shows it without reading its file again. After [`Session::close`] alone a
    /// listing folds the session's whole log once (outside testing L4: `list` after a CLI
    /// `append` of one turn to a session of 500,000 messages took 2 s and 320 MB). The
    /// catalog is derived: an entry that cannot be recorded is only computed again when
    /// listed.
    ///
    /// # Errors
    /// As [`Session::close`].
    pub fn close(&self, session: &Session) -> Result<()> {
        session.close()?;
        let _ = self.record_closed(session);
        Ok(())
    }

    /// As [`Root::list`], keeping only the sessions that pass `filter`, in its order;
    /// `after` is a cursor from [`ListFilter::cursor_after`]. A filtered or sorted page
    /// first brings stale catalog entries up to date (one `stat` per session; skipped with
    /// [`ListFilter::cached_only`]), then is one keyset query on the catalog; unreadable
    /// sessions are reported on the first page.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a cursor another listing made (another order, other
    /// filters) or none made, for a `cwd` filter that no session can have been created
    /// with (empty, or holding a NUL: `create` and `import` refuse those) and for an empty
    /// `title` filter (every title contains it); as [`Root::list`].
    pub fn list_filtered(
        &self,
        filter: &ListFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Listing> {
        // An empty `--cwd "$DIR"` of an unset variable listed "no sessions match".
        if let Some(cwd) = &filter.cwd {
            crate::model::header::Header::check_cwd(cwd)?;
        }
        // An empty `--title "$TEXT"` of an unset variable listed every session as if
        // filtered.
        if filter.title.as_deref() == Some("") {
            return Err(Error::invalid(
                "title filter is empty: every title contains it; give the text to look for, \
                 or no title filter",
            ));
        }
        self.inner.catalog.filtered_page(self, filter, after, limit)
    }

    /// Totals over the catalog as last refreshed: sessions, bytes of their files and WALs,
    /// events, turns, token usage and cost, in one scan of its rows (no session file opened, so
    /// its cost does not grow with the sessions' sizes). Entries are as fresh as the last
    /// refreshing listing ([`Root::list`], or [`Root::list_filtered`] without
    /// [`ListFilter::cached_only`]).
    ///
    /// # Errors
    /// When the catalog cannot be opened or read.
    pub fn catalog_totals(&self) -> Result<CatalogTotals> {
        self.inner.catalog.totals(self)
    }

    /// One session's catalog entry (title, turns, preview, usage, header fields) without
    /// folding it: the cached entry when the session's files did not change since it was
    /// recorded, else computed from the file (and recorded).
    ///
    /// # Errors
    /// [`Error::SessionNotFound`]; as [`Root::open_reader`] for a file that cannot be read.
    pub fn catalog_entry(&self, id: &SessionId) -> Result<CatalogEntry> {
        self.inner.catalog.entry(self, id)
    }

    /// Recomputes the catalog from the session files, replacing whatever is there (also a
    /// damaged or foreign catalog file), and rebuilds the search index (creating it when
    /// missing). Sessions that cannot be read are reported, not indexed.
    ///
    /// # Errors
    /// When the root cannot be read or the catalog cannot be written.
    pub fn rebuild_catalog(&self) -> Result<RebuildReport> {
        let mut report = self.inner.catalog.rebuild(self)?;
        report.searchable = self.rebuild_search()?;
        Ok(report)
    }

    /// Opens an existing session for writing: takes the writer lock, bumps the lease
    /// generation and rebuilds the projection from the file.
    ///
    /// # Errors
    /// [`Error::SessionNotFound`], also for a session deleted while it is opened;
    /// [`Error::WriterOwned`] naming the holder when another writer, in this process or
    /// another, has it.
    pub fn open_writer(&self, id: &SessionId) -> Result<Session> {
        let dir = self.existing_dir(id)?;
        let open = || {
            // Before the lock and the lease: a refused folder is left as it is.
            check_folder_owner(id, &SessionReader::open(&dir)?)?;
            let lock = self.take_writer_lock(id, &dir)?;
            self.start_writer(&dir, lock)
        };
        open().map_err(|e| gone_or(id, &dir, e))
    }

    /// Takes the writer lock of session `id`'s folder `dir`, retrying a lock held only for a
    /// moment (a probe, or a child process between `fork` and `exec` that shares the
    /// descriptor).
    ///
    /// # Errors
    /// [`Error::WriterOwned`] naming the holder when a writer keeps it.
    fn take_writer_lock(&self, id: &SessionId, dir: &Path) -> Result<WriterLock> {
        let lock_path = dir.join(LOCK_FILE);
        for attempt in 1..=LOCK_ATTEMPTS {
            if let Some(lock) = WriterLock::try_acquire(&lock_path)? {
                return Ok(lock);
            }
            if attempt < LOCK_ATTEMPTS {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Err(Error::WriterOwned {
            session: id.to_string(),
            owner: self.current_owner(dir, RecordWait::ForFinal)?,
        })
    }

    /// The writer holding the lock of the session folder `dir`: its record in the lock file
    /// (waited for as `wait` says), else the lease in its file.
    fn current_owner(&self, dir: &Path, wait: RecordWait) -> Result<WriterOwner> {
        match recorded_owner(&dir.join(LOCK_FILE), wait) {
            Some(owner) => Ok(owner),
            None => SessionReader::open(dir)?.lease(),
        }
    }

    /// This process as a writer lock's holder before it has a lease (generation 0): what
    /// a refused opener names.
    pub(crate) fn provisional_owner(&self) -> WriterOwner {
        WriterOwner {
            owner_id: random_hex(),
            host: self.inner.host.clone(),
            pid: std::process::id(),
            generation: 0,
            since_ms: now_ms(),
            holding_for: None,
        }
    }

    /// Opens the session file in `dir` for writing under `lock` (held by the caller) and
    /// starts the live session on it.
    fn start_writer(&self, dir: &Path, lock: WriterLock) -> Result<Session> {
        let options = &self.inner.options;
        let writer = FileWriter::open(
            dir,
            lock,
            self.provisional_owner(),
            options.durability,
            options.checkpoint,
            options.inline_threshold,
        )?;
        // A session still under `.staging/` is indexed once published.
        let published = dir.parent() == Some(self.path());
        let session = Session::start(
            dir,
            writer,
            WriteBehind {
                delay: options.write_behind,
                budget: options.queue_budget,
                index: published.then(|| Arc::clone(self.index_slot())),
            },
        )?;
        if published {
            // What an earlier writer drained without indexing (it died, or its index
            // write failed) is caught up from the file.
            self.index_reader(session.reader());
        }
        Ok(session)
    }

    /// Opens a session read-only: no lock, no lease; sees only the durable prefix.
    ///
    /// # Errors
    /// [`Error::SessionNotFound`], also for a session deleted while it is opened;
    /// [`Error::Corrupt`] or [`Error::UnsupportedVersion`] for a file this build cannot
    /// read.
    pub fn open_reader(&self, id: &SessionId) -> Result<SessionReader> {
        let dir = self.existing_dir(id)?;
        let reader = SessionReader::open(&dir).map_err(|e| match e {
            // Deleted since `existing_dir`: the session is what is not found.
            Error::SessionNotFound(_) if session_file_gone(&dir) => {
                Error::SessionNotFound(id.to_string())
            }
            e => e,
        })?;
        check_folder_owner(id, &reader)?;
        Ok(reader)
    }

    /// Header, sequences, lineage and last writer of a session.
    ///
    /// # Errors
    /// As [`Root::open_reader`]; a session deleted while it is read is
    /// [`Error::SessionNotFound`].
    pub fn stat(&self, id: &SessionId) -> Result<SessionInfo> {
        self.read_settled(id, |reader| {
            let lineage = reader.lineage();
            Ok(SessionInfo {
                header: reader.header().clone(),
                durable_sequence: reader.durable_sequence()?,
                inherited_events: lineage.iter().map(|e| e.through_seq - e.after_seq).sum(),
                lineage,
                last_writer: reader.lease()?,
            })
        })
    }

    /// The current writer of a session, if one holds its lock now.
    ///
    /// # Errors
    /// As [`Root::open_reader`]; a session deleted while it is asked (by a delete holding
    /// its lock) is [`Error::SessionNotFound`].
    pub fn writer_owner(&self, id: &SessionId) -> Result<Option<WriterOwner>> {
        let dir = self.existing_dir(id)?;
        let owner = || {
            if lock::is_held(&dir.join(LOCK_FILE))? {
                self.current_owner(&dir, RecordWait::AsItIs).map(Some)
            } else {
                Ok(None)
            }
        };
        owner().map_err(|e| gone_or(id, &dir, e))
    }

    /// Whether a writer holds session `id` now, of this process or another: its writer
    /// lock probed (one open and a non-blocking lock attempt), without reading who
    /// ([`Root::writer_owner`] does). `false` when the lock cannot be looked at (the
    /// session was deleted meanwhile).
    pub(crate) fn writer_held(&self, id: &SessionId) -> bool {
        lock::is_held(&self.session_dir(id).join(LOCK_FILE)).unwrap_or(false)
    }

    /// Ids of every session under the root, sorted: folders holding a `session.sqlite`,
    /// also one that is not a regular file (a symlink, a folder) and a folder this process
    /// may not look into, which every open then refuses, so `list` reports it as skipped
    /// instead of passing over it. Staging, trash and other dot-entries are never listed,
    /// nor what is no session of this root though named like one: a symlink to a folder
    /// (never followed), a folder whose name is not UTF-8 or not a valid session id (`list` and
    /// `rebuild-catalog` report those as skipped, `gc` as kept).
    ///
    /// # Errors
    /// [`Error::Io`] when the root cannot be read.
    pub fn list_ids(&self) -> Result<Vec<SessionId>> {
        Ok(self.scan()?.ids(self))
    }

    /// [`Root::scan`] for a listing's first page, which reports the entries that are no
    /// session of the root (and, the first time this process opens the catalog, indexes
    /// the ids): the last such read again while the root folder shows no change since it
    /// (its inode, modification and change times; the read is kept only when the folder had
    /// been left alone for a moment before it, see `scan_cache`). Every session created,
    /// published, deleted or renamed into the root changes the folder's times; what they do
    /// not show (a session file put into a folder named as no valid id, a symlink's target
    /// replaced) is reported once the folder changes again.
    ///
    /// # Errors
    /// As [`Root::scan`].
    pub(crate) fn listing_scan(&self) -> Result<Arc<RootScan>> {
        self.inner
            .scans
            .get_or_read(&self.inner.path, || self.scan())
    }

    /// One read of the root folder: its folders named as session ids (their sessions:
    /// [`RootScan::ids`], as [`Root::list_ids`]) and, each as skipped with why, the entries named like sessions that are none of this
    /// root's, which no command can open: a symlink to a folder ("a symlink; sessions are
    /// folders of the root"; one to a file or dangling is left out, as a file is), a
    /// session folder whose name is not UTF-8 or is not a valid session id
    /// (under its name as it is, [`SessionId::shown`]: only the bytes that are not UTF-8 as
    /// U+FFFD). Both sorted; dot-entries left out.
    ///
    /// # Errors
    /// [`Error::Io`] when the root cannot be read.
    pub(crate) fn scan(&self) -> Result<RootScan> {
        let entries = std::fs::read_dir(&self.inner.path)
            .map_err(|e| Error::io(format!("read {}", self.inner.path.display()), e))?;
        let mut scan = RootScan::default();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("read root entry", e))?;
            let name = entry.file_name();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if name.as_encoded_bytes().starts_with(b".") {
                continue;
            }
            let path = entry.path();
            // A symlink to a folder: what a linked session looks like (one to a file, or
            // dangling, is no more a session than a file is). Its target is looked at by
            // `stat`, never opened.
            let why = if kind.is_symlink() && path.is_dir() {
                "a symlink; sessions are folders of the root".to_owned()
            } else if kind.is_dir() {
                let why = match name.to_str().map(SessionId::new) {
                    Some(Ok(id)) => {
                        // Looked into only when its id is needed (`RootScan::ids`).
                        scan.folders.push(id);
                        continue;
                    }
                    Some(Err(Error::InvalidInput { what, .. })) => format!("not a session: {what}"),
                    Some(Err(e)) => format!("not a session: {e}"),
                    None => "not a session: name is not UTF-8".to_owned(),
                };
                if !holds_session_file(&path) {
                    continue;
                }
                why
            } else {
                continue;
            };
            scan.skipped.push(SkippedSession {
                session_id: SessionId::shown(&name.to_string_lossy()),
                error: Arc::new(Error::invalid(format!("{} is {why}", path.display()))),
            });
        }
        scan.folders.sort();
        scan.skipped.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        Ok(scan)
    }
}
