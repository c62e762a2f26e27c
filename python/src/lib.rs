//! `session_store._native`: the Rust side of the `session_store` Python package.
//!
//! A thin layer over [`session_store::Root`], [`session_store::Session`] and
//! [`session_store::SessionQuery`]: every call that touches SQLite or the file system releases the
//! GIL (`Python::detach`), JSON crosses the boundary as text (the Python side encodes and
//! decodes it with the standard `json` module, so payloads are stored as given), and every
//! [`session_store::Error`] becomes an instance of the exception class of its variant.
//! The Pythonic API (dicts, context managers, async variants) is `session_store/__init__.py`.

mod pyjson;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod fork;
mod per_process;

use per_process::PerProcess;
use pyo3::PyTypeInfo;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileExistsError, PyLookupError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple, PyType};
use serde::Serialize;
use session_store::{
    Batch, CancelToken, CreateOptions, Durability, Error, ForkPoint, ImportOptions, ListFilter,
    ListSort, Origin, SearchOptions, Service, SessionId, SessionQuery, SessionReader, Snippet,
    StoreOptions, absolute_cwd,
};

create_exception!(
    session_store,
    SessionStoreError,
    PyException,
    "Base class of every error raised by session_store."
);
create_exception!(
    session_store,
    WriterOwned,
    SessionStoreError,
    "Another writer owns the session; `owner` is a dict (owner_id, host, pid, generation, since_ms, holding_for: \"delete\" while a delete holds it, else None)."
);
create_exception!(
    session_store,
    UnsupportedVersion,
    SessionStoreError,
    "A file, schema or required event kind newer than this build understands."
);
create_exception!(
    session_store,
    Corrupt,
    SessionStoreError,
    "A file that is damaged or not a session file."
);
create_exception!(
    session_store,
    InternalError,
    SessionStoreError,
    "An invariant broke inside the library (a bug, not the caller's doing)."
);
create_exception!(
    session_store,
    Closed,
    SessionStoreError,
    "The session was closed; it accepts nothing more."
);
create_exception!(
    session_store,
    StaleGeneration,
    SessionStoreError,
    "Another writer took the lease: this handle is fenced off."
);
create_exception!(
    session_store,
    Poisoned,
    SessionStoreError,
    "An earlier failure left a commit's outcome unknown; reopen the session."
);
create_exception!(
    session_store,
    PersistenceFailed,
    SessionStoreError,
    "The last write failed; the accepted tail is kept and the next flush retries."
);
create_exception!(
    session_store,
    DiskFull,
    PersistenceFailed,
    "The disk (or its quota) is full."
);
create_exception!(
    session_store,
    Cancelled,
    SessionStoreError,
    "The wait was cancelled (e.g. `delete` gave up waiting for the writer)."
);
create_exception!(
    session_store,
    ForkBoundaryNotAtomic,
    SessionStoreError,
    "The fork or rewind cut does not fall on a commit boundary."
);
create_exception!(
    session_store,
    ForkActiveAuthority,
    SessionStoreError,
    "The fork or rewind prefix leaves an open turn or a pending interaction."
);
create_exception!(
    session_store,
    RuntimeStateError,
    SessionStoreError,
    "The service runtime is busy, bound, not running, stale or needs recovery."
);
create_exception!(
    session_store,
    StorageError,
    SessionStoreError,
    "An operating-system I/O error or any other SQLite error."
);

/// The class `name` of `session_store`, documented by `doc`, subclassing `bases` (a
/// `SessionStoreError` class and, for a class whose meaning is a builtin error's, that
/// builtin, so that `except ValueError` catches `InvalidInput`): made once, by `type(...)`
/// (PyO3's `create_exception!` takes one base), and kept in `cell`.
fn mixed_class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    doc: &str,
    bases: Vec<Bound<'py, PyType>>,
) -> PyResult<Bound<'py, PyType>> {
    let class = cell.get_or_try_init(py, || {
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "session_store")?;
        namespace.set_item("__doc__", doc)?;
        let made = py
            .get_type::<PyType>()
            .call1((name, PyTuple::new(py, bases)?, namespace))?;
        PyResult::Ok(made.cast_into::<PyType>()?.unbind())
    })?;
    Ok(class.bind(py).clone())
}

/// Declares `$class(py)`, the `session_store.$name` exception class subclassing the classes
/// the functions `$base` give (see [`mixed_class`]).
macro_rules! mixed_exception {
    ($class:ident, $name:literal, [$($base:expr),+], $doc:literal) => {
        #[doc = concat!("The class `session_store.", $name, "`: ", $doc)]
        fn $class(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
            static CELL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
            mixed_class(py, &CELL, $name, $doc, vec![$($base(py)?),+])
        }
    };
}

/// The class of `T` (`SessionStoreError`, a builtin error), as [`mixed_exception!`] wants it.
fn class_of<T: PyTypeInfo>(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    Ok(py.get_type::<T>())
}

mixed_exception!(
    invalid_input_class,
    "InvalidInput",
    [class_of::<SessionStoreError>, class_of::<PyValueError>],
    "The caller passed something malformed: an id, a batch, a cursor, an option, JSON. Also a ValueError."
);
mixed_exception!(
    invalid_payload_class,
    "InvalidPayload",
    [invalid_input_class],
    "An event payload does not match its kind's schema. Also a ValueError."
);
mixed_exception!(
    operation_conflict_class,
    "OperationConflict",
    [invalid_input_class],
    "The operation id was used before with different content. Also a ValueError."
);
mixed_exception!(
    not_found_class,
    "NotFound",
    [class_of::<SessionStoreError>, class_of::<PyLookupError>],
    "No session with this id exists under the root. Also a LookupError."
);
mixed_exception!(
    already_exists_class,
    "AlreadyExists",
    [class_of::<SessionStoreError>, class_of::<PyFileExistsError>],
    "A session (or export destination) with this name already exists. Also a FileExistsError."
);

/// An instance of the class `class` makes, with message `msg` (or the error making it).
fn new_err(
    py: Python<'_>,
    class: fn(Python<'_>) -> PyResult<Bound<'_, PyType>>,
    msg: String,
) -> PyErr {
    match class(py) {
        Ok(class) => PyErr::from_type(class, msg),
        Err(other) => other,
    }
}

/// The exception of `e`'s variant, with its message (and `owner` for `WriterOwned`).
fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let msg = e.to_string();
    to_py_with(py, e, msg)
}

