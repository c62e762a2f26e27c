//! Reliability promise 6a: hostile input. Property tests over session ids and batches, JSON
//! that is not JSON or nested 100,000 deep, and a 100 MB payload: every input is stored
//! correctly or refused with a clear error; nothing panics, overflows the stack or changes
//! state on a refusal. `PROPTEST_CASES` sets the cases per property (default 64).

mod common;
mod reliability_support;

use std::cell::Cell;
use std::path::{Component, Path};
use std::time::{Duration, Instant};

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use reliability_support::*;
use serde_json::{Value, json};
use session_store::{
    Batch, CreateOptions, Error, Event, PROJECTION_KINDS, Root, SessionId, SessionRef, replay_file,
};

fn config() -> Config {
    Config {
        cases: env_count("PROPTEST_CASES", 64) as u32,
        // No regression files in the tree; a failure prints its minimal input.
        failure_persistence: None,
        ..Config::default()
    }
}

/// Pieces that path traversal, device names and look-alikes are made of.
const ID_FRAGMENTS: &[&str] = &[
    "..",
    ".",
    "/",
    "\\",
    "\0",
    "\n",
    "\r",
    "\t",
    "\u{7f}",
    "\u{85}",
    "\u{1b}",
    "CON",
    "nul",
    "com1",
    "LPT9",
    "aux",
    ":",
    "*",
    "?",
    "\"",
    "<",
    ">",
    "|",
    " ",
    "a",
    "b",
    "Z",
    "0",
    "é",
    "\u{202e}",
    "\u{200b}",
    "\u{feff}",
    "%2e",
    "%2f",
    "~",
    "$HOME",
    "-",
    "_",
    "...",
    "\u{ff0f}",
    "\u{2215}",
    "\u{2024}",
    "/etc/passwd",
    "C:\\",
    "\\\\?\\",
    "sessions",
    ".staging",
    ".trash",
];

fn arb_id_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>(),
        4 => "[a-zA-Z0-9\\u{e9}\\u{4e2d}][a-zA-Z0-9._ ()\\u{e9}-]{0,30}",
        3 => "[./\\\\\\x00-\\x1f a-zA-Z0-9:%~\\u{80}-\\u{9f}\\u{202e}]{0,12}",
        3 => prop::collection::vec(prop::sample::select(ID_FRAGMENTS), 0..8).prop_map(|v| v.concat()),
        1 => Just("a".repeat(255)),
        1 => Just("a".repeat(256)),
        1 => Just("é".repeat(128)),
    ]
}

/// What any accepted id must satisfy, whatever the rules behind it.
fn check_accepted_id(text: &str, id: &SessionId, root: &Path) -> Result<(), TestCaseError> {
    prop_assert_eq!(id.as_str(), text);
    prop_assert!(!text.is_empty() && text.len() <= 255);
    prop_assert!(text != "." && text != "..");
    prop_assert!(
        !text
            .chars()
            .any(|c| c == '/' || c == '\\' || c == '\0' || c.is_control()),
        "accepted {:?}",
        text
    );
    // One normal path component: joined to the root it names a child of the root.
    let components: Vec<Component<'_>> = Path::new(text).components().collect();
    prop_assert_eq!(components, vec![Component::Normal(text.as_ref())]);
    let joined = root.join(text);
    prop_assert_eq!(joined.parent(), Some(root));
    prop_assert_eq!(joined.file_name().and_then(|n| n.to_str()), Some(text));
    // Every other way in agrees.
    prop_assert_eq!(&text.parse::<SessionId>().unwrap(), id);
    prop_assert_eq!(
        &serde_json::from_value::<SessionId>(json!(text)).unwrap(),
        id
    );
    prop_assert!(SessionRef::new("host", text).is_ok());
    Ok(())
}

#[test]
fn proptest_session_ids_never_escape_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::open(dir.path().join("sessions")).unwrap();
    let (accepted, created) = (Cell::new(0u32), Cell::new(0u32));
    let mut runner = TestRunner::new(config());
    runner
        .run(&arb_id_text(), |text| {
            match SessionId::new(text.clone()) {
                Ok(id) => {
                    accepted.set(accepted.get() + 1);
                    check_accepted_id(&text, &id, root.path())?;
                    // Really create it (once per id): the folder appears directly under
                    // the root and nowhere else. (Ids over 215 bytes cannot be created at
                    // all: see `the_longest_valid_id_can_be_created`.)
                    if text.len() <= 215 && !root.session_dir(&id).exists() {
                        root.create(CreateOptions::with_id(id.clone()))
                            .unwrap()
                            .close()
                            .unwrap();
                        created.set(created.get() + 1);
                    }
                    if text.len() <= 215 {
                        prop_assert!(root.list_ids().unwrap().contains(&id));
                    }
                }
                Err(e) => {
                    prop_assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
                    prop_assert!(serde_json::from_value::<SessionId>(json!(text)).is_err());
                    prop_assert!(text.parse::<SessionId>().is_err());
                    prop_assert!(SessionRef::new("host", text.clone()).is_err());
                }
            }
            Ok(())
        })
        .unwrap();
    // Nothing was created outside the root.
    let outside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(outside, vec![std::ffi::OsString::from("sessions")]);
    for entry in std::fs::read_dir(root.path()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let name = name.to_str().unwrap();
        assert!(
            name.starts_with('.') || SessionId::new(name).is_ok(),
            "unexpected entry {name:?}"
        );
    }
    eprintln!(
        "session ids: {} accepted, {} sessions created, none escaped",
        accepted.get(),
        created.get()
    );
}

