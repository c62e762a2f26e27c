//! Conversation messages: opaque JSON with a stable `id`, and the model filter.
//!
//! A message keeps its JSON text as given; only `id`, `role` and the few keys the model
//! filter looks at are read (no tree): by a scan of the already validated text in the
//! common form ([`Probed::quick`]), else by one borrowing serde pass. Appends read every
//! message, so this is on the hot path.

use std::borrow::Cow;
use std::sync::Arc;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::format::MAX_PAYLOAD_NESTING;
use crate::model::json_scan;

/// A conversation message. Only its `id` is interpreted by the fold; every other field is
/// kept verbatim (role, content, tool calls, provider-specific fields).
///
/// ```
/// use session_store::Message;
/// let m: Message = serde_json::from_str(r#"{"id":"m1","role":"user","content":"hi"}"#).unwrap();
/// assert_eq!(m.id(), "m1");
/// assert_eq!(m.role(), Some("user"));
/// assert_eq!(m.text().as_deref(), Some("hi"));
/// ```
///
/// Two messages are equal when their JSON texts are (byte for byte, as stored):
///
/// ```
/// use session_store::Message;
/// let a: Message = serde_json::from_str(r#"{"id":"m1","content":"hi"}"#).unwrap();
/// assert_eq!(a, serde_json::from_str::<Message>(r#"{"id":"m1","content":"hi"}"#).unwrap());
/// assert_ne!(a, serde_json::from_str::<Message>(r#"{"content":"hi","id":"m1"}"#).unwrap());
/// ```
///
/// Its `Debug` shows the id and role as text, and the JSON:
///
/// ```
/// use session_store::Message;
/// let m: Message = serde_json::from_str(r#"{"id":"m1","role":"user","content":"hi"}"#).unwrap();
/// assert_eq!(
///     format!("{m:?}"),
///     r#"Message { id: "m1", role: Some("user"), json: "{\"id\":\"m1\",\"role\":\"user\",\"content\":\"hi\"}" }"#
/// );
/// ```
#[derive(Clone)]
pub struct Message {
    /// `None` without an `id` (read as "").
    id: Option<Field>,
    role: Option<Field>,
    /// Whether the provider view differs from the message (local-only or stripped keys).
    filtered: bool,
    /// A JSON object's text, valid JSON: every constructor either has serde_json check it
    /// or takes it from text serde_json checked ([`Message::from_checked_object`]).
    json: Box<str>,
}

/// A string field of a message: where its text sits in the message's JSON when the JSON
/// spells it without escapes (most ids and roles: no allocation of its own), else a copy.
#[derive(Clone)]
enum Field {
    /// Bytes `start..end` of the message's JSON text.
    At { start: usize, end: usize },
    /// The unescaped text.
    Own(Box<str>),
}

impl Field {
    /// The field for `value`, read from `json`.
    fn of(value: Text<'_>, json: &str) -> Field {
        match value.0 {
            Cow::Borrowed(text) => {
                let start = (text.as_ptr() as usize).wrapping_sub(json.as_ptr() as usize);
                let end = start.wrapping_add(text.len());
                // A borrowed string is a slice of `json`; checked all the same.
                if json.get(start..end).is_some_and(|at| at == text) {
                    Field::At { start, end }
                } else {
                    Field::Own(text.into())
                }
            }
            Cow::Owned(text) => Field::Own(text.into_boxed_str()),
        }
    }

    /// The field's text in a message whose JSON is `json`.
    fn get<'a>(&'a self, json: &'a str) -> &'a str {
        match self {
            Field::At { start, end } => json.get(*start..*end).unwrap_or_default(),
            Field::Own(text) => text,
        }
    }
}

/// A JSON string, borrowed from the text being parsed when it holds no escapes (serde's
/// `Cow<str>` borrows only as a field of its own, never inside an `Option`).
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a str>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(Visit(std::marker::PhantomData))
    }
}

/// Fields dropped from the provider view of a message (upstream §1.11).
const PROVIDER_STRIPPED: [&str; 6] = [
    "raw_content",
    "host_authored",
    "decision_receipt",
    "decision_receipts",
    "tool_execution",
    "tool_run_state",
];

