//! A caller that may stop waiting. A call that makes a session (`create`, `prepare_create`,
//! `fork`, `rewind`, `import`) runs on a task of its own, so that a caller that stops
//! waiting (its future dropped by a timeout or a `select!`, its task aborted) does not
//! stop it half-way; without more, the session was then made and published under an id
//! the caller never learnt. [`Caller`] lives in the caller's future and [`Watch`] in the
//! task: the task makes nothing once the caller is gone, and hands over what it made only
//! while the caller still waits; what it made for a caller gone is deleted again.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::model::SessionRef;
use crate::service::Service;

/// How long the delete of a session made for a caller gone waits for a writer another
/// process took meanwhile (then the session is left to it).
const ABANDONED_WAIT: Duration = Duration::from_secs(10);

/// What the task made and the caller has not taken yet.
#[derive(Default)]
pub(crate) struct Handoff {
    /// The caller took the call's result: nothing is undone any more.
    taken: bool,
    /// A session made and published for the caller, deleted if the caller goes now.
    made: Option<SessionRef>,
}

struct Shared {
    /// Cancelled when the caller stops waiting before it took the result.
    gone: CancelToken,
    handoff: Mutex<Handoff>,
}

/// The caller's end, held by the caller's future; dropped before [`Caller::take`], the
/// caller is gone.
pub(crate) struct Caller {
    shared: Arc<Shared>,
    service: Service,
    /// Whether the call runs on to the end without its caller: a session whose id the
    /// caller gave it stays (the caller can name it, and a later open gets it).
    named: bool,
}

/// The task's end.
#[derive(Clone)]
pub(crate) struct Watch {
    shared: Arc<Shared>,
}

impl Caller {
    /// A caller; with `named` (it gave the id of the session the call makes), the call
    /// runs on to the end without it.
    pub(crate) fn new(service: &Service, named: bool) -> Caller {
        Caller {
            named,
            shared: Arc::new(Shared {
                gone: CancelToken::new(),
                handoff: Mutex::new(Handoff::default()),
            }),
            service: service.clone(),
        }
    }

    /// The task's end of this call.
    pub(crate) fn watch(&self) -> Watch {
        Watch {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The caller takes the call's result: what it made stays.
    pub(crate) fn take<T>(self, result: T) -> T {
        self.shared.lock().taken = true;
        result
    }
}

impl Drop for Caller {
    /// Dropped before [`Caller::take`]: the caller is gone. The task stops at its next
    /// check, and a session it published already is deleted (its delete refuses a
    /// runtime someone bound or runs an execution on meanwhile: that one stays).
    fn drop(&mut self) {
        let made = {
            let mut handoff = self.shared.lock();
            if handoff.taken || self.named {
                return;
            }
            self.shared.gone.cancel();
            handoff.made.take()
        };
        // On the service's own runtime: the caller's may be the one being dropped, which
        // would drop the delete with it.
        let (Some(r), Ok(tasks)) = (made, self.service.tasks()) else {
            return;
        };
        let service = self.service.clone();
        tasks.spawn(async move {
            let _ = service.delete(&r, &abandoned_wait()).await;
        });
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Handoff> {
        self.handoff.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Watch {
    /// Cancelled once the caller is gone: blocking work checks it before it starts and
    /// at its safe points.
    pub(crate) fn gone(&self) -> &CancelToken {
        &self.shared.gone
    }

    /// `f`, or [`Error::Cancelled`] without running it when the caller is gone by the
    /// time it would start (on a blocking thread, after a wait for one).
    pub(crate) fn unless_gone<T, F: FnOnce() -> Result<T>>(
        &self,
        f: F,
    ) -> impl FnOnce() -> Result<T> + use<T, F> {
        let gone = self.shared.gone.clone();
        move || {
            if gone.is_cancelled() {
                return Err(Error::Cancelled);
            }
            f()
        }
    }

    /// The hand-over, held while the task publishes what it made: the caller cannot go
    /// in between. `None` when the caller is gone already.
    pub(crate) fn hold(&self) -> Option<MutexGuard<'_, Handoff>> {
        let handoff = self.shared.lock();
        (!self.shared.gone.is_cancelled()).then_some(handoff)
    }
}

/// The cancel token of a delete of what was made for a caller gone: it waits
/// [`ABANDONED_WAIT`] at most for a writer another process took meanwhile.
pub(crate) fn abandoned_wait() -> CancelToken {
    CancelToken::after(ABANDONED_WAIT)
}

impl Handoff {
    /// `r` was published for the caller: deleted if the caller goes before it takes it.
    pub(crate) fn made(&mut self, r: &SessionRef) {
        self.made = Some(r.clone());
    }
}
