//! Where each message id of the UI transcript sits, without the messages: what the fold
//! needs for the duplicate-id check of `message/complete` and the position of a
//! `message/upsert`.
//!
//! Ids are kept as [`MessageKey`]s. The part restored from a checkpoint stays a sorted
//! array (restoring it is a copy, not a hash-map build: a 100,000-message transcript
//! opens in well under a millisecond); ids added since sit in a hash map beside it.

use rustc_hash::FxHashMap as HashMap;

/// A message id as the index keeps it: its XXH3-128 hash. Two different ids share one
/// with probability about n²/2¹²⁹ (10⁻²⁶ for a million messages), the assumption content
/// addressing makes.
pub(crate) type MessageKey = u128;

/// The key of a message id.
pub(crate) fn message_key(id: &str) -> MessageKey {
    xxhash_rust::xxh3::xxh3_128(id.as_bytes())
}

/// Bytes per entry in [`TranscriptIndex::to_bytes`]: the key, then the position.
pub(crate) const ENTRY: usize = 16 + 4;

/// Message key → 0-based transcript position.
#[derive(Clone, Default)]
pub(crate) struct TranscriptIndex {
    /// Restored from a checkpoint: keys ascending, positions beside them.
    keys: Vec<MessageKey>,
    positions: Vec<u32>,
    /// Added since.
    added: HashMap<MessageKey, u32>,
}

/// Its size, not its entries: hashes and positions say nothing to a reader of a
/// `Projection`'s `Debug`, and a long transcript's would run to megabytes.
impl std::fmt::Debug for TranscriptIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TranscriptIndex")
            .field("restored", &self.keys.len())
            .field("added", &self.added.len())
            .finish()
    }
}

impl TranscriptIndex {
    /// The position of `key`.
    pub(crate) fn get(&self, key: MessageKey) -> Option<u32> {
        if let Some(&at) = self.added.get(&key) {
            return Some(at);
        }
        let i = self.keys.binary_search(&key).ok()?;
        self.positions.get(i).copied()
    }

    /// Puts `key` at `at` (a later insert of the same key wins).
    pub(crate) fn insert(&mut self, key: MessageKey, at: u32) {
        self.added.insert(key, at);
    }

    /// Forgets every id (the transcript was replaced).
    pub(crate) fn clear(&mut self) {
        *self = TranscriptIndex::default();
    }

    /// The index as a checkpoint stores it: per id, ascending by key, the 16-byte
    /// little-endian key and the 4-byte little-endian position.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut entries: Vec<(MessageKey, u32)> = self
            .keys
            .iter()
            .copied()
            .zip(self.positions.iter().copied())
            .filter(|(k, _)| !self.added.contains_key(k))
            .chain(self.added.iter().map(|(&k, &at)| (k, at)))
            .collect();
        entries.sort_unstable_by_key(|&(k, _)| k);
        let mut out = Vec::with_capacity(entries.len() * ENTRY);
        for (key, at) in entries {
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&at.to_le_bytes());
        }
        out
    }

    /// The index of [`TranscriptIndex::to_bytes`] for a transcript of `len` messages;
    /// `None` unless the keys ascend strictly and every position is below `len`.
    #[cfg(test)]
    pub(crate) fn from_bytes(bytes: &[u8], len: u64) -> Option<TranscriptIndex> {
        let mut loader = IndexLoader::new(bytes.len(), len)?;
        loader.push(bytes)?;
        loader.finish()
    }
}

/// Rebuilds a [`TranscriptIndex`] from its [`TranscriptIndex::to_bytes`] form read in
/// pieces (each a whole number of entries), so that the reader needs no copy of the whole
/// form: a 100,000-message index is 2 MB.
pub(crate) struct IndexLoader {
    keys: Vec<MessageKey>,
    positions: Vec<u32>,
    entries: usize,
    len: u64,
}

impl IndexLoader {
    /// A loader of a `bytes`-long form for a transcript of `len` messages; `None` unless
    /// `bytes` is a whole number of entries, at most one per message.
    pub(crate) fn new(bytes: usize, len: u64) -> Option<IndexLoader> {
        if !bytes.is_multiple_of(ENTRY) || (bytes / ENTRY) as u64 > len {
            return None;
        }
        let entries = bytes / ENTRY;
        Some(IndexLoader {
            keys: Vec::with_capacity(entries),
            positions: Vec::with_capacity(entries),
            entries,
            len,
        })
    }

