//! The command-line front end: subcommands and output helpers. Compiled into the
//! `session-store` binary only (not part of the library).

/// `println!` that returns its error from the enclosing function (which returns a
/// [`CliResult`]) instead of panicking: a reader that closed the pipe (`| head`) ends the
/// command quietly (see [`is_broken_pipe`]).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err(crate::cli::OutputError)?
    }};
}

/// `print!` as [`outln!`] is `println!`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($arg)*).map_err(crate::cli::OutputError)?
    }};
}

/// `eprintln!` that never panics: when the reader of stderr went away (`2>&1 | grep -q`)
/// the line is lost and the command keeps its own exit status (`eprintln!` panicked,
/// status 101).
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod append;
pub mod bench;
pub mod corpus;
pub mod demo;
pub mod interrupt;
pub mod lean;
pub mod limits;
pub mod owner;
pub mod replicate;
pub mod search;
pub mod serve;
pub mod sessions;
pub mod when;
pub mod workload;

use std::borrow::Cow;
use std::fmt;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use session_store::Error;

/// The error type of every subcommand.
pub type CliError = Box<dyn std::error::Error>;

/// The result type of every subcommand.
pub type CliResult<T> = Result<T, CliError>;

/// Exit status: any other error.
pub const EXIT_OTHER: u8 = 1;
/// Exit status: bad command line.
pub const EXIT_USAGE: u8 = 2;
/// Exit status: no such session or file.
pub const EXIT_NOT_FOUND: u8 = 3;
/// Exit status: the session (or destination) already exists.
pub const EXIT_EXISTS: u8 = 4;
/// Exit status: another writer owns the session.
pub const EXIT_OWNED: u8 = 5;
/// Exit status: invalid or corrupt input.
pub const EXIT_INVALID: u8 = 6;

