//! Reliability of a root as a whole (issue 11): one bad session, a damaged catalog or a
//! session id that looks like a catalog file never takes the root down; concurrent
//! deletes, list while deleting and concurrent `append --create` are races without
//! losers; a root the user can only read serves every read-only command; schema objects
//! we did not create (trigger, view, index, table) and a history index that differs from
//! the log are refused. Everything runs through the CLI binary as real processes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_session-store");

/// A batch of one completed turn with one user message (JSON Lines).
fn turn_line(n: usize) -> String {
    format!(
        r#"{{"operation_id":"op-{n}","turn_id":"t{n}","events":[{{"kind":"turn/start"}},{{"kind":"message/complete","payload":{{"message":{{"id":"m{n}","role":"user","content":"hello {n}"}}}}}},{{"kind":"turn/end","payload":{{"status":"completed"}}}}]}}"#
    ) + "\n"
}

/// A root folder in a temp dir, driven through the CLI.
struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        Env { _dir: dir, root }
    }

    fn work(&self) -> &Path {
        self._dir.path()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--root").arg(&self.root).args(args);
        cmd
    }

    /// Runs with `stdin` as input (through a file, so the child reads it at its pace).
    fn run_with(&self, args: &[&str], stdin: &str) -> Output {
        let input = self.work().join(format!("stdin-{}", fastrand::u64(..)));
        std::fs::write(&input, stdin).expect("write stdin");
        let out = self
            .command(args)
            .stdin(std::fs::File::open(&input).expect("open stdin"))
            .output()
            .expect("run");
        let _ = std::fs::remove_file(&input);
        out
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, "")
    }

    /// Runs a command that must exit 0; returns (stdout, stderr).
    fn ok(&self, args: &[&str]) -> (String, String) {
        let out = self.run(args);
        let (stdout, stderr) = texts(&out);
        assert!(
            out.status.success(),
            "{args:?} failed ({:?}): {stderr}",
            out.status
        );
        (stdout, stderr)
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        serde_json::from_str(&self.ok(&full).0).expect("json output")
    }

    /// Runs a command that must exit with `code`; returns stderr.
    fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.run(args);
        let (_, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        stderr
    }

    /// A session with `turns` completed turns.
    fn session(&self, id: &str, turns: usize) {
        let lines: String = (1..=turns).map(turn_line).collect();
        let out = self.run_with(&["append", id, "--create"], &lines);
        assert!(out.status.success(), "append {id}: {}", texts(&out).1);
    }

    fn file(&self, id: &str) -> PathBuf {
        self.root.join(id).join("session.sqlite")
    }

    fn sql(&self, id: &str, sql: &str) {
        let conn = rusqlite::Connection::open(self.file(id)).expect("open");
        conn.execute_batch(sql).expect("sql");
    }

    /// The ids `list --json` shows and the ids it reports as skipped.
    fn listed(&self) -> (Vec<String>, Vec<String>) {
        let page = self.json(&["list", "--limit", "100"]);
        let ids = |key: &str, field: &dyn Fn(&Value) -> &Value| -> Vec<String> {
            page[key]
                .as_array()
                .expect(key)
                .iter()
                .map(|s| field(s).as_str().expect("id").to_owned())
                .collect()
        };
        (
            ids("sessions", &|s| &s["session_ref"]["session_id"]),
            ids("skipped", &|s| &s["session_id"]),
        )
    }
}

fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// One foreign and one newer-schema session folder: `list` and `rebuild-catalog` list the
/// sound sessions and name the bad ones (stderr, `--json`, library).
#[test]
fn one_bad_session_does_not_take_the_root_down() {
    let env = Env::new();
    env.session("a", 1);
    env.session("c", 2);
    env.session("y", 1);
    env.ok(&["list"]);
    // A foreign SQLite file, and a session file from a newer build.
    std::fs::create_dir(env.root.join("x")).expect("mkdir");
    rusqlite::Connection::open(env.file("x"))
        .and_then(|c| c.execute_batch("create table t(x)"))
        .expect("foreign file");
    env.sql("y", "PRAGMA user_version = 99");

    // A root whose only session cannot be read is not a root with no sessions.
    let alone = Env::new();
    alone.session("z", 1);
    alone.sql("z", "PRAGMA user_version = 99");
    let (stdout, stderr) = alone.ok(&["list"]);
    assert!(stderr.contains("skipped session z"), "{stderr}");
    assert!(stdout.starts_with("no readable sessions in "), "{stdout}");
    assert!(
        stdout.contains("(1 skipped: they cannot be read"),
        "{stdout}"
    );

    let (stdout, stderr) = env.ok(&["list"]);
    assert!(stdout.contains("a ") && stdout.contains("c "), "{stdout}");
    assert!(stderr.contains("skipped session x"), "{stderr}");
    assert!(stderr.contains("skipped session y"), "{stderr}");
    assert_eq!(
        env.listed(),
        (vec!["a".into(), "c".into()], vec!["x".into(), "y".into()])
    );
    // Paged: the bad sessions are reported once, with the page that covers them.
    let first = env.json(&["list", "--limit", "1"]);
    assert_eq!(first["skipped"].as_array().expect("skipped").len(), 0);
    let second = env.json(&["list", "--limit", "1", "--cursor", "a"]);
    assert_eq!(second["sessions"][0]["session_ref"]["session_id"], "c");
    assert_eq!(second["skipped"][0]["session_id"], "x");

    let rebuilt = env.json(&["rebuild-catalog"]);
    assert_eq!(rebuilt["sessions"], 2);
    let skipped: Vec<&str> = rebuilt["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .map(|s| s["session_id"].as_str().expect("id"))
        .collect();
    assert_eq!(skipped, ["x", "y"]);
    assert!(
        rebuilt["skipped"][1]["error"]
            .as_str()
            .expect("error")
            .contains("newer"),
        "{rebuilt}"
    );
    let (_, stderr) = env.ok(&["rebuild-catalog"]);
    assert!(stderr.contains("skipped session x"), "{stderr}");

    // The library: a result type with the skipped ids and their errors.
    let root = session_store::Root::open(&env.root).expect("root");
    let listing = root.list(None, 10).expect("list");
    let ids: Vec<&str> = listing
        .entries
        .iter()
        .map(|e| e.session_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "c"]);
    assert!(matches!(
        listing.skipped[1].error.as_ref(),
        session_store::Error::UnsupportedVersion { .. }
    ));
    assert_eq!(root.rebuild_catalog().expect("rebuild").skipped.len(), 2);

    // Once repaired, it is listed again.
    std::fs::remove_dir_all(env.root.join("x")).expect("rm");
    env.sql(
        "y",
        &format!(
            "PRAGMA user_version = {}",
            session_store::format::SCHEMA_VERSION
        ),
    );
    assert_eq!(
        env.listed(),
        (vec!["a".into(), "c".into(), "y".into()], vec![])
    );
}

