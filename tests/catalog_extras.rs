//! Titles, usage totals, list filters and retention (issue 14), through the library and the
//! built binary: real roots, real child processes (a live writer is another process
//! holding the lock), file times set back with `File::set_modified` to age sessions.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::{create, event, id, temp_root, turn};
use serde_json::{Value, json};
use session_store::{
    Batch, Error, ForkPoint, GcOptions, ListFilter, ListSort, Origin, Root, Service, SessionId,
    Usage,
};

const BIN: &str = env!("CARGO_BIN_EXE_session-store");

/// The binary on `root`, no root in the environment.
fn command(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--root")
        .arg(root)
        .args(args)
        .env_remove("SESSION_STORE_ROOT");
    c
}

fn run(root: &Path, args: &[&str]) -> Output {
    command(root, args).output().expect("run")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exit status")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs, expects status 0, returns stdout.
fn ok(root: &Path, args: &[&str]) -> String {
    let out = run(root, args);
    assert_eq!(code(&out), 0, "{args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Runs with `--json`, expects status 0, parses stdout.
fn json_of(root: &Path, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = ok(root, &all);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Runs, expects `status` and one line on stderr (clap's usage errors aside); returns it.
fn fails(root: &Path, args: &[&str], status: i32) -> String {
    let out = run(root, args);
    assert_eq!(code(&out), status, "{args:?}: {}", text(&out.stderr));
    let err = text(&out.stderr);
    if status != 2 {
        assert_eq!(err.lines().count(), 1, "one line on stderr: {err:?}");
    }
    err
}

/// The ids as text, in their order (a library listing's entries or skipped sessions).
fn id_texts<'a>(ids: impl IntoIterator<Item = &'a SessionId>) -> Vec<String> {
    ids.into_iter().map(SessionId::to_string).collect()
}

/// Ids listed (one page of `list --json` with these extra arguments).
fn listed(root: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["list"];
    args.extend_from_slice(extra);
    common::listed_ids(&json_of(root, &args))
}

/// Sets the times of a session's files `secs` seconds back, as if it had not been touched
/// since (what `gc` takes as the age of a file it cannot read; a session's updated time is
/// its last commit's).
fn age(root: &Path, session: &str, secs: u64) {
    touch(root, session, SystemTime::now() - Duration::from_secs(secs));
}

/// Now as a UTC date-time `list --since` takes (`2026-12-05T18:50:00.250Z`).
fn utc_now() -> String {
    let ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis();
    let (days, ms_of_day) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    // Days since the epoch to a civil date (H. Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1_000 % 60,
        ms_of_day % 1_000,
    );
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// The `updated_at_ms` that `list --json` gives session `id`.
fn listed_updated(root: &Path, id: &str) -> i64 {
    let page = json_of(root, &["list", "--limit", "100"]);
    page["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|s| s["session_ref"]["session_id"] == id)
        .and_then(|s| s["updated_at_ms"].as_i64())
        .unwrap_or_else(|| panic!("{id} not listed: {page}"))
}

/// Sets the times of a session's files to `when`.
fn touch(root: &Path, session: &str, when: SystemTime) {
    for name in ["session.sqlite", "session.sqlite-wal"] {
        let path = root.join(session).join(name);
        if path.exists() {
            std::fs::File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(when))
                .expect("set mtime");
        }
    }
}

/// A child process appending to `session` that holds its writer lock until killed; waits
/// until `show` names it.
fn live_writer(root: &Path, session: &str) -> Child {
    let child = command(root, &["append", session])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn writer");
    let deadline = Instant::now() + Duration::from_secs(20);
    while json_of(root, &["show", session])["writer"].is_null() {
        if Instant::now() > deadline {
            stop(child);
            panic!("the writer never took the lock");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn stop(mut child: Child) {
    if let Some(stdin) = child.stdin.as_mut() {
        let _ = stdin.flush();
    }
    child.kill().expect("kill");
    child.wait().expect("wait");
}

/// A `usage` event.
fn usage(model: &str, input: u64, output: u64, cost: &str) -> session_store::Event {
    event(
        "usage",
        json!({"model": model, "input_tokens": input, "output_tokens": output,
               "cache_read_tokens": 2, "cost": cost}),
    )
}

/// `chat`: a session `name` with `turns` completed turns (`t1`, `t2`, …) written by the
/// binary, titled by the caller.
fn chat(root: &Path, name: &str, turns: usize, cwd: &str) {
    ok(root, &["create", name, "--cwd", cwd]);
    let lines: String = (1..=turns).map(|n| turn_line(name, n)).collect();
    let out = append(root, name, &lines);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
}

/// `append session` with `lines` on stdin.
fn append(root: &Path, session: &str, lines: &str) -> Output {
    feed(command(root, &["append", session]), lines)
}

/// Runs `command` with `lines` on stdin (its stdout dropped).
fn feed(mut command: Command, lines: &str) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(lines.as_bytes())
        .expect("write");
    child.wait_with_output().expect("wait")
}

/// A fresh temp folder and the root inside it.
fn temp_cli_root() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    (dir, root)
}

/// An empty `--cwd` (`--cwd "$DIR"` of an unset variable) is refused by `list` and
/// `search` as `create` refuses it (exit 6, "cwd is empty"): no session can have one, and
/// they answered "no sessions match the filters" and "no matches" (exit 0). The library's
/// `Root::list_filtered` and `SearchOptions::with_cwd` alike.
#[test]
fn an_empty_cwd_filter_is_refused_as_create_refuses_it() {
    let (_dir, root) = temp_cli_root();
    chat(&root, "a", 1, "/srv/api");
    for args in [
        &["create", "b", "--cwd", ""][..],
        &["list", "--cwd", ""],
        &["search", "question", "--cwd", ""],
    ] {
        let err = fails(&root, args, 6);
        assert!(err.contains("cwd is empty"), "{args:?}: {err}");
    }
    assert_eq!(listed(&root, &["--cwd", "/srv/api"]), ["a"]);
    let lib = Root::open(&root).expect("root");
    let e = lib
        .list_filtered(&ListFilter::default().with_cwd(""), None, 10)
        .expect_err("empty cwd");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
    // An empty title filter matched every session, as if it filtered.
    let err = fails(&root, &["list", "--title", ""], 6);
    assert!(err.contains("title filter is empty"), "{err}");
    let e = lib
        .list_filtered(&ListFilter::default().with_title(""), None, 10)
        .expect_err("empty title");
    assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
}

#[test]
fn rename_appends_a_title_that_list_shows_at_once() {
    let (_dir, root) = temp_cli_root();
    chat(&root, "talk", 1, "/w");
    // Listed once, so the catalog holds an entry to bring up to date.
    assert_eq!(json_of(&root, &["list"])["sessions"][0]["title"], "");
    let before = json_of(&root, &["show", "talk"])["durable_sequence"].clone();
    let out = json_of(&root, &["rename", "talk", "Fix the parser"]);
    assert_eq!(
        out,
        json!({"session_id": "talk", "title": "Fix the parser"})
    );
    let page = json_of(&root, &["list"]);
    assert_eq!(page["sessions"][0]["title"], "Fix the parser");
    assert!(ok(&root, &["list"]).contains("Fix the parser"));
    let show = json_of(&root, &["show", "talk"]);
    assert_eq!(show["title"], "Fix the parser");
    assert_eq!(show["durable_sequence"], before.as_u64().expect("seq") + 1);
    let events = json_of(&root, &["events", "talk"]);
    let last = events["events"].as_array().expect("events").last().cloned();
    assert_eq!(
        last.as_ref().map(|e| e["kind"].clone()),
        Some(json!("session/title"))
    );

    // Exit codes: 3 no such session, 6 a blank title (nothing appended), 2 usage, and 5
    // while another process writes it (the title unchanged).
    fails(&root, &["rename", "nope", "x"], 3);
    fails(&root, &["rename", "talk", "   "], 6);
    fails(&root, &["rename", "talk"], 2);
    // A raw `session/title` event appended directly is held to the same rule as `rename`
    // (a blank title hid the session's preview in `list`): exit 6, nothing appended.
    for blank in ["", "   ", "\\n\\t"] {
        let line = format!(
            r#"{{"operation_id":"blank-{}","events":[{{"kind":"session/title","payload":{{"title":"{blank}"}}}}]}}"#,
            blank.len()
        );
        let out = append(&root, "talk", &format!("{line}\n"));
        assert_eq!(code(&out), 6, "{blank:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("blank"), "{}", text(&out.stderr));
    }
    // A title over 1,024 bytes (or, in an event, one holding NUL) was accepted, a megabyte
    // of it too: refused, exit 6, naming the limit, nothing appended.
    let long = "t".repeat(1025);
    let err = fails(&root, &["rename", "talk", &long], 6);
    assert!(err.contains("at most 1024 bytes"), "{err}");
    ok(&root, &["rename", "talk", &long[..1024]]);
    ok(&root, &["rename", "talk", "Fix the parser"]);
    let before = json_of(&root, &["show", "talk"])["durable_sequence"].clone();
    for (title, what) in [("a\\u0000b", "NUL"), (long.as_str(), "1024")] {
        let line = format!(
            r#"{{"operation_id":"bad-title","events":[{{"kind":"session/title","payload":{{"title":"{title}"}}}}]}}"#
        );
        let out = append(&root, "talk", &format!("{line}\n"));
        assert_eq!(code(&out), 6, "{title:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(what), "{}", text(&out.stderr));
    }
    assert_eq!(
        json_of(&root, &["show", "talk"])["durable_sequence"],
        before
    );
    assert_eq!(json_of(&root, &["show", "talk"])["title"], "Fix the parser");
    let writer = live_writer(&root, "talk");
    let err = fails(&root, &["rename", "talk", "Stolen"], 5);
    assert!(err.contains(&writer.id().to_string()), "{err}");
    stop(writer);
    assert_eq!(json_of(&root, &["show", "talk"])["title"], "Fix the parser");
    assert_eq!(
        json_of(&root, &["show", "talk"])["durable_sequence"],
        before
    );
}

#[test]
fn service_rename_goes_through_the_live_runtime() {
    let (_dir, root) = temp_root();
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    rt.block_on(async {
        let service = Service::new("h", root.clone()).expect("service");
        let runtime = service
            .create(session_store::CreateOptions::with_id(id("live")))
            .await
            .expect("create");
        let r = runtime.session_ref().clone();
        service.rename(&r, "Live title").await.expect("rename");
        let page = service.query().list(None, 10).await.expect("list");
        assert_eq!(page.sessions[0].title, "Live title");
        assert!(page.sessions[0].live);
        assert!(matches!(
            service.rename(&r, "").await,
            Err(Error::InvalidInput { .. })
        ));
        service.close(&r).await.expect("close");
        service.rename(&r, "Cold title").await.expect("rename cold");
        let page = service.query().list(None, 10).await.expect("list");
        assert_eq!(page.sessions[0].title, "Cold title");
        assert!(!page.sessions[0].live);
    });
}

/// The totals of `n` events of `usage("m", 3, 5, "0.1")` and one "x" event per 10.
fn expected_totals(u: &Usage, n: u64) {
    let xs = n / 10;
    assert_eq!(u.total.events, n + xs);
    assert_eq!(u.total.input_tokens, 3 * n + 7 * xs);
    assert_eq!(u.total.output_tokens, 5 * n);
    assert_eq!(u.total.cache_read_tokens, 2 * (n + xs));
    assert_eq!(u.total.cache_write_tokens, 0);
    // 0.1 summed n times and 0.000000000000000001 xs times, exactly (floating point
    // would drift after a few additions).
    let cost = format!("{}.{:0>18}", n / 10, format!("{}{:017}", n % 10, xs));
    assert_eq!(u.total.cost.map(|c| c.to_string()), Some(cost));
    assert_eq!(u.by_model["m"].events, n);
    assert_eq!(
        u.by_model["m"].cost.map(|c| c.to_string()),
        Some(format!("{}.{}", n / 10, n % 10))
    );
    assert_eq!(u.by_model["x"].input_tokens, 7 * xs);
}

#[test]
fn root_totals_of_counts_past_u64_saturate_instead_of_wrapping() {
    // Two sessions each at a count's largest value: their sum does not fit in 64 bits.
    // `catalog_totals` (serve's `/api/stats`) wrapped it in silence: input tokens
    // 2^64 - 2 and output tokens 0 for two sessions of 2^64 - 1 and 2^63 each.
    let (_dir, root) = temp_root();
    for name in ["a", "b"] {
        let s = create(&root, name);
        s.append(Batch::new(
            "u",
            vec![event(
                "usage",
                json!({"model": "m", "input_tokens": u64::MAX, "output_tokens": 1u64 << 63,
                       "cache_read_tokens": 5}),
            )],
        ))
        .expect("append");
        s.close().expect("close");
    }
    let c = create(&root, "c");
    c.append(Batch::new(
        "u",
        vec![event(
            "usage",
            json!({"model": "m", "input_tokens": 1, "output_tokens": 1, "cost": "0.25"}),
        )],
    ))
    .expect("append");
    c.close().expect("close");
    root.list(None, 10).expect("list");
    // Damaged after it was listed: the totals come from the catalog's entries alone, so
    // it still counts. They were summed by SQLite, whose `sum` of counts past 2^63 - 1
    // failed, and every totals call then opened every session file instead (outside
    // testing Z3), where this one's could not be read.
    let file = root.session_dir(&id("c")).join("session.sqlite");
    let mut bytes = std::fs::read(&file).expect("read");
    for b in &mut bytes[100..] {
        *b = 0xde;
    }
    std::fs::write(&file, &bytes).expect("damage");
    let totals = root.catalog_totals().expect("totals");
    assert_eq!(totals.sessions, 3);
    assert_eq!(totals.usage_events, 3);
    assert_eq!(totals.input_tokens, u64::MAX);
    assert_eq!(totals.output_tokens, u64::MAX);
    assert_eq!(totals.cache_read_tokens, 10);
    assert_eq!(totals.cost.map(|c| c.to_string()), Some("0.25".to_owned()));
}

#[test]
fn usage_totals_are_exact_across_many_batches_and_a_fork() {
    let (dir, root) = temp_root();
    let s = create(&root, "parent");
    // 300 batches of one usage event; every tenth also a turn with an "x" usage event.
    for i in 1..=300u64 {
        let mut events = vec![usage("m", 3, 5, "0.1")];
        if i % 10 == 0 {
            let t = turn(&format!("turn-{i}"), &format!("t{i}"), &format!("msg-{i}"));
            let mut turn_events = t.events;
            turn_events.insert(1, usage("x", 7, 0, "0.000000000000000001"));
            s.append(Batch::new(format!("op-{i}"), vec![events.remove(0)]))
                .expect("append usage");
            s.append(Batch::new(format!("turn-{i}"), turn_events).in_turn(format!("t{i}")))
                .expect("append turn");
        } else {
            s.append(Batch::new(format!("op-{i}"), events))
                .expect("append");
        }
    }
    s.with_projection(|p| expected_totals(&p.usage, 300));
    s.close().expect("close");
    // Reopened from its checkpoint and from the log alike, and in the catalog entry.
    expected_totals(
        &root
            .open_reader(&id("parent"))
            .expect("reader")
            .projection()
            .expect("p")
            .usage,
        300,
    );
    let w = root.open_writer(&id("parent")).expect("writer");
    w.with_projection(|p| expected_totals(&p.usage, 300));
    w.close().expect("close");
    let listing = root.list(None, 10).expect("list");
    expected_totals(&listing.entries[0].usage, 300);

    // A fork after turn t100 folds the inherited prefix once: its totals are the parent's
    // at the cut (100 "m" events, 10 "x" events), then grow with its own events only.
    let child = root
        .fork(
            &id("parent"),
            ForkPoint::AfterTurn("t100".into()),
            Some(id("child")),
        )
        .expect("fork");
    expected_totals(
        &root
            .open_reader(&child)
            .expect("reader")
            .projection()
            .expect("p")
            .usage,
        100,
    );
    let c = root.open_writer(&child).expect("child writer");
    for i in 101..=110u64 {
        c.append(Batch::new(
            format!("child-{i}"),
            vec![usage("m", 3, 5, "0.1")],
        ))
        .expect("append");
    }
    // An optional event is stored and not folded.
    c.append(Batch::new(
        "child-optional",
        vec![usage("optional", 1, 1, "1").optional()],
    ))
    .expect("append");
    c.close().expect("close");
    let child_usage = root
        .open_reader(&child)
        .expect("reader")
        .projection()
        .expect("p")
        .usage;
    assert_eq!(child_usage.by_model["m"].events, 110);
    assert!(!child_usage.by_model.contains_key("optional"));
    // `stats` reads the usage events alone (inherited ones from the parent's file) and
    // gives the projection's totals.
    assert_eq!(root.stats(&child).expect("stats").usage, child_usage);
    assert_eq!(
        root.stats(&id("parent")).expect("stats").usage,
        root.open_reader(&id("parent"))
            .expect("reader")
            .projection()
            .expect("p")
            .usage
    );
    assert_eq!(
        child_usage.total.cost.map(|c| c.to_string()),
        Some("11.000000000000000010".into())
    );
    // The parent is not changed by its fork; deleting it materialises the fork's inherited
    // history without counting it twice.
    expected_totals(
        &root
            .open_reader(&id("parent"))
            .expect("reader")
            .projection()
            .expect("p")
            .usage,
        300,
    );
    root.delete(&id("parent"), &session_store::CancelToken::new())
        .expect("delete");
    assert_eq!(
        root.open_reader(&child)
            .expect("reader")
            .projection()
            .expect("p")
            .usage,
        child_usage
    );

    // The CLI shows the same totals in show, stats and list --json.
    let cli_root = dir.path().join("sessions");
    let show = json_of(&cli_root, &["show", "child"]);
    assert_eq!(show["usage"]["total"]["cost"], "11.000000000000000010");
    assert_eq!(show["usage"]["by_model"]["m"]["events"], 110);
    let stats = json_of(&cli_root, &["stats", "child"]);
    assert_eq!(stats["usage"], show["usage"]);
    let page = json_of(&cli_root, &["list"]);
    assert_eq!(page["sessions"][0]["usage"], show["usage"]);
    assert!(ok(&cli_root, &["show", "child"]).contains("cost 11.000000000000000010"));
}

/// `stats` decodes no payload but the `usage` events': its fold of every payload held each
/// message decoded, about 3 GB for an 800 MB one in each request of `serve`'s stats page
/// (outside testing V5). Here a message whose blob is damaged: `verify` refuses the
/// session, `stats` still gives its sizes and usage totals.
#[test]
fn stats_reads_no_payload_but_the_usage_events() {
    let (_dir, root) = temp_root();
    let s = create(&root, "big");
    let mut events = turn("t1", "t1", "m1").events;
    events[1] = event(
        "message/complete",
        json!({"message": {"id": "m1", "role": "user", "content": "x".repeat(100_000)}}),
    );
    events.insert(2, usage("m", 3, 5, "0.1"));
    s.append(Batch::new("op", events).in_turn("t1"))
        .expect("append");
    s.close().expect("close");
    let file = root.session_dir(&id("big")).join("session.sqlite");
    let conn = rusqlite::Connection::open(&file).expect("open");
    let damaged = conn
        .execute("UPDATE blobs SET data = x'00', encoding = 'identity'", [])
        .expect("damage");
    assert_eq!(damaged, 1, "the message is stored as one blob");
    drop(conn);
    assert!(root.verify(&id("big")).is_err(), "the blob is damaged");
    let stats = root.stats(&id("big")).expect("stats");
    assert_eq!(stats.usage.by_model["m"].events, 1);
    assert_eq!(stats.usage.total.input_tokens, 3);
    assert_eq!(stats.blobs.count, 1);
}

/// A CLI `append` records the session's catalog entry as it closes (`Root::close`), as
/// `rename` and a service's close do: it left the entry stale, and the next `list` folded
/// the session's whole log again (2 s and 320 MB after one turn appended to a session of
/// 500,000 messages: outside testing L4).
#[test]
fn an_append_leaves_the_catalog_entry_current() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("sessions");
    chat(&root, "a", 2, "/w");
    assert_eq!(json_of(&root, &["list"])["sessions"][0]["turns"], 2);
    let out = append(&root, "a", &turn_line("a", 3));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    // Read from the catalog file itself: a `list` would bring a stale entry up to date.
    let recorded = common::sqlite3(
        &root.join(".catalog").join("catalog.sqlite"),
        "SELECT json_extract(entry, '$.turns') || ' ' || json_extract(entry, '$.durable_sequence')
         FROM sessions WHERE session_id = 'a'",
    );
    let durable = json_of(&root, &["show", "a"])["durable_sequence"].clone();
    assert_eq!(recorded.trim(), format!("3 {durable}"));
}

#[test]
fn hostile_usage_payloads_are_refused_and_change_nothing() {
    let (_dir, root) = temp_root();
    let s = create(&root, "u");
    s.append(Batch::new(
        "ok",
        vec![event(
            "usage",
            json!({"model": "m", "input_tokens": u64::MAX - 1, "output_tokens": 0}),
        )],
    ))
    .expect("a large but valid count");
    let before = s.with_projection(|p| p.usage.clone());
    let base = json!({"model": "m", "input_tokens": 1, "output_tokens": 1});
    let with = |key: &str, value: Value| {
        let mut p = base.clone();
        p[key] = value;
        p
    };
    let mut missing = base.clone();
    missing
        .as_object_mut()
        .expect("object")
        .remove("output_tokens");
    let hostile = [
        with("input_tokens", json!(-1)),
        with("output_tokens", json!(1.5)),
        with("input_tokens", json!("10")),
        with("input_tokens", json!(1e30)),
        with("input_tokens", json!(2)), // the total would pass u64::MAX
        with("cache_read_tokens", json!(-3)),
        with("cache_write_tokens", json!(true)),
        with("cost", json!(0.1)),
        with("cost", json!("-1")),
        with("cost", json!("1e3")),
        with("cost", json!("0.1.2")),
        with("cost", json!("")),
        with("cost", json!(".5")),
        with("cost", json!(" 1")),
        with("cost", json!("0.0000000000000000001")),
        with("cost", json!("9".repeat(40))),
        // More than one call may cost: it left no room for later costs of 18 decimals.
        with("cost", json!("1000000000000000")),
        with("cost", json!("1000000000000000000000")),
        with("model", json!("")),
        with("model", json!(" ")),
        with("model", json!(7)),
        with("model", json!("m".repeat(300))),
        with("reasoning_tokens", json!(1)),
        missing,
        json!([1, 2]),
        json!(null),
    ];
    for (i, payload) in hostile.iter().enumerate() {
        let err = s
            .append(Batch::new(
                format!("bad-{i}"),
                vec![event("usage", payload.clone())],
            ))
            .expect_err(&format!("{payload} must be refused"));
        assert!(
            matches!(err, Error::InvalidPayload { .. }),
            "{payload}: {err}"
        );
        assert!(err.is_caller_error(), "{payload}: {err}");
    }
    // An empty model is missing, a blank one is given but blank (both said "is required").
    for (model, says) in [("", "model is required"), (" ", "model must not be blank")] {
        let err = s
            .append(Batch::new(
                "m",
                vec![event("usage", with("model", json!(model)))],
            ))
            .expect_err("refused");
        assert!(err.to_string().contains(says), "{err}");
    }
    // A usage event without a payload, and a good event batched with a bad one.
    assert!(
        s.append(Batch::new("bare", vec![session_store::Event::new("usage")]))
            .is_err()
    );
    // The refused event is named, as the range checks name it (outside testing C1: only
    // they did; "cost \"x\" is not a decimal string" said nothing of which event).
    let mixed = s
        .append(Batch::new(
            "mixed",
            vec![
                usage("m", 1, 1, "1"),
                event("usage", with("cost", json!("x"))),
            ],
        ))
        .expect_err("refused");
    assert!(
        mixed
            .to_string()
            .contains(r#"events[1] (model "m"): cost "x""#),
        "{mixed}"
    );
    s.with_projection(|p| assert_eq!(p.usage, before));
    assert_eq!(
        s.flush().expect("flush"),
        1,
        "only the first batch is in the log"
    );
    // The refused payloads are caller errors on the command line too (status 6).
    s.close().expect("close");
    let dir = root.path().to_path_buf();
    let line = json!({"operation_id": "cli", "events": [{"kind": "usage", "payload": with("cost", json!("1,5"))}]});
    let out = append(&dir, "u", &format!("{line}\n"));
    assert_eq!(code(&out), 6, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("usage"), "{}", text(&out.stderr));
}

/// One hostile cost cannot keep a session from recording costs: a cost of 10^21 was
/// accepted, and from then on every `usage` event with a cost of 18 decimals was refused
/// ("the usage totals would overflow", naming neither the event nor the total) for good.
/// Now a cost of 10^15 or more is refused, naming the event; an overflow names the event,
/// the total and its value.
#[test]
fn one_hostile_cost_cannot_keep_a_session_from_recording_costs() {
    let (_dir, root) = temp_root();
    let s = create(&root, "c");
    let err = s
        .append(Batch::new(
            "huge",
            vec![
                usage("m", 1, 1, "0.5"),
                usage("big", 1, 1, "1000000000000000000000"),
            ],
        ))
        .expect_err("a cost of 10^21 is refused");
    let said = err.to_string();
    assert!(
        said.contains(
            r#"events[1] (model "big"): cost 1000000000000000000000 is over what one call may cost"#
        ),
        "{said}"
    );
    s.with_projection(|p| assert!(p.usage.is_empty()));
    // Costs of 18 decimals still add up after the largest cost one call may have.
    s.append(Batch::new(
        "max",
        vec![usage("m", 1, 1, "999999999999999.999999999999999999")],
    ))
    .expect("the largest cost");
    s.append(Batch::new(
        "fine",
        vec![usage("m", 1, 1, "0.000000000000000001")],
    ))
    .expect("a fine cost after it");
    assert_eq!(
        s.with_projection(|p| p.usage.total.cost.map(|c| c.to_string())),
        Some("1000000000000000.000000000000000000".to_owned())
    );
    // An overflow names the event, the total and where it stands.
    s.append(Batch::new(
        "many",
        vec![event(
            "usage",
            json!({"model": "m", "input_tokens": u64::MAX - 4, "output_tokens": 0}),
        )],
    ))
    .expect("a large count");
    let err = s
        .append(Batch::new(
            "over",
            vec![usage("m", 1, 1, "1"), usage("n", 5, 1, "1")],
        ))
        .expect_err("the input tokens overflow");
    assert!(
        err.to_string().contains(&format!(
            r#"events[1] (model "n"): the total input_tokens ({}) plus 5 would pass {}"#,
            u64::MAX - 1,
            u64::MAX
        )),
        "{err}"
    );
    s.close().expect("close");
    // The binary says the same (exit 6), nothing appended.
    let dir = root.path().to_path_buf();
    let line = json!({"operation_id": "cli", "events": [usage_json("big", "5000000000000000")]});
    let out = append(&dir, "c", &format!("{line}\n"));
    assert_eq!(code(&out), 6, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(r#"events[0] (model "big"): cost 5000000000000000 is over"#),
        "{}",
        text(&out.stderr)
    );
}

/// A `usage` event as an `append` line has it.
fn usage_json(model: &str, cost: &str) -> Value {
    json!({"kind": "usage", "payload": {"model": model, "input_tokens": 1, "output_tokens": 1, "cost": cost}})
}

#[test]
fn list_filters_and_sorts_are_keyset_pages_on_the_catalog() {
    let (_dir, root) = temp_cli_root();
    // Five sessions: cwd, title, origin and last commit chosen per session. Updated order
    // (a session's last commit, or a fork's creation; newest first): d, b, e, a, c, with
    // `after_c` and `after_a` between them.
    let pause = || std::thread::sleep(Duration::from_millis(30));
    chat(&root, "c", 1, "/other");
    ok(&root, &["rename", "c", "parser notes"]);
    pause();
    let after_c = utc_now();
    pause();
    chat(&root, "a", 1, "/proj");
    ok(&root, &["rename", "a", "Refactor the PARSER"]);
    pause();
    let after_a = utc_now();
    pause();
    chat(&root, "b", 2, "/proj");
    ok(&root, &["fork", "b", "--after-turn", "t1", "--id", "e"]);
    pause();
    ok(&root, &["rename", "b", "Standup"]);
    chat(&root, "d", 1, "/proj");
    ok(&root, &["rename", "d", "Lunch"]);
    assert_eq!(listed(&root, &[]), ["a", "b", "c", "d", "e"]);
    assert_eq!(
        listed(&root, &["--sort", "updated"]),
        ["d", "b", "e", "a", "c"]
    );
    assert_eq!(listed(&root, &["--cwd", "/proj"]), ["a", "b", "d", "e"]);
    assert_eq!(listed(&root, &["--title", "parser"]), ["a", "c"]);
    assert_eq!(
        listed(&root, &["--title", "PARSER", "--cwd", "/proj"]),
        ["a"]
    );
    assert_eq!(listed(&root, &["--origin", "fork"]), ["e"]);
    assert_eq!(
        listed(&root, &["--since", &after_c, "--sort", "updated"]),
        ["d", "b", "e", "a"]
    );
    assert_eq!(listed(&root, &["--since", &after_a]), ["b", "d", "e"]);
    assert_eq!(listed(&root, &["--since", "1d"]), ["a", "b", "c", "d", "e"]);
    assert_eq!(
        listed(&root, &["--since", "2000-01-01"]),
        ["a", "b", "c", "d", "e"]
    );
    assert!(listed(&root, &["--since", "2101-01-01"]).is_empty());
    // An empty page says whether the filters or the cursor emptied it, not that the root
    // holds no sessions (it said "no sessions in ROOT" for all three).
    let empty = ok(&root, &["list", "--since", "2101-01-01"]);
    assert!(
        empty.starts_with("no sessions match the filters in "),
        "{empty}"
    );
    let empty = ok(&root, &["list", "--cursor", "zzz"]);
    assert!(
        empty.starts_with("no more sessions after the cursor in "),
        "{empty}"
    );
    // (A listing's cursor does not name `--since`, which a relative time moves.)
    let first = json_of(&root, &["list", "--since", "2000-01-01", "--limit", "1"]);
    let cursor = first["next_cursor"].as_str().expect("cursor");
    let empty = ok(
        &root,
        &["list", "--since", "2101-01-01", "--cursor", cursor],
    );
    assert!(
        empty.starts_with("no more sessions match the filters after the cursor in "),
        "{empty}"
    );
    let (_empty_dir, empty_root) = temp_cli_root();
    ok(&empty_root, &["create", "x"]);
    ok(&empty_root, &["delete", "x"]);
    let empty = ok(&empty_root, &["list"]);
    assert!(empty.starts_with("no sessions in "), "{empty}");

    // Pages of two follow the cursor through the same order, in every sort.
    for sort in ["id", "updated", "created"] {
        let all = json_of(&root, &["list", "--sort", sort])["sessions"].clone();
        let mut paged = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut args = vec!["list", "--sort", sort, "--limit", "2"];
            if let Some(c) = &cursor {
                args.extend(["--cursor", c.as_str()]);
            }
            let page = json_of(&root, &args);
            paged.extend(
                page["sessions"]
                    .as_array()
                    .expect("sessions")
                    .iter()
                    .cloned(),
            );
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        assert_eq!(Value::Array(paged), all, "{sort}");
    }
    // The human "more:" line continues the same listing: it names the sort the cursor
    // belongs to (alone, `--cursor u.…` was read as an id and listed other sessions), and
    // the filters to give again (alone, the cursor listed every session after it).
    let human = ok(&root, &["list", "--sort", "updated", "--limit", "2"]);
    let more = human.lines().last().unwrap_or_default();
    let args: Vec<&str> = more
        .strip_prefix("more: ")
        .unwrap_or_else(|| panic!("{human}"))
        .split(' ')
        .collect();
    assert_eq!(args[..3], ["--sort", "updated", "--cursor"], "{more}");
    let mut next = vec!["list", "--limit", "2"];
    next.extend(&args);
    assert_eq!(listed(&root, &next[1..]), ["e", "a"], "{more}");
    let human = ok(
        &root,
        &["list", "--cwd", "/proj", "--origin", "new", "--limit", "1"],
    );
    let more = human.lines().last().unwrap_or_default();
    assert!(
        more.starts_with("more: --cursor ") && more.ends_with(" (with the same --cwd, --origin)"),
        "{more}"
    );
    let created = json_of(&root, &["list", "--sort", "created"])["sessions"].clone();
    let keys: Vec<(i64, String)> = created
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| {
            (
                s["created_at_ms"].as_i64().expect("ms"),
                s["session_ref"]["session_id"]
                    .as_str()
                    .expect("id")
                    .to_owned(),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_by(|x, y| y.cmp(x));
    assert_eq!(keys, sorted);

    // The library: the same filter through SessionQuery::list_with and Root::list_filtered.
    let lib = Root::open(&root).expect("root");
    let filter = ListFilter::default()
        .with_cwd("/proj")
        .with_sort(ListSort::Updated);
    let listing = lib.list_filtered(&filter, None, 10).expect("list");
    let ids = id_texts(listing.entries.iter().map(|e| &e.session_id));
    assert_eq!(ids, ["d", "b", "e", "a"]);
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    let page = rt
        .block_on(async {
            let service = Service::new("h", lib.clone())?;
            service
                .query()
                .list_with(&ListFilter::default().with_origin(Origin::Fork), None, 1)
                .await
        })
        .expect("list_with");
    assert_eq!(page.sessions.len(), 1);
    assert_eq!(page.sessions[0].session_ref.session_id.as_str(), "e");
    assert!(page.next_cursor.is_none());

    // A session that became unreadable is reported with the first page, never listed from
    // the entry it had.
    std::fs::write(root.join("c").join("session.sqlite"), b"not a session file").expect("damage");
    let page = json_of(&root, &["list", "--title", "parser"]);
    assert_eq!(page["sessions"].as_array().expect("sessions").len(), 1);
    assert_eq!(page["sessions"][0]["session_ref"]["session_id"], "a");
    assert_eq!(page["skipped"][0]["session_id"], "c");
    assert_eq!(listed(&root, &["--sort", "updated"]), ["d", "b", "e", "a"]);

    // Bad input: a cursor of another order (6), an unknown origin, sort or date (2).
    fails(&root, &["list", "--sort", "updated", "--cursor", "a"], 6);
    fails(&root, &["list", "--origin", "alien"], 2);
    fails(&root, &["list", "--sort", "size"], 2);
    fails(&root, &["list", "--since", "2024-02-30"], 2);
    // A negative duration is our refusal of the value, not clap's "unexpected argument
    // '-7'" (outside testing, clocks); so is a space around a time, as the serve API's.
    for args in [
        &["list", "--since", "-7d"][..],
        &["search", "question", "--since", "-7d"],
        &["list", "--since", " 7d"],
    ] {
        let err = fails(&root, args, 2);
        assert!(err.contains("is neither a duration"), "{args:?}: {err}");
    }
    let err = fails(&root, &["gc", "--older-than", "-1d"], 2);
    assert!(err.contains("\"-1d\" is not a duration"), "{err}");
}

/// Reading a session whose file has no `-wal` beside it (a fork, an import) makes SQLite
/// create an empty one: its fresh mtime made the session "updated" now, so `show`, a
/// browser's page or `gc --dry-run` itself put an old session back at the top of
/// `list --sort updated` and out of reach of `gc` (the test's sessions were created now,
/// so only `gc`, which goes by the files alone, sees their age). An empty WAL holds no
/// change.
/// A `list` cursor continues only the listing that made it (its order and filters): a
/// sorted listing's cursor given to the plain one (read as an id), a plain one's given
/// with a filter, one of other filters (all restarted or skipped silently), and hand-made
/// ones (a negative time, a history cursor read as an id, a time with a `+`) are refused,
/// exit 6, naming the cursor. An earlier build's cursors still continue an unfiltered
/// listing of their order.
#[test]
fn a_list_cursor_continues_only_the_listing_that_made_it() {
    let (_dir, root) = temp_cli_root();
    for (name, cwd) in [("a", "/p"), ("b", "/q"), ("c", "/p"), ("d", "/p")] {
        ok(&root, &["create", name, "--cwd", cwd]);
    }
    let cursor = |args: &[&str]| -> String {
        let mut all = vec!["list", "--limit", "1"];
        all.extend(args);
        json_of(&root, &all)["next_cursor"]
            .as_str()
            .expect("cursor")
            .to_owned()
    };
    let plain = cursor(&[]);
    let updated = cursor(&["--sort", "updated"]);
    let in_p = cursor(&["--cwd", "/p"]);
    let refused = |args: &[&str], why: &str| {
        let mut all = vec!["list"];
        all.extend(args);
        let err = fails(&root, &all, 6);
        assert!(
            err.contains("invalid list cursor") && err.contains(why),
            "{args:?}: {err}"
        );
    };
    refused(&["--cursor", &updated], "not for this sort");
    refused(
        &["--sort", "created", "--cursor", &updated],
        "not for this sort",
    );
    refused(&["--cwd", "/p", "--cursor", &plain], "other filters");
    refused(&["--cursor", &in_p], "other filters");
    refused(&["--cwd", "/q", "--cursor", &in_p], "other filters");
    refused(
        &["--cwd", "/p", "--title", "x", "--cursor", &in_p],
        "other filters",
    );
    for hand_made in [
        "u.-5.x",
        "h1.600.+198",
        "s3.1.2.0000000000000001",
        "u.+5.a",
        "u.05.a",
    ] {
        let sort = if hand_made.starts_with("u.") {
            "updated"
        } else {
            "id"
        };
        refused(
            &["--sort", sort, "--cursor", hand_made],
            "not a cursor a listing made",
        );
    }
    refused(&["--cursor", "l2:i:0000000000000000:0:a"], "other filters");
    refused(&["--cursor", "l2:i:zz:0:a"], "not a cursor a listing made");
    refused(
        &["--cursor", "l2:x:0000000000000000:0:a"],
        "not a cursor a listing made",
    );
    // An earlier build's forms name no filters: a filtered listing refuses them.
    refused(&["--cwd", "/p", "--cursor", "a"], "earlier build");
    // Any text that is an id reads as an earlier build's cursor of the id order: a sorted
    // listing said `garbage` continued "a listing sorted by id" (outside testing W6,
    // session 37).
    refused(
        &["--sort", "updated", "--cursor", "garbage"],
        "not a cursor a listing sorted by updated made (a bare session id continues only the id order",
    );
    // Each cursor continues its own listing; the earlier forms an unfiltered one.
    let ids = |args: &[&str]| listed(&root, args);
    assert_eq!(ids(&["--cursor", &plain]), ["b", "c", "d"]);
    assert_eq!(ids(&["--cwd", "/p", "--cursor", &in_p]), ["c", "d"]);
    assert_eq!(ids(&["--cursor", "b"]), ["c", "d"]);
    let d = json_of(&root, &["list", "--sort", "updated", "--limit", "1"]);
    let old = format!("u.{}.d", d["sessions"][0]["updated_at_ms"]);
    assert_eq!(
        ids(&["--sort", "updated", "--cursor", &old]),
        ["c", "b", "a"]
    );
    assert_eq!(
        ids(&["--sort", "updated", "--cursor", &updated]),
        ["c", "b", "a"]
    );
}

#[test]
fn reading_a_session_does_not_make_it_updated() {
    let (_dir, root) = temp_cli_root();
    chat(&root, "parent", 1, "/w");
    ok(
        &root,
        &["fork", "parent", "--after-turn", "t1", "--id", "child"],
    );
    let wal = root.join("child").join("session.sqlite-wal");
    let _ = std::fs::remove_file(&wal);
    std::thread::sleep(Duration::from_millis(1_200));
    for args in [
        &["show", "child"][..],
        &["history", "child"],
        &["verify", "child"],
    ] {
        ok(&root, args);
    }
    assert!(wal.exists(), "the reads made SQLite's -wal");
    let dry = json_of(&root, &["gc", "--older-than", "1s", "--dry-run"]);
    let again = json_of(&root, &["gc", "--older-than", "1s", "--dry-run"]);
    assert_eq!(dry, again, "a dry run changes nothing the next one sees");
    assert_eq!(
        dry["deleted"].as_array().expect("deleted").len(),
        2,
        "{dry}"
    );
}

/// An old parent and its old fork: deleting the fork (first in id order) removes its row
/// from the parent's `dependents`, which changes the parent's file. The parent was then
/// skipped without a word (neither deleted nor kept), against the dry run that said it
/// would be deleted. Every session old when the run starts is reported.
/// The session ids a `gc --json` report lists under `key` (`deleted` or `kept`).
fn gc_ids(report: &Value, key: &str) -> Vec<String> {
    report[key]
        .as_array()
        .expect(key)
        .iter()
        .map(|d| d["session_id"].as_str().expect("id").to_owned())
        .collect()
}

/// `BIN --root ROOT ARGS` under the wall clock `clock` (see [`common::under_clock`]).
fn clocked(root: &Path, clock: &str, args: &[&str]) -> Command {
    let mut c = common::under_clock(clock, BIN);
    c.arg("--root")
        .arg(root)
        .args(args)
        .env_remove("SESSION_STORE_ROOT");
    c
}

/// Turn `t{n}` of `session` as `append` takes it: one user message, "question N".
fn turn_line(session: &str, n: usize) -> String {
    let t = format!("t{n}");
    format!(
        "{}\n",
        json!({"operation_id": format!("{t}/op"), "turn_id": t, "events": [
            {"kind": "turn/start"},
            {"kind": "message/complete", "payload": {"message":
                {"id": format!("{session}-{t}"), "role": "user", "content": format!("question {n}")}}},
            {"kind": "turn/end", "payload": {"status": "completed"}},
        ]})
    )
}

/// Runs `command` with `input` on stdin; expects status 0.
fn fed(command: Command, input: &str) {
    let out = feed(command, input);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
}

/// Commit times are the writers' clocks (outside testing, clocks). A session committed to
/// a moment ago, the last time by a writer whose clock ran 25 years behind, is kept by
/// `gc` (an earlier commit is newer than the age: it was deleted a second after that
/// append); one created under a clock in 2090 is reported kept until then (passed over in
/// silence: no run would ever collect it); a writer under a clock past year 9999 records
/// 9999-12-31 and one before 1970 records 1970, so the export of either imports (past
/// 9999 the header's time was refused by `import`).
#[test]
fn gc_and_import_under_writers_clocks_that_were_wrong() {
    if !common::faketime_or_skip() {
        return;
    }
    let (_dir, root) = temp_cli_root();
    ok(&root, &["create", "back"]);
    std::thread::sleep(Duration::from_millis(2_500));
    append(&root, "back", &turn_line("back", 1));
    fed(
        clocked(&root, "@2001-09-09 01:46:40", &["append", "back"]),
        &turn_line("back", 2),
    );
    fed(
        clocked(
            &root,
            "@2090-01-01 00:00:00",
            &["append", "ahead", "--create"],
        ),
        &turn_line("ahead", 1),
    );
    let dry = json_of(&root, &["gc", "--older-than", "2s", "--dry-run"]);
    let real = json_of(&root, &["gc", "--older-than", "2s"]);
    for report in [&dry, &real] {
        assert_eq!(gc_ids(report, "deleted"), Vec::<String>::new(), "{report}");
        assert_eq!(gc_ids(report, "kept"), ["back", "ahead"], "{report}");
        let reasons: Vec<&str> = report["kept"]
            .as_array()
            .expect("kept")
            .iter()
            .map(|k| k["reason"].as_str().expect("reason"))
            .collect();
        assert!(
            reasons[0].contains("a writer's clock went back"),
            "{report}"
        );
        assert!(reasons[1].contains("a time still to come"), "{report}");
    }
    let human = ok(&root, &["gc", "--older-than", "2s"]);
    assert!(
        human.contains("kept ahead: updated at a time still to come"),
        "{human}"
    );
    assert_eq!(listed(&root, &[]), ["ahead", "back"]);

    for (clock, created) in [
        ("+8000y", "9999-12-31 23:59:59"),
        ("@1965-01-01 00:00:00", "1970-01-01 00:00:00"),
    ] {
        let (_dir, other) = temp_cli_root();
        fed(
            clocked(&other, clock, &["append", "odd", "--create"]),
            &turn_line("odd", 1),
        );
        let shown = ok(&other, &["show", "odd"]);
        assert!(shown.contains(created), "{clock}: {shown}");
        let file = other.parent().expect("parent").join("odd.sqlite");
        ok(&other, &["export", "odd", file.to_str().expect("path")]);
        let (_dir, into) = temp_cli_root();
        ok(&into, &["import", file.to_str().expect("path")]);
        assert!(ok(&into, &["verify", "odd"]).starts_with("ok"));
    }
}

/// `import` refuses a file whose commits' times pass year 9999, as it refuses such a
/// header time (the session's update time passes every key of `list --sort updated`);
/// nothing is published.
#[test]
fn import_refuses_a_commit_time_past_year_9999() {
    let (_dir, root) = temp_cli_root();
    chat(&root, "late", 1, "/w");
    let file = root.parent().expect("parent").join("late.sqlite");
    ok(&root, &["export", "late", file.to_str().expect("path")]);
    let conn = rusqlite::Connection::open(&file).expect("open");
    conn.execute_batch("UPDATE commits SET created_at = 254084649174801")
        .expect("edit");
    drop(conn);
    let (_dir, into) = temp_cli_root();
    let err = fails(&into, &["import", file.to_str().expect("path")], 6);
    assert!(
        err.contains("a commit of the file has a time of 254084649174801 ms since 1970, not a time of years 1970-9999"),
        "{err}"
    );
    assert!(!into.join("late").exists());
}

/// Out of file descriptors (`ulimit -n`, swept), `gc` either does its work or fails with
/// exit 1, naming the sessions it could not check or delete, each left as it was: an error of its
/// check under the delete's lock was taken for a reason to keep, so a run kept every
/// session "for" "Too many open files" and exited 0, having deleted nothing (outside
/// testing, resource limits).
#[test]
fn gc_out_of_file_descriptors_fails_rather_than_keeping() {
    let (dir, template) = temp_cli_root();
    let names = ["a", "b", "c", "d", "e", "f"];
    for name in names {
        chat(&template, name, 1, "/w");
    }
    let limits = 8..24;
    let root_of = |limit: i32| dir.path().join(format!("n{limit}"));
    for limit in limits.clone() {
        common::copy_tree(&template, &root_of(limit));
    }
    // Older than the age given, as sessions and as arrivals in their root.
    std::thread::sleep(Duration::from_millis(1_100));
    for limit in limits {
        let root = root_of(limit);
        let out = Command::new("sh")
            .args(["-c", "ulimit -n \"$1\" && shift && exec \"$@\"", "sh"])
            .arg(limit.to_string())
            .arg(BIN)
            .arg("--root")
            .arg(&root)
            .args(["gc", "--older-than", "1s"])
            .env_remove("SESSION_STORE_ROOT")
            .output()
            .expect("sh");
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        if out.status.success() {
            assert!(
                !said.contains("Too many open files"),
                "ulimit -n {limit}: {said}"
            );
            assert!(listed(&root, &[]).is_empty(), "ulimit -n {limit}: {said}");
        } else {
            assert_eq!(code(&out), 1, "ulimit -n {limit}: {said}");
        }
    }
}

/// `gc --older-than 0s` (or `0d`) is refused as a usage error (exit 2), nothing deleted: it
/// deleted every session without a writer, however new, for an accidental 0.
#[test]
fn gc_refuses_an_age_of_zero() {
    let (_dir, root) = temp_cli_root();
    chat(&root, "keep", 1, "/w");
    age(&root, "keep", 3 * 86_400);
    for zero in ["0s", "0d"] {
        for dry in [&[][..], &["--dry-run"][..]] {
            let mut args = vec!["gc", "--older-than", zero];
            args.extend(dry);
            let err = fails(&root, &args, 2);
            assert!(
                err.contains("would delete every session without a writer"),
                "{err}"
            );
        }
    }
    assert_eq!(listed(&root, &[]), ["keep"]);
    std::thread::sleep(Duration::from_millis(1_100));
    let real = json_of(&root, &["gc", "--older-than", "1s"]);
    assert_eq!(gc_ids(&real, "deleted"), ["keep"]);
}

/// A session's updated time is its last commit's (its creation before any): forking,
/// exporting, verifying and reading it leave it where it was, in `list` and its
/// `--sort updated`, and `gc` deletes an old parent and its old fork in one run. A fork
/// moved its parent's updated time (its `dependents` row changed the parent's file, whose
/// last change it was), and `gc` deleted the fork and kept the parent as "updated
/// meanwhile" (deleting the fork changed the parent's file again). A catalog an earlier
/// build filled (`user_version` 0) has its entries computed again.
#[test]
fn forks_and_reads_do_not_make_a_session_updated_and_gc_takes_both() {
    let (dir, root) = temp_cli_root();
    chat(&root, "parent", 1, "/w");
    let before = listed_updated(&root, "parent");
    std::thread::sleep(Duration::from_millis(30));
    ok(
        &root,
        &["fork", "parent", "--after-turn", "t1", "--id", "child"],
    );
    let export = dir.path().join("parent.sqlite");
    ok(
        &root,
        &["export", "parent", export.to_str().expect("utf-8")],
    );
    for args in [
        &["verify", "parent"][..],
        &["show", "parent"],
        &["history", "parent"],
    ] {
        ok(&root, args);
    }
    assert_eq!(listed_updated(&root, "parent"), before);
    let child = listed_updated(&root, "child");
    assert!(
        child > before,
        "the fork's own time is its creation: {child} <= {before}"
    );
    assert_eq!(listed(&root, &["--sort", "updated"]), ["child", "parent"]);
    // An entry an earlier build stored (its meaning of updated) is not trusted.
    let catalog =
        rusqlite::Connection::open(root.join(".catalog").join("catalog.sqlite")).expect("catalog");
    catalog
        .execute_batch(
            "UPDATE sessions SET entry = json_set(entry, '$.updated_at_ms', 1) \
             WHERE session_id = 'parent'; PRAGMA user_version = 0;",
        )
        .expect("older catalog");
    drop(catalog);
    assert_eq!(listed_updated(&root, "parent"), before);
    std::thread::sleep(Duration::from_millis(1_100));
    let real = json_of(&root, &["gc", "--older-than", "1s"]);
    assert_eq!(gc_ids(&real, "deleted"), ["child", "parent"], "{real}");
    assert!(gc_ids(&real, "kept").is_empty(), "{real}");
    assert_eq!(real["deleted"][1]["updated_at_ms"], before, "{real}");
    assert!(listed(&root, &[]).is_empty());
}

/// A session deleted while its entry was computed (`serve` reading its page) left a row
/// stamped as missing (`-/-`), which matched the missing file's stamp for ever: no
/// refresh dropped it, a sorted first page of 2 had no next cursor (the row filled the
/// page's extra place and was dropped after the query) and the root's totals counted the
/// deleted session (outside testing W1, session 37). Planted here as such a row.
#[test]
fn a_row_of_a_deleted_session_stamped_missing_is_dropped_by_the_next_refresh() {
    let (_dir, root) = temp_cli_root();
    for name in ["a", "b", "c"] {
        chat(&root, name, 1, "/w");
    }
    listed(&root, &[]);
    let catalog =
        rusqlite::Connection::open(root.join(".catalog").join("catalog.sqlite")).expect("catalog");
    catalog
        .execute_batch(
            "INSERT INTO sessions (session_id, stamp, entry) \
             SELECT 'ghost', '-/-', json_set(entry, '$.session_id', 'ghost', \
                    '$.updated_at_ms', 9000000000000, '$.created_at_ms', 9000000000000) \
             FROM sessions WHERE session_id = 'a'",
        )
        .expect("plant");
    drop(catalog);
    let page = json_of(&root, &["list", "--sort", "updated", "--limit", "2"]);
    assert_eq!(page["sessions"].as_array().map(Vec::len), Some(2), "{page}");
    assert!(page["next_cursor"].is_string(), "no next page: {page}");
    let totals = Root::open(&root)
        .and_then(|r| r.catalog_totals())
        .expect("totals");
    assert_eq!(totals.sessions, 3, "{totals:?}");
    let rows: i64 = rusqlite::Connection::open(root.join(".catalog").join("catalog.sqlite"))
        .expect("catalog")
        .query_row(
            "SELECT count(*) FROM sessions WHERE session_id = 'ghost'",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(rows, 0);
}

/// A fork SIGKILLed between recording itself in its parent's `dependents` and its
/// publication leaves a row naming no session (5 of 60 random kills did); the same row
/// naming a session made later under that id, which inherits nothing. Neither is a
/// fork: `gc --keep-forked` deletes the parent (it kept it for good, "2 fork(s) inherit
/// from it") and the report lists no forks keeping its history.
#[test]
fn gc_keep_forked_ignores_dependents_rows_of_forks_that_never_were() {
    let (_dir, root) = temp_cli_root();
    chat(&root, "parent", 2, "/w");
    std::thread::sleep(Duration::from_millis(2_200));
    chat(&root, "unrelated", 1, "/w");
    let file = root.join("parent").join("session.sqlite");
    let conn = rusqlite::Connection::open(&file).expect("open");
    conn.execute_batch(
        "INSERT INTO dependents (child_id, through_seq) VALUES ('ghost', 4), ('unrelated', 4)",
    )
    .expect("plant");
    drop(conn);
    let dry = json_of(&root, &["gc", "--older-than", "2s", "--dry-run"]);
    assert_eq!(gc_ids(&dry, "deleted"), ["parent"], "{dry}");
    assert_eq!(dry["deleted"][0]["forks"], json!([]), "{dry}");
    let real = json_of(&root, &["gc", "--older-than", "2s", "--keep-forked"]);
    assert_eq!(gc_ids(&real, "deleted"), ["parent"], "{real}");
    assert_eq!(listed(&root, &[]), ["unrelated"]);
    assert!(ok(&root, &["verify", "unrelated"]).starts_with("ok"));
}

#[test]
fn gc_deletes_only_old_sessions_without_a_writer() {
    let (_dir, root) = temp_cli_root();
    // Old: last committed OLD ago; fresh: committed (or forked) after that.
    const OLD: Duration = Duration::from_secs(4);
    chat(&root, "old", 1, "/w");
    chat(&root, "busy", 1, "/w");
    chat(&root, "parent", 2, "/w");
    std::thread::sleep(OLD + Duration::from_millis(300));
    chat(&root, "fresh", 1, "/w");
    ok(
        &root,
        &["fork", "parent", "--after-turn", "t2", "--id", "child"],
    );
    let fresh_since = Instant::now();
    let child_before = json_of(&root, &["history", "child"]);
    let writer = live_writer(&root, "busy");

    // A dry run deletes nothing and says what it would do.
    let dry = json_of(&root, &["gc", "--older-than", "4s", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(gc_ids(&dry, "deleted"), ["old", "parent"]);
    assert_eq!(dry["deleted"][1]["forks"], json!(["child"]));
    assert_eq!(gc_ids(&dry, "kept"), ["busy"]);
    assert!(
        dry["kept"][0]["reason"]
            .as_str()
            .expect("reason")
            .contains(&format!("pid {}", writer.id()))
    );
    let human = ok(&root, &["gc", "--older-than", "4s", "--dry-run"]);
    assert!(human.contains("would delete old"), "{human}");
    assert!(human.contains("kept busy"), "{human}");
    assert_eq!(
        listed(&root, &[]),
        ["busy", "child", "fresh", "old", "parent"]
    );

    // --keep-forked keeps the parent; the live writer's session is kept and reported.
    let kept = json_of(&root, &["gc", "--older-than", "4s", "--keep-forked"]);
    assert_eq!(gc_ids(&kept, "deleted"), ["old"]);
    assert_eq!(gc_ids(&kept, "kept"), ["busy", "parent"]);
    assert_eq!(listed(&root, &[]), ["busy", "child", "fresh", "parent"]);

    // Without it the parent goes; its fork keeps the history it inherited.
    let out = ok(&root, &["gc", "--older-than", "4s"]);
    assert!(out.contains("deleted parent"), "{out}");
    assert!(out.contains("kept busy"), "{out}");
    assert_eq!(listed(&root, &[]), ["busy", "child", "fresh"]);
    assert_eq!(json_of(&root, &["history", "child"]), child_before);
    assert!(ok(&root, &["verify", "child"]).starts_with("ok"));
    stop(writer);

    // Once its writer is gone the old session is collected; the fresh ones never.
    assert_eq!(
        gc_ids(&json_of(&root, &["gc", "--older-than", "4s"]), "deleted"),
        ["busy"]
    );
    assert!(ok(&root, &["gc", "--older-than", "4s"]).contains("nothing to collect"));
    assert_eq!(listed(&root, &[]), ["child", "fresh"]);

    // The library: a dry run reports, deletes nothing.
    assert!(
        fresh_since.elapsed() < OLD,
        "the runs took longer than the age that tells old from fresh"
    );
    let lib = Root::open(&root).expect("root");
    std::thread::sleep(OLD.saturating_sub(fresh_since.elapsed()) + Duration::from_millis(300));
    let report = lib
        .gc(&GcOptions::older_than(OLD).with_dry_run(true))
        .expect("gc");
    assert_eq!(report.deleted.len(), 2);
    assert_eq!(lib.list_ids().expect("ids").len(), 2);

    // An old session that cannot be read: a dry run says it could not check it (it said
    // "could not delete", having tried nothing); a real run could not delete it. Both exit
    // 1 and leave it as it was.
    chat(&root, "garbled", 1, "/w");
    std::fs::write(
        root.join("garbled").join("session.sqlite"),
        b"not a session",
    )
    .expect("damage");
    age(&root, "garbled", 3 * 86_400);
    let out = run(&root, &["gc", "--older-than", "2d", "--dry-run"]);
    assert_eq!(code(&out), 1);
    let err = text(&out.stderr);
    assert!(err.contains("could not check garbled"), "{err}");
    assert!(!err.contains("delete"), "{err}");
    let out = run(&root, &["gc", "--older-than", "2d"]);
    assert_eq!(code(&out), 1);
    let err = text(&out.stderr);
    assert!(err.contains("could not delete garbled"), "{err}");
    assert_eq!(
        std::fs::read(root.join("garbled").join("session.sqlite")).expect("read"),
        b"not a session"
    );

    // Bad durations are usage errors (2).
    fails(&root, &["gc", "--older-than", "7"], 2);
    fails(&root, &["gc", "--older-than", "-1d"], 2);
    fails(&root, &["gc"], 2);
}

#[test]
fn a_rename_racing_a_delete_lands_or_is_not_found_naming_the_session() {
    let (dir, root) = temp_root();
    let export = common::exported_turns(&root, dir.path(), 20);
    let again = session_store::ImportOptions::default().with_session_id(id("p"));
    let (mut renamed, mut gone, mut wrong) = (0, 0, Vec::new());
    for round in 0..60u64 {
        root.import(&export, again.clone()).unwrap();
        // The delete and the rename at once, the rename a little later each round.
        let (rename, deleted) = std::thread::scope(|scope| {
            let rename = scope.spawn(|| {
                std::thread::sleep(Duration::from_micros(50 * (round % 20)));
                root.rename(&id("p"), "new title")
            });
            let delete = scope.spawn(|| {
                loop {
                    // A delete meeting the rename's writer waits for it.
                    match root.delete(&id("p"), &session_store::CancelToken::new()) {
                        Err(session_store::Error::WriterOwned { .. }) => {}
                        other => break other,
                    }
                }
            });
            (rename.join().unwrap(), delete.join().unwrap())
        });
        deleted.unwrap();
        match rename {
            Ok(()) => renamed += 1,
            Err(session_store::Error::SessionNotFound(what)) if what == "p" => gone += 1,
            Err(e) => wrong.push(format!("round {round}: {e}")),
        }
    }
    println!("{renamed} renamed, {gone} not found");
    assert!(wrong.is_empty(), "a rename racing a delete: {wrong:#?}");
}

/// An import keeps its commits' times, so an old export imported a moment ago was as old
/// as its last commit and `gc` deleted it at once (found right after the updated time
/// became the last commit's). A session must also have come into the root at least the
/// age ago (its file's birth time): the original is deleted, the import kept and not
/// reported.
/// `gc` prints each session as it deletes it, also to a file: a run SIGKILLed midway has
/// printed every session it deleted but at most the one being printed (outside testing,
/// session 39: the lines came at the end of the run, so `gc > log` stopped midway had
/// deleted 43 sessions and logged none).
#[test]
fn a_gc_killed_midway_has_printed_what_it_deleted() {
    const SESSIONS: usize = 300;
    let (dir, root) = temp_cli_root();
    let lib = Root::open(&root).expect("root");
    for n in 0..SESSIONS {
        create(&lib, &format!("s{n:03}")).close().expect("close");
    }
    drop(lib);
    std::thread::sleep(Duration::from_millis(1_200));
    let log = dir.path().join("gc.log");
    let mut gc = command(&root, &["gc", "--older-than", "1s"])
        .stdout(std::fs::File::create(&log).expect("log"))
        .stderr(Stdio::null())
        .spawn()
        .expect("gc");
    let since = Instant::now();
    while std::fs::metadata(&log).expect("log").len() == 0 {
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "gc printed nothing"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    gc.kill().expect("kill");
    gc.wait().expect("wait");
    let printed: Vec<String> = std::fs::read_to_string(&log)
        .expect("read log")
        .lines()
        .filter_map(|l| l.strip_prefix("deleted "))
        .filter_map(|l| l.split(' ').next().map(str::to_owned))
        .collect();
    let on_disk: Vec<String> = (0..SESSIONS)
        .map(|n| format!("s{n:03}"))
        .filter(|id| root.join(id).exists())
        .collect();
    let gone = SESSIONS - on_disk.len();
    assert!(
        printed.len() < SESSIONS,
        "the kill came after the whole run: {} lines",
        printed.len()
    );
    for id in &printed {
        assert!(
            !on_disk.contains(id),
            "{id} printed as deleted, still there"
        );
    }
    assert!(
        gone == printed.len() || gone == printed.len() + 1,
        "{gone} deleted, {} printed",
        printed.len()
    );
}

#[test]
fn gc_does_not_delete_an_old_export_imported_a_moment_ago() {
    let (dir, root) = temp_cli_root();
    chat(&root, "old", 1, "/w");
    let export = dir.path().join("old.sqlite");
    ok(&root, &["export", "old", export.to_str().expect("utf-8")]);
    std::thread::sleep(Duration::from_millis(2_200));
    ok(
        &root,
        &["import", export.to_str().expect("utf-8"), "--id", "fresh"],
    );
    let dry = json_of(&root, &["gc", "--older-than", "2s", "--dry-run"]);
    assert_eq!(gc_ids(&dry, "deleted"), ["old"], "{dry}");
    let real = json_of(&root, &["gc", "--older-than", "2s"]);
    assert_eq!(gc_ids(&real, "deleted"), ["old"], "{real}");
    assert!(gc_ids(&real, "kept").is_empty(), "{real}");
    assert_eq!(listed(&root, &[]), ["fresh"]);
}

/// A long-lived `Root` keeps its last read of the root folder for the next first page of
/// `list` while the folder shows no change (it read all 10,000 entries of a root again
/// for every first page, about 4 ms): what is no session of the root, added or removed
/// since, is reported or left out by the very next first page, plain or filtered, also
/// right after the read before it (in the same tick of the folder's clock) and after
/// quiet spells that let the read be kept; the sessions listed follow creates and deletes,
/// and a session folder copied in by hand.
#[test]
fn a_first_page_sees_what_changed_in_the_root_folder_since_the_last() {
    let (_dir, root) = temp_root();
    for name in ["a", "b"] {
        create(&root, name).close().expect("close");
    }
    let skipped =
        |listing: &session_store::Listing| id_texts(listing.skipped.iter().map(|s| &s.session_id));
    let ids =
        |listing: &session_store::Listing| id_texts(listing.entries.iter().map(|e| &e.session_id));
    let pages = |root: &Root| {
        let plain = root.list(None, 10).expect("list");
        let filtered = root
            .list_filtered(&ListFilter::default().with_origin(Origin::New), None, 10)
            .expect("filtered");
        assert_eq!(skipped(&plain), skipped(&filtered));
        assert_eq!(ids(&plain), ids(&filtered));
        (ids(&plain), skipped(&plain))
    };
    let stray = root.path().join("has:colon");
    for quiet in [Duration::ZERO, Duration::from_millis(300)] {
        assert_eq!(pages(&root), (vec!["a".into(), "b".into()], vec![]));
        std::thread::sleep(quiet);
        assert_eq!(pages(&root).1, Vec::<String>::new(), "kept or read again");
        // A folder named as no valid id, holding a session file: reported at once.
        std::fs::create_dir(&stray).expect("mkdir");
        std::fs::copy(
            root.session_dir(&id("a")).join("session.sqlite"),
            stray.join("session.sqlite"),
        )
        .expect("copy");
        assert_eq!(pages(&root).1, vec!["has:colon".to_owned()]);
        std::thread::sleep(quiet);
        assert_eq!(pages(&root).1, vec!["has:colon".to_owned()]);
        std::fs::remove_dir_all(&stray).expect("remove");
        assert_eq!(pages(&root).1, Vec::<String>::new(), "gone at once");
        // A new session and a deleted one are listed as they are.
        create(&root, "c").close().expect("close");
        assert_eq!(pages(&root).0, vec!["a", "b", "c"]);
        std::thread::sleep(quiet);
        root.delete(&id("c"), &session_store::CancelToken::new())
            .expect("delete");
        assert_eq!(pages(&root).0, vec!["a", "b"]);
        // A session folder copied in by hand (from another root) is listed by this
        // process's next first page (it was listed by no page of this process before:
        // the folders were indexed at the catalog's first open only).
        let other = Root::open(_dir.path().join(format!("other-{}", quiet.as_millis())))
            .expect("other root");
        create(&other, "d").close().expect("close");
        common::copy_tree(&other.session_dir(&id("d")), &root.session_dir(&id("d")));
        assert_eq!(pages(&root).0, vec!["a", "b", "d"]);
        std::thread::sleep(quiet);
        assert_eq!(pages(&root).0, vec!["a", "b", "d"]);
        std::fs::remove_dir_all(root.session_dir(&id("d"))).expect("remove");
        assert_eq!(pages(&root).0, vec!["a", "b"]);
    }
}

/// A run decides as its dry run reports (outside testing, session 35): with a fork `c`
/// ordered before its parent `p`, both old, `gc --keep-forked` deleted `c` and then `p`,
/// which no fork held any more, after `--dry-run` had said "kept p: 1 fork(s) inherit from
/// it". Both keep `p` now; without `--keep-forked` both delete the two, and `p`'s report
/// names no fork (`c` is gone before it, nothing is copied into it).
#[test]
fn gc_does_what_its_dry_run_says_when_a_fork_sorts_before_its_parent() {
    let (_dir, root) = temp_cli_root();
    chat(&root, "p", 2, "/w");
    ok(&root, &["fork", "p", "--after-turn", "t2", "--id", "c"]);
    std::thread::sleep(Duration::from_millis(2_200));
    for dry_run in [true, false] {
        let mut args = vec!["gc", "--older-than", "2s", "--keep-forked"];
        if dry_run {
            args.push("--dry-run");
        }
        let report = json_of(&root, &args);
        assert_eq!(gc_ids(&report, "deleted"), ["c"], "{report}");
        assert_eq!(gc_ids(&report, "kept"), ["p"], "{report}");
    }
    assert_eq!(listed(&root, &[]), ["p"]);
    ok(&root, &["fork", "p", "--after-turn", "t2", "--id", "c"]);
    std::thread::sleep(Duration::from_millis(2_200));
    for dry_run in [true, false] {
        let mut args = vec!["gc", "--older-than", "2s"];
        if dry_run {
            args.push("--dry-run");
        }
        let report = json_of(&root, &args);
        assert_eq!(gc_ids(&report, "deleted"), ["c", "p"], "{report}");
        assert_eq!(report["deleted"][1]["forks"], json!([]), "{report}");
    }
    assert!(listed(&root, &[]).is_empty());
}

/// An export whose header holds what `create` refuses (an empty cwd, one holding NUL, one
/// of 10,001 bytes) or a creation time of `i64::MAX` was imported, exit 0; the last was
/// then on no page of `list --sort created` (outside testing D7, session 37). Refused
/// naming the header, nothing published; `--cwd` gives such an export a cwd of its own.
/// `verify` of such a file notes what import refuses.
#[test]
fn import_refuses_a_header_that_create_would_refuse() {
    let (dir, root) = temp_cli_root();
    chat(&root, "src", 1, "/w");
    let clean = dir.path().join("clean.sqlite");
    ok(&root, &["export", "src", clean.to_str().expect("utf-8")]);
    let long = "/".repeat(10_001);
    for (n, (column, value, said)) in [
        ("cwd", "''", "cwd is empty"),
        ("cwd", "'/a' || char(0)", "NUL"),
        ("cwd", &format!("'{long}'"), "at most 4096 bytes"),
        ("created_at", "9223372036854775807", "creation time"),
    ]
    .into_iter()
    .enumerate()
    {
        let file = dir.path().join(format!("bad{n}.sqlite"));
        std::fs::copy(&clean, &file).expect("copy");
        let conn = rusqlite::Connection::open(&file).expect("open");
        conn.execute_batch(&format!("UPDATE header SET {column} = {value}"))
            .expect("edit");
        drop(conn);
        let id = format!("imp{n}");
        let path = file.to_str().expect("utf-8");
        let err = fails(&root, &["import", path, "--id", &id], 6);
        assert!(
            err.contains("the file's header") && err.contains(said),
            "{err}"
        );
        assert!(!root.join(&id).exists(), "{id} was published");
        // `verify` of the file calls it sound (a header is read as it is) and says that
        // import refuses it (it said nothing: outside testing H5, session 41).
        let verified = json_of(&root, &["verify", path]);
        let notes = verified["notes"].to_string();
        assert!(
            notes.contains(said) && notes.contains("import"),
            "{verified}"
        );
        if column == "cwd" {
            ok(&root, &["import", path, "--id", &id, "--cwd", "/elsewhere"]);
        }
    }
    // An absolute cwd spelled otherwise than `--cwd` spells it is imported as `--cwd`
    // spells it: kept as the file had it, `/srv//api/./` was found by no `--cwd` filter
    // (outside testing C4).
    let file = dir.path().join("spelled.sqlite");
    std::fs::copy(&clean, &file).expect("copy");
    let conn = rusqlite::Connection::open(&file).expect("open");
    conn.execute_batch("UPDATE header SET cwd = '/srv//api/./'")
        .expect("edit");
    drop(conn);
    ok(
        &root,
        &["import", file.to_str().expect("utf-8"), "--id", "spelled"],
    );
    let listed = json_of(&root, &["list", "--cwd", "/srv/api"]);
    assert_eq!(
        listed["sessions"][0]["session_ref"]["session_id"], "spelled",
        "{listed}"
    );
    assert_eq!(
        json_of(&root, &["show", "spelled"])["header"]["cwd"],
        "/srv/api"
    );
}

/// `gc` names a session that another delete (another `gc`'s, or `delete`'s) is deleting
/// as such, as `append` names it: it said "a live writer holds it" of a stopped `gc`
/// (outside testing W5). The delete is held inside the fork's file by another connection.
#[test]
fn gc_names_a_delete_in_progress_as_a_delete() {
    let (_dir, root) = temp_root();
    let p = create(&root, "p");
    p.append(turn("op-1", "t1", "m1")).expect("append");
    p.close().expect("close");
    root.fork(
        &id("p"),
        session_store::ForkPoint::AfterTurn("t1".into()),
        Some(id("c")),
    )
    .expect("fork");
    // Older than the age given, as sessions and as arrivals in their root.
    std::thread::sleep(Duration::from_millis(1_100));
    let fork_file = root.session_dir(&id("c")).join("session.sqlite");
    let other = rusqlite::Connection::open(&fork_file).expect("sqlite");
    other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let deleting = std::thread::spawn({
        let root = root.clone();
        move || root.delete(&id("p"), &session_store::CancelToken::new())
    });
    let deadline = Instant::now() + Duration::from_secs(4);
    while root
        .writer_owner(&id("p"))
        .ok()
        .flatten()
        .is_none_or(|o| o.holding_for.is_none())
    {
        assert!(Instant::now() < deadline, "the delete never took the lock");
        std::thread::sleep(Duration::from_millis(10));
    }
    let options = session_store::GcOptions::older_than(Duration::from_secs(1)).with_dry_run(true);
    let report = root.gc(&options).expect("gc");
    let kept = report
        .kept
        .iter()
        .find(|k| k.session_id == id("p"))
        .unwrap_or_else(|| panic!("p not kept: {report:?}"));
    assert!(
        kept.reason
            .starts_with("a delete in progress holds it (pid "),
        "{}",
        kept.reason
    );
    drop(other);
    let _ = deleting.join().expect("delete thread");
}

/// A process holding a write on the catalog (a `rebuild-catalog` stopped inside its
/// transaction) costs a writer's best-effort catalog writes 1 s each, not the 5 s busy
/// timeout: `rename` and `create` took 5 s and 10 s, each without a word (outside testing
/// W8). What they could not record is computed again when listed.
#[test]
fn a_held_catalog_delays_writers_briefly() {
    let (_dir, root) = temp_root();
    let s = create(&root, "s");
    s.append(turn("op-1", "t1", "m1")).expect("append");
    s.close().expect("close");
    root.list(None, 10).expect("list");
    let catalog = root.path().join(".catalog").join("catalog.sqlite");
    let other = rusqlite::Connection::open(&catalog).expect("sqlite");
    other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let started = Instant::now();
    root.rename(&id("s"), "Renamed while held").expect("rename");
    let made = create(&root, "made");
    made.close().expect("close");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    // A command's first use of the catalog (a process of its own) adds the root's folders
    // to it: that write waited out the busy timeout too.
    let started = Instant::now();
    ok(root.path(), &["rename", "s", "Renamed by the CLI"]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    drop(other);
    let titles: Vec<(String, String)> = root
        .list(None, 10)
        .expect("list")
        .entries
        .into_iter()
        .map(|e| (e.session_id.to_string(), e.title))
        .collect();
    assert_eq!(
        titles,
        [
            ("made".to_owned(), String::new()),
            ("s".to_owned(), "Renamed by the CLI".to_owned())
        ]
    );
}
