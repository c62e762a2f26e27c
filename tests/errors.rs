//! The public classifiers of `session_store::Error` (issue 13), one test each: every error
//! is produced through the public API on real session files (except `Internal`, a library
//! bug no call can cause; the read pool's `ReadConnection`, a pool's timeout, is tested in
//! `src/store/read_pool.rs`), and each test checks the classifier, the ones that must not answer, and the
//! `source()` chain where the error has a cause.

mod common;

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use common::{create, id, manual_root, message, temp_root, title};
use session_store::{Batch, Error, Event, PersistenceStatus, Root, SessionId, StoreOptions};

/// The classifiers that answer yes for `e`, by name (each test states the exact set).
fn classes(e: &Error) -> Vec<&'static str> {
    let all = [
        ("retryable", e.is_retryable()),
        ("not_found", e.is_not_found()),
        ("already_exists", e.is_already_exists()),
        ("writer_owned", e.is_writer_owned()),
        ("corrupt", e.is_corrupt()),
        ("unsupported", e.is_unsupported()),
        ("caller_error", e.is_caller_error()),
        ("needs_reopen", e.needs_reopen()),
        ("internal", e.is_internal()),
    ];
    all.into_iter()
        .filter(|(_, yes)| *yes)
        .map(|(n, _)| n)
        .collect()
}

/// A new session `name` holding one durable commit (operation `op-0`).
fn durable_session(root: &Root, name: &str) -> session_store::Session {
    let s = create(root, name);
    s.append(Batch::new("op-0", vec![title("durable")]))
        .expect("append");
    s.flush().expect("flush");
    s
}

/// The failed write's error behind a `PersistenceFailed` or `Poisoned` (its source).
fn failed_write(e: &Error) -> &Error {
    e.source()
        .and_then(|c| c.downcast_ref::<Error>())
        .expect("the failed write is the source")
}

/// The session file of `s`.
fn session_file(s: &session_store::Session) -> std::path::PathBuf {
    s.dir().join("session.sqlite")
}

/// Bumps the lease generation of `s`'s file behind its back, as another writer's open
/// would: `s`'s next write is fenced off.
fn bump_lease(s: &session_store::Session) {
    rusqlite::Connection::open(session_file(s))
        .expect("sqlite")
        .execute("UPDATE lease SET generation = generation + 1", [])
        .expect("bump the lease");
}

#[test]
fn a_missing_session_or_folder_is_not_found() {
    let (dir, root) = temp_root();
    let absent = id("absent");
    for e in [
        root.open_reader(&absent).expect_err("no such session"),
        root.open_writer(&absent).expect_err("no such session"),
        root.stat(&absent).expect_err("no such session"),
    ] {
        assert!(matches!(e, Error::SessionNotFound(_)), "{e:?}");
        assert_eq!(classes(&e), ["not_found"], "{e}");
        assert!(e.to_string().contains("absent"), "{e}");
        assert!(e.source().is_none());
    }

    // An export into a folder that does not exist: the OS error is the typed source.
    create(&root, "present").close().expect("close");
    let e = root
        .export(&id("present"), dir.path().join("no-such-folder/out.sqlite"))
        .expect_err("missing destination folder");
    assert_eq!(classes(&e), ["not_found"], "{e:?}");
    let io = e
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .expect("the io::Error is the source");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}

/// `import`, `verify_file` and `replay_file` of a path with nothing there name the path
/// as a file, not a session (they said "session /x/gone.export not found"), and of a
/// folder without a session file name the folder as such (they said "session
/// DIR/session.sqlite not found", which only the CLI reworded): the OS error "No such
/// file or directory" is the typed source, `is_not_found` (CLI exit 3), and nothing is
/// imported.
#[test]
fn a_missing_file_to_import_or_verify_is_named_as_a_path() {
    let (dir, root) = temp_root();
    let missing = dir.path().join("gone.export");
    let folder = dir.path().join("plain-folder");
    std::fs::create_dir(&folder).expect("mkdir");
    for (path, said) in [
        (&missing, format!("{}", missing.display())),
        (
            &folder,
            format!(
                "{} is a folder without a session file (session.sqlite)",
                folder.display()
            ),
        ),
    ] {
        for e in [
            root.import(path, session_store::ImportOptions::default())
                .expect_err("nothing to import"),
            session_store::verify_file(path).expect_err("nothing to verify"),
            session_store::replay_file(path).expect_err("nothing to replay"),
        ] {
            assert_eq!(classes(&e), ["not_found"], "{e:?}");
            assert_eq!(
                e.to_string(),
                format!("{said}: No such file or directory (os error 2)")
            );
            let io = e
                .source()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .expect("the io::Error is the source");
            assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        }
    }
    assert!(root.list_ids().expect("ids").is_empty());
}

