//! The public API as a host crate sees it, checked when rustdoc runs the doctests (this
//! module is compiled for nothing else): records the library returns and enums that may
//! grow are `#[non_exhaustive]`, so a host cannot build one with a struct expression or
//! match one without a `_` arm, and a minor release may add fields and variants (the crate
//! docs promise it). Each `compile_fail` block below compiles without the attribute.
//!
//! The handles a host keeps (in an axum state, across tokio tasks) and the error are
//! `Send + Sync + 'static` and `Debug`:
//!
//! ```
//! fn host<T: Send + Sync + std::fmt::Debug + 'static>() {}
//! use session_store::*;
//! host::<Root>();
//! host::<Session>();
//! host::<SessionReader>();
//! host::<Service>();
//! host::<Runtime>();
//! host::<SessionQuery>();
//! host::<Execution>();
//! host::<ClientBinding>();
//! host::<PreparedRuntime>();
//! host::<CancelToken>();
//! host::<Error>();
//! let _: Box<dyn std::error::Error + Send + Sync> = Box::new(Error::Cancelled);
//! ```
//!
//! The states a host shows or sends on (a UI, another process) read back from their JSON
//! and key sets and maps; a session id is looked up by its text:
//!
//! ```
//! use session_store::{PersistenceStatus, RuntimePhase, SessionId};
//! let phase: RuntimePhase = serde_json::from_str(r#""recovery_required""#).unwrap();
//! assert_eq!(phase, RuntimePhase::RecoveryRequired);
//! assert_eq!(serde_json::to_string(&phase).unwrap(), r#""recovery_required""#);
//! let seen = std::collections::HashSet::from([phase, RuntimePhase::Idle]);
//! assert!(seen.contains(&RuntimePhase::Idle));
//! let statuses = std::collections::HashSet::from([PersistenceStatus::Pending]);
//! assert!(statuses.contains(&PersistenceStatus::Pending));
//! let titles = std::collections::HashMap::from([(SessionId::try_from("chat")?, "Hi")]);
//! assert_eq!(titles.get("chat"), Some(&"Hi"));
//! # Ok::<(), session_store::Error>(())
//! ```
//!
//! ```compile_fail,E0639
//! fn copy(x: session_store::Usage) -> session_store::Usage {
//!     session_store::Usage { ..x }
//! }
//! ```
//!
//! ```compile_fail,E0639
//! fn copy(x: session_store::UsageTotals) -> session_store::UsageTotals {
//!     session_store::UsageTotals { ..x }
//! }
//! ```
//!
//! ```compile_fail,E0639
//! fn copy(x: session_store::Snippet) -> session_store::Snippet {
//!     session_store::Snippet { ..x }
//! }
//! ```
//!
//! ```compile_fail,E0639
//! fn copy(x: session_store::SearchHit) -> session_store::SearchHit {
//!     session_store::SearchHit { ..x }
//! }
//! ```
//!
//! ```compile_fail,E0639
//! fn copy(x: session_store::SearchPage) -> session_store::SearchPage {
//!     session_store::SearchPage { ..x }
//! }
//! ```
//!
//! ```compile_fail,E0639
//! fn copy(x: session_store::GcDeleted) -> session_store::GcDeleted {
//!     session_store::GcDeleted { ..x }
//! }
//! ```
//!
//! ```compile_fail,E0639
//! fn copy(x: session_store::GcKept) -> session_store::GcKept {
//!     session_store::GcKept { ..x }
//! }
//! ```
//!
//! ```compile_fail,E0639
//! fn copy(x: session_store::GcReport) -> session_store::GcReport {
//!     session_store::GcReport { ..x }
//! }
//! ```
//!
//! ```compile_fail,E0004
//! fn name(x: session_store::RuntimePhase) -> u8 {
//!     match x {
//!         session_store::RuntimePhase::Idle | session_store::RuntimePhase::Running | session_store::RuntimePhase::Cancelling | session_store::RuntimePhase::RecoveryRequired | session_store::RuntimePhase::Closed => 0,
//!     }
//! }
//! ```
//!
//! ```compile_fail,E0004
//! fn name(x: session_store::PersistenceStatus) -> u8 {
//!     match x {
//!         session_store::PersistenceStatus::Ready | session_store::PersistenceStatus::Pending | session_store::PersistenceStatus::Failed | session_store::PersistenceStatus::Uncertain => 0,
//!     }
//! }
//! ```
//!
//! ```compile_fail,E0004
//! fn name(x: session_store::ListSort) -> u8 {
//!     match x {
//!         session_store::ListSort::Id | session_store::ListSort::Updated | session_store::ListSort::Created => 0,
//!     }
//! }
//! ```
//!
//! ```compile_fail,E0004
//! fn name(x: session_store::ForkPoint) -> u8 {
//!     match x {
//!         session_store::ForkPoint::AfterTurn(_) | session_store::ForkPoint::BeforeTurn(_) => 0,
//!     }
//! }
//! ```
//!
//! A [`ClientBinding`](crate::ClientBinding) or an [`Execution`](crate::Execution) dropped
//! as soon as it is made lets go at once (the runtime can be closed under the client; the
//! execution has ended), so both are `#[must_use]`: an open or bind whose result is not
//! kept warns (an error here). Each block compiles without the `deny`.
//!
//! ```compile_fail
//! #![deny(unused_must_use)]
//! async fn open(s: &session_store::Service, r: &session_store::SessionRef) -> session_store::Result<()> {
//!     s.open(r).await?;
//!     Ok(())
//! }
//! ```
//!
//! ```compile_fail
//! #![deny(unused_must_use)]
//! fn bind(runtime: &session_store::Runtime) -> session_store::Result<()> {
//!     runtime.bind_execution("model")?;
//!     Ok(())
//! }
//! ```
