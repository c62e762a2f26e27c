//! The subcommands that inspect and operate sessions, each one call (or a few) into the
//! library: create, list, rename, show, history, events, fork/rewind, export/import, delete,
//! gc, verify, migrate-legacy, stats, rebuild-catalog.

use std::borrow::Cow;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use session_store::format::{SESSION_FILE, WAL_FILE};
use session_store::{
    CancelToken, Commit, ContentRef, CreateOptions, DependentFork, Error, Event, ForkPoint,
    GcDeleted, GcOptions, ImportOptions, LineageEntry, ListFilter, ListSort, Root, SessionId,
    SkippedSession, TableBytes, TurnBoundary, Usage, UsageTotals, WriterOwner, utc,
};

use super::interrupt::Interrupt;
use super::{
    CliError, CliResult, Context, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_OTHER, Failure, OutputError,
    block_on, columns, count, exit_code, human_bytes, in_context, is_broken_pipe, naming_damaged,
    padded, print_json, printable, session_id, shown, spinner,
};

/// Characters of a payload or message shown on one line of human output.
const PREVIEW_CHARS: usize = 100;

/// `text` on one line, control characters escaped, cut to `max` characters with an
/// ellipsis, never inside an escape (`\u{202e…` was cut so; outside testing, session 42).
pub(super) fn preview(text: &str, max: usize) -> String {
    let mut cut = String::new();
    let mut shown = 0;
    for c in text.chars() {
        let piece = printable(c.encode_utf8(&mut [0; 4])).into_owned();
        let width = piece.chars().count();
        if shown + width > max {
            cut.push('…');
            break;
        }
        cut.push_str(&piece);
        shown += width;
    }
    cut
}

/// A content ref for people: `<blob 1a2b3c4d5e6f… 120.0 KiB>`.
fn blob_label(content: &ContentRef) -> String {
    format!(
        "<blob {}… {}>",
        &content.digest[..content.digest.len().min(12)],
        human_bytes(content.bytes)
    )
}

/// `create [ID] [--cwd DIR]`.
pub fn create(cx: &Context, id: Option<&str>, cwd: Option<String>) -> CliResult<()> {
    let mut options = CreateOptions::default();
    options.session_id = id.map(session_id).transpose()?;
    options.cwd = cwd;
    let root = cx.create_root()?;
    let session = root.create(options)?;
    root.close(&session)?;
    if cx.json {
        print_json(&json!({ "session_id": session.id() }))
    } else {
        outln!("{}", shown(session.id()));
        Ok(())
    }
}

