//! Helpers shared by the examples (not an example itself): a completed question-and-answer
//! turn, and a session's transcript as message ids.
#![allow(dead_code)] // each example uses the helpers it needs

use serde_json::json;
use session_store::{Batch, Event, Root, SessionId};

/// A completed turn (operation id `op-<turn_id>`): the user's question (message
/// `q-<turn_id>`) and the assistant's answer (`a-<turn_id>`).
pub fn chat_turn(turn_id: &str, question: &str, answer: &str) -> session_store::Result<Batch> {
    let message = |id: String, role: &str, content: &str| {
        Event::new("message/complete")
            .with_payload(&json!({"message": {"id": id, "role": role, "content": content}}))
    };
    Ok(Batch::new(
        format!("op-{turn_id}"),
        vec![
            Event::new("turn/start"),
            message(format!("q-{turn_id}"), "user", question)?,
            message(format!("a-{turn_id}"), "assistant", answer)?,
            Event::new("turn/end").with_payload(&json!({"status": "completed"}))?,
        ],
    )
    .in_turn(turn_id))
}

/// The message ids of a session's durable transcript in `root`, read without any lock.
pub fn transcript(root: &Root, id: &SessionId) -> session_store::Result<Vec<String>> {
    let reader = root.open_reader(id)?;
    let messages = reader.transcript(reader.durable_sequence()?)?;
    Ok(messages.iter().map(|m| m.id().to_owned()).collect())
}
