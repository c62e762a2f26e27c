//! The projection checkpoint: the small state, the transcript index and the model
//! workset by reference. It never holds a message body: every message is in the log
//! already, so the checkpoint names the event it comes from.
//!
//! `checkpoint.projection` is JSON text:
//!
//! ```text
//! {"format": 5, "state": {…the projection, workset empty…},
//!  "model": [delta | [delta, item, provider_view], …]}
//! ```
//!
//! where each `model` entry is one workset message: the event at `seq`, its `message`
//! (`item` = -1) or item `item` of its `messages` array, taken as its provider view when
//! `provider_view` is 1. `seq` is given as `delta`, its difference from the entry before
//! (from 0 for the first; negative when an upsert put a later event in the middle of the
//! workset), and an entry that is a message event's provider view, as nearly all are, is that
//! number alone: a workset of chat messages costs two or three bytes a message (format 4,
//! still read, wrote every entry as `[seq, item, provider_view]`: 12 to 16 bytes).
//! `checkpoint.message_ids` is the transcript index (`model::transcript_index`): per
//! message id, ascending by key, its 16-byte XXH3-128 key and its 4-byte position
//! (little-endian). So a checkpoint costs 20 bytes per transcript message plus a few bytes
//! per workset message, whatever the messages' size.
//!
//! Anything else (an older form, an index that does not fit) decodes as `None`: the
//! opener then folds the log, which is always the truth. The digest ([`digest`]) is
//! XXH3-128: it is there to notice damage (like every hash here it is unkeyed, so it
//! cannot stop a deliberate edit).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::Projection;
use crate::model::projection::ModelRef;

/// The `format` this build writes and reads.
const FORMAT: u32 = 5;

/// The form before [`FORMAT`], still read: every reference whole, its sequence absolute.
const FORMAT_ABSOLUTE_REFS: u32 = 4;

/// A workset reference as stored.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum RefRow {
    /// The provider view of a message event's `message`, the sequence as a delta.
    Message(i64),
    /// Sequence (a delta in [`FORMAT`], absolute in [`FORMAT_ABSOLUTE_REFS`]), item (-1
    /// for none) and provider view (0 / 1).
    Whole(i64, i64, u8),
}

/// What `checkpoint.digest` stores: XXH3-128 (hex) of `through_seq` in decimal, a NUL,
/// the checkpoint text, a NUL and the transcript index. (The operation filter carries a
/// check of its own: [`sealed_filter`].)
pub(crate) fn digest(through_seq: u64, text: &str, ids: &[u8]) -> String {
    let mut digest = Digest::new(through_seq, text);
    digest.update(ids);
    digest.hex()
}

/// [`digest`] computed as the transcript index is read in pieces.
pub(crate) struct Digest(xxhash_rust::xxh3::Xxh3);

impl Digest {
    /// The digest of a checkpoint as of `through_seq` with `text`, its transcript index
    /// still to come ([`Digest::update`]).
    pub(crate) fn new(through_seq: u64, text: &str) -> Digest {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(through_seq.to_string().as_bytes());
        h.update(&[0]);
        h.update(text.as_bytes());
        h.update(&[0]);
        Digest(h)
    }

    /// Adds the next bytes of the transcript index.
    pub(crate) fn update(&mut self, ids: &[u8]) {
        self.0.update(ids);
    }

    /// The digest as `checkpoint.digest` stores it (32 hex digits).
    pub(crate) fn hex(&self) -> String {
        format!("{:032x}", self.0.digest128())
    }
}

/// Bytes of the check that ends a stored operation filter.
const FILTER_CHECK: usize = 16;

/// The check of an operation filter stored as of `through_seq`: XXH3-128 of
/// `through_seq` (8 bytes, little-endian) and the filter.
fn filter_check(through_seq: u64, filter: &[u8]) -> [u8; FILTER_CHECK] {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&through_seq.to_le_bytes());
    h.update(filter);
    h.digest128().to_le_bytes()
}

/// `checkpoint.operation_filter` for the live session's operation filter `filter`
/// (`session::ops`) as of `through_seq`: the filter, then its check. Checked on its own,
/// so a reader that does not use the filter does not read it.
pub(crate) fn sealed_filter(through_seq: u64, filter: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(filter.len() + FILTER_CHECK);
    out.extend_from_slice(filter);
    out.extend_from_slice(&filter_check(through_seq, filter));
    out
}

/// The filter of a stored `checkpoint.operation_filter` as of `through_seq` (its check
/// removed); `None` when the check fails.
pub(crate) fn unsealed_filter(through_seq: u64, mut stored: Vec<u8>) -> Option<Vec<u8>> {
    let len = stored.len().checked_sub(FILTER_CHECK)?;
    let (filter, check) = stored.split_at(len);
    if check != filter_check(through_seq, filter) {
        return None;
    }
    stored.truncate(len);
    Some(stored)
}

#[derive(Serialize)]
struct Out<'a> {
    format: u32,
    state: &'a Projection,
    model: Vec<RefRow>,
}

#[derive(Deserialize)]
struct In {
    format: u32,
    state: Projection,
    model: Vec<RefRow>,
}