#[test]
fn a_taken_name_is_already_exists() {
    let (_dir, root) = temp_root();
    create(&root, "taken").close().expect("close");
    let e = root
        .create(session_store::CreateOptions::with_id(id("taken")))
        .expect_err("the id is taken");
    assert!(matches!(e, Error::SessionExists(_)), "{e:?}");
    assert_eq!(classes(&e), ["already_exists"]);
    assert!(e.source().is_none());
}

#[test]
fn a_second_writer_is_writer_owned_and_told_the_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Root::open(dir.path()).expect("root");
    let s = create(&first, "owned");
    // A second root on the same folder (as another process would open it).
    let second = Root::open(dir.path()).expect("root");
    let e = second.open_writer(&id("owned")).expect_err("owned");
    assert_eq!(classes(&e), ["writer_owned"], "{e:?}");
    let owner = e.writer_owner().expect("the owner is reported");
    assert_eq!(owner, s.owner());
    assert_eq!(owner.pid, std::process::id());
    assert!(e.to_string().contains(&format!("pid {}", owner.pid)), "{e}");
    // It names the session: "session writer is owned by pid …" named none, and a host of
    // many sessions could not tell which one was taken.
    assert!(
        e.to_string()
            .starts_with("session owned is owned by another writer: pid "),
        "{e}"
    );
    assert!(matches!(&e, Error::WriterOwned { session, .. } if session == "owned"));
    // When the lease was taken reads as a UTC time, not as a count of milliseconds
    // ("since 1796336102082 ms" read like a duration of 57 years).
    let taken = format!("since {} UTC)", session_store::utc(owner.since_ms));
    assert!(e.to_string().ends_with(&taken), "{e} (wanted {taken:?})");
    assert!(!e.to_string().contains(" ms)"), "{e}");
    assert!(e.source().is_none());
    // Once the first writer lets go, the second opens it.
    s.close().expect("close");
    second
        .open_writer(&id("owned"))
        .expect("free now")
        .close()
        .expect("close");
}

#[test]
fn a_damaged_file_is_corrupt_and_a_newer_one_unsupported() {
    let (_dir, root) = temp_root();
    let s = create(&root, "damaged");
    s.append(Batch::new("t", vec![title("before the damage")]))
        .expect("append");
    let file = session_file(&s);
    s.close().expect("close");
    let good = std::fs::read(&file).expect("read");

    let mut garbage = b"this is not a session file".repeat(2_000);
    garbage.truncate(good.len().max(4096));
    std::fs::write(&file, &garbage).expect("write");
    for e in [
        root.open_reader(&id("damaged")).expect_err("damaged"),
        root.open_writer(&id("damaged")).expect_err("damaged"),
        root.stat(&id("damaged")).expect_err("damaged"),
    ] {
        assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
        assert_eq!(classes(&e), ["corrupt"], "{e}");
        // SQLite found it (`SQLITE_NOTADB`): its error is the typed source.
        let sqlite = e
            .source()
            .and_then(|c| c.downcast_ref::<rusqlite::Error>())
            .unwrap_or_else(|| panic!("no rusqlite source: {e:?}"));
        assert_eq!(
            sqlite.sqlite_error_code(),
            Some(rusqlite::ErrorCode::NotADatabase),
            "{e}"
        );
    }

    // A schema version newer than this build: unsupported, not corrupt.
    std::fs::write(&file, &good).expect("restore");
    let conn = rusqlite::Connection::open(&file).expect("sqlite");
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("user_version");
    conn.pragma_update(None, "user_version", version + 1)
        .expect("bump");
    drop(conn);
    let e = root.open_reader(&id("damaged")).expect_err("newer");
    assert!(matches!(e, Error::UnsupportedVersion { .. }), "{e:?}");
    assert_eq!(classes(&e), ["unsupported"], "{e}");
    // The store's own version check refused it before any lower-level code ran.
    assert!(e.source().is_none(), "{e:?}");
    // It names the file and says what reads it (it said "schema version N is newer than
    // M" alone).
    assert_eq!(
        e.to_string(),
        format!(
            "not supported by this build: file {} has schema version {}, newer than {version} \
             (the newest this build reads): a newer session-store reads it",
            file.display(),
            version + 1
        )
    );

    // A header naming another storage codec (a file of another format or a later one
    // under the same schema version) is unsupported too, not read as this codec; an
    // import refuses it and publishes nothing.
    create(&root, "codec").close().expect("close");
    let file = root.session_dir(&id("codec")).join("session.sqlite");
    let conn = rusqlite::Connection::open(&file).expect("sqlite");
    conn.execute("UPDATE header SET codec = 'other/v9'", [])
        .expect("codec");
    drop(conn);
    for e in [
        root.open_reader(&id("codec")).expect_err("other codec"),
        root.open_writer(&id("codec")).expect_err("other codec"),
        session_store::verify_file(&file).expect_err("other codec"),
    ] {
        assert!(matches!(e, Error::UnsupportedVersion { .. }), "{e:?}");
        assert!(e.to_string().contains("other/v9"), "{e}");
    }
    let e = root
        .import(
            &file,
            session_store::ImportOptions::default().with_session_id(id("imported")),
        )
        .expect_err("other codec");
    assert!(matches!(e, Error::UnsupportedVersion { .. }), "{e:?}");
    assert!(!root.session_dir(&id("imported")).exists());
}

