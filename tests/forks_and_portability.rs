//! Forks and rewinds without copying, export to one file, validated import, and a delete
//! that never breaks a fork — on real files, with a real SIGKILL for crash safety.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::json;
use session_store::{
    Batch, CancelToken, Error, Event, ForkPoint, ImportOptions, Origin, Root, replay_file,
};

fn after(turn: &str) -> ForkPoint {
    ForkPoint::AfterTurn(turn.into())
}

fn before(turn: &str) -> ForkPoint {
    ForkPoint::BeforeTurn(turn.into())
}

fn model_ids(root: &Root, name: &str) -> Vec<String> {
    let p = root.open_reader(&id(name)).unwrap().projection().unwrap();
    p.model_messages.iter().map(|m| m.id().to_owned()).collect()
}

fn staging_is_empty(root: &Root) -> bool {
    std::fs::read_dir(root.path().join(".staging")).map_or(true, |mut d| d.next().is_none())
}

/// Seed `TestServiceForkAndRewindUsePersistedTurnBoundaries`, at the storage level.
#[test]
fn fork_and_rewind_use_persisted_turn_boundaries() {
    let (_dir, root) = temp_root();
    let parent = create(&root, "parent");
    parent
        .append(turn("same-size-a", "turn-a", "message-a"))
        .unwrap();
    parent
        .append(turn("same-size-b", "turn-b", "message-b"))
        .unwrap();
    parent.flush().unwrap();

    let child = root
        .fork(&id("parent"), after("turn-a"), Some(id("child-after-a")))
        .unwrap();
    assert_eq!(model_ids(&root, child.as_str()), ["message-a"]);
    let info = root.stat(&child).unwrap();
    assert_eq!(info.inherited_events, 3);
    assert_eq!(info.header.origin, Origin::Fork);
    assert_eq!(info.header.parent_id, Some(id("parent")));

    let rewound = root
        .fork(&id("parent"), before("turn-b"), Some(id("child-before-b")))
        .unwrap();
    assert_eq!(model_ids(&root, rewound.as_str()), ["message-a"]);
    assert_eq!(root.stat(&rewound).unwrap().header.origin, Origin::Rewind);

    // No events were copied: the child file holds none of its own.
    let file = root.session_dir(&child).join("session.sqlite");
    let own: i64 = rusqlite::Connection::open(file)
        .unwrap()
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(own, 0);
    let deps: Vec<_> = root
        .open_reader(&id("parent"))
        .unwrap()
        .dependents()
        .unwrap();
    assert_eq!(deps.len(), 2);

    // The child has its own operation-id space and continues after the cut.
    let w = root.open_writer(&child).unwrap();
    assert_eq!(w.snapshot().event_sequence, 3);
    let c = w
        .append(turn("same-size-b", "turn-b2", "message-b2"))
        .unwrap();
    assert_eq!(
        c.first_seq, 4,
        "a parent's operation id did not dedupe the child's append"
    );
    w.close().unwrap();
    assert_eq!(
        model_ids(&root, child.as_str()),
        ["message-a", "message-b2"]
    );
    let replayed = replay_file(root.session_dir(&child)).unwrap();
    assert_eq!(replayed.commits.len(), 2);
    assert!(
        replayed.commits[0]
            .operation_id
            .starts_with("inherit:parent:")
    );
    parent.close().unwrap();
}

#[test]
fn fork_refuses_unknown_turns_and_unsafe_cuts() {
    let (_dir, root) = temp_root();
    let s = create(&root, "p");
    s.append(turn("a", "turn-a", "m-a")).unwrap();
    // A turn whose start shares a commit with earlier events: rewinding before it would
    // split that commit.
    s.append(
        Batch::new(
            "b",
            vec![
                title("t"),
                Event::new("turn/start"),
                message("m-b", "user", "b"),
                turn_end("completed"),
            ],
        )
        .in_turn("turn-b"),
    )
    .unwrap();
    // A turn that leaves an interaction pending.
    let pending = Event::new("interaction/created")
        .with_payload(&json!({"id": "ask", "state": "pending"}))
        .unwrap();
    s.append(
        Batch::new(
            "c",
            vec![Event::new("turn/start"), pending, turn_end("completed")],
        )
        .in_turn("turn-c"),
    )
    .unwrap();
    s.flush().unwrap();

    let err = root.fork(&id("p"), after("nope"), None).unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    let err = root.fork(&id("p"), before("turn-b"), None).unwrap_err();
    assert!(matches!(err, Error::ForkBoundaryNotAtomic(_)), "{err}");
    let err = root.fork(&id("p"), after("turn-c"), None).unwrap_err();
    assert!(matches!(err, Error::ForkActiveAuthority(_)), "{err}");
    assert!(root.fork(&id("p"), after("turn-b"), Some(id("ok"))).is_ok());
    let err = root
        .fork(&id("p"), after("turn-a"), Some(id("ok")))
        .unwrap_err();
    assert!(matches!(err, Error::SessionExists(_)), "{err}");
    assert_eq!(root.list_ids().unwrap(), vec![id("ok"), id("p")]);
    assert!(staging_is_empty(&root));
    s.close().unwrap();
}

/// The open turn of a session (started, not ended, durable): a rewind before it makes the
/// session as it was before the turn began, and a fork after it says the turn is still
/// open. Both said "completed turn … not found" (`InvalidInput`) of a turn the caller
/// could see running, since no turn row records an open turn.
#[test]
fn a_rewind_before_the_open_turn_cuts_at_its_start() {
    let (_dir, root) = temp_root();
    let s = create(&root, "p");
    s.append(turn("a", "turn-a", "m-a")).unwrap();
    s.append(
        Batch::new(
            "b",
            vec![Event::new("turn/start"), message("m-b", "user", "b")],
        )
        .in_turn("turn-b"),
    )
    .unwrap();
    s.flush().unwrap();

    let child = root
        .fork(&id("p"), before("turn-b"), Some(id("back")))
        .unwrap();
    let reader = root.open_reader(&child).unwrap();
    assert_eq!(
        reader.durable_sequence().unwrap(),
        root.open_reader(&id("p"))
            .unwrap()
            .turn("turn-a")
            .unwrap()
            .unwrap()
            .boundary_sequence
    );
    let projection = reader.projection().unwrap();
    assert_eq!(projection.turn_id, None);
    assert_eq!(model_ids(&root, "back"), ["m-a"]);
    let err = root.fork(&id("p"), after("turn-b"), None).unwrap_err();
    assert!(matches!(err, Error::ForkActiveAuthority(_)), "{err}");
    assert!(
        err.to_string().contains("\"turn-b\" of p is still open"),
        "{err}"
    );
    // A turn id that is not there at all is still not found.
    let err = root.fork(&id("p"), before("turn-z"), None).unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    assert!(err.to_string().contains("not found"), "{err}");
    assert_eq!(root.list_ids().unwrap(), vec![id("back"), id("p")]);
    assert!(staging_is_empty(&root));
    s.close().unwrap();
}

