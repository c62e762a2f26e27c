//! `session-store`: inspect and operate a root of sessions, and the bench harness.
//!
//! ```text
//! session-store [--root DIR] [--host ID] [--json] <command> …
//! ```
//!
//! The root is `--root`, else `$SESSION_STORE_ROOT`, else the platform data dir
//! (`$XDG_DATA_HOME/session-store`, `~/.local/share/session-store`); `demo` alone writes
//! to `--root`, else `./session-store-demo`, whatever `$SESSION_STORE_ROOT` says. Human output by default, `--json` for machines; errors are
//! one line on stderr. Exit status: 0 ok, 1 other error, 2 usage, 3 not found, 4 already
//! exists, 5 owned by another writer, 6 invalid or corrupt input.

#[macro_use]
#[path = "../cli/mod.rs"]
mod cli;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use cli::{CliResult, Context, Failure};

/// Root used by `demo` without `--root` (`$SESSION_STORE_ROOT` is not read for it).
const DEMO_ROOT: &str = "session-store-demo";

/// Environment variable naming the root.
const ROOT_ENV: &str = "SESSION_STORE_ROOT";

/// Folder name of the root inside the platform data dir.
const DATA_DIR_NAME: &str = "session-store";

/// Durable, queryable, forkable AI-agent conversation sessions in SQLite.
///
/// Exit status: 0 ok, 1 other error, 2 usage, 3 not found, 4 already exists, 5 owned by
/// another writer, 6 invalid or corrupt input.
#[derive(Debug, Parser)]
#[command(name = "session-store", version, about, propagate_version = true)]
struct Args {
    /// Root folder of sessions [default: $SESSION_STORE_ROOT, else the platform data dir,
    /// e.g. ~/.local/share/session-store; for `demo`: ./session-store-demo, whatever
    /// $SESSION_STORE_ROOT says]
    #[arg(long, global = true, value_name = "DIR")]
    root: Option<PathBuf>,

    /// Host id the sessions are served under (printable, not blank).
    #[arg(long, global = true, value_name = "ID", default_value = "local",
          value_parser = cli::parse_host)]
    host: String,

    /// Print machine-readable JSON on stdout.
    #[arg(long, global = true)]
    json: bool,

    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// When `append` makes its batches durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Sync {
    /// Flush (fsync) after every batch.
    Each,
    /// Flush once at the end of the input (timed group commits in between).
    End,
}

