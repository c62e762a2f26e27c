//! The query side and `open`, in one process and one run:
//!
//! * `SessionQuery::list` over 10,000 sessions (each made with `Root::create`, one
//!   `session/title` event and `close`): after one untimed warm-up walk that fills the
//!   catalog, the first page of 50 (median of 20 runs, target <= 5 ms) and a full walk in
//!   pages of 50 until `next_cursor` is `None` (median of 5 runs, target <= 100 ms). The
//!   baseline lists without the catalog: `open_reader(id)?.projection()?.title` for the
//!   same 50 / all ids (the ids are given to it; reading the folder is not timed);
//! * `SessionQuery::history_page` of 50 on a cold session of 100,000 `message/complete` events
//!   (unique ids, ~200-byte contents, appended in batches of 500, then closed): the
//!   newest page, and a page in the middle (reached first by following cursors, untimed,
//!   in pages of 50; a walk over its time budget stops early and the page where it
//!   stopped is timed, its position printed). Target <= 5 ms each. Baseline:
//!   `SessionQuery::history` (the whole transcript) of the same session;
//! * `Service::open` (writer lock, lease, projection, restart-recovery check), `release`
//!   and `close` of a 100,000-event session vs a 100-event session, both closed cleanly
//!   before (turns of 100 events: `turn/start`, a user and an assistant
//!   `message/complete`, 48 `tool/start` and `tool/result` pairs, `turn/end`); target:
//!   the ratio big/small <= 2.0, i.e. open does not grow with history. The same for the
//!   100,000-message session above (every event a message, so the projection the open
//!   loads holds 100,000 messages), against the same 100-event session.
//!
//! The list part runs in a root of its own (exactly 10,000 sessions); the warm-up walk
//! that fills the catalog is timed once and reported too (no target).
//!
//! Sessions use `Durability::ProcessCrash` and a long write-behind (only `close` drains),
//! so that building them is quick. `BENCH_QUICK=1` shrinks every size 10x (a smoke run).
//! Files go under Cargo's target tmp dir (`BENCH_DIR` overrides it).
//!
//! Run with `cargo bench --bench query`.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::roots::{
    BenchResult, CONTENT_BYTES, bench_root, build_history, create_titled, filler_text, fmt_ms,
    message_json, sample, sample_after, spread, walk_history,
};
use common::{fmt_count, fmt_mb, load_average, median, quick, verdict};
use serde_json::json;
use session_store::{
    Batch, CreateOptions, Event, Root, Service, SessionId, SessionQuery, SessionRef,
};
use tokio::runtime::Runtime;

/// Sessions listed in a full run (a quick run has a tenth).
const SESSIONS: usize = 10_000;
/// Messages of the history session in a full run.
const MESSAGES: usize = 100_000;
/// Events of the big session opened in a full run.
const OPEN_EVENTS: usize = 100_000;
/// Events of the small session opened (in every run).
const SMALL_EVENTS: usize = 100;
/// Events per turn (and commit) of the sessions opened.
const EVENTS_PER_TURN: usize = 100;
/// Page size of `list` and `history_page`.
const PAGE: usize = 50;
/// How long the untimed walk to the middle of the history may take.
const WALK_BUDGET: Duration = Duration::from_secs(8);
/// Timed runs.
const FIRST_PAGE_REPS: usize = 20;
const WALK_REPS: usize = 5;
const FILE_WALK_REPS: usize = 1;
const HISTORY_PAGE_REPS: usize = 10;
const HISTORY_REPS: usize = 5;
const OPEN_REPS: usize = 20;
const OPEN_MESSAGES_REPS: usize = 5;
/// Targets.
const FIRST_PAGE_TARGET_MS: f64 = 5.0;
const WALK_TARGET_MS: f64 = 100.0;
const HISTORY_PAGE_TARGET_MS: f64 = 5.0;
const OPEN_RATIO_TARGET: f64 = 2.0;

