//! A model-based random test of the read side: random sequences of operations (turns of
//! `message/complete` messages, `message/upsert` of old, removed and new ids, a refused
//! duplicate `message/complete`, `history/replace`, `model/context-replace`, flush, close and
//! reopen, fork after a turn, rewind before one, delete of a parent, export and import under a
//! new id) run on real session files through the public API, and after every step each
//! session's answers are compared with a small in-memory model (a list of messages, the model
//! workset, event, commit and turn counts per session): the cold transcript, every history page
//! walked by its cursor, `transcript_texts`, the live writer's transcript, the commits replayed,
//! the folded projection and `verify_file`. `PROPTEST_CASES` sets the number of sequences
//! (default 12).

mod common;
mod reliability_support;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};
use reliability_support::env_count;
use reliability_support::harness::{
    Accepted, Handle, Served, deref_to_handle, run_sequences, turn_ids, workset_ids,
};
use reliability_support::model::{Fold, long_text, message, message_id, store_value};
use serde_json::{Value, json};
use session_store::format::SESSION_FILE;
use session_store::{
    CancelToken, ContentRef, Error, Event, ForkPoint, HistoryPage, Message, Root, SessionQuery,
    SessionRef, verify_file,
};

const HOST: &str = "model";

/// Events of a bulk commit: as many as make a close write a checkpoint.
const BULK: usize = 1_000;

fn config() -> Config {
    Config {
        cases: env_count("PROPTEST_CASES", 12) as u32,
        failure_persistence: None,
        ..Config::default()
    }
}

/// A history walk by cursor, one page a step.
struct Walk {
    session: String,
    /// The transcript as of the first page.
    expected: Vec<Value>,
    snapshot: u64,
    page: usize,
    cursor: Option<String>,
    /// (position, message) of the pages so far, oldest first.
    walked: Vec<(u64, Value)>,
    pages: usize,
}

