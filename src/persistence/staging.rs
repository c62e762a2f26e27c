//! Staging: new session folders are built under `<root>/.staging/` and renamed into place
//! whole, so a reader sees either nothing or the complete session.
//!
//! Each staging folder `<name>` has a guard beside it, `<name>.lock`, locked (`flock`) by
//! the process building it from before the folder exists until after it is published or
//! removed. The kernel drops the lock when that process dies, so a folder whose guard can
//! be locked is certainly abandoned: [`remove_abandoned`], run when a root is opened,
//! removes exactly those and never a folder another process is still building.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::model::ids::random_hex;
use crate::persistence::{rename_no_replace, sync_dir};
use crate::store::lock::WriterLock;

/// Folder under the root where new sessions are built before publication.
pub(crate) const STAGING_DIR: &str = ".staging";

/// Suffix of a staging folder's guard file.
const GUARD_SUFFIX: &str = ".lock";

/// A folder being built under `.staging/`, invisible to every reader until
/// [`Staged::publish`]. Dropped unpublished (an error on the way), it is removed.
#[derive(Debug)]
pub(crate) struct Staged {
    dir: PathBuf,
    guard_path: PathBuf,
    /// Held for the folder's whole life under `.staging/`.
    _guard: WriterLock,
    published: bool,
}

impl Staged {
    /// A fresh, empty staging folder `<purpose>-<random>` under `root` (the session id
    /// is not part of the name, so the longest valid id still fits).
    pub(crate) fn new(root: &Path, purpose: &str) -> Result<Staged> {
        let staging = root.join(STAGING_DIR);
        std::fs::create_dir_all(&staging)
            .map_err(|e| Error::io(format!("create {}", staging.display()), e))?;
        let name = format!("{purpose}-{}", random_hex());
        let guard_path = staging.join(format!("{name}{GUARD_SUFFIX}"));
        let guard = WriterLock::try_acquire(&guard_path)?
            .ok_or_else(|| Error::invalid(format!("{} is held", guard_path.display())))?;
        let staged = Staged {
            dir: staging.join(name),
            guard_path,
            _guard: guard,
            published: false,
        };
        std::fs::create_dir(&staged.dir)
            .map_err(|e| Error::io(format!("create {}", staged.dir.display()), e))?;
        Ok(staged)
    }

    /// The folder being built.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Renames the folder to `target` (never replacing: [`Error::SessionExists`] names
    /// `id`) and makes the rename durable. On failure the folder is removed.
    pub(crate) fn publish(mut self, target: &Path, id: &str) -> Result<()> {
        rename_no_replace(&self.dir, target, id)?;
        self.published = true;
        match target.parent() {
            Some(root) => sync_dir(root),
            None => Ok(()),
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        // Removed while still locked: nobody can be waiting on a guard of a random name.
        let _ = std::fs::remove_file(&self.guard_path);
    }
}

/// Removes the staging folders of `root` that no living process is building (left by a
/// crash); returns how many. Best effort: a folder that cannot be removed stays.
pub(crate) fn remove_abandoned(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root.join(STAGING_DIR)) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = entry.path();
        let mut guard_name = entry.file_name();
        guard_name.push(GUARD_SUFFIX);
        let guard_path = dir.with_file_name(guard_name);
        // A folder built by this or another living process has its guard locked.
        if let Ok(Some(_guard)) = WriterLock::try_acquire(&guard_path) {
            if std::fs::remove_dir_all(&dir).is_ok() {
                removed += 1;
            }
            let _ = std::fs::remove_file(&guard_path);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_abandoned_folders_are_removed_and_an_error_removes_its_own() {
        let root = tempfile::tempdir().expect("tempdir");
        let live = Staged::new(root.path(), "create").expect("stage");
        std::fs::write(live.dir().join("session.sqlite"), b"x").expect("write");
        // An abandoned folder: no living guard (as after a SIGKILL).
        let abandoned = root.path().join(STAGING_DIR).join("import-0123");
        std::fs::create_dir(&abandoned).expect("mkdir");
        std::fs::write(abandoned.join("session.sqlite"), b"y").expect("write");

        assert_eq!(remove_abandoned(root.path()), 1);
        assert!(!abandoned.exists());
        assert!(
            live.dir().join("session.sqlite").is_file(),
            "a live build stays"
        );

        let dir = live.dir().to_path_buf();
        drop(live);
        assert!(
            !dir.exists(),
            "an unpublished folder is removed when dropped"
        );
        let left: Vec<_> = std::fs::read_dir(root.path().join(STAGING_DIR))
            .expect("read")
            .collect();
        assert!(left.is_empty(), "guards removed too: {left:?}");
    }

    #[test]
    fn publish_moves_the_folder_and_never_replaces() {
        let root = tempfile::tempdir().expect("tempdir");
        let target = root.path().join("s1");
        let staged = Staged::new(root.path(), "create").expect("stage");
        std::fs::write(staged.dir().join("f"), b"1").expect("write");
        staged.publish(&target, "s1").expect("publish");
        assert!(target.join("f").is_file());

        let second = Staged::new(root.path(), "create").expect("stage");
        let dir = second.dir().to_path_buf();
        assert!(matches!(
            second.publish(&target, "s1"),
            Err(Error::SessionExists(_))
        ));
        assert!(!dir.exists(), "a refused publication removes its folder");
        assert_eq!(std::fs::read(target.join("f")).expect("read"), b"1");
    }
}