/// [`to_py`] of an error of a call on session `session`: the errors whose message does not
/// say which session they are of (a closed or fenced writer, a failed write, a damaged
/// file) name it first, `session ID: …`, and a closed one says `session ID is closed`
/// (the library's "session is closed" names none, and a host of many sessions, an agents
/// `Runner`, a LangGraph server, could not tell which; `session ID: session is closed`
/// said "session" twice). A writer owned by another is named by the library, by the id of
/// the store (which an adapter may have mapped): it is named so by the caller's name too.
fn to_py_of(py: Python<'_>, session: &str, e: Error) -> PyErr {
    if let Error::Closed = e {
        let msg = format!("session {} is closed", session_store::quoted(session));
        return to_py_with(py, e, msg);
    }
    let msg = e.to_string();
    let unnamed = matches!(
        e,
        Error::WriterOwned { .. }
            | Error::StaleGeneration { .. }
            | Error::Poisoned(_)
            | Error::PersistenceFailed(_)
            | Error::DiskFull(_)
            | Error::Corrupt { .. }
            | Error::Io { .. }
            | Error::Sqlite(_)
            | Error::ReadConnection(_)
    ) && !msg.contains(&format!("session {session}"));
    let msg = if unnamed {
        format!("session {}: {msg}", session_store::quoted(session))
    } else {
        msg
    };
    to_py_with(py, e, msg)
}

/// The exception of `e`'s variant with the message `msg`; a failed write's names the
/// process's file size limit when one is set, as the CLI's error line does
/// ([`session_store::naming_file_size_limit`]: SQLite says "disk I/O error" alone).
fn to_py_with(py: Python<'_>, e: Error, msg: String) -> PyErr {
    let msg = match e {
        Error::Io { .. }
        | Error::Sqlite(_)
        | Error::ReadConnection(_)
        | Error::Poisoned(_)
        | Error::PersistenceFailed(_)
        | Error::DiskFull(_) => session_store::naming_file_size_limit(msg),
        _ => msg,
    };
    // An OS error of a full disk or quota met outside SQLite (a writer open recording its
    // owner): the library calls it retryable, as SQLite's own full disk.
    let io_disk_full = matches!(e, Error::Io { .. }) && e.is_retryable();
    let not_found = e.is_not_found();
    match e {
        Error::InvalidInput { .. } => new_err(py, invalid_input_class, msg),
        Error::InvalidPayload { .. } => new_err(py, invalid_payload_class, msg),
        Error::OperationConflict { .. } => new_err(py, operation_conflict_class, msg),
        Error::SessionNotFound(_) => new_err(py, not_found_class, msg),
        // Nothing at a path the caller named (a file to import or verify).
        Error::Io { .. } if not_found => new_err(py, not_found_class, msg),
        Error::SessionExists(_) | Error::InTheWay { .. } | Error::DestinationExists(_) => {
            new_err(py, already_exists_class, msg)
        }
        Error::WriterOwned { owner, .. } => writer_owned(py, msg, &owner),
        Error::UnsupportedVersion { .. } => UnsupportedVersion::new_err(msg),
        Error::Corrupt { .. } => Corrupt::new_err(msg),
        Error::Internal { .. } => InternalError::new_err(msg),
        Error::Closed | Error::ServiceShutDown => Closed::new_err(msg),
        Error::StaleGeneration { .. } => StaleGeneration::new_err(msg),
        Error::Poisoned(_) => Poisoned::new_err(msg),
        Error::PersistenceFailed(_) => PersistenceFailed::new_err(msg),
        Error::DiskFull(_) => DiskFull::new_err(msg),
        Error::Io { .. } if io_disk_full => DiskFull::new_err(msg),
        Error::Cancelled => Cancelled::new_err(msg),
        Error::ForkBoundaryNotAtomic(_) => ForkBoundaryNotAtomic::new_err(msg),
        Error::ForkActiveAuthority(_) => ForkActiveAuthority::new_err(msg),
        Error::RuntimeBusy(_)
        | Error::RuntimeBound(_)
        | Error::SessionNotRunning(_)
        | Error::StaleExecution(_)
        | Error::RecoveryRequired(_) => RuntimeStateError::new_err(msg),
        Error::Io { .. } | Error::Sqlite(_) | Error::ReadConnection(_) => {
            StorageError::new_err(msg)
        }
        _ => SessionStoreError::new_err(msg),
    }
}

/// A `WriterOwned` exception with message `msg` and `owner` as a dict.
fn writer_owned(py: Python<'_>, msg: String, owner: &session_store::WriterOwner) -> PyErr {
    let err = WriterOwned::new_err(msg);
    let dict = PyDict::new(py);
    let filled = dict
        .set_item("owner_id", &owner.owner_id)
        .and_then(|()| dict.set_item("host", &owner.host))
        .and_then(|()| dict.set_item("pid", owner.pid))
        .and_then(|()| dict.set_item("generation", owner.generation))
        .and_then(|()| dict.set_item("since_ms", owner.since_ms))
        .and_then(|()| dict.set_item("holding_for", owner.holding_for.as_deref()))
        .and_then(|()| err.value(py).setattr("owner", dict));
    match filled {
        Ok(()) => err,
        Err(other) => other,
    }
}

/// Result of a call, errors already Python exceptions.
type NativeResult<T> = Result<T, PyErr>;

/// Runs `f` with the GIL released and maps its error.
fn detached<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> session_store::Result<T> + Send,
) -> NativeResult<T> {
    py.detach(f).map_err(|e| to_py(py, e))
}

/// [`detached`] for a call on session `session` (its error as [`to_py_of`] gives it).
fn detached_of<T: Send>(
    py: Python<'_>,
    session: &str,
    f: impl FnOnce() -> session_store::Result<T> + Send,
) -> NativeResult<T> {
    py.detach(f).map_err(|e| to_py_of(py, session, e))
}

/// An [`Error::InvalidInput`] whose cause (its typed source) is the JSON error `source`:
/// `what` says which input.
fn invalid_from(what: &str, source: serde_json::Error) -> Error {
    Error::InvalidInput {
        what: what.to_owned(),
        source: Some(std::sync::Arc::new(source)),
    }
}

/// A `list` sort order by name.
fn list_sort(name: &str) -> session_store::Result<ListSort> {
    match name {
        "id" => Ok(ListSort::Id),
        "updated" => Ok(ListSort::Updated),
        "created" => Ok(ListSort::Created),
        other => Err(Error::InvalidInput {
            what: format!(
                "sort must be \"id\", \"updated\" or \"created\", not {}",
                session_store::quoted(other)
            ),
            source: None,
        }),
    }
}

/// A `list` origin filter by its stored name.
fn list_origin(name: &str) -> session_store::Result<Origin> {
    Origin::parse(name).ok_or_else(|| Error::InvalidInput {
        what: format!(
            "origin must be one of new, fork, rewind, canonical-import, legacy-import, not {}",
            session_store::quoted(name)
        ),
        source: None,
    })
}

/// `value` as JSON text.
fn json<T: Serialize>(value: &T) -> session_store::Result<String> {
    serde_json::to_string(value).map_err(|e| invalid_from("value cannot be encoded as JSON", e))
}

