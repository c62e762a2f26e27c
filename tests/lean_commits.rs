//! Schema version 3's compact commit rows and free-page release (issue 12): bytes per
//! commit row against the schema-2 form, idempotent retries across a restart, the upgrade
//! of the committed schema-2 fixtures keeping every id, hostile commit rows, free pages
//! left by rewritten checkpoints, and pages written per durable commit.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use rusqlite::{Connection, params};
use serde_json::json;
use session_store::format::SCHEMA_VERSION;
use session_store::{Batch, Commit, Error, Event, Root, replay_file, verify_file};
use sha2::{Digest, Sha256};

fn session_file(root: &Root, name: &str) -> PathBuf {
    root.session_dir(&id(name)).join("session.sqlite")
}

fn sql(file: &Path, statements: &str) {
    let conn = Connection::open(file).expect("open");
    conn.execute_batch(statements).expect("sql");
}

/// A chat turn as hosts write it: no turn id (derived from the operation id) and no event
/// ids (derived from the commit id).
fn chat_turn(op: &str, n: usize) -> Batch {
    Batch::new(
        op,
        vec![
            Event::new("turn/start"),
            message(&format!("u{n}"), "user", &format!("question {n}")),
            message(&format!("a{n}"), "assistant", &format!("answer {n}")),
            turn_end("completed"),
        ],
    )
}

/// Bytes of the commits table and its indexes (`dbstat`), per commit row.
fn commit_bytes_per_row(conn: &Connection, tables: &[&str]) -> f64 {
    let marks = vec!["?"; tables.len()].join(", ");
    let bytes: i64 = conn
        .query_row(
            &format!("SELECT sum(pgsize) FROM dbstat WHERE name IN ({marks})"),
            rusqlite::params_from_iter(tables),
            |r| r.get(0),
        )
        .expect("dbstat");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM commits", [], |r| r.get(0))
        .expect("count");
    bytes as f64 / rows as f64
}

/// A commit row takes well under the bytes of the schema-2 form (hex text and a unique
/// index on the operation id text), measured in the same run on the same commits.
#[test]
fn commit_rows_take_less_than_half_the_schema2_bytes() {
    let (_dir, root) = manual_root();
    let s = create(&root, "lean");
    const COMMITS: usize = 2_000;
    for n in 0..COMMITS {
        s.append(chat_turn(&format!("op-{n:06}-{}", "x".repeat(12)), n))
            .expect("append");
    }
    s.close().expect("close");
    let file = session_file(&root, "lean");
    let commits = root
        .open_reader(&id("lean"))
        .expect("reader")
        .all_commits()
        .expect("replay");

    // The same commits in the schema-2 form (migrations 0001 + 0002), in a scratch file.
    let scratch = tempfile::tempdir().expect("tempdir");
    let old = Connection::open(scratch.path().join("v2.sqlite")).expect("v2");
    old.execute_batch(
        "CREATE TABLE commits (
            first_seq INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL,
            commit_id TEXT NOT NULL, operation_id TEXT NOT NULL UNIQUE,
            operation_hash TEXT NOT NULL, turn_id TEXT, writer_generation INTEGER NOT NULL,
            created_at INTEGER NOT NULL, row_hash TEXT);",
    )
    .expect("v2 table");
    for c in &commits {
        let row_hash = hex::encode(Sha256::digest(c.commit_id.as_bytes()));
        old.execute(
            "INSERT INTO commits VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                c.first_seq,
                c.last_seq(),
                c.commit_id,
                c.operation_id,
                c.operation_hash,
                c.turn_id,
                c.writer_generation,
                c.created_at_ms,
                row_hash
            ],
        )
        .expect("v2 row");
    }
    let before = commit_bytes_per_row(&old, &["commits", "sqlite_autoindex_commits_1"]);
    let new = Connection::open(&file).expect("open");
    let after = commit_bytes_per_row(&new, &["commits", "commits_by_operation"]);
    println!(
        "bytes per commit row (table + index, dbstat, {COMMITS} commits): \
         schema 2 {before:.1}, schema 3 {after:.1} ({:.2}x)",
        after / before
    );
    assert!(
        after < before * 0.5,
        "schema 3 {after:.1} vs schema 2 {before:.1}"
    );

    // Every new row is in the compact form, and the views show what readers return.
    let (stored_ids, hashes16, derived_turns): (i64, i64, i64) = new
        .query_row(
            "SELECT count(commit_id), sum(length(row_hash) = 16), sum(turn_id = '') FROM commits",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("forms");
    assert_eq!((stored_ids, hashes16, derived_turns), (0, 2_000, 2_000));
    let shown = sqlite3(
        &file,
        "SELECT commit_id || ' ' || operation_hash FROM commit_log WHERE first_seq = 5;",
    );
    let c = &commits[1];
    assert_eq!(shown, format!("{} {}", c.commit_id, c.operation_hash));
    let event = sqlite3(&file, "SELECT event_id FROM event_log WHERE seq = 6;");
    assert_eq!(event, c.events[1].id);
}

