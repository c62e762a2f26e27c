//! The operation ids a live session knows in memory, so that the idempotency check of an
//! append does not read SQLite on the hot path.
//!
//! Two parts, both bounded:
//! * the recent window: the id and operation hash of the last [`RECENT_WINDOW`] durable
//!   commits (a retry of one of them is answered from memory: a conflict at once, the
//!   original commit by one cold read);
//! * the filter: a growing series of Bloom filters over every operation id of the file
//!   (loaded on a writer thread after the session opens, so opening does not scan the
//!   file) and every id accepted since. An id it does not contain was never used, so a
//!   fresh append needs no lookup. It stops at [`MAX_FILTER_BYTES`] (about a million
//!   ids); past that, before it is loaded and on a false positive, the session asks
//!   SQLite, without holding its state lock.

use std::collections::{HashMap, VecDeque};

/// Durable commits whose operation id and hash stay in memory.
pub(crate) const RECENT_WINDOW: usize = 2048;
/// The most memory the filter takes (its bits); at 16 bits per id, about a million ids.
pub(crate) const MAX_FILTER_BYTES: usize = 2 << 20;
/// Bits per id and probes per lookup: a false positive rate of about 0.05 % per segment.
const BITS_PER_ID: usize = 16;
const PROBES: u64 = 7;
/// Ids the first segment holds; each next one holds twice as many.
const FIRST_SEGMENT: usize = 1024;
/// The longest [`OperationIds::filter_bytes`] this build writes, with its stored check: the
/// bits within [`MAX_FILTER_BYTES`], an 8-byte head per segment (fewer than 32 of them, each
/// twice the one before), the 8-byte header and the 16-byte check. A longer stored filter
/// is not even read.
pub(crate) const MAX_FILTER_FORM: usize = MAX_FILTER_BYTES + 32 * 8 + 8 + 16;
/// The first byte of [`OperationIds::filter_bytes`]: the form this build writes and reads.
const FILTER_FORMAT: u8 = 1;

/// One Bloom filter of a fixed capacity.
struct Segment {
    bits: Vec<u64>,
    capacity: usize,
    len: usize,
}

impl Segment {
    fn new(capacity: usize) -> Segment {
        Segment {
            bits: vec![0; capacity * BITS_PER_ID / 64],
            capacity,
            len: 0,
        }
    }

    /// The word and bit mask of probe `i` for `hash` (double hashing).
    fn position(&self, hash: u64, i: u64) -> (usize, u64) {
        let m = (self.bits.len() * 64) as u64;
        let bit = hash.wrapping_add(i.wrapping_mul((hash >> 32) | 1)) % m;
        ((bit / 64) as usize, 1u64 << (bit % 64))
    }

    fn insert(&mut self, hash: u64) {
        for i in 0..PROBES {
            let (word, mask) = self.position(hash, i);
            self.bits[word] |= mask;
        }
        self.len += 1;
    }

    fn contains(&self, hash: u64) -> bool {
        (0..PROBES).all(|i| {
            let (word, mask) = self.position(hash, i);
            self.bits[word] & mask != 0
        })
    }
}

/// The filter key of an operation id: its operation key as the file stores it
/// (`model::event::operation_key`, 8 bytes of SHA-256), so loading reads no text.
pub(crate) fn operation_key(operation_id: &str) -> u64 {
    crate::model::event::operation_key(operation_id) as u64
}

/// What memory says about an operation id.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Known<'a> {
    /// A recent durable commit used it, with this operation hash.
    Recent(&'a str),
    /// Never used in this file: a new operation.
    Absent,
    /// Memory cannot tell: ask the file.
    Unknown,
}

