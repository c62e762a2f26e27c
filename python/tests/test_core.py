"""The core API: append, flush, history pages, list, fork, rewind, export, import, delete,
verify, async variants, the exception hierarchy and hostile input."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import multiprocessing
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

import session_store
from session_store import (
    AlreadyExists,
    Closed,
    Corrupt,
    InvalidInput,
    InvalidPayload,
    NotFound,
    OperationConflict,
    SessionStoreError,
    UnsupportedVersion,
    WriterOwned,
)

from conftest import msg, run_script, turn


def fill(root, sid: str, turns: int, per_turn: int = 1) -> session_store.Session:
    session = root.create(sid)
    n = 0
    for t in range(turns):
        messages = []
        for _ in range(per_turn):
            n += 1
            messages.append(msg(n, "user" if n % 2 else "assistant"))
        session.append(turn(f"t{t}", *messages), operation_id=f"op-{t}", turn_id=f"t{t}")
    session.flush()
    return session


def test_append_flush_history_and_idempotent_retry(root):
    with root.create("chat") as s:
        events = turn("t1", msg(1), msg(2, "assistant"))
        first = s.append(events, operation_id="op-1", turn_id="t1")
        assert (first["first_seq"], first["last_seq"], first["turn_id"]) == (1, 4, "t1")
        assert s.sequences()[0] == 4
        # Accepted but not yet durable: the root's reads see the durable state only.
        assert s.transcript()[1]["content"] == "message 2"
        again = s.append(events, operation_id="op-1", turn_id="t1")
        assert again["commit_id"] == first["commit_id"]
        with pytest.raises(OperationConflict, match="op-1"):
            s.append(turn("t1", msg(9)), operation_id="op-1", turn_id="t1")
        assert s.flush() == 4
    page = root.history("chat")
    assert [m["inline"]["content"] for m in page["messages"]] == ["message 1", "message 2"]
    assert page["has_more"] is False and page["next_cursor"] is None
    assert root.transcript("chat")[0] == msg(1)
    assert [t["turn_id"] for t in root.turns("chat")] == ["t1"]
    commits = root.events("chat")["commits"]
    assert len(commits) == 1 and [e["kind"] for e in commits[0]["events"]][1] == "message/complete"


def test_a_writer_open_on_a_full_disk_raises_disk_full(tmp_path):
    # The open records its owner before SQLite writes anything; on a full disk that is an
    # OS error (ENOSPC) the library calls retryable, as SQLite's own full disk: it came
    # here as StorageError, not DiskFull. A tmpfs of 2 MiB, mounted as root.
    if os.geteuid() != 0:
        pytest.skip("a full disk needs root to mount a tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode(errors='replace')}")
    try:
        root = session_store.Root(disk / "sessions")
        with root.create("full") as s:
            s.append(turn("t1", msg(1)), operation_id="op-1", turn_id="t1")
        filler = disk / "filler"
        with open(filler, "wb", buffering=0) as f:  # unbuffered: no write left for close
            for chunk in (b"\x5a" * 65536, b"\x5a"):
                try:
                    while True:
                        f.write(chunk)
                except OSError:
                    pass
        with pytest.raises(session_store.DiskFull):
            root.open("full")
        filler.unlink()
        root.open("full").close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_history_pages_walk_every_message_once(root):
    fill(root, "long", 25, per_turn=10).close()
    seen, cursor = [], None
    while True:
        page = root.history("long", cursor=cursor, limit=40)
        assert len(page["messages"]) <= 40
        seen = [m["message_id"] for m in page["messages"]] + seen
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"m{i}" for i in range(1, 251)]
    reader = root.reader("long")
    assert reader.history(limit=3)["messages"][-1]["message_id"] == "m250"
    assert len(reader.transcript()) == 250


def test_list_pages_and_iteration(root):
    for i in range(7):
        root.create(f"s{i}").close()
    page = root.list(limit=3)
    assert [s["session_ref"]["session_id"] for s in page["sessions"]] == ["s0", "s1", "s2"]
    assert page["next_cursor"]
    assert [s["session_ref"]["session_id"] for s in root.iter_sessions(page_size=2)] == [
        f"s{i}" for i in range(7)
    ]


def test_a_write_past_the_file_size_limit_names_the_limit(root):
    """Under `ulimit -f` a write fails with EFBIG, which SQLite reports as "disk I/O error"
    alone: the CLI named the limit, Python's StorageError and Poisoned did not."""
    out = run_script(
        """
import json, os, resource, sys
import session_store
resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
s = session_store.Root(sys.argv[1]).create("big")
errors = []
try:
    for i in range(100):
        text = os.urandom(30_000).hex()
        s.append([{"kind": "message/complete", "payload": {"message": {"id": f"m{i}", "role": "user", "content": text}}}], operation_id=f"o{i}")
        s.flush()
except session_store.SessionStoreError as e:
    errors.append([type(e).__name__, str(e)])
try:
    s.close()
except session_store.SessionStoreError as e:
    errors.append([type(e).__name__, str(e)])
print(json.dumps(errors))
""",
        root.path,
    )
    errors = json.loads(out.stdout)
    assert [name for name, _ in errors] == ["StorageError", "Poisoned"], errors
    for _, text in errors:
        assert text.startswith('session "big": ') and "disk I/O error" in text, text
        assert text.endswith("(this process may write no file over 1000000 bytes: see `ulimit -f`)")
    # The session stays sound, its flushed batches readable.
    assert len(root.transcript("big")) == root.verify("big")["commits"] > 0


def test_iteration_by_updated_time_yields_a_session_committed_to_meanwhile_once(root):
    """Keyset pages by updated time: a session committed to after the pages passed its
    place moved ahead of them and was never yielded ("every session" said the docstring)."""
    for sid in ["s1", "s2", "s3", "s4"]:
        with root.create(sid) as s:
            s.append([{"kind": "message/complete", "payload": {"message": msg(0)}}], operation_id="o")
        time.sleep(0.005)

    def bump(sid: str, n: int) -> None:
        with root.open(sid) as s:
            s.append([{"kind": "message/complete", "payload": {"message": msg(n)}}], operation_id=f"o{n}")

    seen = []
    for i, e in enumerate(root.iter_sessions(page_size=1, sort="updated")):
        seen.append(e["session_ref"]["session_id"])
        if i == 0:
            bump("s2", 1)  # older than the page's place: moves ahead of it
        if i == 1:
            bump("s4", 2)  # yielded already: not again
    assert seen == ["s4", "s3", "s1", "s2"]

    async def walk() -> list[str]:
        out = []
        async for e in root.aiter_sessions(1, sort="updated", cached_only=True):
            out.append(e["session_ref"]["session_id"])
            if len(out) == 1:
                await asyncio.to_thread(bump, "s1", 3)
                root.list(sort="updated")  # the catalog refreshed, as another lister does
        return out

    assert asyncio.run(walk()) == ["s4", "s2", "s3", "s1"]
    # The other orders are one pass, as before.
    assert [e["session_ref"]["session_id"] for e in root.iter_sessions(1, sort="created")] == [
        "s4", "s3", "s2", "s1"
    ]


def test_list_says_live_for_a_writer_of_another_process_and_names_a_damaged_session(root, tmp_path):
    # `live` was False for a session another process was writing (it meant a runtime of
    # this process's service), while serve's page badged it live.
    root.create("idle").close()
    broken = os.path.join(root.path, "broken")
    os.mkdir(broken)
    with open(os.path.join(broken, "session.sqlite"), "wb") as f:
        f.write(b"not a session file")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, session_store as ss\n"
            "s = ss.Root(sys.argv[1]).create('busy')\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"
            "s.close()\n",
            root.path,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        live = {s["session_ref"]["session_id"]: s["live"] for s in root.list()["sessions"]}
        assert live == {"busy": True, "idle": False}
    finally:
        holder.communicate("go\n", timeout=60)
    assert [s["live"] for s in root.list()["sessions"]] == [False, False]
    # A damaged session is named by a page served from the catalog as it is, also in a
    # process whose first listing that is (it said nothing: `skipped` was always []).
    assert [s["session_id"] for s in root.list()["skipped"]] == ["broken"]
    fresh = session_store.Root(root.path)
    for _ in range(2):
        page = fresh.list(sort="updated", cached_only=True)
        assert [s["session_id"] for s in page["skipped"]] == ["broken"]