/// A retry returns the original commit (same commit id and event ids) while the writer
/// runs, after a restart, and from a reader; a different batch under the same operation
/// id conflicts.
#[test]
fn retries_return_the_original_commit_before_and_after_restart() {
    let (_dir, root) = temp_root();
    let s = create(&root, "retry");
    let first = s.append(chat_turn("op-a", 1)).expect("append");
    let second = s
        .append(turn("op-b", "explicit-turn", "m2"))
        .expect("append");
    assert_eq!(first.commit_id.len(), 32);
    assert_eq!(first.events[0].id, format!("{}.0", first.commit_id));
    assert_ne!(first.commit_id, second.commit_id);
    s.flush().expect("flush");
    let again = s.append(chat_turn("op-a", 1)).expect("retry");
    assert_eq!(identity(&again), identity(&first));
    s.close().expect("close");

    let s = root.open_writer(&id("retry")).expect("reopen");
    for (batch, original) in [
        (chat_turn("op-a", 1), &first),
        (turn("op-b", "explicit-turn", "m2"), &second),
    ] {
        let again = s.append(batch).expect("retry after restart");
        assert_eq!(identity(&again), identity(original));
    }
    let conflict = s.append(chat_turn("op-a", 2)).expect_err("conflict");
    assert!(
        matches!(conflict, Error::OperationConflict { .. }),
        "{conflict}"
    );
    s.close().expect("close");
    let read = root
        .open_reader(&id("retry"))
        .expect("reader")
        .all_commits()
        .expect("replay");
    assert_eq!(identity(&read[0]), identity(&first));
    assert_eq!(identity(&read[1]), identity(&second));
}

/// The committed schema-2 fixtures, upgraded by a writer open, keep every commit id, event
/// id, operation id and hash, turn and time; retries of their operations still return the
/// original commits; the converted rows are compact and the views read in the 3.40 shell.
#[test]
fn schema2_fixtures_upgrade_keeping_every_id() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2");
    let work = tempfile::tempdir().expect("tempdir");
    let root_dir = work.path().join("sessions");
    copy_tree(&fixtures.join("root"), &root_dir);
    let root = Root::open(&root_dir).expect("root");
    let names = ["blobs", "chain-a", "chain-b", "chain-c", "rewound"];
    let before: Vec<Vec<serde_json::Value>> = names
        .iter()
        .map(|name| {
            let reader = root.open_reader(&id(name)).expect("reader");
            reader
                .all_commits()
                .expect("replay")
                .iter()
                .map(identity)
                .collect()
        })
        .collect();
    for name in names {
        assert_eq!(
            sqlite3(&session_file(&root, name), "PRAGMA user_version"),
            "2"
        );
    }
    // Upgrade the ancestors last, so a child reads an ancestor of either version.
    for name in names.iter().rev() {
        let s = root.open_writer(&id(name)).expect("upgrade");
        let own = s.reader().all_commits().expect("replay");
        for c in own.iter().filter(|c| c.first_seq > s.inherited_events()) {
            let again = s.append(retry_of(c)).expect("retry of a schema-2 commit");
            assert_eq!(identity(&again), identity(c), "{name}");
        }
        s.close().expect("close");
        let file = session_file(&root, name);
        assert_eq!(
            sqlite3(&file, "PRAGMA user_version"),
            SCHEMA_VERSION.to_string()
        );
        // Old random ids stay (as 16 bytes), digests are binary, keys are filled.
        let forms = sqlite3(
            &file,
            "SELECT count(*) = sum(length(commit_id) = 16 AND length(operation_hash) = 32
                                   AND length(row_hash) = 32 AND operation_key <> 0)
             FROM commits;",
        );
        assert_eq!(forms, "1", "{name}");
        assert_eq!(
            sqlite3(&file, "SELECT count(*) FROM event_log"),
            sqlite3(&file, "SELECT count(*) FROM events"),
            "{name}"
        );
    }
    for (name, before) in names.iter().zip(&before) {
        let reader = root.open_reader(&id(name)).expect("reader");
        let after: Vec<_> = reader
            .all_commits()
            .expect("replay")
            .iter()
            .map(identity)
            .collect();
        assert_eq!(&after, before, "{name}");
        verify_file(root.session_dir(&id(name))).expect("verify");
    }
}

