//! The `session-store` command line, driven as a user would: the built binary, real
//! folders, real child processes (a second writer, SIGKILL mid-append).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_session-store");

/// A fresh temp folder; sessions live in its `root/`.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The binary with `--root` set and no root in the environment.
    fn command(&self, args: &[&str]) -> Command {
        self.command_at(&self.root(), args)
    }

    /// The binary with `--root root`, run in the temp folder.
    fn command_at(&self, root: &std::path::Path, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg("--root")
            .arg(root)
            .args(args)
            .env_remove("SESSION_STORE_ROOT")
            .current_dir(self.dir.path());
        c
    }

    /// Runs with `stdin` as input.
    fn run_with(&self, args: &[&str], stdin: &str) -> Output {
        self.run_at(&self.root(), args, stdin)
    }

    /// Runs with `--root root` and `stdin` as input.
    fn run_at(&self, root: &std::path::Path, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .command_at(root, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(stdin.as_bytes()).expect("write stdin");
        drop(input);
        child.wait_with_output().expect("wait")
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, "")
    }

    /// Runs, expects status 0, returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        stdout(&out)
    }

    /// Runs with `--json`, expects status 0, parses stdout.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        parse(&self.ok(&all))
    }

    /// Runs, expects `status`, returns stderr.
    fn fails(&self, args: &[&str], status: i32) -> String {
        let out = self.run(args);
        assert_eq!(code(&out), status, "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        if status != 2 {
            assert_eq!(err.lines().count(), 1, "one line on stderr: {err:?}");
        }
        err
    }
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exit status")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn message(id: &str, role: &str, content: &str) -> Value {
    json!({"kind": "message/complete", "payload": {"message": {"id": id, "role": role, "content": content}}})
}

/// A completed turn as JSON Lines: a user batch and an answer batch.
fn turn_lines(n: usize) -> String {
    let t = format!("turn-{n}");
    let user = json!({"operation_id": format!("{t}/user"), "turn_id": t, "events": [
        {"kind": "turn/start"},
        message(&format!("{t}-u"), "user", &format!("question {n}")),
    ]});
    let answer = json!({"operation_id": format!("{t}/answer"), "turn_id": t, "events": [
        message(&format!("{t}-a"), "assistant", &format!("answer {n}")),
        {"kind": "session/title", "payload": {"title": "CLI test"}},
        {"kind": "turn/end", "payload": {"status": "completed"}},
    ]});
    format!("{user}\n{answer}\n")
}

