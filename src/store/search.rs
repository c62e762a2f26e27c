//! The full-text search index of a root: `<root>/.catalog/search.sqlite`, derived from the
//! session files like the catalog and rebuildable from them at any time; never the source
//! of truth. Every SQL statement on it is here.
//!
//! - `search_text`: a contentless FTS5 table (`content=''`, `detail=full` for phrases) over
//!   the text of each indexed message and title. `columnsize=0`: no per-row token count,
//!   so bm25 ranks without length normalisation but reads no `docsize` row per match
//!   (about 10x cheaper on a frequent word). It keeps the inverted index only, so its
//!   bytes stay well under the text's; snippets are cut from the messages read back
//!   through the session's reader. Plain contentless (no `contentless_delete`, which needs
//!   SQLite 3.43): the file stays readable and searchable by older SQLite shells (Debian's
//!   3.40). Its rows are never deleted; a row is live only while `search_rows` has its id.
//!   A replaced message, a reset transcript or a deleted session leave dead FTS rows that
//!   no search returns, reclaimed by the next rebuild.
//! - `search_rows`: what a hit needs to be found again and filtered (session key, transcript
//!   position — 0 for the title —, event sequence, time, role: a small integer for the
//!   usual roles, else the text), one row per live FTS row. A message that a later row at
//!   its position or a transcript reset superseded keeps its row, with `until_seq` (the
//!   sequence that superseded it): forks cut before that still show it, and are found
//!   through it (a search skips such a row unless a fork's inherited range holds it).
//!   The message id is not copied: a hit reads its message back for the snippet anyway.
//! - `search_sessions`: one row per indexed session (cwd, title, and `indexed_seq`, the
//!   last sequence of its own file the index holds: catching up reads only what follows).
//! - `search_lineage`: the ranges each fork inherits, to list the forks that share a hit
//!   found in an ancestor's file and to search one session with its inherited part.
//! - `search_resets`: the sequence of every transcript reset of each session's own file
//!   (a fork shows an inherited message unless a reset within what it inherits, or of its
//!   own, came after it; one reset per session, its last, was kept before, so a fork cut
//!   between two resets of its parent was said to show what the first one dropped).
//! - `search_dead_writers`: for each session caught up after its writer died (killed
//!   between a drain and its index write), the stamp of the record that writer left in
//!   `writer.lock`, so the session is read for that writer once (`persistence::search`).
//! - `search_births`: the creation time of each indexed session, so that a session deleted
//!   and made again under its id behind the index's back is not taken for the one indexed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::model::Message;
use crate::model::SessionId;
use crate::model::projection::HistoryChange;
use crate::model::search::{index_text, message_text};
use crate::store::hit_files::HitFiles;
use crate::store::read::LineageEntry;
use crate::store::reader::{OwnChanges, SessionReader};
use crate::store::schema;
use crate::store::write::Accepted;

/// The index file, in the catalog's folder.
pub(crate) const SEARCH_FILE: &str = "search.sqlite";
/// The index file and SQLite's files beside it.
pub(crate) const SEARCH_FILES: [&str; 4] = [
    "search.sqlite",
    "search.sqlite-wal",
    "search.sqlite-shm",
    "search.sqlite-journal",
];
/// `PRAGMA user_version` of an index that a fill ([`SearchIndex::rebuild`]) completed: set
/// in the fill's own transaction, so an index whose first fill was interrupted (a search
/// killed while it filled a new index) is 0 and is filled again by the next search. An
/// index an earlier build filled (1: before a Responses-API item's tool call, output and
/// reasoning summary were text to search; 2: before emoji were words, `model::search::
/// index_text`, and before a text with a lone surrogate escape was indexed; 3: before each
/// Han, kana and Hangul letter was a word of its own; 4: before text was indexed in its
/// compatibility form, full-width letters and ligatures as their letters and `ß` as `ss`;
/// 5: before the damaged events a fill left out were recorded in `search_damage`) is
/// filled again the same way.
const FILLED: i64 = 6;

/// A session the index recorded as damaged when it indexed it
/// ([`SearchIndex::damaged_sessions`]).
pub(crate) struct DamagedSession {
    /// The session.
    pub id: SessionId,
    /// When the session the index holds under that id was made (ms), when recorded: a
    /// session made again since under the id is another one.
    pub born: Option<i64>,
    /// What was found, as an [`Error::Corrupt`] saying its messages there are left out.
    pub error: Error,
}

/// `PRAGMA application_id` of a search index ("SeSF").
const SEARCH_APPLICATION_ID: i32 = 0x5365_5346;
/// How long an index write waits for another process's (a drain gives up after this and
/// the index catches up later).
const BUSY: Duration = Duration::from_millis(250);
/// An unfiltered search ranks this many FTS rows per hit wanted before it joins them
/// (dead rows among them are skipped; when too many are dead, every match is joined).
const CANDIDATES: usize = 4;
/// Connections to session files kept open for reading hits back, at most.
const KEPT_FILES: usize = 64;

/// Connections to session files kept open for reading hits back: [`KEPT_FILES`], or one
/// per 16 of the process's file descriptors when that is fewer (each holds up to three:
/// the file, its `-wal` and `-shm`). Under `ulimit -n 40` the 64 kept files held every
/// descriptor a server had, and each of its later pages failed with "Too many open files".
fn kept_files() -> usize {
    use rustix::process::{Resource, getrlimit};
    getrlimit(Resource::Nofile)
        .current
        .and_then(|limit| usize::try_from(limit / 16).ok())
        .map_or(KEPT_FILES, |n| n.clamp(1, KEPT_FILES))
}

