//! Transcript reads for hosts in other languages (issue 15): `SessionReader::transcript_texts`
//! (the messages unparsed, a tail or all of them) and the history-index lookups a fork at
//! a message needs (`transcript_len`, `transcript_entry`, `transcript_find`,
//! `transcript_prefix_kept`, `turn_holding`), each checked against
//! `SessionReader::transcript` on real files: upserts, replacements, messages over 64 KiB,
//! forks, pinned snapshots, and damaged rows.

mod common;

use common::{create, id, message, sqlite3, temp_root, turn_end};
use serde_json::json;
use session_store::{Batch, Error, Event, ForkPoint, MessageText, SessionReader};

/// The messages of `reader`'s transcript at `snapshot` as JSON text, two ways.
fn both(reader: &SessionReader, snapshot: u64, limit: usize) -> (Vec<String>, Vec<String>) {
    let whole: Vec<String> = reader
        .transcript(snapshot)
        .unwrap()
        .iter()
        .map(|m| m.json().to_owned())
        .collect();
    let expected = whole[whole.len().saturating_sub(limit)..].to_vec();
    let texts = reader
        .transcript_texts(snapshot, limit)
        .unwrap()
        .iter()
        .map(|t| t.message().unwrap().to_owned())
        .collect();
    (expected, texts)
}

fn replace(messages: serde_json::Value) -> Event {
    common::event("history/replace", json!({ "messages": messages }))
}

#[test]
fn texts_are_the_transcript_through_upserts_replacements_blobs_and_forks() {
    let (_dir, root) = temp_root();
    let s = create(&root, "texts");
    let big = "x".repeat(70_000); // a message over 64 KiB, and a content part
    s.append(Batch::new(
        "b1",
        vec![
            Event::new("turn/start"),
            message("a", "user", "first"),
            message("b", "assistant", &big),
            common::event(
                "message/complete",
                json!({"message": {"id": "c", "role": "user", "content": "é \u{0} \"q\" \\ 1e999",
                                   "n": [1, -0.0, 12345678901234567890u64]}}),
            ),
            turn_end("completed"),
        ],
    )
    .in_turn("turn-1"))
    .unwrap();
    s.flush().unwrap();
    let reader = root.open_reader(&id("texts")).unwrap();
    let first = reader.durable_sequence().unwrap();
    for limit in [usize::MAX, 3, 2, 1, 0] {
        let (expected, texts) = both(&reader, first, limit);
        assert_eq!(texts, expected, "limit {limit}");
    }
    assert_eq!(reader.transcript_texts(first, usize::MAX).unwrap().len(), 3);

    // An upsert changes position 1; a later message follows; the old snapshot still reads
    // as it was.
    s.append(Batch::new(
        "b2",
        vec![common::event(
            "message/upsert",
            json!({"message": {"id": "a", "role": "user", "content": "edited"}}),
        )],
    ))
    .unwrap();
    s.append(Batch::new("b3", vec![message("d", "user", "later")]))
        .unwrap();
    s.flush().unwrap();
    let second = reader.durable_sequence().unwrap();
    let (expected, texts) = both(&reader, second, usize::MAX);
    assert_eq!(texts, expected);
    assert!(texts[0].contains("edited"));
    let (expected, texts) = both(&reader, first, usize::MAX);
    assert_eq!(texts, expected);
    assert!(texts[0].contains("first"));

    // A replacement: its items come as messages of their own, read from one payload.
    s.append(Batch::new(
        "b4",
        vec![replace(json!([
            {"id": "r1", "role": "user", "content": "kept"},
            {"id": "r2", "role": "assistant", "content": big}
        ]))],
    ))
    .unwrap();
    s.append(Batch::new("b5", vec![message("e", "user", "after")]))
        .unwrap();
    s.flush().unwrap();
    let third = reader.durable_sequence().unwrap();
    for limit in [usize::MAX, 2, 1] {
        let (expected, texts) = both(&reader, third, limit);
        assert_eq!(texts, expected, "limit {limit}");
    }
    // Read in parts below a position, newest part first, the parts make the whole.
    let len = reader.transcript_len(third).unwrap();
    assert_eq!(len, 3);
    let mut parts = Vec::new();
    for before in (2..=len + 1).rev().step_by(2) {
        let mut part = reader.transcript_texts_before(third, before, 2).unwrap();
        part.extend(parts);
        parts = part;
    }
    assert_eq!(parts, reader.transcript_texts(third, usize::MAX).unwrap());
    assert!(
        reader
            .transcript_texts_before(third, 1, 5)
            .unwrap()
            .is_empty()
    );
    let raw = reader.transcript_texts(third, usize::MAX).unwrap();
    assert!(matches!(&raw[0], MessageText::Message(t) if t.contains("r1")));
    assert!(matches!(&raw[2], MessageText::Payload(t) if t.starts_with("{\"message\"")));
    s.close().unwrap();

    // A fork reads its parent's file for the inherited range and its own after it.
    let parent = id("texts");
    let child = root
        .fork(
            &parent,
            ForkPoint::AfterTurn("turn-1".into()),
            Some(id("child")),
        )
        .unwrap();
    let w = root.open_writer(&child).unwrap();
    w.append(Batch::new("c1", vec![message("own", "user", "child's")]))
        .unwrap();
    w.close().unwrap();
    let reader = root.open_reader(&child).unwrap();
    let now = reader.durable_sequence().unwrap();
    for limit in [usize::MAX, 2] {
        let (expected, texts) = both(&reader, now, limit);
        assert_eq!(texts, expected, "limit {limit}");
    }
    assert_eq!(reader.transcript_len(now).unwrap(), 4);
}

