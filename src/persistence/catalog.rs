//! The catalog: `<root>/.catalog/catalog.sqlite`, a derived index of per-session summaries
//! that makes `list` one keyset query. Rebuildable at any time from the session files.
//!
//! It lives in a dot-folder, out of the session id namespace (ids never start with `.`), so
//! no session folder can take the name of the catalog or of its `-wal` / `-shm`. A catalog
//! that is damaged or not ours is replaced on open; a catalog that cannot be written (a
//! read-only root, a full disk) is bypassed: the page is computed from the session files.
//! One session that cannot be read never fails a page or a rebuild: it is reported as a
//! [`SkippedSession`] and the others are listed.
//!
//! An entry is trusted only while the session file's stamp (size and mtime of
//! `session.sqlite` and `-wal`, read with `stat`, never by opening the file) is
//! unchanged; otherwise it is recomputed from the file. Every page checks that each
//! listed folder still exists, so a stale entry never revives a deleted session.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::header::Origin;
use crate::model::{Cost, Projection, SessionId, Usage, UsageTotals};
use crate::persistence::{Root, RootScan, confine, holds_session_file};
use crate::store::reader::SessionReader;
use crate::store::schema::{self, SESSION_FILE, WAL_FILE};

pub(crate) use crate::format::{CATALOG_DIR, CATALOG_FILE};
/// The catalog file and SQLite's files beside it. Older builds kept them at the root; there
/// they are removed when the catalog is first created in its folder.
const CATALOG_FILES: [&str; 4] = [
    "catalog.sqlite",
    "catalog.sqlite-wal",
    "catalog.sqlite-shm",
    "catalog.sqlite-journal",
];
/// `PRAGMA user_version` of a catalog whose entries mean what this build's do. In a
/// catalog of an earlier build (0: `updated_at_ms` was the last change of the session's
/// files, which a fork of it or a `dependents` row moved) every entry is made stale on
/// open, so each is computed again from its file when next listed.
const CATALOG_VERSION: i64 = 1;
/// `PRAGMA application_id` of a catalog file ("SeSC").
const CATALOG_APPLICATION_ID: i32 = 0x5365_5343;
/// The catalog's one table.
const CATALOG_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    stamp      TEXT NOT NULL,
    entry      TEXT NOT NULL
) WITHOUT ROWID;";

/// The indexes of the sorted listings (most recently updated or created first): a page is
/// a walk of the first entries of one of them, whatever the number of sessions. Partial,
/// like the listing query (`entry <> ''`): a row recorded before its entry is computed
/// holds no JSON.
const CATALOG_ORDER_INDEXES: &str = "
    CREATE INDEX IF NOT EXISTS sessions_by_updated
        ON sessions (json_extract(entry, '$.updated_at_ms')) WHERE entry <> '';
    CREATE INDEX IF NOT EXISTS sessions_by_created
        ON sessions (json_extract(entry, '$.created_at_ms')) WHERE entry <> '';";

/// A session that `list` or `rebuild_catalog` could not read, and why; the other sessions
/// are listed without it. A folder whose name is not UTF-8 is one, under its name with the
/// undecodable bytes as U+FFFD.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct SkippedSession {
    /// The session's id (its folder name).
    pub session_id: SessionId,
    /// Why it could not be read (e.g. a foreign or newer-schema file).
    #[serde(serialize_with = "error_text")]
    pub error: Arc<Error>,
}

fn error_text<S: serde::Serializer>(
    error: &Arc<Error>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(error)
}

/// A page of [`Root::list`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Listing {
    /// Sound sessions in id order.
    pub entries: Vec<CatalogEntry>,
    /// Sessions passed over on the way because they could not be read; on a first page
    /// also, last, the entries of the root named like sessions that are none of its (a
    /// symlink, a folder whose name is not UTF-8 or no valid id: see [`Root::list_ids`]).
    pub skipped: Vec<SkippedSession>,
    /// Why the catalog was bypassed (the page was computed from the session files), e.g. a
    /// read-only root or a full disk; `None` when the catalog served the page.
    pub catalog_error: Option<Arc<Error>>,
    /// How many of the last of `skipped` are such entries of the root, not of the page's
    /// range of ids.
    pub(crate) not_sessions: usize,
}

impl Listing {
    /// Reports `skipped`, entries of the root that are no sessions, after the others.
    fn add_not_sessions(&mut self, skipped: Vec<SkippedSession>) {
        self.not_sessions = skipped.len();
        self.skipped.extend(skipped);
    }

    /// The skipped sessions of the page's range of ids, and the entries of the root that
    /// are no sessions.
    pub(crate) fn split_skipped(self) -> (Vec<SkippedSession>, Vec<SkippedSession>) {
        let mut of_range = self.skipped;
        let at = of_range.len().saturating_sub(self.not_sessions);
        let not_sessions = of_range.split_off(at);
        (of_range, not_sessions)
    }
}

/// Totals over the catalog as last refreshed ([`Root::catalog_totals`]): one scan of its
/// rows, no session file opened. Sizes are those of the entries' stamps
/// (the last refresh); a fork's events, turns and usage include its inherited prefix, as
/// its [`CatalogEntry`] does. A sum past 2^64 - 1 (each session's counts fit in 64 bits,
/// their sum may not) is 2^64 - 1.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CatalogTotals {
    /// Sessions with an entry.
    pub sessions: u64,
    /// Bytes of their `session.sqlite` files.
    pub file_bytes: u64,
    /// Bytes of their `-wal` files.
    pub wal_bytes: u64,
    /// Durable events (the sum of the durable sequences).
    pub events: u64,
    /// Ended turns.
    pub turns: u64,
    /// `usage` events folded.
    pub usage_events: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Tokens read from a cache.
    pub cache_read_tokens: u64,
    /// Tokens written to a cache.
    pub cache_write_tokens: u64,
    /// The exact sum of the sessions' costs; `None` when no session has one (or, past
    /// 38 digits, when the sum does not fit). Every other surface of usage gave the cost,
    /// `/api/stats` alone did not (outside testing D6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
}

/// [`CatalogTotals`] being summed, one session at a time.
#[derive(Default)]
struct TotalsSum {
    totals: CatalogTotals,
    /// The costs' sum went past 38 digits: the totals give none.
    cost_overflowed: bool,
}

impl TotalsSum {
    /// Adds one session: its file and WAL bytes, durable events and turns, and usage.
    /// Each count of a session fits in 64 bits, their sum may not (a `usage` count may be
    /// 2^64 - 1): it saturates, where it wrapped.
    fn add(&mut self, [file, wal, events, turns]: [u64; 4], usage: &UsageTotals) {
        let t = &mut self.totals;
        let add = |sum: &mut u64, n: u64| *sum = sum.saturating_add(n);
        add(&mut t.sessions, 1);
        add(&mut t.file_bytes, file);
        add(&mut t.wal_bytes, wal);
        add(&mut t.events, events);
        add(&mut t.turns, turns);
        add(&mut t.usage_events, usage.events);
        add(&mut t.input_tokens, usage.input_tokens);
        add(&mut t.output_tokens, usage.output_tokens);
        add(&mut t.cache_read_tokens, usage.cache_read_tokens);
        add(&mut t.cache_write_tokens, usage.cache_write_tokens);
        if let Some(cost) = usage.cost.filter(|_| !self.cost_overflowed) {
            t.cost = match t.cost {
                None => Some(cost),
                Some(sum) => sum.checked_add(cost),
            };
            self.cost_overflowed = t.cost.is_none();
        }
    }
}

