//! A live writable session: the accepted tail in memory, write-behind group commit,
//! `flush`, backpressure and close.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, WriterOwner};
use crate::format::CATALOG_DIR;
use crate::model::event::{
    assign_derived_ids, check_fields, check_names, check_nesting, check_unique_ids, operation_hash,
    trim_name,
};
use crate::model::ids::{derived_turn_id, now_ms, random_hex};
use crate::model::projection::{FoldEffects, apply_history};
use crate::model::{Batch, Commit, Event, Message, Projection, SessionId};
use crate::session::ops::{self, Known, OperationIds};
use crate::session::pool::{self, Drain};
use crate::store::checkpoint;
use crate::store::lock::WriterLock;
use crate::store::operation_keys::ChunkCache;
use crate::store::reader::SessionReader;
use crate::store::search::{self, IndexSlot, SEARCH_FILE, SearchIndex};
use crate::store::write::Accepted;
use crate::store::writer::FileWriter;

/// A closing session writes a projection checkpoint when this many events came since
/// the last one; a running session when many more did. Either waits longer for a large
/// projection: see [`checkpoint_due`].
const CHECKPOINT_ON_CLOSE: u64 = 1_000;
const CHECKPOINT_WHILE_RUNNING: u64 = 50_000;

/// What a checkpoint of `projection` costs to write and read, in folded events: a read
/// of its event per workset message, and 20 bytes of transcript index per transcript
/// message (a small fraction of a fold).
fn checkpoint_size(projection: &Projection) -> u64 {
    projection.model_messages.len() as u64 + projection.transcript_len / 64
}

/// Whether a new projection checkpoint is worth writing after `new_events` events since
/// the last one, which held `last_size` items: at least `min_events` came, and the events
/// an opener would no longer fold outnumber what the last checkpoint held. So a
/// transcript-heavy session checkpoints at doubling lengths, and all the checkpoints a
/// session writes over its life cost about one fold of its log, instead of growing with
/// the square of its length.
fn checkpoint_due(new_events: u64, last_size: u64, min_events: u64) -> bool {
    new_events >= min_events.max(last_size)
}

/// The operation ids an opening session starts from, and the sequence after which the
/// keys of its file are still to be loaded. With the filter of the checkpoint it started
/// from (`checkpoint_seq`), the keys after it are read here when they fit in one page (a
/// session reopened after a clean close has few or none), so the filter is complete at
/// once; otherwise the writer thread loads them ([`Shared::load_operation_ids`]). Without
/// one, the writer thread loads every key.
fn restored_operation_ids(reader: &SessionReader, checkpoint_seq: u64) -> (OperationIds, u64) {
    let restored = (checkpoint_seq > 0)
        .then(|| reader.operation_filter(checkpoint_seq, ops::MAX_FILTER_FORM))
        .flatten()
        .and_then(|bytes| OperationIds::restored(&bytes));
    let Some(mut ops) = restored else {
        return (OperationIds::new(), 0);
    };
    if let Ok((keys, None)) = operation_keys_page(reader, checkpoint_seq) {
        ops.load(keys);
    }
    (ops, checkpoint_seq)
}

/// Operation keys read per page when a session loads them ([`operation_keys_page`]).
const KEYS_PAGE: usize = 4096;

/// One page of the operation keys of `reader`'s own file after the commit starting after
/// `after_seq`, and where the next page starts (`None` after the last).
fn operation_keys_page(reader: &SessionReader, after_seq: u64) -> Result<(Vec<u64>, Option<u64>)> {
    let page = reader.operation_keys_after(after_seq, KEYS_PAGE)?;
    let next = match page.last() {
        Some(&(last, _)) if page.len() == KEYS_PAGE => Some(last),
        _ => None,
    };
    Ok((page.into_iter().map(|(_, key)| key as u64).collect(), next))
}

/// Fixed per-commit charge against the queue budget, plus per event.
const COMMIT_CHARGE: usize = 512;
const EVENT_CHARGE: usize = 96;
/// Bytes charged for a derived event id (`<32 hex>.<index>`).
const DERIVED_ID_CHARGE: usize = 36;

/// How long drained commits wait for the search index: the drains of that time share one
/// index write.
const INDEX_DELAY: Duration = Duration::from_millis(50);

/// The first retry of a paused session's drain comes this long after its failure; each
/// failed retry doubles the wait, up to [`RETRY_AT_MOST`].
const RETRY_FIRST: Duration = Duration::from_millis(500);

/// The longest wait between retries of a paused session's drain.
const RETRY_AT_MOST: Duration = Duration::from_secs(8);

/// How a live session writes behind.
#[derive(Clone, Debug)]
pub(crate) struct WriteBehind {
    pub delay: Duration,
    pub budget: usize,
    /// The root's search index, kept current after each drain once the root has one
    /// (`None` for a session being built under `.staging/`: it is indexed once published).
    pub index: Option<IndexSlot>,
}