def test_list_filters_and_sorts_as_the_library_and_the_cli_do(root, tmp_path, monkeypatch):
    # Root.list took only cursor and limit: no cwd, since, title, origin or sort.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "proj").mkdir()
    root.create("a", cwd="/srv/api").close()
    root.rename("a", "Deploy the API")
    time.sleep(0.01)
    root.create("b", cwd="proj/").close()
    root.rename("b", "notes")
    time.sleep(0.01)
    root.create("c", cwd="x/../proj").close()

    def ids(**filters):
        return [s["session_ref"]["session_id"] for s in root.list(**filters)["sessions"]]

    here = str(tmp_path / "proj")
    assert root.list()["sessions"][1]["cwd"] == here
    assert ids(cwd="/srv/api/") == ["a"]
    assert ids(cwd="/srv//api/.") == ["a"]
    assert ids(cwd="proj") == ["b", "c"]
    assert ids(cwd="./proj/../proj/") == ["b", "c"]
    assert ids(cwd=tmp_path / "proj") == ["b", "c"]
    assert ids(title="DEPLOY") == ["a"]
    assert ids(origin="new") == ["a", "b", "c"]
    assert ids(origin="fork") == []
    assert ids(sort="created") == ["c", "b", "a"]
    assert ids(sort="updated", cwd="proj") == ["c", "b"]
    # None is the default order, as for the other optional parameters (it was a TypeError).
    assert ids(sort=None) == ids() == ["a", "b", "c"]
    assert [s["session_ref"]["session_id"] for s in root.iter_sessions(sort=None)] == ids()
    assert asyncio.run(root.alist(sort=None)) == root.list()
    assert ids(since=datetime.now(timezone.utc) + timedelta(hours=1)) == []
    assert ids(since=datetime.now(timezone.utc) - timedelta(hours=1)) == ["a", "b", "c"]
    assert ids(sort="created", cached_only=True) == ["c", "b", "a"]
    # The iterators take cached_only as list does (a TypeError before).
    cached = root.iter_sessions(1, sort="created", cached_only=True)
    assert [s["session_ref"]["session_id"] for s in cached] == ["c", "b", "a"]

    async def cached_ids():
        return [s["session_ref"]["session_id"] async for s in root.aiter_sessions(cached_only=True)]

    assert asyncio.run(cached_ids()) == ["a", "b", "c"]
    # Pages of one in a sort follow the cursor to the whole listing.
    seen, cursor = [], None
    while True:
        page = root.list(cursor, 1, sort="created")
        seen += [s["session_ref"]["session_id"] for s in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ["c", "b", "a"]
    assert [s["session_ref"]["session_id"] for s in root.iter_sessions(1, cwd="proj")] == [
        "b",
        "c",
    ]
    assert [
        s["session_ref"]["session_id"] for s in asyncio.run(root.alist(title="notes"))["sessions"]
    ] == ["b"]
    with pytest.raises(InvalidInput, match="origin must be one of"):
        root.list(origin="forked")
    with pytest.raises(InvalidInput, match="sort must be"):
        root.list(sort="newest")
    with pytest.raises(InvalidInput):
        root.list(since=datetime(2026, 1, 1))
    cursor = root.list(None, 1, sort="created")["next_cursor"]
    with pytest.raises(InvalidInput, match="for this sort"):
        root.list(cursor, 1, sort="updated")


def test_search_cwd_is_made_absolute_as_the_cli_does(root, tmp_path, monkeypatch):
    # search(cwd=) was compared as given: "proj/", "./proj" or "/srv/api/" found nothing.
    monkeypatch.chdir(tmp_path)
    with root.create("a", cwd="/srv/api") as s:
        s.append(turn("t1", msg(1, "user", "walrus here")), operation_id="o", turn_id="t1")
    with root.create("b", cwd="proj") as s:
        s.append(turn("t1", msg(2, "user", "walrus there")), operation_id="o", turn_id="t1")

    def found(cwd):
        return [h["message_id"] for h in root.search("walrus", cwd=cwd)["hits"]]

    for cwd in ["/srv/api/", "/srv//api", "/srv/./api/"]:
        assert found(cwd) == ["m1"], cwd
    for cwd in ["proj", "proj/", "./proj", "x/../proj", str(tmp_path / "proj"), tmp_path / "proj"]:
        assert found(cwd) == ["m2"], cwd
    # The role is compared ignoring case, a blank one refused.
    assert [h["message_id"] for h in root.search("walrus", role="USER")["hits"]] in (
        ["m1", "m2"],
        ["m2", "m1"],
    )
    with pytest.raises(InvalidInput, match="blank"):
        root.search("walrus", role=" ")


def test_fork_and_rewind_copy_nothing_and_keep_the_parent(root):
    fill(root, "parent", 4).close()
    child = root.fork("parent", after_turn="t1", child="child")
    assert child == "child"
    assert [m["id"] for m in root.transcript("child")] == ["m1", "m2"]
    rewound = root.rewind("parent", before_turn="t1")
    assert [m["id"] for m in root.transcript(rewound)] == ["m1"]
    assert len(root.transcript("parent")) == 4
    with root.open("child") as w:
        w.append(turn("c1", msg(100)), operation_id="c-op", turn_id="c1")
    assert [m["id"] for m in root.transcript("child")] == ["m1", "m2", "m100"]
    assert len(root.transcript("parent")) == 4
    with pytest.raises(InvalidInput, match="turn"):
        root.fork("parent", after_turn="no-such-turn")


def test_a_fork_after_a_turn_not_yet_flushed_says_the_log_is_durable(tmp_path):
    # The turn was appended a moment ago: "completed turn "t2" not found in a" sent the
    # caller looking for a typo; the fork reads the durable prefix only.
    root = session_store.Root(tmp_path / "root", write_behind_ms=3_600_000)
    with root.create("a") as s:
        s.append(turn("t1", msg(1)), operation_id="o1", turn_id="t1")
        s.flush()
        s.append(turn("t2", msg(2)), operation_id="o2", turn_id="t2")
        with pytest.raises(InvalidInput) as e:
            root.fork("a", after_turn="t2")
        assert str(e.value) == (
            'invalid input: ended turn "t2" not found in the durable log of a (a turn its '
            "writer accepted is there once flushed)"
        )
        s.flush()
        assert [m["id"] for m in root.transcript(root.fork("a", after_turn="t2"))] == ["m1", "m2"]


def test_export_import_verify_delete(root, tmp_path):
    fill(root, "src", 3).close()
    out = tmp_path / "src.export"
    report = root.export("src", out)
    assert report["events"] == 9 and report["bytes"] == out.stat().st_size
    assert session_store.verify(out)["events"] == 9
    with pytest.raises(AlreadyExists, match="export destination") as exists:
        root.export("src", out)
    assert "session " not in str(exists.value)
    # A bytes path is named as the path it is (the message showed b'/…/src.export').
    with pytest.raises(AlreadyExists) as exists:
        root.export("src", os.fsencode(out))
    assert str(exists.value).startswith(f"export destination {out} already exists")
    assert root.verify("src") == {"session_id": "src", "commits": 3, "events": 9, "notes": []}
    other = session_store.Root(tmp_path / "other")
    assert other.import_file(out, session_id="copy") == "copy"
    assert other.transcript("copy") == root.transcript("src")
    with pytest.raises(AlreadyExists):
        other.import_file(out, session_id="copy")
    root.delete("src")
    with pytest.raises(NotFound):
        root.history("src")
    with pytest.raises(NotFound):
        root.delete("src")


def test_verify_notes_a_checkpoint_that_does_not_check_out(root, tmp_path):
    # verify() returned only session_id, commits and events: the note the library gives
    # for a damaged projection checkpoint (every reader ignores it) did not reach Python.
    fill(root, "cp", 400).close()
    file = tmp_path / "root" / "cp" / "session.sqlite"
    assert root.verify("cp")["notes"] == []
    with sqlite3.connect(file) as db:
        (through,) = db.execute("SELECT through_seq FROM checkpoint").fetchone()
        db.execute("UPDATE checkpoint SET digest = 'not the digest'")
    db.close()
    for report in (root.verify("cp"), session_store.verify(file)):
        assert report["events"] == 1200
        assert len(report["notes"]) == 1, report
        assert f"the projection checkpoint at sequence {through} does not check out" in (
            report["notes"][0]
        )


def test_a_missing_file_is_named_as_a_file_not_a_session(root, tmp_path):
    # verify() and import_file() of a path with nothing there said "session /x not found".
    missing = tmp_path / "gone.export"
    for call in (
        lambda: session_store.verify(missing),
        lambda: asyncio.run(session_store.averify(os.fsencode(missing))),
        lambda: root.import_file(str(missing)),
    ):
        with pytest.raises(NotFound) as e:
            call()
        assert str(e.value) == f"{missing}: no such file or folder"
    # A folder without a session file: it said "session DIR/session.sqlite not found".
    folder = tmp_path / "plain-folder"
    folder.mkdir()
    for call in (
        lambda: session_store.verify(folder),
        lambda: root.import_file(str(folder)),
    ):
        with pytest.raises(NotFound) as e:
            call()
        assert str(e.value).startswith(
            f"{folder} is a folder without a session file (session.sqlite): "
        )
    assert root.list()["sessions"] == []


def test_a_file_that_is_no_session_is_named_by_verify_and_import(root, tmp_path):
    # verify() and import_file() of a file that is not a session said only "corrupt session
    # store: SQLite reports: file is not a database": a host checking many files could not
    # tell which.
    garbage = tmp_path / "notes.export"
    garbage.write_bytes(b"not a database at all" * 100)
    for call in (
        lambda: session_store.verify(garbage),
        lambda: asyncio.run(session_store.averify(os.fsencode(garbage))),
        lambda: root.import_file(garbage),
        lambda: root.import_file(str(garbage), session_id="x"),
    ):
        with pytest.raises(Corrupt) as e:
            call()
        assert str(e.value).count(str(garbage)) == 1, str(e.value)
    assert root.list()["sessions"] == []


def test_a_cwd_is_recorded_and_filtered_as_the_cli_spells_it(root, tmp_path, monkeypatch):
    # Stored as given, "/srv/api/" was never found by a filter of "/srv/api" (the CLI's
    # `list --cwd` and `search --cwd` spell both that way) nor a relative "." by any; a
    # pathlib.Path raised TypeError.
    import pathlib

    monkeypatch.chdir(tmp_path)
    here = os.getcwd()
    for sid, cwd in [
        ("slash", "/srv/api/"),
        ("dots", "/srv//api/./"),
        ("path", pathlib.Path("/srv/api")),
        ("dot", "."),
        ("rel", "proj/../api/"),
    ]:
        with root.create(sid, cwd=cwd) as s:
            s.append(turn("t", msg(1, content=f"needle {sid}")), operation_id="o", turn_id="t")
    cwds = {s["session_ref"]["session_id"]: s["cwd"] for s in root.iter_sessions()}
    assert cwds == {
        "slash": "/srv/api",
        "dots": "/srv/api",
        "path": "/srv/api",
        "dot": here,
        "rel": os.path.join(here, "api"),
    }

    def found(cwd) -> set[str]:
        return {h["session_ref"]["session_id"] for h in root.search("needle", cwd=cwd)["hits"]}

    assert found("/srv/api/") == found(pathlib.Path("/srv/api")) == {"slash", "dots", "path"}
    assert found(".") == found(here) == {"dot"}
    assert found("api") == {"rel"}
    export = tmp_path / "slash.export"
    root.export("slash", export)
    root.import_file(export, session_id="imported", cwd=pathlib.Path("imports/"))
    assert root.list()["sessions"][2]["cwd"] == os.path.join(here, "imports")
    # Bytes are a path as for every path argument (decoded as the file system does).
    root.create("bytes", cwd=b"/srv/").close()
    assert root.list(cwd="/srv")["sessions"][0]["session_ref"]["session_id"] == "bytes"
    with pytest.raises(InvalidInput, match="cwd is empty"):
        root.create("empty", cwd="")


def test_damaged_export_is_corrupt_and_imports_nothing(root, tmp_path):
    fill(root, "src", 3).close()
    out = tmp_path / "src.export"
    root.export("src", out)
    data = bytearray(out.read_bytes())
    for i in range(4096, len(data), 997):
        data[i] ^= 0xFF
    out.write_bytes(bytes(data))
    with pytest.raises(Corrupt):
        session_store.verify(out)
    with pytest.raises(Corrupt):
        root.import_file(out, session_id="bad")
    assert [s["session_ref"]["session_id"] for s in root.iter_sessions()] == ["src"]
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(Corrupt):
        session_store.verify(garbage)


def test_a_message_changed_in_place_is_corrupt_naming_the_event(root, tmp_path):
    # One character of a stored message changed behind the store's back, the JSON still
    # valid: every read of the transcript refuses it (the row's check, schema 7) instead of
    # showing the changed text.
    fill(root, "flip", 2).close()
    file = tmp_path / "root" / "flip" / "session.sqlite"
    with sqlite3.connect(file) as conn:
        seq, payload = conn.execute(
            "SELECT seq, payload FROM events WHERE payload LIKE '%message 2%'"
        ).fetchone()
        conn.execute(
            "UPDATE events SET payload = ? WHERE seq = ?",
            (payload.replace("message 2", "message X"), seq),
        )
    conn.close()
    with pytest.raises(Corrupt, match=f"event {seq}: the row does not match its check"):
        root.transcript("flip")
    with pytest.raises(Corrupt, match=f"event {seq}"):
        root.history("flip")
    with pytest.raises(Corrupt):
        session_store.verify(file)


def test_error_hierarchy_and_writer_owned_carries_the_owner(root):
    for cls in (InvalidInput, NotFound, AlreadyExists, WriterOwned, Corrupt, Closed):
        assert issubclass(cls, SessionStoreError)
    assert issubclass(InvalidPayload, InvalidInput) and issubclass(OperationConflict, InvalidInput)
    with pytest.raises(NotFound, match="nope"):
        root.open("nope")
    writer = root.create("a")
    with pytest.raises(AlreadyExists):
        root.create("a")
    with pytest.raises(WriterOwned) as owned:
        root.open("a")
    assert owned.value.owner["pid"] == os.getpid()
    assert root.writer_owner("a")["pid"] == os.getpid()
    writer.close()
    with pytest.raises(Closed):
        writer.append(turn("t", msg(1)), operation_id="late")
    # As Session.close documents: only appends raise; the rest answer with the closed state.
    writer.close()
    assert writer.flush() == 0 and writer.sequences() == (0, 0) and writer.transcript() == []
    root.open("a").close()  # free again


def test_errors_of_a_session_name_it(root):
    # "session writer is owned by pid 7 ..." and "session is closed" (it said "session
    # runtime is closed") name no session ('session "chat 1": session is closed', the word
    # twice, until session 28), nor did a damaged file's "corrupt session
    # store: ...": a host of many sessions (an agents Runner, a LangGraph server) could not
    # tell which one failed.
    from session_store.agents import SessionStoreSession

    writer = root.create("chat 1")
    with pytest.raises(WriterOwned) as owned:
        root.open("chat 1")
    assert str(owned.value).startswith("session chat 1 is owned by another writer: pid ")
    assert owned.value.owner["pid"] == os.getpid()
    with pytest.raises(WriterOwned, match="^session chat 1 is owned by another writer: "):
        root.rename("chat 1", "title")
    with pytest.raises(WriterOwned, match="^session chat 1 is owned by another writer: "):
        asyncio.run(SessionStoreSession("chat 1", root).add_items([{"role": "user"}]))
    writer.close()
    with pytest.raises(Closed) as closed:
        writer.append(turn("t", msg(1)), operation_id="late")
    assert str(closed.value) == 'session "chat 1" is closed'
    adapter = SessionStoreSession("chat 1", root)
    adapter.close()
    with pytest.raises(Closed) as closed:
        adapter.add_items_sync([{"role": "user"}])
    assert str(closed.value) == 'session "chat 1" is closed'
    fill(root, "damaged", 2).close()
    with open(os.path.join(root.path, "damaged", "session.sqlite"), "r+b") as f:
        f.write(b"not a database" * 100)
    for read in (
        lambda: root.history("damaged"),
        lambda: root.transcript("damaged"),
        lambda: root.events("damaged"),
        lambda: root.turns("damaged"),
        lambda: root.verify("damaged"),
        lambda: root.reader("damaged").messages(),
    ):
        with pytest.raises(Corrupt, match='^session "damaged": corrupt session store: '):
            read()
    # A message naming its session already is left as it was.
    with pytest.raises(NotFound) as missing:
        root.history("nope")
    assert str(missing.value) == "session nope not found"


def _open_in_worker(path: str, session_id: str) -> None:
    """Run in a process pool: raises what `Root.open` raises there."""
    session_store.Root(path).open(session_id)


def test_handles_refuse_pickle_and_copy_naming_their_class_and_values_pickle(root):
    # A Root, Session or SessionReader (and the adapters) holds open files and locks:
    # pickle and deepcopy raised "cannot pickle 'session_store._native.Root' object",
    # naming a private type (a Root for a reader or an adapter), and copy.copy made a
    # second handle of the same writer. Now a TypeError naming the public class.
    import copy

    from session_store.agents import SessionStoreSession
    from session_store.langgraph import SessionStoreSaver

    s = root.create("p")
    s.append(turn("t1", msg(1)), operation_id="op-1", turn_id="t1")
    s.flush()
    handles = [root, s, root.reader("p"), SessionStoreSession("a", root), SessionStoreSaver(root)]
    for handle in handles:
        name = f"{type(handle).__module__}.{type(handle).__qualname__}"
        # The LangGraph saver's copy.copy shares it (LangGraph's with_allowlist makes one).
        attempts = [pickle.dumps, copy.deepcopy]
        if not isinstance(handle, SessionStoreSaver):
            attempts.append(copy.copy)
        for attempt in attempts:
            with pytest.raises(TypeError, match=f"cannot pickle or copy a {name}: it holds"):
                attempt(handle)
    # What they return pickles.
    values = [root.events("p"), root.transcript("p"), root.history("p"), root.list()]
    assert pickle.loads(pickle.dumps(values)) == values
    s.close()


def test_errors_pickle_and_cross_a_process_pool(root):
    # Exceptions are named where the package exports them, so pickle (multiprocessing,
    # concurrent.futures) can find their class: `_native` was no importable module.
    for name in session_store.__all__:
        cls = getattr(session_store, name)
        if isinstance(cls, type) and issubclass(cls, SessionStoreError):
            assert cls.__module__ == "session_store", cls
            again = pickle.loads(pickle.dumps(cls(f"{name} happened")))
            assert type(again) is cls and str(again) == f"{name} happened"
    writer = root.create("p")
    with pytest.raises(WriterOwned) as owned:
        root.open("p")
    again = pickle.loads(pickle.dumps(owned.value))
    assert type(again) is WriterOwned and again.owner == owned.value.owner
    assert str(again) == str(owned.value)
    # A worker process's error comes back as the same class, with its message and owner.
    with concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        with pytest.raises(WriterOwned) as remote:
            pool.submit(_open_in_worker, root.path, "p").result(timeout=60)
        assert remote.value.owner["pid"] == os.getpid()
        with pytest.raises(NotFound, match="nope"):
            pool.submit(_open_in_worker, root.path, "nope").result(timeout=60)
    writer.close()


# Each error class whose meaning is a builtin error's also subclasses that builtin.
_BUILTIN_BASES = {
    "InvalidInput": ValueError,
    "InvalidPayload": ValueError,
    "OperationConflict": ValueError,
    "NotFound": LookupError,
    "AlreadyExists": FileExistsError,
}


def test_errors_are_also_the_builtin_error_of_their_meaning(root, tmp_path):
    # Every error was a `SessionStoreError` and an `Exception` only: `except ValueError`
    # did not catch `InvalidInput`, `except LookupError` not `NotFound`, `except
    # FileExistsError` not `AlreadyExists`.
    with pytest.raises(ValueError) as bad:
        root.create("bad id/with a slash")
    assert type(bad.value) is InvalidInput
    with pytest.raises(LookupError) as missing:
        root.open("nope")
    assert type(missing.value) is NotFound
    root.create("taken").close()
    with pytest.raises(FileExistsError) as taken:
        root.create("taken")
    assert type(taken.value) is AlreadyExists
    # Message, args and repr as before; the OSError base adds no errno text.
    assert str(taken.value) == "session taken already exists"
    assert taken.value.args == ("session taken already exists",)
    assert repr(taken.value) == "AlreadyExists('session taken already exists')"
    with pytest.raises(ValueError):  # raised by the Python layer too
        root.create("x\ud800")
    for name in session_store.__all__:
        cls = getattr(session_store, name)
        if not (isinstance(cls, type) and issubclass(cls, SessionStoreError)):
            continue
        builtin = _BUILTIN_BASES.get(name)
        for other in (ValueError, LookupError, OSError, TimeoutError):
            assert issubclass(cls, other) == (
                builtin is not None and issubclass(builtin, other)
            ), (cls, other)
        assert cls.__module__ == "session_store" and cls.__qualname__ == name, cls
        assert cls.__doc__ and cls.__doc__ == getattr(session_store._native, name).__doc__
        again = pickle.loads(pickle.dumps(cls(f"{name} happened")))
        assert type(again) is cls and again.args == (f"{name} happened",)
    assert issubclass(InvalidPayload, InvalidInput)
    assert issubclass(OperationConflict, InvalidInput)


def test_events_may_be_any_mapping_as_the_signature_says(root):
    # append takes Sequence[Mapping[str, Any]] and checks each event is a Mapping, but a
    # Mapping that is not a dict (a MappingProxyType, a custom one) was refused by the
    # encoder: "value is not JSON-able: Object of type mappingproxy is not JSON serializable".
    import types
    from collections.abc import Mapping

    class Event(Mapping):
        def __init__(self, **items):
            self.items_ = items

        def __getitem__(self, key):
            return self.items_[key]

        def __iter__(self):
            return iter(self.items_)

        def __len__(self):
            return len(self.items_)

    events = [
        types.MappingProxyType({"kind": "turn/start"}),
        Event(kind="message/complete", payload={"message": msg(1)}),
        Event(kind="turn/end", payload={"status": "completed"}),
    ]
    with root.create("m") as s:
        s.append(events, operation_id="o", turn_id="t")
        assert s.append(tuple(events), operation_id="o", turn_id="t")["first_seq"] == 1
    assert [m["id"] for m in root.transcript("m")] == ["m1"]


def test_read_content_tells_a_malformed_digest_from_an_absent_one(root):
    """Both raised InvalidInput "does not belong to session" (serve: 400 and 404)."""
    with root.create("big") as s:
        s.append([{"kind": "message/complete", "payload": {"message": msg(0, content="y" * 70_000)}}],
                 operation_id="o")
    digest = root.history("big")["messages"][0]["content_ref"]["digest"]
    assert len(root.read_content("big", digest)) > 70_000
    for malformed in ["zz", "", digest.upper(), digest + "0"]:
        with pytest.raises(InvalidInput, match="is not a content digest: a digest is 64 lowercase hex"):
            root.read_content("big", malformed)
    with pytest.raises(NotFound) as e:
        root.read_content("big", "0" * 64)
    assert str(e.value) == f"no content {'0' * 64} in session big or its ancestors"
    assert isinstance(e.value, LookupError)
    with pytest.raises(NotFound, match="^session absent not found$"):
        root.read_content("absent", digest)


def test_append_names_the_argument_or_event_key_of_a_wrong_value(root):
    """Session.append built JSON text and handed back its reader's message: "invalid type:
    integer `7`, expected a string at line 1 column 131" of a text the caller never wrote,
    InvalidInput for a wrong argument type where every other call raises TypeError."""
    ev = [{"kind": "message/complete", "payload": {"message": msg(0)}}]
    with root.create("w") as s:
        for kw, text in [
            ({"operation_id": 5}, "operation_id must be str, not int"),
            ({"operation_id": None}, "operation_id must be str, not NoneType"),
            ({"operation_id": "o", "turn_id": 7}, "turn_id must be str or None, not int"),
        ]:
            with pytest.raises(TypeError) as e:
                s.append(ev, **kw)
            assert str(e.value) == text
        # Any argument of the wrong type, named (PyO3 said "'int' object is not an
        # instance of 'str'", naming none; a str limit of messages() leaked a comparison's
        # TypeError: outside testing, session 36).
        for call, text in [
            (lambda: root.create(123), "create() argument 'session_id' must be str | None, not int"),
            (lambda: root.events("w", after="1"), "events() argument 'after' must be int, not str"),
            (lambda: root.list(cached_only="y"), "list() argument 'cached_only' must be bool, not str"),
            (lambda: root.delete("w", wait="1"), "delete() argument 'wait' must be float, not str"),
            (lambda: root.reader("w").messages("3"),
             "messages() argument 'limit' must be int | None, not str"),
            # Taken, then refused at the first read naming nothing (session 37).
            (lambda: root.reader(5), "reader() argument 'session_id' must be str, not int"),
            # InvalidInput, and paths and page sizes named nothing or another argument
            # (outside testing C5).
            (lambda: root.list(since="7d"), "since must be datetime.datetime or None, not str"),
            (lambda: root.search("x", since=7), "since must be datetime.datetime or None, not int"),
            (lambda: root.list(cwd=5), "cwd must be str, bytes or os.PathLike, not int"),
            (lambda: root.export("w", 5), "path must be str, bytes or os.PathLike, not int"),
            (lambda: session_store.Root(5), "path must be str, bytes or os.PathLike, not int"),
            (lambda: next(root.iter_sessions(page_size="x")), "page_size must be int, not str"),
        ]:
            with pytest.raises(TypeError) as e:
                call()
            assert str(e.value) == text
        second = {"kind": "tool/log", "optional": True}
        for event, text in [
            ({"kind": 5}, "events[1].kind must be str, not int"),
            ({**second, "optional": "yes"}, "events[1].optional must be bool, not str"),
            ({**second, "id": 5}, "events[1].id must be str, not int"),
            ({**second, "paylod": {}}, "events[1] has the unknown key 'paylod' (an event's "
                                       "keys are kind, payload, optional, id)"),
            ({"optional": True}, "events[1] has no kind"),
            ({**second, "seq": 3}, "events[1].seq is not input: sequences are assigned "
                                   "when a batch is accepted; remove the key"),
            (7, "events[1] is int, not a dict"),
        ]:
            with pytest.raises(InvalidInput) as e:
                s.append(ev + [event], operation_id="bad")
            assert str(e.value) == f"invalid input: {text}", e.value
        with pytest.raises(InvalidInput, match="^invalid input: page_size must be 1..=100, not 500$"):
            next(root.iter_sessions(page_size=500))  # "list limit" before: not its name
        for wrong in [5, None, {"kind": "tool/log"}, "events"]:
            with pytest.raises(TypeError, match=f"^events must be a list of dicts, not {type(wrong).__name__}$"):
                s.append(wrong, operation_id="bad")  # type: ignore[arg-type]
        assert s.sequences() == (0, 0)
        # The well-formed batch appends, with its optional keys.
        s.append(ev + [{**second, "id": "e1", "payload": None}], operation_id="bad")
        assert [m["id"] for m in s.transcript()] == ["m0"]


def test_hostile_input_is_refused_and_changes_nothing(root, tmp_path):
    with root.create("h") as s:
        s.append(turn("t0", msg(0)), operation_id="ok", turn_id="t0")
        s.flush()
        cases = [
            lambda: s.append_json("{not json"),
            lambda: s.append_json('{"operation_id": "x", "events": [{"kind": 3}]}'),
            lambda: s.append_json("[]"),
            lambda: s.append([{"kind": "session/title", "payload": {"x": {1, 2}}}], operation_id="set"),
            lambda: s.append([{"kind": "session/title", "payload": float("nan")}], operation_id="nan"),
            # Keys that are not str: json.dumps wrote them as strings ({1: 2} came back as
            # {"1": 2}, {1: "a", "1": "b"} as one key), appended.
            lambda: s.append([{"kind": "message/complete", "payload": {"message": {
                "id": "k", "role": "user", "content": "x", "meta": [{1: "one"}]}}}],
                operation_id="int-key"),
            lambda: s.append([{"kind": "message/complete", "payload": {"message": {
                "id": "k", "role": "user", "content": "x", None: 1}}}], operation_id="none-key"),
            lambda: s.append([1, 2], operation_id="ints"),
            lambda: s.append([{"kind": "turn/start"}], operation_id=""),
            # A lone surrogate (json.loads('"\\ud800"') gives one) has no UTF-8 form.
            lambda: s.append(
                [{"kind": "session/title", "payload": json.loads('{"title": "\\ud800"}')}],
                operation_id="surrogate",
            ),
            lambda: s.append_json('{"operation_id": "\ud800", "events": [{"kind": "turn/start"}]}'),
        ]
        for case in cases:
            with pytest.raises(InvalidInput):
                case()
        with pytest.raises(InvalidPayload):
            s.append([{"kind": "session/title", "payload": {"title": 7}}], operation_id="p")
        with pytest.raises(UnsupportedVersion):
            s.append([{"kind": "future/kind"}], operation_id="f")
        with pytest.raises(InvalidInput, match="turn"):
            s.append([{"kind": "turn/start"}, {"kind": "turn/start"}], operation_id="nest")
        with pytest.raises(TypeError):
            s.append_json(b"{}")
        with pytest.raises(TypeError):
            s.append("turn/start", operation_id="str")  # type: ignore[arg-type]
        # A key a batch or event does not have (a typo) is refused naming it: it was
        # ignored, so the field it meant was dropped and the batch appended.
        with pytest.raises(InvalidInput, match=r"events\[0\] has the unknown key 'optinal'"):
            s.append([{"kind": "session/title", "payload": {"title": "t"}, "optinal": True}],
                     operation_id="typo")
        with pytest.raises(InvalidInput, match="unknown field `turn_idd`"):
            s.append_json('{"operation_id": "typo", "turn_idd": "t", "events": [{"kind": "turn/start"}]}')
        # An event's output-only fields are refused naming them: they were dropped, and an
        # event given by its content_ref alone was stored with no payload.
        with pytest.raises(InvalidInput, match=r"events\[0\]\.seq is not input"):
            s.append([{"kind": "session/title", "payload": {"title": "t"}, "seq": 9}],
                     operation_id="out")
        # A lone surrogate escape in JSON text was serde_json's "unexpected end of hex
        # escape": said as such, naming the key.
        with pytest.raises(InvalidInput, match='the value of "id" holds a lone UTF-16 '
                           "surrogate escape"):
            s.append_json(r'{"operation_id": "sur", "events": [{"kind": "tool/log", '
                          r'"optional": true, "id": "\ud800"}]}')
        with pytest.raises(InvalidPayload, match='the value of "title" holds a lone UTF-16'):
            s.append_json(r'{"operation_id": "sur", "events": [{"kind": "session/title", '
                          r'"payload": {"title": "x\udcff"}}]}')
        ref = {"digest": "ab", "bytes": 2, "media_type": "application/json"}
        with pytest.raises(InvalidInput, match=r"events\[0\]\.content_ref is not input"):
            s.append([{"kind": "tool/log", "optional": True, "content_ref": ref}],
                     operation_id="out")
        assert s.sequences() == (3, 3)
    assert len(root.events("h")["commits"]) == 1
    # After any sequence there is (SQLite's integers end at 2**63 - 1): past the end.
    with pytest.raises(InvalidInput, match="past the last sequence"):
        root.events("h", after=2**63)
    # A lone surrogate has no UTF-8 form: InvalidInput too (was UnicodeEncodeError).
    for bad_id in ["", "../escape", "a/b", "x" * 5000, "\x00", "\ud800", "a\udcff"]:
        with pytest.raises(InvalidInput):
            root.create(bad_id)
        with pytest.raises(InvalidInput):
            root.history(bad_id)
        with pytest.raises(InvalidInput):
            root.reader(bad_id).messages()
        with pytest.raises(InvalidInput):
            root.fork("h", after_turn="t0", child=bad_id)
        with pytest.raises(InvalidInput):
            root.delete(bad_id)
    with pytest.raises(InvalidInput):
        root.history("h", cursor="\ud800")
    with pytest.raises(InvalidInput):
        root.create("cwd-surrogate", cwd="\ud800")
    # An empty root path too (was StorageError "resolve root : No such file or directory").
    for empty in ["", b""]:
        with pytest.raises(InvalidInput, match="root path is empty"):
            session_store.Root(empty)
    # A NUL in a path is malformed input, not a storage failure (was StorageError).
    nul = str(tmp_path / "a\x00b")
    with pytest.raises(InvalidInput):
        session_store.Root(nul)
    with pytest.raises(InvalidInput):
        root.export("h", nul)
    with pytest.raises(InvalidInput):
        root.import_file(nul)
    with pytest.raises(InvalidInput):
        session_store.verify(nul)
    assert not os.path.exists(tmp_path / "a")
    with pytest.raises(TypeError):
        root.create(123)
    with pytest.raises(TypeError):
        root.history("h", limit="ten")
    with pytest.raises(InvalidInput):
        root.history("h", cursor="h1.garbage")
    with pytest.raises(InvalidInput):
        root.list(limit=10_000)
    # Refused as list's is (it was cut to 500 silently).
    with pytest.raises(InvalidInput, match=r"history limit must be 1\.\.=500"):
        root.history("h", limit=501)
    # Out of the native integer's range is out of range too (not OverflowError), naming
    # the argument (PyO3's "can't convert negative int to unsigned" named none).
    for call, named in (
        (lambda: root.list(limit=-1), "limit -1 is negative"),
        (lambda: root.history("h", limit=-1), "limit -1 is negative"),
        (lambda: root.history("h", limit=2**64), "limit"),
        (lambda: root.events("h", after=-1), "after -1 is negative"),
        (lambda: root.events("h", limit=-5), "limit -5 is negative"),
        (lambda: root.reader("h").messages(2**64), "limit"),
        (lambda: root.events("h", after=2**64), "after"),
        (lambda: session_store.Root(tmp_path / "r3", write_behind_ms=-1), "write_behind_ms"),
        (lambda: root.delete("h", wait=-1), "wait must be a finite number of seconds from 0, not -1.0"),
        (lambda: root.delete("h", wait=float("inf")), "finite number of seconds from 0, not inf"),
    ):
        with pytest.raises(InvalidInput, match=named):
            call()
    # The events page's limits in the Python call's terms (it said "observe cursor").
    with pytest.raises(InvalidInput, match="no events after sequence 1000"):
        root.events("h", after=1000)
    with pytest.raises(InvalidInput, match=r"1\.\.=1000 commits \(a limit of 0 is 100\), not 1001"):
        root.events("h", limit=1001)
    with pytest.raises(InvalidInput):
        session_store.Root(tmp_path / "r2", durability="sometimes")
    with pytest.raises(InvalidInput):
        root.fork("h", after_turn="t0", child="bad/id")
    with pytest.raises(NotFound):
        root.history("missing")
    with pytest.raises(InvalidInput):
        root.verify("../h")
    with pytest.raises(NotFound):
        root.verify("missing")
    with pytest.raises(NotFound):
        session_store.verify(tmp_path / "missing-root" / "x")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(SessionStoreError):
        session_store.Root(blocker / "root")
    # Nothing refused left a session folder behind.
    assert [d for d in os.listdir(root.path) if not d.startswith(".")] == ["h"]
    assert [m["id"] for m in root.transcript("h")] == ["m0"]


def test_large_messages_come_back_through_content(root):
    big = "x" * 100_000
    with root.create("big") as s:
        s.append(turn("t", msg(1, content=big)), operation_id="op", turn_id="t")
    row = root.history("big")["messages"][0]
    assert row["inline"] is None
    payload = json.loads(root.read_content("big", row["content_ref"]["digest"]))
    assert payload["message"]["content"] == big
    assert root.transcript("big")[0]["content"] == big


def test_async_variants(root, tmp_path):
    async def main():
        s = await root.acreate("as")
        async with s:
            await s.aappend(turn("t1", msg(1)), operation_id="o1", turn_id="t1")
            assert await s.aflush() == 3
        assert (await root.ahistory("as"))["messages"][0]["message_id"] == "m1"
        child = await root.afork("as", after_turn="t1")
        exported = await root.aexport(child, tmp_path / "c.export")
        assert exported["events"] == 3
        assert (await session_store.averify(tmp_path / "c.export"))["events"] == 3
        assert await root.aimport_file(tmp_path / "c.export", session_id="imp") == "imp"
        await root.adelete("imp")
        return [s["session_ref"]["session_id"] for s in (await root.alist())["sessions"]]

    listed = asyncio.run(main())
    assert "as" in listed and "imp" not in listed


def test_every_blocking_read_has_an_async_variant(root):
    # events, turns, read_content and writer_owner had none (nor SessionReader's history,
    # transcript, events and turns, nor the agents adapter's history and events), while
    # history, transcript, list, search and the others had theirs.
    from session_store.agents import SessionStoreSession

    no_io = {"reader", "iter_sessions", "path", "id", "root", "sequences", "transcript"}
    for cls, skip in [
        (session_store.Root, {"reader", "path"}),
        (session_store.SessionReader, {"id"}),
        (session_store.Session, no_io),  # sequences and transcript are in memory
        (SessionStoreSession, {"get_items_sync", "add_items_sync", "pop_item_sync",
                               "clear_session_sync", "get_items", "add_items", "pop_item",
                               "clear_session"}),
    ]:
        names = {n for n in vars(cls) if not n.startswith("_") and callable(getattr(cls, n))}
        for name in names - skip:
            if name.startswith("a") and name[1:] in names:
                continue
            assert f"a{name}" in names, f"{cls.__name__}.{name} has no a{name}"

    async def main():
        with root.create("r") as s:
            s.append(turn("t1", msg(1, content="x" * 100_000)), operation_id="o1", turn_id="t1")
            s.flush()
            assert await root.awriter_owner("r") == root.writer_owner("r") is not None
        assert await root.awriter_owner("r") is None
        assert await root.aevents("r", after=1, limit=2) == root.events("r", after=1, limit=2)
        assert await root.aturns("r") == root.turns("r")
        assert [s async for s in root.aiter_sessions(1, sort=None)] == list(root.iter_sessions())
        digest = root.history("r")["messages"][0]["content_ref"]["digest"]
        assert await root.aread_content("r", digest) == root.read_content("r", digest)
        reader = root.reader("r")
        assert await reader.ahistory(limit=1) == reader.history(limit=1)
        assert await reader.atranscript() == reader.transcript()
        assert await reader.aevents(1) == reader.events(1)
        assert await reader.aturns() == reader.turns()
        adapter = SessionStoreSession("ag", root)
        await adapter.add_items([{"role": "user", "content": "hi"}])
        assert await adapter.ahistory() == adapter.history()
        assert await adapter.aevents() == adapter.events()
        await adapter.aclose()

    asyncio.run(main())


def test_a_cancelled_async_call_is_never_half_done(tmp_path):
    """As the docs say: an ``aappend`` cancelled before a worker thread started it never
    runs (the docs said the call ran all the same); and ``export`` and ``fork`` read the
    durable prefix, not what a Session of this process accepted and has not written."""
    root = session_store.Root(tmp_path / "root", write_behind_ms=3_600_000)
    s = root.create("cx")
    release = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        # The one worker is busy: the append waits in the executor's queue.
        busy = loop.run_in_executor(None, release.wait, 10)
        queued = asyncio.ensure_future(s.aappend(turn("t1", msg(1)), operation_id="o1",
                                                 turn_id="t1"))
        await asyncio.sleep(0.05)
        queued.cancel()
        # The executor's future is cancelled by a callback of the loop: let it run first.
        await asyncio.sleep(0.05)
        release.set()
        await busy
        with pytest.raises(asyncio.CancelledError):
            await queued
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert s.sequences() == (0, 0)
    s.append(turn("t1", msg(1)), operation_id="o1", turn_id="t1")
    assert s.sequences() == (3, 0)
    assert root.export("cx", tmp_path / "before.export")["events"] == 0
    with pytest.raises(InvalidInput, match="once flushed"):
        root.fork("cx", after_turn="t1")
    s.flush()
    assert root.export("cx", tmp_path / "after.export")["events"] == 3
    assert root.fork("cx", after_turn="t1")
    s.close()


def test_a_blocking_call_releases_the_gil(root):
    """While one thread waits inside the store (a delete waiting 1.5 s for a held writer
    lock), another thread keeps running Python code: the wait does not hold the GIL."""
    writer = root.create("held")
    outcome = []

    def blocked():
        try:
            root.delete("held", wait=1.5)
        except session_store.Cancelled:
            outcome.append("cancelled")

    thread = threading.Thread(target=blocked)
    start = time.monotonic()
    thread.start()
    spins = 0
    while time.monotonic() - start < 0.5:
        spins += 1  # pure Python: runs only while this thread has the GIL
    elapsed = time.monotonic() - start
    still_waiting = thread.is_alive()
    thread.join()
    writer.close()
    assert outcome == ["cancelled"]
    assert still_waiting and elapsed < 1.2, f"main thread stalled {elapsed:.2f} s"
    assert spins > 1000


def test_writers_in_threads(root):
    """Writers in threads, each flushing after every batch, all succeed."""
    errors = []

    def work(i):
        try:
            with root.create(f"w{i}") as s:
                for t in range(20):
                    s.append(turn(f"t{t}", msg(t)), operation_id=f"o{t}", turn_id=f"t{t}")
                    s.flush()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(len(root.transcript(f"w{i}")) == 20 for i in range(4))


def test_delete_waits_for_the_writer_then_gives_up(root):
    writer = root.create("held")
    # It says what it waited for (the caller cancelled nothing: "operation cancelled" before).
    with pytest.raises(
        session_store.Cancelled,
        match=rf"gave up deleting held after 0\.2 s: its writer, pid {os.getpid()} \(this process\) on host ",
    ):
        root.delete("held", wait=0.2)
    writer.close()
    root.delete("held", wait=0.2)
    # A free session is deleted whatever the wait, 0 included (Cancelled before: the
    # deadline was checked before the lock was first tried).
    for wait in (0, 0.0, 1e-9):
        root.create("free").close()
        root.delete("free", wait=wait)
        with pytest.raises(NotFound):
            root.history("free")
    writer = root.create("held")
    started = time.monotonic()
    with pytest.raises(session_store.Cancelled):
        root.delete("held", wait=0)
    assert time.monotonic() - started < 0.4
    writer.close()



def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_deletes_leave_no_thread_behind(root):
    # Each delete used to start a timer thread sleeping for its whole `wait` (10 s by
    # default): a host deleting 40 sessions had 40 more threads for the next 10 s.
    for i in range(40):
        with root.create(f"d{i}") as s:
            s.append(turn("t1", msg(i)), operation_id=f"op-{i}", turn_id="t1")
    root.delete("d0", wait=3600)  # the library's own threads are started by now
    before = _threads()
    for i in range(1, 40):
        root.delete(f"d{i}", wait=3600)
    assert _threads() <= before + 2, (before, _threads())
    assert root.list()["sessions"] == []

_OUT_OF_THREADS = r"""
import sys
import session_store

root = session_store.Root(sys.argv[1])
with root.create("a") as s:
    s.append([{"kind": "turn/start"}], operation_id="o", turn_id="t")
failed = 0
for call in (root.list, lambda: root.search("word")):
    try:
        call()
    except session_store.SessionStoreError as e:
        assert "thread" in str(e), e
        failed += 1
print("failed", failed)
"""


@pytest.mark.skipif(
    os.geteuid() != 0
    or not all(os.path.exists(f"/usr/bin/{t}") for t in ("setpriv", "prlimit", "python3")),
    reason="needs root (a user of its own is limited), setpriv, prlimit and /usr/bin/python3",
)
def test_out_of_threads_is_a_session_store_error():
    # Out of threads, the query runtime's worker could not start and tokio panicked:
    # Python got pyo3's PanicException, a BaseException that `except SessionStoreError`
    # (or `except Exception`) does not catch, at every later call too (outside testing R6).
    # Run as a user of its own (root is not held to the limit), with the system's Python
    # (the venv's may lie in a folder only root may enter) and a copy of the package.
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="ss-threads-")
    site = os.path.join(folder, "site")
    shutil.copytree(os.path.dirname(session_store.__file__), os.path.join(site, "session_store"))
    for path, dirs, files in os.walk(folder):
        for name in [path, *(os.path.join(path, f) for f in files)]:
            os.chmod(name, 0o777 if os.path.isdir(name) else 0o644)
    user = ["setpriv", "--reuid=64322", "--regid=64322", "--clear-groups"]
    try:
        failures = 0
        for n in (2, 3, 4):
            script = ["/usr/bin/python3", "-c", _OUT_OF_THREADS, os.path.join(folder, f"root{n}")]
            done = subprocess.run(
                [*user, "prlimit", f"--nproc={n}", *script],
                capture_output=True,
                text=True,
                timeout=120,
                env={"PYTHONPATH": site, "RUST_BACKTRACE": "0", "PATH": "/usr/bin:/bin"},
            )
            assert done.returncode == 0, (n, done.stderr)
            failures += int(done.stdout.split()[-1])
        assert failures > 0, "no limit was low enough to make a query fail"
    finally:
        shutil.rmtree(folder)


