//! Full-text search, the pure part: the query syntax (parsed here and rewritten as an FTS5
//! expression in which every term is a quoted string, so no FTS5 operator, column filter or
//! `NEAR(` can come from the user), the text of a message that is indexed, and snippets
//! with the matched words marked.
//!
//! Syntax: words (all must match), `"a phrase"`, `prefix*`, `a OR b`, `a NOT b`, `AND`
//! (implicit between terms) and parentheses. Matching ignores case, diacritics and
//! compatibility forms (`ｆｏｏ` is `foo`, `ﬁ` is `fi`, `ß` is `ss`); words are runs of
//! letters and digits.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::Value;
use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;
use unicode_normalization::{IsNormalized, is_nfkc_quick};

use crate::error::{Error, Result};
use crate::model::Message;

/// Longest query accepted, in bytes.
pub(crate) const MAX_QUERY_BYTES: usize = 1024;
/// Most terms a query may have.
const MAX_TERMS: usize = 64;
/// Deepest nesting of parentheses.
const MAX_DEPTH: usize = 16;
/// Words of a snippet at most.
const SNIPPET_WORDS: usize = 24;
/// Words shown before the first match.
const SNIPPET_LEAD: usize = 6;
/// Characters of one word of a snippet, or of the text between two words, shown at most:
/// a longer one (a pasted base64 image, a minified line) is cut with `…` on the side away
/// from the first match, so a snippet stays short whatever the message holds.
const SNIPPET_PIECE_CHARS: usize = 60;
/// Keys whose string values are not text to search (ids, types, encoded data).
const SKIPPED_KEYS: [&str; 8] = [
    "type",
    "id",
    "tool_call_id",
    "call_id",
    "media_type",
    "mime_type",
    "data",
    "image_url",
];

/// A parsed search query.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SearchQuery {
    root: Node,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    /// A word or a phrase; `prefix` for a trailing `*`.
    Term {
        text: String,
        prefix: bool,
    },
    And(Vec<Node>),
    Or(Vec<Node>),
    /// Matches of the left side without a match of the right side.
    Not(Box<Node>, Box<Node>),
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Term { text: String, prefix: bool },
    Open,
    Close,
    And,
    Or,
    Not,
}

fn bad(reason: impl std::fmt::Display) -> Error {
    Error::invalid(format!("invalid search query: {reason}"))
}

/// Whether `c` is a letter of a script written without spaces between its words (Han
/// ideographs, hiragana, katakana) or of Hangul (whose words take their particles without
/// a space: `서울에서`). Each is indexed and searched as a word of its own ([`index_text`]),
/// so a query is the phrase of its characters: `東京` finds `東京タワーに行きました` and
/// `서울` finds `서울에서`. `unicode61` took a whole run of them for one word, which a
/// search found only whole (`東京` found nothing there, nor `タワー`).
fn is_unspaced(c: char) -> bool {
    matches!(
        u32::from(c),
        0x1100..=0x11FF
            | 0x3040..=0x30FF
            | 0x3130..=0x318F
            | 0x31F0..=0x31FF
            | 0x3400..=0x4DBF
            | 0x4E00..=0x9FFF
            | 0xA960..=0xA97F
            | 0xAC00..=0xD7FF
            | 0xF900..=0xFAFF
            | 0xFF66..=0xFFDC
            | 0x20000..=0x323AF
    ) && c.is_alphanumeric()
}

/// Whether `c` is part of a word (as SQLite's `unicode61` tokenizer sees it, closely: a
/// combining mark belongs to the word it accents), or an emoji ([`is_emoji`]: a word of
/// its own).
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || is_combining_mark(c) || is_emoji(c)
}

/// Whether `c` is an emoji or a pictograph of the emoji blocks (U+1F000-U+1FFFD: emoticons,
/// pictographs, transport, flags' regional indicators, skin tone modifiers, and those
/// Unicode adds there later; Miscellaneous Symbols and Dingbats U+2600-U+27BF; U+2B00-U+2BFF;
/// and the emoji among other symbols: `©`, `®`, `‼`, `⁉`, `™`, `⌚`, `⏰`, `▶`, `⤴`, `〰`, …),
/// not a letter or digit. Each is indexed and searched as a word of its own
/// ([`index_text`]): `unicode61` takes most of them for separators (`✅` and `👍` held no
/// word, so no search found them), and some for letters (those Unicode 6.1 had not
/// assigned, such as `🤔` or a skin tone, which stuck to the word beside them).
fn is_emoji(c: char) -> bool {
    matches!(
        u32::from(c),
        0x1F000..=0x1FFFD
            | 0x2600..=0x27BF
            | 0x2B00..=0x2BFF
            | 0xA9
            | 0xAE
            | 0x203C
            | 0x2049
            | 0x2122
            | 0x2194..=0x2199
            | 0x21A9..=0x21AA
            | 0x231A..=0x231B
            | 0x2328
            | 0x23CF
            | 0x23E9..=0x23F3
            | 0x23F8..=0x23FA
            | 0x25AA..=0x25AB
            | 0x25B6
            | 0x25C0
            | 0x25FB..=0x25FE
            | 0x2934..=0x2935
            | 0x3030
            | 0x303D
            | 0x3297
            | 0x3299
    ) && !c.is_alphanumeric()
}

