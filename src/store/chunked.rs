//! Multi-row inserts: rows of one table gathered and inserted [`CHUNK`] to a statement
//! (`INSERT … VALUES (…), (…), …`), so that SQLite runs one statement per chunk instead of
//! one per row (its per-statement work: reset, bindings cleared, the program started).
//! The drain inserts every event and history row this way.

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{Connection, ToSql, params_from_iter};

use crate::error::Result;

/// Rows per multi-row statement.
const CHUNK: usize = 32;

/// The two statements of one table's multi-row insert, built once per process (a `static`
/// `LazyLock` of the caller's): for a whole chunk and for one row.
pub(crate) struct ChunkSql {
    /// Values per row.
    width: usize,
    chunk: String,
    row: String,
}

impl ChunkSql {
    /// The statements for rows of `width` values, starting `head` (`INSERT … VALUES `,
    /// without the row tuples).
    pub(crate) fn new(head: &str, width: usize) -> ChunkSql {
        let tuple = format!("({})", vec!["?"; width].join(","));
        ChunkSql {
            width,
            chunk: format!("{head}{}", vec![tuple.as_str(); CHUNK].join(",")),
            row: format!("{head}{tuple}"),
        }
    }
}

/// Rows waiting to be inserted into one table, in order.
pub(crate) struct ChunkedInsert<'a> {
    sql: &'static ChunkSql,
    values: Vec<ToSqlOutput<'a>>,
}

impl<'a> ChunkedInsert<'a> {
    /// No rows yet, to be inserted by `sql`'s statements.
    pub(crate) fn new(sql: &'static ChunkSql) -> ChunkedInsert<'a> {
        ChunkedInsert {
            sql,
            values: Vec::with_capacity(CHUNK * sql.width),
        }
    }

    /// Adds one row (exactly `width` values); a full chunk is inserted at once.
    pub(crate) fn push<const N: usize>(
        &mut self,
        tx: &Connection,
        row: [ToSqlOutput<'a>; N],
    ) -> Result<()> {
        debug_assert_eq!(N, self.sql.width);
        self.values.extend(row);
        if self.values.len() == CHUNK * self.sql.width {
            tx.prepare_cached(&self.sql.chunk)?
                .execute(params_from_iter(self.values.drain(..)))?;
        }
        Ok(())
    }

    /// Inserts the rows still waiting, one statement each (fewer than a chunk; a
    /// statement per remainder size would crowd the statement cache).
    pub(crate) fn finish(mut self, tx: &Connection) -> Result<()> {
        if self.values.is_empty() {
            return Ok(());
        }
        let mut row = tx.prepare_cached(&self.sql.row)?;
        while !self.values.is_empty() {
            row.execute(params_from_iter(self.values.drain(..self.sql.width)))?;
        }
        Ok(())
    }
}

/// A value borrowed from `v`.
pub(crate) fn value<T: ToSql + ?Sized>(v: &T) -> Result<ToSqlOutput<'_>> {
    Ok(v.to_sql()?)
}

/// An optional text, borrowed (`NULL` for `None`).
pub(crate) fn opt_text(s: Option<&str>) -> ToSqlOutput<'_> {
    match s {
        Some(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        None => ToSqlOutput::Owned(Value::Null),
    }
}

/// An owned optional text (`NULL` for `None`).
pub(crate) fn owned_text<'a>(s: Option<String>) -> ToSqlOutput<'a> {
    ToSqlOutput::Owned(s.map_or(Value::Null, Value::Text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    static T_ROWS: std::sync::LazyLock<ChunkSql> =
        std::sync::LazyLock::new(|| ChunkSql::new("INSERT INTO t (k, v) VALUES ", 2));

    fn table() -> Connection {
        let conn = Connection::open_in_memory().expect("open");
        conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
            .expect("create");
        conn
    }

    #[test]
    fn rows_go_in_whole_chunks_then_one_by_one_in_order() {
        let mut conn = table();
        let texts: Vec<String> = (0..2 * CHUNK + 6).map(|i| format!("v{i}")).collect();
        let tx = conn.transaction().expect("tx");
        let mut rows = ChunkedInsert::new(&T_ROWS);
        for (k, v) in texts.iter().enumerate() {
            rows.push(&tx, [ToSqlOutput::from(k as i64), opt_text(Some(v))])
                .expect("push");
        }
        rows.push(&tx, [ToSqlOutput::from(999i64), owned_text(None)])
            .expect("push");
        rows.finish(&tx).expect("finish");
        tx.commit().expect("commit");
        let stored: Vec<(i64, Option<String>)> = conn
            .prepare("SELECT k, v FROM t ORDER BY k")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("rows");
        assert_eq!(stored.len(), texts.len() + 1);
        for (i, (k, v)) in stored.iter().take(texts.len()).enumerate() {
            assert_eq!((*k, v.as_deref()), (i as i64, Some(texts[i].as_str())));
        }
        assert_eq!(stored.last(), Some(&(999, None)));
    }

    #[test]
    fn a_refused_row_fails_its_chunk() {
        let mut conn = table();
        let tx = conn.transaction().expect("tx");
        let mut rows = ChunkedInsert::new(&T_ROWS);
        let mut failed = false;
        for k in 0..CHUNK {
            // The last row of the chunk repeats the first key.
            let k = if k == CHUNK - 1 { 0 } else { k };
            failed |= rows
                .push(&tx, [ToSqlOutput::from(k as i64), opt_text(None)])
                .is_err();
        }
        assert!(failed, "a duplicate key in a chunk is an error");
    }
}
