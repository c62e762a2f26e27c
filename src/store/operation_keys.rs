//! The operation keys of a session file in sorted chunks (schema 6, `operation_key_chunks`):
//! written by the drain once per [`CHUNK_COMMITS`] commits, read by the writer's
//! idempotency check. They replace an index on `commits.operation_key`, whose leaf every
//! durable commit wrote at a random place (the key is a hash). Derived data: a chunk that
//! does not read as one is skipped, its commits then searched as those after the last
//! chunk are.

use rusqlite::{Connection, params};

use crate::error::Result;

/// Commits whose keys the drain gathers into one chunk.
pub(crate) const CHUNK_COMMITS: usize = 1024;

/// Bytes of one entry of a chunk: the key (i64) and the first sequence (u64), little-endian.
const ENTRY: usize = 16;

/// Where the chunks of a file end, as its writer tracks them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkMark {
    /// The last chunk's `through_seq` (0 without one).
    through: u64,
    /// Commits after it.
    unchunked: usize,
}

impl ChunkMark {
    /// Reads the mark of a file (a writer's, at open). The count reads the commits after
    /// the last chunk: fewer than [`CHUNK_COMMITS`] but after a crash or an upgrade.
    pub(crate) fn read(conn: &Connection) -> Result<ChunkMark> {
        let through: u64 = conn
            .prepare_cached("SELECT coalesce(max(through_seq), 0) FROM operation_key_chunks")?
            .query_row([], |r| r.get(0))?;
        let unchunked: u64 = conn
            .prepare_cached("SELECT count(*) FROM commits WHERE first_seq > ?1")?
            .query_row([through], |r| r.get(0))?;
        Ok(ChunkMark {
            through,
            unchunked: usize::try_from(unchunked).unwrap_or(usize::MAX),
        })
    }

    /// Inside the drain's transaction, after it inserted `drained` commits ending at
    /// `last_seq`: writes the chunk of every commit after the mark once there are
    /// [`CHUNK_COMMITS`] of them. The mark to keep once the transaction commits.
    pub(crate) fn after_drain(
        self,
        conn: &Connection,
        drained: usize,
        last_seq: u64,
    ) -> Result<ChunkMark> {
        let unchunked = self.unchunked.saturating_add(drained);
        if unchunked < CHUNK_COMMITS {
            return Ok(ChunkMark { unchunked, ..self });
        }
        let mut entries = conn
            .prepare_cached(
                "SELECT operation_key, first_seq FROM commits WHERE first_seq > ?1 AND first_seq <= ?2",
            )?
            .query_map(params![self.through, last_seq], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, u64>(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        entries.sort_unstable();
        let mut keys = Vec::with_capacity(entries.len() * ENTRY);
        for (key, seq) in &entries {
            keys.extend_from_slice(&key.to_le_bytes());
            keys.extend_from_slice(&seq.to_le_bytes());
        }
        conn.prepare_cached(
            "INSERT INTO operation_key_chunks (through_seq, keys) VALUES (?1, ?2)",
        )?
        .execute(params![last_seq, keys])?;
        Ok(ChunkMark {
            through: last_seq,
            unchunked: 0,
        })
    }
}

/// The chunks a writer has read, kept: a chunk is never rewritten.
#[derive(Debug, Default)]
pub(crate) struct ChunkCache {
    /// Sequences up to here are in `chunks` (the rest are searched in `commits`).
    through: u64,
    /// Each chunk's entries, sorted.
    chunks: Vec<Vec<(i64, u64)>>,
}

impl ChunkCache {
    /// The first sequences of the commits whose operation key is `key`, ascending: from
    /// the chunks (those written since the last call read first) and from the commits
    /// after them.
    pub(crate) fn candidates(&mut self, conn: &Connection, key: i64) -> Result<Vec<u64>> {
        self.read_new(conn)?;
        let mut found = Vec::new();
        for chunk in &self.chunks {
            let start = chunk.partition_point(|&(k, _)| k < key);
            found.extend(
                chunk
                    .get(start..)
                    .unwrap_or_default()
                    .iter()
                    .take_while(|&&(k, _)| k == key)
                    .map(|&(_, seq)| seq),
            );
        }
        let mut tail = conn.prepare_cached(
            "SELECT first_seq FROM commits WHERE first_seq > ?1 AND operation_key = ?2",
        )?;
        let rows = tail.query_map(params![self.through, key], |r| r.get::<_, u64>(0))?;
        for seq in rows {
            found.push(seq?);
        }
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    /// Reads the chunks after `through`, in order, up to the first that does not read as a
    /// chunk (its commits are then searched in `commits`).
    fn read_new(&mut self, conn: &Connection) -> Result<()> {
        let mut stmt = conn.prepare_cached(
            "SELECT through_seq, keys FROM operation_key_chunks WHERE through_seq > ?1
             ORDER BY through_seq",
        )?;
        let mut rows = stmt.query([self.through])?;
        while let Some(row) = rows.next()? {
            // A value of another type is a damaged chunk: stop before it.
            let (Ok(through), Ok(keys)) = (row.get::<_, u64>(0), row.get_ref(1)?.as_blob()) else {
                return Ok(());
            };
            let Some(entries) = decode(keys, self.through, through) else {
                return Ok(());
            };
            self.chunks.push(entries);
            self.through = through;
        }
        Ok(())
    }
}

/// A chunk's entries when `keys` is one: whole entries, sorted, each first sequence in
/// `(after, through]`.
fn decode(keys: &[u8], after: u64, through: u64) -> Option<Vec<(i64, u64)>> {
    if !keys.len().is_multiple_of(ENTRY) {
        return None;
    }
    let entries: Vec<(i64, u64)> = keys
        .chunks_exact(ENTRY)
        .map(|e| {
            let (key, seq) = e.split_at(8);
            Some((
                i64::from_le_bytes(key.try_into().ok()?),
                u64::from_le_bytes(seq.try_into().ok()?),
            ))
        })
        .collect::<Option<_>>()?;
    let sorted = entries.windows(2).all(|w| w[0] < w[1]);
    let in_range = entries
        .iter()
        .all(|&(_, seq)| seq > after && seq <= through);
    (sorted && in_range).then_some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(entries: &[(i64, u64)]) -> Vec<u8> {
        entries
            .iter()
            .flat_map(|(k, s)| k.to_le_bytes().into_iter().chain(s.to_le_bytes()))
            .collect()
    }

    #[test]
    fn a_chunk_reads_back_only_when_whole_sorted_and_in_its_range() {
        let good = [(-5, 3), (7, 1), (7, 2)];
        assert_eq!(decode(&encode(&good), 0, 3), Some(good.to_vec()));
        assert_eq!(decode(&[], 0, 3), Some(Vec::new()));
        let bytes = encode(&good);
        assert_eq!(decode(&bytes[..bytes.len() - 1], 0, 3), None, "a cut entry");
        assert_eq!(decode(&encode(&[(7, 2), (7, 1)]), 0, 3), None, "unsorted");
        assert_eq!(decode(&encode(&[(7, 1), (7, 1)]), 0, 3), None, "repeated");
        assert_eq!(
            decode(&encode(&good), 1, 3),
            None,
            "a sequence before the range"
        );
        assert_eq!(
            decode(&encode(&good), 0, 2),
            None,
            "a sequence after the range"
        );
    }
}
