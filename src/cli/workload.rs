//! The benchmark workload and its raw-SQLite baseline, shared by `session-store bench` and
//! `benches/` (which include this file with `#[path]`: a bench cannot import the binary's
//! modules, and this is not library API). Plain std and rusqlite only.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

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
