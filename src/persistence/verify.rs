//! Validation of a whole log: the checks shared by `replay_file`, export and import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::model::header::Header;
use crate::model::projection::{FoldEffects, HistoryChange, apply_history};
use crate::model::{Commit, Message, Projection, TurnBoundary};
use crate::store::read::{HistoryRow, check_integrity};
use crate::store::reader::SessionReader;
use crate::store::schema::{self, Access, SESSION_FILE};

/// The result of [`replay_file`]: every commit, validated, and their projection.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReplayReport {
    /// The header row.
    pub header: Header,
    /// Every durable commit in order.
    pub commits: Vec<Commit>,
    /// The turns the fold ended, in order.
    pub turns: Vec<TurnBoundary>,
    /// The UI transcript the log ends with.
    pub transcript: Vec<Arc<Message>>,
    /// The fold of all commits.
    pub projection: Projection,
    /// What is damaged but ignored by every reader, so the log is still sound (a
    /// projection checkpoint that does not check out): one sentence each.
    pub notes: Vec<String>,
}

/// Folds commits one by one, in order, checking kinds and payloads; the reader that
/// streams them checks sequences, hashes, row digests and blobs.
#[derive(Default)]
pub(crate) struct LogValidator {
    projection: Projection,
    next_seq: u64,
}

impl LogValidator {
    pub(crate) fn new() -> Self {
        LogValidator {
            projection: Projection::default(),
            next_seq: 1,
        }
    }

    /// Folds the next commit (the reader already checked its sequence and hash); returns
    /// the turns it closes and its transcript changes.
    pub(crate) fn check(&mut self, c: &Commit) -> Result<FoldEffects> {
        let mut effects = FoldEffects::default();
        self.projection
            .apply_commit_tracked(c, &mut effects)
            .map_err(|e| Error::corrupt_from(format!("commit at {}", c.first_seq), e))?;
        self.next_seq = c.last_seq() + 1;
        Ok(effects)
    }

    /// The last validated sequence.
    pub(crate) fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    pub(crate) fn into_projection(self) -> Projection {
        self.projection
    }
}

/// The history index a log implies: rows keyed by `(event_seq, position)` (a later change
/// of the same key replaces an earlier one, as the index's upsert does) and resets.
#[derive(Default)]
struct HistoryIndex {
    rows: BTreeMap<(u64, u64), HistoryRow>,
    resets: BTreeSet<u64>,
}

impl HistoryIndex {
    fn add(&mut self, changes: &[HistoryChange]) {
        for change in changes {
            match change {
                HistoryChange::Reset { seq } => {
                    self.resets.insert(*seq);
                }
                put => {
                    if let Some(row) = HistoryRow::of(put) {
                        self.rows.insert((row.event_seq, row.position), row);
                    }
                }
            }
        }
    }

    /// Refuses a stored index that differs from the log's: a row or reset missing, extra
    /// or altered.
    fn compare(self, (rows, resets): (Vec<HistoryRow>, Vec<u64>)) -> Result<()> {
        let mismatch = |what: String| Err(Error::corrupt(format!("history index: {what}")));
        let mut expected = self.rows.into_values();
        let mut stored = rows.into_iter();
        loop {
            match (expected.next(), stored.next()) {
                (None, None) => break,
                (Some(want), Some(got)) if want == got => {}
                (Some(want), got) => {
                    let found = got.map_or_else(|| "nothing".to_owned(), |g| described(&g));
                    return mismatch(format!("expected {}, found {found}", described(&want)));
                }
                (None, Some(got)) => {
                    return mismatch(format!(
                        "position {} at event {} is not in the log",
                        got.position, got.event_seq
                    ));
                }
            }
        }
        let resets: BTreeSet<u64> = resets.into_iter().collect();
        if let Some(seq) = self.resets.symmetric_difference(&resets).next() {
            return mismatch(format!(
                "the transcript reset at event {seq} is {}",
                if resets.contains(seq) {
                    "not in the log"
                } else {
                    "missing"
                }
            ));
        }
        Ok(())
    }
}

