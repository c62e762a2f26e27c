//! The model of a session's transcript shared by the model-based tests
//! (`reliability_model.rs`, `reliability_model_lineage.rs`): the fold of message events
//! (transcript and model workset) and the messages they are built from.

use serde_json::{Value, json};
use session_store::Message;

/// What a session holds at one sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fold {
    /// The UI transcript, oldest first (each message as JSON).
    pub messages: Vec<Value>,
    /// The ids of the model workset, in order.
    pub workset: Vec<String>,
    pub events: u64,
    pub commits: u64,
}

impl Fold {
    pub fn ids(&self) -> Vec<String> {
        self.messages.iter().map(message_id).collect()
    }

    /// A `message/upsert`: `m` at its id's position, else at the end; in the workset in
    /// place of its id (the last with it), else at the end.
    pub fn upsert(&mut self, m: Value) {
        let id = message_id(&m);
        match self.messages.iter().position(|x| message_id(x) == id) {
            Some(i) => self.messages[i] = m,
            None => self.messages.push(m),
        }
        if !self.workset.contains(&id) {
            self.workset.push(id);
        }
    }

    /// A `message/complete`: refused (false) for an id the transcript holds, else `m` at
    /// the end of the transcript and of the workset.
    pub fn complete(&mut self, m: Value) -> bool {
        let id = message_id(&m);
        if self.messages.iter().any(|x| message_id(x) == id) {
            return false;
        }
        self.messages.push(m);
        self.workset.push(id);
        true
    }

    /// A `history/replace` (`history`) or `model/context-replace` by `messages`.
    pub fn replace(&mut self, messages: &[Value], history: bool) {
        self.workset = messages.iter().map(message_id).collect();
        if history {
            self.messages = messages.to_vec();
        }
    }

    /// The transcript's messages `keep` selects (bit i, modulo 16).
    pub fn kept(&self, keep: u16) -> Vec<Value> {
        self.messages
            .iter()
            .enumerate()
            .filter(|(k, _)| keep & (1 << (k % 16)) != 0)
            .map(|(_, m)| m.clone())
            .collect()
    }
}

/// The id of a model message.
pub fn message_id(m: &Value) -> String {
    m["id"].as_str().expect("model message id").to_owned()
}

/// Message `id` of a model, version `n`: its text is `text <n> of <id>` (a phrase no
/// other version holds), its role `user` for an even `n`, else `assistant`.
pub fn message(id: &str, n: u64) -> Value {
    let role = if n.is_multiple_of(2) {
        "user"
    } else {
        "assistant"
    };
    json!({"id": id, "role": role, "content": format!("text {n} of {id}")})
}

/// `length` characters of text that does not compress to nothing.
pub fn long_text(seed: &str, length: usize) -> String {
    let mut out = String::with_capacity(length + 16);
    let mut n = seed.len() as u64;
    while out.len() < length {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push_str(&format!("{:x} ", n >> 40));
    }
    out.truncate(length);
    out
}

/// A stored message as the JSON it was written as.
pub fn store_value(m: &Message) -> Value {
    serde_json::from_str(m.json()).expect("stored message is JSON")
}
