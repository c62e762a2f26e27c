//! The benchmark workload, its raw-SQLite baseline and the durable-commit measurement,
//! shared by `session-store bench` and `benches/` (which include this file with `#[path]`:
//! a bench cannot import the binary's modules, and this is not library API). Std,
//! rusqlite and the library's public API only.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior};
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

/// The raw baseline's file: `events(seq INTEGER PRIMARY KEY, payload TEXT)` in WAL mode at
/// `synchronous` (`FULL` or `NORMAL`).
pub fn raw_table(file: &Path, synchronous: &str) -> rusqlite::Result<Connection> {
    let conn = Connection::open(file)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", synchronous)?;
    conn.execute(
        "CREATE TABLE events (seq INTEGER PRIMARY KEY, payload TEXT)",
        [],
    )?;
    Ok(conn)
}

/// Inserts `payloads` into a [`raw_table`] after the rows it holds (`seq` is the next
/// rowid), one `BEGIN IMMEDIATE` transaction per `batch` rows.
pub fn raw_insert(
    conn: &mut Connection,
    payloads: &[String],
    batch: usize,
) -> rusqlite::Result<()> {
    for chunk in payloads.chunks(batch.max(1)) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut insert = tx.prepare_cached("INSERT INTO events (payload) VALUES (?1)")?;
            for p in chunk {
                insert.execute([p.as_str()])?;
            }
        }
        tx.commit()?;
    }
    Ok(())
}

/// Events per second of [`raw_insert`] into a new [`raw_table`] at `synchronous`, one
/// transaction per `batch` rows. The file's creation and its first `untimed` payloads (a
/// warm-up on the same file, see [`flushed_commits`]) are not timed.
pub fn raw_rate(
    file: &Path,
    payloads: &[String],
    batch: usize,
    synchronous: &str,
    untimed: usize,
) -> rusqlite::Result<f64> {
    let mut conn = raw_table(file, synchronous)?;
    let (warm, timed) = payloads.split_at(untimed.min(payloads.len()));
    raw_insert(&mut conn, warm, batch)?;
    let t = Instant::now();
    raw_insert(&mut conn, timed, batch)?;
    Ok(timed.len() as f64 / t.elapsed().as_secs_f64().max(1e-9))
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
