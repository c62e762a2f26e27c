//! Forks and rewinds at turn boundaries, without copying: the child records lineage
//! rows naming the files that hold its inherited prefix.

use serde_json::json;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::model::header::{Header, Origin};
use crate::model::ids::now_ms;
use crate::model::{SessionId, TurnBoundary};
use crate::persistence::{Root, session_file_gone};
use crate::session::live::Session;
use crate::store::lineage::{empty_wal, record_dependent, write_lineage};
use crate::store::lock::{DEPENDENTS_LOCK_FILE, DependentsLock, RecordWait, WriterLock};
use crate::store::reader::SessionReader;
use crate::store::schema::{CODEC, SESSION_FILE};
use crate::store::write;

/// How long a fork waits for a delete of a session it would read from: a delete copying
/// a large session into its forks, or one stopped, made a fork (and a rewind) wait
/// without limit and without a word (outside testing T2, session 41).
const DELETE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How many times a fork is made when an ancestor's delete changed its lineage each time.
const FORK_ATTEMPTS: usize = 5;

/// Where a fork or rewind cuts its parent.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForkPoint {
    /// Keep everything up to the end of the commit that closed this turn.
    AfterTurn(String),
    /// Keep everything strictly before this turn's `turn/start`.
    BeforeTurn(String),
}

/// The turn `turn_id` of `parent` when it is the open turn of its durable log (started,
/// not ended): its start, for a rewind before it (the prefix before an open turn is
/// whole). No turn row records an open turn, so a rewind before it said "completed turn
/// not found" of a turn the caller could see running.
///
/// # Errors
/// [`Error::ForkActiveAuthority`] for a fork after the open turn (it has no end to cut
/// after); [`Error::InvalidInput`] when no turn of that id is in the durable log.
fn open_turn(
    reader: &SessionReader,
    parent: &SessionId,
    turn_id: &str,
    point: &ForkPoint,
) -> Result<TurnBoundary> {
    let projection = reader.projection()?;
    let open = projection.current_turn_start != 0 && projection.turn_id.as_deref() == Some(turn_id);
    match point {
        ForkPoint::BeforeTurn(_) if open => Ok(TurnBoundary {
            turn_id: turn_id.to_owned(),
            start_sequence: projection.current_turn_start,
            end_sequence: 0,
            boundary_sequence: 0,
            status: projection.turn_status,
            fork_safe: false,
            rewind_safe: projection.current_turn_rewind_safe,
        }),
        ForkPoint::AfterTurn(_) if open => Err(Error::ForkActiveAuthority(format!(
            "turn {} of {parent} is still open (started at seq {}, not ended): a fork after \
             a turn needs its turn/end; rewind before it, or fork after an ended turn",
            crate::error::quoted(turn_id),
            projection.current_turn_start
        ))),
        ForkPoint::AfterTurn(_) => Err(Error::invalid(format!(
            "ended turn {} not found in the durable log of {parent} (a turn its writer \
             accepted is there once flushed)",
            crate::error::quoted(turn_id)
        ))),
        ForkPoint::BeforeTurn(_) => Err(Error::invalid(format!(
            "turn {} not found in the durable log of {parent}, ended or open (a turn its \
             writer accepted is there once flushed)",
            crate::error::quoted(turn_id)
        ))),
    }
}

impl Root {
    /// Creates a child session that inherits the parent's durable prefix up to `point`,
    /// without copying events or blobs. Returns the child's id (the child is not opened).
    ///
    /// The parent may be cold or live; a live parent should be flushed first (only its
    /// durable prefix is seen). Before the child is published, every file that supplies
    /// its prefix records it in its `dependents` table.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an unknown turn; [`Error::ForkBoundaryNotAtomic`] when the
    /// cut is not a commit boundary; [`Error::ForkActiveAuthority`] when the prefix leaves a
    /// turn open or an interaction pending; [`Error::SessionExists`] for a taken child id
    /// ([`Error::InTheWay`] when no session takes it);
    /// [`Error::SessionNotFound`] for a parent that is not there, also one deleted while
    /// the fork is made (then nothing is published); [`Error::WriterOwned`] naming a
    /// session the child would read from and the holder of its writer lock when a delete
    /// of it has not finished within 2 s (it waited for the delete without limit, and
    /// said nothing); [`Error::Corrupt`] naming the parent
    /// when a file holding part of the range the child would inherit is missing, or the
    /// commit it cuts at does not check out (its row hash, its events against its
    /// operation hash): nothing is written.
    pub fn fork(
        &self,
        parent: &SessionId,
        point: ForkPoint,
        child: Option<SessionId>,
    ) -> Result<SessionId> {
        self.fork_locked(parent, point, child).map(|(id, _lock)| id)
    }