/// `chat` with `turns` completed turns.
fn chat(env: &Env, id: &str, turns: usize) {
    env.ok(&["create", id]);
    let input: String = (1..=turns).map(turn_lines).collect();
    let out = env.run_with(&["append", id], &input);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn create_list_show_and_platform_root() {
    let env = Env::new();
    assert_eq!(
        env.ok(&["create", "alpha", "--cwd", "/work/a"]).trim(),
        "alpha"
    );
    let random = env.json(&["create"])["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(random.len(), 32);
    env.fails(&["create", "alpha"], 4);
    chat(&env, "beta", 1);

    let page = env.json(&["list"]);
    let ids: Vec<&str> = page["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["session_ref"]["session_id"].as_str().expect("id"))
        .collect();
    let mut expected = vec!["alpha", "beta", random.as_str()];
    expected.sort_unstable();
    assert_eq!(ids, expected, "id order");
    assert!(page["next_cursor"].is_null());
    assert_eq!(page["sessions"][0]["session_ref"]["host_id"], "local");
    let first = env.json(&["list", "--limit", "1", "--host", "laptop"]);
    assert_eq!(first["sessions"][0]["session_ref"]["host_id"], "laptop");
    let cursor = first["next_cursor"].as_str().expect("cursor").to_owned();
    let second = env.json(&["list", "--limit", "1", "--cursor", &cursor]);
    assert_eq!(
        second["sessions"][0]["session_ref"]["session_id"],
        expected[1]
    );
    let human = env.ok(&["list"]);
    assert!(
        human.contains("beta") && human.contains("CLI test"),
        "{human}"
    );
    // Out of the range `--help` gives (1..=100): a usage error, as for every number.
    env.fails(&["list", "--limit", "1000"], 2);

    let show = env.json(&["show", "beta"]);
    assert_eq!(show["header"]["session_id"], "beta");
    assert_eq!(show["durable_sequence"], 5);
    assert_eq!(show["turns"][0]["turn_id"], "turn-1");
    assert!(show["writer"].is_null());
    assert!(show["lease"]["generation"].as_u64().expect("generation") >= 1);
    assert!(show["lease"]["pid"].as_u64().expect("pid") > 0);
    assert!(
        show["tables"]
            .as_array()
            .expect("tables")
            .iter()
            .any(|t| t["table"] == "events")
    );
    let human = env.ok(&["show", "alpha"]);
    assert!(
        human.contains("cwd        /work/a") && human.contains("writer     free"),
        "{human}"
    );
    // A session that never had a turn says so (it printed "status " and nothing after).
    assert!(
        human.contains("turns      0 ended, 0 messages, status none\n"),
        "{human}"
    );
    // Its tables' sizes end in one column (`operation_key_chunks` pushed its size out of
    // line: outside testing, session 38).
    let table_lines: Vec<&str> = human
        .lines()
        .skip_while(|l| !l.starts_with("file "))
        .skip(1)
        .collect();
    assert!(
        table_lines
            .iter()
            .any(|l| l.contains("operation_key_chunks")),
        "{human}"
    );
    let ends: Vec<Option<usize>> = table_lines.iter().map(|l| l.find("B  (")).collect();
    assert!(ends.iter().all(|e| e.is_some() && *e == ends[0]), "{human}");

    // Without --root and $SESSION_STORE_ROOT: the platform data dir.
    let data = env.path("data");
    let out = Command::new(BIN)
        .args(["create", "here"])
        .env_remove("SESSION_STORE_ROOT")
        .env("XDG_DATA_HOME", &data)
        .output()
        .expect("run");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(data.join("session-store/here/session.sqlite").is_file());
    let out = Command::new(BIN)
        .args(["show", "here", "--json"])
        .env("SESSION_STORE_ROOT", data.join("session-store"))
        .output()
        .expect("run");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn append_history_events_stats_and_the_sqlite3_shell() {
    let env = Env::new();
    let big = "x".repeat(100 * 1024);
    let mut input = turn_lines(1);
    input.push('\n'); // blank lines are skipped
    input.push_str(&turn_lines(2));
    input.push_str(&format!(
        "{}\n",
        json!({"operation_id": "tool-log", "events": [
            {"kind": "tool/log", "optional": true, "payload": {"log": big}},
        ]})
    ));
    let out = env.run_with(
        &["append", "made", "--create", "--sync", "each", "--json"],
        &input,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out).lines().map(parse).collect();
    assert_eq!(lines.len(), 5);
    let mut next = 1;
    for l in &lines {
        assert_eq!(l["first_seq"], next);
        assert!(l["durable_sequence"].as_u64() >= l["last_seq"].as_u64());
        next = l["last_seq"].as_u64().expect("seq") + 1;
    }
    assert_eq!(lines[0]["operation_id"], "turn-1/user");
    assert_eq!(lines[4]["last_seq"], 11);

    // A retry is idempotent; the human summary names the durable sequence, and counts
    // the retried batches as retries, not as appended (nothing was added).
    let again = env.run_with(&["append", "made"], &turn_lines(1));
    assert_eq!(code(&again), 0);
    let summary = stdout(&again);
    assert!(summary.contains("durable sequence 11"), "{summary}");
    assert!(
        summary.starts_with("appended 0 batches (0 events, ")
            && summary.contains("2 retries of batches already stored"),
        "{summary}"
    );
    // A retry and a new batch in one run (in another session): one appended, one retry.
    assert_eq!(
        code(&env.run_with(&["append", "other", "--create"], &turn_lines(1))),
        0
    );
    let first = turn_lines(1)
        .lines()
        .next()
        .map(str::to_owned)
        .unwrap_or_default();
    let extra = json!({"operation_id": "extra", "events": [message("m-extra", "user", "more")]});
    let summary = stdout(&env.run_with(&["append", "other"], &format!("{first}\n{extra}\n")));
    assert!(
        summary.starts_with("appended 1 batch (1 event, ")
            && summary.contains("(1 retry of a batch already stored)")
            && summary.contains("durable sequence 6"),
        "{summary}"
    );
    // A `--json` line names the operation as stored, spaces around it taken off (it said
    // "  spaced  " where `events --json` and Python say "spaced": outside testing C3).
    let spaced = json!({"operation_id": "  spaced  ", "events": [message("m-sp", "user", "s")]});
    let out = env.run_with(&["append", "other", "--json"], &format!("{spaced}\n"));
    assert_eq!(parse(stdout(&out).trim())["operation_id"], "spaced");

    let history = env.json(&["history", "made"]);
    let messages = history["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[0]["inline"]["content"], "question 1");
    let page = env.json(&["history", "made", "--limit", "2"]);
    assert_eq!(page["messages"][0]["position"], 3);
    let cursor = page["next_cursor"].as_str().expect("cursor").to_owned();
    let older = env.json(&["history", "made", "--limit", "2", "--cursor", &cursor]);
    assert_eq!(older["messages"][0]["position"], 1);
    assert!(env.ok(&["history", "made"]).contains("answer 2"));

    let events = env.json(&["events", "made", "--after", "9"]);
    let list = events["events"].as_array().expect("events");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["seq"], 10);
    assert_eq!(list[1]["kind"], "tool/log");
    assert!(
        list[1]["payload"].is_null(),
        "a blob-backed payload comes as a ref"
    );
    assert_eq!(
        list[1]["content_ref"]["bytes"]
            .as_u64()
            .map(|b| b > 100 * 1024),
        Some(true)
    );
    let inline = env.json(&["events", "made", "--after", "10", "--inline"]);
    assert_eq!(
        inline["events"][0]["payload"]["log"].as_str().map(str::len),
        Some(big.len())
    );
    let first = env.json(&["events", "made", "--limit", "3"]);
    assert_eq!(first["events"].as_array().map(Vec::len), Some(3));
    assert_eq!(first["next_after"], 3);
    // At the durable sequence: an empty last page. Past it: refused, as Python and the
    // library's `observe` refuse it (outside testing D1: exit 0 with an empty page).
    let last = env.json(&["events", "made", "--after", "11"]);
    assert_eq!(last["events"].as_array().map(Vec::len), Some(0));
    assert_eq!(last["next_after"], Value::Null);
    let err = env.fails(&["events", "made", "--after", "12"], 6);
    assert!(
        err.contains(
            "no events after sequence 12: it is past the last sequence 11 of session made"
        ),
        "{err}"
    );
    assert!(env.ok(&["events", "made"]).contains("<blob "));

    let stats = env.json(&["stats", "made"]);
    assert_eq!(stats["events"], 11);
    let kinds = stats["kinds"].as_array().expect("kinds");
    let count = |kind: &str| {
        kinds
            .iter()
            .find(|k| k["kind"] == kind)
            .map(|k| k["count"].clone())
    };
    assert_eq!(count("message/complete"), Some(json!(4)));
    assert_eq!(count("tool/log"), Some(json!(1)));
    assert_eq!(stats["blobs"]["count"], 1);
    assert!(stats["blobs"]["compression_ratio"].as_f64().expect("ratio") > 10.0);
    assert!(env.ok(&["stats", "made"]).contains("compression ratio"));

    // The file `append` created is readable by Debian's sqlite3.
    let file = env.root().join("made/session.sqlite");
    let out = Command::new("/usr/bin/sqlite3")
        .arg(&file)
        .arg("SELECT count(*) FROM events; SELECT role || ':' || content_preview FROM transcript ORDER BY seq LIMIT 1;")
        .output()
        .expect("sqlite3");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "11\nuser:question 1\n");
}

#[test]
fn append_reports_and_keeps_the_batches_before_a_bad_line() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let good = json!({"operation_id": "one", "events": [message("m1", "user", "hi")]});
    for (bad, what) in [
        ("{not json".to_owned(), "not a batch"),
        (json!({"events": []}).to_string(), "operation_id"),
        (
            json!({"operation_id": "x", "events": [{"kind": "no/such-kind"}]}).to_string(),
            "unknown",
        ),
        (
            json!({"operation_id": "one", "events": [message("m1", "user", "changed")]})
                .to_string(),
            "conflicts",
        ),
        // Keys a batch or an event does not have are refused, naming the key: they were
        // ignored, so a misspelt turn id or `optional` was dropped and the batch appended.
        (
            json!({"operation_id": "x", "turn_idd": "t", "events": [message("m9", "user", "a")]})
                .to_string(),
            "unknown field `turn_idd`",
        ),
        (
            json!({"operation_id": "x", "evnts": [], "events": [message("m9", "user", "a")]})
                .to_string(),
            "unknown field `evnts`",
        ),
        (
            json!({"operation_id": "x", "events": [
                {"kind": "session/title", "payload": {"title": "t"}, "optinal": true}
            ]})
            .to_string(),
            "unknown field `optinal`",
        ),
        // An event's output-only fields were dropped: a `content_ref` without a payload
        // stored the event with no payload at all.
        (
            json!({"operation_id": "x", "events": [
                {"kind": "session/title", "payload": {"title": "t"}, "seq": 7}
            ]})
            .to_string(),
            "events[0].seq is not input",
        ),
        (
            json!({"operation_id": "x", "events": [{"kind": "tool/log", "optional": true,
                "content_ref": {"digest": "ab", "bytes": 2, "media_type": "application/json"}}
            ]})
            .to_string(),
            "events[0].content_ref is not input",
        ),
        // Whatever their value: `null` and `0` passed unnoticed, a wrong type was "expected
        // a JSON object" (outside testing C2).
        (
            json!({"operation_id": "x", "events": [
                {"kind": "tool/log", "optional": true, "payload": {"a": 1}, "content_ref": null}
            ]})
            .to_string(),
            "events[0].content_ref is not input",
        ),
        (
            json!({"operation_id": "x", "events": [
                {"kind": "tool/log", "optional": true, "content_ref": "abc"}
            ]})
            .to_string(),
            "events[0].content_ref is not input",
        ),
        (
            json!({"operation_id": "x", "events": [
                {"kind": "session/title", "payload": {"title": "t"}, "seq": 0}
            ]})
            .to_string(),
            "events[0].seq is not input",
        ),
        (
            json!({"operation_id": "x", "events": [
                {"kind": "session/title", "payload": {"title": "t"}, "seq": null}
            ]})
            .to_string(),
            "events[0].seq is not input",
        ),
        // A lone surrogate escape was "unexpected end of hex escape": now said as such,
        // naming the key whose value holds it.
        (
            r#"{"operation_id":"x","events":[{"id":"\ud800","kind":"tool/log","optional":true}]}"#
                .to_owned(),
            r#"the value of "id" holds a lone UTF-16 surrogate escape"#,
        ),
        (
            r#"{"operation_id":"x","events":[{"kind":"session/title","payload":{"title":"a\udc00"}}]}"#
                .to_owned(),
            r#"the value of "title" holds a lone UTF-16 surrogate escape (\ud800-\udfff not in a high-low pair), which is not valid Unicode (column 17 of the payload)"#,
        ),
        (
            r#"{"operation_id":"x","events":[{"kind":"message/complete","payload":{"message":{"id":"m","role":"\ud800\u0041","content":"x"}}}]}"#
                .to_owned(),
            "a string holds a lone UTF-16 surrogate escape",
        ),
    ] {
        let out = env.run_with(
            &["append", "s", "--json"],
            &format!("{good}\n{bad}\n{good}\n"),
        );
        assert_eq!(code(&out), 6, "{bad}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("line 2") && stderr(&out).contains(what),
            "{}",
            stderr(&out)
        );
        let printed: Vec<Value> = stdout(&out).lines().map(parse).collect();
        assert_eq!(printed.len(), 1, "only the batch before the bad line");
        assert_eq!(printed[0]["last_seq"], 1);
    }
    assert_eq!(env.json(&["show", "s"])["durable_sequence"], 1);
    // Without --json the summary of what was kept is printed too (it printed nothing, so
    // the batches kept before the bad line went unreported); a bad first line adds none.
    let two = json!({"operation_id": "two", "events": [message("m2", "user", "ho")]});
    let out = env.run_with(&["append", "s"], &format!("{good}\n{two}\n{{bad\n"));
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert!(stderr(&out).contains("line 3"), "{}", stderr(&out));
    let summary = stdout(&out);
    assert!(
        summary.starts_with("appended 1 batch (1 event, ")
            && summary.contains("(1 retry of a batch already stored)")
            && summary.contains("durable sequence 2"),
        "{summary}"
    );
    let out = env.run_with(&["append", "s"], "{bad\n");
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    env.fails(&["append", "missing"], 3);
    env.fails(&["append", "s", "--file", "no-such-file.jsonl"], 3);
    let file = env.path("batches.jsonl");
    std::fs::write(&file, turn_lines(1)).expect("write");
    let out = env.run(&[
        "append",
        "s",
        "--file",
        file.to_str().expect("utf-8"),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2);

    // `append --create` whose first batch is bad (not JSON, a payload off its schema, an
    // empty operation id, two turn/starts) creates nothing: it used to leave an empty
    // session behind.
    let good = json!({"operation_id": "one", "events": [message("m1", "user", "hi")]});
    for bad in [
        "{not json".to_owned(),
        json!({"operation_id": "t", "events": [{"kind": "session/title", "payload": {"title": 7}}]})
            .to_string(),
        json!({"operation_id": "", "events": [{"kind": "turn/start"}]}).to_string(),
        json!({"operation_id": "n", "events": [{"kind": "turn/start"}, {"kind": "turn/start"}]})
            .to_string(),
    ] {
        let out = env.run_with(&["append", "fresh", "--create", "--json"], &format!("\n{bad}\n{good}\n"));
        assert_eq!(code(&out), 6, "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("line 2"), "{}", stderr(&out));
        // serde_json's own "at line 1 column C" (of the line, or of the payload) is not
        // given as a line of the input: it said "line 2: … at line 1 column 2".
        assert!(!stderr(&out).contains("line 1"), "{}", stderr(&out));
        assert_eq!(stdout(&out), "", "{bad}");
        env.fails(&["show", "fresh"], 3);
        assert!(!env.root().join("fresh").exists(), "{bad}");
    }
    // A good first batch is appended with the create and reported; a bad later line keeps it.
    let out = env.run_with(
        &["append", "fresh", "--create", "--json"],
        &format!("{good}\n{{bad\n"),
    );
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    let printed: Vec<Value> = stdout(&out).lines().map(parse).collect();
    assert_eq!(printed.len(), 1, "{printed:?}");
    assert_eq!(printed[0]["operation_id"], "one");
    assert_eq!(printed[0]["last_seq"], 1);
    assert_eq!(env.json(&["show", "fresh"])["durable_sequence"], 1);
    // Empty input still creates the empty session it names.
    let out = env.run_with(&["append", "empty", "--create"], "");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.json(&["show", "empty"])["durable_sequence"], 0);
}

#[test]
fn fork_rewind_export_import_delete_and_verify() {
    let env = Env::new();
    chat(&env, "parent", 2);
    assert_eq!(
        env.ok(&["fork", "parent", "--after-turn", "turn-1", "--id", "child"])
            .trim(),
        "child"
    );
    let rewound = env.json(&["rewind", "parent", "--before-turn", "turn-2"]);
    assert_eq!(rewound["origin"], "rewind");
    let rewound = rewound["session_id"].as_str().expect("id").to_owned();
    env.fails(&["fork", "parent", "--after-turn", "no-such-turn"], 6);
    env.fails(
        &["fork", "parent", "--after-turn", "turn-1", "--id", "child"],
        4,
    );
    env.fails(&["fork", "nobody", "--after-turn", "turn-1"], 3);
    let child = env.json(&["show", "child"]);
    assert_eq!(child["header"]["parent_id"], "parent");
    assert_eq!(child["inherited_events"], 5);
    assert_eq!(child["lineage"][0]["ancestor_id"], "parent");
    assert_eq!(env.json(&["show", &rewound])["durable_sequence"], 5);
    assert_eq!(
        env.json(&["show", "parent"])["dependents"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    // A row a fork SIGKILLed before its publication left names no session: `show` does
    // not list it as a dependent (it did, as if that session inherited from this one).
    rusqlite::Connection::open(env.root().join("parent").join("session.sqlite"))
        .and_then(|c| {
            c.execute(
                "INSERT INTO dependents (child_id, through_seq) VALUES ('ghost', 5)",
                [],
            )
        })
        .expect("plant");
    assert_eq!(
        env.json(&["show", "parent"])["dependents"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert!(!env.ok(&["show", "parent"]).contains("ghost"));

    let export = env.path("parent.sqlite");
    let export_arg = export.to_str().expect("utf-8");
    let report = env.json(&["export", "parent", export_arg]);
    assert_eq!(
        (report["commits"].clone(), report["events"].clone()),
        (json!(4), json!(10))
    );
    // The existing file is named as the export destination, not as a session.
    let exists = env.fails(&["export", "parent", export_arg], 4);
    assert!(
        exists.contains("export destination") && !exists.contains("session "),
        "{exists}"
    );
    assert_eq!(
        env.ok(&["import", export_arg, "--id", "copy", "--cwd", "/elsewhere"])
            .trim(),
        "copy"
    );
    env.fails(&["import", export_arg, "--id", "copy"], 4);
    env.fails(&["import", "missing.sqlite"], 3);
    let copy = env.json(&["show", "copy"]);
    assert_eq!(copy["header"]["origin"], "canonical-import");
    assert_eq!(copy["header"]["cwd"], "/elsewhere");

    for target in ["parent", "child", export_arg] {
        let v = env.json(&["verify", target]);
        assert_eq!(v["ok"], true, "{target}");
    }
    assert_eq!(env.json(&["verify", "child"])["events"], 5);
    assert!(env.ok(&["verify", "copy"]).starts_with("ok: copy"));
    env.fails(&["verify", "nothing"], 3);

    // A payload changed behind the library's back: the row no longer matches its check;
    // with the check cleared too (as in a row written before schema 7), the operation
    // hash no longer matches.
    let tampered = env.path("tampered.sqlite");
    std::fs::copy(&export, &tampered).expect("copy");
    let tamper = |sql: &str| {
        let out = Command::new("/usr/bin/sqlite3")
            .arg(&tampered)
            .arg(sql)
            .output()
            .expect("sqlite3");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    };
    tamper(
        r#"UPDATE events SET payload = '{"title":"forged"}' WHERE kind = (SELECT code FROM event_kinds WHERE kind = 'session/title') AND seq = 4"#,
    );
    let tampered_arg = tampered.to_str().expect("utf-8");
    let out = env.run(&["verify", tampered_arg, "--json"]);
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert_eq!(parse(&stdout(&out))["ok"], false);
    assert!(
        stderr(&out).contains("event 4: the row does not match its check"),
        "{}",
        stderr(&out)
    );
    tamper("UPDATE events SET payload_check = NULL WHERE seq = 4");
    let out = env.run(&["verify", tampered_arg, "--json"]);
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert!(stderr(&out).contains("hash"), "{}", stderr(&out));
    // An import refused for what the file holds names the file (it said only "corrupt
    // session store: commit at 4: …" or "…: file is not a database").
    let refused = env.fails(&["import", tampered_arg, "--id", "forged"], 6);
    assert!(
        refused.starts_with(&format!(
            "session-store: error: cannot import {tampered_arg}: corrupt session store: "
        )) && refused.contains("hash"),
        "{refused}"
    );
    let garbage = env.path("garbage.sqlite");
    std::fs::write(&garbage, b"not a database at all").expect("write");
    let garbage_arg = garbage.to_str().expect("utf-8");
    let refused = env.fails(&["verify", garbage_arg], 6);
    // SQLite's error is the typed source: its text is printed once, not restated.
    assert_eq!(
        refused.matches("file is not a database").count(),
        1,
        "{refused}"
    );
    let refused = env.fails(&["import", garbage_arg], 6);
    assert!(
        refused.starts_with(&format!(
            "session-store: error: cannot import {garbage_arg}: "
        )) && refused.matches("file is not a database").count() == 1,
        "{refused}"
    );
    let newer = env.path("newer.sqlite");
    std::fs::copy(&export, &newer).expect("copy");
    rusqlite::Connection::open(&newer)
        .and_then(|c| {
            c.execute_batch(&format!(
                "PRAGMA user_version = {}",
                session_store::format::SCHEMA_VERSION + 1
            ))
        })
        .expect("user_version");
    let newer_arg = newer.to_str().expect("utf-8");
    let refused = env.fails(&["import", newer_arg, "--id", "newer"], 6);
    assert_eq!(
        refused.trim_end(),
        format!(
            "session-store: error: cannot import {newer_arg}: not supported by this build: \
             file {newer_arg} has schema version {}, newer than {} (the newest this build \
             reads): a newer session-store reads it",
            session_store::format::SCHEMA_VERSION + 1,
            session_store::format::SCHEMA_VERSION
        ),
    );

    // Deleting the parent keeps its forks whole.
    assert_eq!(env.json(&["delete", "parent"])["deleted"], "parent");
    env.fails(&["show", "parent"], 3);
    env.fails(&["delete", "parent"], 3);
    assert_eq!(env.json(&["verify", "child"])["events"], 5);
    assert!(
        env.json(&["show", "child"])["lineage"]
            .as_array()
            .expect("lineage")
            .is_empty()
    );
    env.fails(&["delete", "child", "--wait", "-1"], 2);
}

#[test]
fn migrate_legacy_rebuild_catalog_and_demo() {
    let env = Env::new();
    let legacy = env.path("legacy.jsonl");
    std::fs::write(
        &legacy,
        "{\"id\":\"l1\",\"role\":\"user\",\"content\":\"old question\"}\n{\"role\":\"assistant\",\"content\":\"old answer\"}\n",
    )
    .expect("write");
    let legacy_arg = legacy.to_str().expect("utf-8");
    let record = env.json(&["migrate-legacy", legacy_arg]);
    assert_eq!(record["message_count"], 2);
    assert_eq!(record["reused"], false);
    let id = record["target_id"].as_str().expect("id").to_owned();
    assert_eq!(env.json(&["migrate-legacy", legacy_arg])["reused"], true);
    assert_eq!(
        env.json(&["history", &id])["messages"][1]["inline"]["content"],
        "old answer"
    );
    env.fails(&["migrate-legacy", "missing.jsonl"], 3);
    std::fs::write(&legacy, "{\"id\":1}\n{\"id\":\"x\"}\n").expect("write");
    env.fails(&["migrate-legacy", legacy_arg], 6);

    chat(&env, "other", 1);
    std::fs::remove_file(env.root().join(".catalog/catalog.sqlite")).expect("remove catalog");
    assert_eq!(env.json(&["rebuild-catalog"])["sessions"], 2);
    assert!(env.ok(&["rebuild-catalog"]).contains("2 sessions"));

    let demo = env.json(&["demo"]);
    let sessions = demo["sessions"].as_array().expect("sessions");
    assert!(sessions.len() >= 3);
    // The model calls it reports are the usage the sessions hold.
    let listed = env.json(&["list"]);
    let total = |field: &str| -> u64 {
        listed["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .filter(|s| sessions.contains(&s["session_ref"]["session_id"]))
            .map(|s| s["usage"]["total"][field].as_u64().expect("count"))
            .sum()
    };
    assert!(demo["usage"]["calls"].as_u64() > Some(sessions.len() as u64));
    assert_eq!(Some(total("events")), demo["usage"]["calls"].as_u64());
    assert_eq!(
        Some(total("input_tokens")),
        demo["usage"]["input_tokens"].as_u64()
    );
    assert_eq!(
        Some(total("output_tokens")),
        demo["usage"]["output_tokens"].as_u64()
    );
    let first = sessions[0].as_str().expect("id");
    assert!(env.json(&["verify", first])["turns"].as_u64() > Some(0));
    // Without --root, demo alone writes to ./session-store-demo, also when
    // $SESSION_STORE_ROOT names a root (a user's real one got the demo's sessions).
    let real = env.path("real-root");
    let out = Command::new(BIN)
        .args(["--json", "demo"])
        .env("SESSION_STORE_ROOT", &real)
        .current_dir(env.dir.path())
        .output()
        .expect("demo");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!real.exists(), "demo wrote into $SESSION_STORE_ROOT");
    // One line of JSON, as every other command's --json.
    assert_eq!(out.stdout.iter().filter(|b| **b == b'\n').count(), 1);
    assert!(
        env.path("session-store-demo")
            .join(first)
            .join("session.sqlite")
            .is_file()
    );
}

#[test]
fn exit_codes_for_usage_other_errors_and_bad_ids() {
    let env = Env::new();
    env.fails(&["no-such-command"], 2);
    env.fails(&["show"], 2);
    env.fails(&["append", "x", "--sync", "sometimes"], 2);
    env.fails(&["bench", "--events", "0"], 2);
    env.fails(&["show", "missing"], 3);
    env.fails(&["history", "missing"], 3);
    env.fails(&["events", "missing"], 3);
    env.fails(&["stats", "missing"], 3);
    env.fails(&["export", "missing", "out.sqlite"], 3);
    env.fails(&["show", "../escape"], 6);
    env.fails(&["create", "con"], 6);
    // A host id with a control character (it is printed in refs and messages) or a blank
    // one is a usage error for every command, `create` too; nothing is created.
    for host in ["a\nb", "a\u{1b}[31m", "tab\t", "", " "] {
        env.fails(&["--host", host, "create", "h"], 2);
        env.fails(&["--host", host, "list"], 2);
    }
    // An empty working directory is refused by the library (6), nothing created.
    let err = env.fails(&["create", "c", "--cwd", ""], 6);
    assert!(err.contains("cwd"), "{err}");
    env.fails(&["show", "c"], 3);
    env.fails(&["show", "h"], 3);
    // As a `list` or `search` filter too (catalog_extras.rs,
    // `an_empty_cwd_filter_is_refused_as_create_refuses_it`).
    // A root that cannot be a folder: refused as "not a folder" (6) whether the command
    // reads the root or would make it (`a_root_that_is_a_file_is_refused_as_not_a_folder`).
    let file = env.path("a-file");
    std::fs::write(&file, b"").expect("write");
    for (command, status) in [("list", 6), ("create", 6)] {
        let out = Command::new(BIN)
            .arg("--root")
            .arg(&file)
            .arg(command)
            .output()
            .expect("run");
        assert_eq!(code(&out), status, "{command}: {}", stderr(&out));
        assert_eq!(stderr(&out).lines().count(), 1);
        assert!(stderr(&out).starts_with("session-store: error: "));
    }
}

/// Commands that read or change existing sessions never create the root: a mistyped
/// `--root` is "no root at …" (status 3, as `serve` has it) and leaves nothing on disk
/// (`gc --dry-run` and `list` used to make the folder and its `.catalog`). Commands that
/// create sessions make it.
#[test]
fn a_missing_root_is_not_found_and_only_creating_commands_make_it() {
    let env = Env::new();
    let refused: &[&[&str]] = &[
        &["list"],
        &["search", "x"],
        &["show", "s"],
        &["history", "s"],
        &["events", "s"],
        &["stats", "s"],
        &["rename", "s", "t"],
        &["fork", "s", "--after-turn", "t"],
        &["rewind", "s", "--before-turn", "t"],
        &["export", "s", "out.sqlite"],
        &["delete", "s"],
        &["gc", "--older-than", "1d", "--dry-run"],
        &["rebuild-catalog"],
        &["append", "s"],
        &["verify", "s"],
    ];
    for args in refused {
        let err = env.fails(args, 3);
        assert!(err.contains("no root at"), "{args:?}: {err}");
        assert!(!env.root().exists(), "{args:?} made the root");
    }
    assert!(!env.path("out.sqlite").exists());
    // `restore` makes the root, but not before it has a Litestream to restore with.
    let missing = env.path("no-litestream");
    let err = env.fails(
        &[
            "restore",
            "--from",
            "file:///nowhere",
            "--all",
            "--litestream",
            missing.to_str().expect("path"),
        ],
        3,
    );
    assert!(err.contains("no-litestream"), "{err}");
    assert!(!env.root().exists(), "restore made the root");
    // Nor do the commands that make sessions when their id is refused.
    env.fails(&["create", "../bad"], 6);
    std::fs::write(env.path("x.sqlite"), b"x").expect("write");
    env.fails(&["import", "x.sqlite", "--id", "../bad"], 6);
    assert!(!env.root().exists(), "a refused id made the root");
    // Nor does an import whose file is refused (it is validated inside the root).
    env.fails(&["import", "x.sqlite"], 6);
    assert!(!env.root().exists(), "a refused import left the root");
    // A root whose parents are missing too: the refused command removes every folder it
    // made, not only the root (the parents were left behind).
    let deep = env.path("a/b/root");
    std::fs::write(env.path("bad.jsonl"), b"not a transcript\n").expect("write");
    let run_deep = |args: &[&str], stdin: &str| env.run_at(&deep, args, stdin);
    // Refusals that come after a build began in the root's `.staging` (which stayed
    // behind, and with it the root and its parents): an export whose payload was edited
    // (refused while it is copied), a first batch the fold refuses, a restore from a
    // replica that is not there (Litestream faked: it is not reached).
    let source = Env::new();
    source.ok(&["create", "src"]);
    let out = source.run_with(
        &["append", "src"],
        "{\"operation_id\":\"t\",\"events\":[{\"kind\":\"session/title\",\"payload\":{\"title\":\"t\"}}]}\n",
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let edited = env.path("edited.sqlite");
    source.ok(&["export", "src", edited.to_str().expect("path")]);
    common::sqlite3(
        &edited,
        "UPDATE events SET payload = '{\"title\":\"u\"}' WHERE seq = 1",
    );
    let fake = env.path("litestream");
    std::fs::write(&fake, "#!/bin/sh\necho v0.5.17\n").expect("write");
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let nowhere = format!("file://{}", env.path("no-replica").display());
    let fake = fake.to_str().expect("path");
    for (args, stdin, status) in [
        (&["import", "x.sqlite"][..], "", 6),
        (&["migrate-legacy", "bad.jsonl"][..], "", 6),
        (&["append", "s", "--create"][..], "not a batch\n", 6),
        (&["import", "edited.sqlite"][..], "", 6),
        (
            &["append", "s", "--create"][..],
            "{\"operation_id\":\"o\",\"events\":[{\"kind\":\"turn/end\"}]}\n",
            6,
        ),
        (
            &["restore", "--from", &nowhere, "--all", "--litestream", fake][..],
            "",
            3,
        ),
    ] {
        let out = run_deep(args, stdin);
        assert_eq!(code(&out), status, "{args:?}: {}", stderr(&out));
        assert!(!env.path("a").exists(), "{args:?} left the root's parents");
    }
    // Folders that were there stay, with what they hold.
    std::fs::create_dir(env.path("a")).expect("mkdir");
    std::fs::write(env.path("a/keep"), b"x").expect("write");
    assert_eq!(code(&run_deep(&["import", "x.sqlite"], "")), 6);
    assert!(!env.path("a/b").exists(), "a refused import left a/b");
    assert!(
        env.path("a/keep").exists(),
        "a folder that was there lost a file"
    );
    env.ok(&["create", "s"]);
    assert!(env.root().is_dir());
    assert!(env.ok(&["list"]).contains('s'));
    // `append --create` makes the root too.
    std::fs::remove_dir_all(env.root()).expect("remove root");
    let out = env.run_with(
        &["append", "s", "--create"],
        "{\"operation_id\":\"a\",\"events\":[{\"kind\":\"diagnostic\"}]}\n",
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(env.json(&["show", "s"])["durable_sequence"], 1);
}

#[test]
fn replicate_run_without_a_litestream_writes_no_config() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let missing = env.path("no-litestream");
    let missing = missing.to_str().expect("path");
    let replica = format!("file://{}", env.path("replica").display());
    let run = [
        "replicate",
        "--replica",
        &replica,
        "--run",
        "--litestream",
        missing,
    ];
    let err = env.fails(&run, 3);
    assert!(err.contains("no-litestream"), "{err}");
    // The default config in the root was written before Litestream was looked for.
    assert!(
        !env.root().join(".litestream.yml").exists(),
        "a failed --run left its config in the root"
    );
    // A --config-out file is left as it was (it was truncated and rewritten).
    let mine = env.path("mine.yml");
    std::fs::write(&mine, "# mine\n").expect("write");
    let mut with_out = run.to_vec();
    with_out.extend(["--config-out", mine.to_str().expect("path")]);
    env.fails(&with_out, 3);
    assert_eq!(std::fs::read_to_string(&mine).expect("read"), "# mine\n");
}

/// A folder without a session file under the root takes an id no command can list, show
/// or delete: every command that would make that session says what is in the way (exit
/// 4), where `create` said "already exists" and `append --create` "not found" (exit 3).
#[test]
fn a_folder_without_a_session_file_is_named_as_in_the_way() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    std::fs::create_dir(env.root().join("orphan")).expect("mkdir");
    env.fails(&["show", "orphan"], 3);
    let batch = "{\"operation_id\":\"o\",\"events\":[{\"kind\":\"session/title\",\"payload\":{\"title\":\"t\"}}]}\n";
    std::fs::write(env.path("one.jsonl"), batch).expect("write");
    for (args, stdin) in [
        (&["create", "orphan"][..], ""),
        (&["append", "orphan", "--create"][..], batch),
        (&["append", "orphan", "--create"][..], ""),
        (
            &["append", "orphan", "--create", "--file", "one.jsonl"][..],
            "",
        ),
    ] {
        let out = env.run_with(args, stdin);
        assert_eq!(code(&out), 4, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("orphan is in the way: a folder without a session file"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert_eq!(
        std::fs::read_dir(env.root().join("orphan"))
            .expect("read")
            .count(),
        0,
        "the folder in the way was changed"
    );
    // A session that exists is still "already exists".
    let err = env.fails(&["create", "s"], 4);
    assert!(err.contains("session s already exists"), "{err}");
    // Once the folder is gone, the id can be made.
    std::fs::remove_dir(env.root().join("orphan")).expect("rmdir");
    env.ok(&["create", "orphan"]);
}

/// Waits until `show ID` reports a writer holding the lock; returns it.
fn wait_for_writer(env: &Env, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let show = env.json(&["show", id]);
        if !show["writer"].is_null() {
            return show["writer"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the first appender never took the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Session `id`'s file bytes, its mtime and the lease generation `show` reads: what a
/// command that opens nothing leaves as it was.
fn session_state(env: &Env, id: &str) -> (Vec<u8>, std::time::SystemTime, Value) {
    let file = env.root().join(id).join("session.sqlite");
    let modified = std::fs::metadata(&file).and_then(|m| m.modified());
    (
        std::fs::read(&file).expect("read"),
        modified.expect("mtime"),
        env.json(&["show", id])["lease"]["generation"].clone(),
    )
}

/// `append` of a file without a batch (empty, blank lines, a lone byte order mark), given
/// by `--file` or redirected to stdin, opens nothing: the session file, its lease
/// generation and its mtime stay as they were (the writer open moved them before), and
/// the summary says nothing was appended. A missing session is still "not found" (exit
/// 3), and `--create` still makes it empty.
#[test]
fn append_of_a_file_without_a_batch_changes_nothing() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let state = || session_state(&env, "s");
    let before = state();
    std::thread::sleep(Duration::from_millis(50));
    for (name, text) in [
        ("empty", ""),
        ("blank", "\n  \n\r\n"),
        ("bom", "\u{feff}\n"),
    ] {
        let input = env.path(name);
        std::fs::write(&input, text).expect("write");
        let by_flag = env.run(&["append", "s", "--file", input.to_str().expect("utf-8")]);
        let redirected = env
            .command(&["append", "s"])
            .stdin(std::fs::File::open(&input).expect("open"))
            .output()
            .expect("run");
        for out in [by_flag, redirected] {
            assert_eq!(code(&out), 0, "{name}: {}", stderr(&out));
            assert!(
                stdout(&out).starts_with("appended 0 batches (0 events, 0 B of payload) to s;"),
                "{name}: {}",
                stdout(&out)
            );
        }
        let after = state();
        assert!(after.0 == before.0, "{name}: the session file changed");
        assert_eq!((&after.1, &after.2), (&before.1, &before.2), "{name}");
    }
    let empty = env.path("empty");
    let missing = env
        .command(&["append", "nope"])
        .stdin(std::fs::File::open(&empty).expect("open"))
        .output()
        .expect("run");
    assert_eq!(code(&missing), 3, "{}", stderr(&missing));
    let created = env
        .command(&["append", "new", "--create"])
        .stdin(std::fs::File::open(&empty).expect("open"))
        .output()
        .expect("run");
    assert_eq!(code(&created), 0, "{}", stderr(&created));
    assert_eq!(env.json(&["show", "new"])["durable_sequence"], 0);
}

/// `append` of a file whose first batch line is bad input (not a batch, not UTF-8, a
/// batch no session accepts: no events, a required event of an unknown kind, a blank
/// title, a `turn/end` without a status) is refused with status 6 before the session is
/// opened: its file, lease generation and mtime stay as they were (the writer was taken
/// first; a batch refused by `Batch::validate` took it until session 35), and while
/// another process writes the session the answer is still 6 naming the line (it was 5,
/// "owned by").
#[test]
fn append_of_a_file_whose_first_line_is_bad_opens_nothing() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let state = || session_state(&env, "s");
    let before = state();
    std::thread::sleep(Duration::from_millis(50));
    let bad: [(&str, &[u8]); 6] = [
        (
            "not-a-batch",
            b"\n{\"operation_id\": \"o\", \"evnts\": []}\n",
        ),
        ("not-utf8", b"\xff\xfe{}\n"),
        ("no-events", b"{\"operation_id\": \"o\", \"events\": []}\n"),
        (
            "unknown-kind",
            b"{\"operation_id\": \"o\", \"events\": [{\"kind\": \"bogus/kind\"}]}\n",
        ),
        (
            "blank-title",
            b"{\"operation_id\": \"o\", \"events\": [{\"kind\": \"session/title\", \"payload\": {\"title\": \" \"}}]}\n",
        ),
        (
            "no-status",
            b"{\"operation_id\": \"o\", \"events\": [{\"kind\": \"turn/end\", \"payload\": {}}]}\n",
        ),
    ];
    for (name, bytes) in bad {
        let input = env.path(name);
        std::fs::write(&input, bytes).expect("write");
        let err = env.fails(
            &["append", "s", "--file", input.to_str().expect("utf-8")],
            6,
        );
        assert!(
            err.contains("line 1") || err.contains("line 2"),
            "{name}: {err}"
        );
        let after = state();
        assert!(after.0 == before.0, "{name}: the session file changed");
        assert_eq!((&after.1, &after.2), (&before.1, &before.2), "{name}");
    }
    // While another process holds the session, the bad line is still what is reported.
    let mut holder: Child = env
        .command(&["append", "s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_for_writer(&env, "s");
    let input = env.path("not-a-batch");
    let err = env.fails(
        &["append", "s", "--file", input.to_str().expect("utf-8")],
        6,
    );
    assert!(err.contains("line 2: not a batch"), "{err}");
    let input = env.path("no-status");
    let err = env.fails(
        &["append", "s", "--file", input.to_str().expect("utf-8")],
        6,
    );
    assert!(
        err.contains("line 1 (operation \"o\")") && err.contains("status"),
        "{err}"
    );
    drop(holder.stdin.take());
    assert!(holder.wait().expect("wait").success());
}

#[test]
fn a_second_appender_exits_5_naming_the_first_ones_pid() {
    let env = Env::new();
    env.ok(&["create", "shared"]);
    let mut first: Child = env
        .command(&["append", "shared", "--json", "--sync", "each"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let writer = wait_for_writer(&env, "shared");
    assert_eq!(writer["pid"], first.id());

    let out = env.run_with(&["append", "shared"], &turn_lines(1));
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("pid {}", first.id())) && err.contains("host"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1);
    // A refused delete says it could not delete the session, and its wait.
    let err = env.fails(&["delete", "shared"], 5);
    assert!(err.contains(&format!("pid {}", first.id())), "{err}");
    assert!(
        err.starts_with(
            "session-store: error: cannot delete shared: session shared is owned by another \
             writer: pid"
        ),
        "{err}"
    );
    let err = env.fails(&["delete", "shared", "--wait", "0.2"], 5);
    assert!(
        err.starts_with(
            "session-store: error: cannot delete shared after waiting 0.2 s: session shared is \
             owned by another writer: pid"
        ),
        "{err}"
    );

    // The first one keeps working; a delete that waits long enough outlives it.
    let mut input = first.stdin.take().expect("stdin");
    input.write_all(turn_lines(1).as_bytes()).expect("write");
    input.flush().expect("flush");
    let mut lines = BufReader::new(first.stdout.take().expect("stdout")).lines();
    let line = lines.next().expect("a line").expect("read");
    assert_eq!(parse(&line)["last_seq"], 2);
    let deleter = env
        .command(&["delete", "shared", "--wait", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(300));
    drop(input);
    assert!(first.wait().expect("wait").success());
    let out = deleter.wait_with_output().expect("wait");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    env.fails(&["show", "shared"], 3);
}

/// An `append` refused while a `delete` holds the session's writer lock (waiting here for
/// a fork, played by a shared lock on `dependents.lock`) names the deleting process: it
/// named the session's last writer, an appender long dead, as the owner.
#[test]
fn an_append_refused_during_a_delete_names_the_deleting_process() {
    let env = Env::new();
    env.ok(&["create", "held"]);
    let old = env.run_with(&["append", "held"], &turn_lines(1));
    assert_eq!(code(&old), 0, "{}", stderr(&old));
    let fork = std::fs::File::open(env.root().join("held").join("dependents.lock"))
        .or_else(|_| std::fs::File::create(env.root().join("held").join("dependents.lock")))
        .expect("dependents.lock");
    fork.lock_shared().expect("shared lock");
    let deleter = env
        .command(&["delete", "held", "--wait", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // The delete takes the writer lock, then waits for the dependents lock.
    let lock = env.root().join("held").join("writer.lock");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::File::open(&lock)
        .expect("writer.lock")
        .try_lock()
        .is_ok()
    {
        assert!(Instant::now() < deadline, "the delete never took the lock");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = env.run_with(&["append", "held"], &turn_lines(1));
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("pid {} ", deleter.id())), "{err}");
    drop(fork);
    let out = deleter.wait_with_output().expect("wait");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    env.fails(&["show", "held"], 3);
}

/// Two `delete`s of one session at once (20 rounds): one deletes it, the other exits 0 or
/// 3 with "session ID not found" (it said "session ROOT/ID/session.sqlite not found" in
/// most rounds: asking for the writer met the file the first one had just moved away).
#[test]
fn two_deletes_of_one_session_at_once_name_the_session_not_its_file() {
    let env = Env::new();
    for round in 0..20 {
        let id = format!("twice-{round}");
        env.ok(&["create", &id]);
        let spawn = || {
            env.command(&["delete", &id])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        };
        let both = [spawn(), spawn()];
        let outs: Vec<Output> = both
            .into_iter()
            .map(|c| c.wait_with_output().expect("wait"))
            .collect();
        assert!(
            outs.iter().any(|o| code(o) == 0),
            "round {round}: none deleted"
        );
        for out in &outs {
            if code(out) != 0 {
                assert_eq!(
                    (code(out), stderr(out)),
                    (3, format!("session-store: error: session {id} not found\n")),
                    "round {round}"
                );
            }
        }
        env.fails(&["show", &id], 3);
    }
}

/// `append --sync each --json` on a 10,000-batch file, SIGKILLed mid-way, ten times: every
/// batch it printed is in the session afterwards, at the printed sequences.
#[test]
fn append_sync_each_killed_mid_way_keeps_every_printed_batch() {
    let env = Env::new();
    let file = env.path("batches.jsonl");
    let mut text = String::new();
    for i in 0..10_000 {
        let batch = json!({"operation_id": format!("op-{i}"), "events": [
            message(&format!("m{i}"), "user", &format!("message {i}")),
            {"kind": "diagnostic", "optional": true, "payload": {"n": i}},
        ]});
        text.push_str(&batch.to_string());
        text.push('\n');
    }
    std::fs::write(&file, text).expect("write");
    for round in 0..10 {
        let id = format!("killed-{round}");
        env.ok(&["create", &id]);
        let mut child = env
            .command(&["append", &id, "--sync", "each", "--json"])
            .stdin(std::fs::File::open(&file).expect("open"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let wanted = 5 + fastrand::usize(..200);
        let mut printed = Vec::new();
        let mut line = String::new();
        while printed.len() < wanted {
            line.clear();
            if out.read_line(&mut line).expect("read") == 0 {
                break;
            }
            printed.push(parse(&line));
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        // Lines already in the pipe were printed before the kill.
        let mut rest = String::new();
        out.read_to_string(&mut rest).expect("read rest");
        let complete = rest.rfind('\n').map_or("", |end| &rest[..end]);
        printed.extend(complete.lines().map(parse));
        assert!(
            printed.len() >= wanted,
            "round {round}: the appender stopped early"
        );
        assert!(
            printed.len() < 10_000,
            "round {round}: killed too late to prove anything"
        );

        let events = env.json(&["events", &id, "--limit", "100000"]);
        let stored: std::collections::HashMap<&str, (u64, u64)> = events["events"]
            .as_array()
            .expect("events")
            .iter()
            .fold(std::collections::HashMap::new(), |mut m, e| {
                let op = e["operation_id"].as_str().expect("op");
                let seq = e["seq"].as_u64().expect("seq");
                let range = m.entry(op).or_insert((seq, seq));
                range.1 = range.1.max(seq);
                m
            });
        for p in &printed {
            let op = p["operation_id"].as_str().expect("op");
            let want = (
                p["first_seq"].as_u64().expect("first"),
                p["last_seq"].as_u64().expect("last"),
            );
            assert_eq!(
                stored.get(op),
                Some(&want),
                "round {round}: printed {op} is missing"
            );
        }
        assert_eq!(env.json(&["verify", &id])["ok"], true);
    }
}

#[test]
fn bench_runs_small_and_reports_the_ratios() {
    let env = Env::new();
    let dir = env.path("bench");
    let report = env.json(&[
        "bench",
        "--events",
        "2000",
        "--batch",
        "50",
        "--sessions",
        "2",
        "--durability",
        "normal",
        "--dir",
        dir.to_str().expect("utf-8"),
    ]);
    for key in ["library", "raw", "jsonl"] {
        assert!(
            report[key]["events_per_s"].as_f64() > Some(0.0),
            "{key}: {report}"
        );
        assert!(
            report[key]["mb_per_s"].as_f64() > Some(0.0),
            "{key}: {report}"
        );
    }
    assert!(report["fdatasync_per_s"].as_f64() > Some(0.0));
    assert!(report["ratio_library_raw"].as_f64() > Some(0.0));
    assert!(report["ratio_library_jsonl"].as_f64() > Some(0.0));
    assert_eq!(report["durability"], "normal");
    let human = env.ok(&["bench", "--events", "640", "--sessions", "1"]);
    assert!(
        human.contains("ratio library/raw") && human.contains("library/JSONL"),
        "{human}"
    );
    // The default bench folder inside the root is removed afterwards, and so is the root
    // the bench made for it: `bench` makes no sessions, so it leaves no root behind (it
    // left an empty one).
    assert!(!env.root().exists(), "bench left the root it made");
    env.ok(&["create", "s"]);
    // The scratch folder of a bench whose process is gone (SIGKILL, SIGQUIT: no command
    // removed it, tens of MB each; outside testing, signals) goes with the next bench; one
    // of a live process stays.
    let mut ended = std::process::Command::new("true").spawn().expect("true");
    let dead = ended.id();
    ended.wait().expect("wait");
    let stale = env.root().join(format!(".bench-append-{dead}"));
    std::fs::create_dir(&stale).expect("mkdir");
    std::fs::write(stale.join("events.sqlite"), b"left behind").expect("write");
    let live = env
        .root()
        .join(format!(".bench-append-{}", std::process::id()));
    std::fs::create_dir(&live).expect("mkdir");
    env.ok(&["bench", "--events", "640", "--sessions", "1"]);
    assert!(!stale.exists(), "a dead bench's folder stayed");
    assert!(live.exists(), "a live bench's folder was removed");
    std::fs::remove_dir(&live).expect("rmdir");
    let left: Vec<_> = std::fs::read_dir(env.root())
        .expect("root")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name == "s" || name.starts_with(".bench"))
        .collect();
    assert_eq!(
        left,
        ["s"],
        "an existing root keeps its sessions, no bench folder"
    );
}

#[test]
fn reads_racing_a_delete_exit_0_or_3() {
    let env = Env::new();
    chat(&env, "s", 40);
    env.ok(&["export", "s", env.path("s.export").to_str().expect("utf-8")]);
    // Another process (this test, through the library) deletes the session and imports it
    // again, over and over, while the binary reads it.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (root, export) = (env.root(), env.path("s.export"));
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let root = session_store::Root::open(root).expect("root");
            let s = session_store::SessionId::new("s").expect("id");
            let never = session_store::CancelToken::new();
            let again = session_store::ImportOptions::default().with_session_id(s.clone());
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while std::time::Instant::now() < until {
                root.delete(&s, &never).expect("delete");
                root.import(&export, again.clone()).expect("import");
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let reads: [&[&str]; 4] = [
        &["events", "s", "--limit", "5"],
        &["history", "s", "--limit", "5"],
        &["show", "s"],
        &["stats", "s"],
    ];
    // Three readers at once (one at a time missed the races a loaded machine showed: a
    // file missing before and after a failed read, an inode number reused by the import).
    let (mut counts, mut wrong) = ([0usize; 2], Vec::new());
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let (mut counts, mut wrong) = ([0usize; 2], Vec::new());
                    while !done.load(std::sync::atomic::Ordering::SeqCst) {
                        for args in reads {
                            let out = env.run(args);
                            match code(&out) {
                                0 => counts[0] += 1,
                                // It names the session, not a file of the root.
                                3 if stderr(&out).contains("session s not found") => counts[1] += 1,
                                other => wrong.push(format!(
                                    "{args:?}: exit {other}: {}",
                                    stderr(&out).trim()
                                )),
                            }
                        }
                    }
                    (counts, wrong)
                })
            })
            .collect();
        for reader in readers {
            let (c, w) = reader.join().expect("reader");
            counts[0] += c[0];
            counts[1] += c[1];
            wrong.extend(w);
        }
    });
    churn.join().expect("churn");
    println!(
        "{} answered, {} not found, {} other",
        counts[0],
        counts[1],
        wrong.len()
    );
    assert!(wrong.is_empty(), "reads racing a delete: {wrong:#?}");
    assert!(counts[0] > 0 && counts[1] > 0, "{counts:?}");
}

/// A batch can end one turn and go on (here with the whole next turn): a fork after the
/// first turn cuts at the end of that batch, so it holds the next turn too, and `fork
/// --help` says so (it said "everything up to its end"); a rewind before the next turn,
/// which starts inside the batch, is refused (exit 6) with nothing made.
#[test]
fn a_fork_after_a_turn_keeps_the_whole_batch_that_ends_it() {
    let env = Env::new();
    let first = json!({"operation_id": "a", "turn_id": "t1", "events": [
        {"kind": "turn/start"}, message("m1", "user", "one"),
    ]});
    let second = json!({"operation_id": "b", "turn_id": "t2", "events": [
        {"kind": "turn/end", "payload": {"status": "completed"}},
        {"kind": "turn/start"}, message("m2", "user", "two"),
        {"kind": "turn/end", "payload": {"status": "completed"}},
    ]});
    let out = env.run_with(
        &["append", "mid", "--create"],
        &format!("{first}\n{second}\n"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    env.ok(&["fork", "mid", "--after-turn", "t1", "--id", "child"]);
    let history = env.json(&["history", "child"]);
    assert_eq!(history["messages"].as_array().map(Vec::len), Some(2));
    assert_eq!(env.json(&["show", "child"])["durable_sequence"], 6);
    let err = env.fails(&["rewind", "mid", "--before-turn", "t2", "--id", "r"], 6);
    assert!(
        err.contains("would cut inside the batch that starts it"),
        "{err}"
    );
    assert!(!env.root().join("r").exists());
    let help = env.ok(&["fork", "--help"]);
    assert!(help.contains("the end of the batch that ends it"), "{help}");
}

/// `show` and `stats` print a session's usage totals, and their help says so (it did not).
#[test]
fn show_and_stats_print_usage_totals_as_their_help_says() {
    let env = Env::new();
    let batch = json!({"operation_id": "u", "events": [{"kind": "usage", "payload":
        {"model": "m", "input_tokens": 3, "output_tokens": 4, "cost": "0.000000001"}}]});
    let out = env.run_with(
        &["append", "s", "--create"],
        &format!(
            "{batch}\n{}\n",
            json!({"operation_id": "v", "events": [{"kind": "usage", "payload":
            {"model": "m", "input_tokens": 1, "output_tokens": 0, "cost": "0.1"}}]})
        ),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for command in ["show", "stats"] {
        let text = env.ok(&[command, "s"]);
        assert!(
            text.contains("2 calls, 4 in, 4 out") && text.contains("cost 0.100000001"),
            "{command}: {text}"
        );
        assert_eq!(
            env.json(&[command, "s"])["usage"]["total"]["cost"],
            "0.100000001"
        );
        let help = env.ok(&[command, "--help"]);
        assert!(help.contains("usage totals"), "{command}: {help}");
    }
}

/// `import` and `verify` given a folder that holds no session file say so (exit 3): they
/// said "session DIR/session.sqlite not found", `verify` "DIR is not sound". A session's
/// own folder still imports and verifies.
#[test]
fn a_folder_without_a_session_file_is_named_as_such() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let folder = env.path("plain-folder");
    std::fs::create_dir(&folder).expect("mkdir");
    let folder = folder.to_str().expect("utf-8");
    for args in [&["import", folder][..], &["verify", folder][..]] {
        let err = env.fails(args, 3);
        assert!(
            err.contains("is a folder without a session file (session.sqlite)")
                && !err.contains("not sound"),
            "{args:?}: {err}"
        );
    }
    let own = env.root().join("s");
    let own = own.to_str().expect("utf-8");
    assert!(env.ok(&["verify", own]).starts_with("ok: s"));
    env.ok(&["import", own, "--id", "s2"]);
    assert_eq!(env.json(&["show", "s2"])["durable_sequence"], 0);
}

/// A folder where `append --file` or `migrate-legacy` want a file of lines is invalid
/// input (6), named as a folder: it was "Is a directory (os error 21)", status 1. Nothing
/// is created (the root they would make included).
#[test]
fn a_folder_given_as_a_file_of_lines_is_invalid_input() {
    let env = Env::new();
    let folder = env.path("lines");
    std::fs::create_dir(&folder).expect("mkdir");
    let folder = folder.to_str().expect("utf-8");
    for args in [
        &["append", "s", "--create", "--file", folder][..],
        &["migrate-legacy", folder][..],
    ] {
        let err = env.fails(args, 6);
        assert!(err.contains("is a folder; give a file"), "{args:?}: {err}");
        assert!(!env.root().exists(), "{args:?} left a root");
    }
}

/// A file named with a trailing `/` is named as a file, not "not found" (exit 3), and
/// `/dev/stdin` on a pipe is named as a pipe, not "resolve /dev/stdin: No such file" (exit
/// 3): both are invalid input (6), and nothing is created (outside testing C7, session 41).
#[test]
fn a_file_named_as_a_folder_and_a_piped_stdin_are_named_for_what_they_are() {
    let env = Env::new();
    let lines = env.path("t.jsonl");
    std::fs::write(&lines, "{\"id\":\"a\",\"role\":\"user\"}\n").expect("write");
    let slashed = format!("{}/", lines.display());
    for args in [&["migrate-legacy", &slashed][..], &["import", &slashed][..]] {
        let err = env.fails(args, 6);
        assert!(
            err.contains("a part of it is a file, not a folder"),
            "{args:?}: {err}"
        );
    }
    let out = env.run_with(
        &["migrate-legacy", "/dev/stdin"],
        "{\"id\":\"a\",\"role\":\"user\"}\n",
    );
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/dev/stdin is a pipe, not a regular file"),
        "{}",
        stderr(&out)
    );
    assert!(!env.root().exists(), "a root was made");
}

/// An export whose file cannot be written (here into `/proc`, which takes no files, even
/// for root) names the session and the destination asked for (status 1): the error named
/// only SQLite's temporary file beside it (a full disk named nothing at all).
#[test]
fn an_export_that_cannot_write_names_its_destination() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let err = env.fails(&["export", "s", "/proc/session-store-export.sqlite"], 1);
    assert!(
        err.starts_with("session-store: error: export s to /proc/session-store-export.sqlite: "),
        "{err}"
    );
    assert!(!std::path::Path::new("/proc/session-store-export.sqlite").exists());
}

/// `--cwd` relative to where the command runs (`.`, `proj/../api`) is recorded by `create`
/// and `import` and filtered by `list` and `search` as the absolute folder it names (`.`
/// used to be stored as `.`, which names nothing once read elsewhere).
#[test]
fn a_relative_cwd_is_taken_as_the_absolute_folder_it_names() {
    let env = Env::new();
    let here = std::fs::canonicalize(env.dir.path()).expect("canonical");
    let here = here.to_str().expect("utf-8");
    env.ok(&["create", "a", "--cwd", "."]);
    env.ok(&["create", "b", "--cwd", "proj/../api"]);
    let export = env.path("a.export");
    env.ok(&["export", "a", export.to_str().expect("path")]);
    env.ok(&[
        "import",
        export.to_str().expect("path"),
        "--id",
        "c",
        "--cwd",
        "./sub/",
    ]);
    let cwd_of = |id: &str| {
        let list = env.json(&["list"]);
        let entry = list["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .find(|s| s["session_ref"]["session_id"] == id)
            .cloned()
            .expect("listed");
        entry["cwd"].as_str().expect("cwd").to_owned()
    };
    assert_eq!(cwd_of("a"), here);
    assert_eq!(cwd_of("b"), format!("{here}/api"));
    assert_eq!(cwd_of("c"), format!("{here}/sub"));
    let ids = |args: &[&str]| common::listed_ids(&env.json(args));

    assert_eq!(ids(&["list", "--cwd", "."]), ["a"]);
    assert_eq!(ids(&["list", "--cwd", here]), ["a"]);
    assert_eq!(ids(&["list", "--cwd", "sub/../api"]), ["b"]);
    let batch = r#"{"operation_id":"o1","turn_id":"t1","events":[{"kind":"turn/start"},{"kind":"message/complete","payload":{"message":{"id":"m1","role":"user","content":"harbour"}}},{"kind":"turn/end","payload":{"status":"completed"}}]}"#;
    let out = env.run_with(&["append", "b"], &format!("{batch}\n"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let hits = |cwd: &str| {
        env.json(&["search", "harbour", "--cwd", cwd])["hits"]
            .as_array()
            .expect("hits")
            .len()
    };
    assert_eq!(hits("api"), 1);
    assert_eq!(hits("."), 0);
    // An absolute folder as a shell completes it (a trailing `/`, `//`, `/./`) names the
    // same folder: it matched nothing, since no working directory is spelled so.
    let api = format!("{here}//./api/");
    assert_eq!(ids(&["list", "--cwd", &api]), ["b"]);
    assert_eq!(hits(&api), 1);
}

/// Session `big` in `env`'s root: 2,000 commits of 64 messages of 200 bytes (about 40 MB),
/// large enough that an export or import of it is still running when a signal comes.
fn big_session(env: &Env) {
    session_of_commits(env, "big", 2_000);
}

/// Session `id` in `env`'s root, of `commits` commits of 64 messages of 200 bytes each.
fn session_of_commits(env: &Env, id: &str, commits: usize) {
    let root = session_store::Root::open(env.root()).expect("root");
    let s = common::create(&root, id);
    for n in 0..commits {
        let events = (0..64)
            .map(|i| common::message(&format!("m{n}-{i}"), "user", &"x".repeat(200)))
            .collect();
        s.append(session_store::Batch::new(format!("op{n}"), events))
            .expect("append");
    }
    s.close().expect("close");
}

/// Ctrl-C (SIGINT) or SIGTERM during `export` stops it with 130 / 143 and removes its
/// temporary file: it used to die at once, leaving `.sse-….tmp` and its `-wal` (tens of
/// MB) beside the destination for good. The session still exports afterwards.
#[test]
fn export_stopped_by_a_signal_leaves_nothing_beside_its_destination() {
    let env = Env::new();
    big_session(&env);
    let out_dir = env.path("exports");
    std::fs::create_dir(&out_dir).expect("mkdir");
    let dest = out_dir.join("big.export");
    let dest_arg = dest.to_str().expect("utf-8");
    // SIGHUP too: a closed terminal or a dropped ssh session left the temporary file and
    // about 14 MB beside the destination (outside testing, signals).
    for (signal, status) in [("INT", 130), ("TERM", 143), ("HUP", 129)] {
        let child = env
            .command(&["export", "big", dest_arg])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn export");
        // Signalled once its temporary file is there: the copy is under way.
        let out = signal_when(child, signal, || {
            std::fs::read_dir(&out_dir).expect("ls").next().is_some()
        });
        assert_eq!(out.status.code(), Some(status), "SIG{signal}: {out:?}");
        assert!(
            stderr(&out).contains(&format!("interrupted by SIG{signal}")),
            "{}",
            stderr(&out)
        );
        let left: Vec<_> = std::fs::read_dir(&out_dir)
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert!(left.is_empty(), "SIG{signal} left {left:?}");
    }
    env.ok(&["export", "big", dest_arg]);
    env.ok(&["verify", dest_arg]);
}

/// Ctrl-C (SIGINT) or SIGTERM during `import` stops it with 130 / 143, publishes nothing
/// and removes its staging copy at once: it used to die at once, leaving a whole copy of
/// the file in `.staging/` until the next command opened the root. The file still imports
/// afterwards.
#[test]
fn import_stopped_by_a_signal_leaves_no_staging_copy() {
    let env = Env::new();
    big_session(&env);
    let export = env.path("big.export");
    let export_arg = export.to_str().expect("utf-8");
    env.ok(&["export", "big", export_arg]);
    let staging = env.root().join(".staging");
    let staged = || {
        std::fs::read_dir(&staging).map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .count()
        })
    };
    for (signal, status) in [("INT", 130), ("TERM", 143), ("HUP", 129)] {
        let child = env
            .command(&["import", export_arg, "--id", "copy"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn import");
        // Signalled once its staging folder is there: the copy is under way.
        let out = signal_when(child, signal, || staged() > 0);
        assert_eq!(out.status.code(), Some(status), "SIG{signal}: {out:?}");
        assert!(
            stderr(&out).contains(&format!("interrupted by SIG{signal}")),
            "{}",
            stderr(&out)
        );
        assert_eq!(staged(), 0, "SIG{signal} left a staging copy");
        assert!(
            !env.root().join("copy").exists(),
            "SIG{signal} published it"
        );
    }
    env.ok(&["import", export_arg, "--id", "copy"]);
    env.ok(&["verify", "copy"]);
}

/// A damaged session is named in the error of every command that reads or writes it (show,
/// history, events, stats, rename, export, fork, rewind, append), with
/// `verify` to check it (exit 6): the CLI printed only "corrupt session store: SQLite
/// reports: database disk image is malformed", where Python and `serve` named the session
/// (outside testing D4).
#[test]
fn a_damaged_session_is_named_in_each_commands_error() {
    let env = Env::new();
    chat(&env, "broken", 2);
    chat(&env, "sound", 1);
    let file = env.root().join("broken/session.sqlite");
    let len = std::fs::metadata(&file).expect("stat").len();
    let mut bytes = std::fs::read(&file).expect("read");
    for b in &mut bytes[4096..] {
        *b = 0xde;
    }
    assert_eq!(bytes.len() as u64, len);
    std::fs::write(&file, &bytes).expect("damage");
    let export = env.path("broken.export");
    let export = export.to_str().expect("utf-8");
    for args in [
        &["show", "broken"][..],
        &["history", "broken"],
        &["events", "broken"],
        &["stats", "broken"],
        &["rename", "broken", "new title"],
        &["export", "broken", export],
        &["fork", "broken", "--after-turn", "turn-1"],
        &["rewind", "broken", "--before-turn", "turn-2"],
        &["append", "broken"],
    ] {
        let out = env.run_with(args, &turn_lines(3));
        assert_eq!(code(&out), 6, "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("session broken is damaged (")
                && err.contains("`session-store verify broken` checks it"),
            "{args:?}: {err}"
        );
    }
    env.ok(&["show", "sound"]);
}

/// A session at the end of a chain of 40 forks, each of the one before with a turn of its
/// own, is read, exported, forked and appended to under a soft descriptor limit of 64 (the
/// hard one higher): each ancestor's file is read through connections of its own (its
/// file, `-wal` and `-shm`), and every one of these commands failed with "Too many open
/// files" under the usual soft limit of 1,024 for a chain of about 340 (outside testing
/// R7). The command raises its soft limit to the hard one.
#[test]
fn a_deep_fork_chain_is_read_under_a_low_soft_descriptor_limit() {
    let env = Env::new();
    let root = session_store::Root::open(env.root()).expect("root");
    let mut parent = common::id("s0");
    let s = common::create(&root, "s0");
    s.append(common::turn("op0", "t0", "m0")).expect("append");
    s.close().expect("close");
    for n in 1..=40 {
        let child = common::id(&format!("s{n}"));
        root.fork(
            &parent,
            session_store::ForkPoint::AfterTurn(format!("t{}", n - 1)),
            Some(child.clone()),
        )
        .expect("fork");
        let s = root.open_writer(&child).expect("open");
        s.append(common::turn(
            &format!("op{n}"),
            &format!("t{n}"),
            &format!("m{n}"),
        ))
        .expect("append");
        root.close(&s).expect("close");
        parent = child;
    }
    drop(root);
    let soft_limited = |args: &[&str]| {
        let out = Command::new("sh")
            .args(["-c", "ulimit -Sn 64 && exec \"$@\"", "sh"])
            .arg(BIN)
            .arg("--root")
            .arg(env.root())
            .args(args)
            .env_remove("SESSION_STORE_ROOT")
            .current_dir(env.path("."))
            .stdin(Stdio::null())
            .output()
            .expect("sh");
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    let history = parse(&soft_limited(&[
        "history", "s40", "--limit", "100", "--json",
    ]));
    let messages = history["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 41, "{history}");
    soft_limited(&["verify", "s40"]);
    let export = env.path("s40.export");
    soft_limited(&["export", "s40", export.to_str().expect("utf-8")]);
    soft_limited(&["fork", "s40", "--after-turn", "t40", "--id", "s41"]);
    let events = parse(&soft_limited(&[
        "events", "s41", "--limit", "1000", "--json",
    ]));
    let events = events["events"].as_array().expect("events");
    assert_eq!(events.len(), 41 * 3);
    assert_eq!(events[121]["payload"]["message"]["id"], "m40");
}

/// A write past the process's file size limit (`prlimit --fsize`, `ulimit -f`) is an
/// error the command reports in one line naming the limit, with status 1, and cleans up
/// after: SIGXFSZ ended `export` at once, leaving its `.sse-….tmp` and `-wal` beside the
/// destination, `import` its staging copy in the root, and `events` with no word. Skipped
/// without `prlimit`.
#[test]
fn a_file_size_limit_fails_writes_cleanly_instead_of_killing_the_command() {
    let has_prlimit = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("prlimit").is_file()));
    if !has_prlimit {
        eprintln!("a_file_size_limit_fails_writes_cleanly…: skipped (no prlimit)");
        return;
    }
    let env = Env::new();
    session_of_commits(&env, "s", 200);
    let export = env.path("s.export");
    env.ok(&["export", "s", export.to_str().expect("utf-8")]);
    let limit = 1_000_000;
    let limited = |args: &[&str], stdout: Stdio| {
        let out = Command::new("prlimit")
            .arg(format!("--fsize={limit}"))
            .arg(BIN)
            .arg("--root")
            .arg(env.root())
            .args(args)
            .env_remove("SESSION_STORE_ROOT")
            .current_dir(env.path("."))
            .stdout(stdout)
            .stderr(Stdio::piped())
            .output()
            .expect("run under prlimit");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(&format!("may write no file over {limit} bytes")),
            "{args:?}: {err}"
        );
        err
    };
    let out_dir = env.path("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    let dest = out_dir.join("s.export");
    let err = limited(
        &["export", "s", dest.to_str().expect("utf-8")],
        Stdio::null(),
    );
    assert!(err.contains("export s to"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&out_dir)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "export left {left:?}");
    limited(
        &["import", export.to_str().expect("utf-8"), "--id", "copy"],
        Stdio::null(),
    );
    assert!(!env.root().join("copy").exists(), "import published it");
    let staged = std::fs::read_dir(env.root().join(".staging"))
        .map_or(0, |d| d.filter_map(Result::ok).count());
    assert_eq!(staged, 0, "import left a staging copy");
    let listing = std::fs::File::create(env.path("events.json")).expect("create");
    let err = limited(
        &["--json", "events", "s", "--limit", "20000"],
        listing.into(),
    );
    assert!(err.contains("File too large"), "{err}");
    // Without the limit, all of it works.
    env.ok(&["export", "s", dest.to_str().expect("utf-8")]);
    env.ok(&["import", export.to_str().expect("utf-8"), "--id", "copy"]);
}

/// `-` is stdin for `append --file` (it was opened as a file named `-`: "No such file",
/// exit 1), and `export ID -` is refused (exit 2) instead of writing a file named `-` in
/// the current folder for a user who meant stdout; `import`, `verify` and
/// `migrate-legacy`, which need a file by its path, refuse `-` as stdin (exit 2).
#[test]
fn a_dash_is_stdin_for_append_and_no_export_file() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let batch =
        r#"{"operation_id":"o1","events":[{"kind":"session/title","payload":{"title":"t"}}]}"#;
    let out = env.run_with(&["--json", "append", "s", "--file", "-"], batch);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let line: Value = serde_json::from_str(stdout(&out).trim()).expect("json");
    assert_eq!(line["operation_id"], "o1");
    let out = env.run(&["export", "s", "-"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("not to stdout"), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
    assert!(!env.path("-").exists(), "a file named - was written");
    // A file named `-` is still reachable by its path.
    env.ok(&["export", "s", "./-"]);
    env.ok(&["verify", "./-"]);
    // The commands that read a file by its path refuse `-` as stdin the same way (they
    // said "- not found", exit 3, or read a file named `-` when one was there).
    for (args, what) in [
        (&["import", "-"][..], "import reads"),
        (&["verify", "-"][..], "verify reads"),
        (&["migrate-legacy", "-"][..], "migrate-legacy reads"),
    ] {
        let out = env.run_with(args, "");
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(what), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("not stdin"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    env.ok(&["import", "./-", "--id", "s2"]);
    assert_eq!(
        env.json(&["list"])["sessions"].as_array().map(Vec::len),
        Some(2)
    );
}

/// A `--root` that is a file is refused by every command as "not a folder" (status 6),
/// the file unchanged: it was "no root at …" (status 3) for most commands, "File
/// exists (os error 17)" (status 1) for `create`, `import`, `append --create`, `demo`
/// and `bench`, and "\"s\" is neither a session in ROOT nor a file" (status 3) for
/// `verify ID`. (`verify FILE` needs no root, and `restore` first looks for Litestream.)
#[test]
fn a_root_that_is_a_file_is_refused_as_not_a_folder() {
    let env = Env::new();
    std::fs::write(env.root(), b"mine").expect("write");
    std::fs::write(env.path("x.sqlite"), b"x").expect("write");
    let commands: &[&[&str]] = &[
        &["list"],
        &["search", "x"],
        &["show", "s"],
        &["history", "s"],
        &["events", "s"],
        &["stats", "s"],
        &["rename", "s", "t"],
        &["fork", "s", "--after-turn", "t"],
        &["rewind", "s", "--before-turn", "t"],
        &["export", "s", "out.sqlite"],
        &["delete", "s"],
        &["gc", "--older-than", "1d"],
        &["rebuild-catalog"],
        &["verify", "s"],
        &["replicate", "--replica", "file:///nowhere"],
        &["append", "s"],
        &["append", "s", "--create"],
        &["create", "s"],
        &["import", "x.sqlite"],
        &["migrate-legacy", "x.sqlite"],
        &["serve", "--addr", "127.0.0.1:0"],
        &["demo"],
        &["bench", "--events", "64"],
    ];
    for args in commands {
        let err = env.fails(args, 6);
        assert!(err.contains("is not a folder"), "{args:?}: {err}");
        assert_eq!(std::fs::read(env.root()).expect("read"), b"mine");
    }
    assert!(!env.path("out.sqlite").exists());
}

/// Sends `kill -SIGNAL` to `child` once `ready` holds (within 30 s) and returns its
/// output.
fn signal_when(child: Child, signal: &str, ready: impl Fn() -> bool) -> Output {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "never ready for SIG{signal}");
        std::thread::sleep(Duration::from_millis(1));
    }
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal}");
    child.wait_with_output().expect("wait")
}

/// `bench` stopped by Ctrl-C (SIGINT) or SIGTERM removes its scratch folder and the root
/// it made (exit 130 / 143), as a finished run does: the `.bench-append-PID` folder
/// (tens of MB) and the root stayed for good before.
#[test]
fn bench_stopped_by_a_signal_leaves_no_scratch_folder_or_root() {
    let env = Env::new();
    let deep = env.path("a/b/root");
    let scratch_in = |root: &std::path::Path| {
        std::fs::read_dir(root).is_ok_and(|mut d| {
            d.any(|e| {
                e.expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".bench-append-")
            })
        })
    };
    for (root, signal, status) in [(&deep, "INT", 130), (&env.root(), "TERM", 143)] {
        if root == &env.root() {
            env.ok(&["create", "s"]);
        }
        let child = env
            .command_at(root, &["bench", "--events", "4000000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn bench");
        let out = signal_when(child, signal, || scratch_in(root));
        assert_eq!(out.status.code(), Some(status), "SIG{signal}: {out:?}");
        assert!(!scratch_in(root), "SIG{signal} left the scratch folder");
    }
    assert!(!env.path("a").exists(), "SIGINT left the root bench made");
    assert_eq!(common::listed_ids(&env.json(&["list"])), ["s"]);
}

/// Every subcommand answers `--help` and `--version` (status 0, on stdout; the version line
/// names the program) and refuses an
/// unknown flag (status 2), making no root: `list --version` was "unexpected argument"
/// (status 2) for every subcommand.
#[test]
fn every_subcommand_answers_help_and_version() {
    let env = Env::new();
    let commands = [
        "create",
        "append",
        "list",
        "rename",
        "show",
        "history",
        "search",
        "events",
        "fork",
        "rewind",
        "export",
        "import",
        "delete",
        "gc",
        "verify",
        "migrate-legacy",
        "stats",
        "rebuild-catalog",
        "replicate",
        "restore",
        "serve",
        "demo",
        "bench",
    ];
    let help = env.ok(&["--help"]);
    for name in commands {
        assert!(
            help.contains(&format!("\n  {name} ")),
            "{name} not in --help"
        );
        let usage = env.ok(&[name, "--help"]);
        assert!(
            usage.contains(&format!("Usage: session-store {name}")),
            "{name}: {usage}"
        );
        // The program's name, as `session-store --version` says it ("session-store-list
        // 0.1.0" before).
        let version = env.ok(&[name, "--version"]);
        assert_eq!(
            version,
            concat!("session-store ", env!("CARGO_PKG_VERSION"), "\n"),
            "{name}"
        );
        let err = env.fails(&[name, "--no-such-flag"], 2);
        assert!(err.contains("unexpected argument"), "{name}: {err}");
    }
    assert!(!env.root().exists(), "a --help or --version made the root");
}

/// `append` reading a terminal (`append ID` typed at a prompt) says so on stderr, with how
/// to end the input: it waited silently before. Input from a pipe prints no such line.
/// The terminal is util-linux `script`'s pseudo-terminal, fed from a pipe.
#[test]
fn append_from_a_terminal_says_it_reads_batches() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let batch = "{\"operation_id\":\"o1\",\"events\":[{\"kind\":\"diagnostic\"}]}\n";
    let line = format!(
        "{BIN} --root {} append s",
        env.root().to_str().expect("utf-8")
    );
    let Ok(mut child) = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("skipped: no `script` (util-linux) to give append a terminal");
        return;
    };
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(batch.as_bytes()).expect("write");
    drop(input);
    let out = child.wait_with_output().expect("wait");
    assert_eq!(code(&out), 0, "{out:?}");
    let shown = stdout(&out);
    assert!(shown.contains("Ctrl-D ends the input"), "{shown}");
    assert!(shown.contains("appended 1 batch ("), "{shown}");
    let piped = env.run_with(&["append", "s"], batch);
    assert_eq!(code(&piped), 0, "{}", stderr(&piped));
    assert_eq!(stderr(&piped), "");
}

/// `verify FILE` takes a path that is not UTF-8, as `export` and `import` do: it was
/// refused by the argument parser ("invalid UTF-8", exit 2), so such an export could be
/// written and imported but not verified.
#[test]
fn verify_takes_a_path_that_is_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    env.ok(&["create", "s"]);
    let file = env
        .dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"s-\xff.export"));
    let run = |args: &[&str]| {
        env.command(args)
            .arg(&file)
            .stdin(Stdio::null())
            .output()
            .expect("run")
    };
    let out = run(&["export", "s"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(&["--json", "verify"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(report["session_id"], "s");
    std::fs::remove_file(&file).expect("rm");
    let out = run(&["verify"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains(r"\xFF"), "{}", stderr(&out));
}

/// Each turn a writer appends in `show_stats_and_events_of_a_session_being_appended_to`:
/// one batch of 4 events, 1 message and 1 model call.
fn counted_turn(n: u64) -> session_store::Batch {
    let event = |kind: &str, payload: Value| {
        session_store::Event::new(kind)
            .with_payload(&payload)
            .expect("payload")
    };
    session_store::Batch::new(
        format!("op-{n}"),
        vec![
            session_store::Event::new("turn/start"),
            event(
                "message/complete",
                message(&format!("u{n}"), "user", "q")["payload"].clone(),
            ),
            event(
                "usage",
                json!({"model": "m", "input_tokens": 1, "output_tokens": 2}),
            ),
            event("turn/end", json!({"status": "completed"})),
        ],
    )
    .in_turn(format!("t{n}"))
}

#[test]
fn show_stats_and_events_of_a_session_being_appended_to_agree_with_themselves() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    // Another process (this test, through the library) appends and flushes turn after
    // turn while the binary reads the session: each answer is of one durable sequence.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (root, done) = (env.root(), std::sync::Arc::clone(&done));
        std::thread::spawn(move || {
            let root = session_store::Root::open(root).expect("root");
            let s = root
                .open_writer(&session_store::SessionId::new("s").expect("id"))
                .expect("writer");
            let mut n = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                s.append(counted_turn(n)).expect("append");
                s.flush().expect("flush");
            }
            s.close().expect("close");
        })
    };
    let mut wrong = Vec::new();
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until && wrong.len() < 5 {
        let show = env.json(&["show", "s"]);
        let durable = show["durable_sequence"].as_u64().expect("durable");
        let turns = show["turns"].as_array().expect("turns").len() as u64;
        let calls = show["usage"]["total"]["events"].as_u64().expect("calls");
        if (show["messages"].as_u64(), turns * 4, calls * 4)
            != (Some(durable / 4), durable, durable)
        {
            wrong.push(format!(
                "show: durable {durable}, {turns} turns, {} messages, {calls} model calls",
                show["messages"]
            ));
        }
        let stats = env.json(&["stats", "s"]);
        let durable = stats["durable_sequence"].as_u64().expect("durable");
        let calls = stats["usage"]["total"]["events"].as_u64().expect("calls");
        if (stats["events"].as_u64(), calls * 4) != (Some(durable), durable) {
            wrong.push(format!(
                "stats: durable {durable}, {} events, {calls} model calls",
                stats["events"]
            ));
        }
        let events = env.json(&[
            "events",
            "s",
            "--after",
            &(durable - durable.min(8)).to_string(),
        ]);
        let durable = events["durable_sequence"].as_u64().expect("durable");
        let last = events["events"]
            .as_array()
            .expect("events")
            .last()
            .map(|e| e["seq"].clone());
        if last
            .as_ref()
            .and_then(Value::as_u64)
            .is_some_and(|seq| seq > durable)
        {
            wrong.push(format!(
                "events: event {last:?} after durable sequence {durable}"
            ));
        }
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().expect("writer");
    assert!(
        wrong.is_empty(),
        "reads of a session being appended to: {wrong:#?}"
    );
}

/// Human summaries count one thing in the singular: a session of one commit of one event
/// is "1 commit, 1 event" to `export`, `verify`, `stats` and `rebuild-catalog` (they said
/// "1 commits, 1 events", "1 sessions").
#[test]
fn summaries_of_one_say_it_in_the_singular() {
    let env = Env::new();
    env.ok(&["create", "one"]);
    let batch = json!({"operation_id": "o1", "events": [message("m1", "user", "hi")]});
    let out = env.run_with(&["append", "one"], &format!("{batch}\n"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let export = env.path("one.sqlite");
    let export_arg = export.to_str().expect("utf-8");
    let exported = env.ok(&["export", "one", export_arg]);
    assert!(exported.contains(": 1 commit, 1 event, "), "{exported}");
    let verified = env.ok(&["verify", "one"]);
    assert!(
        verified.contains(": 1 commit, 1 event, 0 turns, 1 message;"),
        "{verified}"
    );
    let stats = env.ok(&["stats", "one"]);
    assert!(
        stats.starts_with("one: 1 event (durable sequence 1)"),
        "{stats}"
    );
    let rebuilt = env.ok(&["rebuild-catalog"]);
    assert!(rebuilt.trim_end().ends_with(": 1 session"), "{rebuilt}");
}

/// `show` of one message, one model call and tables of one page, and `migrate-legacy` of
/// one message, say so in the singular (they said "1 messages", "1 calls", "(1 pages)",
/// "migrated 1 messages").
#[test]
fn show_and_migrate_legacy_of_one_say_it_in_the_singular() {
    let env = Env::new();
    env.ok(&["create", "one"]);
    let usage =
        json!({"kind": "usage", "payload": {"model": "m", "input_tokens": 1, "output_tokens": 2}});
    let batch = json!({"operation_id": "o1", "events": [message("m1", "user", "hi"), usage]});
    let out = env.run_with(&["append", "one"], &format!("{batch}\n"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let shown = env.ok(&["show", "one"]);
    assert!(shown.contains(" 0 ended, 1 message, "), "{shown}");
    assert!(shown.contains("1 call, 1 in, 2 out"), "{shown}");
    assert!(shown.contains("(1 page)"), "{shown}");

    let legacy = env.path("one.jsonl");
    std::fs::write(&legacy, "{\"role\":\"user\",\"content\":\"old\"}\n").expect("write");
    let migrated = env.ok(&["migrate-legacy", legacy.to_str().expect("utf-8")]);
    assert!(
        migrated.starts_with("migrated 1 message from "),
        "{migrated}"
    );
}

/// `show` of a fork whose parent was deleted says so: the parent line named the parent as
/// if it were there (its `show` says "not found") and nothing told where the inherited
/// events went (into the fork's own file). `--json` has `parent_in_root`.
#[test]
fn show_of_a_fork_whose_parent_was_deleted_says_so() {
    let env = Env::new();
    chat(&env, "p", 2);
    env.ok(&["fork", "p", "--after-turn", "turn-1", "--id", "c"]);
    env.ok(&["fork", "c", "--after-turn", "turn-1", "--id", "g"]);
    let before = env.ok(&["show", "c"]);
    assert!(
        before.contains("parent     p (5 events inherited at the cut)\n"),
        "{before}"
    );
    assert_eq!(env.json(&["show", "c"])["parent_in_root"], true);
    assert_eq!(env.json(&["show", "p"])["parent_in_root"], Value::Null);
    env.ok(&["delete", "p"]);
    let after = env.ok(&["show", "c"]);
    assert!(
        after.contains(
            "parent     p (5 events inherited at the cut; p is not in this root, they \
             are held in this session's file)\n"
        ),
        "{after}"
    );
    assert!(
        after.contains("sequences  durable 5, own 5, inherited 0\n"),
        "{after}"
    );
    let json = env.json(&["show", "c"]);
    assert_eq!(json["parent_in_root"], false);
    assert_eq!(json["header"]["parent_id"], "p");
    // The grandchild's parent is still there.
    assert_eq!(env.json(&["show", "g"])["parent_in_root"], true);
    env.fails(&["show", "p"], 3);
}

/// `append --json --sync end` fed through a pipe that stays open prints a batch's line once
/// a write-behind drain made it durable: the lines of the first batches arrive while the
/// input is still open and idle (no next line sent), each with a durable sequence at or
/// past its last sequence, and the rest once it closes. Every line came only at the end
/// of the input, though a drain had made the batches durable long before; then only at
/// the next line, so a host waiting for a batch's line before sending the next waited for
/// good.
#[test]
fn append_sync_end_prints_each_batch_once_a_drain_made_it_durable() {
    let env = Env::new();
    env.ok(&["create", "piped"]);
    let mut child = env
        .command(&["--json", "append", "piped", "--sync", "end"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let (lines, printed) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut feed = move |n: usize| {
        let batch = json!({"operation_id": format!("op-{n}"),
            "events": [message(&format!("m{n}"), "user", &format!("message {n}"))]});
        stdin
            .write_all(format!("{batch}\n").as_bytes())
            .expect("write");
        stdin.flush().expect("flush");
    };
    feed(1);
    feed(2);
    // The write-behind delay (200 ms) passes: both are drained and printed, no next line
    // needed.
    let mut early = Vec::new();
    while early.len() < 2 {
        match printed.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => early.push(serde_json::from_str::<Value>(&line).expect("json")),
            Err(_) => panic!("no line while the input is open; printed {early:?}"),
        }
    }
    for (n, line) in early.iter().enumerate() {
        assert_eq!(line["operation_id"], format!("op-{}", n + 1), "{line}");
        assert!(
            line["durable_sequence"].as_u64() >= line["last_seq"].as_u64(),
            "{line}"
        );
    }
    feed(3);
    drop(feed);
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    reader.join().expect("reader");
    let rest: Vec<Value> = printed
        .try_iter()
        .map(|l| serde_json::from_str(&l).expect("json"))
        .collect();
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(rest[0]["operation_id"], "op-3");
    assert_eq!(rest[0]["durable_sequence"], 3);
}

/// A session made under a deleted parent's id is not the fork's parent: `show` of the
/// fork said its parent was in the root (and `serve` linked and drew the new session as
/// its ancestor), though the fork holds none of its events. So is a fork imported where a
/// session of its parent's id is another one. A fork imported where its parent is (the
/// same commit at the fork point) still names it as there.
#[test]
fn show_of_a_fork_does_not_take_another_session_under_its_parents_id_for_its_parent() {
    let env = Env::new();
    chat(&env, "p", 2);
    env.ok(&["fork", "p", "--after-turn", "turn-1", "--id", "c"]);
    env.ok(&["rewind", "p", "--before-turn", "turn-1", "--id", "r0"]);
    let export = env.dir.path().join("c.sqlite");
    let export = export.to_str().expect("utf-8 path");
    env.ok(&["export", "c", export]);
    env.ok(&["import", export, "--id", "c-copy"]);
    assert_eq!(env.json(&["show", "c"])["parent_in_root"], true);
    assert_eq!(env.json(&["show", "c-copy"])["parent_in_root"], true);
    assert_eq!(env.json(&["show", "r0"])["parent_in_root"], true);
    env.ok(&["delete", "p"]);
    let shown = env.ok(&["show", "c"]);
    assert!(
        shown.contains("; p is not in this root, they are held in this session's file)"),
        "{shown}"
    );
    // Another session under the parent's id: other commits, as many events and more.
    let other = json!({"operation_id": "other", "turn_id": "t", "events": [
        {"kind": "turn/start"},
        message("x-u", "user", "another session"),
        message("x-a", "assistant", "under the same id"),
        {"kind": "session/title", "payload": {"title": "Other"}},
        {"kind": "turn/end", "payload": {"status": "completed"}},
    ]});
    let out = env.run_with(&["append", "p", "--create"], &format!("{other}\n{other}\n"));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for fork in ["c", "c-copy"] {
        let json = env.json(&["show", fork]);
        assert_eq!(json["parent_in_root"], false, "{fork}");
        assert_eq!(json["header"]["parent_id"], "p");
        // Said as it is: "p is not in this root" was false, `list` shows a session p.
        let shown = env.ok(&["show", fork]);
        assert!(
            shown.contains(
                "; the session p of this root is another session, not this one's parent: \
                 they are held in this session's file)"
            ),
            "{shown}"
        );
    }
    // A rewind before the first turn inherits nothing to tell its parent by.
    assert_eq!(env.json(&["show", "r0"])["parent_in_root"], true);
}

/// A line longer than any batch can be (an event's payload and 1 MiB) is refused once read
/// that far: `append --file /dev/zero` grew until the machine ran out of memory (outside
/// testing, session 35: 23.9 GB before the kernel killed it; under a memory limit, an
/// abort with a backtrace). The session stays as it was, sound.
#[test]
fn append_refuses_a_line_longer_than_any_batch() {
    let env = Env::new();
    env.ok(&["create", "s"]);
    let err = env.fails(&["append", "s", "--file", "/dev/zero"], 6);
    assert!(err.contains("line 1 is longer than"), "{err}");
    assert!(!err.contains("backtrace"), "{err}");
    assert!(env.ok(&["verify", "s"]).starts_with("ok"));
    assert_eq!(env.json(&["show", "s"])["durable_sequence"], 0);
}

/// An export killed while it copies leaves its temporary file beside the destination:
/// that file held the header from the start, so it read as a whole session of no commits,
/// `verify` called it sound and `import` published it as an empty session, exit 0
/// (outside testing C1, session 41). It is no session file until the export finishes:
/// both refuse it, saying it did not finish.
#[test]
fn an_export_killed_midway_leaves_no_file_that_verifies_or_imports() {
    let env = Env::new();
    let mut rng = fastrand::Rng::with_seed(41);
    let mut input = String::new();
    for n in 0..64 {
        // Incompressible: the copy writes about 16 MB to the temporary file's WAL.
        let noise: String = (0..256 * 1024)
            .map(|_| char::from(b'a' + rng.u8(..26)))
            .collect();
        input.push_str(&format!(
            "{}\n",
            json!({"operation_id": format!("op{n}"), "events": [
                {"kind": "message/complete",
                 "payload": {"message": {"id": format!("m{n}"), "role": "tool", "content": noise}}}
            ]})
        ));
    }
    let out = env.run_with(&["append", "big", "--create"], &input);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let folder = env.path("exports");
    std::fs::create_dir(&folder).expect("folder");
    let destination = folder.join("big.sqlite");
    let mut export = env
        .command(&["export", "big", destination.to_str().expect("utf-8")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("export");
    let temp_wal = || {
        std::fs::read_dir(&folder).ok()?.flatten().find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name.starts_with(".sse-") && name.ends_with(".tmp-wal"))
                .then(|| (e.path(), e.metadata().map_or(0, |m| m.len())))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if temp_wal().is_some_and(|(_, len)| len > 4 << 20) {
            break;
        }
        assert!(
            export.try_wait().expect("try_wait").is_none(),
            "the export ended before it was seen copying"
        );
        assert!(Instant::now() < deadline, "no copy seen");
        std::thread::sleep(Duration::from_millis(1));
    }
    export.kill().expect("kill");
    export.wait().expect("wait");
    assert!(!destination.exists());
    let (wal, _) = temp_wal().expect("the killed export's files are left");
    let temp = wal.with_file_name(
        wal.file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix("-wal"))
            .expect("name"),
    );
    let temp_arg = temp.to_str().expect("utf-8");
    let refused = env.fails(&["verify", temp_arg], 6);
    assert!(refused.contains("did not finish"), "{refused}");
    let refused = env.fails(&["import", temp_arg, "--id", "copy"], 6);
    assert!(refused.contains("did not finish"), "{refused}");
    env.fails(&["show", "copy"], 3);
}

/// Two legacy transcripts of the same content whose paths differ only in bytes that are
/// not UTF-8 (`\xff` and `\xfe`, both read as U+FFFD): the second continued the first
/// one's session, `reused: true` (outside testing C5, session 41). Each path is its own.
#[test]
fn legacy_paths_that_differ_only_in_bytes_not_utf8_are_two_sessions() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    let mut ids = Vec::new();
    for byte in [0xff_u8, 0xfe] {
        let file = env
            .dir
            .path()
            .join(std::ffi::OsStr::from_bytes(&[b'l', byte, b'.', b'j']));
        std::fs::write(
            &file,
            "{\"id\":\"m1\",\"role\":\"user\",\"content\":\"hello\"}\n",
        )
        .expect("write");
        let out = env
            .command(&["--json", "migrate-legacy"])
            .arg(&file)
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let record: Value = serde_json::from_str(&stdout(&out)).expect("json");
        assert_eq!(record["reused"], false, "{record}");
        // The path it names has the byte, escaped (it was U+FFFD for either).
        let named = record["source_path"].as_str().expect("path").to_owned();
        assert!(named.ends_with(&format!("l\\x{byte:02X}.j")), "{named}");
        ids.push(record["target_id"].as_str().expect("id").to_owned());
    }
    assert_ne!(ids[0], ids[1]);
}

/// A `gc` stopped by a signal finishes the deletion under way, prints it and exits 130:
/// the signal's default action ended it between a deletion and its line, so a session was
/// gone that no line named (outside testing I5).
#[test]
fn a_gc_stopped_by_a_signal_has_printed_every_session_it_deleted() {
    let env = Env::new();
    let ids: Vec<String> = (0..150).map(|i| format!("s{i:03}")).collect();
    for id in &ids {
        env.ok(&["create", id]);
    }
    std::thread::sleep(Duration::from_millis(1_100));
    let mut gc = env
        .command(&["gc", "--older-than", "1s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = BufReader::new(gc.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("first line");
    assert!(first.starts_with("deleted "), "{first}");
    let sent = Command::new("kill")
        .args(["-INT", &gc.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("the rest");
    let done = gc.wait_with_output().expect("wait");
    let printed = 1 + rest.lines().filter(|l| l.starts_with("deleted ")).count();
    let left = ids.iter().filter(|id| env.root().join(id).exists()).count();
    assert_eq!(done.status.code(), Some(130), "{}", stderr(&done));
    assert!(
        stderr(&done).contains("interrupted by SIGINT"),
        "{}",
        stderr(&done)
    );
    assert_eq!(ids.len() - left, printed, "{first}{rest}");
    assert!(left > 0, "the run ended before the signal: {first}{rest}");
}
