//! The payload schemas: typed serde structs for the payloads the projection folds
//! (strict: unknown keys are refused) and for those the library writes itself, with the
//! checks they share. Kind names and allowed values are in [`crate::model::kind`].
//!
//! The structs the library writes declare their fields in key order, so they serialize
//! to the very bytes a `serde_json::json!` object of the same keys gives (its map is
//! sorted): files written before and after read the same.

use std::sync::Arc;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::model::event::Event;
use crate::model::json_scan;
use crate::model::kind::USAGE;
use crate::model::message::Message;
use crate::model::usage::{Cost, UsageRecord};

/// One todo item of `todo/write`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Todo {
    /// What to do (non-blank, trimmed, unique in the list).
    pub content: String,
    /// `pending`, `in_progress` or `completed`.
    pub status: String,
}

impl Todo {
    /// A todo item. `todo/write` accepts it when `content` is non-blank, trimmed and unique
    /// in the list, and `status` is `pending`, `in_progress` or `completed`.
    pub fn new(content: impl Into<String>, status: impl Into<String>) -> Self {
        Todo {
            content: content.into(),
            status: status.into(),
        }
    }
}

/// Recovery state recorded by `runtime/recovery` (snake_case keys, strict).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RecoveryStatus {
    /// E.g. `recovery_required`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// The tool call concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The attempt concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<String>,
    /// Whether a person must decide how to continue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_user_decision: Option<bool>,
    /// Whether the interrupted work was read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Phase of the interrupted work, e.g. `tool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why recovery is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When a retry is planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<Value>,
    /// How long the runtime waited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// How long it may wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_budget_ms: Option<u64>,
    /// Whether it is still waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<bool>,
}

impl RecoveryStatus {
    /// A status in `state` (e.g. `recovery_required`) with every other field unset; set
    /// the ones that apply on the returned value.
    pub fn new(state: impl Into<String>) -> Self {
        RecoveryStatus {
            state: state.into(),
            ..RecoveryStatus::default()
        }
    }
}

/// `message/complete` and `message/upsert`: one message.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessagePayload {
    #[serde(deserialize_with = "shared")]
    pub(crate) message: Arc<Message>,
}

impl MessagePayload {
    /// The payload of `event`. In the common form, exactly `{"message":{…}}`, the message
    /// is taken from the event's payload text, which serde_json checked when the event
    /// was made, without a second parse ([`json_scan::bare_message`],
    /// [`Message::from_checked_object`]; the serde pass it saves was 29% of
    /// `Session::append`'s samples under `perf` in `bench --sessions 1`, session 32); any
    /// other form, or a message that does not probe, is read by [`decode`], with its
    /// errors.
    pub(crate) fn of(event: &Event) -> Result<MessagePayload> {
        let checked = event
            .payload_str()
            .and_then(json_scan::bare_message)
            .and_then(|text| Message::from_checked_object(text).ok());
        match checked {
            Some(message) => Ok(MessagePayload {
                message: Arc::new(message),
            }),
            None => decode(event),
        }
    }
}

/// A message read straight into its `Arc` (serde's `Arc<T>` reads a `Box<T>`, then copies
/// it into a second allocation).
fn shared<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Arc<Message>, D::Error> {
    Message::deserialize(deserializer).map(Arc::new)
}

/// Messages read as [`shared`] does.
fn all_shared<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<Arc<Message>>, D::Error> {
    Ok(Vec::<Message>::deserialize(deserializer)?
        .into_iter()
        .map(Arc::new)
        .collect())
}

/// `assistant/attempt`: the attempt id and its action (`kind::ATTEMPT_ACTIONS`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AttemptPayload {
    pub(crate) id: String,
    #[serde(rename = "messageId")]
    _message_id: Option<IgnoredAny>,
    pub(crate) action: String,
    #[serde(rename = "attempt")]
    _attempt: Option<IgnoredAny>,
    #[serde(rename = "max")]
    _max: Option<IgnoredAny>,
    #[serde(rename = "reason")]
    _reason: Option<IgnoredAny>,
}

