//! Validation of a whole log: the checks shared by `replay`, export and import.

use std::path::Path;

use crate::error::{Error, Result};
use crate::model::header::Header;
use crate::model::projection::HistoryChange;
use crate::model::{Commit, Projection, TurnBoundary};
use crate::store::reader::SessionReader;
use crate::store::schema::{self, SESSION_FILE};

/// The result of [`replay`]: every commit, validated, and their projection.
#[derive(Clone, Debug)]
pub struct Replay {
    /// The header row.
    pub header: Header,
    /// Every durable commit in order.
    pub commits: Vec<Commit>,
    /// The fold of all commits.
    pub projection: Projection,
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
    pub(crate) fn check(&mut self, c: &Commit) -> Result<(Vec<TurnBoundary>, Vec<HistoryChange>)> {
        let turns_before = self.projection.turns.len();
        let mut history = Vec::new();
        self.projection
            .apply_commit_tracked(c, &mut history)
            .map_err(|e| Error::corrupt(format!("commit at {}: {e}", c.first_seq)))?;
        self.next_seq = c.last_seq() + 1;
        Ok((self.projection.turns[turns_before..].to_vec(), history))
    }

    /// The last validated sequence.
    pub(crate) fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    pub(crate) fn into_projection(self) -> Projection {
        self.projection
    }
}

/// `PRAGMA integrity_check` and `foreign_key_check` on an untrusted file.
pub(crate) fn check_integrity(file: &Path) -> Result<()> {
    let conn = schema::open_reader(file)?;
    let verdict: String = conn.query_row("PRAGMA integrity_check(1)", [], |r| r.get(0))?;
    if verdict != "ok" {
        return Err(Error::corrupt(format!("integrity_check: {verdict}")));
    }
    let dangling: i64 =
        conn.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })?;
    if dangling != 0 {
        return Err(Error::corrupt(format!(
            "{dangling} rows reference missing commits or blobs"
        )));
    }
    Ok(())
}

/// Splits a path into the session file and the root its ancestors live in.
pub(crate) fn file_and_root(path: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    if path.is_dir() {
        (
            path.join(SESSION_FILE),
            path.parent().unwrap_or(path).to_path_buf(),
        )
    } else {
        let root = path
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("."));
        (path.to_path_buf(), root.to_path_buf())
    }
}

/// What [`verify`] found in a sound log: the counts and the projection, not the commits.
#[derive(Clone, Debug)]
pub struct Verified {
    /// The header row.
    pub header: Header,
    /// Durable commits.
    pub commits: u64,
    /// The last sequence (0 for an empty log).
    pub events: u64,
    /// The fold of all commits.
    pub projection: Projection,
}

/// Checks a session file (or folder) as [`replay`] does and hands each validated commit
/// to `f`, one page in memory at a time.
fn validate_each(path: &Path, mut f: impl FnMut(Commit)) -> Result<Verified> {
    let (file, root) = file_and_root(path);
    check_integrity(&file)?;
    let reader = SessionReader::open_file(&file, &root)?;
    let mut validator = LogValidator::new();
    let mut commits = 0u64;
    reader.visit(u64::MAX, |c| {
        validator.check(&c)?;
        commits += 1;
        f(c);
        Ok(())
    })?;
    Ok(Verified {
        header: reader.header().clone(),
        commits,
        events: validator.last_seq(),
        projection: validator.into_projection(),
    })
}

/// Reads and validates every commit of a session file (or a session folder): structure
/// (`integrity_check`), contiguous sequences from 1, operation hashes, blob digests, known
/// kinds, and a full fold. Ancestors of a fork are resolved as siblings of its folder.
///
/// Keeps every commit in memory; [`verify`] makes the same checks in bounded memory.
///
/// # Errors
/// [`Error::Corrupt`] naming the first problem; [`Error::SessionNotFound`] for a missing file.
pub fn replay(path: impl AsRef<Path>) -> Result<Replay> {
    let mut commits = Vec::new();
    let verified = validate_each(path.as_ref(), |c| commits.push(c))?;
    Ok(Replay {
        header: verified.header,
        commits,
        projection: verified.projection,
    })
}

/// Makes every check of [`replay`] without keeping the commits: memory follows one page
/// of the log and the projection, not the log's length.
///
/// # Errors
/// As [`replay`].
pub fn verify(path: impl AsRef<Path>) -> Result<Verified> {
    validate_each(path.as_ref(), drop)
}
