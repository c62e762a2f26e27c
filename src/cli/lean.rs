//! `bench --suite lean`: the measures of the "lean store" issue (nine rows: 6a and 6b are
//! one measure at two sizes), each printed with its same-run baseline, the ratio (the
//! median of the rounds' ratios where a row runs rounds), the target and whether it is met.
//!
//! 1. bytes on disk of a session folder after close / the messages as JSON Lines: 20,000
//!    chat messages of ~400 B, two per turn, one batch per turn (`turn/start`, user and
//!    assistant `message/complete`, `turn/end`); a table shaped as openai-agents'
//!    `SQLiteSession` is measured beside it as a peer;
//! 2. the same over the events as JSON Lines: 1,000 agent turns with 2–40 KB tool outputs
//!    (logs and code, [`Corpus`]), each output in `tool/result` and in the tool message;
//! 3. peak RSS of a child process (this binary's hidden `bench-writer`, `VmHWM`) appending
//!    100,000 such messages, the model workset kept whole, vs 64 MiB + 1.5x their JSON;
//! 4. the same with a `model/context-replace` (a summary and the last turn) every 50 turns,
//!    vs 48 MiB;
//! 5. open a writer + one durable append (one message, `flush`) on the compacted session of
//!    4 vs on a 100-message session, median of several trials;
//! 6. `bench --sessions 1` library/raw at 96,000 and 384,000 events, timed until every
//!    session is closed;
//! 7. `cargo bench --bench append`'s measure: flush after every 64-event commit / raw;
//! 8. one durable append per call (one event, `flush()` each time) / raw SQLite with one
//!    insert + commit per call, both at `synchronous=FULL`.
//!
//! Timed pairs run in alternating order over several rounds; rates and ratios are medians.
//! `--quick` runs every measure small (a smoke run: the figures mean nothing).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use session_store::baseline::{raw_rate, sqlite_session_bytes};
use session_store::{Batch, CreateOptions, Durability, Event, Root, SessionId, StoreOptions};

use super::bench::{self, Rate};
use super::corpus::Corpus;
use super::workload::{flushed_commits, fmt_count, load_average, median, payloads};
use super::{CliResult, Context, Failure, human_bytes, print_json, progress_bar};

/// JSON bytes of one chat message.
const MESSAGE_BYTES: usize = 400;
/// Events per commit of measure 7 (and rows per raw transaction).
const EVENTS_PER_COMMIT: usize = 64;
/// Tool output sizes of measure 2, in bytes.
const TOOL_OUTPUT_BYTES: std::ops::RangeInclusive<usize> = 2_000..=40_000;
/// Fixed part of measure 3's memory budget.
const RSS_BUDGET_BASE: f64 = 64.0 * MIB;
/// Measure 4's memory budget.
const RSS_BUDGET_COMPACTED: f64 = 48.0 * MIB;
/// A `model/context-replace` every this many turns in measure 4.
const COMPACT_EVERY: usize = 50;
/// Messages of measure 5's small session.
const SMALL_SESSION_MESSAGES: usize = 100;
/// Seed of every generated text.
const SEED: u64 = 12;
/// Session id of the bench sessions.
const SESSION: &str = "lean";
/// Bytes in a MiB.
const MIB: f64 = 1_048_576.0;

/// What `bench --suite lean` was asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    /// Every measure small (a smoke run).
    pub quick: bool,
    /// Folder for the files (default: a temporary folder in the root, removed afterwards).
    pub dir: Option<PathBuf>,
}

/// The sizes of one run.
struct Sizes {
    chat_messages: usize,
    agent_turns: usize,
    rss_messages: usize,
    trials: usize,
    bench_events: [usize; 2],
    rounds: usize,
    append_events: usize,
    calls: usize,
    /// Untimed calls before row 8's timed ones, on the same file: enough for a WAL of one
    /// page per commit to pass SQLite's 1,000-page autocheckpoint and start over.
    warm_calls: usize,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                chat_messages: 200,
                agent_turns: 10,
                rss_messages: 2_000,
                trials: 3,
                bench_events: [960, 3_840],
                rounds: 1,
                append_events: 640,
                calls: 20,
                warm_calls: 20,
            }
        } else {
            Sizes {
                chat_messages: 20_000,
                agent_turns: 1_000,
                rss_messages: 100_000,
                trials: 7,
                bench_events: [96_000, 384_000],
                rounds: 3,
                append_events: 96_000,
                calls: 1_000,
                warm_calls: 2_000,
            }
        }
    }
}

