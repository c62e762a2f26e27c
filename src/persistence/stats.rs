//! Storage statistics of a session: counts and bytes by event kind, the blobs its events
//! reference and how well they compress, bytes by table, and the usage totals. Read-only;
//! SQL aggregates over the session file and the files of its ancestors; no payload is
//! decoded but the `usage` events' (whose totals are the projection's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::{SessionId, Usage};
use crate::persistence::Root;
use crate::store::reader::SessionReader;
use crate::store::schema::{self, SESSION_FILE};
use crate::store::stats::{BlobSize, blob_sizes, kind_totals, table_bytes};
pub use crate::store::stats::{KindStats, TableBytes};

/// The distinct blobs a session's events reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct BlobStats {
    /// Distinct blobs.
    pub count: u64,
    /// Blobs stored zstd-compressed (the others are stored as is).
    pub compressed: u64,
    /// Raw bytes of the blobs.
    pub raw_bytes: u64,
    /// Bytes stored for them.
    pub stored_bytes: u64,
    /// `raw_bytes / stored_bytes` (1 when there are none).
    pub compression_ratio: f64,
}

/// What [`Root::stats`] reports.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct SessionStats {
    /// The session.
    pub session_id: SessionId,
    /// Its last durable sequence.
    pub durable_sequence: u64,
    /// Events counted (own and inherited).
    pub events: u64,
    /// By kind, most bytes first.
    pub kinds: Vec<KindStats>,
    /// The blobs the events reference.
    pub blobs: BlobStats,
    /// Tables of the session's own file, most bytes first.
    pub tables: Vec<TableBytes>,
    /// Bytes of the session's own file and its WAL.
    pub file_bytes: u64,
    /// Token and cost totals of its `usage` events (inherited ones included), as the
    /// projection's.
    pub usage: Usage,
}

/// One file and the range of sequences it supplies, `(after, through]`.
struct Source {
    file: PathBuf,
    after: u64,
    through: u64,
}

impl Root {
    /// Counts and bytes by event kind, blob count and compression ratio, bytes by table
    /// and usage totals of a session's durable prefix, inherited ranges included.
    ///
    /// # Errors
    /// [`Error::SessionNotFound`], also for a session deleted while it is read;
    /// [`Error::Corrupt`] when an ancestor or an event row is missing, or a `usage` payload
    /// does not read (no other payload is read: `verify` checks them); SQLite errors.
    pub fn stats(&self, id: &SessionId) -> Result<SessionStats> {
        self.read_settled(id, |reader| self.stats_of(id, reader))
    }

    /// [`Root::stats`] on an open reader of `id`.
    fn stats_of(&self, id: &SessionId, reader: &SessionReader) -> Result<SessionStats> {
        // Every count at this durable sequence: a writer may commit meanwhile.
        let durable = reader.durable_sequence()?;
        let mut sources: Vec<Source> = reader
            .lineage()
            .into_iter()
            .map(|e| Source {
                file: self.session_dir(&e.ancestor_id).join(SESSION_FILE),
                after: e.after_seq,
                through: e.through_seq,
            })
            .collect();
        // The own file holds exactly the sequences no lineage row covers.
        sources.push(Source {
            file: reader.file().to_path_buf(),
            after: 0,
            through: durable.min(i64::MAX as u64),
        });
        let mut kinds: BTreeMap<String, KindStats> = BTreeMap::new();
        let mut blobs: BTreeMap<String, BlobSize> = BTreeMap::new();
        for source in &sources {
            let conn = schema::open_reader(&source.file).map_err(|e| match e {
                Error::SessionNotFound(_) if source.file != reader.file() => {
                    Error::corrupt(format!(
                        "session {id} inherits from {}, which is missing",
                        source.file.display()
                    ))
                }
                other => other,
            })?;
            for row in kind_totals(&conn, source.after, source.through)? {
                let total = kinds.entry(row.kind.clone()).or_insert_with(|| KindStats {
                    kind: row.kind.clone(),
                    ..KindStats::default()
                });
                total.count += row.count;
                total.inline_bytes += row.inline_bytes;
                total.blob_events += row.blob_events;
                total.blob_bytes += row.blob_bytes;
                total.content_parts += row.content_parts;
            }
            blobs.extend(blob_sizes(&conn, source.after, source.through)?);
        }
        let mut kinds: Vec<KindStats> = kinds.into_values().collect();
        kinds.sort_by(|a, b| {
            (b.inline_bytes + b.blob_bytes)
                .cmp(&(a.inline_bytes + a.blob_bytes))
                .then_with(|| a.kind.cmp(&b.kind))
        });
        // No payload is read, so the log is not folded: a missing event row (which the
        // fold refused) is told from the count, as sequences run from 1 without a gap.
        let events: u64 = kinds.iter().map(|k| k.count).sum();
        if events != durable {
            return Err(Error::corrupt(format!(
                "session {id} holds {events} events through sequence {durable}: events are                  missing"
            )));
        }
        let (raw_bytes, stored_bytes) = blobs
            .values()
            .fold((0, 0), |(r, s), b| (r + b.raw, s + b.stored));
        Ok(SessionStats {
            session_id: id.clone(),
            durable_sequence: durable,
            events,
            kinds,
            blobs: BlobStats {
                count: blobs.len() as u64,
                compressed: blobs.values().filter(|b| b.zstd).count() as u64,
                raw_bytes,
                stored_bytes,
                compression_ratio: if stored_bytes == 0 {
                    1.0
                } else {
                    raw_bytes as f64 / stored_bytes as f64
                },
            },
            tables: table_bytes(reader.file())?,
            file_bytes: file_bytes(reader.file()),
            usage: reader.usage_through(durable)?,
        })
    }

    /// Bytes by table (indexes counted with their table) of a session's own file, most
    /// bytes first.
    ///
    /// # Errors
    /// [`Error::SessionNotFound`]; SQLite errors.
    pub fn table_bytes(&self, id: &SessionId) -> Result<Vec<TableBytes>> {
        table_bytes(&self.session_dir(id).join(SESSION_FILE)).map_err(|e| match e {
            Error::SessionNotFound(_) => Error::SessionNotFound(id.to_string()),
            other => other,
        })
    }
}

/// Bytes of a session file and its WAL.
fn file_bytes(file: &Path) -> u64 {
    let wal = PathBuf::from(format!("{}-wal", file.display()));
    [file.to_path_buf(), wal]
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}