/// Seed `TestServiceExportAndDeleteAreSessionDirectoryAtomic`, at the storage level.
#[test]
fn export_and_delete_are_atomic_and_the_export_is_self_contained() {
    let (dir, root) = temp_root();
    let s = create(&root, "managed");
    s.append(Batch::new(
        "message",
        vec![message("m", "user", &"exported".repeat(20_000))],
    ))
    .unwrap();
    s.flush().unwrap();
    let exported = dir.path().join("exported-session.sqlite");
    let report = root.export(&id("managed"), &exported).unwrap();
    assert_eq!((report.commits, report.events), (1, 1));
    replay_file(&exported).unwrap();
    assert!(
        !Path::new(&format!("{}-wal", exported.display())).exists(),
        "export is one file"
    );
    // The taken destination is named as the export's file, not as a session ("session
    // /tmp/…/exported-session.sqlite already exists" before).
    let err = root.export(&id("managed"), &exported).unwrap_err();
    assert!(err.is_already_exists(), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "export destination {} already exists; give the path of a new file",
            exported.display()
        )
    );
    // A destination ending with '/' names a folder: refused, nothing written (the file was
    // written at the path without it).
    let slashed = dir.path().join("new-export.sqlite/");
    let err = root.export(&id("managed"), &slashed).unwrap_err();
    assert!(err.is_caller_error(), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "invalid input: export destination {} ends with '/', which names a folder; give \
             the path of a new file",
            slashed.display()
        )
    );
    assert!(!dir.path().join("new-export.sqlite").exists());
    s.close().unwrap();

    root.delete(&id("managed"), &CancelToken::new()).unwrap();
    assert!(!root.session_dir(&id("managed")).exists());
    assert!(matches!(
        root.open_reader(&id("managed")),
        Err(Error::SessionNotFound(_))
    ));
    std::fs::remove_dir_all(root.path()).unwrap();
    let again = replay_file(&exported).unwrap();
    assert_eq!(
        again.projection.model_messages[0].text().unwrap().len(),
        160_000
    );
}

/// A reader of an export's temporary file (a backup tool, an indexer, `verify` run on it)
/// does not make the export fail: the export keeps every other connection out of the file
/// until it is done, where the reader's shared lock made its switch to a rollback journal
/// at the end fail with "database is locked" after all its work (outside testing C6,
/// session 41). Here a reader holds a read transaction on the file for 100 ms at a time,
/// every 20 ms, while the export runs.
#[test]
fn a_reader_of_the_export_temporary_file_does_not_fail_the_export() {
    let (dir, root) = temp_root();
    let s = create(&root, "big");
    for turn in 0..40 {
        let text = format!("{turn} {}", "all work and no play ".repeat(20_000));
        s.append(Batch::new(
            format!("m{turn}"),
            vec![message(&format!("m{turn}"), "user", &text)],
        ))
        .unwrap();
    }
    s.close().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (out, done) = (out.clone(), done.clone());
        std::thread::spawn(move || {
            let mut tries = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let temp = std::fs::read_dir(&out).unwrap().flatten().find(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(".sse-") && name.ends_with(".tmp")
                });
                // A poller: a pause between reads, as a tool polling the folder makes.
                std::thread::sleep(Duration::from_millis(20));
                let Some(temp) = temp else {
                    continue;
                };
                tries += 1;
                let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
                if let Ok(conn) = rusqlite::Connection::open_with_flags(temp.path(), flags)
                    && conn.busy_timeout(Duration::ZERO).is_ok()
                {
                    let read = conn.execute_batch("BEGIN; SELECT count(*) FROM sqlite_master;");
                    if read.is_ok() {
                        std::thread::sleep(Duration::from_millis(100));
                        let _ = conn.execute_batch("COMMIT");
                    }
                }
            }
            tries
        })
    };
    let report = root.export(&id("big"), out.join("big.sqlite"));
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let tries = reader.join().unwrap();
    let report = report.unwrap();
    assert_eq!(report.commits, 40);
    assert!(tries > 0, "the reader never saw the temporary file");
    replay_file(out.join("big.sqlite")).unwrap();
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("big.sqlite")]);
}

#[test]
fn a_live_session_exports_without_stopping_its_writer() {
    let (dir, root) = temp_root();
    let s = create(&root, "live");
    s.append(turn("a", "t-a", "m-a")).unwrap();
    s.flush().unwrap();
    let exported = dir.path().join("live.sqlite");
    root.export(&id("live"), &exported).unwrap();
    s.append(turn("b", "t-b", "m-b")).unwrap();
    assert_eq!(s.flush().unwrap(), 6);
    assert_eq!(replay_file(&exported).unwrap().commits.len(), 1);
    s.close().unwrap();
}

/// Seed `TestServiceImportValidatesSelfContainedContentAndPublishesAtomically`, storage level.
#[test]
fn import_validates_and_publishes_atomically() {
    let work = tempfile::tempdir().unwrap();
    let source = Root::open(work.path().join("source")).unwrap();
    let s = create(&source, "portable");
    s.append(Batch::new(
        "large",
        vec![message("large", "user", &"portable".repeat(20_000))],
    ))
    .unwrap();
    s.close().unwrap();
    let bundle = work.path().join("bundle.sqlite");
    source.export(&id("portable"), &bundle).unwrap();
    std::fs::remove_dir_all(source.path()).unwrap();

    let target = Root::open(work.path().join("target")).unwrap();
    let imported = target.import(&bundle, ImportOptions::default()).unwrap();
    assert_eq!(imported, id("portable"));
    let commits = target
        .open_reader(&imported)
        .unwrap()
        .all_commits()
        .unwrap();
    assert!(
        commits[0].events[0].content_ref.is_some(),
        "the large message is a blob"
    );
    let err = target
        .import(&bundle, ImportOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::SessionExists(_)), "{err}");
    assert!(staging_is_empty(&target));

    let desktop = Root::open(work.path().join("desktop")).unwrap();
    let options = |sid: &str| {
        ImportOptions::default()
            .with_session_id(id(sid))
            .with_cwd("/workspace")
            .with_origin(Origin::CanonicalImport)
    };
    let with_header = desktop.import(&bundle, options("portable")).unwrap();
    let info = desktop.stat(&with_header).unwrap();
    assert_eq!(info.header.cwd.as_deref(), Some("/workspace"));
    assert_eq!(info.header.origin, Origin::CanonicalImport);
    let remapped = desktop.import(&bundle, options("migr-conflict")).unwrap();
    assert_eq!(remapped, id("migr-conflict"));
    let p = desktop
        .open_reader(&remapped)
        .unwrap()
        .projection()
        .unwrap();
    assert_eq!(p.transcript_len, 1);
    // The remapped copy keeps its idempotency keys.
    let w = desktop.open_writer(&remapped).unwrap();
    let retried = w
        .append(Batch::new(
            "large",
            vec![message("large", "user", &"portable".repeat(20_000))],
        ))
        .unwrap();
    assert_eq!(retried.first_seq, 1);
    w.close().unwrap();
}

/// A fork's export imported under its parent's id is refused, nothing published: it was
/// published naming itself as its own parent (`show`: "parent a", in the root). Under
/// another id, or under its own, it imports and names its parent.
#[test]
fn a_forks_export_is_not_imported_under_its_parents_id() {
    let work = tempfile::tempdir().unwrap();
    let source = Root::open(work.path().join("source")).unwrap();
    let a = create(&source, "a");
    a.append(turn("t1", "turn-1", "m1")).unwrap();
    a.close().unwrap();
    source
        .fork(&id("a"), after("turn-1"), Some(id("b")))
        .unwrap();
    let bundle = work.path().join("b.sqlite");
    source.export(&id("b"), &bundle).unwrap();

    let target = Root::open(work.path().join("target")).unwrap();
    let err = target
        .import(&bundle, ImportOptions::default().with_session_id(id("a")))
        .unwrap_err();
    assert!(err.is_caller_error(), "{err:?}");
    assert_eq!(
        err.to_string(),
        "invalid input: the export was forked from a: imported as a it would be its own \
         parent; give it another id"
    );
    assert!(target.list_ids().unwrap().is_empty());
    assert!(staging_is_empty(&target));
    for name in ["b", "c"] {
        let options = ImportOptions::default().with_session_id(id(name));
        let imported = target.import(&bundle, options).unwrap();
        let header = target.stat(&imported).unwrap().header;
        assert_eq!(header.parent_id, Some(id("a")), "{name}");
    }
}

