//! Retention that never surprises: [`Root::gc`] deletes the sessions not updated (no
//! commit of their own) for a given time and without a writer, each through [`Root::delete`] (forks get their
//! inherited history materialised first; crash-safe), and reports every session it
//! deletes, would delete (a dry run) or keeps, with why. Nothing is deleted unless the
//! caller asks for it.

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::model::SessionId;
use crate::model::ids::{now_ms, unix_ms};
use crate::persistence::Root;
use crate::store::lock;
use crate::store::reader::SessionReader;
use crate::store::schema::{self, LOCK_FILE, SESSION_FILE, WAL_FILE, write_denied};

/// How long a deletion waits for a session's locks before it is kept as busy.
const LOCK_WAIT: Duration = Duration::from_millis(200);

/// What [`Root::gc`] deletes. Built with [`GcOptions::older_than`] and the `with_*`
/// methods.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcOptions {
    /// Only sessions whose last commit of their own (their creation, before any) is at
    /// least this old ([`CatalogEntry::updated_at_ms`](crate::CatalogEntry::updated_at_ms))
    /// and that came into this root at least this long ago (an import or a restore keeps
    /// its commits' times: the birth time of its file counts too, where the file system
    /// keeps one).
    pub older_than: Duration,
    /// Report what would be deleted; delete nothing.
    pub dry_run: bool,
    /// Keep sessions that forks inherit from (otherwise their forks get the inherited
    /// history copied in first, as [`Root::delete`] does). Decided for every session as
    /// the run starts, as a dry run reports it: a session whose forks this same run
    /// deletes is kept all the same (a later run, finding it without forks, deletes it).
    pub keep_forked: bool,
}

impl GcOptions {
    /// Sessions not updated for `older_than`, deleted for real, forked ones included.
    pub fn older_than(older_than: Duration) -> Self {
        GcOptions {
            older_than,
            dry_run: false,
            keep_forked: false,
        }
    }

    /// Report only, delete nothing.
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Keep sessions that forks inherit from.
    pub fn with_keep_forked(mut self, keep_forked: bool) -> Self {
        self.keep_forked = keep_forked;
        self
    }
}

/// A session [`Root::gc`] deleted (or, in a dry run, would delete).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct GcDeleted {
    /// The session.
    pub session_id: SessionId,
    /// When it was last updated (ms since the Unix epoch): its last commit of its own, or
    /// its creation before any; for a file that cannot be read, the last change of its
    /// files.
    pub updated_at_ms: i64,
    /// Its forks, which get the history they inherit from it copied in first (not those
    /// this run deleted before it).
    pub forks: Vec<SessionId>,
}

/// A session old enough that [`Root::gc`] kept, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct GcKept {
    /// The session.
    pub session_id: SessionId,
    /// Why: a live writer (named), forks with `keep_forked`, updated meanwhile, or the
    /// error met.
    pub reason: String,
}

/// What [`Root::gc`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct GcReport {
    /// Whether this was a dry run (nothing deleted).
    pub dry_run: bool,
    /// Sessions deleted (or that would be), in id order.
    pub deleted: Vec<GcDeleted>,
    /// Old sessions kept, with why; also a session updated at a time still to come (a
    /// writer's clock was ahead), which no run collects until that time is past.
    pub kept: Vec<GcKept>,
    /// Old sessions whose deletion failed, with the error (they stay intact).
    pub failed: Vec<GcKept>,
}

/// How far past this run's clock a session's last update must be to be reported as kept
/// for being in the future: a commit made by another process while the run starts is not.
const FUTURE_MARGIN_MS: i64 = 60_000;

/// When the session in `dir` was last updated, for a session whose file cannot be read
/// (no commit time to read): the last change of its files (ms since the Unix epoch; 0
/// when unknown). An empty WAL holds no change: SQLite creates one for any reader of a
/// file that had none.
fn modified_ms(dir: &Path) -> i64 {
    [SESSION_FILE, WAL_FILE]
        .iter()
        .filter_map(|f| Some((*f, std::fs::symlink_metadata(dir.join(f)).ok()?)))
        .filter(|(f, m)| *f == SESSION_FILE || m.len() > 0)
        .filter_map(|(_, m)| unix_ms(m.modified().ok()?))
        .max()
        .unwrap_or(0)
}

