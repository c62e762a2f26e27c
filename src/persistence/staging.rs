//! Staging: new session folders are built under `<root>/.staging/` and renamed into place
//! whole, so a reader sees either nothing or the complete session.
//!
//! Each staging folder `<name>` has a guard beside it, `<name>.lock`, locked (`flock`) by
//! the process building it from before the folder exists until after it is published or
//! removed. The kernel drops the lock when that process dies, so a folder whose guard can
//! be locked is certainly abandoned: [`remove_abandoned`], run when a root is opened,
//! removes exactly those and never a folder another process is still building.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::error::{Error, Result};
use crate::model::ids::random_hex;
use crate::persistence::confine;
use crate::persistence::{rename_no_replace_at, sync_dir};
use crate::store::folder_swap;
use crate::store::lock::WriterLock;

pub(crate) use crate::format::STAGING_DIR;

/// Suffix of a staging folder's guard file.
const GUARD_SUFFIX: &str = ".lock";

/// Fresh names tried before a staging folder is refused (each one's guard held).
const FRESH_NAME_ATTEMPTS: usize = 8;

/// A folder being built under `.staging/`, invisible to every reader until
/// [`Staged::publish`]. Dropped unpublished (an error on the way), it is removed.
#[derive(Debug)]
pub(crate) struct Staged {
    /// `.staging`, held open (checked to be a real folder of the root).
    staging: OwnedFd,
    /// The folder's name in `.staging`.
    name: String,
    dir: PathBuf,
    /// Held for the folder's whole life under `.staging/`.
    _guard: WriterLock,
    published: bool,
}

/// Opens (creating it when missing) the root's `.staging`, refusing a symlink there.
fn open_staging(root: BorrowedFd<'_>, root_path: &Path) -> Result<OwnedFd> {
    confine::ensure_dir_at(root, STAGING_DIR, &root_path.join(STAGING_DIR))
}

impl Staged {
    /// A fresh, empty staging folder `<purpose>-<random>` under the root whose folder is
    /// `root` (the session id is not part of the name, so the longest valid id still fits).
    pub(crate) fn new(root: BorrowedFd<'_>, root_path: &Path, purpose: &str) -> Result<Staged> {
        let staging = open_staging(root, root_path)?;
        let staging_path = root_path.join(STAGING_DIR);
        // A fresh name's guard is free unless another process holds that very path; a CI
        // run once saw it held (the names then came from `fastrand`, whose global generator
        // seeds from the clock and the thread id only; now from the OS, `random_u64`), so a
        // held guard means: take another name.
        let mut attempt = 0;
        // A guard is also taken again when the file this process locked is no longer the
        // one at its path: [`remove_abandoned`] of another process may have locked and
        // unlinked it between this process creating and locking it (a guard with no folder
        // beside it looks abandoned), and a lock on an unlinked file guards nothing.
        let (name, guard) = loop {
            let name = format!("{purpose}-{}", random_hex());
            let guard_path = staging_path.join(format!("{name}{GUARD_SUFFIX}"));
            match WriterLock::try_acquire(&guard_path)? {
                Some(guard) if guard.is_at(&guard_path) => break (name, guard),
                Some(_) | None if attempt < FRESH_NAME_ATTEMPTS => attempt += 1,
                Some(_) | None => {
                    return Err(Error::internal(format!(
                        "the staging guards of {FRESH_NAME_ATTEMPTS} fresh names were held or taken away, the last {name}"
                    )));
                }
            }
        };
        let dir = staging_path.join(&name);
        rustix::fs::mkdirat(
            &staging,
            name.as_str(),
            rustix::fs::Mode::from_raw_mode(0o777),
        )
        .map_err(|e| Error::io(format!("create {}", dir.display()), e.into()))?;
        Ok(Staged {
            staging,
            name,
            dir,
            _guard: guard,
            published: false,
        })
    }

    /// The folder being built.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Renames the folder to `id` in the root (never replacing: [`Error::SessionExists`]
    /// names `id`) and makes the rename durable. On failure the folder is removed.
    pub(crate) fn publish(
        mut self,
        root: BorrowedFd<'_>,
        root_path: &Path,
        id: &str,
    ) -> Result<()> {
        folder_swap::publishing(|| {
            rename_no_replace_at(
                &self.staging,
                Path::new(&self.name),
                root,
                Path::new(id),
                id,
                (&self.dir, &root_path.join(id)),
            )
        })?;
        self.published = true;
        sync_dir(root_path)
    }

    /// Creates the folder `child` inside this staging folder (an existing one is kept, a
    /// symlink there refused); returns its path.
    pub(crate) fn make_child(&self, child: &str) -> Result<PathBuf> {
        let path = self.dir.join(child);
        confine::ensure_dir_at(&self.staging, &format!("{}/{child}", self.name), &path)?;
        Ok(path)
    }