/// `snippet` with its matches as indices of characters (Python's `str` indices) instead
/// of bytes. The library's ranges fall on character boundaries; one that would not is
/// dropped rather than misplaced.
fn char_indexed(mut snippet: Snippet) -> Snippet {
    let chars_before = |byte: usize| snippet.text.get(..byte).map(|s| s.chars().count());
    let matches = snippet
        .matches
        .iter()
        .filter_map(|m| Some(chars_before(m.start)?..chars_before(m.end)?))
        .collect();
    snippet.matches = matches;
    snippet
}

/// A session id from a Python string (validated by the library).
fn session_id(id: &str) -> session_store::Result<SessionId> {
    SessionId::new(id)
}

/// The one tokio runtime of the process that runs [`SessionQuery`] futures (their storage work
/// runs on its blocking pool). A child made by `os.fork()` inherits the parent's runtime
/// without its threads (a query waited forever for a worker that is not there): the child
/// builds its own, and the inherited one is left alone (dropping it would wait for those
/// threads too).
fn tokio_runtime() -> session_store::Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: PerProcess<Mutex<Option<&'static tokio::runtime::Runtime>>> = PerProcess::new();
    let mut slot = RUNTIME.get().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(runtime) = *slot {
        return Ok(runtime);
    }
    // tokio panics when it cannot start the worker (out of threads): that reached Python
    // as `PanicException`, a `BaseException` no `except SessionStoreError` catches, at
    // every later call too (outside testing R6).
    let built = std::panic::catch_unwind(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("session-store-py")
            .enable_all()
            .build()
    })
    .unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "no thread could be started (the process or its user is out of threads or memory)",
        ))
    });
    let runtime = built.map_err(|e| Error::Io {
        context: "starting the query runtime".into(),
        source: std::sync::Arc::new(e),
    })?;
    let runtime: &'static tokio::runtime::Runtime = Box::leak(Box::new(runtime));
    *slot = Some(runtime);
    Ok(runtime)
}

/// A value of the process that made it. A child made by `os.fork()` holds copies of its
/// parent's objects, whose SQLite connections, writer lock and pending batches are the
/// parent's ("never carry a connection across fork()"): there the value is not handed out
/// and never dropped (a session dropped in a child wrote the parent's pending batches a
/// second time, poisoning the parent's writer).
struct Owned<T> {
    value: Option<T>,
    pid: u32,
}

impl<T> Owned<T> {
    fn new(value: T) -> Owned<T> {
        Owned {
            value: Some(value),
            pid: std::process::id(),
        }
    }

    /// The value, or None in a child made by `os.fork()`.
    fn get(&self) -> Option<&T> {
        if self.pid == std::process::id() {
            self.value.as_ref()
        } else {
            None
        }
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            std::mem::forget(self.value.take());
        }
    }
}

/// A root folder of sessions (`session_store.Root` wraps it). A child made by `os.fork()`
/// opens the folder again at its first call (see [`PerProcess`]).
#[pyclass(frozen, module = "session_store._native")]
struct Root {
    path: PathBuf,
    options: StoreOptions,
    service: PerProcess<Mutex<Option<Service>>>,
}

impl Root {
    /// This process's service of the root.
    fn service(&self) -> session_store::Result<Service> {
        let mut service = self.service.get().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(service) = service.as_ref() {
            return Ok(service.clone());
        }
        let root = session_store::Root::with_options(&self.path, self.options.clone())?;
        let fresh = Service::new("local", root)?;
        *service = Some(fresh.clone());
        Ok(fresh)
    }

    fn query(&self) -> session_store::Result<SessionQuery> {
        Ok(self.service()?.query())
    }

    /// Runs `read`, a read of session `session_id`. When it fails and the session's file is
    /// not the one it was when the read began (deleted, or deleted and made again,
    /// meanwhile), or there was none, the failure is [`Error::SessionNotFound`] (deleted
    /// while it was read, as the CLI says), not SQLite's error for the files that went away
    /// ("disk I/O error") or a false "corrupt" of a read that met two files. A failure on
    /// a file that looks unchanged is read once more (a file made in the freed inode within
    /// the same clock tick looks the same), and its second failure is the answer.
    fn settled<T>(
        &self,
        session_id: &str,
        read: impl Fn(&SessionId) -> session_store::Result<T>,
    ) -> session_store::Result<T> {
        let id = self::session_id(session_id)?;
        let file = self
            .service()?
            .root()
            .session_dir(&id)
            .join(session_store::format::SESSION_FILE);
        let mut attempt = 1;
        loop {
            let before = file_id(&file).ok();
            let failure = match read(&id) {
                Err(e) if !matches!(e, Error::SessionNotFound(_)) => e,
                other => return other,
            };
            if before.is_none() || file_id(&file).ok() != before {
                return Err(Error::SessionNotFound(id.to_string()));
            }
            if attempt == 2 {
                return Err(failure);
            }
            attempt += 1;
        }
    }

    /// Runs a query future on the shared runtime.
    fn run<T>(
        &self,
        f: impl Future<Output = session_store::Result<T>>,
    ) -> session_store::Result<T> {
        tokio_runtime()?.block_on(f)
    }
}

