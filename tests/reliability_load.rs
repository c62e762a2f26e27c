//! Reliability promise 7: load. 200 sessions appended at once by 8 tokio tasks through the
//! `Service` (each task owns 25 sessions and works through them round-robin, one realistic
//! turn at a time: user message, assistant message with a tool call, the tool's output,
//! closing message; one turn in 40 carries an output over 64 KiB, stored as a blob), with
//! timed write-behind drains and a flush every few turns, for `RELIABILITY_LOAD_SECS`
//! seconds (default 5; `soak_load`: 60).
//!
//! Checked: no append, flush, create or close fails; every flush covers what was accepted
//! before it; after close every session replays to exactly the accepted commits (count,
//! sequences, commit and operation ids, and a SHA-256 of each batch's content as sent),
//! folds to the accepted turns, and is listed by the catalog with those figures; the peak
//! resident set stays under [`rss_bound_kb`] (under 1 GiB for the default run); the process
//! gains no more threads than the library's shared pools (`WRITER_THREADS` writers and one
//! read-pool housekeeper), whatever the number of sessions.
//!
//! `RELIABILITY_LOAD_SESSIONS` and `RELIABILITY_LOAD_TASKS` change the shape.

mod common;
mod reliability_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::id;
use reliability_support::*;
use serde_json::json;
use session_store::{
    Batch, CreateOptions, Event, Root, Runtime, Service, SessionRef, WRITER_THREADS, replay_file,
};
use sha2::{Digest, Sha256};

/// The peak resident set allowed, KiB, and what it is made of. An open session keeps its
/// whole projection in memory (`docs/SCALING.md`), so the bound grows with the messages
/// accepted, and with nothing else the run does (not with payload bytes: tool outputs and
/// blobs leave memory once drained):
/// - 256 MiB for the process: test binary, tokio runtime, thread stacks, the library's
///   statics (a 5 s run of 200 sessions peaks at 150-270 MiB in all);
/// - 3 MiB per open session: SQLite's default page cache (2,000 KiB) on its writer
///   connection, its WAL index, statements, and a write tail of at most `FLUSH_EVERY`
///   turns (one of which may carry an output over 64 KiB);
/// - 4 bytes per byte of message payload: the projection keeps each message's JSON text
///   verbatim plus its id, role, `Arc` and the slots of `messages` and `model_messages`,
///   with the allocator's slack (about 3 in the runs done);
/// - the test's own ledger: an [`Accepted`] per commit, twice for `Vec` growth.
///
/// For the default 5 s run that is about 900 MiB.
fn rss_bound_kb(sessions: usize, message_bytes: u64, commits: u64) -> u64 {
    let ledger = commits * 2 * std::mem::size_of::<Accepted>() as u64;
    256 * 1024 + sessions as u64 * 3 * 1024 + (4 * message_bytes + ledger) / 1024
}

/// A session is flushed after every this many of its turns.
const FLUSH_EVERY: u64 = 4;

/// One turn in this many has a tool output over 64 KiB.
const BIG_EVERY: u64 = 40;

/// Name of the tokio runtime's threads (workers and blocking pool), told apart from the
/// library's own threads when counting.
const TOKIO_THREAD: &str = "load-tokio";

/// What the test keeps of one accepted commit: its first sequence and a SHA-256 over its
/// commit id, operation id and the content digest of the batch as sent.
struct Accepted {
    first_seq: u64,
    key: [u8; 32],
}

