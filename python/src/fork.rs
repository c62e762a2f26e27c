//! `os.fork()` with SQLite in other threads. SQLite keeps a few process-wide mutexes (its
//! allocator's, the file-open lock of its unix VFS, the page cache's, the random number
//! generator's). A fork while another thread of the parent holds one (a write-behind
//! writer or a read pool's thread inside SQLite) gives the child that mutex locked for
//! good: its first SQLite call waited forever, and a read pool gave up after its timeout
//! ("no read connection … timed out"). So, as `pthread_atfork` handlers do for a
//! library's locks, the forking thread takes them all before the fork and both processes
//! let them go after it.

use libsqlite3_sys as ffi;

/// SQLite's static mutexes, outer ones first: the random number generator's (held while
/// it finds the default VFS, which takes the main one), the main, open and VFS locks, the
/// page cache's, then the allocator's, which SQLite takes inside every other.
const STATIC_MUTEXES: [std::os::raw::c_int; 9] = [
    ffi::SQLITE_MUTEX_STATIC_PRNG,
    ffi::SQLITE_MUTEX_STATIC_MAIN,
    ffi::SQLITE_MUTEX_STATIC_OPEN,
    ffi::SQLITE_MUTEX_STATIC_VFS1,
    ffi::SQLITE_MUTEX_STATIC_VFS2,
    ffi::SQLITE_MUTEX_STATIC_VFS3,
    ffi::SQLITE_MUTEX_STATIC_LRU,
    ffi::SQLITE_MUTEX_STATIC_PMEM,
    ffi::SQLITE_MUTEX_STATIC_MEM,
];

/// Takes SQLite's static mutexes, in order (`os.register_at_fork(before=...)`).
pub fn hold_sqlite() {
    for id in STATIC_MUTEXES {
        // SAFETY: a static mutex is allocated once by SQLite and never freed; entering it
        // only waits for the thread that holds it.
        unsafe {
            let mutex = ffi::sqlite3_mutex_alloc(id);
            if !mutex.is_null() {
                ffi::sqlite3_mutex_enter(mutex);
            }
        }
    }
}

/// Lets SQLite's static mutexes go, in reverse order (after the fork, in the parent and in
/// the child: the thread that took them is the one that forked, in both).
pub fn release_sqlite() {
    for id in STATIC_MUTEXES.iter().rev() {
        // SAFETY: as in `hold_sqlite`, whose locks this thread holds.
        unsafe {
            let mutex = ffi::sqlite3_mutex_alloc(*id);
            if !mutex.is_null() {
                ffi::sqlite3_mutex_leave(mutex);
            }
        }
    }
}
