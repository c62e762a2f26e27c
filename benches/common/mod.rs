//! Helpers shared by the benches (`mod common;` in a bench file).
#![allow(dead_code)]

/// The workload `session-store bench` uses too (its raw baseline is
/// `session_store::baseline`).
#[path = "../../src/cli/workload.rs"]
pub mod workload;
pub use workload::{fmt_count, median};

pub mod roots;

/// The folder a bench's files go under (`BENCH_DIR`, else Cargo's target tmp dir: on disk,
/// so fsync is real), created if needed, and a fresh temp dir inside it.
pub fn bench_dir() -> std::io::Result<(std::path::PathBuf, tempfile::TempDir)> {
    let base = std::env::var_os("BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base)?;
    let dir = tempfile::tempdir_in(&base)?;
    Ok((base, dir))
}

/// How a result compares with its target.
pub fn verdict(ok: bool) -> &'static str {
    if ok { "MET" } else { "MISSED" }
}

/// The 1-minute load average as text, `?` when unknown.
pub fn load_average() -> String {
    workload::load_average().map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"))
}

/// Bytes as MB (10^6).
pub fn fmt_mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Whether `BENCH_QUICK` asks for a smoke run with smaller sizes.
pub fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}
