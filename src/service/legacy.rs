//! Continuing a legacy transcript (one message JSON object per line) as a canonical
//! session with a deterministic id. The source is only ever read.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;
use serde_json::json;

use crate::error::{Error, Result};
use crate::format::MAX_PAYLOAD_NESTING;
use crate::model::event::sha256_hex;
use crate::model::header::Origin;
use crate::model::ids::derived_id;
use crate::model::kind;
use crate::model::payload::MessageOut;
use crate::model::{Batch, Event, Message, SessionId};
use crate::persistence::{CreateOptions, Root};
use crate::session::live::Session;
use crate::store::schema::CODEC;

/// Messages per appended batch.
const MESSAGES_PER_BATCH: usize = 128;

/// What a legacy migration did.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct MigrationRecord {
    /// The new session's id (hex of the first 12 bytes of SHA-256 over path, digest,
    /// head and codec).
    pub target_id: SessionId,
    /// The canonical source path.
    pub source_path: String,
    /// Bytes of the source file.
    pub source_size: u64,
    /// SHA-256 of the source file.
    pub source_sha256: String,
    /// The legacy head id the migration froze ("" for the file's tip).
    pub legacy_head_id: String,
    /// Messages migrated.
    pub message_count: usize,
    /// Whether an earlier migration of the same source was reused.
    pub reused: bool,
    /// Whether the last line was torn (incomplete) and skipped.
    pub torn_last_line: bool,
}

/// A message of the transcript and its 1-based line.
type Line = (usize, Message);

/// Parses the transcript; a last line without a newline that does not parse (or is cut
/// inside a UTF-8 character) is torn. Any other line that is not UTF-8 is refused, never
/// repaired: a migration copies messages exactly or not at all. A byte order mark before
/// the first line is ignored (RFC 8259 lets a parser ignore it).
fn parse_transcript(bytes: &[u8], branch: &str, digest: &str) -> Result<(Vec<Line>, bool)> {
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let mut messages = Vec::new();
    let mut torn = false;
    for (n, raw) in lines.iter().enumerate() {
        let last = n + 1 == lines.len();
        // A torn last line is a write cut short: text that ends inside a character or a
        // JSON value. A complete line that is not a message is refused like any other
        // (it was dropped as torn when no newline followed it).
        let line = match std::str::from_utf8(raw) {
            Ok(line) => line,
            Err(e) if last && e.error_len().is_none() => {
                torn = true;
                continue;
            }
            Err(e) => {
                return Err(Error::invalid(format!(
                    "legacy line {} is not UTF-8 (invalid byte at offset {} of the line); \
                     the transcript was left unchanged and nothing was migrated",
                    n + 1,
                    e.valid_up_to()
                )));
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Message>(line) {
            // Its payload, `{"message": …}`, is one level deeper: refused here by its line
            // (the append named `events[43]` of a batch the caller never saw; outside
            // testing C7, session 41).
            Ok(_)
                if crate::model::json_scan::nests_deeper_than(
                    line.as_bytes(),
                    MAX_PAYLOAD_NESTING - 1,
                ) =>
            {
                return Err(Error::invalid(format!(
                    "legacy line {} nests objects and arrays more than {} deep (a payload \
                     may nest {MAX_PAYLOAD_NESTING}, its {{\"message\": …}} one of them); \
                     nothing was migrated",
                    n + 1,
                    MAX_PAYLOAD_NESTING - 1
                )));
            }
            Ok(m) if m.id().is_empty() => {
                let id = derived_id(&["legacy", branch, &messages.len().to_string(), digest]);
                messages.push((n + 1, m.with_id(&id)));
            }
            Ok(m) => messages.push((n + 1, m)),
            Err(e) if last && e.is_eof() => torn = true,
            Err(e) => return Err(Error::invalid_from(format!("legacy line {}", n + 1), e)),
        }
    }
    Ok((messages, torn))
}

/// `path` as the migration record names it: its text, each byte that is not UTF-8 as
/// `\xNN` (it was U+FFFD, which names no file and is the same for every such byte;
/// outside testing C5, session 41).
fn path_text(path: &Path) -> String {
    let mut out = String::new();
    for chunk in path.as_os_str().as_encoded_bytes().utf8_chunks() {
        out.push_str(chunk.valid());
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02X}"));
        }
    }
    out
}

