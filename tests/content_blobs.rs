//! Content parts: string values of a payload over the inline threshold stored once per
//! file in the blob table (a tool output written in `tool/result` and in the tool message
//! is stored once), read back byte for byte; the threshold setting; what the `sqlite3`
//! shell shows; hostile files; export, import, fork and materialisation.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{id, message};
use rusqlite::Connection;
use serde_json::Value;
use session_store::format::{DEFAULT_INLINE_THRESHOLD, MAX_INLINE_THRESHOLD, MIN_INLINE_THRESHOLD};
use session_store::{
    Batch, CancelToken, Error, Event, ForkPoint, ImportOptions, Root, StoreOptions,
};

fn root_with(dir: &Path, threshold: usize) -> Root {
    Root::with_options(
        dir.join("sessions"),
        StoreOptions::default().with_inline_threshold(threshold),
    )
    .expect("root")
}

/// About `bytes` bytes of text that compresses like a tool's output: build and test log
/// lines with paths, counters and timings, varied by `seed`.
fn tool_output(seed: u64, bytes: usize) -> String {
    const WORDS: [&str; 12] = [
        "Compiling",
        "Checking",
        "warning:",
        "unused",
        "variable",
        "test",
        "ok",
        "FAILED",
        "src/store/read.rs",
        "src/model/event.rs",
        "finished",
        "running",
    ];
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = String::with_capacity(bytes + 128);
    let mut line = 0u32;
    while out.len() < bytes {
        let words: Vec<&str> = (0..rng.usize(3..9))
            .map(|_| WORDS[rng.usize(..WORDS.len())])
            .collect();
        out.push_str(&format!(
            "{line:04} [{}.{:03}s] {} (crate-{} v0.{}.{}) \"{}\"\t{}%\n",
            rng.u32(0..60),
            rng.u32(0..1000),
            words.join(" "),
            rng.u32(0..40),
            rng.u32(0..9),
            rng.u32(0..20),
            seed,
            rng.u32(0..100)
        ));
        line += 1;
    }
    out.truncate(bytes);
    out
}

/// Agent turn `n` with this tool output ([`common::tool_turn`]).
fn tool_turn(n: u64, output: &str) -> Batch {
    common::tool_turn(&format!("op-{n}"), &format!("turn-{n}"), output)
}

fn file_of(root: &Root, name: &str) -> PathBuf {
    root.session_dir(&id(name)).join("session.sqlite")
}

fn count(file: &Path, sql: &str) -> i64 {
    Connection::open(file)
        .expect("open")
        .query_row(sql, [], |r| r.get(0))
        .expect("query")
}

/// Every payload of a session as read back, in order.
fn payloads(root: &Root, name: &str) -> Vec<Option<String>> {
    root.open_reader(&id(name))
        .expect("reader")
        .all_commits()
        .expect("replay")
        .into_iter()
        .flat_map(|c| c.events)
        .map(|e| e.payload_str().map(str::to_owned))
        .collect()
}

/// Writes `turns` tool turns (one output each) to a new session `name` and closes it.
fn write_turns(root: &Root, name: &str, outputs: &[String]) {
    let s = root
        .create(session_store::CreateOptions::with_id(id(name)))
        .expect("create");
    for (n, output) in outputs.iter().enumerate() {
        s.append(tool_turn(n as u64, output)).expect("append");
    }
    s.close().expect("close");
}

#[test]
fn a_tool_output_is_stored_once_across_tool_result_and_the_tool_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = root_with(dir.path(), DEFAULT_INLINE_THRESHOLD);
    let output = tool_output(1, 20_000);
    write_turns(&root, "once", std::slice::from_ref(&output));
    let file = file_of(&root, "once");
    assert_eq!(count(&file, "SELECT count(*) FROM blobs"), 1);
    assert_eq!(
        count(
            &file,
            "SELECT count(*) FROM events WHERE payload_parts IS NOT NULL"
        ),
        2
    );
    // Inline text and blob data together: well under the output once (it compresses).
    let stored = count(
        &file,
        "SELECT (SELECT sum(length(CAST(payload AS BLOB))) FROM events)
              + (SELECT sum(length(data)) FROM blobs)",
    );
    assert!(
        (stored as usize) < output.len() / 2,
        "{stored} stored for a {} byte output written twice",
        output.len()
    );
    // Read back byte for byte, and the projection sees the tool message whole.
    let back = payloads(&root, "once");
    let tool_result = back[4].as_deref().expect("tool/result payload");
    let v: Value = serde_json::from_str(tool_result).expect("json");
    assert_eq!(v["output"], output);
    let tool_message: Value =
        serde_json::from_str(back[5].as_deref().expect("message")).expect("json");
    assert_eq!(tool_message["message"]["content"], output);
    root.open_reader(&id("once"))
        .expect("reader")
        .projection()
        .expect("projection");
    session_store::verify_file(&file).expect("verify");
}