/// `history/replace`, `model/context-replace` and `compaction`: the replacing messages.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessagesPayload {
    #[serde(deserialize_with = "all_shared")]
    pub(crate) messages: Vec<Arc<Message>>,
    #[serde(rename = "reason")]
    _reason: Option<IgnoredAny>,
    #[serde(rename = "trigger")]
    _trigger: Option<IgnoredAny>,
    #[serde(rename = "sourceSequences")]
    _source_sequences: Option<Vec<u64>>,
}

/// `legacy/import`: a whole legacy transcript with its goal and model.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LegacyImport {
    #[serde(rename = "source")]
    _source: Option<IgnoredAny>,
    #[serde(deserialize_with = "all_shared")]
    pub(crate) messages: Vec<Arc<Message>>,
    pub(crate) goal: Option<Value>,
    #[serde(rename = "modelRef", default)]
    pub(crate) model_ref: String,
    #[serde(rename = "modelIdentity")]
    pub(crate) model_identity: Option<Value>,
}

/// `session/title`: read by the fold and written by [`title_event`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TitlePayload {
    pub(crate) title: String,
}

/// Whether `c` is a character a terminal draws as nothing, or as a line break: Unicode's
/// Default_Ignorable_Code_Point set (zero-width space, joiners, direction marks, the word
/// joiner and invisible operators, the byte-order mark, the soft hyphen, the combining
/// grapheme joiner, Hangul and Khmer fillers, Mongolian and other variation selectors,
/// tags, ...), the interlinear annotation marks and the line and paragraph separators.
/// A title of these and white space alone is blank; the command line and `serve` write
/// them as escapes in session ids (outside testing U1, session 48: `tag` + U+E0041 + `x`
/// was listed as `tagx`, another session's id, as were ids holding U+034F, U+FE0F,
/// U+180E, U+206A-U+206F or U+3164).
///
/// ```
/// assert!(session_store::is_invisible('\u{200b}'));
/// assert!(!session_store::is_invisible('a'));
/// ```
pub fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{034f}'
            | '\u{061c}'
            | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{2029}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fffb}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// Longest title, in UTF-8 bytes, that [`title_event`] and an appended `session/title`
/// accept (a title is shown in one line of a listing and kept in the catalog).
pub(crate) const MAX_TITLE_BYTES: usize = 1024;

/// Why `title` is refused, if it is: blank (empty, or white space and characters drawn as
/// nothing, [`is_invisible`]: a title of zero-width spaces was listed as no text, and the
/// browser's link to the session had none, outside testing U7), holding a NUL character
/// (SQLite's text functions and C tools such as `sqlite3` end a string there), or longer
/// than [`MAX_TITLE_BYTES`]. Refused by [`title_event`] and, on append, in a
/// `session/title` event; a stored one still folds.
pub(crate) fn title_problem(title: &str) -> Option<String> {
    if title.chars().all(|c| c.is_whitespace() || is_invisible(c)) {
        Some("a title must not be blank".to_owned())
    } else if title.contains('\0') {
        Some("a title must not contain a NUL character (\\0)".to_owned())
    } else if title.len() > MAX_TITLE_BYTES {
        Some(format!(
            "a title must be at most {MAX_TITLE_BYTES} bytes (UTF-8), this one is {}",
            title.len()
        ))
    } else {
        None
    }
}

/// The `session/title` event that renames a session to `title`.
///
/// # Errors
/// [`Error::InvalidInput`] for a title [`title_problem`] refuses.
pub(crate) fn title_event(title: &str) -> Result<Event> {
    if let Some(problem) = title_problem(title) {
        return Err(Error::invalid(problem));
    }
    Event::new(crate::model::kind::SESSION_TITLE).with_payload(&TitlePayload {
        title: title.to_owned(),
    })
}

/// `usage`: one model call's token counts and cost, under the providers' own field names.
/// Counts are non-negative integers; `cost` is an exact decimal string ([`Cost`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UsagePayload {
    model: String,
    input_tokens: u64,
    output_tokens: u64,
    cache_read_tokens: Option<u64>,
    cache_write_tokens: Option<u64>,
    cost: Option<Cost>,
}

/// Longest `model` name of a `usage` event (the totals keep one entry per name).
const MAX_USAGE_MODEL_BYTES: usize = 256;

