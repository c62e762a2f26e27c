//! Full-text search across a root: where the search index (`store::search`) sits in a
//! root (`<root>/.catalog/search.sqlite`), when it is created and filled, how it is kept
//! current (publication, writer open, each drain, delete, rebuild), and a search: the
//! index's hits checked against the session folders (a deleted session is never
//! returned) with their snippets cut from the messages read back through each session's
//! reader.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::model::Message;
use crate::model::search::{Mark, SearchQuery, message_text, snippet};
use crate::model::{SessionId, Snippet};
use crate::persistence::Root;
use crate::persistence::catalog::{CATALOG_DIR, SkippedSession, catalog_dir, unlink_files_at};
use crate::store::lock;
use crate::store::reader::SessionReader;
use crate::store::schema::{self, LOCK_FILE, SESSION_FILE};
use crate::store::search::{
    DamagedSession, FilesStamp, Fill, IndexFilter, IndexHit, LockStamp, SEARCH_FILE, SEARCH_FILES,
    SearchIndex,
};

/// Default page of a search (each hit reads its message back for the snippet).
const DEFAULT_SEARCH_LIMIT: usize = 10;
/// Largest page of a search (a larger [`SearchOptions::limit`] is
/// [`Error::InvalidInput`](crate::Error::InvalidInput)).
pub const MAX_SEARCH_LIMIT: usize = 100;
/// Threads reading a page's messages back from their session files: one per session of a
/// default page. A cold file's first read waits on the file system (for its pages, and
/// for its `-shm`, which SQLite sets up unless the file is read without locks) as much as
/// on the CPU, so more threads than cores still overlap.
const READ_THREADS: usize = 10;
/// The most index rows a search reads back in one round while it fills a page past rows
/// that no session shows (it doubles from `limit + 1` up to this).
const MAX_ROWS_A_ROUND: usize = 800;

/// Messages read back, keyed by session, position and event sequence (an older version at
/// a position, kept for the forks that still show it, is not the current one), the
/// sessions found gone, and those whose file cannot be read (damaged, foreign or of a
/// newer schema).
type ReadBack<'a> = (
    Vec<((&'a SessionId, u64, u64), Arc<Message>)>,
    Vec<SessionId>,
    Vec<SkippedSession>,
);

/// A page of [`Root::search`]: its hits, the next page's cursor, and the sessions whose
/// hits were left out because their file cannot be read.
pub(crate) struct Searched {
    pub found: Vec<Found>,
    pub next: Option<String>,
    pub skipped: Vec<SkippedSession>,
}

/// What [`crate::SessionQuery::search`] looks for besides the query. Built with
/// [`SearchOptions::default`] and the `with_*` methods.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct SearchOptions {
    /// Hits per page (0 = 10; at most 100).
    pub limit: usize,
    /// A previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Only this session's messages (its own and those it inherits from its ancestors).
    pub session: Option<SessionId>,
    /// Only sessions created with this working directory.
    pub cwd: Option<String>,
    /// Only messages committed at or after this time (ms since the Unix epoch).
    pub since_ms: Option<i64>,
    /// Only messages with this role (`user`, `assistant`, `tool`, …; `title` for titles),
    /// compared ignoring ASCII case; a blank one is refused.
    pub role: Option<String>,
}

impl SearchOptions {
    /// Hits per page (0 = 10; at most 100).
    #[must_use]
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Continue after a previous page (its `next_cursor`).
    #[must_use]
    pub fn with_cursor(mut self, cursor: impl Into<String>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }

    /// Only this session (with what it inherits).
    #[must_use]
    pub fn with_session(mut self, session: SessionId) -> Self {
        self.session = Some(session);
        self
    }

    /// Only sessions with exactly this working directory (`/srv/api/` is not `/srv/api`):
    /// pass a user's text through [`absolute_cwd`](crate::absolute_cwd) first, as the CLI
    /// does.
    #[must_use]
    pub fn with_cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Only messages committed at or after `ms` (since the Unix epoch).
    #[must_use]
    pub fn with_since(mut self, ms: i64) -> Self {
        self.since_ms = Some(ms);
        self
    }

    /// Only messages with this role (compared ignoring ASCII case; a blank one is refused
    /// by the search as [`Error::InvalidInput`]).
    #[must_use]
    pub fn with_role(mut self, role: impl Into<String>) -> Self {
        self.role = Some(role.into());
        self
    }
}

/// One hit of [`Root::search`], before the service names its session with a ref.
#[derive(Clone, Debug)]
pub(crate) struct Found {
    pub hit: IndexHit,
    /// The message's id ("" for a title).
    pub message_id: String,
    pub snippet: Snippet,
    pub shared_with: Vec<SessionId>,
}

/// Which search a cursor continues: the query and the session, cwd and role filters,
/// hashed (XXH3-64). The limit is left out, so a page size may change between pages, and
/// so is `since_ms`, which a relative `--since 1d` moves on every page.
fn search_key(query: &str, options: &SearchOptions) -> u64 {
    let key = serde_json::json!([
        query,
        options.session.as_ref().map(SessionId::as_str),
        options.cwd,
        options.role,
    ]);
    xxhash_rust::xxh3::xxh3_64(key.to_string().as_bytes())
}

