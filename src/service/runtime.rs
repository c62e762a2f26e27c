//! A runtime: the one live instance of a session in a service, with its execution
//! binding, cancellation and phase.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::model::ids::random_hex;
use crate::model::{Batch, CLOSURE_KINDS, Commit, SessionRef};
use crate::session::live::{Session, SessionSnapshot};

/// What a runtime is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RuntimePhase {
    /// Nothing is running.
    Idle,
    /// An execution is running.
    Running,
    /// A cancel was delivered and the execution has not finished yet.
    Cancelling,
    /// The execution lost its authority; the host must decide how to continue.
    RecoveryRequired,
    /// The runtime was closed (or is closing: [`Service::close`](crate::Service::close)
    /// has begun and no execution binds any more).
    Closed,
}

impl RuntimePhase {
    /// Running, cancelling or recovery-required: `close` refuses.
    pub fn is_busy(self) -> bool {
        matches!(
            self,
            RuntimePhase::Running | RuntimePhase::Cancelling | RuntimePhase::RecoveryRequired
        )
    }
}

/// A runtime's state with its session's.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct RuntimeSnapshot {
    /// The session.
    pub session_ref: SessionRef,
    /// Random id of this runtime instance.
    pub runtime_epoch: String,
    /// Bumped on every phase or activity change and on cancel.
    pub activity_revision: u64,
    /// The phase.
    pub phase: RuntimePhase,
    /// Name of the current activity (e.g. `model`, `tool`).
    pub activity: Option<String>,
    /// The session's snapshot.
    pub session: SessionSnapshot,
}

struct State {
    phase: RuntimePhase,
    activity: Option<String>,
    revision: u64,
    execution: Option<(u64, CancelToken)>,
    next_generation: u64,
}

pub(crate) struct RuntimeInner {
    session_ref: SessionRef,
    session: Session,
    epoch: String,
    state: Mutex<State>,
}

/// One live session instance owned by a service (cheap to clone; clones are the same
/// instance, compare with `==`).
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

impl PartialEq for Runtime {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
impl Eq for Runtime {}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("ref", &self.inner.session_ref)
            .field("epoch", &self.inner.epoch)
            .finish()
    }
}

/// Proof of a bound execution: its cancellation token and its commit authority. Dropped,
/// it ends as [`Execution::finish`] ends it.
#[derive(Debug)]
#[must_use = "an execution dropped at once has ended: the runtime is idle again"]
pub struct Execution {
    runtime: Runtime,
    generation: u64,
    token: CancelToken,
}

/// What `cancel_session` did.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct CancelReceipt {
    /// The session.
    pub session_ref: SessionRef,
    /// Always true: cancelling is idempotent.
    pub accepted: bool,
    /// The runtime instance, if one is attached.
    pub runtime_epoch: Option<String>,
    /// Its activity revision after the cancel.
    pub activity_revision: u64,
    /// Its phase after the cancel (`idle` without a runtime).
    pub phase: RuntimePhase,
}