/// The unit of a row's value and baseline.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Bytes.
    Bytes,
    /// Milliseconds.
    Ms,
    /// Events per second.
    EventsPerS,
}

/// How a ratio compares with its target.
#[derive(Clone, Copy, Debug, Serialize)]
pub enum Bound {
    /// The ratio must not exceed the target.
    #[serde(rename = "<=")]
    AtMost,
    /// The ratio must reach the target.
    #[serde(rename = ">=")]
    AtLeast,
}

/// One row of the table: a measure, its same-run baseline and the target of their ratio.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The issue's row number (`6a`/`6b` for the two sizes of row 6).
    pub row: &'static str,
    /// What was measured.
    pub measure: String,
    /// Ours.
    pub value: f64,
    /// The baseline (a same-run measurement, or the budget for the memory rows).
    pub baseline: f64,
    /// What the baseline is.
    pub baseline_label: String,
    /// The unit of `value` and `baseline`.
    pub unit: Unit,
    /// value / baseline (for timed pairs: the median of the per-round ratios).
    pub ratio: f64,
    /// How `ratio` must compare with `target`.
    pub bound: Bound,
    /// The issue's target for `ratio`.
    pub target: f64,
    /// Whether the target is met.
    pub met: bool,
    /// Further figures of the same run.
    pub detail: String,
}

impl Row {
    #[allow(clippy::too_many_arguments)]
    fn new(
        row: &'static str,
        measure: String,
        (value, baseline, ratio): (f64, f64, f64),
        baseline_label: &str,
        unit: Unit,
        (bound, target): (Bound, f64),
        detail: String,
    ) -> Row {
        let met = match bound {
            Bound::AtMost => ratio <= target,
            Bound::AtLeast => ratio >= target,
        };
        Row {
            row,
            measure,
            value,
            baseline,
            baseline_label: baseline_label.to_owned(),
            unit,
            ratio,
            bound,
            target,
            met,
            detail,
        }
    }
}

/// What `bench --suite lean --json` prints.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `lean`.
    pub suite: &'static str,
    /// Whether the sizes were the small smoke-run ones.
    pub quick: bool,
    /// Where the files were written.
    pub dir: PathBuf,
    /// The rows, in the issue's order.
    pub rows: Vec<Row>,
    /// Rows whose target is met.
    pub met: usize,
    /// Wall-clock seconds of the whole run.
    pub total_seconds: f64,
    /// The 1-minute load average at the start and at the end (other work on the machine
    /// skews the timed rows), when `/proc/loadavg` can be read.
    pub load_average: [Option<f64>; 2],
}

