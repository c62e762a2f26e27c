//! The CLI uses only the library (issue 13): what `restore`, `bench` and `show` needed from
//! raw SQLite and from re-declared names is library API now, and each piece is tested here
//! on real files and real processes: the restore staging (`Root::scratch` with
//! `Scratch::session_file`, `staged_ancestors`, `publish_session`) survives concurrent
//! `Root::open`s in other processes and threads and publishes, a SIGKILLed restore's
//! staging is removed by the next open, `catalog_session_ids` reads a catalog and refuses
//! other files, `Root::set_aside` moves a session out of the namespace, the raw baselines
//! of `session_store::baseline` write what they are given, and `src/cli` and `src/bin`
//! hold no SQL and no re-declared layout name.

mod common;

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use session_store::baseline::{RawTable, raw_rate, sqlite_session_bytes};
use session_store::format::{CATALOG_DIR, CATALOG_FILE, SESSION_FILE, WAL_FILE};
use session_store::{
    Durability, Error, ForkPoint, Root, catalog_sequences, catalog_session_ids, replay_file,
    verify_file,
};

/// The staging folder of a root (the library's name for it is private on purpose).
const STAGING: &str = ".staging";

/// `session-store --json --root ROOT list` (it opens the root), not yet started.
fn list_command(root: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_session-store"));
    cmd.arg("--json").arg("--root").arg(root).arg("list");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The stdout of a `session-store` run that must have succeeded.
fn succeeded(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A closed source root (its own temp dir) holding `alpha` (two turns) and `alpha-fork`
/// (forked after the first, then one turn of its own): the session files a restore
/// copies from a replica.
fn source() -> (tempfile::TempDir, Root) {
    let (dir, root) = temp_root();
    let alpha = create(&root, "alpha");
    alpha.append(turn("a1", "turn-1", "m-a1")).expect("append");
    alpha.append(turn("a2", "turn-2", "m-a2")).expect("append");
    alpha.close().expect("close");
    root.fork(
        &id("alpha"),
        ForkPoint::AfterTurn("turn-1".into()),
        Some(id("alpha-fork")),
    )
    .expect("fork");
    let fork = root.open_writer(&id("alpha-fork")).expect("writer");
    fork.append(turn("f1", "turn-f1", "m-f1")).expect("append");
    fork.close().expect("close");
    (dir, root)
}

/// Copies the closed session `name` of `root` to the session file `to`, with its `-wal`
/// when it has one (a fork records its dependents row in the parent's WAL).
fn copy_session(root: &Root, name: &str, to: &Path) {
    let file = root.session_dir(&id(name)).join(SESSION_FILE);
    std::fs::copy(&file, to).expect("copy");
    let wal = file.with_file_name(WAL_FILE);
    if wal.exists() {
        std::fs::copy(&wal, to.with_file_name(WAL_FILE)).expect("copy -wal");
    }
}

/// The folders and files in the root's `.staging/`.
fn staging_entries(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join(STAGING))
        .map(|d| {
            d.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Every commit of a session (folder or file), as JSON, for comparisons.
fn commits(path: &Path) -> serde_json::Value {
    serde_json::to_value(replay_file(path).expect("replay").commits).expect("json")
}

#[test]
fn restore_staging_survives_concurrent_opens_and_publishes() {
    let (_src_dir, src) = source();
    let work = tempfile::tempdir().expect("tempdir");
    let target_dir = work.path().join("target");
    let target = Root::open(&target_dir).expect("root");

    // Lay out both sessions as `restore` does with Litestream's output.
    let staging = target.scratch("restore").expect("scratch");
    for name in ["alpha-fork", "alpha"] {
        let file = staging.session_file(&id(name)).expect("session file");
        copy_session(&src, name, &file);
    }
    let staged = staging.path().to_path_buf();
    assert!(
        staged.starts_with(target.path().join(STAGING)),
        "{staged:?}"
    );

    // Other processes (`list` opens the root) and threads open the root meanwhile.
    let lists: Vec<_> = (0..3)
        .map(|_| list_command(&target_dir).spawn().expect("spawn list"))
        .collect();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..10 {
                    Root::open(&target_dir).expect("concurrent open");
                }
            });
        }
    });
    for list in lists {
        succeeded(list.wait_with_output().expect("wait for list"));
    }
    for name in ["alpha", "alpha-fork"] {
        assert!(
            staged.join(name).join(SESSION_FILE).is_file(),
            "{name} still staged after the concurrent opens"
        );
    }

    // What each staged session inherits from, then publication ancestors first.
    assert_eq!(
        staging
            .staged_ancestors(&id("alpha-fork"))
            .expect("lineage"),
        [id("alpha")]
    );
    assert!(
        staging
            .staged_ancestors(&id("alpha"))
            .expect("lineage")
            .is_empty()
    );
    assert!(matches!(
        staging.staged_ancestors(&id("beta")),
        Err(Error::SessionNotFound { .. })
    ));
    for name in ["alpha", "alpha-fork"] {
        staging.publish_session(&id(name)).expect("publish");
        let dir = target.session_dir(&id(name));
        verify_file(&dir).expect("verify");
        assert_eq!(
            commits(&dir),
            commits(&src.session_dir(&id(name))),
            "{name} reads as its source"
        );
    }
    // The catalog was told: a fresh process lists both.
    let listed = succeeded(list_command(&target_dir).output().expect("list"));
    assert!(
        listed.contains("\"alpha\"") && listed.contains("\"alpha-fork\""),
        "{listed}"
    );

    // Publishing never replaces a session: the copy stays staged.
    let again = staging.session_file(&id("alpha")).expect("session file");
    copy_session(&src, "alpha", &again);
    assert!(matches!(
        staging.publish_session(&id("alpha")),
        Err(Error::SessionExists { .. })
    ));
    assert!(again.is_file());
    // A restored session is writable.
    let writer = target.open_writer(&id("alpha-fork")).expect("writer");
    writer
        .append(turn("f2", "turn-f2", "m-f2"))
        .expect("append");
    writer.close().expect("close");

    drop(staging);
    assert_eq!(
        staging_entries(target.path()),
        Vec::<String>::new(),
        "the staging folder and its guard are gone once dropped"
    );
}

