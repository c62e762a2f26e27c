//! The session header: who a session is and where it came from.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::ids::{LATEST_MS, SessionId};

/// How a session came to be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Origin {
    /// Created empty.
    #[default]
    New,
    /// Forked after a turn of a parent.
    Fork,
    /// Rewound to before a turn of a parent.
    Rewind,
    /// Imported from an export file.
    CanonicalImport,
    /// Migrated from a legacy transcript.
    LegacyImport,
}

impl Origin {
    /// The stored name (`new`, `fork`, `rewind`, `canonical-import`, `legacy-import`).
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::New => "new",
            Origin::Fork => "fork",
            Origin::Rewind => "rewind",
            Origin::CanonicalImport => "canonical-import",
            Origin::LegacyImport => "legacy-import",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Origin> {
        [
            Origin::New,
            Origin::Fork,
            Origin::Rewind,
            Origin::CanonicalImport,
            Origin::LegacyImport,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// The one `header` row of a session file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Header {
    /// The session id (equals the folder name).
    pub session_id: SessionId,
    /// The storage codec ([`crate::format::CODEC`]).
    pub codec: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// The working directory the host associates with the session.
    pub cwd: Option<String>,
    /// The session this one was forked, rewound or imported from.
    pub parent_id: Option<SessionId>,
    /// How the session came to be.
    pub origin: Origin,
    /// Free-form provenance (e.g. a legacy migration's source).
    pub provenance: Option<Value>,
    /// Events inherited from the parent at a fork or rewind (0 otherwise).
    pub inherited_events: u64,
}

/// The longest working directory a session may record, in bytes: `PATH_MAX`, the longest
/// path the operating system takes.
pub(crate) const MAX_CWD_BYTES: usize = 4096;

impl Header {
    /// Checks a header's creation time as `import` takes it: a time of years 1970-9999.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] saying what the time is.
    pub(crate) fn check_created_at(&self) -> Result<()> {
        if (0..=LATEST_MS).contains(&self.created_at_ms) {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "the file's header has a creation time of {} ms since 1970, not a time of years \
             1970-9999",
            self.created_at_ms
        )))
    }

    /// Checks the latest commit time of a file as `import` takes it, `newest_ms` (from
    /// [`SessionReader::newest_commit_ms`](crate::SessionReader)): not past year 9999,
    /// where a session's update time would pass every key of `list --sort updated`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] saying what the time is.
    pub(crate) fn check_commit_time(newest_ms: i64) -> Result<()> {
        if newest_ms <= LATEST_MS {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "a commit of the file has a time of {newest_ms} ms since 1970, not a time of \
             years 1970-9999"
        )))
    }

    /// Checks a working directory given for a new or imported session: not empty (leave
    /// it out instead), at most [`MAX_CWD_BYTES`] long (no longer path can be a working
    /// directory) and without a NUL byte (no path holds one). Headers already written are
    /// read as they are.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty `cwd`, one over [`MAX_CWD_BYTES`] or one
    /// holding a NUL.
    pub(crate) fn check_cwd(cwd: &str) -> Result<()> {
        if cwd.is_empty() {
            return Err(Error::invalid(
                "cwd is empty: give a working directory or leave it out",
            ));
        }
        if cwd.len() > MAX_CWD_BYTES {
            return Err(Error::invalid(format!(
                "a cwd must be at most {MAX_CWD_BYTES} bytes (PATH_MAX), this one is {}",
                cwd.len()
            )));
        }
        if let Some(at) = cwd.find('\0') {
            return Err(Error::invalid(format!(
                "cwd holds a NUL byte (at byte {at}), which no path can hold"
            )));
        }
        Ok(())
    }
}

/// A working directory as given by a user (`--cwd DIR`, Python's `cwd=`) as the absolute
/// folder it names, as sessions record it and as `list` and `search` filter it: an
/// absolute one without its `.` parts and repeated or trailing `/` (`/srv//api/` is
/// `/srv/api`, as a working directory is spelled; its `..` parts are kept), a relative one
/// (`.`, `../api`) joined to the current directory with its `.` and `..` parts resolved by
/// name (symlinks are not followed; the folder need not exist). An empty one stays empty,
/// for the call it is given to to refuse.
///
/// # Errors
/// [`Error::Io`] when the current directory cannot be read; [`Error::InvalidInput`] when
/// it is not UTF-8.
pub fn absolute_cwd(text: &str) -> Result<String> {
    use std::path::{Component, Path, PathBuf};
    let path = Path::new(text);
    if text.is_empty() {
        return Ok(String::new());
    }
    if path.is_absolute() {
        // The path is the UTF-8 `text`, so its parts are too.
        let spelled: PathBuf = path.components().collect();
        return Ok(spelled.to_string_lossy().into_owned());
    }
    let here = std::env::current_dir().map_err(|e| Error::io("current directory", e))?;
    let mut out = PathBuf::new();
    for part in here.join(path).components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out.into_os_string()
        .into_string()
        .map_err(|_| Error::invalid("the current directory is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_relative_cwd_is_made_absolute_by_name() {
        let here = std::env::current_dir().expect("cwd");
        let here = here.to_str().expect("utf-8");
        let abs = |t: &str| absolute_cwd(t).expect("dir");
        assert_eq!(abs("/srv/a/../b"), "/srv/a/../b");
        assert_eq!(abs(""), "");
        assert_eq!(abs("."), here);
        assert_eq!(abs("./x/./y/"), format!("{here}/x/y"));
        let parent = Path::new(here).parent().expect("parent").join("z");
        assert_eq!(abs("../z"), parent.to_str().expect("utf-8"));
        let deep = "../".repeat(here.split('/').count() + 3);
        assert_eq!(abs(&deep), "/");
    }

    #[test]
    fn an_absolute_cwd_is_spelled_as_a_relative_one_is() {
        // `./api/` named `<here>/api`, but `/srv/api/` (a shell's completion) stayed
        // `/srv/api/`, which no session's working directory (`/srv/api`) equals: `list
        // --cwd /srv/api/` and `search --cwd` found nothing.
        let abs = |t: &str| absolute_cwd(t).expect("dir");
        assert_eq!(abs("/srv/api/"), "/srv/api");
        assert_eq!(abs("/srv//api/./x"), "/srv/api/x");
        assert_eq!(abs("/"), "/");
        // `..` is kept: by name it is not the folder a symlink on the way leads to.
        assert_eq!(abs("/srv/a/../b/"), "/srv/a/../b");
    }
}
