"""Durable, queryable, forkable AI-agent sessions in SQLite, from Python.

The Rust crate ``session-store`` behind a small Pythonic API::

    import session_store

    root = session_store.Root("./sessions")
    with root.create("chat") as session:                 # the one writer of "chat"
        session.append(
            [
                {"kind": "turn/start"},
                {"kind": "message/complete",
                 "payload": {"message": {"id": "m1", "role": "user", "content": "Hi"}}},
                {"kind": "turn/end", "payload": {"status": "completed"}},
            ],
            operation_id="op-1",
            turn_id="turn-1",
        )
        session.flush()                                  # durable (fsynced)
    page = root.history("chat", limit=50)               # newest page first
    child = root.fork("chat", after_turn="turn-1")       # copies nothing

Events are dicts ``{"kind", "payload"?, "optional"?, "id"?}``; payloads are JSON-able values,
encoded once with :func:`json.dumps` and stored as that exact text. Every call that touches
SQLite releases the GIL, so threads run in parallel; the ``a``-prefixed methods (``aappend``,
``ahistory``, ``afork``, …) are the same calls run in :func:`asyncio.to_thread` for asyncio
hosts. Cancelling such a task (or an :func:`asyncio.wait_for` timeout) before a worker
thread has started its call means the call never runs; once started, it runs to its end as
it would have and only the waiting stops (``adelete`` excepted, see it). Either way a call
is never half done: a cancelled ``aappend`` appended its whole batch or nothing (append it
again under the same ``operation_id`` to find out: the original commit comes back, or it is
appended now). Errors are :class:`SessionStoreError` subclasses mirroring the Rust ``Error``; those
whose meaning is a builtin error's also subclass it, so ``except ValueError`` and the like
catch them: :class:`InvalidInput` (and its :class:`InvalidPayload`, :class:`OperationConflict`)
is a :class:`ValueError`, :class:`NotFound` a :class:`LookupError` (not :class:`KeyError`,
whose ``str()`` quotes the message), :class:`AlreadyExists` a :class:`FileExistsError`
(an :class:`OSError` with ``errno`` None; ``str()`` and ``args`` are the message). The
others subclass no builtin error: :class:`Cancelled` is a wait that ended (the caller's
cancel, or a ``delete`` whose ``wait`` ran out), not a :class:`TimeoutError`.
An argument of the wrong type (``root.create(123)``, ``append(events, operation_id=5)``)
raises :class:`TypeError`, as Python's own functions do, naming the argument; a value of
the right type that is refused (an id the store does not take, an event of a batch with a
wrong key or value, named as ``events[2].kind``) :class:`InvalidInput`.

Reads through :class:`Root` (``history``, ``transcript``, ``events``, ``turns``) see the
*durable* state: call :meth:`Session.flush` first to read what a writer appended.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import contextlib
import functools
import inspect
import json
import os
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NoReturn, ParamSpec, TypeVar

from . import _native
from ._native import (
    AlreadyExists,
    Cancelled,
    Closed,
    Corrupt,
    DiskFull,
    ForkActiveAuthority,
    ForkBoundaryNotAtomic,
    InvalidInput,
    InvalidPayload,
    NotFound,
    OperationConflict,
    PersistenceFailed,
    Poisoned,
    InternalError,
    RuntimeStateError,
    SessionStoreError,
    StaleGeneration,
    StorageError,
    UnsupportedVersion,
    WriterOwned,
)

__all__ = [
    "AlreadyExists",
    "Cancelled",
    "Closed",
    "Corrupt",
    "DiskFull",
    "ForkActiveAuthority",
    "ForkBoundaryNotAtomic",
    "InvalidInput",
    "InvalidPayload",
    "NotFound",
    "OperationConflict",
    "PersistenceFailed",
    "Poisoned",
    "InternalError",
    "Root",
    "RuntimeStateError",
    "Session",
    "SessionReader",
    "SessionStoreError",
    "StaleGeneration",
    "StorageError",
    "UnsupportedVersion",
    "WriterOwned",
    "encode_json",
    "verify",
    "averify",
]

# No other thread holds one of SQLite's process-wide mutexes, or the store's, as a fork
# makes a child: the native module registered pthread_atfork handlers when it loaded.
# A child made by os.fork() closes its copies of the parent's writer lock files at once (a
# copy kept the parent's lock held for as long as the child lived).
os.register_at_fork(after_in_child=_native.close_inherited_locks)

#: The package's version, as the wheel's metadata gives it.
__version__: str = _native.__version__

_T = TypeVar("_T")
_P = ParamSpec("_P")

PathLike = str | bytes | os.PathLike[str] | os.PathLike[bytes]


def encode_json(value: Any) -> str:
    """``value`` as compact JSON text (UTF-8, no NaN/Infinity).

    Raises :class:`InvalidInput` when the value cannot be encoded (a set, an object, NaN,
    a key that is not a string, …), before anything is written.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidInput(f"invalid input: value is not JSON-able: {e}") from None
    # json.dumps writes an int, float, bool or None key as a string ({1: 2} came back as
    # {"1": 2}; {1: "a", "1": "b"} as one key "1"). Walked after dumps: no cycle is left.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidInput(
                        f"invalid input: value is not JSON-able: the key {key!r} is "
                        f"{type(key).__name__}, not str (JSON keys are strings)"
                    )
                stack.append(child)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return text


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _loads(text: str) -> Any:
    """``json.loads(text)``; a text nested deeper than it reads is a
    :class:`SessionStoreError` (a bare ``RecursionError`` named nothing)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise SessionStoreError(_native.TOO_DEEP) from None


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object the native module returned, as a dict."""
    value: dict[str, Any] = _loads(text)
    return value


def _json_list(text: str) -> list[dict[str, Any]]:
    """A JSON array of objects the native module returned, as a list."""
    value: list[dict[str, Any]] = _loads(text)
    return value