const SEARCH_SCHEMA: &str = "
CREATE TABLE search_sessions (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL UNIQUE,
    cwd         TEXT,
    title       TEXT NOT NULL,
    indexed_seq INTEGER NOT NULL
);
CREATE TABLE search_resets (
    session INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE search_lineage (
    ancestor_id TEXT NOT NULL,
    session     INTEGER NOT NULL,
    after_seq   INTEGER NOT NULL,
    through_seq INTEGER NOT NULL,
    PRIMARY KEY (ancestor_id, session, after_seq)
) WITHOUT ROWID;
CREATE INDEX search_lineage_of ON search_lineage (session);
CREATE TABLE search_rows (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    session    INTEGER NOT NULL,
    position   INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    time_ms    INTEGER NOT NULL,
    role,
    until_seq  INTEGER
);
CREATE INDEX search_rows_at ON search_rows (session, position, seq);
CREATE VIRTUAL TABLE search_text USING fts5(
    text, content = '', detail = full, columnsize = 0,
    tokenize = 'unicode61 remove_diacritics 2'
);";

/// Opens the index file at `path`, creating its schema when the file is new (one
/// immediate transaction, so two processes creating it agree). A file that is not such
/// an index is [`Error::Corrupt`] (the caller replaces it: the index is derived).
pub(crate) fn open_index(path: &Path) -> Result<Connection> {
    let conn = schema::open_derived(
        path,
        &schema::DerivedFile {
            application_id: SEARCH_APPLICATION_ID,
            schema: SEARCH_SCHEMA,
            probe: "SELECT s.session_id, s.cwd, s.title, s.indexed_seq, x.seq, r.position, r.seq,
                           r.time_ms, r.role, r.until_seq, l.ancestor_id, l.after_seq,
                           l.through_seq
                    FROM search_sessions s, search_rows r, search_lineage l, search_text t,
                         search_resets x
                    LIMIT 0",
            what: "a search index",
            // A rebuild gives the pages it frees back to the disk.
            incremental_vacuum: true,
        },
    )?;
    conn.busy_timeout(BUSY)?;
    // Not in `SEARCH_SCHEMA`'s probe: an index made before it gets it here, not refilled.
    // Best effort: without it (another process's long write holds the index), dead
    // writers' sessions are caught up again rather than remembered.
    let _ = conn.execute_batch(DEAD_WRITERS_SCHEMA);
    // An index filled before it (`FILLED` 5) is filled again, which records the damage.
    conn.execute_batch(DAMAGE_SCHEMA)?;
    // Not refilled either: a session indexed before it is taken for the one indexed, as
    // before, until it is registered again.
    conn.execute_batch(BIRTHS_SCHEMA)?;
    Ok(conn)
}

/// `search_births`: the creation time (`header.created_at`, ms) of each session the index
/// holds. The index tells sessions apart by id: a session deleted and made again under its
/// id while the index could not be written (another user's), or while a `serve` over a
/// private index ran, kept the old session's rows; a search for an old word read back the
/// new session's message at its position, and the new session's messages up to the old
/// one's last sequence were found by no search (outside testing, session 44, N5).
const BIRTHS_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS search_births (
    session_id TEXT PRIMARY KEY,
    created_ms INTEGER NOT NULL
) WITHOUT ROWID;";

/// `search_damage`: for each session whose own file held a damaged event when it was
/// indexed (the row not matching its check, a message that does not parse), what was
/// found (the first one). Those events are left out of the index; every search names the
/// session in its `skipped` (outside testing, session 43: a search of a root indexed after
/// the damage left the message out without a word, while `list` and `verify` named it).
const DAMAGE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS search_damage (
    session_id TEXT PRIMARY KEY,
    error      TEXT NOT NULL
) WITHOUT ROWID;";

/// `search_dead_writers`: for each session caught up after its writer died, the stamp of
/// the record that writer left in `writer.lock` ([`LockStamp`], as text).
const DEAD_WRITERS_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS search_dead_writers (
    session_id TEXT PRIMARY KEY,
    stamp      TEXT NOT NULL
) WITHOUT ROWID;";

/// A [`LockStamp`] as `search_dead_writers` keeps it.
fn stamp_text((dev, ino, size, secs, nanos): LockStamp) -> String {
    format!("{dev}:{ino}:{size}:{secs}.{nanos:09}")
}

/// A root's search index: a connection for index writes and one for searches (so a
/// search never waits for a drain's index write, nor the reverse), each opened by
/// [`open_index`]; and the connections to session files that read hits back, kept
/// between searches ([`HitFiles`]).
#[derive(Debug)]
pub(crate) struct SearchIndex {
    path: PathBuf,
    /// The folder of a private index ([`SearchIndex::open_private`]), removed with it.
    private_dir: Option<PathBuf>,
    write: Mutex<Connection>,
    read: Mutex<Connection>,
    files: HitFiles,
    /// Whether a search of this process has used the index yet
    /// ([`SearchIndex::first_search`]).
    searched: AtomicBool,
    /// Sessions a writer of this process closed while the index lacked some of their
    /// commits ([`SearchIndex::note_behind`]): the next search catches them up.
    behind: Mutex<Vec<SessionId>>,
    /// For a private index, the stamp of each session's files when it was last caught up
    /// ([`SearchIndex::files_changed`]).
    seen_files: Mutex<HashMap<SessionId, FilesStamp>>,
}

/// Size and modification time (s, ns) of a session's file and of its `-wal`: every commit
/// changes one of them.
pub(crate) type FilesStamp = [(u64, i64, i64); 2];

/// Device, inode, size and modification time (s, ns) of a session's `writer.lock` holding
/// a record: a writer rewrites it when it takes the lock, so another writer's record has
/// another stamp.
pub(crate) type LockStamp = (u64, u64, u64, i64, i64);

/// A root's search index once opened; shared by the root with its live sessions, which
/// index each drain once it is set.
pub(crate) type IndexSlot = Arc<OnceLock<Arc<SearchIndex>>>;

/// The index at `path` opened into `slot`, when `slot` holds none and `path` is a regular
/// file: for a live session whose root had no index when it opened (a search made it
/// since). `None` when there is none, it cannot be opened (derived data: best effort;
/// a damaged one is a search's to replace) or a newer build filled it
/// ([`SearchIndex::is_newer`]).
pub(crate) fn open_made(slot: &IndexSlot, path: &Path) -> Option<Arc<SearchIndex>> {
    if let Some(index) = slot.get() {
        return Some(Arc::clone(index));
    }
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let index = Arc::new(SearchIndex::open(path).ok()?);
    if index.is_newer().unwrap_or(true) {
        return None;
    }
    // A search of this process may have set it meanwhile: the first one set is kept.
    let _ = slot.set(index);
    slot.get().map(Arc::clone)
}

/// One hit as the index has it (the snippet is cut by the caller from the message).
#[derive(Clone, Debug)]
pub(crate) struct IndexHit {
    /// Key of the row (the keyset cursor's last part).
    pub row: i64,
    /// The session whose file holds the message.
    pub session_id: SessionId,
    /// That session's title.
    pub title: String,
    /// Transcript position (0 for the title).
    pub position: u64,
    /// The event that put the message there.
    pub seq: u64,
    /// The message's role (`title` for the title).
    pub role: Option<String>,
    /// Time of the commit (ms since the Unix epoch).
    pub time_ms: i64,
    /// bm25 (lower is better).
    pub rank: f64,
    /// 0 when the row matched the query's words as one exact phrase, else 1.
    pub tier: i64,
    /// Whether the message is in its own session's transcript (else only forks cut before
    /// what superseded it show it).
    pub own: bool,
}

/// What a search looks for, besides the query.
#[derive(Clone, Debug, Default)]
pub(crate) struct IndexFilter<'a> {
    /// Only this session's messages (its own and those it inherits).
    pub session: Option<&'a SessionId>,
    /// Only sessions with this working directory.
    pub cwd: Option<&'a str>,
    /// Only messages committed at or after this time (ms).
    pub since_ms: Option<i64>,
    /// Only messages with this role (`title` for titles), in ASCII lower case: a role
    /// stored in any case matches.
    pub role: Option<&'a str>,
    /// Keyset: only hits after this `(tier, row)` (the row ranked again as the index is
    /// now: see [`reanchor`]).
    pub after: Option<(i64, i64)>,
    /// At most this many hits.
    pub limit: usize,
}

/// One change to a session's part of the index, in sequence order.
enum Change<'a> {
    /// The transcript was replaced (at event `seq`): every earlier message is gone.
    Reset { seq: u64 },
    /// `message` is now at `position`.
    Put {
        position: u64,
        seq: u64,
        role: Option<&'a str>,
        text: String,
        time_ms: i64,
    },
    /// A new title.
    Title {
        seq: u64,
        title: String,
        time_ms: i64,
    },
}

#[derive(serde::Deserialize)]
struct TitlePayload {
    title: String,
}

/// Roles stored as their index here (others as their text): 1-2 bytes a row, not 4-9.
const ROLES: [&str; 5] = ["title", "user", "assistant", "tool", "system"];

/// A role as stored in `search_rows.role`.
fn role_value(role: Option<&str>) -> Value {
    match role {
        None => Value::Null,
        Some(r) => ROLES
            .iter()
            .position(|known| *known == r)
            .map_or_else(|| Value::Text(r.to_owned()), |i| Value::Integer(i as i64)),
    }
}

/// SQL: the stored index of the role `?2` (a known role, given in lower case), NULL for
/// another. A role filter matches a stored index through it and a stored text ignoring
/// ASCII case.
fn known_role() -> String {
    let arms: String = ROLES
        .iter()
        .enumerate()
        .map(|(i, r)| format!(" WHEN '{r}' THEN {i}"))
        .collect();
    format!("(CASE ?2{arms} END)")
}

/// A role read back from `search_rows.role`.
fn role_of(value: Value) -> Option<String> {
    match value {
        Value::Integer(i) => usize::try_from(i)
            .ok()
            .and_then(|i| ROLES.get(i))
            .map(|r| (*r).to_owned()),
        Value::Text(t) => Some(t),
        _ => None,
    }
}

/// Start of the name of a private index's folder, followed by `<pid>-<random hex>`.
const PRIVATE_PREFIX: &str = "session-store-search-";