/// A session with a few closed commits, closed.
fn sample(root: &Root, name: &str) -> Vec<Commit> {
    let s = create(root, name);
    let mut commits = Vec::new();
    for n in 0..4 {
        commits.push((*s.append(chat_turn(&format!("op-{n}"), n)).expect("append")).clone());
    }
    s.close().expect("close");
    commits
}

fn assert_refused(root: &Root, name: &str, what: &str) {
    let dir = root.session_dir(&id(name));
    let outcomes = [
        ("replay", replay_file(&dir).map(drop)),
        ("verify", verify_file(&dir).map(drop)),
        (
            "reader",
            root.open_reader(&id(name))
                .and_then(|r| r.all_commits())
                .map(drop),
        ),
    ];
    for (entry, outcome) in outcomes {
        match outcome {
            Err(Error::Corrupt { .. }) => {}
            other => panic!("{what}: {entry} gave {other:?}, expected Error::Corrupt"),
        }
    }
}

/// Hostile commit rows: a tampered binary row hash, digests and ids of the wrong length
/// and a missing id are refused as corrupt by every reading entry point; operation keys
/// that collide with different texts are told apart by the text.
#[test]
fn hostile_commit_rows_are_refused_or_read_correctly() {
    let (_dir, root) = temp_root();
    let damages = [
        (
            "tampered row hash",
            "UPDATE commits SET row_hash = randomblob(16) WHERE first_seq = 5",
        ),
        (
            "short row hash",
            "UPDATE commits SET row_hash = randomblob(15) WHERE first_seq = 5",
        ),
        (
            "no id, long hash",
            "UPDATE commits SET row_hash = randomblob(32) WHERE first_seq = 5",
        ),
        (
            "short operation hash",
            "UPDATE commits SET operation_hash = substr(operation_hash, 1, 31) WHERE first_seq = 5",
        ),
        (
            "operation hash as text",
            "UPDATE commits SET operation_hash = lower(hex(operation_hash)) || 'x' WHERE first_seq = 5",
        ),
        (
            "wrong-length commit id",
            "UPDATE commits SET commit_id = randomblob(5) WHERE first_seq = 5",
        ),
        (
            "stored commit id",
            "UPDATE commits SET commit_id = row_hash WHERE first_seq = 5",
        ),
        (
            "no id, no hash",
            "UPDATE commits SET row_hash = NULL WHERE first_seq = 5",
        ),
        (
            "turn no longer derived",
            "UPDATE commits SET turn_id = NULL WHERE first_seq = 5",
        ),
        (
            "operation id rewritten",
            "UPDATE commits SET operation_id = 'op-9' WHERE first_seq = 5",
        ),
    ];
    for (n, (what, damage)) in damages.iter().enumerate() {
        let name = format!("hostile-{n}");
        sample(&root, &name);
        sql(&session_file(&root, &name), damage);
        assert_refused(&root, &name, what);
    }

    // Two operation ids under one key (as a 64-bit collision would have it): a lookup
    // confirms the text, so the retry finds its own commit, not the earlier one under
    // the key. `verify` names the key that is not its operation id's.
    let commits = sample(&root, "colliding");
    sql(
        &session_file(&root, "colliding"),
        "UPDATE commits SET operation_key = (SELECT operation_key FROM commits WHERE first_seq = 5)
         WHERE first_seq = 1",
    );
    let refused = verify_file(root.session_dir(&id("colliding"))).expect_err("key damage");
    assert!(matches!(refused, Error::Corrupt { .. }), "{refused}");
    let s = root.open_writer(&id("colliding")).expect("open");
    let again = s.append(retry_of(&commits[1])).expect("retry");
    assert_eq!(identity(&again), identity(&commits[1]));
    s.append(chat_turn("op-new", 9)).expect("new operation");
    s.close().expect("close");

    // Two rows with the same operation id (the store never writes them): refused on lookup.
    sample(&root, "twice");
    let file = session_file(&root, "twice");
    let conn = Connection::open(&file).expect("open");
    let (op_key, turn): (i64, String) = conn
        .query_row(
            "SELECT operation_key, turn_id FROM commits WHERE first_seq = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("row");
    assert_eq!(turn, "", "derived turn ids are stored empty");
    conn.execute(
        "UPDATE commits SET operation_key = ?1, operation_id = 'op-0' WHERE first_seq = 5",
        [op_key],
    )
    .expect("update");
    drop(conn);
    let s = root.open_writer(&id("twice"));
    let outcome = s.and_then(|s| s.append(chat_turn("op-0", 0)).map(drop));
    assert!(matches!(outcome, Err(Error::Corrupt { .. })), "{outcome:?}");
}

/// `(freelist_count, page_count, auto_vacuum)` of a file.
fn freelist(file: &Path) -> (i64, i64, i64) {
    let conn = Connection::open(file).expect("open");
    let get = |pragma: &str| -> i64 {
        conn.pragma_query_value(None, pragma, |r| r.get(0))
            .expect("pragma")
    };
    (get("freelist_count"), get("page_count"), get("auto_vacuum"))
}

/// One round: 1,000 small events (titles: no transcript growth, so the close is due a
/// checkpoint) and a model context replaced by 600 messages of about 3 KiB in even rounds
/// and by none in odd ones, then a close, which rewrites the projection checkpoint: it
/// grows by about 2 MB and shrinks again.
fn rewrite_checkpoint(root: &Root, name: &str, round: usize) {
    let s = root.open_writer(&id(name)).expect("open");
    for n in 0..100 {
        let titles = (0..10)
            .map(|k| title(&format!("title {round}.{n}.{k}")))
            .collect();
        s.append_events(&format!("r{round}-op-{n}"), titles)
            .expect("append");
    }
    let body = "lorem ipsum ".repeat(250);
    let count = if round.is_multiple_of(2) { 600 } else { 0 };
    let messages: Vec<_> = (0..count)
        .map(|k| json!({"id": format!("w{round}-{k}"), "role": "user", "content": body}))
        .collect();
    let replace = Event::new("model/context-replace")
        .with_payload(&json!({ "messages": messages }))
        .expect("payload");
    s.append_events(&format!("r{round}-replace"), vec![replace])
        .expect("replace");
    s.close().expect("close");
}

/// Rewriting a session's projection checkpoint many times does not keep growing its free
/// pages: a new file is `auto_vacuum=INCREMENTAL` and the writer gives pages beyond the
/// kept 256 back. The same rounds on a copy switched to `auto_vacuum=NONE` (what files of
/// schema versions 1 and 2 have) are the same-run baseline (printed).
#[test]
fn rewritten_checkpoints_do_not_pile_up_free_pages() {
    let (_dir, root) = manual_root();
    create(&root, "lean").close().expect("close");
    create(&root, "old").close().expect("close");
    sql(
        &session_file(&root, "old"),
        "PRAGMA auto_vacuum = NONE; VACUUM;",
    );
    assert_eq!(freelist(&session_file(&root, "lean")).2, 2, "incremental");
    assert_eq!(freelist(&session_file(&root, "old")).2, 0, "none");
    let mut peak = [0i64; 2];
    let mut rewrites = 0;
    let mut last_through = String::new();
    for round in 0..8 {
        for (i, name) in ["lean", "old"].iter().enumerate() {
            rewrite_checkpoint(&root, name, round);
            let file = session_file(&root, name);
            let (free, pages, _) = freelist(&file);
            peak[i] = peak[i].max(free);
            if i == 0 {
                assert!(free <= 256, "round {round}: {free} free of {pages} pages");
                let through = sqlite3(&file, "SELECT through_seq FROM checkpoint");
                rewrites += usize::from(through != last_through);
                last_through = through;
            }
        }
    }
    assert!(rewrites >= 4, "{rewrites} checkpoint rewrites");
    let [lean, old] = peak;
    println!("peak free pages over 8 checkpoint rewrites: incremental {lean}, none {old}");
}

/// WAL frames written by one durable one-event commit (a `flush` per append), averaged.
fn frames_per_durable_commit(root: &Root, name: &str, commits: usize) -> f64 {
    let s = root.open_writer(&id(name)).expect("open");
    let wal = PathBuf::from(format!("{}-wal", session_file(root, name).display()));
    s.append(chat_turn(&format!("{name}-warm"), 0))
        .expect("warm");
    s.flush().expect("flush");
    let start = std::fs::metadata(&wal).expect("wal").len();
    for n in 0..commits {
        s.append_events(
            &format!("{name}-one-{n:05}"),
            vec![message(&format!("{name}-m{n}"), "user", "a short message")],
        )
        .expect("append");
        s.flush().expect("flush");
    }
    let grown = std::fs::metadata(&wal).expect("wal").len() - start;
    s.close().expect("close");
    // A frame is a 24-byte header and a 4096-byte page.
    grown as f64 / 4120.0 / commits as f64
}

/// Pages written per durable one-event commit: the event, its commit row and its operation
/// key entry and history row, about four pages, not more.
#[test]
fn a_durable_one_event_commit_writes_few_pages() {
    let (_dir, root) = manual_root();
    create(&root, "pages").close().expect("close");
    // 150 commits stay below the 1,000-frame automatic checkpoint, after which the WAL
    // would be rewritten from its start and no longer grow.
    let frames = frames_per_durable_commit(&root, "pages", 150);
    println!("WAL frames per durable one-event commit: {frames:.2}");
    assert!(frames <= 4.5, "{frames:.2} frames per commit");
}

/// Zeroes the bit words of a stored operation filter (its header, segment heads and check
/// left as they are): restored without its check, it would call every id new.
fn zero_filter_bits(file: &Path) {
    let conn = Connection::open(file).expect("open");
    let mut filter: Vec<u8> = conn
        .query_row("SELECT operation_filter FROM checkpoint", [], |r| r.get(0))
        .expect("filter");
    let segments = u32::from_le_bytes(filter[4..8].try_into().expect("count"));
    let mut at = 8;
    for _ in 0..segments {
        let capacity = u32::from_le_bytes(filter[at..at + 4].try_into().expect("cap")) as usize;
        let bytes = capacity * 16 / 8;
        filter[at + 8..at + 8 + bytes].fill(0);
        at += 8 + bytes;
    }
    assert_eq!(filter.len(), at + 16, "the layout of migrations/0004");
    conn.execute("UPDATE checkpoint SET operation_filter = ?1", [filter])
        .expect("update");
}

/// Schema 4: a closing session stores its operation filter with the checkpoint, and the
/// next writer starts from it. Every retry still returns the original commit, a reused id
/// with other content is still a conflict and new operations append, whether the filter
/// is intact, damaged (its bits zeroed: its check fails, it is ignored and the keys are
/// scanned), longer than any this build writes (3 MiB: not read), or missing (NULL, as a
/// checkpoint without one). (A version-3 file, which has no filter column, is the
/// committed schema-3 fixture of `format_fixtures.rs`: its long session's checkpoint
/// stays, retries are answered, and the next checkpoint stores a filter.)
#[test]
fn the_checkpoint_operation_filter_is_restored_and_a_bad_one_ignored() {
    let (_dir, root) = temp_root();
    let s = create(&root, "filter");
    // 1,200 one-event commits: the close is due a checkpoint (1,000 events or more).
    let commits: Vec<_> = (0..1_200)
        .map(|n| {
            s.append_events(&format!("op-{n}"), vec![title(&format!("t{n}"))])
                .expect("append")
        })
        .collect();
    s.close().expect("close");
    let file = session_file(&root, "filter");
    assert_eq!(
        sqlite3(
            &file,
            "SELECT through_seq, length(operation_filter) > 16 FROM checkpoint"
        ),
        "1200|1"
    );
    let states = ["intact", "damaged", "oversized", "missing"];
    for (next, state) in (1_201..).zip(states) {
        match state {
            "damaged" => zero_filter_bits(&file),
            // Longer than any filter this build writes: not read at all.
            "oversized" => sql(
                &file,
                "UPDATE checkpoint SET operation_filter = zeroblob(3 * 1024 * 1024)",
            ),
            "missing" => sql(&file, "UPDATE checkpoint SET operation_filter = NULL"),
            _ => {}
        }
        let picks = [0, 1, 599, 1_198, 1_199];
        retries_conflict_and_append(&root, "filter", &commits, &picks, next - 1, state);
    }
    assert_eq!(
        sqlite3(&file, "PRAGMA user_version"),
        SCHEMA_VERSION.to_string()
    );
    assert_eq!(
        sqlite3(
            &file,
            "SELECT count(*) FROM pragma_table_info('checkpoint') WHERE name = 'operation_filter'"
        ),
        "1"
    );
    verify_file(&file).expect("verify");
    assert_eq!(
        root.open_reader(&id("filter"))
            .expect("reader")
            .all_commits()
            .expect("replay")
            .len(),
        1_204
    );
}
