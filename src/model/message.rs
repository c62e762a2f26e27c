//! Conversation messages: opaque JSON with a stable `id`, and the model filter.
//!
//! A message keeps its JSON text as given; only `id`, `role` and the few keys the model
//! filter looks at are parsed (one borrowing pass, no tree). Appends parse every message,
//! so this is on the hot path.

use std::borrow::Cow;
use std::sync::Arc;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

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
#[derive(Clone, Debug)]
pub struct Message {
    id: String,
    role: Option<String>,
    /// Whether the provider view differs from the message (local-only or stripped keys).
    filtered: bool,
    json: Box<RawValue>,
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
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    local_only: Option<bool>,
    provider_content: Option<IgnoredAny>,
    raw_content: Option<IgnoredAny>,
    host_authored: Option<IgnoredAny>,
    decision_receipt: Option<IgnoredAny>,
    decision_receipts: Option<IgnoredAny>,
    tool_execution: Option<IgnoredAny>,
    tool_run_state: Option<IgnoredAny>,
}

impl Message {
    fn from_raw(json: Box<RawValue>) -> serde_json::Result<Message> {
        let p: Probe<'_> = serde_json::from_str(json.get())?;
        let filtered = p.local_only == Some(true)
            || p.provider_content.is_some()
            || p.raw_content.is_some()
            || p.host_authored.is_some()
            || p.decision_receipt.is_some()
            || p.decision_receipts.is_some()
            || p.tool_execution.is_some()
            || p.tool_run_state.is_some();
        Ok(Message {
            id: p.id.map(Cow::into_owned).unwrap_or_default(),
            role: p.role.map(Cow::into_owned),
            filtered,
            json,
        })
    }

    /// A message from parts a checkpoint stored (so they were probed when the message was
    /// first appended): no second parse of the JSON.
    pub(crate) fn from_checked_parts(
        id: String,
        role: Option<String>,
        filtered: bool,
        json: Box<RawValue>,
    ) -> Message {
        Message {
            id,
            role,
            filtered,
            json,
        }
    }

    /// The parts [`Message::from_checked_parts`] takes back.
    pub(crate) fn parts(&self) -> (&str, Option<&str>, bool, &RawValue) {
        (&self.id, self.role.as_deref(), self.filtered, &self.json)
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
        &self.id
    }

    /// The `role` field, if it is a string.
    pub fn role(&self) -> Option<&str> {
        self.role.as_deref()
    }

    /// The message as JSON text, verbatim.
    pub fn json(&self) -> &str {
        self.json.get()
    }

    /// All fields, parsed.
    pub fn fields(&self) -> Map<String, Value> {
        serde_json::from_str(self.json.get()).unwrap_or_default()
    }

    /// The `content` field if it is a string, else `raw_content`.
    pub fn text(&self) -> Option<String> {
        let fields = self.fields();
        ["content", "raw_content"]
            .iter()
            .find_map(|k| fields.get(*k).and_then(Value::as_str).map(str::to_owned))
    }

    /// The same message with another id.
    pub fn with_id(&self, id: &str) -> Message {
        let mut fields = self.fields();
        fields.insert("id".into(), Value::String(id.to_owned()));
        Self::from_value(&Value::Object(fields)).unwrap_or_else(|_| self.clone())
    }

    /// The provider view of this message, or `None` when it is local-only. A message that
    /// needs no change is shared, not copied.
    pub fn for_model(self: &Arc<Self>) -> Option<Arc<Message>> {
        if !self.filtered {
            return Some(Arc::clone(self));
        }
        let mut fields = self.fields();
        if fields.get("local_only").and_then(Value::as_bool) == Some(true) {
            return None;
        }
        if let Some(provider) = fields.remove("provider_content") {
            fields.insert("content".into(), provider);
        }
        for k in PROVIDER_STRIPPED {
            fields.remove(k);
        }
        Some(Arc::new(
            Self::from_value(&Value::Object(fields)).unwrap_or_else(|_| Message::clone(self)),
        ))
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.json.get() == other.json.get()
    }
}

impl Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(serializer)
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

/// The provider view of a list of messages.
pub(crate) fn model_messages(messages: &[Arc<Message>]) -> Vec<Arc<Message>> {
    messages.iter().filter_map(Message::for_model).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
