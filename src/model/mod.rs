//! Pure data and pure functions: ids, events, batches, commits, messages, the event kind
//! vocabulary, the payload schemas, the projection fold and the operation hash. No I/O.

pub(crate) mod event;
pub(crate) mod header;
pub(crate) mod ids;
pub(crate) mod json_scan;
pub(crate) mod kind;
pub(crate) mod message;
pub(crate) mod payload;
pub(crate) mod projection;
pub(crate) mod search;
pub(crate) mod transcript_index;
pub(crate) mod usage;

pub use event::{Batch, Commit, ContentRef, Event};
pub use ids::{SessionId, SessionRef};
pub use kind::{CLOSURE_KINDS, PROJECTION_KINDS, TERMINAL_TURN_STATUSES, TURN_IN_PROGRESS};
pub use message::Message;
pub use payload::{RecoveryStatus, Todo};
pub use projection::{PreparedFold, Projection, TurnBoundary};
pub use search::Snippet;
pub use usage::{Cost, MAX_COST_SCALE, Usage, UsageTotals};
