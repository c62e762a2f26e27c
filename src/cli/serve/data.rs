//! What the pages and the JSON API show, read through the public library API only
//! (`Root`, `SessionQuery`, `SessionReader`): never a writer lock, only durable prefixes.
//! Each loader validates its inputs (session ids, digests, origins, limits) before any
//! file is touched.

use std::future::Future;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use session_store::{
    CatalogEntry, CatalogTotals, ContentRef, HistoryPage, ListFilter, ListSort, Origin, Root,
    SearchOptions, SearchPage, SessionId, SessionInfo, SessionRef, SessionStats, SessionSummary,
    SkippedSession, TurnBoundary, WriterOwner,
};

use super::App;
use super::problem::Problem;
use crate::cli::sessions::file_bytes;
use crate::cli::{count, shown};
use tokio::sync::OwnedSemaphorePermit;

/// Sessions or messages per page unless `limit` says otherwise.
pub const PAGE: usize = 50;
/// The largest `limit`.
pub const MAX_PAGE: usize = 100;
/// Newer messages shown after the one a link (`?at=N`) names.
const AT_CONTEXT: u64 = 5;
/// How old the catalog may get before a sessions page starts a refresh.
pub const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// How long a sessions page waits for the refresh it starts before it serves the catalog
/// as it is.
const REFRESH_WAIT: Duration = Duration::from_millis(250);
/// How long a search waits for a refresh it started: its catch-up of sessions whose writer
/// died, or could not write the index (another process held it), names those it cannot
/// catch up as skipped. A search that went ahead after [`REFRESH_WAIT`] answered "no
/// matches" without a word for what such a writer had added (outside testing W7).
const SEARCH_REFRESH_WAIT: Duration = Duration::from_secs(2);

/// The query parameters every route understands (each optional; empty means absent).
#[derive(Debug, Default, Deserialize)]
pub struct Params {
    /// Full-text search query.
    pub q: Option<String>,
    /// A previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Only sessions of this working directory.
    pub cwd: Option<String>,
    /// Only sessions of this origin.
    pub origin: Option<String>,
    /// Page size (1..=100).
    pub limit: Option<String>,
    /// A transcript position: the page that holds it (with a few newer messages).
    pub at: Option<String>,
    /// A transcript position: the page of the messages right after it.
    pub after: Option<String>,
    /// Search: only messages with this role (`title` for titles).
    pub role: Option<String>,
    /// Search: only messages since this time (`7d`, `2026-12-01`, as `search --since`).
    pub since: Option<String>,
    /// Search: only this session (with what it inherits).
    pub session: Option<String>,
}

/// `value` unless it is absent or blank.
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.trim().is_empty())
}

/// `value` unless it is absent or empty (a form's field left empty comes as `name=`): a
/// blank one is given, for its check to refuse as the CLI refuses it.
fn given_as_is(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

impl Params {
    /// The search query, if one is given.
    pub fn query(&self) -> Option<&str> {
        given(&self.q)
    }

    /// The cursor, if one is given.
    pub fn cursor(&self) -> Option<&str> {
        given(&self.cursor)
    }

    /// The working-directory filter as given, if one is.
    pub fn cwd(&self) -> Option<&str> {
        given_as_is(&self.cwd)
    }

    /// The working-directory filter, checked: an absolute folder, spelled as sessions
    /// record it (`/srv//api/` is `/srv/api`, as `--cwd` takes it). A relative or blank
    /// one is refused: the server cannot tell what it is relative to (`cwd=srv/api`
    /// answered an empty page, and a blank one was no filter).
    fn cwd_filter(&self) -> Result<Option<String>, Problem> {
        let Some(cwd) = self.cwd() else {
            return Ok(None);
        };
        if !std::path::Path::new(cwd).is_absolute() {
            return Err(Problem::bad_request(format!(
                "cwd {cwd:?} is not an absolute folder (a session records the absolute \
                 working directory it was made in)"
            )));
        }
        Ok(Some(session_store::absolute_cwd(cwd)?))
    }

    /// The search's role filter, if one is given (a blank one too: search refuses it).
    pub fn role(&self) -> Option<&str> {
        given_as_is(&self.role)
    }

    /// The search's time filter as given, if one is (kept by the links to the next pages).
    pub fn since_text(&self) -> Option<&str> {
        given_as_is(&self.since)
    }

    /// The search's session filter as given, if one is.
    pub fn session_text(&self) -> Option<&str> {
        given(&self.session)
    }

    /// The origin filter's text, if one is given.
    pub fn origin_text(&self) -> Option<&str> {
        given(&self.origin)
    }

    /// The origin filter, parsed.
    fn origin(&self) -> Result<Option<Origin>, Problem> {
        self.origin_text()
            .map(|o| {
                Origin::parse(o).ok_or_else(|| {
                    Problem::bad_request(format!(
                        "unknown origin {o:?} (new, fork, rewind, canonical-import, legacy-import)"
                    ))
                })
            })
            .transpose()
    }

    /// The page size as given, if one is (kept by the links to the next pages).
    pub fn limit_text(&self) -> Option<&str> {
        given(&self.limit)
    }

    /// The transcript position asked for, if any (a number from 1).
    fn at(&self) -> Result<Option<u64>, Problem> {
        given(&self.at)
            .map(|text| {
                text.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|p| *p >= 1)
                    .ok_or_else(|| {
                        Problem::bad_request(format!("at {text:?} is not a position from 1"))
                    })
            })
            .transpose()
    }

    /// The position the page of newer messages follows, if any (a number from 0).
    fn after(&self) -> Result<Option<u64>, Problem> {
        given(&self.after)
            .map(|text| {
                text.trim().parse::<u64>().map_err(|_| {
                    Problem::bad_request(format!("after {text:?} is not a position from 0"))
                })
            })
            .transpose()
    }

    /// The page size: [`PAGE`] unless `limit` gives one in `1..=MAX_PAGE`.
    fn limit(&self) -> Result<usize, Problem> {
        match self.limit_text() {
            None => Ok(PAGE),
            // An out-of-range number is not called "not a number" (outside testing D5).
            Some(text) => match text.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
                Ok(n) => Err(Problem::bad_request(format!(
                    "limit {n} is not in 1..={MAX_PAGE}"
                ))),
                Err(_) => Err(Problem::bad_request(format!(
                    "limit {text:?} is not a number in 1..={MAX_PAGE}"
                ))),
            },
        }
    }
}

