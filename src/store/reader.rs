//! Cold reads of a session: pooled read-only connections to its file and to the
//! files of its ancestors. Never touches the writer lock or the lease.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

use rusqlite::{Connection, OptionalExtension};

use crate::error::{Error, Result, WriterOwner};
use crate::model::event::INLINE_PAYLOAD_LIMIT;
use crate::model::event::{inherited_operation_id, rehash_commit};
use crate::model::header::Header;
use crate::model::kind;
use crate::model::projection::{self, ModelRef};
use crate::model::{Commit, ContentRef, Message, Projection, SessionId, TurnBoundary, Usage};
use crate::store::blob::Holds;
use crate::store::operation_keys::ChunkCache;
use crate::store::read::{self, DependentFork, HistoryRow, LineageEntry};
use crate::store::read_pool::{PooledConnection, ReadPool};
use crate::store::schema::{self, Access, SESSION_FILE};

/// A pooled read connection inside one read transaction (`BEGIN`, ended when dropped):
/// the statements run through it share one snapshot and take the WAL read lock once,
/// instead of once per statement.
struct ReadTxn(PooledConnection);

impl ReadTxn {
    /// A connection of `pool` with a deferred read transaction begun.
    fn begin(pool: &ReadPool) -> Result<ReadTxn> {
        let conn = pool.get()?;
        conn.execute_batch("BEGIN")?;
        Ok(ReadTxn(conn))
    }
}

impl std::ops::Deref for ReadTxn {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.0
    }
}

impl Drop for ReadTxn {
    fn drop(&mut self) {
        // A read transaction holds no change: ending it cannot lose anything, and the
        // connection must go back to the pool outside any transaction.
        if self.0.execute_batch("COMMIT").is_err() {
            let _ = self.0.execute_batch("ROLLBACK");
        }
    }
}

/// Item `i` of the messages event `event_seq` holds; a history row naming a missing one is
/// [`Error::Corrupt`].
fn history_item<T>(items: &[T], i: u64, event_seq: u64) -> Result<&T> {
    usize::try_from(i)
        .ok()
        .and_then(|i| items.get(i))
        .ok_or_else(|| Error::corrupt(format!("history item {i} of event {event_seq} is missing")))
}

/// What a history row naming event `seq` of kind `kind`, which puts no message in the
/// transcript, is said to do.
fn puts_no_message(seq: u64, kind: &str) -> String {
    format!(
        "names event {seq}, a {}, which puts no message there",
        crate::error::quoted(kind)
    )
}

/// The order checks of a page of transcript entries read newest position first (§4.2 of
/// the architecture, step 5): positions run down without a hole, a page shorter than its
/// limit ends at position 1, and no two entries name the same event and item.
#[derive(Default)]
struct PageOrder {
    /// The position of the entry before (newer).
    newer: Option<u64>,
    named: std::collections::HashSet<(u64, Option<u64>)>,
}

impl PageOrder {
    /// Checks the next entry: at `position`, naming item `item` of event `event_seq`.
    fn next(
        &mut self,
        reader: &SessionReader,
        position: u64,
        event_seq: u64,
        item: Option<u64>,
    ) -> Result<()> {
        // Positions run from 1 to the transcript's length without a hole.
        if let Some(newer) = self.newer
            && newer != position + 1
        {
            return Err(reader.history_damage(newer - 1, "is missing".to_owned()));
        }
        if !self.named.insert((event_seq, item)) {
            return Err(reader.history_damage(position, format!("names event {event_seq} again")));
        }
        self.newer = Some(position);
        Ok(())
    }

    /// After the page's `count` entries (at most `limit`): a short page ends at position 1.
    fn finish(&self, reader: &SessionReader, count: usize, limit: usize) -> Result<()> {
        match self.newer {
            Some(oldest) if count < limit && oldest > 1 => {
                Err(reader.history_damage(oldest - 1, "is missing".to_owned()))
            }
            _ => Ok(()),
        }
    }
}

/// A file in a read transaction and the range of sequences `(after, through]` read from it.
type FileRange = (ReadTxn, (u64, u64));

/// One range of sequences, `(after, through]`, and the file that holds it.
#[derive(Clone, Debug)]
struct Segment {
    /// The session whose file holds the range.
    source: SessionId,
    after: u64,
    through: u64,
    /// True for a range inherited from an ancestor.
    inherited: bool,
    /// The session whose reader this is (the one that inherits an inherited range).
    heir: SessionId,
    /// Set once an inherited range's file was found to be the ancestor `heir` was cut
    /// from ([`Segment::check_ancestry`]); shared by the layout's copies.
    ancestry_checked: Arc<OnceLock<()>>,
    file: PathBuf,
    connections: ReadPool,
}

impl Segment {
    /// The read connections of the range's file. An inherited range's file is checked
    /// first, once, to be the ancestor this session was cut from, so that a session put
    /// under an ancestor's id (a folder copied in by hand) never supplies its events.
    ///
    /// # Errors
    /// [`Error::Corrupt`] from [`Segment::check_ancestry`]; the pool's errors.
    fn pool(&self) -> Result<&ReadPool> {
        if self.inherited && self.ancestry_checked.get().is_none() {
            self.check_ancestry()?;
        }
        Ok(&self.connections)
    }

    /// `damage`, met reading this range's file, said to be in the ancestor's file when the
    /// range is inherited: `verify` of a fork named the fork's own file (which held no
    /// event) for a row damaged in its parent's (outside testing T6, session 45).
    fn damage_here(&self, damage: Error) -> Error {
        if !self.inherited {
            return damage;
        }
        damage.corrupt_in(|| {
            format!(
                "session {} inherits sequences {}..={} from {} ({})",
                self.heir,
                self.after + 1,
                self.through,
                self.source,
                self.file.display()
            )
        })
    }

    /// Checks that the file of an inherited range records `heir` in its `dependents`
    /// through at least the range's end (a fork writes that row before it is published).
    /// A session made again under a deleted ancestor's id (or brought in from another
    /// root), or an ancestor put back from a copy older than the fork, fails. (Creation
    /// times are not compared: an imported ancestor keeps the clock of the host that made
    /// it.)
    ///
    /// The file is first checked as a file opened by its own name is
    /// ([`schema::check_format`]): a version newer than this build's, or objects that are
    /// not ours, are refused for its forks too (they were read through them, and `verify`
    /// of a fork called it sound).
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the ancestor; [`Error::UnsupportedVersion`] for an
    /// ancestor newer than this build; the pool's and SQLite's errors.
    fn check_ancestry(&self) -> Result<()> {
        let conn = self.connections.get()?;
        schema::check_format(&conn).map_err(|e| self.unreadable_ancestor(e))?;
        let recorded = read::dependent_through(&conn, &self.heir)?;
        if recorded.is_some_and(|through| through >= self.through) {
            let _ = self.ancestry_checked.set(());
            return Ok(());
        }
        Err(Error::corrupt(format!(
            "session {} inherits sequences {}..={} from {}, which does not record it as a \
             dependent (another session under that id, or a copy older than the fork): it \
             is not the session this one was forked from, and deleting it would not keep \
             this history",
            self.heir,
            self.after + 1,
            self.through,
            self.source
        )))
    }

    /// `refused`, the ancestor's file refused by [`schema::check_format`], said of the
    /// session that inherits from it.
    fn unreadable_ancestor(&self, refused: Error) -> Error {
        let context = format!("session {} inherits from {}", self.heir, self.source);
        match refused {
            Error::UnsupportedVersion { what, source } => Error::UnsupportedVersion {
                what: format!("{context}: {what}"),
                source,
            },
            other => Error::corrupt_from(format!("{context}, which cannot be read"), other),
        }
    }
}

/// A history entry's message: inline, or where to read it.
#[derive(Clone, Debug)]
pub(crate) enum HistoryBody {
    /// The message.
    Inline(Arc<Message>),
    /// The event payload holding it.
    Content(ContentRef),
}

#[derive(serde::Deserialize)]
struct MessageOf {
    message: Message,
}

