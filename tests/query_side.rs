//! The query side at scale: list pages with a stable cursor, deleted sessions never
//! revived by the catalog, history pages pinned to a snapshot while appends continue.

mod common;

use std::collections::HashSet;

use common::{id, message};
use session_store::{
    Batch, CancelToken, CreateOptions, Error, ListFilter, ListSort, Root, Service, SessionRef,
};

fn service() -> (tempfile::TempDir, Service) {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::open(dir.path().join("sessions")).unwrap();
    (dir, Service::new("local", root).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_sessions_list_in_stable_pages_while_sessions_are_created() {
    let (_dir, service) = service();
    let root = service.root().clone();
    tokio::task::spawn_blocking(move || {
        for i in 0..1000 {
            let s = root
                .create(CreateOptions::with_id(id(&format!("s{i:04}"))))
                .unwrap();
            s.append(Batch::new("t", vec![common::title(&format!("title {i}"))]))
                .unwrap();
            s.close().unwrap();
        }
    })
    .await
    .unwrap();

    let creator = {
        let root = service.root().clone();
        tokio::task::spawn_blocking(move || {
            for i in 0..100 {
                // Interleaved ids land both before and after the cursor.
                root.create(CreateOptions::with_id(id(&format!("s{:04}x", i * 10))))
                    .unwrap()
                    .close()
                    .unwrap();
            }
        })
    };
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = service.query().list(cursor.as_deref(), 50).await.unwrap();
        pages += 1;
        for s in &page.sessions {
            assert!(
                seen.insert(s.session_ref.session_id.clone()),
                "listed twice: {}",
                s.session_ref.session_id
            );
        }
        match page.next_cursor {
            Some(next) => {
                assert!(
                    cursor.as_deref().is_none_or(|c| next.as_str() > c),
                    "cursor went backwards"
                );
                cursor = Some(next);
            }
            None => break,
        }
    }
    creator.await.unwrap();
    for i in 0..1000 {
        assert!(seen.contains(&id(&format!("s{i:04}"))), "s{i:04} missing");
    }
    assert!(pages >= 20);
    let first = service.query().list(None, 50).await.unwrap();
    assert_eq!(first.sessions[0].title, "title 0");
}

#[tokio::test]
async fn a_deleted_session_never_reappears_in_list_or_snapshot() {
    let (dir, service) = service();
    let rt = service
        .create(CreateOptions::with_id(id("gone")))
        .await
        .unwrap();
    rt.session()
        .append(Batch::new("m", vec![message("m", "user", "hi")]))
        .unwrap();
    service.close(rt.session_ref()).await.unwrap();
    let keep = service
        .create(CreateOptions::with_id(id("kept")))
        .await
        .unwrap();
    service.close(keep.session_ref()).await.unwrap();
    assert_eq!(
        service.query().list(None, 50).await.unwrap().sessions.len(),
        2
    );

    // Another process (another Root on the same folder) deletes it: this service's
    // catalog still holds the entry.
    let other = Root::open(dir.path().join("sessions")).unwrap();
    other.delete(&id("gone"), &CancelToken::new()).unwrap();
    let r = SessionRef::new("local", "gone").unwrap();
    for _ in 0..2 {
        let page = service.query().list(None, 50).await.unwrap();
        let ids: Vec<_> = page
            .sessions
            .iter()
            .map(|s| s.session_ref.session_id.as_str().to_owned())
            .collect();
        assert_eq!(ids, ["kept"]);
        assert!(matches!(
            service.query().snapshot(&r).await,
            Err(Error::SessionNotFound(_))
        ));
    }
    // A rebuilt catalog does not bring it back either.
    assert_eq!(service.query().rebuild_catalog().await.unwrap().sessions, 1);
    assert_eq!(
        service.query().list(None, 50).await.unwrap().sessions.len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_pages_return_every_message_once_while_appends_continue() {
    let (_dir, service) = service();
    let rt = service
        .create(CreateOptions::with_id(id("long")))
        .await
        .unwrap();
    for chunk in 0..100 {
        let events = (0..100)
            .map(|i| message(&format!("m{:05}", chunk * 100 + i), "user", "x"))
            .collect();
        rt.session()
            .append(Batch::new(format!("c{chunk}"), events))
            .unwrap();
    }
    rt.session().flush().unwrap();
    let writer = {
        let session = rt.session().clone();
        tokio::task::spawn_blocking(move || {
            for i in 0..50 {
                session
                    .append(Batch::new(
                        format!("late{i}"),
                        vec![message(&format!("late{i}"), "user", "y")],
                    ))
                    .unwrap();
                session.flush().unwrap();
            }
        })
    };
    let r = rt.session_ref().clone();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut snapshot = None;
    loop {
        let page = service
            .query()
            .history_page(&r, cursor.as_deref(), 100)
            .await
            .unwrap();
        assert!(
            snapshot.is_none_or(|s| s == page.snapshot_sequence),
            "pages moved off their snapshot"
        );
        snapshot = Some(page.snapshot_sequence);
        let positions: Vec<u64> = page.messages.iter().map(|m| m.position).collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "ascending inside a page"
        );
        seen.splice(0..0, page.messages.into_iter().map(|m| m.message_id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    writer.await.unwrap();
    let pinned = snapshot.unwrap() as usize;
    assert!(pinned >= 10_000);
    assert_eq!(
        seen.len(),
        pinned,
        "every message of the snapshot exactly once"
    );
    let unique: HashSet<_> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len());
    assert_eq!(seen[0], "m00000");
    assert_eq!(seen[9_999], "m09999");
    service.close(&r).await.unwrap();
}

async fn page_ids(service: &Service, r: &SessionRef) -> Vec<(u64, String, String)> {
    let page = service.query().history_page(r, None, 100).await.unwrap();
    page.messages
        .iter()
        .map(|m| {
            let text = m.inline.as_ref().and_then(|i| i.text()).unwrap_or_default();
            (m.position, m.message_id.clone(), text)
        })
        .collect()
}

#[tokio::test]
async fn history_pages_follow_upserts_replacements_and_forks() {
    let (_dir, service) = service();
    let rt = service
        .create(CreateOptions::with_id(id("edits")))
        .await
        .unwrap();
    let s = rt.session();
    s.append(common::turn("t1", "turn-1", "a")).unwrap();
    s.append(Batch::new("b", vec![message("b", "assistant", "first")]))
        .unwrap();
    let upsert = session_store::Event::new("message/upsert")
        .with_payload(
            &serde_json::json!({"message": {"id": "b", "role": "assistant", "content": "second"}}),
        )
        .unwrap();
    s.append(Batch::new("b2", vec![upsert])).unwrap();
    s.flush().unwrap();
    let r = rt.session_ref().clone();
    assert_eq!(
        page_ids(&service, &r).await,
        [
            (1, "a".into(), "a".into()),
            (2, "b".into(), "second".into())
        ]
    );
    let fork = service.fork(&r, "turn-1", Some(id("fork"))).await.unwrap();
    fork.session()
        .append(Batch::new("c", vec![message("c", "user", "child")]))
        .unwrap();
    fork.session().flush().unwrap();
    assert_eq!(
        page_ids(&service, fork.session_ref()).await,
        [(1, "a".into(), "a".into()), (2, "c".into(), "child".into())]
    );
    let replace = session_store::Event::new("history/replace")
        .with_payload(
            &serde_json::json!({"messages": [{"id": "z", "role": "user", "content": "only"}]}),
        )
        .unwrap();
    s.append(Batch::new("r", vec![replace])).unwrap();
    s.flush().unwrap();
    assert_eq!(
        page_ids(&service, &r).await,
        [(1, "z".into(), "only".into())]
    );
    service.close_all().await.unwrap();
}

#[tokio::test]
async fn continue_legacy_tolerates_a_torn_last_line_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join("torn.jsonl");
    std::fs::write(
        &legacy,
        "{\"id\":\"u1\",\"role\":\"user\",\"content\":\"hi\"}\n{\"id\":\"a1\",\"role\":\"assistant\",\"content\":\"hel",
    )
    .unwrap();
    let service = Service::new("local", Root::open(dir.path().join("sessions")).unwrap()).unwrap();
    let (rt, record) = service.continue_legacy(&legacy, "").await.unwrap();
    assert!(record.torn_last_line);
    assert_eq!(record.message_count, 1);
    assert_eq!(
        record.source_size,
        std::fs::metadata(&legacy).unwrap().len()
    );
    assert_eq!(rt.session().snapshot().projection.transcript_len, 1);
    service.close_all().await.unwrap();
    // A damaged line in the middle is refused, and nothing is published.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"id\":\"u1\",\"role\":\"user\"}\nnot json\n{\"id\":\"u2\"}\n",
    )
    .unwrap();
    assert!(matches!(
        service.continue_legacy(&bad, "").await,
        Err(Error::InvalidInput { .. })
    ));
    assert_eq!(
        service.query().list(None, 50).await.unwrap().sessions.len(),
        1
    );
    // A last line that is complete, only not a message, is no torn write: refused as well,
    // with or without a newline after it (without one it was dropped as torn, exit 0:
    // outside testing, session 35). So is a source that is not a regular file (a FIFO or
    // `/dev/zero` was read until it ended, which it never does).
    for (name, last) in [
        (
            "dup.jsonl",
            "{\"id\":\"b\",\"role\":\"user\",\"id\":\"b2\"}",
        ),
        ("array.jsonl", "[]"),
        ("number.jsonl", "{\"id\":5}"),
    ] {
        let file = dir.path().join(name);
        std::fs::write(&file, format!("{{\"id\":\"a\",\"role\":\"user\"}}\n{last}")).unwrap();
        let err = service.continue_legacy(&file, "").await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput { .. }) && err.to_string().contains("line 2"),
            "{name}: {err}"
        );
    }
    let err = service.continue_legacy("/dev/zero", "").await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { .. })
            && err.to_string().contains("not a regular file"),
        "{err}"
    );
    let fifo = dir.path().join("fifo.jsonl");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let err = service.continue_legacy(&fifo, "").await.unwrap_err();
    assert!(matches!(&err, Error::InvalidInput { .. }), "{err}");
    assert_eq!(
        service.query().list(None, 50).await.unwrap().sessions.len(),
        1
    );
}