impl UsagePayload {
    /// The checked record: `model` must be non-blank and at most 256 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidPayload`] naming `usage`.
    pub(crate) fn record(self) -> Result<UsageRecord> {
        if let Some(why) = missing_or_blank("model", &self.model) {
            return Err(bad(USAGE, why));
        }
        if self.model.len() > MAX_USAGE_MODEL_BYTES {
            return Err(bad(
                USAGE,
                format!("model is longer than {MAX_USAGE_MODEL_BYTES} bytes"),
            ));
        }
        Ok(UsageRecord {
            model: self.model,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cache_read_tokens: self.cache_read_tokens.unwrap_or(0),
            cache_write_tokens: self.cache_write_tokens.unwrap_or(0),
            cost: self.cost,
        })
    }
}

/// `session/config`: the model (`modelRef` must not be blank).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigPayload {
    #[serde(rename = "modelRef")]
    pub(crate) model_ref: String,
    #[serde(rename = "modelIdentity")]
    pub(crate) model_identity: Option<Value>,
}

/// `turn/end`: a terminal status (`kind::TERMINAL_TURN_STATUSES`); read by the fold and
/// written by restart recovery.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TurnEndPayload {
    pub(crate) status: String,
}

/// `step/start` and `step/end`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepPayload {
    pub(crate) id: String,
    #[serde(rename = "status")]
    _status: Option<IgnoredAny>,
}

/// `tool/start`: the call that became active.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolStartPayload {
    pub(crate) id: String,
    pub(crate) name: String,
}

/// `tool/call` and `tool/result` keys (upstream §1.6); `tool/result` adds five more.
macro_rules! tool_payload {
    ($(#[$doc:meta])* $name:ident { $($extra:ident : $key:literal),* }) => {
        $(#[$doc])*
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        pub(crate) struct $name {
            pub(crate) id: String,
            pub(crate) name: String,
            args: Option<IgnoredAny>,
            #[serde(rename = "runState")] run_state: Option<IgnoredAny>,
            diagnostic: Option<IgnoredAny>,
            #[serde(rename = "resolvedName")] resolved_name: Option<IgnoredAny>,
            #[serde(rename = "capabilityId")] capability_id: Option<IgnoredAny>,
            #[serde(rename = "readOnly")] read_only: Option<IgnoredAny>,
            truncated: Option<IgnoredAny>,
            #[serde(rename = "durationMs")] duration_ms: Option<IgnoredAny>,
            #[serde(rename = "startedAt")] started_at: Option<IgnoredAny>,
            #[serde(rename = "endedAt")] ended_at: Option<IgnoredAny>,
            partial: Option<IgnoredAny>,
            #[serde(rename = "argChars")] arg_chars: Option<IgnoredAny>,
            refreshed: Option<IgnoredAny>,
            #[serde(rename = "parentId")] parent_id: Option<IgnoredAny>,
            #[serde(rename = "attemptId")] attempt_id: Option<IgnoredAny>,
            #[serde(rename = "subagentRef")] subagent_ref: Option<IgnoredAny>,
            #[serde(rename = "subagentStatus")] subagent_status: Option<IgnoredAny>,
            #[serde(rename = "subagentErrorCode")] subagent_error_code: Option<IgnoredAny>,
            #[serde(rename = "subagentRetryable")] subagent_retryable: Option<IgnoredAny>,
            diff: Option<IgnoredAny>,
            added: Option<IgnoredAny>,
            removed: Option<IgnoredAny>,
            profile: Option<IgnoredAny>,
            execution: Option<IgnoredAny>,
            #[serde(rename = "presentedFiles")] presented_files: Option<IgnoredAny>,
            #[serde(rename = "workspaceMutation")] workspace_mutation: Option<IgnoredAny>,
            #[serde(rename = "workspacePaths")] workspace_paths: Option<IgnoredAny>,
            #[serde(rename = "workspaceAllPaths")] workspace_all_paths: Option<IgnoredAny>,
            $(#[serde(rename = $key)] $extra: Option<IgnoredAny>,)*
        }
    };
}
tool_payload!(
    /// `tool/call`: the call the model asked for.
    ToolCallPayload {}
);
tool_payload!(
    /// `tool/result`, as the fold reads it.
    ToolResultPayload {
    error: "error",
    output: "output",
    state: "state",
    todos: "todos",
    todo_written: "todoWritten"
});

/// A `message/complete` payload the library writes (legacy migration), serialized from
/// the message's own JSON text (a `json!` tree would refuse numbers like `1e999` and deep
/// nesting).
#[derive(Serialize)]
pub(crate) struct MessageOut<'a> {
    /// The message.
    pub(crate) message: &'a Message,
}

/// A `tool/result` the library writes (restart recovery): a call closed without its
/// result. Fields in key order (see the module docs).
#[derive(Serialize)]
pub(crate) struct ToolResultOut<'a> {
    /// Why there is no result.
    pub(crate) error: &'a str,
    /// The call id.
    pub(crate) id: &'a str,
    /// The tool name.
    pub(crate) name: &'a str,
    /// The result state, e.g. `kind::TOOL_RESULT_UNKNOWN`.
    pub(crate) state: &'a str,
}

/// `todo/write`: the whole todo list.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TodoPayload {
    pub(crate) todos: Vec<Todo>,
}

