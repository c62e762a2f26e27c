//! Every program in `examples/` runs and ends with its success line: the examples are
//! built (`cargo build --examples` in the profile of this test binary, a no-op after
//! `cargo test`, which builds them) and run as child processes, each in its own
//! temporary folder. `replicated_root` may report that it is skipped when no `litestream`
//! is found (`.ci/run` puts one on PATH).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>`: this test binary lives in its `deps/` folder.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// Builds the examples in this test's profile (so `cargo test --test examples` alone
/// runs current ones); cargo does nothing when they are up to date.
fn build_examples() {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        let profile = profile_dir();
        let name = profile
            .file_name()
            .and_then(|n| n.to_str())
            .expect("profile name");
        let profile = if name == "debug" { "dev" } else { name };
        let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--examples", "--profile", profile])
            .output()
            .expect("run cargo build --examples");
        assert!(
            out.status.success(),
            "cargo build --examples: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// Runs the example `name` (at most a minute) and returns its output, asserting exit 0.
fn run_example(name: &str) -> String {
    build_examples();
    let bin = profile_dir().join("examples").join(name);
    let mut child = Command::new(&bin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{name} did not finish within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    assert!(
        status.success(),
        "{name} exited with {status}\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&stderr)
    );
    print!("{stdout}");
    stdout
}

/// Asserts that `stdout` has a line equal to `line`.
fn has_line(stdout: &str, line: &str) {
    assert!(
        stdout.lines().any(|l| l == line),
        "no line {line:?} in:\n{stdout}"
    );
}

#[test]
fn service_host_runs() {
    let out = run_example("service_host");
    has_line(&out, "late tool result refused (stale execution)");
    has_line(
        &out,
        "reopened after the crash: turn status interrupted, phase Idle",
    );
    has_line(&out, "list, 2 per page: build-bot, notes, release");
    has_line(&out, "service_host: ok");
}

#[test]
fn fork_and_rewind_runs() {
    let out = run_example("fork_and_rewind");
    has_line(
        &out,
        "fork after turn-1: q-turn-1, a-turn-1, q-turn-2b, a-turn-2b",
    );
    has_line(
        &out,
        "trip-planning-porto inherits events 1..=4 of trip-planning",
    );
    has_line(&out, "fork_and_rewind: ok");
}

#[test]
fn export_import_runs() {
    let out = run_example("export_import");
    has_line(&out, "imported as debug-build-2: q-turn-1, tool-turn-1");
    has_line(&out, "second import refused: debug-build-2 exists");
    has_line(&out, "export_import: ok");
}

#[test]
fn replicated_root_runs_or_says_it_is_skipped() {
    let out = run_example("replicated_root");
    if out.starts_with("replicated_root: skipped:") {
        return;
    }
    has_line(
        &out,
        "restored on host-b: q-turn-1, a-turn-1, q-turn-2, a-turn-2",
    );
    has_line(&out, "replicated_root: ok");
}