/// The in-memory operation ids of one live session (see the module doc).
pub(crate) struct OperationIds {
    recent: HashMap<String, String>,
    order: VecDeque<String>,
    /// Ids that left the recent window so far; a cold lookup that started before an
    /// eviction may have missed the evicted id and is repeated.
    evictions: u64,
    segments: Vec<Segment>,
    /// The filter reached its bound and was dropped: it answers nothing any more.
    full: bool,
    /// The ids the file held are in the filter (those accepted since always are).
    loaded: bool,
}

impl OperationIds {
    /// An empty set whose filter is not loaded yet (see [`OperationIds::load`]).
    pub(crate) fn new() -> OperationIds {
        OperationIds {
            recent: HashMap::new(),
            order: VecDeque::new(),
            evictions: 0,
            segments: Vec::new(),
            full: false,
            loaded: false,
        }
    }

    /// The filter a checkpoint stored ([`OperationIds::filter_bytes`]), not loaded yet:
    /// the keys of the commits after the checkpoint are still to come through
    /// [`OperationIds::load`]. `None` for bytes of another form.
    pub(crate) fn restored(bytes: &[u8]) -> Option<OperationIds> {
        let mut ids = OperationIds::new();
        let (header, mut rest) = bytes.split_first_chunk::<8>()?;
        let [format, bits, probes, 0, count @ ..] = *header else {
            return None;
        };
        if format != FILTER_FORMAT
            || usize::from(bits) != BITS_PER_ID
            || u64::from(probes) != PROBES
        {
            return None;
        }
        let mut used = 0;
        for _ in 0..u32::from_le_bytes(count) {
            // Each segment is twice the one before, and all together within the bound
            // (checked before anything is allocated), every one but the last full.
            let expected = ids
                .segments
                .last()
                .map_or(FIRST_SEGMENT, |s| s.capacity * 2);
            used += expected * BITS_PER_ID / 8;
            let before_full = ids.segments.last().is_none_or(|s| s.len == s.capacity);
            let (head, words) = rest.split_first_chunk::<8>()?;
            let (capacity, len) = head.split_at(4);
            let capacity = u32::from_le_bytes(capacity.try_into().ok()?) as usize;
            let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
            if capacity != expected || len > capacity || !before_full || used > MAX_FILTER_BYTES {
                return None;
            }
            let mut segment = Segment::new(capacity);
            let (bits, after) = words.split_at_checked(segment.bits.len() * 8)?;
            for (word, bytes) in segment.bits.iter_mut().zip(bits.chunks_exact(8)) {
                *word = u64::from_le_bytes(bytes.try_into().ok()?);
            }
            segment.len = len;
            ids.segments.push(segment);
            rest = after;
        }
        rest.is_empty().then_some(ids)
    }

    /// The filter as a checkpoint stores it (the module doc of `migrations/0004`): a
    /// header, then each segment's capacity, count and bit words, little-endian. `None`
    /// unless the filter holds every id of the file ([`OperationIds::load`] ran and it
    /// did not reach its bound).
    pub(crate) fn filter_bytes(&self) -> Option<Vec<u8>> {
        if !self.loaded || self.full {
            return None;
        }
        let words: usize = self.segments.iter().map(|s| s.bits.len()).sum();
        let mut out = Vec::with_capacity(8 + self.segments.len() * 8 + words * 8);
        out.extend_from_slice(&[FILTER_FORMAT, BITS_PER_ID as u8, PROBES as u8, 0]);
        out.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        for segment in &self.segments {
            out.extend_from_slice(&(segment.capacity as u32).to_le_bytes());
            out.extend_from_slice(&(segment.len as u32).to_le_bytes());
            for word in &segment.bits {
                out.extend_from_slice(&word.to_le_bytes());
            }
        }
        Some(out)
    }

    /// Whether [`OperationIds::load`] ran.
    pub(crate) fn loaded(&self) -> bool {
        self.loaded
    }

    /// Adds the keys ([`operation_key`]) of every operation id the file held; from then on
    /// the filter can tell that an id is new.
    pub(crate) fn load(&mut self, keys: impl IntoIterator<Item = u64>) {
        for key in keys {
            self.insert_key(key);
        }
        self.loaded = true;
    }

