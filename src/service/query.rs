//! The query side: list, history, snapshots and observation, for live and cold
//! sessions alike. Never takes the writer lock.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::Snippet;
use crate::model::event::sha256_hex;
use crate::model::header::{Header, Origin};
use crate::model::{Commit, ContentRef, Message, SessionId, SessionRef, Usage};
use crate::persistence::{
    CatalogEntry, ListFilter, ListSort, RebuildReport, SearchOptions, SkippedSession,
};
use crate::service::runtime::RuntimeSnapshot;
use crate::service::{Service, blocking};
use crate::session::live::{PersistenceStatus, SessionSnapshot};
use crate::store::reader::{HistoryBody, SessionReader};

/// Largest page `list` returns (a larger `limit` is [`Error::InvalidInput`]).
pub const MAX_LIST_LIMIT: usize = 100;
/// Default page of `history_page` (a `limit` of 0 gives it).
const DEFAULT_HISTORY_LIMIT: usize = 100;
/// Largest page `history_page` returns (a larger `limit` is [`Error::InvalidInput`], as
/// `list`'s and `observe`'s are).
pub const MAX_HISTORY_LIMIT: usize = 500;
/// Largest page of `observe`.
const MAX_OBSERVE_LIMIT: usize = 1000;
/// The commits of an `observe` page whose limit is 0 (upstream's `Read` default).
const DEFAULT_OBSERVE_LIMIT: usize = 100;

/// One row of `list`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SessionSummary {
    /// The session.
    pub session_ref: SessionRef,
    /// Storage codec.
    pub codec: String,
    /// Title from the last `session/title`.
    pub title: String,
    /// Ended turns.
    pub turns: u64,
    /// First user message, cut to 240 characters.
    pub preview: Option<String>,
    /// Last accepted sequence (durable for cold sessions).
    pub event_sequence: u64,
    /// Last durable sequence.
    pub durable_sequence: u64,
    /// Creation time (ms since the Unix epoch).
    pub created_at_ms: i64,
    /// Last change of the session's files (ms since the Unix epoch).
    pub updated_at_ms: i64,
    /// Working directory from the header.
    pub cwd: Option<String>,
    /// Parent session from the header.
    pub parent_id: Option<SessionId>,
    /// Origin from the header.
    pub origin: Origin,
    /// Token and cost totals (accepted for a live session; a fork's include its
    /// inherited prefix).
    #[serde(default)]
    pub usage: Usage,
    /// Whether a writer holds it: a runtime of this service has it open (also while a
    /// close of it drains), or a writer of any process holds its writer lock (probed as it
    /// is listed), as the "live" badge of `serve` says.
    pub live: bool,
}

impl SessionSummary {
    fn from_entry(
        host_id: &str,
        e: CatalogEntry,
        event_sequence: u64,
        live: bool,
    ) -> SessionSummary {
        SessionSummary {
            session_ref: SessionRef {
                host_id: host_id.to_owned(),
                session_id: e.session_id,
            },
            codec: e.codec,
            title: e.title,
            turns: e.turns,
            preview: e.preview,
            event_sequence,
            durable_sequence: e.durable_sequence,
            created_at_ms: e.created_at_ms,
            updated_at_ms: e.updated_at_ms,
            cwd: e.cwd,
            parent_id: e.parent_id,
            origin: e.origin,
            usage: e.usage,
            live,
        }
    }
}

/// A page of `list`.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct SessionPage {
    /// Sessions in the listing's order (id order by default).
    pub sessions: Vec<SessionSummary>,
    /// Pass as `cursor` for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
    /// Sessions of this page's id range that could not be read (e.g. a foreign or
    /// newer-schema file), with why; the others are listed. A first page also reports,
    /// last, the entries of the root named like sessions that are none of its (a symlink,
    /// a folder whose name is not UTF-8 or no valid id).
    pub skipped: Vec<SkippedSession>,
    /// Why the catalog was bypassed for this page (computed from the session files), e.g.
    /// a read-only root or a full disk.
    #[serde(serialize_with = "optional_error_text")]
    pub catalog_error: Option<Arc<Error>>,
}

