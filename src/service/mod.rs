//! The service hosts use: a registry of live runtimes (exactly one per session),
//! create/open/close rules, cancellation, restart recovery, and entry points for fork,
//! export, import, delete and legacy migration. Async on tokio; every SQLite call runs
//! on a blocking thread.

mod caller;
mod legacy;
mod query;
mod recovery;
mod runtime;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::model::ids::random_hex;
use crate::model::{SessionId, SessionRef};
use crate::persistence::{CreateOptions, ExportReport, ForkPoint, ImportOptions, Root};
use crate::service::caller::{Caller, Watch, abandoned_wait};
use crate::session::live::Session;

pub use legacy::MigrationRecord;
pub use query::{
    EventPage, HistoryPage, MAX_HISTORY_LIMIT, MAX_LIST_LIMIT, ObserveResult, PersistentMessage,
    SearchHit, SearchPage, SessionPage, SessionQuery, SessionSummary,
};
pub use runtime::{CancelReceipt, Execution, Runtime, RuntimePhase, RuntimeSnapshot};

tokio::task_local! {
    /// The runtime of the caller a service task runs for ([`Service::to_completion`]), when
    /// it had one: the task's storage work runs on that runtime's blocking threads, as a
    /// call's own does, so the service's runtime stays one thread (its own blocking pool
    /// grew with the sessions opened at once). Work the caller's runtime, shut down, never
    /// started runs on the service's runtime instead ([`blocking`]).
    static CALLER_RUNTIME: Option<tokio::runtime::Handle>;
}

/// Runs blocking storage work off the async workers (of the caller's runtime, for a
/// service task: [`CALLER_RUNTIME`]).
///
/// # Errors
/// `f`'s; [`Error::Io`] when tokio has no blocking thread and cannot start one (the
/// process out of threads or memory): `spawn_blocking` panics then, and the task it
/// queued is marked so that it never runs later.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    // Taken by the thread that runs it: a task queued and never run leaves it here.
    let work = Arc::new(Mutex::new(Some(f)));
    if let Some(caller) = CALLER_RUNTIME.try_with(Clone::clone).ok().flatten() {
        match run_blocking(Some(&caller), &work).await {
            // The caller's runtime was shut down before the work started: the service
            // task goes on without it (a create's session is then closed and deleted).
            Err(_) if work.lock().unwrap_or_else(|e| e.into_inner()).is_some() => {}
            done => return done,
        }
    }
    run_blocking(None, &work).await
}

/// [`blocking`] on `runtime`'s blocking threads (the current runtime's when `None`): the
/// work in `work`, unless another thread took it.
async fn run_blocking<T: Send + 'static, F: FnOnce() -> Result<T> + Send + 'static>(
    runtime: Option<&tokio::runtime::Handle>,
    work: &Arc<Mutex<Option<F>>>,
) -> Result<T> {
    let taken = Arc::clone(work);
    let task = move || {
        let f = taken.lock().unwrap_or_else(|e| e.into_inner()).take();
        f.map_or(Err(Error::Cancelled), |f| f())
    };
    let spawned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match runtime {
        Some(runtime) => runtime.spawn_blocking(task),
        None => tokio::task::spawn_blocking(task),
    }));
    let Ok(handle) = spawned else {
        // Never run later, should the queued task start after all.
        drop(work.lock().unwrap_or_else(|e| e.into_inner()).take());
        return Err(Error::io(
            "start a thread for storage work",
            crate::error::no_thread(),
        ));
    };
    handle
        .await
        .map_err(|e| Error::internal_from("blocking storage task did not finish", e))?
}

/// How many of the sessions closed last a [`Service::close`] of them again answers `Ok`.
const CLOSED_KEPT: usize = 4096;

/// The sessions closed here last (at most [`CLOSED_KEPT`]), so that closing one again
/// answers `Ok`: a record of every session ever closed grew without bound in a server
/// opening millions of them.
struct ClosedSessions {
    /// How many closes are kept ([`CLOSED_KEPT`]; fewer in tests).
    kept: usize,
    /// Each session's latest close, numbered.
    stamps: HashMap<SessionId, u64>,
    /// The closes in order, oldest first; an entry whose stamp is no longer its
    /// session's (reopened, or closed again since) is skipped when it leaves.
    order: std::collections::VecDeque<(SessionId, u64)>,
    next: u64,
}

impl Default for ClosedSessions {
    fn default() -> Self {
        ClosedSessions {
            kept: CLOSED_KEPT,
            stamps: HashMap::new(),
            order: std::collections::VecDeque::new(),
            next: 0,
        }
    }
}

impl ClosedSessions {
    fn contains(&self, id: &SessionId) -> bool {
        self.stamps.contains_key(id)
    }

    fn insert(&mut self, id: SessionId) {
        self.next += 1;
        self.stamps.insert(id.clone(), self.next);
        self.order.push_back((id, self.next));
        while self.order.len() > self.kept {
            if let Some((old, stamp)) = self.order.pop_front()
                && self.stamps.get(&old) == Some(&stamp)
            {
                self.stamps.remove(&old);
            }
        }
    }

    fn remove(&mut self, id: &SessionId) {
        self.stamps.remove(id);
    }
}

#[derive(Default)]
struct Registry {
    active: HashMap<SessionId, Runtime>,
    /// Sessions closed here lately and no longer active (for idempotent close).
    closed: ClosedSessions,
    preparing: HashSet<SessionId>,
    /// Sessions a [`Service::delete`] is deleting (after closing their runtime): an open
    /// waits for it as for `preparing`; a query does not (nothing accepted is left in
    /// memory), nor does `shutdown` (the delete may wait for another process's writer).
    deleting: HashSet<SessionId>,
    /// Runtimes a close unpublished and is draining: still read by `list`, whose summary
    /// of the session would otherwise go back to the file's durable prefix meanwhile.
    closing: HashMap<SessionId, Runtime>,
    bindings: HashMap<SessionId, usize>,
    /// Set by [`Service::shutdown`]: no id is reserved and no runtime published any more.
    stopped: bool,
}

pub(crate) struct ServiceInner {
    host_id: String,
    root: Root,
    registry: Mutex<Registry>,
    registry_changed: Notify,
    /// The tokio runtime the service's own tasks run on ([`Service::to_completion`]), one
    /// worker thread started at the first of them.
    tasks: Mutex<Option<tokio::runtime::Runtime>>,
}

