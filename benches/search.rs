//! Full-text search (issue 14), in one process and one run:
//!
//! * a root of `SEARCH_SESSIONS` (default 10,000) sessions x `SEARCH_MESSAGES` (default
//!   100) messages, 1M messages, and a root of a tenth of the sessions (100,000 messages).
//!   Message text is drawn from a Zipf-distributed vocabulary of 40,000 made-up words,
//!   8-60 words a message (about 200 bytes on average), user and assistant alternating.
//!   Sessions are built in parallel (`BUILD_THREADS`), each in one batch, without the
//!   index; the first search then creates the index and fills it in one transaction
//!   (timed and printed). `SEARCH_ROOT=DIR` keeps both roots in DIR and reuses them on
//!   the next run when they are complete (a marker file is written once built);
//! * `SessionQuery::search` (first page of 10 with snippets) p50 and p99 over `QUERIES` one-word
//!   and `QUERIES` two-word queries, the words of each taken from one message of a session
//!   both roots hold (so every query has hits), of the vocabulary's ranks 50..20,000 (the
//!   50 most frequent words are left out: each is in thousands of messages).
//!   Targets p50 <= 20 ms, p99 <= 100 ms; baseline: the same queries on the 100,000-message
//!   root, and the ratio 1M/100k p50 (target <= 3x);
//! * (no target) the p50 of `REPEATS` of those queries on the 1M root, each timed when run
//!   again right after itself: its page's sessions are read on the connections kept open
//!   by the first run;
//! * durable append, one message + `flush()` per call (`Durability::PowerLoss`), 1,000 calls
//!   after 300 untimed ones, in a root whose index exists vs one that has none; 3
//!   alternating rounds, median of the per-round ratios (target >= 0.9x);
//! * index bytes (`search.sqlite` after the fill) / indexed text bytes (target <= 0.6x).
//!
//! `BENCH_QUICK=1` shrinks the roots 10x (a smoke run; its figures mean little). Files go
//! under Cargo's target tmp dir (`BENCH_DIR` overrides it) unless `SEARCH_ROOT` is set.
//!
//! Run with `cargo bench --bench search`.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{fmt_count, fmt_mb, load_average, median, quick, verdict};
use serde_json::json;
use session_store::{
    Batch, CreateOptions, Durability, Event, Root, SearchOptions, Service, SessionId, SessionQuery,
    StoreOptions,
};
use tokio::runtime::Runtime;

/// Sessions of the big root, and messages per session (overridable by env).
const SESSIONS: usize = 10_000;
const MESSAGES: usize = 100;
/// Vocabulary size and the Zipf exponent.
const VOCABULARY: usize = 40_000;
const ZIPF_S: f64 = 1.0;
/// Query words come from these frequency ranks.
const QUERY_RANKS: std::ops::Range<usize> = 50..20_000;
/// Timed queries of each kind (after `WARMUP` untimed ones).
const QUERIES: usize = 200;
const WARMUP: usize = 20;
/// Queries timed again right after a first run (kept connections; no target).
const REPEATS: usize = 50;
/// Durable appends timed per round, after untimed ones.
const APPENDS: usize = 1_000;
const APPEND_WARMUP: usize = 300;
const ROUNDS: usize = 3;
/// Targets.
const P50_TARGET_MS: f64 = 20.0;
const P99_TARGET_MS: f64 = 100.0;
const SCALE_TARGET: f64 = 3.0;
const APPEND_TARGET: f64 = 0.9;
const BYTES_TARGET: f64 = 0.6;
/// Marker written in a root once fully built (for `SEARCH_ROOT` reuse).
const BUILT: &str = ".bench-search-built";

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

