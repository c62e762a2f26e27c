//! What the two fuzz targets check, in one place: the `cargo fuzz` targets under
//! `fuzz/fuzz_targets/` call these functions, and the stable test
//! `tests/reliability_fuzz_corpus.rs` includes this file as a module
//! (`#[path = "../fuzz/src/lib.rs"]`) to replay the committed corpus through them.
//!
//! Both take arbitrary bytes and must never panic: every `assert!` below is a property of
//! the library, so a panic is a library bug (or a broken promise), never bad input.
//!
//! - [`import_bytes`]: the bytes as an export file are imported into a fresh root, and the
//!   bytes as a session folder are replayed. An import that succeeds publishes exactly one
//!   session that verifies and replays to the same history as the bytes (when the bytes
//!   replay: their replay also checks the indexes derived from the log, which an import
//!   builds anew); a refused import leaves nothing behind.
//! - [`append_jsonl`]: the bytes as the JSON Lines input of `session-store append`. Each
//!   line that parses as a `Batch` is appended to one session: accepted whole (exactly its
//!   sequences), returned as the original commit (a retry), or refused with a bad-input
//!   error that changes nothing. After a flush and close the session replays to exactly
//!   the accepted commits and the live projection.
//!
//! Scratch files go to `/dev/shm` where it exists (fsyncs cost nothing there), else to the
//! system temp dir.

use std::borrow::Borrow;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use session_store::{
    Batch, Commit, CreateOptions, Error, ImportOptions, Root, SessionId, StoreOptions, replay_file,
    verify_file,
};

/// What [`import_bytes`] saw: each side's commit count, or its error's variant name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportReport {
    /// `Root::import` of the bytes as an export file.
    pub import: Result<usize, String>,
    /// `replay_file` of a session folder holding the bytes as `session.sqlite`.
    pub replay: Result<usize, String>,
}

/// What [`append_jsonl`] saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppendReport {
    /// Lines that were not blank.
    pub lines: usize,
    /// Lines that are not a `Batch` (serde_json refused them).
    pub unparsed: usize,
    /// Batches accepted as new commits.
    pub accepted: usize,
    /// Batches answered with an earlier commit (idempotent retries).
    pub retried: usize,
    /// Batches refused.
    pub refused: usize,
    /// Events of the accepted commits (the session's last sequence).
    pub events: u64,
}

/// A fresh scratch directory, on `/dev/shm` where possible.
fn scratch() -> tempfile::TempDir {
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix("session-store-fuzz-");
        b
    };
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = builder.tempdir_in(shm)
    {
        return dir;
    }
    builder.tempdir().expect("a scratch directory")
}

