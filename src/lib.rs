#![doc = include_str!("../README.md")]
//!
//! ## Cargo features
//!
//! - `cli` (default): the `session-store` command-line binary and its dependencies
//!   (`clap`, `indicatif`, and for `serve` `axum`, `maud`, `hyper`'s HTTP/1 server and
//!   tokio's networking and signals), and the module `baseline`: the raw-SQLite baselines
//!   its benchmarks measure the library against (the `append` bench needs it). A host that embeds the library turns it off:
//!   `session-store = { version = "0.1", default-features = false }`.
//!
//! ## Where things are
//!
//! The crate root holds what a host calls and the records it gets back: [`Root`] and
//! [`Session`] for storage, [`SessionReader`] for reading, [`Service`] for the async host
//! API, and [`Error`]. [`model`] holds the pure data (events, messages, the projection and
//! its fold) and [`format`](mod@format) the on-disk constants (file names, identity pragmas, size
//! limits). Records the library returns are `#[non_exhaustive]`: they may gain fields in a
//! minor release, so build inputs with their constructors (`Batch::new`, `Event::new`,
//! `CreateOptions::with_id`, ...) rather than struct literals. So are the enums that may
//! gain variants ([`Error`], [`RuntimePhase`], [`PersistenceStatus`], [`ForkPoint`],
//! [`ListSort`], [`Origin`], [`Durability`], [`CheckpointPolicy`]): a `match` on one needs
//! a `_` arm.
#![deny(missing_docs)]
#![deny(unreachable_pub)]
#![deny(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

#[cfg(doctest)]
mod api_contract;
#[cfg(feature = "cli")]
pub mod baseline;
mod cancel;
mod error;
pub mod format;
pub mod model;
mod persistence;
mod service;
mod session;
mod store;

pub use cancel::CancelToken;
pub use error::{Error, Result, SqliteError, WriterOwner, naming_file_size_limit, quoted, utc};
pub use model::header::{Header, Origin, absolute_cwd};
pub use model::payload::{is_invisible, json_error_reason};
pub use model::{
    Batch, CLOSURE_KINDS, Commit, ContentRef, Event, Message, PROJECTION_KINDS, Projection,
    RecoveryStatus, SessionId, SessionRef, Snippet, TERMINAL_TURN_STATUSES, Todo, TurnBoundary,
};
pub use model::{Cost, MAX_COST_SCALE, Usage, UsageTotals};
pub use persistence::{BlobStats, KindStats, SessionStats, TableBytes};
pub use persistence::{
    CatalogEntry, CatalogTotals, CheckpointPolicy, CreateOptions, ExportReport, FileIdentity,
    ForkPoint, ImportOptions, ListFilter, ListSort, Listing, MAX_SEARCH_LIMIT, RebuildReport,
    ReplayReport, Root, Scratch, SearchOptions, SessionInfo, SkippedSession, StoreOptions,
    Verified, catalog_sequences, catalog_session_ids, hold_for_fork, release_after_fork,
    replay_file, verify_file,
};
pub use persistence::{GcDeleted, GcKept, GcOptions, GcReport};
pub use service::{
    CancelReceipt, ClientBinding, EventPage, Execution, HistoryPage, MAX_HISTORY_LIMIT,
    MAX_LIST_LIMIT, MigrationRecord, ObserveResult, PersistentMessage, PreparedRuntime, Runtime,
    RuntimePhase, RuntimeSnapshot, SearchHit, SearchPage, Service, SessionPage, SessionQuery,
    SessionSummary,
};
pub use session::live::{PersistenceStatus, Session, SessionSnapshot};
pub use session::pool::WRITER_THREADS;
pub use store::lock::close_inherited_locks;
pub use store::read::{DependentFork, LineageEntry};
pub use store::reader::{MessageText, SessionReader, TranscriptEntry};
pub use store::schema::Durability;
