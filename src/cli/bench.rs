//! `bench`: append throughput and its baselines, in one process and one run.
//!
//! * library: `S` sessions written in parallel (one thread each) through
//!   `Session::append` with the default write-behind (group commit) at the chosen
//!   durability; timed until every session has been flushed and closed (its final drain
//!   and close-time checkpoint included), as a host waits before it exits;
//! * raw: plain SQLite, `events(seq INTEGER PRIMARY KEY, payload TEXT)` in `S` WAL files
//!   in parallel with the same `synchronous` setting, one `BEGIN IMMEDIATE` transaction
//!   per batch;
//! * JSON Lines: `S` files in parallel, one line per event, one `fdatasync` per batch (what
//!   file-based session stores do);
//! * fdatasync: the machine's rate of 4 KiB appends each followed by `fdatasync`, one
//!   file, for about a second.
//!
//! Every measurement writes the same `N` events of ~400-byte `message/complete` payloads in
//! batches of `B`. `cargo bench --bench append` has the finer single-session breakdown.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;
use session_store::baseline::RawTable;
use session_store::{CreateOptions, Durability, Root, SessionId, StoreOptions};

use super::workload::{PAYLOAD_BYTES, batch, fmt_count, payloads};
use super::{CliResult, Context, Failure, progress_bar};

/// How long the fdatasync rate is measured.
const FDATASYNC_TIME: Duration = Duration::from_secs(1);

/// Bytes written before each fdatasync of the rate measurement.
const FDATASYNC_BLOCK: usize = 4096;

/// What `bench` was asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    /// Events in total.
    pub events: usize,
    /// Events per batch.
    pub batch: usize,
    /// Durability of the library and `synchronous` of the raw baseline.
    pub durability: Durability,
    /// Writers in parallel.
    pub sessions: usize,
    /// Folder for the files (default: a temporary folder in the root).
    pub dir: Option<PathBuf>,
}

/// One measured rate.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Rate {
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Events per second.
    pub events_per_s: f64,
    /// Payload megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
}

impl Rate {
    fn new(events: usize, bytes: usize, elapsed: Duration) -> Rate {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Rate {
            seconds,
            events_per_s: events as f64 / seconds,
            mb_per_s: bytes as f64 / seconds / 1e6,
        }
    }
}

/// What `bench --json` prints.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Events per measurement.
    pub events: usize,
    /// Events per batch.
    pub batch: usize,
    /// Writers in parallel.
    pub sessions: usize,
    /// `full` or `normal`.
    pub durability: &'static str,
    /// Payload bytes per measurement.
    pub payload_bytes: usize,
    /// Where the files were written.
    pub dir: PathBuf,
    /// Through the library, group commit.
    pub library: Rate,
    /// Raw SQLite, one transaction per batch.
    pub raw: Rate,
    /// JSON Lines, one fdatasync per batch.
    pub jsonl: Rate,
    /// The machine's fdatasync calls per second (4 KiB appends).
    pub fdatasync_per_s: f64,
    /// library events/s over raw events/s.
    pub ratio_library_raw: f64,
    /// library events/s over JSON Lines events/s.
    pub ratio_library_jsonl: f64,
    /// Wall-clock seconds of the whole run.
    pub total_seconds: f64,
}

/// Removes the bench folder when dropped (only a folder the bench created itself), then
/// the root and its parents when the bench made them and they are empty.
pub(super) struct Scratch(Option<PathBuf>, Vec<PathBuf>);

/// The folder a bench writes to: `dir` when given (kept afterwards), else a new
/// `.bench-{suite}-{pid}` folder in the root, removed when the returned [`Scratch`] drops.
pub(super) fn work_dir(
    cx: &Context,
    dir: Option<&Path>,
    suite: &str,
) -> CliResult<(PathBuf, Scratch)> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            Ok((dir.to_path_buf(), Scratch(None, Vec::new())))
        }
        None => {
            // A missing root is made for the scratch folder and removed with it: `bench`
            // makes no sessions, so it leaves no root behind (README, Command line).
            let made = super::missing_folders(&cx.root);
            let dir = cx
                .root
                .join(format!(".bench-{suite}-{}", std::process::id()));
            // Ctrl-C or SIGTERM ends a run early: what drop does then happens on the
            // signal's thread (the folder used to stay, tens of MB, with the root made).
            let (folder, made_too) = (dir.clone(), made.clone());
            super::interrupt::Interrupt::exit_after(move || remove_scratch(&folder, &made_too))?;
            let scratch = Scratch(None, made);
            std::fs::create_dir_all(&cx.root)?;
            remove_dead_scratches(&cx.root);
            std::fs::create_dir_all(&dir)?;
            Ok((dir.clone(), Scratch(Some(dir), scratch.forget_made())))
        }
    }
}

