//! The on-disk format: identity of a session file, the layout of a root, and the limits
//! that decide where a payload's bytes are stored.
//!
//! A host needs these to recognise the files (`PRAGMA application_id`, `user_version`),
//! to back up or replicate a root (which names are sessions, which are the library's own
//! dot-folders) and to choose a [`StoreOptions::with_inline_threshold`]. Everything else
//! about the layout is private: read and write through [`Root`] and [`SessionReader`].
//! `docs/ARCHITECTURE.md` (§2, "On disk") describes what each value guards.
//!
//! [`StoreOptions::with_inline_threshold`]: crate::StoreOptions::with_inline_threshold
//! [`Root`]: crate::Root
//! [`SessionReader`]: crate::SessionReader

/// `PRAGMA application_id` of a session file ("SeSt"). Opening a file with another value
/// fails with [`Error::Corrupt`](crate::Error::Corrupt).
pub const APPLICATION_ID: i32 = 0x5365_5374;

/// The codec name written in the header of session files of this format
/// ([`Header::codec`](crate::Header::codec)).
pub const CODEC: &str = "session-store/sqlite-v1";

/// The schema version (`PRAGMA user_version`) this build writes; it reads and migrates
/// every version from 1 up to this one, and refuses a newer file with
/// [`Error::UnsupportedVersion`](crate::Error::UnsupportedVersion).
pub const SCHEMA_VERSION: i64 = 9;

/// The session file inside a session folder (`<root>/<session id>/session.sqlite`).
pub const SESSION_FILE: &str = "session.sqlite";

/// The write-ahead log beside [`SESSION_FILE`] while the file is in WAL mode (part of the
/// session's content until it is checkpointed: copy or measure it with the file).
pub const WAL_FILE: &str = "session.sqlite-wal";

/// The folder of the catalog in a root (a dot-name: never a session id).
pub const CATALOG_DIR: &str = ".catalog";

/// The catalog file in [`CATALOG_DIR`]. The catalog is derived data: it is rebuilt from
/// the session files when missing.
pub const CATALOG_FILE: &str = "catalog.sqlite";

/// The folder under a root where new sessions are built before they are published (a
/// dot-name: never a session id). A copy or replica of a root leaves it out.
pub const STAGING_DIR: &str = ".staging";

/// Payloads longer than this (64 KiB) are stored once, whole, in the session file's
/// `blobs` table, whatever the inline threshold.
pub const INLINE_PAYLOAD_LIMIT: usize = 64 * 1024;

/// The largest payload an event may have (900,000,000 bytes, below SQLite's default
/// 1,000,000,000-byte value limit even when it does not compress): an append of a longer
/// one is refused ([`Error::InvalidInput`](crate::Error::InvalidInput)), and no reader
/// decompresses a blob to more than this, whatever its row says (a bound on zstd bombs).
pub const MAX_PAYLOAD_BYTES: u64 = 900_000_000;

/// The longest operation id, turn id or event id a new operation may give (1,024 bytes of
/// UTF-8): each is stored, hashed and printed with every commit or event, and a host that
/// passes untrusted ids on had nothing bounding them (a 1 MiB operation id was stored).
pub const MAX_ID_BYTES: usize = 1024;

/// The longest event kind a new operation may give (256 bytes of UTF-8).
pub const MAX_KIND_BYTES: usize = 256;

/// How deep objects and arrays may nest in a payload an append takes (512): a deeper one
/// is refused ([`Error::InvalidInput`](crate::Error::InvalidInput)). The store's own
/// readers follow any depth, but Python's `json.loads` stops at its recursion limit (about
/// 990 levels by default, fewer in a deep call stack), and a session holding one such
/// payload could not be read from Python at all. A payload stored before this limit still
/// reads where it can.
pub const MAX_PAYLOAD_NESTING: usize = 512;

/// The smallest inline threshold a store accepts: a shorter string would not shrink.
pub const MIN_INLINE_THRESHOLD: usize = 128;

/// The largest inline threshold a store accepts: payloads over 64 KiB
/// ([`INLINE_PAYLOAD_LIMIT`]) are stored as one blob anyway.
pub const MAX_INLINE_THRESHOLD: usize = INLINE_PAYLOAD_LIMIT;

/// The default inline threshold (1 KiB): string values of a payload longer than this are
/// stored once as content parts; see `docs/ARCHITECTURE.md` for the measurement.
pub const DEFAULT_INLINE_THRESHOLD: usize = 1024;