/// What a page of history needs to show its turns (issue 16): each message's event
/// sequence, the turns overlapping a sequence range (also those a fork inherits), and a
/// session's catalog entry without a fold, current after a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_messages_carry_sequences_and_turns_overlap_them() {
    let (_dir, service) = service();
    let root = service.root().clone();
    let session = root.create(CreateOptions::with_id(id("turny"))).unwrap();
    for t in 1..=20 {
        session
            .append(common::turn(
                &format!("op-{t}"),
                &format!("turn-{t}"),
                &format!("m{t}"),
            ))
            .unwrap();
    }
    // A message outside any turn after turn 20.
    session
        .append(Batch::new(
            "loose",
            vec![message("loose", "user", "outside")],
        ))
        .unwrap();
    session.close().unwrap();
    let r = service.session_ref(id("turny"));
    let page = service.query().history_page(&r, None, 5).await.unwrap();
    let seqs: Vec<u64> = page.messages.iter().map(|m| m.event_sequence).collect();
    // Turn t holds sequences 3t-2..=3t, its message at 3t-1; the loose message is 61.
    assert_eq!(seqs, [50, 53, 56, 59, 61]);
    // A page ending at a position (a permalink), then older pages by its cursor.
    let positions = |p: &session_store::HistoryPage| -> Vec<u64> {
        p.messages.iter().map(|m| m.position).collect()
    };
    let at = service
        .query()
        .history_page_ending_at(&r, 3, 2)
        .await
        .unwrap();
    assert_eq!(positions(&at), [2, 3]);
    let older = service
        .query()
        .history_page(&r, at.next_cursor.as_deref(), 2)
        .await
        .unwrap();
    assert_eq!(positions(&older), [1]);
    let past_end = service
        .query()
        .history_page_ending_at(&r, 999, 2)
        .await
        .unwrap();
    assert_eq!(positions(&past_end), [20, 21]);
    let zero = service
        .query()
        .history_page_ending_at(&r, 0, 2)
        .await
        .unwrap_err();
    assert!(zero.is_caller_error());
    let reader = root.open_reader(&id("turny")).unwrap();
    let turns = reader.turns_overlapping(50, 61).unwrap();
    let names: Vec<&str> = turns.iter().map(|t| t.turn_id.as_str()).collect();
    assert_eq!(names, ["turn-17", "turn-18", "turn-19", "turn-20"]);
    assert_eq!(reader.turns_overlapping(61, 61).unwrap(), []);
    assert_eq!(reader.turns_overlapping(2, 2).unwrap()[0].turn_id, "turn-1");
    assert_eq!(reader.turns_overlapping(3, 4).unwrap().len(), 2);
    // A fork after turn 10 sees the inherited turns up to its cut, none after.
    let fork = root
        .fork(
            &id("turny"),
            session_store::ForkPoint::AfterTurn("turn-10".into()),
            Some(id("turny-fork")),
        )
        .unwrap();
    let fork_reader = root.open_reader(&fork).unwrap();
    let inherited = fork_reader.turns_overlapping(1, 1000).unwrap();
    assert_eq!(inherited.len(), 10);
    assert_eq!(inherited.last().unwrap().turn_id, "turn-10");
    // The catalog entry: as listed, refreshed after a rename, not found once deleted.
    let entry = root.catalog_entry(&id("turny")).unwrap();
    assert_eq!((entry.turns, entry.title.as_str()), (20, ""));
    root.rename(&id("turny"), "Renamed").unwrap();
    assert_eq!(root.catalog_entry(&id("turny")).unwrap().title, "Renamed");
    assert_eq!(
        root.catalog_entry(&fork).unwrap().parent_id,
        Some(id("turny"))
    );
    assert!(
        root.catalog_entry(&id("missing"))
            .unwrap_err()
            .is_not_found()
    );
    root.delete(&fork, &CancelToken::new()).unwrap();
    assert!(root.catalog_entry(&fork).unwrap_err().is_not_found());
}