/// A stored payload that is not JSON is corrupt with the `serde_json::Error` as the typed
/// source, the message ending with it once.
#[test]
fn a_corrupt_row_has_its_decoding_error_as_source() {
    let (_dir, root) = temp_root();
    let s = create(&root, "not-json");
    s.append(Batch::new("t", vec![title("before the damage")]))
        .expect("append");
    let file = session_file(&s);
    s.close().expect("close");
    // The row's check cleared as well (a row written before schema 7): with it, the read
    // refuses the row before decoding it.
    let sql = "UPDATE events SET payload = '{not json', payload_check = NULL WHERE kind = (SELECT code FROM event_kinds WHERE kind = 'session/title')";
    let conn = rusqlite::Connection::open(&file).expect("sqlite");
    assert!(conn.execute(sql, []).expect(sql) > 0, "{sql}");
    drop(conn);

    let e = root
        .open_reader(&id("not-json"))
        .and_then(|r| r.all_commits())
        .expect_err("not json");
    assert_eq!(classes(&e), ["corrupt"], "{e:?}");
    let cause = e.source().unwrap_or_else(|| panic!("no source: {e:?}"));
    assert!(cause.is::<serde_json::Error>(), "{e:?}");
    assert!(e.to_string().contains("payload is not JSON"), "{e}");
    let text = cause.to_string();
    assert_eq!(e.to_string().matches(&text).count(), 1, "{e}");
    assert!(e.to_string().ends_with(&text), "{e}");
}

