//! Committed on-disk fixtures of an older format, so every later format change is tested
//! against real files that earlier code wrote.
//!
//! `tests/fixtures/schema2/` was written by schema version 2 of this crate (migrations 0001
//! and 0002) through the public API, by the ignored generator
//! [`write_schema2_fixtures`] (`cargo test --release --test format_fixtures -- --ignored
//! write_schema2_fixtures`). It holds a root (`root/`) with a session whose tool outputs
//! are blobs over 64 KiB and appear both in `tool/result` and in the tool message
//! (`blobs`), a fork chain with titles and several turns (`chain-a`, its fork `chain-b`,
//! the fork of the fork `chain-c`), a rewind of `chain-a` (`rewound`), an export of
//! `chain-c` (`export.sqlite`), and per session an `expected/<id>.json` recording what a
//! reader must see: the durable sequence, every commit's operation id with a digest of each
//! event's kind and payload text, the title, the turn ids and the history and model
//! message ids.
//!
//! [`schema2_fixtures_read_append_fork_delete_and_import`] copies that root and checks, for
//! each session and the export, that it reads as recorded, `replay` and `verify` pass, a
//! writer appends and a reopen sees it, a fork of it reads, deleting the chain's parent
//! keeps every descendant whole, and the export imports. It passes on schema version 2
//! today; **every later format (migration 0003 onwards) must keep it passing unchanged**:
//! a writer open upgrades these files, and readers, `verify`, `export` and `import` must
//! accept them before and after. Never regenerate the fixtures with a newer schema: they
//! stand for files already on users' disks.

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

/// The sessions of the fixture root, each with an `expected/<id>.json`.
const SESSIONS: [&str; 5] = ["blobs", "chain-a", "chain-b", "chain-c", "rewound"];

/// The session `export.sqlite` was made from.
const EXPORTED: &str = "chain-c";

/// The schema version the fixtures were written with.
const FIXTURE_SCHEMA: i64 = 2;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2")
}

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

