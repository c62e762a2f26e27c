//! A tokio host on [`Service`]: create a session, bind an execution, append a turn with a
//! tool call, cancel a running execution, reopen the session after its writer process was
//! killed mid-turn (restart recovery closes the turn), then page through the session list
//! and the history.
//!
//! ```sh
//! cargo run --release --example service_host
//! ```
//!
//! Everything happens in a temporary folder that is removed at the end. The crash is real:
//! the example starts itself again as a child process (`--crashing-writer ROOT`), which
//! opens the session, appends half a turn, makes it durable and is then killed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use session_store::{
    Batch, CreateOptions, Error, Event, Root, RuntimePhase, Service, SessionId, SessionRef,
};

/// The argument that makes this program the child writer that gets killed.
const CRASHING_WRITER: &str = "--crashing-writer";
/// The host id every service of this example runs under.
const HOST: &str = "example-host";
/// The session the example works on.
const SESSION: &str = "build-bot";

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// An event of `kind` carrying `payload`.
fn event(kind: &str, payload: Value) -> session_store::Result<Event> {
    Event::new(kind).with_payload(&payload)
}

/// A `message/complete` event: one transcript message.
fn message(id: &str, role: &str, content: &str) -> session_store::Result<Event> {
    event(
        "message/complete",
        json!({"message": {"id": id, "role": role, "content": content}}),
    )
}