/// The transcript up to and including the message whose id is `head` ("" keeps it all).
///
/// # Errors
/// [`Error::InvalidInput`] when no message has that id (nothing is migrated).
fn cut_at_head(mut messages: Vec<Line>, head: &str) -> Result<Vec<Line>> {
    if head.is_empty() {
        return Ok(messages);
    }
    let at = messages
        .iter()
        .position(|(_, m)| m.id() == head)
        .ok_or_else(|| {
            Error::invalid(format!(
                "legacy head {} is not the id of a message of the transcript",
                crate::error::quoted(head)
            ))
        })?;
    messages.truncate(at + 1);
    Ok(messages)
}

/// The messages of `lines`, refused as [`Error::InvalidInput`] naming both lines when two
/// share an id (a session's transcript holds an id once; the append would refuse it
/// without saying where).
fn unique_ids(lines: Vec<Line>) -> Result<Vec<Message>> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(lines.len());
    for (line, m) in &lines {
        if let Some(first) = seen.insert(m.id(), *line) {
            return Err(Error::invalid(format!(
                "legacy line {line}: duplicate message id {} (line {first} has it); \
                 nothing was migrated",
                crate::error::quoted(m.id())
            )));
        }
    }
    drop(seen);
    Ok(lines.into_iter().map(|(_, m)| m).collect())
}

/// A legacy transcript read and parsed, with the deterministic id of the session that
/// continues it. Nothing is written until [`Migration::run`] or [`Migration::complete`].
pub(crate) struct Migration {
    target_id: SessionId,
    path_text: String,
    source_size: u64,
    digest: String,
    head: String,
    messages: Vec<Message>,
    torn: bool,
}