/// An error with the exit status it maps to.
#[derive(Debug)]
pub struct Failure {
    /// The exit status.
    pub code: u8,
    /// The one-line message.
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl Failure {
    /// A failure with this status.
    pub fn with_code(code: u8, message: impl Into<String>) -> CliError {
        Box::new(Failure {
            code,
            message: message.into(),
        })
    }

    /// A bad command line (status 2).
    pub fn usage(message: impl Into<String>) -> CliError {
        Self::with_code(EXIT_USAGE, message)
    }

    /// Invalid or corrupt input (status 6).
    pub fn invalid(message: impl Into<String>) -> CliError {
        Self::with_code(EXIT_INVALID, message)
    }

    /// `error` with `context` in front, keeping the status it maps to.
    pub fn context(
        context: impl fmt::Display,
        error: &(dyn std::error::Error + 'static),
    ) -> CliError {
        Self::with_code(exit_code(error), format!("{context}: {}", one_line(error)))
    }
}

/// `error` as the CLI reports it: one not otherwise classified (exit 1: a failed write, a
/// root that takes no files) prefixed with `what` was being done, which its own text may
/// not say; a classified one as it is.
pub fn in_context(error: Error, what: impl fmt::Display) -> CliError {
    if library_code(&error) == EXIT_OTHER {
        Failure::context(what, &error)
    } else {
        error.into()
    }
}

/// `error`, a failed read or write of session `id`, naming the session and `verify` when
/// it says the session is damaged: the library's error names the damage ("corrupt session
/// store: SQLite reports: database disk image is malformed") and not always the session,
/// where Python and `serve` name it, so a script looping over ids could not tell which
/// one was damaged (outside testing D4). The exit status stays 6. A message that names
/// the session already is left as it is.
pub fn naming_damaged(id: &session_store::SessionId, error: CliError) -> CliError {
    match error.downcast_ref::<Error>() {
        // A message that names the session already ("session P cannot be forked at …").
        Some(e) if e.is_corrupt() && !e.to_string().contains(&format!("session {id}")) => {
            Failure::invalid(format!(
                "session {id} is damaged ({}); `session-store verify {id}` checks it",
                one_line(e)
            ))
        }
        _ => error,
    }
}

/// The exit status of a library error, through its classifiers (the table is in
/// `docs/ARCHITECTURE.md`, "Public API: errors").
pub fn library_code(error: &Error) -> u8 {
    if error.is_not_found() {
        EXIT_NOT_FOUND
    } else if error.is_already_exists() {
        EXIT_EXISTS
    } else if error.is_writer_owned() {
        EXIT_OWNED
    } else if error.is_caller_error() || error.is_corrupt() || error.is_unsupported() {
        EXIT_INVALID
    } else {
        EXIT_OTHER
    }
}

/// The exit status of any error a subcommand returns.
pub fn exit_code(error: &(dyn std::error::Error + 'static)) -> u8 {
    if let Some(f) = error.downcast_ref::<Failure>() {
        f.code
    } else if let Some(e) = error.downcast_ref::<Error>() {
        library_code(e)
    } else if let Some(e) = error.downcast_ref::<std::io::Error>()
        && e.kind() == std::io::ErrorKind::NotFound
    {
        EXIT_NOT_FOUND
    } else {
        EXIT_OTHER
    }
}

/// True when `error` is a write to stdout that failed because its reader went away
/// (`session-store events ID | head`): the command then ends quietly with status 1.
pub fn is_broken_pipe(error: &(dyn std::error::Error + 'static)) -> bool {
    let kind = match (
        error.downcast_ref::<OutputError>(),
        error.downcast_ref::<std::io::Error>(),
    ) {
        (Some(OutputError(e)), _) | (None, Some(e)) => Some(e.kind()),
        (None, None) => error
            .downcast_ref::<serde_json::Error>()
            .and_then(serde_json::Error::io_error_kind),
    };
    kind == Some(std::io::ErrorKind::BrokenPipe)
}

/// A write to stdout that failed (a full disk behind `> file`, `/dev/full`): named as
/// such, where the bare system error ("No space left on device") read as the root's disk
/// being full, after a command that had made its change (outside testing, session 36).
#[derive(Debug)]
pub struct OutputError(pub std::io::Error);

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "could not write the output to stdout: {}", self.0)
    }
}

impl std::error::Error for OutputError {}

impl From<serde_json::Error> for OutputError {
    fn from(e: serde_json::Error) -> OutputError {
        OutputError(e.into())
    }
}

/// True when `error` is an [`OutputError`].
pub fn is_output_error(error: &(dyn std::error::Error + 'static)) -> bool {
    error.downcast_ref::<OutputError>().is_some()
}

/// The largest sequence a command line may name (SQLite stores sequences as `i64`).
pub const MAX_SEQUENCE: u64 = i64::MAX as u64;

/// The largest `events --limit`.
pub const MAX_EVENTS_LIMIT: u64 = 1_000_000;

/// The longest `delete --wait`: one year, in seconds.
pub const MAX_WAIT_SECONDS: f64 = 365.0 * 86_400.0;

/// Parses `--host`: a host id [`session_store::SessionRef::check_host_id`] accepts (a
/// clap value parser: anything else is a usage error, status 2, for every command).
pub fn parse_host(text: &str) -> Result<String, String> {
    session_store::SessionRef::check_host_id(text)
        .map(|()| text.to_owned())
        .map_err(|e| e.to_string())
}

/// Parses a number of seconds in `0..=MAX_WAIT_SECONDS` (a clap value parser: anything
/// else is a usage error, status 2).
pub fn parse_wait(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=MAX_WAIT_SECONDS).contains(&seconds) {
        return Err(format!(
            "{text} is not a number of seconds in 0..={MAX_WAIT_SECONDS}"
        ));
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text}: {e}"))
}

/// What every subcommand gets from the global flags.
#[derive(Clone, Debug)]
pub struct Context {
    /// The root folder of sessions.
    pub root: std::path::PathBuf,
    /// The host id sessions are served under.
    pub host: String,
    /// Machine-readable output.
    pub json: bool,
}

impl Context {
    /// Opens the root, which must exist: status 3 and nothing created when it does not.
    /// Commands that read or change existing sessions use this, so a mistyped `--root`
    /// leaves no empty root behind.
    pub fn open_root(&self) -> CliResult<session_store::Root> {
        if !self.root.is_dir() {
            self.root_not_a_file()?;
            return Err(Failure::with_code(
                EXIT_NOT_FOUND,
                format!("no root at {}", self.root.display()),
            ));
        }
        self.create_root()
    }

    /// Opens the root, creating it if needed (commands that create sessions).
    pub fn create_root(&self) -> CliResult<session_store::Root> {
        self.root_not_a_file()?;
        Ok(session_store::Root::open(&self.root)?)
    }