/// What a durable commit survives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// synchronous=FULL: survives power loss.
    Full,
    /// synchronous=NORMAL: survives a process crash.
    Normal,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Create a new empty session; prints its id.
    Create {
        /// The id (random 32-hex when omitted).
        id: Option<String>,
        /// Working directory to record in the header (a relative one is made absolute
        /// against the current directory).
        #[arg(long, value_name = "DIR", value_parser = session_store::absolute_cwd)]
        cwd: Option<String>,
    },
    /// Append JSON Lines batches (stdin by default), one batch per line:
    /// {"operation_id", "turn_id"?, "events": [{"kind", "payload"?, "optional"?, "id"?}]}.
    /// With --json, prints one line per batch once it is durable:
    /// {"operation_id","first_seq","last_seq","durable_sequence"} (with --sync end, once a
    /// write-behind drain made it durable: within about the write-behind delay (200 ms)
    /// and 50 ms more, also while no next line comes; the rest at the end).
    Append {
        /// The session.
        id: String,
        /// Read batches from this file instead of stdin (`-`: stdin).
        #[arg(long, value_name = "F")]
        file: Option<PathBuf>,
        /// When batches become durable.
        #[arg(long, value_enum, default_value = "end")]
        sync: Sync,
        /// Create the session first when it does not exist.
        #[arg(long)]
        create: bool,
    },
    /// List sessions, one page (filters combine; a cursor continues the same listing).
    List {
        /// Sessions per page (1..=100).
        #[arg(long, default_value_t = 50,
              value_parser = RangedU64ValueParser::<usize>::new().range(1..=session_store::MAX_LIST_LIMIT as u64))]
        limit: usize,
        /// Start after this cursor (a previous page's next_cursor, given with the same
        /// --sort, --cwd, --title and --origin; another listing's is refused).
        #[arg(long, value_name = "C")]
        cursor: Option<String>,
        /// Only sessions whose header names exactly this working directory (a relative
        /// one is made absolute against the current directory).
        #[arg(long, value_name = "DIR", value_parser = session_store::absolute_cwd)]
        cwd: Option<String>,
        /// Only sessions updated (last committed to) since: a duration back from now (7d, 12h) or a date, UTC
        /// unless an offset is given (2026-12-01, 2026-12-01T08:30:00Z,
        /// 2026-12-01T09:30:00.250+01:00).
        #[arg(long, value_name = "WHEN", value_parser = cli::when::parse_since, allow_hyphen_values = true)]
        since: Option<i64>,
        /// Only sessions whose title contains this text (ASCII case ignored).
        #[arg(long, value_name = "TEXT")]
        title: Option<String>,
        /// Only sessions of this origin (new, fork, rewind, canonical-import,
        /// legacy-import).
        #[arg(long, value_name = "ORIGIN", value_parser = parse_origin)]
        origin: Option<session_store::Origin>,
        /// The order: id, updated (most recent first) or created (most recent first).
        #[arg(long, value_enum, default_value = "id")]
        sort: SortArg,
    },
    /// Set a session's title: appends a `session/title` event as its writer (exit 5 when
    /// another process writes it).
    Rename {
        /// The session.
        id: String,
        /// The new title (not blank).
        title: String,
    },
    /// Header, lineage, lease, sequences, turns, usage totals and bytes by table of a session.
    Show {
        /// The session.
        id: String,
    },
    /// One page of a session's durable history (newest page first).
    History {
        /// The session.
        id: String,
        /// Messages per page (1..=500).
        #[arg(long, default_value_t = 100,
              value_parser = RangedU64ValueParser::<usize>::new().range(1..=session_store::MAX_HISTORY_LIMIT as u64))]
        limit: usize,
        /// An older page: a previous page's next_cursor.
        #[arg(long, value_name = "C")]
        cursor: Option<String>,
    },
    /// Full-text search over every session: words (all must match), "a phrase",
    /// prefix*, a OR b, a NOT b, parentheses; case and diacritics ignored. Hits best
    /// first (an exact phrase of the words first, then bm25), one page.
    Search {
        /// The query.
        query: String,
        /// Hits per page (1..=100).
        #[arg(long, default_value_t = 10,
              value_parser = RangedU64ValueParser::<usize>::new().range(1..=session_store::MAX_SEARCH_LIMIT as u64))]
        limit: usize,
        /// The next page: a previous page's next_cursor.
        #[arg(long, value_name = "C")]
        cursor: Option<String>,
        /// Only this session (with the messages it inherits).
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// Only sessions created with this working directory (a relative one is made
        /// absolute against the current directory).
        #[arg(long, value_name = "DIR", value_parser = session_store::absolute_cwd)]
        cwd: Option<String>,
        /// Only messages since: a duration back from now (7d, 12h) or a date, UTC unless an
        /// offset is given (2026-12-01, 2026-12-01T08:30:00Z, 2026-12-01T09:30:00.250+01:00).
        #[arg(long, value_name = "WHEN", value_parser = cli::when::parse_since, allow_hyphen_values = true)]
        since: Option<i64>,
        /// Only messages with this role (user, assistant, tool, …; title for titles),
        /// ignoring ASCII case.
        #[arg(long)]
        role: Option<String>,
    },
    /// Durable events in replay order.
    Events {
        /// The session.
        id: String,
        /// Only events with a sequence above this (0..=2^63-1).
        #[arg(long, value_name = "SEQ", default_value_t = 0,
              value_parser = clap::value_parser!(u64).range(..=cli::MAX_SEQUENCE))]
        after: u64,
        /// At most this many events (1..=1000000).
        #[arg(long, default_value_t = 100,
              value_parser = RangedU64ValueParser::<usize>::new().range(1..=cli::MAX_EVENTS_LIMIT))]
        limit: usize,
        /// Print blob-backed payloads inline instead of as content refs.
        #[arg(long)]
        inline: bool,
    },
    /// Fork a session after a completed turn; prints the new id.
    Fork {
        /// The parent session.
        id: String,
        /// The turn to keep: everything up to the end of the batch that ends it (a batch
        /// that ends it and goes on, say with a title or the whole next turn, is kept
        /// whole; one that leaves the next turn open is refused, exit 6).
        #[arg(long, value_name = "T")]
        after_turn: String,
        /// The new session's id (random when omitted).
        #[arg(long = "id", value_name = "NEW")]
        new_id: Option<String>,
    },
    /// Rewind a session to before a turn, as a new session; prints the new id.
    Rewind {
        /// The parent session.
        id: String,
        /// The turn to drop (and everything after it), also the turn still open.
        #[arg(long, value_name = "T")]
        before_turn: String,
        /// The new session's id (random when omitted).
        #[arg(long = "id", value_name = "NEW")]
        new_id: Option<String>,
    },
    /// Write a session as one self-contained SQLite file. Ctrl-C (SIGINT), SIGTERM or
    /// SIGHUP stops it leaving no file (exit 130, 143 or 129).
    Export {
        /// The session.
        id: String,
        /// The file to write (must not exist; not `-`: the file is SQLite's, written in
        /// place, so it cannot go to stdout).
        file: PathBuf,
    },
    /// Validate an exported file and publish it as a new session. Ctrl-C (SIGINT), SIGTERM
    /// or SIGHUP stops it publishing nothing (exit 130, 143 or 129); once it has published,
    /// only its search indexing stops, and it prints the id (exit 0).
    Import {
        /// The exported file.
        file: PathBuf,
        /// Publish under this id instead of the file's.
        #[arg(long = "id", value_name = "NEW")]
        new_id: Option<String>,
        /// Working directory to record (a relative one is made absolute against the
        /// current directory).
        #[arg(long, value_name = "DIR", value_parser = session_store::absolute_cwd)]
        cwd: Option<String>,
    },
    /// Delete a session (its forks keep their inherited events).
    Delete {
        /// The session.
        id: String,
        /// Wait at most this long for its writer to go away (0..=31536000 seconds).
        #[arg(long, value_name = "SECONDS", default_value = "0", value_parser = cli::parse_wait)]
        wait: Duration,
    },
    /// Delete the sessions not updated (no commit of their own; a fork of one does not
    /// count) nor imported or restored into the root for DURATION and without a writer (a live writer: kept and reported); forks get their inherited history first, as `delete` does.
    /// Prints what it deletes, or with --dry-run what it would.
    Gc {
        /// Age of the last change: 90s, 45m, 12h, 7d, 2w (not 0: at least 1s).
        #[arg(long, value_name = "DURATION", value_parser = cli::when::parse_age, allow_hyphen_values = true)]
        older_than: Duration,
        /// Print what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Keep sessions that forks inherit from.
        #[arg(long)]
        keep_forked: bool,
    },
    /// Check a session or file: integrity_check, sequences, hashes, blob digests, full
    /// replay. Exit 0 only when sound.
    Verify {
        /// A session id, or the path of a session file, folder or export (any bytes: a
        /// path need not be UTF-8).
        target: PathBuf,
    },
    /// Continue a legacy transcript (one message JSON per line) as a new session.
    MigrateLegacy {
        /// The transcript.
        file: PathBuf,
        /// The legacy head to freeze: the id of the last message to migrate ("" for the
        /// file's tip); an id that no message has is refused.
        #[arg(long, value_name = "ID", default_value = "")]
        head: String,
    },
    /// Bytes and counts by event kind, blobs and compression ratio, usage totals.
    Stats {
        /// The session.
        id: String,
    },
    /// Rebuild the derived catalog from the session files.
    RebuildCatalog,
    /// Write a Litestream (>= 0.5) config that replicates every session of the root
    /// continuously (stdout, or --config-out FILE); --run starts `litestream replicate`.
    Replicate {
        /// Replica: file:///PATH, s3://BUCKET/PREFIX or sftp://USER@HOST/PATH
        /// [default: $SESSION_STORE_REPLICA].
        #[arg(long, value_name = "URL")]
        replica: Option<String>,
        /// Write the config to this file instead of stdout.
        #[arg(long, value_name = "FILE")]
        config_out: Option<PathBuf>,
        /// Start `litestream replicate -config FILE` (FILE: --config-out, else
        /// <root>/.litestream.yml).
        #[arg(long)]
        run: bool,
        /// The Litestream binary [default: $LITESTREAM_BIN, else litestream on PATH].
        #[arg(long, value_name = "BIN")]
        litestream: Option<PathBuf>,
    },
    /// Restore one session (and the ancestors its lineage names) or all of them from a
    /// Litestream replica into the root, verify each and rebuild the catalog.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["id", "all"])))]
    Restore {
        /// The replica `replicate` wrote to (file:///PATH, s3://…, sftp://…).
        #[arg(long, value_name = "REPLICA")]
        from: String,
        /// The session to restore.
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// Every session of the replica.
        #[arg(long)]
        all: bool,
        /// The Litestream binary [default: $LITESTREAM_BIN, else litestream on PATH].
        #[arg(long, value_name = "BIN")]
        litestream: Option<PathBuf>,
    },
    /// Browse the root in a web browser: a read-only HTTP server (sessions, search,
    /// transcripts, fork trees, storage charts, and the same data as JSON under /api/).
    /// Prints its URL as the first line on stdout, then serves until stopped.
    Serve {
        /// Address to listen on; port 0 picks a free one. Only loopback addresses unless
        /// --allow-remote.
        #[arg(long, value_name = "IP:PORT", default_value = cli::serve::DEFAULT_ADDR)]
        addr: std::net::SocketAddr,
        /// Open the system's browser on the URL.
        #[arg(long)]
        open: bool,
        /// Allow a non-loopback address; a random token is then printed in the URL and
        /// required on every request.
        #[arg(long)]
        allow_remote: bool,
    },
    /// Write a scripted multi-session agent workload into the root and summarise it.
    Demo,
    /// Append throughput: the library (group commit) on S sessions in parallel, a raw
    /// SQLite baseline, a JSON Lines file with one fdatasync per batch, and the
    /// machine's fdatasync rate. `--suite lean` instead prints the lean-store table: bytes
    /// on disk, writer memory, reopen cost and durable append rates, each with its
    /// same-run baseline, ratio and target.
    Bench {
        /// Which benchmark: `append` (the throughput above) or `lean` (the table).
        #[arg(long, value_enum, default_value = "append")]
        suite: Suite,
        /// With `--suite lean`: every measure at small sizes (a smoke run).
        #[arg(long)]
        quick: bool,
        /// Events in total (spread over the sessions; 1..=10000000) [default: 96000].
        #[arg(long, value_name = "N",
              value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
        events: Option<usize>,
        /// Events per batch (one transaction or fdatasync each in the baselines;
        /// 1..=1000000) [default: 64].
        #[arg(long, value_name = "B",
              value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
        batch: Option<usize>,
        /// What a durable commit survives [default: full].
        #[arg(long, value_enum)]
        durability: Option<DurabilityArg>,
        /// Sessions (and baseline files) written in parallel (1..=1024) [default: 4].
        #[arg(long, value_name = "S",
              value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
        sessions: Option<usize>,
        /// Folder for the bench files [default: a temporary folder in the root, removed
        /// afterwards].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// The writer process of `bench --suite lean`'s memory rows: appends chat messages to a
    /// new session in the root and prints its peak RSS as JSON.
    #[command(hide = true)]
    BenchWriter {
        /// Messages to append (two per turn).
        #[arg(long, value_name = "N",
              value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
        messages: usize,
        /// A `model/context-replace` every this many turns (0: never).
        #[arg(long, value_name = "T", default_value_t = 0)]
        compact_every: usize,
        /// Write the events to a JSON Lines file instead of a session.
        #[arg(long)]
        jsonl: bool,
    },
}

