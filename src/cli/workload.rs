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

/// Inserts `payloads` into a [`raw_table`], one `BEGIN IMMEDIATE` transaction per `batch`
/// rows.
pub fn raw_insert(
    conn: &mut Connection,
    payloads: &[String],
    batch: usize,
) -> rusqlite::Result<()> {
    let mut seq = 0i64;
    for chunk in payloads.chunks(batch) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut insert =
                tx.prepare_cached("INSERT INTO events (seq, payload) VALUES (?1, ?2)")?;
            for p in chunk {
                seq += 1;
                insert.execute((seq, p.as_str()))?;
            }
        }
        tx.commit()?;
    }
    Ok(())
}

/// Events per second of [`raw_insert`] into a new [`raw_table`] at `synchronous`, one
/// transaction per `batch` rows (the file's creation is not timed).
pub fn raw_rate(
    file: &Path,
    payloads: &[String],
    batch: usize,
    synchronous: &str,
) -> rusqlite::Result<f64> {
    let mut conn = raw_table(file, synchronous)?;
    let t = Instant::now();
    raw_insert(&mut conn, payloads, batch)?;
    Ok(payloads.len() as f64 / t.elapsed().as_secs_f64().max(1e-9))
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
/// transaction; the session's creation and close are not timed.
///
/// # Errors
/// Storage errors.
pub fn flushed_commits(
    dir: &Path,
    payloads: &[String],
    per_commit: usize,
    options: StoreOptions,
) -> session_store::Result<Flushed> {
    let s = bench_session(dir, options)?;
    let mut in_append = Duration::ZERO;
    let t = Instant::now();
    for (op, chunk) in payloads.chunks(per_commit.max(1)).enumerate() {
        let a = Instant::now();
        s.append(batch(op, chunk)?)?;
        in_append += a.elapsed();
        s.flush()?;
    }
    let elapsed = t.elapsed().as_secs_f64().max(1e-9);
    s.close()?;
    Ok(Flushed {
        rate: payloads.len() as f64 / elapsed,
        append_share: in_append.as_secs_f64() / elapsed,
    })
}