fn commit_key(commit_id: &str, operation_id: &str, content: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [commit_id, operation_id, content] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// One session of a task, with everything accepted for it.
struct Ledger {
    runtime: Runtime,
    accepted: Vec<Accepted>,
    turns: u64,
    last_seq: u64,
    payload_bytes: u64,
    /// Payload bytes of the `message/complete` events: what the projection keeps.
    message_bytes: u64,
    big_payloads: u64,
    flushes: u64,
}

/// `min` to `min + spread` words of plausible tool output or prose.
fn words(rng: &mut fastrand::Rng, min: usize, spread: usize) -> String {
    let n = min + rng.usize(..spread);
    const WORDS: &[&str] = &[
        "the",
        "file",
        "src/lib.rs",
        "compiles",
        "error[E0308]:",
        "mismatched",
        "types",
        "ok",
        "test",
        "passed",
        "failed",
        "warning:",
        "unused",
        "variable",
        "->",
        "fn",
        "let",
        "=",
        "{",
        "}",
        "42",
        "0x7ffd",
        "/tmp/build",
        "cargo",
        "running",
        "1 test",
        "in",
        "0.3s",
    ];
    let mut s = String::with_capacity(n * 7);
    for i in 0..n {
        if i > 0 {
            s.push(if rng.u8(..12) == 0 { '\n' } else { ' ' });
        }
        s.push_str(WORDS[rng.usize(..WORDS.len())]);
    }
    s
}

fn event(kind: &str, payload: serde_json::Value) -> Event {
    Event::new(kind).with_payload(&payload).expect("payload")
}

/// The four batches of one turn of session `s` (turn number `turn`).
fn turn_batches(rng: &mut fastrand::Rng, s: &str, turn: u64, big: bool) -> Vec<Batch> {
    let t = format!("{s}-t{turn}");
    let message = |n: u32, role: &str, text: String| {
        event(
            "message/complete",
            json!({"message": {"id": format!("{t}-m{n}"), "role": role, "content": text}}),
        )
    };
    let call = format!("{t}-c");
    let output = if big {
        words(rng, 12_000, 20_000) // 80–220 KiB
    } else {
        words(rng, 20, 300)
    };
    let user = words(rng, 5, 40);
    let plan = words(rng, 10, 60);
    let answer = words(rng, 10, 120);
    vec![
        Batch::new(
            format!("{t}-1"),
            vec![Event::new("turn/start"), message(1, "user", user)],
        ),
        Batch::new(
            format!("{t}-2"),
            vec![
                message(2, "assistant", plan),
                event(
                    "tool/call",
                    json!({"id": call, "name": "bash", "args": {"cmd": "cargo test"}}),
                ),
                event("tool/start", json!({"id": call, "name": "bash"})),
            ],
        ),
        Batch::new(
            format!("{t}-3"),
            vec![
                event(
                    "tool/result",
                    json!({"id": call, "name": "bash", "output": output}),
                ),
                event("diagnostic", json!({"ms": rng.u32(..5000)})).optional(),
            ],
        ),
        Batch::new(
            format!("{t}-4"),
            vec![
                message(3, "assistant", answer),
                event("turn/end", json!({"status": "completed"})),
            ],
        ),
    ]
    .into_iter()
    .map(|b| b.in_turn(t.clone()))
    .collect()
}

/// One task: creates its sessions, appends turns to them round-robin until `deadline`,
/// flushing each every `FLUSH_EVERY` turns, then closes them all.
async fn run_task(
    service: Service,
    task: usize,
    sessions: usize,
    deadline: Instant,
    seed: u64,
) -> Vec<(SessionRef, Ledger)> {
    let mut rng = fastrand::Rng::with_seed(seed ^ (task as u64).wrapping_mul(0x9e37_79b9));
    let mut ledgers = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let sid = id(&format!("load-{task:02}-{i:03}"));
        let runtime = service
            .create(CreateOptions::with_id(sid.clone()))
            .await
            .unwrap_or_else(|e| panic!("create {sid}: {e}"));
        let sref = runtime.session_ref().clone();
        ledgers.push((
            sref,
            Ledger {
                runtime,
                accepted: Vec::new(),
                turns: 0,
                last_seq: 0,
                payload_bytes: 0,
                message_bytes: 0,
                big_payloads: 0,
                flushes: 0,
            },
        ));
    }
    'load: loop {
        for (sref, ledger) in &mut ledgers {
            if Instant::now() >= deadline {
                break 'load;
            }
            let name = sref.session_id.as_str().to_owned();
            let big = rng.u64(..BIG_EVERY) == 0;
            let execution = ledger
                .runtime
                .bind_execution("load turn")
                .unwrap_or_else(|e| panic!("{name}: bind: {e}"));
            for batch in turn_batches(&mut rng, &name, ledger.turns, big) {
                let content = content_digest(batch.turn_id.as_deref(), &batch.events);
                let operation_id = batch.operation_id.clone();
                let bytes: u64 = batch.events.iter().map(|e| e.payload_len() as u64).sum();
                let message_bytes: u64 = batch
                    .events
                    .iter()
                    .filter(|e| e.kind == "message/complete")
                    .map(|e| e.payload_len() as u64)
                    .sum();
                let commit = execution
                    .append(batch)
                    .unwrap_or_else(|e| panic!("{name}: append {operation_id}: {e}"));
                assert_eq!(
                    commit.first_seq,
                    ledger.last_seq + 1,
                    "{name}: {operation_id} did not take the next sequence"
                );
                ledger.last_seq = commit.last_seq();
                ledger.accepted.push(Accepted {
                    first_seq: commit.first_seq,
                    key: commit_key(&commit.commit_id, &operation_id, &content),
                });
                ledger.payload_bytes += bytes;
                ledger.message_bytes += message_bytes;
            }
            execution.finish();
            ledger.turns += 1;
            ledger.big_payloads += u64::from(big);
            if ledger.turns % FLUSH_EVERY == 0 {
                let durable = service
                    .flush(sref)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: flush: {e}"));
                assert!(
                    durable >= ledger.last_seq,
                    "{name}: flush returned {durable}, accepted up to {}",
                    ledger.last_seq
                );
                ledger.flushes += 1;
            }
            tokio::task::yield_now().await;
        }
    }
    for (sref, _) in &ledgers {
        service
            .close(sref)
            .await
            .unwrap_or_else(|e| panic!("{}: close: {e}", sref.session_id));
    }
    ledgers
}