def _epoch_ms(when: datetime | None) -> int | None:
    """``when`` as whole milliseconds since the Unix epoch; a naive datetime (no timezone:
    local time or UTC?) raises :class:`InvalidInput`, another type :class:`TypeError`, as
    any argument of the wrong type does (it raised :class:`InvalidInput`: outside testing
    C5)."""
    if when is None:
        return None
    if not isinstance(when, datetime):
        raise TypeError(f"since must be datetime.datetime or None, not {type(when).__name__}")
    if when.utcoffset() is None:
        raise InvalidInput(
            "invalid input: since is a naive datetime; give it a timezone "
            "(e.g. datetime.timezone.utc)"
        )
    return (when - _EPOCH) // timedelta(milliseconds=1)


def _native_args(fn: Callable[_P, _T]) -> Callable[_P, _T]:
    """``fn`` raising :class:`InvalidInput` where PyO3 refuses to convert an argument, so
    nothing was done: :class:`UnicodeEncodeError` for a str argument (an id, a cursor, a
    path, a batch) holding a lone surrogate (``json.loads('"\\ud800"')`` gives one; it has
    no UTF-8 form), :class:`OverflowError` for an int out of the native type's range (a
    negative ``limit`` or ``after``, one beyond 64 bits), as a limit over the maximum is.
    Typed with ``fn``'s own parameters, so type checkers check the calls of the wrapped
    methods (``Callable[..., _T]`` accepted any arguments)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return fn(*args, **kwargs)
        except UnicodeEncodeError as e:
            raise InvalidInput(f"invalid input: text is not UTF-8: {e}") from None
        except OverflowError as e:
            raise InvalidInput(
                f"invalid input: {_out_of_range_argument(fn, args, kwargs) or e}"
            ) from None
        except TypeError as e:
            wrong = _wrong_argument(fn, args, kwargs)
            if wrong is None:
                raise
            raise TypeError(wrong) from e

    return wrapper


def _out_of_range_argument(fn: Callable[..., Any], args: Any, kwargs: Any) -> str | None:
    """Which int argument of a call of ``fn`` the native call could not take, said with its
    name (``limit -1 is negative``): PyO3's :class:`OverflowError` named none ("can't
    convert negative int to unsigned"). None when no argument is such an int."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return None
    for name, value in bound.arguments.items():
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if value < 0:
            return f"{name} {value} is negative"
        if value >= 2**64:
            return f"{name} {value} is over 2**64 - 1"
    return None


#: The annotations :func:`_wrong_argument` checks, by name (``float`` takes an int too).
_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "None": (type(None),),
}


def _wrong_argument(fn: Callable[..., Any], args: Any, kwargs: Any) -> str | None:
    """Which argument of a call of ``fn`` is not of the type its annotation names (an
    annotation of ``str``, ``int``, ``float``, ``bool``, ``None`` or a union of them; other
    ones are not looked at), as a :class:`TypeError` message naming it: PyO3's said only
    ``'int' object is not an instance of 'str'``, naming no argument. None when none is."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return None
    for name, value in bound.arguments.items():
        annotation = fn.__annotations__.get(name)
        if not isinstance(annotation, str):
            continue
        names = [part.strip() for part in annotation.split("|")]
        if not all(n in _SIMPLE_TYPES for n in names):
            continue
        if not isinstance(value, tuple(t for n in names for t in _SIMPLE_TYPES[n])):
            return f"{fn.__name__}() argument {name!r} must be {annotation}, not {type(value).__name__}"
    return None


def _fspath(path: PathLike, name: str) -> str:
    """``path``, the argument ``name``, as a str (bytes decoded as the file system does,
    ``os.fsdecode``: a name that is not UTF-8 keeps its bytes); a NUL in it (no file can be
    named so) raises :class:`InvalidInput`, another type than a path :class:`TypeError`
    naming the argument (``os.fsdecode``'s named none: outside testing C5)."""
    try:
        text = os.fsdecode(path)
    except TypeError:
        raise TypeError(
            f"{name} must be str, bytes or os.PathLike, not {type(path).__name__}"
        ) from None
    if "\0" in text:
        raise InvalidInput(f"invalid input: path {text!r} contains a NUL character")
    return text


def _about_file(path: PathLike, error: SessionStoreError) -> SessionStoreError:
    """``error``, raised by a native call given ``path`` (a file or folder to verify or
    import), saying what it is of: a :class:`NotFound` with nothing at ``path`` says so of
    the path, in words of its own (the native message is the OS's, ``/x: No such file or
    directory (os error 2)``; it called the path a session, ``session /x not found``); a
    :class:`Corrupt` or :class:`UnsupportedVersion` that does not name the path names it
    first (``corrupt session store: SQLite reports: file is not a database`` named no file;
    the store names the file it resolved, which holds the path given unless a symlink or
    ``..`` was resolved)."""
    text = os.fsdecode(path)
    if isinstance(error, NotFound):
        if os.path.lexists(path):
            return error  # a session it names (an ancestor, say) is what is missing
        return NotFound(f"{text}: no such file or folder")
    if isinstance(error, (Corrupt, UnsupportedVersion)) and text not in str(error):
        return type(error)(f"{text}: {error}")
    return error


def _naming_caller_id(error: SessionStoreError, store_id: str, named: str) -> SessionStoreError:
    """``error``, of the store session ``store_id``, naming it as ``named`` says (the id an
    adapter's caller gave, with the store's): the first ``session STORE_ID`` of its text
    becomes ``session NAMED``, or ``session NAMED: `` goes first; of the same class (a
    :class:`WriterOwned` keeps its ``owner``)."""
    text = str(error)
    for form in (f"session {json.dumps(store_id)}", f"session {store_id}"):
        if form in text:
            text = text.replace(form, f"session {named}", 1)
            break
    else:
        text = f"session {named}: {text}"
    renamed = type(error)(text)
    if isinstance(error, WriterOwned) and isinstance(renamed, WriterOwned):
        renamed.owner = error.owner
    return renamed


def _missing_sdk(
    error: ModuleNotFoundError, modules: tuple[str, ...], what: str, extra: str, sdk: str
) -> ModuleNotFoundError | None:
    """When ``error`` is a module of ``modules`` (an adapter's SDK) not found: the error to
    raise instead, naming ``what`` needs it and the package extra installing it (a bare
    ``No module named 'langchain_core'`` named neither). None for another missing module."""
    if error.name is None or error.name.split(".")[0] not in modules:
        return None
    return ModuleNotFoundError(
        f"{what} needs {sdk}, which is not installed ({error}): "
        f"pip install 'session-store[{extra}]'",
        name=error.name,
        path=error.path,
    )


def _raise_missing_sdk(modules: tuple[str, ...], what: str, extra: str, sdk: str) -> NoReturn:
    """In an ``except ModuleNotFoundError:`` block around an adapter's imports: raises
    :func:`_missing_sdk`'s error for the one being handled, or that one itself when
    another module is missing. The block binds no name (``except ... as e`` left ``e``
    and the error at module level in the stubs: ``mypy.stubtest`` reported both)."""
    error = sys.exc_info()[1]
    if not isinstance(error, ModuleNotFoundError):
        raise RuntimeError("_raise_missing_sdk called outside an except block") from error
    missing = _missing_sdk(error, modules, what, extra, sdk)
    if missing is None:
        raise error
    raise missing from error


async def _to_thread(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))