/// A header, lease, lineage, dependents, commits or events value that does not decode is
/// corrupt in plain words: the session (the file, when its header is what does not
/// decode), the table, the column and the value. It said rusqlite's "undecodable row:
/// Conversion error from type Text at index: 0, invalid input: invalid session id …" and
/// "Invalid column type Text at index: 2, name: pid", naming no session; the commits and
/// events rows said so until session 28 ("undecodable row: Invalid column type Text at
/// index: 6, name: writer_generation", "… Conversion error from type Blob at index: 8,
/// commit row at 1 does not match its row hash").
#[test]
fn an_undecodable_header_or_lease_value_is_named_in_plain_words() {
    let (_dir, root) = temp_root();
    for (name, sql, said) in [
        (
            "bad-header",
            "UPDATE header SET session_id = '../x'",
            "header.session_id \"../x\" is not a valid session id",
        ),
        (
            "bad-lease",
            "UPDATE lease SET pid = 'abc'",
            "session bad-lease: lease.pid holds text, not the type of that column",
        ),
        (
            "bad-lineage",
            "INSERT INTO lineage (ancestor_id, after_seq, through_seq) VALUES ('a/b', 0, 1)",
            "session bad-lineage: lineage.ancestor_id \"a/b\" is not a valid session id",
        ),
        (
            "bad-commit",
            "UPDATE commits SET writer_generation = 'one'",
            "session bad-commit: commits.writer_generation holds text, not the type of that \
             column",
        ),
        (
            "changed-commit",
            "UPDATE commits SET created_at = created_at + 1",
            "session changed-commit: commits.row_hash does not match the commit at 1 (the row \
             was changed)",
        ),
        (
            "bad-event",
            "UPDATE events SET optional = 'no'",
            "session bad-event: events.optional holds text, not the type of that column",
        ),
    ] {
        let s = durable_session(&root, name);
        let file = session_file(&s);
        s.close().expect("close");
        let conn = rusqlite::Connection::open(&file).expect("sqlite");
        assert!(conn.execute(sql, []).expect(sql) > 0, "{sql}");
        drop(conn);
        let e = root
            .open_reader(&id(name))
            .and_then(|r| r.lease().and_then(|_| r.all_commits()))
            .map(drop)
            .expect_err(name);
        assert_eq!(classes(&e), ["corrupt"], "{name}: {e:?}");
        let said = match name {
            "bad-header" => format!("corrupt session store: file {}: {said}", file.display()),
            _ => format!("corrupt session store: {said}"),
        };
        assert_eq!(e.to_string(), said, "{name}");
    }
}

/// The schema migrations' refusal of a database newer than they know is
/// `UnsupportedVersion` with their `rusqlite_migration::Error` as the typed source.
#[test]
fn a_migrations_refusal_is_unsupported_with_its_error_as_source() {
    let mut conn = rusqlite::Connection::open_in_memory().expect("sqlite");
    conn.pragma_update(None, "user_version", 7)
        .expect("version");
    let refused =
        rusqlite_migration::Migrations::new(vec![rusqlite_migration::M::up("CREATE TABLE t (x)")])
            .to_latest(&mut conn)
            .expect_err("a newer database");
    let e = Error::from(refused);
    assert_eq!(classes(&e), ["unsupported"], "{e:?}");
    assert!(
        e.source()
            .is_some_and(|c| c.is::<rusqlite_migration::Error>()),
        "{e:?}"
    );
}

#[test]
fn what_the_caller_passed_is_a_caller_error_and_changes_nothing() {
    let (dir, root) = temp_root();
    let s = durable_session(&root, "input");
    let before = s.snapshot().event_sequence;

    // A root path that is a file: "create root X: File exists", an I/O error, before.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"kept").expect("file");
    let not_a_folder = Root::open(&file).expect_err("a file as the root");
    assert!(
        not_a_folder.to_string().contains("is not a folder")
            && not_a_folder.to_string().contains("a-file"),
        "{not_a_folder}"
    );
    assert_eq!(std::fs::read(&file).expect("file"), b"kept");
    let mut refused = vec![
        not_a_folder,
        SessionId::new("../escape").expect_err("bad id"),
        Root::with_options(
            dir.path().join("other"),
            StoreOptions::default().with_queue_budget(0),
        )
        .expect_err("zero budget"),
        s.append(Batch::new("", vec![title("x")]))
            .expect_err("no operation id"),
        // The same operation id with other content.
        s.append(Batch::new("op-0", vec![title("other")]))
            .expect_err("conflict"),
        // A payload that does not match its kind's schema.
        s.append(Batch::new(
            "op-2",
            vec![
                Event::new("message/complete")
                    .with_payload(&serde_json::json!({"message": 42}))
                    .expect("json"),
            ],
        ))
        .expect_err("bad payload"),
    ];
    // A fork cut at a turn the session does not have.
    refused.push(
        root.fork(
            &id("input"),
            session_store::ForkPoint::AfterTurn("no-such-turn".into()),
            None,
        )
        .expect_err("unknown turn"),
    );
    assert!(
        matches!(refused[1], Error::InvalidInput { .. }),
        "{:?}",
        refused[1]
    );
    assert!(
        matches!(refused[4], Error::OperationConflict { .. }),
        "{:?}",
        refused[4]
    );
    assert!(
        matches!(refused[5], Error::InvalidPayload { .. }),
        "{:?}",
        refused[5]
    );
    for e in &refused {
        assert_eq!(classes(e), ["caller_error"], "{e:?}");
        assert!(e.source().is_none(), "{e:?}");
    }
    assert_eq!(s.snapshot().event_sequence, before, "nothing was accepted");
    s.close().expect("close");
    assert!(!dir.path().join("other").exists(), "no root was made");
}