/// How long a small write of a derived catalog row waits for another process's write on
/// the catalog ([`Catalog::with_conn_writing`]).
const CATALOG_WRITE_WAIT: Duration = Duration::from_secs(1);

/// The rows behind [`CatalogTotals`], summed in [`Catalog::cached_totals`]: a stamp
/// starts with the session file's size and holds the WAL's after its `/` (`-`, a missing
/// file, casts to 0); the usage totals come as their JSON text, read exactly (a count up
/// to 2^64 - 1 is a floating-point number to SQLite, and its `sum` failed with "integer
/// overflow" past 2^63 - 1, so every totals call opened every session file instead;
/// outside testing Z3) and the cost summed as a decimal.
const TOTALS_SQL: &str = "SELECT CAST(stamp AS INTEGER),
    CAST(substr(stamp, instr(stamp, '/') + 1) AS INTEGER),
    json_extract(entry, '$.durable_sequence'),
    json_extract(entry, '$.turns'),
    json_extract(entry, '$.usage.total')
    FROM sessions WHERE entry <> ''";

/// The order of a listing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ListSort {
    /// By session id, ascending.
    #[default]
    Id,
    /// Most recently updated first (ties by id, descending).
    Updated,
    /// Most recently created first (ties by id, descending).
    Created,
}

/// Which sessions a listing returns and in which order: every filter given must match.
/// Built with the `with_*` methods.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only sessions whose header names exactly this working directory (compared byte for
    /// byte: spell it with [`absolute_cwd`](crate::absolute_cwd), as the sessions' own
    /// should be, see [`CreateOptions::cwd`](crate::CreateOptions::cwd)).
    pub cwd: Option<String>,
    /// Only sessions updated at or after this time (ms since the Unix epoch).
    pub since_ms: Option<i64>,
    /// Only sessions whose title contains this text (ASCII letters compared without case).
    pub title: Option<String>,
    /// Only sessions of this origin.
    pub origin: Option<Origin>,
    /// The order.
    pub sort: ListSort,
    /// A filtered or sorted page served from the catalog as last refreshed, without first
    /// bringing every stale entry up to date (see [`ListFilter::cached_only`]).
    pub cached_only: bool,
}

/// The version prefix of the list cursors this build makes (see
/// [`ListFilter::cursor_after`]).
const CURSOR_PREFIX: &str = "l2:";

/// The first parts of the other cursors this crate makes and made (an earlier build's
/// sorted list cursor, a history cursor, a search cursor): an earlier build's bare-id
/// cursor of this form is refused, as no listing made it.
const OTHER_CURSOR_TAGS: [&str; 6] = ["u", "c", "h1", "h2", "s2", "s3"];

/// The parts `(order, time, id)` of an earlier build's sorted cursor, `u.<time>.<id>` or
/// `c.<time>.<id>`; `None` for anything else (in id order an earlier cursor was the bare
/// id).
fn old_sorted_cursor(cursor: &str) -> Option<(&str, &str, &str)> {
    let mut parts = cursor.splitn(3, '.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(tag @ ("u" | "c")), Some(key), Some(id)) if key.parse::<i64>().is_ok() => {
            Some((tag, key, id))
        }
        _ => None,
    }
}

impl ListFilter {
    /// Only sessions whose header names exactly `cwd` (`/srv/api/` is not `/srv/api`): pass
    /// a user's text through [`absolute_cwd`](crate::absolute_cwd) first, as the CLI does.
    pub fn with_cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Only sessions updated at or after `ms` (ms since the Unix epoch).
    pub fn with_since_ms(mut self, ms: i64) -> Self {
        self.since_ms = Some(ms);
        self
    }

    /// Only sessions whose title contains `text` (ASCII letters compared without case).
    pub fn with_title(mut self, text: impl Into<String>) -> Self {
        self.title = Some(text.into());
        self
    }

