//! Values each process makes for itself. A child made by `os.fork()` holds copies of its
//! parent's objects, and of their locks as they were at the fork: a lock another thread
//! of the parent held then stays locked in the child for good (that thread is not there),
//! and the child's first call that took it waited for ever (a read through a `Root` the
//! child inherited hung in about one fork in a thousand, with three threads of the parent
//! reading). A [`PerProcess`] value is never shared across a fork: the child makes its own
//! at its first use, locks included, and leaves its parent's copy alone (never used, never
//! dropped: it holds the parent's connections and writer state).

use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A value of type `T` made anew (by `T::default()`) in each process that uses it.
pub struct PerProcess<T> {
    /// The value of the process that made it last, or null before the first use.
    current: AtomicPtr<Made<T>>,
    /// Owns a `Made<T>` (and so is `Send`/`Sync` only as the impls below say).
    _owns: PhantomData<*mut Made<T>>,
}

/// A value and the id of the process that made it.
struct Made<T> {
    pid: u32,
    value: T,
}

// SAFETY: a `PerProcess<T>` owns its `T` (made and dropped by whichever thread uses or drops
// it), and `get` shares `&T` between threads: as for a `Mutex`-free container of `T`.
unsafe impl<T: Send> Send for PerProcess<T> {}
// SAFETY: as above; `&PerProcess<T>` may make a `T` on one thread and drop a surplus one
// on it, and hands out `&T` to every thread.
unsafe impl<T: Send + Sync> Sync for PerProcess<T> {}

impl<T> PerProcess<T> {
    /// A value made at its first use ([`get`](Self::get)).
    pub const fn new() -> PerProcess<T> {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// A value `value`, this process's.
    pub fn with(value: T) -> PerProcess<T> {
        let made = Box::into_raw(Box::new(Made {
            pid: std::process::id(),
            value,
        }));
        PerProcess {
            current: AtomicPtr::new(made),
            _owns: PhantomData,
        }
    }
}

impl<T: Default> PerProcess<T> {
    /// This process's value, made by `T::default()` at its first use in this process. No
    /// lock is taken: a value made by another process is replaced (and left alone); of two
    /// threads making one at once, one's is kept and the other's dropped.
    pub fn get(&self) -> &T {
        let pid = std::process::id();
        let mut seen = self.current.load(Ordering::Acquire);
        loop {
            // SAFETY: a non-null pointer is a `Made<T>` this value owns, freed only by its
            // drop (which `&self` rules out) or, for a surplus one, before it was shared.
            if let Some(made) = unsafe { seen.as_ref() }
                && made.pid == pid
            {
                return &made.value;
            }
            let fresh = Box::into_raw(Box::new(Made {
                pid,
                value: T::default(),
            }));
            match self
                .current
                .compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // The replaced value (another process's) is never freed: see the module.
                // SAFETY: `fresh` was just made and is now shared only as `&`.
                Ok(_) => return unsafe { &(*fresh).value },
                Err(now) => {
                    // SAFETY: `fresh` was never shared: this thread still owns it.
                    drop(unsafe { Box::from_raw(fresh) });
                    seen = now;
                }
            }
        }
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let made = *self.current.get_mut();
        // SAFETY: as in `get`; `&mut self` means no `&T` handed out is still in use.
        if let Some(owned) = unsafe { made.as_ref() }
            && owned.pid == std::process::id()
        {
            // SAFETY: this process made it and no reference to it is left.
            drop(unsafe { Box::from_raw(made) });
        }
    }
}