/// One step of a sequence. `s` picks a session (modulo how many exist), the other numbers pick
/// among what the session holds at that point.
#[derive(Clone, Debug)]
enum Op {
    /// A turn of `n` new messages, then an upsert of a known id when `upsert` is set; the
    /// four bits of `sizes` for message i choose its length (one in 16 over 64 KiB, three
    /// over the inline threshold: content parts).
    Turn {
        s: u8,
        n: u8,
        upsert: Option<u16>,
        sizes: u16,
    },
    /// An upsert outside a turn: of an id used before anywhere (`Some`), or a new one.
    Upsert {
        s: u8,
        known: Option<u16>,
    },
    /// One commit of message events outside a turn, each part a `message/complete` (0: of
    /// a new id, 1: of an id used before anywhere, refusing the whole batch when the
    /// transcript holds it by then), a `message/upsert` (2: new, 3: used before) or a
    /// `history/replace` keeping what `pick` selects plus a new message (4).
    Mixed {
        s: u8,
        parts: Vec<(u8, u16)>,
    },
    /// One commit of 1,000 `diagnostic` events: the next close writes a projection
    /// checkpoint, which the next open (and a fork's open within its range) starts from.
    Bulk {
        s: u8,
    },
    /// A `message/complete` reusing an id of the transcript: refused, nothing changes.
    Duplicate {
        s: u8,
        pick: u16,
    },
    /// A `history/replace` (`history`) or a `model/context-replace` (the workset only) of
    /// the transcript's messages `keep` selects (bit i, modulo 16) and `add` new ones.
    Replace {
        s: u8,
        keep: u16,
        add: u8,
        history: bool,
    },
    Flush {
        s: u8,
    },
    /// Close the writer; the next write reopens it (folding from the file).
    Reopen {
        s: u8,
    },
    Fork {
        s: u8,
        turn: u16,
    },
    Rewind {
        s: u8,
        turn: u16,
    },
    /// Delete a session that was forked, materialising its forks (nothing without one).
    DeleteParent {
        s: u8,
    },
    ExportImport {
        s: u8,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    let s = any::<u8>();
    prop_oneof![
        5 => (s, 1..4u8, prop::option::of(any::<u16>()), any::<u16>())
            .prop_map(|(s, n, upsert, sizes)| Op::Turn { s, n, upsert, sizes }),
        2 => (s, prop::option::of(any::<u16>())).prop_map(|(s, known)| Op::Upsert { s, known }),
        1 => (s, any::<u16>()).prop_map(|(s, pick)| Op::Duplicate { s, pick }),
        2 => (s, any::<u16>(), 0..3u8, any::<bool>())
            .prop_map(|(s, keep, add, history)| Op::Replace { s, keep, add, history }),
        3 => (s, prop::collection::vec((0..5u8, any::<u16>()), 1..5))
            .prop_map(|(s, parts)| Op::Mixed { s, parts }),
        1 => s.prop_map(|s| Op::Bulk { s }),
        2 => s.prop_map(|s| Op::Flush { s }),
        2 => s.prop_map(|s| Op::Reopen { s }),
        2 => (s, any::<u16>()).prop_map(|(s, turn)| Op::Fork { s, turn }),
        1 => (s, any::<u16>()).prop_map(|(s, turn)| Op::Rewind { s, turn }),
        2 => s.prop_map(|s| Op::DeleteParent { s }),
        1 => s.prop_map(|s| Op::ExportImport { s }),
    ]
}

/// An ended turn: the session before its first event and after its last.
#[derive(Clone, Debug)]
struct Turn {
    id: String,
    before: Fold,
    after: Fold,
}

/// A session's state: what its log folds to and the turns it ended.
#[derive(Clone, Debug, Default)]
struct State {
    fold: Fold,
    turns: Vec<Turn>,
    /// The fold after each commit, oldest first (what older snapshots read).
    past: Vec<Fold>,
}

impl State {
    /// The state as of sequence `cut` (a commit boundary), with `turns` ended by then.
    fn at(&self, fold: &Fold, turns: usize) -> State {
        State {
            fold: fold.clone(),
            turns: self.turns[..turns].to_vec(),
            past: self
                .past
                .iter()
                .take_while(|f| f.events <= fold.events)
                .cloned()
                .collect(),
        }
    }
}

/// A session: its id, states and writer (the shared harness's), and whether it was forked.
struct Sess {
    h: Handle<State>,
    /// Whether some fork or rewind read this session's file (it has dependents).
    forked: bool,
}

impl Sess {
    /// A session made on disk (a fork, a rewind, an import) holding `state`, not open.
    fn cold(id: String, state: State) -> Sess {
        Sess {
            h: Handle::cold(id, state),
            forked: false,
        }
    }
}

impl Accepted for State {
    fn events(&self) -> u64 {
        self.fold.events
    }
}

deref_to_handle!(Sess, State);

/// The state of one sequence: the sessions, the store's handles and counters for fresh names.
struct World {
    served: Served,
    sessions: Vec<Sess>,
    /// Every message id used so far, in any session.
    used: Vec<String>,
    counter: u64,
    /// A history walk by cursor spread over the steps (one page a step).
    walk: Option<Walk>,
    /// Forks and rewinds made, parents deleted, imports made, checkpoints at the end, walks
    /// over several steps finished.
    figures: [usize; 5],
}

impl World {
    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}", self.counter)
    }

    /// The index of the session `s` picks, creating the first one when there is none.
    fn pick(&mut self, s: u8) -> usize {
        if self.sessions.is_empty() {
            let name = self.fresh("s");
            let session = create(&self.served.root, &name);
            let mut sess = Sess::cold(name, State::default());
            sess.writer = Some(session);
            self.sessions.push(sess);
        }
        usize::from(s) % self.sessions.len()
    }

    /// Appends `events` as one commit of session `i` (a turn when `turn` is given) and
    /// folds `f` into the model.
    fn append(&mut self, i: usize, events: Vec<Event>, turn: Option<String>, f: Fold) {
        let (_, n) =
            self.sessions[i].append(&self.served, &mut self.counter, events, turn.as_deref());
        let state = &mut self.sessions[i].accepted;
        let before = state.fold.clone();
        state.fold = f;
        state.fold.events = before.events + n;
        state.fold.commits = before.commits + 1;
        state.past.push(state.fold.clone());
        if let Some(id) = turn {
            state.turns.push(Turn {
                id,
                before,
                after: state.fold.clone(),
            });
        }
    }

    fn new_message(&mut self) -> Value {
        let id = self.fresh("m");
        self.used.push(id.clone());
        message(&id, self.counter)
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Turn {
                s,
                n,
                upsert,
                sizes,
            } => {
                let i = self.pick(s);
                let mut fold = self.sessions[i].accepted.fold.clone();
                let mut events = vec![Event::new("turn/start")];
                for k in 0..n {
                    let mut m = self.new_message();
                    let length = match (sizes >> (4 * k)) & 15 {
                        15 => 70_000,
                        12..=14 => 1_500,
                        _ => 0,
                    };
                    if length > 0 {
                        m["content"] = json!(long_text(&message_id(&m), length));
                    }
                    events.push(event("message/complete", json!({ "message": m })));
                    assert!(fold.complete(m));
                }
                if let Some(pick) = upsert {
                    let ids = fold.ids();
                    let target = &ids[usize::from(pick) % ids.len()];
                    self.counter += 1;
                    let m = message(target, self.counter);
                    events.push(event("message/upsert", json!({ "message": m })));
                    fold.upsert(m);
                }
                events.push(turn_end("completed"));
                let turn = self.fresh("t");
                self.append(i, events, Some(turn), fold);
            }
            Op::Upsert { s, known } => {
                let i = self.pick(s);
                let m = match known {
                    Some(pick) if !self.used.is_empty() => {
                        let target = self.used[usize::from(pick) % self.used.len()].clone();
                        self.counter += 1;
                        message(&target, self.counter)
                    }
                    _ => self.new_message(),
                };
                let mut fold = self.sessions[i].accepted.fold.clone();
                let events = vec![event("message/upsert", json!({ "message": m }))];
                fold.upsert(m);
                self.append(i, events, None, fold);
            }
            Op::Bulk { s } => {
                let i = self.pick(s);
                let fold = self.sessions[i].accepted.fold.clone();
                let events = (0..BULK).map(|_| Event::new("diagnostic")).collect();
                self.append(i, events, None, fold);
            }
            Op::Duplicate { s, pick } => {
                let i = self.pick(s);
                let ids = self.sessions[i].accepted.fold.ids();
                if ids.is_empty() {
                    return;
                }
                let target = ids[usize::from(pick) % ids.len()].clone();
                let w = self.sessions[i].writer(&self.served, &mut self.counter);
                let before = w.snapshot().event_sequence;
                let op = self.fresh("op");
                self.counter += 1;
                let m = message(&target, self.counter);
                let refused = w.append_events(
                    &op,
                    vec![event("message/complete", json!({ "message": m }))],
                );
                assert!(
                    matches!(refused, Err(Error::InvalidPayload { .. })),
                    "a duplicate message/complete of {target:?} was not refused: {refused:?}"
                );
                assert_eq!(w.snapshot().event_sequence, before);
            }
            Op::Replace {
                s,
                keep,
                add,
                history,
            } => {
                let i = self.pick(s);
                let mut fold = self.sessions[i].accepted.fold.clone();
                let mut messages = fold.kept(keep);
                for _ in 0..add {
                    messages.push(self.new_message());
                }
                fold.replace(&messages, history);
                let kind = if history {
                    "history/replace"
                } else {
                    "model/context-replace"
                };
                let events = vec![event(kind, json!({ "messages": messages }))];
                self.append(i, events, None, fold);
            }
            Op::Mixed { s, ref parts } => {
                let i = self.pick(s);
                let mut fold = self.sessions[i].accepted.fold.clone();
                let mut events = Vec::new();
                let mut refused = false;
                for &(part, pick) in parts {
                    let used = (!self.used.is_empty())
                        .then(|| self.used[usize::from(pick) % self.used.len()].clone());
                    let m = match used {
                        Some(target) if part % 2 == 1 => {
                            self.counter += 1;
                            message(&target, self.counter)
                        }
                        _ => self.new_message(),
                    };
                    match part {
                        0 | 1 => {
                            refused |= !fold.complete(m.clone());
                            events.push(event("message/complete", json!({ "message": m })));
                        }
                        2 | 3 => {
                            fold.upsert(m.clone());
                            events.push(event("message/upsert", json!({ "message": m })));
                        }
                        _ => {
                            let mut messages = fold.kept(pick);
                            messages.push(m);
                            fold.replace(&messages, true);
                            events.push(event("history/replace", json!({ "messages": messages })));
                        }
                    }
                }
                if !refused {
                    self.append(i, events, None, fold);
                    return;
                }
                let w = self.sessions[i].writer(&self.served, &mut self.counter);
                let before = w.snapshot().event_sequence;
                let op = self.fresh("op");
                let result = w.append_events(&op, events);
                assert!(
                    matches!(result, Err(Error::InvalidPayload { .. })),
                    "a batch completing a message id twice was not refused: {result:?}"
                );
                assert_eq!(w.snapshot().event_sequence, before);
            }
            Op::Flush { s } => {
                let i = self.pick(s);
                self.sessions[i].flush();
            }
            Op::Reopen { s } => {
                let i = self.pick(s);
                self.sessions[i].close(&self.served);
            }
            Op::Fork { s, turn } | Op::Rewind { s, turn } => {
                let i = self.pick(s);
                if self.sessions[i].accepted.turns.is_empty() {
                    return;
                }
                self.sessions[i].flush();
                let parent = &self.sessions[i];
                let k = usize::from(turn) % parent.durable.turns.len();
                let t = &parent.durable.turns[k];
                let after = matches!(op, Op::Fork { .. });
                let (point, state) = if after {
                    let state = parent.durable.at(&t.after, k + 1);
                    (ForkPoint::AfterTurn(t.id.clone()), state)
                } else {
                    let state = parent.durable.at(&t.before, k);
                    (ForkPoint::BeforeTurn(t.id.clone()), state)
                };
                let parent_id = id(&parent.id);
                let name = self.fresh("f");
                let child = self
                    .served
                    .root
                    .fork(&parent_id, point.clone(), Some(id(&name)))
                    .unwrap_or_else(|e| panic!("{point:?} of {parent_id}: {e}"));
                assert_eq!(child.as_str(), name);
                self.sessions[i].forked = true;
                self.figures[0] += 1;
                self.sessions.push(Sess::cold(name, state));
            }
            Op::DeleteParent { s } => {
                let parents: Vec<usize> = (0..self.sessions.len())
                    .filter(|i| self.sessions[*i].forked)
                    .collect();
                let Some(&i) = parents.get(usize::from(s) % parents.len().max(1)) else {
                    return;
                };
                self.sessions[i].close(&self.served);
                let sess = self.sessions.remove(i);
                self.served
                    .root
                    .delete(&id(&sess.id), &CancelToken::new())
                    .expect("delete");
                self.figures[1] += 1;
            }
            Op::ExportImport { s } => {
                let i = self.pick(s);
                self.sessions[i].flush();
                let name = format!("{}.sqlite", self.fresh("x"));
                let file = self.served.exports.join(name);
                let from = id(&self.sessions[i].id);
                self.served.root.export(&from, &file).expect("export");
                let name = self.fresh("i");
                self.served.import_as(&file, &name);
                self.figures[2] += 1;
                let state = self.sessions[i].durable.clone();
                self.sessions.push(Sess::cold(name, state));
            }
        }
    }

    /// Compares every session's answers with the model; `page` is the history page size.
    /// Compares every session's answers with the model (`page`: the history page size,
    /// `pick`: which older snapshot is read), then takes one more page of the walk.
    fn check(&mut self, page: usize, pick: u16) -> Result<(), TestCaseError> {
        let query = self.served.service.query();
        for sess in &self.sessions {
            check_session(&self.served.root, &query, &self.served.rt, sess, page, pick)?;
        }
        self.walk_on(pick)
    }

    /// Takes the next page of the walk, pinned to the snapshot of its first page whatever
    /// the steps since did (appends, replacements, reopens, a parent's delete); starts a walk
    /// of a session `pick` chooses when there is none. A walk of a deleted session stops.
    fn walk_on(&mut self, pick: u16) -> Result<(), TestCaseError> {
        if self.sessions.is_empty() {
            return Ok(());
        }
        let walk = match self.walk.take() {
            Some(walk) if self.sessions.iter().any(|s| s.id == walk.session) => walk,
            _ => {
                let sess = &self.sessions[usize::from(pick) % self.sessions.len()];
                Walk {
                    session: sess.id.clone(),
                    expected: sess.durable.fold.messages.clone(),
                    snapshot: sess.durable.fold.events,
                    page: 1 + usize::from(pick % 2),
                    cursor: None,
                    walked: Vec::new(),
                    pages: 0,
                }
            }
        };
        let r = SessionRef::new(HOST, walk.session.as_str()).expect("ref");
        let query = self.served.service.query();
        let p = self
            .served
            .rt
            .block_on(query.history_page(&r, walk.cursor.as_deref(), walk.page))
            .expect("history page");
        let mut walk = walk;
        let below = walk.walked.first().map(|(position, _)| *position);
        let read = |c: &ContentRef| {
            self.served
                .rt
                .block_on(query.read_content(&r, c))
                .expect("content")
        };
        let got = check_page(&read, &p, walk.snapshot, walk.page, below, &walk.session)?;
        walk.walked.splice(0..0, got);
        walk.pages += 1;
        match p.next_cursor.filter(|_| p.has_more) {
            Some(cursor) => {
                walk.cursor = Some(cursor);
                self.walk = Some(walk);
            }
            None => {
                let walked: Vec<Value> = walk.walked.into_iter().map(|(_, m)| m).collect();
                prop_assert_eq!(
                    &walked,
                    &walk.expected,
                    "{}: a walk over several steps",
                    walk.session
                );
                if walk.pages > 1 {
                    self.figures[4] += 1;
                }
            }
        }
        Ok(())
    }
}

