//! A model-based random test of the write side and of lineage operations: random sequences of turns
//! (some messages over the inline threshold, some over 64 KiB: content blobs), upserts,
//! `history/replace`, flushes and reopens (every other writer a runtime of a `Service`), forks and
//! rewinds of any session (forks of forks cut at any of their turns, inherited or their own; some
//! opened at once with `fork_writer`), deletes of any session (forks and forks of forks get its
//! ranges materialised while their writers hold unflushed commits and readers stay open on them; a
//! delete of a session with a live writer first waits and is cancelled, changing nothing), `gc`
//! (dry run or not, with or without `keep_forked`), export then import under a new id and under the
//! same id after a delete (and refused while it exists), `Root::rename` (refused while a writer
//! holds the session) and full-text searches of message versions and titles (every writer closed
//! first). A model keeps, per session, its state after each commit (transcript, workset, title,
//! ended turns, the long strings stored as blobs), its header (parent, origin, inherited count) and
//! its lineage rows; after every step every session is compared with it: `stat` (durable sequence,
//! lineage ranges, `inherited_events`, header), the cold transcript and turn index, `stats`
//! (events, distinct blobs), `verify`, the catalog (`list` holds exactly the model's sessions, each
//! entry's title, turns, sequence, parent and origin, `list_filtered` by origin, `catalog_entry`,
//! `catalog_totals`), the live writer's transcript and sequences, and the readers held open across
//! steps (their snapshot read again). A search of a message version's phrase finds exactly the
//! sessions whose transcript shows it: each once, as the session whose file holds it or in a hit's
//! `shared_with`, and a search of one session alone finds it exactly when that session shows it.
//! `PROPTEST_CASES` sets the number of sequences (default 10), `RELIABILITY_SEED` the seed of their
//! choices (printed, so a failure replays).

mod common;
mod reliability_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError};
use reliability_support::harness::{
    Accepted, Handle, Served, deref_to_handle, run_sequences, turn_ids, workset_ids,
};
use reliability_support::model::{Fold, long_text, message, message_id, store_value};
use reliability_support::{env_count, seed};
use serde_json::{Value, json};
use session_store::format::{DEFAULT_INLINE_THRESHOLD, INLINE_PAYLOAD_LIMIT};
use session_store::{
    Batch, CancelToken, Error, Event, ForkPoint, GcOptions, ImportOptions, ListFilter, Origin,
    Root, SearchOptions, Session, SessionReader,
};

const HOST: &str = "lineage";

/// `PROPTEST_CASES` sequences (default 10) from the seed `RELIABILITY_SEED` (printed; a
/// fresh one when unset).
fn config() -> Config {
    Config {
        cases: env_count("PROPTEST_CASES", 10) as u32,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed("proptest_lineage_operations_agree_with_a_model")),
        ..Config::default()
    }
}

/// One step. `s` picks a session (modulo how many exist), the other numbers pick among what
/// it holds at that point.
#[derive(Clone, Debug)]
enum Op {
    /// A new session.
    Create,
    /// A turn of `n` new messages (one commit); bits of `sizes` choose their lengths.
    Turn {
        s: u8,
        n: u8,
        sizes: u16,
    },
    /// An upsert of a message of the transcript (`pick`) with a new text, long when `long`.
    Upsert {
        s: u8,
        pick: u16,
        long: bool,
    },
    /// A `history/replace` keeping the messages `keep` selects plus `add` new ones.
    Replace {
        s: u8,
        keep: u16,
        add: u8,
    },
    Flush {
        s: u8,
    },
    /// Close the writer and open it again (`reopen`) or leave it closed.
    Reopen {
        s: u8,
        reopen: bool,
    },
    /// A fork after (`after`) or a rewind before a turn of a session, inherited or its own;
    /// opened for writing at once with `fork_writer` when `open`.
    Fork {
        s: u8,
        turn: u16,
        after: bool,
        open: bool,
    },
    /// Delete a session (`cancel`: a delete of a session with a writer is first tried with a
    /// short wait, and cancelled); dependents' writers reopened after it when `reopen`.
    Delete {
        s: u8,
        cancel: bool,
        reopen: bool,
    },
    /// `gc` of every session not updated for 0 s.
    Gc {
        dry_run: bool,
        keep_forked: bool,
    },
    /// Export; import under a new id, or (`same`) delete the session and import it again.
    ExportImport {
        s: u8,
        same: bool,
    },
    /// `Root::rename` (a blank title when `blank`, refused).
    Rename {
        s: u8,
        blank: bool,
    },
    /// Open a reader of a session and keep it (`hold`), or drop the held readers.
    Reader {
        s: u8,
        hold: bool,
    },
    /// Close every writer, then search the phrases of `picks` message versions.
    Search {
        picks: Vec<u16>,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    let s = any::<u8>();
    prop_oneof![
        2 => Just(Op::Create),
        6 => (s, 1..4u8, any::<u16>()).prop_map(|(s, n, sizes)| Op::Turn { s, n, sizes }),
        3 => (s, any::<u16>(), any::<bool>())
            .prop_map(|(s, pick, long)| Op::Upsert { s, pick, long }),
        1 => (s, any::<u16>(), 0..3u8).prop_map(|(s, keep, add)| Op::Replace { s, keep, add }),
        2 => s.prop_map(|s| Op::Flush { s }),
        2 => (s, any::<bool>()).prop_map(|(s, reopen)| Op::Reopen { s, reopen }),
        5 => (s, any::<u16>(), any::<bool>(), any::<bool>())
            .prop_map(|(s, turn, after, open)| Op::Fork { s, turn, after, open }),
        4 => (s, any::<bool>(), any::<bool>())
            .prop_map(|(s, cancel, reopen)| Op::Delete { s, cancel, reopen }),
        1 => (any::<bool>(), any::<bool>())
            .prop_map(|(dry_run, keep_forked)| Op::Gc { dry_run, keep_forked }),
        2 => (s, any::<bool>()).prop_map(|(s, same)| Op::ExportImport { s, same }),
        1 => (s, prop::bool::weighted(0.2)).prop_map(|(s, blank)| Op::Rename { s, blank }),
        2 => (s, prop::bool::weighted(0.7)).prop_map(|(s, hold)| Op::Reader { s, hold }),
        2 => prop::collection::vec(any::<u16>(), 1..5).prop_map(|picks| Op::Search { picks }),
    ]
}

/// A session after one of its commits (or empty).
#[derive(Clone, Debug, Default)]
struct Snap {
    fold: Fold,
    title: String,
    /// What its events store as blobs: each payload over 64 KiB whole, else each string
    /// value over the inline threshold.
    blobs: BTreeSet<String>,
    /// Ended turns: id, sequence before its first event and after its last.
    turns: Vec<(String, u64, u64)>,
}

/// A session's log: its state after each commit, oldest first (`[0]` is empty).
#[derive(Clone, Debug)]
struct Log(Vec<Snap>);

impl Default for Log {
    fn default() -> Self {
        Log(vec![Snap::default()])
    }
}

impl Log {
    fn now(&self) -> &Snap {
        self.0.last().expect("a log is never empty")
    }