/// `ListFilter::cached_only` (issue 16): a sorted page from the catalog as last
/// refreshed, without stamping every session; a refreshing page brings it up to date; a
/// deleted session is never returned either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_only_pages_skip_the_refresh_until_a_refreshing_page() {
    let (_dir, service) = service();
    let root = service.root().clone();
    for name in ["a", "b", "c"] {
        root.create(CreateOptions::with_id(id(name)))
            .unwrap()
            .close()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let newest_first = || ListFilter::default().with_sort(ListSort::Updated);
    let order = |page: session_store::SessionPage| -> Vec<String> {
        page.sessions
            .into_iter()
            .map(|s| s.session_ref.session_id.to_string())
            .collect()
    };
    let q = service.query();
    assert_eq!(
        order(q.list_with(&newest_first(), None, 10).await.unwrap()),
        ["c", "b", "a"]
    );
    // "a" changes behind the catalog's back (a writer appends and stays open).
    let writer = root.open_writer(&id("a")).unwrap();
    writer
        .append(Batch::new("op", vec![message("m", "user", "hi")]))
        .unwrap();
    writer.flush().unwrap();
    let cached = q
        .list_with(&newest_first().cached_only(), None, 10)
        .await
        .unwrap();
    assert_eq!(order(cached), ["c", "b", "a"]);
    assert_eq!(
        order(q.list_with(&newest_first(), None, 10).await.unwrap()),
        ["a", "c", "b"]
    );
    writer.close().unwrap();
    root.delete(&id("c"), &CancelToken::new()).unwrap();
    let cached = q
        .list_with(&newest_first().cached_only(), None, 10)
        .await
        .unwrap();
    assert!(!order(cached).contains(&"c".to_owned()));
    // The plain listing ignores the flag.
    let plain = q
        .list_with(&ListFilter::default().cached_only(), None, 10)
        .await
        .unwrap();
    assert_eq!(order(plain), ["a", "b"]);
}