/// The text as the index holds it and as a query's terms look for it: in its compatibility
/// form ([`push_folded`]: NFKC, so full-width `ｆｏｏ` is `foo` and `ﬁ` is `fi`; `ß` and `ẞ`
/// as `ss`), each Han, kana and Hangul letter ([`is_unspaced`]) a token of its own between
/// spaces, and each emoji ([`is_emoji`]) a token of its own, a private-use character (which
/// `unicode61` takes for a letter) standing for it between spaces: U+F0000 plus the code
/// point for one of the Basic Multilingual Plane, U+100000 plus its offset in the plane for
/// one of plane 1. So `done✅` holds the words `done` and `✅`, `👍🏽` the words `👍` and
/// `🏽` (a search for `👍` finds every skin tone, `👍🏽` that one as a phrase), and a ZWJ
/// sequence its emoji in order. Variation selectors and the zero-width joiner are
/// separators already. An emoji is never put in its compatibility form (`™` stays `™`, not
/// `TM`). ASCII text, and any text with nothing of these, is returned as it is, without a
/// copy. Only the index holds this form: snippets are cut from the message's own text.
pub(crate) fn index_text(text: &str) -> Cow<'_, str> {
    if text.is_ascii() || is_indexed_as_it_is(text) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest.find(is_emoji).unwrap_or(rest.len());
        rest[..cut].nfkc().for_each(|c| push_folded(c, &mut out));
        let mut tail = rest[cut..].chars();
        if let Some(emoji) = tail.next() {
            let code = u32::from(emoji);
            let stand_in = if code < 0x1_0000 {
                0xF_0000 + code
            } else {
                0x10_0000 + (code - 0x1_0000)
            };
            out.push(' ');
            // Always a private-use character (planes 15 and 16), so always a `char`.
            out.push(char::from_u32(stand_in).unwrap_or(char::REPLACEMENT_CHARACTER));
            out.push(' ');
        }
        rest = tail.as_str();
    }
    Cow::Owned(out)
}

/// Whether [`index_text`] leaves `text` as it is: no emoji, no letter of a script without
/// spaces, no `ß`/`ẞ`, and already in NFKC (its quick check; a "maybe" is taken for no).
fn is_indexed_as_it_is(text: &str) -> bool {
    !text
        .chars()
        .any(|c| is_emoji(c) || is_unspaced(c) || matches!(c, 'ß' | 'ẞ'))
        && is_nfkc_quick(text.chars()) == IsNormalized::Yes
}

/// Appends `c`, a character of text in NFKC, as the index holds it: `ß` and `ẞ` as `ss`
/// (full case folding, which `unicode61`'s simple folding lacks: `strasse` finds `Straße`),
/// a Han, kana or Hangul letter between spaces ([`is_unspaced`]), any other as it is.
fn push_folded(c: char, out: &mut String) {
    match c {
        'ß' | 'ẞ' => out.push_str("ss"),
        c if is_unspaced(c) => {
            out.push(' ');
            out.push(c);
            out.push(' ');
        }
        c => out.push(c),
    }
}

/// A word as the index compares it (`unicode61 remove_diacritics 2` on [`index_text`]'s
/// form, closely): in its compatibility form (NFKC: `ｆｏｏ` is `foo`, `ﬁ` is `fi`),
/// lowercase, decomposed, its combining marks dropped, `ß` as `ss`. So `résumé`, `RESUME`
/// and `resume` (and `e` followed by U+0301) are one word, `Straße` and `strasse` another,
/// and a snippet marks what the search matched.
fn fold(word: &str) -> String {
    if word.is_ascii() {
        return word.to_ascii_lowercase();
    }
    let compatible: String = word.nfkc().collect();
    let mut out = String::with_capacity(compatible.len());
    for c in compatible
        .to_lowercase()
        .nfd()
        .filter(|c| !is_combining_mark(*c))
    {
        match c {
            'ß' => out.push_str("ss"),
            c => out.push(c),
        }
    }
    out
}

