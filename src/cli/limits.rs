//! The process limits a command raises for itself before it opens anything.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Raises the soft limit on open file descriptors to the hard limit, as the Go runtime and
/// most servers do at start. A session reads its ancestors' files through connections of
/// their own (each the file, its `-wal` and its `-shm`), so under the usual soft limit of
/// 1,024 a fork chain about 340 deep could not be shown, exported, forked or appended to,
/// and it stopped the root's first search for every session (outside testing R7, session
/// 45). Best effort: a limit the system refuses (a hard limit of "unlimited" above the
/// kernel's `nr_open`) leaves the soft one as it was.
pub fn raise_descriptor_limit() {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
    }
}