/// Threads of this process: all of them, and those not named [`TOKIO_THREAD`].
fn threads() -> (usize, usize) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0, 0);
    };
    let names: Vec<String> = tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .collect();
    let own = names
        .iter()
        .filter(|n| !n.trim_end().starts_with(TOKIO_THREAD))
        .count();
    (names.len(), own)
}

/// `Threads:` of /proc/self/status.
fn status_threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Samples the thread counts every 20 ms until stopped; keeps the maxima.
struct ThreadSampler {
    stop: Arc<AtomicBool>,
    max_total: Arc<AtomicUsize>,
    max_own: Arc<AtomicUsize>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl ThreadSampler {
    fn start() -> ThreadSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max_total = Arc::new(AtomicUsize::new(0));
        let max_own = Arc::new(AtomicUsize::new(0));
        let (s, t, o) = (stop.clone(), max_total.clone(), max_own.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let (_, own) = threads();
                t.fetch_max(status_threads(), Ordering::Relaxed);
                o.fetch_max(own, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        ThreadSampler {
            stop,
            max_total,
            max_own,
            handle: Some(handle),
        }
    }

    /// Stops sampling; returns (max threads, max threads not of the tokio runtime).
    fn finish(mut self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.join().expect("sampler");
        }
        (
            self.max_total.load(Ordering::Relaxed),
            self.max_own.load(Ordering::Relaxed),
        )
    }
}

/// Threads named like the library's writer pool (`session-store-writer-N`; the kernel
/// keeps 15 bytes of a name).
fn writer_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|t| t.ok())
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .filter(|n| n.starts_with("session-store-w"))
                .count()
        })
        .unwrap_or(0)
}