/// The keys of a message the store looks at; everything else is skipped unparsed.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    id: Option<Text<'a>>,
    #[serde(borrow, default)]
    role: Option<Text<'a>>,
    local_only: Option<bool>,
    provider_content: Option<IgnoredAny>,
    raw_content: Option<IgnoredAny>,
    host_authored: Option<IgnoredAny>,
    decision_receipt: Option<IgnoredAny>,
    decision_receipts: Option<IgnoredAny>,
    tool_execution: Option<IgnoredAny>,
    tool_run_state: Option<IgnoredAny>,
}

/// What a message's [`Probe`] tells.
struct Probed {
    id: Option<Field>,
    role: Option<Field>,
    /// Whether the provider view differs from the message.
    filtered: bool,
}

/// The keys [`Probed::quick`] reads before [`PROVIDER_STRIPPED`]'s: their slots are
/// their places in this list, the stripped keys' follow.
const PROBED_FIRST: [&str; 4] = ["id", "role", "local_only", "provider_content"];

/// The slot of a probed key ([`PROBED_FIRST`], then [`PROVIDER_STRIPPED`]); `None` for a key
/// the probe skips.
fn probed_slot(key: &[u8]) -> Option<usize> {
    PROBED_FIRST
        .iter()
        .chain(&PROVIDER_STRIPPED)
        .position(|k| k.as_bytes() == key)
}

impl Probed {
    /// Reads the probed keys of a message's JSON text with serde_json (the authority: it
    /// refuses what [`Probe`] refuses).
    fn read(text: &str) -> serde_json::Result<Probed> {
        let p: Probe<'_> = serde_json::from_str(text)?;
        let filtered = p.local_only == Some(true)
            || p.provider_content.is_some()
            || p.raw_content.is_some()
            || p.host_authored.is_some()
            || p.decision_receipt.is_some()
            || p.decision_receipts.is_some()
            || p.tool_execution.is_some()
            || p.tool_run_state.is_some();
        Ok(Probed {
            id: p.id.map(|v| Field::of(v, text)),
            role: p.role.map(|v| Field::of(v, text)),
            filtered,
        })
    }

    /// What [`Probed::read`] answers, for a message's valid JSON text in the common form
    /// (an object whose `id` and `role` are strings without escapes or `null`, each probed
    /// key once, keys without escapes): found by skipping values with
    /// [`json_scan`] instead of a second serde pass over the whole message. `None` for any
    /// other text, which `read` then reads (and refuses where it must).
    fn quick(text: &str) -> Option<Probed> {
        let b = text.as_bytes();
        if b.first() != Some(&b'{') {
            return None;
        }
        let mut out = Probed {
            id: None,
            role: None,
            filtered: false,
        };
        let mut seen = 0u16;
        let mut at = json_scan::skip_space(b, 1);
        if b.get(at) == Some(&b'}') {
            return (json_scan::skip_space(b, at + 1) == b.len()).then_some(out);
        }
        loop {
            if b.get(at) != Some(&b'"') {
                return None;
            }
            let key_end = json_scan::string_end(b, at + 1)?;
            let key = b.get(at + 1..key_end - 1)?;
            if key.contains(&b'\\') {
                // An escaped key may spell a probed one.
                return None;
            }
            at = json_scan::skip_space(b, key_end);
            if b.get(at) != Some(&b':') {
                return None;
            }
            let start = json_scan::skip_space(b, at + 1);
            let end = json_scan::value_end(b, start)?;
            let value = b.get(start..end)?;
            let slot = probed_slot(key);
            if let Some(slot) = slot {
                if seen & (1 << slot) != 0 {
                    // serde refuses a repeated field.
                    return None;
                }
                seen |= 1 << slot;
                match slot {
                    0 | 1 => {
                        let field = match value {
                            b"null" => None,
                            [b'"', inner @ .., b'"'] if !inner.contains(&b'\\') => {
                                Some(Field::At {
                                    start: start + 1,
                                    end: end - 1,
                                })
                            }
                            _ => return None,
                        };
                        if slot == 0 {
                            out.id = field;
                        } else {
                            out.role = field;
                        }
                    }
                    2 => match value {
                        b"true" => out.filtered = true,
                        b"false" | b"null" => {}
                        _ => return None,
                    },
                    _ => out.filtered |= value != b"null",
                }
            }
            at = json_scan::skip_space(b, end);
            match b.get(at) {
                Some(b',') => at = json_scan::skip_space(b, at + 1),
                Some(b'}') => {
                    return (json_scan::skip_space(b, at + 1) == b.len()).then_some(out);
                }
                _ => return None,
            }
        }
    }
}

