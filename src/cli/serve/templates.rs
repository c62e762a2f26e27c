//! The page frame and the sessions, search, error, tree and stats pages, as maud
//! templates compiled into the binary. maud escapes every interpolated string, so text
//! from a session (titles, ids, snippets, working directories) is always text, never
//! markup; URLs are built by [`links`] from validated ids, never taken from a session.

use std::borrow::Cow;

use axum::response::Html;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use session_store::{CatalogTotals, SearchPage, SessionId, SessionRef, SessionStats, Snippet};

use super::data::{Params, SessionList};
use super::problem::Problem;
use super::tree::ForkTree;
use super::{links, svg};
use crate::cli::{count, human_bytes, shown};
use session_store::utc;

/// The origins a session list can be filtered by.
const ORIGINS: [&str; 5] = ["new", "fork", "rewind", "canonical-import", "legacy-import"];

/// Characters of a title or preview shown in a list.
const TITLE_CHARS: usize = 100;
/// The forks a search hit names by name ("also in: …"); the rest are counted.
const ALSO_IN_SHOWN: usize = 10;

/// `text` cut to `max` characters, with an ellipsis when cut.
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// A page: the frame, the navigation and `body`. Control characters from a session
/// (terminal escapes, NUL, C1 controls) and bidirectional controls (a right-to-left
/// override in a title or a message) are shown as the CLI shows them (`\u{1b}`,
/// `\u{202e}`), never sent raw; line breaks and tabs stay.
pub fn layout(title: &str, current: Option<SitePage>, body: Markup) -> Html<String> {
    let here = |page: SitePage| (Some(page) == current).then_some("page");
    let page = html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · session-store" }
                    link rel="stylesheet" href="/assets/style.css";
                    link rel="icon" type="image/svg+xml" href="/assets/icon.svg";
                }
                body {
                    header.top {
                        a.brand href="/" { "session-store" }
                        nav aria-label="Site" {
                            a href="/" aria-current=[here(SitePage::Sessions)] { "Sessions" }
                            " "
                            a href="/stats" aria-current=[here(SitePage::Storage)] { "Storage" }
                        }
                    }
                    main { (body) }
                }
            }
    }
    .into_string();
    Html(match crate::cli::printable_block(&page) {
        Cow::Borrowed(_) => page,
        Cow::Owned(shown) => shown,
    })
}

/// The small page of an error answer.
pub fn error_page(problem: &Problem) -> Html<String> {
    layout(
        problem.title(),
        None,
        html! {
            h1 { (problem.status.as_u16()) " " (problem.title()) }
            p.error { (problem.message) }
            p { a href="/" { "Back to the sessions" } }
        },
    )
}

/// `text` as the value of a form field that sends it back exactly: HTML-escaped, with each
/// character the page's pass for people writes as `\u{…}` (a control character or a
/// bidirectional control, [`crate::cli::escaped_in_blocks`]) given as a numeric character
/// reference instead, which the browser reads back as the character. Escaped for people,
/// the field held `/srv/app\u{202e}1`, and "Go" searched for that text: no hits (outside
/// testing U5).
fn exact_value(text: &str) -> PreEscaped<String> {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if crate::cli::escaped_in_blocks(c) => out.push_str(&format!("&#x{:x};", c as u32)),
            c => out.push(c),
        }
    }
    PreEscaped(out)
}

/// The search box and the filters, keeping what was asked.
fn filters(params: &Params) -> Markup {
    let origin = params.origin_text().unwrap_or("");
    html! {
        form.filters method="get" action="/" {
            input type="search" name="q" placeholder="Search messages, tool outputs, titles"
                value=(exact_value(params.query().unwrap_or(""))) aria-label="Search";
            input type="text" name="cwd" placeholder="Working directory"
                value=(exact_value(params.cwd().unwrap_or(""))) aria-label="Working directory";
            select name="origin" aria-label="Origin" {
                option value="" selected[origin.is_empty()] { "any origin" }
                @for o in ORIGINS {
                    option value=(o) selected[origin == o] { (o) }
                }
            }
            // Search filters given in the URL (no fields of their own) stay with a new query.
            @for (name, value) in [("role", params.role()), ("since", params.since_text()), ("session", params.session_text())] {
                @if let Some(value) = value {
                    input type="hidden" name=(name) value=(exact_value(value));
                }
            }
            button type="submit" { "Go" }
            @if params.query().is_some() || params.cwd().is_some() || !origin.is_empty() {
                " " a href="/" { "clear" }
            }
        }
    }
}