fn values(messages: &[Arc<Message>]) -> Vec<Value> {
    messages.iter().map(|m| store_value(m)).collect()
}

/// Checks one history page: pinned to `snapshot`, at most `limit` messages in ascending
/// positions ending right below `below` (the oldest position of the newer page, if any),
/// `has_more` and its cursor while position 1 is not reached, each message's id its own;
/// returns the messages with their positions.
fn check_page(
    read: &dyn Fn(&ContentRef) -> Vec<u8>,
    p: &HistoryPage,
    snapshot: u64,
    limit: usize,
    below: Option<u64>,
    who: &str,
) -> Result<Vec<(u64, Value)>, TestCaseError> {
    prop_assert_eq!(p.snapshot_sequence, snapshot, "{}: page snapshot", who);
    prop_assert!(p.messages.len() <= limit, "{}: page over its limit", who);
    let positions: Vec<u64> = p.messages.iter().map(|m| m.position).collect();
    if let Some(below) = below {
        let expected: Vec<u64> = (below.saturating_sub(limit as u64).max(1)..below).collect();
        prop_assert_eq!(&positions, &expected, "{}: page positions", who);
    } else if let Some(first) = positions.first() {
        let expected: Vec<u64> = (*first..*first + positions.len() as u64).collect();
        prop_assert_eq!(&positions, &expected, "{}: first page positions", who);
    }
    let more = positions.first().is_some_and(|p| *p > 1);
    prop_assert_eq!(p.has_more, more, "{}: has_more", who);
    prop_assert_eq!(p.next_cursor.is_some(), more, "{}: next cursor", who);
    p.messages
        .iter()
        .map(|m| {
            let value = match (&m.inline, &m.content_ref) {
                (Some(inline), None) => store_value(inline),
                (None, Some(content)) => {
                    // The payload of the event that recorded it: a message event's
                    // `message`, or the replacement's item with this id.
                    let payload: Value = serde_json::from_slice(&read(content)).expect("JSON");
                    match payload.get("message") {
                        Some(message) => message.clone(),
                        None => payload["messages"]
                            .as_array()
                            .expect("a replacement's messages")
                            .iter()
                            .find(|x| message_id(x) == m.message_id)
                            .expect("the replacement holds the message")
                            .clone(),
                    }
                }
                other => {
                    return Err(TestCaseError::fail(format!(
                        "{who}: message {} is {other:?}",
                        m.message_id
                    )));
                }
            };
            prop_assert_eq!(&m.message_id, &message_id(&value));
            Ok((m.position, value))
        })
        .collect()
}