/// `interaction/created`: a pending interaction (state empty or `pending`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InteractionCreatedPayload {
    pub(crate) id: String,
    #[serde(rename = "toolCallId")]
    _tool_call_id: Option<IgnoredAny>,
    #[serde(rename = "kind")]
    _kind: Option<IgnoredAny>,
    #[serde(default)]
    pub(crate) state: String,
    #[serde(rename = "sessionId")]
    _session_id: Option<IgnoredAny>,
    #[serde(rename = "headId")]
    _head_id: Option<IgnoredAny>,
    #[serde(rename = "turnId")]
    _turn_id: Option<IgnoredAny>,
    #[serde(rename = "runtimeEpoch")]
    _runtime_epoch: Option<IgnoredAny>,
}

/// `interaction/resolved`: the interaction and how it was resolved
/// (`kind::INTERACTION_RESOLVED_STATES`); read by the fold and written by restart recovery.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InteractionResolvedPayload {
    pub(crate) id: String,
    pub(crate) state: String,
}

/// An [`Error::InvalidPayload`] for `kind`.
pub(crate) fn bad(kind: &str, reason: impl Into<String>) -> Error {
    Error::InvalidPayload {
        kind: kind.to_owned(),
        reason: reason.into(),
    }
}

/// Decodes an event's payload into its schema.
///
/// # Errors
/// [`Error::InvalidPayload`] without a payload or when it does not fit.
pub(crate) fn decode<T: DeserializeOwned>(event: &Event) -> Result<T> {
    let text = event
        .payload_str()
        .ok_or_else(|| bad(&event.kind, "payload is required"))?;
    serde_json::from_str(text).map_err(|e| bad(&event.kind, payload_json_error(&e, text)))
}

/// The reason a payload's text does not fit its schema, with the position serde_json gives
/// said to be in the payload: its bare "at line 1 column 60" read as a line of the
/// caller's own input (`append` names the input line before it).
fn payload_json_error(e: &serde_json::Error, text: &str) -> String {
    let message = json_error_reason(e, text);
    match e.line() {
        0 => message,
        1 => format!("{message} (column {} of the payload)", e.column()),
        line => format!(
            "{message} (line {line} column {} of the payload)",
            e.column()
        ),
    }
}

/// The end of serde's "unknown field" error for an [`Event`](crate::Event): its fields,
/// `seq` and `content_ref` (output only) among them.
const EVENT_FIELDS: &str =
    "expected one of `id`, `seq`, `kind`, `optional`, `payload`, `content_ref`";