/// Exports session `src` of a root under `work`, three one-message commits (`op0`..`op2`,
/// tool messages holding `content(i)`), to `work/bundle.sqlite`.
fn export_of_three(work: &Path, content: impl Fn(usize) -> String) -> std::path::PathBuf {
    let source = Root::open(work.join("source")).unwrap();
    let s = create(&source, "src");
    for i in 0..3 {
        s.append(Batch::new(
            format!("op{i}"),
            vec![message(&format!("m{i}"), "tool", &content(i))],
        ))
        .unwrap();
    }
    s.close().unwrap();
    let bundle = work.join("bundle.sqlite");
    source.export(&id("src"), &bundle).unwrap();
    bundle
}

fn tamper(bundle: &Path, name: &str, work: &Path, f: impl FnOnce(&Path)) -> std::path::PathBuf {
    let copy = work.join(name);
    std::fs::copy(bundle, &copy).unwrap();
    f(&copy);
    copy
}

fn sql(file: &Path, statements: &str) {
    rusqlite::Connection::open(file)
        .unwrap()
        .execute_batch(statements)
        .unwrap();
}

#[test]
fn import_refuses_damaged_files_and_leaves_nothing_behind() {
    let work = tempfile::tempdir().unwrap();
    let bundle = export_of_three(work.path(), |i| format!("{i}").repeat(100_000));
    let len = std::fs::metadata(&bundle).unwrap().len();

    let bad = [
        tamper(&bundle, "truncated", work.path(), |f| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(f)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        }),
        tamper(&bundle, "flipped-blob", work.path(), |f| {
            let conn = rusqlite::Connection::open(f).unwrap();
            let (digest, mut data): (String, Vec<u8>) = conn
                .query_row("SELECT digest, data FROM blobs LIMIT 1", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .unwrap();
            let mid = data.len() / 2;
            data[mid] ^= 0x40;
            conn.execute(
                "UPDATE blobs SET data = ?1 WHERE digest = ?2",
                rusqlite::params![data, digest],
            )
            .unwrap();
        }),
        tamper(&bundle, "gap", work.path(), |f| {
            sql(
                f,
                "DELETE FROM events WHERE seq = 2; DELETE FROM commits WHERE first_seq = 2;",
            );
        }),
        tamper(&bundle, "not-sqlite", work.path(), |f| {
            std::fs::write(f, b"hello, not a database at all").unwrap()
        }),
        tamper(&bundle, "other-app", work.path(), |f| {
            sql(f, "PRAGMA application_id = 42;")
        }),
        tamper(&bundle, "lineage", work.path(), |f| {
            sql(
                f,
                "INSERT INTO lineage (depth, ancestor_id, after_seq, through_seq) VALUES (0, 'elsewhere', 0, 1);",
            )
        }),
    ];
    let target = Root::open(work.path().join("target")).unwrap();
    for file in &bad {
        let err = target.import(file, ImportOptions::default()).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt { .. } | Error::InvalidInput { .. }),
            "{}: unexpected {err:?}",
            file.display()
        );
        assert!(target.list_ids().unwrap().is_empty(), "{}", file.display());
        assert!(staging_is_empty(&target), "{}", file.display());
    }
    // Lineage rows are what is wrong, not the ancestor they name being out of reach (the
    // error used to be "inherits from elsewhere, which cannot be read: session <the
    // file's grandparent folder>/elsewhere not found").
    let err = target
        .import(&bad[5], ImportOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert!(
        err.to_string().contains("not a self-contained export")
            && err.to_string().contains("elsewhere"),
        "{err}"
    );
    assert_eq!(
        target.import(&bundle, ImportOptions::default()).unwrap(),
        id("src")
    );
}

/// An export with a hot journal beside it (a write to it that did not finish: the file and
/// its `-journal` copied while a transaction was open) is refused by `import` and
/// `verify_file` as invalid input naming the file and the journal and saying how to roll
/// it back; the file and its journal unchanged, nothing published or staged. Both failed
/// with SQLite's bare "attempt to write a readonly database" (exit 1) before.
#[test]
fn an_export_with_a_hot_journal_is_refused_naming_it() {
    let work = tempfile::tempdir().unwrap();
    let bundle = export_of_three(work.path(), |i| format!("{i}"));
    let conn = rusqlite::Connection::open(&bundle).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = DELETE; PRAGMA cache_size = 1; BEGIN IMMEDIATE; \
         UPDATE header SET cwd = '/elsewhere'; DELETE FROM history;",
    )
    .unwrap();
    // Enough pages that the one-page cache spills: the journal then has its header.
    for seq in 0..200 {
        conn.execute(
            "INSERT INTO history_resets (seq) VALUES (?1)",
            [1_000 + seq],
        )
        .unwrap();
    }
    let journal = work.path().join("bundle.sqlite-journal");
    assert!(journal.is_file());
    let hot = work.path().join("hot.sqlite");
    std::fs::copy(&bundle, &hot).unwrap();
    std::fs::copy(&journal, work.path().join("hot.sqlite-journal")).unwrap();
    drop(conn);
    let before = (
        std::fs::read(&hot).unwrap(),
        std::fs::read(work.path().join("hot.sqlite-journal")).unwrap(),
    );
    let target = Root::open(work.path().join("target")).unwrap();
    let errors = [
        target.import(&hot, ImportOptions::default()).unwrap_err(),
        session_store::verify_file(&hot).unwrap_err(),
    ];
    for e in errors {
        assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("{} has a hot journal", hot.display()))
                && text.contains("hot.sqlite-journal")
                && text.contains("roll it back"),
            "{text}"
        );
    }
    let after = (
        std::fs::read(&hot).unwrap(),
        std::fs::read(work.path().join("hot.sqlite-journal")).unwrap(),
    );
    assert!(before == after, "the file or its journal changed");
    assert!(target.list_ids().unwrap().is_empty());
    assert!(staging_is_empty(&target));
}

/// Events that no commit row covers (its commit rows deleted, or a row added past the last
/// commit) are part of no log: import used to publish what the commits named (an empty
/// session when none was left) and `verify_file` called such a file sound.
#[test]
fn events_outside_every_commit_are_refused_by_import_and_verify() {
    let work = tempfile::tempdir().unwrap();
    let bundle = export_of_three(work.path(), |_| "hi".to_string());

    let bad = [
        tamper(&bundle, "no-commits", work.path(), |f| {
            sql(
                f,
                "DELETE FROM commits; DELETE FROM turns; DELETE FROM history;",
            )
        }),
        tamper(&bundle, "orphan-tail", work.path(), |f| {
            sql(
                f,
                "INSERT INTO events (seq, kind, payload) VALUES (4, 'session/title', '{\"title\":\"x\"}');",
            )
        }),
        tamper(&bundle, "orphan-zero", work.path(), |f| {
            sql(
                f,
                "INSERT INTO events (seq, kind) VALUES (0, 'turn/start');",
            )
        }),
    ];
    let target = Root::open(work.path().join("target")).unwrap();
    for file in &bad {
        let before = std::fs::read(file).unwrap();
        let err = session_store::verify_file(file).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt { .. }),
            "{}: verify gave {err:?}",
            file.display()
        );
        let err = target.import(file, ImportOptions::default()).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt { .. }),
            "{}: import gave {err:?}",
            file.display()
        );
        assert!(
            err.to_string().contains("no commit"),
            "{}: the error names the problem: {err}",
            file.display()
        );
        assert!(target.list_ids().unwrap().is_empty(), "{}", file.display());
        assert!(staging_is_empty(&target), "{}", file.display());
        assert_eq!(std::fs::read(file).unwrap(), before, "{}", file.display());
    }
}