/// Runs the suite.
///
/// # Errors
/// I/O and storage errors; a failed child process.
pub fn run(cx: &Context, options: &Options) -> CliResult<()> {
    let started = Instant::now();
    let load_start = load_average();
    let sizes = Sizes::new(options.quick);
    let (dir, _scratch) = bench::work_dir(cx, options.dir.as_deref(), "lean")?;
    let bar = progress_bar(9, "1: bytes on disk, chat");
    let step = |next: &str| {
        bar.inc(1);
        bar.set_message(next.to_owned());
    };
    let mut rows = vec![chat_bytes(&dir.join("1-chat"), sizes.chat_messages)?];
    step("2: bytes on disk, agent turns");
    rows.push(agent_bytes(&dir.join("2-agent"), sizes.agent_turns)?);
    step("3: writer peak RSS (child process)");
    let floor = writer_child(&dir.join("3-jsonl"), sizes.rss_messages, 0, true)?;
    let whole = writer_child(&dir.join("3-whole"), sizes.rss_messages, 0, false)?;
    rows.push(rss_row("3", &whole, &floor, None));
    step("4: writer peak RSS, compacted (child process)");
    let compacted_root = dir.join("4-compacted");
    let compacted = writer_child(&compacted_root, sizes.rss_messages, COMPACT_EVERY, false)?;
    rows.push(rss_row("4", &compacted, &floor, Some(RSS_BUDGET_COMPACTED)));
    step("5: open + one durable append");
    rows.push(open_append(
        &compacted_root,
        &dir.join("5-small"),
        sizes.rss_messages,
        sizes.trials,
    )?);
    for (row, events) in ["6a", "6b"].into_iter().zip(sizes.bench_events) {
        step(&format!("6: bench --sessions 1, {events} events"));
        rows.push(bench_one_session(
            &dir.join(format!("6-{events}")),
            row,
            events,
            sizes.rounds,
        )?);
    }
    step("7: flush per 64-event commit");
    rows.push(flushed_vs_raw(
        &dir.join("7-append"),
        "7",
        (sizes.append_events, 0),
        EVENTS_PER_COMMIT,
        sizes.rounds,
    )?);
    step("8: one durable append per call");
    rows.push(flushed_vs_raw(
        &dir.join("8-calls"),
        "8",
        (sizes.calls, sizes.warm_calls),
        1,
        sizes.rounds,
    )?);
    bar.finish_and_clear();
    let report = Report {
        suite: "lean",
        quick: options.quick,
        dir: std::path::absolute(&dir)?,
        met: rows.iter().filter(|r| r.met).count(),
        rows,
        total_seconds: started.elapsed().as_secs_f64(),
        load_average: [load_start, load_average()],
    };
    super::print_report(cx, &report, print_human)
}

fn print_human(r: &Report) -> CliResult<()> {
    outln!(
        "bench --suite lean{}: files in {}, durability full",
        if r.quick {
            " --quick (smoke sizes)"
        } else {
            ""
        },
        r.dir.display()
    );
    for row in &r.rows {
        outln!("{:>3}  {}", row.row, row.measure);
        outln!(
            "     ours {}   baseline {} ({})   ratio {:.2}x   target {} {:.2}x   {}",
            fmt_value(row.value, row.unit),
            fmt_value(row.baseline, row.unit),
            row.baseline_label,
            row.ratio,
            match row.bound {
                Bound::AtMost => "<=",
                Bound::AtLeast => ">=",
            },
            row.target,
            if row.met { "MET" } else { "MISSED" }
        );
        if !row.detail.is_empty() {
            outln!("     {}", row.detail);
        }
    }
    let load = |l: Option<f64>| l.map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"));
    outln!(
        "{} of {} targets met   (total {:.1} s, load average {} at the start, {} at the end)",
        r.met,
        r.rows.len(),
        r.total_seconds,
        load(r.load_average[0]),
        load(r.load_average[1])
    );
    Ok(())
}

fn fmt_value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Bytes => human_bytes(v as u64),
        Unit::Ms => format!("{v:.2} ms"),
        Unit::EventsPerS => format!("{} events/s", fmt_count(v)),
    }
}

/// One chat message of about [`MESSAGE_BYTES`] of JSON.
fn chat_message(corpus: &mut Corpus, id: &str, role: &str) -> CliResult<String> {
    let empty = serde_json::to_string(&json!({"id": id, "role": role, "content": ""}))?;
    let content = corpus.prose(MESSAGE_BYTES.saturating_sub(empty.len()).max(1));
    Ok(serde_json::to_string(
        &json!({"id": id, "role": role, "content": content}),
    )?)
}

