//! Continuing a legacy transcript (one message JSON object per line) as a canonical
//! session with a deterministic id. The source is only ever read.

use std::path::Path;

use serde::Serialize;
use serde_json::json;

use crate::error::{Error, Result};
use crate::model::event::sha256_hex;
use crate::model::header::Origin;
use crate::model::ids::derived_id;
use crate::model::{Batch, Event, Message, SessionId};
use crate::persistence::{CreateOptions, Root};
use crate::session::live::Session;
use crate::store::schema::CODEC;

/// Messages per appended batch.
const MESSAGES_PER_BATCH: usize = 128;

/// What a legacy migration did.
#[derive(Clone, Debug, Serialize)]
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

/// A `message/complete` payload, serialized from the message's own JSON text (a `json!`
/// tree would refuse numbers like `1e999` and deep nesting).
#[derive(Serialize)]
struct MessageOf<'a> {
    message: &'a Message,
}

/// Parses the transcript; a last line without a newline that does not parse (or is cut
/// inside a UTF-8 character) is torn. Any other line that is not UTF-8 is refused, never
/// repaired: a migration copies messages exactly or not at all.
fn parse_transcript(bytes: &[u8], branch: &str, digest: &str) -> Result<(Vec<Message>, bool)> {
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let mut messages = Vec::new();
    let mut torn = false;
    for (n, raw) in lines.iter().enumerate() {
        let last = n + 1 == lines.len();
        let line = match std::str::from_utf8(raw) {
            Ok(line) => line,
            Err(_) if last => {
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
            Ok(m) if m.id().is_empty() => {
                messages.push(m.with_id(&derived_id(&[
                    "legacy",
                    branch,
                    &messages.len().to_string(),
                    digest,
                ])));
            }
            Ok(m) => messages.push(m),
            Err(_) if last => torn = true,
            Err(e) => return Err(Error::invalid(format!("legacy line {}: {e}", n + 1))),
        }
    }
    Ok((messages, torn))
}

/// The transcript up to and including the message whose id is `head` ("" keeps it all).
///
/// # Errors
/// [`Error::InvalidInput`] when no message has that id (nothing is migrated).
fn cut_at_head(mut messages: Vec<Message>, head: &str) -> Result<Vec<Message>> {
    if head.is_empty() {
        return Ok(messages);
    }
    let at = messages
        .iter()
        .position(|m| m.id() == head)
        .ok_or_else(|| {
            Error::invalid(format!(
                "legacy head {} is not the id of a message of the transcript",
                crate::error::quoted(head)
            ))
        })?;
    messages.truncate(at + 1);
    Ok(messages)
}

/// Publishes the canonical session for a legacy transcript, filled before it becomes
/// visible (a crash leaves nothing). Idempotent: a second call reuses the target, and
/// every batch has a deterministic operation id, so appending them again adds nothing
/// (and completes a target an older build published before filling it).
pub(crate) fn migrate(root: &Root, source: &Path, head: &str) -> Result<MigrationRecord> {
    let path = std::fs::canonicalize(source)
        .map_err(|e| Error::io(format!("resolve {}", source.display()), e))?;
    let bytes =
        std::fs::read(&path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let digest = sha256_hex(&bytes);
    let path_text = path.to_string_lossy().into_owned();
    let target_hex = sha256_hex(format!("{path_text}\0{digest}\0{head}\0{CODEC}").as_bytes());
    let target_id = SessionId::new(&target_hex[..24])?;
    let branch = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (messages, torn) = parse_transcript(&bytes, &branch, &digest)?;
    let messages = cut_at_head(messages, head)?;
    let provenance = json!({
        "source_path": path_text,
        "source_size": bytes.len(),
        "source_sha256": digest,
        "legacy_head_id": head,
        "version": "legacy",
    });
    let append_all = |session: &Session| -> Result<()> {
        for (n, chunk) in messages.chunks(MESSAGES_PER_BATCH).enumerate() {
            let events = chunk
                .iter()
                .map(|message| Event::new("message/complete").with_payload(&MessageOf { message }))
                .collect::<Result<Vec<_>>>()?;
            session.append(Batch::new(
                format!("legacy-import:{digest}:messages:{n}"),
                events,
            ))?;
        }
        Ok(())
    };
    // Filled under `.staging/` and published whole: a crash leaves nothing visible. A
    // concurrent migration of the same source may publish it first: then it is reused.
    let created = !root.session_dir(&target_id).exists()
        && match root.create_filled(
            CreateOptions {
                session_id: Some(target_id.clone()),
                origin: Origin::LegacyImport,
                provenance: Some(provenance),
                ..CreateOptions::default()
            },
            "legacy",
            append_all,
        ) {
            Ok(_) => true,
            Err(Error::SessionExists(_)) => false,
            Err(e) => return Err(e),
        };
    let reused = !created;
    if reused {
        let info = root.stat(&target_id)?;
        if info
            .header
            .provenance
            .as_ref()
            .and_then(|p| p["source_sha256"].as_str())
            != Some(digest.as_str())
        {
            return Err(Error::SessionExists(format!(
                "{target_id} (from another source)"
            )));
        }
        // Complete already unless an older build published it before filling it.
        let session = root.open_writer(&target_id)?;
        append_all(&session)?;
        session.close()?;
    }
    Ok(MigrationRecord {
        target_id,
        source_path: path_text,
        source_size: bytes.len() as u64,
        source_sha256: digest,
        legacy_head_id: head.to_owned(),
        message_count: messages.len(),
        reused,
        torn_last_line: torn,
    })
}