impl Message {
    fn from_raw(json: Box<RawValue>) -> serde_json::Result<Message> {
        Self::probed(json.into())
    }

    /// A message from `json`, the text of a JSON object that serde_json has already
    /// checked as part of a larger value (a message payload's `message`, found by
    /// [`json_scan::bare_message`]): not parsed again, only probed. The caller guarantees
    /// the text is one valid JSON object; anything else breaks what `json()` promises.
    ///
    /// # Errors
    /// When its `id` / `role` is not a string.
    pub(crate) fn from_checked_object(json: &str) -> serde_json::Result<Message> {
        Self::probed(json.into())
    }

    /// A message from valid JSON object text, its id, role and filter keys probed.
    fn probed(json: Box<str>) -> serde_json::Result<Message> {
        let Probed { id, role, filtered } = match Probed::quick(&json) {
            Some(probed) => probed,
            None => Probed::read(&json)?,
        };
        Ok(Message {
            id,
            role,
            filtered,
            json,
        })
    }

    /// A message from a JSON object.
    ///
    /// # Errors
    /// When `value` is not an object or its `id` / `role` is not a string.
    pub fn from_value(value: &Value) -> serde_json::Result<Message> {
        Self::from_raw(serde_json::value::to_raw_value(value)?)
    }

    /// A message with an id, a role and text content.
    pub fn text_message(id: impl Into<String>, role: &str, content: impl Into<String>) -> Self {
        let value = serde_json::json!({"id": id.into(), "role": role, "content": content.into()});
        // An object of strings always serializes and probes.
        Self::from_value(&value).unwrap_or_else(|_| unreachable!("a JSON object of strings"))
    }

    /// The stable message id ("" only inside bulk replacements).
    pub fn id(&self) -> &str {
        self.id.as_ref().map_or("", |f| f.get(&self.json))
    }

    /// The `role` field, if it is a string.
    pub fn role(&self) -> Option<&str> {
        self.role.as_ref().map(|f| f.get(&self.json))
    }

    /// The message as JSON text, verbatim.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// All fields, parsed; a lone surrogate escape (`\ud800`) in a string is read as
    /// U+FFFD, and a field whose value does not fit a [`Value`] even so (a
    /// number such as `1e999`, nesting past serde_json's depth limit) is left out, not the
    /// whole message (a message with one such value, in metadata say, had no fields:
    /// search did not find its text, the browser showed it as JSON).
    pub fn fields(&self) -> Map<String, Value> {
        parse_deep(&self.json).unwrap_or_else(|| {
            self.entries()
                .into_iter()
                .filter_map(|(key, value)| Some((key, parse_lossy(value.get())?)))
                .collect()
        })
    }

    /// The top-level fields in order, each value as its exact JSON text (no number or
    /// depth a `Value` tree would refuse is lost).
    fn entries(&self) -> Vec<(String, Box<RawValue>)> {
        serde_json::from_str::<Entries>(&self.json)
            .map(|e| e.0)
            .unwrap_or_default()
    }