    /// Only sessions of this origin.
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = Some(origin);
        self
    }

    /// The order.
    pub fn with_sort(mut self, sort: ListSort) -> Self {
        self.sort = sort;
        self
    }

    /// Serve a filtered or sorted page from the catalog as last refreshed: one keyset
    /// query, without the `stat` of every session that brings stale entries up to date
    /// first. A session changed since the last refreshing page may be out of place or show
    /// its older entry; a deleted one is still never returned. A first page reports the
    /// sessions the last refresh found unreadable, as a refreshing one does (until the next
    /// refresh, also one deleted or repaired since). For a view that refreshes
    /// now and then (a refreshing page every few seconds) over a big root. The plain
    /// listing (no filter, id order) always checks the entries it returns.
    pub fn cached_only(mut self) -> Self {
        self.cached_only = true;
        self
    }

    /// Whether this is the plain listing (no filter, id order).
    fn is_plain(&self) -> bool {
        ListFilter {
            cached_only: false,
            ..self.clone()
        } == ListFilter::default()
    }

    /// Whether `e` passes every filter (the same test the catalog query makes in SQL).
    fn matches(&self, e: &CatalogEntry) -> bool {
        self.cwd.as_ref().is_none_or(|c| e.cwd.as_ref() == Some(c))
            && self.since_ms.is_none_or(|s| e.updated_at_ms >= s)
            && self.title.as_ref().is_none_or(|t| {
                e.title
                    .to_ascii_lowercase()
                    .contains(&t.to_ascii_lowercase())
            })
            && self.origin.is_none_or(|o| e.origin == o)
    }

    /// The time `e` is sorted by (`None` in id order).
    fn key(&self, e: &CatalogEntry) -> Option<i64> {
        match self.sort {
            ListSort::Id => None,
            ListSort::Updated => Some(e.updated_at_ms),
            ListSort::Created => Some(e.created_at_ms),
        }
    }

    /// The cursor that continues a page ending with `e`:
    /// `l2:<order>:<listing>:<time>:<id>`, the order `i`, `u` or `c` (id, updated, created),
    /// the listing its order and filters hashed (XXH3-64) and the time `e` is
    /// sorted by (0 in id order). A session id holds no `:`, so no id reads as a cursor.
    pub fn cursor_after(&self, e: &CatalogEntry) -> String {
        format!(
            "{CURSOR_PREFIX}{}:{:016x}:{}:{}",
            self.sort_tag(),
            self.listing_key(),
            self.key(e).unwrap_or(0),
            e.session_id
        )
    }

    /// The order's letter in a cursor.
    fn sort_tag(&self) -> &'static str {
        match self.sort {
            ListSort::Id => "i",
            ListSort::Updated => "u",
            ListSort::Created => "c",
        }
    }

    /// Which listing a cursor continues: the order and the cwd, title (as matched, ASCII
    /// lower case) and origin filters, hashed (XXH3-64). `since_ms` is left out, as a
    /// search cursor leaves it out: a relative `--since 1d` moves on every page.
    fn listing_key(&self) -> u64 {
        let key = serde_json::json!([
            self.sort_tag(),
            self.cwd,
            self.title.as_ref().map(|t| t.to_ascii_lowercase()),
            self.origin.map(Origin::as_str),
        ]);
        xxhash_rust::xxh3::xxh3_64(key.to_string().as_bytes())
    }

    /// Whether any filter is given (the order aside).
    fn is_filtered(&self) -> bool {
        self.cwd.is_some()
            || self.since_ms.is_some()
            || self.title.is_some()
            || self.origin.is_some()
    }

    /// The position a cursor names: `(time, id)` in time order (`time` is `i64::MAX`
    /// without a cursor), `(0, id)` in id order. A cursor of this build must have been
    /// made by a listing of this order and these filters (`since_ms` aside). An earlier
    /// build's forms, which name no filters, are followed by a listing without filters
    /// only: a bare session id in id order, `u.<time>.<id>` / `c.<time>.<id>` in that
    /// order.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for anything else: a cursor of another order or other
    /// filters, one no listing makes (a time that is not a number as a listing writes it,
    /// an id that is no session id).
    fn position(&self, cursor: Option<&str>) -> Result<(i64, String)> {
        let Some(cursor) = cursor else {
            return Ok((i64::MAX, String::new()));
        };
        let bad = |why: &str| {
            Error::invalid(format!(
                "invalid list cursor {}: {why}",
                crate::error::quoted(cursor)
            ))
        };
        let (tag, made_by, key, id) = match cursor.strip_prefix(CURSOR_PREFIX) {
            Some(rest) => {
                let mut parts = rest.splitn(4, ':');
                let (Some(tag), Some(made_by), Some(key), Some(id)) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    return Err(bad("not a cursor a listing made"));
                };
                let made_by = Some(made_by)
                    .filter(|m| m.len() == 16)
                    .and_then(|m| u64::from_str_radix(m, 16).ok())
                    .ok_or_else(|| bad("not a cursor a listing made"))?;
                (tag, Some(made_by), key, id)
            }
            None => match old_sorted_cursor(cursor) {
                Some((tag, key, id)) => (tag, None, key, id),
                // The form of another cursor of this crate (a history's `h1.…`, a
                // search's `s3.…`), not an id a listing ended with.
                None if cursor
                    .split_once('.')
                    .is_some_and(|(tag, _)| OTHER_CURSOR_TAGS.contains(&tag)) =>
                {
                    return Err(bad("not a cursor a listing made"));
                }
                None => ("i", None, "0", cursor),
            },
        };
        let order = match tag {
            "i" => ListSort::Id,
            "u" => ListSort::Updated,
            "c" => ListSort::Created,
            _ => return Err(bad("not a cursor a listing made")),
        };
        let key = key
            .parse::<i64>()
            .ok()
            .filter(|k| k.to_string() == key && (made_by.is_some() || *k >= 0))
            .ok_or_else(|| bad("not a cursor a listing made"))?;
        if SessionId::new(id).is_err() || (order == ListSort::Id && key != 0) {
            return Err(bad("not a cursor a listing made"));
        }
        if order != self.sort {
            let name = |s: ListSort| match s {
                ListSort::Id => "id",
                ListSort::Updated => "updated",
                ListSort::Created => "created",
            };
            // Any text that is a session id reads as an earlier build's cursor (of the id
            // order): `garbage` was said to continue "a listing sorted by id".
            if made_by.is_none() && order == ListSort::Id && id == cursor {
                return Err(bad(&format!(
                    "not a cursor a listing sorted by {} made (a bare session id continues \
                     only the id order, as an earlier build's cursor)",
                    name(self.sort)
                )));
            }
            return Err(bad(&format!(
                "not for this sort: it continues a listing sorted by {}, not by {}; give the \
                 sort and filters of the page it came from",
                name(order),
                name(self.sort)
            )));
        }
        match made_by {
            Some(made_by) if made_by != self.listing_key() => Err(bad(
                "it continues a listing with other filters; give the filters of the page it \
                 came from",
            )),
            None if self.is_filtered() => Err(bad(
                "a cursor of an earlier build names no filters, so it cannot continue a \
                 filtered listing; start again without a cursor",
            )),
            _ => Ok((if order == ListSort::Id { 0 } else { key }, id.to_owned())),
        }
    }

    /// The one keyset query of a filtered or sorted page: named parameters `:cwd`,
    /// `:since`, `:title` (lower-cased), `:origin`, `:key`, `:id`, `:limit`.
    fn sql(&self) -> String {
        // In id order every row's key is 0: a cursor (key 0) keeps the ids after it, no
        // cursor (key i64::MAX) keeps every row.
        let (key, keyset, order) = match self.sort {
            ListSort::Id => (
                "0",
                "(k < :key OR (k = :key AND session_id > :id))",
                "session_id",
            ),
            ListSort::Updated => (
                "json_extract(entry, '$.updated_at_ms')",
                "(k < :key OR (k = :key AND session_id < :id))",
                "k DESC, session_id DESC",
            ),
            ListSort::Created => (
                "json_extract(entry, '$.created_at_ms')",
                "(k < :key OR (k = :key AND session_id < :id))",
                "k DESC, session_id DESC",
            ),
        };
        format!(
            "SELECT session_id, stamp, entry FROM (
                 SELECT session_id, stamp, entry, {key} AS k FROM sessions WHERE entry <> ''
             ) WHERE (:cwd IS NULL OR json_extract(entry, '$.cwd') = :cwd)
               AND (:since IS NULL OR json_extract(entry, '$.updated_at_ms') >= :since)
               AND (:title IS NULL OR instr(lower(json_extract(entry, '$.title')), :title) > 0)
               AND (:origin IS NULL OR json_extract(entry, '$.origin') = :origin)
               AND {keyset}
             ORDER BY {order} LIMIT :limit"
        )
    }
}

/// What [`Root::rebuild_catalog`] did.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct RebuildReport {
    /// Sessions indexed.
    pub sessions: usize,
    /// Sessions that could not be read (listed as skipped until they can).
    pub skipped: Vec<SkippedSession>,
    /// Sessions in the rebuilt search index.
    pub searchable: usize,
}

/// What the catalog knows about a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CatalogEntry {
    /// The session id.
    pub session_id: SessionId,
    /// Storage codec.
    pub codec: String,
    /// Title from the last `session/title`.
    pub title: String,
    /// Ended turns.
    pub turns: u64,
    /// First user message, cut to 240 characters.
    pub preview: Option<String>,
    /// Last durable sequence.
    pub durable_sequence: u64,
    /// Creation time (ms since the Unix epoch).
    pub created_at_ms: i64,
    /// Time of the session's last durable commit of its own, or its creation time before
    /// any (ms since the Unix epoch): forking, reading, verifying or exporting it does not
    /// move it.
    pub updated_at_ms: i64,
    /// Working directory from the header.
    pub cwd: Option<String>,
    /// Parent session from the header.
    pub parent_id: Option<SessionId>,
    /// Origin from the header.
    pub origin: Origin,
    /// Token and cost totals (a fork's include its inherited prefix).
    #[serde(default)]
    pub usage: Usage,
}

impl CatalogEntry {
    /// The entry of a session whose projection is `projection` at `durable_sequence`,
    /// last updated at `updated_at_ms` ([`SessionReader::updated_at_ms`]).
    pub(crate) fn new(
        reader: &SessionReader,
        projection: &Projection,
        durable_sequence: u64,
        updated_at_ms: i64,
    ) -> Self {
        let h = reader.header();
        CatalogEntry {
            session_id: h.session_id.clone(),
            codec: h.codec.clone(),
            title: projection.title.clone(),
            turns: projection.ended_turns,
            preview: projection.preview.clone(),
            durable_sequence,
            created_at_ms: h.created_at_ms,
            updated_at_ms,
            cwd: h.cwd.clone(),
            parent_id: h.parent_id.clone(),
            origin: h.origin,
            usage: projection.usage.clone(),
        }
    }
}

/// The stamp of a file that does not exist.
const MISSING: &str = "-";

/// The stamp of a file that cannot be looked at (in a folder this process may not search):
/// never a cached row's, and not [`MISSING`], so the session is read (and reported when
/// that fails), not taken for deleted.
const UNREADABLE: &str = "?";

