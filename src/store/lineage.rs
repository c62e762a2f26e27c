//! Lineage and dependents rows, and the materialisation of an inherited range: every
//! statement a fork, a rewind or a delete runs on a session file.

use std::path::Path;
use std::sync::Arc;

use rusqlite::{Connection, TransactionBehavior, params};

use crate::error::{Error, Result};
use crate::model::event::inherited_operation_id;
use crate::store::read::{self, LineageEntry};
use crate::store::reader::check_commit;
use crate::store::schema::{self, Durability};
use crate::store::write::{self, Accepted};

/// Commits copied per read while materialising.
const COPY_PAGE: usize = 1000;

/// Records `child` as a dependent of the session file `file` through `through`, durably
/// (on a side connection: the file's writer, if any, is not disturbed).
pub(crate) fn record_dependent(file: &Path, child: &str, through: u64) -> Result<()> {
    let record = || -> Result<()> {
        let mut conn = schema::open_side_writer(file)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO dependents (child_id, through_seq) VALUES (?1, ?2)
             ON CONFLICT (child_id) DO UPDATE SET through_seq = max(through_seq, excluded.through_seq)",
            params![child, through],
        )?;
        tx.commit()?;
        Ok(())
    };
    record().map_err(|e| schema::busy_file(e, file))
}

/// Gives back to the session file `file` the frames its WAL holds and empties the WAL,
/// when no other connection uses it: best effort, nothing waits (a writer of the file
/// checkpoints it in its turn). A fork's `dependents` row is a commit in each ancestor's
/// WAL, made while the fork's own reader of the ancestor held a snapshot, so the WAL never
/// started again from its beginning: it grew by about 8 KB a fork for as long as nobody
/// wrote the parent, and every open of the parent or of a fork read through it (outside
/// testing L1: `rebuild-catalog` took 101 s for 2,000 forks of one parent, 12 s once the
/// WAL was emptied).
pub(crate) fn empty_wal(file: &Path) {
    if let Ok(conn) = schema::open_side_writer(file) {
        let _ = conn.busy_timeout(std::time::Duration::ZERO);
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
}

/// Drops `child`'s dependents row from the session file `file` (on a side connection, as
/// [`record_dependent`]).
pub(crate) fn forget_dependent(file: &Path, child: &str) -> Result<()> {
    let forget = || -> Result<()> {
        let conn = schema::open_side_writer(file)?;
        conn.execute("DELETE FROM dependents WHERE child_id = ?1", [child])?;
        Ok(())
    };
    forget().map_err(|e| schema::busy_file(e, file))
}

/// Replaces a file's lineage rows.
pub(crate) fn write_lineage(conn: &mut Connection, lineage: &[LineageEntry]) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute("DELETE FROM lineage", [])?;
    for (depth, e) in lineage.iter().enumerate() {
        tx.execute(
            "INSERT INTO lineage (depth, ancestor_id, after_seq, through_seq) VALUES (?1, ?2, ?3, ?4)",
            params![depth as i64, e.ancestor_id.as_str(), e.after_seq, e.through_seq],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Copies every range the session file `child_file` inherits from `ancestor` (whose file
/// is `source_file`) into `child_file` itself: commits (with inherited operation ids),
/// their events and blobs, turns and history rows; then drops those lineage rows. One
/// transaction: a crash leaves the child either untouched or self-sufficient for them.
/// String values longer than `inline_threshold` become content parts of the child. A
/// child of an older version is upgraded first: the caller holds its writer lock then.
pub(crate) fn materialize(
    source_file: &Path,
    ancestor: &str,
    child_file: &Path,
    inline_threshold: usize,
) -> Result<()> {
    copy_ranges(source_file, ancestor, child_file, inline_threshold)
        .map_err(|e| schema::busy_file(e, child_file))
}

/// [`materialize`], its errors as they come.
fn copy_ranges(
    source_file: &Path,
    ancestor: &str,
    child_file: &Path,
    inline_threshold: usize,
) -> Result<()> {
    let source = schema::open_reader(source_file)?;
    let mut conn = schema::open_writable(child_file, Durability::PowerLoss)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let ranges: Vec<_> = read::read_lineage(&tx)?
        .into_iter()
        .filter(|e| e.ancestor_id.as_str() == ancestor)
        .collect();
    for range in &ranges {
        let mut after = range.after_seq;
        while after < range.through_seq {
            let mut budget = read::PAGE_BYTES;
            let page =
                read::read_commits(&source, after, range.through_seq, COPY_PAGE, &mut budget)?;
            let Some(last) = page.last() else {
                // The ancestor holds less than the range (damaged, or an older copy):
                // copying what there is and dropping the lineage row would lose the rest.
                return Err(Error::corrupt(format!(
                    "{ancestor} holds sequences only through {after} of the {}..={} inherited",
                    range.after_seq + 1,
                    range.through_seq
                )));
            };
            // Each commit is checked as a reader checks it (no gap, its events match its
            // operation hash): a damaged one copied with a new operation id would leave the
            // child as damaged as the ancestor, which the delete then removes.
            let mut next = after + 1;
            for commit in &page {
                next = check_commit(next, commit)? + 1;
            }
            after = last.last_seq();
            let batch: Vec<_> = page
                .into_iter()
                .map(|mut commit| {
                    commit.operation_id = inherited_operation_id(ancestor, &commit);
                    Arc::new(Accepted {
                        commit: Arc::new(commit),
                        closed_turns: Vec::new(),
                        history: Vec::new(),
                        charge: 0,
                    })
                })
                .collect();
            write::insert_commits(&tx, &batch, inline_threshold)?;
        }
        let turns = read::read_turns_ending_in(&source, range.after_seq, range.through_seq)?;
        write::insert_turns(&tx, &turns)?;
        write::copy_history(&tx, &source, range.after_seq, range.through_seq)?;
        tx.execute(
            "DELETE FROM lineage WHERE ancestor_id = ?1 AND after_seq = ?2",
            params![ancestor, range.after_seq],
        )?;
    }
    tx.commit()?;
    Ok(())
}
