//! The idempotency check of `append` answered from memory (the accepted tail, a bounded
//! window of recent durable operation ids, a filter of every id of the file) with a cold
//! lookup off the session's state lock: retries and conflicts behave exactly as before,
//! across restarts, past the recent window and between threads.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;

use common::*;
use session_store::{Batch, Error, Event, Session};

/// More commits than the in-memory window of recent durable operation ids (2,048).
const PAST_WINDOW: usize = 2_200;

fn titled(op: &str, text: &str) -> Batch {
    Batch::new(op, vec![title(text)])
}

/// `count` commits appended as `titled("op-<i>", "t<i>")`, flushed every 100; the commits
/// `append` returned.
fn titled_commits(s: &Session, count: usize) -> Vec<Arc<session_store::Commit>> {
    (0..count)
        .map(|i| {
            let commit = s
                .append(titled(&format!("op-{i}"), &format!("t{i}")))
                .unwrap();
            if i % 100 == 99 {
                s.flush().unwrap();
            }
            commit
        })
        .collect()
}

fn assert_conflict(s: &Session, op: &str, text: &str) {
    let before = s.sequences();
    let err = s.append(titled(op, text)).unwrap_err();
    assert!(matches!(err, Error::OperationConflict { .. }), "{err}");
    assert_eq!(s.sequences(), before, "a conflict uses no sequence");
}

#[test]
fn retries_older_than_the_recent_window_return_the_original_commit_or_conflict() {
    let (_dir, root) = temp_root();
    let s = create(&root, "window");
    let originals = titled_commits(&s, PAST_WINDOW);
    assert_eq!(s.flush().unwrap(), PAST_WINDOW as u64);

    // In the same session: the oldest ids have left the window, the newest have not.
    for i in [0, 1, PAST_WINDOW / 2, PAST_WINDOW - 1] {
        let retried = s
            .append(titled(&format!("op-{i}"), &format!("t{i}")))
            .unwrap();
        assert_eq!(retried.commit_id, originals[i].commit_id, "op-{i}");
        assert_eq!(retried.first_seq, originals[i].first_seq, "op-{i}");
        assert_conflict(&s, &format!("op-{i}"), "changed");
    }
    assert_eq!(s.sequences(), (PAST_WINDOW as u64, PAST_WINDOW as u64));
    s.close().unwrap();

    // After a restart every id comes from the file.
    let s = root.open_writer(&id("window")).unwrap();
    for i in [0, PAST_WINDOW / 3, PAST_WINDOW - 1] {
        let retried = s
            .append(titled(&format!("op-{i}"), &format!("t{i}")))
            .unwrap();
        assert_eq!(retried.commit_id, originals[i].commit_id, "op-{i}");
        assert_eq!(retried.events[0].id, originals[i].events[0].id, "op-{i}");
        assert_conflict(&s, &format!("op-{i}"), "changed");
    }
    // New ids are still accepted, and are then known.
    let new = s.append(titled("op-new", "new")).unwrap();
    assert_eq!(new.first_seq, PAST_WINDOW as u64 + 1);
    assert_eq!(
        s.append(titled("op-new", "new")).unwrap().commit_id,
        new.commit_id
    );
    assert_conflict(&s, "op-new", "other");
    s.close().unwrap();

    let s = root.open_writer(&id("window")).unwrap();
    assert_eq!(
        s.append(titled("op-new", "new")).unwrap().commit_id,
        new.commit_id
    );
    assert_eq!(s.snapshot().projection.title, "new");
    assert_eq!(s.sequences().0, PAST_WINDOW as u64 + 1);
    s.close().unwrap();
}

#[test]
fn a_retry_of_an_undrained_commit_is_answered_from_the_tail_then_from_the_window() {
    let (_dir, root) = manual_root();
    let s = create(&root, "tail");
    let first = s.append(titled("op", "one")).unwrap();
    assert_eq!(s.sequences(), (1, 0), "not durable yet");
    assert!(Arc::ptr_eq(&first, &s.append(titled("op", "one")).unwrap()));
    assert_conflict(&s, "op", "two");
    s.flush().unwrap();
    assert_eq!(
        s.append(titled("op", "one")).unwrap().commit_id,
        first.commit_id
    );
    assert_conflict(&s, "op", "two");
    assert_eq!(s.sequences(), (1, 1));
    s.close().unwrap();
}