    /// Status 6 when the root's path is there but is no folder (a file, a device): it was
    /// "no root at DIR" for some commands and "File exists (os error 17)", status 1, for
    /// those that make the root (`demo` and `bench`, which make theirs themselves, call
    /// this first too).
    pub fn root_not_a_file(&self) -> CliResult<()> {
        match std::fs::metadata(&self.root) {
            Ok(m) if !m.is_dir() => Err(Failure::invalid(format!(
                "root {} is not a folder; give a folder's path with --root",
                self.root.display()
            ))),
            _ => Ok(()),
        }
    }

    /// A service over the root (which must exist) for this host.
    pub fn service(&self) -> CliResult<session_store::Service> {
        self.service_on(self.open_root()?)
    }

    /// A service over `root` for this host.
    pub fn service_on(&self, root: session_store::Root) -> CliResult<session_store::Service> {
        Ok(session_store::Service::new(self.host.clone(), root)?)
    }
}

/// The folders of `root`'s path that do not exist, the root first, then each missing
/// parent up to the first one that exists: what making the root would create.
pub fn missing_folders(root: &Path) -> Vec<PathBuf> {
    root.ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .take_while(|p| std::fs::symlink_metadata(p).is_err())
        .map(Path::to_path_buf)
        .collect()
}

/// Removes the root `root` that a failed command made ([`missing_folders`] of it, taken
/// before the command ran, are `made`) while it holds nothing: first its `.staging`
/// when empty (a build refused after it began there, an import whose copy fails
/// validation, a restore, leaves that folder, and the root and its parents stayed with
/// it), then [`remove_empty_folders`]. A root that was there already is left as it is.
pub fn remove_unused_root(root: &Path, made: &[PathBuf]) {
    if made.first().is_some_and(|first| first == root) {
        let _ = std::fs::remove_dir(root.join(session_store::format::STAGING_DIR));
    }
    remove_empty_folders(made);
}

/// Removes `folders` (as [`missing_folders`] lists them, deepest first) while they are
/// empty, stopping at the first that is not: what a command made and left unused goes,
/// nothing anyone wrote there meanwhile does.
pub fn remove_empty_folders(folders: &[PathBuf]) {
    for dir in folders {
        if std::fs::remove_dir(dir).is_err() {
            break;
        }
    }
}

/// Fails with status 6 when `path` is a folder: input read as lines (`append --file`,
/// `migrate-legacy`) failed on one with "Is a directory (os error 21)", status 1.
pub fn not_a_folder(path: &Path) -> CliResult<()> {
    if path.is_dir() {
        return Err(Failure::invalid(format!(
            "{} is a folder; give a file",
            path.display()
        )));
    }
    Ok(())
}

/// Parses a session id (status 6 when it is not a valid id).
pub fn session_id(text: &str) -> CliResult<session_store::SessionId> {
    Ok(session_store::SessionId::new(text)?)
}

/// Prints `value` as one line of JSON on stdout and flushes it.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> CliResult<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value).map_err(OutputError::from)?;
    out.write_all(b"\n").map_err(OutputError)?;
    out.flush().map_err(OutputError)?;
    Ok(())
}

/// Prints `value` as JSON when the context asks for it, else has `human` print it.
pub fn print_report<T: Serialize>(
    cx: &Context,
    value: &T,
    human: impl FnOnce(&T) -> CliResult<()>,
) -> CliResult<()> {
    if cx.json {
        print_json(value)
    } else {
        human(value)
    }
}

/// A progress bar of `len` steps on stderr, hidden unless stderr is a terminal.
pub fn progress_bar(len: u64, message: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len).with_message(message.to_owned());
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]") {
        bar.set_style(style);
    }
    bar
}

/// A ticking spinner on stderr for an operation without steps, hidden unless stderr is a
/// terminal.
pub fn spinner(message: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner().with_message(message.to_owned());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// Runs a future of the library's async service to completion on a small runtime.
pub fn block_on<F: std::future::Future>(future: F) -> CliResult<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(future))
}

/// An error and its sources as one line (`outer: cause: root cause`), without repeats: a
/// cause already in the line is left out, and so is one that only restates the cause
/// before it behind a prefix (SQLite's `Error code 26: file is not a database` under
/// `file is not a database`), and SQLite's bare code under an SQLite error that has a
/// message of its own (`Error code 4874: disk I/O error` under "could not read FILE: no
/// space left …", which a full disk's `list` printed).
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut previous = line.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !is_bare_sqlite_code(&text) && !line.contains(&text) && !text.ends_with(&previous) {
            line.push_str(": ");
            line.push_str(&text);
        }
        previous = text;
        source = cause.source();
    }
    printable(&line).into_owned()
}