#[test]
fn index_lookups_find_messages_and_tell_a_kept_prefix() {
    let (_dir, root) = temp_root();
    let s = create(&root, "look");
    let turn = |op: &str, ids: &[&str]| {
        let mut events = vec![Event::new("turn/start")];
        events.extend(ids.iter().map(|m| message(m, "user", m)));
        events.push(turn_end("completed"));
        Batch::new(op, events).in_turn(op)
    };
    s.append(turn("t1", &["x", "y"])).unwrap();
    s.append(turn("t2", &["z"])).unwrap();
    s.flush().unwrap();
    let reader = root.open_reader(&id("look")).unwrap();
    let now = reader.durable_sequence().unwrap();
    let t1 = reader.turn("t1").unwrap().unwrap();
    assert_eq!(reader.transcript_len(now).unwrap(), 3);
    assert_eq!(reader.transcript_len(t1.boundary_sequence).unwrap(), 2);
    assert_eq!(reader.transcript_len(0).unwrap(), 0);
    let y = reader.transcript_entry(now, 2).unwrap().unwrap();
    assert_eq!((y.position, y.message_id.as_str()), (2, "y"));
    assert!(reader.transcript_entry(now, 4).unwrap().is_none());
    assert!(reader.transcript_entry(now, 0).unwrap().is_none());
    assert_eq!(reader.transcript_find(now, "y").unwrap(), Some(y.clone()));
    assert!(reader.transcript_find(now, "nope").unwrap().is_none());
    assert!(
        reader
            .transcript_find(t1.boundary_sequence, "z")
            .unwrap()
            .is_none()
    );

    // The turn holding a message's event, and none past the log.
    let holding = reader.turn_holding(y.event_seq).unwrap().unwrap();
    assert_eq!(holding.turn_id, "t1");
    assert_eq!(reader.turn_holding(now + 5).unwrap(), None);

    // After t1 the transcript is x, y: exactly the first two of now, not the first one.
    assert!(
        reader
            .transcript_prefix_kept(t1.boundary_sequence, now, 2)
            .unwrap()
    );
    assert!(
        !reader
            .transcript_prefix_kept(t1.boundary_sequence, now, 1)
            .unwrap()
    );
    assert!(
        !reader
            .transcript_prefix_kept(t1.boundary_sequence, now, 3)
            .unwrap()
    );
    assert!(
        !reader
            .transcript_prefix_kept(now, t1.boundary_sequence, 2)
            .unwrap()
    );
    assert!(reader.transcript_prefix_kept(0, now, 0).unwrap());

    // An upsert of y after t1 changes the prefix; a replacement resets it.
    s.append(Batch::new(
        "u",
        vec![common::event(
            "message/upsert",
            json!({"message": {"id": "y", "role": "user", "content": "y2"}}),
        )],
    ))
    .unwrap();
    s.flush().unwrap();
    let later = reader.durable_sequence().unwrap();
    assert!(
        !reader
            .transcript_prefix_kept(t1.boundary_sequence, later, 2)
            .unwrap()
    );
    let moved = reader.transcript_find(later, "y").unwrap().unwrap();
    assert_eq!(moved.position, 2);
    assert!(moved.event_seq > y.event_seq);
    s.append(Batch::new(
        "r",
        vec![replace(
            json!([{"id": "x", "role": "user", "content": "x"}]),
        )],
    ))
    .unwrap();
    s.flush().unwrap();
    let last = reader.durable_sequence().unwrap();
    assert!(!reader.transcript_prefix_kept(later, last, 1).unwrap());
    assert_eq!(reader.transcript_len(last).unwrap(), 1);
    assert!(reader.transcript_find(last, "y").unwrap().is_none());
    s.close().unwrap();
}