/// `options` with its role in ASCII lower case (a role is matched ignoring ASCII case, as
/// the query's words and `list --title` are: `User` finds `user`; it found nothing).
///
/// # Errors
/// [`Error::InvalidInput`] for a blank role, which no message can have been found by, and
/// for a cwd no session can have (empty, or holding a NUL).
fn with_role_folded(options: &SearchOptions) -> Result<SearchOptions> {
    if let Some(cwd) = &options.cwd {
        // No session has an empty working directory (`create` refuses one): an empty
        // `--cwd "$DIR"` of an unset variable found nothing, without a word.
        crate::model::header::Header::check_cwd(cwd)?;
    }
    let mut folded = options.clone();
    if let Some(role) = &mut folded.role {
        if role.trim().is_empty() {
            return Err(Error::invalid(format!(
                "search role {} is blank: give a message role (user, assistant, tool, \
                 system, …) or title",
                crate::error::quoted(role)
            )));
        }
        role.make_ascii_lowercase();
    }
    Ok(folded)
}

/// `s3.<tier>.<row>.<search key>`: the keyset of the last hit of a page (its score is
/// not kept: the row is ranked again on the index as it is then, `store::search`'s
/// `reanchor`), and the search it belongs to.
fn cursor_of(hit: &IndexHit, search: u64) -> String {
    format!("s3.{}.{}.{search:016x}", hit.tier, hit.row)
}

/// The keyset `(tier, row)` of `cursor`, made by a page of the search `search` (its rows
/// mean nothing for another query or other filters). A cursor of an earlier build
/// (`s2.<tier>.<rank bits>.<row>.<search key>`, with the score the next page never used)
/// is followed alike, its score checked as before and left out.
fn parse_cursor(cursor: &str, search: u64) -> Result<(i64, i64)> {
    let bad = || {
        Error::invalid(format!(
            "invalid search cursor {}",
            crate::error::quoted(cursor)
        ))
    };
    let (mut parts, scored) = match (cursor.strip_prefix("s3."), cursor.strip_prefix("s2.")) {
        (Some(rest), _) => (rest.split('.'), false),
        (None, Some(rest)) => (rest.split('.'), true),
        (None, None) => return Err(bad()),
    };
    let tier = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    if scored {
        parts
            .next()
            .and_then(|p| u64::from_str_radix(p, 16).ok())
            .map(f64::from_bits)
            .filter(|r| r.is_finite())
            .ok_or_else(bad)?;
    }
    let row = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let made_by = parts
        .next()
        .filter(|p| p.len() == 16)
        .and_then(|p| u64::from_str_radix(p, 16).ok())
        .ok_or_else(bad)?;
    if parts.next().is_some() {
        return Err(bad());
    }
    if made_by != search {
        return Err(Error::invalid(format!(
            "search cursor {} continues another search: give the query and filters of the \
             page it came from",
            crate::error::quoted(cursor)
        )));
    }
    Ok((tier, row))
}