/// Input that is not JSON is a caller error whose typed source is the JSON parse error.
#[test]
fn input_that_is_not_json_has_the_parse_error_as_source() {
    let e = Event::new("session/title")
        .with_payload_json("{\"title\": ")
        .expect_err("not JSON");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
    assert_eq!(classes(&e), ["caller_error"], "{e}");
    let parse = e
        .source()
        .and_then(|c| c.downcast_ref::<serde_json::Error>())
        .unwrap_or_else(|| panic!("no serde_json source: {e:?}"));
    assert!(parse.is_eof(), "{parse}");
    assert_eq!(
        e.to_string(),
        format!("invalid input: payload is not JSON: {parse}")
    );
}

/// A write that meets another connection's write lock (SQLite `SQLITE_BUSY` after the
/// 5 s busy timeout) fails cleanly: retryable, the tail kept, an append over the budget is
/// `PersistenceFailed` whose source is that busy error, and once the other connection lets
/// go an append over the budget drains again and `flush` succeeds.
#[test]
fn a_busy_file_is_retryable_and_flush_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = StoreOptions::default()
        .with_write_behind(Duration::from_secs(3600))
        .with_queue_budget(1);
    let root = Root::with_options(dir.path(), options).expect("root");
    let s = durable_session(&root, "busy");
    let durable = s.snapshot().durable_sequence;

    let other = rusqlite::Connection::open(session_file(&s)).expect("sqlite");
    other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    // Over the budget at once: a drain starts and meets the lock.
    s.append(Batch::new("op-1", vec![message("m1", "user", "one")]))
        .expect("accepted in memory");
    let e = s
        .append(Batch::new("op-2", vec![message("m2", "user", "two")]))
        .expect_err("over budget while the drain fails");
    assert!(matches!(e, Error::PersistenceFailed(_)), "{e:?}");
    assert_eq!(classes(&e), ["retryable"], "{e}");
    let cause = failed_write(&e);
    let Error::Sqlite(reported) = cause else {
        panic!("{cause:?}")
    };
    // The store's own type keeps SQLite's codes, SQLITE_BUSY (5), and names the file and
    // what it means (outside testing W6: "database is locked" named neither).
    assert_eq!(reported.code(), Some(5), "{reported}");
    assert_eq!(reported.extended_code(), Some(5), "{reported}");
    assert_eq!(
        reported.to_string(),
        format!(
            "{} is busy: another process held a write on it for 5 s (its writer, or a delete \
             or fork of a session it shares history with); try again",
            session_file(&s).display()
        )
    );
    assert_eq!(classes(cause), ["retryable"]);
    let sqlite = cause
        .source()
        .and_then(|c| c.downcast_ref::<rusqlite::Error>())
        .expect("the SQLite error is the source");
    assert_eq!(
        sqlite.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy)
    );
    let snap = s.snapshot();
    assert_eq!(snap.persistence_status, PersistenceStatus::Failed);
    assert_eq!(snap.durable_sequence, durable);
    assert_eq!(snap.persistence_error, Some(cause.to_string()));

    other.execute_batch("ROLLBACK").expect("let go");
    // Over the budget while paused, once the file is free: the append drains again, and is
    // accepted (it was refused at once; outside testing W2).
    s.append(Batch::new("op-3", vec![message("m3", "user", "three")]))
        .expect("drained again, then accepted");
    let now = s.flush().expect("the retry succeeds");
    assert_eq!(now, durable + 2, "the kept tail and m3 are written");
    assert_eq!(s.snapshot().persistence_status, PersistenceStatus::Ready);
    s.close().expect("close");
}