    /// A message from fields, written in key order (as a `Map` writes them, so a message
    /// rewritten by an earlier build reads the same), values kept as their JSON text.
    fn from_entries(mut entries: Vec<(String, Box<RawValue>)>) -> serde_json::Result<Message> {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut text = String::from("{");
        for (i, (key, value)) in entries.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(&serde_json::to_string(key)?);
            text.push(':');
            text.push_str(value.get());
        }
        text.push('}');
        Self::from_raw(RawValue::from_string(text)?)
    }

    /// The `content` field if it is a string, else `raw_content` (a lone surrogate escape
    /// in it read as U+FFFD).
    pub fn text(&self) -> Option<String> {
        let entries = self.entries();
        ["content", "raw_content"].iter().find_map(|k| {
            entries
                .iter()
                .find(|(key, _)| key == k)
                .and_then(|(_, v)| parse_lossy::<String>(v.get()))
        })
    }

    /// The text a person reads in this message: [`Message::text`], else the `text` of each
    /// part of a `content` array that has one (`{"type": "text" | "input_text" |
    /// "output_text", "text": …}`: Chat Completions' and the Responses API's parts, as the
    /// openai-agents adapter stores an assistant's reply), joined by blank lines; `None`
    /// when there is none (an image, a `reasoning` item). For display: the session
    /// browser and `history` showed such a reply as its JSON (outside testing, session 35).
    /// The fold's preview keeps reading [`Message::text`] alone.
    pub fn display_text(&self) -> Option<String> {
        if let Some(text) = self.text() {
            return Some(text);
        }
        let entries = self.entries();
        let (_, content) = entries.iter().find(|(key, _)| key == "content")?;
        let parts = parse_lossy::<Vec<Value>>(content.get())?;
        let texts: Vec<&str> = parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect();
        (!texts.is_empty()).then(|| texts.join("\n\n"))
    }

    /// The same message with another id; every other field is kept as its exact text.
    pub fn with_id(&self, id: &str) -> Message {
        let mut entries = self.entries();
        entries.retain(|(k, _)| k != "id");
        let id = serde_json::value::to_raw_value(id)
            .unwrap_or_else(|_| unreachable!("a string always serializes"));
        entries.push(("id".to_owned(), id));
        Self::from_entries(entries).unwrap_or_else(|_| self.clone())
    }

    /// The provider view of this message, or `None` when it is local-only. A message that
    /// needs no change is shared, not copied; the fields it keeps keep their exact text.
    pub fn for_model(self: &Arc<Self>) -> Option<Arc<Message>> {
        if !self.filtered {
            return Some(Arc::clone(self));
        }
        let mut entries = self.entries();
        let local = entries
            .iter()
            .any(|(k, v)| k == "local_only" && v.get().trim() == "true");
        if local {
            return None;
        }
        if let Some(at) = entries.iter().position(|(k, _)| k == "provider_content") {
            let (_, provider) = entries.remove(at);
            match entries.iter_mut().find(|(k, _)| k == "content") {
                Some(content) => content.1 = provider,
                None => entries.push(("content".to_owned(), provider)),
            }
        }
        entries.retain(|(k, _)| !PROVIDER_STRIPPED.contains(&k.as_str()));
        Some(Arc::new(
            Self::from_entries(entries).unwrap_or_else(|_| Message::clone(self)),
        ))
    }
}

/// A JSON object's fields in order, values as raw JSON text.
struct Entries(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

/// The id and role as text (the derived form showed where they sit in the JSON, byte
/// offsets that mean nothing to a reader), then the JSON.
impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("id", &self.id())
            .field("role", &self.role())
            .field("json", &self.json())
            .finish()
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json
    }
}

impl Eq for Message {}

/// The JSON text as it is (serde_json's `RawValue`: the text is checked again here, which
/// only writers of a message's JSON pay, not every append).
impl Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde_json::from_str::<&RawValue>(&self.json)
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let json = Box::<RawValue>::deserialize(deserializer)?;
        if !json.get().trim_start().starts_with('{') {
            return Err(serde::de::Error::custom("a message must be a JSON object"));
        }
        Message::from_raw(json).map_err(serde::de::Error::custom)
    }
}

/// `json` parsed as a `T`, a lone UTF-16 surrogate escape (`\ud800`-`\udfff` not in a
/// high-low pair, which `append` keeps as given but serde_json refuses to decode) read as
/// U+FFFD: a message whose text held one had no text (search found none of its words,
/// `history` showed its JSON). `None` when it does not parse even so.
fn parse_lossy<T: serde::de::DeserializeOwned>(json: &str) -> Option<T> {
    parse_deep(json).or_else(|| parse_deep(&without_lone_surrogates(json)?))
}