#[test]
fn damaged_rows_are_corrupt_not_panics() {
    let (_dir, root) = temp_root();
    let s = create(&root, "bad");
    s.append(Batch::new(
        "b1",
        vec![message("a", "user", "one"), message("b", "user", "two")],
    ))
    .unwrap();
    s.close().unwrap();
    let file = root.session_dir(&id("bad")).join("session.sqlite");
    let conn = rusqlite::Connection::open(&file).unwrap();
    // A payload edited to lack its message (its row check cleared, as a row written
    // before schema 7 has none: a checked row is refused whole, see below), and a history
    // row naming no event.
    conn.execute(
        "UPDATE events SET kind = 'message/complete', payload = '{\"nope\":1}',
                           payload_check = NULL
         WHERE seq = 1",
        [],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO history (position, event_seq, item, message_id, role, bytes)
         VALUES (3, 99, NULL, 'ghost', 'user', 10)",
        [],
    )
    .unwrap();
    drop(conn);
    let reader = root.open_reader(&id("bad")).unwrap();
    // The ghost row is the newest position: the read names the missing event. A read of
    // the newest messages as of an earlier sequence also finds the ghost above them, past
    // the end of the log, as a history page does (since session 31).
    let err = reader.transcript_texts(u64::MAX, usize::MAX).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    let err = reader.transcript_texts(2, usize::MAX).unwrap_err();
    assert!(
        err.to_string()
            .contains("history position 3: the index row names event 99, past the end of the log"),
        "{err}"
    );
    sqlite3(&file, "DELETE FROM history WHERE event_seq = 99");
    let texts = reader.transcript_texts(2, usize::MAX).unwrap();
    assert_eq!(texts.len(), 2);
    let err = texts[0].message().unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert_eq!(
        texts[1].message().unwrap(),
        r#"{"content":"two","id":"b","role":"user"}"#
    );
}

/// A message payload damaged in place (one character changed, the JSON still valid, the
/// row's `payload_check` as written) is refused by every read by sequence: the transcript,
/// its texts, a commit read and `verify`, each naming the event. A row without a check
/// (written before schema 7) is read as it is on the transcript path, which is what the
/// check is for; the commit read and `verify` still refuse it (the operation hash). A
/// check of another type is `Corrupt`, not a panic.
#[test]
fn a_payload_damaged_in_place_is_refused_by_reads_by_sequence() {
    let (_dir, root) = temp_root();
    let s = create(&root, "flip");
    let part = "y".repeat(5_000); // over the inline threshold: a content part
    s.append(Batch::new(
        "b1",
        vec![
            message("a", "user", "alpha words"),
            message("b", "assistant", &part),
        ],
    ))
    .unwrap();
    s.close().unwrap();
    let file = root.session_dir(&id("flip")).join("session.sqlite");
    assert_eq!(
        sqlite3(
            &file,
            "SELECT count(*) FROM events WHERE payload_check IS NOT NULL"
        ),
        "2",
        "every row of this build is checked"
    );
    let reader = root.open_reader(&id("flip")).unwrap();
    let intact = reader.transcript(2).unwrap();
    assert_eq!(intact.len(), 2);
    for (seq, from, to) in [(1, "alpha", "alphb"), (2, "sse-blob:", "sse-blob;")] {
        sqlite3(
            &file,
            &format!(
                "UPDATE events SET payload = replace(payload, '{from}', '{to}') WHERE seq = {seq}"
            ),
        );
        let named = format!("event {seq}: the row does not match its check");
        let refused = |err: Error| {
            assert!(err.is_corrupt(), "{err:?}");
            assert!(err.to_string().contains(&named), "{err}");
        };
        refused(reader.transcript(2).unwrap_err());
        refused(reader.transcript_texts(2, usize::MAX).unwrap_err());
        refused(reader.commits(0, 10).unwrap_err());
        refused(session_store::verify_file(&file).unwrap_err());
        sqlite3(
            &file,
            &format!(
                "UPDATE events SET payload = replace(payload, '{to}', '{from}') WHERE seq = {seq}"
            ),
        );
        assert_eq!(reader.transcript(2).unwrap().len(), 2, "restored");
    }
    // The same damage in a row without a check: the transcript path reads it as it is.
    sqlite3(
        &file,
        "UPDATE events SET payload = replace(payload, 'alpha', 'alphb'), payload_check = NULL
         WHERE seq = 1",
    );
    let read = reader.transcript(2).unwrap();
    assert!(read[0].json().contains("alphb words"), "{}", read[0].json());
    assert!(reader.commits(0, 10).unwrap_err().is_corrupt());
    assert!(session_store::verify_file(&file).unwrap_err().is_corrupt());
    sqlite3(&file, "UPDATE events SET payload_check = 'x' WHERE seq = 2");
    assert!(reader.transcript(2).unwrap_err().is_corrupt());
    assert!(reader.transcript_texts(2, 1).unwrap_err().is_corrupt());
}

/// One reader shared by more threads than its file has pooled connections, each reading
/// the newest messages (what Python's `SessionReader.messages` and the agents adapter's
/// `get_items` do): each read held one connection of the file and asked for a second, so
/// with every connection held each thread waited out the pool's 5-second timeout, and some
/// failed with "no read connection to the session file" (outside testing, session 36).
#[test]
fn threads_sharing_one_reader_read_the_newest_messages_without_waiting_for_each_other() {
    let (_dir, root) = temp_root();
    let s = create(&root, "shared");
    for i in 0..50 {
        s.append(Batch::new(
            format!("op{i}"),
            vec![message(&format!("m{i}"), "user", &"x".repeat(200))],
        ))
        .unwrap();
    }
    s.close().unwrap();
    let reader = root.open_reader(&id("shared")).unwrap();
    let snapshot = reader.durable_sequence().unwrap();
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..16)
            .map(|_| {
                scope.spawn(|| {
                    for _ in 0..5 {
                        let texts = reader.transcript_texts(snapshot, 50).unwrap();
                        assert_eq!(texts.len(), 50);
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
    });
}