_DELETE_INTERRUPTED = r"""
import os, signal, sys, threading, time
import session_store

root = session_store.Root(sys.argv[1])
writer = root.create("held")  # this process's writer: the delete waits for it
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    root.delete("held", wait=30)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.1f} s")
writer.close()
print("kept:", [s["session_ref"]["session_id"] for s in root.list()["sessions"]])
"""


def test_ctrl_c_ends_a_delete_waiting_for_the_writer(tmp_path):
    # With the GIL released for the whole wait, Python ran no signal handler: Ctrl-C did
    # nothing for the delete's `wait` (10 s by default), then came after its Cancelled.
    done = run_script(_DELETE_INTERRUPTED, tmp_path / "root", timeout=60)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("interrupted after "), done.stdout
    assert float(lines[0].split()[2]) < 5, done.stdout
    assert lines[1] == "kept: ['held']"


_EXPORT_INTERRUPTED = r"""
import os, signal, sys, threading, time
import session_store

root = session_store.Root(sys.argv[1])
with root.create("big") as s:
    for t in range(60):
        items = [
            {"kind": "message/complete", "payload": {"message": {
                "id": f"m{t}-{i}", "role": "user", "content": os.urandom(3000).hex()}}}
            for i in range(100)
        ]
        s.append(items, operation_id=f"op{t}")
out = os.path.join(sys.argv[1], "..", "big.sse")
threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    root.export("big", out)
    print("exported")
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.1f} s")
print("left:", os.path.exists(out))
"""