/// `list [--limit N] [--cursor C] [--cwd DIR] [--since WHEN] [--title TEXT]
/// [--origin ORIGIN] [--sort id|updated|created]`.
pub fn list(cx: &Context, limit: usize, cursor: Option<&str>, filter: ListFilter) -> CliResult<()> {
    let service = cx.service()?;
    let filters: Vec<&str> = [
        ("--cwd", filter.cwd.is_some()),
        ("--since", filter.since_ms.is_some()),
        ("--title", filter.title.is_some()),
        ("--origin", filter.origin.is_some()),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect();
    let filtered = !filters.is_empty();
    let sort = match filter.sort {
        ListSort::Updated => "--sort updated ",
        ListSort::Created => "--sort created ",
        _ => "",
    };
    let page = block_on(service.query().list_with(&filter, cursor, limit))??;
    report_skipped(&page.skipped);
    if let Some(e) = &page.catalog_error {
        errln!(
            "session-store: warning: catalog not used ({}); listed from the session files",
            super::one_line(e.as_ref())
        );
    }
    if cx.json {
        return print_json(&page);
    }
    if page.sessions.is_empty() {
        // An empty page of a filtered or continued listing says so: "no sessions in ROOT"
        // read as if the root held none.
        let what = match (filtered, cursor.is_some()) {
            (true, false) => "no sessions match the filters",
            (true, true) => "no more sessions match the filters after the cursor",
            (false, true) => "no more sessions after the cursor",
            (false, false) if page.skipped.is_empty() => "no sessions",
            (false, false) => "no readable sessions",
        };
        // Sessions that could not be read are not "no sessions" (a root whose every
        // session was skipped said so).
        let skipped = match page.skipped.len() {
            0 => String::new(),
            n => format!(" ({n} skipped: they cannot be read, named above)"),
        };
        outln!("{what} in {}{skipped}", cx.root.display());
        return Ok(());
    }
    let width = page
        .sessions
        .iter()
        .map(|s| columns(&shown(&s.session_ref.session_id)))
        .max()
        .unwrap_or(2)
        .max(2);
    outln!(
        "{}  {:>5}  {:>8}  {:<19}  TITLE",
        padded("ID", width),
        "TURNS",
        "EVENTS",
        "UPDATED (UTC)"
    );
    for s in &page.sessions {
        let title = if s.title.is_empty() {
            s.preview
                .as_deref()
                .map_or_else(String::new, |p| format!("({})", preview(p, 60)))
        } else {
            preview(&s.title, 60)
        };
        outln!(
            "{}  {:>5}  {:>8}  {:<19}  {title}",
            padded(&shown(&s.session_ref.session_id), width),
            s.turns,
            s.durable_sequence,
            utc(s.updated_at_ms),
        );
    }
    if let Some(next) = &page.next_cursor {
        // The cursor continues this listing only: alone, a sorted listing's cursor read as
        // an id (or was refused) and a filtered one's listed every session after it.
        let same = if filters.is_empty() {
            String::new()
        } else {
            format!(" (with the same {})", filters.join(", "))
        };
        outln!("more: {sort}--cursor {next}{same}");
    }
    Ok(())
}

/// Names each session that could not be read, with why, on stderr.
pub(super) fn report_skipped(skipped: &[SkippedSession]) {
    for s in skipped {
        errln!(
            "session-store: skipped session {}: {}",
            shown(&s.session_id),
            super::one_line(s.error.as_ref())
        );
    }
}

/// `rename ID TITLE`.
pub fn rename(cx: &Context, id: &str, title: &str) -> CliResult<()> {
    let id = session_id(id)?;
    let root = cx.open_root()?;
    root.rename(&id, title)
        .map_err(|e| naming_damaged(&id, e.into()))?;
    if cx.json {
        print_json(&json!({ "session_id": id, "title": title }))
    } else {
        outln!("renamed {}: {}", shown(&id), preview(title, PREVIEW_CHARS));
        Ok(())
    }
}

/// What `show` prints with `--json`.
#[derive(Serialize)]
struct Show {
    header: session_store::Header,
    title: String,
    durable_sequence: u64,
    inherited_events: u64,
    own_events: u64,
    lineage: Vec<LineageEntry>,
    /// Whether the parent (`header.parent_id`) is a session of this root now; `None`
    /// without a parent. A deleted parent's inherited events were copied into this
    /// session's own file (an imported one holds them too).
    parent_in_root: Option<bool>,
    /// Whether a session of the parent's id is in the root that is not the parent (made
    /// under its id since, or beside an imported fork): human output says so instead of
    /// "not in this root". Not in `--json` (`parent_in_root` says it is not the parent).
    #[serde(skip)]
    parent_id_taken: bool,
    /// The last writer that took the lease (the lease row).
    lease: WriterOwner,
    /// The writer holding the lock now, if any.
    writer: Option<WriterOwner>,
    dependents: Vec<DependentFork>,
    turn_status: String,
    open_turn: Option<String>,
    messages: u64,
    turns: Vec<TurnBoundary>,
    tables: Vec<TableBytes>,
    file_bytes: u64,
    /// Token and cost totals (a fork's include its inherited prefix).
    usage: Usage,
}

/// Bytes of a session's own file and its WAL (0 for a file that is missing).
pub fn file_bytes(root: &session_store::Root, id: &SessionId) -> u64 {
    let dir = root.session_dir(id);
    [SESSION_FILE, WAL_FILE]
        .iter()
        .filter_map(|f| std::fs::symlink_metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// Reads of one session `read_of` makes at most when each fails on a file it cannot tell
/// from the one it started with.
const READ_ATTEMPTS: usize = 5;

/// Runs `read`, a read of session `id`. When it fails and the session's file is gone or no
/// longer the one it was (the session was deleted, or deleted and imported again, while it
/// was read), or there was none when the read began (it was imported and deleted again
/// meanwhile), the failure is "not found" (status 3), not SQLite's error for the files that
/// went away ("disk I/O error", "unable to open database file"). A failure on what looks
/// like the same file is read again (at most [`READ_ATTEMPTS`] reads): where the file
/// system keeps no creation time, a file deleted and made again can look like the old one.
fn read_of<T>(root: &Root, id: &SessionId, read: impl Fn() -> CliResult<T>) -> CliResult<T> {
    let mut attempt = 1;
    loop {
        let before = root.session_file_identity(id);
        match read() {
            Err(e) if !is_broken_pipe(e.as_ref()) => {
                let not_found = exit_code(e.as_ref()) == EXIT_NOT_FOUND;
                let now = root.session_file_identity(id);
                if before.is_some() && (now.is_none() || now != before) {
                    return Err(Failure::with_code(
                        EXIT_NOT_FOUND,
                        format!("session {id} not found (deleted while it was read)"),
                    ));
                }
                if before.is_none() {
                    // A "not found" of one of the files the read met names a path in the
                    // root: the session is what was not there. (Another failure, a folder
                    // this process may not look into, says why itself.)
                    return Err(if not_found {
                        Failure::with_code(EXIT_NOT_FOUND, format!("session {id} not found"))
                    } else {
                        e
                    });
                }
                if not_found || attempt == READ_ATTEMPTS {
                    return Err(naming_damaged(id, e));
                }
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// `show ID`.
pub fn show(cx: &Context, id: &str) -> CliResult<()> {
    let id = session_id(id)?;
    let root = cx.open_root()?;
    let show = read_of(&root, &id, || show_of(&root, &id))?;
    if cx.json {
        return print_json(&show);
    }
    print_show(&show)
}

/// What `show ID` prints.
fn show_of(root: &Root, id: &SessionId) -> CliResult<Show> {
    let info = root.stat(id)?;
    let reader = root.open_reader(id)?;
    // Every part at the durable sequence `stat` read: a writer may commit meanwhile.
    let projection = reader.projection_at(info.durable_sequence)?;
    let mut turns = reader.turns()?;
    turns.retain(|t| t.boundary_sequence <= info.durable_sequence);
    let file_bytes = file_bytes(root, id);
    let own_events = info.durable_sequence.saturating_sub(info.inherited_events);
    let show = Show {
        title: projection.title.clone(),
        durable_sequence: info.durable_sequence,
        inherited_events: info.inherited_events,
        own_events,
        lineage: info.lineage,
        parent_in_root: match info.header.parent_id {
            Some(_) => Some(root.parent_in_root(&reader)?),
            None => None,
        },
        parent_id_taken: info
            .header
            .parent_id
            .as_ref()
            .is_some_and(|p| root.session_file_identity(p).is_some()),
        lease: info.last_writer,
        writer: root.writer_owner(id)?,
        // A fork SIGKILLed before its publication left a row naming no session: no fork.
        dependents: reader
            .dependents()?
            .into_iter()
            .filter(|d| root.session_file_identity(&d.child_id).is_some())
            .collect(),
        turn_status: projection.turn_status.clone(),
        open_turn: projection.turn_id.clone(),
        messages: projection.transcript_len,
        turns,
        tables: root.table_bytes(id)?,
        file_bytes,
        usage: projection.usage.clone(),
        header: info.header,
    };
    Ok(show)
}

fn print_show(s: &Show) -> CliResult<()> {
    let h = &s.header;
    outln!("session    {}", shown(&h.session_id));
    if !s.title.is_empty() {
        outln!("title      {}", preview(&s.title, PREVIEW_CHARS));
    }
    outln!(
        "created    {} UTC, origin {}, codec {}",
        utc(h.created_at_ms),
        h.origin.as_str(),
        printable(&h.codec)
    );
    if let Some(cwd) = &h.cwd {
        outln!("cwd        {}", printable(cwd));
    }
    if let Some(parent) = &h.parent_id {
        let parent = shown(parent);
        // A parent deleted since (or never in this root: an import; or another session
        // made under its id since) is named as such, and the events inherited are this
        // session's own now.
        let gone = match s.parent_in_root {
            Some(false) if s.parent_id_taken => format!(
                "; the session {parent} of this root is another session, not this one's parent: \
                 they are held in this session's file"
            ),
            Some(false) => {
                format!("; {parent} is not in this root, they are held in this session's file")
            }
            _ => String::new(),
        };
        outln!(
            "parent     {parent} ({} inherited at the cut{gone})",
            count(h.inherited_events, "event", "events")
        );
    }
    for e in &s.lineage {
        outln!(
            "lineage    seq {}..={} from {}",
            e.after_seq + 1,
            e.through_seq,
            shown(&e.ancestor_id)
        );
    }
    outln!(
        "sequences  durable {}, own {}, inherited {}",
        s.durable_sequence,
        s.own_events,
        s.inherited_events
    );
    match &s.writer {
        Some(w) => outln!(
            "writer     held by pid {} on host {} (generation {}, owner {})",
            w.pid,
            printable(&w.host),
            w.generation,
            printable(&w.owner_id)
        ),
        None => outln!("writer     free"),
    }
    let l = &s.lease;
    if l.generation == 0 {
        outln!("lease      never taken (generation 0)");
    } else {
        outln!(
            "lease      generation {}, last taken by pid {} on host {} at {} UTC (owner {})",
            l.generation,
            l.pid,
            printable(&l.host),
            utc(l.since_ms),
            printable(&l.owner_id)
        );
    }
    for d in &s.dependents {
        outln!(
            "dependent  {} (inherits through seq {})",
            shown(&d.child_id),
            d.through_seq
        );
    }
    outln!(
        "turns      {} ended, {}, status {}{}",
        s.turns.len(),
        count(s.messages, "message", "messages"),
        if s.turn_status.is_empty() {
            "none".into()
        } else {
            printable(&s.turn_status)
        },
        s.open_turn
            .as_deref()
            .map_or_else(String::new, |t| format!(" (open turn {})", printable(t)))
    );
    for t in &s.turns {
        let mut safe = Vec::new();
        if t.fork_safe {
            safe.push("fork-safe");
        }
        if t.rewind_safe {
            safe.push("rewind-safe");
        }
        outln!(
            "  {}  seq {}..={} (cut {})  {}  {}",
            printable(&t.turn_id),
            t.start_sequence,
            t.end_sequence,
            t.boundary_sequence,
            printable(&t.status),
            safe.join(" ")
        );
    }
    print_usage("usage     ", "  ", &s.usage)?;
    outln!("file       {} on disk", human_bytes(s.file_bytes));
    // Padded to the longest name (`operation_key_chunks` pushed its column out of line).
    let width = s.tables.iter().map(|t| t.table.len()).max().unwrap_or(0);
    for t in &s.tables {
        outln!(
            "  {:<width$} {:>10}  ({})",
            t.table,
            human_bytes(t.bytes),
            count(t.pages, "page", "pages")
        );
    }
    Ok(())
}

/// One line of usage totals for people.
fn usage_line(t: &UsageTotals) -> String {
    format!(
        "{}, {} in, {} out, {} cache read, {} cache write{}",
        count(t.events, "call", "calls"),
        t.input_tokens,
        t.output_tokens,
        t.cache_read_tokens,
        t.cache_write_tokens,
        t.cost.map_or_else(String::new, |c| format!(", cost {c}"))
    )
}

/// The usage totals under `label`, then one line per model indented by `indent`
/// (nothing without usage).
fn print_usage(label: &str, indent: &str, usage: &Usage) -> CliResult<()> {
    if usage.is_empty() {
        return Ok(());
    }
    outln!("{label} {}", usage_line(&usage.total));
    for (model, t) in &usage.by_model {
        outln!("{indent}{}: {}", preview(model, 60), usage_line(t));
    }
    Ok(())
}

/// `history ID [--limit N] [--cursor C]`.
pub fn history(cx: &Context, id: &str, limit: usize, cursor: Option<&str>) -> CliResult<()> {
    let id = session_id(id)?;
    let service = cx.service()?;
    let r = service.session_ref(id.clone());
    let page = read_of(service.root(), &id, || {
        Ok(block_on(service.query().history_page(&r, cursor, limit))??)
    })?;
    if cx.json {
        return print_json(&page);
    }
    if page.messages.is_empty() {
        outln!("no messages (durable sequence {})", page.snapshot_sequence);
    }
    for m in &page.messages {
        let role = printable(m.role.as_deref().unwrap_or("?"));
        let body = match (&m.inline, &m.content_ref) {
            (_, Some(content)) => blob_label(content),
            (Some(message), None) => message
                .display_text()
                .unwrap_or_else(|| message.json().to_owned()),
            (None, None) => String::new(),
        };
        outln!(
            "#{:<4} {role:<9} {}",
            m.position,
            preview(&body, PREVIEW_CHARS)
        );
    }
    if let Some(next) = &page.next_cursor {
        outln!("older: --cursor {next}");
    }
    Ok(())
}

/// One event of `events --json`.
#[derive(Serialize)]
struct EventLine<'a> {
    seq: u64,
    id: &'a str,
    kind: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    optional: bool,
    operation_id: &'a str,
    commit_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a serde_json::value::RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_ref: Option<&'a ContentRef>,
}

impl<'a> EventLine<'a> {
    fn new(commit: &'a Commit, e: &'a Event, inline: bool) -> Self {
        let blob = e.content_ref.is_some();
        EventLine {
            seq: e.seq,
            id: &e.id,
            kind: &e.kind,
            optional: e.optional,
            operation_id: &commit.operation_id,
            commit_id: &commit.commit_id,
            turn_id: commit.turn_id.as_deref(),
            payload: e.payload.as_deref().filter(|_| inline || !blob),
            content_ref: e.content_ref.as_ref(),
        }
    }
}

/// What `events --json` prints.
#[derive(Serialize)]
struct EventsPage<'a> {
    events: &'a [EventLine<'a>],
    durable_sequence: u64,
    next_after: Option<u64>,
}

/// `events ID [--after SEQ] [--limit N]`.
pub fn events(cx: &Context, id: &str, after: u64, limit: usize, inline: bool) -> CliResult<()> {
    let id = session_id(id)?;
    let root = cx.open_root()?;
    // Every commit holds at least one event, so `limit` commits cover `limit` events.
    let (durable, commits) = read_of(&root, &id, || {
        let reader = root.open_reader(&id)?;
        Ok((reader.durable_sequence()?, reader.commits(after, limit)?))
    })?;
    // As the library's `observe` refuses it: a script paging with a sequence this session
    // has not reached (another session's, a typo) saw an empty, finished stream (exit 0),
    // where Python raised `InvalidInput` (outside testing D1).
    if after > durable {
        return Err(Failure::with_code(
            EXIT_INVALID,
            format!(
                "no events after sequence {after}: it is past the last sequence {durable} of \
                 session {id}"
            ),
        ));
    }
    // Commits made after `durable` was read are left for the next page.
    let lines: Vec<EventLine<'_>> = commits
        .iter()
        .flat_map(|c| c.events.iter().map(move |e| (c, e)))
        .filter(|(_, e)| e.seq > after && e.seq <= durable)
        .take(limit)
        .map(|(c, e)| EventLine::new(c, e, inline))
        .collect();
    let last = lines.last().map_or(after, |l| l.seq);
    let next_after = (last < durable).then_some(last);
    if cx.json {
        // A struct, not `json!`: payloads are written as the stored text (a `Value` tree
        // would refuse numbers like 1e999 and nesting deeper than serde_json's limit).
        return print_json(&EventsPage {
            events: &lines,
            durable_sequence: durable,
            next_after,
        });
    }
    for l in &lines {
        let body = match (l.content_ref, l.payload) {
            (Some(content), None) => blob_label(content),
            (_, Some(payload)) => preview(payload.get(), PREVIEW_CHARS),
            (None, None) => String::new(),
        };
        let line = format!(
            "{:>7}  {:<22} {:<16} {body}",
            l.seq,
            printable(l.kind),
            preview(l.turn_id.unwrap_or("-"), 16)
        );
        outln!("{}", line.trim_end());
    }
    match next_after {
        Some(next) => outln!("more: --after {next}"),
        None if lines.is_empty() => {
            outln!("no events after {after} (durable sequence {durable})")
        }
        None => {}
    }
    Ok(())
}

/// `fork ID --after-turn T [--id NEW]` and `rewind ID --before-turn T [--id NEW]`.
pub fn fork(cx: &Context, id: &str, point: ForkPoint, new_id: Option<&str>) -> CliResult<()> {
    let parent = session_id(id)?;
    let root = cx.open_root()?;
    let origin = if matches!(point, ForkPoint::BeforeTurn(_)) {
        "rewind"
    } else {
        "fork"
    };
    let child = root
        .fork(&parent, point, new_id.map(session_id).transpose()?)
        .map_err(|e| naming_damaged(&parent, e.into()))?;
    if cx.json {
        print_json(&json!({"session_id": child, "parent_id": parent, "origin": origin}))
    } else {
        outln!("{}", shown(&child));
        Ok(())
    }
}

/// Fails with status 3 unless `path` exists.
fn must_exist(path: &Path) -> CliResult<()> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(()),
        // `FILE/` for a file: a path ending in `/` names a folder, and the file is there
        // (it said "FILE/ not found", outside testing C7, session 41).
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Err(Failure::invalid(format!(
            "{}: a part of it is a file, not a folder{}",
            path.display(),
            if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
                " (a path ending in / names a folder)"
            } else {
                ""
            }
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Failure::with_code(
            EXIT_NOT_FOUND,
            format!("{} not found", path.display()),
        )),
        // A folder on the way this user may not enter: its reason, not "not found" (a
        // file root could read was "not found" once root acted as a root's owner; outside
        // testing, re-test of security).
        Err(e) => Err(Failure::with_code(
            EXIT_OTHER,
            format!("{}: {e}", path.display()),
        )),
    }
}

/// Fails with status 2 when `path` is `-`, which a user means as stdin or stdout, for a
/// command that needs a file by its path (`does` says what it does with it): not a file
/// named `-` in the current folder, which such a user would not look for (or would be
/// told is "not found").
fn not_a_dash(path: &Path, does: &str) -> CliResult<()> {
    if path == Path::new("-") {
        return Err(Failure::usage(format!(
            "{does}: give its path (./- for a file named -)"
        )));
    }
    Ok(())
}

/// `export ID FILE`.
pub fn export(cx: &Context, id: &str, file: &Path) -> CliResult<()> {
    not_a_dash(file, "export writes a SQLite file, not to stdout")?;
    let id = session_id(id)?;
    let root = cx.open_root()?;
    let interrupt = Interrupt::watch()?;
    let bar = spinner(&format!("exporting {id}"));
    let report = root.export_cancellable(&id, file, interrupt.token());
    bar.finish_and_clear();
    let report = report.map_err(|e| -> CliError {
        if matches!(e, Error::Cancelled) {
            let what = format!("nothing was written to {}", file.display());
            interrupt.failure(e.into(), &what)
        } else {
            // A failed write (a full disk, a folder that takes no files) named only the
            // temporary file SQLite was given, or nothing at all.
            naming_damaged(
                &id,
                in_context(e, format!("export {id} to {}", file.display())),
            )
        }
    })?;
    if cx.json {
        return print_json(&json!({
            "session_id": id, "file": file.to_string_lossy(), "commits": report.commits,
            "events": report.events, "bytes": report.bytes,
        }));
    }
    outln!(
        "exported {} to {}: {}, {}, {}",
        shown(&id),
        printable(&file.display().to_string()),
        count(report.commits, "commit", "commits"),
        count(report.events, "event", "events"),
        human_bytes(report.bytes)
    );
    Ok(())
}

/// `import FILE [--id NEW] [--cwd DIR]`.
pub fn import(
    cx: &Context,
    file: &Path,
    new_id: Option<&str>,
    cwd: Option<String>,
) -> CliResult<()> {
    not_a_dash(file, "import reads a SQLite file in place, not stdin")?;
    must_exist(file)?;
    let mut options = ImportOptions::default();
    options.session_id = new_id.map(session_id).transpose()?;
    options.cwd = cwd;
    let root = cx.create_root()?;
    let interrupt = Interrupt::watch()?;
    let bar = spinner(&format!("importing {}", file.display()));
    let imported = root.import_cancellable(file, options, interrupt.token());
    bar.finish_and_clear();
    // The library's account of a bad file ("corrupt session store: event 5: …") names no
    // file; the user may be importing many.
    let id = imported.map_err(|e| -> CliError {
        if matches!(e, Error::Cancelled) {
            interrupt.failure(e.into(), "nothing was imported")
        } else if e.is_corrupt() || e.is_unsupported() {
            Failure::context(format!("cannot import {}", file.display()), &e)
        } else {
            in_context(e, format!("import {}", file.display()))
        }
    })?;
    // A signal after the session was published stopped only its search indexing: the
    // import is done, and said so (the signal went unnoticed for the 10 s a large session
    // was indexed, then the command printed the id, exit 0, or a second one ended it,
    // exit 130, with the session published: outside testing I2).
    if let Some((_, name)) = interrupt.seen() {
        errln!(
            "session-store: interrupted by {name} after the session was published: it is \
             kept (the next search indexes what this import had not)"
        );
    }
    if cx.json {
        print_json(&json!({"session_id": id, "file": file.to_string_lossy()}))
    } else {
        outln!("{}", shown(&id));
        Ok(())
    }
}

/// How long `delete` waits for a lock it found free (it may be taken in between).
const DELETE_GRACE: Duration = Duration::from_millis(500);

/// `delete ID [--wait SECONDS]`.
pub fn delete(cx: &Context, id: &str, wait: Duration) -> CliResult<()> {
    let id = session_id(id)?;
    let root = cx.open_root()?;
    // The delete says that it could not delete the session, and how long it waited.
    let owned = |owner| {
        let what = if wait.is_zero() {
            format!("cannot delete {id}")
        } else {
            format!("cannot delete {id} after waiting {} s", wait.as_secs_f64())
        };
        Failure::context(
            what,
            &Error::WriterOwned {
                session: id.to_string(),
                owner,
            },
        )
    };
    // A writer refuses a delete that does not wait at once; another delete in progress is
    // waited for as briefly as any delete waits (its session is then not found).
    if wait.is_zero()
        && let Some(owner) = root.writer_owner(&id)?
        && owner.holding_for.is_none()
    {
        return Err(owned(owner));
    }
    let patience = wait.max(DELETE_GRACE);
    let cancel = CancelToken::after(patience);
    let bar = spinner(&format!("deleting {id}"));
    let deleted = root.delete(&id, &cancel);
    bar.finish_and_clear();
    match deleted {
        Ok(()) => {}
        Err(Error::Cancelled) => {
            return Err(match root.writer_owner(&id)? {
                Some(owner) => owned(owner),
                None => Failure::with_code(
                    EXIT_OTHER,
                    format!(
                        "gave up deleting {id} after {} s (a fork or delete is in progress)",
                        patience.as_secs_f64()
                    ),
                ),
            });
        }
        // Another session's writer: a fork of an older schema version, which the delete
        // would upgrade under that writer as it copies the inherited events in.
        Err(Error::WriterOwned { session, owner }) if session != id.as_str() => {
            let context = format!(
                "delete {id} (it copies what its fork {session} inherits into that fork, whose \
                 file, of an older schema version, it would upgrade under its writer; {id} is \
                 kept)"
            );
            return Err(Failure::context(
                context,
                &Error::WriterOwned { session, owner },
            ));
        }
        Err(e) => return Err(in_context(e, format!("delete {id}"))),
    }
    if cx.json {
        print_json(&json!({ "deleted": id }))
    } else {
        outln!("deleted {}", shown(&id));
        Ok(())
    }
}

/// `gc --older-than DURATION [--dry-run] [--keep-forked]`: prints each session deleted
/// (or that would be) and each old one kept, with why; fails (status 1) when a deletion
/// failed.
pub fn gc(cx: &Context, options: &GcOptions) -> CliResult<()> {
    let root = cx.open_root()?;
    let bar = spinner("collecting old sessions");
    let verb = if options.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    // Each deletion is printed as it is made (with --json the report comes at the end): a
    // run stopped midway printed nothing of what it had deleted. One that cannot print
    // stops before its next deletion, and so does one a signal stops: the deletion under
    // way is finished and printed first (the signal's default action ended the process
    // between a deletion and its line: outside testing I5).
    let interrupt = Interrupt::watch()?;
    let go_on = || match interrupt.seen() {
        Some(_) => ControlFlow::Break(()),
        None => ControlFlow::Continue(()),
    };
    let mut unprinted = None;
    let collected = root.gc_with_progress(options, |d| {
        if cx.json {
            return go_on();
        }
        bar.suspend(|| match print_collected(verb, d) {
            Ok(()) => go_on(),
            Err(e) => {
                // Said where it can still be read: with stdout gone (`gc | head -2`) the
                // run deleted one session more than it printed, without a word.
                errln!(
                    "session-store: {verb} {}, which stdout could not take; the run stops here",
                    shown(&d.session_id)
                );
                unprinted = Some(e);
                ControlFlow::Break(())
            }
        })
    });
    bar.finish_and_clear();
    // A root that cannot be written: what was being done, then where and why.
    let report = collected
        .map_err(|e| in_context(e, format!("collect old sessions of {}", cx.root.display())))?;
    if let Some(e) = unprinted {
        return Err(e.into());
    }
    if cx.json {
        print_json(&report)?;
    } else {
        for k in &report.kept {
            outln!("kept {}: {}", shown(&k.session_id), printable(&k.reason));
        }
        // A dry run deletes nothing, so what failed there is the check.
        let failed = if report.dry_run {
            "could not check"
        } else {
            "could not delete"
        };
        for f in &report.failed {
            errln!(
                "session-store: {failed} {}: {}",
                shown(&f.session_id),
                printable(&f.reason)
            );
        }
        if report.deleted.is_empty() && report.kept.is_empty() && report.failed.is_empty() {
            outln!("nothing to collect");
        }
    }
    if let Some(stopped) = interrupt.stopped("the run stopped after the deletions it reported") {
        return Err(stopped);
    }
    match report.failed.len() {
        0 => Ok(()),
        n if report.dry_run => Err(Failure::with_code(
            EXIT_OTHER,
            format!("{n} session(s) could not be checked"),
        )),
        n => Err(Failure::with_code(
            EXIT_OTHER,
            format!("{n} session(s) could not be deleted (each left as it was)"),
        )),
    }
}

/// `gc`'s line of one session it deleted (or would delete: `verb`).
fn print_collected(verb: &str, d: &GcDeleted) -> Result<(), OutputError> {
    let forks: Vec<Cow<'_, str>> = d.forks.iter().map(shown).collect();
    outln!(
        "{verb} {} (updated {} UTC){}",
        shown(&d.session_id),
        utc(d.updated_at_ms),
        if forks.is_empty() {
            String::new()
        } else {
            format!("; forks keep their history: {}", forks.join(", "))
        }
    );
    Ok(())
}

/// The session folder or file `verify` checks, with the session id when `target` names a
/// session of the root (checked as the root opens it), else a path.
fn verify_target(cx: &Context, target: &Path) -> CliResult<(PathBuf, Option<SessionId>)> {
    if let Some(Ok(id)) = target.to_str().map(SessionId::new) {
        let dir = cx.root.join(id.as_str());
        // Also a session file that is no regular file or in a folder this process may not
        // look into: the root's open says what is wrong with it (as `show` does), where
        // this said "neither a session in ROOT nor a file".
        let held = std::fs::symlink_metadata(dir.join(SESSION_FILE)).map_or_else(
            |e| e.kind() == std::io::ErrorKind::PermissionDenied,
            |_| true,
        );
        if held {
            return Ok((dir, Some(id)));
        }
    }
    not_a_dash(
        target,
        "verify reads a session or a SQLite file in place, not stdin",
    )?;
    let path = target.to_path_buf();
    // Also a path in a folder this user may not enter: verifying it says why.
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        _ => return Ok((path, None)),
    }
    // Neither a file nor a session of the root: a root that is no folder, or none at all,
    // is what is wrong (a root that is a file said "neither a session in ROOT nor a
    // file", status 3, where every other command says "not a folder", status 6).
    cx.root_not_a_file()?;
    let root = cx.root.display();
    Err(Failure::with_code(
        EXIT_NOT_FOUND,
        if cx.root.is_dir() {
            format!("{target:?} is neither a session in {root} nor a file")
        } else {
            format!("no root at {root}, and {target:?} is not a file")
        },
    ))
}

/// `verify (ID | FILE)`.
pub fn verify(cx: &Context, target: &Path) -> CliResult<()> {
    let (path, id) = verify_target(cx, target)?;
    let bar = spinner(&format!("verifying {}", path.display()));
    let replayed = match &id {
        Some(id) => cx.open_root()?.verify(id),
        None => session_store::verify_file(&path),
    };
    bar.finish_and_clear();
    let replay = match replayed {
        Ok(replay) => replay,
        Err(e) => {
            if cx.json {
                print_json(&json!({
                    "ok": false, "path": path.to_string_lossy(), "error": super::one_line(&e),
                }))?;
            }
            // Only a damaged (or too new) file is "not sound": an error that kept the
            // file from being read (a full disk, a permission, I/O) says nothing of it.
            // What is not there (a session, a folder's session file) is named by the
            // library's own message.
            if e.is_not_found() {
                return Err(e.into());
            }
            let what = if e.is_corrupt() || e.is_unsupported() {
                format!("{} is not sound", path.display())
            } else {
                format!("could not verify {}", path.display())
            };
            return Err(Failure::context(what, &e));
        }
    };
    let p = &replay.projection;
    if cx.json {
        return print_json(&json!({
            "ok": true, "path": path.to_string_lossy(), "session_id": replay.header.session_id,
            "commits": replay.commits, "events": replay.events,
            "turns": p.ended_turns, "messages": p.transcript_len, "notes": replay.notes,
        }));
    }
    outln!(
        "ok: {} ({}): {}, {}, {}, {}; integrity, sequences, hashes, blob digests and replay \
         are sound",
        shown(&replay.header.session_id),
        printable(&path.display().to_string()),
        count(replay.commits, "commit", "commits"),
        count(replay.events, "event", "events"),
        count(p.ended_turns, "turn", "turns"),
        count(p.transcript_len, "message", "messages")
    );
    for note in &replay.notes {
        outln!("note: {note}");
    }
    Ok(())
}

/// `migrate-legacy FILE [--head ID]`.
pub fn migrate_legacy(cx: &Context, file: &Path, head: &str) -> CliResult<()> {
    not_a_dash(
        file,
        "migrate-legacy reads a file by its path (the new session's id is derived from it), not stdin",
    )?;
    must_exist(file)?;
    super::not_a_folder(file)?;
    let service = cx.service_on(cx.create_root()?)?;
    let record = block_on(async {
        let (runtime, record) = service.continue_legacy(file, head).await?;
        service.close(runtime.session_ref()).await?;
        Ok::<_, Error>(record)
    })??;
    if cx.json {
        return print_json(&record);
    }
    outln!(
        "{} {} from {} into session {}{}",
        if record.reused { "reused:" } else { "migrated" },
        count(record.message_count as u64, "message", "messages"),
        printable(&record.source_path),
        shown(&record.target_id),
        if record.torn_last_line {
            " (torn last line skipped)"
        } else {
            ""
        }
    );
    Ok(())
}

/// `stats ID`.
pub fn stats(cx: &Context, id: &str) -> CliResult<()> {
    let id = session_id(id)?;
    let root = cx.open_root()?;
    let stats = root.stats(&id).map_err(|e| naming_damaged(&id, e.into()))?;
    if cx.json {
        return print_json(&stats);
    }
    outln!(
        "{}: {} (durable sequence {}), {} on disk",
        shown(&stats.session_id),
        count(stats.events, "event", "events"),
        stats.durable_sequence,
        human_bytes(stats.file_bytes)
    );
    let width = stats
        .kinds
        .iter()
        .map(|k| columns(&printable(&k.kind)))
        .max()
        .unwrap_or(4)
        .max(4);
    outln!(
        "  {}  {:>8}  {:>10}  {:>6}  {:>10}  {:>6}",
        padded("KIND", width),
        "COUNT",
        "INLINE",
        "BLOBS",
        "BLOB BYTES",
        "PARTS"
    );
    for k in &stats.kinds {
        outln!(
            "  {}  {:>8}  {:>10}  {:>6}  {:>10}  {:>6}",
            padded(&printable(&k.kind), width),
            k.count,
            human_bytes(k.inline_bytes),
            k.blob_events,
            human_bytes(k.blob_bytes),
            k.content_parts
        );
    }
    let b = &stats.blobs;
    outln!(
        "  blobs: {} distinct ({} zstd), {} raw, {} stored, compression ratio {:.2}",
        b.count,
        b.compressed,
        human_bytes(b.raw_bytes),
        human_bytes(b.stored_bytes),
        b.compression_ratio
    );
    let tables: Vec<String> = stats
        .tables
        .iter()
        .map(|t| format!("{} {}", t.table, human_bytes(t.bytes)))
        .collect();
    outln!("  tables: {}", tables.join(", "));
    print_usage("  usage:", "    ", &stats.usage)?;
    Ok(())
}

/// `rebuild-catalog`.
pub fn rebuild_catalog(cx: &Context) -> CliResult<()> {
    let root = cx.open_root()?;
    let bar = spinner("rebuilding the catalog");
    let rebuilt = root.rebuild_catalog();
    bar.finish_and_clear();
    // SQLite's "attempt to write a readonly database" named neither the root nor what was
    // being done.
    let report = rebuilt
        .map_err(|e| in_context(e, format!("rebuild the catalog of {}", cx.root.display())))?;
    report_skipped(&report.skipped);
    if cx.json {
        print_json(&report)
    } else {
        outln!(
            "rebuilt the catalog of {}: {}{}",
            cx.root.display(),
            count(report.sessions as u64, "session", "sessions"),
            match report.skipped.len() {
                0 => String::new(),
                n => format!(", {n} skipped (unreadable, named above)"),
            }
        );
        Ok(())
    }
}