#[pymethods]
impl Root {
    /// Opens (creating it when missing) the root at `path`. `durability` is `"full"`
    /// (fsync on every drain, the default) or `"normal"`; `write_behind_ms` is the delay
    /// before an accepted batch is written (default 200).
    #[new]
    #[pyo3(signature = (path, durability=None, write_behind_ms=None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        durability: Option<&str>,
        write_behind_ms: Option<u64>,
    ) -> NativeResult<Root> {
        let mut options = StoreOptions::default();
        match durability {
            None | Some("full") => {}
            Some("normal") => options = options.with_durability(Durability::ProcessCrash),
            Some(other) => {
                return Err(new_err(
                    py,
                    invalid_input_class,
                    format!(
                        "invalid input: durability must be \"full\" or \"normal\", not {}",
                        session_store::quoted(other)
                    ),
                ));
            }
        }
        if let Some(ms) = write_behind_ms {
            options = options.with_write_behind(Duration::from_millis(ms));
        }
        detached(py, move || {
            let root = session_store::Root::with_options(path, options.clone())?;
            Ok(Root {
                path: root.path().to_path_buf(),
                options,
                service: PerProcess::with(Mutex::new(Some(Service::new("local", root)?))),
            })
        })
    }

    /// The root folder.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Creates a session (a random id when `session_id` is None) and opens it for writing.
    #[pyo3(signature = (session_id=None, cwd=None))]
    fn create(
        &self,
        py: Python<'_>,
        session_id: Option<String>,
        cwd: Option<String>,
    ) -> NativeResult<Session> {
        detached(py, || {
            let id = match session_id {
                Some(id) => SessionId::new(id)?,
                None => SessionId::random(),
            };
            let mut options = CreateOptions::with_id(id);
            if let Some(cwd) = cwd {
                options = options.with_cwd(absolute_cwd(&cwd)?);
            }
            Ok(Session::new(self.service()?.root().create(options)?))
        })
    }

    /// Opens an existing session as its one writer (`WriterOwned` when another has it).
    fn open_writer(&self, py: Python<'_>, session_id: &str) -> NativeResult<Session> {
        detached_of(py, session_id, || {
            let id = self::session_id(session_id)?;
            Ok(Session::new(self.service()?.root().open_writer(&id)?))
        })
    }

    /// A reader of one session's durable state, kept open across calls.
    fn reader(slf: &Bound<'_, Self>, session_id: &str) -> NativeResult<Reader> {
        Ok(Reader {
            root: slf.clone().unbind(),
            id: self::session_id(session_id).map_err(|e| to_py(slf.py(), e))?,
            open: PerProcess::new(),
        })
    }

    /// One page of sessions after `cursor` (JSON of a `SessionPage`) that pass every filter
    /// given, in `sort` order (`id`, `updated` or `created`): `SessionQuery::list_with` with
    /// a `ListFilter` (`cwd` made absolute as `absolute_cwd` does, as for `search`).
    #[pyo3(signature = (cursor=None, limit=50, cwd=None, since_ms=None, title=None,
                        origin=None, sort="id", cached_only=false))]
    #[allow(clippy::too_many_arguments)]
    fn list(
        &self,
        py: Python<'_>,
        cursor: Option<String>,
        limit: usize,
        cwd: Option<String>,
        since_ms: Option<i64>,
        title: Option<String>,
        origin: Option<String>,
        sort: &str,
        cached_only: bool,
    ) -> NativeResult<String> {
        detached(py, || {
            let mut filter = ListFilter::default().with_sort(list_sort(sort)?);
            if let Some(cwd) = cwd {
                filter = filter.with_cwd(absolute_cwd(&cwd)?);
            }
            if let Some(ms) = since_ms {
                filter = filter.with_since_ms(ms);
            }
            if let Some(title) = title {
                filter = filter.with_title(title);
            }
            if let Some(origin) = origin {
                filter = filter.with_origin(list_origin(&origin)?);
            }
            if cached_only {
                filter = filter.cached_only();
            }
            let page = self.run(self.query()?.list_with(&filter, cursor.as_deref(), limit))?;
            json(&page)
        })
    }

    /// One page of full-text search hits over every session of the root, best first (JSON
    /// of a `SearchPage`; each snippet's `matches` are Python string indices, not bytes).
    #[pyo3(signature = (query, cursor=None, limit=10, session=None, cwd=None, since_ms=None, role=None))]
    #[allow(clippy::too_many_arguments)]
    fn search(
        &self,
        py: Python<'_>,
        query: &str,
        cursor: Option<String>,
        limit: usize,
        session: Option<String>,
        cwd: Option<String>,
        since_ms: Option<i64>,
        role: Option<String>,
    ) -> NativeResult<String> {
        detached(py, || {
            let mut options = SearchOptions::default().with_limit(limit);
            if let Some(cursor) = cursor {
                options = options.with_cursor(cursor);
            }
            if let Some(session) = session {
                options = options.with_session(self::session_id(&session)?);
            }
            if let Some(cwd) = cwd {
                options = options.with_cwd(absolute_cwd(&cwd)?);
            }
            if let Some(ms) = since_ms {
                options = options.with_since(ms);
            }
            if let Some(role) = role {
                options = options.with_role(role);
            }
            let mut page = self.run(self.query()?.search(query, options))?;
            for hit in &mut page.hits {
                hit.snippet = char_indexed(std::mem::take(&mut hit.snippet));
            }
            json(&page)
        })
    }

    /// One page of the durable transcript, newest page first (JSON of a `HistoryPage`).
    #[pyo3(signature = (session_id, cursor=None, limit=100))]
    fn history(
        &self,
        py: Python<'_>,
        session_id: &str,
        cursor: Option<String>,
        limit: usize,
    ) -> NativeResult<String> {
        detached_of(py, session_id, || {
            self.settled(session_id, |id| {
                let r = self.service()?.session_ref(id.clone());
                let page = self.run(self.query()?.history_page(&r, cursor.as_deref(), limit))?;
                json(&page)
            })
        })
    }

    /// The whole durable transcript (a JSON array of messages).
    fn transcript(&self, py: Python<'_>, session_id: &str) -> NativeResult<String> {
        detached_of(py, session_id, || {
            self.settled(session_id, |id| {
                let r = self.service()?.session_ref(id.clone());
                let messages = self.run(self.query()?.history(&r))?;
                json(&messages)
            })
        })
    }

    /// Durable commits after sequence `after`, at most `limit` (0 = 100, max 1000; JSON of
    /// an `EventPage`).
    #[pyo3(signature = (session_id, after=0, limit=1000))]
    fn events(
        &self,
        py: Python<'_>,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> NativeResult<String> {
        detached_of(py, session_id, || {
            self.settled(session_id, |id| {
                let r = self.service()?.session_ref(id.clone());
                let observed = self.run(self.query()?.observe(&r, after, limit))?;
                json(&observed.events)
            })
        })
    }

    /// The bytes of a content ref (`digest`) of this session or its ancestors. A digest
    /// that is not one raises `InvalidInput` saying so, one the session does not hold
    /// `NotFound`, as `serve` answers 400 and 404 (both were `InvalidInput` "does not
    /// belong to session").
    fn read_content<'py>(
        &self,
        py: Python<'py>,
        session_id: &str,
        digest: String,
    ) -> NativeResult<Bound<'py, PyBytes>> {
        let well_formed = session_store::ContentRef::is_digest(&digest);
        let bytes = detached_of(py, session_id, || {
            self.settled(session_id, |id| {
                let r = self.service()?.session_ref(id.clone());
                let content = session_store::ContentRef::new(digest.clone(), 0, "");
                match self.run(self.query()?.read_content(&r, &content)) {
                    // The id and the digest are well formed: the library's "does not
                    // belong" (a caller error) is no such content here.
                    Err(Error::InvalidInput { .. }) if well_formed => Ok(None),
                    read => read.map(Some),
                }
            })
        })?;
        let Some(bytes) = bytes else {
            let msg = format!("no content {digest} in session {session_id} or its ancestors");
            return Err(new_err(py, not_found_class, msg));
        };
        Ok(PyBytes::new(py, &bytes))
    }

    /// The completed turns of the durable log (JSON array of turn boundaries).
    fn turns(&self, py: Python<'_>, session_id: &str) -> NativeResult<String> {
        detached_of(py, session_id, || {
            self.settled(session_id, |id| {
                let reader = self.service()?.root().open_reader(id)?;
                json(&reader.turns()?)
            })
        })
    }

    /// Who holds the session's writer lock (JSON object), or None.
    fn writer_owner(&self, py: Python<'_>, session_id: &str) -> NativeResult<Option<String>> {
        detached_of(py, session_id, || {
            let owner = self
                .service()?
                .root()
                .writer_owner(&self::session_id(session_id)?)?;
            owner.as_ref().map(json).transpose()
        })
    }

    /// Forks `parent` after turn `after_turn`, or rewinds it to before turn `before_turn`
    /// (exactly one of them); returns the new session's id. Copies nothing.
    #[pyo3(signature = (parent, after_turn=None, before_turn=None, child=None))]
    fn fork(
        &self,
        py: Python<'_>,
        parent: &str,
        after_turn: Option<String>,
        before_turn: Option<String>,
        child: Option<String>,
    ) -> NativeResult<String> {
        detached_of(py, parent, || {
            let point = match (after_turn, before_turn) {
                (Some(t), None) => ForkPoint::AfterTurn(t),
                (None, Some(t)) => ForkPoint::BeforeTurn(t),
                _ => {
                    return Err(Error::InvalidInput {
                        what: "give exactly one of after_turn and before_turn".into(),
                        source: None,
                    });
                }
            };
            let child = child.map(SessionId::new).transpose()?;
            let id = self
                .service()?
                .root()
                .fork(&self::session_id(parent)?, point, child)?;
            Ok(id.to_string())
        })
    }

    /// Exports a session to one self-contained file (JSON of an `ExportReport`). A
    /// signal's exception (Ctrl-C's `KeyboardInterrupt`) stops it: the unfinished file is
    /// removed and the exception raised (it was seen only once the export had finished,
    /// leaving the file that a retry then refused as existing).
    fn export(&self, py: Python<'_>, session_id: &str, path: PathBuf) -> NativeResult<String> {
        let token = CancelToken::new();
        interruptible(
            py,
            &token,
            None,
            Some("the export had finished when interrupted: its file is whole and kept"),
            |py, e| to_py_of(py, session_id, e),
            || {
                let report = self.service()?.root().export_cancellable(
                    &self::session_id(session_id)?,
                    path,
                    &token,
                )?;
                json(&report)
            },
        )
    }

    /// Validates and imports an exported file; returns the new session's id.
    #[pyo3(signature = (path, session_id=None, cwd=None))]
    fn import_file(
        &self,
        py: Python<'_>,
        path: PathBuf,
        session_id: Option<String>,
        cwd: Option<String>,
    ) -> NativeResult<String> {
        let token = CancelToken::new();
        let finished = "the import had finished when interrupted: the session is published";
        interruptible(py, &token, None, Some(finished), to_py, || {
            let mut options = ImportOptions::default();
            if let Some(id) = session_id {
                options = options.with_session_id(SessionId::new(id)?);
            }
            if let Some(cwd) = cwd {
                options = options.with_cwd(absolute_cwd(&cwd)?);
            }
            let imported = self
                .service()?
                .root()
                .import_cancellable(path, options, &token)?;
            Ok(imported.to_string())
        })
    }

    /// Verifies one session of this root (see the module's `verify`) after the checks every
    /// other call makes of its folder: a real folder of the root (not a symlink) holding the
    /// session's own file (`Root::verify`).
    fn verify(&self, py: Python<'_>, session_id: &str) -> NativeResult<String> {
        detached_of(py, session_id, || {
            self.settled(session_id, |id| {
                verified_json(self.service()?.root().verify(id)?)
            })
        })
    }

    /// Sets a session's title as its writer (a `session/title` event; `WriterOwned` while
    /// another writer, in this process or another, has it).
    fn rename(&self, py: Python<'_>, session_id: &str, title: &str) -> NativeResult<()> {
        detached_of(py, session_id, || {
            let id = self::session_id(session_id)?;
            self.service()?.root().rename(&id, title)
        })
    }

    /// Deletes a session, waiting at most `wait` seconds for its writer (`Cancelled` then).
    /// A signal's exception (Ctrl-C's `KeyboardInterrupt`) ends the wait at once: the
    /// delete is cancelled (nothing deleted unless it was already under way) and the
    /// exception raised. So does `stop` (a `threading.Event`) once it is set, raising
    /// `Cancelled` (`adelete` sets it when its task is cancelled).
    #[pyo3(signature = (session_id, wait=10.0, stop=None))]
    fn delete(
        &self,
        py: Python<'_>,
        session_id: &str,
        wait: f64,
        stop: Option<&Bound<'_, PyAny>>,
    ) -> NativeResult<()> {
        let wait = Duration::try_from_secs_f64(wait).map_err(|_| {
            new_err(
                py,
                invalid_input_class,
                format!(
                    "invalid input: wait must be a finite number of seconds from 0, not {wait:?}"
                ),
            )
        })?;
        let id = self::session_id(session_id).map_err(|e| to_py(py, e))?;
        let service = detached(py, || self.service())?;
        // The deadline is checked before each try of the lock: with a wait of 0 (or
        // shorter than the delete takes to start) even a free session was never deleted.
        // A lock found free gets the CLI's grace (it may be taken in between); a held one
        // gets `wait`.
        let patience = match detached(py, || service.root().writer_owner(&id))? {
            None => wait.max(DELETE_GRACE),
            Some(_) => wait,
        };
        // A deadline, not a timer thread: a thread per delete outlived the call by `wait`
        // seconds, so a host deleting often kept hundreds of them.
        let token = CancelToken::after(patience);
        let started = Instant::now();
        let deleted = interruptible(py, &token, stop, None, to_py, || {
            match service.root().delete(&id, &token) {
                Err(Error::Cancelled) => Ok(Some((
                    service.root().writer_owner(&id).ok().flatten(),
                    patience,
                ))),
                other => other.map(|()| None),
            }
        })?;
        // The caller cancelled nothing: say what the delete waited for ("operation
        // cancelled" before).
        let Some((owner, patience)) = deleted else {
            return Ok(());
        };
        let why = match owner {
            Some(owner) => format!("its writer, {owner}, still holds it"),
            None => "a fork or delete of it is in progress".to_owned(),
        };
        // Ended by `stop` (a cancelled `adelete`) before the wait was over: said so, with
        // the time it waited ("after 10 s" when it had waited 0.2 s).
        let waited = started.elapsed();
        Err(Cancelled::new_err(if waited < patience {
            format!(
                "stopped deleting {session_id} after {:.1} s (cancelled), nothing deleted: {why}",
                waited.as_secs_f64()
            )
        } else {
            format!(
                "gave up deleting {session_id} after {} s: {why}",
                patience.as_secs_f64()
            )
        }))
    }
}