/// Refuses a stored turn index that differs from the turns the log ends: a turn missing,
/// extra or altered (a fork or rewind cuts where the index says).
/// A history row as `verify` names it: `message "m1" (role "tool", 148 bytes) at position
/// 4 from event 13`, or `(no role, …)`. It said `role Some("tool")` (Rust's debug form;
/// outside testing Z4), and of the expected row only its id and place, so a row that
/// differed in its role or size read as the same message twice.
fn described(row: &HistoryRow) -> String {
    let role = row.role.as_deref().map_or_else(
        || "no role".to_owned(),
        |r| format!("role {}", crate::quoted(r)),
    );
    format!(
        "message {} ({role}, {} bytes) at position {} from event {}",
        crate::quoted(&row.message_id),
        row.bytes,
        row.position,
        row.event_seq
    )
}

fn compare_turns(folded: &[TurnBoundary], stored: &[TurnBoundary]) -> Result<()> {
    let differs = |what: String| Err(Error::corrupt(format!("turn index: {what}")));
    for (i, want) in folded.iter().enumerate() {
        match stored.get(i) {
            Some(got) if got == want => {}
            Some(got) => {
                return differs(format!(
                    "turn {} (sequences {}..={}) is stored as turn {} (sequences {}..={}, \
                     boundary {}, status {}, fork_safe {}, rewind_safe {})",
                    crate::error::quoted(&want.turn_id),
                    want.start_sequence,
                    want.end_sequence,
                    crate::error::quoted(&got.turn_id),
                    got.start_sequence,
                    got.end_sequence,
                    got.boundary_sequence,
                    crate::error::quoted(&got.status),
                    got.fork_safe,
                    got.rewind_safe
                ));
            }
            None => {
                return differs(format!(
                    "turn {} ending at {} is missing",
                    crate::error::quoted(&want.turn_id),
                    want.end_sequence
                ));
            }
        }
    }
    if let Some(extra) = stored.get(folded.len()) {
        return differs(format!(
            "turn {} ending at {} is not in the log",
            crate::error::quoted(&extra.turn_id),
            extra.end_sequence
        ));
    }
    Ok(())
}

/// Whether two projections hold the same state (compared as their JSON, what a checkpoint
/// stores).
fn same_projection(a: &Projection, b: &Projection) -> Result<bool> {
    let encoding = |e| Error::internal_from("projection as JSON", e);
    // As JSON text first, `b`'s compared with `a`'s as it is written: two JSON trees of a
    // 200,000-message workset took about 300 MB (outside testing H7, session 41). Equal
    // text is equal JSON; text that differs is compared as JSON trees, which do not tell
    // apart what text may (`1.0` and `1.00`, the order of an object's keys).
    let first = serde_json::to_vec(a).map_err(encoding)?;
    let mut second = SameBytes {
        expected: &first,
        at: 0,
        same: true,
    };
    serde_json::to_writer(&mut second, b).map_err(encoding)?;
    if second.same && second.at == first.len() {
        return Ok(true);
    }
    drop(first);
    let json = |p: &Projection| serde_json::to_value(p).map_err(encoding);
    Ok(json(a)? == json(b)?)
}

/// A writer that compares what is written with `expected`, from its start, keeping
/// nothing.
struct SameBytes<'a> {
    expected: &'a [u8],
    at: usize,
    same: bool,
}

