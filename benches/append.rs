//! Append throughput, in one process and one run:
//!
//! * (a) durable: one session at `Durability::PowerLoss` (synchronous=FULL), 64-event
//!   commits of ~400-byte `message/complete` payloads, `flush()` after every append, so
//!   each commit is its own fsynced transaction;
//! * (b) raw: plain SQLite (`session_store::baseline`), `events(seq INTEGER PRIMARY KEY, payload TEXT)` in a WAL
//!   file at synchronous=FULL, one `BEGIN IMMEDIATE` transaction per 64 rows;
//! * (c) accepted: appends on one session with a long write-behind and no flush in the
//!   loop (the final flush is not timed).
//!
//! The fsync rate of a machine drifts, so (a) and (b) run interleaved in several rounds
//! (their order alternates) and the medians are reported; the ratio is the median of the
//! per-round ratios. `BENCH_EVENTS` sets the events per measurement (default 96,000),
//! `BENCH_ROUNDS` the rounds (default 3). Files go to a temp dir under `BENCH_DIR`, else
//! under Cargo's target tmp dir (on disk, not tmpfs, so fsync is real).
//!
//! Run with `cargo bench --bench append`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::workload::{Flushed, batch, bench_session, flushed_commits, payloads};
use common::{fmt_count, median, verdict};
use session_store::baseline::raw_rate;
use session_store::{Durability, StoreOptions};

/// Events per commit (and rows per raw transaction).
const EVENTS_PER_COMMIT: usize = 64;
/// Target of ours/raw for durable appends.
const RATIO_TARGET: f64 = 0.8;
/// Target of the accepted (in-memory) rate, events per second.
const ACCEPTED_TARGET: f64 = 100_000.0;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> BenchResult<()> {
    // `cargo bench` passes `--bench`; this harness has no options of its own.
    let events = env_usize("BENCH_EVENTS", EVENTS_PER_COMMIT * 1500)?.max(EVENTS_PER_COMMIT);
    let events = events / EVENTS_PER_COMMIT * EVENTS_PER_COMMIT;
    let rounds = env_usize("BENCH_ROUNDS", 3)?.max(1);
    let (base, dir) = common::bench_dir()?;
    let payloads = payloads(events);
    let started = Instant::now();

    println!(
        "append bench: {events} events per measurement, {EVENTS_PER_COMMIT} events/commit, \
         {}-byte payloads, {rounds} rounds, files in {}",
        payloads[0].len(),
        base.display()
    );
    // Warm-up (page cache, allocator, writer threads); not reported.
    let warm = &payloads[..payloads.len().min(EVENTS_PER_COMMIT * 20)];
    durable(&dir.path().join("warm-ours"), warm)?;
    raw(&dir.path().join("warm-raw.sqlite"), warm)?;

    let (mut ours, mut base_rates, mut ratios, mut accepted_rates, mut shares) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut grouped_rates, mut grouped_ratios) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let ours_dir = dir.path().join(format!("ours-{round}"));
        let raw_file = dir.path().join(format!("raw-{round}.sqlite"));
        let (a, b) = if round % 2 == 0 {
            let a = durable(&ours_dir, &payloads)?;
            (a, raw(&raw_file, &payloads)?)
        } else {
            let b = raw(&raw_file, &payloads)?;
            (durable(&ours_dir, &payloads)?, b)
        };
        let c = accepted(&dir.path().join(format!("accepted-{round}")), &payloads)?;
        let d = grouped(&dir.path().join(format!("grouped-{round}")), &payloads)?;
        grouped_rates.push(d);
        grouped_ratios.push(d / b);
        println!(
            "round {}: ours {:>9} events/s ({:.0}% in append)   raw {:>9} events/s   \
             ratio {:.2}   accepted {:>10} events/s   group commit {:>9} events/s ({:.2}x raw)",
            round + 1,
            fmt_count(a.rate),
            a.append_share * 100.0,
            fmt_count(b),
            a.rate / b,
            fmt_count(c),
            fmt_count(d),
            d / b
        );
        ours.push(a.rate);
        shares.push(a.append_share);
        base_rates.push(b);
        ratios.push(a.rate / b);
        accepted_rates.push(c);
    }

    let (a, b, ratio, c) = (
        median(&mut ours),
        median(&mut base_rates),
        median(&mut ratios),
        median(&mut accepted_rates),
    );
    println!(
        "(a) durable, ours (PowerLoss, flush per commit): median {:>10} events/s ({:.0} commits/s, \
         {:.0}% of the time in append)",
        fmt_count(a),
        a / EVENTS_PER_COMMIT as f64,
        median(&mut shares) * 100.0
    );
    println!(
        "(b) raw SQLite (WAL, FULL, txn per 64 rows):    median {:>10} events/s ({:.0} commits/s)",
        fmt_count(b),
        b / EVENTS_PER_COMMIT as f64
    );
    println!(
        "ratio ours/raw (median of rounds): {ratio:.2}   target >= {RATIO_TARGET:.2}   {}",
        verdict(ratio >= RATIO_TARGET)
    );
    println!(
        "(c) accepted, in memory (no flush in loop):     median {:>10} events/s   target >= {}   {}",
        fmt_count(c),
        fmt_count(ACCEPTED_TARGET),
        verdict(c >= ACCEPTED_TARGET)
    );
    let (d, d_ratio) = (median(&mut grouped_rates), median(&mut grouped_ratios));
    println!(
        "(d) durable, ours with group commit (write-behind, flush at end): median {:>10} events/s, \
         {d_ratio:.2}x raw   {}",
        fmt_count(d),
        verdict(d_ratio >= RATIO_TARGET)
    );
    println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Reads a positive count from the environment, or `default`.