fn env_usize(name: &str, default: usize) -> BenchResult<usize> {
    match std::env::var(name) {
        Ok(v) => Ok(v
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a count"))?),
        Err(_) => Ok(default),
    }
}

/// A deterministic vocabulary of made-up words and a Zipf sampler over it.
struct Words {
    words: Vec<String>,
    /// Cumulative weights.
    cumulative: Vec<f64>,
}

impl Words {
    fn new() -> Words {
        const SYLLABLES: [&str; 24] = [
            "ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "bra", "cle", "dro", "fen",
            "gal", "hus", "jor", "kin", "lum", "mor", "nix", "pel", "qua", "ris", "tav",
        ];
        let mut rng = fastrand::Rng::with_seed(14);
        let mut seen = std::collections::HashSet::new();
        let mut words = Vec::with_capacity(VOCABULARY);
        while words.len() < VOCABULARY {
            let n = rng.usize(1..5);
            let w: String = (0..n)
                .map(|_| SYLLABLES[rng.usize(..SYLLABLES.len())])
                .collect();
            if seen.insert(w.clone()) {
                words.push(w);
            }
        }
        let mut total = 0.0;
        let cumulative = (1..=VOCABULARY)
            .map(|r| {
                total += 1.0 / (r as f64).powf(ZIPF_S);
                total
            })
            .collect();
        Words { words, cumulative }
    }

    fn sample(&self, rng: &mut fastrand::Rng) -> &str {
        let total = self.cumulative[self.cumulative.len() - 1];
        let x = rng.f64() * total;
        let i = self.cumulative.partition_point(|c| *c < x);
        &self.words[i.min(self.words.len() - 1)]
    }

    fn text(&self, rng: &mut fastrand::Rng) -> String {
        let n = rng.usize(8..60);
        let mut out = String::with_capacity(n * 7);
        for i in 0..n {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(self.sample(rng));
        }
        out
    }
}

fn message(id: &str, role: &str, content: &str) -> BenchResult<Event> {
    Ok(Event::new("message/complete")
        .with_payload(&json!({"message": {"id": id, "role": role, "content": content}}))?)
}

fn build_root(root: &Root, words: &Words, sessions: usize, messages: usize) -> BenchResult<u64> {
    let threads = env_usize("BUILD_THREADS", 4)?.max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let text_bytes = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| -> BenchResult<()> {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<(), String> {
                    loop {
                        let s = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if s >= sessions {
                            return Ok(());
                        }
                        let mut rng = fastrand::Rng::with_seed(s as u64);
                        let id = SessionId::new(format!("s{s:05}")).map_err(|e| e.to_string())?;
                        let session = root
                            .create(
                                CreateOptions::with_id(id).with_cwd(format!("/work/p{}", s % 20)),
                            )
                            .map_err(|e| e.to_string())?;
                        let mut events = Vec::with_capacity(messages);
                        let mut bytes = 0;
                        for m in 0..messages {
                            let text = words.text(&mut rng);
                            bytes += text.len() as u64;
                            let role = if m % 2 == 0 { "user" } else { "assistant" };
                            events.push(
                                message(&format!("s{s}-m{m}"), role, &text)
                                    .map_err(|e| e.to_string())?,
                            );
                        }
                        session
                            .append(Batch::new(format!("build-{s}"), events))
                            .map_err(|e| e.to_string())?;
                        session.close().map_err(|e| e.to_string())?;
                        text_bytes.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "a build thread panicked")??;
        }
        Ok(())
    })?;
    Ok(text_bytes.into_inner())
}

/// Opens (building when needed) a root of `sessions` x `messages`; returns it, the text
/// bytes indexed and the index bytes.
fn prepared_root(
    rt: &Runtime,
    path: &Path,
    words: &Words,
    sessions: usize,
    messages: usize,
) -> BenchResult<(Root, u64, u64)> {
    let options = StoreOptions::default()
        .with_durability(Durability::ProcessCrash)
        .with_write_behind(Duration::from_secs(3600));
    let marker = path.join(BUILT);
    let reused = std::fs::read_to_string(&marker).ok().and_then(|text| {
        let mut parts = text.split_whitespace().map(str::parse::<u64>);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(Ok(s)), Some(Ok(m)), Some(Ok(bytes)))
                if (s, m) == (sessions as u64, messages as u64) =>
            {
                Some(bytes)
            }
            _ => None,
        }
    });
    let (root, text_bytes) = match reused {
        Some(bytes) => {
            println!("reusing {} ({sessions} x {messages})", path.display());
            (Root::with_options(path, options)?, bytes)
        }
        None => {
            if path.exists() {
                std::fs::remove_dir_all(path)?;
            }
            let root = Root::with_options(path, options)?;
            let t = Instant::now();
            let text_bytes = build_root(&root, words, sessions, messages)?;
            println!(
                "built {sessions} sessions x {messages} messages ({} of text) in {:.1} s",
                fmt_mb(text_bytes),
                t.elapsed().as_secs_f64()
            );
            std::fs::write(&marker, format!("{sessions} {messages} {text_bytes}"))?;
            (root, text_bytes)
        }
    };
    if index_bytes(path) == 0 {
        let t = Instant::now();
        let service = Service::new("bench", root.clone())?;
        rt.block_on(service.query().search("warmup", SearchOptions::default()))?;
        println!(
            "created and filled the index ({} messages) in {:.1} s: {}",
            fmt_count((sessions * messages) as f64),
            t.elapsed().as_secs_f64(),
            fmt_mb(index_bytes(path))
        );
    }
    Ok((root, text_bytes, index_bytes(path)))
}