def test_ctrl_c_stops_an_export_and_leaves_no_file(tmp_path):
    # Ctrl-C was seen only after the export had finished: the caller got KeyboardInterrupt,
    # not the report, and the finished file made a retry fail as existing (outside testing
    # A2). The export is cancelled instead, and removes its unfinished file.
    done = run_script(_EXPORT_INTERRUPTED, tmp_path / "root", timeout=120)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("interrupted after "), done.stdout
    assert lines[1] == "left: False", done.stdout


_ADELETE_CANCELLED = r"""
import asyncio, os, signal, sys, threading, time
import session_store

root = session_store.Root(sys.argv[1])

async def timed_out(i):
    writer = root.create(f"held{i}")
    # Timeouts 5 ms apart cover the 50 ms between two looks of the native delete at its
    # stop event (a delete that had not looked yet took the lock below and deleted).
    try:
        await asyncio.wait_for(root.adelete(f"held{i}", wait=30), 0.1 + i * 0.005)
    except TimeoutError:
        pass
    writer.close()  # a delete still waiting would take the lock now and delete it
    await asyncio.sleep(0.1)

async def rounds():
    for i in range(12):
        await timed_out(i)
    await asyncio.sleep(0.5)
    ids = sorted(s["session_ref"]["session_id"] for s in root.list()["sessions"])
    print("after a timeout:", len(ids), "kept")

asyncio.run(rounds())
writer = root.open("held0")
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    asyncio.run(root.adelete("held0", wait=30))
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.1f} s")
"""