/// `json` parsed, also past serde_json's limit of 128 levels when it nests no deeper than
/// a payload may ([`MAX_PAYLOAD_NESTING`], checked by the store before it parses): a
/// field nested deeper than 128 (one tool call's arguments, say) was dropped whole, and
/// with it every tool call of the message from the browser and from search (outside
/// testing W2, session 37).
fn parse_deep<T: serde::de::DeserializeOwned>(json: &str) -> Option<T> {
    if let Ok(value) = serde_json::from_str(json) {
        return Some(value);
    }
    if json_scan::nests_deeper_than(json.as_bytes(), MAX_PAYLOAD_NESTING) {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(json);
    de.disable_recursion_limit();
    let value = T::deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(value)
}

/// `json` with each lone surrogate escape replaced by `\ufffd`; `None` when it has none.
/// Every backslash of JSON text starts an escape inside a string, so the text is read
/// escape by escape, a `\\` never taken for the start of one.
fn without_lone_surrogates(json: &str) -> Option<String> {
    let bytes = json.as_bytes();
    let unit = |at: usize| {
        json.get(at..at + 4)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u16::from_str_radix(h, 16).ok())
    };
    let mut out = String::new();
    let mut copied = 0;
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
            continue;
        }
        if bytes.get(at + 1) != Some(&b'u') {
            at += 2;
            continue;
        }
        match unit(at + 2) {
            Some(0xD800..=0xDBFF)
                if bytes.get(at + 6..at + 8) == Some(&b"\\u"[..])
                    && unit(at + 8).is_some_and(|low| (0xDC00..=0xDFFF).contains(&low)) =>
            {
                at += 12;
            }
            Some(0xD800..=0xDFFF) => {
                // The escape is ASCII, so `at` and `copied` are character boundaries.
                out.push_str(&json[copied..at]);
                out.push_str("\\ufffd");
                at += 6;
                copied = at;
            }
            _ => at += 2,
        }
    }
    (copied > 0).then(|| out + &json[copied..])
}

#[cfg(test)]
mod tests {

    #[test]
    fn display_text_reads_text_parts_and_text_first() {
        let shown = |v: serde_json::Value| Message::from_value(&v).expect("message").display_text();
        assert_eq!(
            shown(serde_json::json!({"role": "user", "content": "plain"})).as_deref(),
            Some("plain")
        );
        assert_eq!(
            shown(serde_json::json!({"role": "assistant", "content": [
                {"type": "output_text", "text": "one"}, {"type": "image_url", "url": "x"},
                {"type": "text", "text": "two"}]}))
            .as_deref(),
            Some("one\n\ntwo")
        );
        assert_eq!(
            shown(serde_json::json!({"role": "user", "content": [{"type": "image_url"}]})),
            None
        );
        assert_eq!(
            shown(serde_json::json!({"type": "reasoning", "summary": []})),
            None
        );
    }
    use super::*;
    use proptest::prelude::*;

    /// A probe's answer as text, to compare the two readers.
    fn answer(p: &Probed, text: &str) -> (Option<String>, Option<String>, bool) {
        let field = |f: &Option<Field>| f.as_ref().map(|f| f.get(text).to_owned());
        (field(&p.id), field(&p.role), p.filtered)
    }