/// Removes the scratch folders (`.bench-{suite}-{pid}`) in `root` of bench runs whose
/// process is gone: one ended by SIGKILL, SIGQUIT or a crash left its folder, tens of MB,
/// and no command removed it (outside testing, signals: 171 MB after 8 runs). Best effort.
fn remove_dead_scratches(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.starts_with(".bench-"))
            .and_then(|n| n.rsplit_once('-'))
            .and_then(|(_, pid)| pid.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        let gone = matches!(
            rustix::process::test_kill_process(pid),
            Err(rustix::io::Errno::SRCH)
        );
        if gone && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes the scratch folder `dir` (tried again while the run's threads still add files
/// to it), then the `made` folders while they are empty.
fn remove_scratch(dir: &Path, made: &[PathBuf]) {
    for _ in 0..10 {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            _ => break,
        }
    }
    super::remove_empty_folders(made);
}

impl Scratch {
    /// The folders this one would remove, handed over (it then removes none).
    fn forget_made(mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.1)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        match self.0.take() {
            Some(dir) => remove_scratch(&dir, &self.1),
            None => super::remove_empty_folders(&self.1),
        }
    }
}

/// Runs `bench`.
///
/// # Errors
/// Status 2 for zero counts; I/O and storage errors.
pub fn run(cx: &Context, options: &Options) -> CliResult<()> {
    if options.events == 0 || options.batch == 0 || options.sessions == 0 {
        return Err(Failure::usage(
            "--events, --batch and --sessions must be positive",
        ));
    }
    if options.sessions > options.events {
        return Err(Failure::usage("--sessions must not exceed --events"));
    }
    let started = Instant::now();
    let (dir, _scratch) = work_dir(cx, options.dir.as_deref(), "append")?;
    let work = split(&payloads(options.events), options.sessions);
    let payload_bytes: usize = work.iter().flatten().map(String::len).sum();
    let bar = progress_bar(4, "library");
    let library = library(&dir.join("library"), &work, options)?;
    bar.inc(1);
    bar.set_message("raw SQLite");
    let raw = raw(&dir.join("raw"), &work, options)?;
    bar.inc(1);
    bar.set_message("JSON Lines");
    let jsonl = jsonl(&dir.join("jsonl"), &work, options.batch)?;
    bar.inc(1);
    bar.set_message("fdatasync");
    let fdatasync_per_s = fdatasync_rate(&dir.join("fdatasync.bin"))?;
    bar.finish_and_clear();
    let report = Report {
        events: options.events,
        batch: options.batch,
        sessions: work.len(),
        durability: match options.durability {
            Durability::ProcessCrash => "normal",
            _ => "full",
        },
        payload_bytes,
        dir: std::path::absolute(&dir)?,
        ratio_library_raw: library.events_per_s / raw.events_per_s,
        ratio_library_jsonl: library.events_per_s / jsonl.events_per_s,
        library,
        raw,
        jsonl,
        fdatasync_per_s,
        total_seconds: started.elapsed().as_secs_f64(),
    };
    super::print_report(cx, &report, print_human)
}

fn print_human(r: &Report) -> CliResult<()> {
    outln!(
        "bench: {} events of ~{PAYLOAD_BYTES} B in batches of {}, {}, \
         durability {}, files in {}",
        r.events,
        r.batch,
        match r.sessions {
            1 => "one writer".to_owned(),
            n => format!("{n} writers in parallel"),
        },
        r.durability,
        r.dir.display()
    );
    let row = |name: &str, rate: &Rate| -> CliResult<()> {
        outln!(
            "  {name:<36} {:>11} events/s  {:>7.1} MB/s  ({:.2} s)",
            fmt_count(rate.events_per_s),
            rate.mb_per_s,
            rate.seconds
        );
        Ok(())
    };
    row("library (group commit, durable)", &r.library)?;
    row("raw SQLite (1 transaction/batch)", &r.raw)?;
    row("JSON Lines (1 fdatasync/batch)", &r.jsonl)?;
    outln!(
        "  {:<36} {:>11} fdatasync/s (4 KiB appends, 1 file)",
        "fdatasync",
        fmt_count(r.fdatasync_per_s)
    );
    outln!(
        "  ratio library/raw {:.2}   library/JSONL {:.2}   (total {:.1} s)",
        r.ratio_library_raw,
        r.ratio_library_jsonl,
        r.total_seconds
    );
    Ok(())
}

/// `payloads` dealt into `parts` nearly equal runs.
pub(super) fn split(payloads: &[String], parts: usize) -> Vec<Vec<String>> {
    let per = payloads.len().div_ceil(parts);
    payloads.chunks(per).map(<[String]>::to_vec).collect()
}

