//! The session browser (`session-store serve`, issue 16) on a big root, in one run: a root
//! of 10,000 titled sessions and one cold session of 100,000 messages (built with the
//! `query` bench's helpers, `common::roots`), served by the real binary on a loopback port.
//!
//! For each page: the server's own time (its `Server-Timing: app;dur=` header: routing,
//! the library calls, rendering; median of 20 after one untimed request) and the client's
//! wall time (connection and transfer included), against the same-run baseline of the
//! library call the page is built on, made in this process on the same root:
//!
//! * the sessions page `/` and `/api/sessions`: `SessionQuery::list_with` of 50, most
//!   recently updated first, `cached_only` (what the server's pages use between its
//!   background refreshes; the page adds each row's file size and writer check). The
//!   refreshing call (a `stat` of every session: the server's first page, and its
//!   background refresh at most every 2 s) is printed too;
//! * the root's storage page `/stats` and `/api/stats`: `Root::catalog_totals` (one
//!   aggregate query on the catalog);
//! * the transcript page `/sessions/history` and `/api/sessions/history/history`, newest
//!   page and a page in the middle (its cursor found by a library walk, untimed):
//!   `SessionQuery::history_page` of 50 (the page adds the header, the catalog entry, the
//!   turns of the page and the rendering).
//!
//! Target: <= 50 ms of server time per page. `BENCH_QUICK=1` shrinks the sizes 10x.
//! Run with `cargo bench --bench serve`.

mod common;
#[path = "../tests/serve_support/mod.rs"]
mod serve_support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::roots::{
    BenchResult, bench_root, build_history, create_titled, fmt_ms, sample, spread, walk_history,
};
use common::{fmt_count, load_average, median, quick, verdict};
use serve_support::Server;
use session_store::{ListFilter, ListSort, Service, SessionId};
use tokio::runtime::Runtime;

/// Sessions of the root in a full run.
const SESSIONS: usize = 10_000;
/// Messages of the big session in a full run.
const MESSAGES: usize = 100_000;
/// Page size of the pages and of the baselines.
const PAGE: usize = 50;
/// Timed requests per page (after one untimed).
const REPS: usize = 20;
/// Server time a page may take.
const TARGET_MS: f64 = 50.0;
/// The walk to the middle of the history: page size and time budget.
const WALK: (usize, Duration) = (500, Duration::from_secs(20));

/// Server and client times of `reps` requests of `path` after one untimed request.
fn requests(server: &Server, path: &str) -> BenchResult<(Vec<f64>, Vec<f64>)> {
    let (mut served, mut wall) = (Vec::with_capacity(REPS), Vec::with_capacity(REPS));
    for round in 0..=REPS {
        let t = Instant::now();
        let reply = server.get(path);
        let elapsed = t.elapsed().as_secs_f64() * 1e3;
        if reply.status != 200 {
            return Err(format!("GET {path}: {} {}", reply.status, reply.body).into());
        }
        let dur = reply
            .header("server-timing")
            .and_then(|t| t.strip_prefix("app;dur="))
            .and_then(|d| d.parse::<f64>().ok())
            .ok_or_else(|| format!("GET {path}: no Server-Timing"))?;
        if round > 0 {
            served.push(dur);
            wall.push(elapsed);
        }
    }
    Ok((served, wall))
}