/// Where the accepted tail stands with respect to the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PersistenceStatus {
    /// Everything accepted is durable.
    Ready,
    /// Accepted commits are waiting for (or in) a drain.
    Pending,
    /// The last drain failed cleanly; the tail is kept and the next `flush` retries.
    Failed,
    /// A commit failed in a way that leaves its outcome unknown; the writer is poisoned
    /// and accepts nothing until the session is reopened (which recovers from the file).
    Uncertain,
}

/// A point-in-time view of a live session.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct SessionSnapshot {
    /// Last accepted sequence.
    pub event_sequence: u64,
    /// Last durable (committed and synced) sequence.
    pub durable_sequence: u64,
    /// Persistence status.
    pub persistence_status: PersistenceStatus,
    /// The error behind `Failed` / `Uncertain`.
    pub persistence_error: Option<String>,
    /// The projection of every accepted commit.
    pub projection: Projection,
}

struct State {
    /// Sequence of the newest projection checkpoint this session can start from.
    checkpoint_seq: u64,
    /// [`checkpoint_size`] of that checkpoint (at open: of the opened projection, which
    /// also holds the tail folded on top of it; 0 without a checkpoint).
    checkpoint_size: u64,
    projection: Projection,
    next_seq: u64,
    durable_seq: u64,
    /// The time of the last commit a drain of this writer made durable (`None` before
    /// the first one).
    drained_at_ms: Option<i64>,
    tail: VecDeque<Arc<Accepted>>,
    tail_ops: HashMap<String, Arc<Commit>>,
    /// Operation ids known in memory beyond the tail (bounded; see `session::ops`).
    ops: OperationIds,
    queued_bytes: usize,
    draining: bool,
    /// The earliest drain scheduled on the writer pool and not yet run.
    armed_at: Option<Instant>,
    /// Set after a clean failure (a file busy for the whole busy timeout, a full disk):
    /// appends arm no drain, and the drain is retried after [`State::retry_in`] instead,
    /// until one succeeds. Timed drains stopped until an explicit flush succeeded, so
    /// another process's write held for 5 s (a delete copying history in, a fork's
    /// `dependents` row) left everything appended after it in memory alone until the
    /// host flushed or closed, long after that process had gone (outside testing W2, W3).
    paused: bool,
    /// How long after the next failure the drain is retried ([`RETRY_FIRST`] after a
    /// success, doubled by each failure up to [`RETRY_AT_MOST`]).
    retry_in: Duration,
    /// The error of the last failed drain (cleared by a successful one).
    error: Option<Error>,
    poisoned: bool,
    closed: bool,
    released: bool,
}

pub(crate) struct Shared {
    id: SessionId,
    dir: PathBuf,
    owner: WriterOwner,
    config: WriteBehind,
    reader: SessionReader,
    state: Mutex<State>,
    changed: Condvar,
    writer: Mutex<Option<FileWriter>>,
    /// The operation keys of the commits after this sequence are still to be loaded into
    /// the filter ([`Shared::load_operation_ids`]): the checkpoint's sequence when its
    /// filter was restored, else 0.
    keys_after: u64,
    /// The operation-key chunks the cold lookups of this writer have read (none are
    /// rewritten while it holds the file).
    chunk_cache: Mutex<ChunkCache>,
    /// Drained commits waiting for the search index (written by a writer thread, off the
    /// flushing caller's path).
    unindexed: Mutex<Unindexed>,
}

/// Drained commits waiting for the search index, and when they are due.
#[derive(Default)]
struct Unindexed {
    commits: Vec<Arc<Accepted>>,
    /// [`INDEX_DELAY`] after the first of them was drained: the writer-thread run
    /// scheduled for then writes them all. Runs before it (the session's timed drains)
    /// leave them, so the drains of that time share one index write.
    due: Option<Instant>,
    /// When this writer last looked for a search index its root did not have
    /// ([`Shared::search_index`]).
    probed: Option<Instant>,
    /// Whether a drain went unindexed, there being no index then: the session is caught up
    /// from its file once there is one.
    missed: bool,
}

/// How often, at most, a writer whose root had no search index looks for one from a drain
/// (a search of another process may have made it since).
const INDEX_PROBE_EVERY: Duration = Duration::from_secs(1);