/// The order of `list`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SortArg {
    /// By session id.
    Id,
    /// Most recently updated first.
    Updated,
    /// Most recently created first.
    Created,
}

/// An origin name for `list --origin`.
fn parse_origin(text: &str) -> Result<session_store::Origin, String> {
    session_store::Origin::parse(text).ok_or_else(|| {
        format!("{text:?} is not an origin (new, fork, rewind, canonical-import, legacy-import)")
    })
}

/// The benchmarks of `bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    /// Append throughput vs raw SQLite, JSON Lines and fdatasync.
    Append,
    /// The lean-store table: nine rows, each against its same-run baseline.
    Lean,
}

/// The root from `--root`, else `$SESSION_STORE_ROOT` (if not empty), else `fallback`.
fn resolve_root(
    flag: Option<PathBuf>,
    fallback: impl FnOnce() -> CliResult<PathBuf>,
) -> CliResult<PathBuf> {
    if let Some(root) = flag {
        return Ok(root);
    }
    match std::env::var_os(ROOT_ENV).filter(|v| !v.is_empty()) {
        Some(root) => Ok(PathBuf::from(root)),
        None => fallback(),
    }
}

/// The platform data dir's `session-store` folder.
fn data_dir_root() -> CliResult<PathBuf> {
    let env_dir = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let base = if cfg!(target_os = "macos") {
        env_dir("HOME").map(|h| h.join("Library/Application Support"))
    } else if cfg!(windows) {
        env_dir("APPDATA")
    } else {
        env_dir("XDG_DATA_HOME").or_else(|| env_dir("HOME").map(|h| h.join(".local/share")))
    };
    base.map(|b| b.join(DATA_DIR_NAME)).ok_or_else(|| {
        Failure::usage(format!(
            "no root: pass --root DIR or set {ROOT_ENV} (no platform data dir found)"
        ))
    })
}

