//! Delete that never breaks a fork: dependents get their inherited ranges materialised
//! first, one transaction each, then the session disappears with one rename.

use std::path::Path;

use crate::cancel::CancelToken;
use crate::error::{Error, Result, WriterOwner};
use crate::model::SessionId;
use crate::model::ids::random_hex;
use crate::persistence::{Root, TRASH_DIR, confine, gone_or, session_file_gone, sync_dir};
use crate::store::lineage;
use crate::store::lock::{DEPENDENTS_LOCK_FILE, DependentsLock, WriterLock};
use crate::store::read::{self, DependentFork};
use crate::store::schema::{self, LOCK_FILE, SESSION_FILE};

impl Root {
    /// Deletes a session. Waits (until `cancel`) for its writer lock, so an owned session is
    /// never deleted under its writer. Sessions that inherit from it first get their
    /// inherited range (events, turns and the blobs they reference) copied into their own
    /// file, one transaction each with their lineage rewritten; then the folder is renamed
    /// into `.trash/` and removed. A crash at any point leaves every session readable.
    /// A session whose file is damaged or not a session file at all is deleted as well,
    /// unless a session under the root inherits from it.
    ///
    /// # Errors
    /// [`Error::Cancelled`] when the wait is cancelled (nothing is deleted; it names no
    /// holder: [`Root::writer_owner`] says who holds the session, as the CLI's `delete
    /// --wait` and the Python package's `Root.delete(wait=)` say in their errors);
    /// [`Error::WriterOwned`] naming a fork of an older schema version that a writer (an
    /// older build's) holds: copying the inherited range in would upgrade its file under
    /// that writer, so the session is kept (forks copied into before it keep their copy);
    /// [`Error::SessionNotFound`]; [`Error::Corrupt`] for a damaged file that other
    /// sessions inherit from (naming them) and [`Error::UnsupportedVersion`] for a file of
    /// a newer version (both kept); I/O and SQLite errors before the session is renamed
    /// away (then it stays intact; clean-up after the rename never fails the call).
    pub fn delete(&self, id: &SessionId, cancel: &CancelToken) -> Result<()> {
        self.delete_unless(id, cancel, |_| Ok(None)).map(drop)
    }

    /// As [`Root::delete`], but once the session's writer and dependents locks are held
    /// (no writer can append, no fork can start), `keep` looks at its folder and may keep
    /// it: `Ok(Some(why))`, nothing changed. `Ok(None)`: deleted. An error of `keep` is the
    /// call's, nothing changed.
    pub(crate) fn delete_unless(
        &self,
        id: &SessionId,
        cancel: &CancelToken,
        keep: impl FnOnce(&Path) -> Result<Option<String>>,
    ) -> Result<Option<String>> {
        let dir = self.existing_dir(id)?;
        // A concurrent delete of the same session may rename it away while this one waits:
        // its lock files are gone then, and so is the session.
        let gone = |e| gone_or(id, &dir, e);
        let mut lock = WriterLock::acquire(&dir.join(LOCK_FILE), cancel).map_err(gone)?;
        // A writer, fork or delete refused meanwhile names this process as a delete, not
        // the session's last writer, at once: a record that says so is final (a
        // provisional one was waited for 2 s, then shown as "generation 0"; outside
        // testing T2, session 41). Best effort: the record is only what a refusal says.
        let _ = lock.record_owner(&WriterOwner {
            holding_for: Some("delete".to_owned()),
            ..self.provisional_owner()
        });
        let forks =
            DependentsLock::exclusive(&dir.join(DEPENDENTS_LOCK_FILE), cancel).map_err(gone)?;
        let file = dir.join(SESSION_FILE);
        // A concurrent delete of the same session may have renamed it away meanwhile.
        if !file.is_file() {
            return Err(Error::SessionNotFound(id.to_string()));
        }
        if let Some(why) = keep(&dir)? {
            return Ok(Some(why));
        }
        // The exclusive dependents lock keeps new forks out until the rename.
        let (ancestors, dependents) = match lineage_and_dependents(&file) {
            Ok(both) => both,
            // A file that is not a readable session says nothing of its forks: it goes
            // only when no session under the root inherits from it.
            Err(damage) if damage.is_corrupt() => {
                self.refuse_if_inherited(id, damage)?;
                (Vec::new(), Vec::new())
            }
            Err(e) => return Err(e),
        };
        // A row naming the session itself (damage: it cannot inherit from its own file)
        // is no fork to keep; it kept the session from being deleted for good (outside
        // testing H3).
        let dependents: Vec<DependentFork> = dependents
            .into_iter()
            .filter(|d| d.child_id != *id)
            .collect();
        for d in &dependents {
            self.materialize(id, &d.child_id)?;
        }
        // A `.trash` that is a symlink is refused, never followed.
        let trash = confine::ensure_dir_at(self.dir_fd(), TRASH_DIR, &self.path().join(TRASH_DIR))?;
        // The id is not part of the name: the longest valid id must still fit.
        let tomb = random_hex();
        self.move_out(id, &trash, TRASH_DIR, &tomb)?;
        // Derived index; listing also drops entries whose folder is gone.
        let _ = self.catalog().forget(self, id);
        let children: Vec<SessionId> = dependents.into_iter().map(|d| d.child_id).collect();
        self.unindex_deleted(id, &children);
        drop((lock, forks));
        // The session is gone from here on: the rest is clean-up, best effort (a leftover
        // tombstone is removed when the root is next opened; a stale dependents row is
        // skipped by a later delete).
        let _ = sync_dir(self.path());
        if let Ok(tomb) = std::ffi::CString::new(tomb) {
            let _ = confine::remove_tree_at(&trash, &tomb);
        }
        for ancestor in ancestors {
            let ancestor = self.session_dir(&ancestor).join(SESSION_FILE);
            let _ = lineage::forget_dependent(&ancestor, id.as_str());
        }
        Ok(None)
    }

