//! The Python package (`python/`, issue 15): runs its pytest suite (`python/tests/`) as part
//! of `cargo test`.
//!
//! A virtual environment under `target/python-venv` is created on first use with
//! `python3 -m venv` and gets maturin, pytest, openai-agents, LangGraph, its SQLite
//! checkpointer, its checkpointer conformance suite (`langgraph-checkpoint-conformance`) and
//! mypy from PyPI; the package is built and installed with `pip install ./python` (maturin as the
//! PEP 517 backend, no build isolation, the wheel's Rust build in this target folder), and
//! re-installed only when a source it is built from changed (`python/`, `src/`, `Cargo.toml`,
//! `Cargo.lock`: a SHA-256 of them is kept in the venv). A current venv needs no network.
//! Then pytest runs and this test fails with its output when pytest fails; the pytest summary
//! and the LangGraph conformance report (`passed/total`) are printed to stderr.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

/// What the venv gets from PyPI besides the package. Changing it rebuilds the venv.
const REQUIREMENTS: &[&str] = &[
    "maturin>=1.7,<2",
    "pytest>=7",
    "openai-agents>=0.2",
    "langgraph>=1",
    "langgraph-checkpoint>=4",
    "langgraph-checkpoint-sqlite>=3",
    "langgraph-checkpoint-conformance>=0.0.2",
    "mypy>=1.10",
];

/// What the line of `python/tests/test_langgraph_conformance.py` reporting the LangGraph
/// checkpointer conformance suite's `passed/total` starts with.
const CONFORMANCE: &str = "langgraph checkpoint conformance:";

/// The repository root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The cargo target folder these tests were built in (`<target>/tmp` is
/// `CARGO_TARGET_TMPDIR`).
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent()
        .map_or_else(|| repo().join("target"), Path::to_path_buf)
}

/// Runs `cmd` with the variables cargo sets for a test binary removed (so a nested
/// `cargo build` by maturin sees a plain environment), returning its output.
fn run(cmd: &mut Command) -> Output {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
            || key.starts_with("CARGO_BIN_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
            ]
            .contains(&key.as_ref())
        {
            cmd.env_remove(key.as_ref());
        }
    }
    match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!("could not run {cmd:?}: {e}"),
    }
}

/// Panics with `what`, the command and its output unless it succeeded.
fn check(what: &str, cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{what} failed ({}): {cmd:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// SHA-256 over the relative paths and contents of the files the wheel is built from.
fn source_digest() -> String {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if [".pytest_cache", "__pycache__", "target", "tests"]
                .iter()
                .any(|skip| name == OsStr::new(skip))
            {
                continue;
            }
            if path.is_dir() {
                walk(&path, files);
            } else {
                files.push(path);
            }
        }
    }
    let mut files = vec![repo().join("Cargo.toml"), repo().join("Cargo.lock")];
    walk(&repo().join("src"), &mut files);
    walk(&repo().join("python"), &mut files);
    files.sort();
    let mut hash = Sha256::new();
    for file in files {
        let rel = file.strip_prefix(repo()).unwrap_or(&file);
        hash.update(rel.to_string_lossy().as_bytes());
        hash.update([0]);
        hash.update(fs::read(&file).unwrap_or_default());
        hash.update([0]);
    }
    hex::encode(hash.finalize())
}

/// The venv's python, after creating the venv and installing the tools when they are not
/// there (or were installed for other requirements).
fn venv_with_tools(venv: &Path) -> PathBuf {
    let python = venv.join("bin").join("python");
    let stamp = venv.join(".session-store-tools");
    let wanted = REQUIREMENTS.join("\n");
    if python.is_file() && fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return python;
    }
    let version = Command::new("python3").arg("--version").output();
    match version {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "python3 --version failed ({}): the Python tests need CPython >= 3.10 as `python3` on PATH",
            out.status
        ),
        Err(e) => panic!(
            "python3 not found ({e}): the Python tests need CPython >= 3.10 as `python3` on PATH \
             (Debian: apt-get install python3 python3-venv)"
        ),
    }
    let started = std::time::Instant::now();
    if venv.exists() {
        fs::remove_dir_all(venv).expect("remove the old venv");
    }
    check(
        "creating the venv (Debian needs python3-venv)",
        Command::new("python3").arg("-m").arg("venv").arg(venv),
    );
    check(
        "pip install of the test tools",
        Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(REQUIREMENTS),
    );
    fs::write(&stamp, &wanted).expect("write the tools stamp");
    let _ = writeln!(
        std::io::stderr(),
        "python venv {} set up in {:.1} s",
        venv.display(),
        started.elapsed().as_secs_f64()
    );
    python
}