async def _to_thread_to_its_end(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)``, a change, in a worker thread; a cancellation of the caller waits for
    it to end (also through further cancellations), then raises: the caller that sees
    ``CancelledError`` sees the change done or refused, never under way (as openai-agents'
    ``SQLiteSession`` does; the change landed seconds after the cancellation, or never when
    the thread had not started)."""
    work = asyncio.ensure_future(_to_thread(fn, *args))
    cancelled: asyncio.CancelledError | None = None
    while not work.done():
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError as e:
            cancelled = cancelled or e
    if cancelled is not None:
        if not work.cancelled():
            work.exception()  # retrieved: the caller was cancelled
        raise cancelled
    return work.result()


def _refuse_pickle(self: object, protocol: object = None) -> NoReturn:
    """``__reduce_ex__`` of the handles (:class:`Root`, :class:`Session`,
    :class:`SessionReader` and the adapters): they hold the store's open files, locks and
    threads, which a pickle (another process) or a copy cannot share, so ``pickle``,
    ``copy.copy`` and ``copy.deepcopy`` raise :class:`TypeError` naming the class (as for a
    file or a lock). What they return (events, commits, messages) are plain dicts and lists,
    which pickle."""
    cls = type(self)
    raise TypeError(
        f"cannot pickle or copy a {cls.__module__}.{cls.__qualname__}: it holds open files "
        "and locks of the session store; pass the root's path (and the session id) instead "
        "and open it again"
    )


# The keys of an event given to Session.append, with the type each value must have
# (a payload is any JSON-able value).
_EVENT_KEYS: dict[str, type | None] = {"kind": str, "payload": None, "optional": bool, "id": str}
# Keys of the events the store returns that are no input, with what to do instead.
_OUTPUT_KEYS = {
    "seq": "sequences are assigned when a batch is accepted; remove the key",
    "content_ref": "it names content the store holds; give the content as payload",
}


def _check_events(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``events`` as a list of dicts: any mapping is taken, as the signature of
    :meth:`Session.append` says (:func:`json.dumps` encodes only dicts: a
    ``MappingProxyType`` was refused as "not JSON-able"). An event with a key it does not
    have or a value of the wrong type raises :class:`InvalidInput` naming the event and the
    key (the store's reader named a position in the JSON text this package wrote)."""
    if isinstance(events, (str, bytes)) or not isinstance(events, Sequence):
        # An argument of the wrong type, as the README says of every one.
        raise TypeError(f"events must be a list of dicts, not {type(events).__name__}")
    out = []
    for i, event in enumerate(events):
        if not isinstance(event, Mapping):
            raise InvalidInput(
                f"invalid input: events[{i}] is {type(event).__name__}, not a dict"
            )
        event = dict(event)
        for key, value in event.items():
            if key in _EVENT_KEYS:
                want = _EVENT_KEYS[key]
                if want is not None and not isinstance(value, want):
                    raise InvalidInput(
                        f"invalid input: events[{i}].{key} must be {want.__name__}, "
                        f"not {type(value).__name__}"
                    )
            elif key in _OUTPUT_KEYS:
                raise InvalidInput(f"invalid input: events[{i}].{key} is not input: {_OUTPUT_KEYS[key]}")
            else:
                raise InvalidInput(
                    f"invalid input: events[{i}] has the unknown key {key!r} (an event's keys "
                    f"are {', '.join(_EVENT_KEYS)})"
                )
        if "kind" not in event:
            raise InvalidInput(f"invalid input: events[{i}] has no kind")
        out.append(event)
    return out


#: How many times :meth:`Root._open_or_create` tries: a session deleted and made again by
#: other processes between each open and create is not waited for beyond that.
_OPEN_OR_CREATE_ATTEMPTS = 3