/// Removes the private index folders in `temp` whose process is gone (one killed before
/// it could remove its own). Best effort.
fn remove_private_of_dead_processes(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(PRIVATE_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
            && entry.file_type().is_ok_and(|t| t.is_dir())
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for SearchIndex {
    fn drop(&mut self) {
        if let Some(dir) = &self.private_dir {
            // Best effort: the connections close right after (their files unlinked).
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An FTS5 error (a query it refuses) as [`Error::InvalidInput`]; anything else as is.
fn query_error(e: rusqlite::Error) -> Error {
    let text = e.to_string();
    if text.contains("fts5") {
        Error::invalid(format!("invalid search query: {text}"))
    } else {
        e.into()
    }
}

impl SearchIndex {
    /// The index at `path`, its two connections opened.
    ///
    /// # Errors
    /// As [`open_index`].
    pub(crate) fn open(path: &Path) -> Result<SearchIndex> {
        Ok(SearchIndex {
            path: path.to_path_buf(),
            private_dir: None,
            write: Mutex::new(open_index(path)?),
            read: Mutex::new(open_index(path)?),
            files: HitFiles::new(kept_files()),
            searched: AtomicBool::new(false),
            behind: Mutex::default(),
            seen_files: Mutex::default(),
        })
    }

    /// Whether this is a private index ([`SearchIndex::open_private`]): no writer keeps it
    /// current, so its owner catches up the sessions whose files changed
    /// ([`SearchIndex::files_changed`]).
    pub(crate) fn is_private(&self) -> bool {
        self.private_dir.is_some()
    }

    /// Whether session `id`'s files have `stamp` for the first time since this index
    /// last asked (then noted): the session is to be caught up. [`SearchIndex::files_seen_again`]
    /// forgets a stamp whose catch-up failed.
    pub(crate) fn files_changed(&self, id: &SessionId, stamp: FilesStamp) -> bool {
        lock(&self.seen_files).insert(id.clone(), stamp) != Some(stamp)
    }

    /// Forgets the stamp of session `id`'s files, so that the next call of
    /// [`SearchIndex::files_changed`] catches it up again.
    pub(crate) fn files_seen_again(&self, id: &SessionId) {
        lock(&self.seen_files).remove(id);
    }

    /// Whether the index file is damaged ([`schema::is_damaged`]).
    pub(crate) fn is_damaged(&self) -> bool {
        schema::is_damaged(&lock(&self.read))
    }

    /// Puts a new, empty index file in place of a damaged one: this index's connections
    /// are closed, its files removed (a root's by `unlink_root_files`, which confines the
    /// removal to the root's catalog folder; a private index's here), and new connections
    /// open (creating) the file at the same path. The caller fills it. Another process's
    /// connections to the old file write into it until they open the index again (what
    /// they wrote is caught up by the next writer open, a dead writer's catch-up or a
    /// rebuild).
    pub(crate) fn replace_file(
        &self,
        unlink_root_files: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut write = lock(&self.write);
        let mut read = lock(&self.read);
        *write = Connection::open_in_memory()?;
        *read = Connection::open_in_memory()?;
        match &self.private_dir {
            Some(dir) => {
                for name in SEARCH_FILES {
                    let file = dir.join(name);
                    match std::fs::remove_file(&file) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(Error::io(format!("remove {}", file.display()), e));
                        }
                        _ => {}
                    }
                }
            }
            None => unlink_root_files()?,
        }
        *write = open_index(&self.path)?;
        *read = open_index(&self.path)?;
        Ok(())
    }

    /// `true` the first time it is asked in this process (the first search of this
    /// index), then `false`.
    pub(crate) fn first_search(&self) -> bool {
        !self.searched.swap(true, Ordering::AcqRel)
    }

    /// Whether session `id` was caught up since its dead writer left the record whose
    /// stamp is `stamp` ([`SearchIndex::caught_up_dead_writer`]): that writer's commits
    /// are in the index. `false` when this cannot be read.
    pub(crate) fn dead_writer_caught_up(&self, id: &SessionId, stamp: LockStamp) -> bool {
        let conn = lock(&self.read);
        conn.prepare_cached("SELECT stamp FROM search_dead_writers WHERE session_id = ?1")
            .and_then(|mut stmt| {
                stmt.query_row(params![id.as_str()], |r| r.get::<_, String>(0))
                    .optional()
            })
            .is_ok_and(|known| known.as_deref() == Some(stamp_text(stamp).as_str()))
    }

    /// Notes that session `id`, whose dead writer's record has `stamp`, was caught up, so
    /// that no later search (of this process or another) reads the session for it again
    /// until another writer records itself there. Best effort.
    pub(crate) fn caught_up_dead_writer(&self, id: &SessionId, stamp: LockStamp) {
        let conn = lock(&self.write);
        let _ = conn
            .prepare_cached(
                "INSERT OR REPLACE INTO search_dead_writers (session_id, stamp) VALUES (?1, ?2)",
            )
            .and_then(|mut stmt| stmt.execute(params![id.as_str(), stamp_text(stamp)]));
    }

    /// A new, empty index of this process alone, in a folder of its own (mode 0700) under
    /// the system's temporary folder, removed when the index is dropped: for a root whose
    /// own index cannot be opened or created (a root this process may only read).
    ///
    /// # Errors
    /// [`Error::Io`] when the folder cannot be created; as [`open_index`].
    pub(crate) fn open_private() -> Result<SearchIndex> {
        use std::os::unix::fs::DirBuilderExt;
        let temp = std::env::temp_dir();
        remove_private_of_dead_processes(&temp);
        let dir = temp.join(format!(
            "{PRIVATE_PREFIX}{}-{:016x}",
            std::process::id(),
            crate::model::ids::random_u64()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let mut index = SearchIndex::open(&dir.join(SEARCH_FILE)).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        index.private_dir = Some(dir);
        Ok(index)
    }

    /// The messages of hits held by the session file `file`, at `wanted` `(position,
    /// event seq)` pairs, each `None` when gone or (with `current`) no longer current in
    /// that file; on a kept connection to that same file when there is one.
    ///
    /// # Errors
    /// As [`HitFiles::messages_at`]: [`Error::SessionNotFound`] when the file is gone.
    pub(crate) fn hit_messages(
        &self,
        file: &Path,
        wanted: &[(u64, u64)],
        current: bool,
    ) -> Result<Vec<Option<Arc<Message>>>> {
        self.files.messages_at(file, wanted, current)
    }

    /// Closes the kept connection to `file` (its session was deleted).
    pub(crate) fn release_file(&self, file: &Path) {
        self.files.release(file);
    }

    /// Indexes the commits a drain just wrote for `reader`'s session, from memory. When
    /// the index is behind (an earlier index write failed, a writer died, a rebuild ran)
    /// it catches up from the file instead, which already holds `batch`.
    ///
    /// # Errors
    /// SQLite errors (busy after [`BUSY`]); the caller ignores them: the next drain, the
    /// next open or a rebuild catches up.
    pub(crate) fn index_drained(
        &self,
        reader: &SessionReader,
        batch: &[Arc<Accepted>],
    ) -> Result<()> {
        let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
            return Ok(());
        };
        let header = reader.header();
        let mut conn = lock(&self.write);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let Some((key, indexed)) = session_state(&tx, &header.session_id, header.created_at_ms)?
        else {
            drop(tx);
            drop(conn);
            return self.catch_up(reader).map(drop);
        };
        if indexed >= last.commit.last_seq() {
            return Ok(());
        }
        if first.commit.first_seq > indexed + 1 {
            drop(tx);
            drop(conn);
            return self.catch_up(reader).map(drop);
        }
        let mut changes = Vec::new();
        for accepted in batch.iter().filter(|a| a.commit.first_seq > indexed) {
            let c = &accepted.commit;
            for change in &accepted.history {
                changes.push(match change {
                    HistoryChange::Reset { seq } => Change::Reset { seq: *seq },
                    HistoryChange::Put {
                        seq,
                        position,
                        message,
                        ..
                    } => Change::Put {
                        position: *position,
                        seq: *seq,
                        role: message.role(),
                        text: message_text(message),
                        time_ms: c.created_at_ms,
                    },
                });
            }
            for (i, e) in c.events.iter().enumerate() {
                if e.kind == "session/title"
                    && let Some(text) = e.payload_str()
                    && let Ok(t) = serde_json::from_str::<TitlePayload>(text)
                {
                    changes.push(Change::Title {
                        seq: c.first_seq + i as u64,
                        title: t.title,
                        time_ms: c.created_at_ms,
                    });
                }
            }
        }
        apply(&tx, key, &changes, None)?;
        set_indexed(&tx, key, last.commit.last_seq())?;
        tx.commit()?;
        Ok(())
    }

    /// Brings `reader`'s session up to date in the index: registers it when the index
    /// does not know it (or when its lineage changed: an ancestor was deleted and its
    /// range copied into this file), then indexes what its own file holds after the last
    /// indexed sequence. Idempotent; a write that raced with it is caught up next time.
    /// Returns whether it wrote anything to the index.
    ///
    /// # Errors
    /// Read errors of the session; SQLite errors of the index.
    pub(crate) fn catch_up(&self, reader: &SessionReader) -> Result<bool> {
        self.catch_up_from(reader, None)
            .map_err(|e| index_busy(e, &self.path))
    }

    /// [`SearchIndex::catch_up`] that stops when `cancel` fires, writing nothing
    /// ([`Error::Cancelled`]): the session is then one the index holds nothing of (when it
    /// held nothing before), which the next process's first search catches up. For the
    /// indexing an `import` does after it published (10 s of a 200 MB session, which
    /// Ctrl-C could not stop: outside testing I2).
    pub(crate) fn catch_up_unless_cancelled(
        &self,
        reader: &SessionReader,
        cancel: &CancelToken,
    ) -> Result<bool> {
        self.catch_up_from(reader, Some(cancel))
            .map_err(|e| index_busy(e, &self.path))
    }

    /// [`SearchIndex::catch_up`], its errors as they come, stopping when `cancel` fires.
    fn catch_up_from(&self, reader: &SessionReader, cancel: Option<&CancelToken>) -> Result<bool> {
        let (id, born) = (&reader.header().session_id, reader.header().created_at_ms);
        let lineage = reader.lineage();
        let durable = reader.durable_sequence()?;
        let known = {
            let conn = lock(&self.write);
            match session_state(&conn, id, born)? {
                // Indexed past the file's end: the file lost commits since (an OS crash
                // under `ProcessCrash`, a copy put back), so its rows are made anew (the
                // lost messages were still found, and what was written after them not).
                // A session indexed with a damaged event is read anew: its file may have been
                // repaired or put back since (session 43: it stayed "skipped" in every search,
                // its message never found, until a rebuild).
                Some((key, indexed))
                    if indexed <= durable
                        && stored_lineage(&conn, key)? == lineage
                        && !has_damage(&conn, id)? =>
                {
                    Some((key, indexed))
                }
                _ => None,
            }
        };
        let after = known.map_or(0, |(_, indexed)| indexed);
        let own = reader.own_changes(after)?;
        if known.is_some() && own.through <= after {
            return Ok(false);
        }
        if cancel.is_some_and(CancelToken::is_cancelled) {
            return Err(Error::Cancelled);
        }
        let title = match known {
            None if own.titles.is_empty() => reader.inherited_title()?,
            _ => String::new(),
        };
        let mut conn = lock(&self.write);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let key = match known {
            Some((key, indexed)) => {
                // Another writer of the index moved on meanwhile: leave it to the next
                // catch-up rather than apply rows twice.
                if session_state(&tx, id, born)? != Some((key, indexed)) {
                    return Ok(false);
                }
                key
            }
            None => register(&tx, reader, &lineage, &title)?,
        };
        apply(&tx, key, &changes_of(&own), cancel)?;
        record_damage(&tx, id, own.damage.as_ref())?;
        record_birth(&tx, id, born)?;
        carry_titles(&tx, TitleScope::Session(key))?;
        set_indexed(&tx, key, own.through.max(reader.inherited_events()))?;
        tx.commit()?;
        Ok(true)
    }

    /// Drops a session from the index (its FTS rows stay, dead, until a rebuild).
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn forget(&self, id: &SessionId) -> Result<()> {
        let mut conn = lock(&self.write);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        forget_in(&tx, id)?;
        tx.prepare_cached("DELETE FROM search_dead_writers WHERE session_id = ?1")?
            .execute([id.as_str()])?;
        tx.commit()?;
        Ok(())
    }

    /// Empties the index (dead FTS rows included), then indexes each session `readers`
    /// yields (its id and its reader) and merges the FTS segments, all in one transaction on a connection of its own: searches meanwhile see
    /// the previous index whole, and a drain's index write that cannot wait is caught up
    /// later. Returns how many sessions were indexed; a session that cannot be read is
    /// passed to `skipped` with its error and left out.
    ///
    /// # Errors
    /// SQLite errors of the index; a session's error that is the process's
    /// ([`Error::is_exhaustion`]), with the index left as it was.
    pub(crate) fn rebuild(
        &self,
        fill: Fill,
        readers: impl Iterator<Item = (SessionId, Result<SessionReader>)>,
        mut skipped: impl FnMut(SessionId, Error),
    ) -> Result<usize> {
        let wait = match fill {
            Fill::Anew => REBUILD_WAIT,
            Fill::UnlessFilled => FILL_WAIT,
        };
        let mut conn = open_index(&self.path)?;
        conn.busy_timeout(wait)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| index_held(e.into(), &self.path, wait))?;
        // Another process's fill, waited for, is this one's: filling it again took as
        // long again (outside testing W1).
        if fill == Fill::UnlessFilled
            && tx.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))? == FILLED
        {
            return Ok(0);
        }
        tx.execute_batch(
            "DELETE FROM search_rows; DELETE FROM search_lineage; DELETE FROM search_sessions;
             DELETE FROM search_resets; DELETE FROM search_dead_writers;
             DELETE FROM search_damage; DELETE FROM search_births;
             INSERT INTO search_text (search_text) VALUES ('delete-all');",
        )?;
        let mut count = 0;
        for (id, reader) in readers {
            let indexed = reader.and_then(|reader| {
                let own = reader.own_changes(0)?;
                let title = if own.titles.is_empty() {
                    reader.inherited_title()?
                } else {
                    String::new()
                };
                let key = register(&tx, &reader, &reader.lineage(), &title)?;
                apply(&tx, key, &changes_of(&own), None)?;
                record_damage(&tx, &id, own.damage.as_ref())?;
                record_birth(&tx, &id, reader.header().created_at_ms)?;
                set_indexed(&tx, key, own.through.max(reader.inherited_events()))
            });
            match indexed {
                Ok(()) => count += 1,
                // Out of descriptors, memory or disk: the session is not unreadable, and
                // an index marked filled without it (every session, when descriptors ran
                // out) answered "no matches" for good. Nothing is kept; the next search
                // fills it again.
                Err(e) if e.is_exhaustion() => return Err(e),
                Err(e) => skipped(id, e),
            }
        }
        carry_titles(&tx, TitleScope::All)?;
        // One b-tree per term instead of the many segments a bulk load leaves: smaller,
        // and a query reads fewer pages.
        tx.execute(
            "INSERT INTO search_text (search_text) VALUES ('optimize')",
            [],
        )?;
        tx.pragma_update(None, "user_version", FILLED)?;
        tx.commit()?;
        // Best effort: the pages the merge freed go back to the disk, the main file is
        // complete on its own and the WAL emptied.
        let _ = schema::incremental_vacuum(&conn, 0);
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        Ok(count)
    }

    /// Whether a fill ([`SearchIndex::rebuild`]) of this index ran to its end: an index
    /// created but never filled (its first search killed while it filled it, or an index
    /// file written before this mark existed) holds only what writers added since.
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn is_filled(&self) -> Result<bool> {
        Ok(self.filled_mark()? == FILLED)
    }

    /// The mark of the build whose fill completed ([`FILLED`]'s value then; 0 for none).
    fn filled_mark(&self) -> Result<i64> {
        let conn = lock(&self.read);
        Ok(conn.pragma_query_value(None, "user_version", |r| r.get(0))?)
    }

    /// Whether a newer build filled this index (its mark is above this build's
    /// [`FILLED`]): it indexes by rules this build does not know, so this build neither
    /// fills it again nor writes rows into it. Each build took the other's index for one
    /// never filled and filled it again, back and forth at every switch of build on a root
    /// (4-15 s for 200,000 messages), and wrote rows of its own rules into it (outside
    /// testing M5 and M3, mixed versions).
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn is_newer(&self) -> Result<bool> {
        Ok(self.filled_mark()? > FILLED)
    }

    /// Hits for the FTS5 expression `fts` (built by `model::search`, every term quoted),
    /// best first: rows matching `phrase` (the words as one exact phrase) first, then by
    /// bm25, then by row.
    ///
    /// Without filters, the best [`CANDIDATES`] x `limit` FTS rows are ranked inside FTS5
    /// first and only those are looked up in `search_rows` and `search_sessions`: a
    /// frequent word's matches are scored, but not each joined (the join of every match
    /// was most of a one-word search). When too many of those candidates are dead rows
    /// (a replaced message, a deleted session) for a full page, or with a filter (which
    /// needs each match's row), every match is joined, filtered and ranked.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an expression FTS5 refuses; SQLite errors.
    pub(crate) fn search(
        &self,
        fts: &str,
        phrase: Option<&str>,
        filter: &IndexFilter<'_>,
    ) -> Result<Vec<IndexHit>> {
        let tier = if phrase.is_some() {
            "CASE WHEN rowid IN (SELECT rowid FROM search_text WHERE search_text MATCH ?10)
                  THEN 0 ELSE 1 END"
        } else {
            "1 + 0 * length(?10)"
        };
        // bm25 can be NaN (NULL in SQL) for a row lacking one of an OR's terms: with
        // `columnsize=0` it takes each row's length as -1, so when the rows average
        // exactly 3 words its length factor is 0 and an absent term scores 0/0. Such a
        // row ranks 0, after the rows holding every term (bm25 is negative).
        let live = live_row();
        let matches = format!(
            "SELECT rowid AS id, coalesce(bm25(search_text), 0) AS score, {tier} AS tier
             FROM search_text WHERE search_text MATCH ?1"
        );
        let conn = lock(&self.read);
        // One read transaction: the cursor's row is ranked on the same index as the page.
        let read = conn.unchecked_transaction()?;
        let after = match filter.after {
            Some(after) => Some(reanchor(&read, fts, phrase, after)?),
            None => None,
        };
        let unfiltered = filter.session.is_none()
            && filter.cwd.is_none()
            && filter.since_ms.is_none()
            && filter.role.is_none();
        if unfiltered {
            let candidates = filter.limit.saturating_mul(CANDIDATES);
            let sql = format!(
                "SELECT m.id, s.session_id, s.title, r.position, r.seq, r.role, r.time_ms,
                        m.score, m.tier, r.until_seq IS NULL AND {OWN_CURRENT} AS own
                 FROM (SELECT * FROM ({matches})
                       WHERE ?6 IS NULL OR (tier, score, id) > (?6, ?7, ?8)
                       ORDER BY tier, score, id
                       LIMIT ?9) AS m
                 LEFT JOIN search_rows r ON r.id = m.id AND {live}
                 LEFT JOIN search_sessions s ON s.id = r.session
                 ORDER BY m.tier, m.score, m.id"
            );
            let rows = query_hits(&conn, &sql, fts, phrase, filter, after, candidates)?;
            let found = rows.len();
            let live: Vec<IndexHit> = rows.into_iter().flatten().collect();
            if live.len() >= filter.limit || found < candidates {
                return Ok(live.into_iter().take(filter.limit).collect());
            }
        }
        let known = known_role();
        let sql = format!(
            "SELECT * FROM (
                SELECT r.id, s.session_id, s.title, r.position, r.seq, r.role, r.time_ms,
                       m.score, m.tier, r.until_seq IS NULL AND {OWN_CURRENT} AS own
                FROM ({matches}) AS m
                JOIN search_rows r ON r.id = m.id AND {live}
                JOIN search_sessions s ON s.id = r.session
                WHERE (?2 IS NULL OR CASE typeof(r.role)
                                          WHEN 'integer' THEN r.role = {known}
                                          ELSE lower(r.role) = ?2 END)
                  AND (?3 IS NULL OR r.time_ms >= ?3)
                  AND (?4 IS NULL OR s.cwd = ?4)
                  AND (?5 IS NULL OR (s.session_id = ?5 AND r.until_seq IS NULL AND {OWN_CURRENT}) OR EXISTS (
                        SELECT 1 FROM search_lineage l JOIN search_sessions f ON f.id = l.session
                        WHERE f.session_id = ?5 AND l.ancestor_id = s.session_id
                          AND r.seq > l.after_seq AND r.seq <= l.through_seq
                          AND (r.until_seq IS NULL OR r.until_seq > l.through_seq)
                          AND {VISIBLE_IN_FORK})))
             WHERE ?6 IS NULL OR (tier, score, id) > (?6, ?7, ?8)
             ORDER BY tier, score, id
             LIMIT ?9"
        );
        Ok(
            query_hits(&conn, &sql, fts, phrase, filter, after, filter.limit)?
                .into_iter()
                .flatten()
                .collect(),
        )
    }

    /// The sessions that inherit `hit` (event `seq` of `ancestor`'s file, at transcript
    /// `position`, its index row `row`) and still show it ([`VISIBLE_IN_FORK`]; cut
    /// before whatever superseded it in `ancestor`): forks sharing a hit.
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn shared_with(&self, hit: &IndexHit) -> Result<Vec<SessionId>> {
        let conn = lock(&self.read);
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT f.session_id
             FROM (SELECT ?2 AS seq, ?3 AS position,
                          (SELECT until_seq FROM search_rows WHERE id = ?4) AS until_seq) r,
                  search_lineage l
             JOIN search_sessions f ON f.id = l.session
             WHERE l.ancestor_id = ?1 AND l.after_seq < r.seq AND l.through_seq >= r.seq
               AND (r.until_seq IS NULL OR r.until_seq > l.through_seq)
               AND {VISIBLE_IN_FORK}
             ORDER BY f.session_id"
        ))?;
        let ids = stmt
            .query_map(
                params![hit.session_id.as_str(), hit.seq, hit.position, hit.row],
                |r| r.get::<_, String>(0),
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        ids.into_iter().map(SessionId::new).collect()
    }

    /// The sessions of `sessions` that an indexed session inherits from (a fork's or a
    /// rewind's lineage names them): the hits of any other have no session to be shared
    /// with ([`SearchIndex::shared_with`] is empty), so a page asks that only of these
    /// (one query for the page instead of one per hit).
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn ancestors_among(
        &self,
        sessions: &[&SessionId],
    ) -> Result<std::collections::HashSet<SessionId>> {
        let ids =
            serde_json::Value::from(sessions.iter().map(|id| id.as_str()).collect::<Vec<&str>>())
                .to_string();
        let conn = lock(&self.read);
        let mut stmt = conn.prepare_cached(
            "SELECT DISTINCT ancestor_id FROM search_lineage
             WHERE ancestor_id IN (SELECT value FROM json_each(?1))",
        )?;
        let found = stmt
            .query_map(params![ids], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        found.into_iter().map(SessionId::new).collect()
    }

    /// The title the index holds for session `id`, if it knows the session.
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn session_title(&self, id: &SessionId) -> Result<Option<String>> {
        let conn = lock(&self.read);
        Ok(conn
            .prepare_cached("SELECT title FROM search_sessions WHERE session_id = ?1")?
            .query_row(params![id.as_str()], |r| r.get::<_, String>(0))
            .optional()?)
    }

    /// The sessions whose indexed lineage names `ancestor` (forks and rewinds that
    /// inherit a range of its file, as the index last saw them), in id order.
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn inheritors(&self, ancestor: &SessionId) -> Result<Vec<SessionId>> {
        let conn = lock(&self.read);
        let mut stmt = conn.prepare_cached(
            "SELECT DISTINCT f.session_id FROM search_lineage l
             JOIN search_sessions f ON f.id = l.session
             WHERE l.ancestor_id = ?1 ORDER BY 1",
        )?;
        let ids = stmt
            .query_map(params![ancestor.as_str()], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        ids.into_iter().map(SessionId::new).collect()
    }

    /// The sessions (only `only` and the sessions it inherits from, when given) that held
    /// a damaged event when they were indexed, each with an [`Error::Corrupt`] saying what
    /// was found and that its messages there are left out of searches.
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn damaged_sessions(&self, only: Option<&SessionId>) -> Result<Vec<DamagedSession>> {
        let conn = lock(&self.read);
        let mut stmt = conn.prepare_cached(
            "SELECT d.session_id, d.error, b.created_ms FROM search_damage d
             LEFT JOIN search_births b ON b.session_id = d.session_id
             WHERE ?1 IS NULL OR d.session_id = ?1
                OR d.session_id IN (SELECT l.ancestor_id FROM search_lineage l
                                    JOIN search_sessions s ON s.id = l.session
                                    WHERE s.session_id = ?1)
             ORDER BY 1",
        )?;
        let rows = stmt
            .query_map([only.map(SessionId::as_str)], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(id, found, born)| {
                let error = Error::corrupt(format!(
                    "{found}; what it holds there is left out of searches"
                ));
                Ok(DamagedSession {
                    id: SessionId::new(id)?,
                    born,
                    error,
                })
            })
            .collect()
    }

    /// Notes that a writer of this process closed session `id` while the index lacked some
    /// of its commits (another process held the index): this process's next search
    /// catches it up ([`SearchIndex::take_behind`]); other processes find the writer's
    /// record left in `writer.lock`.
    pub(crate) fn note_behind(&self, id: &SessionId) {
        let mut behind = lock(&self.behind);
        if !behind.contains(id) {
            behind.push(id.clone());
        }
    }

    /// The sessions [`SearchIndex::note_behind`] noted since the last call.
    pub(crate) fn take_behind(&self) -> Vec<SessionId> {
        std::mem::take(&mut *lock(&self.behind))
    }

    /// The last sequence of `reader`'s session the index holds (`None`: it holds nothing
    /// of it, or what it holds under its id is another session's, [`BIRTHS_SCHEMA`]).
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn indexed_through(&self, reader: &SessionReader) -> Result<Option<u64>> {
        let header = reader.header();
        let conn = lock(&self.read);
        Ok(
            session_state(&conn, &header.session_id, header.created_at_ms)?
                .map(|(_, indexed)| indexed),
        )
    }

    /// Sessions the index knows, for tests and `verify`-like checks: id and indexed
    /// sequence, in id order.
    ///
    /// # Errors
    /// SQLite errors.
    pub(crate) fn indexed_sessions(&self) -> Result<Vec<(SessionId, u64)>> {
        let conn = lock(&self.read);
        let mut stmt =
            conn.prepare_cached("SELECT session_id, indexed_seq FROM search_sessions ORDER BY 1")?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(id, seq)| Ok((SessionId::new(id)?, seq)))
            .collect()
    }
}