/// The start of an agent turn: the user's request, then the model asks for a tool.
fn turn_opening(turn: &str, request: &str, call: &str) -> session_store::Result<Vec<Event>> {
    Ok(vec![
        Event::new("turn/start"),
        message(&format!("user-{turn}"), "user", request)?,
        event(
            "tool/call",
            json!({"id": call, "name": "bash", "args": {"cmd": "cargo test"}}),
        )?,
        event("tool/start", json!({"id": call, "name": "bash"}))?,
    ])
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, root] = args.as_slice()
        && flag == CRASHING_WRITER
    {
        return crashing_writer(Path::new(root)).await;
    }

    let dir = tempfile::tempdir()?;
    let root_path = dir.path().join("sessions");
    let service = Service::new(HOST, Root::open(&root_path)?)?;

    // 1. Create a session: the service keeps exactly one runtime per session.
    let runtime = service
        .create(CreateOptions::with_id(SessionId::new(SESSION)?))
        .await?;
    let r: SessionRef = runtime.session_ref().clone();
    println!("created {}", r.session_id.as_str());

    // 2. Bind an execution (the agent loop's authority to write) and append a whole turn:
    //    user message, tool call, tool result, the tool message, the assistant's reply.
    let execution = runtime.bind_execution("agent-turn")?;
    let mut events = turn_opening("turn-1", "run the tests", "call-1")?;
    events.extend([
        event(
            "tool/result",
            json!({"id": "call-1", "name": "bash", "output": "test result: ok. 42 passed"}),
        )?,
        event(
            "message/complete",
            json!({"message": {"id": "tool-turn-1", "role": "tool", "tool_call_id": "call-1",
                "content": "test result: ok. 42 passed"}}),
        )?,
        message("reply-turn-1", "assistant", "All 42 tests pass.")?,
        event("turn/end", json!({"status": "completed"}))?,
    ]);
    // The operation id makes a retried append idempotent.
    execution.append(Batch::new("op-turn-1", events).in_turn("turn-1"))?;
    execution.finish();
    let durable = service.flush(&r).await?; // fsynced
    println!("turn-1 durable up to sequence {durable}");

    // 3. Cancel: a second turn starts a long tool; the user cancels the session.
    let execution = runtime.bind_execution("agent-turn")?;
    execution.append(
        Batch::new(
            "op-turn-2",
            turn_opening("turn-2", "run the slow benchmarks", "call-2")?,
        )
        .in_turn("turn-2"),
    )?;
    let receipt = service.cancel_session(&r)?;
    assert!(execution.cancel_token().is_cancelled());
    println!("cancel accepted, phase {:?}", receipt.phase);
    // A late business result of the cancelled execution is refused...
    let late = Batch::new(
        "op-turn-2-late",
        vec![event(
            "tool/result",
            json!({"id": "call-2", "name": "bash", "output": "too late"}),
        )?],
    )
    .in_turn("turn-2");
    match execution.append(late) {
        Err(Error::StaleExecution(_)) => println!("late tool result refused (stale execution)"),
        other => return Err(format!("expected a stale execution, got {other:?}").into()),
    }
    // ...but it may still close its turn (closure kinds, see `CLOSURE_KINDS`).
    execution.append(
        Batch::new(
            "op-turn-2-end",
            vec![event("turn/end", json!({"status": "interrupted"}))?],
        )
        .in_turn("turn-2"),
    )?;
    execution.finish();
    assert_eq!(runtime.phase(), RuntimePhase::Idle);
    service.close(&r).await?; // flushes and releases the writer

    // 4. A crash: another process opens the session, appends half a turn (a tool is
    //    running), makes it durable, and is killed before it can finish.
    let mut child = Command::new(std::env::current_exe()?)
        .arg(CRASHING_WRITER)
        .arg(&root_path)
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "durable" {
        child.kill()?;
        return Err(format!("child writer said {line:?}").into());
    }
    child.kill()?;
    child.wait()?;
    println!("writer process killed in the middle of turn-3");

    // 5. Reopen: restart recovery closes the open turn with one durable batch (the running
    //    tool gets a `result_unknown` result, the turn ends `interrupted`); no authority
    //    of the dead process is restored.
    let binding = service.open(&r).await?;
    let snapshot = binding.runtime().snapshot();
    let projection = &snapshot.session.projection;
    assert_eq!(projection.turn_id, None);
    assert!(projection.active_tools.is_empty());
    println!(
        "reopened after the crash: turn status {}, phase {:?}",
        projection.turn_status, snapshot.phase
    );
    binding.release().await?;
    service.close(&r).await?;

    // 6. Queries read durable state without taking the writer: the session list and the
    //    history, both one page at a time (a cursor continues where a page ended).
    for name in ["notes", "release"] {
        let rt = service
            .create(CreateOptions::with_id(SessionId::new(name)?))
            .await?;
        service.close(rt.session_ref()).await?;
    }
    let query = service.query();
    let mut cursor = None;
    let mut listed = Vec::new();
    loop {
        let page = query.list(cursor.as_deref(), 2).await?;
        listed.extend(
            page.sessions
                .iter()
                .map(|s| s.session_ref.session_id.clone()),
        );
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    println!(
        "list, 2 per page: {}",
        listed
            .iter()
            .map(|id| id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    // History pages come newest first; messages inside a page are in ascending order.
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page = query.history_page(&r, cursor.as_deref(), 3).await?;
        pages += 1;
        let ids: Vec<&str> = page
            .messages
            .iter()
            .map(|m| m.message_id.as_str())
            .collect();
        println!("history page {pages}: {}", ids.join(", "));
        match page.next_cursor {
            Some(next) if page.has_more => cursor = Some(next),
            _ => break,
        }
    }

    service.shutdown().await?;
    println!("service_host: ok");
    Ok(())
}

/// The child process of step 4: opens the session, appends an open turn with a running
/// tool, flushes, reports `durable` and waits to be killed.
async fn crashing_writer(root: &Path) -> AnyResult<()> {
    let service = Service::new(HOST, Root::open(root)?)?;
    let binding = service.open(&SessionRef::new(HOST, SESSION)?).await?;
    let runtime = binding.runtime();
    let execution = runtime.bind_execution("agent-turn")?;
    execution.append(
        Batch::new(
            "op-turn-3",
            turn_opening("turn-3", "deploy the release", "call-3")?,
        )
        .in_turn("turn-3"),
    )?;
    service.flush(runtime.session_ref()).await?;
    println!("durable");
    // Never returns normally: the parent kills this process.
    std::future::pending::<()>().await;
    Ok(())
}