    /// Adds the next entries; `None` when `bytes` is not a whole number of entries, goes
    /// past the announced length, breaks the strict key order or names a position at or
    /// past the transcript's length.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Option<()> {
        if !bytes.len().is_multiple_of(ENTRY)
            || self.keys.len() + bytes.len() / ENTRY > self.entries
        {
            return None;
        }
        for entry in bytes.chunks_exact(ENTRY) {
            let (key, at) = entry.split_at(16);
            let key = u128::from_le_bytes(key.try_into().ok()?);
            let at = u32::from_le_bytes(at.try_into().ok()?);
            if self.keys.last().is_some_and(|&last| last >= key) || u64::from(at) >= self.len {
                return None;
            }
            self.keys.push(key);
            self.positions.push(at);
        }
        Some(())
    }

    /// The index, once every announced entry came.
    pub(crate) fn finish(self) -> Option<TranscriptIndex> {
        (self.keys.len() == self.entries).then(|| TranscriptIndex {
            keys: self.keys,
            positions: self.positions,
            added: HashMap::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restored_and_added_ids_answer_alike() {
        let mut index = TranscriptIndex::default();
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            index.insert(message_key(id), i as u32);
        }
        let bytes = index.to_bytes();
        assert_eq!(bytes.len(), 3 * ENTRY);
        let mut back = TranscriptIndex::from_bytes(&bytes, 3).expect("restore");
        back.insert(message_key("d"), 3);
        for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
            assert_eq!(back.get(message_key(id)), Some(i as u32), "{id}");
        }
        assert_eq!(back.get(message_key("e")), None);
        let again = TranscriptIndex::from_bytes(&back.to_bytes(), 4).expect("restore");
        assert_eq!(again.get(message_key("d")), Some(3));
        back.clear();
        assert_eq!(back.get(message_key("a")), None);
    }

    /// A `Projection`'s `Debug` printed every entry of its transcript index (a hash and a
    /// position per message, megabytes for a long session); the index shows its size.
    #[test]
    fn debug_shows_the_size_not_the_entries() {
        let mut index = TranscriptIndex::default();
        for i in 0..1000u32 {
            index.insert(message_key(&format!("m{i}")), i);
        }
        let mut index = TranscriptIndex::from_bytes(&index.to_bytes(), 1000).expect("restore");
        index.insert(message_key("new"), 1000);
        assert_eq!(
            format!("{index:?}"),
            "TranscriptIndex { restored: 1000, added: 1 }"
        );
    }

    #[test]
    fn an_index_loaded_in_pieces_equals_one_loaded_whole() {
        let mut index = TranscriptIndex::default();
        for i in 0..10u32 {
            index.insert(message_key(&format!("m{i}")), i);
        }
        let bytes = index.to_bytes();
        let mut loader = IndexLoader::new(bytes.len(), 10).expect("loader");
        for piece in bytes.chunks(3 * ENTRY) {
            loader.push(piece).expect("piece");
        }
        let back = loader.finish().expect("finish");
        for i in 0..10u32 {
            assert_eq!(back.get(message_key(&format!("m{i}"))), Some(i));
        }
        let mut short = IndexLoader::new(bytes.len(), 10).expect("loader");
        short.push(&bytes[..9 * ENTRY]).expect("nine");
        assert!(short.finish().is_none(), "an entry missing");
        let mut over = IndexLoader::new(bytes.len() - ENTRY, 10).expect("loader");
        assert!(over.push(&bytes).is_none(), "more than announced");
        let mut split = IndexLoader::new(bytes.len(), 10).expect("loader");
        assert!(split.push(&bytes[..ENTRY + 1]).is_none(), "half an entry");
        let mut order = IndexLoader::new(2 * ENTRY, 10).expect("loader");
        order.push(&bytes[ENTRY..2 * ENTRY]).expect("second");
        assert!(order.push(&bytes[..ENTRY]).is_none(), "order across pieces");
        assert!(
            IndexLoader::new(bytes.len(), 9).is_none(),
            "more entries than messages"
        );
    }

    #[test]
    fn refuses_bytes_that_do_not_fit() {
        let mut index = TranscriptIndex::default();
        index.insert(message_key("a"), 0);
        index.insert(message_key("b"), 1);
        let bytes = index.to_bytes();
        assert!(
            TranscriptIndex::from_bytes(&bytes, 1).is_none(),
            "position 1 of 1"
        );
        assert!(
            TranscriptIndex::from_bytes(&bytes[1..], 2).is_none(),
            "length"
        );
        let mut swapped = bytes[ENTRY..].to_vec();
        swapped.extend_from_slice(&bytes[..ENTRY]);
        assert!(TranscriptIndex::from_bytes(&swapped, 2).is_none(), "order");
        assert!(TranscriptIndex::from_bytes(&[], 0).is_some());
    }
}