#: Every :class:`Session` made in this process and not yet collected, for
#: :func:`_close_at_exit`.
_OPEN_SESSIONS: weakref.WeakSet[Session] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Closes (so flushes) every session still open when the interpreter exits normally.

    A session a daemon thread held was never dropped (its thread's frame is not torn
    down), so what it had accepted in the last write-behind window was lost at a clean
    ``sys.exit(0)`` (outside testing P2). Closed, not only flushed: a daemon thread's
    later append raises :class:`Closed` instead of being acknowledged and lost. Errors
    are left unsaid (a copy inherited through ``os.fork`` only lets its handle go).
    """
    while True:
        try:
            sessions = list(_OPEN_SESSIONS)
            break
        except RuntimeError:  # another thread added one meanwhile
            continue
    for session in sessions:
        with contextlib.suppress(Exception):
            session.close()


atexit.register(_close_at_exit)


class Session:
    """A session opened for writing: the one writer of its file (across processes).

    Obtained from :meth:`Root.create` or :meth:`Root.open`. Appends are accepted in memory
    and become durable after the write-behind delay, on :meth:`flush` or on :meth:`close`.
    A context manager (sync and async) that closes the session on exit. At the
    interpreter's normal exit every session still open is closed (so flushed), also one
    that a daemon thread holds; a process that dies, or ends by ``os._exit``, keeps only
    what was durable.
    """

    __slots__ = ("_native", "_root", "__weakref__")
    __reduce_ex__ = _refuse_pickle

    def __init__(self, native: _native.Session, root: Root) -> None:
        self._native = native
        self._root = root
        _OPEN_SESSIONS.add(self)

    @property
    def id(self) -> str:
        """The session id."""
        return self._native.id

    @property
    def root(self) -> Root:
        """The root this session lives in."""
        return self._root

    def sequences(self) -> tuple[int, int]:
        """``(accepted, durable)`` event sequences."""
        return self._native.sequences()

    def append(
        self,
        events: Sequence[Mapping[str, Any]],
        *,
        operation_id: str,
        turn_id: str | None = None,
    ) -> dict[str, Any]:
        """Appends one batch atomically; returns the commit
        ``{"commit_id", "operation_id", "turn_id", "first_seq", "last_seq"}``.

        ``operation_id`` is the idempotency key: the same batch sent again returns the
        original commit; different content under it raises :class:`OperationConflict`.
        A batch that does not validate raises (:class:`InvalidInput`,
        :class:`InvalidPayload`, :class:`UnsupportedVersion`) and appends nothing: an event
        is a dict of ``kind`` (str), ``payload`` (JSON-able), ``optional`` (bool) and
        ``id`` (str), an error names it (``events[2].kind must be str, not int``).
        ``events`` that are no list (a dict, None) and an ``operation_id`` or ``turn_id``
        that is not a str raise :class:`TypeError`, as any argument of the wrong type does.
        """
        if not isinstance(operation_id, str):
            raise TypeError(f"operation_id must be str, not {type(operation_id).__name__}")
        if turn_id is not None and not isinstance(turn_id, str):
            raise TypeError(f"turn_id must be str or None, not {type(turn_id).__name__}")
        batch: dict[str, Any] = {"operation_id": operation_id, "events": _check_events(events)}
        if turn_id is not None:
            batch["turn_id"] = turn_id
        return self.append_json(encode_json(batch))

    @_native_args
    def append_json(self, batch: str) -> dict[str, Any]:
        """As :meth:`append`, with the batch as JSON text in the CLI's ``append`` line format
        ``{"operation_id", "turn_id"?, "events": [{"kind", "payload"?, "optional"?, "id"?}]}``.
        """
        if not isinstance(batch, str):
            raise TypeError(f"batch must be str, not {type(batch).__name__}")
        return _json_object(self._native.append(batch))

    def flush(self) -> int:
        """Writes every accepted batch in one fsynced transaction; returns the durable sequence."""
        return self._native.flush()

    def transcript(self) -> list[dict[str, Any]]:
        """The accepted transcript (messages), including batches not yet durable."""
        return _json_list(self._native.transcript())

    def close(self) -> None:
        """Flushes and releases the writer lock. Later appends raise :class:`Closed`; closing
        again does nothing, and :meth:`flush`, :meth:`sequences` and :meth:`transcript` still
        answer (with the state at the close)."""
        self._native.close()

    async def aappend(
        self,
        events: Sequence[Mapping[str, Any]],
        *,
        operation_id: str,
        turn_id: str | None = None,
    ) -> dict[str, Any]:
        """:meth:`append` in a worker thread."""
        return await _to_thread(self.append, events, operation_id=operation_id, turn_id=turn_id)

    async def aappend_json(self, batch: str) -> dict[str, Any]:
        """:meth:`append_json` in a worker thread."""
        return await _to_thread(self.append_json, batch)

    async def aflush(self) -> int:
        """:meth:`flush` in a worker thread."""
        return await _to_thread(self.flush)

    async def aclose(self) -> None:
        """:meth:`close` in a worker thread."""
        await _to_thread(self.close)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<session_store.Session {self.id!r}>"


class SessionReader:
    """Lock-free reads of one session's durable state (any number, beside its writer).

    Its read connections are opened at the first :meth:`messages` and kept for the next
    calls (a session deleted and made again under the same id is noticed and reopened).
    """

    __slots__ = ("_id", "_native_reader", "_root")
    __reduce_ex__ = _refuse_pickle

    def __init__(self, root: Root, session_id: str) -> None:
        self._root = root
        self._id = session_id
        self._native_reader: _native.Reader | None = None

    @property
    def id(self) -> str:
        """The session's id (read-only: the reader's kept connections are to this session)."""
        return self._id

    @property
    def _native(self) -> _native.Reader:
        if self._native_reader is None:
            self._native_reader = self._root._native.reader(self.id)
        return self._native_reader

    def _drop_connections(self) -> None:
        """Closes the kept read connections (their file descriptors); the next read opens
        them again."""
        self._native_reader = None

    @_native_args
    def messages(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` messages of the durable transcript (all when None), oldest
        first, each as ``json.loads`` gives it (messages over 64 KiB included). The work
        follows ``limit``, not the session's length."""
        if limit is not None and limit <= 0:
            return []
        return self._native.messages(limit)

    async def amessages(self, limit: int | None = None) -> list[dict[str, Any]]:
        """:meth:`messages` in a worker thread."""
        return await _to_thread(self.messages, limit)

    def history(self, cursor: str | None = None, limit: int = 100) -> dict[str, Any]:
        """:meth:`Root.history` of this session."""
        return self._root.history(self.id, cursor=cursor, limit=limit)

    def transcript(self) -> list[dict[str, Any]]:
        """:meth:`Root.transcript` of this session."""
        return self._root.transcript(self.id)

    def events(self, after: int = 0, limit: int = 1000) -> dict[str, Any]:
        """:meth:`Root.events` of this session."""
        return self._root.events(self.id, after=after, limit=limit)

    def turns(self) -> list[dict[str, Any]]:
        """:meth:`Root.turns` of this session."""
        return self._root.turns(self.id)

    async def ahistory(self, cursor: str | None = None, limit: int = 100) -> dict[str, Any]:
        """:meth:`history` in a worker thread."""
        return await _to_thread(self.history, cursor, limit)

    async def atranscript(self) -> list[dict[str, Any]]:
        """:meth:`transcript` in a worker thread."""
        return await _to_thread(self.transcript)

    async def aevents(self, after: int = 0, limit: int = 1000) -> dict[str, Any]:
        """:meth:`events` in a worker thread."""
        return await _to_thread(self.events, after, limit)

    async def aturns(self) -> list[dict[str, Any]]:
        """:meth:`turns` in a worker thread."""
        return await _to_thread(self.turns)

    def __repr__(self) -> str:
        return f"<session_store.SessionReader {self.id!r}>"