/// The keyset position `(tier, bm25, row)` of a cursor's row in the index as it is now
/// (a cursor carries no score: `s3.<tier>.<row>.<search>`). bm25 weighs each term by its rarity in the whole index, so any session's change moves
/// every score: compared with the score the row had when its page was served, the rows
/// after it could all fall before it (the next page empty) or before ones come back. The
/// FTS row outlives its message (contentless rows are never deleted, only a rebuild
/// drops them), so the cursor's row is ranked again. The tier depends on the row and the
/// query alone.
///
/// # Errors
/// [`Error::InvalidInput`] when the row is not in the index: it was rebuilt since the
/// cursor's page (every row has a new number), or the cursor was made up or is another
/// root's. Following it with the score its page had (cursors carried it before) started
/// the page over among rows of equal score (whose new numbers all come after the old
/// one), repeating earlier pages' hits in silence. Also when the cursor's tier is not its
/// row's (`phrase`: the exact phrase of the query's words, whose matches are tier 0, the
/// others 1): only an edited cursor has one, which gave an empty page, or the first page
/// again, as if the search went on.
fn reanchor(
    conn: &Connection,
    fts: &str,
    phrase: Option<&str>,
    after: (i64, i64),
) -> Result<(i64, f64, i64)> {
    let (tier, row) = after;
    let (now, in_phrase) = conn
        .prepare_cached(
            "SELECT coalesce(bm25(search_text), 0),
                    ?3 IS NOT NULL AND rowid IN (SELECT rowid FROM search_text
                                                 WHERE search_text MATCH ?3)
             FROM search_text WHERE search_text MATCH ?1 AND rowid = ?2",
        )?
        .query_row(params![fts, row, phrase], |r| {
            Ok((r.get::<_, f64>(0)?, r.get::<_, bool>(1)?))
        })
        .optional()
        .map_err(query_error)?
        .ok_or_else(|| {
            Error::invalid(
                "this search cursor's hit is not in the search index: it was rebuilt since \
                 the cursor's page (or the cursor is not of this root): search again from \
                 the first page",
            )
        })?;
    if tier != i64::from(!in_phrase) {
        return Err(Error::invalid(
            "invalid search cursor: it is not one a page of this search gave",
        ));
    }
    Ok((tier, now, row))
}