/// Appends one turn with a large (blob) tool output.
fn blob_turn(s: &session_store::Session, tag: &str) {
    let output = json!({"message": {"id": format!("out-{tag}"), "role": "tool", "content": tag.repeat(70_000)}});
    s.append(
        Batch::new(
            format!("op-{tag}"),
            vec![
                Event::new("turn/start"),
                Event::new("message/complete")
                    .with_payload(&output)
                    .unwrap(),
                turn_end("completed"),
            ],
        )
        .in_turn(format!("turn-{tag}")),
    )
    .unwrap();
}

fn events_json(root: &Root, name: &str) -> String {
    let commits = root.open_reader(&id(name)).unwrap().all_commits().unwrap();
    let events: Vec<_> = commits.iter().flat_map(|c| c.events.iter()).collect();
    serde_json::to_string(&events).unwrap()
}

#[test]
fn deleting_ancestors_of_a_fork_chain_keeps_every_descendant_whole() {
    let (dir, root) = temp_root();
    let a = create(&root, "a");
    blob_turn(&a, "a1");
    blob_turn(&a, "a2");
    a.close().unwrap();
    root.fork(&id("a"), after("turn-a1"), Some(id("b")))
        .unwrap();
    let b = root.open_writer(&id("b")).unwrap();
    blob_turn(&b, "b1");
    b.close().unwrap();
    root.fork(&id("b"), after("turn-b1"), Some(id("c")))
        .unwrap();
    let c = root.open_writer(&id("c")).unwrap();
    blob_turn(&c, "c1");
    c.close().unwrap();
    let info = root.stat(&id("c")).unwrap();
    assert_eq!(info.lineage.len(), 2, "flattened: a and b");
    let ranges: u64 = info
        .lineage
        .iter()
        .map(|e| e.through_seq - e.after_seq)
        .sum();
    assert_eq!(info.inherited_events, ranges);
    assert!(info.inherited_events > 0 && info.inherited_events < info.durable_sequence);

    let before_c = events_json(&root, "c");
    let before_b = events_json(&root, "b");
    root.delete(&id("a"), &CancelToken::new()).unwrap();
    assert_eq!(events_json(&root, "c"), before_c);
    assert_eq!(events_json(&root, "b"), before_b);
    root.delete(&id("b"), &CancelToken::new()).unwrap();
    assert_eq!(events_json(&root, "c"), before_c);
    // Materialised: nothing is read from an ancestor any more (the header keeps the cut's
    // count); `show` printed "own N, inherited M" with N + M over the durable sequence.
    let info = root.stat(&id("c")).unwrap();
    assert!(info.lineage.is_empty());
    assert_eq!(info.inherited_events, 0);
    assert!(info.header.inherited_events > 0);
    assert_eq!(root.list_ids().unwrap(), vec![id("c")]);

    let replayed = replay_file(root.session_dir(&id("c"))).unwrap();
    assert_eq!(replayed.commits.len(), 3);
    let exported = dir.path().join("c.sqlite");
    root.export(&id("c"), &exported).unwrap();
    let from_export = replay_file(&exported).unwrap();
    let blob_bytes: Vec<usize> = from_export
        .commits
        .iter()
        .map(|c| c.events[1].payload_len())
        .collect();
    assert!(blob_bytes.iter().all(|&n| n > 140_000), "{blob_bytes:?}");
    let imported = root
        .import(
            &exported,
            ImportOptions::default().with_session_id(id("c2")),
        )
        .unwrap();
    assert_eq!(root.stat(&imported).unwrap().inherited_events, 0);
    assert_eq!(
        serde_json::to_string(
            &from_export
                .commits
                .iter()
                .flat_map(|c| c.events.iter())
                .collect::<Vec<_>>()
        )
        .unwrap(),
        before_c
    );
}

/// Child role: deletes session `a` of the root in `SS_ROOT`.
#[test]
#[ignore = "child process role, run by the crash tests"]
fn child_delete_role() {
    let root = Root::open(std::env::var("SS_ROOT").unwrap()).unwrap();
    println!("deleting");
    root.delete(&id("a"), &CancelToken::new()).unwrap();
    println!("deleted");
}

/// A parent with many commits and blobs, and two forks of it (one a fork of the other).
fn forked_family(root: &Root) {
    let a = create(root, "a");
    for i in 0..40 {
        blob_turn(&a, &format!("{i:03}"));
    }
    for i in 0..400 {
        a.append(Batch::new(
            format!("small-{i}"),
            vec![message(&format!("s{i}"), "user", "small")],
        ))
        .unwrap();
    }
    a.close().unwrap();
    root.fork(&id("a"), after("turn-039"), Some(id("b")))
        .unwrap();
    let b = root.open_writer(&id("b")).unwrap();
    blob_turn(&b, "b");
    b.close().unwrap();
    root.fork(&id("b"), after("turn-b"), Some(id("c"))).unwrap();
    root.fork(&id("a"), after("turn-010"), Some(id("d")))
        .unwrap();
}