/// Whether `text` is SQLite's bare result code as the library's SQLite errors give it as
/// their last cause (`Error code 4874: disk I/O error`): under an SQLite error with a
/// message of its own it only restates the code, and under one without a message the
/// line holds it already. (The command line reads no SQLite type, so it goes by the text.)
fn is_bare_sqlite_code(text: &str) -> bool {
    text.strip_prefix("Error code ")
        .and_then(|rest| rest.split_once(": "))
        .is_some_and(|(code, _)| !code.is_empty() && code.bytes().all(|b| b.is_ascii_digit()))
}

/// `text` safe to print on a terminal: every control character (escape sequences, line
/// breaks, C1 controls) and bidirectional embedding, override or isolate (U+202A-U+202E,
/// U+2066-U+2069: they reorder the rest of the line as the terminal shows it) written as a
/// Rust escape (`\u{1b}`, `\n`, `\u{202e}`), everything else as is. For human output of
/// strings that come from a session or a caller; JSON output stays exact JSON instead.
pub fn printable(text: &str) -> Cow<'_, str> {
    escape_controls(text, |c| c.is_control() || is_bidi_control(c))
}

/// A session id (or other stored name) for human output: [`printable`], and an invisible
/// character written as an escape too (`a\u{200b}b`): an id may hold bidirectional
/// controls that would reorder the line on a terminal, and an id of zero-width characters
/// printed as nothing (`--json` gives it exact). Message text keeps them (a zero-width
/// joiner is part of an emoji there).
pub fn shown<T: AsRef<str> + ?Sized>(id: &T) -> Cow<'_, str> {
    let id = id.as_ref();
    // An id not in NFC (`cafe` + U+0301) drew as its NFC twin (`café`), another session's
    // id: its combining marks are escaped too (outside testing, session 38: two sessions
    // listed alike). An NFC id keeps its marks (Devanagari vowel signs, say).
    let decomposed = !unicode_normalization::is_nfc(id);
    escape_controls(id, |c| {
        c.is_control()
            || is_bidi_control(c)
            || session_store::is_invisible(c)
            || (decomposed && unicode_normalization::char::is_combining_mark(c))
    })
}

/// `text` followed by spaces up to `width` columns as a terminal draws it (a CJK character
/// takes two, a combining mark none), for a column of a table.
pub fn padded(text: &str, width: usize) -> String {
    let pad = width.saturating_sub(columns(text));
    format!("{text}{}", " ".repeat(pad))
}

/// The columns `text` takes on a terminal ([`padded`]).
pub fn columns(text: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(text)
}

/// Whether `c` opens or closes a bidirectional embedding, override or isolate.
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// As [`printable`], keeping line breaks and tabs (`\n`, `\r`, `\t`): for text shown as a
/// block where they are layout, such as the web pages (`serve`). Bidirectional controls are
/// escaped as the CLI escapes them: a right-to-left override inside a title, a message or a
/// search snippet (`invoice_\u{202e}txt.exe`) drew as other text (`invoice_exe.txt`; outside
/// testing D6, session 42).
pub fn printable_block(text: &str) -> Cow<'_, str> {
    escape_controls(text, escaped_in_blocks)
}

/// Whether [`printable_block`] writes `c` as an escape: a control character other than a
/// line break or tab, or a bidirectional control.
pub fn escaped_in_blocks(c: char) -> bool {
    (c.is_control() && !matches!(c, '\n' | '\r' | '\t')) || is_bidi_control(c)
}