/// Known refusals, checked explicitly so a regression names the input.
#[test]
fn hostile_ids_are_refused() {
    for bad in [
        "",
        ".",
        "..",
        "../x",
        "x/..",
        "/etc",
        "a/b",
        "a\\b",
        "..\\x",
        "C:\\x",
        "x\0y",
        "\0",
        "a\nb",
        "tab\t",
        "\u{7f}",
        "\u{85}x",
        "CON",
        "con.txt",
        "Nul",
        "COM1.log",
        "lpt9",
        ".",
        ".hidden",
        "trailing.",
        " lead",
        "trail ",
        "a:b",
        "a*b",
        "a?b",
        "a|b",
        "a<b",
        "a>b",
        "a\"b",
    ] {
        assert!(
            matches!(SessionId::new(bad), Err(Error::InvalidInput { .. })),
            "{bad:?} was accepted"
        );
    }
    assert!(SessionId::new("x".repeat(256)).is_err());
}

/// Regression guard (a library bug, now fixed): `SessionId` accepts up to 255 bytes,
/// but `Root::create` stages the folder as `.staging/<id>.create-<32 hex>`, a name 40 bytes
/// longer, so every id over 215 bytes fails with `Io` "File name too long" (ENAMETOOLONG)
/// on file systems with the usual 255-byte name limit.
#[test]
fn the_longest_valid_id_can_be_created() {
    let (_dir, root) = temp_root();
    for len in [215, 216, 223, 255] {
        let id = SessionId::new("a".repeat(len)).unwrap();
        match root.create(CreateOptions::with_id(id.clone())) {
            Ok(s) => s.close().unwrap(),
            Err(e) => panic!("a valid {len}-byte id cannot be created: {e}"),
        }
        assert!(root.list_ids().unwrap().contains(&id));
        // Neither staging nor trash names contain the id: it can be deleted too.
        root.delete(&id, &session_store::CancelToken::new())
            .unwrap_or_else(|e| panic!("a valid {len}-byte id cannot be deleted: {e}"));
        assert!(!root.list_ids().unwrap().contains(&id));
    }
}