/// What serde_json found wrong in the JSON `text` it was parsing (error `e`), without its
/// "at line L column C" (the caller says where, in its own terms). A lone UTF-16
/// surrogate escape (`"\ud800"`: serde_json says "unexpected end of hex escape" or "lone
/// leading surrogate in hex escape", its only uses of either) is said as such, naming
/// the key whose value holds it.
///
/// ```
/// let text = r#"{"title": "\ud800"}"#;
/// let e = serde_json::from_str::<serde_json::Value>(text).unwrap_err();
/// assert_eq!(
///     session_store::json_error_reason(&e, text),
///     r#"the value of "title" holds a lone UTF-16 surrogate escape (\ud800-\udfff not in a high-low pair), which is not valid Unicode"#
/// );
/// ```
pub fn json_error_reason(e: &serde_json::Error, text: &str) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = full.strip_suffix(&suffix).unwrap_or(&full);
    // An event's output-only fields are in serde's list of its fields, and always
    // refused as input (outside testing, session 43).
    if let Some(head) = message.strip_suffix(EVENT_FIELDS) {
        return format!("{head}expected one of `kind`, `payload`, `optional`, `id`");
    }
    if message != "unexpected end of hex escape"
        && message != "lone leading surrogate in hex escape"
    {
        return without_struct_name(message);
    }
    let place = match key_of_string_at(text, e.line(), e.column()) {
        Some(key) => format!("the value of {}", crate::quoted(&key)),
        None => "a string".to_owned(),
    };
    format!(
        "{place} holds a lone UTF-16 surrogate escape (\\ud800-\\udfff not in a high-low \
         pair), which is not valid Unicode"
    )
}

/// `message` with serde's name of a Rust type ("expected struct TitlePayload", "expected
/// struct Event") said as what it is to a caller, a JSON object: the name meant nothing
/// outside this crate (outside testing Z2, fuzzing: 20 event kinds said so for a payload
/// of the wrong JSON type).
fn without_struct_name(message: &str) -> String {
    const STRUCT: &str = "expected struct ";
    match message.find(STRUCT) {
        Some(at) => {
            let rest = &message[at + STRUCT.len()..];
            let name_end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            format!(
                "{}expected a JSON object{}",
                &message[..at],
                &rest[name_end..]
            )
        }
        None => message.to_owned(),
    }
}

/// The key of the object member whose string value is open at 1-based `line` and
/// `column` (bytes) of `text`, when that string is a member's value; `None` otherwise.
/// Read backwards from there: the string's opening quote (one no odd run of backslashes
/// escapes), which must hold a surrogate escape, a `:`, then the key's quoted text.
fn key_of_string_at(text: &str, line: usize, column: usize) -> Option<String> {
    let start = text
        .split_inclusive('\n')
        .take(line.checked_sub(1)?)
        .map(str::len)
        .sum::<usize>();
    // serde_json's column is the byte it stopped at (past the escape): not looked at.
    let end = (start + column.checked_sub(1)?).min(text.len());
    let bytes = text.as_bytes();
    let unescaped_quote = |at: usize| {
        bytes[at] == b'"'
            && bytes[..at]
                .iter()
                .rev()
                .take_while(|b| **b == b'\\')
                .count()
                % 2
                == 0
    };
    let open = (0..end).rev().find(|&i| unescaped_quote(i))?;
    // The string found holds a surrogate escape, or the position was not in `text` (one
    // serde_json gives of a nested text a type parses on its own).
    // A position of another text may fall inside a character of this one.
    let held = text.get(open..end)?.to_ascii_lowercase();
    let surrogate = held
        .match_indices("\\ud")
        .any(|(i, _)| matches!(held.as_bytes().get(i + 3), Some(b'8'..=b'9' | b'a'..=b'f')));
    if !surrogate {
        return None;
    }
    let before = text.get(..open)?.trim_end();
    let before = before.strip_suffix(':')?.trim_end();
    let key_end = before.len().checked_sub(1)?;
    if !unescaped_quote(key_end) {
        return None;
    }
    let key_open = (0..key_end).rev().find(|&i| unescaped_quote(i))?;
    serde_json::from_str(&text[key_open..=key_end]).ok()
}

/// Why `value`, a field named `what` that must hold text, holds none: `"{what} is
/// required"` when it is empty (or absent), `"{what} must not be blank"` when it is only
/// white space (a blank model said "model is required", though one was given: outside
/// testing, session 43); `None` when it holds text.
pub(crate) fn missing_or_blank(what: &str, value: &str) -> Option<String> {
    if value.is_empty() {
        Some(format!("{what} is required"))
    } else if value.trim().is_empty() {
        Some(format!("{what} must not be blank"))
    } else {
        None
    }
}