/// One file's part of a stamp: `<size>@<mtime ns>`, [`MISSING`] or [`UNREADABLE`].
fn file_stamp(size_and_mtime: rustix::io::Result<(u64, u128)>) -> String {
    use rustix::io::Errno;
    match size_and_mtime {
        Ok((len, ns)) => format!("{len}@{ns}"),
        Err(Errno::NOENT | Errno::NOTDIR) => MISSING.to_owned(),
        Err(_) => UNREADABLE.to_owned(),
    }
}

/// Stamps of the sessions of one root: size and mtime (ns) of `session.sqlite` and its
/// `-wal`, each read with `fstatat` relative to the root's own descriptor
/// ([`Root::dir_fd`]; a symlink is not followed): no walk of the root's path per file,
/// and no open of the root folder per call (`gc` looked up every old session's entry, one
/// open each).
struct Stamper<'a> {
    root: rustix::fd::BorrowedFd<'a>,
}

impl<'a> Stamper<'a> {
    fn of(root: &'a Root) -> Stamper<'a> {
        Stamper {
            root: root.dir_fd(),
        }
    }

    /// Size and mtime (ns) of the file `name` of session `id`; `stat`'s error (`ENOENT`
    /// when it is missing; a time or size out of range is `EOVERFLOW`).
    fn size_and_mtime(&self, id: &SessionId, name: &str) -> rustix::io::Result<(u64, u128)> {
        use rustix::io::Errno;
        let st = rustix::fs::statat(
            self.root,
            format!("{id}/{name}"),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )?;
        let seconds = u128::try_from(st.st_mtime).map_err(|_| Errno::OVERFLOW)?;
        let ns = seconds * 1_000_000_000 + u128::from(st.st_mtime_nsec);
        Ok((u64::try_from(st.st_size).map_err(|_| Errno::OVERFLOW)?, ns))
    }

    /// `<size>@<mtime ns>/<size>@<mtime ns>` of the session's file and WAL.
    fn stamp(&self, id: &SessionId) -> String {
        format!(
            "{}/{}",
            file_stamp(self.size_and_mtime(id, SESSION_FILE)),
            file_stamp(self.size_and_mtime(id, WAL_FILE))
        )
    }

    /// Bytes of the session's file and of its WAL (0 for a missing one).
    fn bytes(&self, id: &SessionId) -> (u64, u64) {
        let size = |name| self.size_and_mtime(id, name).map_or(0, |(len, _)| len);
        (size(SESSION_FILE), size(WAL_FILE))
    }
}

#[derive(Debug)]
pub(crate) struct Catalog {
    dir: PathBuf,
    conn: Mutex<Option<Connection>>,
    /// The sessions the last refresh of this catalog (in this process) found unreadable,
    /// which a page served from the catalog as it is ([`ListFilter::cached_only`]) reports
    /// again; `None` before the first.
    unreadable: Mutex<Option<Vec<SkippedSession>>>,
    /// The read of the root folder whose session folders this catalog last made sure it
    /// has a row for ([`Catalog::index_new_folders`]); dangling before the first.
    indexed: Mutex<Weak<RootScan>>,
}

/// Opens the catalog file at `path`, creating it (in one immediate transaction, so two
/// processes creating it at once agree) when it is new. A file that is not a catalog of
/// this format (another application's database, random bytes) is [`Error::Corrupt`].
fn open_catalog(path: &Path) -> Result<Connection> {
    let conn = schema::open_derived(
        path,
        &schema::DerivedFile {
            application_id: CATALOG_APPLICATION_ID,
            schema: CATALOG_SCHEMA,
            probe: "SELECT session_id, stamp, entry FROM sessions LIMIT 0",
            what: "a catalog",
            incremental_vacuum: false,
        },
    )?;
    // Also in a catalog made by an older build. Best effort: without them (a read-only
    // root) a sorted page sorts the rows instead of walking an index.
    let _ = conn.execute_batch(CATALOG_ORDER_INDEXES);
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version < CATALOG_VERSION {
        // An empty stamp matches no file: every entry is computed again when next listed.
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; UPDATE sessions SET stamp = ''; \
             PRAGMA user_version = {CATALOG_VERSION}; COMMIT;"
        ))?;
    }
    Ok(conn)
}

/// Opens the catalog's folder of `root` (the catalog's and the search index's), creating
/// it when missing; a symlink in its place is removed, never followed. When the folder is
/// new, a catalog left at the root by older builds is removed. Another file in its place
/// is the user's: [`Error::InvalidInput`] saying to move or remove it.
pub(crate) fn catalog_dir(root: &Root) -> Result<rustix::fd::OwnedFd> {
    let shown = root.path().join(CATALOG_DIR);
    let fresh = !confine::is_dir_at(root.dir_fd(), c".catalog");
    if confine::is_symlink_at(root.dir_fd(), c".catalog") {
        // Derived data: the link itself goes, never what it points to.
        unlink_files_at(root.dir_fd(), &[CATALOG_DIR], &shown)?;
    }
    let dir = match confine::ensure_dir_at(root.dir_fd(), CATALOG_DIR, &shown) {
        // Not a folder, and no symlink (removed above): a file of the user's, never
        // replaced. What it is in the way of, and what to do.
        Err(Error::InvalidInput { .. }) => {
            return Err(Error::invalid(format!(
                "{} is not a folder: session-store keeps this root's catalog and search \
                 index (derived data, made again from the session files) in a folder of that \
                 name; move or remove the file (until then `list` reads every session file \
                 and warns)",
                shown.display()
            )));
        }
        other => other?,
    };
    if fresh {
        unlink_files_at(root.dir_fd(), &CATALOG_FILES, root.path())?;
    }
    Ok(dir)
}

/// The session ids a catalog file lists, sorted: e.g. a root's catalog restored from a
/// replica, to learn which sessions the replica holds (`restore --all`). The file is only
/// read (a copy with no `-wal` beside it is opened immutable: nothing is created beside
/// it); its entries are not checked against any session file.
///
/// # Errors
/// [`Error::SessionNotFound`] when `file` is missing; [`Error::InvalidInput`] for a
/// symlink or a non-regular file; [`Error::Corrupt`] for a file that is not a catalog or
/// lists an invalid id.
pub fn catalog_session_ids(file: &Path) -> Result<Vec<SessionId>> {
    Ok(catalog_sequences(file)?
        .into_iter()
        .map(|(id, _)| id)
        .collect())
}

/// As [`catalog_session_ids`], each id with the durable sequence its entry records (`None`
/// for an entry not computed yet): what `restore --all` compares a restored session with,
/// to say that its replica held less than the replicated catalog saw.
///
/// # Errors
/// As [`catalog_session_ids`].
pub fn catalog_sequences(file: &Path) -> Result<Vec<(SessionId, Option<u64>)>> {
    schema::check_file(file)?;
    let access = schema::Access::for_user_file(file);
    let conn = Connection::open_with_flags(access.name(file), schema::reader_flags())?;
    let app: i32 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    if app != CATALOG_APPLICATION_ID {
        return Err(Error::corrupt(format!(
            "{} is not a catalog (application_id {app:#x})",
            file.display()
        )));
    }
    let mut stmt = conn.prepare(
        "SELECT session_id, CASE WHEN json_valid(entry)
                THEN json_extract(entry, '$.durable_sequence') END
         FROM sessions ORDER BY session_id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?))
    })?;
    let mut ids = Vec::new();
    for row in rows {
        let (text, sequence) = row?;
        let id = SessionId::new(text.as_str()).map_err(|_| {
            Error::corrupt(format!(
                "{} lists an invalid session id {}",
                file.display(),
                crate::error::quoted(&text)
            ))
        })?;
        ids.push((id, sequence.and_then(|s| u64::try_from(s).ok())));
    }
    Ok(ids)
}

