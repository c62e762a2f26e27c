"""An openai-agents ``Session`` stored in a session-store root.

:class:`SessionStoreSession` has the shape of ``agents.memory.SQLiteSession(session_id,
db_path)`` and implements the SDK's ``Session`` protocol (``get_items``, ``add_items``,
``pop_item``, ``clear_session``, all async) on one session of a root::

    from agents import Agent, Runner
    from session_store.agents import SessionStoreSession

    session = SessionStoreSession("user-42", "./sessions")
    result = await Runner.run(agent, "Hello", session=session)
    branch = session.fork(after_item=1)          # a new session with items 0..1, copy-free

How items are stored: each ``add_items`` call is one atomic, fsynced commit forming one turn
(``turn/start``, one ``message/complete`` per item, ``turn/end``). An item is stored as the
message's JSON object itself, so the store's transcript, previews and the ``sqlite3`` views
show it: the message ``id`` is a stable id the store assigns (``i<sequence>``, unique in the
session forever) and the item's own ``id``, when it has one, is kept under ``sse_item_id``
(so an item holding that key itself is refused with :class:`session_store.InvalidInput`).
``pop_item`` and ``clear_session`` are turns holding one ``history/replace`` event (the items
that remain), so the transcript changes and every earlier item stays readable in the log
(:meth:`SessionStoreSession.events`). ``pop_item`` rewrites the remaining items' JSON (its time
and the bytes it adds to the log grow with the session, as a ``history/replace``'s do: 20
pops of a 5,000-item conversation of 2.7 MB added 9.5 MB, where ``SQLiteSession`` deletes a
row; content over 1 KiB is stored once, whatever rewrites it); ``clear_session`` writes
nothing but the empty replacement.

Session ids: any ``str`` names a conversation, as for ``SQLiteSession``. One the store
accepts as a session id (``user-42``, ``alice@example.com``) is the session's id itself;
another (``user:42``, ``a/b``, ``""``, one over 255 bytes, …) is stored under
:func:`store_id_of` it: ``agx-<hex of its UTF-8>``, or ``agh-<SHA-256 of its UTF-8 in hex>``
for one over 125 bytes. An id the store accepts that has one of these forms itself is mapped
too (see :func:`store_id_of`), so two ids never share a session; so is one starting ``lg-``
or ``lgx-``, the forms :mod:`session_store.langgraph` gives its threads' sessions, so a
conversation and a LangGraph thread of one root never share a session either.

The writer lock is taken at the first change and held until :meth:`SessionStoreSession.close`
(or the end of an ``async with`` / ``with`` block, or the object's garbage collection): a
second *process* changing the same session gets :class:`session_store.WriterOwned`, whose
``owner`` names the holder. In one process, every ``SessionStoreSession`` of the same root
folder and session id shares one writer (as when a server makes a new one per request); the
lock is released when the last of them is closed. Reads take no lock. A child made by
``os.fork()`` starts with no shared writer: its adapters write once the parent has let the
session go (the parent's adapters it inherited raise :class:`session_store.WriterOwned`).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import re
import sys
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from . import (
    AlreadyExists,
    Closed,
    InvalidInput,
    NotFound,
    PathLike,
    Root,
    Session,
    SessionStoreError,
    _missing_sdk,
    _naming_caller_id,
    _native,
    _refuse_pickle,
    _to_thread,
    _to_thread_to_its_end,
    encode_json,
)

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings

__all__ = ["ITEM_ID_KEY", "SessionStoreSession", "store_id_of"]

#: The key under which an item's own ``id`` is kept (the message ``id`` is the store's).
ITEM_ID_KEY = "sse_item_id"

# The index of an event in a refusal of the store's ("invalid input: events[3] ...").
_EVENT_INDEX = re.compile(r"\bevents\[(\d+)\]")
# The store ids store_id_of gives an id the store refuses: its UTF-8 in hex (up to 125
# bytes, so at most 254 characters), else its SHA-256.
_HEXED = re.compile(r"agx-((?:[0-9a-f]{2})*)")
_HASHED = re.compile(r"agh-[0-9a-f]{64}")
_LONGEST_HEXED = 125
# The prefixes of the session ids session_store.langgraph gives its threads (lg-<id>,
# lgx-<hex>), and the form of its hashed ones (lgh-<SHA-256 hex>): an agents conversation
# is never stored under one.
_LANGGRAPH_PREFIXES = ("lg-", "lgx-")
_LANGGRAPH_HASHED = re.compile(r"lgh-[0-9a-f]{64}")


def _kept(session_id: str) -> bool:
    """Whether ``session_id`` is its own store id: the store accepts it, it is not what
    :func:`store_id_of` gives another id, and it is not of the LangGraph adapter's forms."""
    try:
        _native.check_session_id(session_id)
    except InvalidInput:
        return False
    if session_id.startswith(_LANGGRAPH_PREFIXES) or _LANGGRAPH_HASHED.fullmatch(session_id):
        return False  # the LangGraph adapter's namespace: its threads' sessions
    if _HASHED.fullmatch(session_id):
        return False  # whose it is cannot be told: an id of this form is always mapped
    hexed = _HEXED.fullmatch(session_id)
    if hexed is None:
        return True
    try:
        inner = bytes.fromhex(hexed[1]).decode()
    except UnicodeDecodeError:
        return True  # no str's UTF-8
    # The store id of `inner` when that one is mapped (its UTF-8 fits: this id is <= 255).
    return _kept(inner)