fn lex(query: &str) -> Result<Vec<Token>> {
    let mut out = Vec::new();
    let mut chars = query.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '(' => out.push(Token::Open),
            ')' => out.push(Token::Close),
            '"' => {
                let mut text = String::new();
                let mut closed = false;
                while let Some((_, c)) = chars.next() {
                    if c == '"' {
                        // `""` inside a phrase is a literal quote, as in FTS5.
                        if chars.peek().is_some_and(|(_, n)| *n == '"') {
                            chars.next();
                            text.push('"');
                            continue;
                        }
                        closed = true;
                        break;
                    }
                    text.push(c);
                }
                if !closed {
                    return Err(bad(format!(
                        "the phrase opened at byte {at} has no closing \""
                    )));
                }
                let prefix = chars.peek().is_some_and(|(_, n)| *n == '*');
                if prefix {
                    chars.next();
                }
                out.push(Token::Term { text, prefix });
            }
            _ => {
                let mut word = String::from(c);
                while let Some((_, n)) = chars.peek() {
                    if n.is_whitespace() || matches!(n, '(' | ')' | '"') {
                        break;
                    }
                    word.push(*n);
                    chars.next();
                }
                out.push(match word.as_str() {
                    "AND" => Token::And,
                    "OR" => Token::Or,
                    "NOT" => Token::Not,
                    _ => match word.strip_suffix('*') {
                        Some(stem) if !stem.is_empty() => Token::Term {
                            text: stem.to_owned(),
                            prefix: true,
                        },
                        Some(_) => return Err(bad("`*` must follow a word (prefix*)")),
                        None => Token::Term {
                            text: word,
                            prefix: false,
                        },
                    },
                });
            }
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn or(&mut self) -> Result<Node> {
        let mut parts = vec![self.and()?];
        while self.peek() == Some(&Token::Or) {
            self.at += 1;
            parts.push(self.and()?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Node::Or(parts)
        })
    }

    fn and(&mut self) -> Result<Node> {
        let mut parts = vec![self.not()?];
        loop {
            match self.peek() {
                Some(Token::And) => {
                    self.at += 1;
                    parts.push(self.not()?);
                }
                Some(Token::Term { .. } | Token::Open) => parts.push(self.not()?),
                _ => break,
            }
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Node::And(parts)
        })
    }

    fn not(&mut self) -> Result<Node> {
        let mut left = self.unary()?;
        while self.peek() == Some(&Token::Not) {
            self.at += 1;
            let right = self.unary()?;
            left = Node::Not(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Node> {
        let token = self.peek().cloned();
        self.at += 1;
        match token {
            // One without a letter, digit or emoji is left out afterwards ([`prune`]).
            Some(Token::Term { text, prefix }) => Ok(Node::Term { text, prefix }),
            Some(Token::Open) => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(bad(format!(
                        "parentheses nest deeper than {MAX_DEPTH} levels"
                    )));
                }
                if self.peek() == Some(&Token::Close) {
                    return Err(bad("empty parentheses"));
                }
                let inner = self.or()?;
                if self.peek() != Some(&Token::Close) {
                    return Err(bad("a `(` is not closed"));
                }
                self.at += 1;
                self.depth -= 1;
                Ok(inner)
            }
            Some(Token::Close) => Err(bad("a `)` closes nothing")),
            Some(Token::Not) => Err(bad(
                "NOT needs a term before it (write `a NOT b`: matches of a without b)",
            )),
            Some(op @ (Token::And | Token::Or)) => Err(bad(format!(
                "{} needs a term on each side",
                if op == Token::And { "AND" } else { "OR" }
            ))),
            None => Err(bad("the query ends where a term is expected")),
        }
    }
}

impl SearchQuery {
    /// Parses `query` (see the module documentation for the syntax).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] saying what is wrong: an empty query, a NUL, a query over
    /// [`MAX_QUERY_BYTES`], an unclosed `"` or `(`, an operator without its terms.
    pub(crate) fn parse(query: &str) -> Result<SearchQuery> {
        if query.contains('\0') {
            return Err(bad("it contains a NUL character"));
        }
        if query.len() > MAX_QUERY_BYTES {
            return Err(bad(format!(
                "it is {} bytes long (at most {MAX_QUERY_BYTES})",
                query.len()
            )));
        }
        let tokens = lex(query)?;
        if tokens.is_empty() {
            return Err(bad("it is empty"));
        }
        let terms = tokens
            .iter()
            .filter(|t| matches!(t, Token::Term { .. }))
            .count();
        if terms > MAX_TERMS {
            return Err(bad(format!("it has {terms} terms (at most {MAX_TERMS})")));
        }
        let mut parser = Parser {
            tokens,
            at: 0,
            depth: 0,
        };
        let root = parser.or()?;
        match parser.peek() {
            None => {}
            Some(Token::Close) => return Err(bad("a `)` closes nothing")),
            Some(_) => return Err(bad("an operator is missing a term")),
        }
        let root = prune(root).ok_or_else(|| {
            bad(format!(
                "{} has no letter, digit or emoji to search for",
                crate::error::quoted(query.trim())
            ))
        })?;
        Ok(SearchQuery { root })
    }

    /// The query as an FTS5 expression: every term a quoted string.
    pub(crate) fn fts(&self) -> String {
        let mut out = String::new();
        emit(&self.root, &mut out);
        out
    }

    /// For a query of two or more plain words or phrases (no operator, no prefix), the
    /// FTS5 expression of them as one exact phrase: rows matching it rank first.
    pub(crate) fn exact_phrase(&self) -> Option<String> {
        let Node::And(parts) = &self.root else {
            return None;
        };
        let mut words = Vec::with_capacity(parts.len());
        for part in parts {
            match part {
                Node::Term {
                    text,
                    prefix: false,
                } => words.push(text.as_str()),
                _ => return None,
            }
        }
        Some(quote(&words.join(" ")))
    }

    /// What a snippet marks: each term's words (folded), a phrase's in order.
    pub(crate) fn marks(&self) -> Vec<Mark> {
        let mut out = Vec::new();
        collect_marks(&self.root, &mut out);
        out
    }
}

/// What a snippet marks for one term of a query: its words in order (one word, or a
/// phrase: a quoted one, or a run of letters of a script without spaces, `北京`), the
/// last a prefix when the term ends with `*`. Only a whole run of them is a match.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Mark {
    words: Vec<String>,
    prefix: bool,
}

impl Mark {
    /// Whether the words of `text` from the `at`-th on are this term's.
    fn matches_at(&self, text: &[(Range<usize>, String)], at: usize) -> bool {
        let last = self.words.len().saturating_sub(1);
        !self.words.is_empty()
            && text.get(at..at + self.words.len()).is_some_and(|found| {
                found
                    .iter()
                    .zip(&self.words)
                    .enumerate()
                    .all(|(i, ((_, w), m))| {
                        if self.prefix && i == last {
                            w.starts_with(m.as_str())
                        } else {
                            w == m
                        }
                    })
            })
    }
}

