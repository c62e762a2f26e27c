//! Events, batches, commits and content references.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::format::{MAX_ID_BYTES, MAX_KIND_BYTES, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_NESTING};
use crate::model::ids::lower_hex;

pub(crate) use crate::format::INLINE_PAYLOAD_LIMIT;

/// One event of a session's log.
///
/// Two events are equal when every field is, the payloads compared as their exact JSON
/// text (the bytes stored and hashed; `{"a":1}` and `{ "a": 1 }` differ).
///
/// ```
/// use session_store::Event;
/// let e = Event::new("session/title").with_payload(&serde_json::json!({"title": "Hi"})).unwrap();
/// assert_eq!(e.payload_str(), Some(r#"{"title":"Hi"}"#));
/// assert_eq!(e, Event::new("session/title").with_payload_json(r#"{"title":"Hi"}"#).unwrap());
/// assert_ne!(e, Event::new("session/title").with_payload_json(r#"{"title": "Hi"}"#).unwrap());
/// ```
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Event {
    /// Event id; empty on input means "derive one" (deterministic, see `docs/ARCHITECTURE.md`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Sequence number, assigned at acceptance: [`Session::append`](crate::Session::append)
    /// ignores it, and a [`Batch`] deserialized with an event that has a `seq` (any value)
    /// is refused.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq: u64,
    /// Event kind, e.g. `message/complete`: one of
    /// [`PROJECTION_KINDS`](crate::PROJECTION_KINDS) (whose docs give each kind's payload),
    /// or any kind when `optional`.
    pub kind: String,
    /// Optional events may be of any kind; the projection skips them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// The payload as JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Box<RawValue>>,
    /// Set on events read back from storage whose payload lives in a blob:
    /// [`Session::append`](crate::Session::append) ignores it, and a [`Batch`] deserialized
    /// with an event that has one is refused (the content is input as `payload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_ref: Option<ContentRef>,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.seq == other.seq
            && self.kind == other.kind
            && self.optional == other.optional
            && self.payload_str() == other.payload_str()
            && self.content_ref == other.content_ref
    }
}

impl Eq for Event {}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Event {
    /// A new event of `kind` with no payload.
    pub fn new(kind: impl Into<String>) -> Self {
        Event {
            id: String::new(),
            seq: 0,
            kind: kind.into(),
            optional: false,
            payload: None,
            content_ref: None,
        }
    }

    /// Sets the payload from any serializable value, as `serde_json` writes it: a float
    /// that is not finite (NaN, an infinity) has no JSON form and is written as `null`, as
    /// `serde_json::to_string` writes it (the payload holds no trace of the float), so give
    /// such a value as something else (a string) when it matters.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the value cannot be serialized to JSON.
    pub fn with_payload<T: Serialize + ?Sized>(mut self, value: &T) -> Result<Self> {
        let text = serde_json::to_string(value)
            .map_err(|e| Error::invalid_from("payload is not JSON", e))?;
        self.payload = Some(raw_json(text)?);
        Ok(self)
    }

    /// Sets the payload from JSON text.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when `json` is not a single JSON value.
    pub fn with_payload_json(mut self, json: &str) -> Result<Self> {
        self.payload = Some(raw_json(json.to_owned())?);
        Ok(self)
    }

    /// Marks the event optional (stored, skipped by the projection).
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// Sets a caller-chosen event id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// The payload JSON text, if any.
    pub fn payload_str(&self) -> Option<&str> {
        self.payload.as_deref().map(RawValue::get)
    }

    /// Bytes of the payload text (0 without a payload).
    pub fn payload_len(&self) -> usize {
        self.payload_str().map_or(0, str::len)
    }
}

/// Parses JSON text into a raw value, refusing anything that is not exactly one JSON value.
pub(crate) fn raw_json(text: String) -> Result<Box<RawValue>> {
    RawValue::from_string(text).map_err(|e| Error::invalid_from("payload is not JSON", e))
}

/// One atomic append: an operation id (the idempotency key), an optional turn id and events.
///
/// Deserialized only from an object `{"operation_id", "turn_id"?, "events": [...]}` (keys in
/// any order): a JSON array is refused, not read as the fields in order, and so is a key
/// the batch or one of its events does not have (a typo such as `turn_idd` or `optinal`
/// would otherwise drop the field it meant, silently), and an event's output-only field
/// (a `seq` other than 0, a `content_ref`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Batch {
    /// Idempotency key: a retry with the same id and content returns the original commit.
    pub operation_id: String,
    /// The turn this batch belongs to; derived from the operation id when a `turn/start`
    /// is appended without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The events, in order.
    pub events: Vec<Event>,
}

