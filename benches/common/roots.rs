//! Roots the benches build and their timing helpers, shared by `query` and `serve`: a root
//! of quick-to-build sessions, 10,000 titled sessions, a session of 100,000 messages, a
//! walk to the middle of its history, timed samples and their formatting.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use session_store::{
    Batch, CreateOptions, Durability, Event, Root, SessionId, SessionQuery, SessionRef,
    StoreOptions,
};

/// What a bench step returns.
pub type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Threads creating the titled sessions.
pub const CREATE_THREADS: usize = 8;
/// Messages per commit of the history session.
pub const HISTORY_BATCH: usize = 500;
/// Approximate bytes of a message's content.
pub const CONTENT_BYTES: usize = 200;

/// A root with quick-to-build sessions: a commit survives a process crash, and only
/// `close` (or a full queue) drains.
pub fn bench_root(path: &Path) -> BenchResult<Root> {
    Ok(Root::with_options(
        path,
        StoreOptions::default()
            .with_durability(Durability::ProcessCrash)
            .with_write_behind(Duration::from_secs(3600)),
    )?)
}

/// Times `reps` runs of `f` after one untimed run; returns the times in ms.
pub fn sample<T>(reps: usize, f: impl FnMut() -> BenchResult<T>) -> BenchResult<Vec<f64>> {
    sample_after(1, reps, f)
}

/// Times `reps` runs of `f` after `warmups` untimed ones; returns the times in ms.
pub fn sample_after<T>(
    warmups: usize,
    reps: usize,
    mut f: impl FnMut() -> BenchResult<T>,
) -> BenchResult<Vec<f64>> {
    for _ in 0..warmups {
        f()?;
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

/// Creates `n` sessions `s-00000`… each with a title, and closes them, on
/// [`CREATE_THREADS`] threads (creation waits on fsyncs more than on the CPU); returns
/// the ids in order.
pub fn create_titled(root: &Root, n: usize) -> BenchResult<Vec<SessionId>> {
    let ids = (0..n)
        .map(|i| SessionId::new(format!("s-{i:05}")))
        .collect::<Result<Vec<_>, _>>()?;
    let chunk = n.div_ceil(CREATE_THREADS).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = ids
            .chunks(chunk)
            .map(|part| scope.spawn(move || create_part(root, part)))
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| "a create thread panicked")?)
    })?;
    Ok(ids)
}

pub fn create_part(root: &Root, ids: &[SessionId]) -> Result<(), String> {
    let create = |id: &SessionId| -> session_store::Result<()> {
        let session = root.create(CreateOptions::with_id(id.clone()))?;
        let title = format!("Session {}", id.as_str().trim_start_matches("s-"));
        session.append(Batch::new(
            "title",
            vec![Event::new("session/title").with_payload(&json!({ "title": title }))?],
        ))?;
        session.close()
    };
    ids.iter()
        .try_for_each(|id| create(id).map_err(|e| format!("create {id}: {e}")))
}

/// `message/complete` payloads' text: unique ids, alternating roles, ~200-byte contents.
pub fn message_json(i: usize, text: &str) -> String {
    let role = if i.is_multiple_of(2) {
        "user"
    } else {
        "assistant"
    };
    let shift = i % 50;
    format!(
        r#"{{"message":{{"id":"m{i:07}","role":"{role}","content":"{}"}}}}"#,
        &text[shift..shift + CONTENT_BYTES]
    )
}

pub fn filler_text() -> String {
    "the quick brown fox jumps over the lazy dog 0123456789 ".repeat(CONTENT_BYTES / 55 + 2)
}

/// Creates `id` with `messages` messages in commits of [`HISTORY_BATCH`], and closes it.
pub fn build_history(root: &Root, id: &SessionId, messages: usize) -> BenchResult<()> {
    let text = filler_text();
    let session = root.create(CreateOptions::with_id(id.clone()))?;
    for start in (0..messages).step_by(HISTORY_BATCH) {
        let events = (start..(start + HISTORY_BATCH).min(messages))
            .map(|i| Event::new("message/complete").with_payload_json(&message_json(i, &text)))
            .collect::<Result<Vec<_>, _>>()?;
        session.append(Batch::new(format!("history-{start:07}"), events))?;
    }
    session.close()?;
    Ok(())
}

/// Follows history cursors from the newest page towards the middle, in pages of
/// `page_size`, for at most `budget`. Returns the cursor whose page ends where
/// the walk stopped, that position, and the pages fetched.
pub async fn walk_history(
    query: &SessionQuery,
    r: &SessionRef,
    messages: usize,
    (page_size, budget): (usize, Duration),
) -> session_store::Result<(Option<String>, usize, usize)> {
    let target = messages / 2;
    let (mut cursor, mut end, mut pages) = (None, messages, 0);
    let started = Instant::now();
    while end > target && started.elapsed() < budget {
        let page = query
            .history_page(r, cursor.as_deref(), (end - target).min(page_size))
            .await?;
        pages += 1;
        end -= page.messages.len();
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    Ok((cursor, end, pages))
}

/// Run count, fastest and slowest of times in ms (sorted by [`median`]).
pub fn spread(sorted: &[f64]) -> String {
    match (sorted.first(), sorted.last()) {
        (Some(&only), _) if sorted.len() == 1 => format!("1 run, {}", fmt_ms(only)),
        (Some(&fastest), Some(&slowest)) => format!(
            "{} runs, min {} max {}",
            sorted.len(),
            fmt_ms(fastest),
            fmt_ms(slowest)
        ),
        _ => "no runs".to_owned(),
    }
}

/// Milliseconds with two decimals below 10 ms, one below 1 s, none above.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}
