//! Reliability: the command line's output of anything `append` accepted, its arguments, and
//! the memory of its read paths. Every test drives the built `session-store` binary as a
//! child process on real folders.
//!
//! * A property test: for any batch `append` accepts (hostile payloads: 1e999, -0, deep
//!   nesting, control characters, escapes, long strings, odd kinds), `events --json`,
//!   `history --json` and `show --json` exit 0 with parseable JSON, and `events --json`
//!   gives back every payload byte for byte; human output carries no control characters.
//!   `PROPTEST_CASES` sets the cases (default 24).
//! * Numeric arguments out of range are usage errors (exit 2), never a panic; a closed
//!   stdout ends a command quietly (status 1), never a panic.
//! * Reads of many commits sharing one large blob (`verify`, `export`, `import`,
//!   `rebuild-catalog`, `events`, `show`) peak at the same RSS for 6 and 36 references.
//! * `migrate-legacy` refuses invalid UTF-8 and honours `--head`; `append` refuses it as
//!   invalid input (exit 6).
//! * Human output escapes terminal control sequences from a session; error lines clip
//!   huge values.
//! * The append rules the README documents: what the operation hash covers, nested
//!   `turn/start` refused, `turn/end` without a start accepted.

mod common;
mod reliability_support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reliability_support::env_count;
use serde::Deserialize;
use serde_json::value::RawValue;
use session_store::{Batch, CreateOptions, Event, Root, SessionId};

const BIN: &str = env!("CARGO_BIN_EXE_session-store");

/// The binary on `root`, with no root from the environment and no backtraces.
fn cli(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--root")
        .arg(root)
        .args(args)
        .env_remove("SESSION_STORE_ROOT")
        .env("RUST_BACKTRACE", "0");
    c
}

/// A temporary folder (removed on drop) whose `root/` holds the sessions.
struct Env(tempfile::TempDir);

impl Env {
    fn new() -> Env {
        Env(tempfile::tempdir().expect("tempdir"))
    }

    /// `name` inside the folder, or the root for `"root"`.
    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// Runs with `stdin` as input and collects everything.
    fn run_with(&self, args: &[&str], stdin: &str) -> Output {
        self.run_bytes(args, stdin.as_bytes())
    }

    /// Runs with `stdin` (any bytes) as input and collects everything.
    fn run_bytes(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = cli(&self.path("root"), args)
            .current_dir(self.0.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // A child that refuses early may close its stdin: not an error here.
        if let Some(mut input) = child.stdin.take() {
            let _ = input.write_all(stdin);
        }
        child.wait_with_output().expect("wait")
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, "")
    }

    /// Runs and requires exit 0; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(code(&out), 0, "{args:?}: {}", describe(&out));
        String::from_utf8(out.stdout).expect("stdout is UTF-8")
    }

    /// Runs and requires exit `expected`; returns stderr.
    fn fails(&self, args: &[&str], expected: i32) -> String {
        let out = self.run(args);
        assert_eq!(code(&out), expected, "{args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn describe(out: &Output) -> String {
    let clip = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        s.chars().take(2000).collect::<String>()
    };
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        clip(&out.stdout),
        clip(&out.stderr)
    )
}

/// Control characters other than the line breaks of the output itself, and bidirectional
/// embeddings, overrides and isolates (they reorder the rest of a terminal's line).
fn control_chars(text: &str) -> Vec<char> {
    text.chars()
        .filter(|c| {
            (c.is_control() && *c != '\n')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// What is wrong with the human output of session `id` (`events`, `history`, `show`,
/// `stats`, `list`): a failing command or a control character reaching the terminal.
fn unprintable_human_output(env: &Env, id: &str) -> Option<String> {
    let commands: [&[&str]; 5] = [
        &["events", id],
        &["history", id],
        &["show", id],
        &["stats", id],
        &["list"],
    ];
    commands.into_iter().find_map(|args| {
        let out = env.run(args);
        let controls = control_chars(&String::from_utf8_lossy(&out.stdout));
        if code(&out) != 0 {
            Some(format!("{args:?}: {}", describe(&out)))
        } else if !controls.is_empty() {
            Some(format!("{args:?} printed control characters {controls:?}"))
        } else {
            None
        }
    })
}

// ---------------------------------------------------------------------------------------
// Property: whatever append accepts, the JSON outputs print and parse.
// ---------------------------------------------------------------------------------------

/// `depth` nested arrays around `inner`, as JSON text.
fn nested(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
}

/// Strings that are hard to print: terminal escapes, controls, bidi, quotes, non-BMP.
fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("\u{1b}[31mred\u{1b}[0m".to_owned()),
        Just("\u{1b}]0;title\u{7}".to_owned()),
        Just("nul\0bell\u{7}del\u{7f}c1\u{9b}".to_owned()),
        Just("line\nbreak\rcarriage\ttab".to_owned()),
        Just("\u{202e}evil\u{2066}".to_owned()),
        Just("quote\" back\\slash /".to_owned()),
        Just("emoji 🦀 中文 é".to_owned()),
        Just(String::new()),
        Just("a".repeat(70_000)),
        "\\PC{0,40}",
        ".{0,24}",
    ]
}

/// One JSON value as text, chosen to break a naive printer.
fn hostile_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("1e999".to_owned()),
        Just("-1e999".to_owned()),
        Just("1e-999".to_owned()),
        Just("-0".to_owned()),
        Just("-0.0".to_owned()),
        Just("5e-324".to_owned()),
        Just("1.7976931348623157e308".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-9223372036854775809".to_owned()),
        Just("123456789012345678901234567890.123456789".to_owned()),
        Just("true".to_owned()),
        Just("null".to_owned()),
        Just(r#""\ud800 lone surrogate""#.to_owned()),
        Just(r#""\u0000\u001b[2J\u0007""#.to_owned()),
        hostile_string().prop_map(|s| serde_json::to_string(&s).expect("string")),
        (
            0usize..4,
            prop_oneof![Just(100usize), Just(127), Just(200), Just(300)]
        )
            .prop_map(|(_, depth)| nested(depth, "1e999")),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((hostile_string(), inner), 0..4).prop_map(|v| {
                let fields: Vec<String> = v
                    .iter()
                    .map(|(k, v)| format!("{}: {v}", serde_json::to_string(k).expect("key")))
                    .collect();
                format!("{{ {} }}", fields.join(" ,"))
            }),
        ]
    })
}

/// Kinds for optional events: odd, long, with controls.
fn odd_kind() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("x".to_owned()),
        Just("kind\u{1b}[2J".to_owned()),
        Just("é/ü/🦀".to_owned()),
        Just("k".repeat(300)),
        Just("with spaces and \"quotes\"".to_owned()),
        Just("message/complete".to_owned()),
    ]
}