fn env_usize(name: &str, default: usize) -> BenchResult<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .replace('_', "")
            .parse()
            .map_err(|e| format!("{name}={v:?}: {e}").into()),
        Err(std::env::VarError::NotPresent) => Ok(default),
        Err(e) => Err(e.into()),
    }
}

/// (a): append + flush per commit.
fn durable(dir: &Path, payloads: &[String]) -> BenchResult<Flushed> {
    let options = StoreOptions::default().with_durability(Durability::PowerLoss);
    Ok(flushed_commits(
        dir,
        payloads,
        EVENTS_PER_COMMIT,
        0,
        options,
    )?)
}

/// (b): raw SQLite, one `BEGIN IMMEDIATE` transaction per commit; events per second.
fn raw(file: &Path, payloads: &[String]) -> BenchResult<f64> {
    Ok(raw_rate(
        file,
        payloads,
        EVENTS_PER_COMMIT,
        Durability::PowerLoss,
        0,
    )?)
}

/// (c): appends with a long write-behind and a budget that never blocks; events per second
/// accepted. The final flush is not timed.
fn accepted(dir: &Path, payloads: &[String]) -> BenchResult<f64> {
    let s = bench_session(
        dir,
        StoreOptions::default()
            .with_write_behind(Duration::from_secs(3600))
            .with_queue_budget(1 << 30),
    )?;
    let t = Instant::now();
    for (op, chunk) in payloads.chunks(EVENTS_PER_COMMIT).enumerate() {
        s.append(batch(op, chunk)?)?;
    }
    let rate = payloads.len() as f64 / t.elapsed().as_secs_f64();
    s.flush()?;
    s.close()?;
    Ok(rate)
}

/// (d): durable with group commit: default write-behind (200 ms), no flush in the loop,
/// timed until the final `flush()` returns (every event durable); events per second.
fn grouped(dir: &Path, payloads: &[String]) -> BenchResult<f64> {
    let s = bench_session(dir, StoreOptions::default())?;
    let t = Instant::now();
    for (op, chunk) in payloads.chunks(EVENTS_PER_COMMIT).enumerate() {
        s.append(batch(op, chunk)?)?;
    }
    s.flush()?;
    let rate = payloads.len() as f64 / t.elapsed().as_secs_f64();
    s.close()?;
    Ok(rate)
}