/// A `message/complete` event of this message JSON.
fn message_event(message: &str) -> CliResult<Event> {
    Ok(Event::new("message/complete").with_payload_json(&format!(r#"{{"message":{message}}}"#))?)
}

/// Chat turn `t`: one batch (`turn/start`, user and assistant messages, `turn/end`) and
/// the two messages' JSON.
fn chat_turn(corpus: &mut Corpus, t: usize) -> CliResult<(Batch, [String; 2])> {
    let user = chat_message(corpus, &format!("u{t}"), "user")?;
    let assistant = chat_message(corpus, &format!("a{t}"), "assistant")?;
    let events = vec![
        Event::new("turn/start"),
        message_event(&user)?,
        message_event(&assistant)?,
        Event::new("turn/end").with_payload(&json!({"status": "completed"}))?,
    ];
    Ok((
        Batch::new(format!("turn-{t}"), events).in_turn(format!("t{t}")),
        [user, assistant],
    ))
}

/// A fresh root in `dir` (default options) and a new session in it.
fn new_session(dir: &Path) -> CliResult<(Root, session_store::Session)> {
    let root = Root::open(dir)?;
    let session = root.create(CreateOptions::with_id(SessionId::new(SESSION)?))?;
    Ok((root, session))
}

/// Bytes of every file under `path` (apparent sizes).
fn dir_bytes(path: &Path) -> CliResult<u64> {
    Ok(folder_files(path)?.iter().map(|(_, bytes)| bytes).sum())
}

/// The entries of `path` that hold bytes, with their bytes (a sub-folder's: all its files),
/// in name order.
fn folder_files(path: &Path) -> CliResult<Vec<(String, u64)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let bytes = if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
        if bytes > 0 {
            files.push((entry.file_name().to_string_lossy().into_owned(), bytes));
        }
    }
    files.sort();
    Ok(files)
}

/// The total of a [`folder_files`] list, and the list as `name size, name size`.
fn sum_files(files: &[(String, u64)]) -> (u64, String) {
    let parts: Vec<String> = files
        .iter()
        .map(|(name, bytes)| format!("{name} {}", human_bytes(*bytes)))
        .collect();
    (files.iter().map(|(_, bytes)| bytes).sum(), parts.join(", "))
}

/// Writes `lines` to `file` (creating its folder), one per line, synced; returns the
/// file's size.
fn write_lines<'a>(file: &Path, lines: impl IntoIterator<Item = &'a str>) -> CliResult<u64> {
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut out = BufWriter::new(File::create(file)?);
    for line in lines {
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(std::fs::metadata(file)?.len())
}

/// The events of `batches` as JSON Lines (each event with its sequence, kind and payload).
fn event_lines(batches: &[Batch]) -> CliResult<Vec<String>> {
    let mut seq = 0;
    let mut lines = Vec::new();
    for event in batches.iter().flat_map(|b| &b.events) {
        seq += 1;
        let mut event = event.clone();
        event.seq = seq;
        lines.push(serde_json::to_string(&event)?);
    }
    Ok(lines)
}

/// Appends `batches` to a new session in `dir`, flushes and closes it; the bytes of the
/// session folder after close, and its files with their bytes.
fn stored_bytes(dir: &Path, batches: Vec<Batch>) -> CliResult<(u64, String)> {
    let (root, session) = new_session(dir)?;
    for batch in batches {
        session.append(batch)?;
    }
    session.flush()?;
    session.close()?;
    let folder = root.session_dir(session.id());
    // Every connection to the file is gone before its folder is measured, as after a
    // host's exit.
    drop((session, root));
    Ok(sum_files(&folder_files(&folder)?))
}

/// Row 1: chat messages on disk vs as JSON Lines, and a `SQLiteSession`-shaped table.
fn chat_bytes(dir: &Path, messages: usize) -> CliResult<Row> {
    let mut corpus = Corpus::new(SEED);
    let (mut batches, mut texts) = (Vec::new(), Vec::new());
    for t in 0..messages.div_ceil(2) {
        let (batch, pair) = chat_turn(&mut corpus, t)?;
        batches.push(batch);
        texts.extend(pair);
    }
    let (ours, files) = stored_bytes(&dir.join("store"), batches)?;
    let jsonl = write_lines(
        &dir.join("messages.jsonl"),
        texts.iter().map(String::as_str),
    )?;
    let peer = sqlite_session_bytes(&dir.join("sqlite-session.db"), &texts)?;
    Ok(Row::new(
        "1",
        format!(
            "bytes on disk / JSON Lines: {} chat messages of ~{MESSAGE_BYTES} B, one batch per turn",
            texts.len()
        ),
        (ours as f64, jsonl as f64, ours as f64 / jsonl as f64),
        "the messages as JSON Lines",
        Unit::Bytes,
        (Bound::AtMost, 1.25),
        format!(
            "{files}; peer: a table shaped as openai-agents SQLiteSession holds them in {} \
             ({:.2}x)",
            human_bytes(peer),
            peer as f64 / jsonl as f64
        ),
    ))
}

/// Agent turn `t` with a tool output of `output_bytes`: two batches, the output in
/// `tool/result` and in the tool message.
fn agent_turn(corpus: &mut Corpus, t: usize, output_bytes: usize) -> CliResult<[Batch; 2]> {
    let call = format!("call-{t}");
    let command = format!("cargo test --release -- case_{t}");
    let output = corpus.tool_output(output_bytes);
    let user = json!({"id": format!("u{t}"), "role": "user", "content": corpus.prose(200)});
    let assistant = json!({
        "id": format!("a{t}"), "role": "assistant", "content": corpus.prose(120),
        "tool_calls": [{"id": call, "type": "function",
            "function": {"name": "bash", "arguments": json!({"command": command}).to_string()}}],
    });
    let tool =
        json!({"id": format!("r{t}"), "role": "tool", "tool_call_id": call, "content": output});
    let answer = json!({"id": format!("f{t}"), "role": "assistant", "content": corpus.prose(300)});
    let message = |m: &serde_json::Value| {
        Event::new("message/complete").with_payload(&json!({ "message": m }))
    };
    let first = vec![
        Event::new("turn/start"),
        message(&user)?,
        message(&assistant)?,
        Event::new("tool/call")
            .with_payload(&json!({"id": call, "name": "bash", "args": {"command": command}}))?,
    ];
    let second = vec![
        Event::new("tool/result")
            .with_payload(&json!({"id": call, "name": "bash", "output": output}))?,
        message(&tool)?,
        message(&answer)?,
        Event::new("turn/end").with_payload(&json!({"status": "completed"}))?,
    ];
    Ok([
        Batch::new(format!("turn-{t}-call"), first).in_turn(format!("t{t}")),
        Batch::new(format!("turn-{t}-result"), second).in_turn(format!("t{t}")),
    ])
}

/// Row 2: agent turns with large tool outputs on disk vs their events as JSON Lines.
fn agent_bytes(dir: &Path, turns: usize) -> CliResult<Row> {
    let mut corpus = Corpus::new(SEED);
    let mut sizes = fastrand::Rng::with_seed(SEED);
    let mut batches = Vec::new();
    let mut outputs = 0;
    for t in 0..turns {
        let bytes = sizes.usize(TOOL_OUTPUT_BYTES);
        outputs += bytes;
        batches.extend(agent_turn(&mut corpus, t, bytes)?);
    }
    let lines = event_lines(&batches)?;
    let jsonl = write_lines(&dir.join("events.jsonl"), lines.iter().map(String::as_str))?;
    let (ours, files) = stored_bytes(&dir.join("store"), batches)?;
    Ok(Row::new(
        "2",
        format!(
            "bytes on disk / JSON Lines: {turns} agent turns, 2-40 KB tool outputs in \
             tool/result and the tool message"
        ),
        (ours as f64, jsonl as f64, ours as f64 / jsonl as f64),
        "the events as JSON Lines",
        Unit::Bytes,
        (Bound::AtMost, 0.4),
        format!(
            "{files}; {} of tool output, each written twice; {} events",
            human_bytes(outputs as u64),
            lines.len()
        ),
    ))
}

/// What the hidden `bench-writer` child reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct WriterReport {
    /// Messages appended.
    pub messages: usize,
    /// Their JSON bytes (the messages alone, without event framing).
    pub message_json_bytes: u64,
    /// `model/context-replace` events appended.
    pub context_replaces: usize,
    /// The process's peak resident memory (`VmHWM`), in bytes, after close.
    pub peak_rss_bytes: u64,
    /// Seconds from the first append until the session was closed (or the JSON Lines file
    /// synced).
    pub seconds: f64,
}

