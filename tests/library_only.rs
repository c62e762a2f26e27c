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

/// Every integration test and benchmark that runs the `session-store` binary or measures
/// against `session_store::baseline` (both only with the `cli` feature) declares
/// `required-features = ["cli"]` in `Cargo.toml`, or keeps those parts behind
/// `#[cfg(feature = "cli")]`: `cargo test --no-default-features` then builds every target
/// it runs and no test fails for want of the binary.
#[test]
fn targets_that_need_the_cli_feature_require_it() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("read Cargo.toml");
    // The `[[test]]` and `[[bench]]` tables that require `cli`, as "tests/NAME.rs" paths.
    let mut requiring = Vec::new();
    for table in manifest.split("\n[").skip(1) {
        let folder = match table.lines().next() {
            Some("[test]]") => "tests",
            Some("[bench]]") => "benches",
            _ => continue,
        };
        let name = table
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
            .expect("a target table names its target");
        if table
            .lines()
            .any(|l| l.starts_with("required-features") && l.contains("\"cli\""))
        {
            requiring.push(format!("{folder}/{name}.rs"));
        }
    }
    let mut missing = Vec::new();
    for folder in ["tests", "benches"] {
        for entry in std::fs::read_dir(dir.join(folder)).expect("read the folder") {
            let path = entry.expect("folder entry").path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a target");
            let needs_cli = [
                "CARGO_BIN_EXE",
                "spawn_cli(",
                "serve_support",
                "session_store::baseline",
            ]
            .iter()
            .any(|used| text.contains(used));
            let file = format!("{folder}/{}", path.file_name().unwrap().to_string_lossy());
            if needs_cli
                && !text.contains("#[cfg(feature = \"cli\")]")
                && !requiring.contains(&file)
            {
                missing.push(file);
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "need the `cli` feature but do not require it: {missing:?}"
    );
}