    /// Refuses the delete of `id`, whose file cannot be read (`damage`), when a session
    /// under the root names it in its lineage: what that session inherits would be lost.
    /// Sessions whose own files cannot be read are not asked.
    fn refuse_if_inherited(&self, id: &SessionId, damage: Error) -> Result<()> {
        let inheritors: Vec<String> = self
            .list_ids()?
            .into_iter()
            .filter(|other| other != id)
            .filter(|other| self.inherits_from(other, id).is_ok_and(|named| named))
            .map(|other| other.to_string())
            .collect();
        if inheritors.is_empty() {
            return Ok(());
        }
        let inherit = if inheritors.len() == 1 {
            "inherits"
        } else {
            "inherit"
        };
        Err(Error::corrupt_from(
            format!(
                "session {id} cannot be read and {} {inherit} from it: it is kept, since \
                 deleting it would lose what they inherit",
                inheritors.join(", ")
            ),
            damage,
        ))
    }

    /// Whether session `other` names `ancestor` in its own lineage rows (read without
    /// opening the ancestors): it reads part of its log from `ancestor`'s file. A session
    /// not in the root names nothing.
    ///
    /// # Errors
    /// `other`'s file cannot be read.
    pub(crate) fn inherits_from(&self, other: &SessionId, ancestor: &SessionId) -> Result<bool> {
        let dir = self.session_dir(other);
        if session_file_gone(&dir) {
            return Ok(false);
        }
        let conn = schema::open_reader(&dir.join(SESSION_FILE))?;
        Ok(read::read_lineage(&conn)?
            .iter()
            .any(|e| &e.ancestor_id == ancestor))
    }

    /// Copies every range `child` inherits from `ancestor` into `child`'s own file and drops
    /// those lineage rows, in one transaction. A child that no longer exists is skipped,
    /// also one deleted while it is being materialised (its delete renames it away at any
    /// moment: whatever fails then, e.g. "unable to open database file", is its absence).
    fn materialize(&self, ancestor: &SessionId, child: &SessionId) -> Result<()> {
        let child_file = self.session_dir(child).join(SESSION_FILE);
        if !child_file.is_file() {
            return Ok(());
        }
        let source = self.session_dir(ancestor).join(SESSION_FILE);
        // Materialising upgrades a child of an older version, which only its writer lock's
        // holder may do: the child's writer may be an older build's, which the upgrade
        // broke (its next commit failed) or let write rows without the new version's
        // checks. A child that a writer holds stays as it is, and so does this session.
        let upgrade_lock = match schema::is_older_version(&child_file).and_then(|older| {
            older
                .then(|| self.take_writer_lock(child, &self.session_dir(child)))
                .transpose()
        }) {
            Ok(lock) => lock,
            Err(_) if !child_file.is_file() => return Ok(()),
            Err(e) => return Err(e),
        };
        let materialized = lineage::materialize(
            &source,
            ancestor.as_str(),
            &child_file,
            self.options().inline_threshold,
        );
        drop(upgrade_lock);
        match materialized {
            Err(_) if !child_file.is_file() => Ok(()),
            // Its range cannot be copied whole: the ancestor is kept, named with the child.
            Err(e @ Error::Corrupt { .. }) => {
                Err(e.corrupt_in(|| format!("{ancestor} is kept, as {child} inherits from it")))
            }
            other => other,
        }
    }
}

/// The lineage and the dependents of the session file at `file` (the caller holds its
/// writer lock), read as the file is: an older file is not upgraded first, so one this
/// process may not write (mode 0444 in a folder it may write) is deleted too (its writer
/// open refused it, "open FILE for writing: Permission denied").
fn lineage_and_dependents(file: &Path) -> Result<(Vec<SessionId>, Vec<DependentFork>)> {
    let conn = schema::open_reader(file)?;
    let lineage = read::read_lineage(&conn)?;
    // The parent records its fork also when the fork reads nothing from it (through
    // sequence 0): its row goes with the fork.
    let parent = read::read_header(&conn)?.parent_id;
    let dependents = read::read_dependents(&conn)?;
    conn.close().map_err(|(_, e)| Error::from(e))?;
    let mut ancestors: Vec<SessionId> = lineage.into_iter().map(|e| e.ancestor_id).collect();
    if let Some(parent) = parent.filter(|p| !ancestors.contains(p)) {
        ancestors.push(parent);
    }
    Ok((ancestors, dependents))
}