    /// Whether the parent that `child`'s header names is in this root as that parent: a
    /// session of that id whose commit at the fork point is the one `child` inherited (the
    /// same commit id). A parent deleted since, one never in this root (an imported fork)
    /// or another session made under its id since is not; `show` and the browser named
    /// such a session as the parent, and drew it as the fork's ancestor. A fork point of
    /// sequence 0 (a rewind before the first turn) inherits nothing to compare: a session
    /// of the parent's id counts. A parent that cannot be read is not compared either.
    /// `false` for a session without a parent.
    ///
    /// # Errors
    /// Read errors of `child` at its fork point.
    pub fn parent_in_root(&self, child: &SessionReader) -> Result<bool> {
        let Some(parent) = child.header().parent_id.as_ref() else {
            return Ok(false);
        };
        let cut = child.inherited_events();
        let parent = match self.open_reader(parent) {
            Ok(reader) => reader,
            Err(e) if e.is_not_found() => return Ok(false),
            Err(_) => return Ok(self.session_file_identity(parent).is_some()),
        };
        if cut == 0 {
            return Ok(true);
        }
        // The commit holding the last inherited event: the one that ends at the cut.
        let at_cut = |reader: &SessionReader| {
            reader
                .commits(cut - 1, 1)
                .map(|commits| commits.into_iter().next().map(|c| c.commit_id))
        };
        let inherited = at_cut(child)?;
        Ok(match at_cut(&parent) {
            Ok(theirs) => theirs.is_some() && theirs == inherited,
            Err(_) => true,
        })
    }

    /// As [`Root::fork`], and opens the child for writing with the writer lock it was
    /// staged with, as [`Root::create`] does: the child is published already locked, so
    /// no other opener (in this process or another) can take it between its publication
    /// and this writer.
    ///
    /// # Errors
    /// As [`Root::fork`]; I/O and SQLite errors of the open (the child then stays
    /// published, unopened).
    pub fn fork_writer(
        &self,
        parent: &SessionId,
        point: ForkPoint,
        child: Option<SessionId>,
    ) -> Result<Session> {
        let (id, lock) = self.fork_locked(parent, point, child)?;
        self.start_writer(&self.session_dir(&id), lock)
    }

    /// Builds and publishes the child of a fork or rewind; returns its id and the writer
    /// lock it was staged with, still held. A session the prefix was to be read from that
    /// a delete removed meanwhile: the parent deleted is [`Error::SessionNotFound`]; an
    /// ancestor deleted moved its range into a later file, so the fork is made again on
    /// the new lineage (at most [`FORK_ATTEMPTS`] times).
    fn fork_locked(
        &self,
        parent: &SessionId,
        point: ForkPoint,
        child: Option<SessionId>,
    ) -> Result<(SessionId, WriterLock)> {
        let mut attempt = 1;
        loop {
            match self.fork_locked_once(parent, &point, child.clone()) {
                // SQLite's "disk I/O error" or "unable to open" of a file deleted under the
                // read, too.
                Err(_) if session_file_gone(&self.session_dir(parent)) => {
                    return Err(Error::SessionNotFound(parent.to_string()));
                }
                Err(Error::SessionNotFound(_)) if attempt < FORK_ATTEMPTS => attempt += 1,
                other => return other,
            }
        }
    }