/// Refuses a blank id.
///
/// # Errors
/// [`Error::InvalidPayload`] naming `kind`.
pub(crate) fn required_id(kind: &str, id: &str) -> Result<()> {
    match missing_or_blank("id", id) {
        Some(why) => Err(bad(kind, why)),
        None => Ok(()),
    }
}

/// Refuses a `field` whose value is not one of `allowed`.
///
/// # Errors
/// [`Error::InvalidPayload`] naming `kind`, the field and the allowed values.
pub(crate) fn one_of(kind: &str, field: &str, value: &str, allowed: &[&str]) -> Result<()> {
    if !allowed.contains(&value) {
        return Err(bad(
            kind,
            format!("{field} {value:?} is not one of {allowed:?}"),
        ));
    }
    Ok(())
}

/// Refuses, on append only, what a required event's payload text holds that its readers
/// would read apart: an object holding a key twice, at any depth (serde_json and Python
/// keep the last value, the sqlite3 shell's `json_extract` and the history page the first:
/// a message of two `content` keys read "harmless" on the page and "hidden secret" in
/// search and Python, outside testing U3, session 48), and a payload given as a JSON array
/// where its kind takes a JSON object, or a `todo/write` todo given as one: serde reads a
/// struct from an array of its fields in order, so `["x"]` was stored as a title and
/// `[{…}]` as a message payload, in a form none of the log's other readers (the sqlite3
/// shell's views, search, Python) read as the event (outside testing, session 47). A
/// stored one still folds, so files written before the rule keep opening, replaying and
/// verifying. Checked before the payloads' schemas, so that an array is said to be one,
/// not "invalid length 2, expected a JSON object with 35 elements". `events` have their
/// kinds trimmed; an unknown kind, `turn/start` and `diagnostic` (which read no payload)
/// are left alone, as is a `todo/write` payload that is no object of todos (its schema
/// says why).
///
/// # Errors
/// [`Error::InvalidPayload`] of the event's kind, naming the key or the array.
pub(crate) fn check_shapes(events: &[Event]) -> Result<()> {
    use crate::model::kind::{DIAGNOSTIC, PROJECTION_KINDS, TODO_WRITE, TURN_START};
    for event in events.iter().filter(|e| !e.optional) {
        let kind = event.kind.as_str();
        let Some(text) = event.payload_str() else {
            continue;
        };
        if kind == TURN_START || kind == DIAGNOSTIC || !PROJECTION_KINDS.contains(&kind) {
            continue;
        }
        if text.trim_start().starts_with('[') {
            return Err(bad(kind, "payload must be a JSON object, not an array"));
        }
        if let Some(key) = json_scan::repeated_key(text) {
            return Err(bad(
                kind,
                format!(
                    "payload holds the key {} twice in one object (readers would disagree \
                     on its value)",
                    crate::quoted(&key)
                ),
            ));
        }
        if kind == TODO_WRITE
            && let Ok(todos) = serde_json::from_str::<TodoShapes>(text)
        {
            let array = |t: &&RawValue| t.get().trim_start().starts_with('[');
            if let Some(i) = todos.todos.iter().position(array) {
                return Err(bad(
                    kind,
                    format!("todos[{i}] must be a JSON object, not an array"),
                ));
            }
        }
    }
    Ok(())
}

/// A `todo/write` payload's todos as their JSON text, for [`check_shapes`].
#[derive(Deserialize)]
struct TodoShapes<'a> {
    #[serde(borrow)]
    todos: Vec<&'a RawValue>,
}