/// The catalog has an index per sorted order (issue 16), also a catalog made before they
/// existed once it is opened again, so a sorted page walks an index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_indexes_its_sorted_orders() {
    let (dir, service) = service();
    let root = service.root().clone();
    root.create(CreateOptions::with_id(id("one")))
        .unwrap()
        .close()
        .unwrap();
    let sorted = ListFilter::default().with_sort(ListSort::Updated);
    service.query().list_with(&sorted, None, 10).await.unwrap();
    let catalog = dir.path().join("sessions/.catalog/catalog.sqlite");
    let indexes = "SELECT name FROM sqlite_schema WHERE type = 'index' AND name LIKE 'sessions_by_%' ORDER BY name";
    assert_eq!(
        common::sqlite3(&catalog, indexes),
        "sessions_by_created\nsessions_by_updated"
    );
    // An older catalog (no indexes) gets them from the next process that opens it.
    common::sqlite3(
        &catalog,
        "DROP INDEX sessions_by_created; DROP INDEX sessions_by_updated;",
    );
    let again = Service::new("local", Root::open(dir.path().join("sessions")).unwrap()).unwrap();
    let page = again.query().list_with(&sorted, None, 10).await.unwrap();
    assert_eq!(page.sessions.len(), 1);
    assert_eq!(
        common::sqlite3(&catalog, indexes),
        "sessions_by_created\nsessions_by_updated"
    );
}

