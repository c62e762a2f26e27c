//! A cancellation token shared by blocking waits and async tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A cloneable "stop waiting" signal.
///
/// ```
/// use session_store::CancelToken;
/// let token = CancelToken::new();
/// let seen_by_task = token.clone();
/// token.cancel();
/// assert!(seen_by_task.is_cancelled());
/// ```
#[derive(Clone, Debug, Default)]
pub struct CancelToken {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    cancelled: AtomicBool,
    /// When the token counts as cancelled by itself ([`CancelToken::after`]).
    deadline: Option<Instant>,
    notify: Notify,
}

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// A token that is cancelled once `wait` has passed (or earlier by
    /// [`CancelToken::cancel`]): a bounded wait, such as [`crate::Root::delete`]'s for a
    /// writer, without a timer thread. The deadline is checked by
    /// [`CancelToken::is_cancelled`], which blocking waits poll; [`CancelToken::cancelled`]
    /// also resolves at it, on tokio's timer (a runtime built with it enabled).
    ///
    /// ```
    /// use std::time::Duration;
    /// use session_store::CancelToken;
    /// assert!(!CancelToken::after(Duration::from_secs(3600)).is_cancelled());
    /// assert!(CancelToken::after(Duration::ZERO).is_cancelled());
    /// ```
    pub fn after(wait: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                // A wait too long to add to the clock is no deadline at all.
                deadline: Instant::now().checked_add(wait),
                ..Inner::default()
            }),
        }
    }

    /// Cancels every clone of this token and wakes their waiters.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    /// Whether [`CancelToken::cancel`] was called or the token's deadline
    /// ([`CancelToken::after`]) has passed.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
            || self.inner.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Resolves once the token is cancelled.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.is_cancelled() {
                return;
            }
            match self.inner.deadline {
                Some(deadline) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(deadline.into()) => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}