impl Root {
    /// The root's search index when it exists (opened on first use in this process);
    /// `None` when nobody has searched this root yet (writers never create it).
    pub(crate) fn search_index(&self) -> Option<Arc<SearchIndex>> {
        if let Some(index) = self.index_slot().get() {
            return Some(Arc::clone(index));
        }
        let path = self.path().join(CATALOG_DIR).join(SEARCH_FILE);
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            return None;
        }
        // Not filled here, when a fill never completed: that is a search's work, not a
        // writer's. The root's own index only: one this process may not write is left to
        // the searches that can (a writer took a private index of its own for it, indexed
        // into that, and cleared its `writer.lock` record as if the root's held its
        // commits; outside testing, users and permissions).
        let index = Arc::new(self.open_root_index().ok()?);
        // A newer build's index is left to it: its searches catch this writer's sessions up
        // from the record the writer leaves in `writer.lock`.
        if index.is_newer().unwrap_or(true) {
            return None;
        }
        let _ = self.index_slot().set(index);
        self.index_slot().get().map(Arc::clone)
    }

    /// Opens the search index, creating it (and filling it from every session) when it is
    /// missing, and replacing a damaged or foreign file (the index is derived). When the
    /// root's index can be neither opened nor created (a root this process may only
    /// read), a private one is built for this process ([`SearchIndex::open_private`]).
    /// An index whose fill never completed (the search that created it was killed while
    /// it filled it) is filled now: it used to stay empty but for what writers added.
    /// At the first search of this process, sessions whose writer died since its last
    /// index write are caught up ([`Root::catch_up_dead_writers_in`]); at every search,
    /// those a writer of this process closed while another process held the index.
    fn open_search_index(&self) -> Result<Arc<SearchIndex>> {
        let index = self.opened_search_index()?;
        let first = index.first_search();
        if !index.is_filled()? {
            self.fill(&index, Fill::UnlessFilled)?;
        } else if first {
            self.catch_up_dead_writers_in(&index);
        }
        // Sessions a writer of this process closed while another process held the index.
        for id in index.take_behind() {
            if self.catch_up_unless_held(&index, &id).is_err() && self.session_dir(&id).is_dir() {
                index.note_behind(&id);
            }
        }
        Ok(index)
    }

    /// Catches the search index up with every session whose writer died since its last
    /// index write, and indexes every session without a writer that it holds nothing of
    /// (one a fill or rebuild could not read then): a writer killed outright (SIGKILL, a
    /// crash) within the index delay after a drain leaves commits in its file that a search
    /// finds only once it meets the session otherwise (a hit of it, a search narrowed to
    /// it), its next writer open or `rebuild-catalog`. The first search of a process does this itself; a long-running
    /// process calls it from time to time (`serve` does on each refresh of its catalog,
    /// at most every 2 s), so its searches find what such a writer left. Returns how many
    /// sessions the index took something new from.
    ///
    /// Before this root's first search it does nothing (that search will): no index is
    /// opened, created or filled here. One read of the root folder, one read of the
    /// index's session list and one `fstatat` of each session's `writer.lock`; only a
    /// session whose lock file holds a record no live writer holds, not caught up since
    /// that record was written, or one the index does not hold, is read. Best effort: a
    /// session that cannot be read is left to a later call.
    pub fn catch_up_dead_writers(&self) -> usize {
        match self.index_slot().get() {
            Some(index) if index.is_filled().unwrap_or(false) => {
                self.catch_up_dead_writers_in(index)
            }
            _ => 0,
        }
    }

    /// [`Root::catch_up_dead_writers`] into `index`: every session of the root whose writer
    /// died ([`Root::catch_up_if_writer_died`]); how many the index took something new from.
    /// Sessions the index holds nothing of are caught up as well: a fill or a rebuild
    /// that could not read one then (a file an older build had upgraded, a damaged one
    /// since repaired) left it out, and no search found its messages, nor named it, until
    /// its next write or rebuild (outside testing, session 40).
    fn catch_up_dead_writers_in(&self, index: &SearchIndex) -> usize {
        let Ok(scan) = self.scan() else {
            return 0;
        };
        let Ok(indexed) = index.indexed_sessions() else {
            return 0;
        };
        let indexed: std::collections::HashSet<SessionId> =
            indexed.into_iter().map(|(id, _)| id).collect();
        let mut unreadable = Vec::new();
        let count = scan
            .folders
            .iter()
            .filter(|id| {
                if !indexed.contains(*id) {
                    return match self.catch_up_unless_held(index, id) {
                        Ok(took) => took,
                        Err(error) => {
                            unreadable.extend(unsearchable((*id).clone(), error));
                            false
                        }
                    };
                }
                if index.is_private() {
                    return self.catch_up_if_files_changed(index, id);
                }
                let Some(stamp) = lock_record_stamp(self.dir_fd(), id) else {
                    return false;
                };
                match self.catch_up_if_writer_died(index, id, stamp) {
                    Ok(took) => took,
                    // Another process holds the index (a long write, a `sqlite3` shell in a
                    // transaction on it): what the writer added is not in it, and a search
                    // answered "no matches" for it without a word (outside testing, people
                    // and tools). Named as skipped, saying why.
                    Err(error) if error.is_busy() => {
                        unreadable.extend(unsearchable((*id).clone(), error));
                        false
                    }
                    Err(_) => false,
                }
            })
            .count();
        self.set_unsearchable(unreadable);
        count
    }

    /// Catches session `id` up in a private index when its files changed since it was last
    /// caught up: no writer writes a private index (a root this process may not write), so
    /// a `serve` over one found nothing a writer added to a session it had indexed (outside
    /// testing, users and permissions). Live writers included: reading takes no lock.
    /// Returns whether the index took anything new. Best effort.
    fn catch_up_if_files_changed(&self, index: &SearchIndex, id: &SessionId) -> bool {
        let Some(stamp) = files_stamp(self.dir_fd(), id) else {
            return false;
        };
        if !index.files_changed(id, stamp) {
            return false;
        }
        match self
            .open_reader(id)
            .and_then(|reader| index.catch_up(&reader))
        {
            Ok(took) => took,
            Err(_) => {
                index.files_seen_again(id);
                false
            }
        }
    }

    /// Catches session `id` up in the index (one it holds nothing of, or one a writer of
    /// this process closed while another process held the index) unless a writer holds it
    /// (a live writer indexes its own drains, and catches its session up at its first
    /// drain after a search made the index). Returns whether the index took anything, or
    /// why the session could not be read (a later call tries again).
    fn catch_up_unless_held(&self, index: &SearchIndex, id: &SessionId) -> Result<bool> {
        if lock::is_held(&self.session_dir(id).join(LOCK_FILE)).unwrap_or(true) {
            return Ok(false);
        }
        self.open_reader(id)
            .and_then(|reader| index.catch_up(&reader))
    }

    /// Whether the session the index recorded as damaged is still in the root: not deleted,
    /// nor deleted and made again, behind the index's back (by hand, or by an older build,
    /// whose delete knows nothing of the record). Every search named such a session as
    /// damaged until a rebuild, also a sound one made again under its id (outside testing
    /// M2). One whose file cannot be opened is taken to be it.
    fn still_the_damaged_session(&self, damaged: &DamagedSession) -> bool {
        if !self.session_dir(&damaged.id).is_dir() {
            return false;
        }
        match (damaged.born, self.open_reader(&damaged.id)) {
            (Some(born), Ok(reader)) => reader.header().created_at_ms == born,
            _ => true,
        }
    }

    /// Catches session `id` up in the index when its last writer died: its `writer.lock`
    /// holds a record (a writer clears it when it lets the lock go), nobody holds the
    /// lock, and no search (of this process or an earlier one) caught the session up
    /// since that record was written (`search_dead_writers`). A live writer indexes its own drains. `stamp` is the stamp of that record
    /// ([`lock_record_stamp`]). Returns whether the index took anything new, or the error
    /// of the index's catch-up (a session that cannot be read is left to a later call).
    fn catch_up_if_writer_died(
        &self,
        index: &SearchIndex,
        id: &SessionId,
        stamp: LockStamp,
    ) -> Result<bool> {
        if index.dead_writer_caught_up(id, stamp)
            || lock::is_held(&self.session_dir(id).join(LOCK_FILE)).unwrap_or(true)
        {
            return Ok(false);
        }
        let Ok(reader) = self.open_reader(id) else {
            return Ok(false);
        };
        let wrote = index.catch_up(&reader)?;
        index.caught_up_dead_writer(id, stamp);
        Ok(wrote)
    }

    /// Catches up the sessions a search meets (those of its hits, and the one it is
    /// narrowed to) whose writer died since this process's first search
    /// ([`Root::catch_up_if_writer_died`]); whether the index took anything new. One
    /// `fstatat` per session.
    fn catch_up_met_dead_writers<'a>(
        &self,
        index: &SearchIndex,
        met: impl Iterator<Item = &'a SessionId>,
    ) -> bool {
        let mut met: Vec<&SessionId> = met.collect();
        met.sort();
        met.dedup();
        met.into_iter().fold(false, |wrote, id| {
            lock_record_stamp(self.dir_fd(), id).is_some_and(|stamp| {
                self.catch_up_if_writer_died(index, id, stamp)
                    .unwrap_or(false)
            }) | wrote
        })
    }

    /// The search index, opened (created, replaced or private as
    /// [`Root::open_search_index`] says) and kept in this root, not filled.
    fn opened_search_index(&self) -> Result<Arc<SearchIndex>> {
        if let Some(index) = self.index_slot().get() {
            return Ok(Arc::clone(index));
        }
        let index = match self.open_root_index() {
            // A newer build's index: searched through a private one, as a root this
            // process may only read, and left as it is.
            Ok(opened) if opened.is_newer()? => SearchIndex::open_private()?,
            Ok(opened) => opened,
            Err(e) => SearchIndex::open_private().map_err(|_| e)?,
        };
        let index = Arc::new(index);
        // Two threads may open it at once: the first one set is kept.
        let _ = self.index_slot().set(Arc::clone(&index));
        Ok(self.index_slot().get().map_or(index, Arc::clone))
    }

    /// The index in the root's catalog folder (a damaged or foreign file is replaced).
    fn open_root_index(&self) -> Result<SearchIndex> {
        let dir = catalog_dir(self)?;
        let shown = self.path().join(CATALOG_DIR);
        let path = shown.join(SEARCH_FILE);
        if let Err(Error::InvalidInput { .. }) = schema::check_file(&path) {
            // A symlink or a non-regular file where the index's files belong.
            unlink_files_at(&dir, &SEARCH_FILES, &shown)?;
        }
        match SearchIndex::open(&path) {
            Err(Error::Corrupt { .. }) => {
                unlink_files_at(&dir, &SEARCH_FILES, &shown)?;
                SearchIndex::open(&path)
            }
            other => other,
        }
    }

    /// Puts a new index file in place of `index`'s damaged one and fills it; how many
    /// sessions it indexed.
    fn replace_damaged_index(&self, index: &SearchIndex) -> Result<usize> {
        index.replace_file(|| {
            let shown = self.path().join(CATALOG_DIR);
            unlink_files_at(&catalog_dir(self)?, &SEARCH_FILES, &shown)
        })?;
        self.fill(index, Fill::Anew)
    }

    /// Indexes every session of the root into `index` (emptied first), as `fill` says.
    fn fill(&self, index: &SearchIndex, fill: Fill) -> Result<usize> {
        let ids = self.list_ids()?;
        let mut unreadable = Vec::new();
        let count = index.rebuild(
            fill,
            ids.into_iter().map(|id| {
                let reader = self.open_reader(&id);
                (id, reader)
            }),
            |session_id, error| unreadable.extend(unsearchable(session_id, error)),
        )?;
        self.set_unsearchable(unreadable);
        Ok(count)
    }

    /// Records the sessions the search index holds nothing of because their file could
    /// not be read (by a fill, or the catch-up of the sessions it holds nothing of), so
    /// that each search names them ([`Root::unsearchable`]).
    fn set_unsearchable(&self, sessions: Vec<SkippedSession>) {
        *self
            .inner
            .unsearchable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = sessions;
    }

    /// The sessions a search of `only` (every session when `None`) cannot answer for and
    /// names in [`Searched::skipped`]: the index holds nothing of them, and their file
    /// could not be read when this process last tried (a fill, or the first search's
    /// catch-up). Such a session's messages were found by no search and named by none
    /// (outside testing, session 40).
    fn unsearchable(&self, only: Option<&SessionId>) -> Vec<SkippedSession> {
        self.inner
            .unsearchable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|s| only.is_none_or(|id| *id == s.session_id))
            .cloned()
            .collect()
    }

    /// Rebuilds the search index from the session files (creating it when missing):
    /// every session that can be read, whatever the index held before. Returns how many
    /// sessions it indexed.
    pub(crate) fn rebuild_search(&self) -> Result<usize> {
        match self.search_index() {
            Some(index) => match self.fill(&index, Fill::Anew) {
                Err(e) if e.is_corrupt() && index.is_damaged() => {
                    self.replace_damaged_index(&index)
                }
                other => other,
            },
            // Creating it fills it.
            None => Ok(self.open_search_index()?.indexed_sessions()?.len()),
        }
    }

    /// Brings a published session up to date in the search index, if the root has one,
    /// and the sessions it inherits from: one that a delete copied a range into and was
    /// killed before it indexed it again is still held as reading that range from the
    /// deleted session, so the messages a new fork of it inherits from its own file were
    /// found by no search (outside testing T1, session 41); a catch-up sees that its
    /// lineage changed and indexes it anew. Best effort: the index is derived, and a
    /// session it misses is caught up when next opened for writing or by a rebuild.
    pub(crate) fn index_session(&self, id: &SessionId) {
        self.index_session_unless_cancelled(id, &CancelToken::new());
    }

    /// [`Root::index_session`] that stops when `cancel` fires, leaving what it had not
    /// indexed to the next process's first search (a session the index holds nothing of
    /// is caught up then): for an import, whose Ctrl-C did nothing for the 10 s it indexed
    /// a large session after publishing it (outside testing I2).
    pub(crate) fn index_session_unless_cancelled(&self, id: &SessionId, cancel: &CancelToken) {
        if let Some(index) = self.search_index()
            && let Ok(reader) = self.open_reader(id)
        {
            let _ = index.catch_up_unless_cancelled(&reader, cancel);
            for entry in reader.lineage() {
                if cancel.is_cancelled() {
                    return;
                }
                if let Ok(ancestor) = self.open_reader(&entry.ancestor_id) {
                    let _ = index.catch_up_unless_cancelled(&ancestor, cancel);
                }
            }
        }
    }

    /// As [`Root::index_session`] with the reader of a live session.
    pub(crate) fn index_reader(&self, reader: &SessionReader) {
        if let Some(index) = self.search_index() {
            let _ = index.catch_up(reader);
        }
    }

    /// Re-indexes the sessions that inherited from a deleted session (their ranges now live
    /// in their own files), then drops the deleted one from the search index. In that
    /// order: a search between the two steps the other way round found neither the
    /// deleted session's rows nor the forks' copies, so a fork's inherited messages were
    /// found by no search for that moment (outside testing, session 36). Best effort.
    pub(crate) fn unindex_deleted(&self, id: &SessionId, dependents: &[SessionId]) {
        if let Some(index) = self.search_index() {
            index.release_file(&self.session_dir(id).join(SESSION_FILE));
            for child in dependents {
                self.index_session(child);
            }
            let _ = index.forget(id);
        }
    }

    /// The messages of `wanted` hits, `(position, seq)` by session, each read back from
    /// the file that holds it (see [`SearchIndex::hit_messages`]; only those still current
    /// there with `current`), the sessions whose folder is gone and those whose file
    /// cannot be read (their hits are left out, as `list` passes over them).
    fn read_back<'a>(
        &self,
        index: &SearchIndex,
        wanted: &[(&'a SessionId, Vec<(u64, u64)>)],
        current: bool,
    ) -> Result<ReadBack<'a>> {
        let mut messages = Vec::new();
        let mut gone = Vec::new();
        let mut skipped = Vec::new();
        for (id, at) in wanted {
            let file = self.session_dir(id).join(SESSION_FILE);
            // A `-wal`, `-shm` or `-journal` that is no regular file (SQLite failed the
            // whole search on it, or waited forever opening a FIFO), or a file this
            // process may not read (its hits were dropped without a word): the session is
            // skipped and named, as `list` does.
            let read =
                schema::check_file(&file).and_then(|()| index.hit_messages(&file, at, current));
            match read {
                Ok(found) => {
                    for ((position, seq), m) in at.iter().zip(found) {
                        if let Some(m) = m {
                            messages.push(((*id, *position, *seq), m));
                        }
                    }
                }
                Err(Error::SessionNotFound(_)) => gone.push((*id).clone()),
                // Deleted while being read.
                Err(_) if !file.is_file() => gone.push((*id).clone()),
                // The process is out of file descriptors: not this session's fault (also
                // when another reading thread freed one since SQLite's open failed).
                Err(e) if e.is_exhaustion() => return Err(e),
                Err(e) if e.is_cannot_open() && schema::open_failure_was_the_process(&file) => {
                    return Err(e);
                }
                // A damaged, foreign or newer file, one it may not read, one whose side
                // files are not regular: one session's fault, not the search's (every
                // search with a hit in it failed, naming no session).
                Err(e) => skipped.push(SkippedSession {
                    session_id: (*id).clone(),
                    error: Arc::new(e),
                }),
            }
        }
        Ok((messages, gone, skipped))
    }

    /// One page of full-text search hits for `query` (syntax: `model::search`), best
    /// first, and the cursor of the next page. Creates and fills the index on first use.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed query, a bad cursor, a blank role, an
    /// empty cwd or a limit over 100;
    /// [`Error::SessionNotFound`] when `options.session` names no session; I/O and SQLite
    /// errors of the index. A hit's session whose file cannot be read is in
    /// [`Searched::skipped`], its hits left out.
    pub(crate) fn search(&self, query: &str, options: &SearchOptions) -> Result<Searched> {
        let options = &with_role_folded(options)?;
        let first = match self.search_once(query, options) {
            // Damage inside the index file (pages overwritten): every search failed, a
            // rebuild too, for good. It is derived: replaced, filled, and asked again.
            Err(e) if e.is_corrupt() => match self.search_index() {
                Some(index) if index.is_damaged() => {
                    self.replace_damaged_index(&index)?;
                    self.search_once(query, options)?
                }
                _ => return Err(e),
            },
            other => other?,
        };
        match first {
            // A session was found gone (and the sessions that inherited from it indexed
            // again): the page is asked again, with their messages in it.
            (_, true) => self.search_once(query, options).map(|(page, _)| page),
            (page, false) => Ok(page),
        }
    }

    /// One try of [`Root::search`]; also says whether it found a session gone (the hits
    /// of the sessions that inherited from it may be missing from this page).
    fn search_once(&self, query: &str, options: &SearchOptions) -> Result<(Searched, bool)> {
        let parsed = SearchQuery::parse(query)?;
        let limit = if options.limit == 0 {
            DEFAULT_SEARCH_LIMIT
        } else {
            options.limit
        };
        if limit > MAX_SEARCH_LIMIT {
            return Err(Error::invalid(format!(
                "search limit must be 1..={MAX_SEARCH_LIMIT}"
            )));
        }
        let search = search_key(query, options);
        let after = options
            .cursor
            .as_deref()
            .map(|c| parse_cursor(c, search))
            .transpose()?;
        if let Some(id) = &options.session {
            // A mistyped id is "not found", as for every other call naming a session,
            // not a search that found nothing.
            self.existing_dir(id)?;
        }
        let index = self.open_search_index()?;
        let mut filter = IndexFilter {
            session: options.session.as_ref(),
            cwd: options.cwd.as_deref(),
            since_ms: options.since_ms,
            role: options.role.as_deref(),
            after,
            limit: limit + 1,
        };
        let (fts, phrase, marks) = (parsed.fts(), parsed.exact_phrase(), parsed.marks());
        let mut skipped = self.unsearchable(options.session.as_ref());
        skipped.extend(
            index
                .damaged_sessions(options.session.as_ref())?
                .into_iter()
                .filter(|damaged| self.still_the_damaged_session(damaged))
                .map(|damaged| SkippedSession {
                    session_id: damaged.id,
                    error: Arc::new(damaged.error),
                }),
        );
        let mut gone: Vec<SessionId> = Vec::new();
        let mut out: Vec<Found> = Vec::new();
        // Rows of the index that no session shows (a message a fork inherited, which the
        // fork and its session both replaced since) are dropped as they are read back: the
        // page is filled from the rows after them, in batches twice as large each time,
        // until it holds one hit more than `limit` (then the next page starts after its
        // last) or the rows end. A page cut from the first `limit + 1` rows was empty or
        // short, "no matches" with hits after it (outside testing, session 42).
        let next = loop {
            let mut hits = index.search(&fts, phrase.as_deref(), &filter)?;
            let met = hits
                .iter()
                .map(|h| &h.session_id)
                .chain(options.session.as_ref());
            if self.catch_up_met_dead_writers(&index, met) {
                // A session met was behind its file (its writer died after a drain): the
                // rows are asked again with what the index took.
                hits = index.search(&fts, phrase.as_deref(), &filter)?;
            }
            // The rows go on after a full batch's last.
            let after_rows = hits
                .last()
                .filter(|_| hits.len() >= filter.limit)
                .map(|h| (h.tier, h.row));
            out.extend(self.shown_hits(&index, &hits, options, &marks, &mut skipped, &mut gone)?);
            if out.len() > limit {
                out.truncate(limit);
                break out.last().map(|f| cursor_of(&f.hit, search));
            }
            match after_rows {
                Some(after) => {
                    filter.after = Some(after);
                    filter.limit = filter.limit.saturating_mul(2).min(MAX_ROWS_A_ROUND);
                }
                None => break None,
            }
        };
        // A session deleted behind the index's back (an older build, by hand), or by a
        // delete killed after its rename and before it updated the index: forgotten, and
        // the sessions that inherited from it indexed again. The delete copied their
        // inherited range into their own files, which the index holds only under the
        // deleted session: forgetting it alone lost those messages from every search
        // until a rebuild or a writer open of each fork.
        // The page is asked again after any: the forks of a session deleted meanwhile may
        // have been indexed again by its delete before this search looked for them (it
        // found no inheritor then, and answered without the forks' copies of the hits:
        // outside testing, session 36).
        gone.sort();
        gone.dedup();
        let again = !gone.is_empty();
        for id in gone {
            let inheritors = index.inheritors(&id).unwrap_or_default();
            self.unindex_deleted(&id, &inheritors);
        }
        let page = Searched {
            found: out,
            next,
            skipped,
        };
        Ok((page, again))
    }

    /// The hits of index rows `hits` that a session shows, in their order, each with its
    /// message read back and its snippet: a row whose message no session shows any more
    /// is left out. Sessions found gone are added to `gone`, those whose file cannot be
    /// read to `skipped`.
    fn shown_hits(
        &self,
        index: &SearchIndex,
        hits: &[IndexHit],
        options: &SearchOptions,
        marks: &[Mark],
        skipped: &mut Vec<SkippedSession>,
        gone: &mut Vec<SessionId>,
    ) -> Result<Vec<Found>> {
        // Each hit's message, read back from the file that holds it: one connection per
        // session of the page.
        let mut wanted: HashMap<&SessionId, Vec<(u64, u64)>> = HashMap::new();
        for hit in hits.iter().filter(|h| h.position > 0) {
            wanted
                .entry(&hit.session_id)
                .or_default()
                .push((hit.position, hit.seq));
        }
        // The files are read on up to `READ_THREADS` threads: opening a connection (the
        // file's schema parsed and checked; its `-shm` set up unless the file is quiet
        // and read without locks) is most of a hit's cost when none is kept for it.
        let wanted: Vec<(&SessionId, Vec<(u64, u64)>)> = wanted.into_iter().collect();
        let chunk = wanted.len().div_ceil(READ_THREADS).max(1);
        // A part whose thread cannot be started (the process out of threads or memory) is
        // read on this thread: `scope.spawn` panicked then.
        let read: Vec<Result<ReadBack<'_>>> = std::thread::scope(|scope| {
            let index = &index;
            let workers: Vec<_> = wanted
                .chunks(chunk)
                .map(|part| {
                    std::thread::Builder::new()
                        .spawn_scoped(scope, move || self.read_back(index, part, true))
                        .map_err(|_| part)
                })
                .collect();
            workers
                .into_iter()
                .map(|w| match w {
                    Ok(w) => w
                        .join()
                        .unwrap_or_else(|_| Err(Error::corrupt("a search read thread panicked"))),
                    Err(part) => self.read_back(index, part, true),
                })
                .collect()
        });
        let mut messages: HashMap<(&SessionId, u64, u64), Arc<Message>> = HashMap::new();
        for part in read {
            let (found, vanished, unreadable) = part?;
            messages.extend(found);
            gone.extend(vanished);
            skipped.extend(unreadable);
        }
        let unreadable = |id: &SessionId| skipped.iter().any(|s| s.session_id == *id);
        // Only a session some fork or rewind inherits from can share a hit with another.
        let mut sessions: Vec<&SessionId> = hits.iter().map(|h| &h.session_id).collect();
        sessions.sort();
        sessions.dedup();
        let ancestors = index.ancestors_among(&sessions)?;
        let sharing = |hit: &IndexHit| -> Result<Vec<SessionId>> {
            if ancestors.contains(&hit.session_id) {
                index.shared_with(hit)
            } else {
                Ok(Vec::new())
            }
        };
        // A message its session replaced or upserted since (no longer current in its
        // file) that forks cut before still show: read back as it was, and found under
        // such a fork. It used to be dropped, so no search found the forks' message.
        let mut stale: HashMap<&SessionId, Vec<(u64, u64)>> = HashMap::new();
        let mut inherited = HashMap::new();
        for hit in hits.iter().filter(|h| h.position > 0) {
            if (hit.own && messages.contains_key(&(&hit.session_id, hit.position, hit.seq)))
                || gone.contains(&hit.session_id)
                || unreadable(&hit.session_id)
            {
                continue;
            }
            let shown = sharing(hit)?;
            if shown.is_empty() {
                continue;
            }
            stale
                .entry(&hit.session_id)
                .or_default()
                .push((hit.position, hit.seq));
            inherited.insert(hit.row, shown);
        }
        let stale: Vec<(&SessionId, Vec<(u64, u64)>)> = stale.into_iter().collect();
        let (stale, vanished, unreadable_stale) = self.read_back(index, &stale, false)?;
        let stale: HashMap<(&SessionId, u64, u64), Arc<Message>> = stale.into_iter().collect();
        gone.extend(vanished);
        skipped.extend(unreadable_stale);
        let mut out = Vec::with_capacity(hits.len());
        for hit in hits {
            let key = (&hit.session_id, hit.position, hit.seq);
            // In its own session's transcript: current in that file, and not superseded by
            // a range the session inherits after it (`IndexHit::own`).
            let current = hit.own && messages.contains_key(&key);
            let (message_id, text) = if hit.position == 0 {
                if !hit.own {
                    // A title the session's own file holds from a range a delete copied
                    // there, that a range it inherits after it retitled: not its title.
                    continue;
                }
                if !self
                    .session_dir(&hit.session_id)
                    .join(SESSION_FILE)
                    .is_file()
                {
                    gone.push(hit.session_id.clone());
                    continue;
                }
                (String::new(), hit.title.clone())
            } else {
                match messages.get(&key).or_else(|| stale.get(&key)) {
                    Some(m) => (m.id().to_owned(), message_text(m)),
                    // Its session is gone, or the index is behind the file (caught up
                    // on the next drain, open or rebuild): not a current hit.
                    None => continue,
                }
            };
            let mut hit = hit.clone();
            let mut shared_with = match inherited.remove(&hit.row) {
                Some(shown) if !current => shown,
                _ => sharing(&hit)?,
            };
            // A fork deleted by a delete killed after its rename, before it updated the
            // index, was named in every search ("also in") until a rebuild: it is left
            // out and forgotten, as a hit's own session found gone is.
            shared_with.retain(|fork| {
                let there = self.session_dir(fork).join(SESSION_FILE).is_file();
                if !there {
                    gone.push(fork.clone());
                }
                there
            });
            if !current && hit.position > 0 {
                // Under a fork that shows it (the one searched, if any), as its session
                // no longer does; a search of that session alone does not find it.
                let at = match &options.session {
                    Some(only) => shared_with.iter().position(|f| f == only),
                    None => (!shared_with.is_empty()).then_some(0),
                };
                let Some(at) = at else {
                    continue;
                };
                hit.session_id = shared_with.remove(at);
                hit.title = index.session_title(&hit.session_id)?.unwrap_or_default();
            }
            out.push(Found {
                shared_with,
                snippet: snippet(&text, marks),
                message_id,
                hit,
            });
        }
        Ok(out)
    }
}