/// Two threads append the same batches at the same moment, `rounds` times; returns the
/// pairs of results.
fn race(s: &Session, ops: &[(String, String, String)]) -> Vec<[Result<String, String>; 2]> {
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let (s, barrier, ops) = (s.clone(), Arc::clone(&barrier), ops.to_vec());
            thread::spawn(move || {
                ops.iter()
                    .map(|(op, a, b)| {
                        barrier.wait();
                        s.append(titled(op, if t == 0 { a } else { b }))
                            .map(|c| c.commit_id.clone())
                            .map_err(|e| match e {
                                Error::OperationConflict { .. } => "conflict".to_owned(),
                                other => panic!("{other}"),
                            })
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut results: Vec<Vec<_>> = handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    let second = results.pop().expect("two");
    let first = results.pop().expect("two");
    first.into_iter().zip(second).map(|(a, b)| [a, b]).collect()
}

#[test]
fn two_threads_retrying_the_same_operation_get_one_commit() {
    let (_dir, root) = temp_root();
    let s = create(&root, "race");
    let rounds = 300;
    // Same content: both get the one commit.
    let same: Vec<_> = (0..rounds)
        .map(|i| (format!("op-{i}"), format!("t{i}"), format!("t{i}")))
        .collect();
    for [a, b] in race(&s, &same) {
        assert_eq!(a.as_ref().unwrap(), b.as_ref().unwrap());
    }
    assert_eq!(s.sequences().0, rounds as u64, "one commit per operation");
    // Other content: one commit and one conflict.
    let other: Vec<_> = (0..rounds)
        .map(|i| (format!("x-{i}"), format!("a{i}"), format!("b{i}")))
        .collect();
    for pair in race(&s, &other) {
        let ok = pair.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "{pair:?}");
        assert!(
            pair.iter().any(|r| matches!(r, Err(e) if e == "conflict")),
            "{pair:?}"
        );
    }
    assert_eq!(s.sequences().0, 2 * rounds as u64);
    s.close().unwrap();

    // After a restart (the ids come from the file) the same holds, and a new id is
    // committed once.
    let s = root.open_writer(&id("race")).unwrap();
    let mut mixed = same[..50].to_vec();
    mixed.extend((0..50).map(|i| (format!("n-{i}"), format!("n{i}"), format!("n{i}"))));
    for [a, b] in race(&s, &mixed) {
        assert_eq!(a.as_ref().unwrap(), b.as_ref().unwrap());
    }
    assert_eq!(s.flush().unwrap(), 2 * rounds as u64 + 50);
    let replayed = s.reader().all_commits().unwrap();
    assert_eq!(replayed.len(), 2 * rounds + 50);
    s.close().unwrap();
}

/// The run that loads a session's operation ids at open writes nothing: on a root whose
/// write-behind waits for `flush`, commits accepted before or after that run stay in
/// memory until the flush (it once drained them).
#[test]
fn loading_the_operation_ids_never_writes_a_commit_early() {
    let (_dir, root) = manual_root();
    let sessions: Vec<Session> = (0..40)
        .map(|i| {
            let s = create(&root, &format!("early-{i}"));
            s.append(titled("first", "t")).unwrap();
            s
        })
        .collect();
    // Long enough for every load run to have run on the writer threads.
    thread::sleep(std::time::Duration::from_millis(500));
    for (i, s) in sessions.iter().enumerate() {
        assert_eq!(s.sequences(), (1, 0), "session {i} wrote before its flush");
        let cold = root.open_reader(&id(&format!("early-{i}"))).unwrap();
        assert_eq!(cold.durable_sequence().unwrap(), 0);
        assert_eq!(s.flush().unwrap(), 1);
        // The retry after the load is answered as before.
        let again = s.append(titled("first", "t")).unwrap();
        assert_eq!(again.first_seq, 1);
        s.close().unwrap();
    }
}

/// Schema 6 keeps the operation keys in sorted chunks of at least 1,024 commits (no index
/// leaf written per commit): a retry after a restart is found in a chunk or in the commits
/// after the last one; a damaged chunk is skipped and its commits are searched instead.
#[test]
fn operation_keys_are_kept_in_chunks_and_a_damaged_chunk_is_searched_around() {
    const COMMITS: usize = 1_500;
    let (_dir, root) = temp_root();
    let s = create(&root, "chunks");
    let originals = titled_commits(&s, COMMITS);
    s.close().unwrap();
    let file = root
        .session_dir(&id("chunks"))
        .join(session_store::format::SESSION_FILE);
    assert_eq!(
        sqlite3(
            &file,
            "SELECT name FROM sqlite_schema WHERE name = 'commits_by_operation'"
        ),
        "",
        "no index on the operation key"
    );
    // One chunk: the drain that brought the count to 1,024 or more (every 100 commits).
    assert_eq!(
        sqlite3(
            &file,
            "SELECT count(*), through_seq, length(keys) / 16 FROM operation_key_chunks"
        ),
        "1|1100|1100"
    );

    let retry_all = |s: &Session| {
        // In the chunk (0, 1,099) and after it (1,100, 1,499).
        for i in [0, 5, 1_099, 1_100, COMMITS - 1] {
            let retried = s
                .append(titled(&format!("op-{i}"), &format!("t{i}")))
                .unwrap();
            assert_eq!(retried.commit_id, originals[i].commit_id, "op-{i}");
            assert_conflict(s, &format!("op-{i}"), "changed");
        }
        assert_eq!(s.sequences().0, COMMITS as u64, "no retry made a commit");
    };
    let s = root.open_writer(&id("chunks")).unwrap();
    retry_all(&s);
    s.close().unwrap();

    // A chunk cut short (or of another type) is skipped: the same answers.
    for damage in [
        "UPDATE operation_key_chunks SET keys = substr(keys, 1, 100)",
        "UPDATE operation_key_chunks SET keys = 'text'",
        "DELETE FROM operation_key_chunks",
    ] {
        sqlite3(&file, damage);
        let s = root.open_writer(&id("chunks")).unwrap();
        retry_all(&s);
        s.close().unwrap();
    }
}

/// `SessionReader::operation` answers whether an append became durable, without the
/// writer: `None` while the commit is only accepted, the stored commit once it is durable
/// (its id trimmed as an append trims it; past the recent window, from the key chunks,
/// after a reopen), `None` for an id never used, and in a fork only for the fork's own
/// commits (an inherited one is its parent's operation).
#[test]
fn a_reader_answers_whether_an_operation_is_durable() {
    let (_dir, root) = temp_root();
    let s = create(&root, "asked");
    let reader = root.open_reader(&id("asked")).unwrap();
    let pending = s.append(titled("pending", "p")).unwrap();
    assert!(reader.operation("pending").unwrap().is_none());
    s.flush().unwrap();
    let durable = reader.operation(" pending ").unwrap().expect("durable");
    assert_eq!(identity(&durable), identity(&pending));
    let originals = titled_commits(&s, PAST_WINDOW);
    s.close().unwrap();

    let reader = root.open_reader(&id("asked")).unwrap();
    for i in [0, PAST_WINDOW / 2, PAST_WINDOW - 1] {
        let found = reader
            .operation(&format!("op-{i}"))
            .unwrap()
            .expect("stored");
        assert_eq!(identity(&found), identity(&originals[i]), "op-{i}");
    }
    assert!(reader.operation("never").unwrap().is_none());

    let after = session_store::ForkPoint::AfterTurn("t".into());
    let parent = create(&root, "parent");
    parent.append(turn("parent-op", "t", "m")).unwrap();
    parent.close().unwrap();
    let child = root.fork(&id("parent"), after, Some(id("child"))).unwrap();
    let session = root.open_writer(&child).unwrap();
    session.append(titled("child-op", "c")).unwrap();
    session.close().unwrap();
    let reader = root.open_reader(&child).unwrap();
    assert!(reader.operation("parent-op").unwrap().is_none());
    assert!(reader.operation("child-op").unwrap().is_some());
}

/// `Batch::validate` refuses, with an append's own error, every batch an append refuses
/// whatever its session holds, and accepts one that only a session's state refuses.
#[test]
fn validate_refuses_what_every_append_refuses() {
    let (_dir, root) = temp_root();
    let s = create(&root, "checked");
    s.append(turn("first", "t1", "m1")).unwrap();
    // A message whose payload nests `depth` deep (two levels are `{"message":{`).
    let nested = |id: &str, depth: usize| {
        let content = format!("{}{}", "[".repeat(depth - 2), "]".repeat(depth - 2));
        Event::new("message/complete")
            .with_payload_json(&format!(
                r#"{{"message":{{"id":"{id}","role":"user","content":{content}}}}}"#
            ))
            .unwrap()
    };
    let limit = session_store::format::MAX_PAYLOAD_NESTING;
    let refused = [
        Batch::new("o", vec![nested("deep", limit + 1)]),
        Batch::new("", vec![title("x")]),
        Batch::new("o", vec![]),
        Batch::new("inherit:a:b", vec![title("x")]),
        Batch::new("o", vec![event("  ", serde_json::json!({}))]),
        Batch::new("o", vec![Event::new("bogus/kind")]),
        Batch::new("o", vec![title("  ")]),
        Batch::new("o", vec![event("turn/end", serde_json::json!({}))]),
        Batch::new(
            "o",
            vec![message("a", "user", "x"), message("a", "user", "y")],
        ),
        Batch::new(
            "o",
            vec![
                Event::new("turn/start").with_id("e"),
                title("x").with_id("e"),
            ],
        ),
    ];
    for batch in refused {
        let checked = batch.validate().unwrap_err().to_string();
        let appended = s.append(batch.clone()).unwrap_err().to_string();
        assert_eq!(checked, appended, "{batch:?}");
    }
    let at_limit = Batch::new("at-limit", vec![nested("deep", limit)]);
    at_limit.validate().unwrap();
    s.append(at_limit).unwrap();
    // Trimmed kinds are read as an append reads them.
    let spaced = Batch::new(
        "o",
        vec![event(" session/title ", serde_json::json!({"title": " "}))],
    );
    assert_eq!(
        spaced.validate().unwrap_err().to_string(),
        s.append(spaced.clone()).unwrap_err().to_string()
    );
    // Only the session's state refuses these: a message id it holds; a turn started while
    // its turn is open.
    s.append(Batch::new("open", vec![Event::new("turn/start")]).in_turn("t2"))
        .unwrap();
    for batch in [
        Batch::new("o", vec![message("m1", "user", "again")]),
        Batch::new("o", vec![Event::new("turn/start")]).in_turn("t3"),
    ] {
        batch.validate().unwrap();
        s.append(batch).unwrap_err();
    }
    assert_eq!(s.sequences().0, 5, "no refused batch was accepted");
}