def store_id_of(session_id: str) -> str:
    """The id of the store session holding the conversation ``session_id`` (any str, as
    ``SQLiteSession`` takes): ``session_id`` itself when the store accepts it as a session
    id, else ``agx-<hex of its UTF-8>`` (``user:42`` is ``agx-757365723a3432``), or
    ``agh-<hex of the SHA-256 of its UTF-8>`` when that is over 125 bytes. Two ids never
    get the same store id: an id the store accepts that is of one of these two forms is
    mapped as well (``agh-`` and 64 hex digits, or ``agx-`` and the hex of an id the store
    refuses or of one mapped so); ``agx-6869``, the hex of ``hi``, stays itself. An id
    starting ``lg-`` or ``lgx-``, or of the form ``lgh-`` and 64 hex digits, is mapped too
    (``lg-support`` is ``agx-6c672d737570706f7274``): those are the
    :mod:`session_store.langgraph` threads' sessions (thread ``support`` is ``lg-support``),
    so a conversation and a thread never share one. A ``session_id`` that
    is not a str raises :class:`TypeError`; one that has no UTF-8 form (a lone surrogate)
    :class:`session_store.InvalidInput`."""
    if not isinstance(session_id, str):
        raise TypeError(f"session_id must be str, not {type(session_id).__name__}")
    try:
        utf8 = session_id.encode()
    except UnicodeEncodeError as e:
        raise InvalidInput(
            f"invalid input: session id {session_id!r} is not UTF-8: {e}"
        ) from None
    if _kept(session_id):
        return session_id
    if len(utf8) <= _LONGEST_HEXED:
        return f"agx-{utf8.hex()}"
    return f"agh-{hashlib.sha256(utf8).hexdigest()}"


class _SharedWriter:
    """The one writer of a session in this process, shared by its adapters."""

    __slots__ = ("key", "lock", "session", "users")

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.lock = threading.Lock()  # serializes the changes of all the adapters
        self.session: Session | None = None  # opened at the first change
        self.users = 0


_WRITERS_LOCK = threading.Lock()
_WRITERS: dict[tuple[str, str], _SharedWriter] = {}
# The thread holding _WRITERS_LOCK. A garbage collection can run at any allocation, also
# in that thread while it holds the lock, and then an adapter's finalizer must not wait
# for the lock (it would wait forever): it leaves its share in _DEFERRED, and the holder
# releases it as it lets the lock go (_unlock_registry).
_HOLDER: int | None = None
_DEFERRED: collections.deque[_SharedWriter] = collections.deque()


def _forget_inherited_writers() -> None:
    """In a child made by ``os.fork()``: a registry of its own. The inherited one holds the
    parent's writers (each raises :class:`WriterOwned` here), so the child's adapters could
    never write those sessions, also once the parent let them go; and its lock may have been
    held by a parent thread at the fork. Adapters inherited keep their share of the old one,
    with a lock of its own: the inherited one may be held by a parent thread that was
    changing the session (the child's next change waited forever instead of raising
    WriterOwned)."""
    global _WRITERS_LOCK, _WRITERS, _HOLDER, _DEFERRED
    for shared in _WRITERS.values():
        shared.lock = threading.Lock()
    _WRITERS_LOCK = threading.Lock()
    _WRITERS = {}
    _HOLDER = None
    _DEFERRED = collections.deque()