/// A session id from a URL (status 400 when it is not a valid id).
pub fn session_id(text: &str) -> Result<SessionId, Problem> {
    SessionId::new(text).map_err(|e| Problem::bad_request(crate::cli::one_line(&e)))
}

/// A content digest from a URL: 64 lowercase hex characters (else status 400).
pub fn digest(text: &str) -> Result<String, Problem> {
    if ContentRef::is_digest(text) {
        Ok(text.to_owned())
    } else {
        Err(Problem::bad_request(
            "a content digest is 64 lowercase hex characters",
        ))
    }
}

/// Runs blocking library work off the async workers.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> session_store::Result<T> + Send + 'static,
) -> Result<T, Problem> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => Ok(result?),
        Err(e) => Err(Problem::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("a storage task did not finish: {e}"),
        )),
    }
}

/// Reads of one session [`of_session`] makes at most while each fails on what looks like
/// the same file.
const READ_ATTEMPTS: usize = 5;

/// Runs `read`, a read of session `id`. A failure of the server's own (status 500) while
/// the session's file went away or was replaced (the session was deleted, or deleted and
/// imported again, while it was read), or when there was none as the read began, is 404
/// "not found (deleted while it was read)", never SQLite's text for the files that went
/// away ("disk I/O error"). A failure on what looks like the same file is read again (at
/// most [`READ_ATTEMPTS`] reads): where the file system keeps no creation time, a file
/// deleted and made again can look like the old one.
pub async fn of_session<T, F, Fut>(app: &App, id: &SessionId, read: F) -> Result<T, Problem>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, Problem>>,
{
    let mut attempt = 1;
    loop {
        let before = app.root.session_file_identity(id);
        match read().await {
            Err(problem) if problem.status.is_server_error() => {
                let now = app.root.session_file_identity(id);
                if before.is_none() || now.is_none() || now != before {
                    return Err(Problem::not_found(format!(
                        "session {id} not found (deleted while it was read)"
                    )));
                }
                if attempt == READ_ATTEMPTS {
                    return Err(problem.of_damaged_session(id));
                }
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The writer holding a session now, if any (a session that vanished has none).
pub fn current_writer(root: &Root, id: &SessionId) -> Option<WriterOwner> {
    root.writer_owner(id).ok().flatten()
}

/// One row of the sessions page.
#[derive(Debug, Serialize)]
pub struct SessionRow {
    /// What `list` reports.
    #[serde(flatten)]
    pub summary: SessionSummary,
    /// Bytes of the session's own file and WAL.
    pub file_bytes: u64,
    /// The writer appending to it now (a "live" session), if any.
    pub writer: Option<WriterOwner>,
}

/// A page of the sessions list, newest first.
#[derive(Debug, Serialize)]
pub struct SessionList {
    /// The sessions.
    pub sessions: Vec<SessionRow>,
    /// The next page's cursor.
    pub next_cursor: Option<String>,
    /// Sessions that could not be read, with why.
    pub skipped: Vec<SkippedSession>,
    /// Why the catalog was not used for this page (it was listed from the session files),
    /// as `list --json` and Python's `Root.list` say it (outside testing D6).
    pub catalog_error: Option<String>,
}

/// Whether a sessions page refreshes the catalog first.
enum Refresh {
    /// The first page of this server: refresh, and wait for it.
    Now,
    /// The last refresh is [`REFRESH_EVERY`] old: start one, wait [`REFRESH_WAIT`] at most.
    Behind,
    /// Refreshed recently: serve the catalog as it is.
    Recent,
}

/// What this page does about the catalog's freshness (a full refresh stats every session:
/// 50-120 ms for 10,000 on a busy 2-core machine).
fn refresh_plan(app: &App) -> Refresh {
    let mut last = app
        .catalog_refreshed
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    match *last {
        None => Refresh::Now,
        Some(at) if at.elapsed() >= REFRESH_EVERY => {
            *last = Some(Instant::now());
            Refresh::Behind
        }
        Some(_) => Refresh::Recent,
    }
}

/// Keeps the catalog and the search index fresh for a page that reads them as they are: the
/// server's first such page refreshes them and waits (a page of the catalog as it is then
/// names the sessions that refresh could not read), later ones start a refresh at most
/// every [`REFRESH_EVERY`] and wait [`REFRESH_WAIT`] for it: a change shows on the next
/// page after an idle spell, or within seconds on a busy server or a large root. A refresh also catches the
/// search index up with sessions whose writer died since its last index write
/// ([`Root::catch_up_dead_writers`]; only a process's first search did, so a writer killed
/// later was found only by a search that met its session otherwise).
async fn refresh_catalog(app: &App) -> Result<(), Problem> {
    refresh_catalog_within(app, REFRESH_WAIT).await
}

/// [`refresh_catalog`], a refresh started now waited for `wait` at most.
async fn refresh_catalog_within(app: &App, wait: Duration) -> Result<(), Problem> {
    // A refreshing page of one; its result is the catalog it leaves behind.
    let newest_first = ListFilter::default().with_sort(ListSort::Updated);
    match refresh_plan(app) {
        Refresh::Now => {
            app.query.list_with(&newest_first, None, 1).await?;
            let root = app.root.clone();
            blocking(move || Ok(root.catch_up_dead_writers())).await?;
            *app.catalog_refreshed
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        }
        Refresh::Behind => {
            let (query, root) = (app.query.clone(), app.root.clone());
            let refresh = tokio::spawn(async move {
                let listed = query.list_with(&newest_first, None, 1).await;
                let _ = blocking(move || Ok(root.catch_up_dead_writers())).await;
                listed
            });
            // Waited for a moment: served at once, the first page after an idle spell
            // showed the catalog of the spell's start, without the sessions made since
            // (outside testing D1, session 42). A refresh that takes longer (a large root
            // on a busy machine) goes on in the background, as before.
            let _ = tokio::time::timeout(wait, refresh).await;
        }
        Refresh::Recent => {}
    }
    Ok(())
}

/// A page of sessions, most recently updated first, filtered by `cwd` and `origin`, from
/// the catalog kept fresh by [`refresh_catalog`]: a page is one keyset query.
pub async fn sessions(app: &App, params: &Params) -> Result<SessionList, Problem> {
    let mut filter = ListFilter::default()
        .with_sort(ListSort::Updated)
        .cached_only();
    if let Some(cwd) = params.cwd_filter()? {
        filter = filter.with_cwd(cwd);
    }
    if let Some(origin) = params.origin()? {
        filter = filter.with_origin(origin);
    }
    let limit = params.limit()?;
    refresh_catalog(app).await?;
    // A first page names the sessions the last refresh could not read (once: the
    // refreshing page's list was added to it before, so the server's first page named
    // each twice) and what is no session of the root.
    let page = app.query.list_with(&filter, params.cursor(), limit).await?;
    let skipped = page.skipped;
    let catalog_error = page.catalog_error.map(|e| crate::cli::one_line(e.as_ref()));
    let root = app.root.clone();
    let summaries = page.sessions;
    let sessions = blocking(move || {
        Ok(summaries
            .into_iter()
            .map(|summary| {
                let id = &summary.session_ref.session_id;
                SessionRow {
                    file_bytes: file_bytes(&root, id),
                    // Only a session the listing found held has a writer to name: the
                    // badge and `live` say the same.
                    writer: summary.live.then(|| current_writer(&root, id)).flatten(),
                    summary,
                }
            })
            .collect())
    })
    .await?;
    Ok(SessionList {
        sessions,
        next_cursor: page.next_cursor,
        skipped,
        catalog_error,
    })
}

/// A page of full-text search hits for `q`, best first.
pub async fn search(app: &App, params: &Params) -> Result<SearchPage, Problem> {
    let q = params
        .query()
        .ok_or_else(|| Problem::bad_request("q (the search query) is required"))?;
    if params.origin_text().is_some() {
        return Err(Problem::bad_request(
            "origin filters the sessions list, not search (search takes cwd, role, since and \
             session)",
        ));
    }
    let mut options = SearchOptions::default().with_limit(params.limit()?);
    if let Some(cursor) = params.cursor() {
        options = options.with_cursor(cursor);
    }
    if let Some(cwd) = params.cwd_filter()? {
        options = options.with_cwd(cwd);
    }
    if let Some(role) = params.role() {
        options = options.with_role(role);
    }
    if let Some(since) = params.since_text() {
        let ms = crate::cli::when::parse_since(since)
            .map_err(|e| Problem::bad_request(format!("since: {e}")))?;
        options = options.with_since(ms);
    }
    if let Some(session) = params.session_text() {
        options = options.with_session(session_id(session)?);
    }
    // A search-only client keeps the index caught up too (a writer killed since).
    refresh_catalog_within(app, SEARCH_REFRESH_WAIT).await?;
    Ok(app.query.search(q, options).await?)
}

/// A session's header and state.
#[derive(Debug, Serialize)]
pub struct SessionDetail {
    /// Header, durable sequence, lineage, last writer.
    pub info: SessionInfo,
    /// Title, turns, preview, usage (from the catalog).
    pub entry: CatalogEntry,
    /// The writer appending to it now, if any: the page shows its durable prefix.
    pub writer: Option<WriterOwner>,
    /// Bytes of its own file and WAL.
    pub file_bytes: u64,
    /// Whether the session its header names as parent is in the root as that parent
    /// (`Root::parent_in_root`: a deleted parent, or another session made under its id
    /// since, is named, not linked); `false` when it has none.
    pub parent_exists: bool,
}

/// The header and state of session `id`.
pub async fn session(app: &App, id: SessionId) -> Result<SessionDetail, Problem> {
    of_session(app, &id, || {
        let (root, id) = (app.root.clone(), id.clone());
        blocking(move || {
            let mut info = root.stat(&id)?;
            let entry = root.catalog_entry(&id)?;
            // The page's durable sequence is the one its title, turns and usage are of: a
            // writer may have committed between the two reads.
            info.durable_sequence = entry.durable_sequence;
            let parent_exists = root.parent_in_root(&root.open_reader(&id)?)?;
            Ok(SessionDetail {
                info,
                entry,
                parent_exists,
                writer: current_writer(&root, &id),
                file_bytes: file_bytes(&root, &id),
            })
        })
    })
    .await
}

/// A page of a session's transcript with the turns its messages belong to.
#[derive(Debug, Serialize)]
pub struct Transcript {
    /// The messages (ascending), the cursor of the older page.
    #[serde(flatten)]
    pub page: HistoryPage,
    /// The ended turns that overlap the page, in order.
    pub turns: Vec<TurnBoundary>,
    /// When newer messages follow this page (one asked for by cursor or position), the
    /// position they follow (the link to them is `?after=` it); not in the JSON, whose
    /// clients page by `after` themselves.
    #[serde(skip)]
    pub newer: Option<u64>,
}

/// The newest page of `id`'s transcript, the older page `cursor` names, or the page that
/// holds position `at`.
pub async fn history(app: &App, id: SessionId, params: &Params) -> Result<Transcript, Problem> {
    of_session(app, &id, || history_once(app, id.clone(), params)).await
}

/// One read of [`history`].
async fn history_once(app: &App, id: SessionId, params: &Params) -> Result<Transcript, Problem> {
    let session = SessionRef {
        host_id: app.host.clone(),
        session_id: id.clone(),
    };
    let limit = params.limit()?;
    let page_len = u64::try_from(limit).unwrap_or(u64::MAX);
    // A page by `at` ends a few newer messages after it, as many as it has room for.
    let context = AT_CONTEXT.min(page_len.saturating_sub(1));
    let at = params.at()?;
    let after = params.after()?;
    // Only one of them: `at` was ignored beside a cursor (outside testing D4, session 42).
    let given = [params.cursor().is_some(), at.is_some(), after.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(Problem::bad_request(
            "give one of at (a position), after (a position) or cursor (a page), not more",
        ));
    }
    // The newest position (0 for an empty transcript), read once when needed: a page by
    // `after` is checked against it, and one by cursor or position links the newer page
    // when its last message is below it.
    let mut newest: Option<u64> = None;
    let read_newest = || async {
        Ok::<u64, Problem>(
            app.query
                .history_page(&session, None, 1)
                .await?
                .messages
                .first()
                .map_or(0, |m| m.position),
        )
    };
    let no_message = |what: String, held: u64| {
        Problem::not_found(format!(
            "session {} has no message {what}: its history holds {}",
            shown(&id),
            count(held, "message", "messages")
        ))
    };
    let page = match (params.cursor(), at, after) {
        (None, Some(at), None) => {
            let page = app
                .query
                .history_page_ending_at(&session, at.saturating_add(context), limit)
                .await?;
            // A position past the end was answered with the newest page, whose `#mN` named
            // nothing (outside testing D4, session 42).
            let held = page.messages.last().map_or(0, |m| m.position);
            if held < at {
                return Err(no_message(at.to_string(), held));
            }
            page
        }
        // The messages right after `after`, a page of them at most: the last such page is
        // short, where a page by `at` past the end was the newest page, which showed
        // messages of the page before it again (outside testing D3, session 42).
        (None, None, Some(after)) => {
            let held = read_newest().await?;
            newest = Some(held);
            if after >= held {
                return Err(no_message(format!("after {after}"), held));
            }
            let end = after.saturating_add(page_len).min(held);
            let len = usize::try_from(end - after).unwrap_or(limit);
            app.query.history_page_ending_at(&session, end, len).await?
        }
        (cursor, _, _) => app.query.history_page(&session, cursor, limit).await?,
    };
    // A page by cursor or position may have newer messages after it: the newer page is
    // the one after its last message.
    let newer = match page.messages.last().filter(|_| given.contains(&true)) {
        Some(last) => {
            let newest = match newest {
                Some(newest) => newest,
                None => read_newest().await?,
            };
            (newest > last.position).then_some(last.position)
        }
        None => None,
    };
    let span = page
        .messages
        .first()
        .zip(page.messages.last())
        .map(|(a, b)| (a.event_sequence, b.event_sequence));
    let turns = match span {
        None => Vec::new(),
        Some((first, last)) => {
            let root = app.root.clone();
            blocking(move || root.open_reader(&id)?.turns_overlapping(first, last)).await?
        }
    };
    Ok(Transcript { page, turns, newer })
}

/// Totals over the whole root, from the catalog alone (one scan of its rows, no session
/// file opened), kept fresh as the sessions page keeps it.
pub async fn root_stats(app: &App) -> Result<CatalogTotals, Problem> {
    refresh_catalog(app).await?;
    let root = app.root.clone();
    blocking(move || root.catalog_totals()).await
}

/// Storage statistics of `id`: bytes by kind, blobs and compression, tables.
pub async fn stats(app: &App, id: SessionId) -> Result<SessionStats, Problem> {
    of_session(app, &id, || {
        let (root, id) = (app.root.clone(), id.clone());
        blocking(move || root.stats(&id))
    })
    .await
}

/// The bytes of content `digest` of session `id` (or its ancestors), with the place
/// ([`super::held`]) the answer holds until it is sent; 404 when the session holds no such
/// content, 503 when no place came free in time.
pub async fn content(
    app: &App,
    id: SessionId,
    digest: String,
) -> Result<(Vec<u8>, OwnedSemaphorePermit), Problem> {
    // The place first: the blob is read only when it may be held.
    let place = super::held::take_place(&app.content_places).await?;
    let bytes = of_session(app, &id, || content_once(app, id.clone(), digest.clone())).await?;
    Ok((bytes, place))
}

/// One read of [`content`].
async fn content_once(app: &App, id: SessionId, digest: String) -> Result<Vec<u8>, Problem> {
    let session = SessionRef {
        host_id: app.host.clone(),
        session_id: id,
    };
    let content = ContentRef::new(digest, 0, "");
    app.query
        .read_content(&session, &content)
        .await
        .map_err(|e| {
            // The id and the digest are well formed (checked before): the library's
            // "does not belong" (a caller error) means there is no such content here.
            if e.is_caller_error() {
                Problem::not_found(format!(
                    "no content {} in session {} or its ancestors",
                    content.digest, session.session_id
                ))
            } else {
                Problem::library(&e)
            }
        })
}