/// The checkpoint of `projection`: its text and its transcript index. The workset is
/// moved out while the state is written and put back before returning.
pub(crate) fn encode(projection: &mut Projection) -> Result<(String, Vec<u8>)> {
    let model = ref_rows(projection.model_refs())?;
    let workset = std::mem::take(&mut projection.model_messages);
    let text = serde_json::to_string(&Out {
        format: FORMAT,
        state: projection,
        model,
    });
    projection.model_messages = workset;
    let text = text.map_err(|e| Error::internal_from("checkpoint to JSON", e))?;
    Ok((text, projection.transcript_ids_bytes()))
}

/// The projection of a checkpoint's text, its workset still to be read from the
/// references returned with it and its transcript index still to be restored
/// ([`Projection::restore_transcript_ids`]); `None` for any other form.
pub(crate) fn decode_state(text: &str) -> Option<(Projection, Vec<ModelRef>)> {
    let parts: In = serde_json::from_str(text).ok()?;
    if !parts.state.model_messages.is_empty() {
        return None;
    }
    let refs = model_refs(parts.format, &parts.model)?;
    if refs
        .iter()
        .any(|r| r.seq == 0 || r.seq > parts.state.committed_sequence)
    {
        return None;
    }
    Some((parts.state, refs))
}

/// The stored form of `refs` ([`FORMAT`]).
fn ref_rows(refs: &[ModelRef]) -> Result<Vec<RefRow>> {
    let mut before = 0i64;
    refs.iter()
        .map(|r| {
            let seq = i64::try_from(r.seq)
                .map_err(|_| Error::internal(format!("workset sequence {} past i64", r.seq)))?;
            let delta = seq - before;
            before = seq;
            Ok(match (r.item, r.provider_view) {
                (None, true) => RefRow::Message(delta),
                (item, provider_view) => {
                    RefRow::Whole(delta, item.map_or(-1, i64::from), u8::from(provider_view))
                }
            })
        })
        .collect()
}

