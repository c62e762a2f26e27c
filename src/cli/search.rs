//! `search QUERY`: full-text search over every session of the root.

use std::io::IsTerminal;

use session_store::{SearchOptions, SearchPage};

use super::sessions::utc;
use super::{CliResult, Context, block_on, print_json, printable, session_id};

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
    /// Only messages at or after this time (ms since the Unix epoch; see [`parse_date`]).
    pub since_ms: Option<i64>,
    /// Only messages with this role.
    pub role: Option<String>,
}

/// Days since the Unix epoch of a civil date (Howard Hinnant's days_from_civil).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM` or `YYYY-MM-DDTHH:MM:SS` (UTC; a space for the `T`
/// and a trailing `Z` are accepted) as ms since the Unix epoch (a clap value parser: a
/// bad date is a usage error, status 2).
pub fn parse_date(text: &str) -> Result<i64, String> {
    let bad = || format!("{text:?} is not a date (YYYY-MM-DD[THH:MM[:SS]], UTC)");
    let t = text.trim().trim_end_matches('Z');
    let (date, time) = match t.split_once(['T', ' ']) {
        Some((d, t)) => (d, Some(t)),
        None => (t, None),
    };
    let num = |s: &str, lo: i64, hi: i64| -> Result<i64, String> {
        s.parse::<i64>()
            .ok()
            .filter(|n| (lo..=hi).contains(n) && !s.starts_with('+'))
            .ok_or_else(bad)
    };
    let d: Vec<&str> = date.split('-').collect();
    let [y, m, day] = d.as_slice() else {
        return Err(bad());
    };
    let (y, m, day) = (num(y, 1970, 9999)?, num(m, 1, 12)?, num(day, 1, 31)?);
    let (next_year, next_month) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    if day > days_from_civil(next_year, next_month, 1) - days_from_civil(y, m, 1) {
        return Err(bad());
    }
    let mut seconds = days_from_civil(y, m, day) * 86_400;
    if let Some(time) = time {
        let parts: Vec<&str> = time.split(':').collect();
        let (h, min, s) = match parts.as_slice() {
            [h, m] => (num(h, 0, 23)?, num(m, 0, 59)?, 0),
            [h, m, s] => (num(h, 0, 23)?, num(m, 0, 59)?, num(s, 0, 60)?),
            _ => return Err(bad()),
        };
        seconds += h * 3600 + min * 60 + s;
    }
    Ok(seconds * 1000)
}

/// `search QUERY [--limit N] [--cursor C] [--session ID] [--cwd DIR] [--since DATE]
/// [--role ROLE]`.
pub fn search(cx: &Context, query: &str, args: SearchArgs) -> CliResult<()> {
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
    let service = cx.service()?;
    let page = block_on(service.query().search(query, options))??;
    if cx.json {
        return print_json(&page);
    }
    print_page(&page, std::io::stdout().is_terminal())
}

/// One block per hit: where it is, then its snippet (matches in bold reverse video on a
/// terminal, plain text otherwise).
fn print_page(page: &SearchPage, terminal: bool) -> CliResult<()> {
    if page.hits.is_empty() {
        outln!("no matches");
        return Ok(());
    }
    let (open, close) = if terminal {
        ("\x1b[1;7m", "\x1b[0m")
    } else {
        ("", "")
    };
    for hit in &page.hits {
        let title = if hit.title.is_empty() {
            String::new()
        } else {
            format!("  {}", printable(&hit.title))
        };
        outln!(
            "{} #{} {} {}{title}",
            hit.session_ref.session_id,
            hit.position,
            hit.role.as_deref().unwrap_or("-"),
            utc(hit.time_ms),
        );
        if !hit.shared_with.is_empty() {
            let forks: Vec<&str> = hit
                .shared_with
                .iter()
                .map(|r| r.session_id.as_str())
                .collect();
            outln!("  also in: {}", forks.join(", "));
        }
        // Snippet text has no control characters: only the marks are escapes.
        outln!("  {}", hit.snippet.marked(open, close));
    }
    if let Some(next) = &page.next_cursor {
        outln!("next page: --cursor {next}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_date;

    #[test]
    fn dates_parse_as_utc() {
        assert_eq!(parse_date("1970-01-01"), Ok(0));
        assert_eq!(parse_date("2024-02-29T12:30"), Ok(1_709_209_800_000));
        assert_eq!(parse_date("2024-02-29 12:30:05Z"), Ok(1_709_209_805_000));
        assert_eq!(parse_date("2023-12-31"), Ok(1_703_980_800_000));
        for bad in [
            "",
            "yesterday",
            "2024-13-01",
            "2024-1",
            "2024-01-01T25:00",
            "+2024-01-01",
            "2023-02-29",
            "2024-04-31",
        ] {
            assert!(parse_date(bad).is_err(), "{bad}");
        }
    }
}
