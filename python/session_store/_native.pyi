"""Type stubs of the native module (``session_store._native``, built from Rust with PyO3).

Use the Pythonic wrappers in :mod:`session_store`; this layer passes JSON as text.
"""

import threading
from typing import Any, final

__version__: str
"""The package's version (the wheel's)."""
TOO_DEEP: str
"""The message of the error a read raises for a stored payload nested deeper than
``json.loads`` reads."""

__all__ = [
    "__version__",
    "TOO_DEEP",
    "Root",
    "Session",
    "Reader",
    "verify",
    "check_session_id",
    "close_inherited_locks",
    "SessionStoreError",
    "InvalidInput",
    "InvalidPayload",
    "OperationConflict",
    "NotFound",
    "AlreadyExists",
    "WriterOwned",
    "UnsupportedVersion",
    "Corrupt",
    "InternalError",
    "Closed",
    "StaleGeneration",
    "Poisoned",
    "PersistenceFailed",
    "DiskFull",
    "Cancelled",
    "ForkBoundaryNotAtomic",
    "ForkActiveAuthority",
    "RuntimeStateError",
    "StorageError",
]

class SessionStoreError(Exception):
    """Base class of every error raised by session_store."""

class InvalidInput(SessionStoreError, ValueError):
    """The caller passed something malformed: an id, a batch, a cursor, an option, JSON.
    Also a ValueError."""

class InvalidPayload(InvalidInput):
    """An event payload does not match its kind's schema. Also a ValueError."""

class OperationConflict(InvalidInput):
    """The operation id was used before with different content. Also a ValueError."""

class NotFound(SessionStoreError, LookupError):
    """No session with this id exists under the root. Also a LookupError."""

class AlreadyExists(SessionStoreError, FileExistsError):
    """A session (or export destination) with this name already exists. Also a FileExistsError."""

class WriterOwned(SessionStoreError):
    """Another writer owns the session."""

    owner: dict[str, Any]
    """``{"owner_id", "host", "pid", "generation", "since_ms", "holding_for"}`` of the
    holder (``holding_for`` is ``"delete"`` while a delete holds the session, else
    ``None``)."""

class UnsupportedVersion(SessionStoreError):
    """A file, schema or required event kind newer than this build understands."""

class Corrupt(SessionStoreError):
    """A file that is damaged or not a session file."""

class InternalError(SessionStoreError):
    """An invariant broke inside the library (a bug, not the caller's doing)."""

class Closed(SessionStoreError):
    """The session was closed; it accepts nothing more."""

class StaleGeneration(SessionStoreError):
    """Another writer took the lease: this handle is fenced off."""

class Poisoned(SessionStoreError):
    """An earlier failure left a commit's outcome unknown; reopen the session."""

class PersistenceFailed(SessionStoreError):
    """The last write failed; the accepted tail is kept and the next flush retries."""

class DiskFull(PersistenceFailed):
    """The disk (or its quota) is full."""

class Cancelled(SessionStoreError):
    """The wait was cancelled (e.g. ``delete`` gave up waiting for the writer)."""

class ForkBoundaryNotAtomic(SessionStoreError):
    """The fork or rewind cut does not fall on a commit boundary."""

class ForkActiveAuthority(SessionStoreError):
    """The fork or rewind prefix leaves an open turn or a pending interaction."""

class RuntimeStateError(SessionStoreError):
    """The service runtime is busy, bound, not running, stale or needs recovery."""

class StorageError(SessionStoreError):
    """An operating-system I/O error or any other SQLite error."""

@final
class Session:
    """A session opened for writing."""

    @property
    def id(self) -> str: ...
    def append(self, batch_json: str) -> str: ...
    def flush(self) -> int: ...
    def sequences(self) -> tuple[int, int]: ...
    def transcript(self) -> str: ...
    def close(self) -> None: ...

@final
class Reader:
    """Reads of one session's durable state, its connections kept open across calls."""

    @property
    def id(self) -> str: ...
    def identity(self) -> tuple[int, int, int]: ...
    def durable_sequence(self) -> int: ...
    def messages(
        self, limit: int | None = None, item_id_key: str | None = None
    ) -> list[dict[str, Any]]: ...
    def transcript_len(self, snapshot: int) -> int: ...
    def transcript_entry(self, snapshot: int, position: int) -> dict[str, Any] | None: ...
    def transcript_find(self, snapshot: int, message_id: str) -> dict[str, Any] | None: ...
    def transcript_prefix_kept(self, earlier: int, later: int, len: int) -> bool: ...
    def turn_holding(self, seq: int) -> str | None: ...

@final
class Root:
    """A root folder of sessions."""

    def __new__(
        cls, path: str, durability: str | None = None, write_behind_ms: int | None = None
    ) -> Root: ...
    @property
    def path(self) -> str: ...
    def create(self, session_id: str | None = None, cwd: str | None = None) -> Session: ...
    def open_writer(self, session_id: str) -> Session: ...
    def reader(self, session_id: str) -> Reader: ...
    def list(
        self,
        cursor: str | None = None,
        limit: int = 50,
        cwd: str | None = None,
        since_ms: int | None = None,
        title: str | None = None,
        origin: str | None = None,
        sort: str = "id",
        cached_only: bool = False,
    ) -> str: ...
    def history(self, session_id: str, cursor: str | None = None, limit: int = 100) -> str: ...
    def rename(self, session_id: str, title: str) -> None: ...
    def search(
        self,
        query: str,
        cursor: str | None = None,
        limit: int = 10,
        session: str | None = None,
        cwd: str | None = None,
        since_ms: int | None = None,
        role: str | None = None,
    ) -> str: ...
    def transcript(self, session_id: str) -> str: ...
    def events(self, session_id: str, after: int = 0, limit: int = 1000) -> str: ...
    def read_content(self, session_id: str, digest: str) -> bytes: ...
    def turns(self, session_id: str) -> str: ...
    def writer_owner(self, session_id: str) -> str | None: ...
    def fork(
        self,
        parent: str,
        after_turn: str | None = None,
        before_turn: str | None = None,
        child: str | None = None,
    ) -> str: ...
    def export(self, session_id: str, path: str) -> str: ...
    def import_file(
        self, path: str, session_id: str | None = None, cwd: str | None = None
    ) -> str: ...
    def verify(self, session_id: str) -> str: ...
    def delete(
        self, session_id: str, wait: float = 10.0, stop: threading.Event | None = None
    ) -> None: ...

def verify(path: str) -> str: ...
def check_session_id(session_id: str) -> None: ...
def close_inherited_locks() -> None: ...
