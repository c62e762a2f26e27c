#![doc = include_str!("../README.md")]
//!
//! ## Cargo features
//!
//! - `cli` (default): the `session-store` command-line binary and its dependencies
//!   (`clap`, `indicatif`). A host that embeds the library turns it off:
//!   `session-store = { version = "0.1", default-features = false }`.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod cancel;
mod error;
pub mod model;
mod persistence;
mod service;
mod session;
mod store;

pub use cancel::CancelToken;
pub use error::{Error, Result, WriterOwner, quoted};
pub use model::header::{Header, Origin};
pub use model::{
    Batch, CLOSURE_KINDS, Commit, ContentRef, Event, INLINE_PAYLOAD_LIMIT, Message,
    PROJECTION_KINDS, Projection, RecoveryStatus, SessionId, SessionRef, TERMINAL_TURN_STATUSES,
    Todo, TurnBoundary,
};
pub use model::{Cost, MAX_COST_SCALE, Usage, UsageTotals};
pub use persistence::{BlobStats, KindStats, SessionStats, TableBytes};
pub use persistence::{
    CatalogEntry, CheckpointPolicy, CreateOptions, DEFAULT_INLINE_THRESHOLD, ExportReport,
    ForkPoint, ImportOptions, ListFilter, ListSort, Listing, MAX_INLINE_THRESHOLD,
    MIN_INLINE_THRESHOLD, RebuildReport, Replay, Root, Scratch, SessionInfo, SkippedSession,
    StoreOptions, Verified, replay, verify,
};
pub use persistence::{GcDeleted, GcKept, GcOptions, GcReport};
pub use service::{
    CancelReceipt, ClientBinding, EventPage, Execution, HistoryPage, MigrationRecord,
    ObserveResult, PersistentMessage, PreparedRuntime, Query, Runtime, RuntimePhase,
    RuntimeSnapshot, Service, SessionPage, SessionSummary,
};
pub use session::live::{PersistenceStatus, Session, SessionSnapshot};
pub use session::pool::WRITER_THREADS;
pub use store::read::{Dependent, LineageEntry};
pub use store::reader::SessionReader;
pub use store::schema::{APPLICATION_ID, CODEC, Durability, SCHEMA_VERSION};