fn main() -> BenchResult<()> {
    // `cargo bench` passes `--bench`; this harness has no options of its own.
    let quick = quick();
    let scale = if quick { 10 } else { 1 };
    let (sessions, messages, open_events) =
        (SESSIONS / scale, MESSAGES / scale, OPEN_EVENTS / scale);
    let (base, dir) = common::bench_dir()?;
    let rt = Runtime::new()?;
    let started = Instant::now();
    println!(
        "query bench{}: list over {sessions} sessions, history of {messages} messages, open of \
         {open_events} vs {SMALL_EVENTS} events; files in {}; load average {}",
        if quick { " (BENCH_QUICK)" } else { "" },
        base.display(),
        load_average()
    );
    let mut rows = Vec::new();

    // 1. list, in a root of its own so that it holds exactly `sessions` sessions.
    let list_root = bench_root(&dir.path().join("list"))?;
    let t = Instant::now();
    let ids = create_titled(&list_root, sessions)?;
    println!(
        "created {sessions} titled sessions in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let list_service = Service::new("bench", list_root.clone())?;
    let query = list_service.query();
    let t = Instant::now();
    let (pages, listed) = rt.block_on(walk(&query))?;
    if listed != sessions {
        return Err(format!("the warm-up walk listed {listed} sessions, not {sessions}").into());
    }
    let cold_walk = t.elapsed().as_secs_f64() * 1e3;
    println!("warm-up walk (fills the catalog): {pages} pages in {cold_walk:.0} ms");
    let first = rt.block_on(query.list(None, PAGE))?;
    let listed_titles: Vec<String> = first.sessions.iter().map(|s| s.title.clone()).collect();
    let file_titles = titles_from_files(&list_root, &ids[..PAGE.min(ids.len())])?;
    if listed_titles != file_titles {
        return Err("the first page's titles differ from the files' titles".into());
    }
    let mut first_ms = sample(FIRST_PAGE_REPS, || {
        Ok(black_box(rt.block_on(query.list(None, PAGE))?))
    })?;
    let mut walk_ms = sample(WALK_REPS, || Ok(black_box(rt.block_on(walk(&query))?)))?;
    let first_page_ids = &ids[..PAGE.min(ids.len())];
    let mut file_first_ms = sample(FIRST_PAGE_REPS, || {
        Ok(black_box(titles_from_files(&list_root, first_page_ids)?))
    })?;
    // The warm-up walk has just read every file: no untimed run of this slow one.
    let mut file_walk_ms = sample_after(0, FILE_WALK_REPS, || {
        Ok(black_box(titles_from_files(&list_root, &ids)?))
    })?;
    let (first, walk_med) = (median(&mut first_ms), median(&mut walk_ms));
    let (file_first, file_walk) = (median(&mut file_first_ms), median(&mut file_walk_ms));
    println!(
        "list: first page {}; full walk of {pages} pages {}; from the files: first 50 {}, \
         all {}",
        spread(&first_ms),
        spread(&walk_ms),
        spread(&file_first_ms),
        spread(&file_walk_ms)
    );
    rows.push(Row::faster(
        "list first page (50)",
        first,
        "open 50 files",
        file_first,
        FIRST_PAGE_TARGET_MS,
    ));
    rows.push(Row::faster(
        &format!("list full walk ({})", fmt_count(sessions as f64)),
        walk_med,
        &format!("open {} files", fmt_count(sessions as f64)),
        file_walk,
        WALK_TARGET_MS,
    ));
    rows.push(Row {
        what: "list walk, catalog unfilled".to_owned(),
        value: fmt_ms(cold_walk),
        baseline: format!(
            "open {} files {}",
            fmt_count(sessions as f64),
            fmt_ms(file_walk)
        ),
        ratio: format!("{:.1}x", file_walk / cold_walk),
        target: "(none, 1 run)".to_owned(),
        verdict: "-",
    });

    // 2. history_page on a cold session of `messages` messages.
    let big_root = bench_root(&dir.path().join("big"))?;
    let service = Service::new("bench", big_root.clone())?;
    let query = service.query();
    let history = SessionId::new("history")?;
    let t = Instant::now();
    build_history(&big_root, &history, messages)?;
    println!(
        "built a session of {messages} messages in {:.1} s ({})",
        t.elapsed().as_secs_f64(),
        fmt_mb(file_bytes(&big_root, &history))
    );
    let history_ref = service.session_ref(history.clone());
    let newest = rt.block_on(query.history_page(&history_ref, None, PAGE))?;
    check_page(&newest, messages)?;
    let mut newest_ms = sample(HISTORY_PAGE_REPS, || {
        Ok(black_box(rt.block_on(query.history_page(
            &history_ref,
            None,
            PAGE,
        ))?))
    })?;
    let t = Instant::now();
    let (cursor, end, walked) = rt.block_on(walk_history(
        &query,
        &history_ref,
        messages,
        (PAGE, WALK_BUDGET),
    ))?;
    println!(
        "walk to the middle: {walked} pages of {PAGE} in {:.1} s, {}",
        t.elapsed().as_secs_f64(),
        if end == messages / 2 {
            format!("reached position {end} of {messages}")
        } else {
            format!(
                "STOPPED by its {} s budget at position {end} of {messages}",
                WALK_BUDGET.as_secs()
            )
        }
    );
    let middle = rt.block_on(query.history_page(&history_ref, cursor.as_deref(), PAGE))?;
    check_page(&middle, end)?;
    let mut middle_ms = sample(HISTORY_PAGE_REPS, || {
        Ok(black_box(rt.block_on(query.history_page(
            &history_ref,
            cursor.as_deref(),
            PAGE,
        ))?))
    })?;
    let mut whole_ms = sample(HISTORY_REPS, || {
        let all = rt.block_on(query.history(&history_ref))?;
        if all.len() != messages {
            return Err(format!("history has {} messages, not {messages}", all.len()).into());
        }
        Ok(black_box(all))
    })?;
    let (newest, middle, whole) = (
        median(&mut newest_ms),
        median(&mut middle_ms),
        median(&mut whole_ms),
    );
    println!(
        "history: newest page {}; page ending at {end} {}; whole history {}",
        spread(&newest_ms),
        spread(&middle_ms),
        spread(&whole_ms)
    );
    let whole_label = format!("history ({})", fmt_count(messages as f64));
    rows.push(Row::faster(
        "history_page newest (50)",
        newest,
        &whole_label,
        whole,
        HISTORY_PAGE_TARGET_MS,
    ));
    rows.push(Row::faster(
        &format!("history_page at {end} (50)"),
        middle,
        &whole_label,
        whole,
        HISTORY_PAGE_TARGET_MS,
    ));

    // 3. open + release + close: a long session, the history session, a short session.
    let big = SessionId::new("open-big")?;
    let small = SessionId::new("open-small")?;
    let t = Instant::now();
    build_turns(&big_root, &big, open_events / EVENTS_PER_TURN)?;
    build_turns(&big_root, &small, SMALL_EVENTS / EVENTS_PER_TURN)?;
    println!(
        "built sessions of {open_events} and {SMALL_EVENTS} events in {:.1} s ({}, {})",
        t.elapsed().as_secs_f64(),
        fmt_mb(file_bytes(&big_root, &big)),
        fmt_mb(file_bytes(&big_root, &small))
    );
    let small_ref = service.session_ref(small.clone());
    let big_ref = service.session_ref(big.clone());
    let sequences = || -> session_store::Result<Vec<u64>> {
        [&big, &small, &history]
            .iter()
            .map(|id| big_root.stat(id).map(|s| s.durable_sequence))
            .collect()
    };
    let before = sequences()?;
    let (mut big_ms, mut small_ms) = open_pair(&rt, &service, [&big_ref, &small_ref], OPEN_REPS)?;
    let (mut msgs_ms, mut small2_ms) = open_pair(
        &rt,
        &service,
        [&history_ref, &small_ref],
        OPEN_MESSAGES_REPS,
    )?;
    let after = sequences()?;
    if before != after {
        return Err(format!("open appended to a closed session: {before:?} -> {after:?}").into());
    }
    let (open_big, open_small) = (median(&mut big_ms), median(&mut small_ms));
    let (open_msgs, open_small2) = (median(&mut msgs_ms), median(&mut small2_ms));
    println!(
        "open+release+close, alternating: {open_events} events {} vs {SMALL_EVENTS} events {}; \
         {messages} messages {} vs {SMALL_EVENTS} events {}; no recovery batch appended",
        spread(&big_ms),
        spread(&small_ms),
        spread(&msgs_ms),
        spread(&small2_ms)
    );
    let opened = [
        (
            format!("{} events", fmt_count(open_events as f64)),
            open_big,
            open_small,
        ),
        (
            format!("{} messages", fmt_count(messages as f64)),
            open_msgs,
            open_small2,
        ),
    ];
    for (what, ms, small_ms) in opened {
        rows.push(Row::relative(
            &format!("open {what}"),
            ms,
            &format!("open {SMALL_EVENTS} events"),
            small_ms,
            OPEN_RATIO_TARGET,
        ));
    }

    println!();
    println!(
        "medians in ms; ratio: \"x\" = baseline/value (how much faster), otherwise value/baseline"
    );
    Row::header().print();
    for row in &rows {
        row.print();
    }
    println!(
        "total bench time {:.1} s; load average {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
    Ok(())
}

/// Lists every session in pages of [`PAGE`]; returns the pages and sessions seen.
async fn walk(query: &SessionQuery) -> session_store::Result<(usize, usize)> {
    let (mut pages, mut sessions) = (0, 0);
    let mut cursor: Option<String> = None;
    loop {
        let page = query.list(cursor.as_deref(), PAGE).await?;
        pages += 1;
        sessions += page.sessions.len();
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok((pages, sessions)),
        }
    }
}

/// The baseline lister: every session's title from its own file.
fn titles_from_files(root: &Root, ids: &[SessionId]) -> BenchResult<Vec<String>> {
    ids.iter()
        .map(|id| Ok(root.open_reader(id)?.projection()?.title))
        .collect()
}

/// Creates `id` with `turns` completed turns of [`EVENTS_PER_TURN`] events (one commit
/// each), and closes it.
fn build_turns(root: &Root, id: &SessionId, turns: usize) -> BenchResult<()> {
    let text = filler_text();
    let tools = (EVENTS_PER_TURN - 4) / 2;
    let session = root.create(CreateOptions::with_id(id.clone()))?;
    for turn in 0..turns {
        let turn_id = format!("turn-{turn:05}");
        let mut events = Vec::with_capacity(EVENTS_PER_TURN);
        events.push(Event::new("turn/start"));
        events.push(
            Event::new("message/complete").with_payload_json(&message_json(2 * turn, &text))?,
        );
        for k in 0..tools {
            let tool = json!({"id": format!("{turn_id}-tool-{k:02}"), "name": "read"});
            events.push(Event::new("tool/start").with_payload(&tool)?);
            let mut result = tool;
            result["state"] = json!("completed");
            result["output"] = json!(&text[k % 50..k % 50 + CONTENT_BYTES / 2]);
            events.push(Event::new("tool/result").with_payload(&result)?);
        }
        events.push(
            Event::new("message/complete").with_payload_json(&message_json(2 * turn + 1, &text))?,
        );
        events.push(Event::new("turn/end").with_payload(&json!({"status": "completed"}))?);
        session.append(Batch::new(format!("{turn_id}-op"), events).in_turn(&turn_id))?;
    }
    session.close()?;
    Ok(())
}

/// Checks that a history page holds [`PAGE`] consecutive messages ending at `end`.
fn check_page(page: &session_store::HistoryPage, end: usize) -> BenchResult<()> {
    let positions: Vec<u64> = page.messages.iter().map(|m| m.position).collect();
    let expected: Vec<u64> = (end.saturating_sub(PAGE) + 1..=end)
        .map(|p| p as u64)
        .collect();
    if positions != expected {
        return Err(format!(
            "history page at {end}: positions {:?}..{:?}, expected {:?}..{:?}",
            positions.first(),
            positions.last(),
            expected.first(),
            expected.last()
        )
        .into());
    }
    Ok(())
}

/// Times `Service::open` + `release` + `close` of each session, the two alternating
/// (which goes first flips every round) after one untimed round; times in ms.
fn open_pair(
    rt: &Runtime,
    service: &Service,
    refs: [&SessionRef; 2],
    reps: usize,
) -> BenchResult<(Vec<f64>, Vec<f64>)> {
    let mut times = [Vec::with_capacity(reps), Vec::with_capacity(reps)];
    for round in 0..=reps {
        for k in 0..2 {
            let which = (k + round) % 2;
            let r = refs[which];
            let t = Instant::now();
            rt.block_on(async {
                let binding = service.open(r).await?;
                binding.release().await?;
                service.close(r).await
            })?;
            if round > 0 {
                times[which].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let [a, b] = times;
    Ok((a, b))
}

/// Bytes of a session's `session.sqlite` (and `-wal`, if any).
fn file_bytes(root: &Root, id: &SessionId) -> u64 {
    ["session.sqlite", "session.sqlite-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(root.session_dir(id).join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// One line of the result table.
struct Row {
    what: String,
    value: String,
    baseline: String,
    ratio: String,
    target: String,
    verdict: &'static str,
}

impl Row {
    fn header() -> Row {
        Row {
            what: "measurement".to_owned(),
            value: "value".to_owned(),
            baseline: "baseline".to_owned(),
            ratio: "ratio".to_owned(),
            target: "target".to_owned(),
            verdict: "",
        }
    }

    /// A row whose value has an absolute target, with the baseline's speed-up.
    fn faster(what: &str, ms: f64, baseline: &str, baseline_ms: f64, target_ms: f64) -> Row {
        Row {
            what: what.to_owned(),
            value: fmt_ms(ms),
            baseline: format!("{baseline} {}", fmt_ms(baseline_ms)),
            ratio: format!("{:.1}x", baseline_ms / ms),
            target: format!("<= {target_ms} ms"),
            verdict: verdict(ms <= target_ms),
        }
    }

    /// A row whose target is on value/baseline.
    fn relative(what: &str, ms: f64, baseline: &str, baseline_ms: f64, target: f64) -> Row {
        let ratio = ms / baseline_ms;
        Row {
            what: what.to_owned(),
            value: fmt_ms(ms),
            baseline: format!("{baseline} {}", fmt_ms(baseline_ms)),
            ratio: format!("{ratio:.2}"),
            target: format!("ratio <= {target}"),
            verdict: verdict(ratio <= target),
        }
    }

    fn print(&self) {
        println!(
            "{:<30} {:>11}   {:<30} {:>8}   {:<14} {}",
            self.what, self.value, self.baseline, self.ratio, self.target, self.verdict
        );
    }
}