/// Unlinks the entries `names` of `dir` that are files or symlinks (a symlink itself, never
/// what it points to); a missing entry or a folder (a session may bear such a name in an
/// older root) is left alone.
pub(crate) fn unlink_files_at(
    dir: impl rustix::fd::AsFd,
    names: &[&str],
    shown: &Path,
) -> Result<()> {
    use rustix::io::Errno;
    for name in names {
        match rustix::fs::unlinkat(&dir, *name, rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT | Errno::ISDIR | Errno::PERM) => {}
            Err(e) => {
                return Err(Error::io(
                    format!("remove {}", shown.join(name).display()),
                    e.into(),
                ));
            }
        }
    }
    Ok(())
}

/// Why session `id` has no entry: a symlink or other file where its folder or its session
/// file must be is refused as every open refuses it ([`schema::check_session_dir`]: the
/// fork tree of a symlinked folder answered "not found" where every other read said "is a
/// symlink; refused"); else it is not found.
fn not_found_or_refused(root: &Root, id: &SessionId) -> Error {
    match schema::check_session_dir(&root.session_dir(id)) {
        Err(e @ Error::InvalidInput { .. }) => e,
        _ => Error::SessionNotFound(id.to_string()),
    }
}

impl Catalog {
    pub(crate) fn new(root: &Path) -> Catalog {
        Catalog {
            dir: root.join(CATALOG_DIR),
            conn: Mutex::new(None),
            unreadable: Mutex::new(None),
            indexed: Mutex::new(Weak::new()),
        }
    }

    /// Opens the catalog in its folder. The catalog is derived: a damaged or foreign file
    /// (and its `-wal` / `-shm`) is replaced by an empty catalog, refilled as sessions are
    /// listed. The first open also removes a catalog left at the root by older builds.
    fn open(&self, root: &Root) -> Result<Connection> {
        let dir = catalog_dir(root)?;
        let path = self.dir.join(CATALOG_FILE);
        if let Err(Error::InvalidInput { .. }) = schema::check_file(&path) {
            // A symlink or a non-regular file where the catalog's files belong.
            unlink_files_at(&dir, &CATALOG_FILES, &self.dir)?;
        }
        match open_catalog(&path) {
            Err(Error::Corrupt { .. }) => {
                unlink_files_at(&dir, &CATALOG_FILES, &self.dir)?;
                open_catalog(&path)
            }
            other => other,
        }
    }