/// One hit of [`SessionQuery::search`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SearchHit {
    /// The session whose file holds the message: a fork's own messages are found under
    /// the fork, inherited ones under the session that wrote them.
    pub session_ref: SessionRef,
    /// That session's title.
    pub title: String,
    /// Transcript position (1-based; 0 for a hit in the title).
    pub position: u64,
    /// The message id ("" for the title).
    pub message_id: String,
    /// The message's role (`title` for the title).
    pub role: Option<String>,
    /// The matching words in context.
    pub snippet: Snippet,
    /// bm25 of the hit (lower is better); hits matching the query's words as one exact
    /// phrase come first whatever their rank.
    pub rank: f64,
    /// When the message was committed (ms since the Unix epoch).
    pub time_ms: i64,
    /// Forks (and rewinds) that inherit this message from `session_ref`.
    pub shared_with: Vec<SessionRef>,
}

/// A page of [`SessionQuery::search`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SearchPage {
    /// Hits, best first.
    pub hits: Vec<SearchHit>,
    /// Pass as [`SearchOptions::with_cursor`] for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
    /// Sessions of this page's hits whose file cannot be read (damaged, foreign or of a
    /// newer schema), with why: their message hits are left out, the others returned.
    #[serde(skip_deserializing)]
    pub skipped: Vec<SkippedSession>,
}

fn optional_error_text<S: serde::Serializer>(
    error: &Option<Arc<Error>>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match error {
        Some(e) => s.collect_str(e),
        None => s.serialize_none(),
    }
}

/// A message of a history page.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct PersistentMessage {
    /// The message id.
    pub message_id: String,
    /// One-based position in the transcript.
    pub position: u64,
    /// Sequence of the event that put the message at its position (places it in its
    /// turn: see [`SessionReader::turns_overlapping`]).
    pub event_sequence: u64,
    /// The message's role.
    pub role: Option<String>,
    /// The message, when its JSON is at most 64 KiB.
    pub inline: Option<Arc<Message>>,
    /// Where to read a larger message (the payload of the event that recorded it).
    pub content_ref: Option<ContentRef>,
}

/// A page of history.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct HistoryPage {
    /// Messages in ascending position.
    pub messages: Vec<PersistentMessage>,
    /// Whether older messages exist.
    pub has_more: bool,
    /// Cursor for the next (older) page, pinned to `snapshot_sequence`.
    pub next_cursor: Option<String>,
    /// The durable sequence the pages are pinned to.
    pub snapshot_sequence: u64,
}

/// A page of commits.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct EventPage {
    /// Whole commits in order.
    pub commits: Vec<Arc<Commit>>,
    /// The last returned commit's last sequence (the next cursor).
    pub next: u64,
    /// Whether more commits exist beyond the page.
    pub truncated: bool,
}

/// What `observe` sees.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct ObserveResult {
    /// The attached runtime's state, if one is attached.
    pub runtime: Option<RuntimeSnapshot>,
    /// Accepted commits (live) or durable commits (cold).
    pub events: EventPage,
}

/// Reads for hosts, over live runtimes and cold files alike.
#[derive(Clone, Debug)]
pub struct SessionQuery {
    service: Service,
}

/// A history page's cursor: `h2.<snapshot>.<oldest position>.<session tag>`, the tag the
/// first 16 hex digits of SHA-256 over the session's id and creation time, so that a
/// cursor continues only the session that made it: another session's, or one of a session
/// deleted and made again under the same id, is refused (both were followed, paging the
/// wrong transcript: outside testing, session 36).
fn history_cursor(header: &Header, snapshot: u64, before: u64) -> String {
    format!("h2.{snapshot}.{before}.{}", session_tag(header))
}

/// The tag of [`history_cursor`].
fn session_tag(header: &Header) -> String {
    let id = format!("{}\0{}", header.session_id, header.created_at_ms);
    sha256_hex(id.as_bytes())[..16].to_owned()
}