os.register_at_fork(after_in_child=_forget_inherited_writers)


def _lock_registry() -> None:
    global _HOLDER
    _WRITERS_LOCK.acquire()
    _HOLDER = threading.get_ident()


def _unlock_registry() -> None:
    global _HOLDER
    _HOLDER = None
    _WRITERS_LOCK.release()
    while _DEFERRED:
        _lock_registry()
        try:
            while _DEFERRED:
                _release_locked(_DEFERRED.popleft())
        finally:
            _HOLDER = None
            _WRITERS_LOCK.release()


def _acquire_writer(root: Root, session_id: str) -> _SharedWriter:
    key = (os.path.realpath(root.path), session_id)
    _lock_registry()
    try:
        shared = _WRITERS.get(key)
        if shared is None:
            shared = _WRITERS[key] = _SharedWriter(key)
        shared.users += 1
    finally:
        _unlock_registry()
    return shared


def _release_locked(shared: _SharedWriter) -> None:
    # Closed under the registry lock: a new adapter of the same session waits for it.
    shared.users -= 1
    if shared.users > 0:
        return
    if _WRITERS.get(shared.key) is shared:  # not a share inherited through os.fork()
        del _WRITERS[shared.key]
    with shared.lock:
        session, shared.session = shared.session, None
        if session is not None:
            session.close()


@contextlib.contextmanager
def _shared_session_closed(root: Root, session_id: str) -> Iterator[bool]:
    """Closes the writer of ``session_id`` that the adapters of this process share, if one
    is open, keeping their shares, and holds their lock for the block: no adapter of this
    process opens the session again meanwhile (one did, between the close and a delete or
    rename, which then raised naming this very process). The next change through any of
    them after the block opens (or creates) the session again. Yields whether adapters of
    this process share the session's writer."""
    key = (os.path.realpath(root.path), session_id)
    _lock_registry()
    try:
        shared = _WRITERS.get(key)
    finally:
        _unlock_registry()
    if shared is None:
        yield False
        return
    with shared.lock:
        session, shared.session = shared.session, None
        if session is not None:
            session.close()
        yield True


def _release_writer(shared: _SharedWriter) -> None:
    """Releases one adapter's share: on close(), or by its finalizer (see _HOLDER)."""
    if _HOLDER == threading.get_ident():
        _DEFERRED.append(shared)
        return
    _lock_registry()
    try:
        _release_locked(shared)
    finally:
        _unlock_registry()


def _to_message(item: Mapping[str, Any], message_id: str) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise TypeError(f"a session item must be a dict, not {type(item).__name__}")
    if ITEM_ID_KEY in item:
        # Stored as is, it would come back as the item's "id" (and replace one it has).
        raise InvalidInput(
            f"invalid input: a session item may not hold the key {ITEM_ID_KEY!r}: it keeps "
            "the item's own id in the store"
        )
    # Key order is kept: the item's own id takes the place of its "id" key.
    message = {ITEM_ID_KEY if key == "id" else key: value for key, value in item.items()}
    message["id"] = message_id
    return message


def _to_item(message: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id" if key == ITEM_ID_KEY else key: value
        for key, value in message.items()
        if key != "id"
    }


