//! Reliability promise 1: a writer SIGKILLed at any moment while appending loses nothing it
//! reported durable, leaves no half-visible commit, and its interrupted turn is closed when
//! the service reopens the session.
//!
//! The writer is a real child process (this binary re-run as `crash_appender_role`). Before
//! each append it prints `intent <op> <digest>` (the digest of the batch's turn id, kinds,
//! flags and payload text), after it `acc <op> <first> <last>`, and after each flush
//! `durable <seq>`. The parent kills it at a random moment and checks the file against
//! those lines. `RELIABILITY_KILLS` raises the number of kills (default 50).

mod common;
mod reliability_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use reliability_support::*;
use serde_json::json;
use session_store::{
    Batch, CreateOptions, Event, Root, Service, SessionId, StoreOptions, replay_file,
};

/// Kills per session file before the test moves on to a fresh session in the same root
/// (bounds the size of the file that every round re-verifies).
const KILLS_PER_SESSION: usize = 10;

/// A payload text longer than [`session_store::format::INLINE_PAYLOAD_LIMIT`], so it goes to a blob:
/// compressible or random, 65..200 KiB.
fn blob_text(rng: &mut fastrand::Rng) -> String {
    let len = rng.usize(65 * 1024 + 1..200 * 1024);
    if rng.bool() {
        let word = format!("{:016x} ", rng.u64(..));
        word.repeat(len / word.len() + 1)[..len].to_owned()
    } else {
        (0..len)
            .map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)]))
            .collect()
    }
}

fn msg(id: &str, role: &str, content: &str) -> Event {
    Event::new("message/complete")
        .with_payload(&json!({"message": {"id": id, "role": role, "content": content}}))
        .expect("payload")
}

fn ev(kind: &str, payload: serde_json::Value) -> Event {
    Event::new(kind).with_payload(&payload).expect("payload")
}

/// What the child knows of the session's state, to build valid batches.
struct Plan {
    turn: Option<String>,
    tools: Vec<String>,
    interactions: Vec<String>,
    last_blob: Option<String>,
    counter: u64,
}

impl Plan {
    fn next_id(&mut self, generation: u64, what: &str) -> String {
        self.counter += 1;
        format!("{what}-{generation}-{}", self.counter)
    }

    /// The next batch: a mix of turns (open, in progress, closed in one or several
    /// commits), tools, interactions, titles, optional events and >64 KiB payloads.
    fn next_batch(&mut self, rng: &mut fastrand::Rng, generation: u64) -> Batch {
        let op = self.next_id(generation, "op");
        let text = |rng: &mut fastrand::Rng| "word ".repeat(rng.usize(1..40));
        let Some(turn) = self.turn.clone() else {
            return match rng.u8(..10) {
                0..=4 => {
                    let turn = self.next_id(generation, "turn");
                    self.turn = Some(turn.clone());
                    let m = self.next_id(generation, "m");
                    Batch::new(
                        op,
                        vec![Event::new("turn/start"), msg(&m, "user", &text(rng))],
                    )
                    .in_turn(turn)
                }
                5 => {
                    // A whole turn in one commit.
                    let turn = self.next_id(generation, "turn");
                    let (m1, m2) = (self.next_id(generation, "m"), self.next_id(generation, "m"));
                    Batch::new(
                        op,
                        vec![
                            Event::new("turn/start"),
                            msg(&m1, "user", &text(rng)),
                            msg(&m2, "assistant", &text(rng)),
                            ev("turn/end", json!({"status": "completed"})),
                        ],
                    )
                    .in_turn(turn)
                }
                6 => Batch::new(
                    op,
                    vec![ev("session/title", json!({"title": text(rng).trim()}))],
                ),
                7 => {
                    // An optional event with a large payload; sometimes the same text
                    // again (a deduplicated blob).
                    let body = match (&self.last_blob, rng.bool()) {
                        (Some(b), true) => b.clone(),
                        _ => blob_text(rng),
                    };
                    self.last_blob = Some(body.clone());
                    Batch::new(
                        op,
                        vec![
                            Event::new("host/attachment")
                                .optional()
                                .with_payload(&json!({"body": body}))
                                .expect("payload"),
                        ],
                    )
                }
                _ => {
                    let m = self.next_id(generation, "m");
                    Batch::new(op, vec![msg(&m, "user", &text(rng))])
                }
            };
        };
        let events = match rng.u8(..20) {
            0..=5 => {
                let m = self.next_id(generation, "m");
                let content = if rng.u8(..4) == 0 {
                    blob_text(rng)
                } else {
                    text(rng)
                };
                vec![msg(&m, "assistant", &content)]
            }
            6..=8 => {
                let t = self.next_id(generation, "tool");
                self.tools.push(t.clone());
                vec![
                    ev(
                        "tool/call",
                        json!({"id": t, "name": "bash", "args": {"cmd": "ls"}}),
                    ),
                    ev("tool/start", json!({"id": t, "name": "bash"})),
                ]
            }
            9..=11 if !self.tools.is_empty() => {
                let t = self.tools.remove(rng.usize(..self.tools.len()));
                let output = if rng.u8(..3) == 0 {
                    blob_text(rng)
                } else {
                    text(rng)
                };
                vec![ev(
                    "tool/result",
                    json!({"id": t, "name": "bash", "output": output}),
                )]
            }
            12 => {
                let i = self.next_id(generation, "ask");
                self.interactions.push(i.clone());
                vec![ev(
                    "interaction/created",
                    json!({"id": i, "state": "pending"}),
                )]
            }
            13 if !self.interactions.is_empty() => {
                let i = self.interactions.remove(0);
                vec![ev(
                    "interaction/resolved",
                    json!({"id": i, "state": "answered"}),
                )]
            }
            14..=16 => {
                // Close the turn: settle its tools and interactions in the same commit.
                let mut events: Vec<Event> = self
                    .tools
                    .drain(..)
                    .map(|t| ev("tool/result", json!({"id": t, "name": "bash"})))
                    .collect();
                events.extend(self.interactions.drain(..).map(|i| {
                    ev(
                        "interaction/resolved",
                        json!({"id": i, "state": "cancelled"}),
                    )
                }));
                events.push(ev("turn/end", json!({"status": "completed"})));
                self.turn = None;
                events
            }
            _ => vec![ev(
                "step/start",
                json!({"id": self.next_id(generation, "step")}),
            )],
        };
        Batch::new(op, events).in_turn(turn)
    }
}

