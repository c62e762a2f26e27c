//! The session header: who a session is and where it came from.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::ids::SessionId;

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

impl Header {
    /// Checks a working directory given for a new or imported session: not empty (leave
    /// it out instead) and without a NUL byte (no path holds one). Headers already written
    /// are read as they are.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty `cwd` or one holding a NUL.
    pub(crate) fn check_cwd(cwd: &str) -> Result<()> {
        if cwd.is_empty() {
            return Err(Error::invalid(
                "cwd is empty: give a working directory or leave it out",
            ));
        }
        if let Some(at) = cwd.find('\0') {
            return Err(Error::invalid(format!(
                "cwd holds a NUL byte (at byte {at}), which no path can hold"
            )));
        }
        Ok(())
    }
}
