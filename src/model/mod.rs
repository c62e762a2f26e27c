//! Pure data and pure functions: ids, events, batches, commits, messages, the projection
//! fold and the operation hash. No I/O.

pub(crate) mod event;
pub(crate) mod header;
pub(crate) mod ids;
pub(crate) mod message;
pub(crate) mod projection;
pub(crate) mod search;
pub(crate) mod transcript_index;

pub use event::{Batch, Commit, ContentRef, Event, INLINE_PAYLOAD_LIMIT};
pub use ids::{SessionId, SessionRef};
pub use message::Message;
pub use projection::{
    PROJECTION_KINDS, PreparedFold, Projection, RecoveryStatus, TERMINAL_TURN_STATUSES,
    TURN_IN_PROGRESS, Todo, TurnBoundary,
};
pub use search::Snippet;