/// `node` without its terms that hold no letter, digit or emoji (`&`, `+`): searched as
/// text (as everything but the syntax is), such a term holds no word, so `a & b` is
/// `a b`, `a OR +` is `a` and `a NOT +` is `a` (before, the query was refused). `None`
/// when nothing is left.
fn prune(node: Node) -> Option<Node> {
    let several = |parts: Vec<Node>, make: fn(Vec<Node>) -> Node| {
        let mut parts: Vec<Node> = parts.into_iter().filter_map(prune).collect();
        match parts.len() {
            0 | 1 => parts.pop(),
            _ => Some(make(parts)),
        }
    };
    match node {
        // Combining marks alone (`\u{301}`, a variation selector) are no word either: the
        // tokenizer drops them, and such a term, an empty phrase, matched nothing, so
        // `log \u{301}` found nothing.
        Node::Term { ref text, .. }
            if !text.chars().any(|c| c.is_alphanumeric() || is_emoji(c)) =>
        {
            None
        }
        Node::Term { .. } => Some(node),
        Node::And(parts) => several(parts, Node::And),
        Node::Or(parts) => several(parts, Node::Or),
        Node::Not(left, right) => {
            let left = prune(*left)?;
            Some(match prune(*right) {
                Some(right) => Node::Not(Box::new(left), Box::new(right)),
                None => left,
            })
        }
    }
}

/// `text` as an FTS5 string: its emoji as the index holds them ([`index_text`]), `"` doubled.
fn quote(text: &str) -> String {
    format!("\"{}\"", index_text(text).replace('"', "\"\""))
}

fn emit(node: &Node, out: &mut String) {
    let join = |parts: &[Node], op: &str, out: &mut String| {
        out.push('(');
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                out.push_str(op);
            }
            emit(p, out);
        }
        out.push(')');
    };
    match node {
        Node::Term { text, prefix } => {
            out.push_str(&quote(text));
            if *prefix {
                out.push('*');
            }
        }
        Node::And(parts) => join(parts, " AND ", out),
        Node::Or(parts) => join(parts, " OR ", out),
        Node::Not(left, right) => {
            out.push('(');
            emit(left, out);
            out.push_str(" NOT ");
            emit(right, out);
            out.push(')');
        }
    }
}

fn collect_marks(node: &Node, out: &mut Vec<Mark>) {
    match node {
        Node::Term { text, prefix } => out.push(Mark {
            words: words(text).map(|(_, w)| w).collect(),
            prefix: *prefix,
        }),
        Node::And(parts) | Node::Or(parts) => parts.iter().for_each(|p| collect_marks(p, out)),
        // What a NOT excludes is never in a hit.
        Node::Not(left, _) => collect_marks(left, out),
    }
}

/// The words of `text`, folded ([`fold`]), with their byte ranges: as the index has them,
/// an emoji or a letter of a script without spaces ([`is_unspaced`]) is a word of its own
/// (with the marks that follow it, such as a variation selector), as [`index_text`] makes
/// it.
fn words(text: &str) -> impl Iterator<Item = (Range<usize>, String)> + '_ {
    let mut chars = text.char_indices().peekable();
    std::iter::from_fn(move || {
        let (start, first) = chars.by_ref().find(|(_, c)| is_word_char(*c))?;
        let alone = is_emoji(first) || is_unspaced(first);
        let mut end = text.len();
        while let Some((at, c)) = chars.peek() {
            let goes_on = if alone {
                is_combining_mark(*c)
            } else {
                is_word_char(*c) && !is_emoji(*c) && !is_unspaced(*c)
            };
            if !goes_on {
                end = *at;
                break;
            }
            chars.next();
        }
        Some((start..end, fold(&text[start..end])))
    })
}

/// The most text of one message that is indexed (and searched for a snippet): its first
/// MiB, cut after the last whole word. FTS5 holds a row's terms in memory until the row is
/// written: a 50 MB tool output of distinct words took 24 s and 808 MB to index, at the
/// first search of the root and at each `import`, fork `delete` or `rebuild-catalog` that
/// indexed it again (outside testing H2, session 41); 1 MB takes about 0.15 s and 34 MB.
pub(crate) const MAX_INDEXED_TEXT: usize = 1 << 20;

/// Text to search of a message: the string values of its `content` (or `raw_content`)
/// and of its `tool_calls`, at any depth, except ids, types and encoded data; one per line;
/// at most [`MAX_INDEXED_TEXT`] bytes.
/// A Responses-API item (what openai-agents stores: no `content` for a tool call or its
/// output) adds the fields that hold what was done ([`item_fields`]).
pub(crate) fn message_text(message: &Message) -> String {
    let fields = message.fields();
    let mut out = String::new();
    let content = fields.get("content").or_else(|| fields.get("raw_content"));
    let item = item_fields(fields.get("type").and_then(Value::as_str));
    let values = [content, fields.get("tool_calls")]
        .into_iter()
        .chain(item.iter().map(|k| fields.get(*k)));
    let mut full = false;
    for value in values.flatten() {
        strings(value, &mut out, &mut full);
    }
    out
}