/// Child role: stages a restore of the session `alpha` of the root `SS_SOURCE` into the
/// root `SS_ROOT`, prints its staging folder, then waits to be killed.
#[test]
#[ignore = "child process role, run by a_killed_restore_leaves_staging_the_next_open_removes"]
fn staging_restore_role() {
    let (Ok(root), Ok(source)) = (std::env::var("SS_ROOT"), std::env::var("SS_SOURCE")) else {
        return; // run by hand without a parent: nothing to do
    };
    let root = Root::open(root).expect("root");
    let staging = root.scratch("restore").expect("scratch");
    let file = staging.session_file(&id("alpha")).expect("file");
    copy_session(&Root::open(source).expect("source"), "alpha", &file);
    println!("staged {}", staging.path().display());
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A child process, SIGKILLed when dropped (also when the test fails before its kill).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_restore_leaves_staging_the_next_open_removes() {
    let (_src_dir, src) = source();
    let work = tempfile::tempdir().expect("tempdir");
    let target_dir = work.path().join("target");
    Root::open(&target_dir).expect("root");
    let mut child = Killed(spawn_role(
        "staging_restore_role",
        &[
            ("SS_ROOT", target_dir.to_str().expect("utf-8")),
            ("SS_SOURCE", src.path().to_str().expect("utf-8")),
        ],
    ));
    let mut out = BufReader::new(child.0.stdout.take().expect("stdout"));
    let staged = PathBuf::from(read_until(&mut out, "staged "));
    assert!(staged.join("alpha").join(SESSION_FILE).is_file());

    // While the restoring process lives, opens elsewhere leave its staging alone.
    succeeded(list_command(&target_dir).output().expect("list"));
    Root::open(&target_dir).expect("open");
    assert!(staged.join("alpha").join(SESSION_FILE).is_file());

    // SIGKILL: no clean-up runs in the child; the kernel drops its guard.
    drop(child);
    assert!(staged.is_dir(), "nothing removed it yet");
    let root = Root::open(&target_dir).expect("open after the crash");
    assert!(!staged.exists(), "the crashed restore's staging is removed");
    assert_eq!(staging_entries(root.path()), Vec::<String>::new());
    assert!(
        root.list_ids().expect("ids").is_empty(),
        "nothing published"
    );
}

#[test]
fn catalog_session_ids_reads_a_catalog_and_refuses_other_files() {
    let (_dir, root) = temp_root();
    for name in ["b", "a.catalog", "c"] {
        create(&root, name).close().expect("close");
    }
    let b = root.open_writer(&id("b")).expect("open b");
    b.append(turn("b-1", "t1", "m1")).expect("append");
    b.close().expect("close");
    // Listing fills the catalog (its rows may still be in its -wal: read where it lives).
    assert_eq!(root.list(None, 10).expect("list").entries.len(), 3);
    let catalog = root.path().join(CATALOG_DIR).join(CATALOG_FILE);
    assert_eq!(
        catalog_session_ids(&catalog).expect("ids"),
        [id("a.catalog"), id("b"), id("c")]
    );
    // With each entry's durable sequence (what `restore --all` compares a restored copy
    // with).
    assert_eq!(
        catalog_sequences(&catalog).expect("sequences"),
        [
            (id("a.catalog"), Some(0)),
            (id("b"), Some(3)),
            (id("c"), Some(0))
        ]
    );
    let listed: Vec<_> = std::fs::read_dir(root.path().join(CATALOG_DIR))
        .expect("read")
        .collect();

    // A session file is not a catalog; a missing file and a symlink are refused.
    let session = root.session_dir(&id("b")).join(SESSION_FILE);
    assert!(matches!(
        catalog_session_ids(&session),
        Err(Error::Corrupt { .. })
    ));
    let missing = root.path().join("nothing.sqlite");
    assert!(matches!(
        catalog_session_ids(&missing),
        Err(Error::SessionNotFound { .. })
    ));
    let link = root.path().join(".link.sqlite");
    std::os::unix::fs::symlink(&catalog, &link).expect("symlink");
    assert!(matches!(
        catalog_session_ids(&link),
        Err(Error::InvalidInput { .. })
    ));
    // Reading created nothing beside the catalog.
    let after: Vec<_> = std::fs::read_dir(root.path().join(CATALOG_DIR))
        .expect("read")
        .collect();
    assert_eq!(after.len(), listed.len());
}

/// `Root::session_file_identity`, which the CLI's reads (`show`, `history`, the server's
/// pages) use to tell a session deleted while read from damage (the CLI had a copy of the
/// library's private `file_identity`): the same file answers the same, another session's
/// file or a missing one not.
#[test]
fn session_file_identity_tells_files_apart() {
    let (_dir, root) = temp_root();
    for name in ["a", "b"] {
        let s = create(&root, name);
        s.append(turn(name, "turn-1", &format!("m-{name}")))
            .expect("append");
        s.close().expect("close");
    }
    let a = root.session_file_identity(&id("a")).expect("a's file");
    assert_eq!(root.session_file_identity(&id("a")), Some(a));
    assert_ne!(root.session_file_identity(&id("b")), Some(a));
    assert_eq!(root.session_file_identity(&id("missing")), None);
    root.delete(&id("a"), &session_store::CancelToken::new())
        .expect("delete");
    assert_eq!(root.session_file_identity(&id("a")), None);
}

#[test]
fn set_aside_moves_a_session_out_of_the_namespace() {
    let (_dir, root) = temp_root();
    let s = create(&root, "bad");
    s.append(turn("b1", "turn-1", "m-b1")).expect("append");
    s.close().expect("close");
    let before = commits(&root.session_dir(&id("bad")));

    // Refused: a name that is not a dot-folder, a session owned by a writer, a symlink.
    for folder in ["plain", ".", "..", ".a/b", ""] {
        assert!(
            matches!(
                root.set_aside(&id("bad"), folder),
                Err(Error::InvalidInput { .. })
            ),
            "{folder:?}"
        );
    }
    let writer = root.open_writer(&id("bad")).expect("writer");
    assert!(matches!(
        root.set_aside(&id("bad"), ".restore-failed"),
        Err(Error::WriterOwned { .. })
    ));
    writer.close().expect("close");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(elsewhere.path(), root.path().join(".evil")).expect("symlink");
    let refused = root.set_aside(&id("bad"), ".evil");
    assert!(
        matches!(refused, Err(Error::InvalidInput { .. })),
        "{refused:?}"
    );
    assert_eq!(
        std::fs::read_dir(elsewhere.path()).expect("read").count(),
        0
    );
    assert!(root.list_ids().expect("ids").contains(&id("bad")));

    let aside = root
        .set_aside(&id("bad"), ".restore-failed")
        .expect("set aside");
    assert!(
        aside.starts_with(root.path().join(".restore-failed")),
        "{aside:?}"
    );
    assert!(aside.ends_with("bad"), "{aside:?}");
    assert_eq!(commits(&aside), before, "the copy is kept whole");
    assert!(root.list_ids().expect("ids").is_empty());
    assert!(root.list(None, 10).expect("list").entries.is_empty());
    assert!(matches!(
        root.open_reader(&id("bad")),
        Err(Error::SessionNotFound { .. })
    ));
    assert!(matches!(
        root.set_aside(&id("bad"), ".restore-failed"),
        Err(Error::SessionNotFound { .. })
    ));
    // The id is free again; a second copy goes beside the first.
    create(&root, "bad").close().expect("close");
    let second = root
        .set_aside(&id("bad"), ".restore-failed")
        .expect("set aside");
    assert_ne!(second, aside);
    assert!(aside.join(SESSION_FILE).is_file() && second.join(SESSION_FILE).is_file());
}

/// Rows of `table` in the SQLite file `file` (the test reads the baselines' files
/// directly: they are plain tables, not session files).
fn rows(file: &Path, table: &str) -> i64 {
    rusqlite::Connection::open(file)
        .expect("open")
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .expect("count")
}

#[test]
fn baselines_write_what_they_are_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let payloads: Vec<String> = (0..10).map(|i| format!(r#"{{"n":{i}}}"#)).collect();

    let file = dir.path().join("raw.sqlite");
    let mut table = RawTable::create(&file, Durability::ProcessCrash).expect("create");
    table.insert(&payloads, 3).expect("insert");
    table.insert(&payloads[..2], 0).expect("a batch of 0 is 1");
    drop(table);
    assert_eq!(rows(&file, "events"), 12);
    assert!(
        RawTable::create(&file, Durability::PowerLoss).is_err(),
        "an existing table is refused"
    );
    assert_eq!(rows(&file, "events"), 12, "and left as it was");

    let timed = dir.path().join("rate.sqlite");
    let rate = raw_rate(&timed, &payloads, 4, Durability::PowerLoss, 6).expect("rate");
    assert!(rate > 0.0);
    assert_eq!(rows(&timed, "events"), 10, "warm-up rows are written too");

    let peer = dir.path().join("peer.sqlite");
    let bytes = sqlite_session_bytes(&peer, &payloads).expect("peer");
    assert_eq!(rows(&peer, "agent_messages"), 10);
    assert_eq!(rows(&peer, "agent_sessions"), 1);
    let wal = dir.path().join("peer.sqlite-wal");
    let on_disk = std::fs::metadata(&peer).expect("stat").len()
        + std::fs::metadata(&wal).map_or(0, |m| m.len());
    assert!(bytes > 0 && bytes <= on_disk, "{bytes} vs {on_disk}");
}

/// The acceptance line of issue 13: no raw SQLite (nor the name of its crate) in the
/// command line's sources, and no layout name of the store re-declared there.
#[test]
fn cli_sources_hold_no_raw_sqlite_and_no_layout_names() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for dir in ["cli", "bin"] {
        for entry in std::fs::read_dir(src.join(dir)).expect("read") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 5, "{files:?}");
    let forbidden = [
        "rusqlite",
        "Connection::open",
        "const SESSION_FILE",
        "const CATALOG_FILE",
        "const STAGING_DIR",
        "= \"session.sqlite\"",
        "= \"catalog.sqlite\"",
        "= \".staging\"",
        "= \".catalog\"",
        "[\"session.sqlite\"",
        "fn rename_no_replace",
        "renameat",
    ];
    for file in files {
        let source = std::fs::read_to_string(&file).expect("read");
        for word in forbidden {
            assert!(
                !source.contains(word),
                "{} contains {word:?}",
                file.display()
            );
        }
    }
}