impl Batch {
    /// A batch without a turn id.
    pub fn new(operation_id: impl Into<String>, events: Vec<Event>) -> Self {
        Batch {
            operation_id: operation_id.into(),
            turn_id: None,
            events,
        }
    }

    /// Sets the turn id.
    pub fn in_turn(mut self, turn_id: impl Into<String>) -> Self {
        self.turn_id = Some(turn_id.into());
        self
    }

    /// Checks, without a session, what an append of this batch checks: an operation id
    /// and events are given, the operation id is not reserved, every event has a kind, a
    /// payload of at most [`MAX_PAYLOAD_BYTES`], nested at most [`MAX_PAYLOAD_NESTING`]
    /// deep, that its kind accepts (a message's `id`, a `turn/end`'s status, a title that
    /// is not blank, ...) and an id no other event of the batch has, and no message id is
    /// completed twice.
    ///
    /// An append refuses every batch this refuses, with the same error, but one: a retry
    /// of an operation the session stores answers its commit, checked against the stored
    /// content only (a rule added since does not refuse what an older build stored). An
    /// append may refuse a batch this accepts, for what its session holds: a message id
    /// completed before, a turn rule, an operation id stored with other content.
    ///
    /// # Errors
    /// As an append's: [`Error::InvalidInput`] or [`Error::InvalidPayload`] naming what is
    /// wrong, [`Error::UnsupportedVersion`] for a required event of a kind this build does
    /// not know (an optional one is stored unread).
    pub fn validate(&self) -> Result<()> {
        check_fields(trim_name(&self.operation_id), &self.events)?;
        check_unique_ids(&self.events)?;
        check_nesting(&self.events)?;
        check_names(
            trim_name(&self.operation_id),
            self.turn_id.as_deref(),
            &self.events,
        )?;
        if self
            .events
            .iter()
            .all(|e| trim_name(&e.kind).len() == e.kind.len())
        {
            return crate::model::projection::check_alone(&self.events);
        }
        // An append trims each kind before it reads its payload.
        let trimmed: Vec<Event> = self
            .events
            .iter()
            .map(|e| Event {
                kind: trim_name(&e.kind).to_owned(),
                ..e.clone()
            })
            .collect();
        crate::model::projection::check_alone(&trimmed)
    }
}

/// `name` (an operation id, an event kind or a turn id as a caller gave it) without the
/// white space around it, keeping control characters: a line break or tab at either end
/// is refused with the name ([`check_names`]), as one inside it is. `str::trim` took them
/// off, so `"ab\r"` answered as a retry of `"ab"` (outside testing, session 43).
pub(crate) fn trim_name(name: &str) -> &str {
    name.trim_matches(|c: char| c.is_whitespace() && !c.is_control())
}

/// The checks of a batch's fields that come before its operation id is looked up (so a
/// retry fails them too): an operation id (`operation_id`, trimmed) and events are
/// given, the id is not reserved for inherited commits, every event has a kind, and no
/// payload is over [`MAX_PAYLOAD_BYTES`].
///
/// # Errors
/// [`Error::InvalidInput`] naming the first that fails.
pub(crate) fn check_fields(operation_id: &str, events: &[Event]) -> Result<()> {
    if operation_id.is_empty() {
        return Err(Error::invalid("an operation id is required"));
    }
    if events.is_empty() {
        return Err(Error::invalid(
            "a batch needs at least one event (events is empty)",
        ));
    }
    if operation_id.starts_with(INHERITED_OPERATION_PREFIX) {
        return Err(Error::invalid(format!(
            "operation ids starting with {INHERITED_OPERATION_PREFIX:?} are reserved for inherited commits"
        )));
    }
    for (i, e) in events.iter().enumerate() {
        if trim_name(&e.kind).is_empty() {
            return Err(Error::invalid(format!("events[{i}].kind is required")));
        }
        if e.payload_len() as u64 > MAX_PAYLOAD_BYTES {
            return Err(Error::invalid(format!(
                "events[{i}] payload is {} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit",
                e.payload_len()
            )));
        }
    }
    Ok(())
}

