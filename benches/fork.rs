//! Fork cost, file copy and export, in one process and one run:
//!
//! * a big parent of 100,000 events (1,000 turns of 100 events: `turn/start`, a ~400-byte
//!   user `message/complete`, 97 optional `bench/filler` events with JSON payloads sized so
//!   that the file is at least 50 MB, `turn/end`) and a small parent of 10 events (one
//!   turn), both built with a long write-behind at `Durability::ProcessCrash`, flushed
//!   once at the end and closed;
//! * `Root::fork` after the last turn of each parent, repeated with fresh child ids (the
//!   two parents alternate), median ms each and the ratio big/small (target <= 1.5: a
//!   fork copies nothing, so its cost must not grow with the parent). Measured twice: on
//!   the parents as `close` left them (with whatever `-wal` it left beside the file), and
//!   after that `-wal` was checkpointed into the file and removed (plain SQLite);
//! * between the two, a plain `std::fs::copy` of the big parent's `session.sqlite` (no
//!   `-wal` beside it) plus an fsync of the copy, median ms, and the ratio copy/fork
//!   (target >= 10);
//! * `Root::export` of the big parent: MB/s (bytes of the exported file, MB = 10^6 bytes)
//!   and events/s, with the plain copy's MB/s as the baseline.
//!
//! `BENCH_QUICK=1` shrinks the parent 10x (a smoke run; the 50 MB floor is then not
//! checked). Files go under Cargo's target tmp dir (`BENCH_DIR` overrides it).
//!
//! Run with `cargo bench --bench fork`.

mod common;
use common::{fmt_count, fmt_mb, load_average, median, quick, verdict};

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use session_store::{
    Batch, CreateOptions, Durability, Event, ForkPoint, Root, SessionId, StoreOptions,
};

