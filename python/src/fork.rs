//! `os.fork()` with SQLite in other threads. SQLite keeps a few process-wide mutexes (its
//! allocator's, the file-open lock of its unix VFS, the page cache's, the random number
//! generator's). A fork while another thread of the parent holds one (a write-behind
//! writer or a read pool's thread inside SQLite) gives the child that mutex locked for
//! good: its first SQLite call waited forever, and a read pool gave up after its timeout
//! ("no read connection … timed out"). So, as `pthread_atfork` handlers do for a
//! library's locks, the forking thread takes them all before the fork and both processes
//! let them go after it.
//!
//! SQLite's unix VFS also keeps mutexes on the heap, one per open file (inode) and one per
//! WAL index, which no handler can name: a fork while a thread of the parent was locking a
//! file gave the child that file's mutex locked for good, and the child's first read of
//! the session hung (a few forks in a hundred, with two threads reading). So every file is
//! opened through [`install_vfs`]'s VFS, which passes each call on to the unix VFS and
//! counts the calls in progress, and the fork waits until none is ([`hold_sqlite`]).

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use libsqlite3_sys as ffi;

/// Calls of a file's methods in progress, in every thread ([`gated`]).
static IN_CALL: AtomicUsize = AtomicUsize::new(0);
/// Set while a fork waits for the calls in progress to end: no new call starts.
static FORKING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread's calls in progress: a call made inside another is not held back.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Runs `call`, one call of a file's methods, counted in [`IN_CALL`]; waits first while a
/// fork is being made.
fn gated<T>(call: impl FnOnce() -> T) -> T {
    let depth = DEPTH.with(Cell::get);
    if depth == 0 {
        loop {
            IN_CALL.fetch_add(1, SeqCst);
            if !FORKING.load(SeqCst) {
                break;
            }
            IN_CALL.fetch_sub(1, SeqCst);
            while FORKING.load(SeqCst) {
                std::thread::yield_now();
            }
        }
    }
    DEPTH.with(|d| d.set(depth + 1));
    let out = call();
    DEPTH.with(|d| d.set(depth));
    if depth == 0 {
        IN_CALL.fetch_sub(1, SeqCst);
    }
    out
}

/// Holds new calls of files' methods back and waits until no call is in progress.
fn wait_for_calls() {
    FORKING.store(true, SeqCst);
    while IN_CALL.load(SeqCst) > 0 {
        std::thread::yield_now();
    }
}

/// Name of the VFS [`install_vfs`] makes the default.
const VFS_NAME: &[u8] = b"session-store-fork-safe\0";

/// An open file of the VFS: SQLite's header, then the unix VFS's file it passes calls to
/// (in the same allocation, right after this).
#[repr(C)]
struct GatedFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
}

/// Bytes of a [`GatedFile`] before its real file, a multiple of 8.
const HEAD: usize = std::mem::size_of::<GatedFile>().next_multiple_of(8);

/// Makes SQLite's default VFS one that passes every call on to it and counts the calls
/// of files' methods in progress ([`gated`]), so that [`hold_sqlite`] can wait until none
/// holds one of the unix VFS's heap mutexes. Called once, when the module is imported,
/// before any file is opened.
///
/// # Errors
/// A message when SQLite has no default VFS or refuses the new one.
pub fn install_vfs() -> Result<(), String> {
    // SAFETY: sqlite3_vfs_find returns SQLite's registered default VFS (never freed) or
    // null; the new VFS is leaked, so it outlives every connection.
    unsafe {
        let real = ffi::sqlite3_vfs_find(std::ptr::null());
        if real.is_null() {
            return Err("SQLite has no default VFS".to_owned());
        }
        if !(*real).zName.is_null()
            && std::ffi::CStr::from_ptr((*real).zName).to_bytes() == &VFS_NAME[..VFS_NAME.len() - 1]
        {
            return Ok(());
        }
        let size = c_int::try_from(HEAD)
            .ok()
            .and_then(|head| head.checked_add((*real).szOsFile))
            .ok_or("SQLite's file size overflows")?;
        // The unix VFS's methods other than xOpen do not use their VFS argument (SQLite's
        // `UNUSED_PARAMETER`), so they are taken as they are; xOpen gets the real VFS.
        let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
            szOsFile: size,
            pNext: std::ptr::null_mut(),
            zName: VFS_NAME.as_ptr().cast::<c_char>(),
            pAppData: real.cast::<c_void>(),
            xOpen: Some(open),
            ..*real
        }));
        match ffi::sqlite3_vfs_register(vfs, 1) {
            ffi::SQLITE_OK => Ok(()),
            code => Err(format!("SQLite refused the fork-safe VFS (code {code})")),
        }
    }
}

