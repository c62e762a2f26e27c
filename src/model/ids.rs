//! Session identities: validated ids, refs, random and derived ids.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result, quoted};

/// Windows device names, refused as the part of an id before the first `.`.
const RESERVED_NAMES: [&str; 22] = [
    "CON", "PRN", "AUX", "NUL", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8",
    "COM9", "LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9",
];

/// A validated session id: one safe path segment of 1..=255 bytes.
///
/// ```
/// use session_store::SessionId;
/// assert!(SessionId::new("chat-42").is_ok());
/// assert!(SessionId::new("../x").is_err());
/// assert!(SessionId::new("con.txt").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SessionId(String);

impl SessionId {
    /// Validates `id` (DESIGN §2): no separators or `< > : " | ? *`, no control characters,
    /// no leading/trailing `.` or white space, not a Windows device name.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the rule that failed.
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        validate(&id)?;
        Ok(SessionId(id))
    }

    /// A random id: 32 lowercase hex characters.
    pub fn random() -> Self {
        SessionId(random_hex())
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn validate(id: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::invalid(format!(
            "invalid session id {}: {why}",
            quoted(id)
        )))
    };
    if id.is_empty() {
        return bad("empty");
    }
    if id.len() > 255 {
        return bad("longer than 255 bytes");
    }
    if id.trim() != id {
        return bad("leading or trailing white space");
    }
    if id.starts_with('.') || id.ends_with('.') {
        return bad("starts or ends with '.'");
    }
    if let Some(c) = id.chars().find(|c| forbidden(*c)) {
        return bad(&format!("contains {c:?}"));
    }
    let stem = id.split('.').next().unwrap_or(id);
    if RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(stem)) {
        return Err(Error::invalid(format!(
            "reserved session id {}: {stem} is a device name",
            quoted(id)
        )));
    }
    Ok(())
}

/// Whether an id may not hold `c` anywhere: a separator, `< > : " | ? *`, a control
/// character.
fn forbidden(c: char) -> bool {
    matches!(c, '/' | '\\' | '<' | '>' | ':' | '"' | '|' | '?' | '*') || c.is_control()
}

impl SessionId {
    /// `name` (of an entry of a root that claims to be a session, its bytes that are not
    /// UTF-8 already U+FFFD) as the id a report of it carries: the name as it is, which
    /// need not be a valid id (`a:b`). Only for reporting such an entry (skipped by `list`,
    /// kept by `gc`): no session is opened by it. Its characters an id may not hold were
    /// U+FFFD before, so `a:b` was reported as `a\u{fffd}b`, a name that exists nowhere.
    pub(crate) fn shown(name: &str) -> SessionId {
        SessionId(name.to_owned())
    }
}

impl TryFrom<String> for SessionId {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        SessionId::new(value)
    }
}

impl TryFrom<&str> for SessionId {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self> {
        SessionId::new(value)
    }
}

impl From<SessionId> for String {
    fn from(id: SessionId) -> String {
        id.0
    }
}

impl FromStr for SessionId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        SessionId::new(s)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SessionId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A map or set keyed by `SessionId` is looked up by a `&str` (equal ids hash as their
/// text does).
impl std::borrow::Borrow<str> for SessionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A session as a host names it: the owning host and the session id. Deserialized through
/// the same checks as [`SessionRef::new`].
///
/// Displayed as `host/session`. A host id may hold `/` but a session id never does, so the
/// last `/` of the text is the one between them: `a/b/c` is host `a/b`, session `c`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawSessionRef")]
pub struct SessionRef {
    /// The host that owns the session (a service only serves its own host id).
    pub host_id: String,
    /// The session id.
    pub session_id: SessionId,
}

/// A [`SessionRef`] as read, before its host id is checked.
#[derive(Deserialize)]
struct RawSessionRef {
    host_id: String,
    session_id: SessionId,
}

impl TryFrom<RawSessionRef> for SessionRef {
    type Error = Error;
    fn try_from(raw: RawSessionRef) -> Result<Self> {
        Self::check_host_id(&raw.host_id)?;
        Ok(SessionRef {
            host_id: raw.host_id,
            session_id: raw.session_id,
        })
    }
}

impl SessionRef {
    /// Builds a ref, validating both parts.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a host id [`SessionRef::check_host_id`] refuses or an
    /// invalid session id.
    pub fn new(host_id: impl Into<String>, session_id: impl Into<String>) -> Result<Self> {
        let host_id = host_id.into();
        Self::check_host_id(&host_id)?;
        Ok(SessionRef {
            host_id,
            session_id: SessionId::new(session_id)?,
        })
    }
}

impl SessionRef {
    /// Checks a host id: not blank, and no control character (it is printed in refs,
    /// listings and error messages).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming what is wrong.
    pub fn check_host_id(host_id: &str) -> Result<()> {
        if let Some(why) = crate::model::payload::missing_or_blank("host id", host_id) {
            return Err(Error::invalid(why));
        }
        if host_id.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "host id {} contains a control character",
                quoted(host_id)
            )));
        }
        Ok(())
    }
}