/// Decodes a payload that must be a JSON object (`plan/state`, `goal/state`).
///
/// # Errors
/// As [`decode`], and when the payload is not an object.
pub(crate) fn json_object(event: &Event) -> Result<Value> {
    let value: Value = decode(event)?;
    if !value.is_object() {
        return Err(bad(&event.kind, "payload must be a JSON object"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::kind::{INTERACTION_UNAVAILABLE, TOOL_RESULT_UNKNOWN, TURN_INTERRUPTED};

    /// An event's unknown field names the fields input takes, not `seq` and `content_ref`
    /// (output only, always refused as input): the list serde derives is the one
    /// [`EVENT_FIELDS`] takes off.
    #[test]
    fn an_unknown_event_field_names_the_fields_input_takes() {
        let text = r#"{"kind": "turn/start", "optinal": true}"#;
        let e = serde_json::from_str::<crate::Event>(text).unwrap_err();
        assert_eq!(
            json_error_reason(&e, text),
            "unknown field `optinal`, expected one of `kind`, `payload`, `optional`, `id`"
        );
    }

    /// A payload or event of the wrong JSON type is said to need a JSON object, not named
    /// by its Rust type ("expected struct TitlePayload"; outside testing Z2).
    #[test]
    fn a_value_that_is_no_object_is_said_to_need_one() {
        let text = r#""x""#;
        let e = serde_json::from_str::<crate::Event>(text).unwrap_err();
        assert_eq!(
            json_error_reason(&e, text),
            "invalid type: string \"x\", expected a JSON object"
        );
        let event = crate::Event::new("session/title")
            .with_payload_json(r#""x""#)
            .expect("JSON");
        let Err(e) = decode::<TitlePayload>(&event) else {
            panic!("a title payload that is no object was decoded");
        };
        let said = e.to_string();
        assert!(said.contains("expected a JSON object"), "{said}");
        assert!(!said.contains("struct"), "{said}");
    }

    /// A position serde_json gave of another text (a message parsed on its own) can fall
    /// inside a character of this one: the key is not named, nothing panics (slicing there
    /// panicked).
    #[test]
    fn a_position_inside_a_character_names_no_key() {
        let text = r#"{"k": "é\ud800"}"#;
        for column in 1..=text.len() + 2 {
            let _ = key_of_string_at(text, 1, column);
        }
        assert_eq!(key_of_string_at(text, 1, 10), None);
        assert_eq!(key_of_string_at(text, 1, 16).as_deref(), Some("k"));
    }

    /// The payloads the library writes serialize to the bytes the `json!` objects of
    /// earlier builds gave, so files written before and after compare equal.
    #[test]
    fn written_payloads_keep_their_bytes() {
        let tool = ToolResultOut {
            error: "why",
            id: "c1",
            name: "bash",
            state: TOOL_RESULT_UNKNOWN,
        };
        let expected =
            json!({"id": "c1", "name": "bash", "state": "result_unknown", "error": "why"});
        assert_eq!(
            serde_json::to_string(&tool).unwrap(),
            serde_json::to_string(&expected).unwrap()
        );
        let resolved = InteractionResolvedPayload {
            id: "i1".to_owned(),
            state: INTERACTION_UNAVAILABLE.to_owned(),
        };
        assert_eq!(
            serde_json::to_string(&resolved).unwrap(),
            serde_json::to_string(&json!({"id": "i1", "state": "unavailable"})).unwrap()
        );
        let end = TurnEndPayload {
            status: TURN_INTERRUPTED.to_owned(),
        };
        assert_eq!(
            serde_json::to_string(&end).unwrap(),
            r#"{"status":"interrupted"}"#
        );
        let m: Message = serde_json::from_str(r#"{"id":"a","role":"user","n":1e999}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&MessageOut { message: &m }).unwrap(),
            r#"{"message":{"id":"a","role":"user","n":1e999}}"#
        );
    }

    /// The constructors of the records a host builds give the payloads the fold accepts.
    #[test]
    fn constructors_build_accepted_payloads() {
        let mut recovery = RecoveryStatus::new("recovery_required");
        recovery.call_id = Some("c1".to_owned());
        assert_eq!(
            serde_json::to_string(&recovery).unwrap(),
            r#"{"state":"recovery_required","call_id":"c1"}"#
        );
        let todos = vec![Todo::new("write it", "pending")];
        let event = Event::new(crate::model::kind::TODO_WRITE)
            .with_payload(&json!({ "todos": todos }))
            .unwrap();
        let folded: TodoPayload = decode(&event).unwrap();
        assert_eq!(folded.todos, todos);
        let event = Event::new(crate::model::kind::RUNTIME_RECOVERY)
            .with_payload(&recovery)
            .unwrap();
        assert_eq!(decode::<RecoveryStatus>(&event).unwrap(), recovery);
    }
}