def test_cancelling_adelete_ends_its_wait_for_the_writer(tmp_path):
    # The worker thread's delete went on waiting for `wait` seconds: Ctrl-C in asyncio.run
    # took that long (its executor's shutdown joined the worker), and a delete whose task
    # timed out still deleted the session once its writer let go (at once, before the
    # native wait looked at its stop event; in most of the 12 rounds, once in a while in
    # the one round this test had).
    lines = run_script(_ADELETE_CANCELLED, tmp_path / "root", timeout=90).stdout.splitlines()
    assert lines[0] == "after a timeout: 12 kept", lines
    assert lines[1].startswith("interrupted after "), lines
    assert float(lines[1].split()[2]) < 5, lines


_ADELETE_CANCELLED_TWICE = r"""
import asyncio, gc, sys, time
import session_store

root = session_store.Root(sys.argv[1])
writer = root.create("a")
logged = []

async def main():
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: logged.append(context))
    task = asyncio.ensure_future(root.adelete("a", wait=10))
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()  # a second cancellation (a timeout and a TaskGroup, a second Ctrl-C)
    try:
        await task
    except asyncio.CancelledError:
        pass
    # Once the task has ended, so has the delete: the writer lets go, nothing takes it.
    writer.close()
    await asyncio.sleep(0.3)
    gc.collect()
    await asyncio.sleep(0)

asyncio.run(main())
print([s["session_ref"]["session_id"] for s in root.list()["sessions"]], len(logged))
root.create("held").close()
stop = __import__("threading").Event()
__import__("threading").Timer(0.2, stop.set).start()
other = session_store.Root(sys.argv[1]).open("held")
try:
    root._delete("held", 10.0, stop)
except session_store.Cancelled as e:
    print(str(e).split(":")[0])
"""


def test_adelete_cancelled_twice_ends_with_its_delete_and_says_it_stopped(tmp_path):
    # A second cancellation of adelete's task ended the task at once, while the worker's
    # delete still looked for its stop event (it could take the lock and delete after the
    # task had ended), and the worker's Cancelled was logged as "never retrieved". Its
    # message said "after 10 s" (the wait allowed) for a delete stopped after 0.2 s.
    out = run_script(_ADELETE_CANCELLED_TWICE, tmp_path / "root", timeout=60).stdout
    lines = out.splitlines()
    assert lines[0] == "['a'] 0", out
    assert lines[1].startswith("stopped deleting held after 0."), out
    assert lines[1].endswith(" s (cancelled), nothing deleted"), out