/// The sessions page: a page of the catalog, newest first.
pub fn sessions_page(list: &SessionList, params: &Params) -> Html<String> {
    let next = list.next_cursor.as_deref().map(|cursor| {
        links::with_query(
            "/",
            &[
                ("cwd", params.cwd()),
                ("origin", params.origin_text()),
                ("limit", params.limit_text()),
                ("cursor", Some(cursor)),
            ],
        )
    });
    layout(
        "Sessions",
        Some(SitePage::Sessions),
        html! {
            h1 { "Sessions" }
            (filters(params))
            @if list.sessions.is_empty() {
                p.empty { "No sessions." }
            } @else {
                table.sessions {
                    thead { tr {
                        th { "Title" } th { "Id" } th { "Working directory" } th { "Origin" }
                        th.num { "Turns" } th.num { "Events" } th.num { "Tokens in / out" }
                        th.num { "Size" } th { "Updated (UTC)" }
                    } }
                    tbody {
                        @for row in &list.sessions {
                            @let s = &row.summary;
                            @let id = &s.session_ref.session_id;
                            tr.session {
                                td.title {
                                    a href=(links::session(id)) {
                                        @if s.title.is_empty() {
                                            span.untitled { (clip(s.preview.as_deref().unwrap_or("(untitled)"), TITLE_CHARS)) }
                                        } @else {
                                            (clip(&s.title, TITLE_CHARS))
                                        }
                                    }
                                    @if row.writer.is_some() { " " span.badge.live { "live" } }
                                }
                                td { code { (shown(id)) } }
                                td { (s.cwd.as_deref().unwrap_or("")) }
                                td { (s.origin.as_str()) }
                                td.num { (s.turns) }
                                td.num { (s.durable_sequence) }
                                td.num {
                                    @if s.usage.is_empty() { "—" } @else {
                                        (s.usage.total.input_tokens) " / " (s.usage.total.output_tokens)
                                    }
                                }
                                td.num { (human_bytes(row.file_bytes)) }
                                td { (utc(s.updated_at_ms)) }
                            }
                        }
                    }
                }
            }
            @for skipped in &list.skipped {
                p.warning { "Skipped " code { (shown(&skipped.session_id)) } ": " (crate::cli::one_line(skipped.error.as_ref())) }
            }
            @if let Some(next) = next { p.pager { a href=(next) { "Next page →" } } }
        },
    )
}

/// A snippet with its matched words in `<mark>`.
pub fn snippet(s: &Snippet) -> Markup {
    html! {
        @for (text, hit) in s.pieces() {
            @if hit { mark { (text) } } @else { (text) }
        }
    }
}

/// The search filters given in the URL that have no field of their own (role, since,
/// session), said in words with a link to the same search without them; nothing when none
/// is given.
fn url_filters(params: &Params) -> Markup {
    let given: Vec<(&str, &str)> = [
        ("role", params.role()),
        ("since", params.since_text()),
        ("session", params.session_text()),
    ]
    .into_iter()
    .filter_map(|(name, value)| value.map(|v| (name, v)))
    .collect();
    let without = links::with_query(
        "/",
        &[
            ("q", params.query()),
            ("cwd", params.cwd()),
            ("limit", params.limit_text()),
        ],
    );
    html! {
        @if !given.is_empty() {
            p.meta.url-filters {
                "Only hits with "
                @for (i, (name, value)) in given.iter().enumerate() {
                    @if i > 0 { ", " }
                    (name) " " code { (value) }
                }
                ". " a href=(without) { "Search without these filters" }
            }
        }
    }
}