    /// Renames the folder `child` of this staging folder to `id` in the root (never
    /// replacing: [`Error::SessionExists`] names `id`) and makes the rename durable. The
    /// staging folder itself stays (other children may follow).
    pub(crate) fn publish_child(
        &self,
        child: &str,
        root: BorrowedFd<'_>,
        root_path: &Path,
        id: &str,
    ) -> Result<()> {
        let relative = Path::new(&self.name).join(child);
        folder_swap::publishing(|| {
            rename_no_replace_at(
                &self.staging,
                &relative,
                root,
                Path::new(id),
                id,
                (&self.dir.join(child), &root_path.join(id)),
            )
        })?;
        sync_dir(root_path)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.published
            && let Ok(name) = CString::new(self.name.as_str())
        {
            let _ = confine::remove_tree_at(&self.staging, &name);
        }
        // Removed while still locked: nobody can be waiting on a guard of a random name.
        let guard = format!("{}{GUARD_SUFFIX}", self.name);
        let _ = rustix::fs::unlinkat(&self.staging, guard.as_str(), rustix::fs::AtFlags::empty());
    }
}

/// Removes the staging folders of the root (folder `root`, resolved path `root_path`)
/// that no living process is building (left by a crash); returns how many. Best effort:
/// a folder that cannot be removed stays; a symlink is unlinked; a `.staging` that is not
/// a real folder of the root is left alone (never followed).
pub(crate) fn remove_abandoned(root: impl AsFd, root_path: &Path) -> usize {
    let staging_path = root_path.join(STAGING_DIR);
    let Ok(staging) = confine::open_dir_at(root, STAGING_DIR, &staging_path) else {
        return 0;
    };
    let mut removed = 0;
    for name in confine::entries(&staging).unwrap_or_default() {
        if !confine::is_dir_at(&staging, &name) {
            // The store never makes a symlink here: unlink one (never follow it).
            if confine::is_symlink_at(&staging, &name) {
                let _ = rustix::fs::unlinkat(&staging, &name, rustix::fs::AtFlags::empty());
            } else {
                remove_orphaned_guard(&staging, &staging_path, &name);
            }
            continue;
        }
        let Ok(text) = name.to_str() else {
            continue;
        };
        let guard = format!("{text}{GUARD_SUFFIX}");
        // A folder built by this or another living process has its guard locked (a
        // guard that is a symlink is refused: the folder stays).
        if let Ok(Some(_guard)) = WriterLock::try_acquire(&staging_path.join(&guard)) {
            if confine::remove_tree_at(&staging, &name).is_ok() {
                removed += 1;
            }
            let _ = rustix::fs::unlinkat(&staging, guard.as_str(), rustix::fs::AtFlags::empty());
        }
    }
    removed
}

/// Unlinks `name` in `.staging` when it is a guard with no folder beside it that no
/// living process holds: what a builder killed after publishing its folder (before it
/// unlinked the guard), or between creating the guard and making the folder, leaves. A
/// builder locks its guard before it makes the folder, so once this process holds the
/// guard no folder of that name can appear; a builder that had created the file but not
/// yet locked it finds it unlinked and takes another name ([`Staged::new`]).
fn remove_orphaned_guard(staging: &OwnedFd, staging_path: &Path, name: &std::ffi::CStr) {
    let Some(folder) = name
        .to_str()
        .ok()
        .and_then(|text| text.strip_suffix(GUARD_SUFFIX))
    else {
        return;
    };
    let Ok(folder) = CString::new(folder) else {
        return;
    };
    if confine::is_dir_at(staging, &folder) {
        return;
    }
    let Ok(text) = name.to_str() else {
        return;
    };
    if let Ok(Some(_guard)) = WriterLock::try_acquire(&staging_path.join(text))
        && !confine::is_dir_at(staging, &folder)
    {
        let _ = rustix::fs::unlinkat(staging, name, rustix::fs::AtFlags::empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_abandoned_folders_are_removed_and_an_error_removes_its_own() {
        let root = tempfile::tempdir().expect("tempdir");
        let (path, fd) = confine::open_root(root.path()).expect("root");
        let live = Staged::new(fd.as_fd(), &path, "create").expect("stage");
        std::fs::write(live.dir().join("session.sqlite"), b"x").expect("write");
        // An abandoned folder: no living guard (as after a SIGKILL).
        let abandoned = root.path().join(STAGING_DIR).join("import-0123");
        std::fs::create_dir(&abandoned).expect("mkdir");
        std::fs::write(abandoned.join("session.sqlite"), b"y").expect("write");

        assert_eq!(remove_abandoned(&fd, &path), 1);
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
        let (path, fd) = confine::open_root(root.path()).expect("root");
        let target = path.join("s1");
        let staged = Staged::new(fd.as_fd(), &path, "create").expect("stage");
        std::fs::write(staged.dir().join("f"), b"1").expect("write");
        staged.publish(fd.as_fd(), &path, "s1").expect("publish");
        assert!(target.join("f").is_file());

        let second = Staged::new(fd.as_fd(), &path, "create").expect("stage");
        let dir = second.dir().to_path_buf();
        assert!(matches!(
            second.publish(fd.as_fd(), &path, "s1"),
            Err(Error::SessionExists(_))
        ));
        assert!(!dir.exists(), "a refused publication removes its folder");
        assert_eq!(std::fs::read(target.join("f")).expect("read"), b"1");
    }
}