/// A session folder whose `session.sqlite` is a symlink (to a sound session's file) or a
/// folder: `show` refuses it by id, so `list` and `rebuild-catalog` report it as skipped
/// (as promise 9 says) instead of passing over it as if it were not there ("no sessions").
#[test]
fn a_session_file_that_is_a_symlink_or_a_folder_is_reported_by_list() {
    let env = Env::new();
    env.session("a", 1);
    std::fs::create_dir(env.root.join("link")).expect("mkdir");
    std::os::unix::fs::symlink(env.file("a"), env.file("link")).expect("symlink");
    std::fs::create_dir_all(env.file("folder")).expect("mkdir");
    for id in ["link", "folder"] {
        env.fails(&["show", id], 6);
    }
    assert_eq!(
        env.listed(),
        (vec!["a".into()], vec!["folder".into(), "link".into()])
    );
    let (_, stderr) = env.ok(&["rebuild-catalog"]);
    assert!(stderr.contains("skipped session link"), "{stderr}");
    assert!(stderr.contains("skipped session folder"), "{stderr}");
    // Alone in a root, they are not "no sessions".
    let alone = Env::new();
    std::fs::create_dir_all(alone.root.join("link")).expect("mkdir");
    std::os::unix::fs::symlink(env.file("a"), alone.file("link")).expect("symlink");
    let (stdout, stderr) = alone.ok(&["list"]);
    assert!(stdout.starts_with("no readable sessions in "), "{stdout}");
    assert!(stderr.contains("is a symlink"), "{stderr}");
}

/// Session ids named like the catalog's files (also from an import's header) never break
/// `list`; a root whose catalog is at its old place (`<root>/catalog.sqlite`) is served.
#[test]
fn catalog_files_are_out_of_the_id_namespace() {
    let env = Env::new();
    env.session("a", 1);
    env.ok(&["list"]);
    for id in ["catalog.sqlite-wal", "catalog.sqlite-shm", "catalog.sqlite"] {
        env.ok(&["create", id]);
    }
    let want: Vec<String> = [
        "a",
        "catalog.sqlite",
        "catalog.sqlite-shm",
        "catalog.sqlite-wal",
    ]
    .map(String::from)
    .to_vec();
    for _ in 0..2 {
        assert_eq!(env.listed(), (want.clone(), vec![]));
    }
    env.ok(&["rebuild-catalog"]);
    assert_eq!(env.listed(), (want.clone(), vec![]));

    // An import whose header names the catalog's WAL.
    let exported = env.work().join("wal.sqlite");
    env.ok(&[
        "export",
        "catalog.sqlite-wal",
        exported.to_str().expect("utf-8"),
    ]);
    env.ok(&["delete", "catalog.sqlite-wal"]);
    let (id, _) = env.ok(&["import", exported.to_str().expect("utf-8")]);
    assert_eq!(id.trim(), "catalog.sqlite-wal");
    assert_eq!(env.listed(), (want, vec![]));

    // An older root: the catalog (with its -wal) at the root. It is replaced by one in
    // `.catalog/`; the old files go.
    let old = Env::new();
    old.session("s", 1);
    let conn = rusqlite::Connection::open(old.root.join("catalog.sqlite")).expect("open");
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE sessions (session_id TEXT PRIMARY KEY, \
         stamp TEXT NOT NULL, entry TEXT NOT NULL); INSERT INTO sessions VALUES ('s','','')",
    )
    .expect("old catalog");
    std::fs::remove_dir_all(old.root.join(".catalog")).expect("rm new catalog");
    assert!(old.root.join("catalog.sqlite-wal").exists());
    assert_eq!(old.listed(), (vec!["s".into()], vec![]));
    drop(conn);
    assert!(old.root.join(".catalog/catalog.sqlite").is_file());
    assert!(!old.root.join("catalog.sqlite").exists());
}

/// A catalog of random bytes, another application's SQLite file or one of ours holding a
/// trigger we did not make is replaced, by `list` and by `rebuild-catalog`.
#[test]
fn damaged_catalog_is_replaced() {
    let env = Env::new();
    for id in ["a", "b", "c"] {
        env.session(id, 1);
    }
    let want = (vec!["a".to_owned(), "b".into(), "c".into()], vec![]);
    assert_eq!(env.listed(), want);
    let catalog = env.root.join(".catalog/catalog.sqlite");
    let clear = || {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", catalog.display()));
        }
    };
    let noise: Vec<u8> = (0..20_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let foreign = |sql: &str| {
        clear();
        rusqlite::Connection::open(&catalog)
            .and_then(|c| c.execute_batch(sql))
            .expect("foreign catalog");
    };
    for (what, command) in [("list", "list"), ("rebuild", "rebuild-catalog")] {
        clear();
        std::fs::write(&catalog, &noise).expect("noise");
        env.ok(&[command]);
        assert_eq!(env.listed(), want, "random bytes, {what}");

        foreign("CREATE TABLE sessions (a, b); INSERT INTO sessions VALUES (1, 2)");
        env.ok(&[command]);
        assert_eq!(env.listed(), want, "another app's file, {what}");

        foreign("PRAGMA application_id = 7; CREATE TABLE t (x)");
        env.ok(&[command]);
        assert_eq!(env.listed(), want, "another app's id, {what}");

        // A trigger planted in a catalog of ours, deleting every row written: `list` said
        // "no sessions" after a rebuild, and went on saying so.
        clear();
        env.ok(&["list"]);
        rusqlite::Connection::open(&catalog)
            .and_then(|c| {
                c.execute_batch(
                    "CREATE TRIGGER hide AFTER INSERT ON sessions BEGIN DELETE FROM sessions; END",
                )
            })
            .expect("planted trigger");
        env.ok(&[command]);
        assert_eq!(env.listed(), want, "a planted trigger, {what}");
        assert_eq!(
            env.listed(),
            want,
            "a planted trigger, {what}, listed again"
        );
    }
    assert_eq!(env.json(&["rebuild-catalog"])["sessions"], 3);
}