impl Migration {
    /// Reads and parses the transcript at `source`, cut at `head` ("" keeps it all).
    ///
    /// # Errors
    /// [`Error::Io`] for an unreadable source; [`Error::InvalidInput`] for a line that is
    /// not a message or not UTF-8 (other than a torn last line), or an unknown `head`.
    pub(crate) fn read(source: &Path, head: &str) -> Result<Migration> {
        // A device or a FIFO was read to its end, which `/dev/zero` and a FIFO no one
        // writes never reach (`import` and `verify` refuse them too). Looked at before the
        // path is resolved: `/dev/stdin` on a pipe resolves to no path, and was "not found"
        // (outside testing C7, session 41).
        let meta = std::fs::metadata(source)
            .map_err(|e| Error::io(format!("stat {}", source.display()), e))?;
        if !meta.is_file() {
            return Err(crate::store::schema::not_regular(source, &meta));
        }
        let path = std::fs::canonicalize(source)
            .map_err(|e| Error::io(format!("resolve {}", source.display()), e))?;
        let bytes =
            std::fs::read(&path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        let digest = sha256_hex(&bytes);
        let path_text = path_text(&path);
        // The path's own bytes (its text for a UTF-8 path, so such ids are as before): two
        // paths that differ in bytes that are not UTF-8 read as one text, and the second
        // file of the same content continued the first one's session (outside testing
        // C5, session 41).
        let mut named = path.as_os_str().as_encoded_bytes().to_vec();
        named.extend_from_slice(format!("\0{digest}\0{head}\0{CODEC}").as_bytes());
        let target_hex = sha256_hex(&named);
        let target_id = SessionId::new(&target_hex[..24])?;
        let branch = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (lines, torn) = parse_transcript(&bytes, &branch, &digest)?;
        let messages = unique_ids(cut_at_head(lines, head)?)?;
        Ok(Migration {
            target_id,
            path_text,
            source_size: bytes.len() as u64,
            digest,
            head: head.to_owned(),
            messages,
            torn,
        })
    }

    /// The id of the session that continues the transcript.
    pub(crate) fn target_id(&self) -> &SessionId {
        &self.target_id
    }

    /// Publishes the canonical session for the transcript, filled before it becomes
    /// visible (a crash leaves nothing), and returns it open for writing: it is published
    /// with its writer lock held and opened under that lock, so no other opener can take
    /// it in between. Idempotent: when the target exists it is reopened and completed
    /// (see [`Migration::complete`]).
    ///
    /// # Errors
    /// [`Error::SessionExists`] when the target comes from another source;
    /// [`Error::WriterOwned`] when another writer holds an existing target; I/O and
    /// SQLite errors.
    pub(crate) fn run(&self, root: &Root) -> Result<(Session, MigrationRecord)> {
        let provenance = json!({
            "source_path": self.path_text,
            "source_size": self.source_size,
            "source_sha256": self.digest,
            "legacy_head_id": self.head,
            "version": "legacy",
        });
        // Filled under `.staging/` and published whole: a crash leaves nothing visible. A
        // concurrent migration of the same source may publish it first: then it is reused.
        let created = if root.session_dir(&self.target_id).exists() {
            None
        } else {
            match root.create_filled(
                CreateOptions {
                    session_id: Some(self.target_id.clone()),
                    origin: Origin::LegacyImport,
                    provenance: Some(provenance),
                    ..CreateOptions::default()
                },
                "legacy",
                |session| self.append_all(session),
            ) {
                Ok(session) => Some(session),
                Err(Error::SessionExists(_)) => None,
                Err(e) => return Err(e),
            }
        };
        match created {
            Some(session) => Ok((session, self.record(false))),
            None => {
                self.check_source(root)?;
                let session = root.open_writer(&self.target_id)?;
                let record = self.complete(root, &session)?;
                Ok((session, record))
            }
        }
    }

    /// Reuses the target, already open for writing as `session`: checks that it continues
    /// this very source and completes it. Every batch has a deterministic operation id,
    /// so appending them again adds nothing (and completes a target an older build
    /// published before filling it).
    ///
    /// # Errors
    /// [`Error::SessionExists`] when the target comes from another source; append errors.
    pub(crate) fn complete(&self, root: &Root, session: &Session) -> Result<MigrationRecord> {
        self.check_source(root)?;
        self.append_all(session)?;
        Ok(self.record(true))
    }

    /// Refuses an existing target whose provenance names another source digest.
    fn check_source(&self, root: &Root) -> Result<()> {
        let info = root.stat(&self.target_id)?;
        if info
            .header
            .provenance
            .as_ref()
            .and_then(|p| p["source_sha256"].as_str())
            != Some(self.digest.as_str())
        {
            return Err(Error::SessionExists(format!(
                "{} (from another source)",
                self.target_id
            )));
        }
        Ok(())
    }

    /// Appends every message, in batches with deterministic operation ids.
    fn append_all(&self, session: &Session) -> Result<()> {
        for (n, chunk) in self.messages.chunks(MESSAGES_PER_BATCH).enumerate() {
            let events = chunk
                .iter()
                .map(|message| {
                    Event::new(kind::MESSAGE_COMPLETE).with_payload(&MessageOut { message })
                })
                .collect::<Result<Vec<_>>>()?;
            session.append(Batch::new(
                format!("legacy-import:{}:messages:{n}", self.digest),
                events,
            ))?;
        }
        Ok(())
    }

    fn record(&self, reused: bool) -> MigrationRecord {
        MigrationRecord {
            message_count: self.messages.len(),
            target_id: self.target_id.clone(),
            source_path: self.path_text.clone(),
            source_size: self.source_size,
            source_sha256: self.digest.clone(),
            legacy_head_id: self.head.clone(),
            reused,
            torn_last_line: self.torn,
        }
    }
}
