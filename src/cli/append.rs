//! `append`: JSON Lines batches into one session, through the library's writer.
//!
//! One batch per line (`session_store::Batch`): `{"operation_id", "turn_id"?, "events":
//! [{"kind", "payload"?, "optional"?, "id"?}]}`; blank lines are skipped. With `--sync
//! each` every batch is flushed (fsynced) before the next line is read; with `--sync end`
//! batches are group-committed (the write-behind drains) and flushed once at the end. With
//! `--json` a line `{"operation_id","first_seq","last_seq","durable_sequence"}` is printed
//! for each batch only once it is durable, so whatever was printed survives a crash of this
//! process: with `--sync end`, as soon as an append sees that a drain made it durable (the
//! session's durable sequence, read after each append and, while input that may sit idle
//! waits for its next line, every 50 ms; no flush of its own), the rest after the final
//! flush.

use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::time::Duration;

use serde::Serialize;
use session_store::{Batch, Commit, CreateOptions, Error, Root, Session, SessionId};

use super::{CliError, CliResult, Context, Failure, OutputError, count, human_bytes, session_id};

/// The `--file` that names stdin, as for most Unix tools.
const STDIN: &str = "-";

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
    /// Batches answered with a commit already stored (a retry of the same operation id
    /// and content): nothing was appended for them.
    retries: u64,
}

/// Runs `append`. Input that is a regular file (`--file F`, or stdin redirected from one)
/// is read up to its first batch before the session is opened: when it holds none, nothing
/// is opened and nothing on disk changes (a writer open moves the lease generation), and
/// when its first line is not a batch it is refused (status 6) with nothing opened. From a
/// pipe or a terminal the writer is taken at once, so a run waiting for its input holds
/// the session.
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
    let (input, regular): (Box<dyn BufRead + Send>, bool) =
        match file.filter(|path| *path != Path::new(STDIN)) {
            Some(path) => {
                super::not_a_folder(path)?;
                let file = File::open(path)
                    .map_err(|e| Failure::context(format!("open {}", path.display()), &e))?;
                let regular = is_regular(&file);
                (Box::new(BufReader::new(file)), regular)
            }
            None => {
                let stdin = std::io::stdin();
                if stdin.is_terminal() {
                    // Typed at a prompt, `append ID` would otherwise wait silently.
                    errln!(
                        "session-store: reading batches from the terminal, one JSON object per \
                     line; Ctrl-D ends the input"
                    );
                }
                let regular = stdin
                    .as_fd()
                    .try_clone_to_owned()
                    .is_ok_and(|fd| is_regular(&File::from(fd)));
                (Box::new(BufReader::new(stdin)), regular)
            }
        };
    let id = session_id(id)?;
    let root = if create {
        cx.create_root()?
    } else {
        cx.open_root()?
    };
    let mut lines: Lines = Box::new(BoundedLines(input).enumerate());
    if regular && !has_a_batch_line(&root, &id, &mut lines)? {
        return nothing_to_append(cx, &root, &id, create);
    }
    let mut pending: Vec<Accepted> = Vec::new();
    let mut totals = Totals::default();
    let session = match root.open_writer(&id) {
        Err(Error::SessionNotFound(_)) if create => {
            create_with_first(&root, &id, &mut lines, &mut pending, &mut totals)?
        }
        other => other.map_err(|e| super::naming_damaged(&id, e.into()))?,
    };
    // Input that may sit idle (a pipe, a terminal) is read on a thread of its own, so that
    // with `--json --sync end` a batch a write-behind drain made durable is reported while
    // no next line comes (a host waiting for it before it sends more waited for good).
    let lines = if regular || sync_each || !cx.json {
        Feed::Blocking(lines)
    } else {
        Feed::Watched(read_ahead(lines))
    };
    let result = feed(cx, &session, lines, sync_each, &mut pending, &mut totals);
    // Whatever was accepted is made durable (and reported) even when a line failed.
    if let Err(e) = root.close(&session) {
        result?;
        return Err(e.into());
    }
    // A failed line stops the input there; the batches before it are durable now and are
    // counted as a run that ended well is (with `--json` their lines are already out).
    let kept = totals.batches + totals.retries > 0;
    if !cx.json && (result.is_ok() || kept) {
        summary(&totals, session.id(), session.sequences().1)?;
    }
    result
}

/// Prints the human summary of a run.
fn summary(totals: &Totals, id: &SessionId, durable: u64) -> CliResult<()> {
    let retries = match totals.retries {
        0 => String::new(),
        1 => " (1 retry of a batch already stored)".to_owned(),
        n => format!(" ({n} retries of batches already stored)"),
    };
    outln!(
        "appended {} ({}, {} of payload) to {}{retries}; durable sequence {durable}",
        count(totals.batches, "batch", "batches"),
        count(totals.events, "event", "events"),
        human_bytes(totals.bytes),
        super::shown(id),
    );
    Ok(())
}