/// The title of a search page: the query, so that pages of different searches (tabs,
/// history, bookmarks) are told apart.
fn search_title(params: &Params) -> String {
    format!(
        "Search: {}",
        clip(params.query().unwrap_or(""), TITLE_CHARS)
    )
}

/// The search results page.
pub fn search_page(page: &SearchPage, params: &Params) -> Html<String> {
    let next = page.next_cursor.as_deref().map(|cursor| {
        links::with_query(
            "/",
            &[
                ("q", params.query()),
                ("cwd", params.cwd()),
                ("role", params.role()),
                ("since", params.since_text()),
                ("session", params.session_text()),
                ("limit", params.limit_text()),
                ("cursor", Some(cursor)),
            ],
        )
    });
    layout(
        &search_title(params),
        None,
        html! {
            h1 { "Search" }
            (filters(params))
            (url_filters(params))
            @if page.hits.is_empty() {
                p.empty { "No hits." }
            }
            ol.hits {
                @for hit in &page.hits {
                    @let id = &hit.session_ref.session_id;
                    li.hit {
                        // A title (position 0) is no message: its hit opens the session.
                        a href=(if hit.position == 0 { links::session(id) } else { links::message(id, hit.position) }) {
                            @if hit.title.is_empty() { code { (shown(id)) } } @else { (clip(&hit.title, TITLE_CHARS)) }
                        }
                        " " span.role { (hit.role.as_deref().unwrap_or("")) }
                        @if hit.position > 0 { " " span.meta { "#" (hit.position) } }
                        " " span.meta { (utc(hit.time_ms)) " UTC" }
                        (also_in(&hit.shared_with, hit.position, params.session_text()))
                        p.snippet { (snippet(&hit.snippet)) }
                    }
                }
            }
            @if let Some(next) = next { p.pager { a href=(next) { "More hits →" } } }
        },
    )
}

/// The forks that inherit a hit's message, as the CLI's "also in:" names them, each
/// linked to the message in it (the page named none: a hit of `session=FORK` showed only
/// the session that wrote it; outside testing D2, session 42). The first
/// [`ALSO_IN_SHOWN`] are named, then how many more; the session the search is filtered
/// by (`searched`) first, so it is never among those only counted.
fn also_in(forks: &[SessionRef], position: u64, searched: Option<&str>) -> Markup {
    let mut forks: Vec<&SessionRef> = forks.iter().collect();
    // Stable: the others keep their order.
    forks.sort_by_key(|f| Some(f.session_id.as_str()) != searched);
    let more = forks.len().saturating_sub(ALSO_IN_SHOWN);
    html! {
        @if !forks.is_empty() {
            p.meta.also-in {
                "also in: "
                @for (i, fork) in forks.iter().take(ALSO_IN_SHOWN).enumerate() {
                    @if i > 0 { ", " }
                    @let id = &fork.session_id;
                    a href=(if position == 0 { links::session(id) } else { links::message(id, position) }) {
                        code { (shown(id)) }
                    }
                }
                @if more > 0 { " and " (more) " more" }
            }
        }
    }
}

/// The search page of a query that was refused, with the reason.
pub fn search_refused(message: &str, params: &Params) -> Html<String> {
    layout(
        &search_title(params),
        None,
        html! {
            h1 { "Search" }
            (filters(params))
            (url_filters(params))
            p.error { (message) }
        },
    )
}

/// The navigation of a session's pages, `current` marked (none on a page of its own, as a
/// blob's).
pub fn session_nav(id: &SessionId, current: Option<SessionPage>) -> Markup {
    let here = |page: SessionPage| (Some(page) == current).then_some("page");
    html! {
        nav.session-nav aria-label="Session" {
            a href=(links::session(id)) aria-current=[here(SessionPage::Transcript)] { "Transcript" }
            a href=(links::tree(id)) aria-current=[here(SessionPage::Tree)] { "Fork tree" }
            a href=(links::stats(id)) aria-current=[here(SessionPage::Storage)] { "Storage" }
            a href=(links::api_session(id)) { "JSON" }
        }
    }
}

/// Which of the site's pages is shown, if one: its link in the top navigation is marked
/// `aria-current="page"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SitePage {
    /// The sessions list (`/`, without a search).
    Sessions,
    /// The root's storage totals (`/stats`).
    Storage,
}