/// Runs `f`, a call that waits on `token`, on a scoped thread with the GIL released, while
/// this thread looks for a signal's exception every [`SIGNAL_POLL`] (Python runs signal
/// handlers only in the main thread, between bytecodes: with the GIL released in one long
/// native wait, Ctrl-C did nothing until the wait ended). On one, `token` is cancelled, `f`
/// is waited for and the exception is returned instead of `f`'s result. `stop`, when given,
/// is an object with `is_set()` (a `threading.Event`) looked at as often: once it is set,
/// `token` is cancelled and `f`'s result (its `Cancelled`, as a rule) returned. `f`'s
/// error becomes an exception through `to_exception`. When `f` succeeded all the same
/// (the signal came after its last look at `token`: an export's file in place, an
/// import's session published) and `finished` says what that leaves, the exception
/// carries it as a note (`add_note`, Python 3.11+): a `KeyboardInterrupt` said nothing
/// of it, and the caller took the work for undone (outside testing I1).
fn interruptible<T: Send>(
    py: Python<'_>,
    token: &CancelToken,
    stop: Option<&Bound<'_, PyAny>>,
    finished: Option<&str>,
    to_exception: impl Fn(Python<'_>, Error) -> PyErr,
    f: impl FnOnce() -> session_store::Result<T> + Send,
) -> NativeResult<T> {
    use std::sync::mpsc::{RecvTimeoutError, sync_channel};
    // Taken by the thread that runs it, or back here when no thread could start.
    let work = &std::sync::Mutex::new(Some(f));
    let take = || work.lock().unwrap_or_else(|e| e.into_inner()).take();
    std::thread::scope(|scope| {
        let (done, mut outcome) = sync_channel(1);
        let started = std::thread::Builder::new().spawn_scoped(scope, move || {
            let f = take();
            if let Some(f) = f {
                let _ = done.send(f());
            }
        });
        if started.is_err() {
            // Out of threads (`spawn` panicked: PanicException): the call runs here, and
            // a signal is seen once it has ended.
            return match take() {
                Some(f) => py.detach(f).map_err(|e| to_exception(py, e)),
                None => Err(InternalError::new_err("the call's thread did not run it")),
            };
        }
        loop {
            // The receiver goes into the GIL-free closure and back (a reference to it is
            // not `Send`).
            let (back, got) = py.detach(move || {
                let got = outcome.recv_timeout(SIGNAL_POLL);
                (outcome, got)
            });
            outcome = back;
            match got {
                Ok(result) => return result.map_err(|e| to_exception(py, e)),
                Err(RecvTimeoutError::Timeout) => {}
                // `f` panicked: the scope raises its panic as it ends.
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(InternalError::new_err("the call's thread panicked"));
                }
            }
            if let Err(signal) = py.check_signals() {
                token.cancel();
                let succeeded = py.detach(move || outcome.recv()).is_ok_and(|r| r.is_ok());
                if succeeded && let Some(finished) = finished {
                    // Best effort: Python 3.10 has no notes.
                    let _ = signal.value(py).call_method1("add_note", (finished,));
                }
                return Err(signal);
            }
            if let Some(stop) = stop
                && stop.call_method0("is_set")?.is_truthy()?
            {
                token.cancel();
            }
        }
    })
}

