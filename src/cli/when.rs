//! Times on the command line: durations (`90s`, `45m`, `12h`, `7d`, `2w`) for
//! `gc --older-than` and `list --since`, and dates (`2026-12-01`, `2026-12-01T08:30:00Z`,
//! RFC 3339's `2026-12-01T09:30:00.250+01:00`) for `list --since` and `search --since`.

use std::time::Duration;

/// Seconds per unit of a duration.
const UNITS: [(&str, u64); 5] = [
    ("s", 1),
    ("m", 60),
    ("h", 3600),
    ("d", 86_400),
    ("w", 604_800),
];

/// The longest duration accepted: 100 years of 365 days.
const MAX_SECONDS: u64 = 100 * 365 * 86_400;

/// Why a text is not a duration.
enum NotADuration {
    /// Not a whole number and a unit.
    Malformed,
    /// A duration over [`MAX_SECONDS`].
    TooLong,
}

impl NotADuration {
    fn message(&self, text: &str) -> String {
        match self {
            NotADuration::Malformed => {
                format!("{text:?} is not a duration like 90s, 45m, 12h, 7d or 2w")
            }
            NotADuration::TooLong => {
                format!("{text:?} is over the limit of 36500 days (5214w: 100 years of 365 days)")
            }
        }
    }
}

/// A duration: a whole number and a unit `s`, `m`, `h`, `d` or `w` (`7d`), at most 100
/// years.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    duration(text).map_err(|e| e.message(text))
}

/// A `gc --older-than` age: a [`parse_duration`] that is not zero. A zero age (`0s`, `0d`)
/// would delete every session without a writer, however new, and a delete cannot be
/// undone: it is refused as a guard against an accidental 0 (a computed `${DAYS}d`); `1s`
/// says it on purpose.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let age = parse_duration(text)?;
    if age.is_zero() {
        return Err(format!(
            "{text:?} would delete every session without a writer, however new; give an age \
             of at least 1s"
        ));
    }
    Ok(age)
}

fn duration(text: &str) -> Result<Duration, NotADuration> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or(NotADuration::Malformed)?;
    let (number, unit) = text.split_at(split);
    let per = UNITS
        .iter()
        .find(|(u, _)| *u == unit)
        .map(|(_, per)| *per)
        .ok_or(NotADuration::Malformed)?;
    if number.is_empty() {
        return Err(NotADuration::Malformed);
    }
    // All digits: a number that does not fit in 64 bits is too long as well.
    let n: u64 = number.parse().map_err(|_| NotADuration::TooLong)?;
    match n.checked_mul(per) {
        Some(secs) if secs <= MAX_SECONDS => Ok(Duration::from_secs(secs)),
        _ => Err(NotADuration::TooLong),
    }
}

/// A point in time for `--since`, as ms since the Unix epoch: a duration back from now
/// (`7d`), a UTC date (`2026-12-01`) or date and time (`2026-12-01T08:30[:00][Z]`), also
/// with a fraction of a second and an offset (`2026-12-01T09:30:00.250+01:00`).
pub fn parse_since(text: &str) -> Result<i64, String> {
    match duration(text) {
        Ok(ago) => {
            // The value is fine; the clock is not (it blamed the value with the system's
            // "second time provided was later than self").
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|_| {
                    format!(
                        "this system's clock reads a time before 1970, so {text:?} cannot be \
                         counted back from it; give a date (2026-12-01) instead"
                    )
                })?;
            let ms = now.saturating_sub(ago).as_millis();
            return i64::try_from(ms).map_err(|_| format!("{text:?} is out of range"));
        }
        Err(e @ NotADuration::TooLong) => return Err(e.message(text)),
        Err(NotADuration::Malformed) => {}
    }
    parse_utc(text).ok_or_else(|| {
        format!(
            "{text:?} is neither a duration (7d) nor a date (2026-12-01, \
             2026-12-01T08:30:00Z or 2026-12-01T09:30:00.250+01:00)"
        )
    })
}