#[test]
fn payloads_round_trip_byte_exact_around_the_threshold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = MIN_INLINE_THRESHOLD;
    let root = root_with(dir.path(), t);
    let long = |n: usize| "a".repeat(n);
    // Raw (escaped) lengths: t - 1, t (inline) and t + 1 (out); escapes, a surrogate
    // pair, raw UTF-8, \u0000, a key over the threshold (keys stay inline), whitespace
    // kept as written, a placeholder-looking string that is not a part.
    let escaped = format!(
        "{}\\\"\\\\\\u0000\\ud83d\\ude00\\n\\t\\/é漢🦀",
        "e".repeat(t)
    );
    let texts = [
        format!("{{\"k\":\"{}\"}}", long(t - 1)),
        format!("{{\"k\":\"{}\"}}", long(t)),
        format!("{{\"k\":\"{}\"}}", long(t + 1)),
        format!(
            "{{ \"{}\" :\n  \"{escaped}\" ,\"b\":[\"{escaped}\", 1, null]}}",
            long(t + 5)
        ),
        format!("\"{}\"", long(t + 1)),
        format!(
            "{{\"fake\":\"sse-blob:{}\",\"real\":\"{}\"}}",
            "0".repeat(64),
            long(t + 9)
        ),
    ];
    let s = root
        .create(session_store::CreateOptions::with_id(id("exact")))
        .expect("create");
    let events: Vec<Event> = texts
        .iter()
        .map(|t| {
            Event::new("x/custom")
                .optional()
                .with_payload_json(t)
                .expect("json")
        })
        .collect();
    s.append(Batch::new("op", events)).expect("append");
    s.close().expect("close");
    let back: Vec<String> = payloads(&root, "exact").into_iter().flatten().collect();
    assert_eq!(back, texts);
    let file = file_of(&root, "exact");
    let parts: Vec<Option<String>> = Connection::open(&file)
        .expect("open")
        .prepare("SELECT payload_parts FROM events ORDER BY seq")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<rusqlite::Result<_>>()
        .expect("rows");
    assert_eq!(
        parts,
        [
            None,
            None,
            Some("[5]".to_owned()),
            // Two equal escaped values, one blob; the long key stays inline.
            Some(format!("[{},{}]", t + 14, t + 14 + 75 + 7)),
            Some("[0]".to_owned()),
            Some("[91]".to_owned()),
        ]
    );
    // a+1, the escaped value once, the bare string (same bytes as a+1), the real one.
    assert_eq!(count(&file, "SELECT count(*) FROM blobs"), 3);
    session_store::verify_file(&file).expect("verify");
}