/// The hidden `bench-writer` subcommand: appends `messages` chat messages (two per turn, one
/// batch per turn, generated as they go so only the writer holds them) to a new session in
/// the root, with a `model/context-replace` (a summary and the last turn) every
/// `compact_every` turns when not 0; flushes and closes it, then prints a
/// [`WriterReport`] as one JSON line. With `jsonl`, writes the same events to a JSON Lines
/// file instead (the floor a process that only writes them needs).
///
/// # Errors
/// Storage and I/O errors; no `/proc/self/status` to read the peak from.
pub fn writer(cx: &Context, messages: usize, compact_every: usize, jsonl: bool) -> CliResult<()> {
    std::fs::create_dir_all(&cx.root)?;
    let mut corpus = Corpus::new(SEED);
    let mut sink = if jsonl {
        Sink::Lines(
            BufWriter::new(File::create(cx.root.join("events.jsonl"))?),
            0,
        )
    } else {
        Sink::Store(new_session(&cx.root)?.1)
    };
    let started = Instant::now();
    let (mut json_bytes, mut replaces) = (0u64, 0);
    for t in 0..messages.div_ceil(2) {
        let (batch, [user, assistant]) = chat_turn(&mut corpus, t)?;
        json_bytes += (user.len() + assistant.len()) as u64;
        sink.write(batch)?;
        if compact_every > 0 && (t + 1) % compact_every == 0 {
            let summary = chat_message(&mut corpus, &format!("summary-{t}"), "system")?;
            let replace = Event::new("model/context-replace")
                .with_payload_json(&format!(r#"{{"messages":[{summary},{user},{assistant}]}}"#))?;
            sink.write(Batch::new(format!("compact-{t}"), vec![replace]))?;
            replaces += 1;
        }
    }
    sink.finish()?;
    let seconds = started.elapsed().as_secs_f64();
    print_json(&WriterReport {
        messages: messages.div_ceil(2) * 2,
        message_json_bytes: json_bytes,
        context_replaces: replaces,
        peak_rss_bytes: peak_rss()?,
        seconds,
    })
}

/// Where `bench-writer` writes: a session, or a JSON Lines file and the last sequence.
enum Sink {
    Store(session_store::Session),
    Lines(BufWriter<File>, u64),
}

impl Sink {
    fn write(&mut self, batch: Batch) -> CliResult<()> {
        match self {
            Sink::Store(session) => {
                session.append(batch)?;
            }
            Sink::Lines(out, seq) => {
                for mut event in batch.events {
                    *seq += 1;
                    event.seq = *seq;
                    serde_json::to_writer(&mut *out, &event)?;
                    out.write_all(b"\n")?;
                }
            }
        }
        Ok(())
    }

    /// Makes everything durable: flush and close the session, or sync the file.
    fn finish(self) -> CliResult<()> {
        match self {
            Sink::Store(session) => {
                session.flush()?;
                session.close()?;
            }
            Sink::Lines(out, _) => out.into_inner().map_err(|e| e.into_error())?.sync_all()?,
        }
        Ok(())
    }
}

/// This process's peak resident memory (`VmHWM` of `/proc/self/status`), in bytes.
fn peak_rss() -> CliResult<u64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| Failure::context("peak RSS needs /proc/self/status (Linux)", &e))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| Failure::invalid("no VmHWM line in /proc/self/status"))
}