/// Refuses a name a caller gives that no command could name again or print whole: an
/// operation id, turn id or event id over [`MAX_ID_BYTES`] or an event kind over
/// [`MAX_KIND_BYTES`], or one holding a control character (a turn is named again by
/// `fork --after-turn` and `rewind --before-turn`, and one holding NUL never could be; an
/// escape sequence in an id was printed raw by every front end that shows it). Checked once
/// the operation id is known to be new, as a rule added later: a retry of what an older
/// build stored still answers its commit. (A blank turn id is none: derived when the batch
/// starts a turn.)
///
/// # Errors
/// [`Error::InvalidInput`] naming the id or the event.
pub(crate) fn check_names(
    operation_id: &str,
    turn_id: Option<&str>,
    events: &[Event],
) -> Result<()> {
    check_name(|| "operation id".to_owned(), operation_id, MAX_ID_BYTES)?;
    if let Some(turn_id) = turn_id {
        check_name(|| "turn id".to_owned(), turn_id, MAX_ID_BYTES)?;
    }
    for (i, e) in events.iter().enumerate() {
        check_name(|| format!("events[{i}].kind"), &e.kind, MAX_KIND_BYTES)?;
        check_name(|| format!("events[{i}].id"), &e.id, MAX_ID_BYTES)?;
    }
    Ok(())
}

/// [`check_names`] of one name: `what` says which (made only for a refusal: every append
/// checks every event's names).
fn check_name(what: impl FnOnce() -> String, name: &str, max_bytes: usize) -> Result<()> {
    let why = if name.len() > max_bytes {
        format!("is over the {max_bytes}-byte limit")
    } else if name.chars().any(char::is_control) {
        "contains a control character".to_owned()
    } else {
        return Ok(());
    };
    Err(Error::invalid(format!(
        "{} {} {why}",
        what(),
        crate::error::quoted(name)
    )))
}

/// Refuses a batch with a payload nested deeper than [`MAX_PAYLOAD_NESTING`]: the store
/// takes it (its check of JSON text does not recurse), but a reader that parses it
/// recursively cannot (the Python package raised `RecursionError` on every read of the
/// session). Checked once the operation id is known to be new, as a rule added later.
///
/// # Errors
/// [`Error::InvalidInput`] naming the event.
pub(crate) fn check_nesting(events: &[Event]) -> Result<()> {
    for (i, e) in events.iter().enumerate() {
        if let Some(text) = e.payload_str()
            && crate::model::json_scan::nests_deeper_than(text.as_bytes(), MAX_PAYLOAD_NESTING)
        {
            return Err(Error::invalid(format!(
                "events[{i}] payload nests objects and arrays more than {MAX_PAYLOAD_NESTING} deep"
            )));
        }
    }
    Ok(())
}

/// Refuses a batch in which two events carry the same caller-supplied id: an event id
/// names one event (forks, replacements and readers find events by it). Empty ids are
/// derived later, each unique. Ids repeated across batches are not looked up (that would
/// search the log on every append).
///
/// # Errors
/// [`Error::InvalidInput`] naming the id and both events.
pub(crate) fn check_unique_ids(events: &[Event]) -> Result<()> {
    // Allocated at the first id: most batches carry none.
    let mut seen = std::collections::HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if e.id.is_empty() {
            continue;
        }
        if let Some(first) = seen.insert(e.id.as_str(), i) {
            return Err(Error::invalid(format!(
                "events[{i}] repeats the id {} of events[{first}]: an event id must be \
                 unique in its batch",
                crate::error::quoted(&e.id)
            )));
        }
    }
    Ok(())
}

/// [`Batch`]'s fields as serde's derive reads them (from a map or, the reason this is not
/// `Batch`'s own impl, from a sequence).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchFields {
    operation_id: String,
    #[serde(default)]
    turn_id: Option<String>,
    events: Vec<EventFields>,
}

/// An input [`Event`]'s fields as serde's derive reads them, the output-only `seq` and
/// `content_ref` only as present or not, whatever their value: read as [`Event`]'s,
/// `"content_ref": null` and `"seq": 0` passed unnoticed, and `"content_ref": "abc"` was
/// "expected a JSON object" instead of what the key is (outside testing C2). The fields in
/// [`Event`]'s order, so that serde's "expected one of" lists them as it does for an
/// [`Event`] (`json_error_reason` says them as input).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventFields {
    #[serde(default)]
    id: String,
    #[serde(default, deserialize_with = "present")]
    seq: bool,
    kind: String,
    #[serde(default)]
    optional: bool,
    #[serde(default)]
    payload: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    content_ref: bool,
}