#[test]
fn the_threshold_is_a_checked_setting() {
    let dir = tempfile::tempdir().expect("tempdir");
    for bad in [0, MIN_INLINE_THRESHOLD - 1, MAX_INLINE_THRESHOLD + 1] {
        let options = StoreOptions::default().with_inline_threshold(bad);
        match Root::with_options(dir.path().join("bad"), options) {
            Err(Error::InvalidInput { what: m, .. }) => {
                assert!(m.contains("inline threshold"), "{m}");
                assert!(m.contains(&MIN_INLINE_THRESHOLD.to_string()), "{m}");
            }
            Err(e) => panic!("{bad}: {e}"),
            Ok(_) => panic!("{bad} accepted"),
        }
    }
    assert!(
        !dir.path().join("bad").exists(),
        "a refused root creates nothing"
    );
    // A higher threshold keeps a 20 KB output inline; the default stores it once.
    let output = tool_output(2, 20_000);
    let high = root_with(&dir.path().join("high"), MAX_INLINE_THRESHOLD);
    write_turns(&high, "s", std::slice::from_ref(&output));
    let file = file_of(&high, "s");
    assert_eq!(count(&file, "SELECT count(*) FROM blobs"), 0);
    assert_eq!(
        count(
            &file,
            "SELECT count(*) FROM events WHERE payload_parts IS NOT NULL"
        ),
        0
    );
    let low = root_with(&dir.path().join("low"), DEFAULT_INLINE_THRESHOLD);
    write_turns(&low, "s", std::slice::from_ref(&output));
    assert_eq!(payloads(&high, "s"), payloads(&low, "s"));
    // A chat message (~400 B) stays inline at the smallest threshold that keeps it.
    let chat = root_with(&dir.path().join("chat"), 512);
    let s = chat
        .create(session_store::CreateOptions::with_id(id("c")))
        .expect("create");
    s.append(Batch::new(
        "op",
        vec![message("m", "user", &"w ".repeat(200))],
    ))
    .expect("append");
    s.close().expect("close");
    assert_eq!(count(&file_of(&chat, "c"), "SELECT count(*) FROM blobs"), 0);
}

