//! Reliability promise 6b (hostile input, the fuzzing side): every file of the committed seed
//! corpus (`fuzz/corpus/import/`, `fuzz/corpus/append_jsonl/`) replayed through the very
//! functions the `cargo fuzz` targets call (`fuzz/src/lib.rs`, included below), under
//! `catch_unwind`: no input may panic. Files named `ok-*` must import, `bad-*` must be
//! refused, `rebuilt-*` must import though their raw replay refuses them (an edited
//! derived index). Crashing inputs a fuzzer finds are added to the corpus, so this test keeps them
//! fixed on stable Rust without `cargo fuzz`.
//!
//! `write_seed_corpus` (ignored) regenerates the seed files from the library.

mod common;

#[path = "../fuzz/src/lib.rs"]
mod fuzz_logic;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::*;
use serde_json::{Value, json};
use session_store::{Batch, Event, ForkPoint, replay_file};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

/// Every file of one target's corpus, by name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir(target))
        .unwrap_or_else(|e| panic!("read the {target} corpus: {e}"))
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// Runs `f` on every file of `target`'s corpus; returns the reports and the panics.
fn replay_corpus<R>(target: &str, f: fn(&[u8]) -> R) -> (Vec<(String, R)>, Vec<String>) {
    let mut reports = Vec::new();
    let mut panics = Vec::new();
    for (name, bytes) in corpus(target) {
        match catch_unwind(AssertUnwindSafe(|| f(&bytes))) {
            Ok(report) => reports.push((name, report)),
            Err(p) => panics.push(format!("{target}/{name}: {}", panic_text(p.as_ref()))),
        }
    }
    (reports, panics)
}

#[test]
fn the_fuzz_seed_corpus_replays_without_a_panic() {
    let started = Instant::now();
    let (imports, mut panics) = replay_corpus("import", fuzz_logic::import_bytes);
    let (appends, append_panics) = replay_corpus("append_jsonl", fuzz_logic::append_jsonl);
    panics.extend(append_panics);

    let mut wrong = Vec::new();
    let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
    let (mut imported, mut replayed) = (0, 0);
    for (name, report) in &imports {
        match &report.import {
            Ok(_) => imported += 1,
            Err(kind) => *refusals.entry(kind.clone()).or_default() += 1,
        }
        replayed += usize::from(report.replay.is_ok());
        if name.starts_with("ok-") && (report.import.is_err() || report.replay.is_err()) {
            wrong.push(format!("import/{name} was refused: {report:?}"));
        }
        if name.starts_with("bad-") && report.import.is_ok() {
            wrong.push(format!("import/{name} was imported: {report:?}"));
        }
        // An export whose history or turn index alone was edited: its raw replay refuses
        // it, and an import builds the indexes anew (README); the import target took
        // that for a broken promise (outside testing N2, fuzzing).
        if name.starts_with("rebuilt-") && (report.import.is_err() || report.replay.is_ok()) {
            wrong.push(format!("import/{name} is not an edited index: {report:?}"));
        }
    }
    let mut batches = fuzz_logic::AppendReport::default();
    for (_, r) in &appends {
        batches.lines += r.lines;
        batches.unparsed += r.unparsed;
        batches.accepted += r.accepted;
        batches.retried += r.retried;
        batches.refused += r.refused;
        batches.events += r.events;
    }
    eprintln!(
        "fuzz_corpus: {} files replayed ({} import, {} append_jsonl) in {:.1?}, {} panics; \
         imports: {imported} accepted, {} refused {refusals:?}, raw replay ok for {replayed}; \
         batches: {} accepted ({} events), {} retried, {} refused, {} of {} lines not a batch",
        imports.len() + appends.len() + panics.len(),
        imports.len(),
        appends.len(),
        started.elapsed(),
        panics.len(),
        imports.len() - imported,
        batches.accepted,
        batches.events,
        batches.retried,
        batches.refused,
        batches.unparsed,
        batches.lines,
    );
    assert!(panics.is_empty(), "inputs that panic: {panics:#?}");
    assert!(wrong.is_empty(), "unexpected outcomes: {wrong:#?}");
    // The corpus is what it claims to be: both outcomes of both targets are exercised.
    assert!(
        imported >= 3 && imports.len() - imported >= 10,
        "{imports:?}"
    );
    assert!(
        batches.accepted >= 20
            && batches.retried > 0
            && batches.refused >= 10
            && batches.unparsed >= 5,
        "{batches:?}"
    );
}

