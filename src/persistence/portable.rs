//! Export to one self-contained SQLite file, and validated, atomic import of such a file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{Connection, Transaction};
use serde::Serialize;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::model::header::{Header, Origin};
use crate::model::{Event, SessionId};
use crate::persistence::export_temp::{self, ExportTemp};
use crate::persistence::verify::{LogValidator, Target, naming_file, resolve_target};
use crate::persistence::{Root, rename_no_replace, sync_dir};
use crate::store::read::{check_integrity, read_file_lineage};
use crate::store::reader::SessionReader;
use crate::store::schema::{self, Access};
use crate::store::write::{self, Accepted};

/// Commits inserted per statement batch while copying a log.
const COPY_BATCH: usize = 256;

/// Payload bytes held for one statement batch at most (the batch is written once it
/// reaches this, so commits sharing a large blob are not all held at once).
const COPY_BATCH_BYTES: usize = 32 << 20;

/// What an export wrote.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct ExportReport {
    /// Commits in the file.
    pub commits: u64,
    /// Events in the file (its last sequence).
    pub events: u64,
    /// Size of the file in bytes.
    pub bytes: u64,
}

/// How an imported session is published: [`ImportOptions::default`] (the file's id and
/// working directory), then the `with_*` methods (new settings may be added in a minor
/// release).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ImportOptions {
    /// Publish under this id instead of the file's (id remap).
    pub session_id: Option<SessionId>,
    /// Working directory to record (default: the file's).
    pub cwd: Option<String>,
    /// Origin to record (default: [`Origin::CanonicalImport`]).
    pub origin: Option<Origin>,
}

impl ImportOptions {
    /// These options publishing under `id` instead of the file's id.
    pub fn with_session_id(mut self, id: SessionId) -> Self {
        self.session_id = Some(id);
        self
    }

    /// These options recording the working directory `cwd`, exactly as given (a relative
    /// one too): pass it through [`absolute_cwd`](crate::absolute_cwd) first to record it
    /// as the CLI and the Python package do, the absolute folder it names, which is what
    /// their `--cwd` and `cwd=` filters compare.
    pub fn with_cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// These options recording `origin`.
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = Some(origin);
        self
    }
}

/// Copies the validated log of `reader` up to `through` into a fresh file's connection,
/// string values longer than `inline_threshold` as content parts; [`Error::Cancelled`]
/// (nothing committed) as soon as `cancel` fires.
fn copy_log(
    reader: &SessionReader,
    through: u64,
    conn: &mut Connection,
    inline_threshold: usize,
    cancel: &CancelToken,
) -> Result<(u64, u64)> {
    write::in_transaction(conn, |tx| {
        copy_commits(reader, through, tx, inline_threshold, cancel)
    })
}

/// The body of [`copy_log`], inside its transaction.
fn copy_commits(
    reader: &SessionReader,
    through: u64,
    tx: &Transaction<'_>,
    inline_threshold: usize,
    cancel: &CancelToken,
) -> Result<(u64, u64)> {
    let mut validator = LogValidator::new();
    let mut pending = Vec::with_capacity(COPY_BATCH);
    let mut pending_bytes = 0usize;
    let mut commits = 0u64;
    reader.visit(through, |c| {
        if cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let effects = validator.check(&c)?;
        commits += 1;
        pending_bytes += c.events.iter().map(Event::payload_len).sum::<usize>();
        pending.push(Arc::new(Accepted {
            commit: Arc::new(c),
            closed_turns: effects.turns,
            history: effects.history,
            charge: 0,
        }));
        if pending.len() >= COPY_BATCH || pending_bytes >= COPY_BATCH_BYTES {
            write::insert_commits(tx, &pending, inline_threshold)?;
            pending.clear();
            pending_bytes = 0;
        }
        Ok(())
    })?;
    write::insert_commits(tx, &pending, inline_threshold)?;
    if validator.last_seq() != through {
        return Err(Error::corrupt(format!(
            "log ends at {}, expected {through}",
            validator.last_seq()
        )));
    }
    Ok((commits, through))
}