class _SessionWalk:
    """The pages :meth:`Root.iter_sessions` (and ``aiter_sessions``) reads and the sessions
    it yields of each. In updated order a session committed to meanwhile moves ahead of the
    pages read (keyset paging on a moving key): those pages are followed by one pass in id
    order (ids do not move) whose sessions not yielded yet are yielded last, newest first;
    a session is yielded once (its id remembered) however it moves."""

    def __init__(self, page_size: int, **filters: Any) -> None:
        # Named as the caller named it (the list's "limit must be 1..=100" named another,
        # and its TypeError "list() argument 'limit'": outside testing C5).
        if not isinstance(page_size, int) or isinstance(page_size, bool):
            raise TypeError(f"page_size must be int, not {type(page_size).__name__}")
        if not 0 < page_size <= 100:
            raise InvalidInput(f"invalid input: page_size must be 1..=100, not {page_size}")
        self._page_size = page_size
        self._filters = filters  # Root.list's keyword arguments: sort and the filters
        self._cursor: str | None = None
        self._started = False
        self._catching_up = False
        self._seen: set[str] | None = set() if filters["sort"] == "updated" else None
        self._late: builtins.list[dict[str, Any]] = []

    def next_page(self) -> dict[str, Any] | None:
        """The arguments of the next :meth:`Root.list` call, None once every page is read."""
        if self._started and self._cursor is None:
            return None
        self._started = True
        sort = "id" if self._catching_up else self._filters["sort"]
        return {
            **self._filters,
            "cursor": self._cursor,
            "limit": self._page_size,
            "sort": sort,
        }

    def take(self, page: dict[str, Any]) -> builtins.list[dict[str, Any]]:
        """The sessions of ``page`` (the answer to :meth:`next_page`'s call) to yield now."""
        sessions: builtins.list[dict[str, Any]] = page["sessions"]
        self._cursor = page["next_cursor"]
        if self._seen is None:
            return sessions
        sessions = [s for s in sessions if s["session_ref"]["session_id"] not in self._seen]
        self._seen.update(s["session_ref"]["session_id"] for s in sessions)
        if self._catching_up:
            self._late += sessions
            sessions = []
        if self._cursor is None:
            if not self._catching_up:
                self._catching_up = True
                self._started = False  # the pass in id order, from its start
            else:
                self._late.sort(
                    key=lambda s: (s["updated_at_ms"], s["session_ref"]["session_id"]),
                    reverse=True,
                )
                sessions, self._late = self._late, []
        return sessions


