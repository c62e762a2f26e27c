//! The text of a projection checkpoint (`checkpoint.projection`): the projection in a
//! compact form that an opener parses quickly, and its digest.
//!
//! Besides the small state, a projection holds three lists that grow with the session:
//! the ended turns, the UI transcript and the model workset. Most model messages are the
//! very transcript messages (shared `Arc`s), so the workset is stored as positions into
//! the transcript, with only the messages of its own (filtered provider views, bulk
//! replacements) written out; turns are stored as arrays instead of objects; a message is
//! stored with the id, role and filter flag its append found, so decoding does not parse
//! its JSON a second time. Decoding shares the `Arc`s again, so a checkpointed projection
//! also costs the memory of one transcript, not two.
//!
//! ```text
//! {"format": 3, "state": {…projection, lists empty…},
//!  "turns": [[turn_id, start, end, boundary, status, fork_safe, rewind_safe], …],
//!  "messages": [[id, role, filtered, message], …],
//!  "model": [position ≥ 0 | -1 - k, …], "model_own": [[id, role, filtered, message] k, …]}
//! ```
//!
//! Anything else (an older form, a bad position) decodes as `None`: the opener then folds
//! the log, which is always the truth. The digest ([`digest`]) is XXH3-128: it is there to
//! notice damage (like every hash here it is unkeyed, so it cannot stop a deliberate edit),
//! and at some 20 GB/s it costs an opener nothing next to parsing.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::model::{Message, Projection, TurnBoundary};

/// The `format` this build writes and reads.
const FORMAT: u32 = 3;

/// A turn boundary as an array.
type TurnRow = (String, u64, u64, u64, String, bool, bool);

/// A message as an array: id, role, filtered, the message JSON.
type MessageRow = (String, Option<String>, bool, Box<RawValue>);

/// What `checkpoint.digest` stores: XXH3-128 (hex) of `through_seq` in decimal, a NUL and
/// the checkpoint text.
pub(crate) fn digest(through_seq: u64, text: &str) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(through_seq.to_string().as_bytes());
    h.update(&[0]);
    h.update(text.as_bytes());
    format!("{:032x}", h.digest128())
}

fn message((id, role, filtered, json): MessageRow) -> Arc<Message> {
    Arc::new(Message::from_checked_parts(id, role, filtered, json))
}

#[derive(Serialize)]
struct Out<'a> {
    format: u32,
    state: &'a Projection,
    turns: Vec<(&'a str, u64, u64, u64, &'a str, bool, bool)>,
    messages: Vec<(&'a str, Option<&'a str>, bool, &'a RawValue)>,
    model: Vec<i64>,
    model_own: Vec<(&'a str, Option<&'a str>, bool, &'a RawValue)>,
}

#[derive(Deserialize)]
struct In {
    format: u32,
    state: Projection,
    turns: Vec<TurnRow>,
    messages: Vec<MessageRow>,
    model: Vec<i64>,
    model_own: Vec<MessageRow>,
}

/// The checkpoint text of `projection`. Its three lists are moved out while the state is
/// written and put back before returning.
pub(crate) fn encode(projection: &mut Projection) -> Result<String> {
    let turns = std::mem::take(&mut projection.turns);
    let messages = std::mem::take(&mut projection.messages);
    let model_messages = std::mem::take(&mut projection.model_messages);
    let text = encode_parts(projection, &turns, &messages, &model_messages);
    projection.turns = turns;
    projection.messages = messages;
    projection.model_messages = model_messages;
    text
}

fn encode_parts(
    state: &Projection,
    turns: &[TurnBoundary],
    messages: &[Arc<Message>],
    model_messages: &[Arc<Message>],
) -> Result<String> {
    let position: HashMap<*const Message, usize> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| (Arc::as_ptr(m), i))
        .collect();
    let mut model = Vec::with_capacity(model_messages.len());
    let mut model_own = Vec::new();
    for m in model_messages {
        match position.get(&Arc::as_ptr(m)) {
            Some(&i) => model.push(i as i64),
            None => {
                model.push(-1 - model_own.len() as i64);
                model_own.push(m.parts());
            }
        }
    }
    let out = Out {
        format: FORMAT,
        state,
        turns: turns
            .iter()
            .map(|t| {
                (
                    t.turn_id.as_str(),
                    t.start_sequence,
                    t.end_sequence,
                    t.boundary_sequence,
                    t.status.as_str(),
                    t.fork_safe,
                    t.rewind_safe,
                )
            })
            .collect(),
        messages: messages.iter().map(|m| m.parts()).collect(),
        model,
        model_own,
    };
    serde_json::to_string(&out).map_err(|e| Error::invalid(format!("checkpoint: {e}")))
}