/// The variant name of an error (`Corrupt`, `InvalidInput`, …), for counting refusals.
pub fn error_kind(e: &Error) -> String {
    let debug = format!("{e:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// What identifies a commit's content, as one JSON line: every field but the events'
/// `content_ref` (set only on events read back from a blob).
fn fingerprints<C: Borrow<Commit>>(commits: &[C]) -> Vec<String> {
    commits
        .iter()
        .map(|c| {
            let mut commit: Commit = c.borrow().clone();
            commit.events.iter_mut().for_each(|e| e.content_ref = None);
            serde_json::to_string(&commit).expect("a commit serializes")
        })
        .collect()
}

/// Entries of a directory (none when it does not exist).
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Imports `data` as an export file into a fresh root and replays it as a session folder.
///
/// # Panics
/// When the library breaks a promise: an accepted import that does not replay or verify,
/// or replays to another history than the bytes; a refused import that leaves a session or
/// staging folder behind; or any panic inside the library.
pub fn import_bytes(data: &[u8]) -> ImportReport {
    let dir = scratch();
    let folder = dir.path().join("replay").join("sample");
    std::fs::create_dir_all(&folder).expect("create the replay folder");
    std::fs::write(folder.join("session.sqlite"), data).expect("write session.sqlite");
    let source = replay_file(&folder);

    let file = dir.path().join("in").join("export.sqlite");
    std::fs::create_dir_all(dir.path().join("in")).expect("create the import folder");
    std::fs::write(&file, data).expect("write the export file");
    let root = Root::open(dir.path().join("root")).expect("open a fresh root");
    let imported = root.import(&file, ImportOptions::default());

    let import = match imported {
        Ok(id) => {
            let copy = replay_file(root.session_dir(&id))
                .unwrap_or_else(|e| panic!("an imported session does not replay: {e}"));
            if let Err(e) = verify_file(root.session_dir(&id)) {
                panic!("an imported session does not verify: {e}");
            }
            // A file whose log is sound and whose history or turn index was edited does
            // not replay as it is, and imports sound (README): its copy was checked above.
            // The committed target took that for a broken promise (outside testing N2).
            if let Ok(source) = source.as_ref() {
                assert_eq!(
                    id, source.header.session_id,
                    "import changed the session id"
                );
                assert_eq!(
                    fingerprints(&copy.commits),
                    fingerprints(&source.commits),
                    "the imported history differs from the file's"
                );
                assert_eq!(
                    serde_json::to_string(&copy.projection).expect("projection"),
                    serde_json::to_string(&source.projection).expect("projection"),
                    "the imported session folds to another projection"
                );
            }
            assert_eq!(root.list_ids().expect("list"), vec![id]);
            Ok(copy.commits.len())
        }
        Err(e) => {
            assert!(
                root.list_ids().expect("list").is_empty(),
                "a refused import ({e}) left a session behind"
            );
            let staging = entries(&root.path().join(".staging"));
            assert!(
                staging.is_empty(),
                "a refused import ({e}) left staging entries {staging:?}"
            );
            Err(error_kind(&e))
        }
    };
    ImportReport {
        import,
        replay: source.map(|r| r.commits.len()).map_err(|e| error_kind(&e)),
    }
}

/// The refusals `Session::append` documents for a bad batch (the caller's mistake, or an
/// unknown required kind).
fn is_bad_input(e: &Error) -> bool {
    e.is_caller_error() || e.is_unsupported()
}

/// Appends every line of `data` that parses as a `Batch` to one fresh session (write-behind
/// of an hour: nothing drains before the flush), then flushes, closes and replays it.
///
/// # Panics
/// When the library breaks a promise: an accepted batch that does not take exactly its
/// sequences, a retry that changes the session or returns a commit never accepted, a refusal
/// that is not a bad-input error or changes the session, a flush that does not make every
/// accepted commit durable, or a replay that differs from what was accepted.
pub fn append_jsonl(data: &[u8]) -> AppendReport {
    let dir = scratch();
    let options = StoreOptions::default().with_write_behind(Duration::from_secs(3600));
    let root = Root::with_options(dir.path().join("root"), options).expect("open a fresh root");
    let id = SessionId::new("fuzz").expect("a valid id");
    let session = root
        .create(CreateOptions::with_id(id.clone()))
        .expect("create a session");
    let projection =
        |s: &session_store::Session| s.with_projection(|p| serde_json::to_string(p).expect("json"));
    let mut report = AppendReport::default();
    let mut accepted: Vec<Arc<Commit>> = Vec::new();
    for line in data.split(|&b| b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        report.lines += 1;
        let Ok(batch) = serde_json::from_slice::<Batch>(line) else {
            report.unparsed += 1;
            continue;
        };
        let n = batch.events.len() as u64;
        let before = session.sequences();
        let before_projection = projection(&session);
        let result = session.append(batch);
        let unchanged = session.sequences() == before && projection(&session) == before_projection;
        match result {
            Ok(commit) if commit.first_seq > before.0 => {
                assert_eq!(commit.first_seq, before.0 + 1, "a gap before a commit");
                assert_eq!(commit.events.len() as u64, n, "a commit lost events");
                assert_eq!(
                    session.sequences().0,
                    before.0 + n,
                    "a commit took other sequences than its events"
                );
                report.accepted += 1;
                accepted.push(commit);
            }
            Ok(commit) => {
                assert!(unchanged, "an idempotent retry changed the session");
                assert!(
                    accepted.iter().any(|c| c.commit_id == commit.commit_id
                        && c.operation_id == commit.operation_id),
                    "a retry returned a commit that was never accepted"
                );
                report.retried += 1;
            }
            Err(e) => {
                assert!(is_bad_input(&e), "a batch refused with {e:?}");
                assert!(unchanged, "a refused batch ({e}) changed the session");
                report.refused += 1;
            }
        }
    }
    let last = session.sequences().0;
    assert_eq!(
        session.flush().expect("flush"),
        last,
        "flush left commits behind"
    );
    let live = projection(&session);
    session.close().expect("close");
    drop(session);

    let replayed = replay_file(root.session_dir(&id))
        .unwrap_or_else(|e| panic!("the appended session does not replay: {e}"));
    assert_eq!(
        fingerprints(&replayed.commits),
        fingerprints(&accepted),
        "the session replays to other commits than were accepted"
    );
    assert_eq!(
        replayed.commits.last().map_or(0, Commit::last_seq),
        last,
        "the replayed log ends elsewhere"
    );
    assert_eq!(
        serde_json::to_string(&replayed.projection).expect("projection"),
        live,
        "the replayed projection differs from the live one"
    );
    let cold = root
        .open_reader(&id)
        .and_then(|r| r.projection())
        .unwrap_or_else(|e| panic!("a cold reader cannot fold the session: {e}"));
    assert_eq!(
        serde_json::to_string(&cold).expect("projection"),
        live,
        "a cold reader folds another projection"
    );
    report.events = last;
    report
}
