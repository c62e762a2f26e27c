//! Validation of a whole log: the checks shared by `replay`, export and import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::error::{Error, Result};
use crate::model::header::Header;
use crate::model::projection::HistoryChange;
use crate::model::{Commit, Projection, TurnBoundary};
use crate::store::read::HistoryRow;
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
                    let found = got.map_or_else(
                        || "nothing".to_owned(),
                        |g| {
                            format!(
                                "message {:?} (role {:?}, {} bytes) at position {} from event {}",
                                g.message_id, g.role, g.bytes, g.position, g.event_seq
                            )
                        },
                    );
                    return mismatch(format!(
                        "expected message {:?} at position {} from event {}, found {found}",
                        want.message_id, want.position, want.event_seq
                    ));
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

/// Reads and validates every commit of a session file (or a session folder): structure
/// (`integrity_check`), contiguous sequences from 1, operation hashes, blob digests, known
/// kinds, and a full fold. Ancestors of a fork are resolved as siblings of its folder.
///
/// # Errors
/// [`Error::Corrupt`] naming the first problem; [`Error::SessionNotFound`] for a missing file.
pub fn replay(path: impl AsRef<Path>) -> Result<Replay> {
    let (file, root) = file_and_root(path.as_ref());
    check_integrity(&file)?;
    let reader = SessionReader::open_file(&file, &root)?;
    let mut validator = LogValidator::new();
    let mut commits = Vec::new();
    let mut index = HistoryIndex::default();
    reader.visit(u64::MAX, |c| {
        let (_, history) = validator.check(&c)?;
        index.add(&history);
        commits.push(c);
        Ok(())
    })?;
    if let Some(stored) = reader.history_index(validator.last_seq())? {
        index.compare(stored)?;
    }
    Ok(Replay {
        header: reader.header().clone(),
        commits,
        projection: validator.into_projection(),
    })
}