fn write_json(path: &Path, value: &Value) {
    let text = serde_json::to_string_pretty(value).expect("json") + "\n";
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

/// Writes `tests/fixtures/schema2/` afresh. Run only with the schema-2 code (it refuses any
/// other schema version): the fixtures stand for files earlier releases left on disk.
#[test]
#[ignore = "regenerates committed fixtures; run by hand with schema-2 code only"]
fn write_schema2_fixtures() {
    assert_eq!(
        SCHEMA_VERSION, FIXTURE_SCHEMA,
        "schema-2 fixtures must be written by schema-2 code"
    );
    let dir = fixture_dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("remove old fixtures");
    }
    let root_dir = dir.join("root");
    let root = Root::open(&root_dir).expect("root");

    // Blobs: two tool outputs over 64 KiB, each in `tool/result` and the tool message.
    let blobs = vec![
        titled("title", "Build logs"),
        tool_turn("op-blob-1", "turn-1", 80),
        tool_turn("op-blob-2", "turn-2", 96),
        chat_turn("op-chat-3", "turn-3"),
    ];
    write_session(&root, "blobs", None, blobs);
    // A fork chain: chain-a, its fork chain-b, and chain-c forked from chain-b.
    let chain_a = vec![
        titled("a-title", "Chain parent"),
        tool_turn("a-op-1", "a1", 70),
        chat_turn("a-op-2", "a2"),
        chat_turn("a-op-3", "a3"),
        chat_turn("a-op-4", "a4"),
    ];
    write_session(&root, "chain-a", None, chain_a);
    let chain_b = vec![
        titled("b-title", "Chain fork"),
        chat_turn("b-op-1", "b1"),
        chat_turn("b-op-2", "b2"),
    ];
    let after_a2 = ForkPoint::AfterTurn("a2".into());
    write_session(&root, "chain-b", Some(("chain-a", after_a2)), chain_b);
    let chain_c = vec![
        chat_turn("c-op-1", "c1"),
        titled("c-title", "Fork of the fork"),
        chat_turn("c-op-2", "c2"),
    ];
    let after_b1 = ForkPoint::AfterTurn("b1".into());
    write_session(&root, "chain-c", Some(("chain-b", after_b1)), chain_c);
    // A rewind of chain-a to before its turn a3, continued.
    let before_a3 = ForkPoint::BeforeTurn("a3".into());
    let rewound = vec![chat_turn("r-op-1", "r1")];
    write_session(&root, "rewound", Some(("chain-a", before_a3)), rewound);

    root.export(&id(EXPORTED), dir.join("export.sqlite"))
        .expect("export");

    let expected = dir.join("expected");
    std::fs::create_dir_all(&expected).expect("mkdir expected");
    for name in SESSIONS {
        write_json(
            &expected.join(format!("{name}.json")),
            &observed_session(&root, name),
        );
    }
    let exported = replay_file(dir.join("export.sqlite")).expect("replay export");
    write_json(&expected.join("export.json"), &observed_replay(&exported));
    write_json(
        &dir.join("manifest.json"),
        &json!({"schema_version": SCHEMA_VERSION, "sessions": SESSIONS, "export_of": EXPORTED}),
    );
    // A writer's close checkpoints and truncates the WAL (forks wrote to their parents'
    // files after those closed).
    for name in SESSIONS {
        root.open_writer(&id(name))
            .expect("open writer")
            .close()
            .expect("close");
    }
    drop(root);

    // Keep only what a reader needs: no derived catalog, no empty work folders, no lock
    // files (recreated on demand); the WAL was checkpointed and truncated on close.
    for derived in [".catalog", ".staging", ".trash"] {
        let p = root_dir.join(derived);
        if p.exists() {
            std::fs::remove_dir_all(p).expect("remove derived folder");
        }
    }
    for name in SESSIONS {
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
    assert!(total < 1 << 20, "fixtures must stay small: {total} bytes");
}

/// The schema-2 fixtures read as recorded, replay and verify, take appends, fork, survive
/// the delete of the chain's parent, and the export imports — today and after every later
/// format change.
#[test]
fn schema2_fixtures_read_append_fork_delete_and_import() {
    let fixtures = fixture_dir();
    let manifest = read_json(&fixtures.join("manifest.json"));
    assert_eq!(manifest["schema_version"], json!(FIXTURE_SCHEMA));
    let work = tempfile::tempdir().expect("tempdir");
    let root_dir = work.path().join("sessions");
    copy_tree(&fixtures.join("root"), &root_dir);
    let export = work.path().join("export.sqlite");
    std::fs::copy(fixtures.join("export.sqlite"), &export).expect("copy export");

    // The files as committed: schema 2, readable by the sqlite3 shell.
    for name in SESSIONS {
        let file = session_file(&root_dir, name);
        let expected = read_json(&fixtures.join(format!("expected/{name}.json")));
        assert_eq!(
            sqlite3(&file, "PRAGMA user_version"),
            FIXTURE_SCHEMA.to_string()
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
        FIXTURE_SCHEMA.to_string()
    );
    let export_expected = read_json(&fixtures.join("expected/export.json"));
    assert_eq!(
        sqlite3(&export, "SELECT count(*) FROM events"),
        export_expected["durable_sequence"].to_string()
    );

    // Readers, replay and verify see exactly what schema 2 recorded.
    let root = Root::open(&root_dir).expect("root");
    for name in SESSIONS {
        let expected = read_json(&fixtures.join(format!("expected/{name}.json")));
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
            let expected = read_json(&fixtures.join(format!("expected/{name}.json")));
            assert_eq!(
                observed_session(&root, name),
                expected,
                "{name} after a writer opened {upgraded}"
            );
            verify_file(root.session_dir(&id(name))).expect("verify");
        }
    }

    // A writer appends; a reopened writer and a reader see it; a retry stays idempotent.
    for name in SESSIONS {
        let before = read_json(&fixtures.join(format!("expected/{name}.json")));
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
        let fork = format!("{name}-fork");
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
    let dependents = ["chain-b", "chain-c", "rewound", "chain-a-fork"];
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