    /// Values as JSON text: scalars, strings full of what the scan skips, nested values.
    fn arb_value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            any::<i32>().prop_map(|n| n.to_string()),
            Just("-1.5e3".to_owned()),
            "[a-z\"\\\\{}\\[\\],: \u{e9}]{0,8}".prop_map(|s| Value::from(s).to_string()),
            Just(r#""\u0041\n""#.to_owned()),
        ];
        leaf.prop_recursive(2, 12, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(("[a-z\"]{1,3}", inner), 0..3).prop_map(|v| {
                    let entries: Vec<String> = v
                        .into_iter()
                        .map(|(k, v)| format!("{}:{v}", Value::from(k)))
                        .collect();
                    format!("{{{}}}", entries.join(","))
                }),
            ]
        })
    }

    /// Keys: the probed ones (most), others, and escaped spellings of probed ones.
    fn arb_key() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => prop::sample::select([PROBED_FIRST.as_slice(), &PROVIDER_STRIPPED].concat())
                .prop_map(|k| format!("\"{k}\"")),
            2 => "[a-z_]{1,8}".prop_map(|k| format!("\"{k}\"")),
            1 => Just(r#""i\u0064""#.to_owned()),
            1 => Just(r#""ro\u006ce""#.to_owned()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn the_quick_probe_answers_as_serde_json_or_not_at_all(
            entries in prop::collection::vec((arb_key(), arb_value()), 0..6),
            space in prop::sample::select(vec!["", " ", "\n  "]),
        ) {
            let body: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{space}{k}{space}:{space}{v}{space}"))
                .collect();
            let text = format!("{{{}}}", body.join(","));
            // The same text as a message's RawValue holds it (valid JSON).
            prop_assert!(serde_json::from_str::<&RawValue>(&text).is_ok(), "{}", text);
            let read = Probed::read(&text);
            if let Some(quick) = Probed::quick(&text) {
                let read = read.map_err(|e| TestCaseError::fail(format!("{text}: serde refused: {e}")))?;
                prop_assert_eq!(answer(&quick, &text), answer(&read, &text), "{}", text);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        /// A message payload of the form `{"message":{…}}` read without a second parse
        /// (`MessagePayload::of`) gives the message serde_json gives, or the same refusal.
        #[test]
        fn a_message_payload_read_from_its_checked_text_is_the_one_serde_reads(
            entries in prop::collection::vec((arb_key(), arb_value()), 0..6),
            space in prop::sample::select(vec!["", " "]),
        ) {
            use crate::model::event::Event;
            use crate::model::payload::{MessagePayload, decode};
            let body: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{space}{k}{space}:{space}{v}{space}"))
                .collect();
            let payload = format!(r#"{{"message":{{{}}}}}"#, body.join(","));
            let event = Event::new("message/complete")
                .with_payload_json(&payload)
                .map_err(|e| TestCaseError::fail(format!("{payload}: {e}")))?;
            // Every such payload takes the path without a second parse.
            prop_assert!(crate::model::json_scan::bare_message(&payload).is_some(), "{}", payload);
            let of = MessagePayload::of(&event).map(|p| p.message);
            let serde = decode::<MessagePayload>(&event).map(|p| p.message);
            match (of, serde) {
                (Ok(a), Ok(b)) => {
                    prop_assert_eq!(a.json(), b.json());
                    prop_assert_eq!((a.id(), a.role()), (b.id(), b.role()));
                    prop_assert_eq!(a.filtered, b.filtered, "{}", payload);
                }
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => prop_assert!(false, "{}: {:?} against {:?}", payload, a, b),
            }
        }
    }

    #[test]
    fn common_messages_take_the_quick_probe() {
        for text in [
            r#"{"id":"m1","role":"user","content":"a \" } { [ \\"}"#,
            r#"{"role":"assistant","content":[{"type":"text","text":"}"}],"id":"m2"}"#,
            r#"{ "id" : "m3" , "local_only" : true }"#,
            r#"{"local_only":false,"tool_run_state":null,"role":null}"#,
            r#"{"id":null,"raw_content":{"x":1},"n":-1.5e3}"#,
            "{}",
        ] {
            let quick = Probed::quick(text).expect(text);
            let read = Probed::read(text).expect(text);
            assert_eq!(answer(&quick, text), answer(&read, text), "{text}");
        }
        for text in [
            r#"{"id":"m\u0031"}"#,
            r#"{"i\u0064":"m1"}"#,
            r#"{"id":"m1","id":"m2"}"#,
            r#"{"id":1}"#,
            r#"{"local_only":1}"#,
            "[]",
        ] {
            assert!(Probed::quick(text).is_none(), "{text}");
        }
    }

    #[test]
    fn debug_shows_the_id_and_role_not_their_offsets() {
        // An id with an escape is a copy (`Field::Own`), the role a slice of the JSON.
        let m: Message =
            serde_json::from_str(r#"{"id":"a\u0062","role":"user","content":"x"}"#).unwrap();
        let shown = format!("{m:?}");
        assert!(
            shown.starts_with(r#"Message { id: "ab", role: Some("user"), json: "#),
            "{shown}"
        );
        assert!(!shown.contains("start"), "{shown}");
    }

    #[test]
    fn keeps_json_verbatim_and_filters_for_the_model() {
        let text = r#"{"role":"assistant","id":"a","content":"x","provider_content":"P","raw_content":"r"}"#;
        let m: Arc<Message> = Arc::new(serde_json::from_str(text).unwrap());
        assert_eq!(m.json(), text);
        assert_eq!(serde_json::to_string(&*m).unwrap(), text);
        let model = m.for_model().unwrap();
        assert_eq!(model.text().as_deref(), Some("P"));
        assert!(!model.fields().contains_key("raw_content"));
        let local: Arc<Message> =
            Arc::new(serde_json::from_str(r#"{"id":"l","local_only":true}"#).unwrap());
        assert!(local.for_model().is_none());
        assert!(serde_json::from_str::<Message>(r#"{"id":1}"#).is_err());
        assert!(serde_json::from_str::<Message>(r#"[1]"#).is_err());
        assert!(serde_json::from_str::<Message>(r#"{"id":"x","id":"y"}"#).is_err());
    }

    #[test]
    fn ids_and_roles_read_alike_with_and_without_escapes() {
        for (text, id, role) in [
            (r#"{"id":"m1","role":"user"}"#, "m1", Some("user")),
            (r#"{ "role" : "tool" , "id" : "" }"#, "", Some("tool")),
            (
                r#"{"id":"a\"b\u00e9","role":"us\u0065r"}"#,
                "a\"bé",
                Some("user"),
            ),
            (r#"{"role":null,"content":"x"}"#, "", None),
        ] {
            let m: Message = serde_json::from_str(text).unwrap();
            assert_eq!((m.id(), m.role(), m.json()), (id, role, text), "{text}");
            let copy = m.clone();
            drop(m);
            assert_eq!((copy.id(), copy.role()), (id, role), "{text}");
        }
        for bad in [
            r#"{"id":1}"#,
            r#"{"role":["user"]}"#,
            r#"{"role":"a","role":"b"}"#,
        ] {
            let err = serde_json::from_str::<Message>(bad)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("expected a string") || err.contains("duplicate field"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_lone_surrogate_escape_is_read_as_a_replacement_character() {
        let m: Message = serde_json::from_str(
            r#"{"id":"m","role":"user","content":"alpha \ud800 beta \udc00\ud83d\ude00 \\ud800 \ud83d","n":1e999}"#,
        )
        .unwrap();
        let want = "alpha \u{fffd} beta \u{fffd}\u{1f600} \\ud800 \u{fffd}";
        assert_eq!(m.text().as_deref(), Some(want));
        assert_eq!(m.fields().get("content"), Some(&Value::from(want)));
        assert_eq!(m.fields().get("role"), Some(&Value::from("user")));
        // The stored text is unchanged.
        assert!(m.json().contains(r"\ud800 beta"));
        assert_eq!(
            without_lone_surrogates(r#"{"a":"\ud83d\ude00 \\ud800"}"#),
            None
        );
    }

    #[test]
    fn rewrites_keep_values_a_value_tree_would_refuse() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let text =
            format!(r#"{{"role":"user","content":[1e999,-0],"x":{deep},"raw_content":"r"}}"#);
        let m: Arc<Message> = Arc::new(serde_json::from_str(&text).unwrap());
        let renamed = m.with_id("n");
        assert_eq!(
            renamed.json(),
            format!(
                r#"{{"content":[1e999,-0],"id":"n","raw_content":"r","role":"user","x":{deep}}}"#
            )
        );
        assert_eq!(renamed.id(), "n");
        let model = m.for_model().unwrap();
        assert_eq!(
            model.json(),
            format!(r#"{{"content":[1e999,-0],"role":"user","x":{deep}}}"#)
        );
        assert_eq!(m.text().as_deref(), Some("r"));
    }
}