/// How often [`interruptible`] looks for a signal.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// How long `Root.delete` waits for a writer lock it found free (as the CLI's `delete`).
const DELETE_GRACE: Duration = Duration::from_millis(500);

/// `{"position", "message_id", "event_seq"}` of a transcript entry.
fn entry_dict<'py>(
    py: Python<'py>,
    entry: &session_store::TranscriptEntry,
) -> NativeResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("position", entry.position)?;
    dict.set_item("message_id", &entry.message_id)?;
    dict.set_item("event_seq", entry.event_seq)?;
    Ok(dict)
}

/// A file's identity (device, inode and, where the file system keeps it, the time it was
/// created): a session file replaced under the same path (the session deleted and made
/// again) is another file, also when it got the freed inode's number (ext4 reuses them).
type FileId = (u64, u64, Option<std::time::SystemTime>);

fn file_id(file: &Path) -> session_store::Result<FileId> {
    let m = std::fs::metadata(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::SessionNotFound(file.display().to_string()),
        _ => Error::Io {
            context: format!("reading the metadata of {}", file.display()),
            source: std::sync::Arc::new(e),
        },
    })?;
    Ok((m.dev(), m.ino(), m.created().ok()))
}

/// Fresh opens a [`Reader`] read runs on when the session's file is replaced under each.
const READ_ATTEMPTS: usize = 3;

/// Lock-free reads of one session's durable state (`session_store.SessionReader` uses it):
/// its read connections stay open between calls. Each call checks, with one `stat`, that
/// the session file is still the one opened (else opens it again); a read that fails is
/// retried once on a fresh open.
#[pyclass(frozen, module = "session_store._native")]
struct Reader {
    root: Py<Root>,
    id: SessionId,
    /// The open reader (a child made by `os.fork()` opens its own: see [`PerProcess`]).
    open: PerProcess<Mutex<Option<(SessionReader, FileId)>>>,
}

impl Reader {
    /// The open reader, (re)opened when missing, stale or `fresh` is asked.
    fn current(&self, fresh: bool) -> session_store::Result<SessionReader> {
        let mut open = self.open.get().lock().unwrap_or_else(|e| e.into_inner());
        if !fresh
            && let Some((reader, id)) = open.as_ref()
            && file_id(reader.file()).is_ok_and(|now| now == *id)
        {
            return Ok(reader.clone());
        }
        *open = None;
        let reader = self.root.get().service()?.root().open_reader(&self.id)?;
        let id = file_id(reader.file())?;
        *open = Some((reader.clone(), id));
        Ok(reader)
    }

    /// Runs `f` on the reader; when it fails, on a fresh one. When the fresh open or read
    /// fails too, a session whose file is gone now is [`Error::SessionNotFound`], and one
    /// whose file was replaced meanwhile (deleted and made again) is read again, up to
    /// [`READ_ATTEMPTS`] fresh opens (then it was deleted while it was read: not found). A
    /// read racing deletes answered SQLite's "disk I/O error" before.
    fn read<T>(
        &self,
        f: impl Fn(&SessionReader) -> session_store::Result<T>,
    ) -> session_store::Result<T> {
        if let Ok(v) = self.current(false).and_then(|r| f(&r)) {
            return Ok(v);
        }
        let file = self
            .root
            .get()
            .service()?
            .root()
            .session_dir(&self.id)
            .join(session_store::format::SESSION_FILE);
        let mut attempt = 1;
        loop {
            let before = file_id(&file).ok();
            let failure = match self.current(true).and_then(|r| f(&r)) {
                Ok(v) => return Ok(v),
                Err(e @ Error::SessionNotFound(_)) => return Err(e),
                Err(e) => e,
            };
            match file_id(&file) {
                Err(Error::SessionNotFound(_)) => {
                    return Err(Error::SessionNotFound(self.id.to_string()));
                }
                Ok(now) if before != Some(now) => {
                    if attempt == READ_ATTEMPTS {
                        return Err(Error::SessionNotFound(self.id.to_string()));
                    }
                    attempt += 1;
                }
                _ => return Err(failure),
            }
        }
    }
}