/// `QUERIES + WARMUP` one-word and two-word queries, each made of words of one message
/// of a session both roots hold (sessions below `sessions`, rebuilt from their seeds), so
/// that every query has hits in both; words of the 50 most frequent are left out.
fn queries(words: &Words, sessions: usize, messages: usize) -> (Vec<String>, Vec<String>) {
    let rank: std::collections::HashMap<&str, usize> = words
        .words
        .iter()
        .enumerate()
        .map(|(r, w)| (w.as_str(), r))
        .collect();
    let mut rng = fastrand::Rng::with_seed(2024);
    let mut pick = |n: usize| -> String {
        loop {
            let s = rng.usize(..sessions);
            let m = rng.usize(..messages);
            let mut text_rng = fastrand::Rng::with_seed(s as u64);
            let text = (0..=m)
                .map(|_| words.text(&mut text_rng))
                .last()
                .unwrap_or_default();
            let mut candidates: Vec<&str> = text
                .split(' ')
                .filter(|w| rank.get(w).is_some_and(|r| QUERY_RANKS.contains(r)))
                .collect();
            candidates.sort_unstable();
            candidates.dedup();
            if candidates.len() >= n {
                rng.shuffle(&mut candidates);
                return candidates[..n].join(" ");
            }
        }
    };
    let one = (0..QUERIES + WARMUP).map(|_| pick(1)).collect();
    let two = (0..QUERIES + WARMUP).map(|_| pick(2)).collect();
    (one, two)
}

