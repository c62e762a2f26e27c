//! `append`: JSON Lines batches into one session, through the library's writer.
//!
//! One batch per line (`session_store::Batch`): `{"operation_id", "turn_id"?, "events":
//! [{"kind", "payload"?, "optional"?, "id"?}]}`; blank lines are skipped. With `--sync
//! each` every batch is flushed (fsynced) before the next line is read; with `--sync end`
//! batches are group-committed and flushed once at the end. With `--json` a line
//! `{"operation_id","first_seq","last_seq","durable_sequence"}` is printed for each batch
//! only once it is durable, so whatever was printed survives a crash of this process.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use serde::Serialize;
use session_store::{Batch, CreateOptions, Error, Session};

use super::{CliResult, Context, Failure, human_bytes, session_id};

/// What is printed for a durable batch.
#[derive(Debug, Serialize)]
struct Durable<'a> {
    operation_id: &'a str,
    first_seq: u64,
    last_seq: u64,
    durable_sequence: u64,
}

/// An accepted batch, not yet reported.
struct Accepted {
    operation_id: String,
    first_seq: u64,
    last_seq: u64,
}

/// Totals for the human summary.
#[derive(Default)]
struct Totals {
    batches: u64,
    events: u64,
    bytes: u64,
}

/// Runs `append`.
///
/// # Errors
/// Status 3 for a missing session (without `create`), 5 when another writer owns it, 6 for
/// a line that is not a valid batch (the batches before it are made durable and reported).
pub fn run(
    cx: &Context,
    id: &str,
    file: Option<&Path>,
    sync_each: bool,
    create: bool,
) -> CliResult<()> {
    let input: Box<dyn BufRead> = match file {
        Some(path) => {
            Box::new(BufReader::new(File::open(path).map_err(|e| {
                Failure::context(format!("open {}", path.display()), &e)
            })?))
        }
        None => Box::new(std::io::stdin().lock()),
    };
    let id = session_id(id)?;
    let root = if create {
        cx.create_root()?
    } else {
        cx.open_root()?
    };
    let session = match root.open_writer(&id) {
        // Another `append --create` may publish it first: then this one appends to it, or
        // is refused naming the writer (status 5), never "already exists".
        Err(Error::SessionNotFound(_)) if create => {
            match root.create(CreateOptions::with_id(id.clone())) {
                Err(Error::SessionExists(_)) => root.open_writer(&id)?,
                other => other?,
            }
        }
        other => other?,
    };
    let mut totals = Totals::default();
    let result = feed(cx, &session, input, sync_each, &mut totals);
    // Whatever was accepted is made durable (and reported) even when a line failed.
    let closed = session.close();
    result?;
    closed?;
    if !cx.json {
        let (_, durable) = session.sequences();
        outln!(
            "appended {} batches ({} events, {} of payload) to {}; durable sequence {durable}",
            totals.batches,
            totals.events,
            human_bytes(totals.bytes),
            session.id()
        );
    }
    Ok(())
}

/// Appends every line of `input`; reports durable batches as it goes (`sync_each`) or
/// after the final flush.
fn feed(
    cx: &Context,
    session: &Session,
    input: Box<dyn BufRead>,
    sync_each: bool,
    totals: &mut Totals,
) -> CliResult<()> {
    let mut pending: Vec<Accepted> = Vec::new();
    let mut failure = None;
    for (n, line) in input.lines().enumerate() {
        let line = match line {
            Ok(line) => line,
            // Bad input, as a line that is not JSON is (status 6), not a failed read.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                failure = Some(Failure::invalid(format!("line {} is not UTF-8", n + 1)));
                break;
            }
            Err(e) => {
                failure = Some(Failure::context(format!("read line {}", n + 1), &e));
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let batch: Batch = match serde_json::from_str(&line) {
            Ok(batch) => batch,
            Err(e) => {
                failure = Some(Failure::invalid(format!(
                    "line {}: not a batch: {e}",
                    n + 1
                )));
                break;
            }
        };
        let operation_id = batch.operation_id.clone();
        let bytes: usize = batch.events.iter().map(|e| e.payload_len()).sum();
        let commit = match session.append(batch) {
            Ok(commit) => commit,
            Err(e) => {
                failure = Some(Failure::context(
                    format!(
                        "line {} (operation {})",
                        n + 1,
                        session_store::quoted(&operation_id)
                    ),
                    &e,
                ));
                break;
            }
        };
        totals.batches += 1;
        totals.events += commit.events.len() as u64;
        totals.bytes += bytes as u64;
        pending.push(Accepted {
            operation_id,
            first_seq: commit.first_seq,
            last_seq: commit.last_seq(),
        });
        if sync_each {
            report(cx, session.flush()?, &mut pending)?;
        }
    }
    if !pending.is_empty() {
        report(cx, session.flush()?, &mut pending)?;
    }
    failure.map_or(Ok(()), Err)
}

/// Prints (with `--json`) the batches in `pending`, all durable at `durable_sequence`.
fn report(cx: &Context, durable_sequence: u64, pending: &mut Vec<Accepted>) -> CliResult<()> {
    if cx.json {
        let mut out = std::io::stdout().lock();
        for a in pending.iter() {
            let line = Durable {
                operation_id: &a.operation_id,
                first_seq: a.first_seq,
                last_seq: a.last_seq,
                durable_sequence,
            };
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
    }
    pending.clear();
    Ok(())
}
