//! Deterministic text for the lean benchmark suite: chat prose, and tool outputs that
//! compress as logs and source code do (timestamps, ids and numbers vary line to line,
//! the vocabulary repeats). The same seed gives the same text on every machine.

use std::fmt::Write;

/// Words of chat prose and identifiers.
const WORDS: [&str; 92] = [
    "the",
    "session",
    "store",
    "agent",
    "writes",
    "a",
    "turn",
    "message",
    "tool",
    "output",
    "reads",
    "file",
    "and",
    "then",
    "checks",
    "whether",
    "it",
    "is",
    "durable",
    "before",
    "answering",
    "user",
    "asked",
    "for",
    "summary",
    "of",
    "changes",
    "in",
    "repository",
    "test",
    "fails",
    "because",
    "index",
    "was",
    "not",
    "rebuilt",
    "after",
    "migration",
    "we",
    "should",
    "keep",
    "history",
    "small",
    "but",
    "complete",
    "model",
    "context",
    "replace",
    "with",
    "last",
    "few",
    "turns",
    "so",
    "that",
    "next",
    "request",
    "fits",
    "budget",
    "compile",
    "error",
    "line",
    "function",
    "returns",
    "value",
    "from",
    "cache",
    "when",
    "key",
    "exists",
    "otherwise",
    "loads",
    "disk",
    "writer",
    "lock",
    "held",
    "by",
    "another",
    "process",
    "retry",
    "later",
    "commit",
    "fork",
    "parent",
    "child",
    "event",
    "sequence",
    "number",
    "query",
    "page",
    "cursor",
    "limit",
    "blob",
];

/// Log levels, most often `INFO`.
const LEVELS: [&str; 6] = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"];

/// Module paths of log lines.
const MODULES: [&str; 8] = [
    "server::http",
    "store::writer",
    "runtime::tool",
    "agent::loop",
    "cache::lru",
    "db::pool",
    "sync::replica",
    "auth::token",
];

/// Request paths of log lines.
const ROUTES: [&str; 6] = [
    "/api/v1/sessions",
    "/api/v1/items",
    "/api/v1/users",
    "/healthz",
    "/api/v2/search",
    "/static/app.js",
];

/// Rust-like types of generated code.
const TYPES: [&str; 8] = [
    "u64",
    "String",
    "Vec<u8>",
    "Option<Key>",
    "Result<()>",
    "&str",
    "bool",
    "Session",
];

/// A seeded source of benchmark text.
pub struct Corpus {
    rng: fastrand::Rng,
}