/// Session `id`, which the search index could not take for `error`, as a search names
/// it ([`Root::unsearchable`]); `None` when it is no longer there (deleted meanwhile, a
/// folder without a session file), as `list` passes over it, or when the error is the
/// process's own ([`Error::is_exhaustion`]), not the session's.
fn unsearchable(session_id: SessionId, error: Error) -> Option<SkippedSession> {
    (!error.is_not_found() && !error.is_exhaustion()).then(|| SkippedSession {
        session_id,
        error: Arc::new(error),
    })
}

/// The stamp of the `writer.lock` of session `id` (in the root folder `folder`) when it
/// holds a record, `None` when it is empty or missing (no writer, or one that let the lock
/// go).
fn lock_record_stamp(folder: rustix::fd::BorrowedFd<'_>, id: &SessionId) -> Option<LockStamp> {
    let st = stat_in(folder, id, LOCK_FILE)?;
    let size = u64::try_from(st.st_size).ok().filter(|&size| size > 0)?;
    Some((
        st.st_dev,
        st.st_ino,
        size,
        st.st_mtime,
        i64::try_from(st.st_mtime_nsec).ok()?,
    ))
}

/// The stamp of session `id`'s file and `-wal` in the root folder `folder` (a missing `-wal`
/// as zeros); `None` when the file cannot be read.
fn files_stamp(folder: rustix::fd::BorrowedFd<'_>, id: &SessionId) -> Option<FilesStamp> {
    let stamp = |name: &str| -> Option<(u64, i64, i64)> {
        let st = stat_in(folder, id, name)?;
        Some((
            u64::try_from(st.st_size).ok()?,
            st.st_mtime,
            i64::try_from(st.st_mtime_nsec).ok()?,
        ))
    };
    Some([
        stamp(SESSION_FILE)?,
        stamp(&format!("{SESSION_FILE}-wal")).unwrap_or_default(),
    ])
}

