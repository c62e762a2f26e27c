//! Confinement to the root: inside a root no symbolic link is ever followed.
//!
//! The root's own path is resolved once, when it is opened (so a root reached through a
//! symlinked folder works), and its directory is held open. Every folder the store
//! manages inside it (`.trash`, `.staging`, their entries) is opened relative to its
//! parent's descriptor with `O_NOFOLLOW | O_DIRECTORY`, and trees are removed with
//! `unlinkat` relative to descriptors: a symlink found anywhere is unlinked, never
//! followed, so nothing outside the root is ever read, created, written or removed.

use std::ffi::CString;
use std::path::Path;

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::store::schema;

/// Deepest tree [`remove_tree_at`] descends into (session folders are a few levels deep).
const MAX_DEPTH: usize = 32;

/// Flags of a directory opened without following a symlink.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// The error for an entry of the root that must be a real directory and is not.
fn not_confined(shown: &Path) -> Error {
    Error::invalid(format!(
        "{} is not a directory of the root (a symlink or another file); refused",
        shown.display()
    ))
}

/// Opens the root folder `path` (resolved, following the user's symlinks) and returns
/// its resolved path and descriptor. The folder is created when missing.
/// An empty path is [`Error::InvalidInput`] (it was an I/O error, "resolve root : No such
/// file or directory"), and so is a path that is there but no folder (it was
/// "create root X: File exists").
pub(crate) fn open_root(path: &Path) -> Result<(std::path::PathBuf, OwnedFd)> {
    if path.as_os_str().is_empty() {
        return Err(Error::invalid(
            "the root path is empty: give a folder (\".\" for the current one)",
        ));
    }
    std::fs::create_dir_all(path).map_err(|e| {
        // The path is there as something else (a file, a device): the caller's path is
        // wrong, and "create root X: File exists" did not say how.
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::invalid(format!(
                "root {} is not a folder; give a folder's path",
                path.display()
            ))
        } else {
            Error::io(format!("create root {}", path.display()), e)
        }
    })?;
    let resolved = std::fs::canonicalize(path)
        .map_err(|e| Error::io(format!("resolve root {}", path.display()), e))?;
    let fd = rustix::fs::open(
        &resolved,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format!("open root {}", resolved.display()), e.into()))?;
    Ok((resolved, fd))
}

/// Opens the directory `name` of `dir` without following a symlink. `shown` is its path
/// for messages. A symlink or a non-directory is [`Error::InvalidInput`]; a missing entry
/// is an [`Error::Io`] of kind `NotFound`.
pub(crate) fn open_dir_at(dir: impl AsFd, name: &str, shown: &Path) -> Result<OwnedFd> {
    match rustix::fs::openat(dir, name, dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(Errno::LOOP | Errno::NOTDIR) => Err(not_confined(shown)),
        Err(e) => Err(Error::io(format!("open {}", shown.display()), e.into())),
    }
}

/// Opens the directory `name` of `dir`, creating it when missing; never follows a symlink
/// (a symlink there is refused, see [`open_dir_at`]).
///
/// One made here by root is given to the owner of `dir` (see
/// [`schema::give_to_folder_owner`]): root's first delete in a user's root made a
/// root-owned `.trash` (its first `list`, `.catalog`), and every delete by the user then
/// failed.
pub(crate) fn ensure_dir_at(dir: impl AsFd, name: &str, shown: &Path) -> Result<OwnedFd> {
    match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o777)) {
        Ok(()) => {
            let made = open_dir_at(&dir, name, shown)?;
            schema::give_to_folder_owner(&made, shown.parent());
            Ok(made)
        }
        Err(Errno::EXIST) => open_dir_at(dir, name, shown),
        Err(e) => Err(Error::io(format!("create {}", shown.display()), e.into())),
    }
}

/// The names in the directory `dir` (without `.` and `..`).
pub(crate) fn entries(dir: impl AsFd) -> std::io::Result<Vec<CString>> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir)? {
        let name = entry?.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    Ok(names)
}

/// The type of `name` in `dir`, not following a symlink.
fn type_at(dir: impl AsFd, name: &std::ffi::CStr) -> Option<FileType> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .map(|st| FileType::from_raw_mode(st.st_mode))
}

/// True when `name` in `dir` is a real directory (a symlink to one is not).
pub(crate) fn is_dir_at(dir: impl AsFd, name: &std::ffi::CStr) -> bool {
    type_at(dir, name) == Some(FileType::Directory)
}

/// True when `name` in `dir` is a symlink.
pub(crate) fn is_symlink_at(dir: impl AsFd, name: &std::ffi::CStr) -> bool {
    type_at(dir, name) == Some(FileType::Symlink)
}

/// Removes `name` from `dir`, and everything under it when it is a directory, with
/// `unlinkat` relative to descriptors: a symlink is unlinked, never followed. A missing
/// entry is not an error.
pub(crate) fn remove_tree_at(dir: impl AsFd, name: &std::ffi::CStr) -> std::io::Result<()> {
    remove_below(dir.as_fd(), name, 0)
}

fn remove_below(
    dir: rustix::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    depth: usize,
) -> std::io::Result<()> {
    if !is_dir_at(dir, name) {
        return match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    if depth >= MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "{} is nested deeper than {MAX_DEPTH} folders",
            name.to_string_lossy()
        )));
    }
    let sub = match rustix::fs::openat(dir, name, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for entry in entries(&sub)? {
        remove_below(sub.as_fd(), &entry, depth + 1)?;
    }
    drop(sub);
    match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_unlinks_symlinks_and_never_follows_them() {
        let root = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("canary"), b"keep").expect("write");
        let tree = root.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).expect("mkdir");
        std::fs::write(tree.join("a/b/f"), b"x").expect("write");
        std::os::unix::fs::symlink(outside.path(), tree.join("a/link")).expect("symlink");
        std::os::unix::fs::symlink(outside.path().join("canary"), tree.join("file-link"))
            .expect("symlink");
        let (_, fd) = open_root(root.path()).expect("root");
        remove_tree_at(&fd, c"tree").expect("remove");
        assert!(!tree.exists());
        assert_eq!(
            std::fs::read(outside.path().join("canary")).expect("canary"),
            b"keep"
        );
    }

    #[test]
    fn a_symlinked_folder_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(outside.path(), root.path().join(".trash")).expect("symlink");
        let (_, fd) = open_root(root.path()).expect("root");
        let shown = root.path().join(".trash");
        assert!(matches!(
            ensure_dir_at(&fd, ".trash", &shown),
            Err(Error::InvalidInput { .. })
        ));
        assert!(ensure_dir_at(&fd, ".staging", &shown).is_ok());
    }
}