    /// One attempt of [`Root::fork_locked`].
    fn fork_locked_once(
        &self,
        parent: &SessionId,
        point: &ForkPoint,
        child: Option<SessionId>,
    ) -> Result<(SessionId, WriterLock)> {
        let reader = self.open_reader(parent)?;
        let (turn_id, origin) = match &point {
            ForkPoint::AfterTurn(t) => (t, Origin::Fork),
            ForkPoint::BeforeTurn(t) => (t, Origin::Rewind),
        };
        // Only the durable prefix is read: a turn a live writer accepted and has not
        // flushed yet is not there ("not found in PARENT" alone sent the caller looking for
        // a typo in a turn id its writer had just appended).
        let turn = match reader.turn(turn_id)? {
            Some(turn) => {
                // A turn row past the log is damage (a writer records a turn with the
                // commit that ends it): a rewind before it inherited the whole log, exit 0
                // (outside testing H6).
                let durable = reader.durable_sequence()?;
                if turn.end_sequence > durable {
                    return Err(Error::corrupt(format!(
                        "turn {} of {parent} ends at sequence {} in its turn index, past the \
                         end of its log ({durable}): the turn index is damaged",
                        crate::error::quoted(turn_id),
                        turn.end_sequence
                    )));
                }
                turn
            }
            None => open_turn(&reader, parent, turn_id, point)?,
        };
        let cut = match point {
            ForkPoint::AfterTurn(_) => {
                if !turn.fork_safe {
                    return Err(Error::ForkActiveAuthority(format!(
                        "a fork after turn {turn_id:?} (seq {}) would leave the child a turn \
                         open (the batch that ends it also starts the next) or an interaction \
                         unanswered",
                        turn.boundary_sequence
                    )));
                }
                turn.boundary_sequence
            }
            ForkPoint::BeforeTurn(_) => {
                let cut = turn.start_sequence - 1;
                if !reader.is_commit_boundary(cut)? {
                    return Err(Error::ForkBoundaryNotAtomic(format!(
                        "a rewind before turn {turn_id:?} would cut inside the batch that \
                         starts it (seq {})",
                        turn.start_sequence
                    )));
                }
                if !turn.rewind_safe {
                    return Err(Error::ForkActiveAuthority(format!(
                        "a rewind before turn {turn_id:?} (seq {cut}) would leave the child a \
                         turn open or an interaction unanswered"
                    )));
                }
                cut
            }
        };
        // What the child inherits must be there, and its cut sound, before anything is
        // written.
        let ended = matches!(point, ForkPoint::AfterTurn(_)).then_some(&turn);
        reader.check_prefix(cut, ended)?;
        let child = child.unwrap_or_else(SessionId::random);
        if self.session_dir(&child).exists() {
            return Err(self.taken(&child));
        }
        let lineage = reader.prefix_lineage(cut);
        // Each file the child reads a range from records it as a dependent; a parent the
        // child reads nothing from (a rewind before the first turn, a cut inside what the
        // parent itself inherits) records it too, through sequence 0, so that the parent's
        // forks include it (the fork tree left it out, and drew no edge to it from its own
        // tree, also once the ancestor it reads from was deleted: outside testing,
        // sessions 36 and 37).
        let mut recorded: Vec<(SessionId, u64)> = lineage
            .iter()
            .map(|e| (e.ancestor_id.clone(), e.through_seq))
            .collect();
        if !recorded.iter().any(|(ancestor, _)| ancestor == parent) {
            recorded.push((parent.clone(), 0));
        }
        // Shared locks keep every supplying session from being deleted until the child is
        // published (a delete waits, then materialises the child like any dependent).
        let mut _guards = Vec::with_capacity(recorded.len());
        for (ancestor, through) in &recorded {
            let dir = self.existing_dir(ancestor)?;
            let guard = DependentsLock::shared_within(&dir.join(DEPENDENTS_LOCK_FILE), DELETE_WAIT);
            // A delete that took the lock first has moved the folder away meanwhile.
            if session_file_gone(&dir) {
                return Err(Error::SessionNotFound(ancestor.to_string()));
            }
            let Some(guard) = guard? else {
                // A delete still copying the session into its forks (or stopped): named
                // as the holder of its writer lock, as a writer open names it.
                return Err(Error::WriterOwned {
                    session: ancestor.to_string(),
                    owner: self.current_owner(&dir, RecordWait::ForFinal)?,
                });
            };
            _guards.push(guard);
            record_dependent(&dir.join(SESSION_FILE), child.as_str(), *through)?;
        }
        let header = Header {
            session_id: child.clone(),
            codec: CODEC.to_owned(),
            created_at_ms: now_ms(),
            cwd: reader.header().cwd.clone(),
            parent_id: Some(parent.clone()),
            origin,
            provenance: Some(json!({"parent": parent, "turn": turn_id, "through_seq": cut})),
            inherited_events: cut,
        };
        let (staged, lock) = self.stage(&child, origin.as_str(), |conn| {
            write::init_file(conn, &header)?;
            write_lineage(conn, &lineage)
        })?;
        self.publish(staged, &child, &CancelToken::new())?;
        drop(reader);
        for (ancestor, _) in &recorded {
            empty_wal(&self.session_dir(ancestor).join(SESSION_FILE));
        }
        Ok((child, lock))
    }
}
