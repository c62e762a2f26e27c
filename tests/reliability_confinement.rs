//! Reliability promise: confinement to the root. Nothing outside a root is ever followed
//! into, created, written or removed, whatever symlinks are planted inside it: for every
//! path the store opens, creates or removes under a root (session folders and files,
//! SQLite's `-wal`/`-shm`/`-journal`, `writer.lock`, `dependents.lock`, `.staging` and its
//! guards, `.trash`, the catalog, exports' temporary files) a symlink pointing outside is
//! planted, the real CLI binary runs the commands that touch it, and the outside canary
//! tree must be byte-identical afterwards while the command either works or fails with a
//! clear error. Also: a root reached through a symlinked folder, long export names, and
//! the file handling of `export`, `import` and `verify` (destinations that are devices or
//! folders, missing folders, symlinked and FIFO inputs, nothing left beside a user's file).

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

/// How long any one command may take (a command that blocks on a FIFO or waits for a
/// lock it can never get fails the test instead of hanging it).
const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// A root `R` and, beside it, an outside folder `V` with a canary tree.
struct World {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    outside: PathBuf,
}

impl World {
    fn new() -> World {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().canonicalize().expect("canonical");
        let root = base.join("R");
        let outside = base.join("V");
        std::fs::create_dir_all(outside.join("docs/deep")).expect("mkdir");
        std::fs::write(outside.join("docs/a"), b"outside a\n").expect("write");
        std::fs::write(outside.join("docs/deep/b"), b"outside b\n").expect("write");
        std::fs::write(outside.join("canary"), b"canary bytes\n").expect("write");
        World {
            _tmp: tmp,
            base,
            root,
            outside,
        }
    }