/// The file `name` of session `id`'s folder in the root folder `folder`, not followed if a
/// symlink; `None` when it cannot be read.
fn stat_in(
    folder: rustix::fd::BorrowedFd<'_>,
    id: &SessionId,
    name: &str,
) -> Option<rustix::fs::Stat> {
    rustix::fs::statat(
        folder,
        format!("{id}/{name}"),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A catch-up whose token fired writes nothing: the session stays one the index holds
    /// nothing of, which a later catch-up (the next process's first search) takes whole.
    /// An import's indexing after it published runs so (outside testing I2: Ctrl-C did
    /// nothing for the 10 s a large session was indexed).
    #[test]
    fn a_cancelled_catch_up_writes_nothing_and_a_later_one_takes_the_session() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = Root::open(dir.path()).expect("root");
        let id = SessionId::new("imported").expect("id");
        let session = root
            .create(crate::CreateOptions::with_id(id.clone()))
            .expect("create");
        let message = crate::Event::new("message/complete")
            .with_payload(
                &serde_json::json!({"message": {"id": "m", "role": "user", "content": "wombat"}}),
            )
            .expect("event");
        session
            .append(crate::Batch::new("o", vec![message]))
            .expect("append");
        session.close().expect("close");
        let index = crate::store::search::SearchIndex::open_private().expect("index");
        let reader = root.open_reader(&id).expect("reader");
        let cancelled = CancelToken::new();
        cancelled.cancel();
        assert!(matches!(
            index.catch_up_unless_cancelled(&reader, &cancelled),
            Err(Error::Cancelled)
        ));
        assert!(index.indexed_sessions().expect("sessions").is_empty());
        assert!(index.catch_up(&reader).expect("catch up"));
        assert_eq!(index.indexed_sessions().expect("sessions"), vec![(id, 1)]);
    }

    #[test]
    fn cursors_round_trip_and_refuse_junk() {
        let hit = IndexHit {
            row: 42,
            session_id: SessionId::new("s").expect("id"),
            title: String::new(),
            position: 1,
            seq: 1,
            role: None,
            time_ms: 0,
            rank: -1.25e-6,
            tier: 1,
            own: true,
        };
        let search = search_key("harbour", &SearchOptions::default());
        assert_eq!(
            parse_cursor(&cursor_of(&hit, search), search).expect("parses"),
            (1, 42)
        );
        // An earlier build's cursor, with the score its page had.
        assert_eq!(
            parse_cursor(
                &format!("s2.1.{:x}.42.{search:016x}", (-1.25e-6f64).to_bits()),
                search
            )
            .expect("parses"),
            (1, 42)
        );
        for junk in [
            "",
            "s2.",
            "s3.",
            "s3.1.zz.0000000000000001",
            "s3.1.1",
            "s3.1.1.0000000000000001.9",
            "s2.1.zz.3.0000000000000001",
            "h1.1.2",
            "s1.1.0.1",
            "s2.1.0.1",
            "s2.1.0.1.1",
            "s2.1.0.1.0000000000000001.9",
            "s2.1.7ff8000000000000.1.0000000000000001",
        ] {
            assert!(parse_cursor(junk, 1).is_err(), "{junk}");
        }
        // Another query, or the same one with another filter, is refused.
        let cursor = cursor_of(&hit, search);
        for other in [
            search_key("harbor", &SearchOptions::default()),
            search_key("harbour", &SearchOptions::default().with_role("user")),
        ] {
            let e = parse_cursor(&cursor, other).expect_err("another search");
            assert!(e.to_string().contains("continues another search"), "{e}");
        }
        let smaller = SearchOptions::default().with_limit(3).with_since(1);
        assert_eq!(search_key("harbour", &smaller), search);
    }
}
