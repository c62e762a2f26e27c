//! `fork()` while other threads use the library. A child made by `fork()` has only the
//! thread that forked; a lock another thread held at that moment stays locked in the child
//! for good, and the child's first call that takes it waits for ever. So the forking thread
//! takes every process-wide lock of the library before the fork ([`hold_for_fork`]) and
//! both processes let them go after it ([`release_after_fork`]), as a library's
//! `pthread_atfork` handlers do. Each is held briefly by the code that takes it, never
//! while it waits for another of them out of the order below, so taking them in that order
//! waits only for the calls under way.

use std::any::Any;
use std::cell::RefCell;

use crate::persistence::export_temp;
use crate::session::pool;
use crate::store::{folder_swap, hit_files, lock, schema, write};

thread_local! {
    /// The guards [`hold_for_fork`] took on this thread, in the order taken.
    static HELD_FOR_FORK: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Takes the library's process-wide locks for a `fork()` this thread is about to make:
/// the lock between reader opens and folder renames (a reader's open may check its schema
/// under the next one), the cache of expected schemas, the search's connection closer,
/// the write-behind pool, the registry of held writer locks and the list of exports under
/// way; and finishes building the drain's statements. [`release_after_fork`] lets them go,
/// in the parent and in the child. Call them around `fork()` in a process with other
/// threads using the library (the Python package does, through `os.register_at_fork`).
/// Calling it twice before a release does nothing more.
pub fn hold_for_fork() {
    HELD_FOR_FORK.with(|held| {
        let mut held = held.borrow_mut();
        if !held.is_empty() {
            return;
        }
        held.push(folder_swap::hold_for_fork());
        held.push(schema::hold_for_fork());
        held.push(hit_files::hold_for_fork());
        held.push(pool::hold_for_fork());
        held.push(lock::hold_for_fork());
        held.push(export_temp::hold_for_fork());
        write::build_for_fork();
    });
}

/// Lets go of what [`hold_for_fork`] took on this thread, last taken first (nothing when
/// it took nothing).
pub fn release_after_fork() {
    HELD_FOR_FORK.with(|held| {
        let mut held = held.borrow_mut();
        while let Some(guard) = held.pop() {
            drop(guard);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_hold_is_taken_once_and_released() {
        hold_for_fork();
        hold_for_fork();
        let other = std::thread::spawn(folder_swap::is_free);
        assert!(!other.join().expect("thread"));
        release_after_fork();
        // Other tests take the lock too: free once within a while, not at once.
        let other = std::thread::spawn(|| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !folder_swap::is_free() {
                if std::time::Instant::now() > deadline {
                    return false;
                }
                std::thread::yield_now();
            }
            true
        });
        assert!(other.join().expect("thread"));
        release_after_fork();
    }
}