/// Whether `file` is a regular file (read to its end without waiting for a writer).
fn is_regular(file: &File) -> bool {
    file.metadata().is_ok_and(|m| m.is_file())
}

/// Reads `lines` up to the first one that is not blank (a byte order mark before the
/// first line counts as blank, as [`read_line`] drops it) and puts that one back; false
/// when there is none. That line is checked here, before anything is opened: one that
/// cannot be read, is not UTF-8, is not a batch or is a batch no session accepts
/// (`Batch::validate`) fails as it would where the lines are fed (a file starting with
/// one took the session's writer first, moving its lease generation and mtime, and was
/// refused with status 5 while another process wrote it). A batch `validate` refuses whose
/// operation session `id` stores goes on: its append is a retry, answered with the stored
/// commit.
fn has_a_batch_line(root: &Root, id: &SessionId, lines: &mut Lines) -> CliResult<bool> {
    for (n, line) in lines.by_ref() {
        let text = read_line(n, line)?;
        if text.trim().is_empty() {
            continue;
        }
        let batch = parse_batch(n, &text)?;
        if let Err(e) = batch.validate()
            && !stores_operation(root, id, &batch.operation_id)?
        {
            return Err(line_failure(n, &batch.operation_id, &e));
        }
        let rest = std::mem::replace(lines, Box::new(std::iter::empty()));
        *lines = Box::new(std::iter::once((n, Ok(text))).chain(rest));
        return Ok(true);
    }
    Ok(false)
}

/// Whether session `id` (when there is one) stores a commit of `operation_id`, read
/// without taking its writer.
fn stores_operation(root: &Root, id: &SessionId, operation_id: &str) -> CliResult<bool> {
    match root.open_reader(id) {
        Ok(reader) => Ok(reader.operation(operation_id)?.is_some()),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `append` of input without a batch, read to its end before anything was opened: the
/// session is only read (its durable sequence for the summary), or with `create` made
/// empty when it is missing.
fn nothing_to_append(cx: &Context, root: &Root, id: &SessionId, create: bool) -> CliResult<()> {
    let durable = match root.open_reader(id) {
        Err(Error::SessionNotFound(_)) if create => {
            match root.create(CreateOptions::with_id(id.clone())) {
                Ok(session) => session.close()?,
                Err(Error::SessionExists(_)) => {}
                Err(e) => return Err(e.into()),
            }
            root.open_reader(id)?.durable_sequence()?
        }
        other => other?.durable_sequence()?,
    };
    if !cx.json {
        summary(&Totals::default(), id, durable)?;
    }
    Ok(())
}

/// The numbered lines of the input.
type Lines = Box<dyn Iterator<Item = (usize, std::io::Result<String>)> + Send>;

/// Creates the session with the input's first batch in it (`Root::create_with_batch`), so
/// a first line that is not a valid batch creates nothing (status 6); empty input creates
/// an empty session. Another `append --create` may publish it first: then this one
/// appends to it (the first line is fed again), or is refused naming the writer (status
/// 5), never "already exists".
fn create_with_first(
    root: &Root,
    id: &SessionId,
    lines: &mut Lines,
    pending: &mut Vec<Accepted>,
    totals: &mut Totals,
) -> CliResult<Session> {
    let mut first = None;
    for (n, line) in lines.by_ref() {
        let line = read_line(n, line)?;
        if !line.trim().is_empty() {
            first = Some((n, line));
            break;
        }
    }
    let Some((n, line)) = first else {
        return match root.create(CreateOptions::with_id(id.clone())) {
            Err(Error::SessionExists(_)) => Ok(root.open_writer(id)?),
            other => Ok(other?),
        };
    };
    let batch = parse_batch(n, &line)?;
    let (operation_id, bytes) = (batch.operation_id.clone(), payload_bytes(&batch));
    match root.create_with_batch(CreateOptions::with_id(id.clone()), batch) {
        Ok((session, commit)) => {
            accepted(bytes, &commit, false, pending, totals);
            Ok(session)
        }
        Err(Error::SessionExists(_)) => {
            let rest = std::mem::replace(lines, Box::new(std::iter::empty()));
            *lines = Box::new(std::iter::once((n, Ok(line))).chain(rest));
            Ok(root.open_writer(id)?)
        }
        Err(e) => Err(line_failure(n, &operation_id, &e)),
    }
}

/// The longest input line `append` reads (a batch as one JSON line): the largest payload
/// an event may have and 1 MiB for the rest of its batch. A longer line was read whole
/// before anything looked at it, so a stream without newlines (`/dev/zero`) grew until
/// memory ran out (outside testing, session 35); it is refused once it passes this.
const MAX_LINE_BYTES: u64 = session_store::format::MAX_PAYLOAD_BYTES + (1 << 20);

/// The lines of an input as [`BufRead::lines`] gives them (without their `\n` or `\r\n`),
/// each read at most to [`MAX_LINE_BYTES`]: a longer one is an error of kind
/// `FileTooLarge` ([`read_line`] words it), and the lines end there.
struct BoundedLines(Box<dyn BufRead + Send>);

impl Iterator for BoundedLines {
    type Item = std::io::Result<String>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut line = Vec::new();
        match std::io::Read::take(&mut *self.0, MAX_LINE_BYTES + 1).read_until(b'\n', &mut line) {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => return Some(Err(e)),
        }
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        } else if line.len() as u64 > MAX_LINE_BYTES {
            // Nothing more is read: the rest of the line is not a batch either.
            self.0 = Box::new(std::io::empty());
            return Some(Err(std::io::Error::from(std::io::ErrorKind::FileTooLarge)));
        }
        Some(
            String::from_utf8(line)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData)),
        )
    }
}

