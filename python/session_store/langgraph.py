"""A LangGraph checkpointer stored in a session-store root.

:class:`SessionStoreSaver` is a ``BaseCheckpointSaver`` (sync and async methods)::

    from langgraph.graph import StateGraph, MessagesState
    from session_store.langgraph import SessionStoreSaver

    saver = SessionStoreSaver("./sessions")
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "t1"}})
    saver.copy_thread("t1", "t1-branch")          # a fork of the session: copies nothing

How it is stored: a LangGraph *thread* is one session of the root (id ``lg-<thread_id>``
for a thread id of ``[a-z0-9_-]``, else ``lgx-<hex of its UTF-8>``, or ``lgh-<SHA-256 hex
of its UTF-8>`` when that is over 255 bytes); checkpoint namespaces live inside it. Every change is one durable (fsynced) commit forming one turn and holding
optional events:

- ``langgraph/value`` ``{"t", "b"}``, one per channel this checkpoint gave a new version
  (``new_versions``), then ``langgraph/checkpoint`` ``{"ns", "id", "parent", "checkpoint",
  "metadata", "values"}``: the checkpoint without its channel values, its metadata, and
  ``[channel, version, base]`` naming the commit's value events in order. A value is the
  serializer's ``(type, bytes)`` (bytes in base64) and nothing else, so equal values are
  equal payloads: a value above the store's inline threshold (1 KiB) is a content part and
  a payload over 64 KiB a blob, each stored once per file however many checkpoints hold it.
  A list channel that only grew since the version this saver last wrote or read
  (``messages``) names that version as its ``base`` and its value event holds the appended
  items only, read back as the base's list plus them.
- ``langgraph/writes`` ``{"ns", "id", "task", "path", "writes": [[idx, channel, value]]}``:
  pending writes of one task (a regular write already stored under the same task and index
  is kept; the special ones, negative indexes, are replaced).
- ``langgraph/delete`` ``{"checkpoints": [[ns, id]]}``: ``prune`` and ``delete_for_runs``
  hide checkpoints and their writes (the values stay, other checkpoints may share them; the
  log keeps everything).
- ``langgraph/thread`` ``{"id"}``: the thread id of an ``lgh-`` session, which its session
  id does not give back, in the thread's first commit (and in the first commit a
  ``copy_thread`` to it makes); the last one names the thread.

A session of a thread's id that holds other events (a ``message/complete``, say: made by
:meth:`session_store.Root.create` or the CLI, not by a saver) is not a thread: ``list``
passes it over, and ``put``, ``put_writes``, ``delete_thread``, ``copy_thread`` and
``prune`` of that thread raise :class:`session_store.InvalidInput` and change nothing (they
wrote LangGraph events into it, or deleted it). A thread's session holds ``langgraph/*``,
``turn/start``, ``turn/end`` and ``session/title`` events only.

``delete_thread`` deletes the session; ``copy_thread`` forks it after its last turn (the
target shares the source's file prefix, nothing is copied); ``prune(strategy="delete")``
deletes the sessions. Reads go through the durable log, folded into a per-thread index
that later reads extend with the new commits only (and build again when the thread's session
was deleted, or deleted and made again, by another saver or process); the index is kept
for the threads whose reader or writer the saver keeps open (the last
``max_open_threads`` read and the last written), so its memory does not grow with the
number of threads it has used.

The saver holds the writer lock of the threads it changed until :meth:`close` (or the end
of a ``with`` block, or its garbage collection), of the last ``max_open_threads`` it
used at most (the least recently used one's is let go beyond them); in one process it
shares writers with the other adapters of the same root folder
(:mod:`session_store.agents`), another process gets :class:`WriterOwned`. A saver copied
into a child by ``os.fork()`` starts there with no writer and reads the logs again.
"""

from __future__ import annotations

import base64
import builtins
import collections
import hashlib
import json
import os
import random
import re
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from . import (
    AlreadyExists,
    InvalidInput,
    NotFound,
    PathLike,
    Root,
    Session,
    SessionStoreError,
    _raise_missing_sdk,
    _naming_caller_id,
    _native,
    _refuse_pickle,
    _to_thread,
    encode_json,
)

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ModuleNotFoundError:
    _raise_missing_sdk(
        ("langchain_core", "langgraph"), __name__, "langgraph", "langgraph-checkpoint"
    )
from .agents import _acquire_writer, _release_writer, _SharedWriter

__all__ = ["MAX_OPEN_THREADS", "SessionStoreSaver", "session_id_of", "thread_id_of"]

#: The longest session id, in UTF-8 bytes (the store's limit).
_MAX_SESSION_ID = 255
_SAFE = re.compile(r"[a-z0-9_-]{1,%d}" % (_MAX_SESSION_ID - len("lg-")))
_CHECKPOINT = "langgraph/checkpoint"
_VALUE = "langgraph/value"
_WRITES = "langgraph/writes"
_DELETE = "langgraph/delete"
_THREAD = "langgraph/thread"
#: The session id of a thread whose ``lgx-`` form is too long: the SHA-256 of its UTF-8.
_HASHED = re.compile(r"lgh-[0-9a-f]{64}")
#: The kinds a thread's session holds besides ``langgraph/*`` (a title set by hand too).
_THREAD_KINDS = frozenset({"turn/start", "turn/end", "session/title"})
_MISSING = object()


