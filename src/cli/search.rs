//! `search QUERY`: full-text search over every session of the root.

use std::borrow::Cow;
use std::io::IsTerminal;

use session_store::{SearchOptions, SearchPage};

use super::sessions::{preview, report_skipped};
use super::{CliResult, Context, block_on, print_json, printable, session_id, shown};

/// Characters of a session's title shown on a hit's line (as `list` shows it).
const TITLE_CHARS: usize = 60;
use session_store::utc;

/// What `search` takes besides the query.
#[derive(Debug)]
pub struct SearchArgs {
    /// Hits per page.
    pub limit: usize,
    /// A previous page's next_cursor.
    pub cursor: Option<String>,
    /// Only this session (with what it inherits).
    pub session: Option<String>,
    /// Only sessions with this working directory.
    pub cwd: Option<String>,
    /// Only messages at or after this time (ms since the Unix epoch; see
    /// [`parse_since`](super::when::parse_since)).
    pub since_ms: Option<i64>,
    /// Only messages with this role.
    pub role: Option<String>,
}

/// `search QUERY [--limit N] [--cursor C] [--session ID] [--cwd DIR] [--since DATE]
/// [--role ROLE]`.
pub fn search(cx: &Context, query: &str, args: SearchArgs) -> CliResult<()> {
    let given = Given {
        session: args.session.is_some(),
        cwd: args.cwd.is_some(),
        since: args.since_ms.is_some(),
        role: args.role.is_some(),
    };
    let mut options = SearchOptions::default().with_limit(args.limit);
    if let Some(c) = args.cursor {
        options = options.with_cursor(c);
    }
    if let Some(s) = args.session {
        options = options.with_session(session_id(&s)?);
    }
    if let Some(c) = args.cwd {
        options = options.with_cwd(c);
    }
    if let Some(ms) = args.since_ms {
        options = options.with_since(ms);
    }
    if let Some(r) = args.role {
        options = options.with_role(r);
    }
    let filters: Vec<&str> = [
        ("--session", given.session),
        ("--cwd", given.cwd),
        ("--since", given.since),
        ("--role", given.role),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect();
    let service = cx.service()?;
    let page = block_on(service.query().search(query, options))??;
    report_skipped(&page.skipped);
    if cx.json {
        return print_json(&page);
    }
    print_page(&page, &filters, std::io::stdout().is_terminal())
}

/// Which filters a search was given (its next page needs them again).
struct Given {
    session: bool,
    cwd: bool,
    since: bool,
    role: bool,
}

/// One block per hit: where it is, then its snippet (matches in bold reverse video on a
/// terminal, plain text otherwise); then the next page's cursor, with the `filters` it
/// needs again (alone it continued an unfiltered search).
fn print_page(page: &SearchPage, filters: &[&str], terminal: bool) -> CliResult<()> {
    if page.hits.is_empty() {
        // As `list` says "no sessions match the filters": a filter that emptied the page
        // is named (a mistyped `--role` or `--cwd` read as a search that found nothing).
        if filters.is_empty() {
            outln!("no matches");
        } else {
            outln!("no matches with {}", filters.join(", "));
        }
        return Ok(());
    }
    let (open, close) = if terminal {
        ("\x1b[1;7m", "\x1b[0m")
    } else {
        ("", "")
    };
    for hit in &page.hits {
        // Clipped as `list` clips it: a title can be any length (it printed whole).
        let title = if hit.title.is_empty() {
            String::new()
        } else {
            format!("  {}", preview(&hit.title, TITLE_CHARS))
        };
        outln!(
            "{} #{} {} {} UTC{title}",
            shown(&hit.session_ref.session_id),
            hit.position,
            printable(hit.role.as_deref().unwrap_or("-")),
            utc(hit.time_ms),
        );
        if !hit.shared_with.is_empty() {
            let forks: Vec<Cow<'_, str>> = hit
                .shared_with
                .iter()
                .map(|r| shown(&r.session_id))
                .collect();
            outln!("  also in: {}", forks.join(", "));
        }
        // Each piece escaped as `history` escapes a message (control characters and
        // bidirectional controls), then the matches marked with the terminal's escapes.
        let mut line = String::new();
        for (piece, matched) in hit.snippet.pieces() {
            let piece = printable(piece);
            if matched {
                line.extend([open, &piece, close]);
            } else {
                line.push_str(&piece);
            }
        }
        outln!("  {line}");
    }
    if let Some(next) = &page.next_cursor {
        let same = if filters.is_empty() {
            String::new()
        } else {
            format!(" and {}", filters.join(", "))
        };
        outln!("next page: --cursor {next} (with the same query{same})");
    }
    Ok(())
}