/// The VFS's xOpen: opens the real file right after the [`GatedFile`] header.
unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite gives `file` szOsFile bytes (HEAD + the real VFS's); pAppData is the
    // real VFS (install_vfs).
    unsafe {
        let real_vfs = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
        let gated_file = file.cast::<GatedFile>();
        let real = file.cast::<u8>().add(HEAD).cast::<ffi::sqlite3_file>();
        (*gated_file).real = real;
        (*real).pMethods = std::ptr::null();
        let Some(real_open) = (*real_vfs).xOpen else {
            (*gated_file).base.pMethods = std::ptr::null();
            return ffi::SQLITE_CANTOPEN;
        };
        let code = gated(|| real_open(real_vfs, name, real, flags, out_flags));
        // A file whose open failed is closed by SQLite only if it has methods.
        (*gated_file).base.pMethods = match (*real).pMethods {
            m if m.is_null() => std::ptr::null(),
            m if (*m).iVersion >= 3 => &METHODS_V3,
            m if (*m).iVersion == 2 => &METHODS_V2,
            _ => &METHODS_V1,
        };
        code
    }
}

/// The real file behind `file` and its methods.
///
/// # Safety
/// `file` is a [`GatedFile`] that [`open`] opened and SQLite has not closed.
unsafe fn real(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    // SAFETY: the caller's; an opened file's methods are a static table of its VFS.
    unsafe {
        let real = (*file.cast::<GatedFile>()).real;
        (real, &*(*real).pMethods)
    }
}

/// A method of [`METHODS_V3`]: the real file's, as one [`gated`] call.
macro_rules! pass_on {
    ($name:ident, $field:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> $ret {
            // SAFETY: SQLite calls a method only on a file `open` opened, with the
            // arguments of the real method; a method missing from the real table is one
            // SQLite does not call (its version is below the method's).
            unsafe {
                let (real, methods) = real(file);
                match methods.$field {
                    Some(method) => gated(|| method(real $(, $arg)*)),
                    None => ffi::SQLITE_IOERR,
                }
            }
        }
    };
}

pass_on!(close, xClose, () -> c_int);
pass_on!(read, xRead, (buf: *mut c_void, amount: c_int, offset: ffi::sqlite3_int64) -> c_int);
pass_on!(write, xWrite, (buf: *const c_void, amount: c_int, offset: ffi::sqlite3_int64) -> c_int);
pass_on!(truncate, xTruncate, (size: ffi::sqlite3_int64) -> c_int);
pass_on!(sync, xSync, (flags: c_int) -> c_int);
pass_on!(file_size, xFileSize, (size: *mut ffi::sqlite3_int64) -> c_int);
pass_on!(lock, xLock, (level: c_int) -> c_int);
pass_on!(unlock, xUnlock, (level: c_int) -> c_int);
pass_on!(check_reserved_lock, xCheckReservedLock, (out: *mut c_int) -> c_int);
pass_on!(file_control, xFileControl, (op: c_int, arg: *mut c_void) -> c_int);
pass_on!(sector_size, xSectorSize, () -> c_int);
pass_on!(device_characteristics, xDeviceCharacteristics, () -> c_int);
pass_on!(shm_map, xShmMap, (page: c_int, page_size: c_int, extend: c_int, out: *mut *mut c_void) -> c_int);
pass_on!(shm_lock, xShmLock, (offset: c_int, n: c_int, flags: c_int) -> c_int);
pass_on!(shm_unmap, xShmUnmap, (delete: c_int) -> c_int);
pass_on!(fetch, xFetch, (offset: ffi::sqlite3_int64, amount: c_int, out: *mut *mut c_void) -> c_int);
pass_on!(unfetch, xUnfetch, (offset: ffi::sqlite3_int64, page: *mut c_void) -> c_int);