/// The references of `rows` stored in `format`; `None` for another format, a sequence
/// below 1 or past `i64`, an item below -1 or past `u32`, or a provider view other than 0
/// and 1.
fn model_refs(format: u32, rows: &[RefRow]) -> Option<Vec<ModelRef>> {
    let relative = match format {
        FORMAT => true,
        FORMAT_ABSOLUTE_REFS => false,
        _ => return None,
    };
    let mut before = 0i64;
    rows.iter()
        .map(|&row| {
            let (seq, item, provider_view) = match row {
                RefRow::Message(seq) if relative => (seq, -1, 1),
                RefRow::Message(_) => return None,
                RefRow::Whole(seq, item, provider_view) => (seq, item, provider_view),
            };
            let seq = if relative {
                before.checked_add(seq)?
            } else {
                seq
            };
            before = seq;
            Some(ModelRef {
                seq: u64::try_from(seq).ok().filter(|&s| s > 0)?,
                item: match item {
                    -1 => None,
                    i => Some(u32::try_from(i).ok()?),
                },
                provider_view: match provider_view {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
            })
        })
        .collect()
}

/// [`decode_state`] with the transcript index `ids` restored.
#[cfg(test)]
fn decode(text: &str, ids: &[u8]) -> Option<(Projection, Vec<ModelRef>)> {
    let (mut p, refs) = decode_state(text)?;
    let index = crate::model::transcript_index::TranscriptIndex::from_bytes(ids, p.transcript_len)?;
    p.restore_transcript_ids(index);
    Some((p, refs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Event;

    #[test]
    fn a_sealed_filter_is_checked_against_its_sequence() {
        let filter = vec![1u8, 16, 7, 0, 0, 0, 0, 0];
        let sealed = sealed_filter(42, &filter);
        assert_eq!(sealed.len(), filter.len() + FILTER_CHECK);
        assert_eq!(unsealed_filter(42, sealed.clone()), Some(filter.clone()));
        assert_eq!(
            unsealed_filter(43, sealed.clone()),
            None,
            "another sequence"
        );
        let mut flipped = sealed.clone();
        flipped[3] ^= 1;
        assert_eq!(unsealed_filter(42, flipped), None, "a flipped byte");
        assert_eq!(unsealed_filter(42, sealed[..10].to_vec()), None, "cut");
        assert_eq!(unsealed_filter(42, vec![]), None, "empty");
        assert_eq!(unsealed_filter(7, sealed_filter(7, &[])), Some(vec![]));
    }

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
            Event::new("model/context-replace")
                .with_payload_json(
                    r#"{"messages":[{"id":"s","role":"system","content":"sum"},{"id":"a","role":"user","content":"c-a"}]}"#,
                )
                .expect("payload"),
            message("d", ""),
            Event::new("turn/end")
                .with_payload_json(r#"{"status":"completed"}"#)
                .expect("payload"),
        ];
        let prepared = p.prepare(&events).expect("valid batch");
        p.apply_prepared(prepared, 1, events.len() as u64, Some("t1"));
        p
    }

    #[test]
    fn round_trips_state_index_and_references_without_bodies() {
        let mut p = sample();
        assert_eq!(p.transcript_len, 4);
        assert_eq!(p.model_messages.len(), 3, "replacement (2) + d");
        let (text, ids) = encode(&mut p).expect("encode");
        assert_eq!(p.model_messages.len(), 3, "workset put back");
        assert!(
            !text.contains("c-d") && !text.contains("sum"),
            "no message body in {text}"
        );
        assert_eq!(ids.len(), 4 * 20);
        let (mut back, refs) = decode(&text, &ids).expect("decode");
        assert_eq!(
            refs,
            vec![
                ModelRef {
                    seq: 5,
                    item: Some(0),
                    provider_view: false
                },
                ModelRef {
                    seq: 5,
                    item: Some(1),
                    provider_view: false
                },
                ModelRef {
                    seq: 6,
                    item: None,
                    provider_view: true
                },
            ]
        );
        back.restore_model(p.model_messages.clone(), refs);
        assert_eq!(
            serde_json::to_string(&back).expect("json"),
            serde_json::to_string(&p).expect("json")
        );
        // The transcript index came back: a duplicate id is refused, a new one is not.
        let dup = Event::new("message/complete")
            .with_payload_json(r#"{"message":{"id":"b","role":"user","content":"x"}}"#)
            .expect("payload");
        assert!(back.prepare(&[dup]).is_err());
        let new = Event::new("message/complete")
            .with_payload_json(r#"{"message":{"id":"e","role":"user","content":"x"}}"#)
            .expect("payload");
        assert!(back.prepare(&[new]).is_ok());
    }

    #[test]
    fn refuses_other_forms_and_bad_references() {
        let mut p = sample();
        let (text, ids) = encode(&mut p).expect("encode");
        assert!(
            text.contains(r#""model":[[5,0,0],[0,1,0],1]"#),
            "items whole, the message event a delta alone: {text}"
        );
        assert!(decode(&text, &ids[1..]).is_none(), "index cut");
        let mut swapped = ids[20..].to_vec();
        swapped.extend_from_slice(&ids[..20]);
        assert!(decode(&text, &swapped).is_none(), "index out of order");
        let with = |model: &str| text.replace("[[5,0,0],[0,1,0],1]", model);
        assert!(decode(&with("[[5,0,0],[0,1,0],1]"), &ids).is_some());
        assert!(decode(&text.replace(r#""format":5"#, r#""format":3"#), &ids).is_none());
        assert!(
            decode(&with("[[5,-2,0],[0,1,0],1]"), &ids).is_none(),
            "item"
        );
        assert!(decode(&with("[[5,0,2],[0,1,0],1]"), &ids).is_none(), "view");
        assert!(
            decode(&with("[[5,0,0],[0,1,0],94]"), &ids).is_none(),
            "past"
        );
        assert!(
            decode(&with("[[5,0,0],[0,1,0],-5]"), &ids).is_none(),
            "zero"
        );
        assert!(
            decode(&with("[[5,0,0],[-9,1,0],1]"), &ids).is_none(),
            "below"
        );
        assert!(
            decode(&with("[9223372036854775807,9223372036854775807]"), &ids).is_none(),
            "overflow"
        );
        assert!(decode(&with(r#"["5"]"#), &ids).is_none(), "text");
        assert!(decode("{", &ids).is_none());
        assert_ne!(digest(7, &text, &ids), digest(7, &text, &ids[20..]));
    }

    /// Format 4 (every reference whole, its sequence absolute), which files written before
    /// format 5 hold, still decodes to the same references; a bare number is not of it.
    #[test]
    fn reads_the_absolute_references_of_format_4() {
        let mut p = sample();
        let (text, ids) = encode(&mut p).expect("encode");
        let old = text
            .replace(r#""format":5"#, r#""format":4"#)
            .replace("[[5,0,0],[0,1,0],1]", "[[5,0,0],[5,1,0],[6,-1,1]]");
        let (_, refs) = decode(&old, &ids).expect("format 4");
        assert_eq!(refs, decode(&text, &ids).expect("format 5").1);
        let bare = old.replace("[6,-1,1]", "6");
        assert!(decode(&bare, &ids).is_none(), "a delta in format 4");
    }

    /// A workset whose order goes back (an upsert put a later event in its middle) stores
    /// negative deltas and comes back in its order.
    #[test]
    fn a_workset_out_of_sequence_order_round_trips() {
        let refs = vec![
            ModelRef {
                seq: 40,
                item: None,
                provider_view: true,
            },
            ModelRef {
                seq: 7,
                item: Some(3),
                provider_view: false,
            },
            ModelRef {
                seq: 7,
                item: None,
                provider_view: false,
            },
            ModelRef {
                seq: 41,
                item: None,
                provider_view: true,
            },
        ];
        let rows = ref_rows(&refs).expect("rows");
        assert_eq!(
            serde_json::to_string(&rows).expect("json"),
            "[40,[-33,3,0],[0,-1,0],34]"
        );
        assert_eq!(model_refs(FORMAT, &rows), Some(refs));
    }
}