#[test]
fn the_sqlite3_shell_shows_where_a_body_lives() {
    let shell = Path::new("/usr/bin/sqlite3");
    if !shell.exists() {
        eprintln!("skipped: /usr/bin/sqlite3 is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = root_with(dir.path(), DEFAULT_INLINE_THRESHOLD);
    let output = tool_output(3, 10_000);
    write_turns(&root, "shell", std::slice::from_ref(&output));
    let digest = {
        use sha2::Digest;
        let raw = serde_json::to_string(&output).expect("json");
        hex(&sha2::Sha256::digest(&raw.as_bytes()[1..raw.len() - 1]))
    };
    let out = Command::new(shell)
        .arg(file_of(&root, "shell"))
        .arg(
            "SELECT json_extract(payload, '$.output') FROM events WHERE kind = (SELECT code FROM event_kinds WHERE kind = 'tool/result');
             SELECT body FROM event_log WHERE kind IN ('tool/result', 'turn/end') ORDER BY seq;
             SELECT role || ' ' || content_in FROM transcript ORDER BY seq;",
        )
        .output()
        .expect("sqlite3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "sse-blob:{digest}\ninline, 1 parts in blobs\ninline\n\
             user inline\ntool part {digest}\nassistant inline\n"
        )
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Damaged content parts are `Corrupt` for a reader and for `verify`, which names the
/// damage as the reader does (it said "content part <64 bytes of the payload> is
/// malformed or its blob is missing", or with nothing between "part" and "is").
#[test]
fn hostile_parts_read_as_corrupt_and_fail_verify() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = root_with(dir.path(), DEFAULT_INLINE_THRESHOLD);
    let output = tool_output(4, 8_000);
    let edits = [
        (
            "missing",
            "DELETE FROM blobs",
            "event 5 references missing content blob",
        ),
        (
            "offset",
            "UPDATE events SET payload_parts = '[3]' WHERE kind = (SELECT code FROM event_kinds WHERE kind = 'tool/result')",
            "event 5: no content placeholder at offset 3",
        ),
        (
            "order",
            "UPDATE events SET payload_parts = '[9999999]' WHERE kind = (SELECT code FROM event_kinds WHERE kind = 'tool/result')",
            "event 5: content part offset 9999999 is out of order or out of bounds",
        ),
        (
            "unparsed",
            "UPDATE events SET payload_parts = 'seven' WHERE kind = (SELECT code FROM event_kinds WHERE kind = 'tool/result')",
            "event 5: payload_parts is not a list of offsets",
        ),
        (
            "tampered",
            "UPDATE blobs SET encoding = 'identity', data = CAST(zeroblob(bytes) AS BLOB)",
            "digest",
        ),
        (
            "no-payload",
            "UPDATE events SET payload = NULL WHERE kind = (SELECT code FROM event_kinds WHERE kind = 'tool/result')",
            "content part",
        ),
    ];
    for (name, _, _) in &edits {
        write_turns(&root, name, std::slice::from_ref(&output));
    }
    for (name, sql, says) in &edits {
        let file = file_of(&root, name);
        let conn = Connection::open(&file).expect("open");
        assert!(conn.execute(sql, []).expect(sql) > 0, "{sql}");
        drop(conn);
        // The reader names the event; it never panics.
        match root.open_reader(&id(name)).and_then(|r| r.all_commits()) {
            Err(e @ Error::Corrupt { .. }) => {
                assert!(e.to_string().contains("event 5"), "{name}: {e}");
            }
            other => panic!("{name}: {other:?}"),
        }
        match session_store::verify_file(&file) {
            Err(e @ Error::Corrupt { .. }) => {
                assert!(e.to_string().contains(says), "{name}: {e}")
            }
            other => panic!("{name}: {other:?}"),
        }
        let out = Command::new(env!("CARGO_BIN_EXE_session-store"))
            .arg("--root")
            .arg(root.path())
            .args(["verify", name])
            .env_remove("SESSION_STORE_ROOT")
            .output()
            .expect("cli");
        assert_eq!(
            out.status.code(),
            Some(6),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dest = dir.path().join(format!("{name}.export"));
        assert!(matches!(
            root.export(&id(name), &dest),
            Err(Error::Corrupt { .. })
        ));
        assert!(!dest.exists());
    }
}

#[test]
fn export_import_fork_and_materialisation_keep_content_readable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = root_with(dir.path(), DEFAULT_INLINE_THRESHOLD);
    let outputs: Vec<String> = (0..3).map(|n| tool_output(10 + n, 6_000)).collect();
    write_turns(&root, "parent", &outputs);
    let original = payloads(&root, "parent");

    let export = dir.path().join("parent.sqlite");
    root.export(&id("parent"), &export).expect("export");
    assert_eq!(count(&export, "SELECT count(*) FROM blobs"), 3);
    session_store::verify_file(&export).expect("verify export");
    let other = root_with(&dir.path().join("other"), DEFAULT_INLINE_THRESHOLD);
    other
        .import(&export, ImportOptions::default())
        .expect("import");
    assert_eq!(payloads(&other, "parent"), original);
    assert_eq!(
        count(&file_of(&other, "parent"), "SELECT count(*) FROM blobs"),
        3
    );

    let child = root
        .fork(
            &id("parent"),
            ForkPoint::AfterTurn("turn-1".into()),
            Some(id("child")),
        )
        .expect("fork");
    let s = root.open_writer(&child).expect("writer");
    s.append(tool_turn(7, &outputs[0])).expect("append");
    s.close().expect("close");
    let before = payloads(&root, "child");
    // The child's own turn reuses the output: stored once in the child's file.
    assert_eq!(
        count(&file_of(&root, "child"), "SELECT count(*) FROM blobs"),
        1
    );
    root.delete(&id("parent"), &CancelToken::new())
        .expect("delete");
    assert_eq!(payloads(&root, "child"), before);
    assert_eq!(&before[..16], &original[..16]);
    // Materialised: turns 0 and 1 copied in, output 0 still stored once.
    assert_eq!(
        count(&file_of(&root, "child"), "SELECT count(*) FROM blobs"),
        2
    );
    session_store::verify_file(file_of(&root, "child")).expect("verify child");
}

#[test]
fn a_schema_2_file_upgrades_on_writer_open_and_stores_new_content_as_parts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("sessions").join("blobs");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/schema2/root/blobs/session.sqlite");
    std::fs::copy(fixture, folder.join("session.sqlite")).expect("copy");
    let root = root_with(dir.path(), DEFAULT_INLINE_THRESHOLD);
    let file = file_of(&root, "blobs");
    let before = payloads(&root, "blobs");
    assert_eq!(count(&file, "PRAGMA user_version"), 2);
    let whole_blobs = count(
        &file,
        "SELECT count(*) FROM events WHERE payload_ref IS NOT NULL",
    );
    assert!(whole_blobs > 0, "the fixture has payloads over 64 KiB");

    // A reader open (its statements prepared) on the schema-2 file while a writer
    // upgrades it and appends parts reads the new commits whole.
    let reader = root.open_reader(&id("blobs")).expect("reader");
    let old_commits = reader.all_commits().expect("replay").len();
    let s = root.open_writer(&id("blobs")).expect("writer");
    let output = tool_output(5, 5_000);
    s.append(tool_turn(100, &output)).expect("append");
    s.flush().expect("flush");
    let commits = reader.all_commits().expect("replay after the upgrade");
    assert_eq!(commits.len(), old_commits + 1);
    let last = commits.last().expect("commits").events[4]
        .payload_str()
        .expect("payload");
    let v: Value = serde_json::from_str(last).expect("json");
    assert_eq!(v["output"], output);
    s.close().expect("close");
    assert_eq!(
        count(&file, "PRAGMA user_version"),
        session_store::format::SCHEMA_VERSION
    );
    assert_eq!(
        count(
            &file,
            "SELECT count(*) FROM events WHERE payload_parts IS NOT NULL"
        ),
        2
    );
    let after = payloads(&root, "blobs");
    assert_eq!(&after[..before.len()], &before[..]);
    let tool_result: Value =
        serde_json::from_str(after[before.len() + 4].as_deref().expect("payload")).expect("json");
    assert_eq!(tool_result["output"], output);
    session_store::verify_file(&file).expect("verify");
    let stats = root.stats(&id("blobs")).expect("stats");
    let kind = |k: &str| {
        stats
            .kinds
            .iter()
            .find(|s| s.kind == k)
            .expect("kind")
            .clone()
    };
    assert_eq!(kind("tool/result").content_parts, 1);
    assert_eq!(kind("tool/result").blob_events as i64, whole_blobs / 2);
    assert_eq!(
        stats.blobs.count as i64,
        count(&file, "SELECT count(*) FROM blobs")
    );
}

#[tokio::test]
async fn history_pages_return_messages_whose_content_is_a_part() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = root_with(dir.path(), DEFAULT_INLINE_THRESHOLD);
    let outputs: Vec<String> = (0..2).map(|n| tool_output(20 + n, 3_000)).collect();
    write_turns(&root, "history", &outputs);
    let service = session_store::Service::new("local", root).expect("service");
    let r = session_store::SessionRef::new("local", "history").expect("ref");
    let page = service
        .query()
        .history_page(&r, None, 100)
        .await
        .expect("page");
    let tools: Vec<Value> = page
        .messages
        .iter()
        .filter(|m| m.role.as_deref() == Some("tool"))
        .map(|m| {
            assert!(m.content_ref.is_none(), "under 64 KiB: inline");
            serde_json::from_str(m.inline.as_ref().expect("inline").json()).expect("json")
        })
        .collect();
    assert_eq!(tools.len(), 2);
    for (message, output) in tools.iter().zip(&outputs) {
        assert_eq!(&message["content"], output);
    }
}