/// The projection of a checkpoint text, or `None` for any other form.
pub(crate) fn decode(text: &str) -> Option<Projection> {
    let parts: In = serde_json::from_str(text).ok()?;
    if parts.format != FORMAT {
        return None;
    }
    let messages: Vec<Arc<Message>> = parts.messages.into_iter().map(message).collect();
    let model_own: Vec<Arc<Message>> = parts.model_own.into_iter().map(message).collect();
    let model_messages = parts
        .model
        .iter()
        .map(|&k| match usize::try_from(k) {
            Ok(i) => messages.get(i).cloned(),
            Err(_) => usize::try_from(-1 - k)
                .ok()
                .and_then(|j| model_own.get(j).cloned()),
        })
        .collect::<Option<Vec<_>>>()?;
    let mut p = parts.state;
    p.turns = parts
        .turns
        .into_iter()
        .map(
            |(turn_id, start_sequence, end_sequence, boundary_sequence, status, fork, rewind)| {
                TurnBoundary {
                    turn_id,
                    start_sequence,
                    end_sequence,
                    boundary_sequence,
                    status,
                    fork_safe: fork,
                    rewind_safe: rewind,
                }
            },
        )
        .collect();
    p.messages = messages;
    p.model_messages = model_messages;
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Event;

    fn sample() -> Projection {
        let mut p = Projection::default();
        let message = |id: &str, extra: &str| {
            Event::new("message/complete")
                .with_payload_json(&format!(
                    r#"{{"message":{{"id":"{id}","role":"user","content":"c-{id}"{extra}}}}}"#
                ))
                .expect("payload")
        };
        let events = vec![
            Event::new("turn/start"),
            message("a", ""),
            message("b", r#","raw_content":"r""#),
            message("c", r#","local_only":true"#),
            Event::new("turn/end")
                .with_payload_json(r#"{"status":"completed"}"#)
                .expect("payload"),
        ];
        let prepared = p.prepare(&events).expect("valid batch");
        p.apply_prepared(prepared, 1, events.len() as u64, Some("t1"));
        p
    }

    #[test]
    fn round_trips_and_shares_the_transcript_messages() {
        let mut p = sample();
        assert_eq!(p.messages.len(), 3);
        assert_eq!(p.model_messages.len(), 2, "local-only message left out");
        let text = encode(&mut p).expect("encode");
        assert_eq!(p.messages.len(), 3, "lists put back");
        let back = decode(&text).expect("decode");
        assert_eq!(
            serde_json::to_string(&back).expect("json"),
            serde_json::to_string(&p).expect("json")
        );
        // `a` is shared, `b` has a filtered provider view of its own.
        assert!(Arc::ptr_eq(&back.messages[0], &back.model_messages[0]));
        assert!(!Arc::ptr_eq(&back.messages[1], &back.model_messages[1]));
        assert_eq!(back.turns, p.turns);
    }

    #[test]
    fn refuses_other_forms_and_bad_positions() {
        let mut p = sample();
        let text = encode(&mut p).expect("encode");
        assert!(decode(&serde_json::to_string(&p).expect("json")).is_none());
        assert!(decode(&text.replace(r#""format":3"#, r#""format":4"#)).is_none());
        assert!(decode(&text.replace(r#""model":[0"#, r#""model":[7"#)).is_none());
        assert!(decode(&text.replace(r#""model":[0,-1]"#, r#""model":[0,-2]"#)).is_none());
        assert!(decode("{").is_none());
    }
}
