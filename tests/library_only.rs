//! The library builds without the command line's dependencies: with `--no-default-features`
//! (no `cli` feature) the dependency tree has no `clap`, `indicatif`, `axum` or `maud`, and
//! the library compiles; and the API docs build without a rustdoc warning. Runs `cargo`
//! itself (on PATH in CI; `$CARGO` when `cargo test` started us) in the release profile, on
//! this target folder.

use std::path::Path;
use std::process::{Command, Output};

/// The cargo that runs the tests, else `cargo` on PATH.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")));
    cmd
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run cargo");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The package names in `cargo tree -e normal --prefix none` with these extra arguments.
fn normal_tree(extra: &[&str]) -> Vec<String> {
    let out = run(cargo()
        .args(["tree", "-e", "normal", "--prefix", "none", "--offline"])
        .args(extra));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_default_features_tree_has_no_cli_dependencies() {
    let lean = normal_tree(&["--no-default-features"]);
    assert!(lean.iter().any(|p| p == "rusqlite"), "{lean:?}");
    for cli_only in [
        "clap",
        "clap_builder",
        "indicatif",
        "console",
        "axum",
        "hyper",
        "maud",
    ] {
        assert!(
            !lean.iter().any(|p| p == cli_only),
            "{cli_only} in {lean:?}"
        );
    }
    // The default build (what `cargo install` and `cargo run` use) still has the CLI's.
    let full = normal_tree(&[]);
    for cli_only in ["clap", "indicatif", "axum", "maud"] {
        assert!(
            full.iter().any(|p| p == cli_only),
            "{cli_only} missing from {full:?}"
        );
    }
}

#[test]
fn library_checks_without_default_features() {
    run(cargo().args([
        "check",
        "--release",
        "--lib",
        "--no-default-features",
        "--offline",
    ]));
}

/// The API docs (crate docs open with the README, example included) build without a
/// rustdoc warning: broken intra-doc links, bad code blocks, missing docs.
#[test]
fn docs_build_without_warnings() {
    run(cargo()
        .args(["doc", "--release", "--no-deps", "--offline"])
        .env("RUSTDOCFLAGS", "-D warnings"));
}