/// `true` for a field that is there, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(deserializer).map(|_| true)
}

impl<'de> Deserialize<'de> for Batch {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Accepts a map only, and hands it to the derived reader of the fields.
        struct ObjectOnly;

        impl<'de> serde::de::Visitor<'de> for ObjectOnly {
            type Value = Batch;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(r#"a batch object {"operation_id", "turn_id"?, "events": [...]}"#)
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Batch, A::Error> {
                let fields =
                    BatchFields::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                if let Some(refusal) = output_only_field(&fields.events) {
                    return Err(serde::de::Error::custom(refusal));
                }
                let events = fields.events.into_iter().map(|e| Event {
                    id: e.id,
                    seq: 0,
                    kind: e.kind,
                    optional: e.optional,
                    payload: e.payload,
                    content_ref: None,
                });
                Ok(Batch {
                    operation_id: fields.operation_id,
                    turn_id: fields.turn_id,
                    events: events.collect(),
                })
            }
        }

        deserializer.deserialize_map(ObjectOnly)
    }
}

/// Why a deserialized batch's events are not input, if they are not: an event that came
/// with a `seq` or a `content_ref` (any value), fields the store sets on events it
/// returns. Dropping them would lose what the caller meant (a `content_ref` without a
/// `payload` would be stored with no payload at all), so the batch is refused, naming the
/// event and field.
fn output_only_field(events: &[EventFields]) -> Option<String> {
    events.iter().enumerate().find_map(|(i, e)| {
        if e.seq {
            Some(format!(
                "events[{i}].seq is not input: sequences are assigned when a batch is accepted; \
                 remove the field"
            ))
        } else if e.content_ref {
            Some(format!(
                "events[{i}].content_ref is not input: it names content the store already \
                 holds; give the content itself as \"payload\""
            ))
        } else {
            None
        }
    })
}

/// An accepted batch with its sequence range and identity. Equal commits have equal
/// fields (events as [`Event`] compares them): a commit read back from the file equals the
/// one its append returned.
///
/// ```
/// use session_store::{Batch, CreateOptions, Event, Root, SessionId};
/// # fn main() -> session_store::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// let root = Root::open(dir.path())?;
/// let id = SessionId::new("chat")?;
/// let session = root.create(CreateOptions::with_id(id.clone()))?;
/// let title = Event::new("session/title").with_payload(&serde_json::json!({"title": "Hi"}))?;
/// let commit = session.append(Batch::new("op-1", vec![title]))?;
/// session.close()?;
/// let stored = root.open_reader(&id)?.commits(0, 10)?;
/// assert_eq!(stored, vec![(*commit).clone()]);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Commit {
    /// Id of this commit: 32 lowercase hex characters, derived from the commit's other
    /// fields (`derived_commit_id`); commits of older files keep the random id they got.
    pub commit_id: String,
    /// The batch's operation id.
    pub operation_id: String,
    /// Lowercase hex SHA-256 of the caller-supplied content `{turnId?, events:[{id?, kind,
    /// optional, payload?}]}`, payloads as their exact JSON text (caller-supplied event ids
    /// only; derived ids and the session id are not hashed).
    pub operation_hash: String,
    /// Sequence of the first event.
    pub first_seq: u64,
    /// The turn id (explicit or derived).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Lease generation of the writer that accepted it.
    pub writer_generation: u64,
    /// Acceptance time, milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// The events with their sequences and ids.
    pub events: Vec<Event>,
}

impl Commit {
    /// Sequence of the last event.
    pub fn last_seq(&self) -> u64 {
        self.first_seq + self.events.len() as u64 - 1
    }
}

/// A reference to content stored in the `blobs` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ContentRef {
    /// SHA-256 of the raw bytes, lowercase hex.
    pub digest: String,
    /// Size of the raw bytes.
    pub bytes: u64,
    /// Media type of the bytes (`application/json` for payloads and messages).
    pub media_type: String,
}

impl ContentRef {
    /// A reference to the content of SHA-256 `digest` (lowercase hex), `bytes` long, of
    /// `media_type`. Readers look content up by its digest alone; the size and media type
    /// describe it to the caller.
    pub fn new(digest: impl Into<String>, bytes: u64, media_type: impl Into<String>) -> Self {
        Self {
            digest: digest.into(),
            bytes,
            media_type: media_type.into(),
        }
    }