/// `YYYY-MM-DD[THH:MM[:SS[.fraction]]][Z|±HH:MM]` as ms since the Unix epoch: UTC unless
/// an offset says otherwise (RFC 3339's form, as other tools print times; a fraction is
/// cut to the millisecond).
fn parse_utc(text: &str) -> Option<i64> {
    // RFC 3339 (§5.6) takes `t` and `z` for `T` and `Z`.
    let (date, time) = match text.split_once(['T', 't', ' ']) {
        Some((d, t)) => (d, Some(t)),
        None => (text.strip_suffix(['Z', 'z']).unwrap_or(text), None),
    };
    let number = |s: &str, len: usize| -> Option<i64> {
        (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let mut d = date.split('-');
    let (year, month, day) = (
        number(d.next()?, 4)?,
        number(d.next()?, 2)?,
        number(d.next()?, 2)?,
    );
    if d.next().is_some()
        || !(1..=12).contains(&month)
        || !(1..=days_in(year, month)).contains(&day)
    {
        return None;
    }
    let mut ms = 0;
    if let Some(time) = time {
        let (time, offset_ms) = split_offset(time)?;
        // A fraction follows whole seconds (`08:30:00.5`, not `08:30.5`); milliseconds are
        // its first three digits, padded.
        let (time, fraction) = match time.split_once('.') {
            Some((t, f))
                if t.len() == 8 && !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) =>
            {
                let digits: String = f.chars().chain("00".chars()).take(3).collect();
                (t, digits.parse::<i64>().ok()?)
            }
            Some(_) => return None,
            None => (time, 0),
        };
        let mut t = time.split(':');
        let hour = number(t.next()?, 2)?;
        let minute = number(t.next()?, 2)?;
        let second = t.next().map_or(Some(0), |s| number(s, 2))?;
        // A leap second (`23:59:60`, RFC 3339) is the next minute's start, as POSIX time
        // counts it.
        if t.next().is_some() || hour > 23 || minute > 59 || second > 60 {
            return None;
        }
        ms = (hour * 3600 + minute * 60 + second) * 1000 + fraction - offset_ms;
    }
    Some(days_from_civil(year, month, day) * 86_400_000 + ms)
}

/// A time of day's zone: `Z`, `+HH:MM` or `-HH:MM` at its end (none: UTC), split off as
/// the offset in ms east of UTC; `None` for a malformed or out-of-range offset.
fn split_offset(time: &str) -> Option<(&str, i64)> {
    if let Some(time) = time.strip_suffix(['Z', 'z']) {
        return Some((time, 0));
    }
    let Some(at) = time.rfind(['+', '-']) else {
        return Some((time, 0));
    };
    let (time, zone) = time.split_at(at);
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let (hours, minutes) = zone.get(1..)?.split_once(':')?;
    let two = |s: &str| {
        (s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<i64>().ok())
            .flatten()
    };
    let (hours, minutes) = (two(hours)?, two(minutes)?);
    if hours > 23 || minutes > 59 {
        return None;
    }
    Some((time, sign * (hours * 3600 + minutes * 60) * 1000))
}

/// Days in `month` of `year` (Gregorian).
fn days_in(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a Gregorian date (Howard Hinnant's days_from_civil).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_dates() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        for bad in [
            "",
            "7",
            "d",
            "-1d",
            "1.5h",
            "7 d",
            "7y",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_utc("1970-01-01"), Some(0));
        assert_eq!(parse_utc("2000-03-01T00:00:01Z"), Some(951_868_801_000));
        assert_eq!(parse_utc("2024-02-29"), Some(1_709_164_800_000));
        assert_eq!(parse_utc("2024-02-29 12:30:05Z"), Some(1_709_209_805_000));
        // RFC 3339, as other tools print times: a fraction (cut to the ms) and an offset.
        assert_eq!(parse_utc("2024-02-29T12:30:05.5Z"), Some(1_709_209_805_500));
        assert_eq!(
            parse_utc("2024-02-29T12:30:05.123456789Z"),
            Some(1_709_209_805_123)
        );
        assert_eq!(
            parse_utc("2024-02-29T13:30:05+01:00"),
            Some(1_709_209_805_000)
        );
        assert_eq!(
            parse_utc("2024-02-29T07:00:05.250-05:30"),
            Some(1_709_209_805_250)
        );
        assert_eq!(
            parse_utc("2024-02-29T12:30:05-00:00"),
            Some(1_709_209_805_000)
        );
        assert_eq!(parse_utc("1970-01-01T00:30+01:00"), Some(-1_800_000));
        // RFC 3339's lower-case `t` and `z`, and a leap second (the next minute's start).
        assert_eq!(parse_utc("2024-02-29t12:30:05z"), Some(1_709_209_805_000));
        assert_eq!(parse_utc("2024-02-29z"), Some(1_709_164_800_000));
        assert_eq!(
            parse_utc("2016-12-31T23:59:60Z"),
            parse_utc("2017-01-01T00:00:00Z")
        );
        for bad in [
            "2023-02-29",
            "2024-04-31",
            "2024-13-01",
            "2024-1-01",
            "+2024-01-01",
            "2024-01-01T24:00",
            "2024-01-01T08:30.5Z",
            "2024-01-01T08:30:00.Z",
            "2024-01-01T08:30:00.5x",
            "2024-01-01T08:30:00+1:00",
            "2024-01-01T08:30:00+24:00",
            "2024-01-01T08:30:00+01:60",
            "2024-01-01T08:30:00+0100",
            "2024-01-01T08:30:00+01:00Z",
            "2024-01-01T08:30:61Z",
            "2024-01-01tt08:30:00Z",
            "2024-01-01+01:00",
            "",
            "x",
        ] {
            assert_eq!(parse_utc(bad), None, "{bad:?}");
        }
        assert!(parse_since("1d").is_ok_and(|ms| ms > 0));
        // A duration too long says so, as `gc --older-than` does (it said "neither a
        // duration nor a UTC date").
        // The bound is 100 years of 365 days, and the message names it (36524d, under
        // 100 calendar years, was "longer than 100 years").
        assert_eq!(
            parse_duration("36500d"),
            Ok(Duration::from_secs(36_500 * 86_400))
        );
        for long in ["99999999999d", "99999999999999999999d", "5300w", "36501d"] {
            let e = parse_since(long).expect_err(long);
            assert!(e.contains("is over the limit of 36500 days"), "{e}");
            let e = parse_duration(long).expect_err(long);
            assert!(e.contains("is over the limit of 36500 days"), "{e}");
        }
        // A zero age is refused by `gc` (it deleted every session without a writer).
        for zero in ["0s", "0d", "000w"] {
            assert_eq!(parse_duration(zero), Ok(Duration::ZERO), "{zero}");
            let e = parse_age(zero).expect_err(zero);
            assert!(
                e.contains("would delete every session without a writer"),
                "{e}"
            );
        }
        assert_eq!(parse_age("1s"), Ok(Duration::from_secs(1)));
        let e = parse_duration("7y").expect_err("7y");
        assert!(e.contains("not a duration"), "{e}");
    }
}
