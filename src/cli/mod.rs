//! The command-line front end: subcommands and output helpers. Compiled into the
//! `session-store` binary only (not part of the library).

pub mod demo;

use std::path::Path;

/// The error type of every subcommand.
pub type CliError = Box<dyn std::error::Error>;

/// The result type of every subcommand.
pub type CliResult<T> = Result<T, CliError>;

/// An error and its sources as one line (`outer: cause: root cause`), without repeats.
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line.replace(['\n', '\r'], " ")
}

/// `path` quoted for a POSIX shell, unquoted when it is plainly safe.
pub fn shell_quote(path: &Path) -> String {
    let text = path.to_string_lossy();
    let safe = |c: char| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c);
    if !text.is_empty() && text.chars().all(safe) {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// A byte count for people: `512 B`, `1.5 KiB`, `3.2 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_when_needed() {
        assert_eq!(
            shell_quote(Path::new("/tmp/a-b/c.sqlite")),
            "/tmp/a-b/c.sqlite"
        );
        assert_eq!(shell_quote(Path::new("/tmp/a b")), "'/tmp/a b'");
        assert_eq!(shell_quote(Path::new("it's")), r"'it'\''s'");
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
