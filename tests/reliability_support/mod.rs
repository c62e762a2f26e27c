//! Helpers shared by the reliability suite (`tests/reliability_*.rs`): counts from the
//! environment, content digests, history fingerprints, child-process output collection, and
//! (`model`, `harness`) the model of a transcript and the harness the model-based tests share.
#![allow(dead_code)]

pub mod harness;
pub mod model;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use session_store::{Commit, Error, Event};
use sha2::{Digest, Sha256};

/// A count from the environment (`name=N`), or `default`.
pub fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a count")),
        Err(_) => default,
    }
}

/// A seed from `RELIABILITY_SEED`, or a fresh random one; printed so a failure can be
/// replayed with the same choices.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("RELIABILITY_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("{test}: RELIABILITY_SEED={seed}");
    seed
}

/// SHA-256 (hex) of what a caller controls in a batch: the turn id and each event's kind,
/// optional flag and payload text. The stored commit must hash the same, byte for byte.
pub fn content_digest<'a>(
    turn_id: Option<&str>,
    events: impl IntoIterator<Item = &'a Event>,
) -> String {
    let mut h = Sha256::new();
    h.update(turn_id.unwrap_or("\u{0}none").as_bytes());
    for e in events {
        h.update([0xff]);
        h.update(e.kind.as_bytes());
        h.update([0, u8::from(e.optional)]);
        match e.payload_str() {
            Some(p) => {
                h.update((p.len() as u64).to_le_bytes());
                h.update(p.as_bytes());
            }
            None => h.update(u64::MAX.to_le_bytes()),
        }
    }
    hex::encode(h.finalize())
}

/// The digest of a stored commit, comparable with [`content_digest`] of the appended batch.
pub fn commit_digest(c: &Commit) -> String {
    content_digest(c.turn_id.as_deref(), &c.events)
}

/// Bytes of payload text in a commit.
pub fn payload_bytes(c: &Commit) -> u64 {
    c.events.iter().map(|e| e.payload_len() as u64).sum()
}

/// One line per commit with everything that identifies its content: sequence, ids, turn,
/// hash and every event's id, kind, flag and payload. Two histories are the same exactly
/// when these are equal.
pub fn history_lines<C: std::borrow::Borrow<Commit>>(commits: &[C]) -> Vec<String> {
    commits
        .iter()
        .map(|c| {
            let c: &Commit = c.borrow();
            let events: Vec<_> = c
                .events
                .iter()
                .map(|e| (e.seq, &e.id, &e.kind, e.optional, e.payload_str()))
                .collect();
            serde_json::to_string(&(
                c.first_seq,
                &c.commit_id,
                &c.operation_id,
                &c.operation_hash,
                &c.turn_id,
                events,
            ))
            .expect("serialize history")
        })
        .collect()
}

/// Whether an error is one of the two a damaged or too-new file may produce.
pub fn is_damage(e: &Error) -> bool {
    e.is_corrupt() || e.is_unsupported()
}

/// Peak resident set of this process in KiB (`VmHWM`), 0 where unknown.
pub fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A child process (this test binary re-run as an `#[ignore]`d role) whose stdout lines
/// are collected by a thread, so the child never blocks on a full pipe.
pub struct ChildLines {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Every line received so far, in order.
    pub seen: Vec<String>,
}

impl ChildLines {
    /// Spawns the role with `env`, stdin and stdout piped, stderr inherited.
    pub fn spawn(role: &str, env: &[(&str, String)]) -> ChildLines {
        let mut cmd = crate::common::role_command(role);
        cmd.stdin(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildLines {
            child,
            stdin,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// The next line that contains `marker`, as what follows the marker; `None` when the
    /// child closed stdout or `timeout` passed. (libtest may print `test name ... ` before
    /// a child's first line, hence "contains".)
    pub fn next_with(&mut self, marker: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(at) = line.find(marker) {
                        return Some(line[at + marker.len()..].trim_end().to_owned());
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Like [`ChildLines::next_with`] but panics with the child's output on failure.
    pub fn expect(&mut self, marker: &str) -> String {
        match self.next_with(marker, Duration::from_secs(60)) {
            Some(rest) => rest,
            None => panic!(
                "child {} printed no {marker:?}; its last lines: {:?}",
                self.child.id(),
                &self.seen[self.seen.len().saturating_sub(10)..]
            ),
        }
    }

    /// Sends one line to the child's stdin.
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write to child");
        stdin.flush().expect("flush child stdin");
    }

    /// Collects every remaining line until the child closes stdout (after it died).
    pub fn drain(&mut self) -> &[String] {
        self.drain_within(Duration::from_secs(30))
    }

    /// Collects lines until the child closes stdout or `timeout` passes.
    pub fn drain_within(&mut self, timeout: Duration) -> &[String] {
        let deadline = Instant::now() + timeout;
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(line);
        }
        &self.seen
    }

    /// SIGKILLs the child and reaps it; returns whether it was still running (killed by
    /// the signal) rather than already exited.
    pub fn kill(&mut self) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait child");
        status.signal() == Some(9)
    }
}

impl Drop for ChildLines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