class SessionStoreSession:
    """One conversation (a session of ``root``) for the openai-agents ``Runner``.

    ``root`` is a :class:`session_store.Root` or a folder path (opened as a root, created
    when missing). The session is created at the first ``add_items``. Beyond the SDK's
    protocol: :meth:`history` (items with their stable ids), :meth:`fork`, :meth:`events`
    and :meth:`close`.
    """

    session_settings: SessionSettings | None = None
    __reduce_ex__ = _refuse_pickle

    def __init__(
        self,
        session_id: str,
        root: Root | PathLike,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        #: The id of the store session holding it (:func:`store_id_of`).
        self.store_id = store_id_of(session_id)
        self.root = root if isinstance(root, Root) else Root(root)
        if session_settings is not None:
            try:
                from agents.memory.session_settings import coerce_session_settings
            except ModuleNotFoundError as e:
                missing = _missing_sdk(
                    e, ("agents",), "SessionStoreSession(session_settings=...)", "agents",
                    "openai-agents",
                )
                if missing is None:
                    raise
                raise missing from e
            # The SDK takes a SessionSettings or a dict: any other mapping (this signature
            # accepts one) is copied into a dict first.
            if isinstance(session_settings, Mapping) and not isinstance(session_settings, dict):
                session_settings = dict(session_settings)
            self.session_settings = coerce_session_settings(session_settings)
        self._reader = self.root.reader(self.store_id)  # its connections stay open
        self._shared = _acquire_writer(self.root, self.store_id)
        # Releases this adapter's share once: on close() or when it is garbage-collected.
        self._release = weakref.finalize(self, _release_writer, self._shared)

    @property
    def _lock(self) -> threading.Lock:
        """The lock of the writer this adapter shares (made anew in a child made by
        ``os.fork()``: see :func:`_forget_inherited_writers`)."""
        return self._shared.lock

    # The SDK's protocol.

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The latest ``limit`` items (all when None and the settings set no limit, or
        when it is negative, as ``SQLiteSession`` reads them; none for 0), oldest first."""
        return await _to_thread(self.get_items_sync, limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Appends ``items`` in one durable commit (nothing for an empty list). Cancelled,
        it waits for the commit to end before it raises ``CancelledError``, as
        ``SQLiteSession`` does (so do :meth:`pop_item` and :meth:`clear_session`)."""
        await _to_thread_to_its_end(self.add_items_sync, items)

    async def pop_item(self) -> TResponseInputItem | None:
        """Removes and returns the latest item; None when there is none."""
        return await _to_thread_to_its_end(self.pop_item_sync)

    async def clear_session(self) -> None:
        """Removes every item (they stay readable in the log)."""
        await _to_thread_to_its_end(self.clear_session_sync)

    # Synchronous forms (the async methods run these in a worker thread).

    def get_items_sync(self, limit: int | None = None) -> list[Any]:
        """:meth:`get_items`, blocking."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and not isinstance(limit, int):
            # It raised "'<=' not supported between instances of 'str' and 'int'".
            raise TypeError(f"get_items() limit must be int or None, not {type(limit).__name__}")
        if limit is not None and limit < 0:
            limit = None  # SQLiteSession's (SQLite's) LIMIT -1: every item
        if limit == 0:
            return []
        try:
            # A limit beyond the native range (an OverflowError) is as many as there are.
            return self._reader._native.messages(
                None if limit is None else min(limit, sys.maxsize), ITEM_ID_KEY
            )
        except NotFound:
            return []

    def add_items_sync(self, items: list[Any]) -> None:
        """:meth:`add_items`, blocking."""
        # Checked before the writer is opened: a refused item creates no session and takes
        # no writer lock; no items (an empty list or iterable) write nothing. One item given
        # alone (a dict) is named as such ("a session item must be a dict, not str" before:
        # its keys were taken for the items).
        if isinstance(items, (Mapping, str, bytes)):
            raise TypeError(
                f"add_items() argument 'items' must be a list of items, not {type(items).__name__}"
            )
        messages = [_to_message(item, "") for item in items]
        self._check_open()  # also for no items, as SQLiteSession
        if not messages:
            return
        for i, message in enumerate(messages):
            try:
                encode_json(message).encode()
            except InvalidInput as e:
                # A NaN, a set, a key that is not str: named by item too.
                raise InvalidInput(
                    str(e).replace("invalid input: ", f"invalid input: items[{i}]: ", 1)
                ) from None
            except UnicodeEncodeError as e:
                # Named by item: the position of the whole batch's JSON could not be traced
                # back to one (outside testing, session 43).
                raise InvalidInput(
                    f"invalid input: items[{i}] holds text that is not UTF-8 "
                    f"({e.object[e.start:e.end]!a}: a surrogate has no UTF-8 form; "
                    f"at character {e.start} of the item's JSON)"
                ) from None
        with self._lock:
            writer = self._open_writer()
            accepted, _ = writer.sequences()
            first = accepted + 1
            for k, message in enumerate(messages):
                message["id"] = f"i{first + 1 + k}"
            try:
                self._turn(
                    writer,
                    first,
                    [{"kind": "message/complete", "payload": {"message": m}} for m in messages],
                )
            except InvalidInput as e:
                # The store names the batch's events, the turn's start first: the caller's
                # items are those after it.
                text = _EVENT_INDEX.sub(lambda m: f"items[{int(m[1]) - 1}]", str(e), count=1)
                raise self._named(type(e)(text)) from None

    def pop_item_sync(self) -> Any:
        """:meth:`pop_item`, blocking."""
        self._check_open()
        with self._lock:
            # No item: nothing to pop, and no session made or writer lock taken for it.
            if not self._messages(None):
                return None
            writer = self._open_writer()
            # Read again once this process holds the writer: a read made before it let
            # another process add or pop meanwhile, and the replace then dropped the item
            # it added (its add_items had returned) or popped one item twice (outside
            # testing P1, session 41).
            messages = self._messages(None)
            if not messages:
                return None
            self._replace(writer, messages[:-1])
            return _to_item(messages[-1])

    def clear_session_sync(self) -> None:
        """:meth:`clear_session`, blocking."""
        self._check_open()
        with self._lock:
            if self._shared.session is None and not self._exists():
                return
            self._replace(self._open_writer(), [])

    # Beyond the protocol.

    def history(self) -> list[dict[str, Any]]:
        """The current items with their stable ids: ``[{"item_id", "position", "item"}]``."""
        return [
            {"item_id": m["id"], "position": i, "item": _to_item(m)}
            for i, m in enumerate(self._messages(None))
        ]

    def events(self, after: int = 0, limit: int = 1000) -> dict[str, Any]:
        """The session's durable log (every item ever added, pops and clears included)."""
        return self.root.events(self.store_id, after=after, limit=limit)

    async def ahistory(self) -> list[dict[str, Any]]:
        """:meth:`history` in a worker thread."""
        return await _to_thread(self.history)

    async def aevents(self, after: int = 0, limit: int = 1000) -> dict[str, Any]:
        """:meth:`events` in a worker thread."""
        return await _to_thread(self.events, after, limit)

    def fork(
        self, after_item: int | str, new_session_id: str | None = None
    ) -> SessionStoreSession:
        """A new session holding this one's items up to and including ``after_item`` (an
        index into :meth:`get_items`, negative from the end, or a stable ``item_id`` from
        :meth:`history`). The new session shares this one's log up to that item's
        ``add_items`` turn without copying it; when that turn added more items (or later
        ones were popped), one ``history/replace`` trims the new session to the kept items.
        ``new_session_id`` is any str, as the constructor's (a random id when None).
        """
        if isinstance(after_item, bool) or not isinstance(after_item, (int, str)):
            raise TypeError("after_item must be an item index (int) or an item id (str)")
        child_id = None if new_session_id is None else store_id_of(new_session_id)
        with self._lock:
            if self._shared.session is not None:
                self._shared.session.flush()
            # The item and its turn from the history and turn indexes: no item is read.
            reader = self._reader._native
            try:
                snapshot = reader.durable_sequence()
            except NotFound:
                snapshot = None
            entry = self._entry(snapshot, after_item)
            assert snapshot is not None  # without a session, _entry found no item
            turn = self._turn_of(entry)
            try:
                child = self.root.fork(self.store_id, after_turn=turn["turn_id"], child=child_id)
            except AlreadyExists:
                if child_id == new_session_id:
                    raise
                # The store's message named only the mapped id the caller never gave.
                raise AlreadyExists(
                    f"session {new_session_id!r} already exists (stored as {child_id})"
                ) from None
            position = entry["position"]
            # The child holds the items up to the end of that turn: the kept ones exactly
            # unless the turn added more after the item or a later change touched them.
            shared = reader.transcript_prefix_kept(turn["boundary_sequence"], snapshot, position)
            kept = [] if shared else self._messages(None)[:position]
        branch = SessionStoreSession(
            child if new_session_id is None else new_session_id, self.root, self.session_settings
        )
        if not shared and branch._messages(None) != kept:
            with branch._lock:
                branch._replace(branch._open_writer(), kept)
        return branch

    async def afork(
        self, after_item: int | str, new_session_id: str | None = None
    ) -> SessionStoreSession:
        """:meth:`fork` in a worker thread."""
        return await _to_thread(self.fork, after_item, new_session_id)

    def close(self) -> None:
        """Ends this adapter's use of the session; the writer lock is released when no other
        adapter of the same session in this process still uses it, and its read connections
        are closed. Everything is already durable. Later changes through this adapter raise
        :class:`session_store.Closed`; reads still answer (opening connections again)."""
        self._release()
        self._reader._drop_connections()

    async def aclose(self) -> None:
        """:meth:`close` in a worker thread."""
        await _to_thread(self.close)

    def __enter__(self) -> SessionStoreSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> SessionStoreSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<SessionStoreSession {self.session_id!r} in {self.root.path!r}>"

    # Internals.

    def _exists(self) -> bool:
        try:
            self.root.turns(self.store_id)
        except NotFound:
            return False
        return True

    def _check_open(self) -> None:
        """Raises :class:`session_store.Closed` once :meth:`close` was called: every change
        does, also one that would change nothing (``SQLiteSession`` raises for each; an
        empty ``add_items`` or a ``pop_item`` of nothing passed here)."""
        if not self._release.alive:
            # Named as the core Session's Closed names its session.
            name = json.dumps(self.store_id, ensure_ascii=False)
            raise self._named(Closed(f"session {name} is closed"))

    def _open_writer(self) -> Session:
        """The shared writer (held ``self._lock``), opened or created at first use."""
        self._check_open()
        shared = self._shared
        if shared.session is None:
            try:
                shared.session = self.root._open_or_create(self.store_id)
            except SessionStoreError as e:
                raise self._named(e) from None
        return shared.session

    def _named(self, error: SessionStoreError) -> SessionStoreError:
        """``error``, of this conversation's store session, naming the conversation by the
        id the caller gave as well when the store's id is another (a mapped id, which alone
        did not say which conversation): ``session "user:42" (stored as
        agx-757365723a3432) is owned by another writer: …``, of the same class (a
        :class:`WriterOwned` keeps its ``owner``). ``error`` itself for an id kept as is."""
        if self.store_id == self.session_id:
            return error
        named = f"{json.dumps(self.session_id, ensure_ascii=False)} (stored as {self.store_id})"
        return _naming_caller_id(error, self.store_id, named)

    def _turn(self, writer: Session, first: int, events: list[dict[str, Any]]) -> None:
        """One durable turn ``t<first>`` holding ``events``."""
        turn = f"t{first}"
        batch = {
            "operation_id": f"agents-{first}",
            "turn_id": turn,
            "events": [
                {"kind": "turn/start"},
                *events,
                {"kind": "turn/end", "payload": {"status": "completed"}},
            ],
        }
        writer.append_json(encode_json(batch))
        writer.flush()

    def _replace(self, writer: Session, messages: list[dict[str, Any]]) -> None:
        accepted, _ = writer.sequences()
        self._turn(
            writer,
            accepted + 1,
            [{"kind": "history/replace", "payload": {"messages": messages}}],
        )

    def _messages(self, limit: int | None) -> list[dict[str, Any]]:
        """The latest ``limit`` stored messages (all for None), oldest first."""
        try:
            return self._reader.messages(limit)
        except NotFound:
            return []

    def _entry(self, snapshot: int | None, after_item: int | str) -> dict[str, Any]:
        """The transcript entry ``{"position", "message_id", "event_seq"}`` of
        ``after_item`` (an index, negative from the end, or an item id) as of ``snapshot``
        (None: the session does not exist yet)."""
        reader = self._reader._native
        if isinstance(after_item, str):
            found = None if snapshot is None else reader.transcript_find(snapshot, after_item)
            if found is None:
                raise NotFound(f"item {after_item!r} is not in the session")
            return found
        if snapshot is None:
            raise IndexError(f"item index {after_item} out of range (0 items)")
        count = reader.transcript_len(snapshot)
        index = after_item + count if after_item < 0 else after_item
        if not 0 <= index < count:
            raise IndexError(f"item index {after_item} out of range ({count} items)")
        entry = reader.transcript_entry(snapshot, index + 1)
        if entry is None:
            raise SessionStoreError(f"item {index} is missing from the history index")
        return entry

    def _turn_of(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The turn that added the transcript entry ``entry``'s item: the ``add_items`` turn
        of this adapter's own item ``i<seq>`` (``seq`` is the event that added it, which a
        later ``history/replace`` rewrote), else the turn holding the event that wrote the
        entry (an item another writer added: the CLI, the core API, an importer; it was
        refused, though :meth:`history` gives its id)."""
        message_id = entry["message_id"]
        if message_id.startswith("i") and message_id[1:].isdigit():
            seq = int(message_id[1:])
        else:
            seq = entry["event_seq"]
        holding = self._reader._native.turn_holding(seq)
        if holding is not None:
            turn: dict[str, Any] = json.loads(holding)
            if turn["start_sequence"] < seq < turn["end_sequence"]:
                return turn
        raise SessionStoreError(f"no completed turn holds item {message_id!r}")