def test_reader_messages_are_what_json_loads_gives(root):
    # Values where a JSON reader other than Python's could differ: big and negative
    # integers, -0.0, floats at the edges, escapes, non-ASCII, nesting, a 64 KiB+ message.
    odd = {
        "id": "odd",
        "role": "user",
        "content": "é 😀 \u0000 \"q\" \\ \n",
        "n": [12345678901234567890123, -9223372036854775809, 18446744073709551615, -5, 0],
        "f": [-0.0, 0.1, 1e308, 1.7976931348623157e308, 5e-324, 2.5e-8, 1e22],
        "deep": {"a": [{"b": None, "c": True, "d": False}], "": {}},
    }
    big = msg(2, content="x" * 70_000)
    with root.create("odd") as s:
        s.append(turn("t1", odd, big, msg(3)), operation_id="op-1", turn_id="t1")
        s.append(
            [{"kind": "message/upsert", "payload": {"message": {**msg(3), "content": "v2"}}}],
            operation_id="op-2",
        )
        s.flush()
    reader = root.reader("odd")
    got = reader.messages()
    assert got == root.transcript("odd") == [odd, big, {**msg(3), "content": "v2"}]
    assert repr(got[0]) == repr(odd)  # -0.0 stays a float with its sign, ints stay ints
    assert [type(v) for v in got[0]["n"]] == [int] * 5
    assert reader.messages(2) == got[1:]
    assert reader.messages(0) == [] and reader.messages(-1) == []
    # A replacement's items come from its one payload.
    with root.open("odd") as s:
        s.append(
            [{"kind": "history/replace", "payload": {"messages": [odd, msg(9)]}}],
            operation_id="op-3",
        )
    assert reader.messages() == [odd, msg(9)]
    assert repr(reader.messages(2)[0]) == repr(odd)
    # Its id is read-only: assigned, it fell out of step with the session its kept
    # connections read.
    assert reader.id == "odd"
    with pytest.raises(AttributeError):
        reader.id = "other"  # type: ignore[misc]
    assert reader.id == "odd" and reader.messages() == [odd, msg(9)]


def test_a_kept_reader_follows_a_session_made_again(root):
    with root.create("again") as s:
        s.append(turn("t1", msg(1)), operation_id="op-1", turn_id="t1")
    reader = root.reader("again")
    assert reader.messages() == [msg(1)]
    root.delete("again")
    with pytest.raises(session_store.NotFound):
        reader.messages()
    with root.create("again") as s:
        s.append(turn("t1", msg(2)), operation_id="op-1", turn_id="t1")
    assert reader.messages() == [msg(2)]
    with pytest.raises(session_store.InvalidInput):
        root.reader("../bad").messages()


def test_long_transcripts_read_in_parts_in_order(root):
    # Over 2,000 messages the native side reads in parts on a second thread while it
    # builds the objects of the parts already read: every message once, in order.
    with root.create("long") as s:
        for t in range(9):
            batch = [msg(t * 500 + i) for i in range(500)]
            s.append(turn(f"t{t}", *batch), operation_id=f"op-{t}", turn_id=f"t{t}")
        s.flush()
    reader = root.reader("long")
    everything = root.transcript("long")
    assert len(everything) == 4500
    assert reader.messages() == everything
    for limit in (2000, 2001, 4000, 4499, 4500, 10_000):
        assert reader.messages(limit) == everything[-limit:], limit