// ---------------------------------------------------------------------------------------
// The seed corpus generator.

fn ev(kind: &str, payload: Value) -> Event {
    Event::new(kind).with_payload(&payload).unwrap()
}

fn msg(id: &str, role: &str, content: &str) -> Event {
    ev(
        "message/complete",
        json!({"message": {"id": id, "role": role, "content": content}}),
    )
}

/// A realistic little session: turns with messages, tool calls and results (one over
/// 64 KiB, stored as a zstd blob), a title, an interaction, todos, an optional event.
fn seed_batches() -> Vec<Batch> {
    let big = "line of tool output that repeats\n".repeat(2200); // ~70 KiB
    vec![
        Batch::new("title", vec![ev("session/title", json!({"title": "Seed"}))]),
        Batch::new(
            "t1-start",
            vec![
                Event::new("turn/start"),
                msg("u1", "user", "list the files"),
            ],
        )
        .in_turn("t1"),
        Batch::new(
            "t1-tool",
            vec![
                msg("a1", "assistant", "running ls"),
                ev(
                    "tool/call",
                    json!({"id": "c1", "name": "bash", "args": {"cmd": "ls"}}),
                ),
                ev("tool/start", json!({"id": "c1", "name": "bash"})),
            ],
        )
        .in_turn("t1"),
        Batch::new(
            "t1-result",
            vec![ev(
                "tool/result",
                json!({"id": "c1", "name": "bash", "output": big}),
            )],
        )
        .in_turn("t1"),
        Batch::new(
            "t1-end",
            vec![
                msg("a2", "assistant", "done"),
                ev("turn/end", json!({"status": "completed"})),
            ],
        )
        .in_turn("t1"),
        Batch::new(
            "t2",
            vec![
                Event::new("turn/start"),
                msg("u2", "user", "ask me"),
                ev(
                    "interaction/created",
                    json!({"id": "i1", "state": "pending"}),
                ),
                ev(
                    "interaction/resolved",
                    json!({"id": "i1", "state": "answered"}),
                ),
                ev(
                    "todo/write",
                    json!({"todos": [{"content": "x", "status": "pending"}]}),
                ),
                ev("future/telemetry", json!({"ms": 12})).optional(),
                ev("turn/end", json!({"status": "interrupted"})),
            ],
        )
        .in_turn("t2"),
    ]
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn jsonl(lines: &[Value]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// `depth` nested arrays around `0`.
fn nested(depth: usize) -> String {
    format!("{}0{}", "[".repeat(depth), "]".repeat(depth))
}

fn write_import_seeds(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let (tmp, root) = manual_root();
    let s = create(&root, "seed");
    for b in seed_batches() {
        s.append(b).unwrap();
    }
    s.close().unwrap();
    create(&root, "empty").close().unwrap();
    let fork = root
        .fork(
            &id("seed"),
            ForkPoint::AfterTurn("t1".into()),
            Some(id("fork")),
        )
        .unwrap();
    let export = |name: &str| {
        let path = tmp.path().join(format!("{name}.export"));
        root.export(&id(name), &path).unwrap();
        std::fs::read(path).unwrap()
    };
    let seed = export("seed");
    write_file(dir, "ok-export.sqlite", &seed);
    write_file(dir, "ok-export-empty-session.sqlite", &export("empty"));
    let raw = |id: &session_store::SessionId| {
        std::fs::read(root.session_dir(id).join("session.sqlite")).unwrap()
    };
    write_file(dir, "ok-closed-session-file.sqlite", &raw(&id("seed")));
    write_file(dir, "bad-fork-with-lineage.sqlite", &raw(&fork));

    write_file(dir, "bad-empty", b"");
    write_file(dir, "bad-text", b"this is not a database\n");
    let mut rng = fastrand::Rng::with_seed(6);
    let garbage: Vec<u8> = (0..4096).map(|_| rng.u8(..)).collect();
    write_file(dir, "bad-garbage-4k", &garbage);
    let mut header = b"SQLite format 3\0".to_vec();
    header.extend(garbage[..84].iter());
    write_file(dir, "bad-header-then-garbage", &header);
    write_file(dir, "bad-truncated-100", &seed[..100]);
    write_file(dir, "bad-truncated-first-page", &seed[..4096]);
    write_file(dir, "bad-truncated-half", &seed[..seed.len() / 2]);

    // Valid SQLite files that are not (or no longer) acceptable session files.
    let edit = |name: &str, sql: &str| {
        let path = tmp.path().join(name);
        std::fs::write(&path, &seed).unwrap();
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(sql)
            .unwrap();
        write_file(dir, name, &std::fs::read(&path).unwrap());
    };
    edit(
        "bad-foreign-application-id",
        "PRAGMA application_id = 1234;",
    );
    edit(
        "bad-user-version-plus-one",
        &format!(
            "PRAGMA user_version = {};",
            session_store::format::SCHEMA_VERSION + 1
        ),
    );
    edit(
        "bad-edited-payload",
        "UPDATE events SET payload = json_set(payload, '$.title', 'forged') \
         WHERE kind = 'session/title';",
    );
    edit(
        "bad-commit-deleted",
        "DELETE FROM commits WHERE first_seq = 1;",
    );
    let plain = tmp.path().join("plain.sqlite");
    rusqlite::Connection::open(&plain)
        .unwrap()
        .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1), ('two');")
        .unwrap();
    write_file(dir, "bad-plain-sqlite", &std::fs::read(&plain).unwrap());

    // A few flipped bytes in a page past the first: refused or harmless.
    let pages = seed.len() / 4096;
    for n in 1..=6 {
        let mut copy = seed.clone();
        let page = rng.usize(1..pages);
        for _ in 0..n.min(4) {
            let at = page * 4096 + rng.usize(..4096);
            copy[at] ^= 1 << rng.u8(..8);
        }
        write_file(dir, &format!("flip-{n}-page-{page}"), &copy);
    }
    drop(root);
}

fn write_append_seeds(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let valid: Vec<Value> = seed_batches()
        .iter()
        .map(|b| serde_json::to_value(b).unwrap())
        .collect();
    write_file(dir, "ok-turns.jsonl", jsonl(&valid).as_bytes());
    write_file(dir, "empty.jsonl", b"");

    let mut rng = fastrand::Rng::with_seed(7);
    let words = [
        "alpha", "beta", "gamma", "delta", "ls", "-la", "/tmp", "ok", "404",
    ];
    let output: Vec<&str> = (0..16_000)
        .map(|_| words[rng.usize(..words.len())])
        .collect();
    write_file(
        dir,
        "blob-70k.jsonl",
        jsonl(&[
            json!({"operation_id": "b1", "turn_id": "t", "events": [{"kind": "turn/start"},
                {"kind": "tool/start", "payload": {"id": "c", "name": "bash"}}]}),
            json!({"operation_id": "b2", "turn_id": "t", "events": [{"kind": "tool/result",
                "payload": {"id": "c", "name": "bash", "output": output.join(" ")}}]}),
            json!({"operation_id": "b3", "turn_id": "t", "events": [{"kind": "turn/end",
                "payload": {"status": "completed"}}]}),
        ])
        .as_bytes(),
    );

    let mut invalid = [
        r#"{"#,
        "not json",
        r#"{"operation_id": 5, "events": []}"#,
        r#"{"events": [{"kind": "x", "optional": true}]}"#,
        "[1, 2, 3]",
        r#"{"operation_id": "a", "events": [{"kind": "x", "payload": }]}"#,
        r#"{"operation_id": "a", "events": []} trailing"#,
        r#"{"operation_id": "a", "events": [{"kind": "x", "optional": "yes"}]}"#,
        r#"{"operation_id": "a", "events": [{"kind": "x", "seq": -1}]}"#,
        r#"{"operation_id": "a", "events": [{"kind": "x", "seq": 18446744073709551616}]}"#,
        r#"{"operation_id": "a\ud800", "events": []}"#,
        r#"{"operation_id": "ok", "events": [{"kind": "session/title", "payload": {"title": "t"}}]}"#,
    ]
    .join("\n")
    .into_bytes();
    invalid.extend(b"\n{\"operation_id\": \"\xff\xfe\", \"events\": []}\n");
    write_file(dir, "invalid-json.jsonl", &invalid);

    let deep = |depth: usize, op: &str| {
        format!(
            r#"{{"operation_id":"{op}","events":[{{"kind":"x/deep","optional":true,"payload":{}}}]}}"#,
            nested(depth)
        )
    };
    let deep_message = format!(
        r#"{{"operation_id":"m","events":[{{"kind":"message/complete","payload":{{"message":{{"id":"m","role":"user","content":{}}}}}}}]}}"#,
        nested(100)
    );
    write_file(
        dir,
        "deep-nesting.jsonl",
        [
            deep(100, "d100"),
            deep(126, "d126"),
            deep(200, "d200"),
            deep(10_000, "d10000"),
            deep_message,
        ]
        .join("\n")
        .as_bytes(),
    );

    write_file(
        dir,
        "huge-numbers.jsonl",
        [
            r#"{"operation_id":"n1","events":[{"kind":"x/n","optional":true,"payload":{"a":1e400,"b":-1e400,"c":123456789012345678901234567890123}}]}"#,
            r#"{"operation_id":"n2","events":[{"kind":"plan/state","payload":{"steps":18446744073709551616,"neg":-9223372036854775809,"f":1.7976931348623157e309}}]}"#,
            r#"{"operation_id":"n3","events":[{"kind":"session/title","payload":{"title":1e5}}]}"#,
            r#"{"operation_id":"n4","events":[{"kind":"x/n","seq":18446744073709551615,"optional":true}]}"#,
            r#"{"operation_id":"n5","events":[{"kind":"goal/state","payload":{"n":0.0000000000000000000000000001,"m":-0}}]}"#,
        ]
        .join("\n")
        .as_bytes(),
    );

    let title = |op: &str, t: &str| {
        json!({"operation_id": op, "events": [
        {"kind": "session/title", "payload": {"title": t}}]})
    };
    write_file(
        dir,
        "duplicate-ops.jsonl",
        jsonl(&[
            title("dup", "first"),
            title("dup", "first"),
            title("dup", "second"),
            json!({"operation_id": "dup", "turn_id": "t", "events": [
                {"kind": "session/title", "payload": {"title": "first"}}]}),
            json!({"operation_id": "ids", "events": [
                {"kind": "session/title", "id": "e1", "payload": {"title": "a"}},
                {"kind": "session/title", "id": "e1", "payload": {"title": "b"}}]}),
            json!({"operation_id": "ids2", "events": [
                {"kind": "session/title", "id": "e1", "payload": {"title": "c"}}]}),
            title("dup", "first"),
        ])
        .as_bytes(),
    );

    let kind = |op: &str, k: &str| json!({"operation_id": op, "events": [{"kind": k}]});
    write_file(
        dir,
        "unknown-kinds.jsonl",
        jsonl(&[
            kind("k1", "future/kind"),
            kind("k2", " turn/start "),
            kind("k3", ""),
            kind("k4", "x\u{0}y"),
            kind("k5", "Message/Complete"),
            kind("k6", "turn/start\n"),
            json!({"operation_id": "k7", "events": [{"kind": "diagnostic", "payload": [1, 2]}]}),
            kind("k8", "turn/start"),
        ])
        .as_bytes(),
    );

    write_file(
        dir,
        "optional-events.jsonl",
        jsonl(&[
            json!({"operation_id": "o1", "events": [
                {"kind": "future/a", "optional": true, "payload": {"any": [null, true, "x"]}},
                {"kind": "future/b", "optional": true}]}),
            json!({"operation_id": "o2", "events": [
                {"kind": "tool/result", "optional": true, "payload": "not an object"}]}),
            json!({"operation_id": "o3", "events": [
                {"kind": "message/complete", "optional": true, "payload": {"message": {}}}]}),
            json!({"operation_id": "o4", "events": [
                {"kind": "session/title", "payload": {"title": "kept"}},
                {"kind": "", "optional": true, "payload": ""}]}),
        ])
        .as_bytes(),
    );

    let long = "o".repeat(1000);
    write_file(
        dir,
        "bad-ids.jsonl",
        jsonl(&[
            title("", "empty op"),
            title("   ", "blank op"),
            title("inherit:x:y", "inherited op"),
            title(&long, "long op"),
            title("nul\u{0}op", "nul op"),
            json!({"operation_id": "t-empty", "turn_id": "", "events": [{"kind": "turn/start"}]}),
            json!({"operation_id": "t-nul", "turn_id": "a\u{0}b", "events": [{"kind": "turn/start"}]}),
            json!({"operation_id": "e-derived", "events": [
                {"kind": "session/title", "id": "abc.0", "payload": {"title": "x"}}]}),
            json!({"operation_id": "e-blank", "events": [
                {"kind": "session/title", "id": " ", "payload": {"title": "y"}}]}),
            json!({"operation_id": "m-noid", "events": [
                {"kind": "message/complete", "payload": {"message": {"role": "user", "content": "x"}}}]}),
        ])
        .as_bytes(),
    );

    write_file(
        dir,
        "turn-protocol.jsonl",
        jsonl(&[
            json!({"operation_id": "p1", "events": [{"kind": "turn/end", "payload": {"status": "completed"}}]}),
            json!({"operation_id": "p2", "turn_id": "t", "events": [{"kind": "turn/start"}, {"kind": "turn/start"}]}),
            json!({"operation_id": "p3", "turn_id": "t", "events": [{"kind": "turn/start"}]}),
            json!({"operation_id": "p4", "turn_id": "u", "events": [{"kind": "turn/start"}]}),
            json!({"operation_id": "p5", "turn_id": "t", "events": [
                {"kind": "tool/result", "payload": {"id": "nope", "name": "bash"}}]}),
            json!({"operation_id": "p6", "turn_id": "t", "events": [
                {"kind": "interaction/resolved", "payload": {"id": "nope", "state": "answered"}}]}),
            json!({"operation_id": "p7", "turn_id": "t", "events": [
                {"kind": "turn/end", "payload": {"status": "maybe"}}]}),
            json!({"operation_id": "p8", "turn_id": "t", "events": [
                {"kind": "turn/end", "payload": {"status": "completed"}}]}),
            json!({"operation_id": "p9", "turn_id": "t", "events": [
                {"kind": "message/complete", "payload": {"message": {"id": "late", "role": "user"}}}]}),
        ])
        .as_bytes(),
    );

    let mut crlf = String::from("\r\n   \n\t\n");
    for v in &valid[..3] {
        crlf.push_str(&format!("{v}\r\n\r\n"));
    }
    write_file(dir, "crlf-and-blank-lines.jsonl", crlf.as_bytes());
}

#[test]
#[ignore = "regenerates fuzz/corpus/ seed files; run by hand"]
fn write_seed_corpus() {
    write_import_seeds(&corpus_dir("import"));
    write_append_seeds(&corpus_dir("append_jsonl"));
    let replayed = replay_file(corpus_dir("import").join("ok-export.sqlite")).unwrap();
    eprintln!(
        "seed corpus written: ok-export.sqlite has {} commits",
        replayed.commits.len()
    );
}
