//! Committed on-disk fixtures of older formats, so every later format change is tested
//! against real files that earlier code wrote.
//!
//! Each fixture set (a [`FixtureSet`]: its folder, the schema version that wrote it and its
//! sessions) was written by that schema version of this crate through the public API, by
//! an ignored generator pinned to it ([`write_schema2_fixtures`], [`write_schema3_fixtures`]:
//! `cargo test --release --test format_fixtures -- --ignored write_schema3_fixtures`, run
//! on a checkout of that schema's code):
//!
//! - `tests/fixtures/schema2/`: schema 2 (migrations 0001 and 0002).
//! - `tests/fixtures/schema3/`: schema 3 (up to 0003: compact commit rows, checkpoints
//!   holding the transcript index `message_ids`), written at 68b7ad8.
//! - `tests/fixtures/schema4/`: schema 4 (up to 0004: the operation filter in
//!   checkpoints; kinds as text, message payloads inside `{"message":…}`), written at
//!   c34e928 with the schema-3 set's sessions.
//! - `tests/fixtures/schema5/`: schema 5 (up to 0005: kinds as codes, message payloads
//!   bare; the last with an index on the operation key), written at 70a40cf with the
//!   schema-3 set's sessions.
//! - `tests/fixtures/schema6/`: schema 6 (up to 0006: operation keys in sorted chunks; the
//!   last without a check on each event row), written at d6d4e79 with the schema-3 set's
//!   sessions.
//! - `tests/fixtures/schema7/`: schema 7 (up to 0007: a check on each event row; the last
//!   with the transcript index before the operation filter in the checkpoint), written at
//!   84648fb with the schema-3 set's sessions.
//! - `tests/fixtures/schema8/`: schema 8 (up to 0008: the checkpoint's transcript index
//!   last; the last whose `event_kinds` view is a `VALUES` list), written at 890da9b with
//!   the schema-3 set's sessions.
//!
//! Both hold a root (`root/`) with a session whose tool outputs are blobs over 64 KiB and
//! appear both in `tool/result` and in the tool message (`blobs`), a fork chain with titles
//! and several turns (`chain-a`, its fork `chain-b`, the fork of the fork `chain-c`), a
//! rewind of `chain-a` (`rewound`), an export of `chain-c` (`export.sqlite`), and per
//! session an `expected/<id>.json` recording what a reader must see: the durable sequence,
//! every commit's operation id with a digest of each event's kind and payload text, the
//! title, the turn ids and the history and model message ids. The schema-3 set adds `long`
//! (1,040 one-event commits, five chat turns and a title: 1,061 events), whose close wrote
//! a projection checkpoint with a transcript index (its through sequence is in
//! `manifest.json`), and `long-fork`, forked after its end so that it starts from that
//! checkpoint. Its expected files have a commit per line (the schema-2 ones are pretty).
//!
//! [`check_fixture_set`] copies a set's root and checks, for each session and the export,
//! that its `user_version` and checkpoint rows are as written, it reads as recorded, `replay` and `verify` pass, a writer appends and a reopen sees
//! it, a fork of it reads, deleting the chain's parent keeps every descendant whole, and the
//! export imports; [`schema2_fixtures_read_append_fork_delete_and_import`] and
//! [`schema3_fixtures_read_append_fork_delete_and_import`] run it on each set.
//! [`schema3_long_session_keeps_its_checkpoint_and_operations_through_the_upgrade`] checks
//! the long session across the upgrade: its schema-3 checkpoint is kept and used (with no
//! operation filter until a new checkpoint is written), retries of its old operations return
//! the original commits, a reused operation id with other content is a conflict, and after a
//! new checkpoint (which stores the filter) a reopen still answers retries; it exports and
//! imports before and after.
//!
//! **Every later format must keep these passing unchanged**: a writer open upgrades the
//! files, and readers, `verify`, `export` and `import` must accept them before and after.
//! Never regenerate a set with a newer schema: they stand for files already on users'
//! disks. A new schema version that changes what is on disk gets a set of its own.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use serde_json::{Value, json};
use session_store::format::SCHEMA_VERSION;
use session_store::{
    Batch, CancelToken, Commit, Event, ForkPoint, ImportOptions, Message, Projection, ReplayReport,
    Root, SessionId, TurnBoundary, replay_file, verify_file,
};
use sha2::{Digest, Sha256};

/// A committed fixture set: what one schema version of this crate wrote.
struct FixtureSet {
    /// Its folder under `tests/fixtures/`.
    dir: &'static str,
    /// The schema version that wrote it (`user_version` of its files).
    schema: i64,
    /// Its sessions, each with an `expected/<id>.json`.
    sessions: &'static [&'static str],
    /// Writes those sessions into a fresh root (the generator's part that differs).
    write: fn(&Root),
}

impl FixtureSet {
    fn path(&self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(self.dir)
    }

    fn expected(&self, name: &str) -> Value {
        read_json(&self.path().join(format!("expected/{name}.json")))
    }
}

/// Written by schema 2: blobs, a fork chain, a rewind.
const SCHEMA2: FixtureSet = FixtureSet {
    dir: "schema2",
    schema: 2,
    sessions: &["blobs", "chain-a", "chain-b", "chain-c", "rewound"],
    write: write_common_sessions,
};

/// The sessions of the sets from schema 3 on: schema 2's, and a session long enough for a
/// checkpoint with its fork.
const SCHEMA3_SESSIONS: &[&str] = &[
    "blobs", "chain-a", "chain-b", "chain-c", "rewound", LONG, LONG_FORK,
];

/// Written by schema 3: the same, and a session long enough for a checkpoint with its fork.
const SCHEMA3: FixtureSet = FixtureSet {
    dir: "schema3",
    schema: 3,
    sessions: SCHEMA3_SESSIONS,
    write: write_schema3_sessions,
};

/// Written by schema 4 (the operation filter in checkpoints): the schema-3 sessions, with
/// kinds as text and message payloads wrapped in `{"message":…}`, as every file before
/// schema 5 holds them.
const SCHEMA4: FixtureSet = FixtureSet {
    dir: "schema4",
    schema: 4,
    sessions: SCHEMA3_SESSIONS,
    write: write_schema3_sessions,
};

/// Written by schema 5 (kinds as codes, message payloads bare), the last with an index on
/// the operation key: the schema-3 sessions.
const SCHEMA5: FixtureSet = FixtureSet {
    dir: "schema5",
    schema: 5,
    sessions: SCHEMA3_SESSIONS,
    write: write_schema3_sessions,
};

/// Written by schema 6 (the operation keys in sorted chunks, no index on them), the last
/// without a check on each event row: the schema-3 sessions.
const SCHEMA6: FixtureSet = FixtureSet {
    dir: "schema6",
    schema: 6,
    sessions: SCHEMA3_SESSIONS,
    write: write_schema3_sessions,
};

/// Written by schema 7 (a check on each event row), the last with the checkpoint's
/// transcript index before its operation filter: the schema-3 sessions.
const SCHEMA7: FixtureSet = FixtureSet {
    dir: "schema7",
    schema: 7,
    sessions: SCHEMA3_SESSIONS,
    write: write_schema3_sessions,
};

/// Written by schema 8 (the checkpoint's transcript index last), the last whose
/// `event_kinds` view is a `VALUES` list: the schema-3 sessions.
const SCHEMA8: FixtureSet = FixtureSet {
    dir: "schema8",
    schema: 8,
    sessions: SCHEMA3_SESSIONS,
    write: write_schema3_sessions,
};

/// The session `export.sqlite` was made from.
const EXPORTED: &str = "chain-c";

/// The schema-3 session whose close wrote a projection checkpoint, and its fork.
const LONG: &str = "long";
const LONG_FORK: &str = "long-fork";

/// One-event commits of [`LONG`]; with its chat turns, more than the 1,000 events since
/// the last checkpoint after which a close writes one.
const LONG_COMMITS: usize = 1_040;

/// New events after which a close writes a new checkpoint (`CHECKPOINT_ON_CLOSE`).
const EVENTS_FOR_A_CHECKPOINT: usize = 1_000;

