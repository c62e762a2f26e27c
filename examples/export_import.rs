//! Export and import between two roots: a session (here a fork, whose early events live in
//! its parent's file) is written as one self-contained SQLite file, checked, and imported
//! into another root, once under its own id and once under a new one. A damaged file is
//! refused before anything becomes visible.
//!
//! ```sh
//! cargo run --release --example export_import
//! ```
//!
//! Uses the synchronous library API in a temporary folder that is removed at the end.

mod common;

use common::transcript;
use serde_json::json;
use session_store::{
    Batch, CreateOptions, Error, Event, ForkPoint, ImportOptions, Root, SessionId, verify_file,
};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// A completed turn whose tool output is large (stored once as a compressed blob).
fn turn(turn_id: &str, output: &str) -> session_store::Result<Batch> {
    let call = format!("call-{turn_id}");
    Ok(Batch::new(
        format!("op-{turn_id}"),
        vec![
            Event::new("turn/start"),
            Event::new("message/complete").with_payload(&json!({"message":
                {"id": format!("q-{turn_id}"), "role": "user", "content": "show the log"}}))?,
            Event::new("tool/call").with_payload(
                &json!({"id": call, "name": "read_file", "args": {"path": "build.log"}}),
            )?,
            Event::new("tool/result")
                .with_payload(&json!({"id": call, "name": "read_file", "output": output}))?,
            Event::new("message/complete").with_payload(&json!({"message":
                {"id": format!("tool-{turn_id}"), "role": "tool", "tool_call_id": call,
                 "content": output}}))?,
            Event::new("turn/end").with_payload(&json!({"status": "completed"}))?,
        ],
    )
    .in_turn(turn_id))
}

fn main() -> AnyResult<()> {
    let dir = tempfile::tempdir()?;
    let laptop = Root::open(dir.path().join("laptop"))?;
    let server = Root::open(dir.path().join("server"))?;

    // On the laptop: a session with two turns and a fork of it after the first turn.
    let log = "warning: unused variable\n".repeat(2_000); // 48 KiB
    let parent = SessionId::new("debug-build")?;
    let session = laptop.create(CreateOptions::with_id(parent.clone()))?;
    session.append(turn("turn-1", &log)?)?;
    session.append(turn("turn-2", "ok")?)?;
    session.close()?;
    let fork = laptop.fork(
        &parent,
        ForkPoint::AfterTurn("turn-1".into()),
        Some(SessionId::new("debug-build-2")?),
    )?;

    // Export the fork: one file holding its whole history, inherited events included.
    let file = dir.path().join("debug-build-2.sqlite");
    let report = laptop.export(&fork, &file)?;
    println!(
        "exported {}: {} commits, {} events, {} bytes",
        fork.as_str(),
        report.commits,
        report.events,
        report.bytes
    );
    // Anyone can check such a file before trusting it (integrity, hashes, full replay).
    verify_file(&file)?;

    // Import into the server under the file's id; a second import of it is refused.
    let imported = server.import(&file, ImportOptions::default())?;
    println!(
        "imported as {}: {}",
        imported.as_str(),
        transcript(&server, &imported)?.join(", ")
    );
    assert_eq!(transcript(&server, &imported)?, transcript(&laptop, &fork)?);
    match server.import(&file, ImportOptions::default()) {
        Err(Error::SessionExists(id)) => println!("second import refused: {id} exists"),
        other => return Err(format!("expected SessionExists, got {other:?}").into()),
    }

    // Import it again under another id (an id remap).
    let copy = server.import(
        &file,
        ImportOptions::default().with_session_id(SessionId::new("debug-build-copy")?),
    )?;
    let header = server.stat(&copy)?.header;
    println!(
        "imported again as {} (origin {})",
        copy.as_str(),
        header.origin.as_str()
    );

    // A damaged file (here cut in half) is refused, and the server is left as it was.
    let bytes = std::fs::read(&file)?;
    let damaged = dir.path().join("damaged.sqlite");
    std::fs::write(&damaged, &bytes[..bytes.len() / 2])?;
    let refused = server.import(
        &damaged,
        ImportOptions::default().with_session_id(SessionId::new("debug-build-damaged")?),
    );
    let Err(error) = refused else {
        return Err("a damaged file was imported".into());
    };
    println!("damaged file refused: {error}");
    assert_eq!(server.list_ids()?.len(), 2);

    println!("export_import: ok");
    Ok(())
}