    /// Whether `text` has a content digest's form: 64 lowercase hex characters (a SHA-256).
    ///
    /// ```
    /// use session_store::ContentRef;
    /// assert!(ContentRef::is_digest(&"0a".repeat(32)));
    /// assert!(!ContentRef::is_digest("zz") && !ContentRef::is_digest(&"0A".repeat(32)));
    /// ```
    pub fn is_digest(text: &str) -> bool {
        text.len() == 64
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }
}

#[derive(Serialize)]
struct HashedEvent<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    kind: &'a str,
    optional: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct HashedBatch<'a> {
    #[serde(rename = "turnId", skip_serializing_if = "Option::is_none")]
    turn_id: Option<&'a str>,
    events: Vec<HashedEvent<'a>>,
}

/// The operation hash: lowercase hex SHA-256 of the JSON encoding of the caller-supplied
/// content `{turnId?, events:[{id?, kind, optional, payload?}]}`.
///
/// `supplied_ids[i]` says whether event `i`'s id came from the caller; derived ids are not
/// hashed, so a retry of the same logical batch hashes the same. Unlike upstream the session
/// id is not hashed, so a session keeps its idempotency keys when imported under a new id.
pub(crate) fn operation_hash(
    turn_id: Option<&str>,
    events: &[Event],
    supplied_ids: &[bool],
) -> String {
    let hashed = HashedBatch {
        turn_id,
        events: events
            .iter()
            .zip(supplied_ids)
            .map(|(e, supplied)| HashedEvent {
                id: supplied.then_some(e.id.as_str()),
                kind: &e.kind,
                optional: e.optional,
                payload: e.payload.as_deref(),
            })
            .collect(),
    };
    // Streamed into the hash: the batch's JSON is never held whole. Serializing borrowed
    // strings and raw values into a hasher cannot fail.
    let mut hasher = HashWriter(Sha256::new());
    let _ = serde_json::to_writer(&mut hasher, &hashed);
    lower_hex(&hasher.0.finalize())
}

/// An `io::Write` that feeds a SHA-256.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The id given to event `index` of a commit whose caller left it empty:
/// `<commit id>.<index>` (unique in the session, recognisable when re-hashing).
pub(crate) fn derived_event_id(commit_id: &str, index: usize) -> String {
    use std::fmt::Write as _;
    let digits = index.checked_ilog10().map_or(1, |d| d as usize + 1);
    let mut id = String::with_capacity(commit_id.len() + 1 + digits);
    id.push_str(commit_id);
    id.push('.');
    // Writing to a `String` cannot fail.
    let _ = write!(id, "{index}");
    id
}

/// Whether `id` is the id [`derived_event_id`] gives event `index` of the commit, checked
/// without allocating (the drain asks this for every event).
pub(crate) fn is_derived_event_id(id: &str, commit_id: &str, index: usize) -> bool {
    let Some(n) = id
        .strip_prefix(commit_id)
        .and_then(|rest| rest.strip_prefix('.'))
    else {
        return false;
    };
    // The exact decimal form only ("01" or "+1" are caller ids, not derived ones).
    let canonical = n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
    canonical && n.parse::<usize>().is_ok_and(|n| n == index)
}

/// Recomputes a stored commit's operation hash, telling derived ids from supplied ones.
pub(crate) fn rehash_commit(commit: &Commit) -> String {
    let supplied: Vec<bool> = commit
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| !is_derived_event_id(&e.id, &commit.commit_id, i))
        .collect();
    operation_hash(commit.turn_id.as_deref(), &commit.events, &supplied)
}

/// Operation ids with this prefix name commits inherited from an ancestor; callers
/// cannot use it.
pub(crate) const INHERITED_OPERATION_PREFIX: &str = "inherit:";

/// The operation id an inherited commit has in a descendant: `inherit:<ancestor>:<commit>`.
/// A commit inherited once keeps its first rebinding.
pub(crate) fn inherited_operation_id(ancestor: &str, commit: &Commit) -> String {
    if commit.operation_id.starts_with(INHERITED_OPERATION_PREFIX) {
        commit.operation_id.clone()
    } else {
        format!(
            "{INHERITED_OPERATION_PREFIX}{ancestor}:{}",
            commit.commit_id
        )
    }
}