/// A compressible text of about `kib` KiB: numbered build-log lines.
fn build_log(tag: &str, kib: usize) -> String {
    let mut out = String::with_capacity(kib * 1024 + 64);
    let mut line = 0usize;
    while out.len() < kib * 1024 {
        out.push_str(&format!(
            "[{tag}] {line:05} compiling crate-{} v0.{}.0 ... ok\n",
            line % 17,
            line % 5
        ));
        line += 1;
    }
    out
}

/// A completed turn whose tool output (over 64 KiB when `kib` is large) appears in
/// `tool/result` and in the tool message ([`common::tool_turn`]).
fn tool_turn(op: &str, turn_id: &str, kib: usize) -> Batch {
    common::tool_turn(op, turn_id, &build_log(turn_id, kib))
}

/// A completed chat turn with a user message and an assistant reply.
fn chat_turn(op: &str, turn_id: &str) -> Batch {
    Batch::new(
        op,
        vec![
            Event::new("turn/start"),
            message(
                &format!("user-{turn_id}"),
                "user",
                &format!("question {turn_id}"),
            ),
            message(
                &format!("reply-{turn_id}"),
                "assistant",
                &format!("answer {turn_id}"),
            ),
            turn_end("completed"),
        ],
    )
    .in_turn(turn_id)
}

fn titled(op: &str, text: &str) -> Batch {
    Batch::new(op, vec![title(text)])
}