/// Bytes on disk of a closed session file (with its WAL, if one is left), and the bytes of
/// its `checkpoint` table (`dbstat`).
fn disk_bytes(file: &Path) -> (u64, u64) {
    let wal = PathBuf::from(format!("{}-wal", file.display()));
    let total = std::fs::metadata(file).expect("file").len()
        + std::fs::metadata(wal).map_or(0, |m| m.len());
    let checkpoint = count(
        file,
        "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = 'checkpoint'",
    );
    (total, checkpoint as u64)
}

/// The measurement behind [`DEFAULT_INLINE_THRESHOLD`]: bytes on disk over the same
/// events as JSON Lines for `SSE_TURNS` (default 1,000) agent turns with 2-40 KB tool
/// outputs, each in `tool/result` and the tool message, at several thresholds; and
/// 20,000 chat messages of ~400 B. Run with
/// `cargo test --release --test content_blobs -- --ignored --nocapture`.
#[test]
#[ignore = "measurement, prints a table"]
fn measure_bytes_on_disk_by_threshold() {
    let turns: u64 = std::env::var("SSE_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    for (low, high) in [(2_000, 40_000), (256, 4_096)] {
        measure_tool_turns(turns, low, high);
    }
    // Chat: 20,000 messages of ~400 B, two per turn; they stay inline at every threshold.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = root_with(dir.path(), 1024);
    let s = root
        .create(session_store::CreateOptions::with_id(id("chat")))
        .expect("create");
    let mut jsonl = 0usize;
    for n in 0..10_000u64 {
        let text = |who: &str| {
            let mut t = format!("{who} {n}: ");
            while t.len() < 400 {
                t.push_str(WORDS_400[(n as usize + t.len()) % WORDS_400.len()]);
                t.push(' ');
            }
            t
        };
        let batch = Batch::new(
            format!("op-{n}"),
            vec![
                message(&format!("u{n}"), "user", &text("user")),
                message(&format!("a{n}"), "assistant", &text("assistant")),
            ],
        );
        jsonl += batch
            .events
            .iter()
            .map(|e| serde_json::to_string(e).expect("json").len() + 1)
            .sum::<usize>();
        s.append(batch).expect("append");
    }
    s.close().expect("close");
    let file = file_of(&root, "chat");
    let (total, checkpoint) = disk_bytes(&file);
    println!(
        "chat 20,000 x ~400 B at 1 KiB: file {total} B = {:.3}x JSONL ({:.3}x without the \
         checkpoint table), {} blobs",
        total as f64 / jsonl as f64,
        (total - checkpoint) as f64 / jsonl as f64,
        count(&file, "SELECT count(*) FROM blobs")
    );
}