/// SHA-256 over a commit's identity fields (not its events, which the operation hash
/// covers): what `commits.row_hash` stores.
pub(crate) fn commit_row_hash(c: &Commit, last_seq: u64) -> String {
    let text = format!(
        "{}\0{}\0{}\0{}\0{}\0{}\0{}\0{}",
        c.commit_id,
        c.operation_id,
        c.operation_hash,
        c.first_seq,
        last_seq,
        c.turn_id.as_deref().unwrap_or(""),
        c.writer_generation,
        c.created_at_ms
    );
    sha256_hex(text.as_bytes())
}

/// The first 16 bytes of SHA-256 over a commit row's identity, as schema version 3 stores
/// it in `commits.row_hash`: the stored commit id (`None` when it is derived), operation id
/// and hash, sequences, turn, generation and time. Unkeyed: it detects damage, not forgery.
pub(crate) fn commit_row_digest(c: &Commit, last_seq: u64, stored_id: Option<&str>) -> [u8; 16] {
    use std::io::Write as _;
    let mut hasher = HashWriter(Sha256::new());
    // Streamed into the hash (the text is never built): the same bytes as the `format!`
    // this was, which every stored row hash was made from. Writing to a hasher cannot fail.
    let _ = write!(
        hasher,
        "commit-v3\0{}\0{}\0{}\0{}\0{}\0{}\0{}\0{}",
        Tagged(stored_id),
        c.operation_id,
        c.operation_hash,
        c.first_seq,
        last_seq,
        Tagged(c.turn_id.as_deref()),
        c.writer_generation,
        c.created_at_ms
    );
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&hasher.0.finalize()[..16]);
    digest
}

/// An optional value of a commit row digest, tagged so that "none" (`-`) stays apart from
/// any stored value (`=value`).
struct Tagged<'a>(Option<&'a str>);

impl std::fmt::Display for Tagged<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(v) => write!(f, "={v}"),
            None => f.write_str("-"),
        }
    }
}

/// The id a commit gets from its other fields: the hex of its row digest with no stored
/// id, so a schema-3 file stores neither (the row hash is the id). Unique in a session:
/// the first sequence is part of it.
pub(crate) fn derived_commit_id(c: &Commit) -> String {
    lower_hex(&commit_row_digest(c, c.last_seq(), None))
}

/// Gives a freshly sequenced commit its derived id ([`derived_commit_id`]) and every event
/// without an id the one derived from it ([`derived_event_id`]).
pub(crate) fn assign_derived_ids(c: &mut Commit) {
    c.commit_id = derived_commit_id(c);
    for (i, e) in c.events.iter_mut().enumerate() {
        if e.id.is_empty() {
            e.id = derived_event_id(&c.commit_id, i);
        }
    }
}

/// The lookup key of an operation id (`commits.operation_key`): the first 8 bytes of its
/// SHA-256 as a signed big-endian integer. Not unique; a lookup confirms the text.
pub(crate) fn operation_key(operation_id: &str) -> i64 {
    let digest = Sha256::digest(operation_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// SHA-256 of bytes, lowercase hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    lower_hex(&Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_recognised_exactly() {
        for (index, id) in [(0, "c1.0"), (9, "c1.9"), (10, "c1.10"), (12345, "c1.12345")] {
            let derived = derived_event_id("c1", index);
            assert_eq!((derived.as_str(), derived.capacity()), (id, id.len()));
        }
        assert!(is_derived_event_id(&derived_event_id("c1", 12), "c1", 12));
        for id in ["c1.012", "c1.+12", "c1.11", "c2.12", "c1.12x", "c112"] {
            assert!(!is_derived_event_id(id, "c1", 12), "{id}");
        }
    }

    /// The operation hash of a batch is pinned: stored hashes of existing files must keep
    /// matching a retry of the same batch.
    #[test]
    fn the_operation_hash_of_a_batch_is_stable() {
        let events = vec![
            Event::new("turn/start").with_id("e1"),
            Event::new("message/complete")
                .with_payload_json(
                    r#"{"message":{"id":"m1","role":"user","content":"héllo \"x\""}}"#,
                )
                .expect("payload"),
        ];
        let hashed = operation_hash(Some("t1"), &events, &[true, false]);
        let json = r#"{"turnId":"t1","events":[{"id":"e1","kind":"turn/start","optional":false},{"kind":"message/complete","optional":false,"payload":{"message":{"id":"m1","role":"user","content":"héllo \"x\""}}}]}"#;
        assert_eq!(hashed, hex::encode(Sha256::digest(json.as_bytes())));
        assert_eq!(
            operation_hash(None, &[], &[]),
            hex::encode(Sha256::digest(br#"{"events":[]}"#))
        );
    }
}