/// Checks an export destination and returns its folder (resolved: the user's symlinks
/// followed) and the destination path in it.
fn export_destination(dest: &Path) -> Result<(PathBuf, PathBuf)> {
    match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_file() || m.is_symlink() => {
            return Err(Error::DestinationExists(dest.to_owned()));
        }
        Ok(m) => {
            return Err(Error::invalid(format!(
                "export destination {} is {}; give the path of a new file",
                dest.display(),
                if m.is_dir() {
                    "a directory"
                } else {
                    "not a regular file (a device, FIFO or socket)"
                }
            )));
        }
        // Nothing there: no such entry, or a part of the path above it is a file (its
        // folder is then refused below, naming it).
        Err(e) if crate::store::schema::is_missing(&e) => {}
        Err(e) => return Err(Error::io(format!("stat {}", dest.display()), e)),
    }
    // A trailing `/` names a folder (`cp FILE new/` refuses it too): the file was written
    // without it, at `new`.
    if dest.as_os_str().as_encoded_bytes().ends_with(b"/") {
        return Err(Error::invalid(format!(
            "export destination {} ends with '/', which names a folder; give the path of a \
             new file",
            dest.display()
        )));
    }
    let name = dest.file_name().ok_or_else(|| {
        Error::invalid(format!(
            "export destination {} has no file name",
            dest.display()
        ))
    })?;
    let folder = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let not_a_folder = |path: &Path, why: &str| {
        Error::invalid(format!(
            "export folder {} is not a directory{why}",
            path.display()
        ))
    };
    let folder = match std::fs::canonicalize(folder) {
        Ok(resolved) if resolved.is_dir() => resolved,
        Ok(resolved) => return Err(not_a_folder(&resolved, "")),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(not_a_folder(folder, " (a part of its path is a file)"));
        }
        Err(e) => return Err(Error::io(format!("export folder {}", folder.display()), e)),
    };
    let dest = folder.join(name);
    Ok((folder, dest))
}

impl Root {
    /// Writes a session's durable prefix as one self-contained SQLite file at `destination`
    /// (which must not exist): inherited ranges and blobs materialised, no lineage, lease
    /// or dependents, `journal_mode=DELETE`. Built under a temporary name beside the
    /// destination, checked with `integrity_check`, fsynced and renamed into place.
    ///
    /// A live session keeps running: flush it first to include its latest commits; the
    /// export holds the durable prefix as of its start.
    ///
    /// The destination's folder is the user's: its symlinks are followed (resolved once);
    /// the destination itself and the temporary file are never followed.
    ///
    /// # Errors
    /// [`Error::DestinationExists`] when the destination exists (a file or a symlink);
    /// [`Error::InvalidInput`] when it is a folder, a device or another non-regular file,
    /// its path ends with `/` (which names a folder), its folder is not a folder, or it is inside the root (a session folder, the store's
    /// own folders or the root itself); [`Error::Io`] of kind `NotFound` when its folder is
    /// missing; read, validation and I/O errors (no file is left at the destination).
    pub fn export(&self, id: &SessionId, destination: impl AsRef<Path>) -> Result<ExportReport> {
        self.export_cancellable(id, destination, &CancelToken::new())
    }

    /// [`Root::export`] that stops when `cancel` fires (a command line's Ctrl-C): the
    /// copy checks it before each commit and before the file is checked and renamed into
    /// place, and a cancelled export removes its temporary file, as a failed one does.
    ///
    /// # Errors
    /// [`Error::Cancelled`] when `cancel` fired before the file was in place (nothing is
    /// left at the destination or beside it); otherwise as [`Root::export`].
    pub fn export_cancellable(
        &self,
        id: &SessionId,
        destination: impl AsRef<Path>,
        cancel: &CancelToken,
    ) -> Result<ExportReport> {
        let (folder, dest) = export_destination(destination.as_ref())?;
        // The root is the store's: a file in a session folder goes with that session's
        // delete, and one at the top takes an id's name (its session then "already exists"
        // and is "not found" at once).
        if folder.starts_with(self.path()) {
            return Err(Error::invalid(format!(
                "export destination {} is inside the root {}; give a path outside it",
                dest.display(),
                self.path().display()
            )));
        }
        let reader = self.open_reader(id)?;
        let through = reader.durable_sequence()?;
        // What an export killed here before left (its lock died with it), then a new
        // temporary file, locked until this export ends: declared before the connections
        // below, so that it is dropped after them (§9).
        export_temp::remove_leftovers(&folder);
        let guard = ExportTemp::create(&folder)?;
        let temp = guard.path().to_path_buf();
        let written = (|| {
            let mut conn = schema::create_private_file(&temp)?;
            write::init_file(&mut conn, reader.header())?;
            let (commits, events) = copy_log(
                &reader,
                through,
                &mut conn,
                self.options().inline_threshold,
                cancel,
            )?;
            schema::use_rollback_journal(&conn)?;
            schema::finish_staged(conn, &temp)?;
            if cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            check_integrity(&temp, Access::Shared)?;
            if cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            let bytes = std::fs::symlink_metadata(&temp).map_or(0, |m| m.len());
            // A file made there meanwhile (another export to the same path) is the
            // destination's, not a session's.
            rename_no_replace(&temp, &dest, &dest.display().to_string()).map_err(|e| match e {
                Error::SessionExists(_) => Error::DestinationExists(dest.to_owned()),
                e => e,
            })?;
            sync_dir(&folder)?;
            Ok(ExportReport {
                commits,
                events,
                bytes,
            })
        })();
        if written.is_err() {
            guard.discard();
        }
        written
    }