/// Line `n` (0-based) of the input; one that is not UTF-8 is bad input (status 6), not a
/// failed read, and so is one longer than [`MAX_LINE_BYTES`]. A byte order mark before the first line is dropped (RFC 8259 lets a
/// parser ignore it, and editors on Windows write one); anywhere else it stays, and is
/// not JSON.
fn read_line(n: usize, line: std::io::Result<String>) -> CliResult<String> {
    let line = line.map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => Failure::invalid(format!("line {} is not UTF-8", n + 1)),
        std::io::ErrorKind::FileTooLarge => Failure::invalid(format!(
            "line {} is longer than {MAX_LINE_BYTES} bytes (an event's payload may have {} \
             bytes, and a batch is one line)",
            n + 1,
            session_store::format::MAX_PAYLOAD_BYTES
        )),
        _ => Failure::context(format!("read line {}", n + 1), &e),
    })?;
    Ok(match line.strip_prefix('\u{feff}') {
        Some(rest) if n == 0 => rest.to_owned(),
        _ => line,
    })
}

/// Line `n` (0-based) as a batch (status 6 when it is not one).
fn parse_batch(n: usize, line: &str) -> CliResult<Batch> {
    serde_json::from_str(line).map_err(|e| {
        // serde_json places the error "at line 1 column C" of the one line it was given;
        // the input's line is `n + 1`, so only the column is kept.
        let reason = session_store::json_error_reason(&e, line);
        // A line that is not JSON says so ("expected ident" alone did not); serde_json's
        // column 0 (a value of the wrong type, found before it was read) is no place.
        let reason = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("not JSON: {reason}")
            }
            _ => reason,
        };
        let reason = match (e.line(), e.column()) {
            (0, _) | (_, 0) => reason,
            (_, column) => format!("{reason} (column {column})"),
        };
        Failure::invalid(format!("line {}: not a batch: {reason}", n + 1))
    })
}

/// The failure of line `n`'s batch `operation_id`.
fn line_failure(n: usize, operation_id: &str, e: &Error) -> CliError {
    Failure::context(
        format!(
            "line {} (operation {})",
            n + 1,
            session_store::quoted(operation_id)
        ),
        e,
    )
}

/// Payload bytes of a batch (for the human summary).
fn payload_bytes(batch: &Batch) -> u64 {
    batch.events.iter().map(|e| e.payload_len() as u64).sum()
}

/// Counts an accepted batch (as a retry when `retry`: its commit was there before) and
/// queues it for reporting, under its commit's operation id (the batch's trimmed: the
/// `--json` line echoed the id as given, `"  op-9  "`, where `events --json` and Python
/// said `op-9`, outside testing C3).
fn accepted(
    bytes: u64,
    commit: &Commit,
    retry: bool,
    pending: &mut Vec<Accepted>,
    totals: &mut Totals,
) {
    if retry {
        totals.retries += 1;
    } else {
        totals.batches += 1;
        totals.events += commit.events.len() as u64;
        totals.bytes += bytes;
    }
    pending.push(Accepted {
        operation_id: commit.operation_id.clone(),
        first_seq: commit.first_seq,
        last_seq: commit.last_seq(),
    });
}

/// How often a run waiting for its next line looks whether a write-behind drain made
/// batches durable ([`Feed::Watched`]).
const DURABLE_CHECK: Duration = Duration::from_millis(50);

/// Lines read ahead on their own thread ([`read_ahead`]): at most this many wait.
const READ_AHEAD_LINES: usize = 64;

/// The input lines as [`feed`] takes them.
enum Feed {
    /// Read as they are needed (a regular file, or nothing to report while idle).
    Blocking(Lines),
    /// Read on a thread of their own, so that the wait for the next one can be cut short
    /// to report batches made durable meanwhile.
    Watched(Receiver<(usize, std::io::Result<String>)>),
}