    /// Adds an id just accepted to the filter.
    pub(crate) fn insert(&mut self, operation_id: &str) {
        self.insert_key(operation_key(operation_id));
    }

    fn insert_key(&mut self, key: u64) {
        if self.full {
            return;
        }
        if self.segments.last().is_none_or(|s| s.len >= s.capacity) {
            let capacity = self
                .segments
                .last()
                .map_or(FIRST_SEGMENT, |s| s.capacity * 2);
            let used: usize = self.segments.iter().map(|s| s.bits.len() * 8).sum();
            if used + capacity * BITS_PER_ID / 8 > MAX_FILTER_BYTES {
                // Full: from now on a miss asks the file.
                self.full = true;
                self.segments = Vec::new();
                return;
            }
            self.segments.push(Segment::new(capacity));
        }
        if let Some(segment) = self.segments.last_mut() {
            segment.insert(key);
        }
    }

    /// Records a commit that became durable, evicting the oldest past the window.
    pub(crate) fn remember(&mut self, operation_id: &str, operation_hash: &str) {
        if self
            .recent
            .insert(operation_id.to_owned(), operation_hash.to_owned())
            .is_none()
        {
            self.order.push_back(operation_id.to_owned());
        }
        while self.order.len() > RECENT_WINDOW {
            if let Some(old) = self.order.pop_front() {
                self.recent.remove(&old);
                self.evictions += 1;
            }
        }
    }