/// A caller's `after` beyond any sequence SQLite can hold (the Python `events(after=2**63)`,
/// `observe` with `u64::MAX`) is an empty page of `commits`, a cursor `observe` refuses as
/// past the session's end, and such a sequence no commit boundary
/// (`SessionReader::is_commit_boundary`), not an SQLite conversion error.
#[tokio::test]
async fn commits_after_a_sequence_beyond_sqlite_integers_are_an_empty_page() {
    let (_dir, service) = service();
    let root = service.root().clone();
    let s = root.create(CreateOptions::with_id(id("e"))).unwrap();
    s.append(Batch::new("a", vec![message("m1", "user", "hi")]))
        .unwrap();
    s.close().unwrap();
    let reader = root.open_reader(&id("e")).unwrap();
    let r = service.session_ref(id("e"));
    for after in [i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX] {
        assert!(reader.commits(after, 10).unwrap().is_empty(), "{after}");
        let past = service.query().observe(&r, after, 10).await;
        assert!(
            matches!(past, Err(Error::InvalidInput { ref what, .. }) if what.contains("past the last sequence 1")),
            "{after}: {past:?}"
        );
        // No commit ends there ("sqlite: out of range integral type conversion
        // attempted" before, for the two past `i64::MAX`).
        assert!(!reader.is_commit_boundary(after).unwrap(), "{after}");
    }
    // The edge below still reads the log.
    assert_eq!(reader.commits(0, 10).unwrap().len(), 1);
    assert!(reader.is_commit_boundary(1).unwrap());
}

/// `observe` with a cursor past the session's last sequence is refused, as a history
/// cursor newer than the session is: it answered an empty page whose `next` was that
/// cursor, and an observer going on from it skipped the session's next commits (here the
/// commit a detached runtime accepted and never made durable: its sequence is taken again
/// by the next writer's first commit). The last sequence itself is an empty page.
#[tokio::test]
async fn observe_refuses_a_cursor_past_the_last_sequence() {
    let (_dir, service) = service();
    let rt = service
        .create(CreateOptions::with_id(id("past")))
        .await
        .unwrap();
    let r = rt.session_ref().clone();
    rt.session()
        .append(Batch::new("a", vec![message("m1", "user", "hi")]))
        .unwrap();
    let live = service.query().observe(&r, 0, 10).await.unwrap();
    assert_eq!(live.events.next, 1);
    let end = service.query().observe(&r, 1, 10).await.unwrap();
    assert!(end.events.commits.is_empty());
    assert_eq!(end.events.next, 1);
    assert!(!end.events.truncated);
    let past = service.query().observe(&r, 2, 10).await;
    assert!(
        matches!(past, Err(Error::InvalidInput { ref what, .. })
            if what == "no events after sequence 2: it is past the last sequence 1 of session past"),
        "{past:?}"
    );
    // Detached before its commit was durable (upstream's seed): cold, the session ends at 0.
    assert!(service.detach(&rt));
    let cold = service.query().observe(&r, 0, 10).await.unwrap();
    assert!(cold.events.commits.is_empty() && cold.events.next == 0);
    let cold = service.query().observe(&r, 1, 10).await;
    assert!(matches!(cold, Err(Error::InvalidInput { .. })), "{cold:?}");
    rt.session().close().unwrap();
}

/// Session `name` holding `n` user messages `m0`, `m1`, …, one batch each, closed.
fn user_messages(root: &session_store::Root, name: &str, n: usize) {
    let s = root.create(CreateOptions::with_id(id(name))).unwrap();
    for i in 0..n {
        let m = format!("m{i}");
        s.append(Batch::new(m.clone(), vec![message(&m, "user", "hi")]))
            .unwrap();
    }
    s.close().unwrap();
}