/// Events per turn of the big parent.
const EVENTS_PER_TURN: usize = 100;
/// Turns of the big parent in a full run (a quick run has a tenth).
const TURNS: usize = 1_000;
/// Approximate bytes of a user message's content.
const MESSAGE_BYTES: usize = 400;
/// Approximate bytes of a filler event's JSON payload: eight event rows to a 4 KiB page,
/// about 50.6 MB for 100,000 events (the file size moves in steps of rows per page).
const FILLER_BYTES: usize = 480;
/// Events of the small parent (one turn).
const SMALL_EVENTS: usize = 10;
/// Timed forks per parent (after the warm-up ones).
const FORK_REPS: usize = 30;
/// Untimed forks per parent first.
const FORK_WARMUP: usize = 2;
/// Timed file copies.
const COPY_REPS: usize = 5;
/// Smallest big-parent file of a full run.
const MIN_FILE_BYTES: u64 = 50_000_000;
/// Target of median fork(big) / median fork(small).
const FORK_RATIO_TARGET: f64 = 1.5;
/// Target of median copy / median fork(big).
const COPY_RATIO_TARGET: f64 = 10.0;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> BenchResult<()> {
    // `cargo bench` passes `--bench`; this harness has no options of its own.
    let quick = quick();
    let turns = if quick { TURNS / 10 } else { TURNS };
    let (base, dir) = common::bench_dir()?;
    let root = Root::with_options(
        dir.path().join("sessions"),
        StoreOptions::default()
            .with_durability(Durability::ProcessCrash)
            .with_write_behind(Duration::from_secs(3600)),
    )?;
    let started = Instant::now();
    println!(
        "fork bench{}: big parent {} events ({turns} turns x {EVENTS_PER_TURN}), small parent \
         {SMALL_EVENTS} events, files in {}; load average {}",
        if quick { " (BENCH_QUICK)" } else { "" },
        turns * EVENTS_PER_TURN,
        base.display(),
        load_average()
    );

    // 1. The parents.
    let big = SessionId::new("parent-big")?;
    let small = SessionId::new("parent-small")?;
    let t = Instant::now();
    let big_last = build(&root, &big, turns, EVENTS_PER_TURN)?;
    let build_secs = t.elapsed().as_secs_f64();
    let small_last = build(&root, &small, 1, SMALL_EVENTS)?;
    let big_file = root.session_dir(&big).join("session.sqlite");
    let closed_bytes = std::fs::metadata(&big_file)?.len();
    let big_events = root.stat(&big)?.durable_sequence;
    let small_events = root.stat(&small)?.durable_sequence;
    println!(
        "built big parent in {build_secs:.1} s: {big_events} events, session.sqlite {}; \
         small parent {small_events} events",
        fmt_mb(closed_bytes)
    );
    let small_file = root.session_dir(&small).join("session.sqlite");
    let (big_wal, small_wal) = (wal_bytes(&big_file), wal_bytes(&small_file));
    println!(
        "after close + drop: big parent -wal {}, small parent -wal {}",
        fmt_wal(big_wal),
        fmt_wal(small_wal)
    );

    // 2a. Forks on the parents as `close` left them.
    let parents = [
        (&big, &big_last, big_events),
        (&small, &small_last, small_events),
    ];
    let (mut big_closed, mut small_closed) = forks(&root, &parents, "closed")?;

    // 3. A plain copy + fsync of the big file, with no -wal beside it: when `close` left
    // one, check it into the main file first (plain SQLite, outside the library).
    for file in [&big_file, &small_file] {
        checkpoint_away(file)?;
    }
    let big_bytes = std::fs::metadata(&big_file)?.len();
    println!(
        "big parent session.sqlite with no -wal: {} ({big_bytes} bytes)",
        fmt_mb(big_bytes)
    );
    if !quick && big_bytes < MIN_FILE_BYTES {
        println!(
            "WARNING: big parent file {} is below the {} floor; raise FILLER_BYTES",
            fmt_mb(big_bytes),
            fmt_mb(MIN_FILE_BYTES)
        );
    }
    let copies = dir.path().join("copies");
    std::fs::create_dir_all(&copies)?;
    let mut copy_ms = Vec::with_capacity(COPY_REPS);
    for i in 0..=COPY_REPS {
        let dest = copies.join(format!("copy-{i}.sqlite"));
        let t = Instant::now();
        std::fs::copy(&big_file, &dest)?;
        File::open(&dest)?.sync_all()?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        std::fs::remove_file(&dest)?;
        if i > 0 {
            copy_ms.push(ms); // copy 0 warms the page cache
        }
    }

    // 2b. Forks again, now that the parents have no -wal.
    let (mut big_clean, mut small_clean) = forks(&root, &parents, "clean")?;
    println!(
        "after the forks: big parent -wal {}, small parent -wal {}",
        fmt_wal(wal_bytes(&big_file)),
        fmt_wal(wal_bytes(&small_file))
    );

    // 4. Export of the big parent.
    let dest = dir.path().join("export-big.sqlite");
    let t = Instant::now();
    let report = root.export(&big, &dest)?;
    let export_secs = t.elapsed().as_secs_f64();
    let export_bytes = std::fs::metadata(&dest)?.len();

    let copy = median(&mut copy_ms); // sorts copy_ms
    let copy_mb_s = big_bytes as f64 / 1e6 / (copy / 1e3);
    let export_mb_s = export_bytes as f64 / 1e6 / export_secs;
    let export_ev_s = report.events as f64 / export_secs;

    println!();
    let phases = [
        ("as closed", &mut big_closed, &mut small_closed),
        ("no -wal", &mut big_clean, &mut small_clean),
    ];
    let mut rows = Vec::new();
    let mut fork_medians = Vec::new();
    for (phase, big_ms, small_ms) in phases {
        let (fork_big, fork_small) = (median(big_ms), median(small_ms));
        println!(
            "fork, parents {phase}: {FORK_REPS} timed forks per parent (after {FORK_WARMUP} \
             untimed), min/max big {:.2}/{:.2} ms, small {:.2}/{:.2} ms; on the minima \
             big/small {:.2}, copy/fork big {:.1}x",
            big_ms[0],
            big_ms[big_ms.len() - 1],
            small_ms[0],
            small_ms[small_ms.len() - 1],
            big_ms[0] / small_ms[0],
            copy_ms[0] / big_ms[0]
        );
        let ratio = fork_big / fork_small;
        rows.push(Row {
            what: format!("fork big, {phase}"),
            value: format!("{fork_big:.2} ms"),
            baseline: format!("fork small {fork_small:.2} ms"),
            ratio: format!("{ratio:.2}"),
            target: format!("big/small <= {FORK_RATIO_TARGET}"),
            verdict: verdict(ratio <= FORK_RATIO_TARGET),
        });
        fork_medians.push((phase, fork_big));
    }
    for (phase, fork_big) in fork_medians {
        let ratio = copy / fork_big;
        rows.push(Row {
            what: format!("copy+fsync {}", fmt_mb(big_bytes)),
            value: format!("{copy:.1} ms"),
            baseline: format!("fork big, {phase} {fork_big:.2} ms"),
            ratio: format!("{ratio:.1}x"),
            target: format!("copy/fork >= {COPY_RATIO_TARGET}x"),
            verdict: verdict(ratio >= COPY_RATIO_TARGET),
        });
    }
    rows.push(Row {
        what: "export big".to_owned(),
        value: format!("{export_mb_s:.1} MB/s"),
        baseline: format!("copy+fsync {copy_mb_s:.1} MB/s"),
        ratio: format!("{:.2}", export_mb_s / copy_mb_s),
        target: "(none)".to_owned(),
        verdict: "-",
    });
    rows.push(Row {
        what: "export big".to_owned(),
        value: format!("{} ev/s", fmt_count(export_ev_s)),
        baseline: "-".to_owned(),
        ratio: "-".to_owned(),
        target: "(none)".to_owned(),
        verdict: "-",
    });
    println!(
        "copy: {COPY_REPS} timed copies (after 1 untimed), min/max {:.1}/{:.1} ms",
        copy_ms[0],
        copy_ms[copy_ms.len() - 1]
    );
    println!(
        "export: {} commits, {} events, {} bytes reported, {} on disk, {:.0} ms",
        report.commits,
        report.events,
        report.bytes,
        fmt_mb(export_bytes),
        export_secs * 1e3
    );
    println!(
        "medians; parents: big {big_events} events in {}, small {small_events} events",
        fmt_mb(big_bytes)
    );
    println!();
    Row {
        what: "measurement".to_owned(),
        value: "value".to_owned(),
        baseline: "baseline".to_owned(),
        ratio: "ratio".to_owned(),
        target: "target".to_owned(),
        verdict: "",
    }
    .print();
    for row in &rows {
        row.print();
    }
    if !quick {
        println!(
            "big parent file {} (floor {}): {}",
            fmt_mb(big_bytes),
            fmt_mb(MIN_FILE_BYTES),
            verdict(big_bytes >= MIN_FILE_BYTES)
        );
    }
    println!(
        "total bench time {:.1} s; load average {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
    Ok(())
}

/// Times forks after the last turn of each parent, the two alternating (which goes first
/// flips every round); returns the times in ms of the big and of the small parent, the
/// warm-up rounds left out. The first round checks that each child inherits its whole
/// parent (not timed).
fn forks(
    root: &Root,
    parents: &[(&SessionId, &String, u64); 2],
    tag: &str,
) -> BenchResult<(Vec<f64>, Vec<f64>)> {
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..FORK_WARMUP + FORK_REPS {
        for k in 0..2 {
            let which = (k + round) % 2;
            let (parent, last, events) = parents[which];
            let child = SessionId::new(format!("{parent}-{tag}-{round:03}"))?;
            let t = Instant::now();
            let made = root.fork(parent, ForkPoint::AfterTurn(last.clone()), Some(child))?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if round == 0 {
                let inherited = root.stat(&made)?.inherited_events;
                if inherited != events {
                    return Err(format!("{made} inherits {inherited} events, not {events}").into());
                }
            }
            if round >= FORK_WARMUP {
                times[which].push(ms);
            }
        }
    }
    let [big, small] = times;
    Ok((big, small))
}

/// Size of the `-wal` beside `file`, if there is one.
fn wal_bytes(file: &Path) -> Option<u64> {
    std::fs::metadata(format!("{}-wal", file.display()))
        .ok()
        .map(|m| m.len())
}

fn fmt_wal(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "none".to_owned(), |b| format!("{b} bytes"))
}