/// Runs this binary's hidden `bench-writer` in a child process with root `root`; its report.
fn writer_child(
    root: &Path,
    messages: usize,
    compact_every: usize,
    jsonl: bool,
) -> CliResult<WriterReport> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command
        .arg("--root")
        .arg(root)
        .arg("bench-writer")
        .arg("--messages")
        .arg(messages.to_string())
        .arg("--compact-every")
        .arg(compact_every.to_string());
    if jsonl {
        command.arg("--jsonl");
    }
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        return Err(Failure::with_code(
            super::EXIT_OTHER,
            format!("bench-writer child failed: {}", output.status),
        ));
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|e| Failure::invalid(format!("bench-writer child printed no report: {e}")))
}

/// Rows 3 and 4: the writer's peak RSS vs its budget (`fixed`, else 64 MiB + 1.5x the
/// messages' JSON).
fn rss_row(row: &'static str, run: &WriterReport, floor: &WriterReport, fixed: Option<f64>) -> Row {
    let json = run.message_json_bytes as f64;
    let (budget, label, measure) = match fixed {
        Some(budget) => (
            budget,
            "budget".to_owned(),
            format!(
                "writer peak RSS: {} messages with a model/context-replace every {COMPACT_EVERY} turns",
                run.messages
            ),
        ),
        None => (
            RSS_BUDGET_BASE + 1.5 * json,
            "budget 64 MiB + 1.5x the messages' JSON".to_owned(),
            format!(
                "writer peak RSS: {} messages, model workset kept whole",
                run.messages
            ),
        ),
    };
    let peak = run.peak_rss_bytes as f64;
    Row::new(
        row,
        measure,
        (peak, budget, peak / budget),
        &label,
        Unit::Bytes,
        (Bound::AtMost, 1.0),
        format!(
            "{} of message JSON, {} context replaces, appended and closed in {:.1} s; \
             a process writing the same events as JSON Lines peaks at {}",
            human_bytes(run.message_json_bytes),
            run.context_replaces,
            run.seconds,
            human_bytes(floor.peak_rss_bytes)
        ),
    )
}