#[pymethods]
impl Reader {
    /// The session id.
    #[getter]
    fn id(&self) -> String {
        self.id.to_string()
    }

    /// `(device, inode, created_at_ms)` of the session's file: a session deleted and made
    /// again under the same id is another file, made at another time.
    fn identity(&self, py: Python<'_>) -> NativeResult<(u64, u64, i64)> {
        detached_of(py, self.id.as_str(), || {
            let reader = self.current(false)?;
            let (dev, ino, _) = file_id(reader.file())?;
            Ok((dev, ino, reader.header().created_at_ms))
        })
    }

    /// The last durable sequence.
    fn durable_sequence(&self, py: Python<'_>) -> NativeResult<u64> {
        detached_of(py, self.id.as_str(), || {
            self.read(SessionReader::durable_sequence)
        })
    }

    /// The number of messages in the transcript as of durable sequence `snapshot`.
    fn transcript_len(&self, py: Python<'_>, snapshot: u64) -> NativeResult<u64> {
        detached_of(py, self.id.as_str(), || {
            self.read(|r| r.transcript_len(snapshot))
        })
    }

    /// The message at 1-based `position` as of `snapshot`:
    /// `{"position", "message_id", "event_seq"}` or None.
    fn transcript_entry<'py>(
        &self,
        py: Python<'py>,
        snapshot: u64,
        position: u64,
    ) -> NativeResult<Option<Bound<'py, PyDict>>> {
        let entry = detached_of(py, self.id.as_str(), || {
            self.read(|r| r.transcript_entry(snapshot, position))
        })?;
        entry.map(|e| entry_dict(py, &e)).transpose()
    }

    /// Where the message `message_id` is as of `snapshot` (as `transcript_entry`), or None.
    fn transcript_find<'py>(
        &self,
        py: Python<'py>,
        snapshot: u64,
        message_id: &str,
    ) -> NativeResult<Option<Bound<'py, PyDict>>> {
        let entry = detached_of(py, self.id.as_str(), || {
            self.read(|r| r.transcript_find(snapshot, message_id))
        })?;
        entry.map(|e| entry_dict(py, &e)).transpose()
    }

    /// Whether the transcript as of `earlier` is exactly the first `len` messages of the
    /// one as of `later`, told from the history index.
    fn transcript_prefix_kept(
        &self,
        py: Python<'_>,
        earlier: u64,
        later: u64,
        len: u64,
    ) -> NativeResult<bool> {
        detached_of(py, self.id.as_str(), || {
            self.read(|r| r.transcript_prefix_kept(earlier, later, len))
        })
    }

    /// The ended turn holding sequence `seq` (JSON of a turn boundary), or None.
    fn turn_holding(&self, py: Python<'_>, seq: u64) -> NativeResult<Option<String>> {
        detached_of(py, self.id.as_str(), || {
            self.read(|r| r.turn_holding(seq))?
                .as_ref()
                .map(json)
                .transpose()
        })
    }

    /// The newest `limit` messages of the durable transcript (all for None), oldest first,
    /// as Python objects (what `json.loads` of each message gives). With `item_id_key`,
    /// each message becomes a session item: its `id` dropped, `item_id_key` renamed `id`.
    ///
    /// Over [`PART`] messages, the transcript is read in parts of [`PART`] on a scoped
    /// thread (without the GIL) while this one builds the objects of the parts already read.
    #[pyo3(signature = (limit=None, item_id_key=None))]
    fn messages<'py>(
        &self,
        py: Python<'py>,
        limit: Option<usize>,
        item_id_key: Option<&str>,
    ) -> NativeResult<Bound<'py, PyList>> {
        let limit = limit.unwrap_or(usize::MAX);
        // Up to PART messages are read in the same `read` (its retries cover them).
        let (reader, opened, snapshot, len, texts) = detached_of(py, self.id.as_str(), || {
            self.read(|r| {
                let opened = file_id(r.file())?;
                let snapshot = r.durable_sequence()?;
                let len = r.transcript_len(snapshot)?;
                let wanted = usize::try_from(len).unwrap_or(usize::MAX).min(limit);
                let texts = if wanted <= PART {
                    Some(r.transcript_texts(snapshot, wanted)?)
                } else {
                    None
                };
                Ok((r.clone(), opened, snapshot, len, texts))
            })
        })?;
        let wanted = usize::try_from(len).unwrap_or(usize::MAX).min(limit);
        let keys = pyjson::Keys::new(py);
        if let Some(texts) = texts {
            let items = texts
                .iter()
                .map(|t| pyjson::message(&keys, t, item_id_key))
                .collect::<PyResult<Vec<_>>>()?;
            return PyList::new(py, items);
        }
        // Newest part first: part k holds the positions below `len + 1 - k * PART`.
        let mut parts: Vec<Vec<Bound<'py, PyAny>>> = Vec::new();
        std::thread::scope(|scope| -> NativeResult<()> {
            let (tx, rx) = std::sync::mpsc::sync_channel(2);
            let reader = &reader;
            scope.spawn(move || {
                let mut before = len.saturating_add(1);
                let mut left = wanted;
                while left > 0 {
                    let n = left.min(PART);
                    let part = reader.transcript_texts_before(snapshot, before, n);
                    let failed = part.is_err();
                    // The receiver is gone when the other side failed: stop.
                    if tx.send(part).is_err() || failed {
                        return;
                    }
                    before = before.saturating_sub(n as u64);
                    left -= n;
                }
            });
            let mut rx = rx;
            loop {
                // The wait releases the GIL (a `Receiver` moves in and back: it is not `Sync`).
                let (back, got) = py.detach(move || {
                    let got = rx.recv();
                    (rx, got)
                });
                rx = back;
                let Ok(part) = got else {
                    return Ok(());
                };
                // A part that fails on a file deleted (or made again) since it was opened:
                // the session is gone, not SQLite's error for the files that went away.
                let texts = part.map_err(|e| {
                    let gone = file_id(reader.file()).map_or(true, |now| now != opened);
                    let e = if gone {
                        Error::SessionNotFound(self.id.to_string())
                    } else {
                        e
                    };
                    to_py_of(py, self.id.as_str(), e)
                })?;
                parts.push(
                    texts
                        .iter()
                        .map(|t| pyjson::message(&keys, t, item_id_key))
                        .collect::<PyResult<Vec<_>>>()?,
                );
            }
        })?;
        PyList::new(py, parts.into_iter().rev().flatten())
    }
}

/// Messages read at once by [`Reader::messages`]; a longer transcript is read in parts of
/// this many.
const PART: usize = 2000;

/// A session opened for writing (`session_store.Session` wraps it). In a child made by
/// `os.fork()` it is the parent's writer: every call but `close` (which lets the copy go)
/// raises `WriterOwned` naming the parent (see [`Owned`]).
#[pyclass(frozen, module = "session_store._native")]
struct Session {
    inner: Owned<session_store::Session>,
    id: SessionId,
    owner: session_store::WriterOwner,
}