/// `observe` with a limit of 0 gives the default page (100 commits), as `list` and
/// `history` do with 0 (it gave one commit); a limit over 1000 is refused, as `list`'s
/// over 100 (it was cut to 1000 silently).
#[tokio::test]
async fn observe_limit_zero_is_the_default_page_and_over_the_maximum_refused() {
    let (_dir, service) = service();
    let root = service.root().clone();
    user_messages(&root, "o", 150);
    let r = service.session_ref(id("o"));
    let page = service.query().observe(&r, 0, 0).await.unwrap();
    assert_eq!(page.events.commits.len(), 100);
    assert!(page.events.truncated);
    assert_eq!(page.events.next, 100);
    let rest = service
        .query()
        .observe(&r, page.events.next, 0)
        .await
        .unwrap();
    assert_eq!(rest.events.commits.len(), 50);
    assert!(!rest.events.truncated);
    assert_eq!(
        service
            .query()
            .observe(&r, 0, 1000)
            .await
            .unwrap()
            .events
            .commits
            .len(),
        150
    );
    let err = service.query().observe(&r, 0, 1001).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert!(err.to_string().contains("1..=1000"), "{err}");
}

/// `history_page` (and `history_page_ending_at`) with a limit over
/// [`session_store::MAX_HISTORY_LIMIT`] (500) is refused naming the maximum, as `list`'s
/// and `observe`'s are: it was cut to 500 silently. 500 itself, and 0 (the default 100),
/// still answer.
#[tokio::test]
async fn history_limit_over_the_maximum_is_refused() {
    let (_dir, service) = service();
    let root = service.root().clone();
    user_messages(&root, "h", 600);
    let r = service.session_ref(id("h"));
    let q = service.query();
    let max = session_store::MAX_HISTORY_LIMIT;
    assert_eq!(max, 500);
    for refused in [
        q.history_page(&r, None, max + 1).await,
        q.history_page(&r, None, usize::MAX).await,
        q.history_page_ending_at(&r, 600, max + 1).await,
    ] {
        let err = refused.unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "invalid input: history limit must be 1..=500 messages (0 for 100)"
        );
    }
    assert_eq!(
        q.history_page(&r, None, max).await.unwrap().messages.len(),
        500
    );
    assert_eq!(
        q.history_page(&r, None, 0).await.unwrap().messages.len(),
        100
    );
}

/// A history cursor is exactly `h2.<snapshot>.<position>.<session tag>`: anything after it
/// (as a search cursor's parser already refuses) is a malformed cursor, not the same page.
#[tokio::test]
async fn history_cursors_with_trailing_parts_are_refused() {
    let (_dir, service) = service();
    let root = service.root().clone();
    user_messages(&root, "h", 5);
    let r = service.session_ref(id("h"));
    let q = service.query();
    let first = q.history_page(&r, None, 2).await.unwrap();
    let cursor = first.next_cursor.expect("an older page");
    assert_eq!(
        q.history_page(&r, Some(&cursor), 2).await.unwrap().messages[0].message_id,
        "m1"
    );
    for bad in [
        format!("{cursor}.1"),
        format!("{cursor}."),
        format!("{cursor}.x"),
    ] {
        let err = q.history_page(&r, Some(&bad), 2).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidInput { .. }) && err.to_string().contains(&bad),
            "{bad}: {err}"
        );
    }
}