/// When the session in `dir` came into this root: the birth time of its file (ms since the
/// Unix epoch; `None` where the file system does not keep one). An import or a restore
/// keeps its commits' times, so by those alone an old export imported a moment ago was
/// old, and `gc` deleted it at once; its file is as new as the import. A session's own
/// file is born before its first commit, a fork's at the fork (its creation time), and a
/// delete copying an ancestor's range into it writes the file in place: none of them is
/// made younger by it.
fn arrived_ms(dir: &Path) -> Option<i64> {
    unix_ms(
        std::fs::symlink_metadata(dir.join(SESSION_FILE))
            .ok()?
            .created()
            .ok()?,
    )
}

/// Why an old session is kept (`Err(why)`), else its forks (`Ok`). Made before any lock
/// is taken (`writer`: also whether a writer holds it), and again under its locks before
/// a real deletion (where no writer can).
fn reason_to_keep(
    root: &Root,
    id: &SessionId,
    dir: &Path,
    cutoff_ms: i64,
    keep_forked: bool,
    writer: bool,
) -> Result<std::result::Result<Vec<SessionId>, String>> {
    let reader = SessionReader::open(dir)?;
    // Its last commit: a fork of it, or this run deleting a session it shares history
    // with (which changes its file, not its commits), does not make it newer.
    if reader.updated_at_ms(reader.durable_sequence()?)? > cutoff_ms {
        return Ok(Err(
            "updated meanwhile (a writer committed to it since the run began)".to_owned(),
        ));
    }
    // Commit times are the writers' clocks: one that went back stamps a commit earlier
    // than the one before it, and by its last commit alone the session looked as old as
    // that clock said (outside testing, clocks: deleted a second after an append).
    let newest = reader.newest_commit_ms()?;
    if newest > now_ms().saturating_add(FUTURE_MARGIN_MS) {
        return Ok(Err(
            "a commit of it is stamped at a time still to come (a writer's clock was ahead): \
             kept until that time is past"
                .to_owned(),
        ));
    }
    if newest > cutoff_ms {
        return Ok(Err(
            "an earlier commit of it is newer than the age given (a writer's clock went back \
             between its commits)"
                .to_owned(),
        ));
    }
    if arrived_ms(dir).is_some_and(|ms| ms > cutoff_ms) {
        return Ok(Err(
            "made again meanwhile (imported or restored under its id since the run began)"
                .to_owned(),
        ));
    }
    if writer && let Some(owner) = root.writer_owner(id)? {
        // A delete (another `gc`'s, or `delete`'s) holds the same lock: named as such, as
        // `append` names it (outside testing W5: "a live writer holds it" of a stopped gc).
        return Ok(Err(match owner.holding_for.as_deref() {
            Some(what) => format!(
                "a {what} in progress holds it (pid {} on host {})",
                owner.pid, owner.host
            ),
            None => format!(
                "a live writer holds it (pid {} on host {})",
                owner.pid, owner.host
            ),
        }));
    }
    // A fork killed between recording itself here and its publication left a row naming
    // no session: it keeps nothing (one that cannot be read is counted, to keep on the
    // safe side).
    let forks: Vec<SessionId> = reader
        .dependents()?
        .into_iter()
        .map(|d| d.child_id)
        .filter(|child| root.inherits_from(child, id).unwrap_or(true))
        .collect();
    if keep_forked && !forks.is_empty() {
        return Ok(Err(format!("{} fork(s) inherit from it", forks.len())));
    }
    // The delete copies what a fork of an older schema version inherits into it under that
    // fork's writer lock (it upgrades the fork's file), and is refused while a writer, an
    // older build's, holds it: the dry run said it would delete the session, and the run
    // then failed (outside testing M6, mixed versions).
    // The lock first: an open of each fork's file (to read its version) cost a wide fan-out
    // one SQLite open per fork, for a writer that is rarely there.
    for fork in &forks {
        let dir = root.session_dir(fork);
        if lock::is_held(&dir.join(LOCK_FILE)).unwrap_or(true)
            && schema::is_older_version(&dir.join(SESSION_FILE)).unwrap_or(false)
            && let Some(owner) = root.writer_owner(fork)?
        {
            return Ok(Err(format!(
                "its fork {fork}, whose file is of an older schema version, is held by a                  writer (pid {} on host {}): the delete would copy what the fork inherits into                  it, upgrading it, under its writer lock",
                owner.pid, owner.host
            )));
        }
    }
    Ok(Ok(forks))
}