/// The fields of a Responses-API item of type `item_type` that hold its text: a
/// `function_call`'s name and arguments, a `function_call_output`'s output, a `reasoning`
/// item's summary; none for any other type (a chat message has none).
fn item_fields(item_type: Option<&str>) -> &'static [&'static str] {
    match item_type {
        Some("function_call") => &["name", "arguments"],
        Some("function_call_output") => &["output"],
        Some("reasoning") => &["summary"],
        _ => &[],
    }
}

fn strings(value: &Value, out: &mut String, full: &mut bool) {
    if *full {
        return;
    }
    match value {
        Value::String(s) => {
            let room = MAX_INDEXED_TEXT.saturating_sub(out.len() + 1);
            let kept = within_limit(s, room);
            *full = kept.len() < s.len();
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(kept);
        }
        Value::Array(items) => items.iter().for_each(|v| strings(v, out, full)),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !SKIPPED_KEYS.contains(&k.as_str()))
            .for_each(|(_, v)| strings(v, out, full)),
        _ => {}
    }
}

/// The longest start of `s` of at most `limit` bytes that ends after a whole word (a cut
/// word would be indexed as another, shorter one): cut at its last white space in the
/// last 64 bytes; a word of over 64 bytes is cut at a character boundary, a shorter one
/// that is all the room holds is left out.
fn within_limit(s: &str, limit: usize) -> &str {
    if s.len() <= limit {
        return s;
    }
    let mut end = limit;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let floor = end.saturating_sub(64);
    match s[floor..end].rfind(char::is_whitespace) {
        Some(at) => &s[..floor + at],
        None if floor == 0 => "",
        None => &s[..end],
    }
}

/// A short extract of a hit's text with the words that matched.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Snippet {
    /// The extract on one line (white space collapsed, other control characters kept: a
    /// front end shows them escaped); `…` where text was cut.
    pub text: String,
    /// Byte ranges of `text` that matched a query word.
    pub matches: Vec<Range<usize>>,
}

impl Snippet {
    /// The text with each match between `open` and `close` (e.g. terminal escapes, or
    /// `[` and `]`).
    pub fn marked(&self, open: &str, close: &str) -> String {
        let mut out = String::with_capacity(self.text.len() + self.matches.len() * 8);
        for (piece, hit) in self.pieces() {
            if hit {
                out.push_str(open);
                out.push_str(piece);
                out.push_str(close);
            } else {
                out.push_str(piece);
            }
        }
        out
    }

    /// The text in order as pieces, each with whether it is a match (for a front end that
    /// marks or escapes each piece itself).
    pub fn pieces(&self) -> Vec<(&str, bool)> {
        let mut out = Vec::with_capacity(self.matches.len() * 2 + 1);
        let mut at = 0;
        for m in &self.matches {
            if let (Some(before), Some(hit)) =
                (self.text.get(at..m.start), self.text.get(m.clone()))
            {
                out.push((before, false));
                out.push((hit, true));
                at = m.end;
            }
        }
        out.push((self.text.get(at..).unwrap_or_default(), false));
        out
    }
}

/// A snippet of `text` around its first match of `marks` (see [`SearchQuery::marks`]),
/// with the words of every match in it marked: a phrase's words only where they stand
/// together (a snippet of `"staging server"` was cut around the first `server` of the
/// text, and marked every `server`; one of `北京` marked the `京` of `京都`).
pub(crate) fn snippet(text: &str, marks: &[Mark]) -> Snippet {
    let found: Vec<(Range<usize>, String)> = words(text).collect();
    let mut hit = vec![false; found.len()];
    for at in 0..found.len() {
        for mark in marks.iter().filter(|m| m.matches_at(&found, at)) {
            if let Some(words) = hit.get_mut(at..at + mark.words.len()) {
                words.fill(true);
            }
        }
    }
    let spans: Vec<(Range<usize>, bool)> =
        found.into_iter().map(|(range, _)| range).zip(hit).collect();
    let first = spans.iter().position(|(_, hit)| *hit).unwrap_or(0);
    // Up to `SNIPPET_LEAD` words before the first match, more when the text ends sooner:
    // a text of at most `SNIPPET_WORDS` words is shown whole.
    let start = first
        .saturating_sub(SNIPPET_LEAD)
        .min(spans.len().saturating_sub(SNIPPET_WORDS));
    let end = (start + SNIPPET_WORDS).min(spans.len());
    let mut out = Snippet::default();
    let Some(chosen) = spans.get(start..end).filter(|s| !s.is_empty()) else {
        return out;
    };
    if start > 0 {
        out.text.push('…');
    }
    // From the first chosen word to the end of the last (the whole text when they are all
    // of it), white space collapsed; a long word or gap keeps the side nearer the first
    // match.
    let from = if start == 0 { 0 } else { chosen[0].0.start };
    let mut last_end = from;
    for (at, (range, hit)) in (start..).zip(chosen) {
        let before_match = at < first;
        push_gap(&mut out.text, &text[last_end..range.start], at <= first);
        let kept = push_clipped(&mut out.text, &text[range.clone()], before_match);
        if *hit {
            out.matches.push(kept);
        }
        last_end = range.end;
    }
    if end < spans.len() {
        if !out.text.ends_with('…') {
            out.text.push('…');
        }
    } else {
        push_gap(&mut out.text, &text[last_end..], false);
        out.text.truncate(out.text.trim_end().len());
    }
    out
}