/// Checkpoints a closed session file's `-wal` into it and removes the `-wal` (plain
/// SQLite: the last connection to close deletes it). Fails if a `-wal` is still there.
fn checkpoint_away(file: &Path) -> BenchResult<()> {
    if wal_bytes(file).is_none() {
        return Ok(());
    }
    let conn = rusqlite::Connection::open(file)?;
    let (busy, _, _): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    conn.close().map_err(|(_, e)| e)?;
    if busy != 0 || wal_bytes(file).is_some() {
        return Err(format!("{} still has a -wal", file.display()).into());
    }
    Ok(())
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
    fn print(&self) {
        println!(
            "{:<30} {:>14}   {:<32} {:>7}   {:<20} {}",
            self.what, self.value, self.baseline, self.ratio, self.target, self.verdict
        );
    }
}

/// Creates `id` with `turns` completed turns of `per_turn` events each (one commit per
/// turn), flushes and closes it. Returns the last turn's id.
fn build(root: &Root, id: &SessionId, turns: usize, per_turn: usize) -> BenchResult<String> {
    let fillers = per_turn.saturating_sub(3);
    let text = "the quick brown fox jumps over the lazy dog 0123456789 "
        .repeat(MESSAGE_BYTES.max(FILLER_BYTES) / 55 + 2);
    let session = root.create(CreateOptions::with_id(id.clone()))?;
    let mut last = String::new();
    for turn in 0..turns {
        let turn_id = format!("turn-{turn:05}");
        let shift = turn % 50;
        let mut events = Vec::with_capacity(per_turn);
        events.push(Event::new("turn/start"));
        events.push(Event::new("message/complete").with_payload(&json!({
            "message": {
                "id": format!("{id}-msg-{turn:05}"),
                "role": "user",
                "content": &text[shift..shift + MESSAGE_BYTES],
            }
        }))?);
        for f in 0..fillers {
            // `{"turn":…,"index":…,"data":"…"}` around FILLER_BYTES long.
            let room = FILLER_BYTES.saturating_sub(40);
            let at = (shift + f) % 50;
            events.push(Event::new("bench/filler").optional().with_payload(&json!({
                "turn": turn,
                "index": f,
                "data": &text[at..at + room],
            }))?);
        }
        events.push(Event::new("turn/end").with_payload(&json!({"status": "completed"}))?);
        session.append(Batch::new(format!("{turn_id}-op"), events).in_turn(&turn_id))?;
        last = turn_id;
    }
    session.flush()?;
    session.close()?;
    Ok(last)
}