/// `host/session`: the session id holds no `/`, so the text's last `/` separates the two.
impl fmt::Display for SessionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.host_id, self.session_id)
    }
}

/// 16 random bytes as 32 lowercase hex characters: session ids, staging folder names,
/// writer owner ids and the like, which must differ between processes as well as within one.
pub(crate) fn random_hex() -> String {
    format!("{:016x}{:016x}", random_u64(), random_u64())
}

/// A random `u64` from the operating system (`getrandom`). `fastrand`'s global generator
/// seeds each thread from the monotonic clock and the thread id alone (hashed with fixed
/// keys), so two processes whose threads of the same id seed it in the same nanosecond
/// draw the same names. Without the OS's randomness (a sandbox refusing `getrandom(2)`), it
/// falls back to `fastrand` mixed with the process id.
pub(crate) fn random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|_| fastrand::u64(..) ^ u64::from(std::process::id()) << 32)
}

/// First 16 bytes (32 hex chars) of SHA-256 over the parts joined by NUL.
pub(crate) fn derived_id(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(p.as_bytes());
    }
    lower_hex(&h.finalize()[..16])
}

/// `bytes` as lowercase hex. `hex::encode` builds its `String` a `char` at a time, which
/// showed in profiles of the append path (ids and digests are hexed on every commit).
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    // `out` is exactly twice as long as `bytes`, the one way `encode_to_slice` fails, and
    // hex digits are ASCII: neither result can be an error.
    let _ = hex::encode_to_slice(bytes, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// The turn id of a batch that opens a turn without naming one. Unlike upstream
/// (§1.8) the session id is not part of it: operation ids are unique per session
/// already, and a session imported under a new id keeps accepting its retries.
pub(crate) fn derived_turn_id(operation_id: &str) -> String {
    derived_id(&["turn", operation_id])
}

/// The last millisecond of year 9999: the latest time the store records or takes from a
/// file (a header of `i64::MAX` was imported, and the session was then on no page of
/// `list --sort created` or `--sort updated`, whose keys it passed).
pub(crate) const LATEST_MS: i64 = 253_402_300_799_999;

/// Milliseconds since the Unix epoch, as a time of years 1970-9999: a clock before 1970
/// reads 0 and one past 9999 its last millisecond ([`LATEST_MS`]). A writer under a clock
/// past 9999 stored that time, and `import` then refused the export of its session.
pub(crate) fn now_ms() -> i64 {
    unix_ms(std::time::SystemTime::now())
        .unwrap_or(0)
        .min(LATEST_MS)
}

/// `time` in milliseconds since the Unix epoch; `None` before it.
pub(crate) fn unix_ms(time: std::time::SystemTime) -> Option<i64> {
    let since = time.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_hex_is_the_hex_crates_text() {
        for bytes in [&[][..], &[0x00], &[0x0f, 0xf0, 0xab], &[0xff; 32]] {
            assert_eq!(lower_hex(bytes), hex::encode(bytes));
        }
        assert_eq!(lower_hex(&[0xde, 0xad, 0x01]), "dead01");
    }

    #[test]
    fn an_id_converts_from_str_and_keys_maps_looked_up_by_str() {
        let id = SessionId::try_from("chat-1").unwrap();
        assert_eq!(id, SessionId::new("chat-1").unwrap());
        assert!(SessionId::try_from("../x").is_err());
        let titles = std::collections::HashMap::from([(id, "Hello")]);
        assert_eq!(titles.get("chat-1"), Some(&"Hello"));
        let ids = std::collections::BTreeSet::from([SessionId::random()]);
        assert!(!ids.contains("chat-1"));
    }

    #[test]
    fn random_ids_are_hex_and_differ() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(|_| random_hex()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| {
            id.len() == 32
                && id
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }));
        // Threads started together draw different values (each its own OS draw).
        let drawn: std::collections::HashSet<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8).map(|_| scope.spawn(random_u64)).collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        assert_eq!(drawn.len(), 8);
        let id = SessionId::random();
        assert_eq!(id.as_str().len(), 32);
        assert_ne!(SessionId::random(), id);
    }

    #[test]
    fn a_ref_with_a_slash_in_its_host_reads_back_at_its_last_slash() {
        let shown = SessionRef::new("team/box 1", "c").unwrap().to_string();
        assert_eq!(shown, "team/box 1/c");
        let (host, session) = shown.rsplit_once('/').unwrap();
        assert_eq!((host, session), ("team/box 1", "c"));
        // The ref it could be mistaken for cannot be made: a session id holds no `/`.
        assert!(SessionRef::new("team", "box 1/c").is_err());
    }

    #[test]
    fn refuses_unsafe_ids() {
        for bad in [
            "", "../x", "a/b", "a\\b", "CON", "con", "Lpt1.log", ".hidden", "trail.", " pad",
            "nul\0", "a:b", "q?",
        ] {
            assert!(SessionId::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(SessionId::new("x".repeat(256)).is_err());
        assert!(SessionId::new("x".repeat(255)).is_ok());
        assert!(SessionId::new("console").is_ok());
        assert!(SessionId::new("a b.c").is_ok());
    }
}
