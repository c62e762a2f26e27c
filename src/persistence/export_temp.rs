//! The temporary file an export writes beside its destination, and what a killed export
//! left there.
//!
//! An export builds its file as `.sse-<16 hex digits>.tmp` in the destination's folder and
//! renames it into place when it is whole; a failed or cancelled export removes it. One
//! killed (`SIGKILL`, a power loss) cannot, so the file and its SQLite sidecars stayed
//! there for good. The export now holds an advisory lock (`flock`) on its temporary file
//! for as long as it runs, which the kernel releases when the process dies, and each
//! export first removes the temporary files of that name pattern in its folder that no
//! one holds.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::model::ids::random_u64;
use crate::store::schema::{self, NO_FOLLOW, open_no_follow};

const PREFIX: &str = ".sse-";
const SUFFIX: &str = ".tmp";

/// An empty leftover is removed only once it is this old: an export creates its file
/// empty and locks it right after, and a file met between the two is not a leftover.
const EMPTY_GRACE: Duration = Duration::from_secs(60);

/// The temporary files of this process's exports under way, named before they are
/// created. [`remove_leftovers`] never opens one: closing any descriptor of a file drops
/// the process's POSIX locks on it, those of the export's SQLite connection included.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Takes the list's lock for a `fork()` (`persistence::fork_hold`).
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    Box::new(live())
}

fn live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// An export's temporary file, locked while this value lives. Dropped only after every
/// SQLite connection to the file is closed: closing a descriptor of a file drops the
/// process's POSIX locks on it, SQLite's included (`flock` is a lock of its own kind).
#[derive(Debug)]
pub(crate) struct ExportTemp {
    path: PathBuf,
    _lock: File,
}

impl Drop for ExportTemp {
    fn drop(&mut self) {
        live().retain(|p| p != &self.path);
    }
}

impl ExportTemp {
    /// Creates and locks a new temporary file in `folder` (a short name, so that any
    /// destination name that fits the file system fits it too, with SQLite's `-journal`
    /// suffix). Never follows a symlink; refuses a name that exists.
    pub(crate) fn create(folder: &Path) -> Result<ExportTemp> {
        let path = folder.join(format!("{PREFIX}{:016x}{SUFFIX}", random_u64()));
        live().push(path.clone());
        let created = Self::lock_new(path.clone());
        if created.is_err() {
            live().retain(|p| p != &path);
        }
        created
    }

    fn lock_new(path: PathBuf) -> Result<ExportTemp> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(NO_FOLLOW)
            .open(&path)
            .map_err(|e| {
                // The folder was found (the export checked it): a "no such file" here is
                // a folder that takes no new file (`/proc`), not a missing one.
                let e = if e.kind() == std::io::ErrorKind::NotFound {
                    std::io::Error::other(format!("{e}: the folder takes no new file"))
                } else {
                    e
                };
                Error::io(format!("create {}", path.display()), e)
            })?;
        match file.try_lock() {
            Ok(()) => Ok(ExportTemp { path, _lock: file }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                let e = match e {
                    TryLockError::Error(e) => e,
                    TryLockError::WouldBlock => {
                        std::io::Error::from(std::io::ErrorKind::WouldBlock)
                    }
                };
                Err(Error::io(format!("lock {}", path.display()), e))
            }
        }
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file and its SQLite sidecars (a failed or cancelled export), then lets
    /// the lock go.
    pub(crate) fn discard(self) {
        remove_with_sidecars(&self.path);
    }
}

/// Removes `file` and its SQLite sidecars (unlinks: never follows a symlink); how many
/// of them were there to remove.
fn remove_with_sidecars(file: &Path) -> usize {
    std::iter::once(file.to_path_buf())
        .chain(
            schema::SIDECARS
                .iter()
                .map(|suffix| schema::sidecar(file, suffix)),
        )
        .filter(|path| std::fs::remove_file(path).is_ok())
        .count()
}

/// What a name in an export's folder is to [`remove_leftovers`].
#[derive(Debug, PartialEq)]
enum TempName<'a> {
    /// An export's temporary file.
    File,
    /// A SQLite sidecar (`-journal`, `-wal`, `-shm`) of the temporary file named here.
    Sidecar(&'a str),
}

/// Whether `name` is an export's temporary file or one of its sidecars.
fn temp_name(name: &str) -> Option<TempName<'_>> {
    let is_file = |name: &str| {
        name.strip_prefix(PREFIX)
            .and_then(|rest| rest.strip_suffix(SUFFIX))
            .is_some_and(|hex| {
                hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            })
    };
    if is_file(name) {
        return Some(TempName::File);
    }
    schema::SIDECARS
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .filter(|file| is_file(file))
        .map(TempName::Sidecar)
}

/// Removes from `folder` the temporary files (and their SQLite sidecars) of exports that
/// died: regular files of the pattern that no process holds locked ([`is_leftover`]), and
/// sidecars whose temporary file is gone (an export killed while it removed them). Best
/// effort: a file that cannot be read, locked or removed is left, and nothing here fails
/// the export that calls it. Returns how many files it removed.
pub(crate) fn remove_leftovers(folder: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let path = entry.path();
        match name.to_str().and_then(temp_name) {
            Some(TempName::File) if is_leftover(&path) => {
                removed += remove_with_sidecars(&path);
            }
            Some(TempName::Sidecar(file)) => {
                let gone = matches!(std::fs::symlink_metadata(folder.join(file)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound);
                if gone && std::fs::remove_file(&path).is_ok() {
                    removed += 1;
                }
            }
            _ => {}
        }
    }
    removed
}