def session_id_of(thread_id: str) -> str:
    """The session id holding LangGraph thread ``thread_id``: ``lg-<thread_id>`` for an id
    of ``[a-z0-9_-]`` (at most 252 characters), else ``lgx-<hex of its UTF-8>`` (up to 125
    bytes), else ``lgh-<hex of the SHA-256 of its UTF-8>``. A thread id that is not UTF-8
    (a lone surrogate) raises :class:`session_store.InvalidInput` naming it."""
    thread_id = str(thread_id)
    if _SAFE.fullmatch(thread_id):
        return f"lg-{thread_id}"
    try:
        utf8 = thread_id.encode()
    except UnicodeEncodeError as e:
        raise InvalidInput(f"invalid input: thread id {thread_id!r} is not UTF-8: {e}") from None
    session_id = f"lgx-{utf8.hex()}"
    if len(session_id) <= _MAX_SESSION_ID:
        return session_id
    return f"lgh-{hashlib.sha256(utf8).hexdigest()}"


def thread_id_of(session_id: str) -> str | None:
    """The thread id a session's id gives back, or None for a session that is not a
    thread's: only an id :func:`session_id_of` makes is one (``lg-ABC`` or ``lgx-61``, made
    by hand, would name threads whose sessions are ``lgx-414243`` and ``lg-a``). None too
    for an ``lgh-`` id (a long thread id's hash): its thread id is in its log (a
    ``langgraph/thread`` event), where :meth:`SessionStoreSaver.list` reads it."""
    thread: str | None = None
    if session_id.startswith("lg-"):
        thread = session_id[3:]
    elif session_id.startswith("lgx-"):
        try:
            thread = bytes.fromhex(session_id[4:]).decode()
        except ValueError:
            return None
    if thread is None or session_id_of(thread) != session_id:
        return None
    return thread


def _encode(typed: tuple[str, bytes]) -> dict[str, str]:
    return {"t": typed[0], "b": base64.b64encode(typed[1]).decode("ascii")}


def _decode(value: dict[str, Any]) -> tuple[str, bytes]:
    return value["t"], base64.b64decode(value["b"])