fn run_load(test: &str, default_secs: usize) {
    let secs = env_count("RELIABILITY_LOAD_SECS", default_secs);
    let sessions = env_count("RELIABILITY_LOAD_SESSIONS", 200);
    let tasks = env_count("RELIABILITY_LOAD_TASKS", 8).max(1);
    let per_task = sessions.div_ceil(tasks);
    let seed = seed(test);
    let dir = tempfile::tempdir().unwrap();
    let root = Root::open(dir.path().join("sessions")).unwrap();
    let service = Service::new("load", root.clone()).unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(tasks)
        .max_blocking_threads(2 * tasks)
        .thread_name(TOKIO_THREAD)
        .enable_all()
        .build()
        .unwrap();
    // A new thread carries its creator's name until it names itself: count the threads of
    // this process only once every worker has its own name.
    let named = Instant::now();
    while named.elapsed() < Duration::from_secs(5) {
        let (all, own) = threads();
        if all - own >= tasks {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let sampler = ThreadSampler::start();
    let (_, own_before) = threads();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs as u64);
    let mut ledgers = rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let n = per_task.min(sessions.saturating_sub(task * per_task));
                tokio::spawn(run_task(service.clone(), task, n, deadline, seed))
            })
            .collect();
        let mut ledgers = Vec::new();
        for h in handles {
            ledgers.extend(h.await.expect("a load task panicked"));
        }
        ledgers
    });
    let load_secs = started.elapsed().as_secs_f64();
    let writers = writer_threads();
    let (max_threads, max_own) = sampler.finish();

    assert_eq!(ledgers.len(), sessions);
    ledgers.sort_by(|a, b| a.0.session_id.as_str().cmp(b.0.session_id.as_str()));
    let sum = |f: fn(&Ledger) -> u64| ledgers.iter().map(|(_, l)| f(l)).sum::<u64>();
    let commits = sum(|l| l.accepted.len() as u64);
    let events = sum(|l| l.last_seq);
    let turns = sum(|l| l.turns);
    let big_payloads = sum(|l| l.big_payloads);
    let message_bytes = sum(|l| l.message_bytes);

    // The catalog lists every session cold, with the accepted figures.
    let listed = rt.block_on(async {
        let mut listed = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = service.query().list(cursor.as_deref(), 100).await.unwrap();
            listed.extend(page.sessions);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break listed,
            }
        }
    });
    assert_eq!(listed.len(), sessions, "sessions listed");
    for (summary, (sref, ledger)) in listed.iter().zip(&ledgers) {
        assert_eq!(summary.session_ref.session_id, sref.session_id);
        assert!(!summary.live, "{}: still live after close", sref.session_id);
        assert_eq!(
            (
                summary.turns,
                summary.event_sequence,
                summary.durable_sequence
            ),
            (ledger.turns, ledger.last_seq, ledger.last_seq),
            "{}: listed with other figures",
            sref.session_id
        );
    }
    drop(rt);

    // Every session replays to exactly what was accepted.
    let verify_started = Instant::now();
    let mut replayed_commits = 0u64;
    for (sref, ledger) in &ledgers {
        let name = &sref.session_id;
        let r =
            replay_file(root.session_dir(name)).unwrap_or_else(|e| panic!("{name}: replay: {e}"));
        assert_eq!(
            r.commits.len(),
            ledger.accepted.len(),
            "{name}: commits on disk"
        );
        for (c, a) in r.commits.iter().zip(&ledger.accepted) {
            assert_eq!(c.first_seq, a.first_seq, "{name}: sequence of a commit");
            assert!(
                commit_key(&c.commit_id, &c.operation_id, &commit_digest(c)) == a.key,
                "{name}: commit {} ({}) differs from what was appended",
                c.first_seq,
                c.operation_id
            );
        }
        assert_eq!(
            r.commits.last().map_or(0, |c| c.last_seq()),
            ledger.last_seq
        );
        assert_eq!(r.projection.ended_turns, ledger.turns, "{name}: turns");
        assert_eq!(
            r.projection.transcript_len,
            3 * ledger.turns,
            "{name}: messages"
        );
        replayed_commits += r.commits.len() as u64;
    }
    assert_eq!(replayed_commits, commits);
    let peak_kb = peak_rss_kb();
    let bound_kb = rss_bound_kb(sessions, message_bytes, commits);

    eprintln!(
        "load: {sessions} sessions, {tasks} tasks, {load_secs:.1} s: {commits} commits, \
         {events} events ({turns} turns, {big_payloads} payloads over 64 KiB, {} flushes), \
         {} payload bytes ({message_bytes} in messages), {:.0} events/s; peak RSS {} MiB \
         (bound {} MiB); max threads {max_threads} ({max_own} outside tokio, {own_before} \
         before, {writers} writers); verified in {:.1?}",
        sum(|l| l.flushes),
        sum(|l| l.payload_bytes),
        events as f64 / load_secs,
        peak_kb / 1024,
        bound_kb / 1024,
        verify_started.elapsed()
    );
    assert!(
        turns >= sessions as u64,
        "every session got at least one turn"
    );
    assert!(big_payloads > 0, "some payloads went to blobs");
    assert!(
        peak_kb < bound_kb,
        "peak RSS {} MiB over the bound of {} MiB",
        peak_kb / 1024,
        bound_kb / 1024
    );
    assert_eq!(writers, WRITER_THREADS, "the writer pool's threads");
    // The library's own threads: the writer pool and the read-pool housekeeper, shared by
    // every session; one more for slack (none is expected).
    assert!(
        max_own <= own_before + WRITER_THREADS + 2,
        "{max_own} threads outside the tokio runtime, {own_before} before the load: \
         the library grew threads with the sessions"
    );
    // In all: those and the runtime's workers and blocking pool (`2 * tasks`), the
    // host's choice; nothing grows with the 200 sessions.
    assert!(
        max_threads <= max_own + 3 * tasks,
        "{max_threads} threads in all"
    );
}

#[test]
fn load_200_sessions_by_8_tasks() {
    run_load("load_200_sessions_by_8_tasks", 5);
}

/// The long variant: 60 s (`RELIABILITY_LOAD_SECS` still overrides it).
#[test]
#[ignore = "soak: 60 s of load, run by scripts/soak.sh"]
fn soak_load() {
    run_load("soak_load", 60);
}
