//! The last read of a root folder that a listing's first page used, kept while the folder
//! shows no change ([`Root::listing_scan`](super::Root::listing_scan)). A first page reads
//! the folder to report what is no session of the root; a long-lived process (a
//! `Service`, `serve`, a Python host) listing a root of 10,000 sessions paid about 4 ms
//! for that read on every first page (`cargo bench --bench query`, session 33).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::RootScan;

/// How long the folder must have been left unchanged before a read of it is kept: a change
/// made in the same clock tick as an earlier one leaves the folder's times as they were
/// (Linux stamps them from a clock that advances in ticks of up to 10 ms), so a read made
/// right after a change could miss one made next to it.
const QUIET: Duration = Duration::from_millis(100);

/// What tells that a folder changed: its inode and its modification and change times.
/// Creating, removing or renaming an entry of the folder changes both times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FolderStamp {
    inode: u64,
    modified: (i64, u64),
    changed: (i64, u64),
}

impl FolderStamp {
    /// The stamp of the folder at `path` (the path the read reads, so that a folder put in
    /// the place of the one read is a change); `None` when it cannot be looked at.
    fn of(path: &Path) -> Option<FolderStamp> {
        let st = rustix::fs::stat(path).ok()?;
        Some(FolderStamp {
            inode: st.st_ino,
            modified: (st.st_mtime, st.st_mtime_nsec),
            changed: (st.st_ctime, st.st_ctime_nsec),
        })
    }

    /// Whether the folder had been left unchanged for [`QUIET`] at `now`.
    fn quiet_at(&self, now: SystemTime) -> bool {
        let last = self.modified.max(self.changed);
        let (Ok(secs), Ok(nanos)) = (u64::try_from(last.0), u32::try_from(last.1)) else {
            return false;
        };
        let last = UNIX_EPOCH + Duration::new(secs, nanos);
        last.checked_add(QUIET).is_some_and(|t| t < now)
    }
}

/// A root's kept read of its folder.
#[derive(Debug, Default)]
pub(crate) struct ScanCache(Mutex<Option<(FolderStamp, Arc<RootScan>)>>);

impl ScanCache {
    /// The kept read when the folder at `path` shows the same stamp as when it was made, else
    /// a new one from `read`, kept when the folder had been quiet for [`QUIET`] before it
    /// (the stamp is taken before the read, so a change during the read is seen next time).
    pub(crate) fn get_or_read(
        &self,
        path: &Path,
        read: impl FnOnce() -> crate::error::Result<RootScan>,
    ) -> crate::error::Result<Arc<RootScan>> {
        let stamp = FolderStamp::of(path);
        let now = SystemTime::now();
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some((at, scan)), Some(stamp)) = (kept.as_ref(), stamp)
            && *at == stamp
        {
            return Ok(Arc::clone(scan));
        }
        let scan = Arc::new(read()?);
        *kept = stamp
            .filter(|s| s.quiet_at(now))
            .map(|s| (s, Arc::clone(&scan)));
        Ok(scan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_quiet_only_once_its_last_change_is_old_enough() {
        let now = SystemTime::now();
        let secs = |t: SystemTime| {
            let d = t.duration_since(UNIX_EPOCH).expect("after the epoch");
            (d.as_secs() as i64, u64::from(d.subsec_nanos()))
        };
        let stamp = |modified, changed| FolderStamp {
            inode: 1,
            modified,
            changed,
        };
        let old = secs(now - Duration::from_secs(1));
        let recent = secs(now - Duration::from_millis(20));
        assert!(stamp(old, old).quiet_at(now));
        assert!(!stamp(recent, old).quiet_at(now), "modified just now");
        assert!(!stamp(old, recent).quiet_at(now), "changed just now");
        assert!(
            !stamp((-1, 0), (-1, 0)).quiet_at(now),
            "a time before the epoch"
        );
    }
}