impl std::io::Write for SameBytes<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.same {
            let end = self.at + buf.len();
            self.same = self.expected.get(self.at..end) == Some(buf);
            self.at = end;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A session file given by path, resolved.
pub(crate) struct Target {
    /// The session file (no symlink in its path).
    pub(crate) file: PathBuf,
    /// The root its ancestors live in.
    pub(crate) root: PathBuf,
    /// How to open it.
    pub(crate) access: Access,
}

/// Resolves a session folder or a session file given by path. The path is the user's:
/// its symlinks are followed (resolved once here). A folder is a session folder of a root
/// (its file is opened shared, its ancestors are its siblings); a file is opened
/// immutable unless a `-wal` or `-journal` is beside it (see [`Access`]), so nothing is
/// created beside a user's file, but SQLite's `-shm` index of a `-wal` that is there
/// without one (reading the WAL needs it; the file and the WAL are left as they are).
///
/// # Errors
/// [`Error::Io`] of kind `NotFound` for a path with nothing there ("PATH: No such file or
/// directory": a path, not a session; [`Error::is_not_found`]) and for a folder without a
/// session file ("DIR is a folder without a session file (session.sqlite): …");
/// [`Error::InvalidInput`]
/// for anything but a folder or a regular file (a FIFO is refused before it is opened, so
/// nothing blocks), or a session file with a symlink beside it.
pub(crate) fn resolve_target(path: &Path) -> Result<Target> {
    let resolved = std::fs::canonicalize(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::io(path.display().to_string(), e)
        } else {
            Error::io(format!("resolve {}", path.display()), e)
        }
    })?;
    let meta = std::fs::metadata(&resolved)
        .map_err(|e| Error::io(format!("stat {}", resolved.display()), e))?;
    if meta.is_dir() {
        let file = resolved.join(SESSION_FILE);
        // Named as the folder given (it said "session DIR/session.sqlite not found").
        if let Err(e) = std::fs::symlink_metadata(&file)
            && schema::is_missing(&e)
        {
            return Err(Error::io(
                format!(
                    "{} is a folder without a session file ({SESSION_FILE})",
                    path.display()
                ),
                e,
            ));
        }
        schema::check_file(&file)?;
        let root = resolved.parent().unwrap_or(&resolved).to_path_buf();
        let access = Access::for_root_file(&file);
        return Ok(Target { file, root, access });
    }
    if !meta.is_file() {
        return Err(schema::not_regular(path, &meta));
    }
    schema::check_file(&resolved)?;
    let root = resolved
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    Ok(Target {
        access: Access::for_user_file(&resolved),
        file: resolved,
        root,
    })
}

/// What [`verify_file`] found in a sound log: the counts and the projection, not the commits.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Verified {
    /// The header row.
    pub header: Header,
    /// Durable commits.
    pub commits: u64,
    /// The last sequence (0 for an empty log).
    pub events: u64,
    /// The fold of all commits.
    pub projection: Projection,
    /// What is damaged but ignored by every reader, so the log is still sound (a
    /// projection checkpoint that does not check out): one sentence each.
    pub notes: Vec<String>,
}

/// Checks a session file (or folder) as [`replay_file`] does and hands each validated commit
/// to `f`, one page in memory at a time; returns what it found and the turns the log
/// ends (checked against the turn index).
fn validate_each(
    path: &Path,
    f: impl FnMut(Commit, FoldEffects),
) -> Result<(Verified, Vec<TurnBoundary>)> {
    let target = resolve_target(path)?;
    validate_target(&target, f).map_err(|e| naming_file(e, &target.file))
}

/// `error`, met reading `file`, naming it when it is [`Error::Corrupt`] and does not yet:
/// `import` or `verify_file` of a file that is no session file said "corrupt session
/// store: SQLite reports: file is not a database" (outside testing, session 39), and a
/// host importing a batch of files could not tell which one.
///
/// A file that vanished while it was read (moved or removed by another process) is named
/// as the file it is, not as a session: `check_file`'s [`Error::SessionNotFound`] called
/// an import's vanished file "session FILE not found" (outside testing C7, session 41).
pub(crate) fn naming_file(error: Error, file: &Path) -> Error {
    let shown = file.display().to_string();
    match &error {
        Error::Corrupt { what, .. } if what.contains(&shown) => error,
        Error::SessionNotFound(path) if *path == shown => Error::io(
            format!("read {shown}"),
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the file is gone (moved or removed while it was read)",
            ),
        ),
        _ => error.corrupt_in(|| shown),
    }
}