    /// Opens the catalog and gives every session folder of `ids` a row it has none for
    /// (once per process: sessions published before this catalog existed, or by a process
    /// that died before recording them, get a stale row). Damage inside the file, met by
    /// these first statements, replaces it: it is derived (`rebuild-catalog` failed on it,
    /// for good).
    fn open_indexing(&self, root: &Root, ids: &[SessionId]) -> Result<Connection> {
        let add_rows = |conn: &Connection| {
            let mut add = conn.prepare(
                "INSERT OR IGNORE INTO sessions (session_id, stamp, entry) VALUES (?1, '', '')",
            )?;
            for id in ids {
                add.execute([id.as_str()])?;
            }
            Ok::<_, Error>(())
        };
        let conn = self.open(root)?;
        // Best effort as the other one-row writes ([`Catalog::with_conn_writing`]): rows a
        // process could not add while another held the catalog are added by a later open
        // or page. Each command's first use of the catalog waited out the 5 s busy timeout
        // there (outside testing W8).
        conn.busy_timeout(CATALOG_WRITE_WAIT)?;
        let added = add_rows(&conn);
        conn.busy_timeout(schema::BUSY_TIMEOUT)?;
        match added {
            Ok(()) => Ok(conn),
            Err(e) if e.is_busy() => Ok(conn),
            Err(e) if e.is_corrupt() && schema::is_damaged(&conn) => {
                drop(conn);
                unlink_files_at(&catalog_dir(root)?, &CATALOG_FILES, &self.dir)?;
                let conn = self.open(root)?;
                add_rows(&conn)?;
                Ok(conn)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs `f` on the catalog connection, opening (and, for a new catalog, filling) it first.
    fn with_conn<T>(&self, root: &Root, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.with_conn_knowing(root, None, f)
    }

    /// [`Catalog::with_conn`] for one small write of a derived row (a session recorded,
    /// its entry stored or dropped), waiting [`CATALOG_WRITE_WAIT`] at most for another
    /// process's write instead of the busy timeout: each such write is best effort (a
    /// stale row is computed again when listed), and a process stopped inside a catalog
    /// write (a `rebuild-catalog` under Ctrl-Z) made every `append`, `delete` and `rename`
    /// wait 5 s and `create` 10 s, and a refresh kept `serve`'s pages waiting as long
    /// (outside testing W8).
    fn with_conn_writing<T>(
        &self,
        root: &Root,
        f: impl FnOnce(&Connection) -> Result<T>,
    ) -> Result<T> {
        self.with_conn(root, |c| {
            c.busy_timeout(CATALOG_WRITE_WAIT)?;
            let out = f(c);
            c.busy_timeout(schema::BUSY_TIMEOUT)?;
            out
        })
    }

    /// [`Catalog::with_conn`], given the read of the root folder the caller has just made
    /// (a first page's [`Root::scan`]), so that the first open does not read it again.
    fn with_conn_knowing<T>(
        &self,
        root: &Root,
        scan: Option<&RootScan>,
        f: impl FnOnce(&Connection) -> Result<T>,
    ) -> Result<T> {
        let mut guard = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let ids = ids_of(root, scan)?;
            *guard = Some(self.open_indexing(root, &ids)?);
        }
        let Some(conn) = guard.as_ref() else {
            return Err(Error::internal(
                "catalog connection missing after opening it",
            ));
        };
        let out = f(conn);
        // Damage inside the catalog (pages overwritten) shows only when a statement meets
        // it: every use failed, `rebuild-catalog` too, for good. The file is derived: it
        // is replaced, and the next use fills the new one (this one reports the damage).
        if matches!(&out, Err(e) if e.is_corrupt()) && schema::is_damaged(conn) {
            *guard = None;
            unlink_files_at(&catalog_dir(root)?, &CATALOG_FILES, &self.dir)?;
        }
        out
    }

    /// Gives a row to each session folder of `scan` (a first page's read of the root
    /// folder) that the catalog has none for: a folder put into the root by other means
    /// than this store (copied by hand, restored by a tool) while this process had its
    /// catalog open was listed by no page of this process (the folders are indexed once,
    /// at the catalog's first open). Runs once per read of the folder: a read kept while the
    /// folder shows no change (`Root::listing_scan`) is not looked at again; otherwise one
    /// read of the catalog's ids, and a `stat` per folder it does not know.
    fn index_new_folders(&self, root: &Root, scan: &Arc<RootScan>) -> Result<()> {
        let mut indexed = self.indexed.lock().unwrap_or_else(|e| e.into_inner());
        if Weak::ptr_eq(&indexed, &Arc::downgrade(scan)) {
            return Ok(());
        }
        self.with_conn_writing(root, |c| {
            let known: HashSet<String> = c
                .prepare_cached("SELECT session_id FROM sessions")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            let mut add = c.prepare_cached(
                "INSERT OR IGNORE INTO sessions (session_id, stamp, entry) VALUES (?1, '', '')",
            )?;
            for id in scan.folders.iter().filter(|id| {
                !known.contains(id.as_str()) && holds_session_file(&root.session_dir(id))
            }) {
                add.execute([id.as_str()])?;
            }
            Ok(())
        })?;
        *indexed = Arc::downgrade(scan);
        Ok(())
    }

    /// Opens the catalog for a page (see [`Catalog::with_conn_knowing`]); for a first
    /// page, `scan` is its read of the root folder, whose new session folders get a row
    /// ([`Catalog::index_new_folders`]).
    fn open_for_page(&self, root: &Root, scan: Option<&Arc<RootScan>>) -> Result<()> {
        self.with_conn_knowing(root, scan.map(|s| &**s), |_| Ok(()))?;
        scan.map_or(Ok(()), |s| self.index_new_folders(root, s))
    }

    /// Opens the catalog (indexing every folder of `scan`, the caller's read of the root
    /// folder, when it is this process's first open), so that the calls that follow do
    /// not read the root folder again.
    ///
    /// # Errors
    /// When the catalog cannot be opened or written (a read-only root).
    pub(crate) fn open_knowing(&self, root: &Root, scan: &RootScan) -> Result<()> {
        self.with_conn_knowing(root, Some(scan), |_| Ok(()))
    }

    /// Records that a session exists (its entry is computed when first listed).
    pub(crate) fn touch(&self, root: &Root, id: &SessionId) -> Result<()> {
        self.with_conn_writing(root, |c| {
            c.prepare_cached(
                "INSERT OR IGNORE INTO sessions (session_id, stamp, entry) VALUES (?1, '', '')",
            )?
            .execute([id.as_str()])?;
            Ok(())
        })
    }

    /// Stores an entry computed by the caller (e.g. from a live projection after close).
    pub(crate) fn put(&self, root: &Root, entry: &CatalogEntry) -> Result<()> {
        self.put_row(root, entry, &row(&Stamper::of(root), entry)?)
    }

    fn put_row(
        &self,
        root: &Root,
        entry: &CatalogEntry,
        (stamp, text): &(String, String),
    ) -> Result<()> {
        // Stamped after its file vanished (a delete while its entry was computed): such a
        // row matched the stamp of a missing file for ever, so no refresh dropped it, and
        // pages and stats counted the deleted session.
        if stamp.starts_with(MISSING) {
            return self.forget(root, &entry.session_id);
        }
        self.with_conn_writing(root, |c| {
            c.prepare_cached(
                "INSERT OR REPLACE INTO sessions (session_id, stamp, entry) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![entry.session_id.as_str(), stamp, text])?;
            Ok(())
        })
    }

    /// One session's entry: the cached row when its stamp is current, else computed from
    /// the file and stored. A catalog that cannot be used is bypassed (computed).
    pub(crate) fn entry(&self, root: &Root, id: &SessionId) -> Result<CatalogEntry> {
        let stamper = Stamper::of(root);
        let current = stamper.stamp(id);
        if current.starts_with(MISSING) {
            return Err(not_found_or_refused(root, id));
        }
        let cached = self
            .with_conn(root, |c| {
                Ok(
                    c.prepare_cached("SELECT stamp, entry FROM sessions WHERE session_id = ?1")?
                        .query_row([id.as_str()], |r| {
                            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                        })
                        .optional()?,
                )
            })
            .ok()
            .flatten()
            .filter(|(stamp, _)| *stamp == current)
            .and_then(|(_, text)| serde_json::from_str::<CatalogEntry>(&text).ok());
        if let Some(entry) = cached {
            return Ok(entry);
        }
        match compute(root, &stamper, id)? {
            Computed::Entry(entry) => {
                // The catalog is derived: a failed update only costs a recomputation.
                let _ = row(&stamper, &entry).and_then(|r| self.put_row(root, &entry, &r));
                Ok(*entry)
            }
            Computed::Gone => Err(not_found_or_refused(root, id)),
            Computed::Unreadable(_) => root.open_reader(id).and_then(|reader| {
                reader.projection()?;
                Err(Error::corrupt(format!("session {id} cannot be read")))
            }),
        }
    }

    /// Drops a session's entry.
    pub(crate) fn forget(&self, root: &Root, id: &SessionId) -> Result<()> {
        self.with_conn_writing(root, |c| {
            c.prepare_cached("DELETE FROM sessions WHERE session_id = ?1")?
                .execute([id.as_str()])?;
            Ok(())
        })
    }

    /// Up to `limit` entries after the cursor `after` that pass `filter`, in its order.
    /// The plain listing (no filter, id order) is [`Catalog::page`]. Otherwise every
    /// stale entry is brought up to date first (one `stat` per session; only changed files
    /// are read), then the page is one keyset query on the catalog; sessions that cannot
    /// be read are reported on the first page. When the catalog cannot be used, the page
    /// is computed from the session files.
    pub(crate) fn filtered_page(
        &self,
        root: &Root,
        filter: &ListFilter,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Listing> {
        let position = filter.position(after)?;
        if filter.is_plain() {
            return self.page(root, after.map(|_| position.1.as_str()), limit);
        }
        let stamper = Stamper::of(root);
        // The first page reports what is no session of the root; one read of the folder
        // (the last one again while the folder has not changed: `Root::listing_scan`).
        let scan = after.is_none().then(|| root.listing_scan()).transpose()?;
        let refreshed = if filter.cached_only {
            // Reported on every first page, not only by the page that ran the refresh
            // that found them (a damaged session then vanished from `serve`'s list).
            self.last_unreadable(root, &stamper)
        } else {
            self.open_for_page(root, scan.as_ref())
                .and_then(|()| self.refresh(root, &stamper))
        };
        let cached = refreshed.and_then(|skipped| {
            let mut listing = self.query_page(root, &stamper, filter, &position, limit)?;
            listing.skipped = skipped;
            Ok(listing)
        });
        let mut listing = match cached {
            Ok(listing) => listing,
            Err(e) => {
                let mut listing = direct_filtered_page(
                    root,
                    &stamper,
                    scan.as_deref(),
                    filter,
                    &position,
                    limit,
                )?;
                listing.catalog_error = Some(Arc::new(e));
                listing
            }
        };
        match scan {
            Some(scan) => listing.add_not_sessions(scan.skipped.clone()),
            None => listing.skipped.clear(),
        }
        Ok(listing)
    }

    /// Totals over the rows as they are (see [`CatalogTotals`]); when the catalog cannot
    /// be used (a read-only root), totals computed from the session files.
    pub(crate) fn totals(&self, root: &Root) -> Result<CatalogTotals> {
        self.cached_totals(root)
            .or_else(|e| direct_totals(root).map_err(|_| e))
    }

    fn cached_totals(&self, root: &Root) -> Result<CatalogTotals> {
        self.with_conn(root, |c| {
            let mut sum = TotalsSum::default();
            let mut stmt = c.prepare_cached(TOTALS_SQL)?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let n = |i| -> u64 {
                    r.get::<_, Option<i64>>(i)
                        .ok()
                        .flatten()
                        .and_then(|v| u64::try_from(v).ok())
                        .unwrap_or(0)
                };
                // An entry whose usage is not this build's JSON (a catalog edited by hand)
                // counts none.
                let usage = r
                    .get::<_, Option<String>>(4)
                    .ok()
                    .flatten()
                    .and_then(|text| serde_json::from_str::<UsageTotals>(&text).ok())
                    .unwrap_or_default();
                sum.add([n(0), n(1), n(2), n(3)], &usage);
            }
            Ok(sum.totals)
        })
    }

    /// Brings every stale entry up to date (vanished sessions dropped); returns the
    /// sessions that cannot be read.
    fn refresh(&self, root: &Root, stamper: &Stamper<'_>) -> Result<Vec<SkippedSession>> {
        let rows: Vec<(String, String)> = self.with_conn(root, |c| {
            let mut stmt = c.prepare_cached("SELECT session_id, stamp FROM sessions")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        let mut skipped = Vec::new();
        for (sid, stamp) in rows {
            let Ok(id) = SessionId::new(sid) else {
                continue;
            };
            let current = stamper.stamp(&id);
            // A row stamped as missing (an earlier build stored some) is dropped, not
            // taken as current.
            if current == stamp && !current.starts_with(MISSING) {
                continue;
            }
            match compute(root, stamper, &id)? {
                Computed::Entry(entry) => self.put_row(root, &entry, &row(stamper, &entry)?)?,
                Computed::Gone => self.forget(root, &id)?,
                Computed::Unreadable(s) => {
                    // Its old entry must not match a filter: the row is left stale and
                    // empty (retried next time, as `touch` leaves a new one).
                    self.with_conn_writing(root, |c| {
                        c.prepare_cached(
                            "UPDATE sessions SET stamp = '', entry = '' WHERE session_id = ?1",
                        )?
                        .execute([id.as_str()])?;
                        Ok(())
                    })?;
                    skipped.push(s);
                }
            }
        }
        *self.unreadable.lock().unwrap_or_else(|e| e.into_inner()) = Some(skipped.clone());
        Ok(skipped)
    }

    /// The sessions the last refresh found unreadable; before any refresh in this process,
    /// those whose rows a refresh left empty (stamp `''`: unreadable then, or published
    /// since) that still cannot be read, each read once to say why.
    fn last_unreadable(&self, root: &Root, stamper: &Stamper<'_>) -> Result<Vec<SkippedSession>> {
        let mut kept = self.unreadable.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(skipped) = kept.as_ref() {
            return Ok(skipped.clone());
        }
        let empty: Vec<String> = self.with_conn(root, |c| {
            let mut stmt = c.prepare_cached("SELECT session_id FROM sessions WHERE stamp = ''")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        let mut skipped = Vec::new();
        for id in empty.into_iter().filter_map(|sid| SessionId::new(sid).ok()) {
            if let Computed::Unreadable(s) = compute(root, stamper, &id)? {
                skipped.push(s);
            }
        }
        *kept = Some(skipped.clone());
        Ok(skipped)
    }

    /// One keyset query for a filtered or sorted page (entries fresh after `refresh`).
    fn query_page(
        &self,
        root: &Root,
        stamper: &Stamper<'_>,
        filter: &ListFilter,
        (key, id): &(i64, String),
        limit: usize,
    ) -> Result<Listing> {
        let texts: Vec<String> = self.with_conn(root, |c| {
            let mut stmt = c.prepare_cached(&filter.sql())?;
            let rows = stmt.query_map(
                rusqlite::named_params! {
                    ":cwd": filter.cwd,
                    ":since": filter.since_ms,
                    ":title": filter.title.as_ref().map(|t| t.to_ascii_lowercase()),
                    ":origin": filter.origin.map(Origin::as_str),
                    ":key": key,
                    ":id": id,
                    ":limit": i64::try_from(limit).unwrap_or(i64::MAX),
                },
                |r| r.get::<_, String>(2),
            )?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        let mut out = Listing::default();
        for text in texts {
            let entry: CatalogEntry =
                serde_json::from_str(&text).map_err(|e| Error::corrupt_from("catalog entry", e))?;
            // Deleted since the refresh: never revived.
            if !stamper.stamp(&entry.session_id).starts_with(MISSING) {
                out.entries.push(entry);
            }
        }
        Ok(out)
    }

    /// Up to `limit` entries with ids after `after`, in id order; stale entries are
    /// recomputed, entries of vanished folders dropped, unreadable sessions skipped. When
    /// the catalog cannot be used (it cannot be written: a read-only root, a full disk),
    /// the page is computed from the session files and the catalog's error reported.
    pub(crate) fn page(&self, root: &Root, after: Option<&str>, limit: usize) -> Result<Listing> {
        let stamper = Stamper::of(root);
        // What is no session of the root is reported on the first page, as the filtered
        // listing does, from the one read of the root folder that also gives its ids: a
        // later page stays a page of the catalog, without a read of the whole folder (nor
        // a first page while the folder has not changed: `Root::listing_scan`).
        let scan = after.is_none().then(|| root.listing_scan()).transpose()?;
        let cached = self
            .open_for_page(root, scan.as_ref())
            .and_then(|()| self.cached_page(root, &stamper, after, limit));
        let mut listing = match cached {
            Ok(listing) => listing,
            Err(e) => {
                let mut listing = direct_page(root, &stamper, scan.as_deref(), after, limit)?;
                listing.catalog_error = Some(Arc::new(e));
                listing
            }
        };
        if let Some(scan) = scan {
            listing.add_not_sessions(scan.skipped.clone());
        }
        Ok(listing)
    }

    fn cached_page(
        &self,
        root: &Root,
        stamper: &Stamper<'_>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Listing> {
        let mut out = Listing::default();
        let mut cursor = after.unwrap_or("").to_owned();
        while out.entries.len() < limit {
            let rows: Vec<(String, String, String)> = self.with_conn(root, |c| {
                let mut stmt = c.prepare_cached(
                    "SELECT session_id, stamp, entry FROM sessions WHERE session_id > ?1 ORDER BY session_id LIMIT ?2",
                )?;
                let rows = stmt.query_map(params![cursor, (limit - out.entries.len()) as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
                Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
            })?;
            let Some(last) = rows.last() else {
                break;
            };
            cursor = last.0.clone();
            for (sid, stamp, text) in rows {
                let Ok(id) = SessionId::new(sid) else {
                    continue;
                };
                let current = stamper.stamp(&id);
                if current.starts_with(MISSING) {
                    self.forget(root, &id)?;
                    continue;
                }
                let cached = (stamp == current)
                    .then(|| serde_json::from_str::<CatalogEntry>(&text).ok())
                    .flatten();
                let entry = match cached {
                    Some(entry) => entry,
                    None => match compute(root, stamper, &id)? {
                        Computed::Entry(entry) => {
                            self.put_row(root, &entry, &row(stamper, &entry)?)?;
                            *entry
                        }
                        Computed::Gone => {
                            self.forget(root, &id)?;
                            continue;
                        }
                        Computed::Unreadable(skipped) => {
                            out.skipped.push(skipped);
                            continue;
                        }
                    },
                };
                out.entries.push(entry);
            }
        }
        Ok(out)
    }

    /// Recomputes one entry per session, then replaces every row in one transaction, so a
    /// rebuild cut short (an error, a crash) leaves the previous catalog whole and no other
    /// process ever lists a half-filled one. A damaged or foreign catalog file is replaced.
    /// Sessions that cannot be read are reported and keep a stale row, so `list` reports
    /// them too.
    pub(crate) fn rebuild(&self, root: &Root) -> Result<RebuildReport> {
        let scan = root.scan()?;
        let ids = scan.ids(root);
        let stamper = Stamper::of(root);
        let mut rows = Vec::with_capacity(ids.len());
        let mut skipped = Vec::new();
        for id in &ids {
            match compute(root, &stamper, id)? {
                Computed::Entry(entry) => rows.push((id, row(&stamper, &entry)?)),
                // Deleted since it was listed: nothing to index.
                Computed::Gone => {}
                Computed::Unreadable(s) => skipped.push(s),
            }
        }
        skipped.extend(scan.skipped);
        // A damaged catalog is replaced by the first try (`with_conn`): the second fills
        // the new one.
        let write = |c: &Connection| {
            let tx = c.unchecked_transaction()?;
            tx.execute("DELETE FROM sessions", [])?;
            let mut put =
                tx.prepare("INSERT INTO sessions (session_id, stamp, entry) VALUES (?1, ?2, ?3)")?;
            for (id, (stamp, text)) in &rows {
                put.execute(params![id.as_str(), stamp, text])?;
            }
            // Sessions published while the entries were computed: indexed when listed.
            let mut add = tx.prepare(
                "INSERT OR IGNORE INTO sessions (session_id, stamp, entry) VALUES (?1, '', '')",
            )?;
            for id in root.list_ids()? {
                add.execute([id.as_str()])?;
            }
            drop((put, add));
            tx.commit()?;
            Ok(())
        };
        match self.with_conn(root, write) {
            Err(e) if e.is_corrupt() => self.with_conn(root, write)?,
            other => other?,
        }
        Ok(RebuildReport {
            sessions: rows.len(),
            skipped,
            searchable: 0,
        })
    }
}

/// The root's session ids: from `scan` when the caller read the root folder already, else
/// from a read now.
fn ids_of(root: &Root, scan: Option<&RootScan>) -> Result<Vec<SessionId>> {
    match scan {
        Some(scan) => Ok(scan.ids(root)),
        None => root.list_ids(),
    }
}

/// A page computed from the session files alone (no catalog read or write); `scan` the
/// read of the root folder when the caller made it already.
fn direct_page(
    root: &Root,
    stamper: &Stamper<'_>,
    scan: Option<&RootScan>,
    after: Option<&str>,
    limit: usize,
) -> Result<Listing> {
    let mut out = Listing::default();
    let after = after.unwrap_or("");
    for id in ids_of(root, scan)?
        .into_iter()
        .filter(|id| id.as_str() > after)
    {
        if out.entries.len() >= limit {
            break;
        }
        match compute(root, stamper, &id)? {
            Computed::Entry(entry) => out.entries.push(*entry),
            Computed::Gone => {}
            Computed::Unreadable(skipped) => out.skipped.push(skipped),
        }
    }
    Ok(out)
}

/// [`CatalogTotals`] computed from the session files alone (sessions that cannot be read
/// are left out, as from the catalog).
fn direct_totals(root: &Root) -> Result<CatalogTotals> {
    let stamper = Stamper::of(root);
    let mut sum = TotalsSum::default();
    for id in root.list_ids()? {
        let Computed::Entry(entry) = compute(root, &stamper, &id)? else {
            continue;
        };
        let (file_bytes, wal_bytes) = stamper.bytes(&id);
        sum.add(
            [file_bytes, wal_bytes, entry.durable_sequence, entry.turns],
            &entry.usage.total,
        );
    }
    Ok(sum.totals)
}

/// A filtered or sorted page computed from the session files alone.
fn direct_filtered_page(
    root: &Root,
    stamper: &Stamper<'_>,
    scan: Option<&RootScan>,
    filter: &ListFilter,
    (key, id): &(i64, String),
    limit: usize,
) -> Result<Listing> {
    let mut out = Listing::default();
    let mut entries = Vec::new();
    for sid in ids_of(root, scan)? {
        match compute(root, stamper, &sid)? {
            Computed::Entry(entry) => entries.push(*entry),
            Computed::Gone => {}
            Computed::Unreadable(skipped) => out.skipped.push(skipped),
        }
    }
    entries.retain(|e| filter.matches(e));
    match filter.sort {
        ListSort::Id => entries.retain(|e| e.session_id.as_str() > id.as_str()),
        ListSort::Updated | ListSort::Created => {
            entries.retain(|e| {
                let k = filter.key(e).unwrap_or(0);
                k < *key || (k == *key && e.session_id.as_str() < id.as_str())
            });
            entries.sort_by(|a, b| {
                (filter.key(b), &b.session_id).cmp(&(filter.key(a), &a.session_id))
            });
        }
    }
    entries.truncate(limit);
    out.entries = entries;
    Ok(out)
}

/// What reading a session's entry gave.
enum Computed {
    Entry(Box<CatalogEntry>),
    /// The session vanished (deleted meanwhile): not an error.
    Gone,
    /// The session exists but cannot be read.
    Unreadable(SkippedSession),
}

/// A session's entry, computed from its file. An error is the session's own when its
/// file is still there afterwards; otherwise it was deleted while being read. An error
/// of the process's own (no descriptor, memory or disk left: [`Error::is_exhaustion`]) is
/// returned: the session is not unreadable, and a listing that skipped it (every session,
/// when descriptors ran out) answered "no sessions".
fn compute(root: &Root, stamper: &Stamper<'_>, id: &SessionId) -> Result<Computed> {
    let read = || -> Result<CatalogEntry> {
        let reader = root.open_reader(id)?;
        // The projection at the sequence read first: a writer may commit meanwhile.
        let durable = reader.durable_sequence()?;
        Ok(CatalogEntry::new(
            &reader,
            &reader.projection_at(durable)?,
            durable,
            reader.updated_at_ms(durable)?,
        ))
    };
    Ok(match read() {
        Ok(entry) => Computed::Entry(Box::new(entry)),
        Err(_) if stamper.stamp(id).starts_with(MISSING) => Computed::Gone,
        // A symlink named like a session (a row an older build indexed): no session of
        // the root, which `Root::scan` reports once, on a listing's first page.
        Err(_) if std::fs::symlink_metadata(root.session_dir(id)).is_ok_and(|m| m.is_symlink()) => {
            Computed::Gone
        }
        Err(Error::SessionNotFound(_)) => Computed::Gone,
        Err(e) if e.is_exhaustion() => return Err(naming_session(e, &root.session_dir(id))),
        Err(e) => Computed::Unreadable(SkippedSession {
            session_id: id.clone(),
            error: Arc::new(e),
        }),
    })
}

/// `error`, an [`Error::is_exhaustion`] met reading the session in `dir`, naming it (a
/// full disk said only "disk full: disk I/O error"), its kind kept: "disk full: could not
/// read DIR/session.sqlite: no space left for its shared-memory file (-shm)".
fn naming_session(error: Error, dir: &std::path::Path) -> Error {
    let file = dir.join(crate::store::schema::SESSION_FILE);
    match error {
        Error::DiskFull(cause) => {
            let named = match cause.cause() {
                // SQLite's own text for a `-shm` it could not grow is "disk I/O error".
                rusqlite::Error::SqliteFailure(code, message) => {
                    let why = if code.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE {
                        "no space left for its shared-memory file (-shm)"
                    } else {
                        message.as_deref().unwrap_or("database or disk is full")
                    };
                    rusqlite::Error::SqliteFailure(
                        *code,
                        Some(format!("could not read {}: {why}", file.display())),
                    )
                }
                _ => return Error::DiskFull(cause),
            };
            Error::DiskFull(crate::error::SqliteError::new(named))
        }
        Error::Io { context, source } => Error::Io {
            context: format!("{context} (reading {})", file.display()),
            source,
        },
        other => other,
    }
}

/// The stamp and the stored text of a session's entry.
fn row(stamper: &Stamper<'_>, entry: &CatalogEntry) -> Result<(String, String)> {
    let stamp = stamper.stamp(&entry.session_id);
    let text = serde_json::to_string(entry)
        .map_err(|e| Error::internal_from("catalog entry to JSON", e))?;
    Ok((stamp, text))
}