impl Runtime {
    pub(crate) fn new(session_ref: SessionRef, session: Session) -> Runtime {
        Runtime {
            inner: Arc::new(RuntimeInner {
                session_ref,
                session,
                epoch: random_hex(),
                state: Mutex::new(State {
                    phase: RuntimePhase::Idle,
                    activity: None,
                    revision: 1,
                    execution: None,
                    next_generation: 1,
                }),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session this runtime serves.
    pub fn session_ref(&self) -> &SessionRef {
        &self.inner.session_ref
    }

    /// The live session (append, flush, snapshot).
    pub fn session(&self) -> &Session {
        &self.inner.session
    }

    /// The current phase.
    pub fn phase(&self) -> RuntimePhase {
        self.state().phase
    }

    /// Full snapshot: runtime state and the session's snapshot.
    pub fn snapshot(&self) -> RuntimeSnapshot {
        let (phase, activity, revision) = {
            let s = self.state();
            (s.phase, s.activity.clone(), s.revision)
        };
        RuntimeSnapshot {
            session_ref: self.inner.session_ref.clone(),
            runtime_epoch: self.inner.epoch.clone(),
            activity_revision: revision,
            phase,
            activity,
            session: self.inner.session.snapshot(),
        }
    }

    /// The session id, as the runtime's errors name it.
    fn id(&self) -> String {
        self.inner.session_ref.session_id.to_string()
    }

    /// Binds an execution (`activity` names it); only from `idle`.
    ///
    /// # Errors
    /// [`Error::RuntimeBusy`] when something runs; [`Error::RecoveryRequired`] while
    /// recovery is required; [`Error::Closed`] after close (of the runtime, or of its
    /// session through [`Runtime::session`]).
    pub fn bind_execution(&self, activity: &str) -> Result<Execution> {
        let mut s = self.state();
        match s.phase {
            RuntimePhase::Idle => {}
            RuntimePhase::RecoveryRequired => return Err(Error::RecoveryRequired(self.id())),
            RuntimePhase::Closed => return Err(Error::Closed),
            _ => return Err(Error::RuntimeBusy(self.id())),
        }
        // Its session closed through `session()`: no batch of the execution could be
        // accepted (it was bound, `Running`, and each append answered `Closed`).
        if self.inner.session.close_began() {
            return Err(Error::Closed);
        }
        let generation = s.next_generation;
        s.next_generation += 1;
        let token = CancelToken::new();
        s.execution = Some((generation, token.clone()));
        s.phase = RuntimePhase::Running;
        s.activity = Some(activity.to_owned());
        s.revision += 1;
        Ok(Execution {
            runtime: self.clone(),
            generation,
            token,
        })
    }

    /// Delivers a cancel to the bound execution. Returns whether there was one running.
    /// When it returns, the execution's business batches are refused: one it was
    /// appending meanwhile is either accepted already or refused.
    pub fn cancel(&self) -> bool {
        {
            let mut s = self.state();
            let Some((_, token)) = s.execution.as_ref() else {
                return false;
            };
            if s.phase != RuntimePhase::Running {
                return false;
            }
            token.cancel();
            s.phase = RuntimePhase::Cancelling;
            s.revision += 1;
        }
        // Waits out an append that passed its gate before the token was cancelled (taken
        // after the runtime's state lock is let go: the gate runs under the session's).
        self.inner.session.barrier();
        true
    }

    /// Revokes the execution's authority: the runtime stays `recovery_required` until the
    /// host calls [`Runtime::resolve_recovery`]. No-op on a closed runtime.
    pub fn require_recovery(&self, activity: &str) {
        {
            let mut s = self.state();
            if s.phase == RuntimePhase::Closed {
                return;
            }
            if let Some((_, token)) = s.execution.take() {
                token.cancel();
            }
            s.phase = RuntimePhase::RecoveryRequired;
            s.activity = Some(activity.to_owned());
            s.revision += 1;
        }
        // As in `cancel`: no business batch of the revoked execution is accepted after.
        self.inner.session.barrier();
    }

    /// The host's explicit decision to leave `recovery_required` for `idle`.
    pub fn resolve_recovery(&self) {
        let mut s = self.state();
        if s.phase == RuntimePhase::RecoveryRequired {
            s.phase = RuntimePhase::Idle;
            s.activity = None;
            s.revision += 1;
        }
    }

    pub(crate) fn epoch(&self) -> &str {
        &self.inner.epoch
    }

    pub(crate) fn revision(&self) -> u64 {
        self.state().revision
    }

    /// Starts a close: unless an execution runs or recovery is required (then it returns
    /// false and changes nothing), the runtime is `closed` from now on, so no execution
    /// binds while the close drains. [`Runtime::abort_close`] undoes it.
    pub(crate) fn begin_close(&self) -> bool {
        let mut s = self.state();
        if s.phase.is_busy() {
            return false;
        }
        if s.phase != RuntimePhase::Closed {
            s.phase = RuntimePhase::Closed;
            s.revision += 1;
        }
        true
    }

    /// A close that failed: the runtime is `idle` again and takes executions.
    pub(crate) fn abort_close(&self) {
        let mut s = self.state();
        if s.phase == RuntimePhase::Closed {
            s.phase = RuntimePhase::Idle;
            s.revision += 1;
        }
    }

    pub(crate) fn mark_closed(&self) {
        let mut s = self.state();
        s.phase = RuntimePhase::Closed;
        s.execution = None;
        s.revision += 1;
    }
}

impl Execution {
    /// Fires when the execution is cancelled (or its authority revoked).
    pub fn cancel_token(&self) -> &CancelToken {
        &self.token
    }

    /// Appends through this execution's authority: once it is cancelled or replaced, only
    /// batches made of closure kinds ([`CLOSURE_KINDS`]) are accepted. A business batch
    /// racing a cancel is accepted before [`Runtime::cancel`] (or
    /// [`Service::cancel_session`](crate::Service::cancel_session)) returns, or refused.
    /// Synchronous, as [`Session::append`]: accepted in memory, it may wait for (and make)
    /// a write when the session's write queue is over its budget.
    ///
    /// # Errors
    /// [`Error::StaleExecution`] for a late business result; as [`Session::append`].
    pub fn append(&self, batch: Batch) -> Result<Arc<Commit>> {
        let current = {
            let s = self.runtime.state();
            s.execution
                .as_ref()
                .is_some_and(|(g, _)| *g == self.generation)
                && !self.token.is_cancelled()
        };
        let closure = batch
            .events
            .iter()
            .all(|e| CLOSURE_KINDS.contains(&crate::model::event::trim_name(&e.kind)));
        if closure {
            return self.runtime.session().append(batch);
        }
        if !current {
            return Err(Error::StaleExecution(self.runtime.id()));
        }
        // Checked again as the batch is sequenced: a cancel (or revoked authority) that
        // returned before then refuses it (`Runtime::cancel` waits for the check).
        let token = &self.token;
        self.runtime.session().append_gated(batch, &|| {
            if token.is_cancelled() {
                Err(Error::StaleExecution(self.runtime.id()))
            } else {
                Ok(())
            }
        })
    }

    /// Ends the execution: the runtime returns to `idle` (unless recovery is required).
    /// Dropping the execution ends it the same way.
    pub fn finish(self) {
        drop(self);
    }

    /// Ends the execution if it is still the runtime's current one.
    fn end(&self) {
        let mut s = self.runtime.state();
        if s.execution
            .as_ref()
            .is_some_and(|(g, _)| *g == self.generation)
        {
            s.execution = None;
            if matches!(s.phase, RuntimePhase::Running | RuntimePhase::Cancelling) {
                s.phase = RuntimePhase::Idle;
                s.activity = None;
            }
            s.revision += 1;
        }
    }
}

impl Drop for Execution {
    /// An execution dropped without [`Execution::finish`] (its task panicked or returned
    /// early) ends as `finish` ends it: otherwise the runtime stayed `running` for good,
    /// refusing every later execution and every close with [`Error::RuntimeBusy`].
    fn drop(&mut self) {
        self.end();
    }
}