/// [`validate_each`] of the file `target` resolved.
fn validate_target(
    target: &Target,
    mut f: impl FnMut(Commit, FoldEffects),
) -> Result<(Verified, Vec<TurnBoundary>)> {
    check_integrity(&target.file, target.access)?;
    let reader = SessionReader::open_file(&target.file, &target.root, target.access)?;
    let mut validator = LogValidator::new();
    let mut commits = 0u64;
    let mut index = HistoryIndex::default();
    let mut turns = Vec::new();
    // Read as of one durable sequence: a writer may be appending (a read of the log to its
    // end, then of the sequence, told a sound session's sequence from a later commit).
    let durable = reader.durable_sequence()?;
    reader.visit(durable, |c| {
        let effects = validator.check(&c)?;
        index.add(&effects.history);
        turns.extend(effects.turns.iter().cloned());
        commits += 1;
        f(c, effects);
        Ok(())
    })?;
    // A fork whose ancestor holds less than its lineage range (an ancestor restored from an
    // older copy, an edited range) reads a shorter log than the sequence it reports.
    if validator.last_seq() != durable {
        return Err(Error::corrupt(format!(
            "the log ends at sequence {} but the session reports {durable} as durable: an \
             ancestor holds less than its lineage range",
            validator.last_seq()
        )));
    }
    reader.check_ancestry()?;
    // The rows `show` reads besides the log: one that does not decode fails `show` as
    // corrupt, so the file is not sound either.
    reader.lease()?;
    let dependents = reader.dependents()?;
    if let Some(stored) = reader.history_index(validator.last_seq())? {
        index.compare(stored)?;
    }
    // Turns that end after `durable` and no later than the log's end once they were read
    // were committed since; one that ends beyond it is not in the log at all. So are forks
    // recorded since (a fork of the log as it is now).
    let stored = reader.turns()?;
    let now = reader.durable_sequence()?;
    if let Some(beyond) = dependents.iter().find(|d| d.through_seq > now) {
        return Err(Error::corrupt(format!(
            "dependents: {} is recorded as inheriting sequences through {}, beyond the end of \
             the log at {now}",
            beyond.child_id, beyond.through_seq
        )));
    }
    let stored: Vec<TurnBoundary> = stored
        .into_iter()
        .filter(|t| t.end_sequence <= durable || t.end_sequence > now)
        .collect();
    compare_turns(&turns, &stored)?;
    // What readers and writers start from: a checkpoint whose projection is not the fold
    // of the log through its sequence (edited with its digest made again: the digest is
    // unkeyed) shows a forged state, which the full fold alone never looked at.
    // Only from a checkpoint: without one, a second fold of the whole log (twice the time,
    // and a second copy of every message the projection holds) had nothing to compare.
    if let Some((from, checkpointed)) = reader.checkpointed_projection(durable)
        && !same_projection(&checkpointed, &validator.projection)?
    {
        return Err(Error::corrupt(format!(
            "the projection checkpoint at sequence {from} does not give the fold of the log \
             (its state differs from a full replay)"
        )));
    }
    // One that does not check out is ignored by every open (derived data), so the log is
    // sound; said, since something changed the file (it was ignored in silence).
    let mut notes: Vec<String> = reader
        .ignored_checkpoint(durable)
        .map(|seq| {
            format!(
                "the projection checkpoint at sequence {seq} does not check out (digest, form \
                 or sequence) and is ignored: opening the session folds the log instead, until \
                 a new checkpoint replaces it"
            )
        })
        .into_iter()
        .collect();
    // A header read as it is (an earlier build may have written it) that `import` refuses:
    // said, as the file was called sound and its import then refused (outside testing H5).
    let header = reader.header();
    if let Err(Error::InvalidInput { what, .. }) = header.check_created_at() {
        notes.push(format!("{what}: import refuses it"));
    }
    if let Err(Error::InvalidInput { what, .. }) =
        Header::check_commit_time(reader.newest_commit_ms()?)
    {
        notes.push(format!("{what}: import refuses it"));
    }
    if let Some(Err(Error::InvalidInput { what, .. })) =
        header.cwd.as_deref().map(Header::check_cwd)
    {
        notes.push(format!(
            "the header's cwd: {what}: import takes the file only with a cwd of its own (--cwd)"
        ));
    }
    let verified = Verified {
        header: reader.header().clone(),
        commits,
        events: validator.last_seq(),
        projection: validator.into_projection(),
        notes,
    };
    Ok((verified, turns))
}