fn main() -> BenchResult<()> {
    let scale = if quick() { 10 } else { 1 };
    let (sessions, messages) = (SESSIONS / scale, MESSAGES / scale);
    let (base, dir) = common::bench_dir()?;
    let rt = Runtime::new()?;
    let started = Instant::now();
    println!(
        "serve bench{}: {} sessions and one of {} messages; files in {}; load average {}",
        if scale > 1 { " (BENCH_QUICK)" } else { "" },
        fmt_count(sessions as f64),
        fmt_count(messages as f64),
        base.display(),
        load_average()
    );
    let path = dir.path().join("root");
    let root = bench_root(&path)?;
    let t = Instant::now();
    create_titled(&root, sessions)?;
    let history = SessionId::new("history")?;
    build_history(&root, &history, messages)?;
    println!("built the root in {:.1} s", t.elapsed().as_secs_f64());

    // Baselines: the library calls the pages are built on, in this process.
    let service = Service::new("local", root.clone())?;
    let query = service.query();
    let newest_first = || ListFilter::default().with_sort(ListSort::Updated);
    let mut refreshing_ms = sample(REPS, || {
        Ok(black_box(rt.block_on(query.list_with(
            &newest_first(),
            None,
            PAGE,
        ))?))
    })?;
    let mut list_ms = sample(REPS, || {
        Ok(black_box(rt.block_on(query.list_with(
            &newest_first().cached_only(),
            None,
            PAGE,
        ))?))
    })?;
    let history_ref = service.session_ref(history.clone());
    let mut newest_ms = sample(REPS, || {
        Ok(black_box(rt.block_on(query.history_page(
            &history_ref,
            None,
            PAGE,
        ))?))
    })?;
    let (cursor, end, _) = rt.block_on(walk_history(&query, &history_ref, messages, WALK))?;
    let cursor = cursor.ok_or("the walk found no middle page")?;
    let mut middle_ms = sample(REPS, || {
        Ok(black_box(rt.block_on(query.history_page(
            &history_ref,
            Some(&cursor),
            PAGE,
        ))?))
    })?;
    let mut totals_ms = sample(REPS, || Ok(black_box(root.catalog_totals()?)))?;
    let totals = median(&mut totals_ms);
    println!(
        "library: catalog_totals {} (median {})",
        spread(&totals_ms),
        fmt_ms(totals)
    );
    let (refreshing, list, newest, middle) = (
        median(&mut refreshing_ms),
        median(&mut list_ms),
        median(&mut newest_ms),
        median(&mut middle_ms),
    );
    println!(
        "library: list_with refreshing {} (median {}); cached_only {}; history_page newest {}; \
         at {end} {}",
        spread(&refreshing_ms),
        fmt_ms(refreshing),
        spread(&list_ms),
        spread(&newest_ms),
        spread(&middle_ms)
    );

    let server = Server::start(&path, &[]);
    let at_middle = format!("?cursor={cursor}");
    let pages = [
        ("sessions page /", "/".to_owned(), list, "list_with cached"),
        (
            "API /api/sessions",
            "/api/sessions".to_owned(),
            list,
            "list_with cached",
        ),
        (
            "root storage page /stats",
            "/stats".to_owned(),
            totals,
            "catalog_totals",
        ),
        (
            "API /api/stats",
            "/api/stats".to_owned(),
            totals,
            "catalog_totals",
        ),
        (
            "transcript page, newest",
            "/sessions/history".to_owned(),
            newest,
            "history_page",
        ),
        (
            "transcript page, middle",
            format!("/sessions/history{at_middle}"),
            middle,
            "history_page",
        ),
        (
            "API history, middle",
            format!("/api/sessions/history/history{at_middle}"),
            middle,
            "history_page",
        ),
    ];
    println!();
    println!("medians of {REPS} requests; ratio = server time / library call");
    println!(
        "{:<26} {:>12} {:>12}   {:<24} {:>7}   {:<10}",
        "page", "server", "client", "baseline (library)", "ratio", "target"
    );
    for (what, path, baseline, call) in pages {
        let (mut served, mut wall) = requests(&server, &path)?;
        let (served, wall) = (median(&mut served), median(&mut wall));
        println!(
            "{what:<26} {:>12} {:>12}   {:<24} {:>7.2}   <= {TARGET_MS} ms {}",
            fmt_ms(served),
            fmt_ms(wall),
            format!("{call} {}", fmt_ms(baseline)),
            served / baseline,
            verdict(served <= TARGET_MS)
        );
    }
    println!(
        "total bench time {:.1} s; load average {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
    Ok(())
}