    /// The log cut at sequence `cut`, a commit boundary.
    fn cut(&self, cut: u64) -> Log {
        let kept: Vec<Snap> = self
            .0
            .iter()
            .take_while(|s| s.fold.events <= cut)
            .cloned()
            .collect();
        assert_eq!(
            kept.last().map(|s| s.fold.events),
            Some(cut),
            "a cut between commits"
        );
        Log(kept)
    }
}

/// A lineage row: ancestor, `(after, through]`.
type Range = (String, u64, u64);

/// A session: its id, logs and writer (the shared harness's), its header and lineage rows.
struct Sess {
    h: Handle<Log>,
    parent: Option<String>,
    origin: Origin,
    /// The header's inherited count (the cut of a fork or rewind).
    inherited: u64,
    lineage: Vec<Range>,
}

impl Sess {
    fn cold(id: String, log: Log) -> Sess {
        Sess {
            h: Handle::cold(id, log),
            parent: None,
            origin: Origin::New,
            inherited: 0,
            lineage: Vec::new(),
        }
    }

    /// The files that hold `(0, cut]` of this session, in order, adjacent ranges of one file
    /// merged: what a fork cut there records as its lineage.
    fn prefix_lineage(&self, cut: u64) -> Vec<Range> {
        let mut out: Vec<Range> = Vec::new();
        let mut push = |source: &str, after: u64, through: u64| {
            if through <= after {
                return;
            }
            match out.last_mut() {
                Some(last) if last.0 == source && last.2 == after => last.2 = through,
                _ => out.push((source.to_owned(), after, through)),
            }
        };
        let mut at = 0;
        for (ancestor, after, through) in &self.lineage {
            push(&self.id, at, (*after).min(cut));
            push(ancestor, *after, (*through).min(cut));
            at = *through;
        }
        push(&self.id, at, cut);
        out
    }
}

impl Accepted for Log {
    fn events(&self) -> u64 {
        self.now().fold.events
    }
}

deref_to_handle!(Sess, Log);

/// A reader opened at some step, with what it saw then.
struct Held {
    id: String,
    reader: SessionReader,
    snap: Snap,
}

struct World {
    served: Served,
    sessions: Vec<Sess>,
    held: Vec<Held>,
    counter: u64,
    /// Every message version written: (id, n).
    versions: Vec<(String, u64)>,
    /// Every title set.
    titles: Vec<String>,
    /// Forks, deletes with dependents, gc deletions, imports, searches with a shared hit.
    figures: [usize; 5],
}

/// Adds what event `e` stores as blobs to `blobs`: its payload over 64 KiB, whole; else
/// each string value over the inline threshold (1 KiB).
fn blob_keys(e: &Event, blobs: &mut BTreeSet<String>) {
    fn strings(v: &Value, blobs: &mut BTreeSet<String>) {
        match v {
            Value::String(s) if s.len() > DEFAULT_INLINE_THRESHOLD => {
                blobs.insert(format!("string {s}"));
            }
            Value::Array(items) => items.iter().for_each(|x| strings(x, blobs)),
            Value::Object(fields) => fields.values().for_each(|x| strings(x, blobs)),
            _ => {}
        }
    }
    let Some(text) = e.payload_str() else {
        return;
    };
    if text.len() > INLINE_PAYLOAD_LIMIT {
        blobs.insert(format!("payload {text}"));
    } else {
        strings(&serde_json::from_str(text).expect("payload JSON"), blobs);
    }
}

fn session_id(s: &str) -> session_store::SessionId {
    id(s)
}

impl World {
    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}", self.counter)
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.sessions.iter().position(|s| s.id == name)
    }

    fn create(&mut self) -> usize {
        let name = self.fresh("s");
        let session = create(&self.served.root, &name);
        let mut sess = Sess::cold(name, Log::default());
        sess.writer = Some(session);
        self.sessions.push(sess);
        self.sessions.len() - 1
    }

    fn pick(&mut self, s: u8) -> usize {
        if self.sessions.is_empty() {
            return self.create();
        }
        usize::from(s) % self.sessions.len()
    }

    /// Appends `events` as one commit of session `i` and records `snap` as its state after.
    fn append(&mut self, i: usize, events: Vec<Event>, turn: Option<String>, mut snap: Snap) {
        for e in &events {
            blob_keys(e, &mut snap.blobs);
        }
        let (before, n) =
            self.sessions[i].append(&self.served, &mut self.counter, events, turn.as_deref());
        let log = &mut self.sessions[i].accepted;
        snap.fold.events = before + n;
        snap.fold.commits = log.now().fold.commits + 1;
        if let Some(t) = turn {
            snap.turns.push((t, before, before + n));
        }
        log.0.push(snap);
    }

    /// A new version of message `id` (a new id when `None`), `long` characters of text more.
    fn version(&mut self, id: Option<String>, long: usize) -> Value {
        let id = id.unwrap_or_else(|| self.fresh("m"));
        self.counter += 1;
        let mut m = message(&id, self.counter);
        self.versions.push((id.clone(), self.counter));
        if long > 0 {
            let text = format!(
                "{} {}",
                m["content"].as_str().expect("text"),
                long_text(&id, long)
            );
            m["content"] = json!(text);
        }
        m
    }

    /// Deletes session `i` (its writer closed) in the model: its dependents' rows naming it
    /// are gone (their ranges are in their own files now). Returns the dependents.
    fn forget(&mut self, i: usize) -> BTreeSet<String> {
        let sess = self.sessions.remove(i);
        let mut dependents = BTreeSet::new();
        for d in &mut self.sessions {
            let before = d.lineage.len();
            d.lineage.retain(|(a, _, _)| *a != sess.id);
            if d.lineage.len() != before {
                dependents.insert(d.id.clone());
            }
        }
        dependents
    }

    fn dependents(&self, name: &str) -> BTreeSet<String> {
        self.sessions
            .iter()
            .filter(|d| d.lineage.iter().any(|(a, _, _)| a == name))
            .map(|d| d.id.clone())
            .collect()
    }

    fn delete(&mut self, i: usize, cancel: bool, reopen: bool) {
        let name = self.sessions[i].id.clone();
        if cancel && self.sessions[i].writer.is_some() {
            // The writer keeps its lock: the delete waits, is cancelled, changes nothing.
            let refused = self.served.root.delete(
                &session_id(&name),
                &CancelToken::after(Duration::from_millis(30)),
            );
            assert!(
                matches!(refused, Err(Error::Cancelled)),
                "a delete under a live writer: {refused:?}"
            );
        }
        self.sessions[i].close(&self.served);
        self.served
            .root
            .delete(&session_id(&name), &CancelToken::new())
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
        let dependents = self.forget(i);
        if !dependents.is_empty() {
            self.figures[1] += 1;
        }
        if reopen {
            for d in dependents {
                let k = self.index(&d).expect("a dependent");
                if self.sessions[k].writer.is_some() {
                    self.sessions[k].close(&self.served);
                    self.sessions[k].writer(&self.served, &mut self.counter);
                }
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Create => {
                self.create();
            }
            Op::Turn { s, n, sizes } => {
                let i = self.pick(s);
                let mut snap = self.sessions[i].accepted.now().clone();
                let mut events = vec![Event::new("turn/start")];
                for k in 0..n {
                    let long = match (sizes >> (4 * k)) & 15 {
                        15 => 70_000,
                        11..=14 => 1_500,
                        _ => 0,
                    };
                    let m = self.version(None, long);
                    events.push(event("message/complete", json!({ "message": m })));
                    assert!(snap.fold.complete(m));
                }
                events.push(turn_end("completed"));
                let turn = self.fresh("t");
                self.append(i, events, Some(turn), snap);
            }
            Op::Upsert { s, pick, long } => {
                let i = self.pick(s);
                let mut snap = self.sessions[i].accepted.now().clone();
                let ids = snap.fold.ids();
                let target = (!ids.is_empty()).then(|| ids[usize::from(pick) % ids.len()].clone());
                let m = self.version(target, if long { 1_500 } else { 0 });
                snap.fold.upsert(m.clone());
                let events = vec![event("message/upsert", json!({ "message": m }))];
                self.append(i, events, None, snap);
            }
            Op::Replace { s, keep, add } => {
                let i = self.pick(s);
                let mut snap = self.sessions[i].accepted.now().clone();
                let mut messages = snap.fold.kept(keep);
                for _ in 0..add {
                    messages.push(self.version(None, 0));
                }
                snap.fold.replace(&messages, true);
                let events = vec![event("history/replace", json!({ "messages": messages }))];
                self.append(i, events, None, snap);
            }
            Op::Flush { s } => {
                let i = self.pick(s);
                self.sessions[i].flush();
            }
            Op::Reopen { s, reopen } => {
                let i = self.pick(s);
                self.sessions[i].close(&self.served);
                if reopen {
                    self.sessions[i].writer(&self.served, &mut self.counter);
                }
            }
            Op::Fork {
                s,
                turn,
                after,
                open,
            } => {
                let i = self.pick(s);
                self.sessions[i].flush();
                let parent = &self.sessions[i];
                let turns = &parent.durable.now().turns;
                if turns.is_empty() {
                    return;
                }
                let (t, start, end) = turns[usize::from(turn) % turns.len()].clone();
                let (point, cut, origin) = if after {
                    (ForkPoint::AfterTurn(t), end, Origin::Fork)
                } else {
                    (ForkPoint::BeforeTurn(t), start, Origin::Rewind)
                };
                let mut child = Sess::cold(String::new(), parent.durable.cut(cut));
                child.parent = Some(parent.id.clone());
                child.origin = origin;
                child.inherited = cut;
                child.lineage = parent.prefix_lineage(cut);
                let parent_id = session_id(&parent.id);
                let name = self.fresh("f");
                child.id = name.clone();
                if open {
                    let w = self
                        .served
                        .root
                        .fork_writer(&parent_id, point.clone(), Some(id(&name)))
                        .unwrap_or_else(|e| panic!("{point:?} of {parent_id}: {e}"));
                    child.writer = Some(w);
                } else {
                    let made = self
                        .served
                        .root
                        .fork(&parent_id, point.clone(), Some(id(&name)))
                        .unwrap_or_else(|e| panic!("{point:?} of {parent_id}: {e}"));
                    assert_eq!(made.as_str(), name);
                }
                self.figures[0] += 1;
                self.sessions.push(child);
            }
            Op::Delete { s, cancel, reopen } => {
                if self.sessions.is_empty() {
                    return;
                }
                let i = usize::from(s) % self.sessions.len();
                self.delete(i, cancel, reopen);
            }
            Op::Gc {
                dry_run,
                keep_forked,
            } => self.gc(dry_run, keep_forked),
            Op::ExportImport { s, same } => {
                let i = self.pick(s);
                self.sessions[i].flush();
                let name = format!("{}.sqlite", self.fresh("x"));
                let file = self.served.exports.join(name);
                let from = self.sessions[i].id.clone();
                let report = self
                    .served
                    .root
                    .export(&session_id(&from), &file)
                    .expect("export");
                let durable = self.sessions[i].durable.clone();
                assert_eq!(report.events, durable.now().fold.events);
                assert_eq!(report.commits, durable.now().fold.commits);
                let mut copy = Sess::cold(String::new(), durable);
                copy.parent = self.sessions[i].parent.clone();
                copy.inherited = self.sessions[i].inherited;
                copy.origin = Origin::CanonicalImport;
                let target = if same {
                    let taken = self.served.root.import(&file, ImportOptions::default());
                    assert!(
                        matches!(taken, Err(Error::SessionExists(_))),
                        "an import over an existing session: {taken:?}"
                    );
                    self.delete(i, false, false);
                    let made = self
                        .served
                        .root
                        .import(&file, ImportOptions::default())
                        .expect("import under the same id");
                    assert_eq!(made.as_str(), from);
                    from
                } else {
                    let name = self.fresh("i");
                    self.served.import_as(&file, &name);
                    name
                };
                copy.id = target;
                self.figures[3] += 1;
                self.sessions.push(copy);
            }
            Op::Rename { s, blank } => {
                let i = self.pick(s);
                let name = self.sessions[i].id.clone();
                let title = if blank {
                    " ".to_owned()
                } else {
                    self.fresh("title ")
                };
                let renamed = self.served.root.rename(&session_id(&name), &title);
                if blank {
                    assert!(
                        matches!(renamed, Err(Error::InvalidInput { .. })),
                        "a blank title: {renamed:?}"
                    );
                } else if self.sessions[i].writer.is_some() {
                    assert!(
                        matches!(renamed, Err(Error::WriterOwned { .. })),
                        "a rename under a live writer: {renamed:?}"
                    );
                } else {
                    renamed.unwrap_or_else(|e| panic!("rename {name}: {e}"));
                    self.titles.push(title.clone());
                    let log = &mut self.sessions[i].accepted;
                    let mut snap = log.now().clone();
                    snap.title = title;
                    snap.fold.events += 1;
                    snap.fold.commits += 1;
                    log.0.push(snap);
                    self.sessions[i].durable = log.clone();
                }
            }
            Op::Reader { s, hold } => {
                if !hold {
                    self.held.clear();
                    return;
                }
                let i = self.pick(s);
                let sess = &self.sessions[i];
                let reader = self
                    .served
                    .root
                    .open_reader(&session_id(&sess.id))
                    .expect("reader");
                self.held.push(Held {
                    id: sess.id.clone(),
                    reader,
                    snap: sess.durable.now().clone(),
                });
            }
            Op::Search { ref picks } => {
                // Drained commits are indexed a little later on a writer thread; a closed
                // session is wholly in the index.
                for i in 0..self.sessions.len() {
                    self.sessions[i].close(&self.served);
                }
                for pick in picks {
                    if self.versions.is_empty() {
                        return;
                    }
                    let (m, n) = self.versions[usize::from(*pick) % self.versions.len()].clone();
                    self.search(&m, n);
                    if !self.titles.is_empty() {
                        let title = self.titles[usize::from(*pick) % self.titles.len()].clone();
                        self.search_title(&title);
                    }
                }
            }
        }
    }

    fn gc(&mut self, dry_run: bool, keep_forked: bool) {
        let options = GcOptions::older_than(Duration::ZERO)
            .with_dry_run(dry_run)
            .with_keep_forked(keep_forked);
        let report = self.served.root.gc(&options).expect("gc");
        assert!(report.failed.is_empty(), "gc failed: {:?}", report.failed);
        let reported: BTreeSet<String> = report
            .deleted
            .iter()
            .map(|d| d.session_id.to_string())
            .chain(report.kept.iter().map(|k| k.session_id.to_string()))
            .collect();
        let all: BTreeSet<String> = self.sessions.iter().map(|s| s.id.clone()).collect();
        assert_eq!(reported, all, "gc reports every session, once: {report:?}");
        for k in &report.kept {
            let sess = &self.sessions[self.index(k.session_id.as_str()).expect("kept")];
            if sess.writer.is_some() {
                // Or changed by this run's deletion of a fork of it (its `dependents`).
                assert!(
                    k.reason.contains("live writer") || k.reason.contains("updated meanwhile"),
                    "{k:?}"
                );
            }
        }
        // A run decides what to keep as it starts (as its dry run reports): a session whose
        // forks the run deletes first is kept all the same with `keep_forked`.
        let forked_at_start: BTreeSet<String> = self
            .sessions
            .iter()
            .filter(|s| !self.dependents(&s.id).is_empty())
            .map(|s| s.id.clone())
            .collect();
        let mut gone: BTreeSet<String> = BTreeSet::new();
        for d in &report.deleted {
            let name = d.session_id.to_string();
            let i = self.index(&name).expect("deleted");
            assert!(
                self.sessions[i].writer.is_none(),
                "gc deleted {name} under its writer"
            );
            let forks: BTreeSet<String> = d.forks.iter().map(ToString::to_string).collect();
            // Not the forks deleted before it in this run (a real run has forgotten them).
            let expected: BTreeSet<String> =
                self.dependents(&name).difference(&gone).cloned().collect();
            assert_eq!(forks, expected, "the forks gc reports for {name}");
            assert!(
                !keep_forked || !forked_at_start.contains(&name),
                "gc deleted forked {name}"
            );
            gone.insert(name);
            if !dry_run {
                self.forget(i);
                self.figures[2] += 1;
            }
        }
        if dry_run {
            // Nothing changed: every session without a writer (and without forks when they
            // are kept) would be deleted.
            let would: BTreeSet<String> = self
                .sessions
                .iter()
                .filter(|s| s.writer.is_none())
                .filter(|s| !keep_forked || self.dependents(&s.id).is_empty())
                .map(|s| s.id.clone())
                .collect();
            let listed: BTreeSet<String> = report
                .deleted
                .iter()
                .map(|d| d.session_id.to_string())
                .collect();
            assert_eq!(listed, would, "a dry run's deletions");
        }
    }

    /// Searches the phrase of version `n` of message `m`.
    fn search(&mut self, m: &str, n: u64) {
        let want: BTreeSet<String> = self
            .sessions
            .iter()
            .filter(|s| {
                s.durable.now().fold.messages.iter().any(|x| {
                    message_id(x) == m
                        && x["content"].as_str().is_some_and(|c| {
                            c.split(' ').take(4).eq(["text", &n.to_string(), "of", m])
                        })
                })
            })
            .map(|s| s.id.clone())
            .collect();
        self.search_phrase(&format!("\"text {n} of {m}\""), m, &want);
    }

    /// Searches `title`: the sessions whose title it is.
    fn search_title(&mut self, title: &str) {
        let want: BTreeSet<String> = self
            .sessions
            .iter()
            .filter(|s| s.durable.now().title == title)
            .map(|s| s.id.clone())
            .collect();
        self.search_phrase(&format!("\"{title}\""), "", &want);
    }

    /// Searches `phrase` (in message `m`, "" for a title): the sessions of `want` are
    /// found each once, as the hit's session or in its `shared_with`; a search of one
    /// session alone finds it once when that session is in `want`, else not.
    fn search_phrase(&mut self, phrase: &str, m: &str, want: &BTreeSet<String>) {
        let query = self.served.service.query();
        let page = self
            .served
            .rt
            .block_on(query.search(phrase, SearchOptions::default().with_limit(100)))
            .unwrap_or_else(|e| panic!("search {phrase}: {e}"));
        assert!(page.next_cursor.is_none());
        let mut found: Vec<String> = Vec::new();
        for hit in &page.hits {
            assert_eq!(hit.message_id, m, "{phrase}: {hit:?}");
            found.push(hit.session_ref.session_id.to_string());
            found.extend(hit.shared_with.iter().map(|r| r.session_id.to_string()));
            if !hit.shared_with.is_empty() {
                self.figures[4] += 1;
            }
        }
        let set: BTreeSet<String> = found.iter().cloned().collect();
        assert_eq!(
            set.len(),
            found.len(),
            "{phrase}: a session found twice: {page:?}"
        );
        assert_eq!(&set, want, "{phrase}: the sessions showing it: {page:?}");
        for sess in &self.sessions {
            let options = SearchOptions::default().with_session(session_id(&sess.id));
            let alone = self
                .served
                .rt
                .block_on(query.search(phrase, options))
                .unwrap_or_else(|e| panic!("search {phrase} in {}: {e}", sess.id));
            assert_eq!(
                alone.hits.len(),
                usize::from(want.contains(&sess.id)),
                "{phrase}: a search of {} alone: {alone:?}",
                sess.id
            );
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let listing = self.served.root.list(None, 10_000).expect("list");
        prop_assert!(listing.skipped.is_empty(), "skipped: {:?}", listing.skipped);
        let listed: Vec<String> = listing
            .entries
            .iter()
            .map(|e| e.session_id.to_string())
            .collect();
        let mut ids: Vec<String> = self.sessions.iter().map(|s| s.id.clone()).collect();
        ids.sort();
        prop_assert_eq!(&listed, &ids, "listed sessions");
        let entries: BTreeMap<String, _> = listing
            .entries
            .into_iter()
            .map(|e| (e.session_id.to_string(), e))
            .collect();
        for origin in [
            Origin::New,
            Origin::Fork,
            Origin::Rewind,
            Origin::CanonicalImport,
        ] {
            let filter = ListFilter::default().with_origin(origin);
            let page = self
                .served
                .root
                .list_filtered(&filter, None, 10_000)
                .expect("list");
            let mut got: Vec<String> = page
                .entries
                .iter()
                .map(|e| e.session_id.to_string())
                .collect();
            got.sort();
            let mut want: Vec<String> = self
                .sessions
                .iter()
                .filter(|s| s.origin == origin)
                .map(|s| s.id.clone())
                .collect();
            want.sort();
            prop_assert_eq!(&got, &want, "sessions listed of origin {:?}", origin);
        }
        let totals = self.served.root.catalog_totals().expect("totals");
        prop_assert_eq!(
            totals.sessions,
            ids.len() as u64,
            "catalog totals: sessions"
        );
        let events: u64 = self
            .sessions
            .iter()
            .map(|s| s.durable.now().fold.events)
            .sum();
        prop_assert_eq!(totals.events, events, "catalog totals: events");
        for sess in &self.sessions {
            check_session(&self.served.root, sess, &entries[&sess.id])?;
        }
        for held in &self.held {
            let read = held.reader.transcript(held.snap.fold.events);
            let exists = self.index(&held.id).is_some();
            match read {
                Ok(transcript) => {
                    let got: Vec<Value> = transcript.iter().map(|m| store_value(m)).collect();
                    prop_assert_eq!(
                        &got,
                        &held.snap.fold.messages,
                        "{}: a reader held open",
                        held.id
                    );
                }
                Err(e) => prop_assert!(!exists, "{}: a reader held open: {}", held.id, e),
            }
        }
        Ok(())
    }
}

fn check_session(
    root: &Root,
    sess: &Sess,
    entry: &session_store::CatalogEntry,
) -> Result<(), TestCaseError> {
    let sid = session_id(&sess.id);
    let who = &sess.id;
    let want = sess.durable.now();
    let info = root.stat(&sid).expect("stat");
    prop_assert_eq!(info.durable_sequence, want.fold.events, "{}: durable", who);
    let lineage: Vec<Range> = info
        .lineage
        .iter()
        .map(|e| (e.ancestor_id.to_string(), e.after_seq, e.through_seq))
        .collect();
    prop_assert_eq!(&lineage, &sess.lineage, "{}: lineage", who);
    let inherited: u64 = sess.lineage.iter().map(|(_, a, t)| t - a).sum();
    prop_assert_eq!(
        info.inherited_events,
        inherited,
        "{}: inherited events",
        who
    );
    prop_assert_eq!(
        info.header.inherited_events,
        sess.inherited,
        "{}: header",
        who
    );
    prop_assert_eq!(
        info.header.parent_id.as_ref().map(ToString::to_string),
        sess.parent.clone(),
        "{}: parent",
        who
    );
    prop_assert_eq!(info.header.origin, sess.origin, "{}: origin", who);

    let reader = root.open_reader(&sid).expect("reader");
    let transcript: Vec<Value> = reader
        .transcript(want.fold.events)
        .expect("transcript")
        .iter()
        .map(|m| store_value(m))
        .collect();
    prop_assert_eq!(&transcript, &want.fold.messages, "{}: transcript", who);
    let turns = turn_ids(&reader);
    let want_turns: Vec<String> = want.turns.iter().map(|t| t.0.clone()).collect();
    prop_assert_eq!(&turns, &want_turns, "{}: turns", who);
    let projection = reader.projection().expect("projection");
    prop_assert_eq!(&projection.title, &want.title, "{}: title", who);
    let workset = workset_ids(&projection);
    prop_assert_eq!(&workset, &want.fold.workset, "{}: workset", who);

    let stats = root.stats(&sid).expect("stats");
    prop_assert_eq!(stats.events, want.fold.events, "{}: stats events", who);
    prop_assert_eq!(
        stats.blobs.count,
        want.blobs.len() as u64,
        "{}: distinct blobs",
        who
    );

    let verified = root.verify(&sid).expect("verify");
    prop_assert_eq!(
        verified.events,
        want.fold.events,
        "{}: verified events",
        who
    );
    prop_assert_eq!(
        verified.commits,
        want.fold.commits,
        "{}: verified commits",
        who
    );

    for (how, e) in [
        ("list", entry.clone()),
        ("catalog_entry", root.catalog_entry(&sid).expect("entry")),
    ] {
        prop_assert_eq!(&e.title, &want.title, "{}: {} title", who, how);
        prop_assert_eq!(e.turns, want.turns.len() as u64, "{}: {} turns", who, how);
        prop_assert_eq!(e.durable_sequence, want.fold.events, "{}: {} seq", who, how);
        prop_assert_eq!(
            e.parent_id.as_ref().map(ToString::to_string),
            sess.parent.clone(),
            "{}: {} parent",
            who,
            how
        );
        prop_assert_eq!(e.origin, sess.origin, "{}: {} origin", who, how);
    }

    if let Some(w) = &sess.writer {
        let live = sess.accepted.now();
        let got: Vec<Value> = w
            .transcript()
            .expect("live transcript")
            .iter()
            .map(|m| store_value(m))
            .collect();
        prop_assert_eq!(&got, &live.fold.messages, "{}: live transcript", who);
        let snapshot = w.snapshot();
        prop_assert_eq!(
            snapshot.event_sequence,
            live.fold.events,
            "{}: accepted",
            who
        );
        prop_assert_eq!(
            snapshot.durable_sequence,
            want.fold.events,
            "{}: live durable",
            who
        );
        prop_assert_eq!(
            &snapshot.projection.title,
            &live.title,
            "{}: live title",
            who
        );
    }
    Ok(())
}

fn run(ops: &[Op]) -> Result<[usize; 5], TestCaseError> {
    let (dir, root) = manual_root();
    let served = Served::with_exports(HOST, &root, dir.path());
    let mut world = World {
        held: Vec::new(),
        versions: Vec::new(),
        titles: Vec::new(),
        served,
        sessions: Vec::new(),
        counter: 0,
        figures: [0; 5],
    };
    for op in ops {
        world.apply(op);
        world.check()?;
    }
    // Everything closed: the files alone answer the same, and each phrase of a message
    // with several versions (the newest 40) and each title is found where the model shows
    // it.
    world.apply(&Op::Search { picks: vec![] });
    let mut versions: BTreeMap<String, usize> = BTreeMap::new();
    for (m, _) in &world.versions {
        *versions.entry(m.clone()).or_default() += 1;
    }
    let several: Vec<(String, u64)> = world
        .versions
        .iter()
        .filter(|(m, _)| versions[m] > 1)
        .cloned()
        .collect();
    for (m, n) in several.iter().rev().take(40) {
        world.search(m, *n);
    }
    for title in world.titles.clone() {
        world.search_title(&title);
    }
    world.check()?;
    Ok(world.figures)
}

#[test]
fn proptest_lineage_operations_agree_with_a_model() {
    let covered = |f: &[usize; 5]| f[0] > 0 && f[1] > 0 && f[3] > 0;
    let (steps, figures) = run_sequences(
        config(),
        prop::collection::vec(arb_op(), 1..45),
        run,
        covered,
    );
    let [forks, deletes, gc, imports, shared] = figures;
    eprintln!(
        "{} steps checked against the model: {forks} forks and rewinds, {deletes} deletes of \
         forked sessions, {gc} sessions deleted by gc, {imports} imports, {shared} search hits \
         shared with forks",
        steps
    );
    assert!(covered(&figures), "every kind of step was exercised");
}

/// A message a session replaced (`history/replace`) or upserted after a fork was cut is still
/// in the fork's transcript, and a search finds it there, also a search of the fork alone:
/// the hit is under a fork that shows it (no longer under the session that wrote it, which
/// does not), with the other forks showing it in `shared_with`. Found by
/// `proptest_lineage_operations_agree_with_a_model`: such a hit was dropped, so the forks'
/// message was found by no search.
#[test]
fn a_message_replaced_after_a_fork_is_still_found_in_the_fork() {
    let (_dir, root) = manual_root();
    let Served { rt, service, .. } = Served::new(HOST, &root);
    let query = service.query();
    let found = |q: &str, options: SearchOptions| -> Vec<(String, u64, String, Vec<String>)> {
        let page = rt.block_on(query.search(q, options)).expect("search");
        page.hits
            .into_iter()
            .map(|h| {
                (
                    h.session_ref.session_id.to_string(),
                    h.position,
                    h.message_id,
                    h.shared_with
                        .iter()
                        .map(|r| r.session_id.to_string())
                        .collect(),
                )
            })
            .collect()
    };
    // A replacement dropping the message, an upsert changing it, a replacement keeping it.
    for (parent, later) in [("p", 0), ("q", 1), ("r", 2)] {
        let s = create(&root, parent);
        s.append(
            Batch::new(
                format!("{parent}-1"),
                vec![
                    Event::new("turn/start"),
                    common::message("m1", "user", &format!("alpha of {parent}")),
                    turn_end("completed"),
                ],
            )
            .in_turn("t1"),
        )
        .expect("turn");
        s.flush().expect("flush");
        let (f1, f2) = (format!("{parent}-f1"), format!("{parent}-f2"));
        for f in [&f1, &f2] {
            root.fork(&id(parent), ForkPoint::AfterTurn("t1".into()), Some(id(f)))
                .expect("fork");
        }
        let m1 = json!({"id": "m1", "role": "user", "content": format!("alpha of {parent}")});
        let later = match later {
            0 => event("history/replace", json!({"messages": []})),
            1 => event(
                "message/upsert",
                json!({"message": {"id": "m1", "role": "user", "content": format!("beta of {parent}")}}),
            ),
            _ => event("history/replace", json!({"messages": [m1]})),
        };
        s.append_events(&format!("{parent}-2"), vec![later])
            .expect("replace");
        s.close().expect("close");
        let phrase = format!("\"alpha of {parent}\"");
        let mut hits = found(&phrase, SearchOptions::default());
        hits.sort();
        let forks = (f1.clone(), 1, "m1".to_owned(), vec![f2.clone()]);
        if parent == "r" {
            // The parent's own copy, and the forks' (an older event of the parent's file).
            let own = (parent.to_owned(), 1, "m1".to_owned(), vec![]);
            assert_eq!(hits, vec![own, forks], "{parent}: each session once");
        } else {
            assert_eq!(
                hits,
                vec![forks],
                "{parent}: the forks show it, the parent not"
            );
        }
        for f in [&f1, &f2] {
            let alone = found(&phrase, SearchOptions::default().with_session(id(f)));
            assert_eq!(alone.len(), 1, "{parent}: a search of {f} alone: {alone:?}");
            assert_eq!(
                &alone[0].0, f,
                "{parent}: under {f} when it alone is searched"
            );
        }
        let alone = found(&phrase, SearchOptions::default().with_session(id(parent)));
        assert_eq!(
            alone.len(),
            usize::from(parent == "r"),
            "{parent} alone: {alone:?}"
        );
    }
    let upserted = found("\"beta of q\"", SearchOptions::default());
    assert_eq!(upserted, vec![("q".to_owned(), 1, "m1".to_owned(), vec![])]);
}

/// A fork cut between two transcript resets of its parent (a rewind before a turn that
/// followed the first) shows nothing the first reset dropped: a search neither lists it in
/// a hit's `shared_with` nor finds the dropped message in a search of it alone. The index
/// kept only each session's last reset, after the cut, and said the fork showed it.
#[test]
fn a_fork_cut_between_two_resets_of_its_parent_does_not_show_what_the_first_dropped() {
    let (_dir, root) = manual_root();
    let Served { rt, service, .. } = Served::new(HOST, &root);
    let g = create(&root, "g");
    turn(&g, "t1", "m1", "alpha words");
    g.close().unwrap();
    root.fork(&id("g"), ForkPoint::AfterTurn("t1".into()), Some(id("p")))
        .unwrap();
    let p = root.open_writer(&id("p")).unwrap();
    reset_transcript(&p, "r1");
    turn(&p, "t2", "m2", "beta words");
    p.flush().unwrap();
    root.fork(&id("p"), ForkPoint::BeforeTurn("t2".into()), Some(id("f")))
        .unwrap();
    reset_transcript(&p, "r2");
    p.close().unwrap();
    let f = root.open_reader(&id("f")).unwrap();
    assert!(
        f.transcript(f.durable_sequence().unwrap())
            .unwrap()
            .is_empty()
    );
    let page = rt
        .block_on(service.query().search("alpha", SearchOptions::default()))
        .unwrap();
    assert_eq!(page.hits.len(), 1, "{page:?}");
    assert_eq!(page.hits[0].session_ref.session_id.as_str(), "g");
    assert!(page.hits[0].shared_with.is_empty(), "{page:?}");
    let alone = rt
        .block_on(
            service
                .query()
                .search("alpha", SearchOptions::default().with_session(id("f"))),
        )
        .unwrap();
    assert!(alone.hits.is_empty(), "{alone:?}");
}

/// A fork of a fork that upserted an inherited message, after the grandparent's delete
/// copied the grandparent's range into both files: a search of the old text finds nothing
/// (no session shows it), one of the new text finds it in the fork and its fork. The
/// grandchild's own copy of the old version was found under it, and hid the new version
/// from its `shared_with`.
#[test]
fn a_version_an_inherited_range_supersedes_after_a_delete_is_not_found() {
    let (_dir, root) = manual_root();
    let Served { rt, service, .. } = Served::new(HOST, &root);
    let s = create(&root, "s");
    turn(&s, "t1", "m1", "alpha words");
    s.close().unwrap();
    let _ = rt
        .block_on(service.query().search("alpha", SearchOptions::default()))
        .unwrap();
    root.fork(&id("s"), ForkPoint::AfterTurn("t1".into()), Some(id("f1")))
        .unwrap();
    let f1 = root.open_writer(&id("f1")).unwrap();
    f1.append_events(
        "u",
        vec![event(
            "message/upsert",
            json!({"message": {"id": "m1", "role": "user", "content": "beta words"}}),
        )],
    )
    .unwrap();
    turn(&f1, "t2", "m2", "gamma words");
    f1.close().unwrap();
    root.fork(&id("f1"), ForkPoint::AfterTurn("t2".into()), Some(id("f2")))
        .unwrap();
    root.delete(&id("s"), &CancelToken::new()).unwrap();
    let f2 = root.open_reader(&id("f2")).unwrap();
    let shown: Vec<String> = f2
        .transcript(f2.durable_sequence().unwrap())
        .unwrap()
        .iter()
        .map(|m| message_text_of(m))
        .collect();
    assert_eq!(shown, ["beta words", "gamma words"]);
    let found = |q: &str, options: SearchOptions| -> Vec<(String, Vec<String>)> {
        let page = rt.block_on(service.query().search(q, options)).unwrap();
        page.hits
            .iter()
            .map(|h| {
                let shared = h.shared_with.iter().map(|r| r.session_id.to_string());
                (h.session_ref.session_id.to_string(), shared.collect())
            })
            .collect()
    };
    assert_eq!(found("alpha", SearchOptions::default()), vec![]);
    let f2_alone = SearchOptions::default().with_session(id("f2"));
    assert_eq!(found("alpha", f2_alone.clone()), vec![]);
    let beta = vec![("f1".to_owned(), vec!["f2".to_owned()])];
    assert_eq!(found("beta", SearchOptions::default()), beta);
    assert_eq!(found("beta", f2_alone).len(), 1);
}

/// A fork cut before a transcript reset its parent had already written when the fork was
/// made (the fork point an earlier turn): the fork shows the messages the reset dropped, and
/// a search finds them under the fork, alone or across the root, and the parent's later
/// message under the parent only. Documented as missed until session 32; the superseded
/// rows the index keeps (`until_seq`) had made it hold already.
#[test]
fn a_fork_cut_before_an_earlier_reset_of_its_parent_finds_what_the_reset_dropped() {
    let (_dir, root) = manual_root();
    let Served { rt, service, .. } = Served::new(HOST, &root);
    let p = create(&root, "p");
    turn(&p, "t1", "m1", "alpha words");
    turn(&p, "t2", "m2", "beta words");
    reset_transcript(&p, "r1");
    turn(&p, "t3", "m3", "gamma words");
    p.flush().unwrap();
    root.fork(&id("p"), ForkPoint::AfterTurn("t1".into()), Some(id("f")))
        .unwrap();
    p.close().unwrap();
    let f = root.open_reader(&id("f")).unwrap();
    let shown: Vec<String> = f
        .transcript(f.durable_sequence().unwrap())
        .unwrap()
        .iter()
        .map(|m| message_text_of(m))
        .collect();
    assert_eq!(shown, ["alpha words"]);
    let found = |q: &str, options: SearchOptions| -> Vec<(String, u64)> {
        let page = rt.block_on(service.query().search(q, options)).unwrap();
        let hits = page.hits.iter();
        hits.map(|h| (h.session_ref.session_id.to_string(), h.position))
            .collect()
    };
    let f_alone = SearchOptions::default().with_session(id("f"));
    let under_f = vec![("f".to_owned(), 1)];
    assert_eq!(found("alpha", SearchOptions::default()), under_f);
    assert_eq!(found("alpha", f_alone.clone()), under_f);
    assert_eq!(found("beta", SearchOptions::default()), vec![]);
    assert_eq!(found("beta", f_alone.clone()), vec![]);
    assert_eq!(
        found("gamma", SearchOptions::default()),
        vec![("p".to_owned(), 1)]
    );
    assert_eq!(found("gamma", f_alone), vec![]);
}

/// Appends a `history/replace` with no messages (the transcript reset) to `s` as
/// operation `op`.
fn reset_transcript(s: &Session, op: &str) {
    s.append_events(op, vec![event("history/replace", json!({"messages": []}))])
        .expect("reset");
}

/// Appends turn `t` of one user message `m` saying `text` to `s`.
fn turn(s: &Session, t: &str, m: &str, text: &str) {
    s.append(
        Batch::new(
            format!("op-{t}"),
            vec![
                Event::new("turn/start"),
                common::message(m, "user", text),
                turn_end("completed"),
            ],
        )
        .in_turn(t),
    )
    .expect("turn");
}

fn message_text_of(m: &session_store::Message) -> String {
    store_value(m)["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// After a delete copied a renamed grandparent's range into a fork of a renamed fork, a
/// search of the grandparent's title finds nothing (the fork of the fork shows its parent's
/// title, as `list` says); it was found under that fork.
#[test]
fn a_title_an_inherited_range_supersedes_after_a_delete_is_not_found() {
    let (_dir, root) = manual_root();
    let Served { rt, service, .. } = Served::new(HOST, &root);
    let s = create(&root, "s");
    turn(&s, "t1", "m1", "alpha words");
    s.close().unwrap();
    root.rename(&id("s"), "first title").unwrap();
    let s = root.open_writer(&id("s")).unwrap();
    turn(&s, "t0", "m0", "zero words");
    s.close().unwrap();
    let _ = rt
        .block_on(service.query().search("alpha", SearchOptions::default()))
        .unwrap();
    root.fork(&id("s"), ForkPoint::AfterTurn("t0".into()), Some(id("f1")))
        .unwrap();
    root.rename(&id("f1"), "second title").unwrap();
    let f1 = root.open_writer(&id("f1")).unwrap();
    turn(&f1, "t2", "m2", "gamma words");
    f1.close().unwrap();
    root.fork(&id("f1"), ForkPoint::AfterTurn("t2".into()), Some(id("f2")))
        .unwrap();
    root.delete(&id("s"), &CancelToken::new()).unwrap();
    assert_eq!(root.catalog_entry(&id("f2")).unwrap().title, "second title");
    let found = |q: &str| -> Vec<(String, u64, Vec<String>)> {
        let page = rt
            .block_on(service.query().search(q, SearchOptions::default()))
            .unwrap();
        page.hits
            .iter()
            .map(|h| {
                let shared = h.shared_with.iter().map(|r| r.session_id.to_string());
                (
                    h.session_ref.session_id.to_string(),
                    h.position,
                    shared.collect(),
                )
            })
            .collect()
    };
    assert_eq!(found("\"first title\""), vec![]);
    let second = vec![("f1".to_owned(), 0, vec!["f2".to_owned()])];
    assert_eq!(found("\"second title\""), second);
}