fn check_session(
    root: &Root,
    query: &SessionQuery,
    rt: &tokio::runtime::Runtime,
    sess: &Sess,
    page: usize,
    pick: u16,
) -> Result<(), TestCaseError> {
    let sid = id(&sess.id);
    let want = &sess.durable.fold;
    let who = &sess.id;

    // The cold reader: durable sequence, transcript, texts, length, commits, turns, fold.
    let reader = root.open_reader(&sid).expect("reader");
    let durable = reader.durable_sequence().expect("durable sequence");
    prop_assert_eq!(durable, want.events, "{}: durable sequence", who);
    let transcript = reader.transcript(durable).expect("transcript");
    prop_assert_eq!(&values(&transcript), &want.messages, "{}: transcript", who);
    let texts: Vec<Value> = reader
        .transcript_texts(durable, usize::MAX)
        .expect("transcript texts")
        .iter()
        .map(|t| serde_json::from_str(t.message().expect("text")).expect("JSON"))
        .collect();
    prop_assert_eq!(&texts, &want.messages, "{}: transcript_texts", who);
    prop_assert_eq!(
        reader.transcript_len(durable).expect("len"),
        want.messages.len() as u64,
        "{}: transcript_len",
        who
    );
    let commits = reader.all_commits().expect("commits");
    prop_assert_eq!(commits.len() as u64, want.commits, "{}: commits", who);
    let mut seq = 0;
    for c in &commits {
        for e in &c.events {
            seq += 1;
            prop_assert_eq!(e.seq, seq, "{}: event sequences", who);
        }
    }
    prop_assert_eq!(seq, want.events, "{}: replayed events", who);
    let turns = turn_ids(&reader);
    let want_turns: Vec<String> = sess.durable.turns.iter().map(|t| t.id.clone()).collect();
    prop_assert_eq!(&turns, &want_turns, "{}: turns", who);
    let projection = reader.projection().expect("projection");
    prop_assert_eq!(projection.committed_sequence, want.events);
    prop_assert_eq!(projection.transcript_len, want.messages.len() as u64);
    prop_assert_eq!(projection.ended_turns, want_turns.len() as u64);
    let workset = workset_ids(&projection);
    prop_assert_eq!(&workset, &want.workset, "{}: cold workset", who);

    // An older snapshot (or none: sequence 0), whole and as its newest `page` texts.
    let empty = Fold::default();
    let old = match usize::from(pick) % (sess.durable.past.len() + 1) {
        0 => &empty,
        k => &sess.durable.past[k - 1],
    };
    prop_assert!(old.events <= durable);
    let transcript = reader.transcript(old.events).expect("older transcript");
    prop_assert_eq!(
        &values(&transcript),
        &old.messages,
        "{}: transcript at {}",
        who,
        old.events
    );
    let tail: Vec<Value> = reader
        .transcript_texts(old.events, page)
        .expect("older texts")
        .iter()
        .map(|t| serde_json::from_str(t.message().expect("text")).expect("JSON"))
        .collect();
    let from = old.messages.len().saturating_sub(page);
    prop_assert_eq!(
        &tail[..],
        &old.messages[from..],
        "{}: newest texts at {}",
        who,
        old.events
    );

    // The query side: the whole history, and every page by its cursor.
    let r = SessionRef::new(HOST, sess.id.as_str()).expect("ref");
    // A runtime of the service answers `history` and `observe` from its accepted state.
    let served = sess.binding.is_some().then_some(&sess.accepted.fold);
    let history = rt.block_on(query.history(&r)).expect("history");
    prop_assert_eq!(
        &values(&history),
        &served.unwrap_or(want).messages,
        "{}: history",
        who
    );
    let read = |c: &ContentRef| rt.block_on(query.read_content(&r, c)).expect("content");
    let mut walked: Vec<(u64, Value)> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let p = rt
            .block_on(query.history_page(&r, cursor.as_deref(), page))
            .expect("history page");
        let below = walked.first().map(|(position, _)| *position);
        walked.splice(0..0, check_page(&read, &p, durable, page, below, who)?);
        cursor = p.next_cursor.filter(|_| p.has_more);
        if cursor.is_none() {
            break;
        }
    }
    let walked: Vec<Value> = walked.into_iter().map(|(_, m)| m).collect();
    prop_assert_eq!(&walked, &want.messages, "{}: pages walked by cursor", who);

    // The page ending at a position (past the end: the newest page), then older pages.
    let position = 1 + u64::from(pick) % (want.messages.len() as u64 + 2);
    let end = position.min(want.messages.len() as u64);
    let p = rt
        .block_on(query.history_page_ending_at(&r, position, page))
        .expect("history page ending at");
    let got = check_page(&read, &p, durable, page, Some(end + 1), who)?;
    let from = end.saturating_sub(page as u64) as usize;
    let expected: Vec<Value> = want.messages[from..end as usize].to_vec();
    let got: Vec<Value> = got.into_iter().map(|(_, m)| m).collect();
    prop_assert_eq!(&got, &expected, "{}: the page ending at {}", who, position);
    if let Some(cursor) = p.next_cursor {
        let older = rt
            .block_on(query.history_page(&r, Some(&cursor), page))
            .expect("older page");
        let got = check_page(&read, &older, durable, page, Some(from as u64 + 1), who)?;
        let expected = &want.messages[from.saturating_sub(page)..from];
        let got: Vec<Value> = got.into_iter().map(|(_, m)| m).collect();
        prop_assert_eq!(&got[..], expected, "{}: the page before it", who);
    }

    // The commits observed cold, page by page from sequence 0.
    let (mut after, mut observed, mut events) = (0u64, 0u64, 0u64);
    loop {
        let o = rt
            .block_on(query.observe(&r, after, page))
            .expect("observe");
        prop_assert_eq!(o.runtime.is_some(), served.is_some(), "{}: runtime", who);
        for c in &o.events.commits {
            prop_assert_eq!(c.first_seq, after + 1, "{}: observed commits in order", who);
            after = c.last_seq();
            observed += 1;
            events += c.events.len() as u64;
        }
        prop_assert_eq!(o.events.next, after, "{}: observe's next", who);
        if !o.events.truncated {
            break;
        }
        prop_assert!(
            !o.events.commits.is_empty(),
            "{}: an empty truncated page",
            who
        );
    }
    let seen = served.unwrap_or(want);
    prop_assert_eq!(observed, seen.commits, "{}: observed commits", who);
    prop_assert_eq!(events, seen.events, "{}: observed events", who);

    // The whole file, checked as `verify` does.
    let verified = verify_file(root.session_dir(&sid)).expect("verify_file");
    prop_assert_eq!(verified.events, want.events, "{}: verified events", who);
    prop_assert_eq!(verified.commits, want.commits, "{}: verified commits", who);
    // The projection from the newest checkpoint is the full fold's.
    let cold = serde_json::to_value(&projection).expect("projection JSON");
    prop_assert_eq!(
        &serde_json::to_value(&verified.projection).expect("projection JSON"),
        &cold,
        "{}: the checkpointed fold differs from the full fold",
        who
    );

    // The live writer: the accepted state.
    if let Some(w) = &sess.writer {
        let live = &sess.accepted.fold;
        prop_assert_eq!(
            &values(&w.transcript().expect("live transcript")),
            &live.messages,
            "{}: live transcript",
            who
        );
        let snapshot = w.snapshot();
        if live.events == want.events {
            prop_assert_eq!(
                &serde_json::to_value(&snapshot.projection).expect("projection JSON"),
                &cold,
                "{}: the writer's fold differs from the cold one",
                who
            );
        }
        prop_assert_eq!(snapshot.event_sequence, live.events, "{}: accepted", who);
        prop_assert_eq!(
            snapshot.durable_sequence,
            want.events,
            "{}: live durable",
            who
        );
        let workset = workset_ids(&snapshot.projection);
        prop_assert_eq!(&workset, &live.workset, "{}: live workset", who);
        let accepted = w.accepted_commits(0, usize::MAX).expect("accepted commits");
        prop_assert_eq!(
            accepted.len() as u64,
            live.commits,
            "{}: accepted commits",
            who
        );
        prop_assert_eq!(
            accepted.last().map_or(0, |c| c.last_seq()),
            live.events,
            "{}: accepted events",
            who
        );
    }
    Ok(())
}

