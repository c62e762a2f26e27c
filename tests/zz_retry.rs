mod common;
use common::*;
use serde_json::json;
use session_store::*;
fn desc(c: &Commit) -> String {
    format!(
        "{} {} {} {:?} gen={} t={} events={:?}",
        c.commit_id,
        c.operation_id,
        c.first_seq,
        c.turn_id,
        c.writer_generation,
        c.created_at_ms,
        c.events
            .iter()
            .map(|e| (
                e.id.clone(),
                e.seq,
                e.kind.clone(),
                e.optional,
                e.payload_str()
                    .map(|p| (p.len(), format!("{:x}", md5ish(p)))),
                e.content_ref.clone()
            ))
            .collect::<Vec<_>>()
    )
}
fn md5ish(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}
#[test]
fn probe_retry_same_result() {
    let (d, root) = manual_root();
    let s = create(&root, "a");
    let big = "z".repeat(50_000);
    let huge = "q".repeat(100_000);
    let b = Batch::new(
        "op",
        vec![
            Event::new("turn/start"),
            event(
                "tool/call",
                json!({"id":"c","name":"bash","args":{"cmd": big}}),
            ),
            event("tool/start", json!({"id":"c","name":"bash"})),
            event(
                "tool/result",
                json!({"id":"c","name":"bash","output": huge}),
            ),
            Event::new("x/custom")
                .optional()
                .with_payload(&json!({"k": "v"}))
                .unwrap(),
            Event::new("diagnostic").with_id("my-id"),
            turn_end("completed"),
        ],
    )
    .in_turn("t1");
    let c1 = s.append(b.clone()).unwrap();
    let c2 = s.append(b.clone()).unwrap();
    s.flush().unwrap();
    let c3 = s.append(b.clone()).unwrap();
    s.close().unwrap();
    drop(root);
    let root = Root::open(d.path().join("sessions")).unwrap();
    let s = root.open_writer(&id("a")).unwrap();
    let c4 = s.append(b.clone()).unwrap();
    let stored = root.open_reader(&id("a")).unwrap().all_commits().unwrap();
    println!(
        "c1 {}\nc2 {}\nc3 {}\nc4 {}\nst {}",
        desc(&c1),
        desc(&c2),
        desc(&c3),
        desc(&c4),
        desc(&stored[0])
    );
}