/// A session paused by a busy file retries its drain by itself once the file is free:
/// what it accepted becomes durable without a flush (an append over the budget drains
/// again before it is refused: `a_busy_file_is_retryable_and_flush_recovers`). Timed
/// drains stopped until the host flushed, so another process's write held for 5 s (a
/// delete copying history in, a fork's `dependents` row) left everything appended after
/// it in memory alone, long after that process had gone (outside testing W2, W3).
#[test]
fn a_session_paused_by_a_busy_file_drains_again_once_it_is_free() {
    let (_dir, root) = temp_root();
    let s = durable_session(&root, "busy");
    let durable = s.snapshot().durable_sequence;
    let other = rusqlite::Connection::open(session_file(&s)).expect("sqlite");
    other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    s.append(Batch::new("op-1", vec![message("m1", "user", "one")]))
        .expect("accepted in memory");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while s.snapshot().persistence_status != PersistenceStatus::Failed {
        assert!(
            std::time::Instant::now() < deadline,
            "the drain never failed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    other.execute_batch("ROLLBACK").expect("let go");
    // No flush: the retry makes it durable.
    while s.snapshot().durable_sequence < durable + 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "never retried: {:?}",
            s.snapshot()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.snapshot().persistence_status, PersistenceStatus::Ready);
    s.close().expect("close");
}

/// A fork whose parent's file, and a delete whose fork's file, another process holds a
/// write on for the whole busy timeout (its writer stopped inside a drain) fail naming the
/// file as busy, to be tried again, and change nothing: both said only "database is
/// locked" (outside testing W6).
#[test]
fn a_fork_and_a_delete_meeting_a_busy_file_name_it() {
    let (_dir, root) = temp_root();
    let p = create(&root, "p");
    p.append(common::turn("op-1", "t1", "m1")).expect("append");
    p.close().expect("close");
    let c = root
        .fork(
            &id("p"),
            session_store::ForkPoint::AfterTurn("t1".into()),
            Some(id("c")),
        )
        .expect("fork");
    let busy = |name: &str| {
        let file = root.session_dir(&id(name)).join("session.sqlite");
        let other = rusqlite::Connection::open(&file).expect("sqlite");
        other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
        (file, other)
    };
    let said = |file: &std::path::Path| {
        format!(
            "{} is busy: another process held a write on it for 5 s (its writer, or a delete \
             or fork of a session it shares history with); try again",
            file.display()
        )
    };
    let (file, other) = busy("p");
    let e = root
        .fork(
            &id("p"),
            session_store::ForkPoint::AfterTurn("t1".into()),
            Some(id("c2")),
        )
        .expect_err("the parent's file is busy");
    assert!(e.to_string().contains(&said(&file)), "{e}");
    assert!(e.is_retryable(), "{e:?}");
    drop(other);
    assert_eq!(root.list_ids().expect("ids"), [id("c"), id("p")]);
    let (file, other) = busy("c");
    let e = root
        .delete(&id("p"), &session_store::CancelToken::new())
        .expect_err("the fork's file is busy");
    assert!(e.to_string().contains(&said(&file)), "{e}");
    drop(other);
    assert_eq!(root.list_ids().expect("ids"), [c, id("p")]);
    root.delete(&id("p"), &session_store::CancelToken::new())
        .expect("delete once the file is free");
}

/// A closed session and a writer fenced off by another lease need a reopen; a poisoned
/// session says so with the failed write as its source.
#[test]
fn closed_fenced_and_poisoned_sessions_need_a_reopen() {
    let (_dir, root) = manual_root();
    let s = durable_session(&root, "fenced");

    // Another writer's lease (bumped behind this one's back) fences the next write off.
    bump_lease(&s);
    s.append(Batch::new("op-1", vec![title("fenced")]))
        .expect("accepted in memory");
    let e = s.flush().expect_err("fenced");
    assert!(matches!(e, Error::StaleGeneration { .. }), "{e:?}");
    assert_eq!(classes(&e), ["needs_reopen"], "{e}");
    assert_eq!(
        s.snapshot().persistence_status,
        PersistenceStatus::Uncertain
    );

    let e = s
        .append(Batch::new("op-2", vec![title("after")]))
        .expect_err("poisoned");
    assert!(matches!(e, Error::Poisoned(_)), "{e:?}");
    assert_eq!(classes(&e), ["needs_reopen"], "{e}");
    let cause = failed_write(&e);
    assert!(matches!(cause, Error::StaleGeneration { .. }), "{cause:?}");

    // close releases a poisoned session (and says it was poisoned); then it is closed.
    let e = s.close().expect_err("poisoned");
    assert!(matches!(e, Error::Poisoned(_)), "{e:?}");
    assert_eq!(classes(&e), ["needs_reopen"], "{e}");
    let e = s
        .append(Batch::new("op-3", vec![title("closed")]))
        .expect_err("closed");
    assert!(matches!(e, Error::Closed), "{e:?}");
    assert_eq!(classes(&e), ["needs_reopen"], "{e}");
    // Reopening (a new lease) is the way on: the durable prefix is there, writes work.
    let again = root.open_writer(&id("fenced")).expect("reopens");
    assert_eq!(again.snapshot().durable_sequence, 1);
    again
        .append(Batch::new("op-4", vec![title("reopened")]))
        .expect("append");
    again.close().expect("close");

    // A clean close, then an append: Closed, saying so of the session (it said "session
    // runtime is closed" of a plain writer, which has no runtime).
    let t = create(&root, "closed");
    t.close().expect("close");
    let e = t
        .append(Batch::new("op", vec![title("late")]))
        .expect_err("closed");
    assert!(matches!(e, Error::Closed), "{e:?}");
    assert_eq!(e.to_string(), "session is closed");
    assert_eq!(classes(&e), ["needs_reopen"]);
    root.open_writer(&id("closed"))
        .expect("reopens")
        .close()
        .expect("close");
}

/// `Internal` is a library bug (no call can cause it on purpose): it classifies as
/// internal only, never as the caller's mistake, and keeps its cause.
#[test]
fn an_internal_failure_is_not_a_caller_error() {
    let e = Error::Internal {
        context: "checkpoint to JSON".into(),
        source: Some(Arc::new(std::io::Error::other("boom"))),
    };
    assert_eq!(classes(&e), ["internal"]);
    assert_eq!(e.to_string(), "internal error: checkpoint to JSON: boom");
    assert!(
        e.source()
            .and_then(|c| c.downcast_ref::<std::io::Error>())
            .is_some()
    );
    // Clones share the cause.
    let copy = e.clone();
    assert_eq!(copy.to_string(), e.to_string());
}

/// A service serves its own host only: every call given a ref of another host is a caller
/// error that touches nothing, `flush` included (it flushed the local session of the same
/// id), and `runtime` finds no runtime under it.
#[tokio::test]
async fn a_ref_of_another_host_is_a_caller_error() {
    let (_dir, root) = manual_root();
    let service = session_store::Service::new("here", root).expect("service");
    let rt = service
        .create(session_store::CreateOptions::with_id(id("s")))
        .await
        .expect("create");
    rt.session()
        .append(Batch::new("op-1", vec![title("kept in memory")]))
        .expect("append");
    let foreign = session_store::SessionRef::new("elsewhere", "s").expect("ref");
    assert!(service.runtime(&foreign).is_none());
    let refused = [
        service.flush(&foreign).await.expect_err("flush"),
        service.close(&foreign).await.expect_err("close"),
        service.cancel(&foreign).expect_err("cancel"),
    ];
    for e in &refused {
        assert_eq!(classes(e), ["caller_error"], "{e:?}");
    }
    let snapshot = rt.session().snapshot();
    assert_eq!(
        (snapshot.event_sequence, snapshot.durable_sequence),
        (1, 0),
        "the foreign flush wrote nothing"
    );
    let local = service.session_ref(id("s"));
    assert!(service.runtime(&local).is_some());
    assert_eq!(service.flush(&local).await.expect("flush"), 1);
    service.close(&local).await.expect("close");
}

/// A `SessionRef` read from JSON passes the checks of `SessionRef::new`: a ref round-trips,
/// a blank host id or one with a control character is refused as a bad session id is.
#[test]
fn a_session_ref_read_from_json_is_checked_as_new_checks_it() {
    let r = session_store::SessionRef::new("laptop", "chat-1").expect("ref");
    let text = serde_json::to_string(&r).expect("json");
    assert_eq!(
        serde_json::from_str::<session_store::SessionRef>(&text).expect("parse"),
        r
    );
    for bad in [
        r#"{"host_id":"","session_id":"x"}"#,
        r#"{"host_id":"  ","session_id":"x"}"#,
        r#"{"host_id":"a\u001b[2J","session_id":"x"}"#,
        r#"{"host_id":"h","session_id":"../x"}"#,
    ] {
        assert!(
            serde_json::from_str::<session_store::SessionRef>(bad).is_err(),
            "{bad}"
        );
    }
}

/// A session whose last write failed with an unknown outcome is poisoned; the close that
/// releases it must not record the in-memory projection (which holds the commits never
/// written) in the catalog: `list` would show them while the file does not hold them.
#[tokio::test]
async fn a_poisoned_close_records_nothing_unwritten_in_the_catalog() {
    let (_dir, root) = manual_root();
    let service = session_store::Service::new("local", root.clone()).expect("service");
    let rt = service
        .create(session_store::CreateOptions::with_id(id("poisoned")))
        .await
        .expect("create");
    let s = rt.session().clone();
    s.append(Batch::new("op-0", vec![title("durable")]))
        .expect("append");
    s.flush().expect("flush");

    // Another lease fences the next write off: its outcome counts as unknown (poisoned).
    bump_lease(&s);
    s.append(Batch::new("op-1", vec![title("never written")]))
        .expect("accepted in memory");
    s.flush().expect_err("fenced");

    let r = rt.session_ref().clone();
    service
        .close(&r)
        .await
        .expect_err("the close says it was poisoned");
    service.close(&r).await.expect("then it is released");

    let page = service.query().list(None, 50).await.expect("list");
    let entry = page
        .sessions
        .iter()
        .find(|e| e.session_ref.session_id.as_str() == "poisoned")
        .expect("listed");
    assert_eq!(entry.title, "durable", "{entry:?}");
    assert_eq!(entry.durable_sequence, 1, "{entry:?}");
    assert_eq!(entry.event_sequence, 1, "{entry:?}");
}

/// `Root::import` and `verify_file` of a file that is no session file (garbage, an empty
/// file, another program's SQLite database) are `Corrupt` naming the file (outside
/// testing, session 39: "corrupt session store: SQLite reports: file is not a database"
/// named none, so a host importing a batch of files could not tell which one), once.
#[test]
fn a_file_that_is_no_session_file_is_corrupt_naming_it() {
    let (dir, root) = temp_root();
    let garbage = dir.path().join("garbage.sqlite");
    std::fs::write(&garbage, b"this is not a session file".repeat(400)).expect("write");
    let empty = dir.path().join("empty.sqlite");
    std::fs::write(&empty, b"").expect("write");
    let plain = dir.path().join("plain.sqlite");
    rusqlite::Connection::open(&plain)
        .and_then(|c| c.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);"))
        .expect("plain database");
    for file in [&garbage, &empty, &plain] {
        let shown = std::fs::canonicalize(file)
            .expect("canonical")
            .display()
            .to_string();
        for e in [
            root.import(file, session_store::ImportOptions::default())
                .expect_err("import"),
            session_store::verify_file(file).expect_err("verify"),
        ] {
            assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
            assert_eq!(e.to_string().matches(&shown).count(), 1, "{e}");
        }
    }
    assert!(root.list_ids().expect("list").is_empty());
}

/// `verify` names a history row that the log contradicts as a reader would read it, its
/// role quoted or "no role", the expected row the same way: it said `role Some("tool")`,
/// Rust's debug form, and gave only the expected row's id (outside testing Z4).
#[test]
fn verify_names_a_contradicted_history_row_plainly() {
    let (_dir, root) = temp_root();
    let s = create(&root, "h");
    s.append(Batch::new(
        "op-1",
        vec![message("m1", "user", "hello"), message("m2", "tool", "ok")],
    ))
    .expect("append");
    let file = session_file(&s);
    s.close().expect("close");
    let conn = rusqlite::Connection::open(&file).expect("sqlite");
    conn.execute("UPDATE history SET role = NULL WHERE position = 1", [])
        .expect("edit");
    drop(conn);
    let e = root.verify(&id("h")).expect_err("unsound");
    let said = e.to_string();
    assert!(
        said.contains(
            "history index: expected message \"m1\" (role \"user\", 43 bytes) at position 1 \
             from event 1, found message \"m1\" (no role, 43 bytes) at position 1 from event 1"
        ),
        "{said}"
    );
    assert!(!said.contains("Some("), "{said}");
}