/// Runs one sequence; returns the forks, deletes and imports it made.
fn run(ops: &[(Op, u8, u16)]) -> Result<[usize; 5], TestCaseError> {
    let (dir, root) = manual_root();
    let served = Served::with_exports(HOST, &root, dir.path());
    let mut world = World {
        used: Vec::new(),
        walk: None,
        served,
        sessions: Vec::new(),
        counter: 0,
        figures: [0; 5],
    };
    for (op, page, pick) in ops {
        world.apply(op);
        world.check(usize::from(*page), *pick)?;
    }
    // Everything closed: the files alone answer the same.
    for i in 0..world.sessions.len() {
        world.sessions[i].close(&world.served);
    }
    world.check(7, 0)?;
    for sess in &world.sessions {
        let file = world
            .served
            .root
            .session_dir(&id(&sess.id))
            .join(SESSION_FILE);
        if sqlite3(&file, "SELECT count(*) FROM checkpoint") == "1" {
            world.figures[3] += 1;
        }
    }
    Ok(world.figures)
}

#[test]
fn proptest_reads_agree_with_a_model_of_the_transcript() {
    let sequences = prop::collection::vec((arb_op(), 1..5u8, any::<u16>()), 1..40);
    let covered = |f: &[usize; 5]| f[..4].iter().all(|&n| n > 0);
    let (steps, figures) = run_sequences(config(), sequences, run, covered);
    let [forks, deletes, imports, checkpoints, walks] = figures;
    eprintln!(
        "{} steps checked against the model: {forks} forks and rewinds, {deletes} parents \
         deleted, {imports} imports, {checkpoints} sessions ending with a checkpoint, {walks} \
         walks by cursor over several steps",
        steps
    );
    assert!(
        covered(&figures),
        "every kind of session-making step was exercised"
    );
}