#[derive(serde::Deserialize)]
struct MessagesOf {
    messages: Vec<Message>,
}

/// A message's place in the transcript (see [`SessionReader::transcript_entry`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TranscriptEntry {
    /// 1-based position.
    pub position: u64,
    /// The message id.
    pub message_id: String,
    /// The event that put the message there (a `message/*` event or a `history/replace`).
    pub event_seq: u64,
}

impl TranscriptEntry {
    fn of(row: HistoryRow) -> TranscriptEntry {
        TranscriptEntry {
            position: row.position,
            message_id: row.message_id,
            event_seq: row.event_seq,
        }
    }
}

/// A message event's payload, its message kept as JSON text.
#[derive(serde::Deserialize)]
struct MessageTextOf<'a> {
    #[serde(borrow)]
    message: &'a serde_json::value::RawValue,
}

/// A replacement's payload, its messages kept as JSON text.
#[derive(serde::Deserialize)]
struct MessageTextsOf {
    messages: Vec<Box<serde_json::value::RawValue>>,
}

/// A message of the transcript as stored, unparsed (see
/// [`SessionReader::transcript_texts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageText {
    /// The payload of the `message/complete` or `message/upsert` event that recorded it,
    /// as JSON text `{"message": <the message>}`: the message is its `message` member.
    Payload(String),
    /// The message's own JSON text (an item of a `history/replace`).
    Message(String),
}

impl MessageText {
    /// The message's JSON text, verbatim (found in a payload with one parsing pass).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a payload without a `message` member.
    pub fn message(&self) -> Result<&str> {
        match self {
            MessageText::Message(text) => Ok(text),
            MessageText::Payload(text) => serde_json::from_str::<MessageTextOf<'_>>(text)
                .map(|of| of.message.get())
                .map_err(|e| Error::corrupt_from("message payload", e)),
        }
    }
}

#[derive(serde::Deserialize)]
struct TitleOf {
    title: String,
}

/// What a session's own file holds after some sequence, for the search index (see
/// [`SessionReader::own_changes`]).
#[derive(Debug, Default)]
pub(crate) struct OwnChanges {
    /// The last sequence read (the file's last commit, or the `after` asked for).
    pub through: u64,
    /// History rows in `(event_seq, position)` order, each with its message and the
    /// time (ms) of its commit.
    pub rows: Vec<(HistoryRow, Arc<Message>, i64)>,
    /// Transcript resets, in order.
    pub resets: Vec<u64>,
    /// `session/title` events: sequence, title, time (ms).
    pub titles: Vec<(u64, String, i64)>,
    /// The first damaged event read ([`Error::Corrupt`]), left out of the rows and titles.
    pub damage: Option<Error>,
}

impl OwnChanges {
    /// What one event's read gave: a damaged event ([`Error::Corrupt`]) is `None`, left
    /// out, and the first such error kept in [`OwnChanges::damage`]; any other error is
    /// the caller's.
    fn unless_damaged<T>(&mut self, read: Result<Option<T>>) -> Result<Option<T>> {
        match read {
            Err(e) if e.is_corrupt() => {
                self.damage.get_or_insert(e);
                Ok(None)
            }
            other => other,
        }
    }
}

/// Reads the messages of events by sequence across a layout, keeping one connection per
/// file it reads (a checkpoint's workset is one event read per message).
struct EventMessages {
    layout: Layout,
    /// Per segment, its connection once used, inside one read transaction: an open reads
    /// each workset message on its own (2,000 reads for 100,000 events of 100-event
    /// turns), and each read outside a transaction took and dropped the WAL read lock.
    conns: Vec<Option<ReadTxn>>,
}

impl EventMessages {
    fn new(layout: Layout) -> EventMessages {
        let conns = layout.segments.iter().map(|_| None).collect();
        EventMessages { layout, conns }
    }

    /// The messages of event `seq`: its `message`, or its `messages` array when `many`.
    fn read(&mut self, seq: u64, many: bool) -> Result<Vec<Arc<Message>>> {
        let i = self
            .layout
            .holding(seq)
            .ok_or_else(|| Error::corrupt(format!("event {seq} is in no file")))?;
        let conn = match &mut self.conns[i] {
            Some(conn) => conn,
            slot => slot.insert(ReadTxn::begin(self.layout.segments[i].pool()?)?),
        };
        parse_messages(seq, &read::read_payload_text(conn, seq)?, many)
    }
}

/// The messages of the payload `text` of event `seq`: its `message`, or its `messages`
/// array when `many`.
fn parse_messages(seq: u64, text: &str, many: bool) -> Result<Vec<Arc<Message>>> {
    let bad = |e: serde_json::Error| Error::corrupt_from(format!("event {seq}"), e);
    Ok(if many {
        serde_json::from_str::<MessagesOf>(text)
            .map_err(bad)?
            .messages
            .into_iter()
            .map(Arc::new)
            .collect()
    } else {
        vec![Arc::new(
            serde_json::from_str::<MessageOf>(text)
                .map_err(bad)?
                .message,
        )]
    })
}

/// The messages that events put at transcript positions of a session file's own history,
/// for `wanted` `(position, event seq)` pairs, in order: each `None` when that row is gone
/// or (with `current`) no longer current (a newer version or a reset came after it). Read on `conn`, a
/// connection to that file alone (no lineage): for search hits, which name the file that
/// holds them. Content parts are spliced back as every read does.
///
/// # Errors
/// Read errors.
pub(crate) fn own_messages_at(
    conn: &Connection,
    wanted: &[(u64, u64)],
    current: bool,
) -> Result<Vec<Option<Arc<Message>>>> {
    let mut out = Vec::with_capacity(wanted.len());
    for (position, seq) in wanted {
        let Some(item) = read::current_history_item(conn, *position, *seq, current)? else {
            out.push(None);
            continue;
        };
        let text = read::read_payload_text(conn, *seq)?;
        let messages = parse_messages(*seq, &text, item.is_some())?;
        out.push(
            usize::try_from(item.unwrap_or(0))
                .ok()
                .and_then(|i| messages.get(i))
                .cloned(),
        );
    }
    Ok(out)
}

/// Where each range of a session's sequences is read from.
#[derive(Clone, Debug)]
struct Layout {
    lineage: Vec<LineageEntry>,
    /// Ranges in sequence order covering `(0, u64::MAX]`.
    segments: Vec<Segment>,
}

impl Layout {
    /// The index of the segment whose range holds sequence `seq` (none for 0).
    fn holding(&self, seq: u64) -> Option<usize> {
        self.segments
            .iter()
            .position(|s| s.after < seq && seq <= s.through)
    }
}

/// A read-only view of a session's durable prefix (its own file plus its ancestors').
///
/// Sees only committed transactions: a live writer's accepted-but-undrained commits are
/// invisible here. Inherited commits are presented with the operation id
/// `inherit:<ancestor>:<commit id>`, so an ancestor's idempotency keys never collide
/// with the session's own. When an ancestor is deleted (its range materialised into
/// this file), the reader notices and re-reads its lineage.
#[derive(Clone, Debug)]
pub struct SessionReader {
    header: Header,
    file: PathBuf,
    root: PathBuf,
    own: ReadPool,
    layout: Arc<RwLock<Layout>>,
}