/// Reads `lines` on a thread of its own into a bounded channel (ends with the input, or
/// when the receiver is gone: a run that stopped at a failed line).
fn read_ahead(lines: Lines) -> Receiver<(usize, std::io::Result<String>)> {
    let (send, receive) = sync_channel(READ_AHEAD_LINES);
    std::thread::spawn(move || {
        for line in lines {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

impl Feed {
    /// The next line; while a [`Feed::Watched`] one waits and `pending` holds batches, the
    /// batches a drain made durable meanwhile are reported every [`DURABLE_CHECK`].
    fn next_line(
        &mut self,
        cx: &Context,
        session: &Session,
        pending: &mut Vec<Accepted>,
    ) -> CliResult<Option<(usize, std::io::Result<String>)>> {
        let receive = match self {
            Feed::Blocking(lines) => return Ok(lines.next()),
            Feed::Watched(receive) => receive,
        };
        loop {
            if pending.is_empty() {
                return Ok(receive.recv().ok());
            }
            match receive.recv_timeout(DURABLE_CHECK) {
                Ok(line) => return Ok(Some(line)),
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
                Err(RecvTimeoutError::Timeout) => {
                    report_durable(cx, session.sequences().1, pending)?;
                }
            }
        }
    }
}

/// Appends every line of `lines` after what `pending` holds; reports durable batches as
/// it goes: flushing each (`sync_each`), or those a write-behind drain made durable, seen
/// after each append and, for [`Feed::Watched`] input, while it waits for a line; the
/// rest after the final flush.
fn feed(
    cx: &Context,
    session: &Session,
    mut lines: Feed,
    sync_each: bool,
    pending: &mut Vec<Accepted>,
    totals: &mut Totals,
) -> CliResult<()> {
    let mut failure = None;
    if sync_each && !pending.is_empty() {
        flush_and_report(cx, session, pending)?;
    }
    while let Some((n, line)) = lines.next_line(cx, session, pending)? {
        let line = match read_line(n, line) {
            Ok(line) => line,
            Err(f) => {
                failure = Some(f);
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let batch = match parse_batch(n, &line) {
            Ok(batch) => batch,
            Err(f) => {
                failure = Some(f);
                break;
            }
        };
        let (operation_id, bytes) = (batch.operation_id.clone(), payload_bytes(&batch));
        // A commit that starts at or below the last accepted sequence was there before.
        let (last_accepted, _) = session.sequences();
        match session.append(batch) {
            Ok(commit) => {
                let retry = commit.first_seq <= last_accepted;
                accepted(bytes, &commit, retry, pending, totals);
            }
            Err(e) => {
                failure = Some(line_failure(n, &operation_id, &e));
                break;
            }
        }
        if sync_each {
            flush_and_report(cx, session, pending)?;
        } else {
            report_durable(cx, session.sequences().1, pending)?;
        }
    }
    if !pending.is_empty() {
        flush_and_report(cx, session, pending)?;
    }
    failure.map_or(Ok(()), Err)
}

/// Flushes `session` and reports the batches in `pending`. When the flush fails (a full
/// disk), the batches that are durable all the same (the one a create published, those a
/// write-behind drain wrote) are reported before the error, which names the durable
/// sequence: with `--json` every durable batch has its line.
fn flush_and_report(cx: &Context, session: &Session, pending: &mut Vec<Accepted>) -> CliResult<()> {
    match session.flush() {
        Ok(durable) => report(cx, durable, pending),
        Err(e) => {
            let (_, durable) = session.sequences();
            report_durable(cx, durable, pending)?;
            let not_durable = pending.len();
            let are = if not_durable == 1 { "is" } else { "are" };
            Err(Failure::context(
                format!(
                    "flush {}: durable through sequence {durable}, {} accepted after it \
                     {are} not",
                    session.id(),
                    count(not_durable as u64, "batch", "batches")
                ),
                &e,
            ))
        }
    }
}

/// Reports the batches at the front of `pending` that are durable at `durable_sequence`
/// (their last sequence at or below it); the others stay in `pending`.
fn report_durable(
    cx: &Context,
    durable_sequence: u64,
    pending: &mut Vec<Accepted>,
) -> CliResult<()> {
    let durable = pending
        .iter()
        .take_while(|a| a.last_seq <= durable_sequence)
        .count();
    if durable == 0 {
        return Ok(());
    }
    let mut rest = pending.split_off(durable);
    report(cx, durable_sequence, pending)?;
    std::mem::swap(pending, &mut rest);
    Ok(())
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
            serde_json::to_writer(&mut out, &line).map_err(OutputError::from)?;
            out.write_all(b"\n").map_err(OutputError)?;
        }
        out.flush().map_err(OutputError)?;
    }
    pending.clear();
    Ok(())
}
