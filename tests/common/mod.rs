//! Helpers shared by the integration tests: temp roots, event builders, child processes.
#![allow(dead_code)]

use std::borrow::Borrow;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::json;
use session_store::{Batch, Commit, CreateOptions, Error, Event, Root, SessionId, StoreOptions};

/// A root in a fresh temp dir; keep the `TempDir` alive for the test's duration.
pub fn temp_root() -> (tempfile::TempDir, Root) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = Root::open(dir.path().join("sessions")).expect("root");
    (dir, root)
}

/// A root whose timed drains never fire during a test (1 hour write-behind).
pub fn manual_root() -> (tempfile::TempDir, Root) {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = StoreOptions::default().with_write_behind(Duration::from_secs(3600));
    let root = Root::with_options(dir.path().join("sessions"), options).expect("root");
    (dir, root)
}

pub fn id(s: &str) -> SessionId {
    SessionId::new(s).expect("valid id")
}

pub fn create(root: &Root, name: &str) -> session_store::Session {
    root.create(CreateOptions::with_id(id(name)))
        .expect("create")
}

pub fn message(id: &str, role: &str, content: &str) -> Event {
    Event::new("message/complete")
        .with_payload(&json!({"message": {"id": id, "role": role, "content": content}}))
        .expect("payload")
}

pub fn title(text: &str) -> Event {
    Event::new("session/title")
        .with_payload(&json!({"title": text}))
        .expect("payload")
}

pub fn turn_end(status: &str) -> Event {
    Event::new("turn/end")
        .with_payload(&json!({"status": status}))
        .expect("payload")
}

/// An event of `kind` with this payload.
pub fn event(kind: &str, payload: serde_json::Value) -> Event {
    Event::new(kind).with_payload(&payload).expect("payload")
}

/// A completed agent turn as a host writes it: a user message, a tool call whose `output`
/// appears in `tool/result` and in the tool message, and an assistant reply (eight events;
/// `tool/result` is the fifth, the tool message the sixth).
pub fn tool_turn(op: &str, turn_id: &str, output: &str) -> Batch {
    let call = format!("call-{turn_id}");
    Batch::new(
        op,
        vec![
            Event::new("turn/start"),
            message(&format!("user-{turn_id}"), "user", "run the build"),
            event(
                "tool/call",
                json!({"id": call, "name": "bash", "args": {"cmd": "cargo build"}}),
            ),
            event("tool/start", json!({"id": call, "name": "bash"})),
            event(
                "tool/result",
                json!({"id": call, "name": "bash", "output": output}),
            ),
            event(
                "message/complete",
                json!({"message": {"id": format!("tool-{turn_id}"), "role": "tool",
                    "tool_call_id": call, "content": output}}),
            ),
            message(&format!("reply-{turn_id}"), "assistant", "the build passed"),
            turn_end("completed"),
        ],
    )
    .in_turn(turn_id)
}

/// A three-event completed turn with one user message.
pub fn turn(op: &str, turn_id: &str, message_id: &str) -> Batch {
    Batch::new(
        op,
        vec![
            Event::new("turn/start"),
            message(message_id, "user", message_id),
            turn_end("completed"),
        ],
    )
    .in_turn(turn_id)
}

/// A command that re-runs this test binary as a child process running only the ignored
/// test `role` (output not captured), stdout piped and stderr inherited.
pub fn role_command(role: &str) -> Command {
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--ignored", "--exact", role, "--test-threads=1"])
        .env("RUST_TEST_NOCAPTURE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// Spawns [`role_command`] with `env` set.
pub fn spawn_role(role: &str, env: &[(&str, &str)]) -> Child {
    let mut cmd = role_command(role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

/// Reads lines from a child until one contains `prefix`; returns what follows it.
/// (libtest prints `test name ... ` before the child's first line.)
pub fn read_until(out: &mut BufReader<ChildStdout>, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).expect("read child");
        assert!(n > 0, "child exited before printing {prefix:?}");
        if let Some(at) = line.find(prefix) {
            return line[at + prefix.len()..].trim_end().to_owned();
        }
    }
}

/// Copies a folder tree of regular files.
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let kind = entry.file_type().expect("file type");
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            assert!(kind.is_file(), "only files and folders in fixtures");
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// Runs `/usr/bin/sqlite3 file sql` (Debian's 3.40: the oldest shell the format promises)
/// and returns its trimmed stdout.
pub fn sqlite3(file: &std::path::Path, sql: &str) -> String {
    let out = Command::new("/usr/bin/sqlite3")
        .arg(file)
        .arg(sql)
        .output()
        .expect("run /usr/bin/sqlite3");
    assert!(
        out.status.success(),
        "sqlite3 {} {sql:?}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Sets `path` and everything under it read-only (or back to writable).
pub fn chmod_tree(path: &std::path::Path, writable: bool) {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(path).expect("stat");
    let mode = match (meta.is_dir(), writable) {
        (true, false) => 0o555,
        (true, true) => 0o755,
        (false, false) => 0o444,
        (false, true) => 0o644,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).expect("read dir") {
            chmod_tree(&entry.expect("entry").path(), writable);
        }
    }
}

/// The session ids of a listing page as `list --json` and `/api/sessions` print it.
pub fn listed_ids(list: &serde_json::Value) -> Vec<String> {
    list["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| {
            s["session_ref"]["session_id"]
                .as_str()
                .expect("id")
                .to_owned()
        })
        .collect()
}

/// What identifies a commit to a caller: ids, hashes, turn, time, event ids.
pub fn identity(c: &Commit) -> serde_json::Value {
    json!({
        "commit_id": c.commit_id, "operation_id": c.operation_id,
        "operation_hash": c.operation_hash, "turn_id": c.turn_id, "first_seq": c.first_seq,
        "writer_generation": c.writer_generation, "created_at_ms": c.created_at_ms,
        "event_ids": c.events.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
    })
}

/// The batch a caller would retry to get `c` back: derived event ids left out.
pub fn retry_of(c: &Commit) -> Batch {
    let events = c
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut e = e.clone();
            if e.id == format!("{}.{i}", c.commit_id) {
                e.id.clear();
            }
            e
        })
        .collect();
    let mut batch = Batch::new(c.operation_id.clone(), events);
    batch.turn_id = c.turn_id.clone();
    batch
}