/// Child role: opens `SS_ID` under `SS_ROOT` for writing and appends and flushes forever
/// with choices from `SS_SEED`, reporting every intent, acceptance and durable sequence.
#[test]
#[ignore = "child process role, run by crash_during_appends_*"]
fn crash_appender_role() {
    let Ok(root_path) = std::env::var("SS_ROOT") else {
        return; // run by hand without a parent: nothing to do
    };
    let name = id(&std::env::var("SS_ID").unwrap());
    let mut rng = fastrand::Rng::with_seed(std::env::var("SS_SEED").unwrap().parse().unwrap());
    // Sometimes timed drains race the explicit flushes, sometimes only flushes write.
    let write_behind = match rng.u8(..3) {
        0 => Duration::from_secs(3600),
        _ => Duration::from_millis(rng.u64(1..30)),
    };
    let options = StoreOptions::default().with_write_behind(write_behind);
    let root = Root::with_options(root_path, options).unwrap();
    let s = root.open_writer(&name).unwrap();
    let generation = s.owner().generation;
    let mut plan = s.with_projection(|p| Plan {
        turn: p.turn_id.clone(),
        tools: p.active_tools.keys().cloned().collect(),
        interactions: p.interactions.keys().cloned().collect(),
        last_blob: None,
        counter: 0,
    });
    println!("ready {} {generation}", std::process::id());
    loop {
        for _ in 0..rng.usize(1..=4) {
            let batch = plan.next_batch(&mut rng, generation);
            let digest = content_digest(batch.turn_id.as_deref(), &batch.events);
            println!("intent {} {digest}", batch.operation_id);
            let c = s.append(batch).unwrap();
            println!("acc {} {} {}", c.operation_id, c.first_seq, c.last_seq());
        }
        println!("durable {}", s.flush().unwrap());
    }
}

/// What one child reported before it died.
#[derive(Default)]
struct Report {
    /// Operation ids in append order, with their content digests.
    intents: Vec<(String, String)>,
    /// Accepted commits: op → (first, last).
    accepted: HashMap<String, (u64, u64)>,
    /// The highest sequence a flush returned.
    durable: u64,
}

fn parse_report(lines: &[String]) -> Report {
    let mut r = Report::default();
    for line in lines {
        // libtest may prefix the first line with `test name ... `.
        let Some(at) = ["intent ", "acc ", "durable "]
            .iter()
            .filter_map(|m| line.find(m))
            .min()
        else {
            continue;
        };
        let mut words = line[at..].split_whitespace();
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("intent"), Some(op), Some(digest), None) => {
                r.intents.push((op.to_owned(), digest.to_owned()));
            }
            (Some("acc"), Some(op), Some(first), Some(last)) => {
                r.accepted.insert(
                    op.to_owned(),
                    (first.parse().unwrap(), last.parse().unwrap()),
                );
            }
            (Some("durable"), Some(seq), None, None) => {
                r.durable = r.durable.max(seq.parse().unwrap());
            }
            // A line cut by the kill (the pipe holds whole writes, but be lenient).
            _ => {}
        }
    }
    r
}