/// One event of a batch line: `(kind, payload text)`, as JSON text of the event.
fn hostile_event(n: usize) -> impl Strategy<Value = (String, Option<String>)> {
    prop_oneof![
        (odd_kind(), hostile_value()).prop_map(|(kind, payload)| {
            let line = format!(
                r#"{{"kind":{},"optional":true,"payload":{payload}}}"#,
                serde_json::to_string(&kind).expect("kind")
            );
            (line, Some(payload))
        }),
        (hostile_string(), hostile_value()).prop_map(move |(role, content)| {
            let payload = format!(
                r#"{{"message":{{"id":"m{n}","role":{},"content":{content},"x":{content}}}}}"#,
                serde_json::to_string(&role).expect("role")
            );
            (
                format!(r#"{{"kind":"message/complete","payload":{payload}}}"#),
                Some(payload),
            )
        }),
        hostile_string().prop_map(|title| {
            let payload = format!(
                r#"{{"title":{}}}"#,
                serde_json::to_string(&title).expect("title")
            );
            (
                format!(r#"{{"kind":"session/title","payload":{payload}}}"#),
                Some(payload),
            )
        }),
        hostile_value().prop_map(|v| {
            let payload = format!(r#"{{"plan":{v}}}"#);
            (
                format!(r#"{{"kind":"plan/state","payload":{payload}}}"#),
                Some(payload),
            )
        }),
        hostile_value().prop_map(|payload| (
            format!(r#"{{"kind":"diagnostic","payload":{payload}}}"#),
            Some(payload)
        )),
    ]
}

#[derive(Deserialize)]
struct EventsOut {
    events: Vec<EventOut>,
    next_after: Option<u64>,
}

#[derive(Deserialize)]
struct EventOut {
    payload: Option<Box<RawValue>>,
}

/// Appends the batch made of `events`; when `append` accepts it, checks every output.
/// Returns whether it was accepted.
fn check_outputs(events: &[(String, Option<String>)]) -> Result<bool, TestCaseError> {
    let env = Env::new();
    let line = format!(
        r#"{{"operation_id":"hostile","events":[{}]}}"#,
        events
            .iter()
            .map(|(e, _)| e.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    let appended = env.run_with(&["append", "s", "--create"], &format!("{line}\n"));
    match code(&appended) {
        0 => {}
        // Refused (and said why): nothing to print.
        6 => return Ok(false),
        _ => {
            return Err(TestCaseError::fail(format!(
                "append: {}",
                describe(&appended)
            )));
        }
    }
    for args in [
        &["--json", "events", "s", "--inline", "--limit", "1000000"][..],
        &["--json", "history", "s"],
        &["--json", "show", "s"],
        &["--json", "stats", "s"],
        &["--json", "verify", "s"],
    ] {
        let out = env.run(args);
        prop_assert_eq!(code(&out), 0, "{:?}: {}", args, describe(&out));
        let text = String::from_utf8(out.stdout.clone())
            .map_err(|_| TestCaseError::fail(format!("{args:?}: stdout is not UTF-8")))?;
        let parsed = serde_json::from_str::<Box<RawValue>>(text.trim_end());
        prop_assert!(
            parsed.is_ok(),
            "{:?}: unparseable: {:?}",
            args,
            parsed.err()
        );
        if args[1] == "events" {
            let page: EventsOut = serde_json::from_str(text.trim_end())
                .map_err(|e| TestCaseError::fail(format!("events --json: {e}")))?;
            prop_assert_eq!(page.next_after, None);
            let printed: Vec<Option<&str>> = page
                .events
                .iter()
                .map(|e| e.payload.as_deref().map(RawValue::get))
                .collect();
            // A `null` payload is stored as no payload (`Event::payload` is `None`).
            let given: Vec<Option<&str>> = events
                .iter()
                .map(|(_, p)| p.as_deref().filter(|text| *text != "null"))
                .collect();
            prop_assert_eq!(printed, given, "events --json must print payloads as given");
        }
    }
    if let Some(problem) = unprintable_human_output(&env, "s") {
        return Err(TestCaseError::fail(problem));
    }
    Ok(true)
}

#[test]
fn any_batch_append_accepts_prints_as_parseable_json() {
    let cases = env_count("PROPTEST_CASES", 24) as u32;
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let batch = prop::collection::vec(0usize..1, 1..4).prop_flat_map(|slots| {
        slots
            .iter()
            .enumerate()
            .map(|(n, _)| hostile_event(n))
            .collect::<Vec<_>>()
    });
    let accepted = std::cell::Cell::new(0u32);
    TestRunner::new(config)
        .run(&batch, |events| {
            accepted.set(accepted.get() + u32::from(check_outputs(&events)?));
            Ok(())
        })
        .unwrap();
    eprintln!(
        "append accepted {} of {cases} hostile batches",
        accepted.get()
    );
    // Most draws are accepted (plan/state refuses numbers out of f64 range and deep
    // nesting): the property is not vacuous. About 64% are (128 of 200 in one run): at
    // least half of 24 failed about once in 25 runs (10 of 24 in session 42's CI); a
    // quarter is 4 standard deviations below the mean.
    assert!(
        accepted.get() * 4 >= cases,
        "only {} accepted",
        accepted.get()
    );
}

/// Fixed cases of the issue, run every time whatever the property draws.
#[test]
fn events_json_prints_1e999_and_200_deep_payloads() {
    for payload in ["[1e999, -0]", &nested(200, "")] {
        let accepted = check_outputs(&[(
            format!(r#"{{"kind":"x","optional":true,"payload":{payload}}}"#),
            Some(payload.to_owned()),
        )])
        .unwrap();
        assert!(accepted, "append accepts {payload}");
    }
}

// ---------------------------------------------------------------------------------------
// Numeric arguments.
// ---------------------------------------------------------------------------------------

#[test]
fn numeric_arguments_out_of_range_are_usage_errors_not_panics() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let refused: &[&[&str]] = &[
        &["delete", "s", "--wait", "1e20"],
        &["delete", "s", "--wait", "1e308"],
        &["delete", "s", "--wait", "18446744073709551616"],
        &["delete", "s", "--wait", "NaN"],
        &["delete", "s", "--wait", "inf"],
        &["delete", "s", "--wait=-1"],
        &["delete", "s", "--wait", "31536001"],
        &["events", "s", "--after", "9223372036854775808"],
        &["events", "s", "--after", "18446744073709551616"],
        &["events", "s", "--limit", "0"],
        &["events", "s", "--limit", "9223372036854775808"],
        &["events", "s", "--limit", "18446744073709551616"],
        &["history", "s", "--limit", "18446744073709551616"],
        &["list", "--limit", "18446744073709551616"],
        // `--help` says 1..=100, as `events --limit` says its range: 0 is not "the default"
        // and 101 a usage error like any other number out of range (was exit 6).
        &["list", "--limit", "0"],
        &["list", "--limit", "101"],
        &["search", "x", "--limit", "0"],
        &["search", "x", "--limit", "101"],
        // `history --limit` likewise (1..=500): 0 was the default page and 501 clamped.
        &["history", "s", "--limit", "0"],
        &["history", "s", "--limit", "501"],
        &["history", "s", "--limit", "18446744073709551615"],
        &["bench", "--events", "18446744073709551615"],
        &["bench", "--batch", "0"],
        &["bench", "--sessions", "100000"],
    ];
    for args in refused {
        let stderr = env.fails(args, 2);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // The edges that are in range still work.
    // Past the session's last sequence: refused for that, exit 6, as Python refuses it.
    let past = env.fails(&["events", "s", "--after", "9223372036854775807"], 6);
    assert!(
        past.contains("past the last sequence 0 of session s"),
        "{past}"
    );
    let page = env.ok(&["--json", "events", "s", "--after", "0"]);
    assert!(page.contains(r#""events":[]"#), "{page}");
    env.ok(&["events", "s", "--limit", "1000000"]);
    env.ok(&["history", "s", "--limit", "500"]);
    env.ok(&["history", "s", "--limit", "1"]);
    env.ok(&["list", "--limit", "100"]);
    env.ok(&["list", "--limit", "1"]);
    env.ok(&["search", "x", "--limit", "100"]);
    let help = env.ok(&["history", "--help"]);
    assert!(help.contains("1..=500"), "{help}");
    env.ok(&["delete", "s", "--wait", "0.5"]);
    env.fails(&["show", "s"], 3);
}

// ---------------------------------------------------------------------------------------
// Memory of read paths over a shared blob.
// ---------------------------------------------------------------------------------------

/// Bytes of the payload every commit shares.
const SHARED_PAYLOAD: usize = 6 << 20;

/// A root with session `s`: `commits` commits whose one event carries the same payload.
fn shared_blob_root(dir: &Path, commits: usize) -> PathBuf {
    let root_dir = dir.join("root");
    let root = Root::open(&root_dir).expect("root");
    let session = root
        .create(CreateOptions::with_id(SessionId::new("s").expect("id")))
        .expect("create");
    let payload = format!(
        r#"{{"blob":"{}"}}"#,
        "0123456789abcdef".repeat(SHARED_PAYLOAD / 16)
    );
    for n in 0..commits {
        let event = Event::new("blob/shared")
            .optional()
            .with_payload_json(&payload)
            .expect("payload");
        session
            .append(Batch::new(format!("op-{n}"), vec![event]))
            .expect("append");
        if n % 8 == 7 {
            session.flush().expect("flush");
        }
    }
    session.close().expect("close");
    root_dir
}

/// Runs the binary to completion and returns its peak RSS in KiB (`VmHWM`, polled while
/// it runs; the high-water mark only grows, so a late sample sees the peak); it must
/// succeed.
fn peak_rss_of(root: &Path, args: &[&str]) -> u64 {
    let (peak, exit, stderr) = run_with_peak_rss(root, args);
    assert!(exit.success(), "{args:?}: {exit} {stderr}");
    peak
}

/// Runs the binary to completion: its peak RSS in KiB (as [`peak_rss_of`]), its exit
/// status and its stderr.
fn run_with_peak_rss(root: &Path, args: &[&str]) -> (u64, std::process::ExitStatus, String) {
    let mut child = cli(root, args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    loop {
        if let Ok(text) = std::fs::read_to_string(&status)
            && let Some(kb) = text
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        {
            peak = peak.max(kb);
        }
        if let Some(exit) = child.try_wait().expect("try_wait") {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
            }
            return (peak, exit, stderr);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Peak RSS (KiB) of each read command over a session of `commits` shared-blob commits.
fn read_peaks(commits: usize) -> Vec<(&'static str, u64)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = shared_blob_root(dir.path(), commits);
    let export = dir.path().join("s.export.sqlite");
    let export_arg = export.to_str().expect("utf-8 path");
    vec![
        ("verify", peak_rss_of(&root, &["verify", "s"])),
        ("export", peak_rss_of(&root, &["export", "s", export_arg])),
        (
            "import",
            peak_rss_of(&root, &["import", export_arg, "--id", "t"]),
        ),
        ("rebuild-catalog", peak_rss_of(&root, &["rebuild-catalog"])),
        (
            "events",
            peak_rss_of(&root, &["events", "s", "--limit", "1000"]),
        ),
        ("show", peak_rss_of(&root, &["show", "s"])),
    ]
}

#[test]
fn reads_of_a_shared_blob_are_bounded_by_the_page_not_the_references() {
    if !Path::new("/proc/self/status").exists() {
        eprintln!("no /proc: peak RSS cannot be sampled, skipped");
        return;
    }
    let (few, many) = (6, 36);
    let small = read_peaks(few);
    let large = read_peaks(many);
    let mb = SHARED_PAYLOAD as u64 / 1024;
    for ((name, a), (_, b)) in small.iter().zip(&large) {
        eprintln!(
            "shared blob of {} MiB: {name} peaks at {} MiB with {few} references, {} MiB with {many}",
            SHARED_PAYLOAD >> 20,
            a / 1024,
            b / 1024
        );
        // 30 more references of 6 MiB each would add 180 MiB if memory followed them.
        assert!(
            *b <= a + 4 * mb,
            "{name}: peak RSS grew from {a} KiB ({few} references) to {b} KiB ({many})"
        );
    }
}

// ---------------------------------------------------------------------------------------
// migrate-legacy.
// ---------------------------------------------------------------------------------------

fn session_dirs(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().join("session.sqlite").is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A zstd frame of a few hundred kilobytes declaring 300 MB of zeros, planted as a blob
/// row declaring as much (within the largest blob): each read decompressed all of it into
/// memory before the digest refused it (800 MB for each `show`, `events`, `list`, 3 GB
/// for four requests to `serve` at once; outside testing H1, session 41). It is checked
/// as it is decompressed first: refused as corrupt, in a small fraction of its size.
#[test]
fn a_planted_blob_declaring_hundreds_of_megabytes_is_refused_without_holding_them() {
    const BOMB: u64 = 300_000_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = shared_blob_root(dir.path(), 1);
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), 1).expect("zstd");
    encoder.include_contentsize(true).expect("content size");
    encoder
        .set_pledged_src_size(Some(BOMB))
        .expect("pledged size");
    std::io::copy(
        &mut std::io::Read::take(std::io::repeat(0), BOMB),
        &mut encoder,
    )
    .expect("compress");
    let frame = encoder.finish().expect("finish");
    assert!(frame.len() < 1 << 20, "{}", frame.len());
    let conn = rusqlite::Connection::open(root.join("s/session.sqlite")).expect("open");
    let planted = conn
        .execute(
            "UPDATE blobs SET bytes = ?1, encoding = 'zstd', data = ?2 WHERE bytes > 1000000",
            rusqlite::params![BOMB as i64, frame],
        )
        .expect("plant");
    assert_eq!(planted, 1);
    drop(conn);
    for args in [&["verify", "s"][..], &["events", "s"], &["show", "s"]] {
        let (peak_kb, exit, stderr) = run_with_peak_rss(&root, args);
        assert_eq!(exit.code(), Some(6), "{args:?}: {stderr}");
        assert!(
            stderr.contains("does not match its digest"),
            "{args:?}: {stderr}"
        );
        assert!(
            peak_kb < 100 * 1024,
            "{args:?} peaked at {peak_kb} KiB for a blob declaring {BOMB} bytes"
        );
    }
}

/// `verify` of a session with a checkpoint compares the checkpoint's projection with its
/// full fold: both were made JSON trees, and with a workset of every message it peaked
/// at 2.8 times what the same verify takes with the checkpoint ignored (463 against 166
/// MB for 200,000 messages; outside testing H7, session 41). Now about the same.
#[test]
fn verify_compares_a_checkpoint_without_a_second_copy_of_the_workset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root_dir = dir.path().join("root");
    let root = Root::open(&root_dir).expect("root");
    let session = root
        .create(CreateOptions::with_id(SessionId::new("s").expect("id")))
        .expect("create");
    let text = "a message of some sixty bytes, as chat turns often are";
    for n in 0..500 {
        let events = (0..100)
            .map(|m| {
                Event::new("message/complete")
                    .with_payload_json(&format!(
                        r#"{{"message":{{"id":"m{n}-{m}","role":"user","content":"{text}"}}}}"#
                    ))
                    .expect("payload")
            })
            .collect();
        session
            .append(Batch::new(format!("op-{n}"), events))
            .expect("append");
    }
    session.close().expect("close");
    drop((session, root));
    let (with_checkpoint, exit, stderr) = run_with_peak_rss(&root_dir, &["verify", "s"]);
    assert!(exit.success(), "{stderr}");
    let conn = rusqlite::Connection::open(root_dir.join("s/session.sqlite")).expect("open");
    let damaged = conn
        .execute("UPDATE checkpoint SET digest = 'not the digest'", [])
        .expect("damage");
    assert_eq!(damaged, 1);
    drop(conn);
    let (without, exit, stderr) = run_with_peak_rss(&root_dir, &["verify", "s"]);
    assert!(exit.success(), "{stderr}");
    assert!(
        with_checkpoint * 2 < without * 3,
        "verify peaked at {with_checkpoint} KiB comparing the checkpoint, {without} KiB without"
    );
}

/// A legacy line nested deeper than a payload may be (with its `{"message": …}`) is
/// refused naming its line; it was named as `events[N]` of a batch of 128 messages the
/// caller never saw (outside testing C7, session 41). One level less is migrated.
#[test]
fn migrate_legacy_names_the_line_of_a_message_nested_too_deep() {
    let env = Env::new();
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let line = |id: &str, depth: usize| {
        format!(
            r#"{{"id":"{id}","role":"user","content":"x","extra":{}}}"#,
            nested(depth)
        )
    };
    let file = env.path("deep.jsonl");
    std::fs::write(&file, format!("{}\n{}\n", line("a", 1), line("b", 511))).expect("write");
    let stderr = env.fails(&["migrate-legacy", file.to_str().expect("path")], 6);
    assert!(stderr.contains("legacy line 2 nests"), "{stderr}");
    assert!(
        session_dirs(&env.path("root")).is_empty(),
        "nothing published"
    );
    std::fs::write(&file, format!("{}\n{}\n", line("a", 1), line("b", 510))).expect("write");
    env.ok(&["migrate-legacy", file.to_str().expect("path")]);
}

#[test]
fn migrate_legacy_refuses_invalid_utf8_and_honours_head() {
    let env = Env::new();
    let bad = env.path("bad.jsonl");
    let bad_bytes =
        b"{\"id\":\"a\",\"role\":\"user\",\"content\":\"x\"}\n{\"id\":\"b\",\"role\":\"user\",\"content\":\"y\xff\"}\n{\"id\":\"c\",\"role\":\"user\",\"content\":\"z\"}\n";
    std::fs::write(&bad, bad_bytes).expect("write");
    let stderr = env.fails(&["migrate-legacy", bad.to_str().expect("path")], 6);
    assert!(stderr.contains("line 2 is not UTF-8"), "{stderr}");
    assert_eq!(std::fs::read(&bad).expect("read"), bad_bytes.to_vec());
    assert!(
        session_dirs(&env.path("root")).is_empty(),
        "nothing published"
    );

    // A last line torn inside a UTF-8 character is a torn line, not a refusal.
    let good = env.path("good.jsonl");
    std::fs::write(
        &good,
        b"{\"id\":\"a\",\"role\":\"user\",\"content\":\"x\"}\n{\"id\":\"b\",\"role\":\"assistant\",\"content\":\"y\"}\n{\"id\":\"c\",\"role\":\"user\",\"content\":\"\xc3",
    )
    .expect("write");
    let path = good.to_str().expect("path");
    let unknown = env.fails(&["migrate-legacy", path, "--head", "zz"], 6);
    assert!(unknown.contains("legacy head \"zz\""), "{unknown}");
    assert!(
        session_dirs(&env.path("root")).is_empty(),
        "nothing published"
    );

    let record: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "migrate-legacy", path, "--head", "a"]))
            .expect("json");
    assert_eq!(record["message_count"], 1);
    assert_eq!(record["torn_last_line"], true);
    let at_a = record["target_id"].as_str().expect("id").to_owned();
    let history = env.ok(&["--json", "history", &at_a]);
    assert!(history.contains(r#""message_id":"a""#) && !history.contains(r#""message_id":"b""#));

    let tip: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "migrate-legacy", path])).expect("json");
    assert_eq!(tip["message_count"], 2);
    assert_ne!(
        tip["target_id"], record["target_id"],
        "another head, another id"
    );
}

#[test]
fn migrate_legacy_names_the_line_of_a_duplicate_message_id() {
    let env = Env::new();
    let dup = env.path("dup.jsonl");
    let text = "{\"id\":\"a\",\"role\":\"user\",\"content\":\"x\"}\n\
                {\"id\":\"b\",\"role\":\"assistant\",\"content\":\"y\"}\n\
                {\"id\":\"a\",\"role\":\"user\",\"content\":\"z\"}\n";
    std::fs::write(&dup, text).expect("write");
    let stderr = env.fails(&["migrate-legacy", dup.to_str().expect("path")], 6);
    // Before: "invalid message/complete payload: duplicate message id", no line.
    assert!(
        stderr.contains("legacy line 3") && stderr.contains("\"a\"") && stderr.contains("line 1"),
        "{stderr}"
    );
    assert!(!stderr.contains("message/complete"), "{stderr}");
    assert!(
        session_dirs(&env.path("root")).is_empty(),
        "nothing published"
    );
}

/// A line that is not a batch says why in the input's terms (session 43, outside testing:
/// `not json` said only "expected ident", an array "(column 0)", and an unknown event
/// field listed `seq` and `content_ref`, which input never takes). Nothing is appended.
#[test]
fn a_line_that_is_not_a_batch_says_why_in_the_inputs_terms() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    for (line, says, not) in [
        ("not json", "line 1: not a batch: not JSON: ", "column 0"),
        ("[1,2]", "expected a batch object", "column 0"),
        (
            r#"{"operation_id":"a"#,
            "not a batch: not JSON: EOF",
            "column 0",
        ),
        (
            r#"{"operation_id":"x","events":[{"kind":"turn/start","optinal":true}]}"#,
            "unknown field `optinal`, expected one of `kind`, `payload`, `optional`, `id` (column",
            "content_ref",
        ),
    ] {
        let out = env.run_bytes(&["append", "s"], format!("{line}\n").as_bytes());
        assert_eq!(code(&out), 6, "{line}: {}", describe(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(says) && !stderr.contains(not),
            "{line}: {stderr}"
        );
    }
    assert_eq!(durable(&env, "s"), 0);
}

#[test]
fn a_byte_order_mark_before_the_first_line_is_ignored() {
    // RFC 8259 lets a parser ignore a leading BOM, and editors on Windows write one.
    let env = Env::new();
    env.ok(&["create", "s"]);
    let line = r#"{"operation_id":"a","events":[{"kind":"diagnostic"}]}"#;
    let out = env.run_bytes(&["append", "s"], format!("\u{feff}{line}\n").as_bytes());
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert_eq!(durable(&env, "s"), 1);
    // Only before the first line: one inside the input is still not JSON.
    let out = env.run_bytes(&["append", "s"], format!("\u{feff}{line}\n").as_bytes());
    assert_eq!(code(&out), 0, "a retry: {}", describe(&out));
    let second = r#"{"operation_id":"b","events":[{"kind":"diagnostic"}]}"#;
    let out = env.run_bytes(
        &["append", "s"],
        format!("{line}\n\u{feff}{second}\n").as_bytes(),
    );
    assert_eq!(code(&out), 6, "{}", describe(&out));
    assert_eq!(durable(&env, "s"), 1);

    let legacy = env.path("bom.jsonl");
    std::fs::write(
        &legacy,
        "\u{feff}{\"id\":\"a\",\"role\":\"user\",\"content\":\"x\"}\r\n",
    )
    .expect("write");
    let record: serde_json::Value = serde_json::from_str(&env.ok(&[
        "--json",
        "migrate-legacy",
        legacy.to_str().expect("path"),
    ]))
    .expect("json");
    assert_eq!(record["message_count"], 1, "{record}");
    let history = env.ok(&[
        "--json",
        "history",
        record["target_id"].as_str().expect("id"),
    ]);
    assert!(history.contains(r#""message_id":"a""#), "{history}");
}

#[test]
fn append_refuses_invalid_utf8_as_invalid_input_keeping_the_lines_before() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let good = r#"{"operation_id":"a","events":[{"kind":"diagnostic"}]}"#;
    let input = [
        format!("{good}\n").into_bytes(),
        b"{\"operation_id\":\"b\xff\",\"events\":[{\"kind\":\"diagnostic\"}]}\n".to_vec(),
    ]
    .concat();
    let out = env.run_bytes(&["append", "s"], &input);
    assert_eq!(code(&out), 6, "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2 is not UTF-8"), "{stderr}");
    // The line before it is durable, nothing of line 2 is.
    assert_eq!(durable(&env, "s"), 1);
}

/// A batch is the JSON object the README documents. A JSON array used to be read as the
/// struct's fields in order (`["op", null, [...]]` appended), and an array of events (a
/// likely mistake) was refused with serde's "expected struct Batch with 3 elements".
#[test]
fn append_refuses_a_batch_that_is_not_a_json_object() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    for line in [
        r#"["o",null,[{"kind":"diagnostic"}]]"#,
        r#"[{"kind":"diagnostic"}]"#,
        "[]",
        r#""o""#,
    ] {
        let out = env.run_with(&["append", "s"], &format!("{line}\n"));
        assert_eq!(code(&out), 6, "{line}: {}", describe(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("a batch object"), "{line}: {stderr}");
        assert!(
            serde_json::from_str::<Batch>(line).is_err(),
            "{line} parsed as a Batch"
        );
    }
    assert_eq!(durable(&env, "s"), 0, "nothing appended");
    // The object form, keys in any order, still parses.
    let batch: Batch = serde_json::from_str(
        r#"{"events":[{"kind":"diagnostic"}],"turn_id":"t","operation_id":"o"}"#,
    )
    .expect("an object");
    assert_eq!(
        (batch.operation_id.as_str(), batch.turn_id.as_deref()),
        ("o", Some("t"))
    );
    assert_eq!(batch.events.len(), 1);
}

/// An event kind this build does not know, not marked optional, is refused as newer than
/// this build (exit 6), and the message says that, not "unsupported session storage
/// version" (nothing about the file or its version is wrong).
#[test]
fn an_unknown_required_kind_is_named_without_blaming_the_storage_version() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let out = env.run_with(
        &["append", "s"],
        "{\"operation_id\":\"a\",\"events\":[{\"kind\":\"future/kind\"}]}\n",
    );
    assert_eq!(code(&out), 6, "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not supported by this build")
            && stderr.contains("\"future/kind\"")
            && stderr.contains("mark it optional")
            && !stderr.contains("storage version"),
        "{stderr}"
    );
    assert_eq!(durable(&env, "s"), 0);
}

/// `session-store events s | head`: the reader closes the pipe while the command still
/// prints. The command stops quietly with status 1 (no panic, no backtrace, no error line
/// for a reader that left on purpose), for human and JSON output.
#[test]
fn a_closed_stdout_ends_the_command_quietly_without_a_panic() {
    let env = Env::new();
    // About 200 KiB of output: more than a pipe holds, so the writes after the first
    // 64 KiB fail even if the pipe was still open when the first ones were made.
    let lines: String = (0..2000)
        .map(|i| {
            format!(
                r#"{{"operation_id":"o{i}","events":[{{"kind":"diagnostic","payload":{{"n":"{}"}}}}]}}"#,
                "x".repeat(60)
            ) + "\n"
        })
        .collect();
    assert_eq!(code(&env.run_with(&["append", "s", "--create"], &lines)), 0);
    for args in [
        &["events", "s", "--limit", "2000"][..],
        &["--json", "events", "s", "--limit", "2000"][..],
    ] {
        let mut child = cli(&env.path("root"), args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        assert_eq!(code(&out), 1, "{args:?}: {}", describe(&out));
        assert!(out.stderr.is_empty(), "{args:?}: {}", describe(&out));
    }
}

/// `session-store create >&-`: with no stdout at all every command exited 0 and printed
/// nothing (a write to a closed descriptor counts as done), so `create` made a session whose
/// generated id was lost. The command fails, status 1, saying why, and changes nothing.
#[test]
fn a_command_without_stdout_fails_and_changes_nothing() {
    let env = Env::new();
    let closed = |args: &[&str]| {
        Command::new("sh")
            .arg("-c")
            .arg(r#""$@" >&-"#)
            .arg("sh")
            .arg(BIN)
            .arg("--root")
            .arg(env.path("root"))
            .args(args)
            .env_remove("SESSION_STORE_ROOT")
            .output()
            .expect("run")
    };
    // Help and version too: clap printed them itself and exited 0 (outside testing,
    // session 38).
    for args in [
        &["create"][..],
        &["create", "s"],
        &["list"],
        &["--version"],
        &["list", "--help"],
    ] {
        let out = closed(args);
        assert_eq!(code(&out), 1, "{args:?}: {}", describe(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("stdout is closed"),
            "{args:?}: {}",
            describe(&out)
        );
    }
    assert!(
        !env.path("root").exists(),
        "a command without stdout made the root"
    );
}

/// `session-store fork … > /dev/full`: the fork was made, then its id could not be
/// printed; the command said only "No space left on device (os error 28)", which read as
/// the root's disk being full (outside testing, session 36). It names stdout and, for a
/// command that changes the root, says that the change stands; status 1 still.
#[test]
fn a_failed_write_of_the_output_names_stdout_and_what_stands() {
    let env = Env::new();
    let turn = r#"{"operation_id":"o","turn_id":"t1","events":[{"kind":"turn/start"},{"kind":"turn/end","payload":{"status":"completed"}}]}"#;
    assert_eq!(
        code(&env.run_with(&["append", "s", "--create"], &format!("{turn}\n"))),
        0
    );
    let full = |args: &[&str]| {
        cli(&env.path("root"), args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create("/dev/full").expect("/dev/full"))
            .stderr(Stdio::piped())
            .output()
            .expect("run")
    };
    for (args, changed) in [
        (&["fork", "s", "--after-turn", "t1", "--id", "f"][..], true),
        (&["--json", "create", "c"][..], true),
        (&["list"][..], false),
        (&["--json", "events", "s"][..], false),
        (&["--version"][..], false),
        (&["append", "--help"][..], false),
    ] {
        let out = full(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 1, "{args:?}: {}", describe(&out));
        assert!(
            stderr.contains("could not write the output to stdout: No space left on device"),
            "{args:?}: {stderr}"
        );
        assert_eq!(
            stderr.contains("what the command did before it is kept"),
            changed,
            "{args:?}: {stderr}"
        );
    }
    // The fork and the session were made.
    for made in ["f", "c"] {
        env.ok(&["show", made]);
    }
    // `gc` prints each deletion as it makes it and stops at the first it cannot print:
    // that one is named on stderr (with stdout gone, `| head`, it was deleted without a
    // word; outside testing, signals), the rest kept.
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let out = full(&["gc", "--older-than", "1s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 1, "{}", describe(&out));
    assert!(
        stderr
            .contains("session-store: deleted c, which stdout could not take; the run stops here"),
        "{stderr}"
    );
    assert!(
        stderr.contains("what the command did before it is kept"),
        "{stderr}"
    );
    let listed = env.ok(&["list"]);
    assert!(!listed.contains("\nc "), "{listed}");
    assert!(
        listed.contains("\nf ") && listed.contains("\ns "),
        "{listed}"
    );
    // Help and version to a pipe print all of it, status 0.
    let version = env.ok(&["--version"]);
    assert!(version.starts_with("session-store "), "{version}");
    assert!(
        env.ok(&["list", "--help"])
            .contains("Usage: session-store list")
    );
}

/// `session-store show nope 2>&1 | grep -q …`: the reader of stderr is gone when the
/// error line is written. The command keeps its exit status (3, and 6 for a bad id, 2 for
/// a usage error); it panicked in `eprintln!` before, status 101.
#[test]
fn a_closed_stderr_keeps_the_exit_status() {
    let env = Env::new();
    assert_eq!(code(&env.run_with(&["create", "s"], "")), 0);
    for (args, status) in [
        (&["show", "nope"][..], 3),
        (&["show", "../bad"][..], 6),
        (&["list", "--limit", "0"][..], 2),
        (&["verify", "nope"][..], 3),
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = cli(&env.path("root"), args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(writer)
            .output()
            .expect("run");
        assert_eq!(code(&out), status, "{args:?}: {}", describe(&out));
    }
}

// ---------------------------------------------------------------------------------------
// Terminal safety of human output; clipped errors.
// ---------------------------------------------------------------------------------------

#[test]
fn search_snippets_escape_bidirectional_controls() {
    // A search hit's snippet printed U+202E and U+2066 as they were (every other human
    // output escapes them), reordering the rest of the terminal's line.
    let env = Env::new();
    let batch = r#"{"operation_id":"o","events":[{"kind":"session/title","payload":{"title":"plan \u202eevil"}},{"kind":"message/complete","payload":{"message":{"id":"m","role":"user","content":"invoice \u202etxt.exe\u2066 done \u001b[31m red"}}}]}"#;
    let out = env.run_with(&["append", "s", "--create"], &format!("{batch}\n"));
    assert_eq!(code(&out), 0, "{}", describe(&out));
    for query in ["invoice", "plan", "txt"] {
        let out = env.ok(&["search", query]);
        assert_eq!(control_chars(&out), Vec::<char>::new(), "{query}: {out}");
        assert!(out.contains(r"\u{202e}"), "{query}: {out}");
    }
    // JSON stays exact.
    let page: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "search", "invoice"])).expect("json");
    let text = page["hits"][0]["snippet"]["text"].as_str().expect("text");
    assert!(text.contains("\u{202e}txt.exe\u{2066}"), "{text}");
}

#[test]
fn search_snippets_escape_control_characters_and_cut_a_long_word() {
    // ESC and BEL were dropped from a snippet (`zeta<BEL>bell` printed `zetabell`), and a
    // message of one 200,000-character token gave a 200 KB snippet.
    let env = Env::new();
    let input = json_line("o1", "alpha \u{1b}[31mbeta gamma zeta\u{7}bell")
        + &json_line("o2", &format!("upload failed: {}", "A".repeat(200_000)));
    let out = env.run_with(&["append", "s", "--create"], &input);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let out = env.ok(&["search", "gamma"]);
    assert!(
        out.contains(r"  alpha \u{1b}[31mbeta gamma zeta\u{7}bell"),
        "{out}"
    );
    assert_eq!(control_chars(&out), Vec::<char>::new(), "{out}");
    let out = env.ok(&["search", "upload"]);
    assert!(
        out.len() < 400,
        "{} bytes: {}",
        out.len(),
        &out[..400.min(out.len())]
    );
    assert!(out.contains("  upload failed: AAAA"), "{out}");
    // JSON: the same short snippet, the control characters as they are stored.
    let page: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "search", "upload"])).expect("json");
    let text = page["hits"][0]["snippet"]["text"].as_str().expect("text");
    assert!(text.chars().count() < 100 && text.ends_with('…'), "{text}");
    let page: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "search", "gamma"])).expect("json");
    let text = page["hits"][0]["snippet"]["text"].as_str().expect("text");
    assert_eq!(text, "alpha \u{1b}[31mbeta gamma zeta\u{7}bell");
}

/// One batch of one user message `content` under operation id `op`, as a line.
fn json_line(op: &str, content: &str) -> String {
    let batch = serde_json::json!({"operation_id": op, "events": [{"kind": "message/complete",
        "payload": {"message": {"id": op, "role": "user", "content": content}}}]});
    format!("{batch}\n")
}

#[test]
fn human_output_escapes_bidirectional_controls_in_session_ids() {
    // A session id may hold U+202E: `list`, `show`, `search`, `gc` (and the bare ids of
    // `create` and `fork`) printed it raw, so `abc<U+202E>txt.exe` showed as `abcexe.txt`.
    let env = Env::new();
    let id = "abc\u{202e}txt.exe";
    let fork = "f\u{2066}k";
    let shown = r"abc\u{202e}txt.exe";
    assert_eq!(env.ok(&["create", id]), format!("{shown}\n"));
    let batch = r#"{"operation_id":"o","turn_id":"t1","events":[{"kind":"turn/start"},{"kind":"message/complete","payload":{"message":{"id":"m","role":"user","content":"findme"}}},{"kind":"turn/end","payload":{"status":"completed"}}]}"#;
    let out = env.run_with(&["append", id], &format!("{batch}\n"));
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert_eq!(
        control_chars(&String::from_utf8_lossy(&out.stdout)),
        Vec::<char>::new()
    );
    assert_eq!(
        env.ok(&["fork", id, "--after-turn", "t1", "--id", fork]),
        "f\\u{2066}k\n"
    );
    std::thread::sleep(Duration::from_millis(1100));
    let commands: [&[&str]; 6] = [
        &["list"],
        &["show", id],
        &["show", fork],
        &["search", "findme"],
        &["stats", id],
        &["gc", "--older-than", "1s", "--dry-run"],
    ];
    for args in commands {
        let out = env.ok(args);
        assert_eq!(control_chars(&out), Vec::<char>::new(), "{args:?}: {out}");
        assert!(out.contains(shown), "{args:?}: {out}");
    }
    // JSON stays exact.
    let list: serde_json::Value = serde_json::from_str(&env.ok(&["--json", "list"])).expect("json");
    assert_eq!(list["sessions"][0]["session_ref"]["session_id"], id);
}

/// Two ids alike but for their normalisation (NFC `café`, NFD `cafe` + U+0301) printed
/// alike (outside testing, session 38): the one not in NFC shows its combining mark
/// escaped; an NFC id keeps its marks (Devanagari `हिंदी`).
#[test]
fn an_id_not_in_nfc_shows_its_combining_marks_escaped() {
    let env = Env::new();
    for id in ["caf\u{e9}", "cafe\u{301}", "हिंदी"] {
        let created = env.ok(&["create", id]);
        assert_eq!(
            created.trim() == "cafe\\u{301}",
            id == "cafe\u{301}",
            "{created}"
        );
    }
    let out = env.ok(&["list"]);
    assert!(
        out.contains("caf\u{e9} ") && out.contains("cafe\\u{301}"),
        "{out}"
    );
    assert!(out.contains("हिंदी"), "{out}");
}

#[test]
fn list_escapes_invisible_ids_and_aligns_wide_ones() {
    // An id of zero-width characters printed as nothing (a row with no id), and `list`
    // padded its id column by characters, so a CJK id (two columns a character) pushed its
    // row's TURNS and the rest to the right of every other row's.
    let env = Env::new();
    let ids = ["\u{200b}\u{200d}", "会话-一", "plain-id"];
    for id in ids {
        env.ok(&["create", id]);
    }
    let out = env.ok(&["list"]);
    assert!(out.contains(r"\u{200b}\u{200d}"), "{out}");
    // The rest of Unicode's default-ignorable characters, and the line separator, as well:
    // `tag` + U+E0041 + `x` was listed as `tagx`, another session's id (outside testing U1).
    let more = [
        "tag\u{e0041}x",
        "comb\u{34f}x",
        "vs\u{fe0f}x",
        "mongol\u{180e}x",
        "i\u{206a}x",
        "i\u{3164}x",
        "i\u{1d173}x",
        "i\u{fff9}x",
        "lsep\u{2028}x",
    ];
    for id in more {
        env.ok(&["create", id]);
    }
    let listed = env.ok(&["list"]);
    for id in more {
        let escaped: String = id.escape_unicode().to_string();
        let hidden = id.chars().find(|c| !c.is_ascii()).expect("one");
        assert!(!listed.contains(hidden), "{escaped} printed raw:\n{listed}");
        assert!(
            listed.contains(&format!(r"\u{{{:x}}}", hidden as u32)),
            "{listed}"
        );
    }
    // Every line's second column (TURNS, right-aligned in 5) ends at the same terminal
    // column: the width before it, counted as a terminal draws it.
    let ends: Vec<usize> = out
        .lines()
        .take(1 + ids.len())
        .map(|line| {
            let (before, _) = line.split_once("  ").expect("two columns");
            let rest = &line[before.len()..];
            let turns = rest.trim_start().split(' ').next().expect("turns column");
            let wide = before
                .chars()
                .filter(|c| ('\u{4e00}'..='\u{9fff}').contains(c));
            before.chars().count() + wide.count() + rest.find(turns).expect("turns") + turns.len()
        })
        .collect();
    assert!(ends.windows(2).all(|w| w[0] == w[1]), "{ends:?}\n{out}");
}

#[test]
fn human_output_escapes_session_strings_and_errors_clip_huge_values() {
    let env = Env::new();
    let cwd = "/tmp/\u{1b}]0;pwned\u{7}\u{1b}[2J";
    env.ok(&["create", "s", "--cwd", cwd]);
    // Through an export and import too, as the issue found it.
    let export = env.path("s.sqlite");
    env.ok(&["export", "s", export.to_str().expect("path")]);
    env.ok(&["import", export.to_str().expect("path"), "--id", "t"]);
    // (A turn id may not hold a control character since session 38; a right-to-left
    // override it may, and it is escaped as well.)
    let batch = r#"{"operation_id":"o","turn_id":"turn\u202e[1m","events":[{"kind":"turn/start"},{"kind":"session/title","payload":{"title":"\u001b[31mred\u202eevil"}},{"kind":"k\u202e[2J","optional":true},{"kind":"message/complete","payload":{"message":{"id":"m","role":"us\u001ber","content":"\u001b[5mblink"}}},{"kind":"turn/end","payload":{"status":"completed"}}]}"#;
    let out = env.run_with(&["append", "t"], &format!("{batch}\n"));
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert_eq!(unprintable_human_output(&env, "t"), None);
    let show = env.ok(&["show", "t"]);
    assert!(
        show.contains(r"cwd        /tmp/\u{1b}]0;pwned\u{7}\u{1b}[2J"),
        "{show}"
    );
    // JSON stays exact.
    let show: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "show", "t"])).expect("json");
    assert_eq!(show["header"]["cwd"], cwd);

    // A 5 MB unknown kind: refused, and the error line quotes 64 characters of it.
    let huge = format!(
        r#"{{"operation_id":"h","events":[{{"kind":"{}"}}]}}"#,
        "k".repeat(5_000_000)
    );
    let out = env.run_with(&["append", "t"], &format!("{huge}\n"));
    assert_eq!(code(&out), 6, "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.len() < 1000, "{} bytes of error", stderr.len());
    assert!(stderr.contains("… (5000000 bytes)"), "{stderr}");
    // A huge, control-laden operation id (refused since session 39; a conflict of two
    // such batches before) is clipped and escaped as well.
    for op in [
        format!("{}\u{1b}[2J", "o".repeat(100_000)),
        "op\u{1b}[2J".to_owned(),
    ] {
        let line = format!(
            r#"{{"operation_id":{},"events":[{{"kind":"x","optional":true,"payload":1}}]}}"#,
            serde_json::to_string(&op).expect("op")
        );
        let refused = env.run_with(&["append", "t"], &format!("{line}\n"));
        assert_eq!(code(&refused), 6, "{}", describe(&refused));
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.len() < 1000 && control_chars(&stderr).is_empty(),
            "{stderr}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The append rules the README documents.
// ---------------------------------------------------------------------------------------

fn durable(env: &Env, id: &str) -> u64 {
    let show: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "show", id])).expect("json");
    show["durable_sequence"].as_u64().expect("sequence")
}