def _msgpack_array_header(count: int) -> bytes:
    """The bytes msgpack starts an array of ``count`` items with."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


class _ListForm:
    """A list channel value as the serializer wrote it: the saver's base of the next list
    grown from it, and the bytes a read decodes afresh (never the objects a put was given or
    a read returned: an item changed in place since, an earlier message edited, would change
    the base too). From a serializer writing the list as one msgpack array (LangGraph's
    default), its items' bytes after the array header (``body``): msgpack items delimit
    themselves, so a list whose body starts with this one holds these items first,
    serialized alike. From any other serializer, each item serialized on its own
    (``items``)."""

    __slots__ = ("count", "body", "items")

    def __init__(self, count: int, body: bytes | None, items: list[tuple[str, bytes]] | None):
        self.count = count
        self.body = body
        self.items = items

    @classmethod
    def of(cls, serde: SerializerProtocol, value: list[Any]) -> tuple[tuple[str, bytes], _ListForm]:
        """``value`` serialized whole (what a saver storing it whole writes), and its form."""
        typed = serde.dumps_typed(value)
        kind, data = typed
        header = _msgpack_array_header(len(value))
        if kind == "msgpack" and data.startswith(header):
            return typed, cls(len(value), data[len(header) :], None)
        return typed, cls(len(value), None, [serde.dumps_typed(item) for item in value])

    def suffix_after(
        self, serde: SerializerProtocol, head: _ListForm, value: list[Any]
    ) -> tuple[str, bytes] | None:
        """The items of ``value`` (whose form this is) after ``head``, serialized as one
        list, when ``value`` starts with ``head``'s items serialized alike; else ``None``.
        ``==`` alone would take ``1``, ``True`` and ``1.0`` for one value."""
        n = head.count
        if not 0 < n <= self.count:
            return None
        if self.body is not None and head.body is not None:
            if not self.body.startswith(head.body):
                return None
            return ("msgpack", _msgpack_array_header(self.count - n) + self.body[len(head.body) :])
        if self.items is not None and head.items is not None and self.items[:n] == head.items:
            return serde.dumps_typed(value[n:])
        return None

    def decode(self, serde: SerializerProtocol) -> list[Any]:
        """The list decoded afresh."""
        if self.body is not None:
            value: list[Any] = serde.loads_typed(
                ("msgpack", _msgpack_array_header(self.count) + self.body)
            )
            return value
        assert self.items is not None
        return [serde.loads_typed(item) for item in self.items]


class _Thread:
    """What the durable log of one thread says, folded (raw records, decoded lazily)."""

    __slots__ = ("after", "blobs", "checkpoints", "foreign", "thread", "values", "writes")

    def __init__(self) -> None:
        self.after = 0  # the last sequence folded in
        # The thread id the last langgraph/thread event names (lgh- sessions only).
        self.thread: str | None = None
        # (sequence, kind) of the first event no saver writes: the session is not a thread's.
        self.foreign: tuple[int, str] | None = None
        # ns -> checkpoint id -> (checkpoint record, metadata record, parent id)
        self.checkpoints: dict[str, dict[str, tuple[Any, Any, str | None]]] = {}
        # (ns, channel, version) -> value record
        self.blobs: dict[tuple[str, str, Any], dict[str, Any]] = {}
        # (ns, checkpoint id) -> (task, idx) -> (task, channel, value record, path)
        self.writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Any, str]]] = {}
        # The value events of the commit being folded, for its checkpoint event.
        self.values: list[dict[str, Any]] = []

    def fold(self, kind: str, payload: Any) -> None:
        if kind == _VALUE:
            self.values.append(payload)
        elif kind == _CHECKPOINT:
            ns = payload["ns"]
            if len(payload["values"]) != len(self.values):
                raise SessionStoreError(
                    f"checkpoint {payload['id']!r} names {len(payload['values'])} values, "
                    f"its commit holds {len(self.values)}"
                )
            for (channel, version, base), value in zip(payload["values"], self.values):
                record = value if base is None else {**value, "base": base}
                self.blobs[(ns, channel, version)] = record
            self.values = []
            self.checkpoints.setdefault(ns, {})[payload["id"]] = (
                payload["checkpoint"],
                payload["metadata"],
                payload["parent"],
            )
        elif kind == _WRITES:
            stored = self.writes.setdefault((payload["ns"], payload["id"]), {})
            task, path = payload["task"], payload["path"]
            for idx, channel, value in payload["writes"]:
                key = (task, idx)
                if idx >= 0 and key in stored:
                    continue
                stored[key] = (task, channel, value, path)
        elif kind == _DELETE:
            for ns, cid in payload["checkpoints"]:
                self.checkpoints.get(ns, {}).pop(cid, None)
                self.writes.pop((ns, cid), None)
        elif kind == _THREAD:
            thread = payload.get("id") if isinstance(payload, dict) else None
            self.thread = thread if isinstance(thread, str) else None


#: How many threads' writers, and readers, a saver keeps open at most by default (its
#: ``max_open_threads``): each holds file descriptors (about six for a writer, four for a
#: reader); the least recently used thread's are closed beyond it and opened again when
#: that thread is used next. What the saver knows of a thread's log (its folded index) is
#: dropped with the last of the two, and read again then: a host running more threads at
#: once than this reopens and rereads a thread at nearly every step.
MAX_OPEN_THREADS = 32


def _release_writers(writers: dict[str, _SharedWriter]) -> None:
    """Lets go of a saver's shares of its threads' writers (once it is collected)."""
    while writers:
        _release_writer(writers.popitem()[1])


#: Every saver of this process, for _forget_inherited_state.
_SAVERS: weakref.WeakSet[SessionStoreSaver] = weakref.WeakSet()
#: Every copy of a saver (``SessionStoreSaver.__copy__``), for _forget_inherited_state.
_CLONES: weakref.WeakSet[SessionStoreSaver] = weakref.WeakSet()


def _forget_inherited_state() -> None:
    """In a child made by ``os.fork()``: every saver starts afresh. The writers it held are
    its parent's (they raise :class:`WriterOwned` here, so the child could never write those
    threads, also once the parent let them go), and its lock may have been held by a parent
    thread at the fork; what it knew of the logs is read again."""
    for saver in list(_SAVERS):
        saver._reset()
    for clone in list(_CLONES):
        clone._share(clone._origin)


os.register_at_fork(after_in_child=_forget_inherited_state)


def _about_thread(error: SessionStoreError, thread_id: str) -> SessionStoreError:
    """``error``, of the session of LangGraph thread ``thread_id``, naming the thread too:
    ``session lgx-5431 (LangGraph thread "T1") is owned by another writer: …`` (it named
    only the session, which the caller cannot tell for its thread; outside testing P5,
    session 41)."""
    if "LangGraph thread" in str(error):
        return error  # the saver's own refusal names it already
    sid = session_id_of(thread_id)
    named = f"{sid} (LangGraph thread {json.dumps(thread_id, ensure_ascii=False)})"
    return _naming_caller_id(error, sid, named)


class SessionStoreSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose threads are sessions of ``root`` (a
    :class:`session_store.Root` or a folder, created when missing). It keeps the writers,
    and the readers, of the last ``max_open_threads`` threads it used open
    (:data:`MAX_OPEN_THREADS` by default): a host running more threads at once than that
    gives a larger number (each costs about ten file descriptors), or every step of a thread
    reopens its session and reads its log again (about ten times slower, measured with 64
    threads against 32)."""

    __reduce_ex__ = _refuse_pickle
    #: The saver a copy shares its state with (``__copy__``); a saver made by ``__init__``
    #: has none.
    _origin: SessionStoreSaver

    def __init__(
        self,
        root: Root | PathLike,
        *,
        serde: SerializerProtocol | None = None,
        max_open_threads: int = MAX_OPEN_THREADS,
    ) -> None:
        if isinstance(max_open_threads, bool) or not isinstance(max_open_threads, int):
            raise TypeError(
                f"max_open_threads must be int, not {type(max_open_threads).__name__}"
            )
        if max_open_threads < 1:
            raise InvalidInput(
                f"invalid input: max_open_threads must be at least 1, not {max_open_threads}"
            )
        super().__init__(serde=serde)
        self.root = root if isinstance(root, Root) else Root(root)
        self._max_open_threads = max_open_threads
        self._reset()
        _SAVERS.add(self)

    def __copy__(self) -> SessionStoreSaver:
        """A saver of the same threads with this one's writers, readers and caches, shared
        (not copied), and its own attributes otherwise: what ``with_allowlist`` makes with
        ``copy.copy`` (every ``compile()`` calls it under ``LANGGRAPH_STRICT_MSGPACK``) to
        give it another ``serde``. The copy keeps this saver alive, so the writers are let
        go when both are gone or either is closed. ``copy.deepcopy`` and ``pickle`` still
        raise :class:`TypeError`."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._origin = getattr(self, "_origin", self)
        _CLONES.add(clone)
        return clone

    def _share(self, origin: SessionStoreSaver) -> None:
        """Takes ``origin``'s state again (a copy, after ``origin._reset()`` in a child
        made by ``os.fork()``), keeping its own ``serde``."""
        self.__dict__.update(
            {k: v for k, v in origin.__dict__.items() if k not in ("serde", "_origin")}
        )

    def _reset(self) -> None:
        """No writer, nothing known of any thread (also in a child made by ``os.fork()``)."""
        self._lock = threading.RLock()
        self._threads: dict[str, _Thread] = {}
        # thread -> set once this saver's delete of it has ended: its commits wait for that
        # (see _commit).
        self._deleting: dict[str, threading.Event] = {}
        # The writers' shares are let go by close(), or when the saver is collected (as an
        # agents adapter's: a saver dropped unclosed held its threads' writer locks for the
        # process's life). Shares inherited through os.fork() are the parent's: not let go.
        old = getattr(self, "_release_writers", None)
        if old is not None:
            old.detach()
        # Both least recently used first, at most max_open_threads each (see _commit).
        self._writers: collections.OrderedDict[str, _SharedWriter] = collections.OrderedDict()
        self._release_writers = weakref.finalize(self, _release_writers, self._writers)
        # (thread, ns, channel) -> (version, the form of the list value last stored or
        # read): the base of a list channel that only grows, and the start of the next read
        # of it (see _ListForm).
        self._lists: dict[tuple[str, str, str], tuple[Any, _ListForm]] = {}
        # thread -> a reader of its session and the identity of the session file that the
        # caches above describe (see _current).
        self._readers: collections.OrderedDict[str, _native.Reader] = collections.OrderedDict()
        self._identities: dict[str, tuple[int, int, int] | None] = {}

    # Reading.

    def _forget(self, thread_id: str) -> None:
        """Drops what this saver knows of the thread's log (its index and list bases)."""
        self._threads.pop(thread_id, None)
        for key in [k for k in self._lists if k[0] == thread_id]:
            del self._lists[key]

    def _drop_unused(self, thread_id: str) -> None:
        """Forgets what this saver knows of a thread whose reader or writer it just let go,
        when it has neither left: the index, list bases and identity are kept for the
        threads it has open only (a saver that had read thousands of threads kept each one's
        folded log in memory). The next use reads the log again."""
        if thread_id not in self._readers and thread_id not in self._writers:
            self._forget(thread_id)
            self._identities.pop(thread_id, None)

    def _current(self, thread_id: str) -> None:
        """Forgets what this saver knows of the thread when its session is not the one it
        was learned from: deleted, or deleted and made again (by another saver or process)."""
        reader = self._readers.get(thread_id)
        if reader is None:
            reader = self._readers[thread_id] = self.root._native.reader(session_id_of(thread_id))
            # Its read connections stay open: only the last max_open_threads are kept.
            while len(self._readers) > self._max_open_threads:
                self._drop_unused(self._readers.popitem(last=False)[0])
        else:
            self._readers.move_to_end(thread_id)
        try:
            identity: tuple[int, int, int] | None = reader.identity()
        except NotFound:
            identity = None
        known = self._identities.get(thread_id)
        # No session: nothing to know. A session made since none was seen holds only what
        # this saver wrote to it (its first put creates it), so that is kept.
        if identity is None or (known is not None and known != identity):
            self._forget(thread_id)
        self._identities[thread_id] = identity

    def _thread(self, thread_id: str) -> _Thread | None:
        """The thread's index brought up to its durable log; None when there is no session."""
        sid = session_id_of(thread_id)
        with self._lock:
            self._current(thread_id)
            model = self._threads.get(thread_id)
            if model is None:
                model = _Thread()
            if not self._fold_log(sid, model):
                self._threads.pop(thread_id, None)
                return None
            self._threads[thread_id] = model
            return model

    def _fold_log(self, sid: str, model: _Thread) -> bool:
        """Folds session ``sid``'s durable commits after ``model.after`` into ``model``;
        False when there is no such session."""
        while True:
            try:
                page = self.root.events(sid, after=model.after, limit=1000)
            except NotFound:
                return False
            for commit in page["commits"]:
                model.values = []
                for event in commit["events"]:
                    kind = event["kind"]
                    if kind.startswith("langgraph/"):
                        model.fold(kind, event["payload"])
                    elif kind not in _THREAD_KINDS and model.foreign is None:
                        model.foreign = (event["seq"], kind)
                    model.after = event["seq"]
            if not page["truncated"] or not page["commits"]:
                return True

    def _root_threads(self) -> builtins.list[str]:
        """The thread ids of every session of the root that is a thread's: given back by
        its id (:func:`thread_id_of`) or, for an ``lgh-`` id, named by its log's last
        ``langgraph/thread`` event whose id hashes to it."""
        threads = []
        for session in list(self.root.iter_sessions()):
            sid = session["session_ref"]["session_id"]
            thread = thread_id_of(sid)
            if thread is None and _HASHED.fullmatch(sid):
                model = _Thread()
                if self._fold_log(sid, model) and model.thread is not None:
                    if session_id_of(model.thread) == sid:
                        thread = model.thread
            if thread is not None:
                threads.append(thread)
        return threads

    def _thread_if_saved(self, thread_id: str) -> _Thread | None:
        """The thread's index when its session is a thread's (None for no session, or for
        one holding events no saver writes)."""
        model = self._thread(thread_id)
        return None if model is None or model.foreign is not None else model

    def _require_thread(self, thread_id: str, refused: str) -> _Thread | None:
        """The thread's index (None when there is no session); raises
        :class:`session_store.InvalidInput` when its session holds events no saver writes
        (it is not a thread's, so ``refused`` is not done to it)."""
        model = self._thread(thread_id)
        if model is not None and model.foreign is not None:
            seq, kind = model.foreign
            raise InvalidInput(
                f"invalid input: session {session_id_of(thread_id)} is not the session of "
                f"LangGraph thread {thread_id!r}: it holds a {kind} event (sequence {seq}), "
                f"which no saver writes; {refused} refused, nothing changed"
            )
        return model

    def _value(self, thread_id: str, model: _Thread, ns: str, channel: str, version: Any) -> Any:
        """The value of ``channel`` at ``version``, decoded afresh: a list stored as appended
        items is its base's list plus them, the chain of bases followed back to a whole
        value or to the version this saver last read or wrote (kept serialized, see
        :class:`_ListForm`)."""
        key = (thread_id, ns, channel)
        cached = self._lists.get(key)
        suffixes: list[list[Any]] = []
        record = model.blobs.get((ns, channel, version))
        base: list[Any] | None = None
        at = version
        while True:
            if cached is not None and cached[0] == at:
                base = cached[1].decode(self.serde)
                break
            if record is None:
                raise SessionStoreError(
                    f"checkpoint value {channel!r} version {at!r} is missing from the log"
                )
            if "base" not in record:
                break
            suffixes.append(self.serde.loads_typed(_decode(record)))
            at = record["base"]
            record = model.blobs.get((ns, channel, at))
        if base is None:
            assert record is not None  # the loop stops at a whole value or a cached one
            value = self.serde.loads_typed(_decode(record))
            if not suffixes and not isinstance(value, list):
                return value
            base = value
        elif not suffixes:
            return base  # the form cached is this version's
        value = list(base)
        for suffix in reversed(suffixes):
            value.extend(suffix)
        self._lists[key] = (version, _ListForm.of(self.serde, value)[1])
        return value

    def _tuple(self, thread_id: str, model: _Thread, ns: str, cid: str) -> CheckpointTuple:
        record, metadata, parent = model.checkpoints[ns][cid]
        checkpoint: Checkpoint = self.serde.loads_typed(_decode(record))
        values = {}
        for channel, version in checkpoint["channel_versions"].items():
            if (ns, channel, version) in model.blobs:
                values[channel] = self._value(thread_id, model, ns, channel, version)
        stored = model.writes.get((ns, cid), {})
        writes = [
            (task, channel, self.serde.loads_typed(_decode(value)))
            for task, channel, value, _ in (
                stored[k] for k in sorted(stored, key=lambda k: writes_sort_key(stored[k][3], *k))
            )
        ]
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": cid,
                }
            },
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self.serde.loads_typed(_decode(metadata)),
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": parent,
                    }
                }
                if parent
                else None
            ),
            pending_writes=writes,
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (its latest in the namespace without an id)."""
        thread_id = str(config["configurable"]["thread_id"])
        ns = config["configurable"].get("checkpoint_ns", "")
        with self._lock:
            model = self._thread(thread_id)
            if model is None:
                return None
            checkpoints = model.checkpoints.get(ns, {})
            cid = get_checkpoint_id(config)
            if cid is None:
                if not checkpoints:
                    return None
                cid = max(checkpoints)
            elif cid not in checkpoints:
                return None
            return self._tuple(thread_id, model, ns, cid)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, of ``config``'s thread (and namespace and id when it
        names them; every thread of the root for None), matching ``filter`` (metadata
        equality), older than ``before``, at most ``limit``."""
        if config is not None:
            threads = [str(config["configurable"]["thread_id"])]
            want_ns = config["configurable"].get("checkpoint_ns")
            want_id = get_checkpoint_id(config)
        else:
            threads = self._root_threads()
            want_ns = want_id = None
        before_id = get_checkpoint_id(before) if before else None
        with self._lock:
            # Every checkpoint asked for, then newest first across threads and namespaces,
            # as SqliteSaver orders them (`ORDER BY checkpoint_id DESC`): thread by thread
            # and namespace by namespace, `limit` took another set (outside testing,
            # session 43: `list(None, limit=1)` gave an older thread's checkpoint). The
            # tuples are then built thread by thread, each thread read once (the saver
            # keeps at most max_open_threads of them).
            found: list[tuple[str, str, str]] = []
            for thread_id in threads:
                model = self._thread_if_saved(thread_id)
                if model is None:
                    continue
                for ns, checkpoints in model.checkpoints.items():
                    if want_ns is not None and ns != want_ns:
                        continue
                    for cid in checkpoints:
                        if want_id and cid != want_id:
                            continue
                        if before_id and cid >= before_id:
                            continue
                        if filter:
                            metadata = self.serde.loads_typed(_decode(checkpoints[cid][1]))
                            if not all(metadata.get(k) == v for k, v in filter.items()):
                                continue
                        found.append((cid, thread_id, ns))
            found.sort(reverse=True)
            if limit is not None:
                found = found[: max(limit, 0)]
            at: dict[str, builtins.list[int]] = {}
            for i, (_, thread_id, _) in enumerate(found):
                at.setdefault(thread_id, []).append(i)
            built: builtins.list[CheckpointTuple | None] = [None] * len(found)
            for thread_id, positions in at.items():
                model = self._thread_if_saved(thread_id)
                if model is None:
                    continue
                for i in positions:
                    cid, _, ns = found[i]
                    built[i] = self._tuple(thread_id, model, ns, cid)
            out = [t for t in built if t is not None]
        yield from out

    # Writing.

    def _commit(
        self,
        thread_id: str,
        events_of: Callable[[], builtins.list[tuple[str, Any]]],
    ) -> None:
        """One durable turn holding the optional ``(kind, payload)`` events that
        ``events_of`` gives, called once the writer is held (opened at first use) and under
        the saver's lock: what they name of the thread's log (a list's base) is read from
        the session this commit goes into. Built before the writer was opened, a put raced
        by another process's ``delete_thread`` named a base the thread made again by the
        put did not hold, and no other saver could read the checkpoint (outside testing
        P2, session 41)."""
        # A commit of a thread this saver is deleting waits for the delete to end (then
        # makes the thread anew): it opened the writer the delete had just let go, and the
        # delete waited out its 10 s for this very process and gave up (outside testing
        # P3, session 41).
        try:
            while True:
                with self._lock:
                    gate = self._deleting.get(thread_id)
                    if gate is None:
                        writer = self._append(thread_id, events_of)
                        break
                gate.wait()
            # Outside the locks: a commit appended meanwhile by another thread (LangGraph
            # saves from background threads) goes into the same fsynced transaction, and
            # this call returns once its own commit is durable (group commit).
            writer.flush()
        except SessionStoreError as e:
            raise _about_thread(e, thread_id) from None

    def _append(
        self,
        thread_id: str,
        events_of: Callable[[], builtins.list[tuple[str, Any]]],
    ) -> Session:
        """:meth:`_commit`'s append, under the saver's lock: the writer it appended to."""
        # The append under the saver's lock: a writer share let go here (below) is never
        # one another thread of this saver is appending through.
        shared = self._writers.get(thread_id)
        if shared is None:
            # Once per writer this saver opens: a session of another kind under the
            # thread's id is not written to.
            self._require_thread(thread_id, "writing to it")
            shared = self._writers[thread_id] = _acquire_writer(
                self.root, session_id_of(thread_id)
            )
            # Every open writer holds about six file descriptors: a saver that kept the
            # writer of every thread it wrote ran out of them ("Too many open files"
            # after 168 threads under the usual limit of 1024). The least recently
            # written thread's share is let go (its writer closed, flushed, unless
            # another adapter of the process shares it); its next put opens it again.
            while len(self._writers) > self._max_open_threads:
                evicted, share = self._writers.popitem(last=False)
                _release_writer(share)
                self._drop_unused(evicted)
        else:
            self._writers.move_to_end(thread_id)
        named: _Thread | None = None
        with shared.lock:
            if shared.session is None:
                shared.session = self.root._open_or_create(session_id_of(thread_id))
            writer = shared.session
            events = events_of()
            if _HASHED.fullmatch(session_id_of(thread_id)):
                # Its session id does not give the thread id back: the log names it, in
                # the first commit of a new thread or of a copy (whose log named its
                # source). Saves from background threads run before the first commit
                # is durable: the index is told at once, so one commit names it (not
                # each of those).
                model = self._thread(thread_id)
                if model is None or model.thread != thread_id:
                    events = [(_THREAD, {"id": thread_id}), *events]
                    if model is None:
                        model = self._threads[thread_id] = _Thread()
                    named = model
            first = writer.sequences()[0] + 1
            batch = {
                "operation_id": f"langgraph-{first}",
                "turn_id": f"t{first}",
                "events": [
                    {"kind": "turn/start"},
                    *({"kind": k, "optional": True, "payload": p} for k, p in events),
                    {"kind": "turn/end", "payload": {"status": "completed"}},
                ],
            }
            writer.append_json(encode_json(batch))
        if named is not None:
            named.thread = thread_id
        return writer

    def _stored_value(
        self, thread_id: str, ns: str, channel: str, version: Any, value: Any
    ) -> tuple[Any, dict[str, str], _ListForm | None]:
        """The stored form of a new channel version, ``(base, value, form)``: the version a
        list grew from and its appended items, else ``None`` and the whole value; and a
        list's form (for :meth:`_remember`). A list grew when the base's items serialize as
        this list's first items do now: an item changed in place since (an edited message)
        makes the whole list stored. The list is serialized once a put, as a saver storing
        it whole does. Changes nothing: :meth:`_remember` records the version once its
        commit is durable."""
        if not isinstance(value, list):
            return None, _encode(self.serde.dumps_typed(value)), None
        whole, form = _ListForm.of(self.serde, value)
        previous = self._lists.get((thread_id, ns, channel))
        if previous is not None and previous[0] != version:
            suffix = form.suffix_after(self.serde, previous[1], value)
            if suffix is not None:
                return previous[0], _encode(suffix), form
        return None, _encode(whole), form

    def _remember(
        self,
        thread_id: str,
        ns: str,
        channel: str,
        version: Any,
        form: _ListForm | None,
    ) -> None:
        """Records a stored channel version: a list (its ``form``) is the base of
        the next one grown from it. Called only after its commit is durable, so a failed
        ``put`` (a value or metadata the serializer refuses, another writer) never leaves a
        base that is not in the log."""
        key = (thread_id, ns, channel)
        if form is not None:
            if thread_id not in self._readers and thread_id not in self._writers:
                return  # let go meanwhile (_drop_unused): nothing is kept of it
            self._lists[key] = (version, form)
        else:
            self._lists.pop(key, None)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Stores a checkpoint (the channels of ``new_versions`` only); returns its config."""
        thread_id = str(config["configurable"]["thread_id"])
        ns = config["configurable"].get("checkpoint_ns", "")
        c = checkpoint.copy()
        values: dict[str, Any] = c.pop("channel_values")  # type: ignore[misc]
        names: list[list[Any]] = []
        lists: builtins.list[_ListForm | None] = []
        stored = {
            "ns": ns,
            "id": checkpoint["id"],
            "parent": config["configurable"].get("checkpoint_id"),
            "checkpoint": _encode(self.serde.dumps_typed(c)),
            "metadata": _encode(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
            "values": names,
        }

        def events_of() -> builtins.list[tuple[str, Any]]:
            # Under the writer: the session is the one the commit goes into.
            self._current(thread_id)  # no list base from an earlier session of the thread
            events: builtins.list[tuple[str, Any]] = []
            for channel, version in new_versions.items():
                if channel in values:
                    base, value, form = self._stored_value(
                        thread_id, ns, channel, version, values[channel]
                    )
                    names.append([channel, version, base])
                    events.append((_VALUE, value))
                    lists.append(form)
            events.append((_CHECKPOINT, stored))
            return events

        self._commit(thread_id, events_of)
        with self._lock:
            for (channel, _, _), form in zip(names, lists):
                self._remember(thread_id, ns, channel, new_versions[channel], form)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Stores the pending writes of task ``task_id`` on the checkpoint of ``config``."""
        if not writes:
            return
        payload = {
            "ns": config["configurable"].get("checkpoint_ns", ""),
            "id": config["configurable"]["checkpoint_id"],
            "task": task_id,
            "path": task_path,
            "writes": [
                [WRITES_IDX_MAP.get(channel, idx), channel, _encode(self.serde.dumps_typed(v))]
                for idx, (channel, v) in enumerate(writes)
            ],
        }
        self._commit(str(config["configurable"]["thread_id"]), lambda: [(_WRITES, payload)])

    def _release(self, thread_id: str) -> None:
        """Closes this saver's use of the thread's writer and forgets what it knew."""
        shared = self._writers.pop(thread_id, None)
        if shared is not None:
            _release_writer(shared)
        self._forget(thread_id)
        self._readers.pop(thread_id, None)
        self._identities.pop(thread_id, None)

    def delete_thread(self, thread_id: str) -> None:
        """Deletes the thread's session (its forks keep their history). The writer the
        savers of this process share for it is closed first (another saver's next ``put``
        makes the thread anew; this saver's ``put``, ``put_writes`` and pruning of the
        thread from other threads wait until the delete has ended); a writer in another
        process is waited for as :meth:`session_store.Root.delete` does."""
        thread_id = str(thread_id)
        gate = self._before_delete(thread_id)
        # Outside the saver's lock: a wait for another process's writer (up to
        # Root.delete's 10 s) held up every other thread's call of this saver. Root.delete
        # closes the writer another saver of this process shares for it.
        try:
            self.root.delete(session_id_of(thread_id))
        except NotFound:
            pass
        except SessionStoreError as e:
            raise _about_thread(e, thread_id) from None
        finally:
            self._after_delete(thread_id, gate)

    def _before_delete(self, thread_id: str) -> threading.Event:
        """Refuses to delete a session that is not the thread's, then lets go of this
        saver's writer and index of the thread; this saver's commits of the thread wait
        until :meth:`_after_delete` sets the gate returned."""
        with self._lock:
            self._require_thread(thread_id, "deleting it")
            self._release(thread_id)
            gate = self._deleting.get(thread_id)
            if gate is None:
                gate = self._deleting[thread_id] = threading.Event()
            return gate

    def _after_delete(self, thread_id: str, gate: threading.Event) -> None:
        """Ends the wait of this saver's commits of the thread (see :meth:`_before_delete`)."""
        with self._lock:
            if self._deleting.get(thread_id) is gate:
                del self._deleting[thread_id]
            # What a read made meanwhile knew of the deleted session is let go.
            self._release(thread_id)
        gate.set()

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Makes ``target_thread_id`` a fork of the source thread's session: it shares every
        checkpoint and write without copying them. Nothing happens for a missing source;
        an existing target raises :class:`session_store.AlreadyExists`."""
        source = str(source_thread_id)
        with self._lock:
            shared = self._writers.get(source)
            if shared is not None and shared.session is not None:
                shared.session.flush()
            self._require_thread(source, "copying it")
            try:
                turns = self.root.turns(session_id_of(source))
            except NotFound:
                return
            if not turns:
                return
            target = str(target_thread_id)
            try:
                self.root.fork(
                    session_id_of(source),
                    after_turn=turns[-1]["turn_id"],
                    child=session_id_of(target),
                )
            except AlreadyExists:
                # The store's message named the session only ("session lg-b already exists").
                raise AlreadyExists(
                    f"thread {target!r} already exists (session {session_id_of(target)})"
                ) from None
            if _HASHED.fullmatch(session_id_of(target)):
                self._commit(target, lambda: [])  # names the copy's thread in its log

    def _hide(self, thread_id: str, doomed: builtins.list[builtins.list[str]]) -> None:
        if doomed:
            self._commit(thread_id, lambda: [(_DELETE, {"checkpoints": doomed})])

    def _delta_named(self, model: _Thread, ns: str, cid: str) -> set[str]:
        """The ``DeltaChannel`` channels checkpoint ``cid``'s metadata counts updates of
        since their last stored value (``counters_since_delta_snapshot``)."""
        metadata = self.serde.loads_typed(_decode(model.checkpoints[ns][cid][1]))
        return set(metadata.get("counters_since_delta_snapshot") or {})

    def _delta_unstored(
        self, model: _Thread, ns: str, cid: str, channels: set[str]
    ) -> set[str]:
        """Which of ``channels`` checkpoint ``cid`` has a version of but does not store, so
        that LangGraph rebuilds them from its ancestors' writes (``BaseCheckpointSaver.
        prune``'s warning). One without a version was never written before it (its first
        writes are ``cid``'s own), so nothing older rebuilds it (an unused delta channel
        blocked every prune and delete: re-test, session 43)."""
        record = self.serde.loads_typed(_decode(model.checkpoints[ns][cid][0]))
        versions = record["channel_versions"]
        return {
            channel
            for channel in channels
            if channel in versions and (ns, channel, versions[channel]) not in model.blobs
        }

    def _delta_sources(self, model: _Thread, ns: str, cid: str) -> builtins.list[str]:
        """The ancestors of checkpoint ``cid`` (namespace ``ns``) its ``DeltaChannel``
        values are rebuilt from, and theirs: LangGraph stores such a value only every
        ``snapshot_frequency`` steps and rebuilds the others from the ancestors' writes
        back to the nearest stored value. From the parent back to the first ancestor that
        stores every channel named on the way (:meth:`_delta_named`,
        :meth:`_delta_unstored`), so that each one returned can itself be rebuilt
        (LangGraph's first safe option: a kept source of one channel read another channel
        empty, re-test of session 43), or to the first checkpoint. Empty for a thread
        without delta channels."""
        checkpoints = model.checkpoints.get(ns, {})
        channels = self._delta_named(model, ns, cid)
        missing = self._delta_unstored(model, ns, cid, channels) if channels else set()
        sources: builtins.list[str] = []
        parent = checkpoints[cid][2]
        while missing and parent is not None and parent in checkpoints:
            sources.append(parent)
            channels |= self._delta_named(model, ns, parent)
            missing = self._delta_unstored(model, ns, parent, channels)
            parent = checkpoints[parent][2]
        return sources

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Hides every checkpoint (and its writes) whose metadata ``run_id`` is one of
        ``run_ids``, in every thread of the root. Raises :class:`session_store.InvalidInput`
        before anything is hidden when a checkpoint of another run rebuilds its
        ``DeltaChannel`` values from one of them (:meth:`_delta_unstored`): hidden, that
        value read empty or short with no error (LangGraph's ``delete_for_runs`` warning;
        outside testing, session 43). Delete the later runs too, or the thread."""
        wanted = set(run_ids)
        if not wanted:
            return
        with self._lock:
            hidden: builtins.list[tuple[str, builtins.list[builtins.list[str]]]] = []
            for thread_id in self._root_threads():
                model = self._thread_if_saved(thread_id)
                if model is None:
                    continue
                doomed = {
                    (ns, cid)
                    for ns, checkpoints in model.checkpoints.items()
                    for cid, (_, metadata, _) in checkpoints.items()
                    if self.serde.loads_typed(_decode(metadata)).get("run_id") in wanted
                }
                if not doomed:
                    continue
                # A kept checkpoint whose parent goes, and that rebuilds a delta value from
                # its ancestors' writes (a kept parent answers for its own ancestors).
                for ns, checkpoints in model.checkpoints.items():
                    for cid, (_, _, parent) in checkpoints.items():
                        if (ns, cid) in doomed or (ns, parent) not in doomed:
                            continue
                        if self._delta_unstored(
                            model, ns, cid, self._delta_named(model, ns, cid)
                        ):
                            raise InvalidInput(
                                f"invalid input: thread {thread_id!r}: checkpoint {cid} of "
                                "another run rebuilds its DeltaChannel values from checkpoint "
                                f"{parent} of a run to delete; delete the later runs too, "
                                "or the thread"
                            )
                hidden.append((thread_id, [[ns, cid] for ns, cid in sorted(doomed)]))
            for thread_id, doomed_list in hidden:
                self._hide(thread_id, doomed_list)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: hides all but the latest checkpoint of each namespace (the
        latest keeps its writes) and, in a graph with ``DeltaChannel`` values, the ancestors
        back to the first that stores every such channel, each of which can be rebuilt
        (:meth:`_delta_sources`; hidden, they left those values empty with no error, as
        LangGraph's ``prune`` warns: outside testing, session 43). A channel never stored
        since the thread's first checkpoint keeps them all. Those ancestors read right, but
        a persistent subgraph's namespace keeps only its latest checkpoint, as every
        namespace: a run resumed from one of them starts such a subgraph afresh.
        ``"delete"``: deletes the threads. A session of one of their ids that is not a
        thread's raises before any thread is changed."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}")
        with self._lock:
            # Every thread checked before any is changed.
            models = {t: self._require_thread(t, "pruning it") for t in map(str, thread_ids)}
            if strategy == "keep_latest":
                for thread_id, model in models.items():
                    if model is None:
                        continue
                    doomed: builtins.list[builtins.list[str]] = []
                    for ns, checkpoints in model.checkpoints.items():
                        if not checkpoints:
                            continue
                        latest = max(checkpoints)
                        kept = {latest, *self._delta_sources(model, ns, latest)}
                        doomed.extend([ns, cid] for cid in sorted(checkpoints) if cid not in kept)
                    self._hide(thread_id, doomed)
                return
        # Deleted outside the saver's lock, as delete_thread does.
        for thread_id in models:
            self.delete_thread(thread_id)

    def close(self) -> None:
        """Releases the writer locks this saver holds (everything is already durable) and
        the readers it keeps. The saver stays usable: a later call takes what it needs
        again, so one saver can serve several ``with`` blocks (unlike the agents adapter,
        whose changes after ``close()`` raise :class:`session_store.Closed`)."""
        with self._lock:
            # Also the threads whose reader was dropped (max_open_threads): their index and
            # list bases are let go too.
            for thread_id in {*self._writers, *self._readers, *self._threads, *self._identities}:
                self._release(thread_id)

    def __enter__(self) -> SessionStoreSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> SessionStoreSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _to_thread(self.close)

    def __repr__(self) -> str:
        return f"<SessionStoreSaver in {self.root.path!r}>"

    # Async variants: the same calls in a worker thread.

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """:meth:`get_tuple` in a worker thread."""
        return await _to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """:meth:`list` in a worker thread."""
        tuples = await _to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in tuples:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """:meth:`put` in a worker thread."""
        return await _to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """:meth:`put_writes` in a worker thread."""
        await _to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """:meth:`delete_thread` in a worker thread. Cancelling the task also ends the
        delete's wait for another process's writer, nothing deleted, as
        :meth:`session_store.Root.adelete` does."""
        thread_id = str(thread_id)
        gate = await _to_thread(self._before_delete, thread_id)
        try:
            await self.root.adelete(session_id_of(thread_id))
        except NotFound:
            pass
        except SessionStoreError as e:
            raise _about_thread(e, thread_id) from None
        finally:
            self._after_delete(thread_id, gate)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """:meth:`copy_thread` in a worker thread."""
        await _to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`delete_for_runs` in a worker thread."""
        await _to_thread(self.delete_for_runs, run_ids)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """:meth:`prune` in a worker thread."""
        await _to_thread(self.prune, thread_ids, strategy=strategy)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The next channel version: a zero-padded counter and a random fraction, as
        LangGraph's ``InMemorySaver`` makes them (versions sort as strings, and two branches
        resumed from the same checkpoint never give one channel the same version)."""
        if current is None:
            n = 0
        elif isinstance(current, int):
            n = current
        else:
            n = int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"