/// Hex SHA-256 of an event's kind, a newline and its payload text (empty without one).
fn event_digest(e: &Event) -> String {
    let mut h = Sha256::new();
    h.update(e.kind.as_bytes());
    h.update(b"\n");
    h.update(e.payload_str().unwrap_or("").as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// What a reader of a session sees, as recorded in `expected/<id>.json`.
fn observed(
    commits: &[Commit],
    projection: &Projection,
    turns: &[TurnBoundary],
    transcript: &[Arc<Message>],
) -> Value {
    let commits: Vec<Value> = commits
        .iter()
        .map(|c| {
            json!({
                "operation_id": c.operation_id,
                "first_seq": c.first_seq,
                "turn_id": c.turn_id,
                "events": c.events.iter().map(event_digest).collect::<Vec<_>>(),
            })
        })
        .collect();
    let durable = commits.last().map_or(0, |c| {
        c["first_seq"].as_u64().expect("seq") + c["events"].as_array().expect("events").len() as u64
            - 1
    });
    json!({
        "durable_sequence": durable,
        "commits": commits,
        "title": projection.title,
        "turn_ids": turns.iter().map(|t| t.turn_id.clone()).collect::<Vec<_>>(),
        "history_message_ids": transcript.iter().map(|m| m.id().to_owned()).collect::<Vec<_>>(),
        "model_message_ids": projection.model_messages.iter().map(|m| m.id().to_owned()).collect::<Vec<_>>(),
    })
}

/// What a replay of a file sees.
fn observed_replay(replayed: &ReplayReport) -> Value {
    observed(
        &replayed.commits,
        &replayed.projection,
        &replayed.turns,
        &replayed.transcript,
    )
}

/// What the root's reader of `name` sees (durable sequence from the reader itself).
fn observed_session(root: &Root, name: &str) -> Value {
    let reader = root.open_reader(&id(name)).expect("reader");
    let commits = reader.all_commits().expect("reader replay");
    let durable = reader.durable_sequence().expect("durable sequence");
    let mut seen = observed(
        &commits,
        &reader.projection().expect("projection"),
        &reader.turns().expect("turns"),
        &reader.transcript(durable).expect("transcript"),
    );
    assert_eq!(
        seen["durable_sequence"].as_u64(),
        Some(reader.durable_sequence().expect("durable sequence")),
        "{name}: durable sequence and last commit disagree"
    );
    seen["inherited_events"] = json!(reader.inherited_events());
    seen
}

/// `commits` of an observation with the operation ids left out.
fn without_operation_ids(commits: &Value) -> Value {
    let mut commits = commits.clone();
    for c in commits.as_array_mut().expect("commits") {
        c.as_object_mut().expect("commit").remove("operation_id");
    }
    commits
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Writes `value`, an object, with each member on a line of its own and each element of
/// a member that is an array (a commit, a message id) on one line: diffable, and a third
/// the size of `to_string_pretty` for the long sessions' commits. (The schema-2 set was
/// written pretty; a reader sees the same values.)
fn write_json(path: &Path, value: &Value) {
    let compact = |v: &Value| serde_json::to_string(v).expect("json");
    let members: Vec<String> = value
        .as_object()
        .expect("an object")
        .iter()
        .map(|(key, member)| match member.as_array() {
            Some(items) if !items.is_empty() => {
                let lines: Vec<String> = items
                    .iter()
                    .map(|i| format!("    {}", compact(i)))
                    .collect();
                format!("  {}: [\n{}\n  ]", compact(&json!(key)), lines.join(",\n"))
            }
            _ => format!("  {}: {}", compact(&json!(key)), compact(member)),
        })
        .collect();
    let text = format!("{{\n{}\n}}\n", members.join(",\n"));
    std::fs::write(path, text).expect("write expected json");
}

fn session_file(root_dir: &Path, name: &str) -> PathBuf {
    root_dir.join(name).join("session.sqlite")
}

/// Every file under `dir` with its size.
fn files_under(dir: &Path, out: &mut BTreeMap<PathBuf, u64>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let entry = entry.expect("entry");
        if entry.file_type().expect("type").is_dir() {
            files_under(&entry.path(), out);
        } else {
            out.insert(entry.path(), entry.metadata().expect("metadata").len());
        }
    }
}

/// Creates session `name` (new, or forked from `from` at its point), appends `batches`
/// and closes it.
fn write_session(root: &Root, name: &str, from: Option<(&str, ForkPoint)>, batches: Vec<Batch>) {
    let session = match from {
        None => create(root, name),
        Some((parent, point)) => {
            root.fork(&id(parent), point, Some(id(name))).expect("fork");
            root.open_writer(&id(name)).expect("open fork")
        }
    };
    for batch in batches {
        session.append(batch).expect("append");
    }
    session.close().expect("close");
}

/// The sessions of the schema-2 set: blobs, the fork chain and the rewind.
fn write_common_sessions(root: &Root) {
    // Blobs: two tool outputs over 64 KiB, each in `tool/result` and the tool message.
    let blobs = vec![
        titled("title", "Build logs"),
        tool_turn("op-blob-1", "turn-1", 80),
        tool_turn("op-blob-2", "turn-2", 96),
        chat_turn("op-chat-3", "turn-3"),
    ];
    write_session(root, "blobs", None, blobs);
    // A fork chain: chain-a, its fork chain-b, and chain-c forked from chain-b.
    let chain_a = vec![
        titled("a-title", "Chain parent"),
        tool_turn("a-op-1", "a1", 70),
        chat_turn("a-op-2", "a2"),
        chat_turn("a-op-3", "a3"),
        chat_turn("a-op-4", "a4"),
    ];
    write_session(root, "chain-a", None, chain_a);
    let chain_b = vec![
        titled("b-title", "Chain fork"),
        chat_turn("b-op-1", "b1"),
        chat_turn("b-op-2", "b2"),
    ];
    let after_a2 = ForkPoint::AfterTurn("a2".into());
    write_session(root, "chain-b", Some(("chain-a", after_a2)), chain_b);
    let chain_c = vec![
        chat_turn("c-op-1", "c1"),
        titled("c-title", "Fork of the fork"),
        chat_turn("c-op-2", "c2"),
    ];
    let after_b1 = ForkPoint::AfterTurn("b1".into());
    write_session(root, "chain-c", Some(("chain-b", after_b1)), chain_c);
    // A rewind of chain-a to before its turn a3, continued.
    let before_a3 = ForkPoint::BeforeTurn("a3".into());
    let rewound = vec![chat_turn("r-op-1", "r1")];
    write_session(root, "rewound", Some(("chain-a", before_a3)), rewound);
}

/// The sessions of the schema-3 set: the schema-2 ones, [`LONG`] ([`LONG_COMMITS`]
/// one-event commits (titles) with a chat turn before every 260th, then a title and a chat
/// turn; its close writes a checkpoint whose transcript index names the turns' messages)
/// and [`LONG_FORK`], forked after that last turn with two turns of its own.
fn write_schema3_sessions(root: &Root) {
    write_common_sessions(root);
    let mut long = Vec::new();
    for n in 0..LONG_COMMITS {
        if n % 260 == 0 {
            long.push(chat_turn(&format!("long-chat-{n}"), &format!("long-{n}")));
        }
        long.push(titled(&format!("long-op-{n}"), &format!("t{n}")));
    }
    long.push(titled("long-title", "A long session"));
    long.push(chat_turn("long-chat-end", "long-end"));
    write_session(root, LONG, None, long);
    let fork = vec![
        chat_turn("long-fork-op-1", "long-fork-1"),
        chat_turn("long-fork-op-2", "long-fork-2"),
    ];
    let after_end = ForkPoint::AfterTurn("long-end".into());
    write_session(root, LONG_FORK, Some((LONG, after_end)), fork);
}

/// Writes the fixture set afresh. Run only with the code of the set's schema version (it
/// refuses any other): the fixtures stand for files earlier releases left on disk.
fn write_fixtures(set: &FixtureSet) {
    assert_eq!(
        SCHEMA_VERSION, set.schema,
        "{} fixtures must be written by schema-{} code",
        set.dir, set.schema
    );
    let dir = set.path();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("remove old fixtures");
    }
    let root_dir = dir.join("root");
    let root = Root::open(&root_dir).expect("root");
    (set.write)(&root);

    root.export(&id(EXPORTED), dir.join("export.sqlite"))
        .expect("export");

    let expected = dir.join("expected");
    std::fs::create_dir_all(&expected).expect("mkdir expected");
    for name in set.sessions {
        write_json(
            &expected.join(format!("{name}.json")),
            &observed_session(&root, name),
        );
    }
    let exported = replay_file(dir.join("export.sqlite")).expect("replay export");
    write_json(&expected.join("export.json"), &observed_replay(&exported));
    // A writer's close checkpoints and truncates the WAL (forks wrote to their parents'
    // files after those closed).
    for name in set.sessions {
        root.open_writer(&id(name))
            .expect("open writer")
            .close()
            .expect("close");
    }
    drop(root);
    let checkpoints: BTreeMap<&str, Value> = set
        .sessions
        .iter()
        .filter_map(|name| {
            let through = checkpoint_through(&session_file(&root_dir, name));
            (!through.is_empty()).then(|| (*name, json!(through.parse::<u64>().expect("seq"))))
        })
        .collect();
    write_json(
        &dir.join("manifest.json"),
        &json!({"schema_version": SCHEMA_VERSION, "sessions": set.sessions,
            "export_of": EXPORTED, "checkpoints": checkpoints}),
    );

    // Keep only what a reader needs: no derived catalog, no empty work folders, no lock
    // files (recreated on demand); the WAL was checkpointed and truncated on close.
    for derived in [".catalog", ".staging", ".trash"] {
        let p = root_dir.join(derived);
        if p.exists() {
            std::fs::remove_dir_all(p).expect("remove derived folder");
        }
    }
    let mut folders: Vec<String> = std::fs::read_dir(&root_dir)
        .expect("read root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    folders.sort_unstable();
    let mut sessions = set.sessions.to_vec();
    sessions.sort_unstable();
    assert_eq!(
        folders, sessions,
        "the root holds the set's sessions and nothing else"
    );
    for name in set.sessions {
        // With no connection open, an empty WAL and its index are leftovers of readers.
        let file = session_file(&root_dir, name);
        let wal = PathBuf::from(format!("{}-wal", file.display()));
        let wal_bytes = std::fs::metadata(&wal).map_or(0, |m| m.len());
        assert_eq!(wal_bytes, 0, "{name}: WAL not checkpointed");
        for side in ["-wal", "-shm"] {
            let p = PathBuf::from(format!("{}{side}", file.display()));
            if p.exists() {
                std::fs::remove_file(p).expect("remove side file");
            }
        }
        for lock in ["writer.lock", "dependents.lock"] {
            let p = root_dir.join(name).join(lock);
            if p.exists() {
                std::fs::remove_file(p).expect("remove lock file");
            }
        }
    }
    let mut files = BTreeMap::new();
    files_under(&dir, &mut files);
    let mut total = 0;
    for (path, bytes) in &files {
        let name = path.to_string_lossy();
        assert!(
            !name.ends_with("-wal") && !name.ends_with("-shm") && !name.ends_with("-journal"),
            "side file left: {name}"
        );
        println!(
            "{bytes:>9}  {}",
            path.strip_prefix(&dir).expect("under").display()
        );
        total += bytes;
    }
    println!("{total:>9}  total");
    // Each session file is about 20 pages of 4 KiB however short (a page per table and
    // index); the long sessions' expected commits take the rest.
    assert!(total < 1_400_000, "fixtures must stay small: {total} bytes");
}

/// `through_seq` of the file's projection checkpoint, empty without one.
fn checkpoint_through(file: &Path) -> String {
    sqlite3(file, "SELECT group_concat(through_seq) FROM checkpoint")
}

/// Writes `tests/fixtures/schema2/` afresh, with schema-2 code only.
#[test]
#[ignore = "regenerates committed fixtures; run by hand with schema-2 code only"]
fn write_schema2_fixtures() {
    write_fixtures(&SCHEMA2);
}

/// Writes `tests/fixtures/schema3/` afresh, with schema-3 code only (68b7ad8).
#[test]
#[ignore = "regenerates committed fixtures; run by hand with schema-3 code only"]
fn write_schema3_fixtures() {
    write_fixtures(&SCHEMA3);
}

/// Writes `tests/fixtures/schema4/` afresh, with schema-4 code only (c34e928).
#[test]
#[ignore = "regenerates committed fixtures; run by hand with schema-4 code only"]
fn write_schema4_fixtures() {
    write_fixtures(&SCHEMA4);
}

/// Writes `tests/fixtures/schema5/` afresh, with schema-5 code only (70a40cf).
#[test]
#[ignore = "regenerates committed fixtures; run by hand with schema-5 code only"]
fn write_schema5_fixtures() {
    write_fixtures(&SCHEMA5);
}

/// Writes `tests/fixtures/schema6/` afresh, with schema-6 code only (d6d4e79).
#[test]
#[ignore = "regenerates committed fixtures; run by hand with schema-6 code only"]
fn write_schema6_fixtures() {
    write_fixtures(&SCHEMA6);
}

/// Writes `tests/fixtures/schema7/` afresh, with schema-7 code only (84648fb).
#[test]
#[ignore = "regenerates committed fixtures; run by hand with schema-7 code only"]
fn write_schema7_fixtures() {
    write_fixtures(&SCHEMA7);
}

/// Writes `tests/fixtures/schema8/` afresh, with schema-8 code only (890da9b).
#[test]
#[ignore = "regenerates committed fixtures; run by hand with schema-8 code only"]
fn write_schema8_fixtures() {
    write_fixtures(&SCHEMA8);
}

/// Appends [`EVENTS_FOR_A_CHECKPOINT`] one-event commits to session `name` and closes its
/// writer (whose close then writes a checkpoint); the commits.
fn commits_for_a_checkpoint(root: &Root, name: &str) -> Vec<Commit> {
    let s = root.open_writer(&id(name)).expect("reopen");
    let added = (0..EVENTS_FOR_A_CHECKPOINT)
        .map(|n| {
            let commit = s.append_events(&format!("after-{n}"), vec![title(&format!("a{n}"))]);
            Commit::clone(&commit.expect("append"))
        })
        .collect();
    s.close().expect("close");
    added
}

/// The operations whose retries [`upgrade_long`] checks: the first, the second, the middle
/// and the last of `originals`.
fn long_picks(originals: &[Commit]) -> [usize; 4] {
    let last = originals.len() - 1;
    [0, 1, last / 2, last]
}

/// Opens the copied root `root_dir` of `set` and has a writer upgrade its `long` session:
/// retries of [`long_picks`] return the original commits, a reused id with other content
/// is refused, and one new commit is appended ([`retries_conflict_and_append`]); the file
/// is then at [`SCHEMA_VERSION`]. The root, the original commits and the new commit's
/// sequence.
fn upgrade_long(set: &FixtureSet, root_dir: &Path) -> (Root, Vec<Commit>, u64) {
    let root = Root::open(root_dir).expect("root");
    let originals = all_commits(&root, LONG);
    let durable = set.expected(LONG)["durable_sequence"]
        .as_u64()
        .expect("seq");
    let picks = long_picks(&originals);
    let new_seq = retries_conflict_and_append(&root, LONG, &originals, &picks, durable, "upgraded");
    assert_eq!(
        sqlite3(&session_file(root_dir, LONG), "PRAGMA user_version"),
        SCHEMA_VERSION.to_string()
    );
    (root, originals, new_seq)
}

/// Every durable commit of session `name`, as a reader replays it.
fn all_commits(root: &Root, name: &str) -> Vec<Commit> {
    root.open_reader(&id(name))
        .expect("reader")
        .all_commits()
        .expect("replay")
}

/// Copies the set's root into a temp dir: the temp dir and the copied root.
fn copied(set: &FixtureSet) -> (tempfile::TempDir, PathBuf) {
    let work = tempfile::tempdir().expect("tempdir");
    let root_dir = work.path().join("sessions");
    copy_tree(&set.path().join("root"), &root_dir);
    let manifest = read_json(&set.path().join("manifest.json"));
    assert_eq!(manifest["schema_version"], json!(set.schema));
    assert_eq!(manifest["sessions"], json!(set.sessions));
    (work, root_dir)
}

/// The set's files read as recorded, replay and verify, take appends, fork, survive the
/// delete of the chain's parent, and the export imports — today and after every later
/// format change.
fn check_fixture_set(set: &FixtureSet) {
    let fixtures = set.path();
    let (work, root_dir) = copied(set);
    let export = work.path().join("export.sqlite");
    std::fs::copy(fixtures.join("export.sqlite"), &export).expect("copy export");
    let checkpoints = &read_json(&fixtures.join("manifest.json"))["checkpoints"];

    // The files as committed: the set's schema, readable by the sqlite3 shell, with the
    // checkpoints the manifest records (none for schema 2).
    for name in set.sessions {
        let file = session_file(&root_dir, name);
        let expected = set.expected(name);
        assert_eq!(
            sqlite3(&file, "PRAGMA user_version"),
            set.schema.to_string()
        );
        assert_eq!(
            checkpoint_through(&file),
            checkpoints
                .get(name)
                .map_or(String::new(), Value::to_string),
            "{name}: checkpoint"
        );
        let own = expected["durable_sequence"].as_u64().expect("seq")
            - expected["inherited_events"].as_u64().expect("inherited");
        assert_eq!(
            sqlite3(&file, "SELECT count(*) FROM events"),
            own.to_string(),
            "{name}: rows of its own"
        );
    }
    assert_eq!(
        sqlite3(&export, "PRAGMA user_version"),
        set.schema.to_string()
    );
    let export_expected = set.expected("export");
    assert_eq!(
        sqlite3(&export, "SELECT count(*) FROM events"),
        export_expected["durable_sequence"].to_string()
    );

    // Readers, replay and verify see exactly what the set's schema recorded.
    let root = Root::open(&root_dir).expect("root");
    for name in set.sessions {
        let expected = set.expected(name);
        assert_eq!(observed_session(&root, name), expected, "{name}: reader");
        let replayed = replay_file(root.session_dir(&id(name))).expect("replay");
        let mut seen = observed_replay(&replayed);
        seen["inherited_events"] = expected["inherited_events"].clone();
        assert_eq!(seen, expected, "{name}: replay");
        let verified = verify_file(root.session_dir(&id(name))).expect("verify");
        assert_eq!(
            json!(verified.events),
            expected["durable_sequence"],
            "{name}"
        );
    }
    let replayed = replay_file(&export).expect("replay export");
    assert_eq!(observed_replay(&replayed), export_expected, "export");
    assert_eq!(
        json!(verify_file(&export).expect("verify export").events),
        export_expected["durable_sequence"]
    );

    // The blobs are whole: the tool output of `tool/result` equals the tool message's.
    let blobs = root
        .open_reader(&id("blobs"))
        .expect("reader")
        .all_commits()
        .expect("replay");
    let outputs: Vec<(String, String)> = blobs
        .iter()
        .filter(|c| c.operation_id.starts_with("op-blob"))
        .map(|c| {
            let payloads = |kind: &str| -> Vec<Value> {
                c.events
                    .iter()
                    .filter(|e| e.kind == kind)
                    .map(|e| serde_json::from_str(e.payload_str().expect("payload")).expect("json"))
                    .collect()
            };
            let result = payloads("tool/result")[0]["output"]
                .as_str()
                .expect("output")
                .to_owned();
            let tool_message = payloads("message/complete")
                .into_iter()
                .find(|p| p["message"]["role"] == "tool")
                .expect("tool message");
            let content = tool_message["message"]["content"]
                .as_str()
                .expect("content");
            (result, content.to_owned())
        })
        .collect();
    assert_eq!(outputs.len(), 2);
    for (result, msg) in &outputs {
        assert!(result.len() > 64 * 1024, "{}", result.len());
        assert!(
            result == msg,
            "tool output differs: {} vs {} bytes",
            result.len(),
            msg.len()
        );
    }

    // A writer open (the upgrade, once there is one) of the chain's parent alone, then of
    // the fork of the fork alone: every member of the chain still reads as recorded,
    // whichever of its files were opened for writing.
    for upgraded in ["chain-a", "chain-c"] {
        root.open_writer(&id(upgraded))
            .expect("open writer")
            .close()
            .expect("close");
        for name in ["chain-a", "chain-b", "chain-c", "rewound"] {
            assert_eq!(
                observed_session(&root, name),
                set.expected(name),
                "{name} after a writer opened {upgraded}"
            );
            verify_file(root.session_dir(&id(name))).expect("verify");
        }
    }

    // A writer appends; a reopened writer and a reader see it; a retry stays idempotent.
    for name in set.sessions {
        let before = set.expected(name);
        let seq = before["durable_sequence"].as_u64().expect("seq");
        let batch = chat_turn(&format!("{name}-after"), &format!("{name}-after"));
        let s = root.open_writer(&id(name)).expect("open writer");
        let commit = s.append(batch.clone()).expect("append");
        assert_eq!(commit.first_seq, seq + 1, "{name}");
        assert_eq!(s.flush().expect("flush"), seq + 4);
        s.close().expect("close");
        let s = root.open_writer(&id(name)).expect("reopen writer");
        assert_eq!(s.append(batch).expect("retry").commit_id, commit.commit_id);
        assert_eq!(
            s.flush().expect("flush"),
            seq + 4,
            "{name}: retry added nothing"
        );
        s.close().expect("close");
        let seen = observed_session(&root, name);
        let commits = seen["commits"].as_array().expect("commits");
        assert_eq!(
            &commits[..commits.len() - 1],
            before["commits"].as_array().expect("commits")
        );
        assert_eq!(
            commits.last().expect("last")["operation_id"],
            json!(format!("{name}-after"))
        );
        assert_eq!(seen["title"], before["title"], "{name}");
        verify_file(root.session_dir(&id(name))).expect("verify after append");

        // A fork after the new turn reads everything and takes appends itself.
        let fork = format!("{name}-after-fork");
        root.fork(
            &id(name),
            ForkPoint::AfterTurn(format!("{name}-after")),
            Some(id(&fork)),
        )
        .expect("fork");
        let forked = observed_session(&root, &fork);
        // A child names inherited commits `inherit:<parent>:…`; their events are the same.
        assert_eq!(
            without_operation_ids(&forked["commits"]),
            without_operation_ids(&seen["commits"]),
            "{fork}"
        );
        assert_eq!(
            forked["history_message_ids"], seen["history_message_ids"],
            "{fork}"
        );
        assert_eq!(forked["inherited_events"], json!(seq + 4));
        let f = root.open_writer(&id(&fork)).expect("open fork");
        f.append(chat_turn("fork-op", "fork-turn"))
            .expect("append to fork");
        assert_eq!(f.flush().expect("flush"), seq + 8);
        f.close().expect("close");
        verify_file(root.session_dir(&id(&fork))).expect("verify fork");
    }

    // Deleting the chain's parent keeps its fork, the fork of the fork and the rewind whole.
    let events_of = |name: &str| -> Value {
        let mut v = observed_session(&root, name);
        v.as_object_mut()
            .expect("object")
            .remove("inherited_events");
        v
    };
    let dependents = ["chain-b", "chain-c", "rewound", "chain-a-after-fork"];
    let before: Vec<Value> = dependents.iter().map(|n| events_of(n)).collect();
    root.delete(&id("chain-a"), &CancelToken::new())
        .expect("delete chain-a");
    assert!(root.open_reader(&id("chain-a")).is_err());
    for (name, was) in dependents.iter().zip(&before) {
        assert_eq!(&events_of(name), was, "{name} after deleting chain-a");
        verify_file(root.session_dir(&id(name))).expect("verify after delete");
    }
    root.delete(&id("chain-b"), &CancelToken::new())
        .expect("delete chain-b");
    assert_eq!(
        events_of("chain-c"),
        before[1],
        "chain-c after deleting chain-b"
    );
    let c = root.open_writer(&id("chain-c")).expect("open chain-c");
    c.append(chat_turn("c-after-delete", "c-after-delete"))
        .expect("append");
    c.close().expect("close");
    verify_file(root.session_dir(&id("chain-c"))).expect("verify chain-c");

    // The export imports into a fresh root, reads as recorded and takes appends.
    let other_dir = work.path().join("imported");
    let other = Root::open(&other_dir).expect("root");
    let imported = other
        .import(&export, ImportOptions::default())
        .expect("import");
    assert_eq!(imported, id(EXPORTED));
    let mut seen = observed_session(&other, EXPORTED);
    let info = other.stat(&imported).expect("stat");
    assert!(info.lineage.is_empty(), "an import is self-contained");
    seen.as_object_mut()
        .expect("object")
        .remove("inherited_events");
    assert_eq!(seen, export_expected, "imported export");
    let s = other.open_writer(&imported).expect("open imported");
    let seq = export_expected["durable_sequence"].as_u64().expect("seq");
    s.append(chat_turn("import-after", "import-after"))
        .expect("append");
    assert_eq!(s.flush().expect("flush"), seq + 4);
    s.close().expect("close");
    verify_file(other.session_dir(&imported)).expect("verify import");

    // And under a new id into the root that holds the rest.
    let renamed = SessionId::new("from-export").expect("id");
    let options = ImportOptions::default().with_session_id(renamed.clone());
    assert_eq!(
        root.import(&export, options).expect("import again"),
        renamed
    );
    let mut seen = observed_session(&root, "from-export");
    seen.as_object_mut()
        .expect("object")
        .remove("inherited_events");
    assert_eq!(seen, export_expected, "export imported under a new id");
}

/// [`check_fixture_set`] on the files schema 2 wrote.
#[test]
fn schema2_fixtures_read_append_fork_delete_and_import() {
    check_fixture_set(&SCHEMA2);
}

/// [`check_fixture_set`] on the files schema 3 wrote.
#[test]
fn schema3_fixtures_read_append_fork_delete_and_import() {
    check_fixture_set(&SCHEMA3);
}

/// [`check_fixture_set`] on the files schema 4 wrote.
#[test]
fn schema4_fixtures_read_append_fork_delete_and_import() {
    check_fixture_set(&SCHEMA4);
}

/// [`check_fixture_set`] on the files schema 5 wrote.
#[test]
fn schema5_fixtures_read_append_fork_delete_and_import() {
    check_fixture_set(&SCHEMA5);
}

/// [`check_fixture_set`] on the files schema 6 wrote.
#[test]
fn schema6_fixtures_read_append_fork_delete_and_import() {
    check_fixture_set(&SCHEMA6);
}

/// [`check_fixture_set`] on the files schema 7 wrote.
#[test]
fn schema7_fixtures_read_append_fork_delete_and_import() {
    check_fixture_set(&SCHEMA7);
}

/// [`check_fixture_set`] on the files schema 8 wrote.
#[test]
fn schema8_fixtures_read_append_fork_delete_and_import() {
    check_fixture_set(&SCHEMA8);
}

/// A process holding the writer lock of session `name` under `root_dir` (`flock(1)` on its
/// lock file, as an older build's writer holds it) until dropped.
struct ForeignWriter(std::process::Child);

impl ForeignWriter {
    fn hold(root: &Root, root_dir: &Path, name: &str) -> ForeignWriter {
        let lock = root_dir.join(name).join("writer.lock");
        // `--no-fork`: flock becomes the `sleep` that holds the lock, so killing it
        // releases it (a forked `sleep` would hold it on).
        let child = std::process::Command::new("flock")
            .arg("--no-fork")
            .arg(&lock)
            .args(["sleep", "600"])
            .spawn()
            .expect("run flock");
        let holder = ForeignWriter(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while root.writer_owner(&id(name)).expect("owner").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "flock never took {name}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        holder
    }
}

impl Drop for ForeignWriter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fork of an older file, or the delete of its parent, never upgrades it under a writer
/// that another process holds (an older build's, which reads no newer version): a schema-2
/// writer's next commit failed (`NOT NULL constraint failed: commits.operation_key`, its
/// batch lost) and a schema-6 writer went on writing rows without the row check (outside
/// testing, session 40). The fork is made, its parent left at its version; the delete is
/// refused naming the fork's writer, with nothing deleted; once that writer is gone it goes
/// through and upgrades the fork.
#[test]
fn an_older_file_another_writer_holds_is_not_upgraded_by_a_fork_or_a_delete() {
    let (_work, root_dir) = copied(&SCHEMA2);
    let root = Root::open(&root_dir).expect("root");
    let version = |name: &str| sqlite3(&session_file(&root_dir, name), "PRAGMA user_version");
    let before: BTreeMap<&str, Value> = ["chain-a", "chain-b"]
        .into_iter()
        .map(|name| (name, observed_session(&root, name)))
        .collect();

    let writer = ForeignWriter::hold(&root, &root_dir, "chain-a");
    root.fork(
        &id("chain-a"),
        ForkPoint::AfterTurn("a2".into()),
        Some(id("a-fork")),
    )
    .expect("fork of a held older file");
    assert_eq!(version("chain-a"), "2", "the fork upgraded its held parent");
    assert_eq!(observed_session(&root, "chain-a"), before["chain-a"]);
    // The fork reads its parent's transcript through turn a2.
    let forked = observed_session(&root, "a-fork");
    let (inherited, parents) = (
        forked["history_message_ids"].as_array().expect("ids"),
        before["chain-a"]["history_message_ids"]
            .as_array()
            .expect("ids"),
    );
    assert!(
        !inherited.is_empty() && inherited.len() < parents.len(),
        "{forked}"
    );
    assert_eq!(inherited[..], parents[..inherited.len()]);
    verify_file(root.session_dir(&id("a-fork"))).expect("verify the fork");
    drop(writer);

    // chain-b, a fork of chain-a, is held: deleting chain-a would copy into it.
    let writer = ForeignWriter::hold(&root, &root_dir, "chain-b");
    let refused = root
        .delete(&id("chain-a"), &CancelToken::new())
        .expect_err("the delete upgraded a held fork");
    assert!(refused.is_writer_owned(), "{refused}");
    assert!(refused.to_string().contains("chain-b"), "{refused}");
    assert_eq!(version("chain-b"), "2", "the delete upgraded a held fork");
    // The CLI says why a session no writer holds is kept (exit 5, as for its own writer).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_session-store"))
        .arg("--root")
        .arg(&root_dir)
        .args(["delete", "chain-a"])
        .output()
        .expect("run session-store");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(
        stderr.contains("delete chain-a (it copies what its fork chain-b inherits into that fork")
            && stderr.contains("chain-a is kept)"),
        "{stderr}"
    );
    assert_eq!(
        version("chain-b"),
        "2",
        "the CLI's delete upgraded a held fork"
    );
    // `gc` and its dry run agree: chain-a is kept, naming its held fork (the dry run said
    // it would delete it, and the run failed, exit 1: outside testing M6, mixed versions).
    // Two days on, as the copied files were just made (gc takes a file's birth as the
    // session's arrival).
    for dry_run in [true, false].into_iter().filter(|_| faketime_or_skip()) {
        let mut args = vec!["--json", "gc", "--older-than", "1d"];
        if dry_run {
            args.push("--dry-run");
        }
        let out = under_clock("+2d", env!("CARGO_BIN_EXE_session-store"))
            .arg("--root")
            .arg(&root_dir)
            .args(&args)
            .output()
            .expect("run session-store");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "dry run {dry_run}: {stderr}");
        let report: Value = serde_json::from_slice(&out.stdout).expect("gc --json");
        let named = |key: &str| -> Vec<(String, String)> {
            report[key]
                .as_array()
                .expect(key)
                .iter()
                .map(|e| {
                    (
                        e["session_id"].as_str().unwrap_or_default().to_owned(),
                        e["reason"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        };
        assert!(
            named("kept")
                .iter()
                .any(|(id, why)| id == "chain-a" && why.contains("its fork chain-b")),
            "dry run {dry_run}: {report}"
        );
        assert!(
            !named("deleted").iter().any(|(id, _)| id == "chain-a"),
            "dry run {dry_run}: {report}"
        );
    }
    assert_eq!(observed_session(&root, "chain-a"), before["chain-a"]);
    assert_eq!(observed_session(&root, "chain-b"), before["chain-b"]);
    drop(writer);

    root.delete(&id("chain-a"), &CancelToken::new())
        .expect("delete once the fork's writer is gone");
    assert_eq!(version("chain-b"), SCHEMA_VERSION.to_string());
    let mut after = observed_session(&root, "chain-b");
    let mut was = before["chain-b"].clone();
    for v in [&mut after, &mut was] {
        v.as_object_mut()
            .expect("object")
            .remove("inherited_events");
        v["commits"] = without_operation_ids(&v["commits"]);
    }
    assert_eq!(after, was, "chain-b after its parent's delete");
    verify_file(root.session_dir(&id("chain-b"))).expect("verify chain-b");
}

/// What a reader of `name` sees, without the count of inherited events (an export or an
/// import has none).
fn observed_own(root: &Root, name: &str) -> Value {
    let mut seen = observed_session(root, name);
    seen.as_object_mut()
        .expect("object")
        .remove("inherited_events");
    seen
}

/// Exports `name` to `work/<tag>.sqlite`: the export verifies and replays as the session
/// reads, and imports into a fresh root under its id, reading the same there.
fn export_and_import(root: &Root, name: &str, work: &Path, tag: &str) {
    let seen = observed_own(root, name);
    let export = work.join(format!("{tag}.sqlite"));
    root.export(&id(name), &export).expect("export");
    assert_eq!(
        sqlite3(&export, "PRAGMA user_version"),
        SCHEMA_VERSION.to_string()
    );
    assert_eq!(
        json!(verify_file(&export).expect("verify export").events),
        seen["durable_sequence"],
        "{tag}"
    );
    let replayed = replay_file(&export).expect("replay export");
    assert_eq!(
        observed_replay(&replayed),
        seen,
        "{tag}: replay of the export"
    );
    let other = Root::open(work.join(format!("{tag}-root"))).expect("root");
    let imported = other
        .import(&export, ImportOptions::default())
        .expect("import");
    assert_eq!(
        observed_own(&other, imported.as_str()),
        seen,
        "{tag}: import"
    );
}

/// `through_seq`, a check that `message_ids` is non-empty and the `operation_filter` (its
/// length, `NULL` when there is none) of the file's checkpoint row.
fn checkpoint_row(file: &Path) -> String {
    sqlite3(
        file,
        "SELECT through_seq, length(message_ids) >= 20, ifnull(length(operation_filter), 'NULL')
         FROM checkpoint",
    )
}

/// The schema-3 long session across the upgrade: its checkpoint (through sequence as
/// recorded, transcript index non-empty) stays and is used after a writer's open, which
/// stores no operation filter until it writes a new checkpoint; retries of its old
/// operations (the first, the middle, the last) return the original commits, a reused
/// operation id with other content is `OperationConflict`, new operations append; after
/// enough new commits a close writes a checkpoint with an operation filter, and a reopen
/// still answers retries of old and new operations. Readers, `verify_file`, `replay_file`,
/// export and import accept the files before and after; its fork reads and takes retries.
#[test]
fn schema3_long_session_keeps_its_checkpoint_and_operations_through_the_upgrade() {
    let set = &SCHEMA3;
    let (work, root_dir) = copied(set);
    let manifest = read_json(&set.path().join("manifest.json"));
    let through = manifest["checkpoints"][LONG]
        .as_u64()
        .expect("long's checkpoint");
    let expected = set.expected(LONG);
    let durable = expected["durable_sequence"].as_u64().expect("seq");
    assert!(through > EVENTS_FOR_A_CHECKPOINT as u64 && through <= durable);
    let file = session_file(&root_dir, LONG);
    let has_filter_column = |file: &Path| {
        sqlite3(
            file,
            "SELECT count(*) FROM pragma_table_info('checkpoint') WHERE name = 'operation_filter'",
        )
    };

    // As committed: schema 3, a checkpoint with a transcript index and no filter column.
    assert_eq!(sqlite3(&file, "PRAGMA user_version"), "3");
    assert_eq!(has_filter_column(&file), "0");
    assert_eq!(
        sqlite3(
            &file,
            "SELECT through_seq, length(message_ids) >= 20 FROM checkpoint"
        ),
        format!("{through}|1")
    );
    let digest = sqlite3(&file, "SELECT digest FROM checkpoint");
    let root = Root::open(&root_dir).expect("root");
    let originals = all_commits(&root, LONG);
    let fork_originals = root
        .open_reader(&id(LONG_FORK))
        .expect("fork reader")
        .all_commits()
        .expect("fork replay");
    export_and_import(&root, LONG, work.path(), "long-v3");
    export_and_import(&root, LONG_FORK, work.path(), "long-fork-v3");
    assert_eq!(
        sqlite3(&file, "PRAGMA user_version"),
        "3",
        "readers upgrade nothing"
    );

    // The writer's open upgrades the file and keeps the checkpoint, which has no filter.
    // It starts from it: its close writes none (one folding the whole log would count
    // every event as new, more than the 1,000 after which a close writes one).
    let last = originals.len() - 1;
    let picks = [0, 1, last / 2, last - 1, last];
    let new_seq = retries_conflict_and_append(&root, LONG, &originals, &picks, durable, "upgraded");
    assert_eq!(
        sqlite3(&file, "PRAGMA user_version"),
        SCHEMA_VERSION.to_string()
    );
    assert_eq!(checkpoint_row(&file), format!("{through}|1|NULL"));
    assert_eq!(sqlite3(&file, "SELECT digest FROM checkpoint"), digest);
    let seen = observed_session(&root, LONG);
    let commits = seen["commits"].as_array().expect("commits");
    assert_eq!(
        commits[..originals.len()],
        expected["commits"].as_array().expect("commits")[..],
        "long after the upgrade"
    );
    assert_eq!(commits[originals.len()]["operation_id"], "new-upgraded");

    // Enough new commits for a checkpoint: the close stores the filter with it.
    let added = commits_for_a_checkpoint(&root, LONG);
    let now = new_seq + EVENTS_FOR_A_CHECKPOINT as u64;
    let row = checkpoint_row(&file);
    let (head, filter_bytes) = row.rsplit_once('|').expect("row");
    assert_eq!(head, format!("{now}|1"), "a new checkpoint");
    assert!(
        filter_bytes.parse::<u64>().is_ok_and(|b| b > 16),
        "the new checkpoint stores an operation filter: {row}"
    );

    // A reopen restores the filter and still answers retries of old and new operations.
    let mut all = originals.clone();
    all.extend(added);
    let picks = [0, last / 2, last, last + 1, all.len() - 1];
    retries_conflict_and_append(&root, LONG, &all, &picks, now, "with the filter");
    assert_eq!(
        checkpoint_row(&file),
        row,
        "no new checkpoint for one commit"
    );
    let seen = observed_session(&root, LONG);
    assert_eq!(
        seen["commits"].as_array().expect("commits")[..originals.len()],
        expected["commits"].as_array().expect("commits")[..],
        "the original commits read as recorded"
    );
    assert_eq!(
        json!(verify_file(&file).expect("verify").events),
        seen["durable_sequence"]
    );
    let mut replayed = observed_replay(&replay_file(&file).expect("replay"));
    replayed["inherited_events"] = json!(0);
    assert_eq!(replayed, seen, "replay after the upgrade");
    export_and_import(&root, LONG, work.path(), "long-v4");

    // The fork reads as recorded after its parent's upgrade; its own writer upgrades it
    // and answers retries of its own operations.
    let fork_expected = set.expected(LONG_FORK);
    assert_eq!(observed_session(&root, LONG_FORK), fork_expected);
    let own: Vec<usize> = (0..fork_originals.len())
        .filter(|&i| fork_originals[i].operation_id.starts_with("long-fork-op"))
        .collect();
    assert_eq!(own.len(), 2);
    let fork_durable = fork_expected["durable_sequence"].as_u64().expect("seq");
    retries_conflict_and_append(
        &root,
        LONG_FORK,
        &fork_originals,
        &own,
        fork_durable,
        "fork",
    );
    let fork_file = session_file(&root_dir, LONG_FORK);
    assert_eq!(
        sqlite3(&fork_file, "PRAGMA user_version"),
        SCHEMA_VERSION.to_string()
    );
    verify_file(&fork_file).expect("verify fork");
    export_and_import(&root, LONG_FORK, work.path(), "long-fork-v4");
}

/// Schema 5 (migration 0005): known kinds are one-byte codes and message payloads of the
/// exact form `{"message":{…}}` are stored bare, without rewriting older rows. A schema-4
/// file upgraded by its writer holds both forms; both read back byte for byte as written,
/// `verify` passes, the shell's views show kinds by name and whole payloads, a child forked
/// from it reads them, and its export holds the new form only.
#[test]
fn schema5_codes_kinds_and_stores_messages_bare_beside_older_rows() {
    let (work, root_dir) = copied(&SCHEMA4);
    let file = session_file(&root_dir, "chain-a");
    let forms = |file: &Path| {
        sqlite3(
            file,
            "SELECT group_concat(DISTINCT typeof(kind)) FROM events",
        )
    };
    assert_eq!(forms(&file), "text", "schema 4 stores kinds as text");
    let root = Root::open(&root_dir).expect("root");
    let before = root
        .open_reader(&id("chain-a"))
        .expect("reader")
        .all_commits()
        .expect("replay");
    let payloads = |commits: &[Commit]| -> Vec<(u64, String, Option<String>)> {
        commits
            .iter()
            .flat_map(|c| &c.events)
            .map(|e| (e.seq, e.kind.clone(), e.payload_str().map(str::to_owned)))
            .collect()
    };

    // New rows: a chat turn, and a message payload of another form (white space inside
    // the wrapper), which keeps its text kind and its bytes.
    let spaced = r#"{"message": {"id":"spaced","role":"user","content":"as written"}}"#;
    let s = root.open_writer(&id("chain-a")).expect("writer");
    s.append(turn("v5-op", "v5-turn", "v5-message"))
        .expect("append");
    s.append(Batch::new(
        "v5-spaced",
        vec![
            Event::new("message/complete")
                .with_payload_json(spaced)
                .expect("payload"),
        ],
    ))
    .expect("append spaced");
    s.close().expect("close");
    assert_eq!(
        sqlite3(&file, "PRAGMA user_version"),
        SCHEMA_VERSION.to_string()
    );
    assert_eq!(
        forms(&file),
        "text,blob",
        "old rows keep their text, new ones are coded"
    );
    assert_eq!(
        sqlite3(
            &file,
            "SELECT json_extract(payload, '$.id') FROM events
             WHERE kind = (SELECT code FROM event_kinds WHERE kind = 'message/complete')"
        ),
        "v5-message",
        "the new message is stored bare"
    );
    assert_eq!(
        sqlite3(
            &file,
            "SELECT payload FROM events WHERE kind = 'message/complete' AND payload LIKE '%spaced%'"
        ),
        spaced,
        "another form keeps its text kind and bytes"
    );

    // Read back: the old commits as before, the new ones as appended.
    let after = root
        .open_reader(&id("chain-a"))
        .expect("reader")
        .all_commits()
        .expect("replay");
    assert_eq!(payloads(&after[..before.len()]), payloads(&before));
    let new: Vec<&Event> = after[before.len()..]
        .iter()
        .flat_map(|c| &c.events)
        .collect();
    let appended = turn("v5-op", "v5-turn", "v5-message");
    for (read, written) in new.iter().zip(&appended.events) {
        assert_eq!(read.kind, written.kind);
        assert_eq!(read.payload_str(), written.payload_str());
    }
    assert_eq!(new.last().expect("spaced").payload_str(), Some(spaced));
    verify_file(&file).expect("verify the mixed file");
    let history = root
        .open_reader(&id("chain-a"))
        .expect("reader")
        .transcript_texts(u64::MAX, usize::MAX)
        .expect("history");
    let ids: Vec<String> = history
        .iter()
        .map(|t| {
            let message: Value = serde_json::from_str(t.message().expect("message")).expect("json");
            message["id"].as_str().expect("id").to_owned()
        })
        .collect();
    assert!(
        ids.ends_with(&["v5-message".to_owned(), "spaced".to_owned()]),
        "{ids:?}"
    );

    // The shell's views: kinds by name, whole payloads, messages of both forms.
    assert_eq!(
        sqlite3(
            &file,
            "SELECT count(*), sum(payload_summary LIKE '{\"message\":%'
                                  OR payload_summary LIKE '<blob %')
             FROM event_log WHERE kind = 'message/complete'"
        ),
        format!("{0}|{0}", sqlite3(&file, "SELECT count(*) FROM transcript")),
    );
    assert_eq!(
        sqlite3(
            &file,
            "SELECT group_concat(message_id, ' ') FROM (SELECT message_id FROM transcript ORDER BY seq DESC LIMIT 2)"
        ),
        "spaced v5-message"
    );

    // A child forked after the new turn reads both forms; an export holds codes only.
    root.fork(
        &id("chain-a"),
        ForkPoint::AfterTurn("v5-turn".into()),
        Some(id("v5-child")),
    )
    .expect("fork");
    let child = root
        .open_reader(&id("v5-child"))
        .expect("child")
        .all_commits()
        .expect("child replay");
    assert_eq!(payloads(&child), payloads(&after[..child.len()]));
    let export = work.path().join("v5-export.sqlite");
    root.export(&id("chain-a"), &export).expect("export");
    assert_eq!(
        sqlite3(
            &export,
            "SELECT count(*) FROM events WHERE typeof(kind) = 'text'"
        ),
        "2",
        "text kinds: the message of another form, and the tool message stored whole as a blob"
    );
    let imported = root
        .import(
            &export,
            ImportOptions::default().with_session_id(id("v5-import")),
        )
        .expect("import");
    let copy = root
        .open_reader(&imported)
        .expect("import reader")
        .all_commits()
        .expect("import replay");
    assert_eq!(payloads(&copy), payloads(&after));
}

/// Schema 6 (migration 0006): the index on the operation key is dropped and the keys go to
/// sorted chunks. The schema-5 `long` session (1,046 commits) upgraded by its writer has no
/// index and answers retries of its old operations (from its commits: no chunk yet); the
/// first drain puts every commit's key in one chunk; after a reopen the retries are answered
/// from it, and the sessions of the set still read, fork and export as recorded.
#[test]
fn schema6_moves_the_operation_keys_of_an_upgraded_file_into_a_chunk() {
    let (_work, root_dir) = copied(&SCHEMA5);
    let file = session_file(&root_dir, LONG);
    let index = |f: &Path| {
        sqlite3(
            f,
            "SELECT count(*) FROM sqlite_schema WHERE name = 'commits_by_operation'",
        )
    };
    let chunks = |f: &Path| {
        sqlite3(
            f,
            "SELECT count(*), max(through_seq), sum(length(keys)) / 16 FROM operation_key_chunks",
        )
    };
    assert_eq!(index(&file), "1", "schema 5 indexes the key");
    let (root, originals, new_seq) = upgrade_long(&SCHEMA5, &root_dir);
    assert_eq!(index(&file), "0");
    assert_eq!(
        chunks(&file),
        format!("1|{new_seq}|{}", originals.len() + 1),
        "every commit, the new one too, in one chunk"
    );
    retries_conflict_and_append(
        &root,
        LONG,
        &originals,
        &long_picks(&originals),
        new_seq,
        "chunked",
    );
    assert_eq!(
        chunks(&file),
        format!("1|{new_seq}|{}", originals.len() + 1)
    );
    verify_file(root.session_dir(&id(LONG))).expect("verify");
}

/// Schema 7 on an upgraded schema-6 file: the rows written before keep no check (NULL: the
/// migration rewrites nothing) and read and verify as before; the rows a writer appends
/// after the upgrade carry one, and a read of the transcript refuses such a row once its
/// payload is changed in place, naming the event.
#[test]
fn schema7_checks_the_rows_it_writes_beside_unchecked_older_ones() {
    let (_work, root_dir) = copied(&SCHEMA6);
    let file = session_file(&root_dir, "chain-a");
    let count = |which: &str| {
        sqlite3(
            &file,
            &format!("SELECT count(*) FROM events WHERE payload_check IS {which}"),
        )
    };
    let before: u64 = sqlite3(&file, "SELECT count(*) FROM events")
        .parse()
        .expect("count");
    let root = Root::open(&root_dir).expect("root");
    let writer = root.open_writer(&id("chain-a")).expect("writer");
    writer
        .append(chat_turn("after-upgrade", "t-upgraded"))
        .expect("append");
    writer.close().expect("close");
    assert_eq!(
        sqlite3(&file, "PRAGMA user_version"),
        SCHEMA_VERSION.to_string()
    );
    assert_eq!(count("NULL"), before.to_string(), "older rows: unchecked");
    assert_eq!(count("NOT NULL"), "4", "the appended turn's rows: checked");
    let reader = root.open_reader(&id("chain-a")).expect("reader");
    let durable = reader.durable_sequence().expect("durable");
    let texts = |r: &session_store::SessionReader| -> session_store::Result<Vec<String>> {
        let messages = r.transcript(durable)?;
        Ok(messages.iter().map(|m| m.json().to_owned()).collect())
    };
    let read = texts(&reader).expect("transcript");
    assert!(read.last().is_some_and(|m| m.contains("answer t-upgraded")));
    verify_file(root.session_dir(&id("chain-a"))).expect("verify");
    sqlite3(
        &file,
        "UPDATE events SET payload = replace(payload, 'answer t-up', 'answer t_up')
         WHERE payload LIKE '%answer t-upgraded%'",
    );
    let err = texts(&reader).expect_err("a checked row changed in place");
    assert!(err.is_corrupt(), "{err:?}");
    assert!(
        err.to_string().contains(&format!(
            "event {}: the row does not match its check",
            durable - 1
        )),
        "{err}"
    );
}

/// Schema 8 (migration 0008) on an upgraded schema-7 file: the checkpoint's columns come in
/// the order an opener reads them, the transcript index last, and its row is copied as it
/// was. The writer's open starts from it: retries of old operations return the originals
/// (its operation filter restored), and its close writes no new checkpoint (one folding the
/// whole log would count every event as new, more than the 1,000 after which a close writes
/// one): its checkpoint text of format 4 (workset references whole) is still read. `verify`
/// passes with no note of an ignored checkpoint, and the checkpoint a close writes later
/// (format 5: references as deltas) is stored in the new order and used by the next open.
#[test]
fn schema8_puts_the_transcript_index_last_and_keeps_the_checkpoint() {
    let (_work, root_dir) = copied(&SCHEMA7);
    let file = session_file(&root_dir, LONG);
    const COLUMNS: &str = "SELECT group_concat(name) FROM pragma_table_info('checkpoint')";
    const ROW: &str = "SELECT through_seq, digest, hex(projection), hex(operation_filter),
                              hex(message_ids)
                       FROM checkpoint";
    const FORMAT: &str = "SELECT json_extract(projection, '$.format') FROM checkpoint";
    assert_eq!(
        sqlite3(&file, COLUMNS),
        "singleton,through_seq,projection,digest,message_ids,operation_filter"
    );
    assert_eq!(sqlite3(&file, FORMAT), "4", "workset references whole");
    let before = sqlite3(&file, ROW);
    let (root, originals, new_seq) = upgrade_long(&SCHEMA7, &root_dir);
    assert_eq!(
        sqlite3(&file, COLUMNS),
        "singleton,through_seq,digest,projection,operation_filter,message_ids"
    );
    assert_eq!(
        sqlite3(&file, ROW),
        before,
        "copied as it was; no new checkpoint"
    );
    let verified = verify_file(&file).expect("verify");
    assert!(verified.notes.is_empty(), "{:?}", verified.notes);

    // Enough new commits for a checkpoint: the close writes one in the new order, and the
    // next open starts from it (its close writes none).
    let added = commits_for_a_checkpoint(&root, LONG);
    let now = new_seq + EVENTS_FOR_A_CHECKPOINT as u64;
    let written = sqlite3(&file, ROW);
    assert!(written.starts_with(&format!("{now}|")), "{written}");
    assert_eq!(sqlite3(&file, FORMAT), "5", "workset references as deltas");
    let last = originals.len() - 1;
    let mut all = originals;
    all.extend(added);
    let picks = [0, last, last + 1, all.len() - 1];
    retries_conflict_and_append(&root, LONG, &all, &picks, now, "after a new checkpoint");
    assert_eq!(
        sqlite3(&file, ROW),
        written,
        "no new checkpoint for one commit"
    );
    let verified = verify_file(&file).expect("verify");
    assert!(verified.notes.is_empty(), "{:?}", verified.notes);
}

/// Schema 9 (migration 0009) on a schema-8 file: `event_kinds` becomes the JSON list, and
/// Debian's `sqlite3` lists the same codes, names and `bare` flags from it as from the
/// `VALUES` list before, and names the kinds of `event_log` the same.
#[test]
fn schema9_lists_the_same_event_kinds_from_one_json_list() {
    let (_work, root_dir) = copied(&SCHEMA8);
    let file = session_file(&root_dir, "chain-a");
    const KINDS: &str = "SELECT group_concat(hex(code) || ' ' || kind || ' ' || bare, ', ')
                         FROM event_kinds";
    const LOG: &str = "SELECT group_concat(kind, ' ') FROM event_log";
    const VIEW: &str =
        "SELECT sql LIKE '%json_each%' FROM sqlite_schema WHERE name = 'event_kinds'";
    assert_eq!(sqlite3(&file, "PRAGMA user_version"), "8");
    assert_eq!(sqlite3(&file, VIEW), "0");
    let (kinds, log) = (sqlite3(&file, KINDS), sqlite3(&file, LOG));
    assert!(
        kinds.starts_with("00 message/complete 1, 01 tool/result 0"),
        "{kinds}"
    );
    assert!(log.contains("message/complete"), "{log}");

    let root = Root::open(&root_dir).expect("root");
    root.open_writer(&id("chain-a"))
        .expect("a writer upgrades the file")
        .close()
        .expect("close");
    assert_eq!(
        sqlite3(&file, "PRAGMA user_version"),
        SCHEMA_VERSION.to_string()
    );
    assert_eq!(sqlite3(&file, VIEW), "1");
    assert_eq!(sqlite3(&file, KINDS), kinds);
    assert_eq!(sqlite3(&file, LOG), log);
}