/// A session opened for writing: the one writer of its file.
///
/// `Session` is a cheap handle (clones share the session). Appends are accepted in memory
/// and become durable on the next drain: after the write-behind delay, on
/// [`Session::flush`] or on [`Session::close`].
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.shared.id)
            .field("owner", &self.shared.owner)
            .finish()
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Session {
    /// Builds the live session over an opened, leased file.
    pub(crate) fn start(dir: &Path, writer: FileWriter, config: WriteBehind) -> Result<Session> {
        let reader = SessionReader::open(dir)?;
        let (checkpoint_seq, projection) = reader.projection_and_checkpoint(u64::MAX)?;
        let durable_seq = reader.durable_sequence()?;
        let (ops, keys_after) = restored_operation_ids(&reader, checkpoint_seq);
        let state = State {
            checkpoint_seq,
            checkpoint_size: if checkpoint_seq == 0 {
                0
            } else {
                checkpoint_size(&projection)
            },
            projection,
            next_seq: durable_seq + 1,
            durable_seq,
            drained_at_ms: None,
            tail: VecDeque::new(),
            tail_ops: HashMap::new(),
            ops,
            queued_bytes: 0,
            draining: false,
            armed_at: None,
            paused: false,
            retry_in: RETRY_FIRST,
            error: None,
            poisoned: false,
            closed: false,
            released: false,
        };
        let shared = Arc::new(Shared {
            id: reader.header().session_id.clone(),
            dir: dir.to_path_buf(),
            owner: writer.owner().clone(),
            config,
            reader,
            state: Mutex::new(state),
            changed: Condvar::new(),
            writer: Mutex::new(Some(writer)),
            keys_after,
            chunk_cache: Mutex::new(ChunkCache::default()),
            unindexed: Mutex::new(Unindexed::default()),
        });
        // The operation ids the checkpoint's filter did not give are loaded on a writer
        // thread by a run that is not a drain (it leaves `armed_at` alone, see
        // `scheduled_drain`): opening does not scan them, and nothing accepted meanwhile is
        // written before its time. (A run that finds the filter complete does nothing.)
        let session: Arc<dyn Drain> = shared.clone();
        pool::schedule(Arc::downgrade(&session), Instant::now());
        Ok(Session { shared })
    }

    /// The session id.
    pub fn id(&self) -> &SessionId {
        &self.shared.id
    }

    /// The session folder.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// This writer's lease (its generation is the fencing token).
    pub fn owner(&self) -> &WriterOwner {
        &self.shared.owner
    }

    /// Read access to the durable prefix (the same view a cold reader has).
    pub fn reader(&self) -> &SessionReader {
        &self.shared.reader
    }

    /// Events inherited from ancestors (a fork's prefix; 0 for a root session).
    pub fn inherited_events(&self) -> u64 {
        self.shared.reader.inherited_events()
    }

    /// Appends a batch atomically: validate → hash → fold → accept → queue.
    ///
    /// Returns the commit. A retry with the same operation id and content returns the
    /// original commit, also after a restart. Waits while the write queue is over its
    /// byte budget ([`StoreOptions::queue_budget`](crate::StoreOptions::queue_budget)),
    /// and may write the queue itself meanwhile: a blocking call then (a transaction and
    /// its fsync on the calling thread), which a tokio task makes on its worker.
    ///
    /// # Errors
    /// [`Error::InvalidInput`], [`Error::InvalidPayload`] or [`Error::UnsupportedVersion`]
    /// for a bad batch (nothing changes, no sequence is used); [`Error::OperationConflict`]
    /// for a reused operation id with other content; [`Error::Closed`] after close;
    /// [`Error::Poisoned`] after an uncertain write; [`Error::PersistenceFailed`] when the
    /// queue is full and the last drain failed.
    pub fn append(&self, batch: Batch) -> Result<Arc<Commit>> {
        let prepared = prepare_batch(batch)?;
        self.shared.accept(prepared, None)
    }

    /// As [`Session::append`], but `gate` is asked under the state lock right before the
    /// batch is sequenced, and its error refuses the batch with nothing changed (a retry
    /// of a commit already accepted is answered without asking it). A caller that makes
    /// `gate` fail and then passes [`Session::barrier`] knows that no batch is accepted
    /// through that gate afterwards.
    pub(crate) fn append_gated(
        &self,
        batch: Batch,
        gate: &dyn Fn() -> Result<()>,
    ) -> Result<Arc<Commit>> {
        let prepared = prepare_batch(batch)?;
        self.shared.accept(prepared, Some(gate))
    }

    /// Returns once no batch is being sequenced: every [`Session::append_gated`] that
    /// passed its gate before this call has been accepted (or refused) by then. Must not
    /// be called inside [`Session::with_projection`].
    pub(crate) fn barrier(&self) {
        drop(lock(&self.shared.state));
    }

    /// Shorthand for a batch without a turn id.
    ///
    /// # Errors
    /// As [`Session::append`].
    pub fn append_events(&self, operation_id: &str, events: Vec<Event>) -> Result<Arc<Commit>> {
        self.append(Batch::new(operation_id, events))
    }

    /// Renames the session: appends a `session/title` event (outside any turn, under a
    /// fresh operation id). The title shows in the projection at once.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a blank title, one holding NUL or one over 1,024 bytes;
    /// as [`Session::append`].
    pub fn rename(&self, title: &str) -> Result<Arc<Commit>> {
        let event = crate::model::payload::title_event(title)?;
        self.append_events(&format!("title-{}", random_hex()), vec![event])
    }

    /// Drains the queue now and returns the durable sequence (everything accepted before
    /// the call is durable when it returns). Retries after a failed drain.
    ///
    /// # Errors
    /// The drain's error ([`Error::DiskFull`], [`Error::StaleGeneration`], …);
    /// [`Error::Poisoned`] once a write was uncertain.
    pub fn flush(&self) -> Result<u64> {
        self.shared.flush()
    }

    /// A snapshot of the accepted state (clones the projection).
    pub fn snapshot(&self) -> SessionSnapshot {
        let s = lock(&self.shared.state);
        SessionSnapshot {
            event_sequence: s.next_seq - 1,
            durable_sequence: s.durable_seq,
            persistence_status: status_of(&s),
            persistence_error: s.error.as_ref().map(ToString::to_string),
            projection: s.projection.clone(),
        }
    }

    /// Runs `f` on the accepted projection without cloning it. `f` runs under the
    /// session's state lock: it must not append to, flush, snapshot or close this session,
    /// nor cancel a [`Runtime`](crate::Runtime) of it (each waits for that lock).
    pub fn with_projection<R>(&self, f: impl FnOnce(&Projection) -> R) -> R {
        f(&lock(&self.shared.state).projection)
    }

    /// The whole UI transcript of every accepted commit, oldest first: the durable part
    /// from the history index, then the changes of the accepted tail. It reads every
    /// message; for a view, prefer history pages.
    ///
    /// # Errors
    /// Read errors of the durable part.
    pub fn transcript(&self) -> Result<Vec<Arc<Message>>> {
        let (durable, tail) = {
            let s = lock(&self.shared.state);
            (s.durable_seq, s.tail.iter().cloned().collect::<Vec<_>>())
        };
        let mut transcript = self.shared.reader.transcript(durable)?;
        for accepted in &tail {
            apply_history(&mut transcript, &accepted.history);
        }
        Ok(transcript)
    }

    /// When the durable session was last updated
    /// ([`SessionReader::updated_at_ms`]): the time of the last commit a drain of this
    /// writer wrote, known without a read; before its first drain, read from the file.
    ///
    /// # Errors
    /// Read errors of the file (before the first drain).
    pub(crate) fn updated_at_ms(&self) -> Result<i64> {
        let (drained, durable) = {
            let s = lock(&self.shared.state);
            (s.drained_at_ms, s.durable_seq)
        };
        match drained {
            Some(ms) => Ok(ms.max(self.shared.reader.header().created_at_ms)),
            None => self.shared.reader.updated_at_ms(durable),
        }
    }

    /// Last accepted and last durable sequence.
    pub fn sequences(&self) -> (u64, u64) {
        let s = lock(&self.shared.state);
        (s.next_seq - 1, s.durable_seq)
    }

    /// Accepted commits with `last_seq > after`: durable ones from the file, then the
    /// in-memory tail; at most `limit` (fewer when the durable page stops at its byte
    /// bound, see [`SessionReader::commits`]).
    ///
    /// # Errors
    /// Read errors of the durable part.
    pub fn accepted_commits(&self, after: u64, limit: usize) -> Result<Vec<Arc<Commit>>> {
        let (tail, durable): (Vec<Arc<Commit>>, u64) = {
            let s = lock(&self.shared.state);
            (
                s.tail.iter().map(|a| Arc::clone(&a.commit)).collect(),
                s.durable_seq,
            )
        };
        let mut out: Vec<Arc<Commit>> = if after < durable {
            self.shared
                .reader
                .commits(after, limit)?
                .into_iter()
                .map(Arc::new)
                .collect()
        } else {
            Vec::new()
        };
        let covered = out.last().map_or(after, |c| c.last_seq());
        // A durable page cut short by its byte bound continues there, not in the tail.
        if covered >= durable {
            out.extend(tail.into_iter().filter(|c| c.last_seq() > covered));
        }
        out.truncate(limit);
        Ok(out)
    }

    /// Stops accepting, drains everything, closes the file and releases the writer lock.
    /// Idempotent; when the final drain fails the session keeps its lock and tail, and a
    /// later `close` retries. `Root::close` also records the session in the root's catalog
    /// (a listing then reads nothing of its file).
    ///
    /// # Errors
    /// The final drain's error.
    pub fn close(&self) -> Result<()> {
        self.shared.close().map(drop)
    }

    /// As [`Session::close`], but hands back the writer lock, still held, instead of
    /// releasing it: the caller can publish or reopen the file under it with no gap in
    /// which another opener could take it.
    ///
    /// # Errors
    /// The final drain's error (the session then keeps its lock and tail, or gives the
    /// file up when poisoned, as [`Session::close`] does); [`Error::Closed`] when the
    /// session was already closed, its lock released.
    pub(crate) fn close_keeping_lock(&self) -> Result<WriterLock> {
        self.shared.close()?.ok_or(Error::Closed)
    }

    /// Whether a close of this session began (it accepts nothing more), also one that
    /// failed and keeps the lock and tail for a retry.
    pub(crate) fn close_began(&self) -> bool {
        lock(&self.shared.state).closed
    }

    /// Whether two handles are the same session instance.
    pub fn same_instance(&self, other: &Session) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// The answer to a batch whose operation id was used by `original`: the original commit
/// for a retry with the same content, a conflict otherwise.
fn same_operation(original: Arc<Commit>, batch: PreparedBatch) -> Result<Arc<Commit>> {
    if original.operation_hash == batch.operation_hash {
        Ok(original)
    } else {
        Err(Error::OperationConflict {
            operation_id: batch.operation_id,
        })
    }
}

impl State {
    /// The failed drain's error behind a paused or poisoned state (both are set only
    /// together with it).
    fn failure(&self) -> Error {
        self.error
            .clone()
            .unwrap_or_else(|| Error::internal("a failed or poisoned session without its error"))
    }
}

fn status_of(s: &State) -> PersistenceStatus {
    if s.poisoned {
        PersistenceStatus::Uncertain
    } else if s.error.is_some() {
        PersistenceStatus::Failed
    } else if s.tail.is_empty() {
        PersistenceStatus::Ready
    } else {
        PersistenceStatus::Pending
    }
}

/// A validated batch, hashed, with ids derived; not yet sequenced.
struct PreparedBatch {
    operation_id: String,
    operation_hash: String,
    turn_id: Option<String>,
    events: Vec<Event>,
    charge: usize,
}

fn prepare_batch(batch: Batch) -> Result<PreparedBatch> {
    let operation_id = trim_name(&batch.operation_id).to_owned();
    check_fields(&operation_id, &batch.events)?;
    let mut events = batch.events;
    for e in &mut events {
        let kind = trim_name(&e.kind);
        if kind.len() != e.kind.len() {
            e.kind = kind.to_owned();
        }
        e.seq = 0;
        e.content_ref = None;
    }
    let turn_id = match batch.turn_id.filter(|t| !trim_name(t).is_empty()) {
        Some(t) => Some(t),
        None if events.iter().any(|e| e.kind == "turn/start") => {
            Some(derived_turn_id(&operation_id))
        }
        None => None,
    };
    let supplied: Vec<bool> = events.iter().map(|e| !e.id.is_empty()).collect();
    let hash = operation_hash(turn_id.as_deref(), &events, &supplied);
    let mut charge = COMMIT_CHARGE;
    for e in &events {
        // An empty id is derived once the commit is sequenced (`<commit id>.<index>`).
        let id_len = if e.id.is_empty() {
            DERIVED_ID_CHARGE
        } else {
            e.id.len()
        };
        charge += EVENT_CHARGE + id_len + e.kind.len() + e.payload_len();
    }
    Ok(PreparedBatch {
        operation_id,
        operation_hash: hash,
        turn_id,
        events,
        charge,
    })
}

impl Shared {
    /// Accepts `batch` unless its operation id was used: the tail and the operation ids
    /// in memory answer most appends; otherwise the file is asked, without holding the
    /// state lock, and the answer is checked again under it.
    fn accept(
        self: &Arc<Self>,
        batch: PreparedBatch,
        gate: Option<&dyn Fn() -> Result<()>>,
    ) -> Result<Arc<Commit>> {
        // Set when the file did not have the id, to the eviction count it was asked at:
        // an id accepted since is in memory unless it has left the recent window.
        let mut absent_at: Option<u64> = None;
        loop {
            let s = self.admit(batch.charge)?;
            if let Some(c) = s.tail_ops.get(&batch.operation_id) {
                return same_operation(Arc::clone(c), batch);
            }
            let asked = absent_at == Some(s.ops.evictions());
            let recent = match s.ops.known(&batch.operation_id) {
                Known::Absent => None,
                Known::Unknown if asked => None,
                Known::Recent(hash) if hash != batch.operation_hash => {
                    return Err(Error::OperationConflict {
                        operation_id: batch.operation_id,
                    });
                }
                Known::Recent(_) => Some(true),
                Known::Unknown => Some(false),
            };
            let Some(recent) = recent else {
                if let Some(gate) = gate {
                    gate()?;
                }
                return self.accept_new(s, batch);
            };
            let evictions = s.ops.evictions();
            drop(s);
            let found = {
                let mut chunks = self.chunk_cache.lock().unwrap_or_else(|e| e.into_inner());
                self.reader
                    .lookup_operation(&batch.operation_id, &mut chunks)?
            };
            match found {
                Some(original) => return same_operation(Arc::new(original), batch),
                None if recent => {
                    return Err(Error::corrupt(format!(
                        "the durable commit of operation {:?} is missing",
                        batch.operation_id
                    )));
                }
                None => absent_at = Some(evictions),
            }
        }
    }

    /// Waits while the queue is over its budget, then returns the state lock, unless the
    /// session is closed or poisoned.
    fn admit(self: &Arc<Self>, charge: usize) -> Result<MutexGuard<'_, State>> {
        // Backpressure: over budget, the appender waits for the drain that is writing,
        // or drains the queue itself when none is (unless the queue is empty: one
        // oversized commit is always accepted).
        let mut s = lock(&self.state);
        // A paused session's drain is tried once more here before the append is refused:
        // the file may be free again (it was refused at once, seconds after the other
        // process had let go; outside testing W2).
        let mut tried = false;
        while !s.closed
            && !s.poisoned
            && s.queued_bytes > 0
            && s.queued_bytes + charge > self.config.budget
        {
            if s.draining {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if s.paused && tried {
                return Err(Error::PersistenceFailed(Box::new(s.failure())));
            }
            tried = true;
            drop(s);
            // A failure is recorded in the state and answered on the next loop.
            let _ = self.drain();
            s = lock(&self.state);
        }
        if s.closed {
            return Err(Error::Closed);
        }
        if s.poisoned {
            return Err(Error::Poisoned(Box::new(s.failure())));
        }
        Ok(s)
    }

    /// Sequences, folds and queues a batch whose operation id is new.
    fn accept_new(
        self: &Arc<Self>,
        mut s: MutexGuard<'_, State>,
        batch: PreparedBatch,
    ) -> Result<Arc<Commit>> {
        // Checked once the operation id is known to be new: a retry of a batch stored
        // before a rule existed still answers its commit.
        check_unique_ids(&batch.events)?;
        check_nesting(&batch.events)?;
        check_names(&batch.operation_id, batch.turn_id.as_deref(), &batch.events)?;
        crate::model::payload::check_shapes(&batch.events)?;
        let fold = s.projection.prepare(&batch.events)?;
        s.projection.check_append(&fold, batch.turn_id.as_deref())?;
        let first_seq = s.next_seq;
        let mut events = batch.events;
        for (i, e) in events.iter_mut().enumerate() {
            e.seq = first_seq + i as u64;
        }
        let mut commit = Commit {
            commit_id: String::new(),
            operation_id: batch.operation_id,
            operation_hash: batch.operation_hash,
            first_seq,
            turn_id: batch.turn_id,
            writer_generation: self.owner.generation,
            created_at_ms: now_ms(),
            events,
        };
        assign_derived_ids(&mut commit);
        let commit = Arc::new(commit);
        let last_seq = commit.last_seq();
        let mut effects = FoldEffects::default();
        s.projection.apply_tracked(
            fold,
            first_seq,
            last_seq,
            commit.turn_id.as_deref(),
            &mut effects,
        );
        s.next_seq = last_seq + 1;
        s.queued_bytes += batch.charge;
        s.ops.insert(&commit.operation_id);
        s.tail_ops
            .insert(commit.operation_id.clone(), Arc::clone(&commit));
        s.tail.push_back(Arc::new(Accepted {
            commit: Arc::clone(&commit),
            closed_turns: effects.turns,
            history: effects.history,
            charge: batch.charge,
        }));
        if !s.draining && !s.paused {
            // Past half the budget the drain starts at once, so that it writes while the
            // appender goes on filling the other half. A delay too long to add to the
            // clock is no timer at all: the commit waits for a flush, the budget or close
            // (`now + delay` panicked in the append, after the commit was accepted).
            let now = Instant::now();
            let due = if s.queued_bytes > self.config.budget / 2 {
                Some(now)
            } else {
                now.checked_add(self.config.delay)
            };
            if let Some(due) = due {
                self.arm(&mut s, due);
            }
        }
        Ok(commit)
    }

    /// Schedules a drain on the writer pool at `due`, unless one is already due by then.
    fn arm(self: &Arc<Self>, s: &mut State, due: Instant) {
        if s.armed_at.is_none_or(|at| due < at) {
            s.armed_at = Some(due);
            let session = Arc::downgrade(self);
            pool::schedule(session, due);
        }
    }

    /// Writes the whole tail in one transaction. Waits for a drain already running.
    fn drain(self: &Arc<Self>) -> Result<()> {
        let batch: Vec<Arc<Accepted>> = {
            let mut s = lock(&self.state);
            while s.draining {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.poisoned {
                return Err(Error::Poisoned(Box::new(s.failure())));
            }
            if s.tail.is_empty() {
                return Ok(());
            }
            s.draining = true;
            s.tail.iter().cloned().collect()
        };
        let result = {
            let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            match w.as_mut() {
                Some(writer) => writer.drain(&batch),
                None => Err(Error::Closed),
            }
        };
        let mut s = lock(&self.state);
        s.draining = false;
        let outcome = match result {
            Ok(()) => {
                for accepted in &batch {
                    s.tail.pop_front();
                    s.tail_ops.remove(&accepted.commit.operation_id);
                    s.ops.remember(
                        &accepted.commit.operation_id,
                        &accepted.commit.operation_hash,
                    );
                    s.queued_bytes -= accepted.charge;
                }
                if let Some(last) = batch.last() {
                    s.durable_seq = last.commit.last_seq();
                    s.drained_at_ms = Some(last.commit.created_at_ms);
                }
                s.paused = false;
                s.retry_in = RETRY_FIRST;
                s.error = None;
                // Commits accepted during the write are drained right after (drain chain).
                if !s.tail.is_empty() {
                    self.arm(&mut s, Instant::now());
                }
                Ok(())
            }
            Err(e) => {
                s.error = Some(e.clone());
                if e.is_retryable_write() {
                    s.paused = true;
                    let retry = s.retry_in;
                    s.retry_in = (retry * 2).min(RETRY_AT_MOST);
                    if let Some(due) = Instant::now().checked_add(retry) {
                        self.arm(&mut s, due);
                    }
                } else {
                    s.poisoned = true;
                }
                Err(e)
            }
        };
        drop(s);
        self.changed.notify_all();
        if outcome.is_ok() && self.search_index(false).is_some() {
            // Indexed on a writer thread, so that a flush never waits for the index, and
            // a little later, so that the drains of a busy session share one index write.
            let mut queue = self.unindexed.lock().unwrap_or_else(|e| e.into_inner());
            queue.commits.extend(batch);
            let due = match queue.due {
                Some(_) => None,
                None => Some(*queue.due.insert(Instant::now() + INDEX_DELAY)),
            };
            drop(queue);
            if let Some(due) = due {
                let session: Arc<dyn Drain> = self.clone();
                pool::schedule(Arc::downgrade(&session), due);
            }
        }
        outcome
    }

    /// The root's search index, which this session's drains keep current: the one the
    /// root had open; for a writer opened before the root's first search made it, the one
    /// made since (outside testing, session 35: that writer indexed nothing, so what it
    /// wrote was found by no search until a later writer open or a rebuild). Looked for at
    /// most every [`INDEX_PROBE_EVERY`] from a drain, and always when `now` (a close); once
    /// found it is the root's (its later searches and sessions share it). A session that
    /// drained while there was none is then caught up in it from its file (the search that
    /// made it filled it from the file as it stood then): by the drain's queued index
    /// write, or at once for a close. `None` for a session not yet published, or while
    /// there is no index (the caller's drain goes unindexed).
    fn search_index(&self, now: bool) -> Option<Arc<SearchIndex>> {
        let slot = self.config.index.as_ref()?;
        let mut queue = self.unindexed.lock().unwrap_or_else(|e| e.into_inner());
        let index = match slot.get() {
            // A private index (the root's is another user's, or a newer build's) is this
            // process's searches' alone: no writer writes it (`index_holds_all`).
            Some(index) if index.is_private() => return None,
            Some(index) => Arc::clone(index),
            None => {
                if !now
                    && queue
                        .probed
                        .is_some_and(|at| at.elapsed() < INDEX_PROBE_EVERY)
                {
                    queue.missed = true;
                    return None;
                }
                queue.probed = Some(Instant::now());
                let root = self.dir.parent()?;
                let Some(index) =
                    search::open_made(slot, &root.join(CATALOG_DIR).join(SEARCH_FILE))
                else {
                    queue.missed = true;
                    return None;
                };
                index
            }
        };
        // A drain that finds the index after missing it leaves the catch-up to the index
        // write it queues, on a writer-pool thread (`SearchIndex::index_drained` sees the
        // gap and catches up from the file), so that its flush does not wait for it; a
        // close, which may queue nothing, catches up now.
        if std::mem::take(&mut queue.missed) && now {
            drop(queue);
            let _ = index.catch_up(&self.reader);
        }
        Some(index)
    }

    /// Whether the root's search index (when it has one) holds every durable commit of
    /// this session, after one more catch-up from the file when it does not (an index
    /// write this writer queued failed: another process held the index for longer than
    /// its busy wait); when it still does not, the session is noted for this process's
    /// next search (`SearchIndex::note_behind`).
    fn index_holds_all(&self) -> bool {
        let Some(slot) = self.config.index.as_ref() else {
            return true;
        };
        let Some(index) = slot.get().filter(|index| !index.is_private()) else {
            // An index there that this process could not open (one it may not write, or a
            // newer build's, which this process's searches leave for a private one): the
            // record stays, so that a search that can write it catches this session up
            // (outside testing, users and permissions: it was cleared, and once the index
            // could be written again no search found what this writer wrote).
            return !self
                .dir
                .parent()
                .is_some_and(|root| root.join(CATALOG_DIR).join(SEARCH_FILE).exists());
        };
        let durable = lock(&self.state).durable_seq;
        let id = &self.reader.header().session_id;
        let holds = || {
            index
                .indexed_through(&self.reader)
                .ok()
                .flatten()
                .is_some_and(|seq| seq >= durable)
        };
        let caught_up = holds() || (index.catch_up(&self.reader).is_ok() && holds());
        if !caught_up {
            index.note_behind(id);
        }
        caught_up
    }

    /// Writes the drained commits still waiting for the search index into it: all of
    /// them when `now` is `None` (a close), else only once they are due at `now`. Derived
    /// and best effort: an index write that fails (busy, full disk) is caught up by the
    /// next drain, the next open or a rebuild.
    fn index_drained(&self, now: Option<Instant>) {
        let batch = {
            let mut queue = self.unindexed.lock().unwrap_or_else(|e| e.into_inner());
            if now.is_some_and(|now| queue.due.is_none_or(|due| due > now)) {
                return;
            }
            queue.due = None;
            std::mem::take(&mut queue.commits)
        };
        if let Some(index) = self.config.index.as_ref().and_then(|slot| slot.get())
            && !index.is_private()
            && !batch.is_empty()
        {
            let _ = index.index_drained(&self.reader, &batch);
        }
    }
}

impl Drain for Shared {
    fn scheduled_drain(self: Arc<Self>) {
        self.index_drained(Some(Instant::now()));
        {
            let mut s = lock(&self.state);
            if s.released {
                return;
            }
            // A run is a drain only when the earliest drain armed is due. Any other run
            // is the one scheduled at open (or one that an earlier run already stood
            // for): it loads the operation ids and writes nothing, so a commit is never
            // written before its write-behind time or an explicit flush.
            if s.armed_at.is_none_or(|at| at > Instant::now()) {
                drop(s);
                self.load_operation_ids();
                return;
            }
            // Any scheduled drain that runs stands for every one armed before it (a paused
            // session's retry too: appends arm none while it is paused).
            s.armed_at = None;
        }
        self.load_operation_ids();
        // A failure is recorded in the state and reported by the next flush.
        if self.drain().is_ok() {
            self.write_checkpoint(CHECKPOINT_WHILE_RUNNING);
        }
    }
}

impl Shared {
    /// Loads the operation ids of the file into the filter, once, without holding the
    /// state lock while reading. Best effort: until it succeeds, a new id costs a lookup.
    /// Only the keys after [`Shared::keys_after`] are read: those before are in the
    /// filter already when the checkpoint's was restored.
    ///
    /// The keys are read in pages, each its own short read transaction, and a session that
    /// starts closing stops the load: a close's `wal_checkpoint(TRUNCATE)` waits for
    /// readers, and with the scan in one transaction the close right after an open of a
    /// 50,000-commit session took 9.99 ms against 0.81 ms for a small one (3.15 ms paged;
    /// `bench --suite lean` row 5, runs before and after).
    fn load_operation_ids(&self) {
        if lock(&self.state).ops.loaded() {
            return;
        }
        let mut keys = Vec::new();
        let mut after = Some(self.keys_after);
        while let Some(from) = after {
            if lock(&self.state).closed {
                return;
            }
            let Ok((page, next)) = operation_keys_page(&self.reader, from) else {
                return;
            };
            keys.extend(page);
            after = next;
        }
        lock(&self.state).ops.load(keys);
    }

    /// Stores the projection as a checkpoint when everything accepted is durable and one
    /// is due ([`checkpoint_due`]). Best effort: it is derived data.
    fn write_checkpoint(&self, min_events: u64) {
        let (seq, size, (text, ids), filter) = {
            let mut s = lock(&self.state);
            let new_events = s.durable_seq.saturating_sub(s.checkpoint_seq);
            if !s.tail.is_empty() || !checkpoint_due(new_events, s.checkpoint_size, min_events) {
                return;
            }
            // With the tail empty, the filter holds exactly the ids of the durable commits.
            match checkpoint::encode(&mut s.projection) {
                Ok(text) => (
                    s.durable_seq,
                    checkpoint_size(&s.projection),
                    text,
                    s.ops.filter_bytes(),
                ),
                Err(_) => return,
            }
        };
        let stored = match self
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(w) => w
                .store_checkpoint(seq, &text, &ids, filter.as_deref())
                .is_ok(),
            None => false,
        };
        if stored {
            let mut s = lock(&self.state);
            s.checkpoint_seq = seq;
            s.checkpoint_size = size;
        }
    }

    fn flush(self: &Arc<Self>) -> Result<u64> {
        let target = lock(&self.state).next_seq - 1;
        loop {
            {
                let s = lock(&self.state);
                if s.poisoned {
                    return Err(Error::Poisoned(Box::new(s.failure())));
                }
                if s.durable_seq >= target {
                    return Ok(s.durable_seq);
                }
            }
            self.drain()?;
        }
    }

    /// Closes the session; returns its writer lock, still held, unless an earlier close
    /// had already released it.
    fn close(self: &Arc<Self>) -> Result<Option<WriterLock>> {
        {
            let mut s = lock(&self.state);
            if s.released {
                return Ok(None);
            }
            s.closed = true;
        }
        self.changed.notify_all();
        match self.flush() {
            Ok(_) => {
                self.write_checkpoint(CHECKPOINT_ON_CLOSE);
                // A closed session is wholly in the search index (also one made by a
                // search since this writer last looked).
                self.search_index(true);
                self.index_drained(None);
                let indexed = self.index_holds_all();
                let mut lock = self.release();
                if !indexed && let Some(lock) = lock.as_mut() {
                    lock.keep_record();
                }
                Ok(lock)
            }
            // The outcome of the last write is unknown: only a reopen (WAL recovery) can
            // tell, so give the file up; what was accepted but not written is lost.
            Err(e) if lock(&self.state).poisoned => {
                drop(self.release());
                Err(e)
            }
            // A clean failure (e.g. a full disk): keep the lock and the tail for a retry.
            Err(e) => Err(e),
        }
    }

    /// Closes the file as the writer's policy says and returns its lock (dropping it
    /// releases the file).
    fn release(&self) -> Option<WriterLock> {
        lock(&self.state).released = true;
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        writer.map(FileWriter::close)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Last handle gone without close: drain what was accepted, then release.
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if state.released || state.poisoned || state.tail.is_empty() {
            return;
        }
        let batch: Vec<Arc<Accepted>> = state.tail.iter().cloned().collect();
        if let Some(writer) = self
            .writer
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            let _ = writer.drain(&batch);
        }
    }
}
