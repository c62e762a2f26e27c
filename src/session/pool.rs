//! The write-behind scheduler: a small, process-wide pool of writer threads that run
//! timed drains. Sessions register a deadline; no session owns a thread.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Instant;

/// What the writer threads run: a session's timed drain. The pool knows sessions only
/// through this trait, so it depends on nothing else in the crate.
pub(crate) trait Drain: Send + Sync {
    /// Runs a drain that was scheduled for now (see [`schedule`]).
    fn scheduled_drain(self: Arc<Self>);
}

/// Writer threads in the process, whatever the number of open sessions.
pub const WRITER_THREADS: usize = 2;

struct Job {
    at: Instant,
    order: u64,
    session: Weak<dyn Drain>,
}

impl PartialEq for Job {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Job {}
impl PartialOrd for Job {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Job {
    /// Reversed: the earliest deadline is the heap's top.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

#[derive(Default)]
struct Queue {
    jobs: BinaryHeap<Job>,
    next_order: u64,
}

struct Pool {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The pool and the id of the process that started its threads. A child made by `fork()`
/// inherits it without its threads (its timed drains never ran): the child starts its own,
/// the inherited one left alone.
static POOL: Mutex<Option<(u32, Arc<Pool>)>> = Mutex::new(None);

/// Takes the pool's lock for a `fork()` (`persistence::fork_hold`).
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    Box::new(POOL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// This process's pool, its threads started at first use (see [`POOL`]).
fn pool() -> Arc<Pool> {
    let pid = std::process::id();
    let mut slot = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((owner, pool)) = slot.as_ref()
        && *owner == pid
    {
        return Arc::clone(pool);
    }
    let pool = Arc::new(Pool {
        queue: Mutex::new(Queue::default()),
        wake: Condvar::new(),
    });
    for i in 0..WRITER_THREADS {
        let p = Arc::clone(&pool);
        // A pool that cannot start threads still works through explicit flushes.
        let _ = std::thread::Builder::new()
            .name(format!("session-store-writer-{i}"))
            .spawn(move || p.run());
    }
    // The parent's pool holds jobs of sessions this process must not drain: keep it as is.
    std::mem::forget(slot.replace((pid, Arc::clone(&pool))));
    pool
}

impl Pool {
    fn run(&self) {
        loop {
            let job = {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    let now = Instant::now();
                    match q.jobs.peek().map(|j| j.at) {
                        Some(at) if at <= now => break q.jobs.pop(),
                        Some(at) => {
                            q = self
                                .wake
                                .wait_timeout(q, at - now)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                        }
                        None => q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner()),
                    }
                }
            };
            if let Some(session) = job.and_then(|j| j.session.upgrade()) {
                session.scheduled_drain();
            }
        }
    }
}

/// Asks a writer thread to drain `session` at `at`.
pub(crate) fn schedule(session: Weak<dyn Drain>, at: Instant) {
    let pool = pool();
    let mut q = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
    let order = q.next_order;
    q.next_order += 1;
    q.jobs.push(Job { at, order, session });
    pool.wake.notify_one();
}