/// A history cursor continues only the session that made it (outside testing, session
/// 36: another session's cursor, or one of a session deleted and made again under the same
/// id, paged that other transcript). An earlier build's `h1.` cursor, which names no
/// session, is still followed.
#[tokio::test]
async fn a_history_cursor_continues_only_the_session_that_made_it() {
    let (_dir, service) = service();
    let root = service.root().clone();
    user_messages(&root, "a", 6);
    user_messages(&root, "b", 6);
    let q = service.query();
    let (a, b) = (service.session_ref(id("a")), service.session_ref(id("b")));
    let cursor = q
        .history_page(&b, None, 2)
        .await
        .unwrap()
        .next_cursor
        .unwrap();
    assert!(cursor.starts_with("h2."), "{cursor}");
    let older = q.history_page(&b, Some(&cursor), 2).await.unwrap();
    assert_eq!(older.messages[0].message_id, "m2");
    let refused = |e: Error| {
        assert!(
            matches!(e, Error::InvalidInput { .. })
                && e.to_string().contains("history cursor of another session"),
            "{e}"
        );
    };
    refused(q.history_page(&a, Some(&cursor), 2).await.unwrap_err());
    // Made again under the same id: another session.
    root.delete(&id("b"), &CancelToken::new()).unwrap();
    user_messages(&root, "b", 8);
    refused(q.history_page(&b, Some(&cursor), 2).await.unwrap_err());
    // An earlier build's cursor pages whichever session it is given.
    let old = q.history_page(&a, Some("h1.6.5"), 2).await.unwrap();
    let ids: Vec<&str> = old.messages.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids, ["m2", "m3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_ref_the_session_does_not_hold_or_no_digest_is_named_quoted_and_clipped() {
    let (_dir, service) = service();
    let root = service.root().clone();
    let s = root.create(CreateOptions::with_id(id("blobs"))).unwrap();
    s.append(Batch::new("m", vec![message("m1", "user", "hello")]))
        .unwrap();
    s.close().unwrap();
    let r = SessionRef::new("local", id("blobs")).unwrap();
    let long = format!("\u{1b}[2J{}", "f".repeat(100_000));
    let (absent, upper) = ("0".repeat(64), "A".repeat(64));
    // A digest that is not one is said so; it was "does not belong to session", as for a
    // well-formed digest the session does not hold.
    for (digest, shown) in [
        (
            "",
            "content \"\" is not a content digest: a digest is 64 lowercase hex",
        ),
        ("zz", "content \"zz\" is not a content digest"),
        (upper.as_str(), "is not a content digest"),
        (long.as_str(), "\\u{1b}[2J"),
        (absent.as_str(), "does not belong to session blobs"),
    ] {
        let e = service
            .query()
            .read_content(&r, &session_store::ContentRef::new(digest, 0, ""))
            .await
            .unwrap_err();
        assert!(e.is_caller_error(), "{e}");
        let text = e.to_string();
        assert!(text.contains(shown), "{text}");
        assert!(text.len() < 300 && !text.contains('\u{1b}'), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_snapshot_and_catalog_entry_of_a_session_being_appended_to_are_of_one_sequence() {
    let (dir, service) = service();
    service
        .root()
        .create(CreateOptions::with_id(id("busy")))
        .unwrap()
        .close()
        .unwrap();
    // Another process's writer (another Root on the same folder) appends and flushes
    // three-event turns while this service reads the session cold.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = common::spawn_turn_writer(
        dir.path().join("sessions"),
        id("busy"),
        std::sync::Arc::clone(&done),
    );
    let r = SessionRef::new("local", "busy").unwrap();
    let mut wrong = Vec::new();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
    while std::time::Instant::now() < until && wrong.len() < 5 {
        let snap = service.query().snapshot(&r).await.unwrap();
        let p = &snap.projection;
        if (
            p.ended_turns * 3,
            p.transcript_len * 3,
            p.committed_sequence,
        ) != (
            snap.durable_sequence,
            snap.durable_sequence,
            snap.durable_sequence,
        ) {
            wrong.push(format!(
                "snapshot: durable {}, {} turns, {} messages, committed {}",
                snap.durable_sequence, p.ended_turns, p.transcript_len, p.committed_sequence
            ));
        }
        let entry = service.root().catalog_entry(&id("busy")).unwrap();
        if entry.turns * 3 != entry.durable_sequence {
            wrong.push(format!(
                "catalog entry: durable {}, {} turns",
                entry.durable_sequence, entry.turns
            ));
        }
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().unwrap();
    assert!(
        wrong.is_empty(),
        "cold reads of a session being appended to: {wrong:#?}"
    );
}

/// A history page whose index rows were edited (one naming an event that holds no message
/// or another message, one past the end of the log, one repeated, a position missing) is
/// `Corrupt` naming the session and the position: the page answered wrong or short without
/// a word before (only `verify` noticed). So is the transcript read unparsed
/// (`SessionReader::transcript_texts`, the Python package's read), which answered short,
/// repeated or wrong until session 31; it reads no message id, so the row naming message
/// "x" is refused there as the second naming its event.
#[tokio::test]
async fn a_history_page_over_an_edited_index_is_corrupt_naming_the_position() {
    let damages = [
        (
            "UPDATE history SET event_seq = 1 WHERE position = 2",
            (2, "puts no message there"),
            (2, "puts no message there"),
        ),
        (
            "UPDATE history SET event_seq = 99 WHERE position = 3",
            (3, "past the end of the log"),
            (3, "past the end of the log"),
        ),
        (
            "DELETE FROM history WHERE position = 2",
            (2, "is missing"),
            (2, "is missing"),
        ),
        (
            "INSERT INTO history SELECT 4, event_seq, item, 'x', role, bytes FROM history \
             WHERE position = 3",
            (4, "names message \"x\" of event 5"),
            (3, "names event 5 again"),
        ),
        (
            "INSERT INTO history SELECT 4, event_seq, item, message_id, role, bytes \
             FROM history WHERE position = 3",
            (3, "names event 5 again"),
            (3, "names event 5 again"),
        ),
    ];
    for (damage, (position, says), unparsed) in damages {
        let (_dir, service) = service();
        let s = service
            .root()
            .create(CreateOptions::with_id(id("h")))
            .unwrap();
        s.append(common::turn("t1", "turn-1", "a")).unwrap();
        s.append(Batch::new("b", vec![message("b", "assistant", "b")]))
            .unwrap();
        s.append(Batch::new("c", vec![message("c", "user", "c")]))
            .unwrap();
        s.close().unwrap();
        let r = SessionRef::new("local", "h").unwrap();
        assert_eq!(page_ids(&service, &r).await.len(), 3);
        let file = service.root().session_dir(&id("h")).join("session.sqlite");
        let changed = rusqlite::Connection::open(file)
            .unwrap()
            .execute(damage, [])
            .unwrap();
        assert_eq!(changed, 1, "{damage}");
        let e = service
            .query()
            .history_page(&r, None, 100)
            .await
            .unwrap_err();
        assert!(e.is_corrupt(), "{damage}: {e:?}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("session h, history position {position}: "))
                && text.contains(says),
            "{damage}: {text}"
        );
        let reader = service.root().open_reader(&id("h")).unwrap();
        let snapshot = reader.durable_sequence().unwrap();
        let (position, says) = unparsed;
        for limit in [100, usize::MAX] {
            let e = reader.transcript_texts(snapshot, limit).unwrap_err();
            let text = e.to_string();
            assert!(
                e.is_corrupt()
                    && text.contains(&format!("session h, history position {position}: "))
                    && text.contains(says),
                "transcript_texts, {damage}: {text}"
            );
        }
    }
}

/// A history page holding a message over 64 KiB (stored whole as a blob) whose event row
/// names a blob the file does not hold is `Corrupt` naming the session, the position and
/// the digest: it failed with SQLite's "Query returned no rows" (exit 1 in the CLI).
#[tokio::test]
async fn a_history_page_over_a_missing_blob_is_corrupt_naming_it() {
    let (_dir, service) = service();
    let s = service
        .root()
        .create(CreateOptions::with_id(id("h")))
        .unwrap();
    let big = "x".repeat(100_000);
    s.append(Batch::new("a", vec![message("a", "user", &big)]))
        .unwrap();
    s.close().unwrap();
    let r = SessionRef::new("local", "h").unwrap();
    assert_eq!(page_ids(&service, &r).await.len(), 1);
    let file = service.root().session_dir(&id("h")).join("session.sqlite");
    // The blob row deleted, the event row intact (a changed `payload_ref` is refused
    // before, by the row's check).
    let conn = rusqlite::Connection::open(file).unwrap();
    conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
    let missing: String = conn
        .query_row(
            "SELECT payload_ref FROM events WHERE payload_ref IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let changed = conn
        .execute("DELETE FROM blobs WHERE digest = ?1", [&missing])
        .unwrap();
    assert_eq!(changed, 1);
    let e = service
        .query()
        .history_page(&r, None, 100)
        .await
        .unwrap_err();
    assert!(e.is_corrupt(), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("session h, history position 1: ")
            && text.contains(&format!("references missing blob {missing}")),
        "{text}"
    );
}