def test_search_finds_words_with_filters_and_pages(root):
    with root.create("alpha", cwd="/work/a") as s:
        s.append(
            turn(
                "t1",
                msg(1, "user", "the café by the harbour opened"),
                msg(2, "assistant", "harbour lights"),
            ),
            operation_id="op-1",
            turn_id="t1",
        )
    with root.create("beta", cwd="/work/b") as s:
        s.append(turn("t1", msg(3, "user", "a harbour seal")), operation_id="op-1", turn_id="t1")

    found = root.search("harbour")
    assert {(h["session_ref"]["session_id"], h["message_id"]) for h in found["hits"]} == {
        ("alpha", "m1"),
        ("alpha", "m2"),
        ("beta", "m3"),
    }
    assert found["next_cursor"] is None
    # Matches index the snippet as a Python str: the "é" before the word is one character
    # (two bytes).
    m1 = next(h for h in found["hits"] if h["message_id"] == "m1")
    text = m1["snippet"]["text"]
    assert [text[m["start"] : m["end"]] for m in m1["snippet"]["matches"]] == ["harbour"]
    assert m1["role"] == "user" and m1["position"] == 1 and m1["time_ms"] > 0

    assert [h["message_id"] for h in root.search("harbour", role="assistant")["hits"]] == ["m2"]
    assert [h["message_id"] for h in root.search("harbour", cwd="/work/b")["hits"]] == ["m3"]
    assert {h["message_id"] for h in root.search("harbour", session="alpha")["hits"]} == {
        "m1",
        "m2",
    }
    assert [h["message_id"] for h in root.search('"harbour seal"')["hits"]] == ["m3"]
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert root.search("harbour", since=later)["hits"] == []
    earlier = datetime.now(timezone.utc) - timedelta(hours=1)
    assert len(root.search("harbour", since=earlier)["hits"]) == 3
    # A commit time is kept in whole milliseconds, cut down (a commit at T.9 ms is T): a
    # `since` inside that millisecond may be before the commit, so it finds the hit (since
    # is cut down as well; rounded up, it lost it), and the next millisecond does not.
    at = datetime.fromtimestamp(m1["time_ms"] / 1000, timezone.utc)
    within = at + timedelta(microseconds=999)
    assert "m1" in {h["message_id"] for h in root.search("harbour", since=within)["hits"]}
    after = at + timedelta(milliseconds=1)
    assert "m1" not in {h["message_id"] for h in root.search("harbour", since=after)["hits"]}

    # One hit a page, every hit once.
    seen, cursor = [], None
    while True:
        page = root.search("harbour", limit=1, cursor=cursor)
        seen += [h["message_id"] for h in page["hits"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == ["m1", "m2", "m3"]
    assert asyncio.run(root.asearch("seal"))["hits"][0]["message_id"] == "m3"

    for bad in [
        lambda: root.search('"unclosed'),
        lambda: root.search(""),
        lambda: root.search("harbour", limit=101),
        lambda: root.search("harbour", since=datetime(2026, 1, 1)),  # naive: which zone?
        lambda: root.search("harbour", cursor="s1.x"),
        lambda: root.search("harbour", session="../x"),
    ]:
        with pytest.raises(InvalidInput):
            bad()
    with pytest.raises(NotFound):
        root.search("harbour", session="nope")
    # A number (seconds or ms?) is of the wrong type, as any argument's is (InvalidInput
    # before: outside testing C5).
    with pytest.raises(TypeError, match="^since must be datetime.datetime or None, not int$"):
        root.search("harbour", since=1767225600)


def test_rename_sets_the_title_that_list_and_search_show(root):
    with root.create("chat") as s:
        s.append(turn("t1", msg(1)), operation_id="op-1", turn_id="t1")
        with pytest.raises(WriterOwned):
            root.rename("chat", "Taken")  # this process's own writer has it
    root.rename("chat", "Harbour plans")
    assert [x["title"] for x in root.list()["sessions"]] == ["Harbour plans"]
    hits = root.search("harbour", role="title")["hits"]
    assert [(h["session_ref"]["session_id"], h["position"]) for h in hits] == [("chat", 0)]
    asyncio.run(root.arename("chat", "Second title"))
    assert root.list()["sessions"][0]["title"] == "Second title"
    durable = root.events("chat")["next"]
    for args, error in [
        (("chat", "  "), InvalidInput),
        (("nope", "x"), NotFound),
        (("../x", "x"), InvalidInput),
    ]:
        with pytest.raises(error):
            root.rename(*args)
    assert root.events("chat")["next"] == durable


_FORK_SCRIPT = r"""
import faulthandler, json, os, signal, sys, time
import session_store
from session_store import WriterOwned

def turn(t, text):
    return [
        {"kind": "turn/start"},
        {"kind": "message/complete",
         "payload": {"message": {"id": f"m-{t}", "role": "user", "content": text}}},
        {"kind": "turn/end", "payload": {"status": "completed"}},
    ]

path, report = sys.argv[1], sys.argv[2]
root = session_store.Root(path, write_behind_ms=60_000)
parent = root.create("p")
parent.append(turn("t1", "hello one"), operation_id="o1", turn_id="t1")
parent.flush()
# Every pool of the process in use before the fork: queries, a kept reader, a search.
reader = root.reader("p")
assert len(reader.messages()) == 1
assert root.search("hello")["hits"] and root.history("p")["messages"] and root.list()["sessions"]
# Accepted, not written: the parent's write-behind waits a minute.
parent.append(turn("t2", "hello two"), operation_id="o2", turn_id="t2")
pid = os.fork()
if pid == 0:
    # A crash or a hang prints where on stderr (the test shows it), not just no report.
    faulthandler.enable()
    faulthandler.dump_traceback_later(50)
    signal.alarm(60)
    out = {}
    out["list"] = [s["session_ref"]["session_id"] for s in root.list()["sessions"]]
    out["history"] = len(root.history("p")["messages"])
    out["messages"] = len(reader.messages())
    out["hits"] = len(root.search("hello")["hits"])
    for call in ("append", "flush", "sequences", "transcript"):
        try:
            if call == "append":
                parent.append(turn("t3", "child"), operation_id="o3", turn_id="t3")
            else:
                getattr(parent, call)()
        except WriterOwned as e:
            out[call] = [e.owner["pid"], "os.fork()" in str(e)]
    parent.close()  # lets go of the copy only
    try:
        root.open("p")
    except WriterOwned as e:
        out["open"] = e.owner["pid"]
    quick = session_store.Root(path, write_behind_ms=10)
    child = quick.create("c")
    child.append(turn("c1", "from the child"), operation_id="c1", turn_id="c1")
    deadline = time.monotonic() + 20
    while not root.history("c")["messages"] and time.monotonic() < deadline:
        time.sleep(0.02)
    out["written_behind"] = len(root.history("c")["messages"])
    child.close()
    with open(report, "w") as f:
        json.dump(out, f)
    sys.exit(0)  # a normal exit: the inherited copies are finalized in this process
_, status = os.waitpid(pid, 0)
out = {"status": status, "pid": os.getpid(), "owner": root.writer_owner("p")["pid"] == os.getpid()}
out["flush"] = parent.flush()
parent.append(turn("t3", "hello three"), operation_id="o3", turn_id="t3")
parent.close()
out["verify"] = session_store.verify(os.path.join(path, "p"))["commits"]
out["transcript"] = [m["id"] for m in root.transcript("p")]
print(json.dumps(out))
"""


def _wait_status(status: int) -> str:
    """What ``os.waitpid``'s ``status`` says: the exit status, or the signal that killed."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"was killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with status {code}"


def test_a_forked_child_works_and_leaves_the_parents_writer_alone(tmp_path):
    # A child made by os.fork() (multiprocessing's default on Linux) after the parent used
    # the package: its first query waited forever for the parent's worker threads, and its
    # copy of the parent's session, finalized at its exit, wrote the parent's pending batch
    # into the file, so the parent's own flush then failed and poisoned its writer.
    # A child that crashed: about 1 run in 40 its first read after starting a thread of its
    # own died of a segmentation fault in parking_lot (r2d2's wait queues), which held the
    # memory of a parent thread that was waiting there at the fork.
    report = tmp_path / "child.json"
    done = run_script(_FORK_SCRIPT, tmp_path / "root", report)
    parent = json.loads(done.stdout)
    assert parent["status"] == 0 and report.exists(), (
        f"the child {_wait_status(parent['status'])}"
        f"{' and wrote no report' if not report.exists() else ''}; stderr:\n{done.stderr}"
    )
    child = json.loads(report.read_text())
    assert child["list"] == ["p"] and child["history"] == 1 and child["messages"] == 1
    assert child["hits"] == 1
    parent_pid = parent["pid"]
    assert child["open"] == parent_pid
    for call in ("append", "flush", "sequences", "transcript"):
        assert child[call] == [parent_pid, True], call
    assert child["written_behind"] == 1
    assert parent["owner"] is True and parent["flush"] == 6
    assert parent["verify"] == 3
    assert parent["transcript"] == ["m-t1", "m-t2", "m-t3"]


def test_the_version_is_the_installed_distributions():
    from importlib import metadata

    assert session_store.__version__ == metadata.version("session-store")
    assert session_store._native.__version__ == session_store.__version__
    assert all(part.isdigit() for part in session_store.__version__.split("."))


def test_the_wheel_metadata_says_what_pypi_and_installers_read():
    # The wheel claimed no Python version (only "Programming Language :: Rust" and
    # CPython), not that it ships type information (py.typed: "Typing :: Typed"), nor that
    # it runs on Linux only (it reads /proc).
    import re
    from importlib import metadata
    from pathlib import Path

    meta = metadata.metadata("session-store")
    classifiers = set(meta.get_all("Classifier") or [])
    assert meta["Requires-Python"] == ">=3.10"
    versions = {c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r".*:: 3\.\d+", c)}
    assert {"3.10", "3.11", "3.12", "3.13"} <= versions, classifiers
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in versions
    assert {
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: Implementation :: CPython",
        "Operating System :: POSIX :: Linux",
        "Typing :: Typed",
    } <= classifiers, classifiers
    assert {"agents", "langgraph"} <= set(meta.get_all("Provides-Extra") or [])
    assert meta["Description-Content-Type"].startswith("text/markdown")
    assert "pip install './python[langgraph]'" in (meta.get_payload() or meta["Description"])
    # The version is the crate's (pyproject.toml repeats it by hand).
    crate = (Path(__file__).parents[2] / "Cargo.toml").read_text()
    assert re.search(r'(?m)^version = "([^"]+)"', crate)[1] == meta["Version"]
    assert any(str(f).endswith("session_store/py.typed") for f in metadata.files("session-store"))
    # A wheel built from the repository carried no license texts (only one built from the
    # sdist did), and the langgraph extra lacked the `langgraph` its README example needs
    # (outside testing, packaging).
    licenses = {f.name for f in metadata.files("session-store") or [] if "licenses" in f.parts}
    assert licenses == {"LICENSE-MIT", "LICENSE-APACHE"}, licenses
    assert sorted(meta.get_all("License-File") or []) == ["LICENSE-APACHE", "LICENSE-MIT"]
    langgraph_extra = {
        r.split(";")[0].strip() for r in metadata.requires("session-store") or [] if "'langgraph'" in r
    }
    assert langgraph_extra == {"langgraph-checkpoint>=4", "langgraph>=1"}, langgraph_extra


def test_a_wheel_built_from_the_sdist_gets_the_python_readme(tmp_path):
    # The sdist holds the root crate's files at its top, its README.md too, where the
    # pyproject's `readme = "README.md"` is read from when pip builds a wheel from the
    # sdist: that wheel's PyPI page was the crate's 650-line README, not this package's.
    import re
    import tarfile
    from pathlib import Path

    python_dir = Path(__file__).parents[1]
    subprocess.run(
        [Path(sys.executable).parent / "maturin", "sdist", "--out", tmp_path],
        cwd=python_dir,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        pyproject = tar.extractfile(f"{top}/pyproject.toml").read().decode()
        path = re.search(r'(?m)^readme = "([^"]+)"', pyproject)[1]
        readme = tar.extractfile(f"{top}/{path}").read().decode()
        # The bundled SQLite's setting is the repository's `.cargo/config.toml`, which the
        # sdist leaves out: a package built from the sdist searched about twice as slowly
        # (outside testing, packaging). Its own config, which the sdist holds, sets it too.
        config = tar.extractfile(f"{top}/python/.cargo/config.toml").read().decode()
    assert readme == (python_dir / path).read_text()
    assert readme.startswith("# session-store for Python")
    assert re.search(r'(?m)^LIBSQLITE3_FLAGS = .*"-DSQLITE_DEFAULT_MEMSTATUS=0"', config), config


def test_annotations_resolve_in_their_class_scope():
    # Type checkers read a method's annotations in its class's scope, where Root.list (a
    # method) hides the builtin: `-> list[dict]` made `for m in root.transcript(i)` "not
    # iterable" for mypy in the caller's code.
    import typing

    from session_store.langgraph import SessionStoreSaver

    classes = (session_store.Root, session_store.Session, session_store.SessionReader)
    for cls in (*classes, SessionStoreSaver):
        module = vars(sys.modules[cls.__module__])
        for name, member in vars(cls).items():
            fn = member.fget if isinstance(member, property) else member
            if name.startswith("__") or not callable(fn) or not hasattr(fn, "__annotations__"):
                continue
            if isinstance(member, property) and name == "_native":
                continue  # a property named as the module its annotation names: not a method
            hints = typing.get_type_hints(fn, globalns=module, localns=dict(vars(cls)))
            assert all(not inspect.isfunction(h) for h in hints.values()), (cls, name)
    assert typing.get_type_hints(
        session_store.Root.transcript, localns=dict(vars(session_store.Root))
    )["return"] == list[dict[str, typing.Any]]


_TYPED_CALLS = """
from datetime import datetime, timezone
import session_store

root = session_store.Root("r", durability="normal", write_behind_ms=10)
with root.create("a", cwd="/w") as s:
    s.append([{"kind": "turn/start"}], operation_id="o", turn_id="t")
    s.flush()
page: dict[str, object] = root.history("a", cursor=None, limit=5)
hits = root.search("hi", limit=3, since=datetime.now(timezone.utc), role="user")
for m in root.transcript("a"):
    m.get("id")
root.fork("a", after_turn="t", child="b")
invalid: ValueError = session_store.InvalidInput("x")  # the builtin bases, as raised
missing: LookupError = session_store.NotFound("x")
taken: FileExistsError = session_store.AlreadyExists("x")
root.delete("b", wait=1.0)
session_store.verify("r/a")
root.history(123)  # error: str expected
root.create(session_id=5)  # error: str | None expected
root.delete("a", wait="1")  # error: float expected
root.fork("a", after="t")  # error: no such keyword
session_store.verify(7)  # error: a path expected
"""


def test_type_checkers_check_the_arguments_of_every_call(tmp_path):
    # `_native_args` was typed `Callable[..., T] -> Callable[..., T]`: every method it wraps
    # (create, open, history, search, fork, delete, verify, ...) took any arguments for
    # mypy and pyright, so `root.history(123)` passed `mypy --strict`.
    script = tmp_path / "calls.py"
    script.write_text(_TYPED_CALLS)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", os.devnull, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    flagged = {
        int(line.split(":")[1]) for line in done.stdout.splitlines() if ": error:" in line
    }
    expected = {
        i for i, line in enumerate(_TYPED_CALLS.splitlines(), 1) if "# error:" in line
    }
    assert flagged == expected, done.stdout + done.stderr


def test_the_package_passes_mypy_strict():
    # The package ships py.typed, so its own annotations are checked as its users check
    # theirs: `mypy --strict session_store` reported 19 errors (json.loads returned as
    # typed results, optional values passed where the native stubs want them, an import
    # of a name langgraph does not export there).
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", os.devnull]
        + ["-p", "session_store"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_native_stubs_match_the_module(tmp_path):
    # mypy's stubtest compares _native.pyi with the built module: 13 errors (classes that
    # cannot be subclassed not marked @final, so mypy passed a subclass that fails at
    # runtime; Root's constructor stubbed as __init__ where the module has __new__; no
    # __all__), outside testing, session 38.
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "session_store._native"],
        cwd=tmp_path,  # its cache (.mypy_cache) there
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


_WITHOUT_SDKS = r"""
import asyncio, sys

class NotInstalled:  # finds none of the adapters' SDKs, as when they are not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("agents", "langchain_core", "langgraph"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
import session_store
from session_store.agents import SessionStoreSession

adapter = SessionStoreSession("s", session_store.Root(sys.argv[1]))
asyncio.run(adapter.add_items([{"role": "user", "content": "hi"}]))
print(asyncio.run(adapter.get_items()))
for attempt in (
    lambda: __import__("session_store.langgraph"),
    lambda: SessionStoreSession("s", adapter.root, session_settings={"limit": 1}),
):
    try:
        attempt()
    except ModuleNotFoundError as e:
        print(type(e).__name__, e.name, str(e))
"""


def test_the_package_works_without_the_adapters_sdks_and_says_which_extra_they_need(tmp_path):
    # The core and the openai-agents adapter need neither SDK; an adapter that needs its SDK
    # said "No module named 'langchain_core'", naming neither the adapter nor the extra.
    lines = run_script(_WITHOUT_SDKS, tmp_path / "root").stdout.splitlines()
    assert lines[0] == "[{'role': 'user', 'content': 'hi'}]"
    assert lines[1].startswith(
        "ModuleNotFoundError langchain_core session_store.langgraph needs langgraph-checkpoint"
    ), lines
    assert lines[1].endswith("pip install 'session-store[langgraph]'"), lines
    assert lines[2].startswith(
        "ModuleNotFoundError agents SessionStoreSession(session_settings=...) needs openai-agents"
    ), lines
    assert lines[2].endswith("pip install 'session-store[agents]'"), lines


def test_paths_may_be_bytes_and_not_utf8(tmp_path):
    # PathLike names bytes paths too (os.fsencode, os.listdir(b".")); they raised a bare
    # TypeError ("'bytes' object is not an instance of 'str'") from the native layer.
    raw = os.fsencode(tmp_path) + b"/root \xff"
    root = session_store.Root(raw)
    assert root.path == os.fsdecode(raw) and os.path.isdir(raw)
    with root.create("b") as s:
        s.append(turn("t", msg(1)), operation_id="o", turn_id="t")
    out = os.fsencode(tmp_path) + b"/export \xfe.sqlite"
    assert root.export("b", out)["commits"] == 1 and os.path.isfile(out)
    assert session_store.verify(out)["session_id"] == "b"
    assert asyncio.run(session_store.averify(out))["session_id"] == "b"
    assert root.import_file(out, session_id="b2") == "b2"
    again = session_store.Root(os.fsdecode(raw))
    assert again.transcript("b2") == root.transcript("b") == [msg(1)]
    with pytest.raises(InvalidInput, match="NUL"):
        session_store.Root(b"x\0y")
    with pytest.raises(TypeError):
        session_store.Root(5)


_FORK_LOCK_SCRIPT = r"""
import json, os, signal, sys
import session_store
from session_store import WriterOwned

root = session_store.Root(sys.argv[1])
parent = root.create("p")
to_child, from_parent = os.pipe()
to_parent, from_child = os.pipe()
pid = os.fork()
if pid == 0:
    signal.alarm(60)
    os.read(to_child, 1)  # the parent closed "p", reopened and closed it again
    try:
        root.open("p").close()
        opened = True
    except WriterOwned:
        opened = False
    os.write(from_child, json.dumps({"child_opened": opened}).encode())
    os.read(to_child, 1)
    os._exit(0)  # no finalizer runs: what the child inherited is only closed by the kernel
parent.close()
out = {}
try:
    root.open("p").close()  # the child still lives, holding copies of the parent's files
    out["parent_reopened"] = True
except WriterOwned as e:
    out["parent_reopened"] = str(e)
os.write(from_parent, b"x")
out.update(json.loads(os.read(to_parent, 1000)))
os.write(from_parent, b"x")
os.waitpid(pid, 0)
print(json.dumps(out))
"""


def test_a_forked_child_does_not_keep_the_parents_writer_lock(tmp_path):
    # flock belongs to the open file description, which fork() shares: the child's copy of
    # the lock file's descriptor kept the parent's lock held after the parent closed the
    # session, for as long as the child lived (a multiprocessing worker: for good).
    done = run_script(_FORK_LOCK_SCRIPT, tmp_path / "root")
    assert json.loads(done.stdout) == {"parent_reopened": True, "child_opened": True}


_DAEMON_WRITER_EXIT_SCRIPT = r"""
import queue, sys, threading
import session_store

root = session_store.Root(sys.argv[1], write_behind_ms=60_000)
inbox, acks = queue.Queue(), queue.Queue()

def worker():  # a daemon thread owns the session: its frame is never torn down
    session = root.create("w")
    while True:
        i = inbox.get()
        message = {"id": f"m{i}", "role": "user", "content": f"hello {i}"}
        acks.put(session.append([{"kind": "message/complete", "payload": {"message": message}}],
                                operation_id=f"o{i}"))

threading.Thread(target=worker, daemon=True).start()
for i in range(3):
    inbox.put(i)
    acks.get()
sys.exit(0)
"""


def test_what_a_daemon_threads_session_accepted_is_durable_after_a_clean_exit(tmp_path):
    # Outside testing P2: a session a daemon thread held was never dropped at a clean
    # sys.exit(0), so what it had accepted (the last write-behind window; with a long
    # write-behind, everything) was lost. The package closes every open session at exit.
    run_script(_DAEMON_WRITER_EXIT_SCRIPT, tmp_path / "root")
    root = session_store.Root(tmp_path / "root")
    assert [m["id"] for m in root.transcript("w")] == ["m0", "m1", "m2"]
    assert root.writer_owner("w") is None


_FORK_DURING_LOCKING_SCRIPT = r"""
import json, os, signal, sys, threading, time
import session_store
from session_store import SessionStoreError

root = session_store.Root(sys.argv[1], durability="normal")
with root.create("s") as s:
    s.append([{"kind": "turn/start"}], operation_id="o", turn_id="t")
    s.append([{"kind": "turn/end", "payload": {"status": "completed"}}], operation_id="e")
stop = threading.Event()

def churn_writer():  # a request thread opening and closing its writer
    while not stop.is_set():
        try:
            root.open("s").close()
        except SessionStoreError:
            pass

def churn_forks():  # forks of "s" made and deleted: its dependents.lock, shared and exclusive
    i = 0
    while not stop.is_set():
        i += 1
        try:
            root.fork("s", after_turn="t", child=f"f{i}")
            root.delete(f"f{i}")
        except SessionStoreError:
            pass

threads = [threading.Thread(target=churn_writer), threading.Thread(target=churn_forks)]
for t in threads:
    t.start()
kids = []
for _ in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:  # a worker that lives on (multiprocessing's, say)
        signal.alarm(60)
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
    time.sleep(0.003)
stop.set()
for t in threads:
    t.join()
# Every descriptor of a child that holds a flock, by file: the parent has let go of all.
held = {}
for pid in kids:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                locked = "FLOCK" in info.read()
        except OSError:
            continue
        if locked:
            name = os.path.basename(target)
            held[name] = held.get(name, 0) + 1
out = {"held": held}
try:
    root.open("s").close()
    root.delete("s", wait=1)
    out["parent"] = "ok"
except SessionStoreError as e:
    out["parent"] = f"{type(e).__name__}: {e}"
for pid in kids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(json.dumps(out))
"""


def test_a_child_forked_while_threads_take_locks_keeps_none_of_them(tmp_path):
    # Outside testing P1: a child forked while another thread of the parent was taking or
    # releasing a lock (a writer's open or close, a fork's or a delete's dependents.lock)
    # kept a copy of its descriptor, and with it the lock after the parent let go: the
    # parent's own open of the session it had closed was refused "by this process", its
    # delete "a fork or delete of it is in progress" (1-2 writer locks and about 19
    # dependents.lock copies in 200-300 children). Every lock file descriptor is now
    # recorded from its open and closed in the child.
    done = run_script(_FORK_DURING_LOCKING_SCRIPT, tmp_path / "root", "150", timeout=120)
    assert json.loads(done.stdout) == {"held": {}, "parent": "ok"}


_FORK_READING_SCRIPT = r"""
import os, signal, sys, threading
import session_store

root = session_store.Root(sys.argv[1], durability="normal")
with root.create("c") as s:
    s.append([{"kind": "message/complete",
               "payload": {"message": {"id": "m", "role": "user", "content": "hello"}}}],
             operation_id="o")
stop = False

def read():
    while not stop:
        root.transcript("c")

threads = [threading.Thread(target=read) for _ in range(3)]
for t in threads:
    t.start()
hung = 0
for i in range(300):
    pid = os.fork()
    if pid == 0:
        signal.alarm(3)  # a child that hangs is ended by SIGALRM
        fresh = session_store.Root(sys.argv[1]) if i % 2 else root
        os._exit(0 if fresh.transcript("c")[0]["id"] == "m" else 1)
    _, status = os.waitpid(pid, 0)
    hung += os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0
stop = True
for t in threads:
    t.join()
print(hung)
"""


def test_a_forked_child_reads_while_the_parents_threads_read(tmp_path):
    # SQLite's unix VFS locks a file under a mutex of that file's (on the heap, out of reach
    # of the fork handler's static ones): a fork while another thread of the parent was
    # locking the session's file gave the child that mutex locked for good, and the
    # child's first read of the session (through the inherited Root or a new one) hung,
    # in 1-4 forks of a hundred here. So did a fork while a parent thread held the Root's
    # own lock of its service (about one in a thousand: once in 300 in a CI run).
    done = run_script(_FORK_READING_SCRIPT, tmp_path / "root")
    assert done.stdout.strip() == "0"


_FORK_WHILE_DROPPING_SCRIPT = r"""
import os, sys, threading, time

# An at-fork handler registered before the package's, as the logging module's is (Python
# code: it lets other threads take the GIL while it runs).
os.register_at_fork(before=lambda: time.sleep(0.002))
import session_store

root = session_store.Root(sys.argv[1], durability="normal")
with root.create("s") as s:
    s.append([{"kind": "message/complete",
               "payload": {"message": {"id": "m", "role": "user", "content": "hi"}}}],
             operation_id="o")
stop = False

def churn():
    while not stop:
        reader = root.reader("s")
        reader.messages(1)
        del reader  # the last reference: its connections close, the GIL held

thread = threading.Thread(target=churn)
thread.start()
for i in range(100):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
stop = True
thread.join()
print("forked")
"""


def test_a_fork_while_another_thread_drops_a_reader_does_not_hang(tmp_path):
    # The package's fork handlers were os.register_at_fork ones: while they held SQLite's
    # file calls, a handler registered before them (logging's) ran Python code, another
    # thread took the GIL and dropped a reader, whose close waited for the fork with the
    # GIL held, and os.fork() never returned (outside testing P1). They are pthread_atfork
    # handlers now, run inside fork() with the GIL held by the forking thread.
    done = run_script(_FORK_WHILE_DROPPING_SCRIPT, tmp_path / "root", timeout=60)
    assert done.stdout.strip() == "forked"


def test_a_kept_reader_racing_deletes_and_remakes_answers_or_says_not_found(root):
    # A read that failed on a file deleted (or deleted and made again) under it was retried
    # once on a fresh open, which could race the next delete too: the caller got SQLite's
    # "disk I/O error" as a StorageError instead of NotFound or the new session's messages.
    with root.create("r") as s:
        s.append(turn("t", msg(1)), operation_id="o", turn_id="t")
    reader = root.reader("r")
    failures: list[BaseException] = []
    answers = {"read": 0, "not_found": 0}
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                # The session made again is empty until its writer's close.
                assert reader.messages(5) in ([], [msg(1)])
                answers["read"] += 1
            except NotFound:
                answers["not_found"] += 1
            except BaseException as e:  # noqa: BLE001 - every other failure is the defect
                failures.append(e)
                return

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 6
    rounds = 0
    while time.monotonic() < deadline and not failures:
        root.delete("r")
        with root.create("r") as s:
            s.append(turn("t", msg(1)), operation_id="o", turn_id="t")
        rounds += 1
    stop.set()
    for t in threads:
        t.join()
    assert not failures, f"after {rounds} rounds: {failures[0]!r}"
    assert answers["read"] > 0


def test_root_reads_racing_deletes_and_remakes_answer_or_say_not_found(root):
    # As the CLI's reads do: a read whose session is deleted (or deleted and made again)
    # under it is NotFound, not SQLite's "disk I/O error" for the files that went away.
    def make() -> None:
        with root.create("r") as s:
            s.append(turn("t", msg(1)), operation_id="o", turn_id="t")

    make()
    reads = {
        "history": lambda: root.history("r"),
        "transcript": lambda: root.transcript("r"),
        "events": lambda: root.events("r"),
        "turns": lambda: root.turns("r"),
        "verify": lambda: root.verify("r"),
    }
    failures: dict[str, BaseException] = {}
    stop = threading.Event()

    def read(name: str) -> None:
        while not stop.is_set() and name not in failures:
            try:
                reads[name]()
            except NotFound:
                pass
            except BaseException as e:  # noqa: BLE001 - every other failure is the defect
                failures[name] = e

    threads = [threading.Thread(target=read, args=(name,)) for name in reads]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 6
    try:
        while time.monotonic() < deadline and not failures:
            root.delete("r")
            make()
    finally:
        # Also when the loop raised: a reader left running kept pytest from exiting.
        stop.set()
        for t in threads:
            t.join()
    assert not failures, failures
    assert root.transcript("r") == [msg(1)]


def test_root_verify_refuses_what_every_other_call_refuses(root, tmp_path):
    # Root.verify checked the folder's file as a plain path: another session's file copied
    # under a new id verified as sound (naming the other session), and a symlinked folder,
    # also one to a folder outside the root, was followed; the CLI's `verify ID` and every
    # other call refuse both.
    import shutil

    with root.create("a") as s:
        s.append(turn("t", msg(1)), operation_id="o", turn_id="t")
    assert root.verify("a")["session_id"] == "a"
    shutil.copytree(os.path.join(root.path, "a"), os.path.join(root.path, "b"))
    with pytest.raises(Corrupt, match="holds the file of session a"):
        root.verify("b")
    with pytest.raises(Corrupt):
        root.history("b")
    outside = tmp_path / "outside"
    shutil.copytree(os.path.join(root.path, "a"), outside / "c")
    os.symlink(outside / "c", os.path.join(root.path, "c"))
    with pytest.raises(InvalidInput, match="symlink"):
        root.history("c")
    with pytest.raises(InvalidInput, match="symlink"):
        root.verify("c")
    assert session_store.verify(outside / "c")["session_id"] == "a"  # a file given by path


def test_a_payload_nested_too_deep_is_refused_and_one_stored_reads_as_an_error(root) -> None:
    # A message nested 1,000 deep was stored (the store checks JSON text without
    # recursing), then every read of the session from Python raised a bare RecursionError
    # (outside testing, session 35). An append refuses it now (over 512 deep); a deep
    # payload stored before that rule reads as a SessionStoreError saying so.
    def batch(op: str, depth: int) -> str:
        content = "[" * (depth - 2) + "]" * (depth - 2)
        return (
            '{"operation_id":"%s","events":[{"kind":"message/complete","payload":'
            '{"message":{"id":"%s","role":"user","content":%s}}}]}' % (op, op, content)
        )

    with root.create("deep") as s:
        with pytest.raises(session_store.InvalidInput, match="nests objects and arrays"):
            s.append_json(batch("too-deep", 1000))
        s.append_json(batch("at-limit", 512))
    assert [m["id"] for m in root.transcript("deep")] == ["at-limit"]
    # What a payload too deep for json.loads meets: the interpreter's limit lowered
    # (where it bounds json's decoder, as on CPython 3.11) below the stored depth.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 60)
    try:
        try:
            json.loads("[" * 100 + "]" * 100)
            bounded = False
        except RecursionError:
            bounded = True
        if bounded:
            for read in (lambda: root.transcript("deep"), lambda: root.events("deep")):
                with pytest.raises(session_store.SessionStoreError, match="deeper than"):
                    read()
    finally:
        sys.setrecursionlimit(limit)
    if not bounded:
        pytest.skip("this interpreter's json decoder is not bounded by sys.setrecursionlimit")