impl Corpus {
    /// A corpus whose text depends only on `seed`.
    pub fn new(seed: u64) -> Corpus {
        Corpus {
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    fn word(&mut self) -> &'static str {
        WORDS[self.rng.usize(..WORDS.len())]
    }

    /// Prose of exactly `bytes` bytes (ASCII): sentences of 6–18 words.
    pub fn prose(&mut self, bytes: usize) -> String {
        let mut out = String::with_capacity(bytes + 128);
        while out.len() < bytes {
            if !out.is_empty() {
                out.push(' ');
            }
            let words = self.rng.usize(6..=18);
            for i in 0..words {
                let w = self.word();
                if i == 0 {
                    let mut chars = w.chars();
                    if let Some(first) = chars.next() {
                        out.push(first.to_ascii_uppercase());
                        out.push_str(chars.as_str());
                    }
                } else {
                    out.push(' ');
                    out.push_str(w);
                }
            }
            out.push(if self.rng.u8(..8) == 0 { '?' } else { '.' });
        }
        out.truncate(bytes);
        out
    }

    /// A tool output of exactly `bytes` bytes (ASCII, lines joined by `\n`): half the
    /// outputs are service logs, half source code.
    pub fn tool_output(&mut self, bytes: usize) -> String {
        let logs = self.rng.bool();
        let mut out = String::with_capacity(bytes + 256);
        let mut clock = self.rng.u64(0..86_400_000);
        while out.len() < bytes {
            if logs {
                clock += self.rng.u64(1..2_000);
                self.log_line(&mut out, clock);
            } else {
                self.code_block(&mut out);
            }
        }
        out.truncate(bytes);
        out
    }

    fn log_line(&mut self, out: &mut String, clock_ms: u64) {
        let (h, m, s, ms) = (
            clock_ms / 3_600_000 % 24,
            clock_ms / 60_000 % 60,
            clock_ms / 1000 % 60,
            clock_ms % 1000,
        );
        let level = LEVELS[self.rng.usize(..LEVELS.len())];
        let module = MODULES[self.rng.usize(..MODULES.len())];
        let _ = write!(
            out,
            "2026-12-03T{h:02}:{m:02}:{s:02}.{ms:03}Z {level:<5} {module}: "
        );
        match self.rng.u8(..3) {
            0 => {
                let route = ROUTES[self.rng.usize(..ROUTES.len())];
                let status = [200, 200, 200, 201, 204, 304, 404, 500][self.rng.usize(..8)];
                let _ = write!(
                    out,
                    "GET {route}/{} -> {status} in {}.{} ms (req={:08x})",
                    self.rng.u32(1..100_000),
                    self.rng.u32(0..400),
                    self.rng.u8(0..10),
                    self.rng.u32(..)
                );
            }
            1 => {
                let _ = write!(
                    out,
                    "{} {} {} id={:x} seq={} bytes={}",
                    self.word(),
                    self.word(),
                    self.word(),
                    self.rng.u64(..1 << 40),
                    self.rng.u32(1..1_000_000),
                    self.rng.u32(64..65_536)
                );
            }
            _ => {
                let _ = write!(
                    out,
                    "pool stats: active={} idle={} waiting={} p99={}ms",
                    self.rng.u8(0..32),
                    self.rng.u8(0..32),
                    self.rng.u8(0..8),
                    self.rng.u16(1..900)
                );
            }
        }
        out.push('\n');
    }

    fn code_block(&mut self, out: &mut String) {
        let name = format!("{}_{}", self.word(), self.word());
        let arg = self.word();
        let ty = TYPES[self.rng.usize(..TYPES.len())];
        let doc = self.rng.usize(30..90);
        let _ = writeln!(out, "/// {}.", self.prose(doc));
        let _ = writeln!(out, "pub fn {name}({arg}: {ty}) -> Result<{ty}> {{");
        for _ in 0..self.rng.usize(2..9) {
            let (a, b) = (self.word(), self.word());
            match self.rng.u8(..4) {
                0 => {
                    let _ = writeln!(out, "    let {a}_{b} = {arg}.{a}()?;");
                }
                1 => {
                    let _ = writeln!(
                        out,
                        "    if {a}.len() > {} {{\n        return Err(Error::invalid(\"{a} {b}\"));\n    }}",
                        self.rng.u16(1..4096)
                    );
                }
                2 => {
                    let _ = writeln!(
                        out,
                        "    for {a} in {b}.iter() {{\n        {a}.{}();\n    }}",
                        self.word()
                    );
                }
                _ => {
                    let comment = self.rng.usize(20..70);
                    let _ = writeln!(out, "    // {}", self.prose(comment));
                }
            }
        }
        let _ = writeln!(out, "    Ok({arg})\n}}\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_has_the_asked_size_and_depends_only_on_the_seed() {
        let (mut a, mut b) = (Corpus::new(7), Corpus::new(7));
        for bytes in [1, 400, 2_000, 40_000] {
            let (p, q) = (a.prose(bytes), b.prose(bytes));
            assert_eq!((p.len(), &p), (bytes, &q));
            let (t, u) = (a.tool_output(bytes), b.tool_output(bytes));
            assert_eq!((t.len(), &t), (bytes, &u));
        }
        assert_ne!(Corpus::new(8).prose(400), Corpus::new(7).prose(400));
    }

    #[test]
    fn tool_outputs_compress_like_logs_and_code_not_like_filler() {
        let mut c = Corpus::new(1);
        let text: String = (0..20).map(|_| c.tool_output(20_000)).collect();
        let packed = zstd::bulk::compress(text.as_bytes(), 3).unwrap();
        let ratio = text.len() as f64 / packed.len() as f64;
        assert!((2.5..12.0).contains(&ratio), "zstd ratio {ratio:.1}");
    }
}
