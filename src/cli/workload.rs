//! The benchmark workload and the durable-commit measurement, shared by `session-store
//! bench` and `benches/` (which include this file with `#[path]`: a bench cannot import
//! the binary's modules, and this is not library API). Std and the library's public API
//! only; the raw-SQLite baseline is the library's `session_store::baseline`.

use std::path::Path;
use std::time::{Duration, Instant};

use session_store::{Batch, CreateOptions, Event, Root, Session, SessionId, StoreOptions};

/// Approximate payload size in bytes.
pub const PAYLOAD_BYTES: usize = 400;

/// `n` distinct `message/complete` payloads of about [`PAYLOAD_BYTES`] bytes each.
pub fn payloads(n: usize) -> Vec<String> {
    let filler = "lorem ipsum dolor sit amet ".repeat(PAYLOAD_BYTES / 27 + 1);
    (0..n)
        .map(|i| {
            let head = format!(r#"{{"message":{{"id":"m{i:08}","role":"assistant","content":""#);
            let room = PAYLOAD_BYTES.saturating_sub(head.len() + 3);
            format!("{head}{}\"}}}}", &filler[..room])
        })
        .collect()
}

/// A count rounded to an integer, with thousands separators: `1234567.8` → `1,234,568`.
pub fn fmt_count(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The median of `v` (sorted in place, total order on floats); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The 1-minute load average, when `/proc/loadavg` can be read (other work on the machine
/// skews fsync-bound timings).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// One commit of `message/complete` events with these payloads, operation id `op-{op}`.
///
/// # Errors
/// When a payload is not JSON.
pub fn batch(op: usize, payloads: &[String]) -> session_store::Result<Batch> {
    let events = payloads
        .iter()
        .map(|p| Event::new("message/complete").with_payload_json(p))
        .collect::<session_store::Result<Vec<_>>>()?;
    Ok(Batch::new(format!("op-{op}"), events))
}

/// A fresh root in `dir` holding one new session, `bench`.
///
/// # Errors
/// When the root or the session cannot be created.
pub fn bench_session(dir: &Path, options: StoreOptions) -> session_store::Result<Session> {
    let root = Root::with_options(dir, options)?;
    root.create(CreateOptions::with_id(SessionId::new("bench")?))
}

/// What [`flushed_commits`] measured.
#[derive(Clone, Copy, Debug)]
pub struct Flushed {
    /// Events per second.
    pub rate: f64,
    /// Share of the time spent in `append` (the rest is `flush`).
    pub append_share: f64,
}

/// Appends `payloads` to a new session in `dir` (root options `options`) in commits of
/// `per_commit` events with a `flush()` after each, so every commit is its own durable
/// transaction. The session's creation, its first `untimed` payloads and its close are not
/// timed: a warm-up of the same file, so that its WAL has wrapped once (a WAL that still
/// grows makes every fsync also commit the file's new size, about twice the cost of one
/// that rewrites its blocks; a writer of fewer pages per commit grows it for longer).
///
/// # Errors
/// Storage errors.
pub fn flushed_commits(
    dir: &Path,
    payloads: &[String],
    per_commit: usize,
    untimed: usize,
    options: StoreOptions,
) -> session_store::Result<Flushed> {
    let s = bench_session(dir, options)?;
    let per_commit = per_commit.max(1);
    let warm_commits = untimed.min(payloads.len()).div_ceil(per_commit);
    let (mut in_append, mut elapsed) = (Duration::ZERO, Duration::ZERO);
    for (op, chunk) in payloads.chunks(per_commit).enumerate() {
        let t = Instant::now();
        s.append(batch(op, chunk)?)?;
        let appended = t.elapsed();
        s.flush()?;
        if op >= warm_commits {
            in_append += appended;
            elapsed += t.elapsed();
        }
    }
    s.close()?;
    let timed = payloads.len().saturating_sub(warm_commits * per_commit);
    let seconds = elapsed.as_secs_f64().max(1e-9);
    Ok(Flushed {
        rate: timed as f64 / seconds,
        append_share: in_append.as_secs_f64() / seconds,
    })
}