/// SQL: whether the row `r` (its `seq` and `position`) of an ancestor's file, inherited by
/// fork `f` (a `search_sessions` row), is still in `f`'s transcript: no later row at that
/// position in `f` (a row of `f`'s own file from before it, of a range a delete
/// materialised there, does not hide it) or in an ancestor range of `f`'s lineage, and
/// (for a message, not the
/// title) no later reset of `f`'s own transcript, nor of an ancestor's within `f`'s range
/// of it (every reset, `search_resets`: with only each session's last one, a fork cut
/// between two resets of its parent was said to show what the first dropped). Before, a
/// fork that replaced or compacted what it inherited was still said to hold it
/// (`shared_with`, a search of that fork alone).
const VISIBLE_IN_FORK: &str = "
    NOT EXISTS (SELECT 1 FROM search_rows o
                WHERE o.session = f.id AND o.position = r.position AND o.until_seq IS NULL
                  AND o.seq > r.seq)
    AND (r.position = 0
         OR NOT EXISTS (SELECT 1 FROM search_resets x WHERE x.session = f.id AND x.seq > r.seq))
    AND NOT EXISTS (
        SELECT 1 FROM search_lineage l2 JOIN search_sessions a2 ON a2.session_id = l2.ancestor_id
        WHERE l2.session = f.id
          AND (EXISTS (SELECT 1 FROM search_rows o2
                       WHERE o2.session = a2.id AND o2.position = r.position AND o2.seq > r.seq
                         AND o2.seq > l2.after_seq AND o2.seq <= l2.through_seq)
               OR (r.position > 0 AND EXISTS (
                       SELECT 1 FROM search_resets x2
                       WHERE x2.session = a2.id AND x2.seq > r.seq
                         AND x2.seq > l2.after_seq AND x2.seq <= l2.through_seq))))";