impl Session {
    fn new(inner: session_store::Session) -> Session {
        Session {
            id: inner.id().clone(),
            owner: inner.owner().clone(),
            inner: Owned::new(inner),
        }
    }

    /// The session, or `WriterOwned` in a child made by `os.fork()`.
    fn inner(&self, py: Python<'_>) -> NativeResult<&session_store::Session> {
        self.inner.get().ok_or_else(|| {
            let err = Error::WriterOwned {
                session: self.id.to_string(),
                owner: self.owner.clone(),
            };
            writer_owned(
                py,
                format!(
                    "{err}: this process ({}) was made by os.fork() and has a copy of its \
                     parent's handle of session {}; open the session in this process once \
                     the parent closed it",
                    std::process::id(),
                    self.id
                ),
                &self.owner,
            )
        })
    }
}

/// What `append` reports of a commit.
#[derive(Serialize)]
struct CommitSummary<'a> {
    commit_id: &'a str,
    operation_id: &'a str,
    turn_id: Option<&'a str>,
    first_seq: u64,
    last_seq: u64,
}

#[pymethods]
impl Session {
    /// The session id.
    #[getter]
    fn id(&self) -> String {
        self.id.to_string()
    }

    /// Appends one batch given as JSON text `{"operation_id", "turn_id"?, "events": [...]}`;
    /// returns the commit (JSON). Accepted in memory; durable after `flush`.
    fn append(&self, py: Python<'_>, batch_json: &str) -> NativeResult<String> {
        let inner = self.inner(py)?;
        detached_of(py, self.id.as_str(), || {
            let batch: Batch =
                serde_json::from_str(batch_json).map_err(|e| Error::InvalidInput {
                    // The reason said plainly (a lone surrogate escape named as such).
                    what: format!(
                        "batch is not valid: {} at line {} column {}",
                        session_store::json_error_reason(&e, batch_json),
                        e.line(),
                        e.column()
                    ),
                    source: None,
                })?;
            let commit = inner.append(batch)?;
            json(&CommitSummary {
                commit_id: &commit.commit_id,
                operation_id: &commit.operation_id,
                turn_id: commit.turn_id.as_deref(),
                first_seq: commit.first_seq,
                last_seq: commit.last_seq(),
            })
        })
    }

    /// Writes every accepted batch (fsynced); returns the durable sequence.
    fn flush(&self, py: Python<'_>) -> NativeResult<u64> {
        let inner = self.inner(py)?;
        detached_of(py, self.id.as_str(), || inner.flush())
    }

    /// `(accepted, durable)` sequences.
    fn sequences(&self, py: Python<'_>) -> NativeResult<(u64, u64)> {
        Ok(self.inner(py)?.sequences())
    }

    /// The accepted transcript, including batches not yet durable (a JSON array).
    fn transcript(&self, py: Python<'_>) -> NativeResult<String> {
        let inner = self.inner(py)?;
        detached_of(py, self.id.as_str(), || json(&inner.transcript()?))
    }

    /// Flushes and releases the writer lock; later calls raise `Closed`. In a child made by
    /// `os.fork()` it does nothing: the parent's writer stays as it is.
    fn close(&self, py: Python<'_>) -> NativeResult<()> {
        match self.inner.get() {
            Some(inner) => detached_of(py, self.id.as_str(), || inner.close()),
            None => Ok(()),
        }
    }
}

/// Verifies a session file, folder or export (integrity, hashes, blobs, full replay);
/// returns JSON `{"session_id", "commits", "events", "notes"}` or raises `Corrupt`.
#[pyfunction]
fn verify(py: Python<'_>, path: PathBuf) -> NativeResult<String> {
    detached(py, || verified_json(session_store::verify_file(path)?))
}

/// Raises `InvalidInput` saying why when `session_id` is not a valid session id (the
/// library's rules), else returns None: the agents adapter maps an id the store refuses to
/// one it takes (`session_store.agents.store_id_of`).
#[pyfunction]
fn check_session_id(py: Python<'_>, session_id: &str) -> NativeResult<()> {
    self::session_id(session_id)
        .map(drop)
        .map_err(|e| to_py(py, e))
}

/// Closes, in a child made by `os.fork()`, its copies of the writer lock files the parent
/// held (the parent keeps its locks, released when it lets them go; before, a forked worker
/// kept them held for its whole life). `session_store` registers it with
/// `os.register_at_fork(after_in_child=...)`; elsewhere it does nothing.
#[pyfunction]
fn close_inherited_locks() {
    session_store::close_inherited_locks();
}

/// What `verify` reports: `{"session_id", "commits", "events", "notes"}`.
fn verified_json(verified: session_store::Verified) -> session_store::Result<String> {
    json(&serde_json::json!({
        "session_id": verified.header.session_id,
        "commits": verified.commits,
        "events": verified.events,
        "notes": verified.notes,
    }))
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    fork::install_vfs().map_err(pyo3::exceptions::PyImportError::new_err)?;
    fork::install_fork_handlers().map_err(pyo3::exceptions::PyImportError::new_err)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("TOO_DEEP", pyjson::too_deep_message())?;
    m.add_class::<Root>()?;
    m.add_class::<Session>()?;
    m.add_class::<Reader>()?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(check_session_id, m)?)?;
    m.add_function(wrap_pyfunction!(close_inherited_locks, m)?)?;
    m.add("SessionStoreError", py.get_type::<SessionStoreError>())?;
    m.add("InvalidInput", invalid_input_class(py)?)?;
    m.add("InvalidPayload", invalid_payload_class(py)?)?;
    m.add("OperationConflict", operation_conflict_class(py)?)?;
    m.add("NotFound", not_found_class(py)?)?;
    m.add("AlreadyExists", already_exists_class(py)?)?;
    m.add("WriterOwned", py.get_type::<WriterOwned>())?;
    m.add("UnsupportedVersion", py.get_type::<UnsupportedVersion>())?;
    m.add("Corrupt", py.get_type::<Corrupt>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add("Closed", py.get_type::<Closed>())?;
    m.add("StaleGeneration", py.get_type::<StaleGeneration>())?;
    m.add("Poisoned", py.get_type::<Poisoned>())?;
    m.add("PersistenceFailed", py.get_type::<PersistenceFailed>())?;
    m.add("DiskFull", py.get_type::<DiskFull>())?;
    m.add("Cancelled", py.get_type::<Cancelled>())?;
    m.add(
        "ForkBoundaryNotAtomic",
        py.get_type::<ForkBoundaryNotAtomic>(),
    )?;
    m.add("ForkActiveAuthority", py.get_type::<ForkActiveAuthority>())?;
    m.add("RuntimeStateError", py.get_type::<RuntimeStateError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    Ok(())
}