class Root:
    """A root folder of sessions (created when missing): one SQLite file per session.

    (Its annotations say ``builtins.list``: in the class's scope, where type checkers read
    them, ``list`` is :meth:`list`.)

    ``durability`` is ``"full"`` (``synchronous=FULL``, survives power loss; the default)
    or ``"normal"`` (survives a process crash); ``write_behind_ms`` is how long an accepted
    batch waits before it is written (default 200 ms; :meth:`Session.flush` writes at once).
    """

    __slots__ = ("_native",)
    __reduce_ex__ = _refuse_pickle

    @_native_args
    def __init__(
        self,
        path: PathLike,
        *,
        durability: str = "full",
        write_behind_ms: int | None = None,
    ) -> None:
        self._native = _native.Root(_fspath(path, "path"), durability, write_behind_ms)

    @property
    def path(self) -> str:
        """The root folder."""
        return os.fspath(self._native.path)

    # Writers and readers.

    @_native_args
    def create(self, session_id: str | None = None, *, cwd: PathLike | None = None) -> Session:
        """Creates a session (a random id when None) and opens it for writing.

        ``cwd`` is the working directory the host associates with it (a str or a path
        object), recorded as the folder it names as the CLI's ``--cwd`` is: a relative one
        made absolute, ``.`` parts and repeated or trailing ``/`` dropped; :meth:`search`'s
        ``cwd`` filter is spelled the same way. Raises :class:`AlreadyExists` for a taken
        id, :class:`InvalidInput` for a bad one.
        """
        return Session(
            self._native.create(session_id, None if cwd is None else _fspath(cwd, "cwd")), self
        )

    @_native_args
    def open(self, session_id: str) -> Session:
        """Opens an existing session as its one writer.

        Raises :class:`NotFound`, or :class:`WriterOwned` (its ``owner`` says who) when
        another writer, in this process or another, has it.
        """
        return Session(self._native.open_writer(session_id), self)

    def _open_or_create(self, session_id: str) -> Session:
        """The session's writer, the session created when it is missing (the adapters').

        Another process may create it between this one's ``open`` and ``create``: the
        ``create`` then raises :class:`AlreadyExists`, and the session is opened again,
        which gives its writer or :class:`WriterOwned` (outside testing P3: two processes
        writing a new conversation at once, one got ``AlreadyExists`` in 38 of 40 races).
        """
        for _ in range(_OPEN_OR_CREATE_ATTEMPTS - 1):
            try:
                return self.open(session_id)
            except NotFound:
                pass
            try:
                return self.create(session_id)
            except AlreadyExists:
                continue  # made by another process meanwhile: open it
        return self.open(session_id)

    def reader(self, session_id: str) -> SessionReader:
        """A reader of one session (no lock; durable state). A ``session_id`` that is not a
        str raises :class:`TypeError` here (it did at the reader's first read, naming no
        argument)."""
        if not isinstance(session_id, str):
            raise TypeError(
                f"reader() argument 'session_id' must be str, not {type(session_id).__name__}"
            )
        return SessionReader(self, session_id)

    # Queries (durable state).

    @_native_args
    def list(
        self,
        cursor: str | None = None,
        limit: int = 50,
        *,
        cwd: PathLike | None = None,
        since: datetime | None = None,
        title: str | None = None,
        origin: str | None = None,
        sort: str | None = None,
        cached_only: bool = False,
    ) -> dict[str, Any]:
        """One page of sessions: ``{"sessions", "next_cursor", "skipped",
        "catalog_error"}``; pass ``next_cursor`` back (with the same filters and ``sort``)
        for the next page (limit <= 100; 0 gives 50).

        Filters combine (the CLI's ``list`` flags, the library's ``ListFilter``): ``cwd``
        (sessions created with that working directory; a relative one, ``.`` or
        ``../api``, is the absolute folder it names from the current directory, and an
        absolute one loses its ``.`` parts and repeated or trailing ``/``, as the CLI's
        ``--cwd``), ``since`` (updated at or after it: a timezone-aware
        :class:`datetime.datetime`), ``title`` (the title contains it, ASCII letters
        compared without case), ``origin`` (``"new"``, ``"fork"``, ``"rewind"``,
        ``"canonical-import"`` or ``"legacy-import"``). ``sort`` is ``"id"`` (ascending;
        None too), ``"updated"`` or ``"created"`` (newest first); ``cached_only`` serves a
        filtered or sorted page from the catalog as last refreshed (cheaper on a big root; a
        session changed since may be out of place; its first page still names, in
        ``skipped``, the sessions the last refresh found unreadable). An unknown ``origin`` or ``sort``, or
        a cursor of another order, raises :class:`InvalidInput`."""
        return _json_object(
            self._native.list(
                cursor,
                limit,
                None if cwd is None else _fspath(cwd, "cwd"),
                _epoch_ms(since),
                title,
                origin,
                "id" if sort is None else sort,
                cached_only,
            )
        )

    def iter_sessions(
        self,
        page_size: int = 100,
        *,
        cwd: PathLike | None = None,
        since: datetime | None = None,
        title: str | None = None,
        origin: str | None = None,
        sort: str | None = None,
        cached_only: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Every session summary of the root passing the filters (those of :meth:`list`,
        ``cached_only`` included), page by page, each session once.

        A live root: in ``sort="updated"`` a session committed to while the pages are read
        moves ahead of the pages already read, so the pages end with one pass over the root
        in id order, which yields, newest first, the sessions the pages did not (a
        :meth:`list` page by page misses them). So every session there from the first page
        to the end is yielded; one created meanwhile may be, one deleted meanwhile may have
        been. The ``"id"`` and ``"created"`` orders do not move."""
        walk = _SessionWalk(
            page_size,
            cwd=cwd,
            since=since,
            title=title,
            origin=origin,
            sort=sort,
            cached_only=cached_only,
        )
        while (request := walk.next_page()) is not None:
            yield from walk.take(self.list(**request))

    @_native_args
    def history(
        self, session_id: str, cursor: str | None = None, limit: int = 100
    ) -> dict[str, Any]:
        """One page of the durable transcript, newest page first and ascending inside it:
        ``{"messages": [{"message_id", "position", "event_sequence", "role", "inline",
        "content_ref"}], "has_more", "next_cursor", "snapshot_sequence"}`` (limit <= 500, a
        larger one raises :class:`InvalidInput`;
        ``event_sequence`` is the sequence of the event that wrote the message). A message over
        64 KiB has ``inline`` None and a ``content_ref`` naming the payload of the event that
        recorded it: :meth:`read_content` gives that payload's JSON, ``{"message": {...}}``
        for a ``message/complete``, ``{"messages": [...]}`` for a ``history/replace`` (find
        the message by its id); :meth:`transcript` and :meth:`SessionReader.messages` give
        the messages themselves.
        """
        return _json_object(self._native.history(session_id, cursor, limit))

    @_native_args
    def search(
        self,
        query: str,
        *,
        limit: int = 10,
        cursor: str | None = None,
        session: str | None = None,
        cwd: PathLike | None = None,
        since: datetime | None = None,
        role: str | None = None,
    ) -> dict[str, Any]:
        """Full-text search over every session of the root (durable messages and titles;
        a live writer indexes what it made durable about 50 ms after its drain, so a message
        flushed a moment ago may not be found yet; a closed session's all are),
        best first: ``{"hits": [{"session_ref", "title", "position", "message_id", "role",
        "snippet": {"text", "matches": [{"start", "end"}]}, "rank", "time_ms",
        "shared_with"}], "next_cursor", "skipped"}``. ``snippet["text"][m["start"]:m["end"]]``
        is a matching word; ``skipped`` names the sessions whose file cannot be read
        (``{"session_id", "error"}``), their message hits left out. Pass ``next_cursor`` back as ``cursor`` (with the same query and
        filters) for the next page; ``limit`` is at most 100 (0 gives 10, as in
        :meth:`list` 0 gives the default).

        The query syntax is the CLI's: words (all must match), ``"a phrase"``, ``prefix*``,
        ``OR``, ``NOT``, parentheses. Filters combine: ``session`` (its own messages and
        those it inherits), ``cwd`` (sessions created with that working directory, made
        absolute as :meth:`list` makes it),
        ``since`` (messages committed at or after it: a timezone-aware
        :class:`datetime.datetime`; commit times are whole milliseconds, so a message
        committed in the millisecond holding ``since`` is found), ``role`` (``user``,
        ``assistant``, ``tool``, …; ``title`` for titles; compared ignoring ASCII case). A malformed query or a blank
        ``role`` raises :class:`InvalidInput` with the reason.
        """
        return _json_object(
            self._native.search(
                query,
                cursor,
                limit,
                session,
                None if cwd is None else _fspath(cwd, "cwd"),
                _epoch_ms(since),
                role,
            )
        )

    @_native_args
    def transcript(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """The whole durable transcript, oldest first."""
        return _json_list(self._native.transcript(session_id))

    @_native_args
    def events(self, session_id: str, after: int = 0, limit: int = 1000) -> dict[str, Any]:
        """Durable commits after sequence ``after``, at most ``limit`` (0 for 100, at most
        1000, else :class:`InvalidInput`): ``{"commits", "next", "truncated"}``. An
        ``after`` past the session's last sequence is :class:`InvalidInput`."""
        return _json_object(self._native.events(session_id, after, limit))

    @_native_args
    def turns(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """The completed turns of the durable log, in order."""
        return _json_list(self._native.turns(session_id))

    @_native_args
    def read_content(self, session_id: str, digest: str) -> bytes:
        """The bytes behind a ``content_ref`` digest of this session or its ancestors (for
        a message of :meth:`history`, the JSON of the event payload holding it). A
        ``digest`` that is not one (64 lowercase hex characters) raises
        :class:`InvalidInput`; one the session and its ancestors do not hold
        :class:`NotFound` ("no content … in session … or its ancestors")."""
        return self._native.read_content(session_id, digest)

    @_native_args
    def writer_owner(self, session_id: str) -> dict[str, Any] | None:
        """Who holds the session's writer lock, or None."""
        owner = self._native.writer_owner(session_id)
        return None if owner is None else _json_object(owner)

    # Whole-session operations.

    @_native_args
    def fork(self, session_id: str, *, after_turn: str, child: str | None = None) -> str:
        """A new session inheriting ``session_id`` up to the end of turn ``after_turn``
        (durable prefix; copies nothing); returns its id. A :class:`Session` of this process
        writing ``session_id`` is not flushed by it: call its :meth:`Session.flush` first, or
        a turn it accepted and has not yet written is not in the durable prefix (the fork
        raises :class:`InvalidInput` saying a flush puts it there)."""
        return self._native.fork(session_id, after_turn, None, child)

    @_native_args
    def rewind(self, session_id: str, *, before_turn: str, child: str | None = None) -> str:
        """A new session holding ``session_id`` up to just before turn ``before_turn``
        (durable prefix, as :meth:`fork`: flush a :class:`Session` of this process first)."""
        return self._native.fork(session_id, None, before_turn, child)

    @_native_args
    def export(self, session_id: str, path: PathLike) -> dict[str, Any]:
        """Writes the session's durable prefix to one self-contained file: ``{"commits",
        "events", "bytes"}``. A :class:`Session` of this process writing ``session_id`` is
        not flushed by it: call its :meth:`Session.flush` first, or the batches it accepted
        and has not yet written are not in the file. Raises :class:`AlreadyExists` when
        ``path`` exists (nothing is written)."""
        return _json_object(self._native.export(session_id, _fspath(path, "path")))

    @_native_args
    def import_file(
        self, path: PathLike, *, session_id: str | None = None, cwd: PathLike | None = None
    ) -> str:
        """Validates an exported file and publishes it (under ``session_id`` if given, with
        ``cwd`` made absolute as :meth:`create` makes it); returns the id. A damaged file
        raises :class:`Corrupt` naming it and publishes nothing; a path with nothing there
        :class:`NotFound` naming it."""
        try:
            return self._native.import_file(
                _fspath(path, "path"), session_id, None if cwd is None else _fspath(cwd, "cwd")
            )
        except (NotFound, Corrupt, UnsupportedVersion) as e:
            raise _about_file(path, e) from None

    @_native_args
    def rename(self, session_id: str, title: str) -> None:
        """Sets the session's title (a ``session/title`` event written as its writer, durable
        when this returns; :meth:`list` and :meth:`search` show it at once). A blank title,
        one holding NUL or one over 1,024 bytes (UTF-8) raises :class:`InvalidInput`; a session another writer has (a :class:`Session` of
        this process included: append the event there instead) raises
        :class:`WriterOwned`. The writer the adapters of this process share is closed first,
        and they wait for the rename (an adapter has no :class:`Session` to append through)."""
        with self._adapters_writer_closed(session_id):
            self._native.rename(session_id, title)

    @_native_args
    def delete(self, session_id: str, *, wait: float = 10.0) -> None:
        """Deletes a session; forks of it keep their history. Waits at most ``wait`` seconds
        for its writer, then raises :class:`Cancelled` naming the holder (nothing deleted); a
        session no writer holds is deleted whatever ``wait`` is, 0 included. The writer the
        adapters of this process share (:mod:`session_store.agents`,
        :mod:`session_store.langgraph`) is closed first, not waited for: their next change
        makes the session anew. A signal's exception (Ctrl-C's :class:`KeyboardInterrupt`)
        ends the wait at once, nothing deleted."""
        self._delete(session_id, wait, None)

    @_native_args
    def _delete(self, session_id: str, wait: float, stop: threading.Event | None) -> None:
        """:meth:`delete` whose wait for the writer also ends once ``stop`` is set."""
        with self._adapters_writer_closed(session_id) as shared:
            if shared:
                # Their writer closed and their lock held, no adapter of this process takes
                # the session back: unless another process's writer has it, the delete is
                # over before they go on. A writer of another process is waited for
                # outside their lock (their other calls would wait with it).
                try:
                    self._native.delete(session_id, 0.0, stop)
                    return
                except Cancelled:
                    pass
        self._native.delete(session_id, wait, stop)

    def _adapters_writer_closed(self, session_id: str) -> contextlib.AbstractContextManager[bool]:
        """Closes the writer of ``session_id`` that the adapters of this process share, if
        one is open, and holds it closed for the block (they open it again at their next
        change after it): a delete waited out its ``wait`` for it and raised
        :class:`Cancelled` naming this very process, a rename raised :class:`WriterOwned`
        naming it, also when an adapter opened it again between the close and the call.
        The block gets whether adapters of this process share the writer."""
        agents = sys.modules.get(f"{__name__}.agents")
        if agents is None:  # no adapter was ever made without it
            return contextlib.nullcontext(False)
        closed: contextlib.AbstractContextManager[bool] = agents._shared_session_closed(
            self, session_id
        )
        return closed

    @_native_args
    def verify(self, session_id: str) -> dict[str, Any]:
        """:func:`verify` of this session, after the checks every other call makes of its
        folder: a real folder of the root (a symlink is refused) holding the session's own
        file (another session's file, copied or renamed there by hand, is :class:`Corrupt`)."""
        return _json_object(self._native.verify(session_id))

    # Async variants.

    async def acreate(
        self, session_id: str | None = None, *, cwd: PathLike | None = None
    ) -> Session:
        """:meth:`create` in a worker thread."""
        return await _to_thread(self.create, session_id, cwd=cwd)

    async def aopen(self, session_id: str) -> Session:
        """:meth:`open` in a worker thread."""
        return await _to_thread(self.open, session_id)

    async def alist(
        self,
        cursor: str | None = None,
        limit: int = 50,
        *,
        cwd: PathLike | None = None,
        since: datetime | None = None,
        title: str | None = None,
        origin: str | None = None,
        sort: str | None = None,
        cached_only: bool = False,
    ) -> dict[str, Any]:
        """:meth:`list` in a worker thread."""
        return await _to_thread(
            self.list,
            cursor,
            limit,
            cwd=cwd,
            since=since,
            title=title,
            origin=origin,
            sort=sort,
            cached_only=cached_only,
        )

    async def aiter_sessions(
        self,
        page_size: int = 100,
        *,
        cwd: PathLike | None = None,
        since: datetime | None = None,
        title: str | None = None,
        origin: str | None = None,
        sort: str | None = None,
        cached_only: bool = False,
    ) -> AsyncIterator[dict[str, Any]]:
        """:meth:`iter_sessions` for ``async for``: each page read in a worker thread."""
        walk = _SessionWalk(
            page_size,
            cwd=cwd,
            since=since,
            title=title,
            origin=origin,
            sort=sort,
            cached_only=cached_only,
        )
        while (request := walk.next_page()) is not None:
            for session in walk.take(await self.alist(**request)):
                yield session

    async def ahistory(
        self, session_id: str, cursor: str | None = None, limit: int = 100
    ) -> dict[str, Any]:
        """:meth:`history` in a worker thread."""
        return await _to_thread(self.history, session_id, cursor, limit)

    async def asearch(
        self,
        query: str,
        *,
        limit: int = 10,
        cursor: str | None = None,
        session: str | None = None,
        cwd: PathLike | None = None,
        since: datetime | None = None,
        role: str | None = None,
    ) -> dict[str, Any]:
        """:meth:`search` in a worker thread."""
        return await _to_thread(
            self.search,
            query,
            limit=limit,
            cursor=cursor,
            session=session,
            cwd=cwd,
            since=since,
            role=role,
        )

    async def atranscript(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """:meth:`transcript` in a worker thread."""
        return await _to_thread(self.transcript, session_id)

    async def aevents(
        self, session_id: str, after: int = 0, limit: int = 1000
    ) -> dict[str, Any]:
        """:meth:`events` in a worker thread."""
        return await _to_thread(self.events, session_id, after, limit)

    async def aturns(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """:meth:`turns` in a worker thread."""
        return await _to_thread(self.turns, session_id)

    async def aread_content(self, session_id: str, digest: str) -> bytes:
        """:meth:`read_content` in a worker thread."""
        return await _to_thread(self.read_content, session_id, digest)

    async def awriter_owner(self, session_id: str) -> dict[str, Any] | None:
        """:meth:`writer_owner` in a worker thread."""
        return await _to_thread(self.writer_owner, session_id)

    async def afork(self, session_id: str, *, after_turn: str, child: str | None = None) -> str:
        """:meth:`fork` in a worker thread."""
        return await _to_thread(self.fork, session_id, after_turn=after_turn, child=child)

    async def arewind(
        self, session_id: str, *, before_turn: str, child: str | None = None
    ) -> str:
        """:meth:`rewind` in a worker thread."""
        return await _to_thread(self.rewind, session_id, before_turn=before_turn, child=child)

    async def aexport(self, session_id: str, path: PathLike) -> dict[str, Any]:
        """:meth:`export` in a worker thread."""
        return await _to_thread(self.export, session_id, path)

    async def aimport_file(
        self, path: PathLike, *, session_id: str | None = None, cwd: PathLike | None = None
    ) -> str:
        """:meth:`import_file` in a worker thread."""
        return await _to_thread(self.import_file, path, session_id=session_id, cwd=cwd)

    async def arename(self, session_id: str, title: str) -> None:
        """:meth:`rename` in a worker thread."""
        await _to_thread(self.rename, session_id, title)

    async def adelete(self, session_id: str, *, wait: float = 10.0) -> None:
        """:meth:`delete` in a worker thread. Cancelling the task (a timeout, Ctrl-C in
        :func:`asyncio.run`) also ends the delete's wait for the writer, nothing deleted
        unless the delete already held the session (its writer had let go): the task ends
        once the worker's delete has (within about 60 ms), so when the cancellation is
        over, the delete is too."""
        stop = threading.Event()
        work = asyncio.ensure_future(_to_thread(self._delete, session_id, wait, stop))
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            # The native delete looks at `stop` every 50 ms: until it has, it may still
            # take the lock (a writer closed right after the cancellation) and delete.
            stop.set()
            # Until the worker is done, also through further cancellations of this task
            # (a timeout and a TaskGroup, a second Ctrl-C): the first one's wait ended at
            # once, before the delete had, and left its Cancelled never retrieved.
            while not work.done():
                try:
                    await asyncio.shield(work)
                except BaseException:  # its Cancelled, or one more cancellation of this task
                    pass
            if not work.cancelled():
                work.exception()  # retrieved: the caller asked for no result
            raise

    async def averify(self, session_id: str) -> dict[str, Any]:
        """:meth:`verify` in a worker thread."""
        return await _to_thread(self.verify, session_id)

    def __repr__(self) -> str:
        return f"<session_store.Root {self.path!r}>"


@_native_args
def verify(path: PathLike) -> dict[str, Any]:
    """Checks a session file, folder or export (integrity check, sequences, hashes, blob
    digests, a full replay): ``{"session_id", "commits", "events", "notes"}`` when sound
    (``notes``: what is damaged but ignored by every reader, such as a projection checkpoint
    that does not check out, one sentence each), else raises :class:`Corrupt` (or
    :class:`NotFound`, :class:`UnsupportedVersion`) naming the path."""
    try:
        return _json_object(_native.verify(_fspath(path, "path")))
    except (NotFound, Corrupt, UnsupportedVersion) as e:
        raise _about_file(path, e) from None


async def averify(path: PathLike) -> dict[str, Any]:
    """:func:`verify` in a worker thread."""
    return await _to_thread(verify, path)