impl Root {
    /// Deletes the sessions not updated (no commit of their own, see
    /// [`CatalogEntry::updated_at_ms`](crate::CatalogEntry::updated_at_ms)) nor imported
    /// or restored into the root for `options.older_than` and that no writer holds, each as [`Root::delete`] does (forks first get the history
    /// they inherit copied in; a crash at any point leaves every session readable). Every
    /// check (age, writer, forks with `keep_forked`) is made again under the session's
    /// writer and dependents locks, so a session that a writer or a fork takes meanwhile
    /// is kept, never deleted under it. A dry run only reports.
    ///
    /// # Errors
    /// [`Error::Io`] when the root cannot be read, or (not in a dry run, when a session is
    /// to be deleted) when the root folder cannot be written, naming it and the system's
    /// reason (a read-only file system, no permission), before anything is deleted: every
    /// deletion would fail alike. A session's own failure is reported in
    /// [`GcReport::failed`] and the others go on; what is named like a session and is none
    /// of the root's (a symlink, a folder whose name is not UTF-8 or not a valid session
    /// id, see [`Root::list_ids`]) is in [`GcReport::kept`], saying so.
    pub fn gc(&self, options: &GcOptions) -> Result<GcReport> {
        self.gc_with_progress(options, |_| ControlFlow::Continue(()))
    }