/// The preview is the first user message's text; an upsert that empties that message clears
/// it and a later user message does not take its place (`Projection::preview`,
/// ARCHITECTURE §3): not one appended after the clearing either (it did), also once read
/// back cold and in the catalog; an upsert that fills the message again brings it back.
#[test]
fn a_preview_cleared_by_an_upsert_is_not_taken_by_a_later_message() {
    let (_dir, root) = manual_root();
    let s = create(&root, "preview");
    let upsert = |content: &str| {
        event(
            "message/upsert",
            json!({"message": {"id": "m1", "role": "user", "content": content}}),
        )
    };
    s.append_events("a", vec![common::message("m1", "user", "hello")])
        .unwrap();
    s.append_events("b", vec![common::message("m2", "user", "second")])
        .unwrap();
    s.append_events("c", vec![upsert("")]).unwrap();
    assert_eq!(s.snapshot().projection.preview, None);
    s.append_events("d", vec![common::message("m3", "user", "third")])
        .unwrap();
    assert_eq!(s.snapshot().projection.preview, None, "live");
    s.close().unwrap();
    let cold = root
        .open_reader(&id("preview"))
        .unwrap()
        .projection()
        .unwrap();
    assert_eq!(cold.preview, None, "cold");
    let listed = root.list(None, 10).unwrap();
    assert_eq!(listed.entries[0].preview, None, "catalog");

    let s = root.open_writer(&id("preview")).unwrap();
    s.append_events("e", vec![upsert("hello again")]).unwrap();
    assert_eq!(
        s.snapshot().projection.preview.as_deref(),
        Some("hello again")
    );
    s.close().unwrap();
}