/// Prints bytes on disk over JSON Lines for `turns` agent turns with outputs of `low` to
/// `high` bytes, at 1, 2, 4 and 64 KiB thresholds.
fn measure_tool_turns(turns: u64, low: usize, high: usize) {
    let mut rng = fastrand::Rng::with_seed(12);
    let outputs: Vec<String> = (0..turns)
        .map(|n| tool_output(1000 + n, rng.usize(low..=high)))
        .collect();
    let jsonl: usize = outputs
        .iter()
        .enumerate()
        .flat_map(|(n, o)| tool_turn(n as u64, o).events)
        .map(|e| serde_json::to_string(&e).expect("json").len() + 1)
        .sum();
    let raw: usize = outputs.iter().map(String::len).sum();
    let zstd: usize = outputs
        .iter()
        .map(|o| zstd::bulk::compress(o.as_bytes(), 1).expect("zstd").len())
        .sum();
    println!(
        "{turns} agent turns, outputs {low}-{high} B: total {raw} B (zstd-1 {:.2}x smaller), JSON Lines {jsonl} B",
        raw as f64 / zstd as f64
    );
    println!(
        "threshold  file bytes  / JSONL  without checkpoint table  / JSONL  blobs  write+close  replay"
    );
    for threshold in [1024, 2048, 4096, MAX_INLINE_THRESHOLD] {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = root_with(dir.path(), threshold);
        let started = std::time::Instant::now();
        write_turns(&root, "m", &outputs);
        let written = started.elapsed();
        let started = std::time::Instant::now();
        assert_eq!(payloads(&root, "m").len(), outputs.len() * 8);
        let read = started.elapsed();
        let file = file_of(&root, "m");
        let (total, checkpoint) = disk_bytes(&file);
        println!(
            "{threshold:>9}  {total:>10}  {:>6.3}  {:>24}  {:>6.3}  {:>5}  {:>5} ms  {:>4} ms",
            total as f64 / jsonl as f64,
            total - checkpoint,
            (total - checkpoint) as f64 / jsonl as f64,
            count(&file, "SELECT count(*) FROM blobs"),
            written.as_millis(),
            read.as_millis()
        );
    }
}

const WORDS_400: [&str; 9] = [
    "the",
    "build",
    "passes",
    "now",
    "with",
    "one",
    "warning",
    "about",
    "lifetimes",
];