/// Reads and validates every commit of a session file (or a session folder): structure
/// (`integrity_check`), contiguous sequences from 1, operation hashes, blob digests, known
/// kinds, and a full fold. Ancestors of a fork are resolved as siblings of its folder.
///
/// Keeps every commit in memory; [`verify_file`] makes the same checks without them.
///
/// # Errors
/// [`Error::Corrupt`] naming the first problem; [`Error::Io`] of kind `NotFound` naming a
/// missing path ([`Error::is_not_found`]); [`Error::InvalidInput`] for a path that is
/// neither a folder nor a regular file, and for a file with a hot journal beside it (a write that did not finish, which a read cannot
/// roll back; the message says how to).
pub fn replay_file(path: impl AsRef<Path>) -> Result<ReplayReport> {
    let (mut commits, mut transcript) = (Vec::new(), Vec::new());
    let (verified, turns) = validate_each(path.as_ref(), |c, effects| {
        commits.push(c);
        apply_history(&mut transcript, &effects.history);
    })?;
    Ok(ReplayReport {
        header: verified.header,
        commits,
        turns,
        transcript,
        projection: verified.projection,
        notes: verified.notes,
    })
}

impl crate::persistence::Root {
    /// Checks session `id` of this root as [`verify_file`] checks a session folder, after
    /// the checks [`Root::open_reader`](crate::Root::open_reader) makes of the folder: a real
    /// folder of the root (not a symlink) holding the session's own file, not another
    /// session's copied or renamed by hand (which every other command refuses).
    ///
    /// A session deleted while it is checked is [`Error::SessionNotFound`], and one deleted
    /// and made again (or imported anew) is checked again, as the other reads of a root do:
    /// a check that met both files once called a sound session corrupt.
    ///
    /// # Errors
    /// As [`Root::open_reader`](crate::Root::open_reader) and [`verify_file`].
    pub fn verify(&self, id: &crate::SessionId) -> Result<Verified> {
        self.read_settled(id, |_| verify_file(self.session_dir(id)))
    }
}

/// Makes every check of [`replay_file`] without keeping the commits: memory follows one page
/// of the log, the projection (its model workset: every message of a session never
/// compacted) and the history index's rows, not the log's bytes.
///
/// # Errors
/// As [`replay_file`].
pub fn verify_file(path: impl AsRef<Path>) -> Result<Verified> {
    Ok(validate_each(path.as_ref(), |_, _| {})?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that vanished while `import` or `verify` read it is named as a file (exit 3
    /// in the CLI: an I/O error of kind "not found"), not as a session.
    #[test]
    fn a_file_gone_while_read_is_named_as_a_file() {
        let file = Path::new("/tmp/x/.sse-1.tmp");
        let named = naming_file(Error::SessionNotFound(file.display().to_string()), file);
        assert!(
            matches!(&named, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{named:?}"
        );
        assert!(named.is_not_found(), "{named}");
        assert_eq!(
            named.to_string(),
            "read /tmp/x/.sse-1.tmp: the file is gone (moved or removed while it was read)"
        );
        // Another session's absence (a lineage ancestor) is left as it is.
        let other = naming_file(Error::SessionNotFound("abc".into()), file);
        assert!(matches!(other, Error::SessionNotFound(_)), "{other:?}");
    }
}
