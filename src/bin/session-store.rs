//! `session-store`: a small command-line front end to the `session_store` library.
//!
//! ```text
//! session-store [--root DIR] [--json] demo
//! ```
//!
//! The root defaults to `$SESSION_STORE_ROOT`, else `./session-store-demo`. Errors print
//! one line on stderr and exit with status 1.

#[path = "../cli/mod.rs"]
mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Root used when neither `--root` nor `$SESSION_STORE_ROOT` is given.
const DEFAULT_ROOT: &str = "session-store-demo";

/// Environment variable naming the root.
const ROOT_ENV: &str = "SESSION_STORE_ROOT";

/// Durable, queryable, forkable AI-agent conversation sessions in SQLite.
#[derive(Debug, Parser)]
#[command(name = "session-store", version, about)]
struct Args {
    /// Root folder of sessions [default: $SESSION_STORE_ROOT, else ./session-store-demo]
    #[arg(long, global = true, value_name = "DIR")]
    root: Option<PathBuf>,

    /// Print machine-readable JSON on stdout.
    #[arg(long, global = true)]
    json: bool,

    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Write a scripted multi-session agent workload into the root and summarise it.
    Demo,
}

impl Args {
    /// The root folder: `--root`, else `$SESSION_STORE_ROOT` (if not empty), else the default.
    fn root(&self) -> PathBuf {
        self.root
            .clone()
            .or_else(|| {
                std::env::var_os(ROOT_ENV)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let root = args.root();
    let result = match args.command {
        Command::Demo => cli::demo::run(&root, args.json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("session-store: error: {}", cli::one_line(&*e));
            ExitCode::FAILURE
        }
    }
}