/// `PATH` with the venv's `bin` first (maturin's PEP 517 hooks run `maturin` from `PATH`).
fn venv_path(venv: &Path) -> std::ffi::OsString {
    let mut dirs = vec![venv.join("bin")];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).expect("PATH entries without separators")
}

/// Builds and installs the package unless the installed one was built from these sources.
fn install_package(venv: &Path, python: &Path) {
    let stamp = venv.join(".session-store-package");
    let digest = source_digest();
    if fs::read_to_string(&stamp).is_ok_and(|s| s == digest) {
        return;
    }
    let _ = fs::remove_file(&stamp);
    let started = std::time::Instant::now();
    check(
        "pip install ./python",
        Command::new(python)
            .current_dir(repo())
            .env("CARGO_TARGET_DIR", target_dir())
            .env("PATH", venv_path(venv))
            .env("VIRTUAL_ENV", venv)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-build-isolation",
                "--no-deps",
                "--force-reinstall",
                "./python",
            ]),
    );
    fs::write(&stamp, &digest).expect("write the package stamp");
    let _ = writeln!(
        std::io::stderr(),
        "session-store wheel built and installed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn pytest_suite_passes() {
    let venv = target_dir().join("python-venv");
    let python = venv_with_tools(&venv);
    install_package(&venv, &python);
    // From python/tests, so `python/session_store` (the sources, without the native
    // module) is not on sys.path: the installed package is. As `python -m pytest`, not the
    // venv's `pytest` script: a script's shebang names the python of the folder the venv
    // was made in, so in a copied target dir (a worktree seeded with `cp -a`) it ran the
    // other checkout's installed package.
    let out = run(Command::new(&python)
        .current_dir(repo().join("python").join("tests"))
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "error::pytest.PytestUnraisableExceptionWarning",
        ])
        .env("PATH", venv_path(&venv))
        .env("VIRTUAL_ENV", &venv)
        .env("PYTHONDONTWRITEBYTECODE", "1"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "pytest failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.contains(" passed"), "pytest ran no test:\n{stdout}");
    let conformance = stdout
        .lines()
        .find(|line| line.starts_with(CONFORMANCE))
        .unwrap_or_else(|| panic!("no LangGraph conformance report in pytest's output:\n{stdout}"));
    // Straight to stderr, past the test harness's capture: the counts show in CI's log.
    let _ = writeln!(std::io::stderr(), "python tests (pytest): {summary}");
    let _ = writeln!(std::io::stderr(), "{conformance}");
}

/// The extension's dependencies hold no `parking_lot_core`. It keeps every waiting thread
/// in one process-wide table of wait queues, linked through that thread's own memory, and
/// r2d2's housekeeping thread (the read pools') waited there for good: a child made by
/// `os.fork()` inherited the table without the thread, and once it started a thread of its
/// own the C library freed that memory and handed it out again, so the child's next wait or
/// wake-up there followed garbage (a segmentation fault of the child in about 1 of 40 runs
/// of `test_a_forked_child_works_and_leaves_the_parents_writer_alone`, whose child's read
/// pools are made after the fork). The read pools are on std's `Mutex` and `Condvar` now.
#[test]
fn the_extension_has_no_process_wide_wait_queue() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = run(Command::new(cargo)
        .current_dir(repo().join("python"))
        // Not `--offline`: on a machine whose Cargo cache has not fetched the extension's
        // dependencies yet (a fresh one, before the venv's build), it answered "no matching
        // package named `pyo3` found" instead of the tree. `--locked` keeps the lock file's.
        .args(["tree", "--locked", "-e", "normal"])
        .args(["--invert", "parking_lot_core"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("did not match any packages"),
        "the Python extension depends on parking_lot_core ({}):\n{}\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}