/// SQL: whether the index row `r` (joined with its session `s`) can be a hit: current in its
/// session, or superseded there (`until_seq`) after the cut of a fork that inherits it.
/// A row that is its session's current one (`own`, [`OWN_CURRENT`]), or that a fork's
/// inherited range holds, cut before whatever superseded it there.
fn live_row() -> String {
    format!(
        "((r.until_seq IS NULL AND {OWN_CURRENT}) OR EXISTS (
    SELECT 1 FROM search_lineage l
    WHERE l.ancestor_id = (SELECT session_id FROM search_sessions WHERE id = r.session)
      AND l.after_seq < r.seq AND l.through_seq >= r.seq
      AND (r.until_seq IS NULL OR l.through_seq < r.until_seq)))"
    )
}

/// SQL: whether the row `r`, current in its session's own file, is in that session's
/// transcript, or is its title (a title carried to it, sequence 0, always is: see
/// [`carry_titles`]): no range the session inherits after it (its own file holds an earlier
/// range once a delete materialised it) holds a later row at its position, or for a
/// message a later reset. Before, such a row was found under the session, which shows
/// the later version instead, and hid that version from the session's `shared_with`.
const OWN_CURRENT: &str = "(r.seq = 0 OR NOT EXISTS (
    SELECT 1 FROM search_lineage l3 JOIN search_sessions a3 ON a3.session_id = l3.ancestor_id
    WHERE l3.session = r.session AND l3.through_seq > r.seq
      AND (EXISTS (SELECT 1 FROM search_rows o3
                   WHERE o3.session = a3.id AND o3.position = r.position AND o3.seq > r.seq
                     AND o3.seq > l3.after_seq AND o3.seq <= l3.through_seq)
           OR (r.position > 0 AND EXISTS (
                   SELECT 1 FROM search_resets x3
                   WHERE x3.session = a3.id AND x3.seq > r.seq
                     AND x3.seq > l3.after_seq AND x3.seq <= l3.through_seq)))))";

/// Runs a search statement of [`SearchIndex::search`] (parameters: `?1` the FTS5
/// expression, `?2`-`?5` the filters, `?6`-`?8` the keyset, `?9` the limit, `?10` the
/// phrase; `after` the keyset, [`reanchor`]ed): its rows in order, `None` for a candidate
/// with no live row.
fn query_hits(
    conn: &Connection,
    sql: &str,
    fts: &str,
    phrase: Option<&str>,
    filter: &IndexFilter<'_>,
    after: Option<(i64, f64, i64)>,
    limit: usize,
) -> Result<Vec<Option<IndexHit>>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let (after_tier, after_rank, after_row) = match after {
        Some((t, r, id)) => (Some(t), Some(r), Some(id)),
        None => (None, None, None),
    };
    let rows = stmt
        .query_map(
            params![
                fts,
                filter.role,
                filter.since_ms,
                filter.cwd,
                filter.session.map(SessionId::as_str),
                after_tier,
                after_rank,
                after_row,
                i64::try_from(limit).unwrap_or(i64::MAX),
                phrase.unwrap_or(""),
            ],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, Option<u64>>(3)?,
                    r.get::<_, Option<u64>>(4)?,
                    r.get::<_, Value>(5)?,
                    r.get::<_, Option<i64>>(6)?,
                    r.get::<_, f64>(7)?,
                    r.get::<_, i64>(8)?,
                    r.get::<_, Option<bool>>(9)?,
                ))
            },
        )
        .map_err(query_error)?;
    let mut out = Vec::new();
    for row in rows {
        let (row, sid, title, position, seq, role, time_ms, rank, tier, own) =
            row.map_err(query_error)?;
        out.push(match (sid, title, position, seq, time_ms) {
            (Some(sid), Some(title), Some(position), Some(seq), Some(time_ms)) => Some(IndexHit {
                row,
                session_id: SessionId::new(sid)?,
                title,
                position,
                seq,
                role: role_of(role),
                time_ms,
                rank,
                tier,
                own: own.unwrap_or(false),
            }),
            _ => None,
        });
    }
    Ok(out)
}

/// How [`SearchIndex::rebuild`] fills the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Whatever it holds (`rebuild-catalog`): waits [`REBUILD_WAIT`] for the index.
    Anew,
    /// A first search's fill: waits [`FILL_WAIT`] for another process's fill or rebuild,
    /// and fills nothing when that one completed the index.
    UnlessFilled,
}

/// How long a rebuild waits for another process's write on the index.
const REBUILD_WAIT: Duration = Duration::from_secs(5);

/// How long a first search waits for another process's fill or rebuild of the index: the
/// fill of 200,000 messages takes 4-15 s, and a second search failed after 5 s with "database is
/// locked" (outside testing W1).
const FILL_WAIT: Duration = Duration::from_secs(30);

/// `e` reworded, when it is the index's file found busy for `wait`, to say so and that a
/// later try will do: SQLite's "database is locked" named neither the file nor the
/// cause (outside testing W1: every search of a root whose first fill another process
/// held, and `rebuild-catalog`, whose error blamed the catalog).
fn index_held(e: Error, path: &Path, wait: Duration) -> Error {
    e.busy_saying(|| {
        format!(
            "the search index {} is busy: another process held a write on it for {} s \
             (filling or rebuilding it, or a writer stopped inside its index write); try again",
            path.display(),
            wait.as_secs()
        )
    })
}

/// `e` reworded, when it is the index's file found busy (another process held a write on
/// it for [`BUSY`]), to say what that means for a search: SQLite's "database is locked"
/// named neither the file nor the consequence.
fn index_busy(e: Error, path: &Path) -> Error {
    e.busy_saying(|| {
        format!(
            "the search index {} is busy (another process holds a write on it): what is new \
             in this session is not searchable until a later search can write it",
            path.display()
        )
    })
}