    /// What memory knows of `operation_id` (the accepted tail is the caller's).
    pub(crate) fn known(&self, operation_id: &str) -> Known<'_> {
        if let Some(hash) = self.recent.get(operation_id) {
            return Known::Recent(hash);
        }
        if self.loaded && !self.full {
            let hash = operation_key(operation_id);
            if !self.segments.iter().any(|s| s.contains(hash)) {
                return Known::Absent;
            }
        }
        Known::Unknown
    }

    /// The eviction count (see [`OperationIds::known`] and the cold lookup).
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserted_ids_are_never_absent_and_others_mostly_are() {
        let mut ids = OperationIds::new();
        assert_eq!(ids.known("op-x"), Known::Unknown, "not loaded yet");
        ids.load((0..20_000).map(|i| operation_key(&format!("file-{i}"))));
        for i in 0..20_000 {
            assert_ne!(ids.known(&format!("file-{i}")), Known::Absent);
        }
        for i in 0..50_000 {
            ids.insert(&format!("op-{i}"));
        }
        for i in 0..50_000 {
            assert_ne!(ids.known(&format!("op-{i}")), Known::Absent);
        }
        let absent = (0..10_000)
            .filter(|i| ids.known(&format!("other-{i}")) == Known::Absent)
            .count();
        assert!(
            absent > 9_900,
            "only {absent} of 10000 new ids were known absent"
        );
    }

    #[test]
    fn a_stored_filter_is_restored_with_the_same_answers() {
        let mut ids = OperationIds::new();
        assert_eq!(ids.filter_bytes(), None, "not loaded: not complete");
        ids.load((0..3_000).map(|i| operation_key(&format!("file-{i}"))));
        let bytes = ids.filter_bytes().expect("complete");
        assert_eq!(&bytes[..4], &[FILTER_FORMAT, 16, 7, 0]);
        let mut back = OperationIds::restored(&bytes).expect("restored");
        assert_eq!(
            back.known("file-1"),
            Known::Unknown,
            "keys after it still to come"
        );
        back.load([operation_key("after-0")]);
        for i in 0..3_000 {
            assert_ne!(back.known(&format!("file-{i}")), Known::Absent, "file-{i}");
        }
        assert_ne!(back.known("after-0"), Known::Absent);
        // The same bits: an id the original knows absent, the restored one does too
        // (but for the one key added since, a false positive at most).
        let differ = (0..2_000)
            .map(|i| format!("other-{i}"))
            .filter(|id| (ids.known(id) == Known::Absent) != (back.known(id) == Known::Absent))
            .count();
        assert!(differ <= 1, "{differ} answers differ");
        let empty = OperationIds::restored(&{
            let mut none = OperationIds::new();
            none.load([]);
            none.filter_bytes().expect("empty filter")
        });
        assert!(empty.is_some_and(|e| e.segments.is_empty()));
    }

    #[test]
    fn a_stored_filter_of_another_form_is_refused() {
        let mut ids = OperationIds::new();
        ids.load((0..1_500).map(|i| operation_key(&format!("file-{i}"))));
        let bytes = ids.filter_bytes().expect("complete");
        let refused = |what: &str, bytes: &[u8]| {
            assert!(OperationIds::restored(bytes).is_none(), "{what}");
        };
        refused("empty", &[]);
        refused("cut", &bytes[..bytes.len() - 1]);
        refused("longer", &[&bytes[..], &[0]].concat());
        for (at, what) in [
            (0, "format"),
            (1, "bits per id"),
            (2, "probes"),
            (3, "reserved"),
        ] {
            let mut other = bytes.clone();
            other[at] ^= 0x40;
            refused(what, &other);
        }
        // Segment 0's capacity, then its count over its capacity.
        let mut other = bytes.clone();
        other[8..12].copy_from_slice(&2048u32.to_le_bytes());
        refused("capacity", &other);
        let mut other = bytes.clone();
        other[12..16].copy_from_slice(&1025u32.to_le_bytes());
        refused("count", &other);
        // A segment after one that is not full.
        let mut other = bytes.clone();
        other[12..16].copy_from_slice(&1000u32.to_le_bytes());
        refused("a gap", &other);
        // A count of segments past the bound is refused before anything is allocated.
        let mut other = bytes.clone();
        other[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        refused("too many segments", &other);
        let full = {
            let mut full = OperationIds::new();
            full.load([]);
            full.full = true;
            full
        };
        assert_eq!(full.filter_bytes(), None, "a full filter is not stored");
    }

    #[test]
    fn the_largest_filter_stored_fits_the_form_read_back() {
        let mut ids = OperationIds::new();
        ids.load([]);
        let mut largest = 0;
        for i in 0.. {
            ids.insert(&format!("op-{i}"));
            if ids.full {
                break;
            }
            if ids.segments.last().is_some_and(|s| s.len == s.capacity) {
                largest = ids.filter_bytes().expect("complete").len();
            }
        }
        assert!(largest > MAX_FILTER_BYTES * 9 / 10, "{largest}");
        assert!(largest + 16 <= MAX_FILTER_FORM, "{largest}");
    }

    #[test]
    fn the_filter_stops_at_its_bound_and_then_answers_unknown() {
        let mut ids = OperationIds::new();
        ids.load([]);
        let limit = MAX_FILTER_BYTES * 8 / BITS_PER_ID;
        for i in 0..limit {
            ids.insert(&format!("op-{i}"));
        }
        assert!(ids.full);
        assert!(ids.segments.is_empty());
        assert_eq!(ids.known("never"), Known::Unknown);
    }

    #[test]
    fn the_recent_window_is_bounded_and_counts_evictions() {
        let mut ids = OperationIds::new();
        ids.load([]);
        for i in 0..RECENT_WINDOW + 10 {
            ids.insert(&format!("op-{i}"));
            ids.remember(&format!("op-{i}"), "h");
        }
        assert_eq!(ids.recent.len(), RECENT_WINDOW);
        assert_eq!(ids.evictions(), 10);
        assert_eq!(ids.known("op-0"), Known::Unknown);
        assert_eq!(
            ids.known(&format!("op-{}", RECENT_WINDOW + 9)),
            Known::Recent("h")
        );
    }
}