/// `delete P` and `delete B` at once, B a fork of P: both succeed, every round.
#[test]
fn concurrent_deletes_of_a_parent_and_its_fork() {
    let template = Env::new();
    template.session("P", 2);
    template.ok(&["fork", "P", "--after-turn", "t1", "--id", "B"]);
    template.ok(&["fork", "B", "--after-turn", "t1", "--id", "C"]);
    let rounds = common_rounds("RELIABILITY_ROOT_DELETE_ROUNDS", 30);
    let started = Instant::now();
    for round in 0..rounds {
        let env = Env::new();
        copy_dir(&template.root, &env.root);
        let spawn = |id: &str| {
            env.command(&["delete", id])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        };
        // Alternate who starts first.
        let (p, b) = if round % 2 == 0 {
            let p = spawn("P");
            (p, spawn("B"))
        } else {
            let b = spawn("B");
            (spawn("P"), b)
        };
        for (name, child) in [("P", p), ("B", b)] {
            let out = child.wait_with_output().expect("wait");
            assert!(
                out.status.success(),
                "round {round}: delete {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // C, a fork of B, keeps every inherited event.
        assert_eq!(env.listed(), (vec!["C".into()], vec![]));
        env.ok(&["verify", "C"]);
        let events = env.json(&["events", "C"]);
        assert_eq!(events["durable_sequence"], 3, "round {round}");
    }
    eprintln!(
        "concurrent deletes: {rounds} rounds in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

fn common_rounds(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// `list` and `rebuild-catalog` while other sessions are deleted (forks among them, so
/// deletes materialise): every call exits 0 quickly and never reports a deleted session
/// as skipped.
#[test]
fn list_and_rebuild_while_deleting() {
    let env = Env::new();
    let count = 12;
    for i in 0..count {
        env.session(&format!("s{i:02}"), 2);
    }
    for i in 0..count / 2 {
        env.ok(&[
            "fork",
            &format!("s{i:02}"),
            "--after-turn",
            "t1",
            "--id",
            &format!("f{i:02}"),
        ]);
    }
    env.ok(&["list"]);
    let deleter: Child = {
        let script = (0..count)
            .map(|i| format!("{BIN:?} --root {:?} delete s{i:02} || exit 1", env.root))
            .collect::<Vec<_>>()
            .join("\n");
        Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn deleter")
    };
    let mut calls = 0;
    let mut slowest = Duration::ZERO;
    let mut deleter = Some(deleter);
    while let Some(mut child) = deleter.take() {
        for args in [
            &["--json", "list", "--limit", "100"][..],
            &["--json", "rebuild-catalog"],
        ] {
            let t = Instant::now();
            let out = env.run(args);
            slowest = slowest.max(t.elapsed());
            if t.elapsed() > Duration::from_secs(1) {
                eprintln!("slow: {args:?} {:?}: {}", t.elapsed(), texts(&out).1);
            }
            calls += 1;
            let (stdout, stderr) = texts(&out);
            assert!(out.status.success(), "{args:?}: {stderr}");
            let v: Value = serde_json::from_str(&stdout).expect("json");
            assert_eq!(v["skipped"], serde_json::json!([]), "{args:?}: {v}");
        }
        match child.try_wait().expect("try_wait") {
            Some(status) => {
                let out = child.wait_with_output().expect("wait");
                assert!(status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            }
            None => deleter = Some(child),
        }
    }
    let forks: Vec<String> = (0..count / 2).map(|i| format!("f{i:02}")).collect();
    assert_eq!(env.listed(), (forks, vec![]));
    assert!(slowest < Duration::from_secs(3), "slowest call {slowest:?}");
    eprintln!("list/rebuild while deleting: {calls} calls, slowest {slowest:?}");
}

/// Three `append X --create` at once for a new session: none loses its batch to "already
/// exists"; each appends (exit 0) or is refused naming the writer (exit 5).
#[test]
fn concurrent_append_create() {
    let rounds = common_rounds("RELIABILITY_ROOT_CREATE_ROUNDS", 10);
    let mut refused = 0;
    for round in 0..rounds {
        let env = Env::new();
        let children: Vec<(usize, Child)> = (1..=3)
            .map(|n| {
                let mut child = env
                    .command(&["--json", "append", "X", "--create"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn");
                use std::io::Write;
                let mut stdin = child.stdin.take().expect("stdin");
                stdin.write_all(turn_line(n).as_bytes()).expect("stdin");
                drop(stdin);
                (n, child)
            })
            .collect();
        let mut appended = Vec::new();
        for (n, child) in children {
            let out = child.wait_with_output().expect("wait");
            let (stdout, stderr) = texts(&out);
            match out.status.code() {
                Some(0) => {
                    assert!(stdout.contains(&format!("op-{n}")), "{stdout}");
                    appended.push(format!("op-{n}"));
                }
                Some(5) => {
                    assert!(stderr.contains("owned by another writer: pid"), "{stderr}");
                    refused += 1;
                }
                other => panic!("round {round}: append {n} exited {other:?}: {stderr}"),
            }
        }
        assert!(!appended.is_empty(), "round {round}");
        let events = env.json(&["events", "X"]);
        let mut ops: Vec<String> = events["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["kind"] == "turn/start")
            .map(|e| e["operation_id"].as_str().expect("op").to_owned())
            .collect();
        ops.sort();
        appended.sort();
        assert_eq!(ops, appended, "round {round}");
    }
    eprintln!("append --create x3: {rounds} rounds, {refused} refused with status 5");

    // The same class: three `migrate-legacy` of one source at once (a deterministic id).
    for round in 0..rounds.min(5) {
        let env = Env::new();
        let legacy = env.work().join("legacy.jsonl");
        let lines: String = (1..=4)
            .map(|i| format!("{{\"id\":\"m{i}\",\"role\":\"user\",\"content\":\"hi {i}\"}}\n"))
            .collect();
        std::fs::write(&legacy, lines).expect("legacy");
        let children: Vec<Child> = (0..3)
            .map(|_| {
                env.command(&["--json", "migrate-legacy", legacy.to_str().expect("utf-8")])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        let mut target = None;
        for child in children {
            let out = child.wait_with_output().expect("wait");
            let (stdout, stderr) = texts(&out);
            match out.status.code() {
                Some(0) => {
                    let record: Value = serde_json::from_str(&stdout).expect("json");
                    target = Some(record["target_id"].as_str().expect("id").to_owned());
                }
                Some(5) => assert!(stderr.contains("owned by another writer: pid"), "{stderr}"),
                other => panic!("round {round}: migrate-legacy exited {other:?}: {stderr}"),
            }
        }
        // All three may have been refused in turn (each open met another's writer): the
        // session is there and whole all the same.
        let target = target.unwrap_or_else(|| {
            let listed = env.listed().0;
            assert_eq!(listed.len(), 1, "round {round}: {listed:?}");
            listed[0].clone()
        });
        let history = env.json(&["history", &target]);
        assert_eq!(history["messages"].as_array().expect("messages").len(), 4);
    }
}

/// The first of `setpriv` / `runuser` found, as a command prefix that runs as `nobody`.
fn as_nobody() -> Option<Vec<&'static str>> {
    let found = |tool: &str| {
        ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .any(|d| Path::new(d).join(tool).is_file())
    };
    if found("setpriv") {
        Some(vec![
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
    } else if found("runuser") {
        Some(vec!["runuser", "-u", "nobody", "--"])
    } else {
        None
    }
}

/// [`as_nobody`]'s prefix, checked to switch user here; `None` (with `test`'s skip message
/// printed) when it cannot.
fn nobody_or_skip(test: &str) -> Option<Vec<&'static str>> {
    let Some(prefix) = as_nobody() else {
        eprintln!("{test}: skipped (neither setpriv nor runuser found)");
        return None;
    };
    let switched = Command::new(prefix[0])
        .args(&prefix[1..])
        .arg("true")
        .status();
    if !switched.is_ok_and(|s| s.success()) {
        eprintln!(
            "{test}: skipped ({} cannot switch to nobody here)",
            prefix[0]
        );
        return None;
    }
    Some(prefix)
}

/// Runs the binary on `root` with `args` as `nobody` (`prefix` from [`nobody_or_skip`]).
fn run_as(prefix: &[&str], root: &Path, args: &[&str]) -> Output {
    Command::new(prefix[0])
        .args(&prefix[1..])
        .arg(BIN)
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .expect("spawn")
}

/// `nobody`'s command prefix ([`nobody_or_skip`]) and a root holding a session `a` of
/// `turns` turns that `nobody` may reach, read and write; `None` when the test is skipped.
fn nobody_with_a_session(test: &str, turns: usize) -> Option<(Vec<&'static str>, Env)> {
    let prefix = nobody_or_skip(test)?;
    let env = Env::new();
    env.session("a", turns);
    open_to_nobody(&env);
    Some((prefix, env))
}

/// Lets `nobody` reach `env`'s root (its work folder 0755) and read and write everything in
/// it.
fn open_to_nobody(env: &Env) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.work(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    open_up(&env.root);
}

/// Lets everyone read and write `path` and, for a folder, everything in it.
fn open_up(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.is_dir();
    let mode = if dir { 0o777 } else { 0o666 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    if dir {
        for entry in std::fs::read_dir(path).expect("read dir") {
            open_up(&entry.expect("entry").path());
        }
    }
}

/// Makes a session `a` of 2 turns whose folders `nobody` may write, runs `lock` (which
/// takes the write of one of its files away from them and returns that file), then `append`,
/// `rename` and each of `more` as `nobody`: each must fail with exit 1 naming that file and
/// the system's reason, the session file unchanged. `None` when the test is skipped.
fn writers_name_the_file_they_may_not_write(
    test: &str,
    lock: impl FnOnce(&Path) -> PathBuf,
    more: &[&[&str]],
) -> Option<(Env, Vec<&'static str>)> {
    let (prefix, env) = nobody_with_a_session(test, 2)?;
    let file = env.file("a");
    let locked = lock(&file);
    let before = std::fs::read(&file).expect("read");
    let batch = env.work().join("batch.jsonl");
    std::fs::write(&batch, turn_line(3)).expect("write");
    let batch = batch.to_str().expect("utf-8");
    let named = format!("open {} for writing: Permission denied", locked.display());
    let writers: [&[&str]; 2] = [
        &["append", "a", "--file", batch],
        &["rename", "a", "new title"],
    ];
    for args in writers.iter().chain(more) {
        let out = run_as(&prefix, &env.root, args);
        let (_, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&named), "{args:?}: {stderr}");
    }
    assert_eq!(std::fs::read(&file).expect("read"), before);
    Some((env, prefix))
}

/// A session file the user may not write (mode 0444, in folders they may write): `append`,
/// `rename` and a `fork` of it (which records the fork in it) refuse it naming the file
/// and the system's reason, exit 1, the file unchanged (SQLite opened it read-only and the
/// first write said "sqlite: attempt to write a readonly database", naming nothing).
/// Reads still work.
#[test]
fn a_session_file_the_user_may_not_write_is_named_by_every_writer() {
    use std::os::unix::fs::PermissionsExt;
    let Some((env, prefix)) = writers_name_the_file_they_may_not_write(
        "a_session_file_the_user_may_not_write",
        |file| {
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o444)).expect("chmod");
            file.to_path_buf()
        },
        &[&["fork", "a", "--after-turn", "t1", "--id", "f"]],
    ) else {
        return;
    };
    assert!(!env.root.join("f").exists());
    assert!(
        run_as(&prefix, &env.root, &["verify", "a"])
            .status
            .success()
    );
}

/// A session file the user may write, beside a `-wal` another user's reader left that the
/// user may not: `append` and `rename` refuse naming that file and the system's reason, exit
/// 1 (the first write said "sqlite: attempt to write a readonly database", naming nothing;
/// outside testing, users and permissions), the session file unchanged.
#[test]
fn a_side_file_the_user_may_not_write_is_named_by_every_writer() {
    use std::os::unix::fs::PermissionsExt;
    writers_name_the_file_they_may_not_write(
        "a_side_file_the_user_may_not_write",
        |file| {
            let wal = PathBuf::from(format!("{}-wal", file.display()));
            std::fs::write(&wal, b"").expect("a foreign -wal");
            std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o644)).expect("chmod");
            wal
        },
        &[],
    );
}

/// A search index the user may not write (another user made it, umask 022): the user's
/// searches do not use it as it is (it could not take their new messages, and they answered
/// "no matches" for them, without a word) but a private index of the root, as on a root
/// they may only read; and their writer, which could not write it either, keeps its owner
/// record in `writer.lock`, so that once the index can be written the next search catches
/// the session up (the writer had indexed into a private index of its own and cleared the
/// record: no search found its message until a rebuild). Outside testing, users and
/// permissions, and its re-test.
#[test]
fn a_search_index_the_user_may_not_write_is_neither_trusted_nor_forgotten() {
    use std::os::unix::fs::PermissionsExt;
    let Some(prefix) = nobody_or_skip("a_search_index_the_user_may_not_write") else {
        return;
    };
    let env = Env::new();
    env.session("a", 1);
    env.ok(&["search", "hello"]);
    open_to_nobody(&env);
    let index = env.root.join(".catalog/search.sqlite");
    let mode = |m: u32| {
        std::fs::set_permissions(&index, std::fs::Permissions::from_mode(m)).expect("chmod")
    };
    mode(0o644);
    let batch = env.work().join("zebra.jsonl");
    std::fs::write(&batch, turn_line(2).replace("hello 2", "zebra crossing")).expect("write");
    let appended = run_as(
        &prefix,
        &env.root,
        &["append", "a", "--file", batch.to_str().expect("utf-8")],
    );
    assert!(appended.status.success(), "{}", texts(&appended).1);
    let record = std::fs::metadata(env.root.join("a/writer.lock")).expect("lock");
    assert!(record.len() > 0, "the owner record was cleared");
    let search = || {
        let found = run_as(&prefix, &env.root, &["search", "zebra"]);
        let (stdout, stderr) = texts(&found);
        assert!(found.status.success(), "{stderr}");
        assert!(stdout.starts_with("a #2 user"), "{stdout}{stderr}");
    };
    search();
    mode(0o666);
    search();
}

/// Files the store makes take the umask as other Unix programs' do (0666 less it): SQLite
/// made its databases 0644 whatever the umask, so the members of a group sharing a root
/// (umask 002) could not write each other's sessions, catalog or search index, and one
/// member's reader left side files that locked the others out (outside testing, users and
/// permissions). Under 022 and 077 nothing is more open than before.
#[test]
fn database_files_take_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    for (umask, file_mode) in [("002", 0o664), ("022", 0o644), ("077", 0o600)] {
        let env = Env::new();
        let run = |args: &str| {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("umask {umask}; exec \"$0\" --root \"$1\" {args}"))
                .arg(BIN)
                .arg(&env.root)
                .output()
                .expect("sh");
            assert!(out.status.success(), "{umask} {args}: {}", texts(&out).1);
        };
        run("create a");
        run("search anything");
        run("rebuild-catalog");
        let mode = |path: &Path| {
            std::fs::metadata(path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .permissions()
                .mode()
                & 0o777
        };
        for file in [
            env.file("a"),
            env.root.join(".catalog/catalog.sqlite"),
            env.root.join(".catalog/search.sqlite"),
        ] {
            assert_eq!(mode(&file), file_mode, "umask {umask}: {}", file.display());
        }
    }
}

/// Run as root in a user's root, the store gives what it makes there for the root's own
/// use (`.catalog` and its catalog and search index, `.trash`, `.staging`) to the owner of
/// the root folder: root's first search left a root-owned index that the user's searches
/// could no longer update (they answered "no matches" for what was new, without a word),
/// its first delete a root-owned `.trash` in which every later delete of the user failed
/// (outside testing, users and permissions). The CLI now acts as the owner there
/// (`cli::owner`): what it makes is the owner's, and it may write nothing outside the root
/// that the owner may not (a user who swapped a folder of the root for a symlink while
/// root's command ran had it create and give away files in folders only root may write:
/// outside testing, security), with the group permissions the root folder has (outside
/// testing F5). Skipped unless run as root.
#[test]
fn root_acts_as_the_owner_of_a_users_root() {
    use std::os::unix::fs::MetadataExt;
    if !Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    {
        eprintln!("root_gives_what_it_makes: skipped (not run as root)");
        return;
    }
    let env = Env::new();
    env.session("a", 1);
    env.session("b", 1);
    std::fs::remove_dir_all(env.root.join(".catalog")).expect("rm catalog");
    let _ = std::fs::remove_dir_all(env.root.join(".staging"));
    let _ = std::fs::remove_dir_all(env.root.join(".trash"));
    let chown = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&env.root)
        .status()
        .expect("chown");
    assert!(chown.success());
    // A root the group shares (setgid, group-writable).
    std::fs::set_permissions(
        &env.root,
        std::os::unix::fs::PermissionsExt::from_mode(0o2775),
    )
    .expect("chmod");
    for args in [
        &["search", "anything"][..],
        &["delete", "b"],
        &["create", "c"],
    ] {
        // Under root's usual umask.
        let out = Command::new("bash")
            .args(["-c", "umask 022 && exec \"$@\"", "bash", BIN, "--root"])
            .arg(&env.root)
            .args(args)
            .output()
            .expect("run");
        assert!(out.status.success(), "{args:?}: {}", texts(&out).1);
    }
    for made in [
        ".catalog",
        ".catalog/catalog.sqlite",
        ".catalog/search.sqlite",
        ".trash",
        ".staging",
        "c",
        "c/session.sqlite",
    ] {
        let meta = std::fs::metadata(env.root.join(made)).expect(made);
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "{made}");
        // The group may write what root made there, as the root folder lets it: root's
        // umask made it 0644 and a member's append or list then failed (outside testing F5).
        assert_eq!(meta.mode() & 0o060, 0o060, "{made}: {:o}", meta.mode());
    }
    let root_only = env.work().join("root-only");
    std::fs::create_dir(&root_only).expect("mkdir");
    let out_file = root_only.join("c.sqlite");
    let refused = env
        .command(&["export", "c", out_file.to_str().expect("utf-8")])
        .output()
        .expect("run");
    let (_, stderr) = texts(&refused);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(!out_file.exists());
}

/// A session file of an older schema (the committed schema-2 and schema-4 fixtures) the user
/// may not write: `append`, `rename` and a `fork` of it, which would upgrade it, refuse it
/// naming the file and the system's reason, exit 1, as for a current file (the upgrade's
/// first write said "sqlite: attempt to write a readonly database", naming nothing); the
/// file keeps its bytes and version, and reads still work.
#[test]
fn an_older_session_file_the_user_may_not_write_is_named_by_every_writer() {
    use std::os::unix::fs::PermissionsExt;
    let Some(prefix) = nobody_or_skip("an_older_session_file_the_user_may_not_write") else {
        return;
    };
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for (set, version) in [("schema2", 2), ("schema4", 4)] {
        let env = Env::new();
        std::fs::set_permissions(env.work(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        common::copy_tree(&fixtures.join(set).join("root"), &env.root);
        open_up(&env.root);
        let batch = env.work().join("batch.jsonl");
        std::fs::write(&batch, turn_line(9)).expect("write");
        let batch = batch.to_str().expect("utf-8");
        let file = env.file("chain-a");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).expect("chmod");
        let before = std::fs::read(&file).expect("read");
        let named = format!("open {} for writing: Permission denied", file.display());
        for args in [
            &["append", "chain-a", "--file", batch][..],
            &["rename", "chain-a", "new title"],
            &["fork", "chain-a", "--after-turn", "a1", "--id", "f"],
        ] {
            let out = run_as(&prefix, &env.root, args);
            let (_, stderr) = texts(&out);
            assert_eq!(out.status.code(), Some(1), "{set} {args:?}: {stderr}");
            assert!(stderr.contains(&named), "{set} {args:?}: {stderr}");
        }
        assert_eq!(std::fs::read(&file).expect("read"), before, "{set}");
        assert!(!env.root.join("f").exists(), "{set}");
        let out = run_as(&prefix, &env.root, &["verify", "chain-a"]);
        assert!(out.status.success(), "{set}: {}", texts(&out).1);
        let conn = rusqlite::Connection::open(&file).expect("open");
        let stored: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(stored, version, "{set}");
    }
}

/// A session file of an older schema (the committed schema-2 and schema-4 fixtures) the
/// user may not write, in a folder they may write, is deleted without being upgraded: a
/// fork of it (`chain-c`) and then the fork's ancestor (`chain-a`, whose forks `chain-b`
/// and `rewound` get its range first) go, as nobody, exit 0, and the forks keep their whole
/// history and verify. The delete opened the file as its writer, which upgrades it first:
/// "open FILE for writing: Permission denied", exit 1, nothing deleted.
#[test]
fn an_older_session_file_the_user_may_not_write_is_deleted() {
    use std::os::unix::fs::PermissionsExt;
    let Some(prefix) = nobody_or_skip("an_older_session_file_the_user_may_not_write_is_deleted")
    else {
        return;
    };
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for set in ["schema2", "schema4"] {
        let env = Env::new();
        std::fs::set_permissions(env.work(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        common::copy_tree(&fixtures.join(set).join("root"), &env.root);
        open_up(&env.root);
        let histories: Vec<Value> = ["chain-b", "rewound"]
            .iter()
            .map(|id| env.json(&["history", id]))
            .collect();
        for id in ["chain-a", "chain-c"] {
            std::fs::set_permissions(env.file(id), std::fs::Permissions::from_mode(0o444))
                .expect("chmod");
        }
        for id in ["chain-c", "chain-a"] {
            let out = run_as(&prefix, &env.root, &["delete", id]);
            assert!(out.status.success(), "{set} delete {id}: {}", texts(&out).1);
            assert!(!env.root.join(id).exists(), "{set}: {id} is still there");
        }
        for (id, before) in ["chain-b", "rewound"].iter().zip(&histories) {
            assert_eq!(&env.json(&["history", id]), before, "{set} {id}");
            env.ok(&["verify", id]);
        }
    }
}

/// A user who can only read a root runs every read-only command: list (from the session
/// files, the catalog being unwritable), show, history, events, stats, verify, export;
/// also on files with no `-wal` beside them, as a writer that closes last leaves them
/// (SQLite cannot create the `-wal` and `-shm` of a shared read there: such a file is read
/// as immutable).
#[test]
fn read_only_root_serves_reads() {
    let Some(prefix) = nobody_or_skip("read_only_root_serves_reads") else {
        return;
    };
    let env = Env::new();
    env.session("a", 2);
    env.session("b", 1);
    env.ok(&["fork", "a", "--after-turn", "t1", "--id", "f"]);
    env.ok(&["list"]);
    for id in ["a", "f"] {
        // A writer's connection that closes last checkpoints the WAL and removes it.
        let conn = rusqlite::Connection::open(env.file(id)).expect("open");
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("checkpoint");
        drop(conn);
        let wal = PathBuf::from(format!("{}-wal", env.file(id).display()));
        assert!(!wal.exists(), "{id}: the WAL is still there");
    }
    let out_dir = env.work().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(env.work(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::fs::set_permissions(&out_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    common::chmod_tree(&env.root, false);
    let run = |args: &[&str]| run_as(&prefix, &env.root, args);
    // The restriction is real: nobody cannot create a session.
    let refused = run(&["create", "z"]);
    assert!(!refused.status.success(), "nobody could write the root");
    // Nor rebuild the catalog; the error says what failed where and why: the file it could
    // not write and the system's reason (it was SQLite's "attempt to write a readonly
    // database" alone, and "unable to open database file" without the file).
    let rebuild = run(&["rebuild-catalog"]);
    let (_, stderr) = texts(&rebuild);
    assert_eq!(rebuild.status.code(), Some(1), "{stderr}");
    let named = format!(
        "rebuild the catalog of {0}: write {0}/.catalog/catalog.sqlite: Permission denied",
        env.root.display()
    );
    assert!(stderr.contains(&named), "{stderr}");
    let catalog = env.root.join(".catalog").join("catalog.sqlite");
    let kept = std::fs::read(&catalog).expect("catalog");
    std::fs::remove_file(&catalog).expect("rm catalog");
    let rebuild = run(&["rebuild-catalog"]);
    let (_, stderr) = texts(&rebuild);
    let named = format!(
        "rebuild the catalog of {0}: write {0}/.catalog: Permission denied",
        env.root.display()
    );
    assert!(stderr.contains(&named), "{stderr}");
    std::fs::write(&catalog, kept).expect("restore catalog");
    let export = out_dir.join("a.sqlite");
    let export = export.to_str().expect("utf-8");
    for args in [
        &["list"][..],
        &["--json", "list"],
        &["show", "a"],
        &["--json", "show", "f"],
        &["history", "a"],
        &["events", "f"],
        &["stats", "a"],
        &["verify", "f"],
        &["export", "a", export],
    ] {
        let out = run(args);
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "{args:?} as nobody: {stderr}");
        if args.ends_with(&["list"]) {
            for id in ["a", "b", "f"] {
                assert!(stdout.contains(id), "{args:?}: {stdout}");
            }
        }
    }
    let listed: Value =
        serde_json::from_slice(&run(&["--json", "list"]).stdout).expect("list json");
    assert_eq!(listed["sessions"].as_array().expect("sessions").len(), 3);
    assert!(listed["catalog_error"].is_string(), "{listed}");
    let show: Value = serde_json::from_slice(&run(&["--json", "show", "a"]).stdout).expect("show");
    assert_eq!(show["writer"], Value::Null);
    common::chmod_tree(&env.root, true);
    env.ok(&["import", export, "--id", "a2"]);
}

/// `gc` on a root the user may only read (as `nobody`): one error naming the root and the
/// system's reason (exit 1; it printed one "Permission denied" per session, naming each
/// session's `writer.lock`, then "N session(s) could not be deleted"), every session kept;
/// a dry run still reports what it would delete.
#[test]
fn gc_on_a_read_only_root_fails_once_naming_the_root() {
    let Some(prefix) = nobody_or_skip("gc_on_a_read_only_root_fails_once_naming_the_root") else {
        return;
    };
    let env = Env::new();
    for id in ["a", "b", "c"] {
        env.session(id, 1);
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(env.work(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    common::chmod_tree(&env.root, false);
    // `gc` refuses an age of 0s: the sessions are made older than 1s.
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let run = |args: &[&str]| run_as(&prefix, &env.root, args);
    let dry = run(&["gc", "--older-than", "1s", "--dry-run"]);
    let (stdout, stderr) = texts(&dry);
    assert!(dry.status.success(), "{stderr}");
    assert_eq!(stdout.matches("would delete").count(), 3, "{stdout}");
    for args in [
        &["gc", "--older-than", "1s"][..],
        &["--json", "gc", "--older-than", "1s"],
    ] {
        let out = run(args);
        let (stdout, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            format!(
                "session-store: error: collect old sessions of {0}: write {0}: Permission \
                 denied (os error 13)",
                env.root.display()
            ),
            "{args:?}"
        );
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
    common::chmod_tree(&env.root, true);
    assert_eq!(env.listed().0, ["a", "b", "c"]);
}

/// A session file (`a`) and a session folder (`b`) the user may not read (mode 000, the
/// rest of the root theirs to read): every command naming them says "Permission denied"
/// (exit 1), where it said "unable to open database file" (SQLite's text alone) or, for
/// the folder, "session b not found" (exit 3) and `verify` "neither a session nor a
/// file"; `list` reports both as skipped (the folder was passed over as if deleted) and
/// lists the session it can read.
#[test]
fn unreadable_session_files_and_folders_say_permission_denied() {
    let Some(prefix) = nobody_or_skip("unreadable_session_files_and_folders_say_permission_denied")
    else {
        return;
    };
    let env = Env::new();
    for id in ["a", "b", "c"] {
        env.session(id, 1);
    }
    env.ok(&["list"]);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(env.work(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        common::chmod_tree(&env.root, false);
        let none = std::fs::Permissions::from_mode(0o000);
        std::fs::set_permissions(env.file("a"), none.clone()).expect("chmod");
        std::fs::set_permissions(env.root.join("b"), none).expect("chmod");
    }
    let run = |args: &[&str]| run_as(&prefix, &env.root, args);
    for id in ["a", "b"] {
        for command in ["show", "history", "events", "stats", "verify"] {
            let out = run(&[command, id]);
            let (_, stderr) = texts(&out);
            assert_eq!(out.status.code(), Some(1), "{command} {id}: {stderr}");
            assert!(
                stderr.contains("Permission denied"),
                "{command} {id}: {stderr}"
            );
        }
    }
    let out = run(&["list"]);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    for id in ["a", "b"] {
        assert!(
            stderr.contains(&format!("skipped session {id}: ")),
            "{stderr}"
        );
    }
    assert!(stdout.contains("c "), "{stdout}");
    common::chmod_tree(&env.root, true);
}

/// Objects planted in a session file (trigger, view, index, table) are refused by verify,
/// open for writing (the trigger never runs), list (skipped, named) and import; a history
/// index that differs from the log fails verify. A replicator's tables are allowed.
#[test]
fn planted_schema_objects_are_refused() {
    let template = Env::new();
    template.session("s", 2);
    template.ok(&["verify", "s"]);
    let plants = [
        (
            "trigger",
            "\"t\"",
            "CREATE TRIGGER t AFTER INSERT ON events BEGIN DELETE FROM history; \
             UPDATE header SET cwd = 'pwned'; END;",
        ),
        ("view", "\"v\"", "CREATE VIEW v AS SELECT seq FROM events"),
        ("index", "\"i\"", "CREATE INDEX i ON events (kind)"),
        ("table", "\"x\"", "CREATE TABLE x (y)"),
    ];
    for (kind, name, sql) in plants {
        let env = Env::new();
        copy_dir(&template.root, &env.root);
        env.sql("s", sql);
        let before = std::fs::read(env.file("s")).expect("read");
        let why = format!("{kind} {name}");
        for args in [&["verify", "s"][..], &["show", "s"], &["history", "s"]] {
            let stderr = env.fails(args, 6);
            assert!(stderr.contains(&why), "{args:?}: {stderr}");
        }
        let out = env.run_with(&["append", "s"], &turn_line(3));
        assert_eq!(out.status.code(), Some(6), "append: {}", texts(&out).1);
        assert!(texts(&out).1.contains(&why));
        assert_eq!(
            std::fs::read(env.file("s")).expect("read"),
            before,
            "{kind}"
        );
        let (_, stderr) = env.ok(&["list"]);
        assert!(stderr.contains("skipped session s") && stderr.contains(&why));
        let file = env.file("s");
        let stderr = env.fails(&["import", file.to_str().expect("utf-8"), "--id", "c"], 6);
        assert!(stderr.contains(&why), "import: {stderr}");
        assert!(!env.root.join("c").exists());
    }

    // The history index against the log: a row missing, altered, extra; a reset extra.
    for (what, sql) in [
        ("missing", "DELETE FROM history WHERE position = 1"),
        (
            "altered",
            "UPDATE history SET role = 'assistant' WHERE position = 2",
        ),
        (
            "extra",
            "INSERT INTO history VALUES (3, 5, NULL, 'ghost', 'user', 10)",
        ),
        ("reset", "INSERT INTO history_resets VALUES (4)"),
    ] {
        let env = Env::new();
        copy_dir(&template.root, &env.root);
        env.sql("s", sql);
        let stderr = env.fails(&["verify", "s"], 6);
        assert!(stderr.contains("history index"), "{what}: {stderr}");
    }

    // The turn index against the log: a turn missing, altered (a fork would cut there),
    // extra.
    for (what, sql) in [
        (
            "missing",
            "DELETE FROM turns WHERE start_seq = (SELECT min(start_seq) FROM turns)",
        ),
        (
            "altered",
            "UPDATE turns SET boundary_seq = boundary_seq - 1",
        ),
        ("status", "UPDATE turns SET status = 'failed'"),
        (
            "extra",
            "INSERT INTO turns VALUES (900, 'ghost', 901, 901, 'completed', 1, 1)",
        ),
    ] {
        let env = Env::new();
        copy_dir(&template.root, &env.root);
        env.sql("s", sql);
        let stderr = env.fails(&["verify", "s"], 6);
        assert!(stderr.contains("turn index"), "{what}: {stderr}");
    }

    // Litestream's bookkeeping tables are not ours but allowed.
    let env = Env::new();
    copy_dir(&template.root, &env.root);
    env.sql(
        "s",
        "CREATE TABLE _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER); \
         CREATE TABLE _litestream_lock (id INTEGER);",
    );
    env.ok(&["verify", "s"]);
    let out = env.run_with(&["append", "s"], &turn_line(3));
    assert!(out.status.success(), "{}", texts(&out).1);
    env.ok(&["verify", "s"]);
    // Only as Litestream creates them.
    env.sql(
        "s",
        "DROP TABLE _litestream_lock; CREATE TABLE _litestream_lock (id, x)",
    );
    let stderr = env.fails(&["verify", "s"], 6);
    assert!(stderr.contains("table \"_litestream_lock\""), "{stderr}");
}

/// Runs `f` on a fresh tmpfs of `size`, unmounted afterwards; `false` (with the reason
/// printed) when no tmpfs can be mounted here (not root, no CAP_SYS_ADMIN).
fn on_tmpfs(size: &str, f: impl FnOnce(&Path)) -> bool {
    let dir = tempfile::tempdir().expect("tempdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir.path())
        .stderr(Stdio::piped())
        .output();
    match mounted {
        Ok(out) if out.status.success() => {}
        other => {
            eprintln!("no tmpfs: {other:?}");
            return false;
        }
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(dir.path())));
    let _ = Command::new("umount").arg("-l").arg(dir.path()).status();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    true
}

/// `list` on a full disk lists from the session files and says the catalog could not be
/// used because the disk is full (not "disk I/O error"); it needs no write at all.
#[test]
fn list_on_a_full_disk() {
    let ran = on_tmpfs("1m", |dir| {
        let env = Env {
            _dir: tempfile::tempdir().expect("tempdir"),
            root: dir.join("root"),
        };
        env.session("a", 1);
        env.session("b", 1);
        std::fs::remove_dir_all(env.root.join(".catalog")).expect("rm catalog");
        // Fill the disk.
        let mut filler = std::fs::File::create(dir.join("filler")).expect("filler");
        let chunk = vec![0u8; 4096];
        use std::io::Write;
        while filler.write_all(&chunk).is_ok() {}
        drop(filler);
        let out = env.run(&["--json", "list"]);
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "list on a full disk: {stderr}");
        let page: Value = serde_json::from_str(&stdout).expect("json");
        assert_eq!(page["sessions"].as_array().expect("sessions").len(), 2);
        let why = page["catalog_error"].as_str().expect("catalog_error");
        assert!(why.contains("disk full"), "{why}");
        assert!(stderr.contains("disk full"), "{stderr}");
    });
    if !ran {
        eprintln!("list_on_a_full_disk: skipped (cannot mount a tmpfs)");
    }
}

/// Out of file descriptors (`ulimit -n`, set for the child by `sh`), `list`, `search` (its
/// index filled anew) and `rebuild-catalog` over 40 sessions answer in full or fail naming
/// "Too many open files". `list` skipped every session it could not open as unreadable and
/// said "no sessions in ROOT" (exit 0); the search's fill marked its index filled without
/// them, so every later search, with descriptors back, said "no matches".
#[test]
fn out_of_descriptors_is_an_error_not_an_empty_root() {
    let env = Env::new();
    const SESSIONS: usize = 40;
    for i in 0..SESSIONS {
        env.session(&format!("s{i:02}"), 1);
    }
    let limited = |n: usize, args: &[&str]| -> Output {
        Command::new("sh")
            .args(["-c", "ulimit -n \"$1\" && shift && exec \"$@\"", "sh"])
            .arg(n.to_string())
            .arg(BIN)
            .arg("--root")
            .arg(&env.root)
            .args(args)
            .output()
            .expect("run sh")
    };
    let hits = |out: &Output| -> usize {
        let page: Value = serde_json::from_slice(&out.stdout).expect("search json");
        page["hits"].as_array().expect("hits").len()
    };
    let search = ["--json", "search", "hello", "--limit", "100"];
    let drop_index = || {
        for f in ["search.sqlite", "search.sqlite-wal", "search.sqlite-shm"] {
            let _ = std::fs::remove_file(env.root.join(".catalog").join(f));
        }
    };
    let mut failed = 0;
    for n in (12..=40).step_by(2) {
        let out = limited(n, &["--json", "list", "--limit", "100"]);
        let (stdout, stderr) = texts(&out);
        if out.status.success() {
            let page: Value = serde_json::from_str(&stdout).expect("list json");
            assert_eq!(
                page["sessions"].as_array().expect("sessions").len(),
                SESSIONS,
                "ulimit -n {n}: {stderr}"
            );
            assert_eq!(page["skipped"], Value::Array(vec![]), "ulimit -n {n}");
        } else {
            failed += 1;
            assert_eq!(out.status.code(), Some(1), "ulimit -n {n}: {stderr}");
            assert!(
                stderr.contains("Too many open files"),
                "ulimit -n {n}: {stderr}"
            );
        }
        drop_index();
        let out = limited(n, &search);
        if out.status.success() {
            // (39 hits once, a session skipped as unreadable: session 38's CI.)
            assert_eq!(
                hits(&out),
                SESSIONS,
                "ulimit -n {n}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        } else {
            // The search reads hits back on several threads: one may free a descriptor
            // between another's failed open and the check that names the limit, so
            // SQLite's own words may stand.
            let stderr = texts(&out).1;
            assert!(
                stderr.contains("Too many open files")
                    || stderr.contains("unable to open database file"),
                "ulimit -n {n}: {stderr}"
            );
        }
        // With descriptors back, the index the limited search left answers in full.
        assert_eq!(hits(&env.run(&search)), SESSIONS, "after ulimit -n {n}");
        let out = limited(n, &["--json", "rebuild-catalog"]);
        if out.status.success() {
            let report: Value = serde_json::from_slice(&out.stdout).expect("rebuild json");
            assert_eq!(report["sessions"], SESSIONS, "ulimit -n {n}");
        } else {
            let stderr = texts(&out).1;
            assert!(
                stderr.contains("Too many open files"),
                "ulimit -n {n}: {stderr}"
            );
        }
        assert_eq!(env.listed().0.len(), SESSIONS, "after ulimit -n {n}");
    }
    assert!(failed > 0, "no limit was low enough to make list fail");
}

/// Out of threads (`prlimit --nproc` 1 to 4, as a user id of its own through `setpriv`,
/// since root is not held to the limit), `list`, `search` and `export` answer in full or
/// fail with exit 1 naming the thread that could not be started (`export` and `import`
/// said only "Resource temporarily unavailable": outside testing R9). The read pools' thread
/// (`ScheduledThreadPool`, gone with r2d2 since), the search's read-back threads (`std::thread::scope`) and
/// tokio's blocking thread panicked ("internal error: … panicked", or exit 101), and
/// `list` and the search's index fill skipped every session ("no sessions", no hits).
#[test]
fn out_of_threads_is_an_error_not_a_panic() {
    let tools = ["setpriv", "prlimit"];
    if let Some(missing) = tools.iter().find(|t| {
        !["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .any(|d| Path::new(d).join(t).is_file())
    }) {
        eprintln!("out_of_threads_is_an_error_not_a_panic: skipped ({missing} not found)");
        return;
    }
    // A user of its own: no other process counts against its limit.
    let user = ["--reuid=64321", "--regid=64321", "--clear-groups"];
    if !Command::new("setpriv")
        .args(user)
        .arg("true")
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("out_of_threads_is_an_error_not_a_panic: skipped (setpriv cannot switch user)");
        return;
    }
    let env = Env::new();
    const SESSIONS: usize = 12;
    for i in 0..SESSIONS {
        env.session(&format!("s{i:02}"), 1);
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(env.work(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let limited = |n: usize, args: &[&str]| -> Output {
        Command::new("setpriv")
            .args(user)
            .arg("prlimit")
            .arg(format!("--nproc={n}"))
            .arg(BIN)
            .arg("--root")
            .arg(&env.root)
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("run setpriv")
    };
    let count = |out: &Output, key: &str| -> usize {
        let page: Value = serde_json::from_slice(&out.stdout).expect("json");
        page[key].as_array().expect(key).len()
    };
    let exports = env.work().join("exports");
    std::fs::create_dir(&exports).expect("mkdir");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exports, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    for n in 1..=4 {
        let export = exports.join(format!("s00-{n}.sqlite"));
        let export_args = ["export", "s00", export.to_str().expect("utf-8 path")];
        let out = limited(n, &export_args);
        let stderr = texts(&out).1;
        match out.status.code() {
            Some(0) => assert!(export.is_file(), "--nproc={n} export: {stderr}"),
            Some(1) => {
                assert!(stderr.contains("thread"), "--nproc={n} export: {stderr}");
                assert!(!export.exists(), "--nproc={n} export: {stderr}");
            }
            other => panic!("--nproc={n} export: exit {other:?}: {stderr}"),
        }
        for (args, key) in [
            (&["--json", "list", "--limit", "100"][..], "sessions"),
            (&["--json", "search", "hello", "--limit", "100"], "hits"),
        ] {
            let out = limited(n, args);
            let stderr = texts(&out).1;
            assert!(
                !stderr.contains("internal error"),
                "--nproc={n} {args:?}: {stderr}"
            );
            match out.status.code() {
                Some(0) => assert_eq!(count(&out, key), SESSIONS, "--nproc={n} {args:?}"),
                Some(1) => assert!(stderr.contains("thread"), "--nproc={n} {args:?}: {stderr}"),
                other => panic!("--nproc={n} {args:?}: exit {other:?}: {stderr}"),
            }
        }
    }
}

/// `serve` that cannot start the threads its runtime needs (`ulimit -u`, run as `nobody`:
/// root ignores the limit) says so and exits 1: tokio's runtime panicked when it could not
/// start a worker, and the server then hung without serving or saying anything until a
/// signal ended it (outside testing, resource limits).
#[test]
fn serve_out_of_threads_says_so_and_exits() {
    let Some((prefix, env)) = nobody_with_a_session("serve_out_of_threads", 1) else {
        return;
    };
    let mut serve = Command::new(prefix[0])
        .args(&prefix[1..])
        .args([
            "bash",
            "-c",
            "ulimit -u 2 && exec \"$@\"",
            "bash",
            BIN,
            "--root",
        ])
        .arg(&env.root)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while serve.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = serve.kill();
            let _ = serve.wait();
            panic!("serve neither served nor exited within 20 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = serve.wait_with_output().expect("output");
    let (stdout, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("serve needs 3 threads and could not start them"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A file the user may not reach (in a folder only root may enter) is refused with the
/// system's reason, exit 1, by `import` and `verify`: it was "FILE not found", exit 3, as
/// a path with nothing there is (outside testing, re-test of security: root acting as a
/// root's owner met it).
#[test]
fn a_file_the_user_may_not_reach_is_not_called_missing() {
    use std::os::unix::fs::PermissionsExt;
    let Some((prefix, env)) = nobody_with_a_session("a_file_the_user_may_not_reach", 1) else {
        return;
    };
    let closed = env.work().join("closed");
    std::fs::create_dir(&closed).expect("mkdir");
    let file = closed.join("a.sqlite");
    env.ok(&["export", "a", file.to_str().expect("utf-8")]);
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    for command in ["import", "verify"] {
        let out = run_as(
            &prefix,
            &env.root,
            &[command, file.to_str().expect("utf-8")],
        );
        let (_, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
        assert!(stderr.contains("Permission denied"), "{command}: {stderr}");
    }
}