/// Retries of `picks` of `originals` in the writer of `name` return the original commits
/// (same ids, hashes, time, event ids), a reused operation id with other content is a
/// conflict, and a new operation appends after `durable`. Returns its sequence.
pub fn retries_conflict_and_append(
    root: &Root,
    name: &str,
    originals: &[impl Borrow<Commit>],
    picks: &[usize],
    durable: u64,
    state: &str,
) -> u64 {
    let s = root.open_writer(&id(name)).expect("open writer");
    for &pick in picks {
        let original = originals[pick].borrow();
        let again = s.append(retry_of(original)).expect("retry");
        assert_eq!(
            identity(&again),
            identity(original),
            "{state}: {name} commit {pick}"
        );
    }
    let reused = &originals[picks[picks.len() / 2]].borrow().operation_id;
    let conflict = s
        .append_events(reused, vec![title("other content")])
        .expect_err("conflict");
    assert!(
        matches!(conflict, Error::OperationConflict { .. }),
        "{state}: {conflict}"
    );
    let new = s
        .append_events(&format!("new-{state}"), vec![title(state)])
        .expect("new operation");
    assert_eq!(new.first_seq, durable + 1, "{state}: retries added nothing");
    s.close().expect("close");
    new.first_seq
}

/// Spawns the `session-store` binary with `--root root` and `args`, its output piped and
/// `input` written to its stdin (which is then closed; a command that refuses early may
/// not read it).
pub fn spawn_cli(root: &std::path::Path, args: &[&str], input: &str) -> Child {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_session-store"))
        .arg("--root")
        .arg(root)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn session-store");
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    child
}

/// Session `src` holding `turns` completed turns ([`turn`]: `t0`, `t1`, …), closed and
/// exported to `dir/src.export`: the file a race test imports again round after round.
pub fn exported_turns(root: &Root, dir: &std::path::Path, turns: usize) -> std::path::PathBuf {
    let s = create(root, "src");
    for n in 0..turns {
        s.append(turn(&format!("op{n}"), &format!("t{n}"), &format!("m{n}")))
            .expect("append");
    }
    s.close().expect("close");
    let export = dir.join("src.export");
    root.export(&id("src"), &export).expect("export");
    export
}

/// A thread that opens session `session` of the root at `path` for writing (through a
/// `Root` of its own, as another process would) and appends and flushes three-event
/// turns ([`turn`]) until `done` is set, then closes it.
pub fn spawn_turn_writer(
    path: std::path::PathBuf,
    session: SessionId,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let s = Root::open(path)
            .expect("root")
            .open_writer(&session)
            .expect("writer");
        let mut n = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            n += 1;
            s.append(turn(&format!("op{n}"), &format!("t{n}"), &format!("m{n}")))
                .expect("append");
            s.flush().expect("flush");
        }
        s.close().expect("close");
    })
}

/// Whether `/usr/bin/faketime` (Debian's libfaketime: a command under another wall clock)
/// is here; without it a clock test fails under `$CI` (`.ci/run` installs it) and is
/// skipped with a message otherwise.
pub fn faketime_or_skip() -> bool {
    let there = std::path::Path::new("/usr/bin/faketime").is_file();
    if !there {
        assert!(
            std::env::var_os("CI").is_none(),
            "faketime is missing (/usr/bin/faketime): .ci/run installs it"
        );
        println!("clock test skipped: no /usr/bin/faketime (apt-get install faketime)");
    }
    there
}

/// `faketime -f CLOCK PROGRAM`: `program` run under the wall clock `clock` (`@2001-09-09
/// 00:00:00`, `+8000y`), its monotonic clock left alone (a real one never goes back).
pub fn under_clock(clock: &str, program: &str) -> Command {
    let mut c = Command::new("faketime");
    c.args(["-f", clock, program])
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    c
}