#[test]
fn a_delete_killed_at_random_points_never_breaks_a_fork() {
    let trials: usize = std::env::var("DELETE_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut completed = 0;
    for trial in 0..trials {
        let (_dir, root) = temp_root();
        forked_family(&root);
        let expected: Vec<(String, String)> = ["b", "c", "d"]
            .iter()
            .map(|n| (n.to_string(), events_json(&root, n)))
            .collect();
        let root_path = root.path().to_str().unwrap().to_owned();
        let mut child = spawn_role("child_delete_role", &[("SS_ROOT", &root_path)]);
        std::thread::sleep(Duration::from_millis(fastrand::u64(5..150)));
        child.kill().unwrap();
        if child.wait().unwrap().success() {
            completed += 1;
        }
        for (name, events) in &expected {
            assert_eq!(
                &events_json(&root, name),
                events,
                "trial {trial}: {name} changed"
            );
            replay_file(root.session_dir(&id(name))).unwrap();
        }
        for present in root.list_ids().unwrap() {
            replay_file(root.session_dir(&present))
                .unwrap_or_else(|e| panic!("trial {trial}: {present}: {e}"));
        }
        // Whatever the kill interrupted, a second delete finishes the job.
        if root.session_dir(&id("a")).exists() {
            root.delete(&id("a"), &CancelToken::new()).unwrap();
        }
        for (name, events) in &expected {
            assert_eq!(
                &events_json(&root, name),
                events,
                "trial {trial}: {name} after re-delete"
            );
        }
    }
    eprintln!("{trials} kills, {completed} deletes finished before the kill");
}

/// How many reads [`reads_of`] makes, each on its own reader.
const READS: usize = 11;

/// Everything a fork's reader reads, as text: turns, one turn and its lookups, commit
/// boundaries, the transcript (whole, as texts, its length), a blob, the commits and the
/// projection; read `i` on reader `r(i)`, so that no read re-reads the lineage for another.
fn reads_of<'r>(
    r: impl Fn(usize) -> &'r session_store::SessionReader,
    digest: &str,
) -> Vec<String> {
    let snapshot = r(0).durable_sequence().unwrap();
    let reads: [(&str, session_store::Result<String>); READS] = [
        ("turns", r(0).turns().map(|t| format!("{t:?}"))),
        (
            "turns_overlapping",
            r(1).turns_overlapping(1, 6).map(|t| format!("{t:?}")),
        ),
        ("turn", r(2).turn("turn-001").map(|t| format!("{t:?}"))),
        (
            "turn_holding",
            r(3).turn_holding(2).map(|t| format!("{t:?}")),
        ),
        (
            "is_commit_boundary",
            r(4).is_commit_boundary(3).map(|b| b.to_string()),
        ),
        (
            "transcript",
            r(5).transcript(snapshot).map(|t| {
                t.iter()
                    .map(|m| m.id().to_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            }),
        ),
        (
            "transcript_texts",
            r(6).transcript_texts(snapshot, 10)
                .map(|t| t.len().to_string()),
        ),
        (
            "transcript_len",
            r(7).transcript_len(snapshot).map(|n| n.to_string()),
        ),
        (
            "blob",
            r(8).blob(digest)
                .map(|b| format!("{:?}", b.map(|b| b.len()))),
        ),
        ("commits", r(9).commits(0, 100).map(|c| c.len().to_string())),
        (
            "projection",
            r(10)
                .projection()
                .map(|p| p.model_messages.len().to_string()),
        ),
    ];
    reads
        .into_iter()
        .map(|(what, read)| format!("{what}: {read:?}"))
        .collect()
}

/// Readers of a fork opened before its parent is deleted (the delete copies the parent's
/// range into the fork) read everything afterwards as a new reader does. Only the commit
/// reads and the transcript's paged reads re-read the lineage before: turns, turn lookups,
/// commit boundaries, the whole transcript and blobs went to the parent's removed file,
/// "session …/a/session.sqlite not found" (the fork is whole).
#[test]
fn a_reader_opened_before_its_parents_delete_reads_the_copied_range() {
    let (_dir, root) = temp_root();
    let a = create(&root, "a");
    for i in 0..4 {
        blob_turn(&a, &format!("{i:03}"));
    }
    a.close().unwrap();
    root.fork(&id("a"), after("turn-002"), Some(id("b")))
        .unwrap();
    let digest = sqlite3(
        &root.session_dir(&id("a")).join("session.sqlite"),
        "SELECT payload_ref FROM events WHERE payload_ref IS NOT NULL ORDER BY seq LIMIT 1",
    )
    .trim()
    .to_owned();
    let early: Vec<_> = (0..READS)
        .map(|_| root.open_reader(&id("b")).unwrap())
        .collect();
    let fresh = root.open_reader(&id("b")).unwrap();
    let before = reads_of(|_| &fresh, &digest);
    assert!(before.iter().all(|r| r.contains(": Ok(")), "{before:#?}");
    root.delete(&id("a"), &CancelToken::new()).unwrap();
    assert!(!root.session_dir(&id("a")).exists());
    assert_eq!(reads_of(|i| &early[i], &digest), before);
    let after = root.open_reader(&id("b")).unwrap();
    assert_eq!(reads_of(|_| &after, &digest), before);
}

/// `Root::stat` and `Root::stats` of a session that another thread keeps deleting and
/// importing again (alone, or as the leaf of a chain whose ancestors it deletes, which
/// materialises their ranges into the leaf): each call either answers or says the session
/// is not found; never a disk I/O error, never "corrupt" for a sound file whose folder, or
/// an ancestor's, left while it was read.
fn reads_racing_deletes_answer_or_say_not_found(chain: bool) {
    let (dir, root) = temp_root();
    let s = create(&root, "s");
    for i in 0..60 {
        s.append(turn(&format!("op{i}"), &format!("t{i}"), &format!("m{i}")))
            .expect("append");
    }
    s.close().expect("close");
    let export = dir.path().join("s.export");
    root.export(&id("s"), &export).expect("export");
    let target = id(if chain { "leaf" } else { "s" });
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (root, done) = (root.clone(), std::sync::Arc::clone(&done));
        std::thread::spawn(move || {
            let never = CancelToken::new();
            let import = || {
                root.import(&export, ImportOptions::default().with_session_id(id("s")))
                    .expect("import")
            };
            for _ in 0..150 {
                if chain {
                    let mid = root.fork(
                        &id("s"),
                        ForkPoint::AfterTurn("t40".into()),
                        Some(id("mid")),
                    );
                    mid.expect("fork mid");
                    let leaf = root.fork(
                        &id("mid"),
                        ForkPoint::AfterTurn("t20".into()),
                        Some(id("leaf")),
                    );
                    leaf.expect("fork leaf");
                    root.delete(&id("mid"), &never).expect("delete mid");
                    root.delete(&id("s"), &never).expect("delete s");
                    root.delete(&id("leaf"), &never).expect("delete leaf");
                } else {
                    root.delete(&id("s"), &never).expect("delete s");
                }
                import();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let (mut answered, mut not_found, mut wrong) = (0, 0, Vec::new());
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        for result in [root.stat(&target).map(drop), root.stats(&target).map(drop)] {
            match result {
                Ok(()) => answered += 1,
                Err(Error::SessionNotFound(_)) => not_found += 1,
                Err(e) => wrong.push(e.to_string()),
            }
        }
    }
    churn.join().expect("churn");
    println!(
        "chain {chain}: {answered} answered, {not_found} not found, {} other",
        wrong.len()
    );
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "reads racing deletes failed otherwise: {wrong:#?}"
    );
    assert!(
        answered > 0 && not_found > 0,
        "{answered} answered, {not_found} not found"
    );
}

#[test]
fn stat_and_stats_racing_a_delete_answer_or_say_not_found() {
    reads_racing_deletes_answer_or_say_not_found(false);
}

#[test]
fn stat_and_stats_racing_deletes_in_a_fork_chain_answer_or_say_not_found() {
    reads_racing_deletes_answer_or_say_not_found(true);
}

/// Replaces the file of session `name` (closed) with bytes that are not a database.
fn damage(root: &Root, name: &str) {
    let dir = root.session_dir(&id(name));
    for leftover in ["session.sqlite-wal", "session.sqlite-shm"] {
        let _ = std::fs::remove_file(dir.join(leftover));
    }
    std::fs::write(dir.join("session.sqlite"), vec![0x5a; 8192]).unwrap();
}

/// A session whose file is not a readable session any more is deleted too, unless another
/// session inherits from it (named in the refusal, both kept); one of a newer version is kept.
#[test]
fn an_unreadable_session_is_deleted_unless_another_inherits_from_it() {
    let (_dir, root) = temp_root();
    let never = CancelToken::new();
    for name in ["lone", "parent", "newer"] {
        let s = create(&root, name);
        s.append(turn("o1", "t1", "m1")).unwrap();
        s.close().unwrap();
    }
    root.fork(&id("parent"), after("t1"), Some(id("child")))
        .unwrap();

    damage(&root, "lone");
    root.delete(&id("lone"), &never).unwrap();
    assert!(!root.session_dir(&id("lone")).exists());
    assert!(!root.list_ids().unwrap().contains(&id("lone")));

    damage(&root, "parent");
    let err = root.delete(&id("parent"), &never).unwrap_err();
    assert!(err.is_corrupt(), "{err}");
    assert!(err.to_string().contains("child inherits from it"), "{err}");
    assert!(
        root.session_dir(&id("parent"))
            .join("session.sqlite")
            .is_file()
    );
    assert_eq!(
        std::fs::read(root.session_dir(&id("parent")).join("session.sqlite")).unwrap(),
        vec![0x5a; 8192]
    );
    assert!(root.list_ids().unwrap().contains(&id("child")));

    sql(
        &root.session_dir(&id("newer")).join("session.sqlite"),
        "PRAGMA user_version = 999;",
    );
    let err = root.delete(&id("newer"), &never).unwrap_err();
    assert!(err.is_unsupported(), "{err}");
    assert!(root.list_ids().unwrap().contains(&id("newer")));

    // Once nothing inherits from it, the damaged parent goes too.
    root.delete(&id("child"), &never).unwrap();
    root.delete(&id("parent"), &never).unwrap();
    assert_eq!(root.list_ids().unwrap(), vec![id("newer")]);
}

#[test]
fn a_fork_racing_the_delete_of_its_parent_is_made_whole_or_not_found() {
    let (dir, root) = temp_root();
    let export = exported_turns(&root, dir.path(), 40);
    let again = ImportOptions::default().with_session_id(id("p"));
    let (mut made, mut gone, mut wrong) = (0, 0, Vec::new());
    for round in 0..60 {
        root.import(&export, again.clone()).unwrap();
        let child = id(&format!("c{round}"));
        // The delete and the fork at once, the fork a little later each round.
        let (forked, deleted) = std::thread::scope(|scope| {
            let fork = scope.spawn(|| {
                std::thread::sleep(Duration::from_micros(50 * (round % 20)));
                root.fork(
                    &id("p"),
                    ForkPoint::AfterTurn("t30".into()),
                    Some(child.clone()),
                )
            });
            let delete = scope.spawn(|| root.delete(&id("p"), &CancelToken::new()));
            (fork.join().unwrap(), delete.join().unwrap())
        });
        deleted.unwrap();
        match forked {
            Ok(_) => {
                made += 1;
                let reader = root.open_reader(&child).unwrap();
                assert_eq!(
                    reader
                        .transcript(reader.durable_sequence().unwrap())
                        .unwrap()
                        .len(),
                    31
                );
                root.verify(&child).unwrap();
            }
            Err(Error::SessionNotFound(what)) if what == "p" => gone += 1,
            Err(e) => wrong.push(format!("round {round}: {e}")),
        }
    }
    println!("{made} forks made, {gone} not found");
    assert!(
        wrong.is_empty(),
        "a fork racing its parent's delete: {wrong:#?}"
    );
}

/// Four exports of one session to one path at once: one writes the file, each other one
/// is `DestinationExists` saying so of the path (they said "session PATH already exists",
/// naming the file a session: outside testing, session 36).
#[test]
fn exports_racing_to_one_path_leave_one_file_and_name_the_destination() {
    let (dir, root) = temp_root();
    let s = create(&root, "src");
    s.append(turn("o", "t", "m")).unwrap();
    s.close().unwrap();
    for round in 0..10 {
        let dest = dir.path().join(format!("out-{round}.sqlite"));
        let barrier = std::sync::Barrier::new(4);
        let results: Vec<Result<session_store::ExportReport, Error>> =
            std::thread::scope(|scope| {
                let runs: Vec<_> = (0..4)
                    .map(|_| {
                        scope.spawn(|| {
                            barrier.wait();
                            root.export(&id("src"), &dest)
                        })
                    })
                    .collect();
                runs.into_iter().map(|r| r.join().unwrap()).collect()
            });
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            1,
            "{results:?}"
        );
        for e in results.into_iter().filter_map(Result::err) {
            assert!(
                matches!(e, Error::DestinationExists(_))
                    && e.to_string().starts_with("export destination"),
                "{e}"
            );
        }
        session_store::verify_file(&dest).unwrap();
    }
}

#[test]
fn an_export_racing_a_delete_is_whole_or_not_found_naming_the_session() {
    let (dir, root) = temp_root();
    let export = exported_turns(&root, dir.path(), 40);
    let again = ImportOptions::default().with_session_id(id("p"));
    let (mut made, mut gone, mut wrong) = (0, 0, Vec::new());
    for round in 0..60u64 {
        root.import(&export, again.clone()).unwrap();
        let out = dir.path().join(format!("p{round}.export"));
        // The delete and the export at once, the export a little later each round.
        let (exported, deleted) = std::thread::scope(|scope| {
            let export = scope.spawn(|| {
                std::thread::sleep(Duration::from_micros(50 * (round % 20)));
                root.export(&id("p"), &out)
            });
            let delete = scope.spawn(|| root.delete(&id("p"), &CancelToken::new()));
            (export.join().unwrap(), delete.join().unwrap())
        });
        deleted.unwrap();
        match exported {
            Ok(_) => {
                made += 1;
                session_store::verify_file(&out).unwrap();
            }
            Err(Error::SessionNotFound(what)) if what == "p" => gone += 1,
            Err(e) => wrong.push(format!("round {round}: {e}")),
        }
    }
    println!("{made} exports made, {gone} not found");
    assert!(wrong.is_empty(), "an export racing a delete: {wrong:#?}");
}

/// Session `p` of two turns and `f`, its fork after the first.
fn parent_and_fork(root: &Root) {
    let s = create(root, "p");
    s.append(turn("op-1", "t1", "m1")).unwrap();
    s.append(turn("op-2", "t2", "m2")).unwrap();
    s.close().unwrap();
    root.fork(&id("p"), after("t1"), Some(id("f"))).unwrap();
}

/// A delete copies the range a fork inherits into the fork first. When the parent holds
/// less of that range than the fork inherits (a commit row edited so the range reads
/// short), the delete is refused as `Corrupt` naming both, the parent kept and the fork
/// unchanged: it copied what it found, dropped the fork's lineage row and deleted the
/// parent, leaving the fork without the rest of its history.
#[test]
fn a_delete_whose_parent_holds_less_than_the_forks_range_is_refused() {
    let (_dir, root) = temp_root();
    parent_and_fork(&root);
    let parent = root.session_dir(&id("p")).join("session.sqlite");
    let conn = rusqlite::Connection::open(&parent).unwrap();
    conn.execute("UPDATE commits SET last_seq = 6 WHERE first_seq = 1", [])
        .unwrap();
    drop(conn);
    let fork = root.session_dir(&id("f")).join("session.sqlite");
    let before = std::fs::read(&fork).unwrap();
    let e = root.delete(&id("p"), &CancelToken::new()).unwrap_err();
    assert!(e.is_corrupt(), "{e:?}");
    assert!(
        e.to_string().contains("p is kept, as f inherits from it"),
        "{e}"
    );
    assert!(parent.is_file());
    assert_eq!(std::fs::read(&fork).unwrap(), before);
    assert_eq!(root.stat(&id("f")).unwrap().lineage.len(), 1);
}

/// A delete of a parent whose range a fork inherits holds an edited event (its commit's
/// operation hash no longer matches) or an event row moved out of its commit is refused
/// as `Corrupt` naming both, the parent kept and the fork's file unchanged: it copied the
/// damaged commits into the fork under new operation ids and deleted the parent, so the
/// fork went on failing to read and the original rows were gone.
#[test]
fn a_delete_whose_parent_range_is_damaged_is_refused() {
    for damage in [
        "UPDATE events SET payload = replace(payload, 'm1', 'mX') WHERE seq = 2",
        "UPDATE events SET seq = 100 WHERE seq = 2",
    ] {
        let (_dir, root) = temp_root();
        parent_and_fork(&root);
        let parent = root.session_dir(&id("p")).join("session.sqlite");
        let changed = rusqlite::Connection::open(&parent)
            .unwrap()
            .execute(damage, [])
            .unwrap();
        assert_eq!(changed, 1, "{damage}");
        let fork = root.session_dir(&id("f")).join("session.sqlite");
        let before = std::fs::read(&fork).unwrap();
        let e = root.delete(&id("p"), &CancelToken::new()).unwrap_err();
        assert!(e.is_corrupt(), "{damage}: {e:?}");
        assert!(
            e.to_string().contains("p is kept, as f inherits from it"),
            "{damage}: {e}"
        );
        assert!(parent.is_file(), "{damage}");
        assert_eq!(std::fs::read(&fork).unwrap(), before, "{damage}");
        assert_eq!(root.stat(&id("f")).unwrap().lineage.len(), 1, "{damage}");
    }
}

/// Session `p` of three turns `t1`-`t3` (3 events each, one commit per turn) in a fresh
/// root.
fn three_turns() -> (tempfile::TempDir, Root) {
    let (dir, root) = temp_root();
    let s = create(&root, "p");
    for t in 1..=3 {
        s.append(turn(&format!("op-{t}"), &format!("t{t}"), &format!("m{t}")))
            .unwrap();
    }
    s.close().unwrap();
    (dir, root)
}

/// Many forks of one parent leave the parent's WAL empty: each fork's `dependents` row was
/// a commit there that no checkpoint emptied while nobody wrote the parent (the fork's own
/// reader held a snapshot as it wrote it), so the WAL grew by about 8 KB a fork and every
/// open of the parent or a fork read through it (outside testing L1: `rebuild-catalog`
/// took 101 s for 2,000 forks of one parent).
#[test]
fn forks_of_one_parent_leave_its_wal_empty() {
    let (_dir, root) = three_turns();
    let wal = root.session_dir(&id("p")).join("session.sqlite-wal");
    for n in 0..40 {
        root.fork(&id("p"), after("t2"), Some(id(&format!("f{n}"))))
            .unwrap();
        let bytes = std::fs::metadata(&wal).map_or(0, |m| m.len());
        assert_eq!(bytes, 0, "after fork {n}");
    }
    assert_eq!(
        root.open_reader(&id("p"))
            .unwrap()
            .dependents()
            .unwrap()
            .len(),
        40
    );
}

/// A fork of a parent whose cut commit is damaged (its commit row does not match its row
/// hash, one of its event rows is missing, one of its events is edited, the same in an
/// ancestor of a fork) is refused as `Corrupt` naming the parent, leaving no child, no
/// staged folder and no `dependents` row behind (it made a child of the damage before).
#[test]
fn a_fork_of_a_damaged_range_is_refused_leaving_nothing() {
    let damages = [
        "UPDATE commits SET created_at = created_at + 1 WHERE first_seq = 4",
        "DELETE FROM events WHERE seq = 4",
        "UPDATE events SET payload = replace(payload, 'm2', 'mX') WHERE seq = 5",
    ];
    for (n, damage) in damages.iter().enumerate() {
        for chain in [false, true] {
            let (_dir, root) = three_turns();
            // Forked from `f`, a fork of `p` inheriting all of it, in the second round.
            let forked = if chain {
                root.fork(&id("p"), after("t3"), Some(id("f"))).unwrap()
            } else {
                id("p")
            };
            let dependents = |name: &str| {
                root.open_reader(&id(name))
                    .unwrap()
                    .dependents()
                    .unwrap()
                    .len()
            };
            let before = dependents("p");
            let changed =
                rusqlite::Connection::open(root.session_dir(&id("p")).join("session.sqlite"))
                    .unwrap()
                    .execute(damage, [])
                    .unwrap();
            assert_eq!(changed, 1, "{damage}");
            let e = root
                .fork(&forked, after("t2"), Some(id("child")))
                .unwrap_err();
            assert!(e.is_corrupt(), "damage {n} chain {chain}: {e:?}");
            let text = e.to_string();
            assert!(
                text.contains(&format!("session {forked} cannot be forked at sequence 6")),
                "{text}"
            );
            assert!(!root.session_dir(&id("child")).exists(), "{text}");
            assert!(staging_is_empty(&root), "{text}");
            assert_eq!(dependents("p"), before, "{text}");
            if chain {
                assert_eq!(dependents("f"), 0, "{text}");
            }
        }
    }
}

/// A fork after a turn whose turn index row (which chooses the cut) was edited behind the
/// store's back, so that the commit it names holds no `turn/end` at the row's end or one
/// of another status, is refused as `Corrupt` naming the parent and the turn, leaving no
/// child, staged folder or `dependents` row (it made a child cut where the row said, in
/// the middle of the turn, which then failed `verify`). Damage earlier in the parent's
/// history, away from the cut, is not looked for (that would read the whole prefix,
/// ARCHITECTURE §6): the fork is made, and its `verify` and reads fail naming the damaged
/// event and the parent's file that holds it.
#[test]
fn a_fork_after_a_turn_whose_index_row_the_log_contradicts_is_refused() {
    let damages = [
        (
            "UPDATE turns SET end_seq = 5 WHERE turn_id = 't2'",
            "turn index: turn \"t2\" is stored as ending at 5 with status \"completed\", which \
             the log does not hold (its commit 4..=6 has no turn/end at 5)",
        ),
        (
            "UPDATE turns SET status = 'failed' WHERE turn_id = 't2'",
            "turn index: turn \"t2\" is stored as ending at 6 with status \"failed\", which the \
             log does not hold (its commit 4..=6 has a turn/end of status \"completed\")",
        ),
    ];
    for (damage, says) in damages {
        let (_dir, root) = three_turns();
        let file = root.session_dir(&id("p")).join("session.sqlite");
        sqlite3(&file, damage);
        let e = root
            .fork(&id("p"), after("t2"), Some(id("child")))
            .unwrap_err();
        assert!(e.is_corrupt(), "{damage}: {e:?}");
        assert!(
            e.to_string()
                .contains(&format!("session p cannot be forked at sequence 6: {says}")),
            "{e}"
        );
        assert!(!root.session_dir(&id("child")).exists(), "{damage}");
        assert!(staging_is_empty(&root), "{damage}");
        let reader = root.open_reader(&id("p")).unwrap();
        assert!(reader.dependents().unwrap().is_empty(), "{damage}");
    }
    let (_dir, root) = three_turns();
    let file = root.session_dir(&id("p")).join("session.sqlite");
    sqlite3(
        &file,
        "UPDATE events SET payload = replace(payload, 'm1', 'mX') WHERE seq = 2",
    );
    root.fork(&id("p"), after("t2"), Some(id("child"))).unwrap();
    for name in ["p", "child"] {
        let e = root.verify(&id(name)).map(|_| ()).unwrap_err();
        assert!(e.is_corrupt(), "{name}: {e:?}");
        assert!(
            e.to_string()
                .contains("event 2: the row does not match its check"),
            "{name}: {e}"
        );
    }
    // The fork's reads name the file that holds the damaged row, its parent's (they named
    // the fork's own file, which holds no event: outside testing T6).
    let in_parent = format!(
        "session child inherits sequences 1..=6 from p ({}): event 2: the row does not match",
        file.display()
    );
    let child = root.open_reader(&id("child")).unwrap();
    let errors = [
        root.verify(&id("child")).map(|_| ()).unwrap_err(),
        child.all_commits().map(|_| ()).unwrap_err(),
        child
            .transcript(child.durable_sequence().unwrap())
            .map(|_| ())
            .unwrap_err(),
    ];
    for e in errors {
        assert!(e.is_corrupt(), "{e:?}");
        assert!(e.to_string().contains(&in_parent), "{e}");
    }
}

/// `verify` of a parent whose `dependents` row says a fork inherits beyond the end of its
/// log is `Corrupt` naming the fork (it was sound before, and a delete would then copy a
/// range the parent does not hold).
#[test]
fn verify_refuses_a_dependents_row_beyond_the_log() {
    let (_dir, root) = temp_root();
    parent_and_fork(&root);
    root.verify(&id("p")).unwrap();
    let changed = rusqlite::Connection::open(root.session_dir(&id("p")).join("session.sqlite"))
        .unwrap()
        .execute(
            "UPDATE dependents SET through_seq = 7 WHERE child_id = 'f'",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let e = root.verify(&id("p")).unwrap_err();
    assert!(e.is_corrupt(), "{e:?}");
    assert!(
        e.to_string().contains(
            "f is recorded as inheriting sequences through 7, beyond the end of the log at 6"
        ),
        "{e}"
    );
    let e = session_store::verify_file(root.session_dir(&id("p"))).unwrap_err();
    assert!(e.is_corrupt(), "{e:?}");
}

/// A fork's parent newer than this build, or holding objects that are not the store's, is
/// refused through the fork as it is by its own name: its events were read through the
/// fork and `verify` of the fork called it sound (outside testing, session 40).
#[test]
fn a_fork_refuses_a_parent_of_a_newer_version_or_with_foreign_objects() {
    let (_dir, root) = temp_root();
    let parent = create(&root, "parent");
    parent.append(turn("op-a", "turn-a", "message-a")).unwrap();
    parent.close().unwrap();
    let child = root
        .fork(&id("parent"), after("turn-a"), Some(id("child")))
        .unwrap();
    let file = root.session_dir(&id("parent")).join("session.sqlite");
    let child_file = root.session_dir(&child);
    let reads = |root: &Root| -> Vec<Error> {
        let reader = || root.open_reader(&child);
        vec![
            reader()
                .and_then(|r| r.commits(0, 100))
                .map(drop)
                .expect_err("commits through the fork"),
            reader()
                .and_then(|r| r.projection())
                .map(drop)
                .expect_err("projection through the fork"),
            session_store::verify_file(&child_file).expect_err("verify of the fork"),
        ]
    };

    let conn = rusqlite::Connection::open(&file).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    conn.pragma_update(None, "user_version", version + 1)
        .unwrap();
    drop(conn);
    for e in reads(&root) {
        assert!(e.is_unsupported(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("session child inherits from parent") && text.contains("newer than"),
            "{text}"
        );
    }

    let conn = rusqlite::Connection::open(&file).unwrap();
    conn.pragma_update(None, "user_version", version).unwrap();
    conn.execute_batch(
        "CREATE TABLE evil (x); CREATE TRIGGER tr AFTER INSERT ON dependents BEGIN \
         INSERT INTO evil VALUES (1); END;",
    )
    .unwrap();
    drop(conn);
    for e in reads(&root) {
        assert!(e.is_corrupt(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("session child inherits from parent, which cannot be read")
                && text.contains("evil"),
            "{text}"
        );
    }

    let conn = rusqlite::Connection::open(&file).unwrap();
    conn.execute_batch("DROP TRIGGER tr; DROP TABLE evil;")
        .unwrap();
    drop(conn);
    let reader = root.open_reader(&child).unwrap();
    assert_eq!(reader.commits(0, 100).unwrap().len(), 1);
    session_store::verify_file(&child_file).expect("verify of the fork");
}

/// A delete of the parent that does not finish (stopped, or copying a large session into
/// many forks) holds the parent's `dependents.lock`: a fork or a rewind of it waited
/// without limit and printed nothing (outside testing T2, session 41). Each is refused
/// after a bounded wait as `WriterOwned` naming the parent, nothing published, and
/// succeeds once the lock is let go. The holder is a real `flock(1)` process.
#[test]
fn a_fork_during_a_delete_that_does_not_finish_is_refused_naming_the_parent() {
    let (_dir, root) = temp_root();
    let parent = create(&root, "parent");
    parent.append(turn("a", "turn-a", "message-a")).unwrap();
    parent.append(turn("b", "turn-b", "message-b")).unwrap();
    parent.close().unwrap();
    let lock = root.path().join("parent").join("dependents.lock");
    let mut holder = std::process::Command::new("flock")
        .arg("--no-fork")
        .arg("--exclusive")
        .arg(&lock)
        .args(["sleep", "600"])
        .spawn()
        .expect("run flock");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock)
            .expect("open lock");
        match file.try_lock_shared() {
            Err(std::fs::TryLockError::WouldBlock) => break,
            _ => assert!(std::time::Instant::now() < deadline, "flock never took it"),
        }
        drop(file);
        std::thread::sleep(Duration::from_millis(10));
    }
    for (point, name) in [(after("turn-a"), "forked"), (before("turn-b"), "rewound")] {
        let started = std::time::Instant::now();
        let refused = root.fork(&id("parent"), point, Some(id(name))).unwrap_err();
        assert!(refused.is_writer_owned(), "{refused:?}");
        assert!(refused.to_string().contains("session parent"), "{refused}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        assert!(!root.path().join(name).exists());
    }
    holder.kill().expect("kill flock");
    holder.wait().expect("wait flock");
    root.fork(&id("parent"), after("turn-a"), Some(id("forked")))
        .expect("fork once the delete let go");
}

/// A fork whose lineage names itself (damage: a session cannot inherit from its own file)
/// read as an empty session (`history` exit 0, "no messages") while other reads called it
/// corrupt, and with a `dependents` row naming itself too, its delete refused for good,
/// "child is kept, as child inherits from it" (outside testing H3, session 41). Every read
/// now refuses it as corrupt, naming it, and a delete removes it.
#[test]
fn a_fork_naming_itself_in_its_lineage_is_corrupt_and_can_be_deleted() {
    let (_dir, root) = temp_root();
    let parent = create(&root, "parent");
    parent.append(turn("a", "turn-a", "message-a")).unwrap();
    parent.close().unwrap();
    root.fork(&id("parent"), after("turn-a"), Some(id("child")))
        .unwrap();
    let file = root.path().join("child").join("session.sqlite");
    let conn = rusqlite::Connection::open(&file).unwrap();
    conn.execute_batch(
        "UPDATE lineage SET ancestor_id = 'child';
         INSERT INTO dependents (child_id, through_seq) VALUES ('child', 3);",
    )
    .unwrap();
    drop(conn);
    let refused = root.open_reader(&id("child")).unwrap_err();
    assert!(refused.is_corrupt(), "{refused:?}");
    assert!(
        refused
            .to_string()
            .contains("session child names itself in its lineage"),
        "{refused}"
    );
    assert!(root.verify(&id("child")).is_err());
    root.delete(&id("child"), &CancelToken::new())
        .expect("delete a session naming itself");
    assert!(root.open_reader(&id("child")).unwrap_err().is_not_found());
    root.verify(&id("parent")).expect("the parent is sound");
}

/// A turn row planted past the end of the log (a damaged turn index, starting right after
/// the last event): a fork after it was refused, but a rewind before it made a session
/// inheriting the whole log, exit 0
/// (outside testing H6, session 41). Both are refused as corrupt, naming the turn.
#[test]
fn a_turn_row_past_the_log_is_refused_by_fork_and_rewind() {
    let (_dir, root) = temp_root();
    let parent = create(&root, "parent");
    parent.append(turn("a", "turn-a", "message-a")).unwrap();
    parent.close().unwrap();
    let file = root.path().join("parent").join("session.sqlite");
    let conn = rusqlite::Connection::open(&file).unwrap();
    conn.execute_batch(
        "INSERT INTO turns (start_seq, turn_id, end_seq, boundary_seq, status, fork_safe,
             rewind_safe)
         SELECT (SELECT max(end_seq) FROM turns) + 1, 'ghost', 4611686018427387905,
             4611686018427387905, status, fork_safe, rewind_safe FROM turns LIMIT 1;",
    )
    .unwrap_or_else(|e| panic!("plant: {e}"));
    drop(conn);
    for (point, name) in [(after("ghost"), "forked"), (before("ghost"), "rewound")] {
        let refused = root.fork(&id("parent"), point, Some(id(name))).unwrap_err();
        assert!(refused.is_corrupt(), "{refused:?}");
        assert!(refused.to_string().contains("\"ghost\""), "{refused}");
        assert!(!root.path().join(name).exists());
    }
}