    /// A new folder beside the root (outside it).
    fn folder(&self, name: &str) -> PathBuf {
        let dir = self.base.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    /// The canary file outside the root.
    fn canary(&self) -> PathBuf {
        self.outside.join("canary")
    }

    /// Runs the CLI on the root; fails the test if it takes longer than [`COMMAND_LIMIT`].
    fn run(&self, args: &[&str], stdin: &str) -> Output {
        run_cli(&self.root, args, stdin)
    }

    /// Runs, expects status 0, returns stdout.
    fn ok(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, stdin);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A session with two completed turns, its writer closed.
    fn session(&self, id: &str) {
        self.ok(&["create", id], "");
        self.ok(&["append", id], &turns(2));
    }

    /// Every file and folder under the outside folder with its content (or link target).
    fn outside_state(&self) -> BTreeMap<PathBuf, String> {
        tree(&self.outside)
    }

    /// Plants a symlink at `at` (inside the root) pointing to `to`.
    fn plant(&self, at: &Path, to: &Path) {
        if let Ok(m) = std::fs::symlink_metadata(at) {
            if m.is_dir() {
                std::fs::remove_dir_all(at).expect("remove");
            } else {
                std::fs::remove_file(at).expect("remove");
            }
        }
        std::os::unix::fs::symlink(to, at).expect("symlink");
    }
}

fn run_cli(root: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = common::spawn_cli(root, args, stdin);
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > COMMAND_LIMIT {
            let _ = child.kill();
            panic!("{args:?} still running after {COMMAND_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `n` completed turns as JSON Lines batches.
fn turns(n: usize) -> String {
    (1..=n)
        .map(|i| {
            let t = format!("turn-{i}");
            let user = json!({"operation_id": format!("{t}/u"), "turn_id": t, "events": [
                {"kind": "turn/start"},
                {"kind": "message/complete", "payload": {"message": {"id": format!("{t}-u"), "role": "user", "content": format!("question {i}")}}},
            ]});
            let answer = json!({"operation_id": format!("{t}/a"), "turn_id": t, "events": [
                {"kind": "message/complete", "payload": {"message": {"id": format!("{t}-a"), "role": "assistant", "content": format!("answer {i}")}}},
                {"kind": "turn/end", "payload": {"status": "completed"}},
            ]});
            format!("{user}\n{answer}\n")
        })
        .collect()
}

/// One more batch for an existing session.
fn one_more(op: &str) -> String {
    format!(
        "{}\n",
        json!({"operation_id": op, "events": [{"kind": "session/title", "payload": {"title": op}}]})
    )
}

/// Every entry under `dir` (not following symlinks): files with their bytes, symlinks
/// with their target, folders as such.
fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            let m = std::fs::symlink_metadata(&path).expect("lstat");
            let what = if m.is_symlink() {
                format!(
                    "link {}",
                    std::fs::read_link(&path).expect("readlink").display()
                )
            } else if m.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else {
                format!("file {:?}", std::fs::read(&path).expect("read"))
            };
            out.insert(path, what);
        }
    }
    out
}

/// Names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A refusal: a non-zero status other than a crash, with a message naming the problem.
fn assert_refused(out: &Output, what: &str, needle: &str) {
    let c = code(out);
    assert!(
        c != 0 && c != 101 && c != -1,
        "{what}: expected a clear refusal, got status {c}: {}",
        stderr(out)
    );
    assert!(
        stderr(out).contains(needle),
        "{what}: the message should say {needle:?}: {}",
        stderr(out)
    );
}

#[test]
fn trash_and_staging_that_are_symlinks_are_never_followed() {
    for folder in [".trash", ".staging"] {
        let w = World::new();
        w.session("s1");
        w.session("s2");
        let before = w.outside_state();
        w.plant(&w.root.join(folder), &w.outside);

        // Opening the root (any command) cleans `.trash` and `.staging`: never through the link.
        for args in [&["list"][..], &["show", "s1"], &["rebuild-catalog"]] {
            let out = w.run(args, "");
            assert_eq!(code(&out), 0, "{folder}: {args:?}: {}", stderr(&out));
        }
        // The commands that create or remove in that folder refuse it clearly.
        let (args, input): (&[&str], String) = if folder == ".trash" {
            (&["delete", "s2"], String::new())
        } else {
            (&["create", "s3"], String::new())
        };
        assert_refused(&w.run(args, &input), folder, "not a directory of the root");
        if folder == ".staging" {
            let exported = w.base.join("s1.export");
            w.ok(&["export", "s1", exported.to_str().expect("utf8")], "");
            let out = w.run(
                &["import", exported.to_str().expect("utf8"), "--id", "s4"],
                "",
            );
            assert_refused(
                &out,
                "import through a symlinked .staging",
                "not a directory",
            );
            assert_refused(
                &w.run(&["fork", "s1", "--after-turn", "turn-1", "--id", "s5"], ""),
                "fork through a symlinked .staging",
                "not a directory",
            );
        } else {
            w.ok(&["show", "s2"], "");
        }
        // Appends keep working: nothing there goes through the folder.
        w.ok(&["append", "s1"], &one_more("more"));
        assert_eq!(
            w.outside_state(),
            before,
            "{folder}: the outside tree changed"
        );
        assert!(w.outside.join("docs/a").is_file());
    }
}

#[test]
fn symlinks_inside_trash_and_staging_are_unlinked_not_followed() {
    let w = World::new();
    w.session("s1");
    let before = w.outside_state();
    let trash = w.root.join(".trash");
    let staging = w.root.join(".staging");
    std::fs::create_dir_all(trash.join("tomb/inner")).expect("mkdir");
    std::fs::create_dir_all(staging.join("import-dead/inner")).expect("mkdir");
    // Links as whole entries and deep inside entries, to folders and to files.
    w.plant(&trash.join("link"), &w.outside);
    w.plant(&trash.join("tomb/inner/docs"), &w.outside.join("docs"));
    w.plant(&trash.join("tomb/file"), &w.canary());
    w.plant(&staging.join("create-dead"), &w.outside.join("docs"));
    w.plant(&staging.join("import-dead/inner/v"), &w.outside);
    w.plant(&staging.join("import-dead/session.sqlite"), &w.canary());
    // An abandoned staging folder whose guard is a symlink: the guard is refused, so the
    // folder stays; the file the guard points to is not written.
    std::fs::create_dir_all(staging.join("fork-dead")).expect("mkdir");
    w.plant(&staging.join("fork-dead.lock"), &w.canary());

    w.ok(&["list"], "");
    assert_eq!(w.outside_state(), before, "the outside tree changed");
    assert!(
        names(&trash).is_empty(),
        "trash emptied: {:?}",
        names(&trash)
    );
    // The symlinked guard is refused (its folder kept) or unlinked first; in either case
    // the next open removes the folder.
    w.ok(&["list"], "");
    assert!(
        names(&staging).is_empty(),
        "abandoned staging entries removed: {:?}",
        names(&staging)
    );
    // Deletes and creates still work, through real folders.
    w.ok(&["create", "s2"], "");
    w.ok(&["delete", "s2"], "");
    assert_eq!(w.outside_state(), before);
}

#[test]
fn lock_files_that_are_symlinks_are_refused_and_their_targets_untouched() {
    let w = World::new();
    w.session("p");
    w.session("q");
    let before = w.outside_state();

    // writer.lock: append, delete, show (probes the lock), fork's writer of the child.
    w.plant(&w.root.join("p/writer.lock"), &w.canary());
    assert_refused(
        &w.run(&["append", "p"], &one_more("x")),
        "append",
        "symlink",
    );
    assert_refused(
        &w.run(&["delete", "p", "--wait", "0"], ""),
        "delete",
        "symlink",
    );
    assert_eq!(w.outside_state(), before, "writer.lock target changed");
    assert!(w.root.join("p/session.sqlite").is_file(), "p not deleted");

    // dependents.lock: fork (shared) and delete (exclusive).
    w.plant(&w.root.join("q/dependents.lock"), &w.canary());
    assert_refused(
        &w.run(&["fork", "q", "--after-turn", "turn-1", "--id", "qf"], ""),
        "fork",
        "symlink",
    );
    assert_refused(&w.run(&["delete", "q"], ""), "delete", "symlink");
    assert_eq!(w.outside_state(), before, "dependents.lock target changed");
    assert!(!w.root.join("qf").exists(), "no fork published");
    w.ok(&["show", "q"], "");
}

/// A `writer.lock` or `dependents.lock` that is a FIFO or a folder: `list`, `show`,
/// `delete`, `gc` and `serve`'s list waited forever reading the FIFO (for the whole
/// root), and a folder was "Is a directory", exit 1 (outside testing, session 37).
#[test]
fn lock_files_that_are_fifos_or_folders_are_refused_and_the_root_still_lists() {
    let w = World::new();
    w.session("good");
    w.session("fifo");
    w.session("dir");
    w.session("dep");
    let made = |path: PathBuf| {
        std::fs::remove_file(&path).ok();
        let fifo = Command::new("mkfifo").arg(&path).status().expect("mkfifo");
        assert!(fifo.success());
    };
    made(w.root.join("fifo/writer.lock"));
    std::fs::remove_file(w.root.join("dir/writer.lock")).ok();
    std::fs::create_dir(w.root.join("dir/writer.lock")).expect("mkdir");
    made(w.root.join("dep/dependents.lock"));
    let listed = w.ok(&["list"], "");
    for id in ["good", "fifo", "dir", "dep"] {
        assert!(listed.contains(id), "{listed}");
    }
    for (id, what) in [("fifo", "not a regular file"), ("dir", "a directory")] {
        for args in [
            vec!["show", id],
            vec!["delete", id, "--wait", "0"],
            vec!["append", id],
        ] {
            assert_refused(&w.run(&args, &one_more("x")), args[0], what);
        }
        assert!(
            w.root.join(id).join("session.sqlite").is_file(),
            "{id} deleted"
        );
    }
    assert_refused(
        &w.run(&["fork", "dep", "--after-turn", "turn-1", "--id", "df"], ""),
        "fork",
        "not a regular file",
    );
    assert!(!w.root.join("df").exists(), "no fork published");
    std::thread::sleep(Duration::from_millis(1100));
    let gc = w.run(&["gc", "--older-than", "1s", "--dry-run"], "");
    assert!(
        stderr(&gc).contains("not a regular file"),
        "{}",
        stderr(&gc)
    );
    w.ok(&["show", "good"], "");
}

#[test]
fn session_folders_and_files_that_are_symlinks_are_refused() {
    let w = World::new();
    w.session("s");
    w.session("t");
    // A session folder outside the root, reached by a symlink in the root.
    let foreign = w.outside.join("foreign");
    std::fs::create_dir_all(&foreign).expect("mkdir");
    std::fs::copy(
        w.root.join("s/session.sqlite"),
        foreign.join("session.sqlite"),
    )
    .expect("copy");
    w.plant(&w.root.join("f"), &foreign);
    let before = w.outside_state();
    for args in [
        &["show", "f"][..],
        &["events", "f"],
        &["append", "f"],
        &["delete", "f"],
        &["fork", "f", "--after-turn", "turn-1", "--id", "ff"],
    ] {
        let out = w.run(args, &one_more("y"));
        assert_refused(
            &out,
            &format!("{args:?}"),
            "is a symlink; sessions are folders of the root",
        );
    }
    // Listed as skipped, naming why (it was passed over in silence), never as a session.
    let listed = w.ok(&["list", "--json"], "");
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("list json");
    assert!(
        !listed["sessions"].to_string().contains("\"f\""),
        "a linked folder is not listed: {listed}"
    );
    let skipped = listed["skipped"].to_string();
    assert!(
        skipped.contains("\"f\"")
            && skipped.contains("a symlink; sessions are folders of the root"),
        "a linked folder is reported as skipped: {listed}"
    );
    for args in [&["list"][..], &["rebuild-catalog"]] {
        let out = w.run(args, "");
        let err = stderr(&out);
        assert!(
            err.contains("skipped session f") && err.contains("a symlink"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        w.outside_state(),
        before,
        "a linked session folder was written"
    );

    // The session file itself, then each of SQLite's files beside it.
    for (name, target) in [
        ("session.sqlite", foreign.join("session.sqlite")),
        ("session.sqlite-wal", w.canary()),
        ("session.sqlite-shm", w.canary()),
        ("session.sqlite-journal", w.canary()),
    ] {
        let w2 = World::new();
        w2.session("t");
        if name == "session.sqlite" {
            std::fs::create_dir_all(w2.outside.join("foreign")).expect("mkdir");
            std::fs::copy(
                w.root.join("s/session.sqlite"),
                w2.outside.join("foreign/session.sqlite"),
            )
            .expect("copy");
        }
        let target = w2
            .outside
            .join(target.strip_prefix(&w.outside).expect("outside"));
        let before = w2.outside_state();
        w2.plant(&w2.root.join("t").join(name), &target);
        for args in [
            &["show", "t"][..],
            &["events", "t"],
            &["append", "t"],
            &["export", "t", w2.base.join("t.out").to_str().expect("utf8")],
            &["verify", "t"],
            &["delete", "t"],
        ] {
            let out = w2.run(args, &one_more("z"));
            assert_refused(&out, &format!("{name}: {args:?}"), "symlink");
        }
        // Listing works; one that reads the session's file reports the refused session by
        // id, naming the symlink. (`list` reads it when its catalog entry is stale: a
        // link planted at `session.sqlite` or its `-wal` makes it so. Planted at `-shm`
        // or `-journal` it leaves the entry as the last writer's close recorded it, and
        // `list` shows that entry without reading the file.)
        let out = w2.run(&["list"], "");
        assert_eq!(code(&out), 0, "{name}: list: {}", stderr(&out));
        let stale = ["session.sqlite", "session.sqlite-wal"].contains(&name);
        for args in [&["list"][..], &["rebuild-catalog"]] {
            if args == ["list"] && !stale {
                continue;
            }
            let err = stderr(&w2.run(args, ""));
            assert!(
                err.contains("skipped session t") && err.contains("symlink"),
                "{name}: {args:?}: {err}"
            );
        }
        assert_eq!(w2.outside_state(), before, "{name}: the outside changed");
        assert!(!w2.base.join("t.out").exists());
    }

    // gc never deletes through a linked folder, and names it.
    std::thread::sleep(Duration::from_millis(1100));
    let out = w.run(&["gc", "--older-than", "1s"], "");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        said.contains("f") && said.contains("a symlink"),
        "gc: {said}"
    );
    assert!(
        std::fs::symlink_metadata(w.root.join("f")).is_ok_and(|m| m.is_symlink()),
        "gc removed the symlink"
    );
    assert_eq!(w.outside_state(), before, "gc changed the linked folder");
}

#[test]
fn session_folders_whose_names_are_not_utf8_are_named_not_passed_over() {
    use std::os::unix::ffi::OsStrExt;
    let w = World::new();
    w.session("s");
    // A copy of a session under a name no command can give: it was left out in silence.
    let odd = w.root.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir(&odd).expect("mkdir");
    std::fs::copy(w.root.join("s/session.sqlite"), odd.join("session.sqlite")).expect("copy");
    for args in [&["list"][..], &["rebuild-catalog"], &["list", "--cwd", "/"]] {
        let out = w.run(args, "");
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("skipped session caf\u{fffd}") && err.contains("name is not UTF-8"),
            "{args:?}: {err}"
        );
    }
    let listed: serde_json::Value =
        serde_json::from_str(&w.ok(&["list", "--json"], "")).expect("list json");
    assert!(
        listed["skipped"].to_string().contains("name is not UTF-8"),
        "{listed}"
    );
    assert_eq!(
        listed["sessions"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    std::thread::sleep(Duration::from_millis(1100));
    let out = w.run(&["gc", "--older-than", "1s"], "");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains("kept caf\u{fffd}") && said.contains("not UTF-8"),
        "gc: {said}"
    );
    assert!(odd.join("session.sqlite").is_file(), "gc removed it");
}

#[test]
fn catalog_files_that_are_symlinks_are_replaced_not_followed() {
    for name in [
        "catalog.sqlite",
        "catalog.sqlite-wal",
        "catalog.sqlite-shm",
        "catalog.sqlite-journal",
    ] {
        // In the catalog's folder: the link is replaced. At the root, where older builds kept
        // the catalog: never followed (and never a session).
        for planted in [Path::new(".catalog").join(name), PathBuf::from(name)] {
            let w = World::new();
            w.session("s");
            let before = w.outside_state();
            w.plant(&w.root.join(&planted), &w.canary());
            let listed = w.ok(&["list", "--json"], "");
            assert!(listed.contains("\"s\""), "{planted:?}: {listed}");
            assert!(!listed.contains(name), "{planted:?}: {listed}");
            w.ok(&["rebuild-catalog"], "");
            w.ok(&["create", "s2"], "");
            assert!(w.ok(&["list"], "").contains("s2"), "{planted:?}");
            assert_eq!(
                w.outside_state(),
                before,
                "{planted:?}: the outside changed"
            );
            if planted.starts_with(".catalog") {
                assert!(
                    !std::fs::symlink_metadata(w.root.join(&planted)).is_ok_and(|m| m.is_symlink()),
                    "{planted:?}: the link is gone"
                );
            }
        }
    }
    // The catalog's folder itself as a symlink to an outside folder.
    let w = World::new();
    w.session("s");
    std::fs::remove_dir_all(w.root.join(".catalog")).expect("remove .catalog");
    let before = w.outside_state();
    w.plant(&w.root.join(".catalog"), &w.outside);
    assert!(w.ok(&["list", "--json"], "").contains("\"s\""));
    w.ok(&["rebuild-catalog"], "");
    assert_eq!(w.outside_state(), before, ".catalog: the outside changed");
    assert!(
        std::fs::symlink_metadata(w.root.join(".catalog")).is_ok_and(|m| m.is_dir()),
        ".catalog is a real folder again"
    );
}

#[test]
fn export_never_follows_or_replaces_a_destination_or_temp_name() {
    let w = World::new();
    w.session("s");
    let out_dir = w.folder("out");
    // A destination that is a symlink to the canary (or dangling, into the outside).
    let linked = out_dir.join("linked.sqlite");
    std::os::unix::fs::symlink(w.canary(), &linked).expect("symlink");
    let dangling = out_dir.join("dangling.sqlite");
    std::os::unix::fs::symlink(w.outside.join("created-by-export"), &dangling).expect("symlink");
    let before = w.outside_state();
    for dest in [&linked, &dangling] {
        let out = w.run(&["export", "s", dest.to_str().expect("utf8")], "");
        assert_eq!(code(&out), 4, "{}: {}", dest.display(), stderr(&out));
    }
    assert_eq!(w.outside_state(), before);
    // A plain export leaves exactly the destination: no temporary file or journal.
    w.ok(
        &[
            "export",
            "s",
            out_dir.join("ok.sqlite").to_str().expect("utf8"),
        ],
        "",
    );
    assert_eq!(
        names(&out_dir),
        ["dangling.sqlite", "linked.sqlite", "ok.sqlite"]
    );
}

#[test]
fn a_root_reached_through_a_symlinked_folder_works() {
    let w = World::new();
    let real = w.folder("real");
    let lp = w.base.join("lp");
    std::os::unix::fs::symlink(&real, &lp).expect("symlink");
    let root = lp.join("sessions");
    let run = |args: &[&str], stdin: &str| {
        let started = Instant::now();
        let out = run_cli(&root, args, stdin);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{args:?} took {:?}",
            started.elapsed()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["create", "s"], "");
    run(&["append", "s"], &turns(2));
    assert!(run(&["show", "s"], "").contains('s'));
    assert!(run(&["list", "--json"], "").contains("\"s\""));
    run(&["fork", "s", "--after-turn", "turn-1", "--id", "f"], "");
    let exported = w.base.join("s.sqlite");
    run(&["export", "s", exported.to_str().expect("utf8")], "");
    run(
        &["import", exported.to_str().expect("utf8"), "--id", "i"],
        "",
    );
    run(&["verify", "f"], "");
    run(&["delete", "s"], "");
    run(&["rebuild-catalog"], "");
    assert!(real.join("sessions/f/session.sqlite").is_file());
    assert!(real.join("sessions/i/session.sqlite").is_file());
    assert!(!real.join("sessions/s").exists());
    // The root given as a symlink itself works too.
    let direct = w.base.join("direct");
    std::os::unix::fs::symlink(real.join("sessions"), &direct).expect("symlink");
    let out = run_cli(&direct, &["show", "f"], "");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn export_to_the_longest_file_name_works() {
    let w = World::new();
    w.session("s");
    let out_dir = w.folder("long");
    for len in [214, 250, 255] {
        let name = format!("{}.sqlite", "n".repeat(len - ".sqlite".len()));
        let dest = out_dir.join(&name);
        w.ok(&["export", "s", dest.to_str().expect("utf8")], "");
        assert!(dest.is_file(), "{len}");
        w.ok(&["verify", dest.to_str().expect("utf8")], "");
    }
    assert_eq!(names(&out_dir).len(), 3, "{:?}", names(&out_dir));
}

#[test]
fn export_destinations_that_are_not_new_files_are_clear_errors() {
    let w = World::new();
    w.session("s");
    // A device: not "already exists", and nothing written to it.
    let out = w.run(&["export", "s", "/dev/full"], "");
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
    // A folder.
    let folder = w.folder("a-folder");
    let out = w.run(&["export", "s", folder.to_str().expect("utf8")], "");
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert!(stderr(&out).contains("a directory"), "{}", stderr(&out));
    assert!(names(&folder).is_empty());
    // A missing folder: not found (3).
    let missing = w.base.join("missing/x.sqlite");
    let out = w.run(&["export", "s", missing.to_str().expect("utf8")], "");
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(!w.base.join("missing").exists());
    // A file where the folder should be, or above it: not a directory (6), naming it, as
    // the docs say (it was exit 1, "stat F/x: Not a directory"); the file untouched.
    let canary = w.canary();
    for (dest, named) in [
        (canary.join("x.sqlite"), "canary is not a directory"),
        (
            canary.join("sub").join("x.sqlite"),
            "canary/sub is not a directory",
        ),
    ] {
        let out = w.run(&["export", "s", dest.to_str().expect("utf8")], "");
        assert_eq!(code(&out), 6, "{}", stderr(&out));
        assert!(stderr(&out).contains(named), "{}", stderr(&out));
    }
    assert_eq!(std::fs::read(&canary).expect("canary"), b"canary bytes\n");
    // An existing file: exists (4), untouched.
    let out = w.run(&["export", "s", w.canary().to_str().expect("utf8")], "");
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert_eq!(
        std::fs::read(w.canary()).expect("canary"),
        b"canary bytes\n"
    );
    // A folder reached through a symlink is the user's choice: followed.
    let linked_folder = w.base.join("linked-folder");
    std::os::unix::fs::symlink(&folder, &linked_folder).expect("symlink");
    w.ok(
        &[
            "export",
            "s",
            linked_folder.join("x.sqlite").to_str().expect("utf8"),
        ],
        "",
    );
    assert_eq!(names(&folder), ["x.sqlite"]);
    // Inside the root (the root itself, a session folder, the store's own folders, also
    // through a symlink to the root): refused (6), nothing written. An export there was a
    // file a later `delete` removed with its session, or one whose name an id then had
    // ("already exists" and "not found" at once).
    std::os::unix::fs::symlink(&w.root, w.base.join("root-link")).expect("symlink");
    w.ok(&["list"], "");
    for dest in [
        w.root.join("x"),
        w.root.join("s").join("backup.sqlite"),
        w.root.join(".staging").join("x.sqlite"),
        w.root.join(".catalog").join("x.sqlite"),
        w.base.join("root-link").join("x"),
    ] {
        let out = w.run(&["export", "s", dest.to_str().expect("utf8")], "");
        assert_eq!(code(&out), 6, "{}: {}", dest.display(), stderr(&out));
        assert!(stderr(&out).contains("inside the root"), "{}", stderr(&out));
        assert!(!dest.exists(), "{}", dest.display());
    }
    w.ok(&["create", "x"], "");
    w.ok(&["verify", "s"], "");
}

#[test]
fn import_and_verify_of_user_files_follow_their_links_refuse_fifos_and_leave_nothing_beside() {
    let w = World::new();
    w.session("s");
    let user = w.folder("user");
    // An export (rollback journal mode) behind a symlink.
    let exported = user.join("export.sqlite");
    w.ok(&["export", "s", exported.to_str().expect("utf8")], "");
    let link = w.base.join("link.sqlite");
    std::os::unix::fs::symlink(&exported, &link).expect("symlink");
    w.ok(&["verify", link.to_str().expect("utf8")], "");
    w.ok(
        &["import", link.to_str().expect("utf8"), "--id", "via-link"],
        "",
    );

    // A WAL-mode session file (a closed session's file, copied).
    let wal_mode = user.join("wal-mode.sqlite");
    std::fs::copy(w.root.join("s/session.sqlite"), &wal_mode).expect("copy");
    let header = std::fs::read(&wal_mode).expect("read");
    assert_eq!(header[18], 2, "the copy is a WAL-mode file");
    let before = tree(&user);
    w.ok(&["verify", wal_mode.to_str().expect("utf8")], "");
    w.ok(
        &[
            "import",
            wal_mode.to_str().expect("utf8"),
            "--id",
            "from-wal",
        ],
        "",
    );
    assert_eq!(
        tree(&user),
        before,
        "nothing created beside the user's files"
    );
    w.ok(&["show", "from-wal"], "");

    // A FIFO: refused at once, not "not found", never opened (nothing blocks).
    let fifo = user.join("fifo.sqlite");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    for args in [
        &["import", fifo.to_str().expect("utf8")][..],
        &["verify", fifo.to_str().expect("utf8")],
    ] {
        let out = w.run(args, "");
        assert_eq!(code(&out), 6, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("not a regular file"),
            "{}",
            stderr(&out)
        );
    }
    // A missing file is not found (3).
    let out = w.run(&["import", user.join("nope").to_str().expect("utf8")], "");
    assert_eq!(code(&out), 3, "{}", stderr(&out));
}

#[test]
fn an_ancestor_folder_that_is_a_symlink_is_refused_before_anything_is_written() {
    let w = World::new();
    w.session("p");
    w.ok(&["fork", "p", "--after-turn", "turn-1", "--id", "c"], "");
    // The ancestor's folder moves outside and a symlink takes its place.
    let moved = w.outside.join("p");
    std::fs::rename(w.root.join("p"), &moved).expect("move");
    w.plant(&w.root.join("p"), &moved);
    let before = w.outside_state();
    for args in [
        &["show", "c"][..],
        &["events", "c"],
        &["history", "c"],
        &["fork", "c", "--after-turn", "turn-1", "--id", "d"],
    ] {
        let started = Instant::now();
        let out = w.run(args, "");
        assert_refused(
            &out,
            &format!("{args:?}"),
            "sessions are folders of the root",
        );
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{args:?} stalled {:?}",
            started.elapsed()
        );
    }
    // Deleting the child touches only its own folder (its row in the ancestor is left:
    // SQLite refuses the path through the link, and a stale row is skipped later).
    w.ok(&["delete", "c"], "");
    assert_eq!(w.outside_state(), before, "the moved ancestor was written");
    assert!(!w.root.join("d").exists() && !w.root.join("c").exists());
}

/// What the bundled SQLite does on its own with a symlinked `-wal`, `-shm` or `-journal`
/// (the store refuses them before SQLite sees them; this pins SQLite's own behaviour):
/// it opens them with `O_NOFOLLOW`, fails, and never writes the file they point to.
#[test]
fn sqlite_itself_never_follows_a_symlinked_sidecar() {
    for (suffix, wal) in [("-wal", true), ("-shm", true), ("-journal", false)] {
        let w = World::new();
        let db = w.folder("db").join("x.sqlite");
        let conn = rusqlite::Connection::open(&db).expect("open");
        let mode = if wal { "WAL" } else { "DELETE" };
        conn.pragma_update(None, "journal_mode", mode)
            .expect("mode");
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .expect("fill");
        drop(conn);
        let before = w.outside_state();
        let side = PathBuf::from(format!("{}{suffix}", db.display()));
        w.plant(&side, &w.canary());
        // Default flags: no SQLITE_OPEN_NOFOLLOW (that flag is about the database path).
        let written =
            rusqlite::Connection::open(&db).and_then(|c| c.execute("INSERT INTO t VALUES (2)", []));
        assert!(written.is_err(), "{suffix}: SQLite wrote through the link");
        assert_eq!(w.outside_state(), before, "{suffix}: the canary changed");
    }
}

#[test]
fn confined_folders_of_the_library_refuse_symlinks() {
    let w = World::new();
    w.session("s");
    let before = w.outside_state();
    w.plant(&w.root.join(".restore-failed"), &w.outside);
    let root = session_store::Root::open(&w.root).expect("root");
    assert!(matches!(
        root.confined_dir(".restore-failed"),
        Err(session_store::Error::InvalidInput { .. })
    ));
    assert!(matches!(
        root.confined_dir("../V"),
        Err(session_store::Error::InvalidInput { .. })
    ));
    let made = root.confined_dir(".scratch").expect("scratch");
    assert!(std::fs::symlink_metadata(&made).expect("lstat").is_dir());
    assert_eq!(w.outside_state(), before);
    // The root's path is resolved once: a root opened through a link reports the real path.
    let link = w.base.join("root-link");
    std::os::unix::fs::symlink(&w.root, &link).expect("symlink");
    let through = session_store::Root::open(&link).expect("root through a link");
    assert_eq!(through.path(), w.root);
}

#[test]
fn a_scratch_folder_is_guarded_while_held_and_removed_when_dropped() {
    let w = World::new();
    let root = session_store::Root::open(&w.root).expect("root");
    let scratch = root.scratch("restore").expect("scratch");
    std::fs::write(scratch.path().join("f"), b"x").expect("write");
    std::os::unix::fs::symlink(&w.outside, scratch.path().join("link")).expect("symlink");
    // Another process opening the root does not take it for an abandoned build.
    w.ok(&["list"], "");
    assert!(
        scratch.path().join("f").is_file(),
        "a held scratch folder stays"
    );
    let before = w.outside_state();
    let path = scratch.path().to_path_buf();
    drop(scratch);
    assert!(!path.exists(), "removed when dropped");
    assert_eq!(w.outside_state(), before);
    assert!(matches!(
        root.scratch("../x"),
        Err(session_store::Error::InvalidInput { .. })
    ));
}

/// A regular file named `.catalog` in a root is the user's: it is never replaced, `list`
/// warns (each time: it is the only sign that every listing now reads each session file)
/// and `rebuild-catalog` refuses (exit 6), both saying what the name is for and to move or
/// remove the file (they said "is not a directory of the root (a symlink or another file);
/// refused" before); once it is moved the catalog is made again.
#[test]
fn a_file_named_catalog_is_kept_and_named_with_what_to_do() {
    let w = World::new();
    w.session("s");
    std::fs::remove_dir_all(w.root.join(".catalog")).expect("remove .catalog");
    std::fs::write(w.root.join(".catalog"), "notes").expect("write");
    let says = format!(
        "{}/.catalog is not a folder: session-store keeps this root's catalog and search index",
        w.root.display()
    );
    let list = w.run(&["list"], "");
    assert_eq!(code(&list), 0, "{}", stderr(&list));
    assert!(String::from_utf8_lossy(&list.stdout).contains('s'));
    assert!(stderr(&list).contains(&says), "{}", stderr(&list));
    assert!(
        stderr(&list).contains("move or remove the file"),
        "{}",
        stderr(&list)
    );
    let rebuild = w.run(&["rebuild-catalog"], "");
    assert_eq!(code(&rebuild), 6, "{}", stderr(&rebuild));
    assert!(stderr(&rebuild).contains(&says), "{}", stderr(&rebuild));
    assert_eq!(
        std::fs::read_to_string(w.root.join(".catalog")).expect("read"),
        "notes"
    );
    std::fs::rename(w.root.join(".catalog"), w.outside.join("notes")).expect("move");
    let list = w.run(&["list"], "");
    assert_eq!(stderr(&list), "");
    assert!(w.root.join(".catalog").is_dir());
}

/// What is named like a session and is none of the root's, a symlink to a folder (a
/// session folder of the root, one outside it) and a session folder whose name is UTF-8 but no valid id
/// (`has:colon`, ` lead`), is reported once, on `list`'s first page whatever its page
/// size (`has:colon` was passed over in silence, a symlink reported only on the page its
/// name falls in, or never when that page was cut short), by `rebuild-catalog`, and by
/// `gc` as kept (a symlink was a failure, exit 1). A later page reports none of them.
/// Each entry is named by its path, under its name as it is (`has:colon`; it was
/// `has\u{fffd}colon`, a name that exists nowhere). A
/// dangling symlink is no more a session than a file is: not reported.
#[test]
fn entries_named_like_sessions_that_are_none_are_skipped_once_and_kept_by_gc() {
    let w = World::new();
    for id in ["a", "b", "c"] {
        w.session(id);
    }
    std::os::unix::fs::symlink(w.root.join("a"), w.root.join("linked")).expect("symlink");
    std::fs::create_dir(w.base.join("elsewhere")).expect("mkdir");
    std::os::unix::fs::symlink(w.base.join("elsewhere"), w.root.join("away")).expect("symlink");
    std::os::unix::fs::symlink(w.base.join("nowhere"), w.root.join("dangling")).expect("symlink");
    for name in ["has:colon", " lead"] {
        std::fs::create_dir(w.root.join(name)).expect("mkdir");
        std::fs::copy(
            w.root.join("a/session.sqlite"),
            w.root.join(name).join("session.sqlite"),
        )
        .expect("copy");
    }
    // In name order.
    let expected = [
        (
            " lead",
            "lead is not a session: invalid session id \" lead\"",
        ),
        (
            "away",
            "away is a symlink; sessions are folders of the root",
        ),
        (
            "has:colon",
            "has:colon is not a session: invalid session id \"has:colon\": contains ':'",
        ),
        (
            "linked",
            "linked is a symlink; sessions are folders of the root",
        ),
    ];
    let first: serde_json::Value =
        serde_json::from_str(&w.ok(&["list", "--json", "--limit", "1"], "")).expect("json");
    let skipped = first["skipped"].as_array().expect("skipped");
    assert_eq!(skipped.len(), expected.len(), "{first}");
    for (s, (id, why)) in skipped.iter().zip(expected) {
        assert_eq!(s["session_id"], id, "{first}");
        assert!(s["error"].as_str().is_some_and(|e| e.contains(why)), "{s}");
    }
    let mut cursor = first["next_cursor"].as_str().map(str::to_owned);
    while let Some(c) = cursor {
        let page: serde_json::Value =
            serde_json::from_str(&w.ok(&["list", "--json", "--limit", "1", "--cursor", &c], ""))
                .expect("json");
        assert_eq!(page["skipped"], serde_json::json!([]), "{page}");
        cursor = page["next_cursor"].as_str().map(str::to_owned);
    }
    for args in [
        &["list"][..],
        &["list", "--title", "x"],
        &["rebuild-catalog"],
    ] {
        let out = w.run(args, "");
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        for (id, _) in expected {
            assert_eq!(
                err.matches(&format!("skipped session {id}: ")).count(),
                1,
                "{args:?}: {err}"
            );
        }
    }
    std::thread::sleep(Duration::from_millis(1100));
    let out = w.run(&["--json", "gc", "--older-than", "1s", "--dry-run"], "");
    assert_eq!(code(&out), 0, "gc: {}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("gc json");
    assert_eq!(report["failed"], serde_json::json!([]), "{report}");
    let kept: Vec<&str> = report["kept"]
        .as_array()
        .expect("kept")
        .iter()
        .filter_map(|k| k["session_id"].as_str())
        .collect();
    assert_eq!(kept, expected.map(|(id, _)| id), "{report}");
}

/// A session folder whose `session.sqlite` is a symlink (to a real session file elsewhere,
/// or dangling), a folder or a FIFO is kept by `gc`, saying why as `list` does ("is a
/// symlink; refused"), and the run succeeds: gc reported the first as a failure with
/// SQLite's "unable to open database file" (exit 1 on every run, also when not dry) and
/// passed over the others in silence.
#[test]
fn gc_keeps_a_session_file_every_command_refuses_saying_why() {
    let w = World::new();
    w.session("ok");
    let away = w.folder("away");
    run_cli(&away, &["create", "ext"], "");
    let plant = |name: &str| {
        let dir = w.root.join(name);
        std::fs::create_dir(&dir).expect("mkdir");
        dir.join("session.sqlite")
    };
    std::os::unix::fs::symlink(away.join("ext/session.sqlite"), plant("evil")).expect("symlink");
    std::os::unix::fs::symlink(w.base.join("nowhere"), plant("lnk")).expect("symlink");
    std::fs::create_dir(plant("dirf")).expect("mkdir");
    let fifo = Command::new("mkfifo")
        .arg(plant("fifo"))
        .status()
        .expect("mkfifo");
    assert!(fifo.success());
    std::thread::sleep(Duration::from_millis(1100));
    for dry in [true, false] {
        let mut args = vec!["--json", "gc", "--older-than", "1s"];
        if dry {
            args.push("--dry-run");
        }
        let out = w.run(&args, "");
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(report["failed"], serde_json::json!([]), "{report}");
        let kept: BTreeMap<&str, &str> = report["kept"]
            .as_array()
            .expect("kept")
            .iter()
            .map(|k| {
                let reason = k["reason"].as_str().expect("reason");
                (k["session_id"].as_str().expect("id"), reason)
            })
            .collect();
        for (id, why) in [
            ("evil", "is a symlink; refused"),
            ("lnk", "is a symlink; refused"),
            ("dirf", "is a directory; refused"),
            ("fifo", "is a pipe, not a regular file; refused"),
        ] {
            assert!(
                kept.get(id).is_some_and(|r| r.contains(why)),
                "{id}: {report}"
            );
            assert!(w.root.join(id).exists(), "{id} was deleted");
        }
    }
    assert!(
        away.join("ext/session.sqlite").is_file(),
        "the target was touched"
    );
}

/// A writer's owner record in `writer.lock` is synced once its open wrote it, before the
/// writer commits a batch: after a power cut it is how searches learn that a writer may
/// have died with commits the search index lacks, and unsynced it could be lost while those
/// commits survive (outside testing, power loss: they were found by no search until a
/// rebuild). Skipped without `strace`.
#[test]
fn a_writers_owner_record_is_synced_before_its_first_commit() {
    let w = World::new();
    w.ok(&["create", "s"], "");
    let probe = Command::new("strace").arg("-V").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "strace is missing: .ci/run installs it"
        );
        eprintln!("skipped: no strace");
        return;
    }
    let trace = w.base.join("sync-trace.txt");
    let mut child = Command::new("strace")
        .args(["-f", "-y", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&trace)
        .arg(env!("CARGO_BIN_EXE_session-store"))
        .arg("--root")
        .arg(&w.root)
        .args(["append", "s", "--sync", "each"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strace");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(turns(1).as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&trace).expect("trace");
    let syncs: Vec<&str> = text.lines().filter(|l| l.contains("sync(")).collect();
    // The writer's open syncs the file as it takes its lease; the batch's commit comes after
    // the record.
    let record = syncs
        .iter()
        .position(|l| l.contains("/writer.lock>"))
        .unwrap_or_else(|| panic!("no sync of writer.lock: {text}"));
    assert!(
        syncs[record..]
            .iter()
            .any(|l| l.contains("/session.sqlite-wal>")),
        "{text}"
    );
}

/// `list`, a filtered `list` and `gc` read the root folder once (`strace` counts the
/// opens of the folder for reading its entries, as `std::fs::read_dir` opens it): they
/// read it twice, once for the session ids and once for the names that are not UTF-8.
/// Skipped without `strace`.
#[test]
fn list_and_gc_read_the_root_folder_once() {
    let w = World::new();
    w.session("a");
    let probe = Command::new("strace").arg("-V").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: no strace");
        return;
    }
    let trace = w.base.join("trace.txt");
    let root = w.root.to_str().expect("utf-8");
    for args in [
        &["list"][..],
        &["list", "--title", "x"],
        &["gc", "--older-than", "1h", "--dry-run"],
    ] {
        let out = Command::new("strace")
            .args(["-f", "-e", "trace=openat", "-o"])
            .arg(&trace)
            .arg(env!("CARGO_BIN_EXE_session-store"))
            .args(["--root", root])
            .args(args)
            .output()
            .expect("strace");
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = std::fs::read_to_string(&trace).expect("trace");
        let reads = text
            .lines()
            .filter(|l| {
                l.contains(&format!(
                    "\"{root}\", O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_DIRECTORY"
                ))
            })
            .count();
        assert_eq!(reads, 1, "{args:?}: {text}");
    }
}