impl Drop for ServiceInner {
    fn drop(&mut self) {
        // Without waiting (the last clone may be dropped inside a caller's async task,
        // where a runtime may not block): a task still running is dropped.
        let Some(tasks) = self
            .tasks
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        if std::thread::current().name() != Some(TASKS_THREAD) {
            tasks.shutdown_background();
            return;
        }
        // Dropped by one of its own tasks: a runtime cannot be shut down from its own
        // threads, so a thread of its own does it (or, when none can be started, the idle
        // runtime is left to the end of the process).
        let (sender, receiver) = std::sync::mpsc::channel::<tokio::runtime::Runtime>();
        let stopper = std::thread::Builder::new().spawn(move || {
            if let Ok(tasks) = receiver.recv() {
                tasks.shutdown_background();
            }
        });
        let unsent = match stopper {
            Ok(_) => sender.send(tasks).err().map(|e| e.0),
            Err(_) => Some(tasks),
        };
        // Dropped here, on its own thread, it would panic.
        std::mem::forget(unsent);
    }
}

/// The name of the threads of a service's own runtime ([`ServiceInner::tasks`]).
const TASKS_THREAD: &str = "session-store-service";

/// A host's entry point: one published runtime per session, and the query side.
///
/// Its async methods are called inside a tokio runtime (either flavor: their storage work
/// runs on its blocking threads; polled outside one, they panic as tokio does). An open,
/// create, fork, rewind, close, rename, import, delete or legacy continuation runs as a
/// task on the service's own runtime (one thread, started at the first of them), so a
/// caller that stops waiting, or whose runtime is dropped, never leaves it half done.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> session_store::Result<()> {
/// use session_store::{Batch, CreateOptions, Root, Service, SessionId};
/// let dir = tempfile::tempdir().unwrap();
/// let service = Service::new("local", Root::open(dir.path())?)?;
/// let runtime = service.create(CreateOptions::with_id(SessionId::new("chat")?)).await?;
/// runtime.session().append(Batch::new("t", vec![session_store::Event::new("session/title")
///     .with_payload(&serde_json::json!({"title": "Hi"}))?]))?;
/// service.close(runtime.session_ref()).await?;
/// let page = service.query().list(None, 50).await?;
/// assert_eq!(page.sessions[0].title, "Hi");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Service {
    inner: Arc<ServiceInner>,
}

/// A client's hold on a runtime; the runtime cannot be closed while bindings remain. The
/// hold ends with [`ClientBinding::release`] or when the binding is dropped.
#[derive(Debug)]
#[must_use = "a binding dropped at once lets go of the runtime: it can be closed under the client"]
pub struct ClientBinding {
    service: Service,
    runtime: Runtime,
    released: std::sync::atomic::AtomicBool,
}

/// A created runtime that is usable but invisible until [`Service::publish`] of the
/// service that prepared it.
#[derive(Debug)]
pub struct PreparedRuntime {
    /// The service that prepared it: only that one (or a clone) publishes or discards it.
    service: std::sync::Weak<ServiceInner>,
    runtime: Runtime,
    stamp: String,
    state: Mutex<PreparedState>,
}

#[derive(Debug, Default)]
struct PreparedState {
    published: bool,
    /// The result of the first `discard`, returned again by later ones.
    discarded: Option<Result<()>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("host_id", &self.inner.host_id)
            .finish()
    }
}

impl Service {
    /// A service for `host_id` over a root of sessions.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a host id [`SessionRef::check_host_id`] refuses.
    pub fn new(host_id: impl Into<String>, root: Root) -> Result<Service> {
        let host_id = host_id.into();
        SessionRef::check_host_id(&host_id)?;
        Ok(Service {
            inner: Arc::new(ServiceInner {
                host_id,
                root,
                registry: Mutex::new(Registry::default()),
                registry_changed: Notify::new(),
                tasks: Mutex::new(None),
            }),
        })
    }