/// A crafted blob that would make a reader decompress far more than its few kilobytes is
/// refused before it is decompressed, naming the session and the digest, by a read and by
/// `verify`: a zstd frame that does not declare its size (this store writes none; one of
/// 25 KB holding 800 MB of zeros under a row declaring them was decompressed whole before
/// its digest failed) and a content part declaring more than the 64 KiB a part can hold
/// (a part is a string of a payload stored inline).
#[test]
fn crafted_blobs_are_refused_before_they_are_decompressed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = root_with(dir.path(), DEFAULT_INLINE_THRESHOLD);
    // One output over 64 KiB (its payloads stored whole), one a part.
    write_turns(
        &root,
        "crafted",
        &[tool_output(7, 100_000), tool_output(8, 20_000)],
    );
    let file = file_of(&root, "crafted");
    let conn = Connection::open(&file).expect("open");
    let digest_of = |sql: &str| -> String { conn.query_row(sql, [], |r| r.get(0)).expect(sql) };
    let whole = digest_of("SELECT payload_ref FROM events WHERE payload_ref IS NOT NULL LIMIT 1");
    let part = digest_of(
        "SELECT digest FROM blobs WHERE digest NOT IN \
         (SELECT payload_ref FROM events WHERE payload_ref IS NOT NULL) LIMIT 1",
    );
    let zeros = 50_000_000u64;
    let unsized_frame =
        zstd::stream::encode_all(std::io::Read::take(std::io::repeat(0), zeros), 1).expect("zstd");
    let sized_frame = zstd::bulk::compress(&vec![0u8; 1_000_000], 1).expect("zstd");
    let cases = [
        (
            &whole,
            unsized_frame,
            zeros,
            "is no zstd frame that declares its size",
        ),
        (
            &part,
            sized_frame,
            1_000_000,
            "claims 1000000 bytes, more than the 65536 a content part may hold",
        ),
    ];
    for (digest, data, bytes, reason) in cases {
        let kept: (i64, Vec<u8>) = conn
            .query_row(
                "SELECT bytes, data FROM blobs WHERE digest = ?1",
                [digest],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("blob");
        conn.execute(
            "UPDATE blobs SET bytes = ?1, data = ?2 WHERE digest = ?3",
            rusqlite::params![bytes as i64, data, digest],
        )
        .expect("edit");
        let read = root
            .open_reader(&id("crafted"))
            .expect("reader")
            .all_commits()
            .unwrap_err();
        let verified = root.verify(&id("crafted")).unwrap_err();
        for e in [read, verified] {
            assert!(e.is_corrupt(), "{e:?}");
            assert!(
                e.to_string()
                    .contains(&format!("session crafted: blob {digest} {reason}")),
                "{e}"
            );
        }
        conn.execute(
            "UPDATE blobs SET bytes = ?1, data = ?2 WHERE digest = ?3",
            rusqlite::params![kept.0, kept.1, digest],
        )
        .expect("restore");
    }
    root.verify(&id("crafted")).expect("sound again");
}

/// A blob row whose declared `bytes` is not what its zstd data holds (fewer, more, about a
/// gigabyte, or past the largest blob) is `Corrupt` naming the session and the digest with
/// both sizes (zstd's "Destination buffer is too small: … bytes needed" before, or a digest
/// mismatch after a buffer of the declared size was made), by a read and by `verify`.
#[test]
fn a_blob_declaring_another_size_is_corrupt_naming_the_session_and_digest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = root_with(dir.path(), DEFAULT_INLINE_THRESHOLD);
    write_turns(&root, "sized", &[tool_output(6, 20_000)]);
    let file = file_of(&root, "sized");
    let conn = Connection::open(&file).expect("open");
    let (digest, holds): (String, u64) = conn
        .query_row(
            "SELECT digest, bytes FROM blobs WHERE encoding = 'zstd' LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("a zstd blob");
    for declared in [100, holds + 1, 800_000_000, 8_000_000_000] {
        conn.execute(
            "UPDATE blobs SET bytes = ?1 WHERE digest = ?2",
            rusqlite::params![declared, digest],
        )
        .expect("edit");
        // A content part holds at most 64 KiB (a longer payload is stored whole).
        let says = if declared > 65_536 {
            format!(
                "session sized: blob {digest} claims {declared} bytes, more than the 65536 a \
                 content part may hold"
            )
        } else {
            format!(
                "session sized: blob {digest} decompresses to {holds} bytes, not the {declared} \
                 its row declares"
            )
        };
        let read = root
            .open_reader(&id("sized"))
            .expect("reader")
            .all_commits()
            .unwrap_err();
        let verified = root.verify(&id("sized")).unwrap_err();
        for e in [read, verified] {
            assert!(e.is_corrupt(), "{declared}: {e:?}");
            assert!(e.to_string().contains(&says), "{declared}: {e}");
            assert!(
                !e.to_string().contains("Destination buffer"),
                "{declared}: {e}"
            );
        }
    }
}