fn build_layout(
    header: &Header,
    own: &ReadPool,
    root: &Path,
    lineage: Vec<LineageEntry>,
) -> Result<Layout> {
    let own_segment = |after: u64, through: u64| Segment {
        source: header.session_id.clone(),
        after,
        through,
        inherited: false,
        heir: header.session_id.clone(),
        ancestry_checked: Arc::default(),
        file: PathBuf::new(),
        connections: own.clone(),
    };
    let mut segments = Vec::with_capacity(2 * lineage.len() + 1);
    let mut covered = 0;
    for entry in &lineage {
        if entry.after_seq < covered {
            return Err(Error::corrupt("lineage ranges overlap"));
        }
        // Its own file is not where a range it inherits comes from: such a session read
        // as an empty one (`history` exit 0, "no messages"; outside testing H3).
        if entry.ancestor_id == header.session_id {
            return Err(Error::corrupt(format!(
                "session {} names itself in its lineage (sequences {}..={})",
                header.session_id,
                entry.after_seq + 1,
                entry.through_seq
            )));
        }
        if entry.after_seq > covered {
            segments.push(own_segment(covered, entry.after_seq));
        }
        let ancestor_dir = root.join(entry.ancestor_id.as_str());
        let ancestor = ancestor_dir.join(SESSION_FILE);
        // A symlink there is refused now, not by SQLite at the first read.
        let pool = match schema::check_session_dir(&ancestor_dir) {
            Err(Error::InvalidInput { what, source }) => Err(Error::InvalidInput {
                what: format!(
                    "session {} inherits from {}: {what}",
                    header.session_id, entry.ancestor_id
                ),
                source,
            }),
            checked => checked
                .and_then(|()| ReadPool::new(&ancestor, Access::for_root_file(&ancestor)))
                .map_err(|e| {
                    Error::corrupt_from(
                        format!(
                            "session {} inherits from {}, which cannot be read",
                            header.session_id, entry.ancestor_id
                        ),
                        e,
                    )
                }),
        }?;
        segments.push(Segment {
            source: entry.ancestor_id.clone(),
            after: entry.after_seq,
            through: entry.through_seq,
            inherited: true,
            heir: header.session_id.clone(),
            ancestry_checked: Arc::default(),
            file: ancestor,
            connections: pool,
        });
        covered = entry.through_seq;
    }
    segments.push(own_segment(covered, u64::MAX));
    Ok(Layout { lineage, segments })
}

fn gap(expected: u64, found: u64) -> Error {
    Error::corrupt(format!(
        "sequence gap: expected {expected}, found a commit at {found}"
    ))
}

/// Refuses a turn index row (`turn`) that the commit holding its end (`c`, read whole)
/// contradicts: no `turn/end` at its `end_sequence`, or one with another status.
fn check_turn_end(c: &Commit, turn: &TurnBoundary) -> Result<()> {
    let status = c
        .events
        .iter()
        .find(|e| e.seq == turn.end_sequence && e.kind == kind::TURN_END)
        .and_then(|e| e.payload_str())
        .and_then(|p| serde_json::from_str::<crate::model::payload::TurnEndPayload>(p).ok())
        .map(|p| p.status);
    if status.as_deref() == Some(turn.status.as_str()) {
        return Ok(());
    }
    Err(Error::corrupt(format!(
        "turn index: turn {} is stored as ending at {} with status {}, which the log does \
         not hold (its commit {}..={} has {})",
        crate::error::quoted(&turn.turn_id),
        turn.end_sequence,
        crate::error::quoted(&turn.status),
        c.first_seq,
        c.last_seq(),
        status.map_or_else(
            || format!("no turn/end at {}", turn.end_sequence),
            |s| format!("a turn/end of status {}", crate::error::quoted(&s))
        )
    )))
}

/// Checks that `c` starts at `expected` and that its events match its operation hash;
/// returns its last sequence.
pub(crate) fn check_commit(expected: u64, c: &Commit) -> Result<u64> {
    if c.first_seq != expected {
        return Err(gap(expected, c.first_seq));
    }
    if rehash_commit(c) != c.operation_hash {
        return Err(Error::corrupt(format!(
            "commit at {}: events do not match operation hash of {}",
            c.first_seq,
            crate::error::quoted(&c.operation_id)
        )));
    }
    Ok(c.last_seq())
}

impl SessionReader {
    /// Opens the session file in the session folder `dir` (ancestors are its siblings).
    pub(crate) fn open(dir: &Path) -> Result<SessionReader> {
        let file = dir.join(SESSION_FILE);
        let access = Access::for_root_file(&file);
        Self::open_file(&file, dir.parent().unwrap_or(dir), access)
    }

    /// Opens a session file with `access`, resolving ancestors as
    /// `<root>/<ancestor>/session.sqlite`.
    pub(crate) fn open_file(file: &Path, root: &Path, access: Access) -> Result<SessionReader> {
        let own = ReadPool::new(file, access)?;
        let conn = own.get()?;
        schema::check_format(&conn)?;
        let header = read::read_header(&conn)?;
        let lineage = read::read_lineage(&conn)?;
        drop(conn);
        let layout = build_layout(&header, &own, root, lineage)?;
        Ok(SessionReader {
            header,
            file: file.to_path_buf(),
            root: root.to_path_buf(),
            own,
            layout: Arc::new(RwLock::new(layout)),
        })
    }

