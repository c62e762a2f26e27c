//! Storage statistics of a session file: SQL aggregates by event kind, the blobs a range
//! of events references, and bytes by table (`dbstat`). No payload is decoded.

use std::path::Path;

use rusqlite::Connection;
use serde::Serialize;

use crate::error::Result;
use crate::store::{event_row, read, schema};

/// Events of one kind in a session (inherited events included).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KindStats {
    /// The event kind.
    pub kind: String,
    /// How many events of this kind.
    pub count: u64,
    /// Bytes of inline payload text.
    pub inline_bytes: u64,
    /// Events whose payload lives in a blob.
    pub blob_events: u64,
    /// Raw (uncompressed) bytes of those payloads.
    pub blob_bytes: u64,
    /// String values stored as content parts (in blobs, a placeholder inline).
    pub content_parts: u64,
}

/// Pages of one table of a session file, its indexes included.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TableBytes {
    /// The table (`sqlite_schema` for the schema itself).
    pub table: String,
    /// Bytes of the pages it uses.
    pub bytes: u64,
    /// Pages it uses.
    pub pages: u64,
}

/// Events of the file with sequences in `(after, through]`, by kind.
pub(crate) fn kind_totals(conn: &Connection, after: u64, through: u64) -> Result<Vec<KindStats>> {
    let parts = if read::has_content_parts(conn)? {
        "coalesce(sum(CASE WHEN json_valid(e.payload_parts)
                           THEN json_array_length(e.payload_parts) END), 0)"
    } else {
        "0"
    };
    let mut stmt = conn.prepare(&format!(
        "SELECT e.kind, count(*),
                coalesce(sum(length(CAST(e.payload AS BLOB))), 0),
                count(e.payload_ref), coalesce(sum(b.bytes), 0), {parts}, min(e.seq)
         FROM events e LEFT JOIN blobs b ON b.digest = e.payload_ref
         WHERE e.seq > ?1 AND e.seq <= ?2 GROUP BY e.kind"
    ))?;
    // A kind stored both as text and as a code (a file upgraded to schema 5) has a row of
    // each; the caller adds rows of the same kind up.
    let mut rows = stmt.query((after, through))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(KindStats {
            kind: event_row::decode_kind(r.get(6)?, r.get_ref(0)?)?
                .kind
                .into_owned(),
            count: r.get(1)?,
            inline_bytes: r.get(2)?,
            blob_events: r.get(3)?,
            blob_bytes: r.get(4)?,
            content_parts: r.get(5)?,
        });
    }
    Ok(out)
}

/// One stored blob's sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlobSize {
    /// Raw (decoded) bytes.
    pub raw: u64,
    /// Bytes stored.
    pub stored: u64,
    /// Whether it is stored zstd-compressed.
    pub zstd: bool,
}

/// The blobs referenced by events with sequences in `(after, through]` (whole payloads
/// and content parts), by digest.
pub(crate) fn blob_sizes(
    conn: &Connection,
    after: u64,
    through: u64,
) -> Result<Vec<(String, BlobSize)>> {
    // A placeholder's digest starts 11 bytes (1-based) after its offset: `"sse-blob:`.
    let parts = if read::has_content_parts(conn)? {
        "UNION SELECT CAST(substr(CAST(e.payload AS BLOB), j.value + 11, 64) AS TEXT)
              FROM events e, json_each(CASE WHEN json_valid(e.payload_parts)
                                            THEN e.payload_parts ELSE '[]' END) j
              WHERE e.payload_parts IS NOT NULL AND e.seq > ?1 AND e.seq <= ?2"
    } else {
        ""
    };
    let mut stmt = conn.prepare(&format!(
        "SELECT digest, bytes, length(data), encoding FROM blobs WHERE digest IN
             (SELECT payload_ref FROM events
              WHERE payload_ref IS NOT NULL AND seq > ?1 AND seq <= ?2 {parts})"
    ))?;
    let rows = stmt.query_map((after, through), |r| {
        Ok((
            r.get::<_, String>(0)?,
            BlobSize {
                raw: r.get(1)?,
                stored: r.get(2)?,
                zstd: r.get::<_, String>(3)? == "zstd",
            },
        ))
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Pages by table from SQLite's `dbstat` table.
pub(crate) fn table_bytes(file: &Path) -> Result<Vec<TableBytes>> {
    let conn = schema::open_reader(file)?;
    let mut stmt = conn.prepare(
        "SELECT coalesce(s.tbl_name, d.name), sum(d.pgsize), count(*)
         FROM dbstat d LEFT JOIN sqlite_schema s ON s.name = d.name
         GROUP BY 1 ORDER BY 2 DESC, 1",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(TableBytes {
            table: r.get(0)?,
            bytes: r.get(1)?,
            pages: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}