/// Runs `f(i, work[i])` on one thread per part, all released together by a barrier;
/// returns the time from the release until the last one finished.
fn parallel<F>(work: &[Vec<String>], f: F) -> CliResult<Duration>
where
    F: Fn(usize, &[String], &Barrier) -> Result<(), String> + Sync,
{
    let barrier = Barrier::new(work.len() + 1);
    let start = std::thread::scope(|scope| {
        let handles: Vec<_> = work
            .iter()
            .enumerate()
            .map(|(i, part)| {
                let (f, barrier) = (&f, &barrier);
                scope.spawn(move || f(i, part, barrier))
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for h in handles {
            h.join()
                .map_err(|_| "a bench thread panicked".to_owned())??;
        }
        Ok::<_, String>(start.elapsed())
    })?;
    Ok(start)
}

/// The library: one session per part, group commit, flush and close at the end; the
/// time runs until the last session's `close()` has returned.
pub(super) fn library(dir: &Path, work: &[Vec<String>], options: &Options) -> CliResult<Rate> {
    let root = Root::with_options(
        dir,
        StoreOptions::default().with_durability(options.durability),
    )?;
    let root = Arc::new(root);
    let elapsed = parallel(work, |i, part, barrier| {
        let setup = || -> session_store::Result<_> {
            root.create(CreateOptions::with_id(SessionId::new(format!(
                "bench-{i}"
            ))?))
        };
        let session = setup();
        barrier.wait();
        let session = session.map_err(|e| e.to_string())?;
        let run = || -> session_store::Result<()> {
            for (n, chunk) in part.chunks(options.batch).enumerate() {
                session.append(batch(n, chunk)?)?;
            }
            session.flush()?;
            Ok(())
        };
        let result = run();
        let closed = session.close();
        result.and(closed).map_err(|e| e.to_string())
    })?;
    Ok(Rate::new(
        work.iter().map(Vec::len).sum(),
        work.iter().flatten().map(String::len).sum(),
        elapsed,
    ))
}

/// Raw SQLite: one WAL file per part, one transaction per batch.
pub(super) fn raw(dir: &Path, work: &[Vec<String>], options: &Options) -> CliResult<Rate> {
    std::fs::create_dir_all(dir)?;
    let elapsed = parallel(work, |i, part, barrier| {
        let table = RawTable::create(&dir.join(format!("raw-{i}.sqlite")), options.durability);
        barrier.wait();
        let mut table = table.map_err(|e| e.to_string())?;
        table.insert(part, options.batch).map_err(|e| e.to_string())
    })?;
    Ok(Rate::new(
        work.iter().map(Vec::len).sum(),
        work.iter().flatten().map(String::len).sum(),
        elapsed,
    ))
}

/// JSON Lines: one file per part, one line per event, one fdatasync per batch.
fn jsonl(dir: &Path, work: &[Vec<String>], batch: usize) -> CliResult<Rate> {
    std::fs::create_dir_all(dir)?;
    let elapsed = parallel(work, |i, part, barrier| {
        let file = File::create(dir.join(format!("session-{i}.jsonl")));
        barrier.wait();
        let mut file = file.map_err(|e| e.to_string())?;
        let mut run = || -> std::io::Result<()> {
            let mut buffer = Vec::with_capacity(batch * (PAYLOAD_BYTES + 64));
            let mut seq = 0u64;
            for chunk in part.chunks(batch) {
                buffer.clear();
                for p in chunk {
                    seq += 1;
                    writeln!(
                        buffer,
                        r#"{{"seq":{seq},"kind":"message/complete","payload":{p}}}"#
                    )?;
                }
                file.write_all(&buffer)?;
                file.sync_data()?;
            }
            Ok(())
        };
        run().map_err(|e| e.to_string())
    })?;
    Ok(Rate::new(
        work.iter().map(Vec::len).sum(),
        work.iter().flatten().map(String::len).sum(),
        elapsed,
    ))
}

/// 4 KiB appends, each followed by fdatasync, for about [`FDATASYNC_TIME`]; calls per second.
fn fdatasync_rate(path: &Path) -> CliResult<f64> {
    let mut file = File::create(path)?;
    let block = vec![b'x'; FDATASYNC_BLOCK];
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < FDATASYNC_TIME {
        file.write_all(&block)?;
        file.sync_data()?;
        calls += 1;
    }
    Ok(calls as f64 / start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_json_of_the_target_size() {
        for p in payloads(3) {
            assert!(p.len().abs_diff(PAYLOAD_BYTES) < 8, "{}", p.len());
            serde_json::from_str::<serde_json::Value>(&p).unwrap();
        }
    }

    #[test]
    fn split_covers_everything() {
        let all = payloads(10);
        let parts = split(&all, 3);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.concat(), all);
    }

    #[test]
    fn counts_have_separators() {
        assert_eq!(fmt_count(1_234_567.8), "1,234,568");
        assert_eq!(fmt_count(12.0), "12");
    }
}