#[test]
fn operation_hash_covers_payload_text_not_key_order_of_the_batch() {
    let env = Env::new();
    let first = r#"{"operation_id":"a","events":[{"kind":"plan/state","payload":{"x":1,"y":2}}]}"#;
    assert_eq!(code(&env.run_with(&["append", "s", "--create"], first)), 0);
    // The batch's and the event's own keys reordered: the same batch, a no-op retry.
    let same = r#"{"events":[{"payload":{"x":1,"y":2},"kind":"plan/state"}],"operation_id":"a"}"#;
    let retry = env.run_with(&["append", "s"], same);
    assert_eq!(code(&retry), 0, "{}", describe(&retry));
    assert_eq!(durable(&env, "s"), 1);
    // Keys inside the payload reordered, or other whitespace: another batch, a conflict.
    for payload in [r#"{"y":2,"x":1}"#, r#"{"x":1, "y":2}"#] {
        let other = format!(
            r#"{{"operation_id":"a","events":[{{"kind":"plan/state","payload":{payload}}}]}}"#
        );
        let out = env.run_with(&["append", "s"], &other);
        assert_eq!(code(&out), 6, "{}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("conflicts with an earlier batch"));
    }
    assert_eq!(durable(&env, "s"), 1);
}

#[test]
fn nested_turn_start_is_refused_and_turn_end_without_start_records_no_turn() {
    let env = Env::new();
    let start = |op: &str, turn: &str| {
        format!(
            r#"{{"operation_id":"{op}","turn_id":"{turn}","events":[{{"kind":"turn/start"}}]}}"#
        )
    };
    let end = |op: &str| {
        format!(
            r#"{{"operation_id":"{op}","events":[{{"kind":"turn/end","payload":{{"status":"completed"}}}}]}}"#
        )
    };
    assert_eq!(
        code(&env.run_with(&["append", "s", "--create"], &start("a", "outer"))),
        0
    );
    // A second turn/start while "outer" is open: refused whole, naming the open turn.
    let nested = env.run_with(&["append", "s"], &start("b", "inner"));
    assert_eq!(code(&nested), 6, "{}", describe(&nested));
    let stderr = String::from_utf8_lossy(&nested.stderr);
    assert!(stderr.contains(r#"turn "outer""#), "{stderr}");
    // Two starts in one batch: refused whole too (its turn/end is not appended either).
    let double = r#"{"operation_id":"c","events":[{"kind":"turn/end","payload":{"status":"completed"}},{"kind":"turn/start"},{"kind":"turn/start"}]}"#;
    assert_eq!(code(&env.run_with(&["append", "s"], double)), 6);
    assert_eq!(durable(&env, "s"), 1);

    assert_eq!(code(&env.run_with(&["append", "s"], &end("d"))), 0);
    // A turn/end with no open turn: accepted, records no turn, sets the status.
    let stray =
        r#"{"operation_id":"e","events":[{"kind":"turn/end","payload":{"status":"failed"}}]}"#;
    assert_eq!(code(&env.run_with(&["append", "s"], stray)), 0);
    assert_eq!(
        code(&env.run_with(&["append", "s"], &start("f", "next"))),
        0
    );
    assert_eq!(code(&env.run_with(&["append", "s"], &end("g"))), 0);
    let show: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "show", "s"])).expect("json");
    let turns: Vec<(&str, u64, u64)> = show["turns"]
        .as_array()
        .expect("turns")
        .iter()
        .map(|t| {
            (
                t["turn_id"].as_str().expect("id"),
                t["start_sequence"].as_u64().expect("start"),
                t["end_sequence"].as_u64().expect("end"),
            )
        })
        .collect();
    assert_eq!(turns, vec![("outer", 1, 2), ("next", 4, 5)]);
    assert_eq!(show["turn_status"], "completed");
    env.ok(&["verify", "s"]);
}