fn run(args: Args) -> CliResult<()> {
    // First, before anything opens a file (which would then get descriptor 1).
    cli::stdout_is_open()?;
    // `demo` writes into `--root` or ./session-store-demo, never into the root
    // `$SESSION_STORE_ROOT` names: a user's real root got five demo sessions, and the
    // README's next command (`--root session-store-demo serve`) found no root (outside
    // testing, session 40).
    let root = match args.command {
        Command::Demo => args.root.unwrap_or_else(|| PathBuf::from(DEMO_ROOT)),
        _ => resolve_root(args.root, data_dir_root)?,
    };
    // Before any file is opened or thread started.
    cli::owner::act_as_root_owner(&root)?;
    // A write past `ulimit -f` fails (and the command cleans up) instead of killing it.
    cli::interrupt::survive_file_size_limit()?;
    // A deep fork chain reads as many files as it has ancestors.
    cli::limits::raise_descriptor_limit();
    let cx = Context {
        root,
        host: args.host,
        json: args.json,
    };
    if matches!(args.command, Command::Demo | Command::Bench { .. }) {
        cx.root_not_a_file()?;
    }
    let missing = cli::missing_folders(&cx.root);
    let result = dispatch(&cx, args.command);
    if result.is_err() {
        // A command that made the root and then failed (an import whose file is refused
        // is validated inside the root) leaves no empty root behind, nor the folders above
        // it that making the root created. `remove_dir` removes only an empty folder, so
        // nothing anyone wrote there meanwhile goes.
        cli::remove_unused_root(&cx.root, &missing);
    }
    result
}