    /// [`Root::gc`], calling `deleted` with each session as soon as it is deleted (in a
    /// dry run: as soon as it is found to be one that would be), so that a caller can
    /// record it at once: a run stopped midway (killed) has deleted exactly what was
    /// reported by then. `ControlFlow::Break` from `deleted` (the record could not be
    /// written) stops the run before the next deletion; what was done is in the report.
    ///
    /// # Errors
    /// As [`Root::gc`].
    pub fn gc_with_progress(
        &self,
        options: &GcOptions,
        mut deleted: impl FnMut(&GcDeleted) -> ControlFlow<()>,
    ) -> Result<GcReport> {
        let older_ms = i64::try_from(options.older_than.as_millis()).unwrap_or(i64::MAX);
        let now = now_ms();
        let cutoff_ms = now.saturating_sub(older_ms);
        let mut report = GcReport {
            dry_run: options.dry_run,
            ..GcReport::default()
        };
        // The ages as the run starts, from the catalog (an entry is read again only when its
        // session's files changed; without a catalog, a read-only root, from the files). A
        // session that cannot be read has no commit time: its files' is taken, and the
        // checks below report it.
        let scan = self.scan()?;
        let cataloged = self.catalog().open_knowing(self, &scan).is_ok();
        let updated = |id: &SessionId| -> Result<i64> {
            if cataloged {
                return Ok(self.catalog_entry(id)?.updated_at_ms);
            }
            let reader = self.open_reader(id)?;
            reader.updated_at_ms(reader.durable_sequence()?)
        };
        // A session file that every command refuses (a symlink, a folder, a FIFO) is kept
        // whatever its age, saying why, as what is no session of the root is: gc failed on
        // a symlink with SQLite's "unable to open database file" (exit 1 every run) and
        // passed over the others in silence.
        let mut refused = Vec::new();
        let mut future = Vec::new(); // updated after this run's clock
        // The process's own want (of descriptors, memory) is no session's fault: taken
        // for unreadable, a session got its files' time as its age, which says nothing of
        // its commits (outside testing, resource limits: gc out of descriptors).
        let mut exhausted = None;
        let old: Vec<(SessionId, i64)> = scan
            .ids(self)
            .into_iter()
            .filter_map(|id| {
                let dir = self.session_dir(&id);
                if let Err(e @ Error::InvalidInput { .. }) = schema::check_session_dir(&dir) {
                    refused.push(GcKept {
                        session_id: id,
                        reason: e.to_string(),
                    });
                    return None;
                }
                let (updated_at_ms, age_ms) = match updated(&id) {
                    // A session imported or restored within the age is young, whatever
                    // its commits' times ([`arrived_ms`]).
                    Ok(ms) => (ms, ms.max(arrived_ms(&dir).unwrap_or(i64::MIN))),
                    Err(Error::SessionNotFound(_)) => return None,
                    Err(e) if e.is_exhaustion() => {
                        exhausted.get_or_insert(e);
                        return None;
                    }
                    // Its files' last change: never before they came into the root.
                    Err(_) => {
                        let ms = modified_ms(&dir);
                        (ms, ms)
                    }
                };
                // No run would ever collect it, and it was passed over in silence.
                if updated_at_ms > now.saturating_add(FUTURE_MARGIN_MS) {
                    future.push(GcKept {
                        session_id: id.clone(),
                        reason: "updated at a time still to come (a writer's clock was ahead): \
                                 kept until that time is past"
                            .to_owned(),
                    });
                }
                (age_ms <= cutoff_ms).then_some((id, updated_at_ms))
            })
            .collect();
        if let Some(e) = exhausted {
            return Err(e);
        }
        // Every session's reason to be kept is found before anything is deleted, so that
        // a run decides as its dry run reports: deleting a fork first no longer frees its
        // parent from `keep_forked` in the same run.
        let mut doomed = Vec::new();
        for (id, updated_at_ms) in old {
            let keep = |why: String| GcKept {
                session_id: id.clone(),
                reason: why,
            };
            let dir = self.session_dir(&id);
            match reason_to_keep(self, &id, &dir, cutoff_ms, options.keep_forked, true) {
                Ok(Ok(forks)) => doomed.push(GcDeleted {
                    session_id: id,
                    updated_at_ms,
                    forks,
                }),
                Ok(Err(why)) => report.kept.push(keep(why)),
                Err(Error::SessionNotFound(_)) => {}
                Err(e) => report.failed.push(keep(e.to_string())),
            }
        }
        let mut root_writable = false;
        for mut doomed in doomed {
            let id = doomed.session_id.clone();
            let keep = |why: String| GcKept {
                session_id: id.clone(),
                reason: why,
            };
            // A fork deleted before it in this run gets nothing copied in.
            doomed.forks.retain(|fork| {
                !report
                    .deleted
                    .iter()
                    .any(|gone: &GcDeleted| gone.session_id == *fork)
            });
            // A dry run deletes nothing and reports each session as a run would.
            let outcome = if options.dry_run {
                Ok(None)
            } else {
                if !root_writable {
                    // A deletion moves the session's folder out of the root: in a root that
                    // cannot be written each one failed, one "Permission denied" per session.
                    if let Some(e) = write_denied(self.path()) {
                        return Err(Error::io(format!("write {}", self.path().display()), e));
                    }
                    root_writable = true;
                }
                // An error of the check is a failure, not a reason to keep: out of file
                // descriptors, a run kept every session "for" that error and exited 0
                // (outside testing, resource limits).
                let recheck = |dir: &Path| -> Result<Option<String>> {
                    reason_to_keep(self, &id, dir, cutoff_ms, options.keep_forked, false)
                        .map(|kept| kept.err())
                };
                self.delete_unless(&id, &CancelToken::after(LOCK_WAIT), recheck)
            };
            match outcome {
                Ok(None) => {
                    let go_on = deleted(&doomed);
                    report.deleted.push(doomed);
                    if go_on.is_break() {
                        break;
                    }
                }
                Ok(Some(why)) => report.kept.push(keep(why)),
                Err(Error::Cancelled) => report
                    .kept
                    .push(keep("busy: a writer, fork or delete held it".to_owned())),
                Err(Error::SessionNotFound(_)) => {}
                Err(e) => report.failed.push(keep(e.to_string())),
            }
        }
        // No sessions of the root (symlinks, names no command can give): kept, and said so,
        // never as failures.
        report.kept.extend(refused);
        report.kept.extend(future);
        report.kept.extend(scan.skipped.into_iter().map(|s| GcKept {
            session_id: s.session_id,
            reason: s.error.to_string(),
        }));
        Ok(report)
    }
}