/// Whether the temporary file at `path` is a dead export's: not one of this process's
/// ([`LIVE`]), a regular file (never followed) that no process holds locked. An export
/// creates its file empty and locks it right after: an empty one with no sidecar (SQLite
/// writes only after the lock is taken) is left until it is [`EMPTY_GRACE`] old.
fn is_leftover(path: &Path) -> bool {
    // Named in `LIVE` before it is created: a file listed in the folder that is not there
    // now is another process's.
    if live().iter().any(|p| p == path) {
        return false;
    }
    let Ok(file) = open_no_follow(path) else {
        return false;
    };
    let Ok(meta) = file.metadata() else {
        return false;
    };
    if !meta.is_file() {
        return false;
    }
    let young = meta
        .modified()
        .ok()
        .and_then(|at| SystemTime::now().duration_since(at).ok())
        .is_none_or(|age| age < EMPTY_GRACE);
    let written = meta.len() > 0
        || schema::SIDECARS
            .iter()
            .any(|suffix| std::fs::symlink_metadata(schema::sidecar(path, suffix)).is_ok());
    if young && !written {
        return false;
    }
    // Our own probe's lock goes with `file` when it is dropped; no connection of this
    // process has such a file open (this process's own are in `LIVE`).
    file.try_lock().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_pattern_is_a_temporary_name() {
        assert_eq!(temp_name(".sse-0123456789abcdef.tmp"), Some(TempName::File));
        assert_eq!(
            temp_name(".sse-0123456789abcdef.tmp-journal"),
            Some(TempName::Sidecar(".sse-0123456789abcdef.tmp"))
        );
        for name in [
            ".sse-0123456789ABCDEF.tmp",
            ".sse-0123456789abcde.tmp",
            ".sse-0123456789abcdef0.tmp",
            "sse-0123456789abcdef.tmp",
            ".sse-0123456789abcdef.tmp-other",
            ".sse-0123456789abcdeg.tmp-wal",
            "export.sqlite",
            "export.sqlite-journal",
        ] {
            assert_eq!(temp_name(name), None, "{name}");
        }
    }

    #[test]
    fn a_locked_or_young_empty_file_stays_and_an_unlocked_one_goes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let live = ExportTemp::create(dir.path()).expect("create");
        std::fs::write(live.path(), b"SQLite format 3\0").expect("write");
        let dead = dir.path().join(".sse-00000000000000aa.tmp");
        std::fs::write(&dead, b"SQLite format 3\0").expect("write");
        std::fs::write(schema::sidecar(&dead, "-journal"), b"j").expect("write");
        let empty = dir.path().join(".sse-00000000000000bb.tmp");
        std::fs::write(&empty, b"").expect("write");
        // Empty, but its journal says SQLite wrote: past the lock, so a dead export's.
        let journalled = dir.path().join(".sse-00000000000000dd.tmp");
        std::fs::write(&journalled, b"").expect("write");
        std::fs::write(schema::sidecar(&journalled, "-journal"), b"j").expect("write");
        // Locked by another open of it (as another process's export holds its own).
        let held = dir.path().join(".sse-00000000000000ff.tmp");
        std::fs::write(&held, b"SQLite format 3\0").expect("write");
        let holder = File::open(&held).expect("open");
        holder.try_lock().expect("lock");
        // A sidecar whose temporary file is gone.
        let orphan = schema::sidecar(&dir.path().join(".sse-00000000000000ee.tmp"), "-wal");
        std::fs::write(&orphan, b"w").expect("write");
        let other = dir.path().join(".sse-notours.tmp");
        std::fs::write(&other, b"x").expect("write");
        // A symlink of the pattern is never followed nor taken for a file.
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").expect("write");
        let link = dir.path().join(".sse-00000000000000cc.tmp");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");

        // The dead file and its journal, the journalled one and its journal, the orphan.
        assert_eq!(remove_leftovers(dir.path()), 5);
        assert!(live.path().exists(), "this process's export under way");
        assert!(held.exists(), "held by a live export");
        assert!(!dead.exists() && !schema::sidecar(&dead, "-journal").exists());
        assert!(!journalled.exists() && !orphan.exists());
        assert!(
            empty.exists(),
            "empty and young: maybe an export about to lock it"
        );
        assert!(other.exists() && target.exists() && link.exists());

        let old = SystemTime::now() - 2 * EMPTY_GRACE;
        File::options()
            .write(true)
            .open(&empty)
            .and_then(|f| f.set_modified(old))
            .expect("age it");
        assert_eq!(remove_leftovers(dir.path()), 1);
        assert!(!empty.exists());
        let live_path = live.path().to_path_buf();
        drop((live, holder));
        assert!(
            !super::live().contains(&live_path),
            "a dropped export is no longer live"
        );
    }
}