/// A history cursor's snapshot, position and session tag: an `h2.` cursor, or an earlier
/// build's `h1.<snapshot>.<position>`, which names no session (still followed).
fn parse_history_cursor(cursor: &str) -> Result<(u64, u64, Option<&str>)> {
    let bad = || {
        Error::invalid(format!(
            "invalid history cursor {}",
            crate::error::quoted(cursor)
        ))
    };
    let (rest, tagged) = match (cursor.strip_prefix("h2."), cursor.strip_prefix("h1.")) {
        (Some(rest), _) => (rest, true),
        (None, Some(rest)) => (rest, false),
        (None, None) => return Err(bad()),
    };
    let mut parts = rest.split('.');
    let snapshot = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let before = parts
        .next()
        .and_then(|p| p.parse().ok())
        .filter(|b| *b > 0)
        .ok_or_else(bad)?;
    let tag = if tagged {
        let tag = parts
            .next()
            .filter(|t| t.len() == 16 && t.bytes().all(|b| b.is_ascii_hexdigit()));
        Some(tag.ok_or_else(bad)?)
    } else {
        None
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok((snapshot, before, tag))
}

impl SessionQuery {
    pub(crate) fn new(service: Service) -> SessionQuery {
        SessionQuery { service }
    }

    fn check(&self, r: &SessionRef) -> Result<()> {
        if r.host_id != self.service.host_id() {
            return Err(Error::invalid(format!(
                "session ref host {} is not this service's",
                crate::error::quoted(&r.host_id)
            )));
        }
        Ok(())
    }

    fn cold_reader(&self, id: &SessionId) -> Result<SessionReader> {
        self.service.root().open_reader(id)
    }

    /// Sessions with ids after `cursor`, in id order, at most `limit` (0 = 50, max 100).
    /// Live sessions report their accepted state (also one a close of this service is
    /// draining); cold ones come from the catalog.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a limit over 100; I/O errors reading the root.
    pub async fn list(&self, cursor: Option<&str>, limit: usize) -> Result<SessionPage> {
        self.list_with(&ListFilter::default(), cursor, limit).await
    }

    /// As [`SessionQuery::list`], keeping only the sessions that pass `filter` (working
    /// directory, updated since, title text, origin), in its order (id, most recently
    /// updated or created first); still one keyset query on the catalog per page
    /// ([`Root::list_filtered`](crate::Root::list_filtered), whose arguments come in the
    /// same order). `cursor` is a previous page's `next_cursor` under the same filter.
    ///
    /// # Errors
    /// As [`SessionQuery::list`]; [`Error::InvalidInput`] for a cursor of another order.
    pub async fn list_with(
        &self,
        filter: &ListFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<SessionPage> {
        let limit = if limit == 0 { 50 } else { limit };
        if limit > MAX_LIST_LIMIT {
            return Err(Error::invalid(format!(
                "list limit must be 1..={MAX_LIST_LIMIT} (0 for 50), not {limit}"
            )));
        }
        let service = self.service.clone();
        let cursor = cursor.map(str::to_owned);
        let filter = filter.clone();
        blocking(move || {
            let live = service.live_runtimes();
            let mut listing =
                service
                    .root()
                    .list_filtered(&filter, cursor.as_deref(), limit + 1)?;
            let catalog_error = listing.catalog_error.clone();
            let mut entries = std::mem::take(&mut listing.entries);
            let more = entries.len() > limit;
            entries.truncate(limit);
            // In id order a session skipped after this page's last one is reported with the
            // next page (in time order they all come with the first page). What is no
            // session of the root comes with the first page whatever its name: no later
            // page reports it.
            let (mut skipped, not_sessions) = listing.split_skipped();
            if more
                && filter.sort == ListSort::Id
                && let Some(last) = entries.last()
            {
                skipped.retain(|s| s.session_id < last.session_id);
            }
            skipped.extend(not_sessions);
            let next_cursor = more
                .then(|| entries.last().map(|e| filter.cursor_after(e)))
                .flatten();
            let sessions: Vec<SessionSummary> = entries
                .into_iter()
                .map(|entry| match live.get(&entry.session_id) {
                    Some(rt) => live_summary(rt, entry),
                    None => {
                        let durable = entry.durable_sequence;
                        let held = service.root().writer_held(&entry.session_id);
                        SessionSummary::from_entry(service.host_id(), entry, durable, held)
                    }
                })
                .collect();
            Ok(SessionPage {
                sessions,
                next_cursor,
                skipped,
                catalog_error,
            })
        })
        .await
    }

    /// Full-text search over every session of the root: user and assistant text, tool
    /// outputs (also those stored as content blobs) and titles, best first, one page.
    ///
    /// Query syntax: words (all must match, any order), `"an exact phrase"`, `prefix*`,
    /// `a OR b`, `a NOT b`, `AND` (implicit) and parentheses; case and diacritics are
    /// ignored. A query of plain words ranks rows holding them as one exact phrase first,
    /// then by bm25. Sees the durable prefix of each session (a live session's accepted
    /// but not yet drained commits are not indexed yet). Deleted sessions are never
    /// returned. The index (`<root>/.catalog/search.sqlite`) is derived: created and
    /// filled on the first search of a root, kept current by writers after each drain,
    /// rebuilt by [`SessionQuery::rebuild_catalog`].
    ///
    /// # Errors
    /// [`Error::InvalidInput`] with the reason for a malformed query (an unclosed quote
    /// or parenthesis, an operator without its terms, a NUL, over 1,024 bytes or 64 terms,
    /// parentheses nested over 16 deep), a bad cursor, a blank role or a limit over 100; I/O
    /// and SQLite errors of the index.
    pub async fn search(&self, query: &str, options: SearchOptions) -> Result<SearchPage> {
        let service = self.service.clone();
        let query = query.to_owned();
        blocking(move || {
            let page = service.root().search(&query, &options)?;
            let hits = page
                .found
                .into_iter()
                .map(|f| SearchHit {
                    session_ref: service.session_ref(f.hit.session_id),
                    title: f.hit.title,
                    position: f.hit.position,
                    message_id: f.message_id,
                    role: f.hit.role,
                    snippet: f.snippet,
                    rank: f.hit.rank,
                    time_ms: f.hit.time_ms,
                    shared_with: f
                        .shared_with
                        .into_iter()
                        .map(|id| service.session_ref(id))
                        .collect(),
                })
                .collect();
            Ok(SearchPage {
                hits,
                next_cursor: page.next,
                skipped: page.skipped,
            })
        })
        .await
    }

    /// The UI transcript (accepted for a live session, durable for a cold one). A close or
    /// open of the session under way in this service is waited for, so what it accepted
    /// is never left out.
    ///
    /// # Errors
    /// [`Error::SessionNotFound`]; read errors.
    pub async fn history(&self, r: &SessionRef) -> Result<Vec<Arc<Message>>> {
        self.check(r)?;
        let query = self.clone();
        let id = r.session_id.clone();
        let live = self.service.settled_runtime(&r.session_id).await;
        blocking(move || match live {
            Some(rt) => rt.session().transcript(),
            None => {
                let reader = query.cold_reader(&id)?;
                reader.transcript(reader.durable_sequence()?)
            }
        })
        .await
    }

    /// The session's snapshot: live (accepted) when attached, else folded from the
    /// durable prefix (status `ready`); a close or open under way is waited for, as in
    /// [`SessionQuery::history`].
    ///
    /// # Errors
    /// [`Error::SessionNotFound`] (also after delete); read errors.
    pub async fn snapshot(&self, r: &SessionRef) -> Result<SessionSnapshot> {
        self.check(r)?;
        if let Some(rt) = self.service.settled_runtime(&r.session_id).await {
            return Ok(rt.session().snapshot());
        }
        let query = self.clone();
        let id = r.session_id.clone();
        blocking(move || {
            let reader = query.cold_reader(&id)?;
            // The projection at the sequence read first: a writer may commit meanwhile.
            let durable = reader.durable_sequence()?;
            let projection = reader.projection_at(durable)?;
            Ok(SessionSnapshot {
                event_sequence: durable,
                durable_sequence: durable,
                persistence_status: PersistenceStatus::Ready,
                persistence_error: None,
                projection,
            })
        })
        .await
    }

    /// A page of durable history, newest page first, ascending inside a page; the cursor
    /// pins later pages to the first page's durable sequence. Messages over 64 KiB come
    /// as a [`ContentRef`] (read it with [`SessionQuery::read_content`]). Served from the history
    /// index written with the events: the work is proportional to the page, not the
    /// session.
    ///
    /// `limit` is the page's number of messages, 1 to [`MAX_HISTORY_LIMIT`] (0 for 100).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad cursor or a limit over [`MAX_HISTORY_LIMIT`];
    /// [`Error::SessionNotFound`]; read errors.
    pub async fn history_page(
        &self,
        r: &SessionRef,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<HistoryPage> {
        let pinned = cursor.map(parse_history_cursor).transpose()?;
        let tag = pinned.and_then(|(_, _, tag)| tag).map(str::to_owned);
        self.history_page_from(r, pinned.map(|(s, b, _)| (Some(s), b)), tag, limit)
            .await
    }

    /// The page of durable history whose newest message is the one at `position`
    /// (1-based; past the end: the newest page), for a link to a message: its `next_cursor`
    /// continues with older pages as [`SessionQuery::history_page`]'s does.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for position 0; as [`SessionQuery::history_page`].
    pub async fn history_page_ending_at(
        &self,
        r: &SessionRef,
        position: u64,
        limit: usize,
    ) -> Result<HistoryPage> {
        if position == 0 {
            return Err(Error::invalid("history positions start at 1"));
        }
        self.history_page_from(r, Some((None, position.saturating_add(1))), None, limit)
            .await
    }

    /// A page of the messages before position `start.1` as of snapshot `start.0` (the
    /// durable sequence when `None`); the newest page without `start`. `tag`: the session
    /// tag of the cursor that asked for it, which must be this session's.
    async fn history_page_from(
        &self,
        r: &SessionRef,
        start: Option<(Option<u64>, u64)>,
        tag: Option<String>,
        limit: usize,
    ) -> Result<HistoryPage> {
        self.check(r)?;
        let limit = if limit == 0 {
            DEFAULT_HISTORY_LIMIT
        } else {
            limit
        };
        if limit > MAX_HISTORY_LIMIT {
            // It was cut to 500 silently, while `list` and `observe` refuse theirs.
            return Err(Error::invalid(format!(
                "history limit must be 1..={MAX_HISTORY_LIMIT} messages (0 for \
                 {DEFAULT_HISTORY_LIMIT})"
            )));
        }
        let query = self.clone();
        let id = r.session_id.clone();
        blocking(move || {
            let reader = query.cold_reader(&id)?;
            if tag.is_some_and(|tag| tag != session_tag(reader.header())) {
                return Err(Error::invalid(format!(
                    "history cursor of another session: it continues no history of {} \
                     (a cursor continues the session that made it; a session deleted and \
                     made again under its id is another): ask for the first page again",
                    crate::error::quoted(id.as_str())
                )));
            }
            let durable = reader.durable_sequence()?;
            let (snapshot, before) = match start {
                Some((Some(s), _)) if s > durable => {
                    return Err(Error::invalid("history cursor is newer than the session"));
                }
                Some((s, b)) => (s.unwrap_or(durable), Some(b)),
                None => (durable, None),
            };
            let rows = reader.history_rows(snapshot, before.unwrap_or(u64::MAX), limit)?;
            let oldest = rows.last().map_or(1, |(row, _)| row.position);
            let messages = rows
                .into_iter()
                .rev()
                .map(|(row, body)| {
                    let (inline, content_ref) = match body {
                        HistoryBody::Inline(m) => (Some(m), None),
                        HistoryBody::Content(c) => (None, Some(c)),
                    };
                    PersistentMessage {
                        message_id: row.message_id,
                        position: row.position,
                        event_sequence: row.event_seq,
                        role: row.role,
                        inline,
                        content_ref,
                    }
                })
                .collect();
            let has_more = oldest > 1;
            Ok(HistoryPage {
                messages,
                has_more,
                next_cursor: has_more.then(|| history_cursor(reader.header(), snapshot, oldest)),
                snapshot_sequence: snapshot,
            })
        })
        .await
    }

    /// Commits after `cursor`, at most `limit` (0 = 100, max 1000, as the other pages: 0
    /// is the default page): accepted ones with the runtime's state when a runtime is
    /// attached, durable ones otherwise; a close or open under way is waited for, as in
    /// [`SessionQuery::history`]. `cursor` is a sequence of the session: the last one
    /// there is to observe (the accepted one live, the durable one cold) answers an empty
    /// page whose `next` is that sequence.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a limit over 1000, or a cursor past the session's last
    /// sequence (as a history cursor newer than the session: one of another session, or
    /// of commits accepted live and lost before they were durable, whose sequences the
    /// session's next commits take again); [`Error::SessionNotFound`]; read errors.
    pub async fn observe(
        &self,
        r: &SessionRef,
        cursor: u64,
        limit: usize,
    ) -> Result<ObserveResult> {
        self.check(r)?;
        let limit = if limit == 0 {
            DEFAULT_OBSERVE_LIMIT
        } else {
            limit
        };
        if limit > MAX_OBSERVE_LIMIT {
            return Err(Error::invalid(format!(
                "a page of events holds 1..={MAX_OBSERVE_LIMIT} commits (a limit of 0 is \
                 {DEFAULT_OBSERVE_LIMIT}), not {limit}"
            )));
        }
        let live = self.service.settled_runtime(&r.session_id).await;
        let query = self.clone();
        let id = r.session_id.clone();
        blocking(move || {
            // `end`: the last sequence there is to observe (a page may stop short of it).
            let (runtime, end, mut commits) = match &live {
                Some(rt) => {
                    let snapshot = rt.snapshot();
                    let end = snapshot.session.event_sequence;
                    let commits = rt.session().accepted_commits(cursor, limit + 1)?;
                    (Some(snapshot), end, commits)
                }
                None => {
                    let reader = query.cold_reader(&id)?;
                    let end = reader.durable_sequence()?;
                    let commits = reader
                        .commits(cursor, limit + 1)?
                        .into_iter()
                        .map(Arc::new)
                        .collect();
                    (None, end, commits)
                }
            };
            // Answered with an empty page, it came back as `next`: an observer went on
            // after a sequence the session has not reached and skipped its next commits.
            if cursor > end {
                return Err(Error::invalid(format!(
                    "no events after sequence {cursor}: it is past the last sequence {end} \
                     of session {id}"
                )));
            }
            let mut truncated = commits.len() > limit;
            commits.truncate(limit);
            let next = commits.last().map_or(cursor, |c| c.last_seq());
            truncated |= next < end;
            Ok(ObserveResult {
                runtime,
                events: EventPage {
                    commits,
                    next,
                    truncated,
                },
            })
        })
        .await
    }

    /// The bytes behind a content ref of this session (or its ancestors).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the ref's digest is not one
    /// ([`ContentRef::is_digest`]: "… is not a content digest", nothing read), or is not
    /// one of this session's ("… does not belong to session …").
    pub async fn read_content(&self, r: &SessionRef, content: &ContentRef) -> Result<Vec<u8>> {
        self.check(r)?;
        if !ContentRef::is_digest(&content.digest) {
            return Err(Error::invalid(format!(
                "content {} is not a content digest: a digest is 64 lowercase hex characters",
                crate::error::quoted(&content.digest)
            )));
        }
        let query = self.clone();
        let id = r.session_id.clone();
        let digest = content.digest.clone();
        blocking(move || {
            query.cold_reader(&id)?.blob(&digest)?.ok_or_else(|| {
                Error::invalid(format!(
                    "content {} does not belong to session {id}",
                    crate::error::quoted(&digest)
                ))
            })
        })
        .await
    }

    /// Rebuilds the catalog from the session files (replacing whatever is there); reports
    /// the count and the sessions that could not be read.
    ///
    /// # Errors
    /// When the root cannot be read or the catalog cannot be written.
    pub async fn rebuild_catalog(&self) -> Result<RebuildReport> {
        let root = self.service.root().clone();
        blocking(move || root.rebuild_catalog()).await
    }
}

/// A live session's summary: its accepted state, not the catalog's durable one.
fn live_summary(rt: &crate::service::Runtime, entry: CatalogEntry) -> SessionSummary {
    let session = rt.session();
    let (accepted, durable) = session.sequences();
    let (title, turns, preview, usage) = session.with_projection(|p| {
        (
            p.title.clone(),
            p.ended_turns,
            p.preview.clone(),
            p.usage.clone(),
        )
    });
    let mut summary = SessionSummary::from_entry(&rt.session_ref().host_id, entry, accepted, true);
    summary.durable_sequence = durable;
    summary.title = title;
    summary.turns = turns;
    summary.preview = preview;
    summary.usage = usage;
    summary
}