/// The key and indexed sequence of session `id`, when the index holds it and what it holds
/// under that id is the session made at `born` (ms; one registered before
/// [`BIRTHS_SCHEMA`] is taken for it): a session made again under the id of a deleted one
/// is one the index does not know.
fn session_state(conn: &Connection, id: &SessionId, born: i64) -> Result<Option<(i64, u64)>> {
    Ok(conn
        .prepare_cached(
            "SELECT s.id, s.indexed_seq FROM search_sessions s
             LEFT JOIN search_births b ON b.session_id = s.session_id
             WHERE s.session_id = ?1 AND (b.created_ms IS NULL OR b.created_ms = ?2)",
        )?
        .query_row(params![id.as_str(), born], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

/// The key of session `id` in the index, whichever session it holds under that id.
fn session_key(conn: &Connection, id: &SessionId) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT id FROM search_sessions WHERE session_id = ?1")?
        .query_row([id.as_str()], |r| r.get(0))
        .optional()?)
}

/// Records that the index holds under `id` the session made at `born` (ms), unless it
/// recorded one already ([`register`] forgets the one before).
fn record_birth(tx: &Transaction<'_>, id: &SessionId, born: i64) -> Result<()> {
    tx.prepare_cached(
        "INSERT OR IGNORE INTO search_births (session_id, created_ms) VALUES (?1, ?2)",
    )?
    .execute(params![id.as_str(), born])?;
    Ok(())
}

/// The lineage recorded for session `key`, in range order.
fn stored_lineage(conn: &Connection, key: i64) -> Result<Vec<LineageEntry>> {
    let mut stmt = conn.prepare_cached(
        "SELECT ancestor_id, after_seq, through_seq FROM search_lineage WHERE session = ?1
         ORDER BY after_seq",
    )?;
    let rows = stmt
        .query_map([key], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, u64>(1)?,
                r.get::<_, u64>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter()
        .map(|(ancestor, after_seq, through_seq)| {
            Ok(LineageEntry {
                ancestor_id: SessionId::new(ancestor)?,
                after_seq,
                through_seq,
            })
        })
        .collect()
}

/// Removes a session's live rows, lineage and entry.
fn forget_in(tx: &Transaction<'_>, id: &SessionId) -> Result<()> {
    tx.prepare_cached("DELETE FROM search_damage WHERE session_id = ?1")?
        .execute([id.as_str()])?;
    tx.prepare_cached("DELETE FROM search_births WHERE session_id = ?1")?
        .execute([id.as_str()])?;
    if let Some(key) = session_key(tx, id)? {
        tx.prepare_cached("DELETE FROM search_rows WHERE session = ?1")?
            .execute([key])?;
        tx.prepare_cached("DELETE FROM search_lineage WHERE session = ?1")?
            .execute([key])?;
        tx.prepare_cached("DELETE FROM search_resets WHERE session = ?1")?
            .execute([key])?;
        tx.prepare_cached("DELETE FROM search_sessions WHERE id = ?1")?
            .execute([key])?;
    }
    Ok(())
}

/// Whether session `id` held a damaged event when it was indexed (`search_damage`).
fn has_damage(conn: &Connection, id: &SessionId) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM search_damage WHERE session_id = ?1")?
        .query_row([id.as_str()], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Records `damage`, a damaged event of session `id` left out of the index, unless the
/// session already has one recorded (the first found is kept).
fn record_damage(tx: &Transaction<'_>, id: &SessionId, damage: Option<&Error>) -> Result<()> {
    if let Some(damage) = damage {
        let text = damage.to_string();
        let found = text
            .strip_prefix("corrupt session store: ")
            .unwrap_or(&text);
        tx.prepare_cached(
            "INSERT OR IGNORE INTO search_damage (session_id, error) VALUES (?1, ?2)",
        )?
        .execute(params![id.as_str(), found])?;
    }
    Ok(())
}

/// (Re)registers `reader`'s session with nothing of its own indexed yet: its previous
/// rows are dropped, its lineage recorded; returns its key. A fork whose ancestors are not
/// the sessions it was cut from ([`SessionReader::check_ancestry`]) is refused: their hits
/// would be listed as its own.
fn register(
    tx: &Transaction<'_>,
    reader: &SessionReader,
    lineage: &[LineageEntry],
    title: &str,
) -> Result<i64> {
    if !lineage.is_empty() {
        reader.check_ancestry()?;
    }
    let header = reader.header();
    forget_in(tx, &header.session_id)?;
    tx.prepare_cached(
        "INSERT INTO search_sessions (session_id, cwd, title, indexed_seq) VALUES (?1, ?2, ?3, 0)",
    )?
    .execute(params![header.session_id.as_str(), header.cwd, title])?;
    let key = tx.last_insert_rowid();
    record_birth(tx, &header.session_id, header.created_at_ms)?;
    let mut put = tx.prepare_cached(
        "INSERT OR REPLACE INTO search_lineage (ancestor_id, session, after_seq, through_seq)
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    for entry in lineage {
        put.execute(params![
            entry.ancestor_id.as_str(),
            key,
            entry.after_seq,
            entry.through_seq
        ])?;
    }
    Ok(key)
}

fn set_indexed(tx: &Transaction<'_>, key: i64, seq: u64) -> Result<()> {
    tx.prepare_cached("UPDATE search_sessions SET indexed_seq = ?2 WHERE id = ?1")?
        .execute(params![key, seq])?;
    Ok(())
}

/// The changes `own` makes, in sequence order (a reset before the rows of its event).
fn changes_of(own: &OwnChanges) -> Vec<Change<'_>> {
    let mut changes: Vec<(u64, u8, Change<'_>)> = Vec::new();
    changes.extend(
        own.resets
            .iter()
            .map(|seq| (*seq, 0, Change::Reset { seq: *seq })),
    );
    for (row, message, time_ms) in &own.rows {
        changes.push((
            row.event_seq,
            1,
            Change::Put {
                position: row.position,
                seq: row.event_seq,
                role: message.role(),
                text: message_text(message),
                time_ms: *time_ms,
            },
        ));
    }
    for (seq, title, time_ms) in &own.titles {
        changes.push((
            *seq,
            2,
            Change::Title {
                seq: *seq,
                title: title.clone(),
                time_ms: *time_ms,
            },
        ));
    }
    // Stable: the rows of one event keep their position order.
    changes.sort_by_key(|(seq, kind, _)| (*seq, *kind));
    changes.into_iter().map(|(_, _, c)| c).collect()
}

/// Marks the current row at a position (`?1` session, `?2` position) superseded by the
/// event `?3`, when that event is later.
const SUPERSEDE_AT: &str = "UPDATE search_rows SET until_seq = ?3
    WHERE session = ?1 AND position = ?2 AND until_seq IS NULL AND seq < ?3";

/// Drops the current row at a position (`?1` session, `?2` position).
const DROP_CURRENT_AT: &str =
    "DELETE FROM search_rows WHERE session = ?1 AND position = ?2 AND until_seq IS NULL";

/// [`latest_at`]'s statement.
const LATEST_AT: &str = "SELECT id, seq, until_seq IS NULL FROM search_rows
    WHERE session = ?1 AND position = ?2 ORDER BY seq DESC LIMIT 1";

/// The latest row at `position` of session `key` (the highest sequence): its id, sequence
/// and whether it is current. [`put`] keeps at most one current row at a position, and a
/// row it supersedes is an earlier event's, so the current row is the latest unless a
/// transcript reset superseded it: found through `search_rows_at` without reading the
/// position's other versions. [`put`] read them all (its statements matched every version
/// of the position), so `message/upsert`s of one message cost in proportion to its
/// versions, and indexing them in proportion to their square (outside testing L2: 10,000
/// upserts of one id took 9.5 s to append, 0.3 s now).
fn latest_at(tx: &Transaction<'_>, key: i64, position: u64) -> Result<Option<(i64, u64, bool)>> {
    Ok(tx
        .prepare_cached(LATEST_AT)?
        .query_row(params![key, position], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?)
}

/// Puts `text` at `position` of session `key` (replacing the row there; blank text
/// leaves none).
fn put(
    tx: &Transaction<'_>,
    key: i64,
    position: u64,
    seq: u64,
    time_ms: i64,
    role: Option<&str>,
    text: &str,
) -> Result<()> {
    match latest_at(tx, key, position)? {
        None => {}
        // The latest row is the current one: it alone is marked or dropped.
        Some((id, latest, true)) => {
            if position > 0 && latest < seq {
                // Kept for the forks cut before it (see `search_rows.until_seq`).
                tx.prepare_cached("UPDATE search_rows SET until_seq = ?2 WHERE id = ?1")?
                    .execute(params![id, seq])?;
            } else {
                tx.prepare_cached("DELETE FROM search_rows WHERE id = ?1")?
                    .execute([id])?;
            }
        }
        // Superseded (by a transcript reset): the current row, if any, is an earlier one.
        Some((_, _, false)) => {
            if position > 0 {
                tx.prepare_cached(SUPERSEDE_AT)?
                    .execute(params![key, position, seq])?;
            }
            tx.prepare_cached(DROP_CURRENT_AT)?
                .execute(params![key, position])?;
        }
    }
    if text.trim().is_empty() {
        return Ok(());
    }
    tx.prepare_cached(
        "INSERT INTO search_rows (session, position, seq, time_ms, role)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![key, position, seq, time_ms, role_value(role)])?;
    tx.prepare_cached("INSERT INTO search_text (rowid, text) VALUES (?1, ?2)")?
        .execute(params![tx.last_insert_rowid(), index_text(text)])?;
    Ok(())
}

/// Which sessions [`carry_titles`] looks at.
#[derive(Clone, Copy)]
enum TitleScope {
    /// Every session (after a rebuild).
    All,
    /// This session (just registered).
    Session(i64),
    /// The forks of this session (its title just changed).
    ForksOf(i64),
}

/// Gives a title row of its own to each session of `scope` that shows a title it
/// inherited (`search_sessions.title`, with no title row of its own) which no ancestor's
/// current title row within its inherited ranges holds any more: the ancestor was renamed
/// after the fork, and its title row now holds the new title. Without it the fork's title
/// (still what `list` shows for it) was found nowhere. The row's sequence is 0 (no event
/// of this file) and its time the session's creation (the title was set at or before it;
/// its own event's time is in the ancestor's file only), or the time it is carried when
/// the index has no creation time for it. Dated by the carrying, such a title was found by
/// searches `since` a moment after it was set, and its time moved at every rebuild
/// (outside testing D3).
fn carry_titles(tx: &Transaction<'_>, scope: TitleScope) -> Result<()> {
    // Each scope picks its sessions by key (a catch-up or a rename reads a few rows).
    let (pick, key) = match scope {
        TitleScope::All => ("?1 IS NULL", None),
        TitleScope::Session(key) => ("f.id = ?1", Some(key)),
        TitleScope::ForksOf(key) => (
            "f.id IN (SELECT l.session FROM search_lineage l JOIN search_sessions a
                      ON a.session_id = l.ancestor_id WHERE a.id = ?1)",
            Some(key),
        ),
    };
    // An ancestor's current title row within the session's inherited ranges that holds
    // the session's title: then the title is found there, under the ancestor.
    let inherited = "EXISTS (
                     SELECT 1 FROM search_lineage l
                     JOIN search_sessions a ON a.session_id = l.ancestor_id
                     JOIN search_rows r ON r.session = a.id AND r.position = 0
                     WHERE l.session = f.id AND a.title = f.title
                       AND r.seq > l.after_seq AND r.seq <= l.through_seq)";
    // A row carried before its ancestor's rows were there (a fill takes the sessions in
    // id order: a fork before its parent) goes once the ancestor's row holds the title:
    // it was found twice, under the fork and in the ancestor's hit's "also in" (outside
    // testing, session 42).
    tx.prepare_cached(&format!(
        "DELETE FROM search_rows WHERE position = 0 AND seq = 0 AND until_seq IS NULL
           AND session IN (SELECT f.id FROM search_sessions f WHERE {pick} AND {inherited})"
    ))?
    .execute([key])?;
    let orphans = tx
        .prepare_cached(&format!(
            "SELECT f.id, f.title, b.created_ms FROM search_sessions f
             LEFT JOIN search_births b ON b.session_id = f.session_id
             WHERE {pick} AND f.title <> ''
               AND NOT EXISTS (SELECT 1 FROM search_rows r
                               WHERE r.session = f.id AND r.position = 0)
               AND NOT {inherited}"
        ))?
        .query_map([key], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i64>>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let now = crate::model::ids::now_ms();
    for (key, title, born) in orphans {
        put(tx, key, 0, 0, born.unwrap_or(now), Some("title"), &title)?;
    }
    Ok(())
}

/// How many changes [`apply`] makes between looks at its cancel token.
const CANCEL_CHECK_CHANGES: usize = 256;

/// Applies `changes` (in sequence order) to session `key`'s rows; stops when `cancel`
/// fires ([`Error::Cancelled`], the caller's transaction then left uncommitted).
fn apply(
    tx: &Transaction<'_>,
    key: i64,
    changes: &[Change<'_>],
    cancel: Option<&CancelToken>,
) -> Result<()> {
    for (i, change) in changes.iter().enumerate() {
        if i % CANCEL_CHECK_CHANGES == 0 && cancel.is_some_and(CancelToken::is_cancelled) {
            return Err(Error::Cancelled);
        }
        match change {
            Change::Reset { seq } => {
                // Kept for the forks cut before it (see `search_rows.until_seq`).
                tx.prepare_cached(
                    "UPDATE search_rows SET until_seq = ?2
                     WHERE session = ?1 AND position > 0 AND until_seq IS NULL",
                )?
                .execute(params![key, seq])?;
                tx.prepare_cached(
                    "INSERT OR IGNORE INTO search_resets (session, seq) VALUES (?1, ?2)",
                )?
                .execute(params![key, seq])?;
            }
            Change::Put {
                position,
                seq,
                role,
                text,
                time_ms,
            } => put(tx, key, *position, *seq, *time_ms, *role, text)?,
            Change::Title {
                seq,
                title,
                time_ms,
            } => {
                put(tx, key, 0, *seq, *time_ms, Some("title"), title)?;
                tx.prepare_cached("UPDATE search_sessions SET title = ?2 WHERE id = ?1")?
                    .execute(params![key, title])?;
                carry_titles(tx, TitleScope::ForksOf(key))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_folders_of_dead_processes_are_removed() {
        let temp = tempfile::tempdir().expect("tempdir");
        // No process has a pid above the kernel's limit (2^22).
        let dead = temp.path().join(format!("{PRIVATE_PREFIX}999999999-00"));
        let alive = temp
            .path()
            .join(format!("{PRIVATE_PREFIX}{}-00", std::process::id()));
        let other = temp.path().join("session-store-other-999999999-00");
        for dir in [&dead, &alive, &other] {
            std::fs::create_dir(dir).expect("mkdir");
            std::fs::write(dir.join("search.sqlite"), b"x").expect("write");
        }
        remove_private_of_dead_processes(temp.path());
        assert!(!dead.exists());
        assert!(alive.exists());
        assert!(other.exists());
    }

    /// Putting a row at a position reads only the latest row there, however many versions
    /// the position had (outside testing L2: `message/upsert`s of one id cost in
    /// proportion to its versions, their indexing in proportion to the square); the
    /// versions before stay, superseded, and a reset's superseded rows are found around.
    #[test]
    fn putting_a_row_does_not_read_every_version_of_its_position() {
        let index = SearchIndex::open_private().expect("private index");
        let mut conn = lock(&index.write);
        let tx = conn.transaction().expect("transaction");
        // The steps of one lookup (the cached statement counts every run).
        let lookup_steps = |tx: &Transaction<'_>| -> i32 {
            let steps = rusqlite::StatementStatus::VmStep;
            tx.prepare_cached(LATEST_AT)
                .expect("cached")
                .reset_status(steps);
            latest_at(tx, 1, 5).expect("latest");
            tx.prepare_cached(LATEST_AT)
                .expect("cached")
                .get_status(steps)
        };
        put(&tx, 1, 5, 1, 0, Some("user"), "version 1").expect("put");
        let one = lookup_steps(&tx);
        for seq in 2..=2_000 {
            put(&tx, 1, 5, seq, 0, Some("user"), "a later version").expect("put");
        }
        let many = lookup_steps(&tx);
        assert!(
            many <= one + 10,
            "{one} steps with 1 version, {many} with 2,000"
        );
        let rows = |tx: &Transaction<'_>| -> (i64, i64) {
            tx.query_row(
                "SELECT count(*), count(*) FILTER (WHERE until_seq IS NULL) FROM search_rows
                 WHERE session = 1 AND position = 5",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("count")
        };
        assert_eq!(rows(&tx), (2_000, 1));
        assert_eq!(
            latest_at(&tx, 1, 5).expect("latest"),
            Some((2_000, 2_000, true))
        );
        // A reset supersedes the current row; the next row at the position is current.
        tx.execute(
            "UPDATE search_rows SET until_seq = 2001 WHERE until_seq IS NULL",
            [],
        )
        .expect("reset");
        put(&tx, 1, 5, 2_002, 0, Some("user"), "after the reset").expect("put");
        assert_eq!(rows(&tx), (2_001, 1));
        // The same event put again (a catch-up) replaces its own row.
        put(&tx, 1, 5, 2_002, 0, Some("user"), "after the reset").expect("put");
        assert_eq!(rows(&tx), (2_001, 1));
    }

    #[test]
    fn a_page_statement_is_not_compiled_again_at_each_search() {
        let index = SearchIndex::open_private().expect("private index");
        let conn = lock(&index.read);
        // As the page statements: a bound LIMIT, run again with other values.
        let mut stmt = conn
            .prepare_cached(
                "SELECT rowid FROM search_text WHERE search_text MATCH ?1 ORDER BY rowid LIMIT ?2",
            )
            .expect("prepare");
        for (query, limit) in [("\"a\"", 11), ("\"b\"", 44), ("\"c\"", 11)] {
            let rows = stmt
                .query_map(params![query, limit], |r| r.get::<_, i64>(0))
                .expect("query")
                .count();
            assert_eq!(rows, 0);
        }
        assert_eq!(
            stmt.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "compiled again when its LIMIT was bound"
        );
    }

    #[test]
    fn a_private_index_is_removed_with_it() {
        let index = SearchIndex::open_private().expect("private index");
        let dir = index.private_dir.clone().expect("its folder");
        assert!(dir.join("search.sqlite").is_file());
        drop(index);
        assert!(!dir.exists());
    }
}