/// `text` with every character `escaped` picks written as a Rust escape (`\u{1b}`).
fn escape_controls(text: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether descriptor 1 was open when the process started. Rust's runtime puts `/dev/null`
/// in place of a closed one before `main`, so a command run with `>&-` printed into nothing
/// and exited 0 (`create` made a session whose generated id was lost); this is looked at
/// before that, by [`CHECK_STDOUT`].
static STDOUT_OPEN_AT_START: AtomicBool = AtomicBool::new(true);

/// Runs [`check_stdout`] as the process starts, before Rust's runtime (an ELF constructor).
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static CHECK_STDOUT: extern "C" fn() = check_stdout;

/// Records whether descriptor 1 is open (see [`STDOUT_OPEN_AT_START`]).
#[cfg(target_os = "linux")]
extern "C" fn check_stdout() {
    if rustix::io::fcntl_getfd(std::io::stdout()) == Err(rustix::io::Errno::BADF) {
        STDOUT_OPEN_AT_START.store(false, Ordering::Relaxed);
    }
}

/// Fails (status 1) when the process was started without stdout (`>&-`), before the
/// command does anything, so nothing changes and the failure is not silent.
///
/// # Errors
/// [`Failure`] with [`EXIT_OTHER`] when descriptor 1 was closed at start.
pub fn stdout_is_open() -> CliResult<()> {
    if STDOUT_OPEN_AT_START.load(Ordering::Relaxed) {
        Ok(())
    } else {
        Err(Failure::with_code(
            EXIT_OTHER,
            "stdout is closed: nothing could be printed (send it to /dev/null to discard it)",
        ))
    }
}

/// `path` quoted for a POSIX shell, unquoted when it is plainly safe.
pub fn shell_quote(path: &Path) -> String {
    let text = path.to_string_lossy();
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c);
    if !text.is_empty() && text.chars().all(safe) {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// `n` and the noun that goes with it: "1 batch", "2 batches", "0 batches".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A byte count for people: `512 B`, `1.5 KiB`, `3.2 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_when_needed() {
        assert_eq!(
            shell_quote(Path::new("/tmp/a-b/c.sqlite")),
            "/tmp/a-b/c.sqlite"
        );
        assert_eq!(shell_quote(Path::new("/tmp/a b")), "'/tmp/a b'");
        assert_eq!(shell_quote(Path::new("it's")), r"'it'\''s'");
    }

    #[test]
    fn a_preview_is_never_cut_inside_an_escape() {
        let text = format!("{}\u{202e}tail", "a".repeat(95));
        assert_eq!(
            sessions::preview(&text, 100),
            format!("{}…", "a".repeat(95))
        );
        assert_eq!(
            sessions::preview(&text, 103),
            format!("{}\\u{{202e}}…", "a".repeat(95))
        );
        assert_eq!(sessions::preview("short", 100), "short");
    }

    #[test]
    fn escapes_control_and_bidi_characters_only() {
        assert_eq!(printable("plain é"), "plain é");
        assert_eq!(
            printable("a\u{1b}[31mb\nc\u{9b}"),
            "a\\u{1b}[31mb\\nc\\u{9b}"
        );
        assert_eq!(
            printable("x\u{202e}y\u{2066}z\u{200f}"),
            "x\\u{202e}y\\u{2066}z\u{200f}"
        );
    }

    /// An error with a message and an optional source, to build chains.
    #[derive(Debug)]
    struct Chain(&'static str, Option<Box<Chain>>);

    impl std::fmt::Display for Chain {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Chain {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|c| c as _)
        }
    }

    #[test]
    fn one_line_prints_each_cause_once() {
        let chain = |texts: &[&'static str]| {
            texts
                .iter()
                .rev()
                .fold(None, |inner, text| Some(Box::new(Chain(text, inner))))
                .expect("a chain")
        };
        // The library's message already ends with its cause; SQLite's own error restates it.
        let corrupt = chain(&[
            "corrupt session store: SQLite reports: file is not a database",
            "file is not a database",
            "Error code 26: file is not a database",
        ]);
        assert_eq!(
            one_line(&*corrupt),
            "corrupt session store: SQLite reports: file is not a database"
        );
        // SQLite's bare code under an SQLite error with a message of its own: left out (a
        // full disk's `list` ended "…: Error code 4874: disk I/O error").
        let named = chain(&[
            "disk full: could not read /r/s/session.sqlite: no space left",
            "could not read /r/s/session.sqlite: no space left",
            "Error code 4874: disk I/O error",
        ]);
        assert_eq!(
            one_line(&*named),
            "disk full: could not read /r/s/session.sqlite: no space left"
        );
        // Text that only starts like it is kept.
        let not_code = chain(&["outer", "Error code x: y"]);
        assert_eq!(one_line(&*not_code), "outer: Error code x: y");
        // A cause that says more is kept, and so is its own cause.
        let io = chain(&["export failed", "open /x/y", "permission denied"]);
        assert_eq!(
            one_line(&*io),
            "export failed: open /x/y: permission denied"
        );
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