/// Structural checks straight in SQL, beyond what `replay` checks: every event belongs to
/// a whole commit, no blob is orphaned, and the turn index matches the fold.
fn check_tables(root: &Root, name: &SessionId, replayed: &session_store::ReplayReport) {
    let file = root.session_dir(name).join("session.sqlite");
    let conn =
        rusqlite::Connection::open_with_flags(&file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let (events, covered): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM events),
                    (SELECT coalesce(sum(last_seq - first_seq + 1), 0) FROM commits)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(events, covered, "events rows vs commit ranges");
    let stray: i64 = conn
        .query_row(
            "SELECT count(*) FROM events e WHERE NOT EXISTS
                 (SELECT 1 FROM commits c WHERE e.seq BETWEEN c.first_seq AND c.last_seq)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stray, 0, "events outside their commit's range");
    let orphans: i64 = conn
        .query_row(
            "SELECT count(*) FROM blobs WHERE digest NOT IN
                 (SELECT payload_ref FROM events WHERE payload_ref IS NOT NULL)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphans, 0, "blobs of no commit (half a commit)");
    let mut stmt = conn
        .prepare("SELECT turn_id, start_seq, end_seq, status FROM turns ORDER BY start_seq")
        .unwrap();
    let index: Vec<(String, u64, u64, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let folded: Vec<(String, u64, u64, String)> = replayed
        .turns
        .iter()
        .map(|t| {
            (
                t.turn_id.clone(),
                t.start_sequence,
                t.end_sequence,
                t.status.clone(),
            )
        })
        .collect();
    assert_eq!(index, folded, "turn index vs the fold of the log");
}

#[derive(Default)]
struct Figures {
    kills: usize,
    killed_before_ready: usize,
    commits_verified: u64,
    bytes_verified: u64,
    bytes_rechecked: u64,
    turns_recovered: usize,
    max_durable: u64,
}

fn run_crash_loop(kills: usize) -> Figures {
    let seed = seed("crash_during_appends");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (_dir, root) = temp_root();
    let root_path = root.path().to_str().unwrap().to_owned();
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut figures = Figures::default();
    // Per session: its full history as last verified.
    let mut histories: Vec<(SessionId, Vec<String>)> = Vec::new();
    let started = Instant::now();
    for kill in 0..kills {
        if kill % KILLS_PER_SESSION == 0 {
            let name = id(&format!("crash-{}", kill / KILLS_PER_SESSION));
            root.create(CreateOptions::with_id(name.clone()))
                .unwrap()
                .close()
                .unwrap();
            histories.push((name, Vec::new()));
        }
        let (name, previous) = histories.last_mut().unwrap();
        let child_seed = rng.u64(..);
        let mut child = ChildLines::spawn(
            "crash_appender_role",
            &[
                ("SS_ROOT", root_path.clone()),
                ("SS_ID", name.to_string()),
                ("SS_SEED", child_seed.to_string()),
            ],
        );
        // One kill in five lands anywhere from process start (in open, lease, fold);
        // the others while it appends.
        if rng.u8(..5) == 0 {
            std::thread::sleep(Duration::from_millis(rng.u64(0..40)));
        } else {
            child.expect("ready ");
            std::thread::sleep(Duration::from_millis(rng.u64(0..150)));
        }
        let was_running = child.kill();
        let lines = child.drain().to_vec();
        assert!(
            was_running,
            "kill {kill} (seed {seed}): the child exited by itself; its output: {:?}",
            &lines[lines.len().saturating_sub(10)..]
        );
        if !lines.iter().any(|l| l.contains("ready ")) {
            figures.killed_before_ready += 1;
        }
        let report = parse_report(&lines);
        let ctx = format!("kill {kill} of {name} (seed {seed}, child seed {child_seed})");

        // 1. The file is sound: integrity_check, foreign keys, contiguous sequences,
        //    operation hashes, blob digests and a full fold (all inside `replay`).
        let replayed = replay_file(root.session_dir(name)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        check_tables(&root, name, &replayed);
        let now = history_lines(&replayed.commits);
        // What an opener folds (from the newest projection checkpoint on) is what the
        // whole log folds to.
        let opened = root.open_reader(name).unwrap().projection().unwrap();
        assert_eq!(
            serde_json::to_string(&opened).unwrap(),
            serde_json::to_string(&replayed.projection).unwrap(),
            "{ctx}: the checkpointed projection differs from the full fold"
        );

        // 2. Nothing verified before changed or went missing.
        assert!(
            now.len() >= previous.len() && now[..previous.len()] == previous[..],
            "{ctx}: earlier history changed"
        );
        figures.bytes_rechecked += replayed.commits[..previous.len()]
            .iter()
            .map(payload_bytes)
            .sum::<u64>();

        // 3. Every commit this child got into the file is one it meant, byte for byte, in
        //    the order it appended them, with no hole.
        let new = &replayed.commits[previous.len()..];
        assert!(
            new.len() <= report.intents.len(),
            "{ctx}: {} new commits but only {} intents",
            new.len(),
            report.intents.len()
        );
        for (c, (op, digest)) in new.iter().zip(&report.intents) {
            assert_eq!(&c.operation_id, op, "{ctx}: commit order");
            assert_eq!(&commit_digest(c), digest, "{ctx}: content of {op}");
            if let Some(&(first, last)) = report.accepted.get(op) {
                assert_eq!((c.first_seq, c.last_seq()), (first, last), "{ctx}: {op}");
            }
            figures.commits_verified += 1;
            figures.bytes_verified += payload_bytes(c);
        }

        // 4. Every sequence a flush reported durable is there, with every commit accepted
        //    up to it.
        let on_disk = replayed.commits.last().map_or(0, |c| c.last_seq());
        assert!(
            on_disk >= report.durable,
            "{ctx}: reported durable {} but the file ends at {on_disk}",
            report.durable
        );
        for (op, &(_, last)) in &report.accepted {
            if last <= report.durable {
                assert!(
                    new.iter().any(|c| &c.operation_id == op),
                    "{ctx}: durable commit {op} is missing"
                );
            }
        }
        figures.max_durable = figures.max_durable.max(on_disk);

        // 5. The service's restart recovery closes an interrupted turn.
        let open_turn = replayed.projection.turn_id.clone();
        let pending =
            replayed.projection.active_tools.len() + replayed.projection.interactions.len();
        let service = Service::new("local", root.clone()).unwrap();
        let sref = service.session_ref(name.clone());
        tokio.block_on(async {
            let binding = service
                .open(&sref)
                .await
                .unwrap_or_else(|e| panic!("{ctx}: service open: {e}"));
            let snap = binding.runtime().snapshot().session;
            assert_eq!(snap.projection.turn_id, None, "{ctx}: turn left open");
            assert!(
                snap.projection.active_tools.is_empty(),
                "{ctx}: tools left active"
            );
            assert!(
                snap.projection.interactions.is_empty(),
                "{ctx}: interactions left pending"
            );
            if open_turn.is_some() {
                assert_eq!(snap.projection.turn_status, "interrupted", "{ctx}");
                assert_eq!(
                    snap.durable_sequence,
                    on_disk + pending as u64 + 1,
                    "{ctx}: the recovery batch is durable"
                );
                figures.turns_recovered += 1;
            } else {
                assert_eq!(snap.durable_sequence, on_disk, "{ctx}: nothing to recover");
            }
            binding.release().await.unwrap();
            service.close(&sref).await.unwrap();
        });
        let recovered =
            replay_file(root.session_dir(name)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let after = history_lines(&recovered.commits);
        assert_eq!(
            after[..now.len()],
            now[..],
            "{ctx}: recovery changed history"
        );
        if let Some(turn) = &open_turn {
            let last = recovered.commits.last().unwrap();
            assert!(
                last.operation_id.starts_with("restart-recovery:")
                    && last.turn_id.as_deref() == Some(turn.as_str()),
                "{ctx}: recovery commit {last:?}"
            );
        }
        *previous = after;
        figures.kills += 1;
    }
    // Every session of the root is still exactly as last verified.
    for (name, history) in &histories {
        let replayed = replay_file(root.session_dir(name)).unwrap();
        assert_eq!(&history_lines(&replayed.commits), history, "{name} changed");
    }
    eprintln!(
        "crash_during_appends: {} kills ({} before the writer was ready) over {} sessions in {:.1?}; \
         {} commits / {} payload bytes checked against the writer's intents, {} bytes re-checked, \
         {} interrupted turns recovered, longest log {} events",
        figures.kills,
        figures.killed_before_ready,
        histories.len(),
        started.elapsed(),
        figures.commits_verified,
        figures.bytes_verified,
        figures.bytes_rechecked,
        figures.turns_recovered,
        figures.max_durable
    );
    figures
}

#[test]
fn crash_during_appends_loses_nothing_durable() {
    let kills = env_count("RELIABILITY_KILLS", 50);
    let figures = run_crash_loop(kills);
    assert_eq!(figures.kills, kills);
    assert!(
        figures.commits_verified > 0 && figures.turns_recovered > 0,
        "the loop exercised nothing"
    );
}

/// The long variant for `scripts/soak.sh`: 1000 kills unless `RELIABILITY_KILLS` says.
#[test]
#[ignore = "soak: long crash loop, run by scripts/soak.sh"]
fn soak_crash_during_appends() {
    run_crash_loop(env_count("RELIABILITY_KILLS", 1000));
}