    /// Runs `f` as a task of its own on the service's runtime and waits for it: a caller
    /// that stops waiting (a `tokio::time::timeout`, a `select!`), or whose runtime is
    /// dropped, does not stop it half-way. An open, fork, migration or close that reserved
    /// a session id in the registry always ends by installing a runtime or dropping the
    /// reservation; dropped mid-way, it would leave the reservation behind and every later
    /// open of that id, and `shutdown`, would wait for it forever. Spawned on the caller's
    /// runtime, such a task was dropped with that runtime (outside testing, session 45: a
    /// runtime dropped during an open, a close, a fork or a create hung every later open of
    /// the id and the service's `shutdown`, and creates given no id left sessions nobody
    /// was given).
    ///
    /// # Errors
    /// `f`'s; [`Error::Io`] when the service's thread cannot be started.
    async fn to_completion<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let caller = tokio::runtime::Handle::try_current().ok();
        let task = self.tasks()?.spawn(CALLER_RUNTIME.scope(caller, f));
        task.await
            .map_err(|e| Error::internal_from("service task did not finish", e))?
    }

    /// A handle of the runtime of the service's own tasks, started at the first call.
    fn tasks(&self) -> Result<tokio::runtime::Handle> {
        let mut tasks = self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tasks) = tasks.as_ref() {
            return Ok(tasks.handle().clone());
        }
        let started = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(TASKS_THREAD)
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the service's task thread", e))?;
        let handle = started.handle().clone();
        *tasks = Some(started);
        Ok(handle)
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The host id this service serves.
    pub fn host_id(&self) -> &str {
        &self.inner.host_id
    }

    /// The root of sessions.
    pub fn root(&self) -> &Root {
        &self.inner.root
    }

    /// The query side (cold and live reads, never taking the writer lock).
    pub fn query(&self) -> SessionQuery {
        SessionQuery::new(self.clone())
    }

    /// A ref of this host.
    pub fn session_ref(&self, id: SessionId) -> SessionRef {
        SessionRef {
            host_id: self.inner.host_id.clone(),
            session_id: id,
        }
    }

    fn check_ref(&self, r: &SessionRef) -> Result<()> {
        if r.host_id != self.inner.host_id {
            return Err(Error::invalid(format!(
                "session ref host {} is not this service's host {}",
                crate::error::quoted(&r.host_id),
                crate::error::quoted(&self.inner.host_id)
            )));
        }
        Ok(())
    }

    /// The published runtime of a session, if any (none for a ref of another host).
    pub fn runtime(&self, r: &SessionRef) -> Option<Runtime> {
        if r.host_id != self.inner.host_id {
            return None;
        }
        self.registry().active.get(&r.session_id).cloned()
    }

    /// Every session's published runtime, else the one a close is draining (its accepted
    /// state is still whole in memory), as of now. A listing takes them before it reads
    /// the catalog: a close records its session's entry before it lets go of the runtime,
    /// so a session found in neither here has its final entry in the catalog already
    /// (looked up after the catalog read, a close ending in between left the entry read
    /// before it, of a session that had not drained yet: `event_sequence` 0 of 300).
    pub(crate) fn live_runtimes(&self) -> HashMap<SessionId, Runtime> {
        let reg = self.registry();
        let mut live = reg.closing.clone();
        live.extend(reg.active.iter().map(|(id, rt)| (id.clone(), rt.clone())));
        live
    }

    /// Creates a session whose runtime is usable but not visible until published. The
    /// session itself is created in the root at once, as upstream's `PrepareCreate` does:
    /// it is listed and its id is taken; what stays hidden is its runtime, which
    /// [`Service::runtime`] does not return and [`Service::open`] does not bind
    /// ([`Error::WriterOwned`] naming this process: the prepared runtime holds the
    /// writer). [`Service::discard`] releases the writer and leaves the session; delete it
    /// ([`Service::delete`]) if it should not stay. A caller that stops waiting (its future
    /// dropped, its task aborted) before this returns leaves no session behind, as with
    /// [`Service::create`].
    ///
    /// # Errors
    /// [`Error::SessionExists`]; [`Error::ServiceShutDown`] after [`Service::shutdown`] (nothing
    /// created); storage errors.
    pub async fn prepare_create(&self, options: CreateOptions) -> Result<PreparedRuntime> {
        self.check_running()?;
        let caller = Caller::new(self, options.session_id.is_some());
        let (service, watch) = (self.clone(), caller.watch());
        let prepared = self
            .to_completion(async move {
                let root = service.inner.root.clone();
                let session = blocking(watch.unless_gone(move || root.create(options))).await?;
                let r = service.session_ref(session.id().clone());
                if let Some(mut handoff) = watch.hold() {
                    handoff.made(&r);
                    return Ok(PreparedRuntime {
                        service: Arc::downgrade(&service.inner),
                        runtime: Runtime::new(r, session),
                        stamp: random_hex(),
                        state: Mutex::new(PreparedState::default()),
                    });
                }
                if close_session(session).await.is_ok() {
                    let _ = service.delete(&r, &abandoned_wait()).await;
                }
                Err(Error::Cancelled)
            })
            .await;
        caller.take(prepared)
    }

    /// Publishes the exact prepared instance (idempotent while it stays published). One
    /// [`Service::detach`]ed since it was published is registered again (it still holds
    /// its writer): the runtime returned is always the one registered.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for one another service prepared (its session is in that
    /// service's root, under its host id); [`Error::SessionExists`] when another runtime
    /// is active for the session; [`Error::Closed`] for a discarded one or a published
    /// one closed since (through the service, or its session's own close after a
    /// detach); [`Error::ServiceShutDown`] for one not registered when the service was
    /// shut down.
    pub fn publish(&self, prepared: &PreparedRuntime) -> Result<Runtime> {
        if !self.prepared_here(prepared) {
            return Err(Error::invalid(format!(
                "prepared runtime {} belongs to another service; publish it there",
                prepared.runtime.session_ref()
            )));
        }
        let mut state = prepared.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.discarded.is_some() {
            return Err(Error::Closed);
        }
        // Closed since it was published (through the service, or by its session's own
        // close after a detach): its session refuses appends; handing it back as
        // published would hide that.
        if state.published
            && (prepared.runtime.phase() == RuntimePhase::Closed
                || prepared.runtime.session().close_began())
        {
            return Err(Error::Closed);
        }
        let id = prepared.runtime.session_ref().session_id.clone();
        let mut reg = self.registry();
        // Still registered: the idempotent case. Published once and detached since, it is
        // registered again below (it used to be handed back as published while the
        // registry knew nothing of it: `runtime(ref)` answered `None`, opens `WriterOwned`).
        if reg.active.get(&id) == Some(&prepared.runtime) {
            return Ok(prepared.runtime.clone());
        }
        if reg.stopped {
            return Err(Error::ServiceShutDown);
        }
        if reg.active.contains_key(&id) {
            return Err(Error::SessionExists(id.to_string()));
        }
        reg.active.insert(id.clone(), prepared.runtime.clone());
        reg.closed.remove(&id);
        state.published = true;
        drop(reg);
        self.inner.registry_changed.notify_waiters();
        Ok(prepared.runtime.clone())
    }

    /// Closes an unpublished prepared runtime and releases its writer. The session stays
    /// in the root, as upstream's `Discard` leaves it (any opener may open it then);
    /// [`Service::delete`] removes it. Repeated calls return the first result. One another
    /// service prepared is left alone (as upstream: a foreign one is a no-op).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a published runtime; the close error.
    pub async fn discard(&self, prepared: &PreparedRuntime) -> Result<()> {
        if !self.prepared_here(prepared) {
            return Ok(());
        }
        {
            let state = prepared.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.published {
                return Err(Error::invalid("published runtime cannot be discarded"));
            }
            if let Some(result) = &state.discarded {
                return result.clone();
            }
        }
        let result = close_session(prepared.runtime.session().clone()).await;
        prepared.runtime.mark_closed();
        let mut state = prepared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.discarded = Some(result.clone());
        result
    }

    /// Whether this service (or a clone of it) prepared `prepared`.
    fn prepared_here(&self, prepared: &PreparedRuntime) -> bool {
        std::ptr::eq(prepared.service.as_ptr(), Arc::as_ptr(&self.inner))
    }

    /// Creates and publishes a session. Its id is reserved like an open's while it is
    /// created: an open of it in this service meanwhile waits and gets its runtime (or
    /// finds no session, when it came first), never [`Error::WriterOwned`] for this
    /// process's own create.
    ///
    /// A caller that gave no id and stops waiting (its future dropped by a timeout or a
    /// `select!`, its task aborted) before this returns leaves no session behind (with an
    /// id, the create runs on to the end and a later open gets the session): the create
    /// stops before it makes the session, or the session it made is
    /// deleted again (unless someone bound it or runs an execution on it meanwhile, or
    /// another process took its writer within 10 s: then it stays). The same holds for
    /// [`Service::prepare_create`], [`Service::fork`], [`Service::rewind`] and
    /// [`Service::import`].
    ///
    /// # Errors
    /// As [`Service::prepare_create`] and [`Service::publish`].
    pub async fn create(&self, mut options: CreateOptions) -> Result<Runtime> {
        let caller = Caller::new(self, options.session_id.is_some());
        let id = options
            .session_id
            .get_or_insert_with(SessionId::random)
            .clone();
        let (service, watch) = (self.clone(), caller.watch());
        let created = self
            .to_completion(async move {
                if service.reserve(&id).await?.is_some() {
                    return Err(Error::SessionExists(id.to_string()));
                }
                let root = service.inner.root.clone();
                let created = blocking(watch.unless_gone(move || root.create(options))).await;
                service
                    .install_for(&service.session_ref(id), created, &watch)
                    .await
            })
            .await;
        caller.take(created)
    }

    /// Opens (or reuses) the session's runtime and binds a client to it. Concurrent calls
    /// get the same instance. A reopened session whose last turn is open is closed by one
    /// recovery batch before it is published. A published runtime whose close failed
    /// (it accepts nothing more) is closed again first, writing the tail it kept, and the
    /// session opened anew.
    ///
    /// # Errors
    /// [`Error::SessionNotFound`]; [`Error::WriterOwned`] when another writer holds it:
    /// another process, or a handle of this one outside this service's registry (a
    /// [`Root::open_writer`] session, a [`Service::prepare_create`] not yet published,
    /// another `Service` over the same root); the error of the retried close when it
    /// fails again (e.g. [`Error::DiskFull`]); [`Error::ServiceShutDown`] after [`Service::shutdown`].
    pub async fn open(&self, r: &SessionRef) -> Result<ClientBinding> {
        loop {
            let runtime = self.open_runtime(r).await?;
            // Counted only while it is still the published runtime, under the registry
            // lock a close takes too: a close that unpublished it after `open_runtime`
            // returned (and found no binding to refuse it) is closing it, so open again,
            // which waits for that close. Counted anyway, the binding was of a closed
            // runtime (appends `Closed`) and its count stayed behind for the next one.
            let mut reg = self.registry();
            if reg.active.get(&r.session_id) != Some(&runtime) {
                continue;
            }
            *reg.bindings.entry(r.session_id.clone()).or_default() += 1;
            return Ok(ClientBinding {
                service: self.clone(),
                runtime,
                released: std::sync::atomic::AtomicBool::new(false),
            });
        }
    }

    pub(crate) async fn open_runtime(&self, r: &SessionRef) -> Result<Runtime> {
        loop {
            let runtime = self.published_or_opened(r).await?;
            if !runtime.session().close_began() {
                return Ok(runtime);
            }
            // Still published, a close of it failed (its drain, e.g. on a full disk): it
            // accepts nothing more and would answer every append `Closed`. Retry that
            // close (it writes the tail it kept) and open the session again; its error,
            // if it fails again. Unpublished, a close took it meanwhile: open again.
            let published = || self.registry().active.get(&r.session_id) == Some(&runtime);
            if published() {
                match self.close(r).await {
                    Err(Error::RuntimeBound(_) | Error::RuntimeBusy(_)) if !published() => {}
                    other => other?,
                }
            }
        }
    }

    /// The published runtime of `r`, else the runtime of the session opened now.
    async fn published_or_opened(&self, r: &SessionRef) -> Result<Runtime> {
        self.check_ref(r)?;
        let (service, r) = (self.clone(), r.clone());
        self.to_completion(async move {
            if let Some(rt) = service.reserve(&r.session_id).await? {
                return Ok(rt);
            }
            let root = service.inner.root.clone();
            let open_id = r.session_id.clone();
            let opened = blocking(move || {
                let session = root.open_writer(&open_id)?;
                recovery::close_interrupted_turn(&session)?;
                Ok(session)
            })
            .await;
            service.install(&r, opened)
        })
        .await
    }

    /// Returns the runtime of `id` when it is published; otherwise reserves `id` in
    /// `preparing` (waiting while another open holds the reservation) and returns `None`:
    /// the caller opens the session and ends with [`Service::install`].
    ///
    /// # Errors
    /// [`Error::ServiceShutDown`] once the service is shut down.
    async fn reserve(&self, id: &SessionId) -> Result<Option<Runtime>> {
        loop {
            let notified = {
                let mut reg = self.registry();
                if reg.stopped {
                    return Err(Error::ServiceShutDown);
                }
                if let Some(rt) = reg.active.get(id) {
                    return Ok(Some(rt.clone()));
                }
                if !reg.preparing.contains(id) && !reg.deleting.contains(id) {
                    reg.preparing.insert(id.clone());
                    return Ok(None);
                }
                self.inner.registry_changed.notified()
            };
            notified.await;
        }
    }

    /// Ends the open of a session reserved in `preparing`: publishes its runtime when
    /// `opened` succeeded, and wakes whoever waits for the reservation either way.
    fn install(&self, r: &SessionRef, opened: Result<Session>) -> Result<Runtime> {
        let session = match opened {
            Ok(session) => session,
            Err(e) => {
                self.release_reservation(&r.session_id);
                return Err(e);
            }
        };
        let id = &r.session_id;
        let rt = Runtime::new(r.clone(), session);
        {
            let mut reg = self.registry();
            reg.preparing.remove(id);
            reg.active.insert(id.clone(), rt.clone());
            reg.closed.remove(id);
        }
        self.inner.registry_changed.notify_waiters();
        Ok(rt)
    }

    /// [`Service::install`] of a session made for a caller that may be gone ([`Watch`]):
    /// published only while the caller waits; made for a caller gone, it is closed and
    /// deleted, its id reserved until then, and the call answers [`Error::Cancelled`]
    /// (to nobody).
    async fn install_for(
        &self,
        r: &SessionRef,
        opened: Result<Session>,
        watch: &Watch,
    ) -> Result<Runtime> {
        let session = match opened {
            Ok(session) => session,
            Err(e) => {
                self.release_reservation(&r.session_id);
                return Err(e);
            }
        };
        if let Some(mut handoff) = watch.hold() {
            let rt = self.install(r, Ok(session))?;
            handoff.made(r);
            return Ok(rt);
        }
        match close_session(session).await {
            Ok(()) => drop(self.delete_reserved(r, &abandoned_wait(), true).await),
            Err(_) => self.release_reservation(&r.session_id),
        }
        Err(Error::Cancelled)
    }

    /// Ends a failed open of a session reserved in `preparing`: drops the reservation and
    /// wakes whoever waits for it.
    fn release_reservation(&self, id: &SessionId) {
        self.registry().preparing.remove(id);
        self.inner.registry_changed.notify_waiters();
    }

    /// Removes the runtime from the registry only if it is still the exact published
    /// instance; does not close it.
    pub fn detach(&self, runtime: &Runtime) -> bool {
        let mut reg = self.registry();
        let id = &runtime.session_ref().session_id;
        if reg.active.get(id) == Some(runtime) {
            reg.active.remove(id);
            reg.bindings.remove(id);
            true
        } else {
            false
        }
    }

    /// Closes the session's runtime: drains, releases the writer, unregisters. Idempotent:
    /// a close of a session among the last 4,096 closed here (and not opened again)
    /// answers `Ok`; of one closed earlier, [`Error::SessionNotRunning`] as of one never
    /// opened here (the registry keeps nothing more of the sessions it closed).
    /// While it closes, the runtime is no longer published: an open of the session waits
    /// for the close and opens it again; another close waits and returns `Ok`.
    ///
    /// # Errors
    /// [`Error::RuntimeBound`] while client bindings remain; [`Error::RuntimeBusy`] while
    /// it runs (the runtime stays registered in both cases); [`Error::SessionNotRunning`]
    /// for a session never opened here (or closed before the last 4,096 closes).
    pub async fn close(&self, r: &SessionRef) -> Result<()> {
        self.close_keeping(r, false).await.map(drop)
    }

    /// [`Service::close`]; with `keep_reserved`, a close that closed the runtime leaves the
    /// session id reserved in `preparing` for the caller, which then holds the reservation
    /// and must end it (so that no open gets in before the caller's next step). Returns
    /// whether it did.
    async fn close_keeping(&self, r: &SessionRef, keep_reserved: bool) -> Result<bool> {
        self.check_ref(r)?;
        let id = r.session_id.clone();
        // Unpublished and reserved while it closes: an open meanwhile waits for the close
        // and then opens the session again, instead of binding the runtime being closed.
        // A close or open of the same session under way is waited for first.
        let runtime = loop {
            let notified = {
                let mut reg = self.registry();
                if let Some(rt) = reg.active.get(&id) {
                    if reg.bindings.get(&id).copied().unwrap_or(0) > 0 {
                        return Err(Error::RuntimeBound(id.to_string()));
                    }
                    // Checked and marked closing at once: an execution bound after this
                    // check would be closed under it.
                    if !rt.begin_close() {
                        return Err(Error::RuntimeBusy(id.to_string()));
                    }
                    let rt = rt.clone();
                    reg.active.remove(&id);
                    // No binding is counted (checked above): a zero left behind for each
                    // session ever closed grew the registry without bound.
                    reg.bindings.remove(&id);
                    reg.preparing.insert(id.clone());
                    reg.closing.insert(id.clone(), rt.clone());
                    break rt;
                }
                if !reg.preparing.contains(&id) {
                    return if reg.closed.contains(&id) {
                        Ok(false)
                    } else {
                        Err(Error::SessionNotRunning(id.to_string()))
                    };
                }
                self.inner.registry_changed.notified()
            };
            notified.await;
        };
        let service = self.clone();
        self.to_completion(async move {
            let result = close_session(runtime.session().clone()).await;
            if result.is_ok() {
                runtime.mark_closed();
                record_in_catalog(service.inner.root.clone(), runtime.session().clone()).await;
            }
            {
                let mut reg = service.registry();
                reg.closing.remove(&id);
                if result.is_err() || !keep_reserved {
                    reg.preparing.remove(&id);
                }
                if result.is_ok() {
                    reg.closed.insert(id);
                } else {
                    // Still open: published again, as it was.
                    runtime.abort_close();
                    reg.active.insert(id, runtime);
                }
            }
            service.inner.registry_changed.notify_waiters();
            result.map(|()| keep_reserved)
        })
        .await
    }

    /// The sessions whose runtime is open in this service, as of now, sorted by id: each
    /// published runtime and each one a close is draining. After [`Service::close_all`] or
    /// [`Service::shutdown`] returns an error, these are the runtimes it left open (still
    /// accepting appends and holding their writer locks); release their bindings or end
    /// their executions and close them again.
    pub fn open_sessions(&self) -> Vec<SessionRef> {
        let mut ids: Vec<SessionId> = self.live_runtimes().into_keys().collect();
        ids.sort();
        ids.into_iter().map(|id| self.session_ref(id)).collect()
    }

    /// Closes every runtime; a bound or busy one stays open and registered (as
    /// [`Service::close`] leaves it): [`Service::open_sessions`] lists those left.
    ///
    /// # Errors
    /// The first error met, after trying every runtime; it names one session only, so
    /// call [`Service::open_sessions`] for every runtime left open.
    pub async fn close_all(&self) -> Result<()> {
        let refs: Vec<SessionRef> = self
            .registry()
            .active
            .values()
            .map(|rt| rt.session_ref().clone())
            .collect();
        let mut first = None;
        for r in refs {
            if let Err(e) = self.close(&r).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Stops the service: from now on it opens, creates and publishes nothing (`create`,
    /// `prepare_create`, `publish`, `open`, `fork`, `rewind`, `rename` and
    /// `continue_legacy` of it and its clones return [`Error::ServiceShutDown`]); an open or close
    /// under way is waited for, then every runtime is closed (use before removing the
    /// root). Queries, `export` and `import` still answer. A bound or busy runtime stays
    /// open ([`Service::open_sessions`] lists those left); `close` and `close_all` still
    /// close them once their bindings are released and their executions have ended.
    ///
    /// # Errors
    /// As [`Service::close_all`]: the first error met, naming one session only.
    pub async fn shutdown(&self) -> Result<()> {
        loop {
            let notified = {
                let mut reg = self.registry();
                reg.stopped = true;
                if reg.preparing.is_empty() {
                    break;
                }
                self.inner.registry_changed.notified()
            };
            notified.await;
        }
        self.close_all().await
    }

    /// [`Error::ServiceShutDown`] once the service is shut down.
    fn check_running(&self) -> Result<()> {
        if self.registry().stopped {
            return Err(Error::ServiceShutDown);
        }
        Ok(())
    }

    /// Flushes an attached runtime.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a ref of another host; [`Error::SessionNotRunning`];
    /// the drain's error.
    pub async fn flush(&self, r: &SessionRef) -> Result<u64> {
        self.check_ref(r)?;
        let rt = self
            .runtime(r)
            .ok_or_else(|| Error::SessionNotRunning(r.session_id.to_string()))?;
        let session = rt.session().clone();
        blocking(move || session.flush()).await
    }

    /// Cancels the attached runtime's execution and returns its state.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a ref of another host; [`Error::SessionNotRunning`]
    /// without an attached runtime.
    pub fn cancel(&self, r: &SessionRef) -> Result<RuntimeSnapshot> {
        self.check_ref(r)?;
        let rt = self
            .runtime(r)
            .ok_or_else(|| Error::SessionNotRunning(r.session_id.to_string()))?;
        rt.cancel();
        Ok(rt.snapshot())
    }

    /// Cancels whatever runs for the session; accepted (phase idle) without a runtime.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a ref of another host.
    pub fn cancel_session(&self, r: &SessionRef) -> Result<CancelReceipt> {
        self.check_ref(r)?;
        let Some(rt) = self.runtime(r) else {
            return Ok(CancelReceipt {
                session_ref: r.clone(),
                accepted: true,
                runtime_epoch: None,
                activity_revision: 0,
                phase: RuntimePhase::Idle,
            });
        };
        rt.cancel();
        Ok(CancelReceipt {
            session_ref: r.clone(),
            accepted: true,
            runtime_epoch: Some(rt.epoch().to_owned()),
            activity_revision: rt.revision(),
            phase: rt.phase(),
        })
    }

    /// The published runtime of `id` once no open or close of it is under way here (waited
    /// for), or `None` when it has none: then everything this service accepted for it is
    /// in the file. A close unpublishes the runtime while it drains: a read that did not
    /// wait read the file without the accepted tail (a history of 300 accepted messages
    /// answered empty while the close ran; a fork or export missed that tail).
    pub(crate) async fn settled_runtime(&self, id: &SessionId) -> Option<Runtime> {
        loop {
            let notified = {
                let reg = self.registry();
                if let Some(rt) = reg.active.get(id) {
                    return Some(rt.clone());
                }
                if !reg.preparing.contains(id) {
                    return None;
                }
                self.inner.registry_changed.notified()
            };
            notified.await;
        }
    }

    /// Makes durable what this service accepted for `id` before the call: flushes its
    /// published runtime, after waiting for an open or close of it under way
    /// ([`Service::settled_runtime`]).
    async fn flush_attached(&self, id: &SessionId) -> Result<()> {
        match self.settled_runtime(id).await {
            Some(rt) => {
                let session = rt.session().clone();
                blocking(move || session.flush()).await.map(drop)
            }
            None => Ok(()),
        }
    }

    async fn fork_at(
        &self,
        r: &SessionRef,
        point: ForkPoint,
        child: Option<SessionId>,
    ) -> Result<Runtime> {
        self.check_ref(r)?;
        self.flush_attached(&r.session_id).await?;
        let caller = Caller::new(self, child.is_some());
        let child = child.unwrap_or_else(SessionId::random);
        // Reserved like an open, so that an open of the child in this service waits for
        // the fork's runtime instead of racing it for the writer lock.
        {
            let mut reg = self.registry();
            if reg.stopped {
                return Err(Error::ServiceShutDown);
            }
            if reg.active.contains_key(&child) || !reg.preparing.insert(child.clone()) {
                return Err(Error::SessionExists(child.to_string()));
            }
        }
        let root = self.inner.root.clone();
        let parent = r.session_id.clone();
        let (service, watch) = (self.clone(), caller.watch());
        let forked = self
            .to_completion(async move {
                let fork_id = child.clone();
                // The child is published with its writer lock held and opened under it: no
                // other process can take it in between (`Root::fork_writer`).
                let opened = blocking(watch.unless_gone(move || {
                    let session = root.fork_writer(&parent, point, Some(fork_id))?;
                    recovery::close_interrupted_turn(&session)?;
                    Ok(session)
                }))
                .await;
                service
                    .install_for(&service.session_ref(child), opened, &watch)
                    .await
            })
            .await;
        caller.take(forked)
    }

    /// Forks after a completed turn and publishes the child's runtime. An attached
    /// runtime of the parent is flushed first (or a close of it under way waited for), so
    /// a turn it accepted is there to cut at.
    ///
    /// # Errors
    /// As [`Root::fork`]; [`Error::ServiceShutDown`] after [`Service::shutdown`].
    pub async fn fork(
        &self,
        r: &SessionRef,
        after_turn: &str,
        child: Option<SessionId>,
    ) -> Result<Runtime> {
        self.fork_at(r, ForkPoint::AfterTurn(after_turn.to_owned()), child)
            .await
    }

    /// Rewinds to before a turn into a new session and publishes its runtime. An attached
    /// runtime of the parent is flushed first (or a close of it under way waited for), so
    /// a turn it accepted is there to cut at.
    ///
    /// # Errors
    /// As [`Root::fork`]; [`Error::ServiceShutDown`] after [`Service::shutdown`].
    pub async fn rewind(
        &self,
        r: &SessionRef,
        before_turn: &str,
        child: Option<SessionId>,
    ) -> Result<Runtime> {
        self.fork_at(r, ForkPoint::BeforeTurn(before_turn.to_owned()), child)
            .await
    }

    /// Exports a session (flushing an attached runtime first, or waiting for a close of it
    /// under way) to one self-contained file. A caller that stops waiting (its future
    /// dropped, its task aborted) stops the copy at its next commit, and nothing is left
    /// at the destination or beside it; a file already renamed into place stays.
    ///
    /// # Errors
    /// As [`Root::export`].
    pub async fn export(
        &self,
        r: &SessionRef,
        destination: impl AsRef<Path>,
    ) -> Result<ExportReport> {
        self.check_ref(r)?;
        self.flush_attached(&r.session_id).await?;
        let root = self.inner.root.clone();
        let id = r.session_id.clone();
        let dest: PathBuf = destination.as_ref().to_path_buf();
        // Dropped, the caller is gone: the copy stops at its next commit and removes its
        // temporary file (`Root::export_cancellable`).
        let caller = Caller::new(self, false);
        let gone = caller.watch().gone().clone();
        let exported = blocking(move || root.export_cancellable(&id, dest, &gone)).await;
        caller.take(exported)
    }

    /// Imports an exported file under its own id.
    ///
    /// # Errors
    /// As [`Root::import`].
    pub async fn import(&self, file: impl AsRef<Path>) -> Result<SessionRef> {
        self.import_with_header(file, ImportOptions::default())
            .await
    }

    /// Imports an exported file with an id remap, cwd and origin. A caller that stops
    /// waiting (its future dropped, its task aborted) leaves no session behind: the
    /// import does not start or stops at its next commit ([`Root::import_cancellable`]),
    /// or the session it published meanwhile is deleted again, as for [`Service::create`].
    ///
    /// # Errors
    /// As [`Root::import`].
    pub async fn import_with_header(
        &self,
        file: impl AsRef<Path>,
        options: ImportOptions,
    ) -> Result<SessionRef> {
        let (root, file) = (self.inner.root.clone(), file.as_ref().to_path_buf());
        let caller = Caller::new(self, false);
        let (service, watch) = (self.clone(), caller.watch());
        let imported = self
            .to_completion(async move {
                let gone = watch.gone().clone();
                let id = blocking(move || root.import_cancellable(file, options, &gone)).await?;
                let r = service.session_ref(id);
                if let Some(mut handoff) = watch.hold() {
                    handoff.made(&r);
                    return Ok(r);
                }
                let _ = service.delete(&r, &abandoned_wait()).await;
                Err(Error::Cancelled)
            })
            .await;
        caller.take(imported)
    }

    /// Deletes a session: closes its attached runtime first (refusing a busy or bound
    /// one), then deletes it (waiting for another process's writer until `cancel`). The
    /// session id is reserved as an open reserves it while the delete runs: an open or
    /// close of it in this service meanwhile is waited for (an open racing it either came
    /// first, and its runtime is closed or its binding refuses the delete, or finds no
    /// session); queries of it still answer. Runs to the end when the caller stops
    /// waiting; `cancel` stops the wait.
    ///
    /// # Errors
    /// As [`Service::close`] and [`Root::delete`].
    pub async fn delete(&self, r: &SessionRef, cancel: &CancelToken) -> Result<()> {
        self.check_ref(r)?;
        let (service, r, cancel) = (self.clone(), r.clone(), cancel.clone());
        self.to_completion(async move {
            let reserved = loop {
                match service.reserve(&r.session_id).await {
                    Ok(None) => break true,
                    // Shut down: nothing opens here any more, only a runtime left bound or
                    // busy by `shutdown` may still be registered.
                    Err(Error::ServiceShutDown) if service.runtime(&r).is_none() => break false,
                    // Closed keeping the id reserved: an open racing the delete waits for
                    // it instead of opening the session again (which the delete would
                    // close again, round after round, before the open's binding counted).
                    Ok(Some(_)) | Err(Error::ServiceShutDown) => {
                        if service.close_keeping(&r, true).await? {
                            break true;
                        }
                    }
                    Err(e) => return Err(e),
                }
            };
            service.delete_reserved(&r, &cancel, reserved).await
        })
        .await
    }

    /// The delete of [`Service::delete`] once no runtime of `r` is published: with
    /// `reserved`, the caller holds the id's reservation in `preparing`, which moves to
    /// `deleting` until the delete ends.
    async fn delete_reserved(
        &self,
        r: &SessionRef,
        cancel: &CancelToken,
        reserved: bool,
    ) -> Result<()> {
        if reserved {
            let mut reg = self.registry();
            reg.preparing.remove(&r.session_id);
            reg.deleting.insert(r.session_id.clone());
        }
        self.inner.registry_changed.notify_waiters();
        let (root, id, cancel) = (
            self.inner.root.clone(),
            r.session_id.clone(),
            cancel.clone(),
        );
        let deleted = blocking(move || root.delete(&id, &cancel)).await;
        {
            let mut reg = self.registry();
            if deleted.is_ok() {
                reg.closed.remove(&r.session_id);
            }
            reg.deleting.remove(&r.session_id);
        }
        self.inner.registry_changed.notify_waiters();
        deleted
    }

    /// Renames a session: appends a `session/title` event as its writer. Through the
    /// attached runtime when there is one (the title is in its projection at once, and
    /// durable when this returns); otherwise as [`Root::rename`], with the session id
    /// reserved as an open reserves it (an open or close of it in this service meanwhile
    /// waits; a rename racing a close waits for the close and renames the closed session).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a blank title, one holding NUL or one over 1,024 bytes;
    /// [`Error::SessionNotFound`];
    /// [`Error::WriterOwned`] when another process writes it; as [`Session::append`];
    /// [`Error::ServiceShutDown`] after [`Service::shutdown`].
    pub async fn rename(&self, r: &SessionRef, title: &str) -> Result<()> {
        self.check_ref(r)?;
        let (service, r, title) = (self.clone(), r.clone(), title.to_owned());
        self.to_completion(async move {
            loop {
                if let Some(rt) = service.reserve(&r.session_id).await? {
                    let (session, title) = (rt.session().clone(), title.clone());
                    let renamed = blocking(move || {
                        session.rename(&title)?;
                        session.flush().map(drop)
                    })
                    .await;
                    // Closed by a close that unpublished it meanwhile: rename it cold,
                    // once that close is over.
                    if matches!(renamed, Err(Error::Closed))
                        && service.runtime(&r).as_ref() != Some(&rt)
                    {
                        continue;
                    }
                    return renamed;
                }
                let (root, id) = (service.inner.root.clone(), r.session_id.clone());
                let title = title.clone();
                let renamed = blocking(move || root.rename(&id, &title)).await;
                service.release_reservation(&r.session_id);
                return renamed;
            }
        })
        .await
    }

    /// Continues a legacy transcript (one message JSON per line) as a new session with a
    /// deterministic id; the source file is never written. A second call reuses it.
    /// `head` freezes the transcript at the message with that id (inclusive); "" keeps it
    /// all.
    ///
    /// # Errors
    /// [`Error::Io`] for an unreadable source; [`Error::InvalidInput`] for a line that is
    /// not a message or not UTF-8 (other than a torn last line), or a `head` that no
    /// message has; [`Error::ServiceShutDown`] after [`Service::shutdown`].
    pub async fn continue_legacy(
        &self,
        source: impl AsRef<Path>,
        head: &str,
    ) -> Result<(Runtime, MigrationRecord)> {
        let source = source.as_ref().to_path_buf();
        let head = head.to_owned();
        let migration = Arc::new(blocking(move || legacy::Migration::read(&source, &head)).await?);
        let r = self.session_ref(migration.target_id().clone());
        let root = self.inner.root.clone();
        let service = self.clone();
        self.to_completion(async move {
            // Already open in this service: reuse that runtime.
            while let Some(rt) = service.reserve(&r.session_id).await? {
                let (session, root, m) = (rt.session().clone(), root.clone(), migration.clone());
                let completed = blocking(move || m.complete(&root, &session)).await;
                // Closed by a close that unpublished it meanwhile: continue the closed
                // session once that close is over.
                if matches!(completed, Err(Error::Closed))
                    && service.runtime(&r).as_ref() != Some(&rt)
                {
                    continue;
                }
                return Ok((rt, completed?));
            }
            // Published with its writer lock held and opened under it: no other process
            // can take the migrated session in between (`Root::create_filled`).
            let migrated = blocking(move || {
                let (session, record) = migration.run(&root)?;
                recovery::close_interrupted_turn(&session)?;
                Ok((session, record))
            })
            .await;
            match migrated {
                Ok((session, record)) => Ok((service.install(&r, Ok(session))?, record)),
                Err(e) => {
                    service.release_reservation(&r.session_id);
                    Err(e)
                }
            }
        })
        .await
    }
}

/// Stores a closed session's catalog entry from its in-memory projection (no re-fold).
async fn record_in_catalog(root: Root, session: Session) {
    // The catalog is derived: a failed update only costs a recomputation when listed.
    let _ = blocking(move || root.record_closed(&session)).await;
}

async fn close_session(session: Session) -> Result<()> {
    blocking(move || session.close()).await
}

impl ClientBinding {
    /// The bound runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Releases the binding (once; later calls do nothing). Dropping the binding releases
    /// it too.
    ///
    /// # Errors
    /// None today; reserved for retirement failures.
    pub async fn release(&self) -> Result<()> {
        self.let_go();
        Ok(())
    }

    /// Takes this binding off its runtime's count, the first time only.
    fn let_go(&self) {
        if self
            .released
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let mut reg = self.service.registry();
        let id = &self.runtime.session_ref().session_id;
        // The count is the registered runtime's: a binding of one detached since (and
        // maybe replaced by a new runtime) has nothing to take off.
        if reg.active.get(id) != Some(&self.runtime) {
            return;
        }
        if let Some(n) = reg.bindings.get_mut(id) {
            *n = n.saturating_sub(1);
        }
    }
}

impl Drop for ClientBinding {
    /// A binding dropped without [`ClientBinding::release`] (an early return, a panic)
    /// lets go of its runtime as well, so the runtime can still be closed.
    fn drop(&mut self) {
        self.let_go();
    }
}

impl PreparedRuntime {
    /// The prepared runtime (usable before publish).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Random stamp of this preparation.
    pub fn stamp(&self) -> &str {
        &self.stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry keeps nothing of the sessions it closed beyond the last
    /// [`CLOSED_KEPT`] (8 here; it kept every closed id, and a binding count of 0 for each,
    /// for the life of the service); a session among those closes again with `Ok`, an
    /// older one answers `SessionNotRunning`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_registry_forgets_sessions_closed_long_ago() {
        let dir = tempfile::tempdir().expect("tempdir");
        let service = Service::new("local", Root::open(dir.path()).expect("root")).expect("svc");
        let kept = 8;
        service.registry().closed.kept = kept;
        let r = |n: usize| service.session_ref(SessionId::new(format!("s{n}")).expect("id"));
        let total = kept + 5;
        for n in 0..total {
            let rt = service
                .create(CreateOptions::with_id(r(n).session_id))
                .await
                .expect("create");
            drop(rt);
            let binding = service.open(&r(n)).await.expect("open");
            binding.release().await.expect("release");
            service.close(&r(n)).await.expect("close");
        }
        {
            let reg = service.registry();
            assert_eq!(reg.closed.stamps.len(), kept);
            assert_eq!(reg.closed.order.len(), kept);
            assert!(reg.bindings.is_empty(), "{} counts", reg.bindings.len());
            assert!(reg.active.is_empty() && reg.preparing.is_empty());
        }
        service
            .close(&r(total - 1))
            .await
            .expect("closed lately: Ok");
        let again = service.close(&r(0)).await;
        assert!(
            matches!(again, Err(Error::SessionNotRunning(_))),
            "{again:?}"
        );
        // Reopened and closed again: its newer close is kept, the older one's slot ends.
        for _ in 0..2 * kept {
            let binding = service.open(&r(total - 1)).await.expect("reopen");
            binding.release().await.expect("release");
            service.close(&r(total - 1)).await.expect("close");
        }
        service
            .close(&r(total - 1))
            .await
            .expect("closed lately: Ok");
        let reg = service.registry();
        assert_eq!(reg.closed.stamps.len(), 1);
        assert_eq!(reg.closed.order.len(), kept);
    }
}