/// Which of a session's pages is shown: its link in [`session_nav`] is marked
/// `aria-current="page"` (a screen reader said nothing of where one was).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionPage {
    /// The transcript (`/sessions/ID`).
    Transcript,
    /// The fork tree.
    Tree,
    /// The storage statistics.
    Storage,
}

/// A session's title, or its id as the CLI shows it when it has none (a bidirectional
/// control or an invisible character in the id escaped: `rtl\u{202e}evil` looked exactly
/// like the session `rtllive`).
pub fn title_or_id<'a>(title: &'a str, id: &'a SessionId) -> Cow<'a, str> {
    if title.is_empty() {
        shown(id)
    } else {
        Cow::Borrowed(title)
    }
}

/// The fork tree page.
pub fn tree_page(tree: &ForkTree) -> Html<String> {
    layout(
        &format!("Fork tree of {}", shown(&tree.focus)),
        None,
        html! {
            h1 { "Fork tree of " code { (shown(&tree.focus)) } }
            (session_nav(&tree.focus, Some(SessionPage::Tree)))
            p.meta {
                (count(tree.nodes.len() as u64, "session", "sessions")) ": ancestors, siblings and descendants; each edge is labelled with its fork point."
                @if tree.truncated { " Only the first sessions are drawn." }
            }
            div.graph { (svg::fork_tree(tree)) }
        },
    )
}

/// The storage stats page.
pub fn stats_page(stats: &SessionStats) -> Html<String> {
    let id = &stats.session_id;
    let b = &stats.blobs;
    layout(
        &format!("Storage of {}", shown(id)),
        None,
        html! {
            h1 { "Storage of " code { (shown(id)) } }
            (session_nav(id, Some(SessionPage::Storage)))
            p.meta {
                (stats.events) " events through sequence " (stats.durable_sequence) "; file and WAL "
                (human_bytes(stats.file_bytes)) "."
            }
            h2 { "Bytes by event kind" }
            div.chart { (svg::kind_chart(&stats.kinds)) }
            h2 { "Blobs" }
            p {
                (b.count) " distinct blobs (" (b.compressed) " compressed): "
                (human_bytes(b.raw_bytes)) " raw, " (human_bytes(b.stored_bytes)) " stored, ratio "
                (format!("{:.2}", b.compression_ratio)) "."
            }
            div.chart { (svg::bars(&[("raw", b.raw_bytes), ("stored", b.stored_bytes)])) }
            h2 { "Bytes by table" }
            div.chart {
                (svg::bars(&stats.tables.iter().map(|t| (t.table.as_str(), t.bytes)).collect::<Vec<_>>()))
            }
        },
    )
}

/// The storage page of the whole root: totals over the catalog as charts.
pub fn root_stats_page(t: &CatalogTotals) -> Html<String> {
    layout(
        "Storage",
        Some(SitePage::Storage),
        html! {
            h1 { "Storage of the root" }
            p.meta {
                (t.sessions) " sessions, " (t.events) " events, " (t.turns) " ended turns; files and WALs "
                (human_bytes(t.file_bytes.saturating_add(t.wal_bytes))) ". From the catalog: a fork counts its inherited prefix."
            }
            h2 { "Bytes on disk" }
            div.chart { (svg::bars(&[("session files", t.file_bytes), ("WALs", t.wal_bytes)])) }
            h2 { "Sessions, events and turns" }
            div.chart {
                (svg::count_bars(&[("sessions", t.sessions), ("events", t.events), ("ended turns", t.turns)]))
            }
            h2 { "Token usage" }
            p {
                (t.usage_events) " usage events"
                @if let Some(cost) = &t.cost { ", costing " (cost.to_string()) " in all" }
                "."
            }
            div.chart {
                (svg::count_bars(&[
                    ("input", t.input_tokens),
                    ("output", t.output_tokens),
                    ("cache read", t.cache_read_tokens),
                    ("cache write", t.cache_write_tokens),
                ]))
            }
        },
    )
}