    fn layout(&self) -> Layout {
        self.layout
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads the lineage; true when it changed (an ancestor was materialised).
    fn reload_layout(&self) -> Result<bool> {
        let lineage = read::read_lineage(&*self.own.get()?)?;
        if lineage == self.layout().lineage {
            return Ok(false);
        }
        let fresh = build_layout(&self.header, &self.own, &self.root, lineage)?;
        *self.layout.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(true)
    }

    /// The header row.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The session file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The ancestors this session inherits from and the ranges they supply.
    pub fn lineage(&self) -> Vec<LineageEntry> {
        self.layout().lineage
    }

    fn own(&self) -> Result<PooledConnection> {
        self.own.get()
    }

    /// Events inherited from the parent when this session was forked (0 for a root).
    pub fn inherited_events(&self) -> u64 {
        self.header.inherited_events
    }

    /// The last durable sequence.
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn durable_sequence(&self) -> Result<u64> {
        let inherited = self.layout().lineage.last().map_or(0, |e| e.through_seq);
        Ok(read::last_own_seq(&*self.own()?)?
            .unwrap_or(0)
            .max(inherited))
    }

    /// When the session was last updated, as of its durable sequence `durable`: the time
    /// of the commit holding `durable` in its own file (its last own commit), or its
    /// creation time when that is later (a fork or rewind that committed nothing of its
    /// own, whose file holds at most its ancestors' commits copied in by a delete). Forks,
    /// reads, verifies and exports change no commit, so they do not move it (ms since the
    /// Unix epoch).
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub(crate) fn updated_at_ms(&self, durable: u64) -> Result<i64> {
        Ok(read::commit_time(&*self.own()?, durable)?.max(self.header().created_at_ms))
    }

    /// The latest time of any commit in this session's own file (0 for none), which is
    /// later than [`SessionReader::updated_at_ms`]'s last commit when a writer's clock went
    /// back between them (ms since the Unix epoch).
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub(crate) fn newest_commit_ms(&self) -> Result<i64> {
        read::newest_commit_time(&*self.own()?)
    }

    /// The lease row: the last (or current) writer.
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn lease(&self) -> Result<WriterOwner> {
        read::read_lease(&*self.own()?)
    }

    /// Sessions that inherit from this one.
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn dependents(&self) -> Result<Vec<DependentFork>> {
        read::read_dependents(&*self.own()?)
    }

    /// Checks that every ancestor is the session this one was cut from (what each read
    /// of an inherited range checks once, [`Segment::check_ancestry`]), reading every
    /// ancestor now; a delete of an ancestor that fails would not keep this session's
    /// history either.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the ancestor; SQLite errors.
    pub(crate) fn check_ancestry(&self) -> Result<()> {
        self.layout()
            .segments
            .iter()
            .filter(|s| s.inherited)
            .try_for_each(Segment::check_ancestry)
    }

    /// Whole durable commits with `last_seq > after`, at most `limit`, checked as a
    /// stream is: each follows the one before without a gap (the first holds `after + 1`)
    /// and its events match its operation hash.
    ///
    /// A page also stops at the first commit boundary after 32 MiB of payload text (it
    /// holds at least one commit), so memory follows the page, not how often a large
    /// blob is referenced: a page shorter than `limit` is not the end of the log, ask
    /// again after its last sequence until [`SessionReader::durable_sequence`].
    ///
    /// # Errors
    /// [`Error::Corrupt`] for damaged rows or blobs, a gap or a hash mismatch; SQLite errors.
    pub fn commits(&self, after: u64, limit: usize) -> Result<Vec<Commit>> {
        let page = self.commits_through(after, u64::MAX, limit)?;
        let mut next = match page.first() {
            Some(first) if first.first_seq <= after + 1 => first.first_seq,
            Some(first) => return Err(gap(after + 1, first.first_seq)),
            None => return Ok(page),
        };
        for c in &page {
            next = check_commit(next, c)? + 1;
        }
        Ok(page)
    }

    /// Whole durable commits with `last_seq` in `(after, through]`, at most `limit` and
    /// about [`read::PAGE_BYTES`] of payload.
    fn commits_through(&self, after: u64, through: u64, limit: usize) -> Result<Vec<Commit>> {
        match self.read_segments(&self.layout(), after, through, limit) {
            // An ancestor may have been deleted after its range was copied here.
            Err(e) if self.reload_layout()? => {
                drop(e);
                self.read_segments(&self.layout(), after, through, limit)
            }
            other => other,
        }
    }

    fn read_segments(
        &self,
        layout: &Layout,
        after: u64,
        through: u64,
        limit: usize,
    ) -> Result<Vec<Commit>> {
        let mut out = Vec::new();
        let mut budget = read::PAGE_BYTES;
        for segment in &layout.segments {
            if out.len() >= limit || budget == 0 || segment.after >= through {
                break;
            }
            if segment.through <= after {
                continue;
            }
            // A deleted ancestor: fail fast (the pool would retry opening it).
            if segment.inherited && !segment.file.is_file() {
                return Err(Error::corrupt(format!(
                    "ancestor {} is missing",
                    segment.source
                )));
            }
            let conn = segment.pool()?.get()?;
            let from = after.max(segment.after);
            let wanted = limit - out.len();
            let page = read::read_commits(
                &conn,
                from,
                segment.through.min(through),
                wanted,
                &mut budget,
            )
            .map_err(|e| segment.damage_here(e))?;
            // An inherited range ends at a commit boundary of its ancestor: a whole page
            // that stops short of it means the ancestor holds less than the range (a copy
            // older than the fork, a lineage row naming this session itself). Handing out
            // the short page would report a durable sequence no page ever reaches.
            let reached = page.last().map_or(from, Commit::last_seq);
            if segment.inherited
                && segment.through <= through
                && page.len() < wanted
                && budget > 0
                && reached < segment.through
            {
                return Err(Error::corrupt(format!(
                    "session {} inherits sequences {}..={} from {}, whose log ends at {reached}: \
                     an ancestor holds less than its lineage range",
                    self.header.session_id,
                    segment.after + 1,
                    segment.through,
                    segment.source
                )));
            }
            out.extend(page.into_iter().map(|mut c| {
                if segment.inherited {
                    c.operation_id = inherited_operation_id(segment.source.as_str(), &c);
                }
                c
            }));
        }
        Ok(out)
    }

    /// Every durable commit, in order.
    ///
    /// # Errors
    /// As [`SessionReader::commits`].
    pub fn all_commits(&self) -> Result<Vec<Commit>> {
        let mut all = Vec::new();
        self.visit(u64::MAX, |c| {
            all.push(c);
            Ok(())
        })?;
        Ok(all)
    }

    /// Streams the durable commits that end at or before `through`, in order, in pages.
    ///
    /// # Errors
    /// As [`SessionReader::commits`], or whatever `f` returns.
    pub fn visit(&self, through: u64, f: impl FnMut(Commit) -> Result<()>) -> Result<()> {
        self.visit_range(0, through, f)
    }

    /// Streams the durable commits with `last_seq` in `(after, through]`, in pages.
    /// Every commit is checked on the way: contiguous sequences from `after + 1` and an
    /// operation hash that matches its events, so a hole or an edited event is refused.
    fn visit_range(
        &self,
        mut after: u64,
        through: u64,
        mut f: impl FnMut(Commit) -> Result<()>,
    ) -> Result<()> {
        const PAGE: usize = 1000;
        loop {
            let page = self.commits_through(after, through, PAGE)?;
            if page.is_empty() {
                return Ok(());
            }
            for c in page {
                after = check_commit(after + 1, &c)?;
                f(c)?;
            }
        }
    }
    /// The newest usable projection checkpoint at or before sequence `through`: this
    /// file's, or an ancestor's taken within the range this session inherits (its prefix
    /// is the same), with its workset read from the events it names.
    fn best_checkpoint(&self, through: u64) -> Option<(u64, Projection)> {
        let mut best: Option<(u64, Projection, Vec<ModelRef>)> = None;
        for segment in self.layout().segments.iter().rev() {
            let found = segment
                .pool()
                .and_then(ReadPool::get)
                .ok()
                .and_then(|conn| read::read_checkpoint(&conn, segment.through.min(through)));
            if let Some((seq, p, refs)) = found
                && best.as_ref().is_none_or(|(b, _, _)| seq > *b)
            {
                best = Some((seq, p, refs));
            }
            if !segment.inherited {
                // The own file appears once per gap; one lookup is enough.
                if best.is_some() {
                    break;
                }
            }
        }
        let (seq, mut p, refs) = best?;
        let workset = self.read_model(&refs).ok()?;
        p.restore_model(workset, refs);
        Some((seq, p))
    }

    /// The model-workset messages `refs` name, read from their events.
    fn read_model(&self, refs: &[ModelRef]) -> Result<Vec<Arc<Message>>> {
        let mut out = Vec::with_capacity(refs.len());
        let mut source = EventMessages::new(self.layout());
        let mut event: Option<(u64, Vec<Arc<Message>>)> = None;
        for r in refs {
            let messages = match &event {
                Some((seq, messages)) if *seq == r.seq => messages,
                _ => {
                    let messages = source.read(r.seq, r.item.is_some())?;
                    &event.insert((r.seq, messages)).1
                }
            };
            let bad =
                || Error::corrupt(format!("checkpoint names a message event {} lacks", r.seq));
            let m = messages.get(r.item.unwrap_or(0) as usize).ok_or_else(bad)?;
            out.push(if r.provider_view {
                m.for_model().ok_or_else(bad)?
            } else {
                Arc::clone(m)
            });
        }
        Ok(out)
    }

    /// The projection of the durable prefix: from the newest checkpoint, folding only the
    /// commits after it.
    ///
    /// # Errors
    /// As [`SessionReader::commits`], or a fold error for an invalid stored payload.
    pub fn projection(&self) -> Result<Projection> {
        self.projection_at(u64::MAX)
    }

    /// The projection of the durable prefix through sequence `snapshot` (a durable
    /// sequence read before): what a read pairing it with other reads at that sequence
    /// (turns, counts) needs, as commits made meanwhile are left out.
    ///
    /// # Errors
    /// As [`SessionReader::projection`].
    pub fn projection_at(&self, snapshot: u64) -> Result<Projection> {
        Ok(self.projection_and_checkpoint(snapshot)?.1)
    }

    /// The projection through sequence `through` and the sequence of the checkpoint it
    /// started from (0 for none).
    pub(crate) fn projection_and_checkpoint(&self, through: u64) -> Result<(u64, Projection)> {
        if let Some(found) = self.checkpointed_projection(through) {
            return Ok(found);
        }
        // No checkpoint, or one the log does not continue: the log is the truth.
        let mut p = Projection::default();
        self.visit_range(0, through, |c| p.apply_commit(&c))?;
        Ok((0, p))
    }

    /// The projection through sequence `through` folded from the newest usable checkpoint
    /// and that checkpoint's sequence; `None` without one, or when the log does not
    /// continue it (a gap, a hash mismatch, a fold error).
    pub(crate) fn checkpointed_projection(&self, through: u64) -> Option<(u64, Projection)> {
        let (start, mut p) = self.best_checkpoint(through)?;
        self.visit_range(start, through, |c| p.apply_commit(&c))
            .ok()?;
        Some((start, p))
    }

    /// The sequence of this session's own checkpoint at or before `through` when one is
    /// stored but does not check out, so that every open ignores it (derived data: `verify`
    /// reports it as a note).
    pub(crate) fn ignored_checkpoint(&self, through: u64) -> Option<u64> {
        let layout = self.layout();
        let own = layout.segments.iter().rev().find(|s| !s.inherited)?;
        read::unusable_checkpoint(&*own.pool().ok()?.get().ok()?, through)
    }

    /// Every ended turn of the durable prefix, in order, from the turn index of each file.
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn turns(&self) -> Result<Vec<TurnBoundary>> {
        self.with_layout(|layout| {
            let mut out = Vec::new();
            for segment in &layout.segments {
                out.extend(read::read_turns_ending_in(
                    &*segment.pool()?.get()?,
                    segment.after,
                    segment.through.min(i64::MAX as u64),
                )?);
            }
            Ok(out)
        })
    }

    /// The ended turns of the durable prefix that overlap the sequences `first..=last`, in
    /// order: what a page of history (whose messages carry their event sequences) needs to
    /// show its turns. Costs a few index lookups per file, not a read of every turn.
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn turns_overlapping(&self, first: u64, last: u64) -> Result<Vec<TurnBoundary>> {
        let clip = |seq: u64| seq.min(i64::MAX as u64);
        self.with_layout(|layout| {
            let mut out = Vec::new();
            for segment in &layout.segments {
                out.extend(read::read_turns_overlapping(
                    &*segment.pool()?.get()?,
                    (segment.after, clip(segment.through)),
                    clip(first),
                    clip(last),
                )?);
            }
            Ok(out)
        })
    }

    /// The whole UI transcript as of durable sequence `snapshot`, oldest first, read from
    /// the history index page by page (bodies over 64 KiB from their blobs). It costs a
    /// read of every message: for a view, prefer pages (`SessionQuery::history_page`).
    ///
    /// # Errors
    /// Read errors; [`Error::Corrupt`] for an index entry its event does not back.
    pub fn transcript(&self, snapshot: u64) -> Result<Vec<Arc<Message>>> {
        self.with_layout(|layout| self.transcript_in(layout, snapshot))
    }

    /// [`SessionReader::transcript`] on `layout`.
    fn transcript_in(&self, layout: &Layout, snapshot: u64) -> Result<Vec<Arc<Message>>> {
        const PAGE: usize = 1000;
        let mut out = Vec::new();
        let mut before = u64::MAX;
        let mut bodies = EventMessages::new(layout.clone());
        loop {
            let rows = self.history_rows_in(layout, snapshot, before, PAGE)?;
            let Some((last, _)) = rows.last() else { break };
            let oldest = last.position;
            for (row, body) in rows {
                out.push(match body {
                    HistoryBody::Inline(m) => m,
                    HistoryBody::Content(_) => {
                        let messages = bodies.read(row.event_seq, row.item.is_some())?;
                        messages
                            .get(row.item.unwrap_or(0) as usize)
                            .cloned()
                            .ok_or_else(|| {
                                Error::corrupt(format!(
                                    "history item of event {} is missing",
                                    row.event_seq
                                ))
                            })?
                    }
                });
            }
            if oldest <= 1 {
                break;
            }
            before = oldest;
        }
        out.reverse();
        Ok(out)
    }

    /// The newest `limit` messages of the UI transcript as of durable sequence `snapshot`,
    /// oldest first (all of them for `usize::MAX`), unparsed: each the JSON text of the
    /// event payload that holds it or its own (content parts spliced back, payloads over
    /// 64 KiB read from their blobs); [`MessageText::message`] is what
    /// [`SessionReader::transcript`] gives as [`Message::json`]. One read transaction and
    /// one statement per file for the history index and the message events' payloads (a
    /// replacement's payload is read once for all its items); the work follows `limit`,
    /// not the session. For hosts that turn the JSON into something else (another
    /// language's objects, a UI's) in one pass.
    ///
    /// # Errors
    /// Read errors; [`Error::Corrupt`] for an index entry its event does not back.
    pub fn transcript_texts(&self, snapshot: u64, limit: usize) -> Result<Vec<MessageText>> {
        self.transcript_texts_before(snapshot, u64::MAX, limit)
    }

    /// As [`SessionReader::transcript_texts`], for the messages at positions below `before`
    /// (1-based; positions run from 1 to [`SessionReader::transcript_len`] without a gap):
    /// a long transcript read in parts, all pinned to one `snapshot`.
    ///
    /// # Errors
    /// As [`SessionReader::transcript_texts`].
    pub fn transcript_texts_before(
        &self,
        snapshot: u64,
        before: u64,
        limit: usize,
    ) -> Result<Vec<MessageText>> {
        self.with_layout(|layout| self.read_texts(layout, snapshot, before, limit))
    }

    fn read_texts(
        &self,
        layout: &Layout,
        snapshot: u64,
        before: u64,
        limit: usize,
    ) -> Result<Vec<MessageText>> {
        let segments: Vec<&Segment> = layout
            .segments
            .iter()
            .filter(|s| s.after < snapshot)
            .collect();
        let txns = segments
            .iter()
            .map(|seg| seg.pool().and_then(ReadTxn::begin))
            .collect::<Result<Vec<_>>>()?;
        let mut epoch = 0;
        for (seg, conn) in segments.iter().zip(&txns) {
            if let Some(e) = read::read_history_epoch(conn, seg.after, seg.through.min(snapshot))? {
                epoch = epoch.max(e);
            }
        }
        // Every file's entries, newest position first and, for one position, newest event
        // first: the first entry of each position is the current one.
        let mut entries: Vec<(read::HistoryText, &ReadTxn)> = Vec::new();
        for (seg, conn) in segments.iter().zip(&txns) {
            if seg.through < epoch {
                continue;
            }
            let bounds = (seg.after, seg.through.min(snapshot));
            let texts = read::read_history_texts(conn, bounds, epoch, before, limit)?;
            entries.extend(texts.into_iter().map(|t| (t, conn)));
        }
        entries.sort_unstable_by(|(a, _), (b, _)| {
            (b.position, b.event_seq).cmp(&(a.position, a.event_seq))
        });
        entries.dedup_by_key(|(t, _)| t.position);
        entries.truncate(limit);
        // The checks of a history page (§4.2, step 5) that need no message parsed.
        let mut order = PageOrder::default();
        for (entry, _) in &entries {
            order.next(self, entry.position, entry.event_seq, entry.item)?;
            if let Some(kind) = entry.kind.as_deref()
                && !kind::puts_history(kind, entry.item.is_some())
            {
                return Err(
                    self.history_damage(entry.position, puts_no_message(entry.event_seq, kind))
                );
            }
        }
        order.finish(self, entries.len(), limit)?;
        if before == u64::MAX {
            let top = entries.first().map_or(0, |(t, _)| t.position);
            // On the own file's connection of this read when it holds one: a second one of
            // the same pool, asked for while this read holds one, waited out the pool's
            // timeout when as many threads as the pool has connections read at once (each
            // holding one and waiting for another; outside testing, session 36).
            match segments.iter().zip(&txns).find(|(s, _)| !s.inherited) {
                Some((_, own)) => self.check_top_on(own, layout, top)?,
                None => self.check_top(layout, top)?,
            }
        }
        let mut out = Vec::with_capacity(entries.len());
        // The positions of one `history/replace` are adjacent: its payload is read once.
        let mut replaced: Option<(u64, Vec<Box<serde_json::value::RawValue>>)> = None;
        for (entry, conn) in entries.into_iter().rev() {
            let seq = entry.event_seq;
            let bad = |e: serde_json::Error| Error::corrupt_from(format!("event {seq}"), e);
            let Some(i) = entry.item else {
                out.push(MessageText::Payload(match entry.payload {
                    Some(text) => text,
                    None => read::read_payload_text(conn, seq)?,
                }));
                continue;
            };
            let items = match &replaced {
                Some((at, items)) if *at == seq => items,
                _ => {
                    let text = read::read_payload_text(conn, seq)?;
                    let of: MessageTextsOf = serde_json::from_str(&text).map_err(bad)?;
                    &replaced.insert((seq, of.messages)).1
                }
            };
            let item = history_item(items, i, seq)?;
            out.push(MessageText::Message(item.get().to_owned()));
        }
        Ok(out)
    }

    /// The files holding sequences up to `snapshot`, each in a read transaction with the
    /// range it holds (clipped to `snapshot`), and the newest transcript reset among them
    /// (0 for none).
    fn history_files(layout: &Layout, snapshot: u64) -> Result<(Vec<FileRange>, u64)> {
        let files = layout
            .segments
            .iter()
            .filter(|s| s.after < snapshot)
            .map(|s| {
                Ok((
                    ReadTxn::begin(s.pool()?)?,
                    (s.after, s.through.min(snapshot)),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut epoch = 0;
        for (conn, (after, through)) in &files {
            if let Some(e) = read::read_history_epoch(conn, *after, *through)? {
                epoch = epoch.max(e);
            }
        }
        Ok((files, epoch))
    }

    /// Runs `f` on the layout, once more on a re-read one when it fails and the lineage
    /// changed (an ancestor deleted after its range was copied here).
    fn with_layout<T>(&self, f: impl Fn(&Layout) -> Result<T>) -> Result<T> {
        match f(&self.layout()) {
            Err(e) if self.reload_layout()? => {
                drop(e);
                f(&self.layout())
            }
            other => other,
        }
    }

    /// The number of messages in the UI transcript as of durable sequence `snapshot`,
    /// from the history index (no message is read).
    ///
    /// # Errors
    /// Read errors.
    pub fn transcript_len(&self, snapshot: u64) -> Result<u64> {
        self.with_layout(|layout| {
            let (files, epoch) = Self::history_files(layout, snapshot)?;
            let mut len = 0;
            for (conn, bounds) in files.iter().filter(|(_, (_, t))| *t >= epoch) {
                len = len.max(read::read_history_len(conn, *bounds, epoch)?.unwrap_or(0));
            }
            Ok(len)
        })
    }

    /// The message at 1-based `position` of the UI transcript as of durable sequence
    /// `snapshot` (`None` past its end), from the history index: a key lookup per file.
    ///
    /// # Errors
    /// Read errors.
    pub fn transcript_entry(
        &self,
        snapshot: u64,
        position: u64,
    ) -> Result<Option<TranscriptEntry>> {
        Ok(self
            .newest_history_row(snapshot, |conn, bounds, epoch| {
                read::read_history_at(conn, bounds, epoch, position)
            })?
            .map(TranscriptEntry::of))
    }

    /// The newest history row that `lookup` finds in any file of the lineage as of durable
    /// sequence `snapshot` (each file asked once, with its bounds and the transcript's epoch).
    fn newest_history_row(
        &self,
        snapshot: u64,
        lookup: impl Fn(&Connection, (u64, u64), u64) -> Result<Option<HistoryRow>>,
    ) -> Result<Option<HistoryRow>> {
        self.with_layout(|layout| {
            let (files, epoch) = Self::history_files(layout, snapshot)?;
            let mut newest: Option<HistoryRow> = None;
            for (conn, bounds) in files.iter().filter(|(_, (_, t))| *t >= epoch) {
                if let Some(row) = lookup(conn, *bounds, epoch)?
                    && newest.as_ref().is_none_or(|n| n.event_seq < row.event_seq)
                {
                    newest = Some(row);
                }
            }
            Ok(newest)
        })
    }

    /// Where the message `message_id` is in the UI transcript as of durable sequence
    /// `snapshot` (`None` when it is not there). Reads the history index through (it has
    /// no key on message ids), no message.
    ///
    /// # Errors
    /// Read errors.
    pub fn transcript_find(
        &self,
        snapshot: u64,
        message_id: &str,
    ) -> Result<Option<TranscriptEntry>> {
        let found = self.newest_history_row(snapshot, |conn, bounds, epoch| {
            read::read_history_of(conn, bounds, epoch, message_id)
        })?;
        // Still there only when no later entry took its position.
        let Some(row) = found else { return Ok(None) };
        Ok(self
            .transcript_entry(snapshot, row.position)?
            .filter(|now| now.event_seq == row.event_seq && now.message_id == row.message_id))
    }

    /// Whether the UI transcript as of durable sequence `earlier` is exactly the first
    /// `len` messages of the one as of `later` (`earlier <= later`): it holds `len`
    /// messages, and no event in `(earlier, later]` replaced the transcript or changed one
    /// of them. Told from the history index, without reading a message.
    ///
    /// # Errors
    /// Read errors.
    pub fn transcript_prefix_kept(&self, earlier: u64, later: u64, len: u64) -> Result<bool> {
        if earlier > later {
            return Ok(false);
        }
        // Positions run 1..=n without a gap: the transcript holds `len` messages when
        // `len` has one and `len + 1` has none.
        let holds = match len {
            0 => self.transcript_len(earlier)? == 0,
            _ => {
                self.transcript_entry(earlier, len)?.is_some()
                    && self.transcript_entry(earlier, len + 1)?.is_none()
            }
        };
        if !holds || !self.no_reset(earlier, later)? {
            return Ok(false);
        }
        self.none_in(earlier, later, |conn, bounds| {
            read::history_changed_through(conn, bounds, len)
        })
    }

    /// Whether no transcript reset happened in `(earlier, later]`.
    fn no_reset(&self, earlier: u64, later: u64) -> Result<bool> {
        self.none_in(earlier, later, |conn, (after, through)| {
            Ok(read::read_history_epoch(conn, after, through)?.is_some())
        })
    }

    /// Whether `found` is false in every file for its part of `(earlier, later]` (given
    /// that file's connection and the part's `(after, through]`).
    fn none_in(
        &self,
        earlier: u64,
        later: u64,
        found: impl Fn(&Connection, (u64, u64)) -> Result<bool>,
    ) -> Result<bool> {
        self.with_layout(|layout| {
            for seg in layout
                .segments
                .iter()
                .filter(|s| s.after < later && s.through > earlier)
            {
                let conn = seg.pool()?.get()?;
                if found(&conn, (seg.after.max(earlier), seg.through.min(later)))? {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// The ended turn whose events hold sequence `seq` (its `turn/start` at or before
    /// `seq`, its `turn/end` at or after it), if any.
    ///
    /// # Errors
    /// Read errors.
    pub fn turn_holding(&self, seq: u64) -> Result<Option<TurnBoundary>> {
        self.with_layout(|layout| {
            let Some(seg) = layout.holding(seq).map(|i| &layout.segments[i]) else {
                return Ok(None);
            };
            Ok(
                read::read_turn_started_by(&*seg.pool()?.get()?, seq)?.filter(|t| {
                    t.start_sequence > seg.after
                        && t.end_sequence >= seq
                        && t.end_sequence <= seg.through
                }),
            )
        })
    }

    /// The raw bytes of a blob referenced by this session (searching its ancestors too).
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the stored bytes do not match the digest.
    pub fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        self.with_layout(|layout| {
            for segment in layout.segments.iter().rev() {
                if let Some(bytes) = read::read_blob(&*segment.pool()?.get()?, digest, Holds::Any)?
                {
                    return Ok(Some(bytes));
                }
            }
            Ok(None)
        })
    }

    /// The ended turn `turn_id`, looked up in the turn index of every file.
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn turn(&self, turn_id: &str) -> Result<Option<TurnBoundary>> {
        self.with_layout(|layout| {
            let mut found: Option<TurnBoundary> = None;
            for segment in &layout.segments {
                if let Some(t) = read::read_turn(&*segment.pool()?.get()?, turn_id)?
                    && t.end_sequence > segment.after
                    && t.end_sequence <= segment.through
                    && found
                        .as_ref()
                        .is_none_or(|f| t.start_sequence < f.start_sequence)
                {
                    found = Some(t);
                }
            }
            Ok(found)
        })
    }

    /// Whether some commit ends exactly at `seq` (0 always counts).
    ///
    /// # Errors
    /// SQLite errors mapped to [`Error`].
    pub fn is_commit_boundary(&self, seq: u64) -> Result<bool> {
        if seq == 0 {
            return Ok(true);
        }
        self.with_layout(|layout| {
            let Some(segment) = layout.holding(seq).map(|i| &layout.segments[i]) else {
                return Ok(false);
            };
            read::commit_ends_at(&*segment.pool()?.get()?, seq)
        })
    }

    /// Checks what a fork cut at `cut` needs of this session, in time that does not grow
    /// with its length: every file holding part of `(0, cut]` is there, and the commit
    /// that ends at `cut` reads whole (its row hash) and its events match its operation
    /// hash; for a fork after turn `ended` (its turn index row, which chose the cut), that
    /// commit holds the turn's `turn/end` at its `end_sequence` with its status. Damage
    /// elsewhere in the range is left to `verify` and to the reads of the log, the child's
    /// as the parent's: checking every commit row and event row of the prefix made a fork
    /// of 200,000 events take 80-90 ms instead of 10.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming this session (and the file, for a missing one); SQLite
    /// errors.
    pub(crate) fn check_prefix(&self, cut: u64, ended: Option<&TurnBoundary>) -> Result<()> {
        let me = &self.header.session_id;
        // A lineage that changed meanwhile (an ancestor deleted after its range was copied
        // here) is read again.
        self.with_layout(|layout| {
            match layout
                .segments
                .iter()
                .find(|s| s.after < cut && s.inherited && !s.file.is_file())
            {
                Some(s) => Err(Error::corrupt(format!(
                    "session {me} cannot be forked at sequence {cut}: sequences {}..={} \
                     held by {}: the file is missing",
                    s.after + 1,
                    s.through.min(cut),
                    s.source
                ))),
                None => Ok(()),
            }
        })?;
        if cut == 0 {
            return Ok(());
        }
        let checked = self
            .commits_through(cut - 1, cut, 1)
            .and_then(|last| match last.first() {
                Some(c) if c.last_seq() == cut => {
                    check_commit(c.first_seq, c)?;
                    ended.map_or(Ok(()), |turn| check_turn_end(c, turn))
                }
                _ => Err(Error::corrupt(format!("no commit ends at {cut}"))),
            });
        checked.map_err(|e| {
            e.corrupt_in(|| format!("session {me} cannot be forked at sequence {cut}"))
        })
    }

    /// The lineage a fork cut at `cut` inherits: every range of `(0, cut]`, clipped,
    /// naming the file that holds it (this session's own ranges name this session).
    pub(crate) fn prefix_lineage(&self, cut: u64) -> Vec<LineageEntry> {
        let mut out: Vec<LineageEntry> = Vec::new();
        for s in self.layout().segments.iter().filter(|s| s.after < cut) {
            let through = s.through.min(cut);
            match out.last_mut() {
                Some(last) if last.ancestor_id == s.source && last.through_seq == s.after => {
                    last.through_seq = through;
                }
                _ => out.push(LineageEntry {
                    ancestor_id: s.source.clone(),
                    after_seq: s.after,
                    through_seq: through,
                }),
            }
        }
        out
    }

    /// The history index at `snapshot`: the newest `limit` transcript positions below
    /// `before`, newest first, with their messages (or, over 64 KiB, the content ref of
    /// the event payload that holds them). O(page): no fold.
    pub(crate) fn history_rows(
        &self,
        snapshot: u64,
        before: u64,
        limit: usize,
    ) -> Result<Vec<(HistoryRow, HistoryBody)>> {
        self.with_layout(|layout| self.history_rows_in(layout, snapshot, before, limit))
    }

    /// [`SessionReader::history_rows`] on `layout`.
    fn history_rows_in(
        &self,
        layout: &Layout,
        snapshot: u64,
        before: u64,
        limit: usize,
    ) -> Result<Vec<(HistoryRow, HistoryBody)>> {
        let segments: Vec<&Segment> = layout
            .segments
            .iter()
            .filter(|s| s.after < snapshot)
            .collect();
        let mut epoch = 0;
        for seg in &segments {
            let conn = seg.pool()?.get()?;
            if let Some(e) = read::read_history_epoch(&conn, seg.after, seg.through.min(snapshot))?
            {
                epoch = epoch.max(e);
            }
        }
        let mut newest: std::collections::BTreeMap<u64, (HistoryRow, &Segment)> =
            Default::default();
        for seg in segments.iter().filter(|s| s.through >= epoch) {
            let conn = seg.pool()?.get()?;
            let bounds = (seg.after, seg.through.min(snapshot));
            for row in read::read_history_rows(&conn, bounds, epoch, before, limit)? {
                match newest.get(&row.position) {
                    Some((kept, _)) if kept.event_seq >= row.event_seq => {}
                    _ => {
                        newest.insert(row.position, (row, seg));
                    }
                }
            }
        }
        let mut out: Vec<(HistoryRow, HistoryBody)> = Vec::with_capacity(limit);
        // The positions of one `history/replace` are adjacent: its payload is read once.
        let mut replaced: Option<(u64, Vec<Arc<Message>>)> = None;
        let mut order = PageOrder::default();
        for (row, seg) in newest.into_values().rev().take(limit) {
            let position = row.position;
            order.next(self, position, row.event_seq, row.item)?;
            let body = self.history_body(&row, seg, &mut replaced).map_err(|e| {
                seg.damage_here(e)
                    .corrupt_in(|| self.history_place(position))
            })?;
            out.push((row, body));
        }
        order.finish(self, out.len(), limit)?;
        if before == u64::MAX {
            self.check_top(layout, out.first().map_or(0, |(row, _)| row.position))?;
        }
        Ok(out)
    }

    /// The newest page's last check: no row of this session's own file above its top
    /// position names an event past the file's last commit (that message would be missing
    /// from every page, without a word).
    fn check_top(&self, layout: &Layout, top: u64) -> Result<()> {
        self.check_top_on(&*self.own()?, layout, top)
    }

    /// [`SessionReader::check_top`] on `own`, a connection to this session's own file.
    fn check_top_on(&self, own: &Connection, layout: &Layout, top: u64) -> Result<()> {
        let own_after = layout.segments.last().map_or(0, |s| s.after);
        match read::history_row_beyond_log(own, top, own_after)? {
            Some((position, seq)) => Err(self.history_damage(
                position,
                format!("names event {seq}, past the end of the log"),
            )),
            None => Ok(()),
        }
    }

    /// Where a damaged history row is: this session and the transcript position.
    fn history_place(&self, position: u64) -> String {
        format!(
            "session {}, history position {position}",
            self.header.session_id
        )
    }

    /// [`Error::Corrupt`]: the history row at `position` `what` (it is missing, it names
    /// an event that holds no message).
    fn history_damage(&self, position: u64, what: String) -> Error {
        Error::corrupt(format!(
            "{}: the index row {what}",
            self.history_place(position)
        ))
    }

    /// The whole history index through `through`: every row and reset, each read from the
    /// file that holds its range (for `verify`); `None` when a file predates the index.
    pub(crate) fn history_index(
        &self,
        through: u64,
    ) -> Result<Option<(Vec<HistoryRow>, Vec<u64>)>> {
        let (mut rows, mut resets) = (Vec::new(), Vec::new());
        for seg in self.layout().segments.iter().filter(|s| s.after < through) {
            let conn = seg.pool()?.get()?;
            match read::read_history_index(&conn, seg.after, seg.through.min(through))? {
                Some((r, s)) => {
                    rows.extend(r);
                    resets.extend(s);
                }
                None => return Ok(None),
            }
        }
        Ok(Some((rows, resets)))
    }

    /// The message of one history entry; `replaced` keeps the messages of the last bulk
    /// replacement read, keyed by its event sequence.
    fn history_body(
        &self,
        row: &HistoryRow,
        seg: &Segment,
        replaced: &mut Option<(u64, Vec<Arc<Message>>)>,
    ) -> Result<HistoryBody> {
        if let (Some(i), Some((seq, messages))) = (row.item, replaced.as_ref())
            && *seq == row.event_seq
        {
            return Self::replaced_item(messages, row, i);
        }
        let conn = seg.pool()?.get()?;
        let seq = row.event_seq;
        let (kind, text, reference) = read::read_event_payload(&conn, seq)?;
        // An edited row may name any event: only one that puts messages in the transcript
        // holds its message.
        if !kind::puts_history(&kind, row.item.is_some()) {
            return Err(Error::corrupt(format!(
                "the index row {}",
                puts_no_message(seq, &kind)
            )));
        }
        if row.bytes > INLINE_PAYLOAD_LIMIT as u64
            && let Some(digest) = reference
        {
            // A reference to a blob the file does not hold is damage, not an SQL error
            // ("Query returned no rows" before).
            let bytes: u64 = conn
                .prepare_cached("SELECT bytes FROM blobs WHERE digest = ?1")?
                .query_row([&digest], |r| r.get(0))
                .optional()?
                .ok_or_else(|| {
                    Error::corrupt(format!("event {seq} references missing blob {digest}"))
                })?;
            return Ok(HistoryBody::Content(ContentRef {
                digest,
                bytes,
                media_type: read::JSON_MEDIA_TYPE.to_owned(),
            }));
        }
        let text = read::payload_text(&conn, seq, text, reference)?;
        let messages = parse_messages(seq, &text, row.item.is_some())?;
        let (_, kept) = replaced.insert((seq, messages));
        Self::replaced_item(kept, row, row.item.unwrap_or(0))
    }

    /// Item `i` of the messages the event of `row` holds (0 for a message event), which
    /// must be the message the row names.
    fn replaced_item(messages: &[Arc<Message>], row: &HistoryRow, i: u64) -> Result<HistoryBody> {
        let message = history_item(messages, i, row.event_seq)?;
        if message.id() != row.message_id {
            return Err(Error::corrupt(format!(
                "the index row names message {} of event {}, which holds message {}",
                crate::error::quoted(&row.message_id),
                row.event_seq,
                crate::error::quoted(message.id())
            )));
        }
        Ok(HistoryBody::Inline(Arc::clone(message)))
    }

    /// What this session's own file adds to the search index after sequence `after`:
    /// its history rows (each with its message, content parts spliced back, and the time
    /// of its commit), transcript resets and titles, up to the file's last commit. A
    /// damaged event (its row not matching its check, a message that does not parse) is
    /// left out and the first one's error kept (`OwnChanges::damage`, which searches name):
    /// the session's other messages, and those its forks inherit, stay searchable. A
    /// search built after the damage found none of them.
    pub(crate) fn own_changes(&self, after: u64) -> Result<OwnChanges> {
        let conn = self.own()?;
        let through = read::last_own_seq(&conn)?.unwrap_or(0).max(after);
        let (rows, resets) = read::read_history_index(&conn, after, through)?.unwrap_or_default();
        let mut out = OwnChanges {
            through,
            resets,
            ..OwnChanges::default()
        };
        let mut event: Option<(u64, Vec<Arc<Message>>)> = None;
        for row in rows {
            let mut read = || -> Result<Option<(Arc<Message>, i64)>> {
                if event.as_ref().is_none_or(|(seq, _)| *seq != row.event_seq) {
                    let text = read::read_payload_text(&conn, row.event_seq)?;
                    event = Some((
                        row.event_seq,
                        parse_messages(row.event_seq, &text, row.item.is_some())?,
                    ));
                }
                let messages = event.as_ref().map_or(&[][..], |(_, m)| m.as_slice());
                let HistoryBody::Inline(message) =
                    Self::replaced_item(messages, &row, row.item.unwrap_or(0))?
                else {
                    return Ok(None);
                };
                Ok(Some((message, read::commit_time(&conn, row.event_seq)?)))
            };
            if let Some((message, time)) = out.unless_damaged(read())? {
                out.rows.push((row, message, time));
            }
        }
        for seq in read::events_of_kind(&conn, "session/title", after, through, false)? {
            let read = || -> Result<Option<(String, i64)>> {
                let text = read::read_payload_text(&conn, seq)?;
                let title = serde_json::from_str::<TitleOf>(&text)
                    .map_err(|e| Error::corrupt_from(format!("event {seq}"), e))?
                    .title;
                Ok(Some((title, read::commit_time(&conn, seq)?)))
            };
            if let Some((title, time)) = out.unless_damaged(read())? {
                out.titles.push((seq, title, time));
            }
        }
        Ok(out)
    }

    /// The token and cost totals of the `usage` events through `through`, inherited ones
    /// included: the projection's [`Projection::usage`] read from those events alone,
    /// with no other payload decoded.
    ///
    /// # Errors
    /// Read errors; [`Error::InvalidPayload`] as the fold's for a stored usage event it
    /// refuses.
    pub(crate) fn usage_through(&self, through: u64) -> Result<Usage> {
        self.with_layout(|layout| {
            let mut usage = Usage::default();
            for seg in layout.segments.iter().filter(|s| s.after < through) {
                let conn = seg.pool()?.get()?;
                let last = seg.through.min(through);
                for seq in read::events_of_kind(&conn, kind::USAGE, seg.after, last, true)? {
                    let text =
                        read::read_payload_text(&conn, seq).map_err(|e| seg.damage_here(e))?;
                    projection::fold_usage(&mut usage, &text)
                        .map_err(|e| seg.damage_here(e.corrupt_in(|| format!("event {seq}"))))?;
                }
            }
            Ok(usage)
        })
    }

    /// The title this session inherits: the newest `session/title` of the ranges it
    /// inherits ("" when none sets one).
    pub(crate) fn inherited_title(&self) -> Result<String> {
        self.with_layout(|layout| {
            for seg in layout.segments.iter().rev().filter(|s| s.inherited) {
                let conn = seg.pool()?.get()?;
                if let Some(seq) =
                    read::events_of_kind(&conn, "session/title", seg.after, seg.through, false)?
                        .last()
                {
                    let text = read::read_payload_text(&conn, *seq)?;
                    return serde_json::from_str::<TitleOf>(&text)
                        .map(|t| t.title)
                        .map_err(|e| Error::corrupt_from(format!("event {seq}"), e));
                }
            }
            Ok(String::new())
        })
    }

    /// One page of the operation keys of this session's own file (the commits
    /// [`SessionReader::lookup_operation`] can find): first sequence and key of at most
    /// `limit` commits after `after_seq`.
    pub(crate) fn operation_keys_after(
        &self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<(u64, i64)>> {
        read::operation_keys_after(&*self.own()?, after_seq, limit)
    }

    /// The operation filter (`session::ops`) stored with this session's own file's
    /// checkpoint if that checkpoint is the one as of `through_seq` (schema 4); `None`
    /// when there is none, it is longer than `max_bytes` or it does not check out.
    pub(crate) fn operation_filter(&self, through_seq: u64, max_bytes: usize) -> Option<Vec<u8>> {
        read::read_operation_filter(&*self.own().ok()?, through_seq, max_bytes)
    }

    /// The durable commit that recorded `operation_id` (trimmed, as an append takes it) in
    /// this session's own file, if there is one: what a retry of that operation would
    /// answer. A host that lost an append's answer (its process died, a call timed out)
    /// asks here whether the batch became durable, without taking the writer. A fork's
    /// inherited commits are its ancestors' (their operations are looked up there).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a damaged commit or key chunk, SQLite's errors.
    pub fn operation(&self, operation_id: &str) -> Result<Option<Commit>> {
        self.lookup_operation(
            crate::model::event::trim_name(operation_id),
            &mut ChunkCache::default(),
        )
    }

    /// The commit that recorded `operation_id` in this session's own file; `chunks` keeps
    /// the operation-key chunks read (schema 6) for the next lookup of the same file.
    pub(crate) fn lookup_operation(
        &self,
        operation_id: &str,
        chunks: &mut ChunkCache,
    ) -> Result<Option<Commit>> {
        read::lookup_operation(&*self.own()?, operation_id, chunks)
    }
}