/// Runs one command on `cx`.
fn dispatch(cx: &Context, command: Command) -> CliResult<()> {
    use cli::sessions as s;
    match command {
        Command::Create { id, cwd } => s::create(cx, id.as_deref(), cwd),
        Command::Append {
            id,
            file,
            sync,
            create,
        } => cli::append::run(cx, &id, file.as_deref(), sync == Sync::Each, create),
        Command::List {
            limit,
            cursor,
            cwd,
            since,
            title,
            origin,
            sort,
        } => {
            let mut filter = session_store::ListFilter::default().with_sort(match sort {
                SortArg::Id => session_store::ListSort::Id,
                SortArg::Updated => session_store::ListSort::Updated,
                SortArg::Created => session_store::ListSort::Created,
            });
            filter.cwd = cwd;
            filter.since_ms = since;
            filter.title = title;
            filter.origin = origin;
            s::list(cx, limit, cursor.as_deref(), filter)
        }
        Command::Rename { id, title } => s::rename(cx, &id, &title),
        Command::Show { id } => s::show(cx, &id),
        Command::History { id, limit, cursor } => s::history(cx, &id, limit, cursor.as_deref()),
        Command::Search {
            query,
            limit,
            cursor,
            session,
            cwd,
            since,
            role,
        } => cli::search::search(
            cx,
            &query,
            cli::search::SearchArgs {
                limit,
                cursor,
                session,
                cwd,
                since_ms: since,
                role,
            },
        ),
        Command::Events {
            id,
            after,
            limit,
            inline,
        } => s::events(cx, &id, after, limit, inline),
        Command::Fork {
            id,
            after_turn,
            new_id,
        } => s::fork(
            cx,
            &id,
            session_store::ForkPoint::AfterTurn(after_turn),
            new_id.as_deref(),
        ),
        Command::Rewind {
            id,
            before_turn,
            new_id,
        } => s::fork(
            cx,
            &id,
            session_store::ForkPoint::BeforeTurn(before_turn),
            new_id.as_deref(),
        ),
        Command::Export { id, file } => s::export(cx, &id, &file),
        Command::Import { file, new_id, cwd } => s::import(cx, &file, new_id.as_deref(), cwd),
        Command::Delete { id, wait } => s::delete(cx, &id, wait),
        Command::Gc {
            older_than,
            dry_run,
            keep_forked,
        } => s::gc(
            cx,
            &session_store::GcOptions::older_than(older_than)
                .with_dry_run(dry_run)
                .with_keep_forked(keep_forked),
        ),
        Command::Verify { target } => s::verify(cx, &target),
        Command::MigrateLegacy { file, head } => s::migrate_legacy(cx, &file, &head),
        Command::Stats { id } => s::stats(cx, &id),
        Command::RebuildCatalog => s::rebuild_catalog(cx),
        Command::Replicate {
            replica,
            config_out,
            run,
            litestream,
        } => cli::replicate::replicate(
            cx,
            replica.as_deref(),
            config_out.as_deref(),
            run,
            litestream.as_deref(),
        ),
        Command::Restore {
            from,
            id,
            all,
            litestream,
        } => cli::replicate::restore(cx, &from, id.as_deref(), all, litestream.as_deref()),
        Command::Serve {
            addr,
            open,
            allow_remote,
        } => cli::serve::run(
            cx,
            &cli::serve::Options {
                addr,
                open,
                allow_remote,
            },
        ),
        Command::Demo => cli::demo::run(&cx.root, cx.json),
        Command::Bench {
            suite,
            quick,
            events,
            batch,
            durability,
            sessions,
            dir,
        } => match suite {
            Suite::Lean => {
                if events.is_some() || batch.is_some() || durability.is_some() || sessions.is_some()
                {
                    return Err(Failure::usage(
                        "--suite lean takes only --quick and --dir (its sizes are fixed)",
                    ));
                }
                cli::lean::run(cx, &cli::lean::Options { quick, dir })
            }
            Suite::Append if quick => Err(Failure::usage("--quick needs --suite lean")),
            Suite::Append => cli::bench::run(
                cx,
                &cli::bench::Options {
                    events: events.unwrap_or(96_000),
                    batch: batch.unwrap_or(64),
                    durability: match durability.unwrap_or(DurabilityArg::Full) {
                        DurabilityArg::Full => session_store::Durability::PowerLoss,
                        DurabilityArg::Normal => session_store::Durability::ProcessCrash,
                    },
                    sessions: sessions.unwrap_or(4),
                    dir,
                },
            ),
        },
        Command::BenchWriter {
            messages,
            compact_every,
            jsonl,
        } => cli::lean::writer(cx, messages, compact_every, jsonl),
    }
}