#[test]
fn migrate_legacy_keeps_numbers_and_nesting_a_value_tree_would_refuse() {
    let env = Env::new();
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let source = env.path("odd.jsonl");
    std::fs::write(
        &source,
        format!(
            "{}\n{{\"role\":\"assistant\",\"content\":\"ok\",\"x\":[1e999,{deep}]}}\n",
            r#"{"id":"a","role":"user","content":[1e999, -0]}"#,
        ),
    )
    .expect("write");
    let record: serde_json::Value = serde_json::from_str(&env.ok(&[
        "--json",
        "migrate-legacy",
        source.to_str().expect("path"),
    ]))
    .expect("json");
    assert_eq!(record["message_count"], 2);
    let id = record["target_id"].as_str().expect("id");
    let page: EventsOut =
        serde_json::from_str(env.ok(&["--json", "events", id, "--inline"]).trim_end())
            .expect("events --json parses");
    let payloads: Vec<&str> = page
        .events
        .iter()
        .filter_map(|e| e.payload.as_deref().map(RawValue::get))
        .collect();
    assert_eq!(payloads.len(), 2);
    assert_eq!(
        payloads[0],
        r#"{"message":{"id":"a","role":"user","content":[1e999, -0]}}"#
    );
    // The message without an id gets a derived one; every other field keeps its text.
    assert!(
        payloads[1].contains(&format!(r#""x":[1e999,{deep}]"#))
            && payloads[1].contains(r#""content":"ok""#),
        "{}",
        payloads[1]
    );
    env.ok(&["verify", id]);
}
