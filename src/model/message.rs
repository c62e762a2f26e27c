//! Conversation messages: opaque JSON with a stable `id`, and the model filter.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A conversation message. Only `id` is interpreted by the fold; every other field is
/// kept as given (role, content, tool calls, provider-specific fields).
///
/// ```
/// use session_store::Message;
/// let m: Message = serde_json::from_str(r#"{"id":"m1","role":"user","content":"hi"}"#).unwrap();
/// assert_eq!(m.role(), Some("user"));
/// assert_eq!(m.text(), Some("hi"));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// The stable message id (may be empty only inside bulk replacements).
    pub id: String,
    /// All other fields, verbatim.
    pub fields: Map<String, Value>,
}

// Hand-written instead of `#[serde(flatten)]`, which buffers every field: messages are
// parsed on every append.
impl Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.fields.len() + 1))?;
        map.serialize_entry("id", &self.id)?;
        for (k, v) in &self.fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = Map::<String, Value>::deserialize(deserializer)?;
        let id = match fields.remove("id") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(id)) => id,
            Some(_) => return Err(serde::de::Error::custom("message id must be a string")),
        };
        Ok(Message { id, fields })
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

impl Message {
    /// A message with an id, a role and text content.
    pub fn text_message(id: impl Into<String>, role: &str, content: impl Into<String>) -> Self {
        let mut fields = Map::new();
        fields.insert("role".into(), Value::String(role.into()));
        fields.insert("content".into(), Value::String(content.into()));
        Message {
            id: id.into(),
            fields,
        }
    }

    /// The `role` field, if it is a string.
    pub fn role(&self) -> Option<&str> {
        self.fields.get("role").and_then(Value::as_str)
    }

    /// The `content` field if it is a string, else `raw_content`.
    pub fn text(&self) -> Option<&str> {
        self.fields
            .get("content")
            .and_then(Value::as_str)
            .or_else(|| self.fields.get("raw_content").and_then(Value::as_str))
    }

    /// The provider view of this message, or `None` when it is local-only. A message
    /// that needs no change is shared, not copied.
    pub fn for_model(self: &Arc<Self>) -> Option<Arc<Message>> {
        if self.fields.get("local_only").and_then(Value::as_bool) == Some(true) {
            return None;
        }
        let needs_change = self.fields.contains_key("provider_content")
            || PROVIDER_STRIPPED
                .iter()
                .any(|k| self.fields.contains_key(*k));
        if !needs_change {
            return Some(Arc::clone(self));
        }
        let mut m = Message::clone(self);
        if let Some(provider) = m.fields.remove("provider_content") {
            m.fields.insert("content".into(), provider);
        }
        for k in PROVIDER_STRIPPED {
            m.fields.remove(k);
        }
        Some(Arc::new(m))
    }
}

/// The provider view of a list of messages.
pub(crate) fn model_messages(messages: &[Arc<Message>]) -> Vec<Arc<Message>> {
    messages.iter().filter_map(Message::for_model).collect()
}