/// Opens the writer of the session in `root`, appends one message and flushes; then closes.
/// The time until the flush returned, and the close's.
fn open_append_once(root: &Root, probe: usize) -> CliResult<(Duration, Duration)> {
    let message = format!(r#"{{"id":"probe-{probe}","role":"user","content":"one more message"}}"#);
    let started = Instant::now();
    let session = root.open_writer(&SessionId::new(SESSION)?)?;
    session.append(Batch::new(
        format!("probe-{probe}"),
        vec![message_event(&message)?],
    ))?;
    session.flush()?;
    let appended = started.elapsed();
    let closing = Instant::now();
    session.close()?;
    Ok((appended, closing.elapsed()))
}

/// Row 5: open + one durable append on the compacted session of row 4 (in `big`) vs on a
/// new [`SMALL_SESSION_MESSAGES`]-message session (in `small`).
fn open_append(big: &Path, small: &Path, big_messages: usize, trials: usize) -> CliResult<Row> {
    let (_, session) = new_session(small)?;
    let mut corpus = Corpus::new(SEED);
    for t in 0..SMALL_SESSION_MESSAGES / 2 {
        session.append(chat_turn(&mut corpus, t)?.0)?;
    }
    session.close()?;
    // Nothing of the small session stays open: both sides start from closed files.
    drop(session);
    let (big, small) = (Root::open(big)?, Root::open(small)?);
    let (mut ours, mut base, mut ratios, mut closes) = (vec![], vec![], vec![], vec![]);
    for trial in 0..trials {
        let (b, s) = if trial % 2 == 0 {
            let b = open_append_once(&big, trial)?;
            (b, open_append_once(&small, trial)?)
        } else {
            let s = open_append_once(&small, trial)?;
            (open_append_once(&big, trial)?, s)
        };
        let (b_ms, s_ms) = (b.0.as_secs_f64() * 1e3, s.0.as_secs_f64() * 1e3);
        ours.push(b_ms);
        base.push(s_ms);
        ratios.push(b_ms / s_ms.max(1e-6));
        closes.push((b.1.as_secs_f64() * 1e3, s.1.as_secs_f64() * 1e3));
    }
    let (mut big_close, mut small_close): (Vec<f64>, Vec<f64>) = closes.into_iter().unzip();
    Ok(Row::new(
        "5",
        format!(
            "open a writer + one durable append: the compacted {big_messages}-message session \
             vs a {SMALL_SESSION_MESSAGES}-message one"
        ),
        (median(&mut ours), median(&mut base), median(&mut ratios)),
        "the small session",
        Unit::Ms,
        (Bound::AtMost, 1.5),
        format!(
            "median of {trials} trials; the close after it: {:.2} ms vs {:.2} ms",
            median(&mut big_close),
            median(&mut small_close)
        ),
    ))
}

/// Medians of `(ours, base)` rates and of their per-round ratios, the pair run in
/// alternating order.
fn alternate(
    rounds: usize,
    mut ours: impl FnMut(usize) -> CliResult<f64>,
    mut base: impl FnMut(usize) -> CliResult<f64>,
) -> CliResult<(f64, f64, f64)> {
    let (mut a, mut b, mut ratios) = (vec![], vec![], vec![]);
    for round in 0..rounds {
        let (x, y) = if round % 2 == 0 {
            let x = ours(round)?;
            (x, base(round)?)
        } else {
            let y = base(round)?;
            (ours(round)?, y)
        };
        a.push(x);
        b.push(y);
        ratios.push(x / y.max(1e-9));
    }
    Ok((median(&mut a), median(&mut b), median(&mut ratios)))
}

/// Removes a measurement's files (they can be large and say nothing afterwards).
fn discard(path: &Path) -> CliResult<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Row 6: `bench --sessions 1` at `events` events, library/raw, close included.
fn bench_one_session(
    dir: &Path,
    row: &'static str,
    events: usize,
    rounds: usize,
) -> CliResult<Row> {
    let options = bench::Options {
        events,
        batch: EVENTS_PER_COMMIT,
        durability: Durability::PowerLoss,
        sessions: 1,
        dir: None,
    };
    let work = bench::split(&payloads(events), 1);
    let rate = |r: CliResult<Rate>, path: &Path| -> CliResult<f64> {
        let rate = r?.events_per_s;
        discard(path)?;
        Ok(rate)
    };
    let (ours, base, ratio) = alternate(
        rounds,
        |round| {
            let path = dir.join(format!("library-{round}"));
            rate(bench::library(&path, &work, &options), &path)
        },
        |round| {
            let path = dir.join(format!("raw-{round}"));
            rate(bench::raw(&path, &work, &options), &path)
        },
    )?;
    Ok(Row::new(
        row,
        format!(
            "bench --sessions 1: library/raw, {} events in batches of {EVENTS_PER_COMMIT}, \
             timed until the session is closed",
            fmt_count(events as f64)
        ),
        (ours, base, ratio),
        "raw SQLite, 1 transaction per batch",
        Unit::EventsPerS,
        (Bound::AtLeast, 0.9),
        format!("median of {rounds} rounds"),
    ))
}

/// Rows 7 and 8: `events` events in commits of `per_commit` with a `flush()` after each vs
/// raw SQLite with one transaction per `per_commit` rows, both at `synchronous=FULL`,
/// each after `untimed` events written the same way to the same file.
fn flushed_vs_raw(
    dir: &Path,
    row: &'static str,
    (events, untimed): (usize, usize),
    per_commit: usize,
    rounds: usize,
) -> CliResult<Row> {
    let work = payloads(untimed + events);
    let mut shares = Vec::new();
    let (ours, base, ratio) = alternate(
        rounds,
        |round| {
            let path = dir.join(format!("library-{round}"));
            let options = StoreOptions::default();
            let flushed = flushed_commits(&path, &work, per_commit, untimed, options)?;
            shares.push(flushed.append_share);
            discard(&path)?;
            Ok(flushed.rate)
        },
        |round| {
            let path = dir.join(format!("raw-{round}"));
            std::fs::create_dir_all(&path)?;
            let rate = raw_rate(
                &path.join("raw.sqlite"),
                &work,
                per_commit,
                Durability::PowerLoss,
                untimed,
            )?;
            discard(&path)?;
            Ok(rate)
        },
    )?;
    let warm = if untimed > 0 {
        format!("timed after {untimed} untimed on the same file; ")
    } else {
        String::new()
    };
    let measure = if per_commit == 1 {
        format!(
            "one durable append per call (one event, flush() each time) / raw insert+commit per call, {events} calls"
        )
    } else {
        format!(
            "cargo bench --bench append: flush after every {per_commit}-event commit / raw, {} events",
            fmt_count(events as f64)
        )
    };
    Ok(Row::new(
        row,
        measure,
        (ours, base, ratio),
        "raw SQLite, synchronous=FULL",
        Unit::EventsPerS,
        (Bound::AtLeast, if per_commit == 1 { 0.85 } else { 0.8 }),
        format!(
            "{warm}median of {rounds} rounds; {:.0}% of our time in append, the rest in flush",
            median(&mut shares) * 100.0
        ),
    ))
}