/// Kinds a batch may carry: every projection kind, unknown ones, blank and odd ones.
fn arb_kind() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(PROJECTION_KINDS.to_vec()).prop_map(str::to_owned),
        1 => prop::sample::select(vec![
            "future/kind",
            "",
            "  ",
            " turn/start ",
            "x\0y",
            "message/complete\n",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z/\\-]{1,12}",
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[ -~\\u{80}-\\u{10ffff}]{0,16}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A payload that fits the kind's schema (so batches get accepted as well as refused).
fn valid_payload(kind: &str, n: u8) -> Option<Value> {
    let id = format!("id-{}", n % 6); // few ids: duplicates happen
    Some(match kind {
        "message/complete" | "message/upsert" => {
            json!({"message": {"id": id, "role": "user", "content": "hi"}})
        }
        "session/title" => json!({"title": format!("t{n}")}),
        "turn/end" => json!({"status": "completed"}),
        "tool/start" | "tool/call" | "tool/result" => json!({"id": id, "name": "bash"}),
        "interaction/created" => json!({"id": id, "state": "pending"}),
        "interaction/resolved" => json!({"id": id, "state": "answered"}),
        "step/start" | "step/end" => json!({"id": id}),
        "todo/write" => json!({"todos": [{"content": "x", "status": "pending"}]}),
        "plan/state" | "goal/state" => json!({"n": n}),
        "history/replace" | "model/context-replace" | "compaction" => {
            json!({"messages": [{"id": id, "role": "user", "content": "r"}]})
        }
        "legacy/import" => json!({"messages": [], "modelRef": "m"}),
        "session/config" => json!({"modelRef": format!("model-{n}")}),
        "runtime/recovery" => json!({"state": "recovery_required"}),
        "assistant/attempt" => json!({"id": id, "action": "begin"}),
        "turn/start" | "diagnostic" => return None,
        _ => json!({"n": n}),
    })
}

#[derive(Clone, Debug)]
struct EventSpec {
    kind: String,
    optional: bool,
    /// 0: no payload, 1: schema-valid payload, 2: arbitrary JSON.
    payload_mode: u8,
    n: u8,
    json: Value,
    id: Option<String>,
}

#[derive(Clone, Debug)]
struct BatchSpec {
    operation_id: String,
    turn_id: Option<String>,
    events: Vec<EventSpec>,
    /// Append the same batch a second time (a client retry).
    retry: bool,
}

fn arb_batch() -> impl Strategy<Value = BatchSpec> {
    let event = (
        arb_kind(),
        prop::bool::weighted(0.2),
        prop_oneof![2 => Just(0u8), 12 => Just(1u8), 1 => Just(2u8)],
        any::<u8>(),
        arb_json(),
        prop::option::weighted(0.1, "[a-z0-9]{0,4}"),
    )
        .prop_map(|(kind, optional, payload_mode, n, json, id)| EventSpec {
            kind,
            optional,
            payload_mode,
            n,
            json,
            id,
        });
    (
        prop_oneof![
            4 => (0u8..8).prop_map(|n| format!("op-{n}")), // repeats: retries and conflicts
            1 => Just(String::new()),
            1 => Just("   ".to_owned()),
            1 => Just("inherit:x:y".to_owned()),
            1 => any::<String>(),
        ],
        prop::option::weighted(0.3, "[a-z]{0,3}"),
        prop::collection::vec(event, 0..5),
        prop::bool::weighted(0.25),
    )
        .prop_map(|(operation_id, turn_id, events, retry)| BatchSpec {
            operation_id,
            turn_id,
            events,
            retry,
        })
}

fn build(spec: &BatchSpec) -> Batch {
    let events = spec
        .events
        .iter()
        .map(|e| {
            let mut ev = Event::new(e.kind.clone());
            if e.optional {
                ev = ev.optional();
            }
            if let Some(id) = &e.id {
                ev = ev.with_id(id.clone());
            }
            let payload = match e.payload_mode {
                0 => None,
                1 => valid_payload(&e.kind, e.n),
                _ => Some(e.json.clone()),
            };
            match payload {
                Some(p) => ev.with_payload(&p).expect("JSON values serialize"),
                None => ev,
            }
        })
        .collect();
    let mut batch = Batch::new(spec.operation_id.clone(), events);
    batch.turn_id = spec.turn_id.clone();
    batch
}

#[test]
fn proptest_a_batch_is_stored_whole_or_refused_without_a_trace() {
    // (accepted, retried, refused)
    let figures = (Cell::new(0u64), Cell::new(0u64), Cell::new(0u64));
    let mut runner = TestRunner::new(config());
    runner
        .run(&prop::collection::vec(arb_batch(), 1..12), |specs| {
            let (_dir, root) = manual_root();
            let s = create(&root, "hostile");
            let mut accepted = Vec::new();
            let attempts = specs
                .iter()
                .flat_map(|spec| std::iter::repeat_n(spec, 1 + usize::from(spec.retry)));
            for spec in attempts {
                let batch = build(spec);
                let n = batch.events.len() as u64;
                let before = s.snapshot();
                let before_projection = serde_json::to_string(&before.projection).unwrap();
                let result = s.append(batch);
                let after = s.snapshot();
                let unchanged = after.event_sequence == before.event_sequence
                    && serde_json::to_string(&after.projection).unwrap() == before_projection;
                match result {
                    Ok(c) if c.first_seq > before.event_sequence => {
                        prop_assert_eq!(c.first_seq, before.event_sequence + 1);
                        prop_assert_eq!(after.event_sequence, before.event_sequence + n);
                        prop_assert_eq!(c.events.len() as u64, n);
                        figures.0.set(figures.0.get() + 1);
                        accepted.push(c);
                    }
                    Ok(retried) => {
                        prop_assert!(unchanged, "an idempotent retry changed the session");
                        let original = accepted
                            .iter()
                            .find(|c| c.operation_id == retried.operation_id);
                        prop_assert!(
                            original.is_some_and(|o| o.commit_id == retried.commit_id),
                            "a retry returned a commit that was never accepted"
                        );
                        figures.1.set(figures.1.get() + 1);
                    }
                    Err(e) => {
                        prop_assert!(
                            matches!(
                                e,
                                Error::InvalidInput { .. }
                                    | Error::InvalidPayload { .. }
                                    | Error::UnsupportedVersion { .. }
                                    | Error::OperationConflict { .. }
                            ),
                            "unexpected refusal {:?} for {:?}",
                            e,
                            spec
                        );
                        prop_assert!(!e.to_string().is_empty());
                        prop_assert!(unchanged, "refused batch {:?} changed the session", spec);
                        figures.2.set(figures.2.get() + 1);
                    }
                }
            }
            let durable = s.flush().unwrap();
            prop_assert_eq!(durable, s.snapshot().event_sequence);
            let live = serde_json::to_string(&s.snapshot().projection).unwrap();
            s.close().unwrap();
            drop(s);
            // What is on disk is exactly what was accepted, and folds to the same state.
            let replayed = replay_file(root.session_dir(&id("hostile"))).unwrap();
            prop_assert_eq!(history_lines(&replayed.commits), history_lines(&accepted));
            prop_assert_eq!(serde_json::to_string(&replayed.projection).unwrap(), live);
            Ok(())
        })
        .unwrap();
    eprintln!(
        "batches: {} accepted, {} idempotent retries, {} refused without a trace",
        figures.0.get(),
        figures.1.get(),
        figures.2.get()
    );
    assert!(
        figures.0.get() > 0 && figures.2.get() > 0,
        "both outcomes were exercised"
    );
}

#[test]
fn proptest_payload_text_is_json_or_refused() {
    let mut runner = TestRunner::new(config());
    let text = prop_oneof![
        any::<String>(),
        "[\\[\\]{}\",:0-9a-z \\\\]{0,24}",
        arb_json().prop_map(|v| v.to_string()),
        arb_json().prop_map(|v| format!("{v} {v}")),
    ];
    runner
        .run(&text, |text| {
            match Event::new("x").optional().with_payload_json(&text) {
                Ok(e) => {
                    prop_assert!(serde_json::from_str::<Value>(&text).is_ok());
                    // Stored as given, but for the white space around the value
                    // (serde_json's `RawValue` drops it).
                    let stored = e.payload_str().unwrap();
                    prop_assert!(
                        stored == text || stored == text.trim_matches([' ', '\t', '\n', '\r']),
                        "{:?} stored as {:?}",
                        text,
                        stored
                    );
                }
                Err(e) => {
                    prop_assert!(matches!(e, Error::InvalidInput { .. }), "{:?}", e);
                    prop_assert!(serde_json::from_str::<Value>(&text).is_err());
                }
            }
            Ok(())
        })
        .unwrap();
}

/// `depth` nested arrays as JSON text, built without recursion.
fn nested(depth: usize) -> String {
    let mut s = String::with_capacity(2 * depth);
    s.extend(std::iter::repeat_n('[', depth));
    s.extend(std::iter::repeat_n(']', depth));
    s
}

/// Appends `event` alone; it must be stored or refused with a clear error that changes
/// nothing. Returns the stored payload text.
fn append_or_refuse(s: &session_store::Session, op: &str, event: Event) -> Option<String> {
    let before = s.sequences();
    let text = event.payload_str().map(str::to_owned);
    match s.append(Batch::new(op, vec![event])) {
        Ok(_) => text,
        Err(e) => {
            assert!(
                matches!(e, Error::InvalidPayload { .. } | Error::InvalidInput { .. }),
                "{op}: {e:?}"
            );
            // serde_json's "recursion limit exceeded", or the append's nesting limit
            // (`format::MAX_PAYLOAD_NESTING`, session 35).
            assert!(
                e.to_string().contains("recursion") || e.to_string().contains("more than 512 deep"),
                "{op}: a clear reason: {e}"
            );
            assert_eq!(s.sequences(), before, "{op}: a refusal changed nothing");
            None
        }
    }
}

#[test]
fn deeply_nested_json_is_refused_or_stored_without_a_stack_overflow() {
    let (_dir, root) = temp_root();
    let s = create(&root, "deep");
    let deep = nested(100_000);
    let mut stored: Vec<String> = Vec::new();
    // As an optional event's payload, through the event API.
    match Event::new("x").optional().with_payload_json(&deep) {
        Err(e) => assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}"),
        Ok(ev) => stored.extend(append_or_refuse(&s, "deep-api", ev)),
    }
    // Through a JSON Lines batch.
    let line = format!(
        r#"{{"operation_id":"deep-line","events":[{{"kind":"y","optional":true,"payload":{deep}}}]}}"#
    );
    match serde_json::from_str::<Batch>(&line) {
        Err(e) => assert!(!e.to_string().is_empty()),
        Ok(batch) => {
            let event = batch.events.into_iter().next().unwrap();
            stored.extend(append_or_refuse(&s, "deep-line", event));
        }
    }
    // Where the projection parses the payload: a message's content, a plan object.
    for (op, kind, payload) in [
        (
            "deep-message",
            "message/complete",
            format!(r#"{{"message":{{"id":"m","role":"user","content":{deep}}}}}"#),
        ),
        ("deep-plan", "plan/state", format!(r#"{{"plan":{deep}}}"#)),
    ] {
        if let Ok(ev) = Event::new(kind).with_payload_json(&payload) {
            stored.extend(append_or_refuse(&s, op, ev));
        }
    }
    // Nesting the parser allows is stored and read back unchanged, also in a message.
    let ok = nested(100);
    let message = format!(r#"{{"message":{{"id":"m-ok","role":"user","content":{ok}}}}}"#);
    s.append(Batch::new(
        "nested-ok",
        vec![
            Event::new("x").optional().with_payload_json(&ok).unwrap(),
            Event::new("message/complete")
                .with_payload_json(&message)
                .unwrap(),
        ],
    ))
    .unwrap();
    stored.extend([ok.clone(), message.clone()]);
    s.close().unwrap();
    drop(s);
    eprintln!(
        "deep_json: {} of the 100,000-deep payloads were stored, the rest refused",
        stored.len() - 2
    );

    // Everything stored reads back byte for byte, through replay and a cold reader, and
    // the query side serves the session.
    let replayed = replay_file(root.session_dir(&id("deep"))).unwrap();
    let texts: Vec<String> = replayed
        .commits
        .iter()
        .flat_map(|c| &c.events)
        .filter_map(|e| e.payload_str().map(str::to_owned))
        .collect();
    assert_eq!(texts, stored);
    let reader = root.open_reader(&id("deep")).unwrap();
    let transcript = reader
        .transcript(reader.durable_sequence().unwrap())
        .unwrap();
    assert!(transcript.iter().any(|m| m.id() == "m-ok"));
    let cold = root
        .open_reader(&id("deep"))
        .unwrap()
        .all_commits()
        .unwrap();
    assert_eq!(history_lines(&cold), history_lines(&replayed.commits));
    let service = session_store::Service::new("local", root.clone()).unwrap();
    let sref = service.session_ref(id("deep"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let history = service.query().history(&sref).await.unwrap();
        assert!(history.iter().any(|m| m.id() == "m-ok"));
        // Open and close through the service (recovery check, catalog refresh with the
        // title and preview), then list: every path that looks at messages.
        let binding = service.open(&sref).await.unwrap();
        binding.release().await.unwrap();
        service.close(&sref).await.unwrap();
        let page = service.query().list(None, 10).await.unwrap();
        assert_eq!(page.sessions.len(), 1);
    });

    // A deep payload written into the file behind the store's back: `replay` refuses it
    // (its operation hash no longer matches), without a stack overflow.
    let file = root.session_dir(&id("deep")).join("session.sqlite");
    let conn = rusqlite::Connection::open(&file).unwrap();
    let forged = format!(r#"{{"message":{{"id":"m-ok","role":"user","content":{deep}}}}}"#);
    conn.execute(
        "UPDATE events SET payload = ?1 WHERE seq = (SELECT max(seq) FROM events)",
        [&forged],
    )
    .unwrap();
    drop(conn);
    let err = replay_file(root.session_dir(&id("deep"))).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    // The fold keeps a message's JSON as text, so it may accept the nesting; what matters
    // is an answer, not a stack overflow.
    if let Err(e) = root.open_reader(&id("deep")).and_then(|r| r.projection()) {
        assert!(
            is_damage(&e) || matches!(e, Error::InvalidPayload { .. }),
            "{e}"
        );
    }
}

#[test]
fn huge_ids_kinds_and_operation_ids_are_stored_or_refused_cleanly() {
    let (_dir, root) = manual_root();
    let s = create(&root, "huge");
    let mb = "k".repeat(1 << 20);
    let cases = [
        Batch::new(mb.clone(), vec![title("big op id")]),
        Batch::new("big-kind", vec![Event::new(format!("x/{mb}")).optional()]),
        Batch::new("big-event-id", vec![title("t").with_id(mb.clone())]),
        Batch::new("big-turn", vec![Event::new("turn/start")]).in_turn(mb.clone()),
        Batch::new("nul-kind", vec![Event::new("x/\0/y").optional()]),
    ];
    let mut stored = Vec::new();
    for batch in cases {
        let op = batch.operation_id.chars().take(16).collect::<String>();
        let before = s.sequences();
        match s.append(batch) {
            Ok(c) => stored.push(c),
            Err(e) => {
                assert_eq!(s.sequences(), before, "{op}: a refusal used a sequence");
                assert!(!e.to_string().is_empty());
            }
        }
    }
    s.close().unwrap();
    drop(s);
    let replayed = replay_file(root.session_dir(&id("huge"))).unwrap();
    assert_eq!(history_lines(&replayed.commits), history_lines(&stored));
}

/// A turn id holding a control character could be appended, and then never named by
/// `fork --after-turn` or `rewind --before-turn` (outside testing, session 38): it is
/// refused and changes nothing; a blank one is none (the turn's id derived). A batch
/// without events or without an operation id says which is missing (both were "required").
#[test]
fn turn_ids_with_control_characters_are_refused_and_blank_ones_derived() {
    let (_dir, root) = manual_root();
    let s = create(&root, "turns");
    let turn = |op: &str, turn_id: &str| {
        Batch::new(
            op,
            vec![
                Event::new("turn/start"),
                Event::new("turn/end")
                    .with_payload(&json!({"status": "completed"}))
                    .unwrap(),
            ],
        )
        .in_turn(turn_id)
    };
    for bad in ["t\0", "t\n1", "\u{1b}[2J", "t\u{85}"] {
        let e = s.append(turn("bad", bad)).unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }), "{bad:?}: {e}");
        assert!(
            e.to_string().contains("contains a control character"),
            "{e}"
        );
        assert_eq!(s.sequences(), (0, 0), "{bad:?}");
    }
    let blank = s.append(turn("blank", " ")).unwrap();
    let kept = s.append(turn("named", "t 1 ünïcode")).unwrap();
    assert_eq!(kept.turn_id.as_deref(), Some("t 1 ünïcode"));
    assert!(
        blank
            .turn_id
            .as_deref()
            .is_some_and(|t| !t.trim().is_empty())
    );
    for (batch, says) in [
        (Batch::new("empty", vec![]), "at least one event"),
        (
            Batch::new("  ", vec![title("t")]),
            "an operation id is required",
        ),
    ] {
        let e = s.append(batch).unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
    s.close().unwrap();
}

/// Operation ids, turn ids and event ids over 1,024 bytes, kinds over 256, and any of them
/// holding a control character, are refused naming which, nothing changed (outside
/// testing, session 39: a 1 MiB operation id, event id and kind holding NUL and ESC were
/// stored); `Batch::validate` refuses them alike, and the largest allowed are stored.
#[test]
fn long_names_and_names_with_control_characters_are_refused() {
    let (_dir, root) = manual_root();
    let s = create(&root, "names");
    let long_id = "i".repeat(1025);
    let long_kind = format!("x/{}", "k".repeat(255));
    let event = |kind: &str, id: &str| {
        let mut e = Event::new(kind).optional();
        e.id = id.to_owned();
        e
    };
    let cases = [
        (
            Batch::new(long_id.clone(), vec![title("t")]),
            "operation id",
            "1025 bytes",
        ),
        (
            Batch::new("op\0", vec![title("t")]),
            "operation id",
            "control character",
        ),
        (
            Batch::new("op\u{1b}[2J", vec![title("t")]),
            "operation id",
            "control character",
        ),
        (
            Batch::new("op", vec![title("t")]).in_turn(long_id.clone()),
            "turn id",
            "1025 bytes",
        ),
        (
            Batch::new("op", vec![event("x/y", &long_id)]),
            "events[0].id",
            "1025 bytes",
        ),
        (
            Batch::new("op", vec![event("x/y", "e\n1")]),
            "events[0].id",
            "control character",
        ),
        (
            Batch::new("op", vec![title("t"), event(&long_kind, "")]),
            "events[1].kind",
            "257 bytes",
        ),
        (
            Batch::new("op", vec![event("x/\u{7}", "")]),
            "events[0].kind",
            "control character",
        ),
        // At either end too (session 43: they were trimmed off with the white space, so
        // `"ab\r"` answered as a retry of `"ab"`).
        (
            Batch::new("op\r", vec![title("t")]),
            "operation id",
            "control character",
        ),
        (
            Batch::new("\nop", vec![title("t")]),
            "operation id",
            "control character",
        ),
        (
            Batch::new("op", vec![event(" x/y\n", "")]),
            "events[0].kind",
            "control character",
        ),
    ];
    for (batch, names, says) in cases {
        let validated = batch.validate().unwrap_err();
        let e = s.append(batch).unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
        for text in [e.to_string(), validated.to_string()] {
            assert!(text.contains(names) && text.contains(says), "{text}");
            assert!(text.len() < 300, "the whole id printed: {}", text.len());
        }
        assert_eq!(s.sequences(), (0, 0));
    }
    let longest = "i".repeat(1024);
    let kind = format!("x/{}", "k".repeat(254));
    let c = s
        .append(Batch::new(longest.clone(), vec![event(&kind, &longest)]).in_turn(longest.clone()))
        .unwrap();
    assert_eq!(c.operation_id, longest);
    // Spaces around an operation id or a kind are still taken off: the same operation.
    let first = s.append(Batch::new("spaced", vec![title("t")])).unwrap();
    let again = s
        .append(Batch::new(
            " spaced\u{a0}",
            vec![
                Event::new(" session/title ")
                    .with_payload(&json!({"title": "t"}))
                    .unwrap(),
            ],
        ))
        .unwrap();
    assert_eq!(again.commit_id, first.commit_id);
    assert!(s.append(Batch::new("spaced\r", vec![title("t")])).is_err());
    s.flush().unwrap();
    s.close().unwrap();
}

/// Child role: appends a small commit and then one optional event with a payload of
/// `SS_BYTES` bytes (random letters when `SS_RANDOM` is set, else a repeated phrase) in the
/// same write-behind tail, flushes, reopens and reads everything back. Prints one of
/// `stored …` (with timings and the peak resident set), `refused <error> kept <bool>`
/// (whether the small commit survived the refusal) or `unreadable <error>`.
#[test]
#[ignore = "child process role, run by huge_payload_*"]
fn huge_payload_role() {
    let Ok(root_path) = std::env::var("SS_ROOT") else {
        return; // run by hand without a parent: nothing to do
    };
    let bytes: usize = std::env::var("SS_BYTES").unwrap().parse().unwrap();
    let random = std::env::var("SS_RANDOM").is_ok();
    let started = Instant::now();
    let mut payload = String::with_capacity(bytes + 16);
    payload.push_str(r#"{"body":""#);
    if random {
        let mut rng = fastrand::Rng::with_seed(1);
        payload.extend((0..bytes).map(|_| rng.alphanumeric()));
    } else {
        let phrase = "all work and no play makes a dull payload ";
        while payload.len() < bytes {
            payload.push_str(phrase);
        }
        payload.truncate(bytes + 9);
    }
    payload.push_str(r#""}"#);
    // Default write-behind (200 ms): with a long one, the append over the queue budget
    // would wait for it (see `an_append_over_the_queue_budget_does_not_wait_for_the_timer`).
    let root = Root::open(root_path).unwrap();
    let name = id("huge");
    let s = root.create(CreateOptions::with_id(name.clone())).unwrap();
    s.append(Batch::new("before", vec![title("before the big one")]))
        .unwrap();
    let kept = |root: &Root| {
        root.open_reader(&name)
            .and_then(|r| r.all_commits())
            .is_ok_and(|c| c.first().is_some_and(|c| c.operation_id == "before"))
    };
    let refuse = |e: Error, s: session_store::Session| {
        let _ = s.close();
        drop(s);
        println!("refused {e} kept {}", kept(&root));
    };
    let event = match Event::new("huge/blob")
        .optional()
        .with_payload_json(&payload)
    {
        Ok(e) => e,
        Err(e) => return refuse(e, s),
    };
    drop(payload);
    let digest = content_digest(None, std::slice::from_ref(&event));
    if let Err(e) = s.append(Batch::new("huge", vec![event])) {
        return refuse(e, s);
    }
    if let Err(e) = s.flush() {
        return refuse(e, s);
    }
    let wrote = started.elapsed();
    s.close().unwrap();
    drop(s);
    let commits = match root.open_reader(&name).and_then(|r| r.all_commits()) {
        Ok(c) => c,
        Err(e) => {
            println!("unreadable {e}");
            return;
        }
    };
    assert_eq!(commits.len(), 2);
    assert_eq!(
        commit_digest(&commits[1]),
        digest,
        "read back byte for byte"
    );
    let len = commits[1].events[0].payload_len();
    drop(commits);
    let file = std::fs::metadata(root.session_dir(&name).join("session.sqlite"))
        .unwrap()
        .len();
    println!(
        "stored {len} bytes (file {file} bytes) write {:.1?} total {:.1?} peak_rss_kb {}",
        wrote,
        started.elapsed(),
        peak_rss_kb()
    );
}

fn run_huge_payload(bytes: usize, random: bool, max_rss_mb: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut env = vec![
        (
            "SS_ROOT",
            dir.path().join("sessions").to_str().unwrap().to_owned(),
        ),
        ("SS_BYTES", bytes.to_string()),
    ];
    if random {
        env.push(("SS_RANDOM", "1".to_owned()));
    }
    let started = Instant::now();
    let mut child = ChildLines::spawn("huge_payload_role", &env);
    let lines = child.drain_within(Duration::from_secs(600)).to_vec();
    let outcome = lines
        .iter()
        .find_map(|l| {
            ["stored ", "refused ", "unreadable "]
                .iter()
                .find_map(|marker| l.find(marker).map(|at| l[at..].to_owned()))
        })
        .unwrap_or_else(|| panic!("the child printed no outcome: {lines:?}"));
    assert!(child.child.wait().unwrap().success(), "the child failed");
    eprintln!(
        "huge_payload: {bytes} bytes ({}): {outcome} in {:.1?}",
        if random { "random" } else { "repetitive" },
        started.elapsed()
    );
    if let Some(rest) = outcome.strip_prefix("stored ") {
        let peak: u64 = rest.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(
            peak / 1024 < max_rss_mb,
            "peak RSS {} MiB for a {} MiB payload",
            peak / 1024,
            bytes >> 20
        );
    } else if let Some(rest) = outcome.strip_prefix("refused ") {
        assert!(
            rest.ends_with("kept true"),
            "a refused payload took the commit before it along: {rest}"
        );
    } else {
        panic!("the store accepted a payload it cannot read back: {outcome}");
    }
}

/// An append over the queue budget waits for room and must start a drain right away,
/// also when an earlier append already armed the write-behind timer. (On the tree this
/// suite was written against it did not: the append blocked until the timer fired, here
/// a minute; fixed by the inline backpressure drain of 2ec9192.)
#[test]
fn an_append_over_the_queue_budget_does_not_wait_for_the_timer() {
    let dir = tempfile::tempdir().unwrap();
    let options = session_store::StoreOptions::default()
        .with_write_behind(Duration::from_secs(60))
        .with_queue_budget(1 << 20);
    let root = Root::with_options(dir.path().join("sessions"), options).unwrap();
    let s = create(&root, "budget");
    s.append(Batch::new("small", vec![title("arms the timer")]))
        .unwrap();
    let big = format!(r#"{{"body":"{}"}}"#, "b".repeat(2 << 20));
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = s.clone();
    std::thread::spawn(move || {
        let started = Instant::now();
        let result = writer.append(Batch::new(
            "big",
            vec![Event::new("x").optional().with_payload_json(&big).unwrap()],
        ));
        let _ = tx.send((result.map(|c| c.first_seq), started.elapsed()));
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok((result, took)) => {
            assert_eq!(result.unwrap(), 2);
            assert!(took < Duration::from_secs(5), "append waited {took:?}");
        }
        Err(_) => panic!(
            "an append over the queue budget was still waiting after 10 s \
             (for the 60 s write-behind timer)"
        ),
    }
    s.close().unwrap();
}

#[test]
fn a_100_mb_payload_is_stored_and_read_back_with_bounded_memory() {
    // Random letters: zstd saves little, so SQLite really writes ~100 MB.
    run_huge_payload(100 << 20, true, 1024);
}

/// The heavy variant: 500 MB of random letters.
#[test]
#[ignore = "soak: 500 MB payload, run by scripts/soak.sh"]
fn soak_huge_random_payload() {
    run_huge_payload(500 << 20, true, 4096);
}

/// The heaviest variant: just over the blob limit (`format::MAX_PAYLOAD_BYTES`), repetitive so it
/// compresses to almost nothing. It must be refused at append, or stored and read back.
///
/// Regression guard (a library bug, now fixed): it is accepted, written and closed,
/// and then every read of the session fails with `Corrupt` ("blob … claims … bytes"):
/// the session can no longer be opened.
#[test]
#[ignore = "soak: 1 GiB payload, needs ~4 GB RAM, run by scripts/soak.sh"]
fn soak_payload_over_the_blob_limit() {
    run_huge_payload((1 << 30) + 1024, false, 8192);
}

/// A `cwd` longer than any path (`PATH_MAX`, 4,096 bytes) is refused as a title over
/// 1,024 bytes is, naming the limit, and creates nothing; a 10 MB one was recorded in the
/// header (and every catalog entry and listing after). One of exactly 4,096 bytes is kept.
#[test]
fn a_cwd_longer_than_path_max_is_refused() {
    let (_dir, root) = temp_root();
    for len in [4_097, 10 << 20] {
        let cwd = format!("/{}", "d".repeat(len - 1));
        let options = CreateOptions::with_id(id("long")).with_cwd(cwd);
        match root.create(options) {
            Err(Error::InvalidInput { what, .. }) => {
                assert!(what.contains("4096"), "{what}")
            }
            other => panic!("a {len}-byte cwd: {other:?}"),
        }
        assert!(
            root.list_ids().unwrap().is_empty(),
            "a refused create left a session"
        );
    }
    let most = format!("/{}", "d".repeat(4_095));
    root.create(CreateOptions::with_id(id("long")).with_cwd(most.clone()))
        .unwrap()
        .close()
        .unwrap();
    let reader = root.open_reader(&id("long")).unwrap();
    assert_eq!(reader.header().cwd.as_deref(), Some(most.as_str()));
}

/// A session named as its own parent is refused (no session can derive from itself; the
/// header recorded the loop, and lineage walks met it), and creates nothing.
#[test]
fn a_session_cannot_be_its_own_parent() {
    let (_dir, root) = temp_root();
    let options = CreateOptions::with_id(id("self")).with_parent(id("self"));
    match root.create(options) {
        Err(Error::InvalidInput { what, .. }) => {
            assert!(what.contains("own parent"), "{what}")
        }
        other => panic!("a session its own parent: {other:?}"),
    }
    assert!(root.list_ids().unwrap().is_empty());
}

/// A payload given as a JSON array where the kind takes an object, or holding a key twice
/// in one object, is refused by a live session's append and by `Batch::validate` alike,
/// and changes nothing: serde read a struct from an array of its fields, so `["x"]` was
/// stored as a title the sqlite3 shell's views, search and Python did not read as one
/// (outside testing, session 47), and a message of two `content` keys showed one text on
/// the history page and another to search and Python (U3, session 48).
#[test]
fn a_payload_its_readers_would_read_apart_is_refused_and_changes_nothing() {
    let (_dir, root) = temp_root();
    let s = create(&root, "arrays");
    let twice = r#"{"message":{"id":"m1","role":"user","content":"harmless","content":"hidden"}}"#;
    for (kind, payload, reason) in [
        (
            "session/title",
            r#"["x"]"#,
            "must be a JSON object, not an array",
        ),
        (
            "tool/result",
            r#"["call-1", "bash"]"#,
            "must be a JSON object, not an array",
        ),
        (
            "todo/write",
            r#"{"todos": [["write it", "pending"]]}"#,
            "todos[0] must be a JSON object",
        ),
        (
            "message/complete",
            twice,
            r#"holds the key "content" twice"#,
        ),
    ] {
        let batch = || {
            Batch::new(
                "apart",
                vec![Event::new(kind).with_payload_json(payload).unwrap()],
            )
        };
        let said = |e: Error| match e {
            Error::InvalidPayload { reason, .. } => reason,
            other => panic!("{kind} {payload}: {other:?}"),
        };
        let validated = said(batch().validate().unwrap_err());
        let appended = said(s.append(batch()).unwrap_err());
        assert_eq!(validated, appended, "{kind}: one error for both");
        assert!(appended.contains(reason), "{appended}");
        assert_eq!(s.sequences(), (0, 0), "{kind}: a refusal changed nothing");
    }
    s.append(Batch::new(
        "object",
        vec![
            Event::new("session/title")
                .with_payload(&json!({"title": "x"}))
                .unwrap(),
        ],
    ))
    .unwrap();
    s.flush().unwrap();
    assert_eq!(s.sequences(), (1, 1), "an object is accepted");
}