    /// Validates an exported file and publishes it as a new session: application id and
    /// schema version, `integrity_check`, no lineage, contiguous sequences, operation
    /// hashes, blob digests and a full projection replay — all before anything becomes
    /// visible. The copy is built under `.staging/` and renamed into place. The file is the
    /// user's: a symlink to it is followed (resolved once), and nothing is created beside
    /// it but SQLite's `-shm` of a `-wal` that is there without one (see
    /// [`replay_file`](crate::replay_file)). `file` may also be a session's folder:
    /// its `session.sqlite` is imported (a self-contained one: a root session, or one whose
    /// inherited range was materialised).
    ///
    /// # Errors
    /// [`Error::SessionExists`] when the target id is taken; [`Error::Io`] of kind
    /// `NotFound` naming the path when nothing is there, or a folder without a
    /// `session.sqlite` ("DIR is a folder without a session file (session.sqlite): …"),
    /// [`Error::is_not_found`];
    /// [`Error::Corrupt`] or [`Error::UnsupportedVersion`] for a bad file;
    /// [`Error::InvalidInput`] for a file that is not self-contained, the export of a fork
    /// given its parent's id (it would be its own parent), one with a hot journal
    /// beside it (see [`replay_file`](crate::replay_file)), or a path that is neither a
    /// folder nor a regular file (a FIFO is refused before it is opened). Nothing is left
    /// on disk on failure.
    pub fn import(&self, file: impl AsRef<Path>, options: ImportOptions) -> Result<SessionId> {
        self.import_cancellable(file, options, &CancelToken::new())
    }

    /// [`Root::import`] that stops when `cancel` fires (a command line's Ctrl-C, a service
    /// caller gone): it is checked before anything is read, before each commit of the copy
    /// and before the session is published, and a cancelled import removes its staging
    /// folder, as a failed one does. Once the session is published the import is done:
    /// `cancel` then only stops its search indexing (left to the next process's first
    /// search), and the new id is returned.
    ///
    /// # Errors
    /// [`Error::Cancelled`] when `cancel` fired before the session was published (nothing
    /// is left in the root); otherwise as [`Root::import`].
    pub fn import_cancellable(
        &self,
        file: impl AsRef<Path>,
        options: ImportOptions,
        cancel: &CancelToken,
    ) -> Result<SessionId> {
        if cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        let target = resolve_target(file.as_ref())?;
        self.import_target(&target, options, cancel)
            .map_err(|e| naming_file(e, &target.file))
    }

    /// [`Root::import_cancellable`] of the file `target` resolved.
    fn import_target(
        &self,
        target: &Target,
        options: ImportOptions,
        cancel: &CancelToken,
    ) -> Result<SessionId> {
        check_integrity(&target.file, target.access)?;
        // Before a reader opens what the rows name (folders beside the user's file).
        let lineage = read_file_lineage(&target.file)?;
        if let Some(first) = lineage.first() {
            return Err(Error::invalid(format!(
                "import is not a self-contained export: it has lineage rows (it inherits \
                 sequences {}..={} from {}); export the session to get its whole history",
                first.after_seq + 1,
                first.through_seq,
                first.ancestor_id
            )));
        }
        let reader = SessionReader::open_file(&target.file, &target.root, target.access)?;
        let mut header = reader.header().clone();
        if let Some(id) = options.session_id {
            header.session_id = id;
        }
        if let Some(cwd) = options.cwd {
            Header::check_cwd(&cwd)?;
            header.cwd = Some(cwd);
        } else if let Some(cwd) = header.cwd.take() {
            // What `create` refuses is refused from a file too (an empty cwd, one holding
            // NUL or longer than a path; a creation time no listing can place were
            // imported).
            Header::check_cwd(&cwd).map_err(|e| match e {
                Error::InvalidInput { what, .. } => Error::invalid(format!(
                    "the file's header: {what}; import it with a cwd of its own (--cwd DIR)"
                )),
                other => other,
            })?;
            // An absolute one spelled as `--cwd` and `cwd=` filters spell it (`/srv//api/.`
            // is `/srv/api`): kept as the file had it, no filter found the session (outside
            // testing C4). A relative one, which a library host may record, is kept.
            header.cwd = Some(if std::path::Path::new(&cwd).is_absolute() {
                crate::absolute_cwd(&cwd)?
            } else {
                cwd
            });
        }
        header.check_created_at()?;
        Header::check_commit_time(reader.newest_commit_ms()?)?;
        header.origin = options.origin.unwrap_or(Origin::CanonicalImport);
        // A fork's export imported under its parent's id named itself as its own parent
        // (`show`: "parent X", in the root).
        if header.parent_id.as_ref() == Some(&header.session_id) {
            return Err(Error::invalid(format!(
                "the export was forked from {0}: imported as {0} it would be its own parent; \
                 give it another id",
                header.session_id
            )));
        }
        let id = header.session_id.clone();
        let through = reader.durable_sequence()?;
        let (staged, _lock) = self.stage(&id, "import", |conn| {
            write::init_file(conn, &header)?;
            copy_log(
                &reader,
                through,
                conn,
                self.options().inline_threshold,
                cancel,
            )
            .map(drop)
        })?;
        if cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        self.publish(staged, &id, cancel)?;
        Ok(id)
    }
}