/// The xShmBarrier method (it returns nothing).
unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: as in `pass_on!`.
    unsafe {
        let (real, methods) = real(file);
        if let Some(method) = methods.xShmBarrier {
            gated(|| method(real));
        }
    }
}

/// The gated methods, as a table of version `version` (the real file's: SQLite calls
/// only the methods a table's version has).
const fn methods(version: c_int) -> ffi::sqlite3_io_methods {
    ffi::sqlite3_io_methods {
        iVersion: version,
        xClose: Some(close),
        xRead: Some(read),
        xWrite: Some(write),
        xTruncate: Some(truncate),
        xSync: Some(sync),
        xFileSize: Some(file_size),
        xLock: Some(lock),
        xUnlock: Some(unlock),
        xCheckReservedLock: Some(check_reserved_lock),
        xFileControl: Some(file_control),
        xSectorSize: Some(sector_size),
        xDeviceCharacteristics: Some(device_characteristics),
        xShmMap: Some(shm_map),
        xShmLock: Some(shm_lock),
        xShmBarrier: Some(shm_barrier),
        xShmUnmap: Some(shm_unmap),
        xFetch: Some(fetch),
        xUnfetch: Some(unfetch),
    }
}

static METHODS_V1: ffi::sqlite3_io_methods = methods(1);
static METHODS_V2: ffi::sqlite3_io_methods = methods(2);
static METHODS_V3: ffi::sqlite3_io_methods = methods(3);

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

/// Registers [`before_fork`] and [`after_fork`] with `pthread_atfork`, once per process:
/// they run inside `fork()` itself, in the forking thread, after every
/// `os.register_at_fork` handler. Registered as such a handler (`before=`), they held every
/// file call and SQLite's mutexes while the handlers registered before them ran (the
/// `logging` module's, Python code): another thread took the GIL meanwhile, dropped a
/// reader, whose close waited for the fork while holding the GIL, and the forking thread
/// never got the GIL back: the parent hung in `os.fork()` for good (outside testing P1).
/// Inside `fork()` the forking thread holds the GIL (when Python forks), so no thread that
/// needs it can be waiting on what the handlers hold.
///
/// # Errors
/// The system's refusal to register them (out of memory).
pub fn install_fork_handlers() -> Result<(), String> {
    static INSTALLED: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
    // SAFETY: the handlers are functions that live as long as the process, callable from
    // any thread.
    let refused = *INSTALLED.get_or_init(|| unsafe {
        libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork))
    });
    match refused {
        0 => Ok(()),
        code => Err(format!(
            "could not register the handlers that make os.fork() safe: {}",
            std::io::Error::from_raw_os_error(code)
        )),
    }
}

/// Takes the store's locks between reader opens and folder renames (and its other
/// process-wide locks), then SQLite's process-wide mutexes, before the fork: so that no
/// other thread holds one as the child is made. The store's locks first: a thread holding
/// one may be inside SQLite.
extern "C" fn before_fork() {
    session_store::hold_for_fork();
    hold_sqlite();
}

/// Lets go of what [`before_fork`] took, in the parent and in the child.
extern "C" fn after_fork() {
    release_sqlite();
    session_store::release_after_fork();
}

/// Waits until no thread is in a call of a file's methods (holding new ones back), then
/// takes SQLite's static mutexes, in order.
fn hold_sqlite() {
    wait_for_calls();
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

/// Lets SQLite's static mutexes go, in reverse order, and the calls held back (after the
/// fork, in the parent and in the child: the thread that took them is the one that forked,
/// in both).
fn release_sqlite() {
    for id in STATIC_MUTEXES.iter().rev() {
        // SAFETY: as in `hold_sqlite`, whose locks this thread holds.
        unsafe {
            let mutex = ffi::sqlite3_mutex_alloc(*id);
            if !mutex.is_null() {
                ffi::sqlite3_mutex_leave(mutex);
            }
        }
    }
    FORKING.store(false, SeqCst);
}