/// Appends the text between two words, white space collapsed to one space, other control
/// characters kept (front ends escape them: dropped, `zeta<BEL>bell` read `zetabell`), cut as
/// [`push_clipped`] cuts a word (`keep_end` for a gap before the first match).
fn push_gap(out: &mut String, gap: &str, keep_end: bool) {
    let flat = gap.split_whitespace().collect::<Vec<_>>().join(" ");
    let lead = gap.starts_with(char::is_whitespace) && !out.is_empty();
    if lead && !flat.is_empty() {
        out.push(' ');
    }
    push_clipped(out, &flat, keep_end);
    if gap.ends_with(char::is_whitespace) && !out.is_empty() && !out.ends_with(' ') {
        out.push(' ');
    }
}

/// Appends `piece`, or when it is longer than [`SNIPPET_PIECE_CHARS`] its last ones after
/// `…` (`keep_end`: it comes before the first match) or its first ones before `…`; returns
/// the byte range of `out` that holds what was kept of it.
fn push_clipped(out: &mut String, piece: &str, keep_end: bool) -> Range<usize> {
    let Some((cut, _)) = piece.char_indices().nth(SNIPPET_PIECE_CHARS) else {
        let at = out.len();
        out.push_str(piece);
        return at..out.len();
    };
    if keep_end {
        let from = piece
            .char_indices()
            .rev()
            .nth(SNIPPET_PIECE_CHARS - 1)
            .map_or(0, |(i, _)| i);
        if !out.ends_with('…') {
            out.push('…');
        }
        let at = out.len();
        out.push_str(&piece[from..]);
        at..out.len()
    } else {
        let at = out.len();
        out.push_str(&piece[..cut]);
        let kept = at..out.len();
        out.push('…');
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fts(q: &str) -> String {
        SearchQuery::parse(q).expect("parses").fts()
    }

    #[test]
    fn terms_are_quoted_and_operators_kept() {
        assert_eq!(fts("hello"), r#""hello""#);
        assert_eq!(fts("a b"), r#"("a" AND "b")"#);
        assert_eq!(fts(r#""a b" OR c*"#), r#"("a b" OR "c"*)"#);
        assert_eq!(fts("a NOT b"), r#"("a" NOT "b")"#);
        assert_eq!(fts("(a OR b) c"), r#"(("a" OR "b") AND "c")"#);
        assert_eq!(fts("text:foo"), r#""text:foo""#);
        assert_eq!(fts("NEAR(a b)"), r#"("NEAR" AND ("a" AND "b"))"#);
        assert_eq!(fts(r#""say ""hi""""#), r#""say ""hi""""#);
    }

    #[test]
    fn malformed_queries_say_why() {
        for (q, why) in [
            ("", "empty"),
            ("  ", "empty"),
            ("\"open", "closing"),
            ("(a", "not closed"),
            ("a)", "closes nothing"),
            ("OR a", "each side"),
            ("a OR", "ends"),
            ("NOT a", "NOT needs"),
            ("*", "must follow"),
            ("a\0b", "NUL"),
            ("()", "empty parentheses"),
            ("\"...\"", "no letter, digit or emoji"),
        ] {
            let e = SearchQuery::parse(q).expect_err(q).to_string();
            assert!(e.contains(why), "{q:?}: {e}");
        }
        let long = "a ".repeat(MAX_QUERY_BYTES);
        assert!(SearchQuery::parse(&long).is_err());
        let deep = format!("{}a{}", "(".repeat(40), ")".repeat(40));
        assert!(SearchQuery::parse(&deep).is_err());
    }

    #[test]
    fn a_term_without_letters_is_left_out_as_text_that_holds_no_word() {
        // `deploy & staging` was refused ("& has no letter or digit"): the README says
        // anything but the syntax is searched as text, and as text `&` holds no word.
        for (q, same_as) in [
            ("deploy & staging", "deploy staging"),
            ("timeout - deadlock", "timeout deadlock"),
            ("a OR +", "a"),
            ("a NOT (+ OR -)", "a"),
            ("(+) a", "a"),
            ("log \u{301}", "log"),
            ("log NOT \u{fe0f}", "log"),
        ] {
            let parsed = SearchQuery::parse(q).unwrap_or_else(|e| panic!("{q:?}: {e}"));
            let expected = SearchQuery::parse(same_as).expect("parses");
            assert_eq!(parsed.fts(), expected.fts(), "{q:?}");
            assert_eq!(parsed.exact_phrase(), expected.exact_phrase(), "{q:?}");
        }
        // A query of nothing else is still refused.
        for q in ["+", "& -", "(+) OR -", "\u{301}", "\u{fe0f} \u{200d}"] {
            let e = SearchQuery::parse(q).expect_err(q).to_string();
            assert!(e.contains("no letter, digit or emoji"), "{q:?}: {e}");
        }
    }

    #[test]
    fn emoji_are_words_of_their_own_in_queries_the_index_and_snippets() {
        // Each emoji a private-use stand-in between spaces, as the index holds it.
        assert_eq!(index_text("plain words"), "plain words");
        assert_eq!(index_text("done✅"), "done \u{F2705} ");
        assert_eq!(index_text("👍🏽"), " \u{10F44D}  \u{10F3FD} ");
        assert_eq!(fts("🎉"), "\" \u{10F389} \"");
        assert_eq!(fts("🎉 party"), "(\" \u{10F389} \" AND \"party\")");
        assert_eq!(fts("✅*"), "\" \u{F2705} \"*");
        let q = SearchQuery::parse("great 👍").expect("parses");
        assert_eq!(q.exact_phrase().as_deref(), Some("\"great  \u{10F44D} \""));
        // A snippet marks the emoji, not the word it is stuck to; a variation selector
        // stays with its emoji.
        let marked = |q: &str, text: &str| {
            snippet(text, &SearchQuery::parse(q).expect("parses").marks()).marked("[", "]")
        };
        assert_eq!(marked("✅", "done✅ ok"), "done[✅] ok");
        assert_eq!(marked("done", "done✅ ok"), "[done]✅ ok");
        // The toned emoji is a phrase of two: a lone 👍 is no match of it (it was marked).
        assert_eq!(marked("👍🏽", "a 👍🏽 b 👍"), "a [👍][🏽] b 👍");
        assert_eq!(marked("❤", "I ❤\u{fe0f} it"), "I [❤\u{fe0f}] it");
        // Symbols that are no emoji still hold no word.
        assert_eq!(fts("a & → b"), fts("a b"));
    }

    #[test]
    fn text_is_indexed_in_its_compatibility_form_and_ascii_as_it_is() {
        assert!(matches!(
            index_text("Plain ASCII, as it is."),
            Cow::Borrowed(_)
        ));
        assert!(matches!(index_text("café déjà vu"), Cow::Borrowed(_)));
        assert_eq!(
            index_text("ｆｏｏ ＢＡＲ１ ﬁle Straße GROẞE"),
            "foo BAR1 file Strasse GROssE"
        );
        // An emoji stands in for itself (`™` is not `TM`); halfwidth kana is composed.
        assert_eq!(index_text("x™ ﬁ"), "x \u{F2122}  fi");
        assert_eq!(index_text("ｶﾞ"), " ガ ");
        assert_eq!(fold("ＦＯＯ"), "foo");
        assert_eq!(fold("Straße"), "strasse");
        assert_eq!(fold("GROẞE"), "grosse");
        assert_eq!(fold("ﬂagged"), "flagged");
        assert_eq!(fold("Résumé"), "resume");
    }

    #[test]
    fn exact_phrase_only_for_plain_words() {
        let p = |q: &str| SearchQuery::parse(q).expect("parses").exact_phrase();
        assert_eq!(
            p("quick brown fox").as_deref(),
            Some(r#""quick brown fox""#)
        );
        assert_eq!(p("quick"), None);
        assert_eq!(p("quick OR fox"), None);
        assert_eq!(p("quick fo*"), None);
    }

    #[test]
    fn snippets_mark_matching_words() {
        let q = SearchQuery::parse("deploy* KUBERNETES").expect("parses");
        let s = snippet(
            "  We talked about many things.\nThen deploying to Kubernetes failed twice. \n",
            &q.marks(),
        );
        assert_eq!(
            s.marked("[", "]"),
            "We talked about many things. Then [deploying] to [Kubernetes] failed twice."
        );
        let long: String = (0..100).map(|i| format!("w{i} ")).collect::<String>() + "needle end";
        let s = snippet(
            &long,
            &SearchQuery::parse("needle").expect("parses").marks(),
        );
        assert!(s.text.starts_with('…'), "{}", s.text);
        assert_eq!(s.marked("<", ">").matches("<needle>").count(), 1);
    }

    #[test]
    fn a_phrase_is_marked_and_shown_where_its_words_stand_together() {
        let marked = |text: &str, q: &str| {
            snippet(text, &SearchQuery::parse(q).expect("parses").marks()).marked("[", "]")
        };
        // The snippet was cut around the first lone "server" (the match 100 words on, out
        // of it), and every "server" was marked.
        let long = format!(
            "server {}restart the staging server now",
            (0..100).map(|i| format!("w{i} ")).collect::<String>()
        );
        let s = marked(&long, "\"staging server\"");
        assert!(s.ends_with("w99 restart the [staging] [server] now"), "{s}");
        assert_eq!(s.matches('[').count(), 2, "{s}");
        assert_eq!(
            marked(
                "the server is down; restart the staging server now, server team",
                "\"staging server\""
            ),
            "the server is down; restart the [staging] [server] now, server team"
        );
        // A run of CJK letters is a phrase of them: 京都 and 東京 hold no match of 北京.
        let cjk = format!("京都很好。{}我们去北京开会", "他".repeat(60));
        let s = marked(&cjk, "北京");
        assert!(s.ends_with("我们去[北][京]开会"), "{s}");
        assert_eq!(s.matches('[').count(), 2, "{s}");
        assert_eq!(
            marked("去北京开会 東京タワー 京都", "北京"),
            "去[北][京]开会 東京タワー 京都"
        );
        // A prefix phrase: its last word a prefix; words of several terms each marked.
        assert_eq!(
            marked("staging servers and staging areas", "\"staging serv\"*"),
            "[staging] [servers] and staging areas"
        );
        assert_eq!(
            marked(
                "deploy then roll back, deploy again",
                "deploy \"roll back\""
            ),
            "[deploy] then [roll] [back], [deploy] again"
        );
    }

    #[test]
    fn a_long_word_is_cut_away_from_the_match_and_controls_are_kept() {
        // One 200,000-character token made the snippet the whole message (200 KB).
        let marks = SearchQuery::parse("upload").expect("parses").marks();
        let text = format!("upload failed: {}", "A".repeat(200_000));
        let s = snippet(&text, &marks);
        assert_eq!(
            s.text,
            format!("upload failed: {}…", "A".repeat(SNIPPET_PIECE_CHARS))
        );
        assert_eq!(s.marked("[", "]").matches("[upload]").count(), 1);
        // Before the match the end of a long word is kept, next to the match; a long run
        // of other characters is cut the same way.
        let text = format!(
            "{} {} upload {}",
            "b".repeat(500),
            "-".repeat(500),
            "c".repeat(9)
        );
        let s = snippet(&text, &marks);
        let dashes = "-".repeat(SNIPPET_PIECE_CHARS);
        let bs = "b".repeat(SNIPPET_PIECE_CHARS);
        assert_eq!(s.text, format!("…{bs} …{dashes} upload ccccccccc"));
        assert_eq!(
            s.marked("[", "]"),
            format!("…{bs} …{dashes} [upload] ccccccccc")
        );
        // A long matching word keeps its start (a prefix match), marked as far as shown.
        let marks = SearchQuery::parse("abc*").expect("parses").marks();
        let s = snippet(&format!("x abc{}", "d".repeat(300)), &marks);
        assert_eq!(s.pieces()[1].0.chars().count(), SNIPPET_PIECE_CHARS);
        assert!(
            s.text.ends_with('…') && s.text.chars().count() < 70,
            "{}",
            s.text
        );
        // Control characters between words are kept (front ends escape them), not dropped
        // to join two words into one that is not in the text.
        let marks = SearchQuery::parse("gamma").expect("parses").marks();
        let s = snippet("alpha \u{1b}[31mbeta gamma zeta\u{7}bell", &marks);
        assert_eq!(s.text, "alpha \u{1b}[31mbeta gamma zeta\u{7}bell");
    }

    #[test]
    fn a_text_that_fits_in_a_snippet_is_not_cut() {
        // 13 words, the match last: the whole text fits in the snippet's 24 words, so none
        // is cut away before the match (the words before it were dropped with an `…`).
        let text = "one two three four five six seven eight nine ten eleven twelve needle";
        let s = snippet(text, &SearchQuery::parse("needle").expect("parses").marks());
        assert_eq!(s.marked("[", "]"), text.replace("needle", "[needle]"));
        // A long text ending in the match shows its last 24 words, not only 7.
        let long: String = (0..100).map(|i| format!("w{i} ")).collect::<String>() + "needle";
        let s = snippet(
            &long,
            &SearchQuery::parse("needle").expect("parses").marks(),
        );
        assert!(s.text.starts_with("…w77 "), "{}", s.text);
        assert!(s.marked("[", "]").ends_with("w99 [needle]"), "{}", s.text);
    }

    #[test]
    fn message_text_is_cut_after_a_whole_word_at_its_limit() {
        let word = "abcdefg ";
        let long = word.repeat(MAX_INDEXED_TEXT / word.len() + 100);
        let m = Message::from_value(&serde_json::json!({
            "id": "m", "role": "tool", "content": [long.clone(), "after the limit"]
        }))
        .expect("message");
        let text = message_text(&m);
        assert!(text.len() <= MAX_INDEXED_TEXT, "{}", text.len());
        assert!(text.len() > MAX_INDEXED_TEXT - 64, "{}", text.len());
        assert!(text.ends_with("abcdefg"), "{:?}", &text[text.len() - 16..]);
        assert!(!text.contains("after"));
        // A word longer than the margin is cut at a character boundary, a word the
        // room cannot hold is left out.
        let long_word = "é".repeat(100);
        assert_eq!(within_limit(&long_word, 81), "é".repeat(40));
        assert_eq!(within_limit("abcdef", 3), "");
        assert_eq!(within_limit("ab cd", 4), "ab");
        assert_eq!(within_limit("ab", 4), "ab");
    }

    #[test]
    fn message_text_takes_what_responses_items_did() {
        let text = |v: serde_json::Value| message_text(&Message::from_value(&v).expect("message"));
        let call = text(serde_json::json!({"id": "i1", "type": "function_call",
            "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Lisbon\"}"}));
        assert!(
            call.contains("get_weather") && call.contains("Lisbon") && !call.contains("c1"),
            "{call}"
        );
        let output = text(
            serde_json::json!({"id": "i2", "type": "function_call_output",
            "call_id": "c1", "output": "sunny, 21 degrees"}),
        );
        assert_eq!(output, "sunny, 21 degrees");
        let reasoning = text(serde_json::json!({"id": "i3", "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "compare the forecasts"}]}));
        assert_eq!(reasoning, "compare the forecasts");
        // A chat message's own `name` (its author) is not its text.
        let chat =
            text(serde_json::json!({"id": "m", "role": "user", "name": "ann", "content": "hi"}));
        assert_eq!(chat, "hi");
    }

    #[test]
    fn message_text_takes_content_parts_and_tool_calls() {
        let m = Message::from_value(&serde_json::json!({
            "id": "m1", "role": "assistant",
            "content": [{"type": "text", "text": "hello there"}, {"type": "image", "data": "QUJD"}],
            "tool_calls": [{"id": "c1", "function": {"name": "grep", "arguments": "{\"q\":\"zebra\"}"}}]
        }))
        .expect("message");
        let t = message_text(&m);
        assert!(
            t.contains("hello there") && t.contains("zebra") && !t.contains("QUJD"),
            "{t}"
        );
    }
}