impl Command {
    /// Whether the command changes the root or writes a file (a failed write of its output
    /// then says that the change stands).
    fn changes_something(&self) -> bool {
        match self {
            Command::Create { .. }
            | Command::Append { .. }
            | Command::Rename { .. }
            | Command::Fork { .. }
            | Command::Rewind { .. }
            | Command::Export { .. }
            | Command::Import { .. }
            | Command::Delete { .. }
            | Command::MigrateLegacy { .. }
            | Command::RebuildCatalog
            | Command::Restore { .. }
            | Command::Demo => true,
            Command::Gc { dry_run, .. } => !dry_run,
            _ => false,
        }
    }
}

fn main() -> ExitCode {
    // clap prints usage errors itself and exits with status 2. A subcommand's `--version`
    // names the program, as `session-store --version` does ("session-store-append" was
    // clap's default name for it).
    let command = Args::command().mut_subcommands(|sub| sub.display_name("session-store"));
    let matches = match command.try_get_matches() {
        Ok(matches) => matches,
        // Not on a terminal, help and version are printed as any command's output is:
        // clap's own printing exited 0 when stdout was closed or full (a `--version >
        // VERSION` on a full disk left an empty file and said nothing).
        Err(e)
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                && !std::io::stdout().is_terminal() =>
        {
            return finish(false, print_text(&e.render().to_string()));
        }
        Err(e) => e.exit(),
    };
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let changes = args.command.changes_something();
    finish(changes, run(args))
}

/// Prints `text` (clap's help or version) to stdout, as a command's output: a stdout
/// closed at start or a failed write is an error.
fn print_text(text: &str) -> CliResult<()> {
    cli::stdout_is_open()?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(cli::OutputError)?;
    Ok(())
}

/// The exit status of a command that ran (`changes`: it changes the root) with `result`,
/// its error printed on stderr.
fn finish(changes: bool, result: CliResult<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader left on purpose (`| head`): no error line for it.
        Err(e) if cli::is_broken_pipe(&*e) => ExitCode::from(cli::EXIT_OTHER),
        Err(e) => {
            let code = cli::exit_code(&*e);
            let mut line = cli::one_line(&*e);
            if code == cli::EXIT_OTHER {
                line = session_store::naming_file_size_limit(line);
            }
            if changes && cli::is_output_error(&*e) {
                // A command that prints as it goes (`append --json`, `gc`) stops at its
                // first failed write: "had done its work" was wrong for those (outside
                // testing, signals: 2 of 2,000 batches appended).
                line.push_str(
                    " (what the command did before it is kept, and it did nothing after it: \
                     `list` and `show` tell what it changed)",
                );
            }
            errln!("session-store: error: {line}");
            ExitCode::from(code)
        }
    }
}