fn index_bytes(root: &Path) -> u64 {
    ["search.sqlite", "search.sqlite-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(root.join(".catalog").join(f)).ok())
        .map(|m| m.len())
        .sum()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// p50 and p99 (ms) of `queries` on `query`, and the median hit count of a first page.
fn time_queries(
    rt: &Runtime,
    query: &SessionQuery,
    queries: &[String],
) -> BenchResult<(f64, f64, f64)> {
    for q in queries.iter().take(WARMUP) {
        rt.block_on(query.search(q, SearchOptions::default()))?;
    }
    let mut times = Vec::with_capacity(queries.len());
    let mut hits = Vec::with_capacity(queries.len());
    for q in queries {
        let t = Instant::now();
        let page = rt.block_on(query.search(q, SearchOptions::default()))?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        hits.push(page.hits.len() as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok((
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        median(&mut hits),
    ))
}

/// p50 (ms) of `REPEATS` queries each run right after itself: the sessions of its page are
/// then read on the connections the first run left open (and the index's pages cached).
fn time_repeats(rt: &Runtime, query: &SessionQuery, queries: &[String]) -> BenchResult<f64> {
    let mut times = Vec::with_capacity(REPEATS);
    for q in queries.iter().skip(WARMUP).take(REPEATS) {
        rt.block_on(query.search(q, SearchOptions::default()))?;
        let t = Instant::now();
        rt.block_on(query.search(q, SearchOptions::default()))?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(percentile(&times, 0.5))
}

/// Durable appends per second: one message and a flush per call.
fn append_rate(root: &Root, id: &SessionId, words: &Words, round: usize) -> BenchResult<f64> {
    let session = root.open_writer(id)?;
    let mut rng = fastrand::Rng::with_seed(round as u64);
    let mut one = |i: usize| -> BenchResult<()> {
        session.append(Batch::new(
            format!("r{round}-{i}"),
            vec![message(
                &format!("r{round}-m{i}"),
                "user",
                &words.text(&mut rng),
            )?],
        ))?;
        session.flush()?;
        Ok(())
    };
    for i in 0..APPEND_WARMUP {
        one(i)?;
    }
    let t = Instant::now();
    for i in APPEND_WARMUP..APPEND_WARMUP + APPENDS {
        one(i)?;
    }
    let rate = APPENDS as f64 / t.elapsed().as_secs_f64();
    session.close()?;
    Ok(rate)
}

/// One line of the result table: measure, value, baseline, ratio, target, verdict.
type Line = [String; 6];

fn line(
    what: String,
    value: String,
    baseline: String,
    ratio: f64,
    target: String,
    ok: bool,
) -> Line {
    let ratio = format!("{ratio:.2}x");
    [what, value, baseline, ratio, target, verdict(ok).to_owned()]
}

fn main() -> BenchResult<()> {
    let scale = if quick() { 10 } else { 1 };
    let sessions = env_usize("SEARCH_SESSIONS", SESSIONS / scale)?;
    let messages = env_usize("SEARCH_MESSAGES", MESSAGES)?;
    let small_sessions = (sessions / 10).max(1);
    let (_base, tmp) = common::bench_dir()?;
    let dir: PathBuf =
        std::env::var_os("SEARCH_ROOT").map_or_else(|| tmp.path().to_path_buf(), PathBuf::from);
    let rt = Runtime::new()?;
    let started = Instant::now();
    println!(
        "search bench: {sessions} x {messages} messages vs {small_sessions} x {messages}; files in {}; load average {}",
        dir.display(),
        load_average()
    );
    let words = Words::new();
    let (big, big_text, big_index) =
        prepared_root(&rt, &dir.join("big"), &words, sessions, messages)?;
    let (small, _, _) = prepared_root(&rt, &dir.join("small"), &words, small_sessions, messages)?;
    let (one, two) = queries(&words, small_sessions, messages);
    let big_service = Service::new("bench", big.clone())?;
    let small_service = Service::new("bench", small.clone())?;
    let big_label = format!("{} msgs", fmt_count((sessions * messages) as f64));
    let small_label = format!("{} msgs", fmt_count((small_sessions * messages) as f64));
    let mut rows = Vec::new();
    for (label, queries) in [("one-word", &one), ("two-word", &two)] {
        let (p50, p99, hits) = time_queries(&rt, &big_service.query(), queries)?;
        let (s50, s99, s_hits) = time_queries(&rt, &small_service.query(), queries)?;
        let again = time_repeats(&rt, &big_service.query(), queries)?;
        println!(
            "{label}: {big_label} p50 {p50:.2} ms p99 {p99:.2} ms (median {hits} hits on the \
             first page); {small_label} p50 {s50:.2} ms p99 {s99:.2} ms (median {s_hits} hits); \
             {big_label}, a query run again right after itself p50 {again:.2} ms"
        );
        for (p, big_ms, small_ms, target, ok) in [
            (
                "p50",
                p50,
                s50,
                format!("<= {P50_TARGET_MS} ms; ratio <= {SCALE_TARGET}x"),
                p50 <= P50_TARGET_MS && p50 / s50 <= SCALE_TARGET,
            ),
            (
                "p99",
                p99,
                s99,
                format!("<= {P99_TARGET_MS} ms"),
                p99 <= P99_TARGET_MS,
            ),
        ] {
            rows.push(line(
                format!("{label} search {p}"),
                format!("{big_ms:.2} ms"),
                format!("{small_label} {small_ms:.2} ms"),
                big_ms / small_ms,
                target,
                ok,
            ));
        }
    }

    // Durable appends with and without the index, alternating.
    // Fresh roots each run (a reused session would answer the same operation ids as
    // retries, without writing).
    let with = Root::open(tmp.path().join("append-indexed"))?;
    let without = Root::open(tmp.path().join("append-plain"))?;
    let id = SessionId::new("appender")?;
    for root in [&with, &without] {
        root.create(CreateOptions::with_id(id.clone()))?.close()?;
    }
    rt.block_on(
        Service::new("bench", with.clone())?
            .query()
            .search("x", SearchOptions::default()),
    )?;
    let (mut with_rates, mut without_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (w, wo) = if round % 2 == 0 {
            let w = append_rate(&with, &id, &words, round)?;
            (w, append_rate(&without, &id, &words, round)?)
        } else {
            let wo = append_rate(&without, &id, &words, round)?;
            (append_rate(&with, &id, &words, round)?, wo)
        };
        println!("append round {round}: indexed {w:.0}/s, plain {wo:.0}/s");
        with_rates.push(w);
        without_rates.push(wo);
        ratios.push(w / wo);
    }
    let ratio = median(&mut ratios);
    rows.push(line(
        "durable append, index on".to_owned(),
        format!("{:.0}/s", median(&mut with_rates)),
        format!("no index {:.0}/s", median(&mut without_rates)),
        ratio,
        format!(">= {APPEND_TARGET}x"),
        ratio >= APPEND_TARGET,
    ));
    let bytes_ratio = big_index as f64 / big_text as f64;
    rows.push(line(
        "index bytes / text bytes".to_owned(),
        fmt_mb(big_index),
        format!("text {}", fmt_mb(big_text)),
        bytes_ratio,
        format!("<= {BYTES_TARGET}x"),
        bytes_ratio <= BYTES_TARGET,
    ));

    println!();
    println!(
        "{:<28} {:>12} {:>22} {:>8} {:>28} verdict",
        "measure", "value", "baseline (same run)", "ratio", "target"
    );
    for [what, value, baseline, ratio, target, verdict] in &rows {
        println!("{what:<28} {value:>12} {baseline:>22} {ratio:>8} {target:>28} {verdict}");
    }
    println!("total {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
