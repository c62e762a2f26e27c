//! Run as root in a root another user owns, the CLI acts as that user.
//!
//! A root is a folder its owner (and, shared, the members of its group) may change at any
//! moment. SQLite opens every file by its path, and resolves the symlinks of that path
//! itself, after the store's checks (made relative to the root's descriptor, with
//! `O_NOFOLLOW`) and before its own use: a user who swapped a folder of the root (`.catalog`,
//! a staging folder) for a symlink at the right moment had a command run as root create,
//! write and give away files in folders only root may write (outside testing, security:
//! root's `list` made the catalog's files in such a folder and gave its journal to the
//! attacker, root's `create` wrote a whole session there). Acting as the owner, root gains
//! nothing there that the owner lacks, whatever a path resolves to; and what it makes in the
//! root belongs to the owner, as the owner's own commands' files do.

use std::path::Path;

use rustix::fs::Mode;
use rustix::process::{Gid, Uid, geteuid};

use super::{CliResult, EXIT_OTHER, Failure};

/// When this process runs as root (effective user id 0) and the root folder (while it does
/// not exist yet, the nearest folder above it that does) belongs to another user, takes that
/// folder's owner as its real, effective and saved user and the folder's group as its
/// group and only supplementary group, as `setpriv --reuid --regid --clear-groups` would.
/// Called at the start of a command, before any file is opened or thread started (a
/// thread's user is its own: one started before would keep root's). Does nothing when the
/// folder belongs to root or none of the path exists.
///
/// What it makes there gets the group permissions the folder has: the umask loses the
/// group bits the folder grants. Root's usual umask 022 made the catalog, the search index
/// and the sessions it created in a group root (`2775`) unwritable to the group, whose
/// appends then failed and whose lists warned, depending only on who ran a command first
/// (outside testing F5).
///
/// # Errors
/// The system's refusal to change the user or groups (exit 1): the command does not go on
/// as root.
pub fn act_as_root_owner(root: &Path) -> CliResult<()> {
    if !geteuid().is_root() {
        return Ok(());
    }
    let Some((folder, uid, gid, mode)) = owner_of_nearest(root) else {
        return Ok(());
    };
    if uid == 0 {
        return Ok(());
    }
    let umask = rustix::process::umask(Mode::empty());
    rustix::process::umask(umask - (Mode::from_raw_mode(mode) & Mode::RWXG));
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    rustix::thread::set_thread_groups(&[gid])
        .and_then(|()| rustix::thread::set_thread_res_gid(gid, gid, gid))
        .and_then(|()| rustix::thread::set_thread_res_uid(uid, uid, uid))
        .map_err(|e| {
            Failure::with_code(
                EXIT_OTHER,
                format!(
                    "run as root in {}, which user {} owns: could not act as that user: {e}",
                    folder.display(),
                    uid.as_raw()
                ),
            )
        })
}

/// The nearest of `root` and the folders above it that exists, with its owner, group and
/// mode.
fn owner_of_nearest(root: &Path) -> Option<(&Path, u32, u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    root.ancestors()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .find_map(|p| {
            std::fs::metadata(p)
                .ok()
                .map(|m| (p, m.uid(), m.gid(), m.mode()))
        })
}
