//! `session-store bench --suite lean`, run small through the built binary: every row of the
//! issue's table is printed with a same-run baseline and a ratio, and the writer child it
//! measures memory with appends what it says. Timing targets are never asserted here.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_session-store");

/// The rows of the table, in order (row 6 at two sizes).
const ROWS: [&str; 9] = ["1", "2", "3", "4", "5", "6a", "6b", "7", "8"];

fn run(root: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--root")
        .arg(root)
        .args(args)
        .env_remove("SESSION_STORE_ROOT")
        .output()
        .expect("run session-store")
}

fn ok(root: &Path, args: &[&str]) -> String {
    let out = run(root, args);
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn json(root: &Path, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(root, &all)).expect("one JSON document")
}

#[test]
fn every_row_has_a_baseline_and_a_ratio() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("files");
    let dir_arg = dir.to_str().expect("utf-8");
    let report = json(
        &tmp.path().join("root"),
        &["bench", "--suite", "lean", "--quick", "--dir", dir_arg],
    );
    assert_eq!(report["suite"], "lean");
    assert_eq!(report["quick"], true);
    let rows = report["rows"].as_array().expect("rows");
    let ids: Vec<&str> = rows.iter().filter_map(|r| r["row"].as_str()).collect();
    assert_eq!(ids, ROWS);
    for row in rows {
        let num = |key: &str| row[key].as_f64().unwrap_or(f64::NAN);
        let (value, baseline, ratio) = (num("value"), num("baseline"), num("ratio"));
        assert!(value > 0.0 && baseline > 0.0, "{row}");
        assert!(ratio.is_finite() && ratio > 0.0, "{row}");
        assert!(num("target") > 0.0, "{row}");
        assert!(
            ["<=", ">="].contains(&row["bound"].as_str().unwrap_or("")),
            "{row}"
        );
        assert!(row["met"].is_boolean(), "{row}");
        assert!(!row["measure"].as_str().unwrap_or("").is_empty(), "{row}");
        assert!(
            !row["baseline_label"].as_str().unwrap_or("").is_empty(),
            "{row}"
        );
        if ["1", "2", "3", "4"].contains(&row["row"].as_str().unwrap_or("")) {
            // Single measurements: the ratio is exactly ours over the baseline.
            assert!((ratio - value / baseline).abs() < 1e-9, "{row}");
        }
    }
    let met = rows.iter().filter(|r| r["met"] == true).count();
    assert_eq!(report["met"].as_u64(), Some(met as u64));

    // Row 1's baseline is the JSON Lines file the suite wrote: one ~400-byte message a line.
    let jsonl = std::fs::read_to_string(dir.join("1-chat/messages.jsonl")).expect("jsonl");
    assert_eq!(rows[0]["baseline"].as_f64(), Some(jsonl.len() as f64));
    assert_eq!(jsonl.lines().count(), 200);
    for line in jsonl.lines() {
        let m: Value = serde_json::from_str(line).expect("a message");
        assert!(m["id"].is_string() && m["role"].is_string(), "{line}");
        assert!(line.len().abs_diff(400) <= 2, "{}", line.len());
    }
    // Row 4's budget is fixed; row 3's grows with the messages' JSON.
    assert_eq!(rows[3]["baseline"].as_f64(), Some(48.0 * 1_048_576.0));
    assert!(rows[2]["baseline"].as_f64() > Some(64.0 * 1_048_576.0));
    // The compacted session row 5 reopened is sound and ends with the row's three probes.
    let compacted = dir.join("4-compacted");
    let verified = json(&compacted, &["verify", "lean"]);
    assert_eq!(verified["ok"], true);
    let last = verified["events"].as_u64().expect("events") - 3;
    let tail = json(
        &compacted,
        &["events", "lean", "--after", &last.to_string()],
    );
    let probes: Vec<&str> = tail["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["payload"]["message"]["id"].as_str())
        .collect();
    assert_eq!(probes, ["probe-0", "probe-1", "probe-2"]);
}

#[test]
fn human_output_prints_each_row_and_cleans_up() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    let out = ok(&root, &["bench", "--suite", "lean", "--quick"]);
    for id in ROWS {
        let at = out
            .lines()
            .position(|l| l.starts_with(&format!("{id:>3}  ")))
            .unwrap_or_else(|| panic!("row {id} missing:\n{out}"));
        let figures = out.lines().nth(at + 1).unwrap_or("");
        for word in ["ours", "baseline", "ratio", "target"] {
            assert!(figures.contains(word), "row {id} lacks {word}: {figures}");
        }
        assert!(
            figures.ends_with("MET") || figures.ends_with("MISSED"),
            "{figures}"
        );
    }
    assert!(out.contains("of 9 targets met"), "{out}");
    // Its folder is removed, and the root it made for it (it left an empty root).
    assert!(!root.exists(), "the bench left the root it made");
}

#[test]
fn lean_suite_refuses_the_append_suite_flags() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    for args in [
        &["bench", "--suite", "lean", "--events", "100"][..],
        &["bench", "--suite", "lean", "--durability", "normal"],
        &["bench", "--quick"],
    ] {
        let out = run(&root, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    }
    assert!(!root.join(".bench-lean").exists());
}

#[test]
fn writer_child_appends_what_it_reports() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    let report = json(
        &root,
        &["bench-writer", "--messages", "100", "--compact-every", "10"],
    );
    assert_eq!(report["messages"], 100);
    assert_eq!(report["context_replaces"], 5);
    let json_bytes = report["message_json_bytes"].as_u64().expect("bytes");
    assert!(json_bytes.abs_diff(100 * 400) <= 200, "{report}");
    assert!(
        report["peak_rss_bytes"].as_u64() > Some(1 << 20),
        "{report}"
    );
    // 50 turns of four events, and the five context replaces.
    assert_eq!(json(&root, &["verify", "lean"])["ok"], true);
    let events = json(&root, &["events", "lean", "--limit", "1000"]);
    let events = events["events"].as_array().expect("events");
    assert_eq!(events.len(), 205);
    let replaces = events
        .iter()
        .filter(|e| e["kind"] == "model/context-replace")
        .count();
    assert_eq!(replaces, 5);
}
