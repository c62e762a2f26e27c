"""session_store.agents.SessionStoreSession: the openai-agents Session protocol, a second
writer in another process, forks, and a full offline Runner conversation with tool calls
(the SDK's own agents.testing.ScriptedModel)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import types

import pytest

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.memory import Session as SessionProtocol
from agents.memory import SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

import session_store
from session_store.agents import SessionStoreSession

from conftest import FORK_HANDSHAKE, lose_the_create_race, run_script

set_tracing_disabled(True)  # offline: no trace export


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def run(coro):
    return asyncio.run(coro)


def test_implements_the_sdk_protocol(root):
    session = SessionStoreSession("s", root)
    assert isinstance(session, SessionProtocol)
    assert session.session_id == "s"
    # A path works as well as a Root (the shape of SQLiteSession(session_id, db_path)).
    assert isinstance(SessionStoreSession("s", root.path).root, session_store.Root)


def test_get_items_limits(root):
    async def main():
        s = SessionStoreSession("lim", root)
        assert await s.get_items() == []
        assert await s.get_items(limit=3) == []
        items = [user(f"u{i}") for i in range(7)]
        await s.add_items(items[:4])
        await s.add_items(items[4:])
        assert await s.get_items() == items
        assert await s.get_items(limit=3) == items[-3:]
        assert await s.get_items(limit=1) == items[-1:]
        assert await s.get_items(limit=0) == []
        # A negative limit is every item, as SQLiteSession (SQLite's LIMIT -1) reads it:
        # it was none, so SessionSettings(limit=-1) sent the model no history.
        assert await s.get_items(limit=-1) == items
        assert await s.get_items(limit=100) == items
        # A limit beyond 64 bits is all of them (an OverflowError before); a str limit is
        # a TypeError saying so (a leaked comparison's before: outside testing, session 36).
        assert await s.get_items(limit=10**30) == items
        with pytest.raises(TypeError, match="^get_items\\(\\) limit must be int or None, not str$"):
            await s.get_items(limit="2")
        limited = SessionStoreSession("lim", root, session_settings=SessionSettings(limit=2))
        assert await limited.get_items() == items[-2:]
        unlimited = SessionStoreSession("lim", root, session_settings=SessionSettings(limit=-1))
        assert await unlimited.get_items() == items
        assert await limited.get_items(limit=5) == items[-5:]
        # Any mapping, as the signature says: the SDK's coercion took a dict only and
        # raised TypeError ("session must be a SessionSettings instance or a dict").
        proxied = SessionStoreSession(
            "lim", root, session_settings=types.MappingProxyType({"limit": 3})
        )
        assert proxied.session_settings == SessionSettings(limit=3)
        assert await proxied.get_items() == items[-3:]
        s.close()

    run(main())


def test_get_items_over_many_pages(root):
    async def main():
        s = SessionStoreSession("many", root)
        items = [user(f"u{i}") for i in range(1_203)]
        for start in range(0, len(items), 100):
            await s.add_items(items[start : start + 100])
        assert await s.get_items() == items
        assert await s.get_items(limit=777) == items[-777:]

    run(main())


def test_a_pop_reads_the_items_once_it_holds_the_writer(root, monkeypatch):
    # Another process adds an item after the pop looked for items and before it took the
    # writer: the pop read the items before that and its replace dropped the added item
    # (its add_items had returned), and two pops at once both returned one item (outside
    # testing P1, session 41). The pop now reads again under the writer.
    s = SessionStoreSession("conv", root)
    s.add_items_sync([user("one"), user("two")])
    s.close()
    other = (
        "import sys\n"
        "from session_store.agents import SessionStoreSession\n"
        "s = SessionStoreSession('conv', sys.argv[1])\n"
        "s.add_items_sync([{'role': 'user', 'content': 'from the other process'}])\n"
        "s.close()\n"
    )
    opened = SessionStoreSession._open_writer

    def open_after_the_other_process(self):
        run_script(other, root.path)
        return opened(self)

    monkeypatch.setattr(SessionStoreSession, "_open_writer", open_after_the_other_process)
    s = SessionStoreSession("conv", root)
    assert s.pop_item_sync() == user("from the other process")
    monkeypatch.setattr(SessionStoreSession, "_open_writer", opened)
    assert s.get_items_sync() == [user("one"), user("two")]
    s.close()


def test_pop_on_empty_pop_and_clear_then_add(root):
    async def main():
        s = SessionStoreSession("p", root)
        assert await s.pop_item() is None
        await s.clear_session()  # on a session that does not exist yet: nothing happens
        await s.add_items([user("a"), {"type": "function_call", "id": "fc_1", "call_id": "c1",
                                       "name": "f", "arguments": "{}"}])
        await s.add_items([])
        popped = await s.pop_item()
        assert popped == {"type": "function_call", "id": "fc_1", "call_id": "c1",
                          "name": "f", "arguments": "{}"}
        assert list(popped) == ["type", "id", "call_id", "name", "arguments"]  # key order kept
        assert await s.get_items() == [user("a")]
        assert await s.pop_item() == user("a")
        assert await s.pop_item() is None
        await s.add_items([user("b")])
        await s.clear_session()
        assert await s.get_items() == []
        assert await s.pop_item() is None
        await s.add_items([user("c"), user("d")])
        assert await s.get_items() == [user("c"), user("d")]
        # The full history stays readable: every item ever added is in the log.
        kinds, added = [], []
        for commit in s.events()["commits"]:
            for e in commit["events"]:
                kinds.append(e["kind"])
                if e["kind"] == "message/complete":
                    added.append(e["payload"]["message"].get("content"))
        assert kinds.count("history/replace") == 3
        assert added == ["a", None, "b", "c", "d"]
        assert session_store.verify(os.path.join(root.path, "p"))["commits"] == 6
        s.close()

    run(main())


def test_history_has_stable_ids(root):
    async def main():
        s = SessionStoreSession("ids", root)
        await s.add_items([user("a"), user("b")])
        first = s.history()
        await s.add_items([user("c")])
        await s.pop_item()
        second = s.history()
        assert second == first
        assert [h["position"] for h in second] == [0, 1]
        assert len({h["item_id"] for h in second}) == 2
        await s.add_items([user("c2")])
        assert s.history()[2]["item_id"] not in {h["item_id"] for h in first}

    run(main())


def test_two_sessions_in_one_root_are_independent(root):
    async def main():
        a = SessionStoreSession("a", root)
        b = SessionStoreSession("b", root)
        await a.add_items([user("for a")])
        await b.add_items([user("for b 1"), user("for b 2")])
        await a.pop_item()
        assert await a.get_items() == []
        assert await b.get_items() == [user("for b 1"), user("for b 2")]
        await b.clear_session()
        await a.add_items([user("again")])
        assert await a.get_items() == [user("again")]
        assert await b.get_items() == []
        ids = [s["session_ref"]["session_id"] for s in root.list()["sessions"]]
        assert ids == ["a", "b"]

    run(main())


SECOND_WRITER = """
import asyncio, json, sys
import session_store
from session_store.agents import SessionStoreSession

async def main():
    s = SessionStoreSession(sys.argv[2], sys.argv[1])
    print(json.dumps({"read": await s.get_items()}), flush=True)
    try:
        await s.add_items([{"role": "user", "content": "intruder"}])
    except session_store.WriterOwned as e:
        print(json.dumps({"owned": e.owner, "message": str(e)}), flush=True)
        return
    print(json.dumps({"wrote": True}), flush=True)

asyncio.run(main())
"""


def test_a_second_writer_process_gets_writer_owned(root):
    async def main():
        s = SessionStoreSession("shared", root)
        await s.add_items([user("mine")])
        out = subprocess.run(
            [sys.executable, "-c", SECOND_WRITER, root.path, "shared"],
            capture_output=True, text=True, timeout=60, cwd=root.path,
        )
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        # Reads take no lock; the write is refused and names this process.
        assert lines[0] == {"read": [user("mine")]}
        assert lines[1]["owned"]["pid"] == os.getpid()
        assert str(os.getpid()) in lines[1]["message"]
        assert await s.get_items() == [user("mine")]
        # Once this process closes its writer, the other one can write.
        await s.aclose()
        again = subprocess.run(
            [sys.executable, "-c", SECOND_WRITER, root.path, "shared"],
            capture_output=True, text=True, timeout=60, cwd=root.path,
        )
        assert json.loads(again.stdout.splitlines()[1]) == {"wrote": True}, again.stderr
        assert await s.get_items() == [user("mine"), user("intruder")]

    run(main())


def test_a_conversation_another_process_creates_meanwhile_is_opened(root, monkeypatch):
    # Outside testing P3: two processes writing a new conversation at once, the one whose
    # create came second raised AlreadyExists (38 of 40 races) instead of opening it.
    lose_the_create_race(monkeypatch)
    s = SessionStoreSession("raced", root)
    run(s.add_items([user("mine")]))
    assert run(s.get_items()) == [user("mine")]
    s.close()


def test_writer_owned_of_a_mapped_id_names_the_conversation_as_given(root):
    """WriterOwned named only the store's id, "session agx-757365723a3432 is owned by
    another writer", not the conversation the caller used (user:42)."""
    s = SessionStoreSession("user:42", root)
    s.add_items_sync([user("mine")])
    out = subprocess.run(
        [sys.executable, "-c", SECOND_WRITER, root.path, "user:42"],
        capture_output=True, text=True, timeout=60, cwd=root.path,
    )
    assert out.returncode == 0, out.stderr
    owned = json.loads(out.stdout.splitlines()[1])
    assert owned["owned"]["pid"] == os.getpid()  # the class and its owner kept
    assert owned["message"].startswith(
        'session "user:42" (stored as agx-757365723a3432) is owned by another writer: '
        f"pid {os.getpid()} "
    ), owned["message"]
    s.close()
    # A closed adapter's change names it so too; an id kept as it is is named as before.
    with pytest.raises(session_store.Closed) as e:
        s.add_items_sync([user("late")])
    assert str(e.value) == 'session "user:42" (stored as agx-757365723a3432) is closed'
    kept = SessionStoreSession("user-42", root)
    kept.close()
    with pytest.raises(session_store.Closed, match='^session "user-42" is closed$'):
        kept.add_items_sync([user("late")])
    # So does a change that would change nothing, as SQLiteSession's (they passed).
    for change in (lambda: kept.add_items_sync([]), kept.pop_item_sync, kept.clear_session_sync):
        with pytest.raises(session_store.Closed, match='^session "user-42" is closed$'):
            change()
    assert kept.get_items_sync() == []  # reads still answer


def test_adapters_of_one_session_in_one_process_share_its_writer(root):
    async def main():
        first = SessionStoreSession("shared", root)
        await first.add_items([user("one")])
        # A new adapter per request, the earlier one still open: both write, in order.
        second = SessionStoreSession("shared", root.path)
        await second.add_items([user("two")])
        await first.add_items([user("three")])
        assert await second.pop_item() == user("three")
        assert await first.get_items() == [user("one"), user("two")]
        assert root.writer_owner("shared")["pid"] == os.getpid()
        first.close()
        first.close()  # idempotent
        with pytest.raises(session_store.Closed):
            await first.add_items([user("late")])
        await second.add_items([user("four")])  # the other adapter still writes
        second.close()
        # The last close released the lock: a plain writer can open the session now.
        root.open("shared").close()
        # An adapter dropped without close releases its share when collected.
        third = SessionStoreSession("shared", root)
        await third.add_items([user("five")])
        del third
        import gc

        gc.collect()
        root.open("shared").close()

    run(main())


def test_fork_after_item(root):
    async def main():
        s = SessionStoreSession("trunk", root)
        await s.add_items([user("a"), user("b")])
        await s.add_items([user("c")])
        await s.add_items([user("d"), user("e")])
        # After the last item of an add_items call: the log is shared, nothing replaced.
        at_c = await s.afork(2, "at-c")
        assert await at_c.get_items() == [user("a"), user("b"), user("c")]
        assert "history/replace" not in json.dumps(at_c.events())
        # Inside a call's items, by id or by negative index: one replacement trims it.
        by_id = s.fork(s.history()[0]["item_id"])
        assert await by_id.get_items() == [user("a")]
        by_neg = s.fork(-2)
        assert await by_neg.get_items() == [user("a"), user("b"), user("c"), user("d")]
        # The branch is a session of its own; the trunk is unchanged.
        await at_c.add_items([user("branch")])
        assert (await at_c.get_items())[-1] == user("branch")
        assert await s.get_items() == [user(x) for x in "abcde"]
        # After a pop, the fork follows the current items, not the log.
        await s.pop_item()
        tail = s.fork(-1)
        assert await tail.get_items() == [user(x) for x in "abcd"]
        with pytest.raises(IndexError):
            s.fork(10)
        with pytest.raises(session_store.NotFound):
            s.fork("i999")
        with pytest.raises(TypeError):
            s.fork(1.5)
        for branch in (at_c, by_id, by_neg, tail, s):
            branch.close()

    run(main())


def test_fork_after_an_item_another_writer_added(root):
    # Items the adapter did not write (the core API's, the CLI's, an importer's) were
    # refused by fork ("'m1' is not an item id of this adapter"), though history() gives
    # their ids and get_items() and pop_item() serve them (outside testing P3).
    with root.create("imported") as w:
        w.append(
            [
                {"kind": "turn/start"},
                *(
                    {"kind": "message/complete", "payload": {"message": m}}
                    for m in (
                        {"id": "m1", "role": "user", "content": "hello"},
                        {"id": "m2", "role": "assistant", "content": "hi!"},
                    )
                ),
                {"kind": "turn/end", "payload": {"status": "completed"}},
            ],
            operation_id="op1",
            turn_id="t1",
        )
    s = SessionStoreSession("imported", root)
    s.add_items_sync([user("added by the adapter")])
    hello = {"role": "user", "content": "hello"}
    hi = {"role": "assistant", "content": "hi!"}
    assert [h["item_id"] for h in s.history()][:2] == ["m1", "m2"]
    for after, items in (
        (0, [hello]),
        ("m2", [hello, hi]),
        (-1, [hello, hi, user("added by the adapter")]),
    ):
        branch = s.fork(after)
        assert branch.get_items_sync() == items, after
        branch.close()
    s.close()


def test_hostile_items(root):
    async def main():
        s = SessionStoreSession("h", root)
        with pytest.raises(TypeError):
            await s.add_items(["not a dict"])
        # One item given alone: its keys were taken for items ("must be a dict, not str").
        with pytest.raises(TypeError, match=r"^add_items\(\) argument 'items' must be a list of items, not dict$"):
            await s.add_items({"role": "user", "content": "hi"})  # type: ignore[arg-type]
        with pytest.raises(session_store.InvalidInput, match=r"items\[0\]: value is not JSON-able"):
            await s.add_items([{"role": "user", "content": {1, 2}}])
        with pytest.raises(session_store.InvalidInput, match=r"items\[1\]: value is not JSON-able"):
            await s.add_items([user("ok"), {"role": "user", "content": float("nan")}])
        # A key that is not str was stored as a string (it came back changed).
        with pytest.raises(session_store.InvalidInput, match="not str"):
            await s.add_items([{"role": "user", "content": "x", "meta": {7: "seven"}}])
        # A tool output with a lone surrogate, as json.loads gives it from a "\ud800" escape:
        # the item is named (a position in the whole batch's JSON could not be traced back).
        with pytest.raises(session_store.InvalidInput, match=r"items\[1\] holds text that is not UTF-8"):
            await s.add_items([user("ok"), json.loads('{"role": "user", "content": "\\ud800"}')])
        # An id with no UTF-8 form (SQLiteSession's sqlite3 cannot bind it either).
        with pytest.raises(session_store.InvalidInput, match="not UTF-8"):
            SessionStoreSession("\ud800", root)
        with pytest.raises(TypeError, match="session_id must be str"):
            SessionStoreSession(42, root)  # type: ignore[arg-type]
        assert await s.get_items() == []
        # No items, in a list or any other iterable, write nothing.
        await s.add_items([])
        await s.add_items(iter([]))
        # Refused items created no session (so took no writer lock).
        with pytest.raises(session_store.NotFound):
            root.turns("h")
        assert [x for x in root.iter_sessions() if x["session_ref"]["session_id"] == "h"] == []
        big = user("y" * 200_000)
        await s.add_items([big, user("small")])
        assert await s.get_items() == [big, user("small")]
        assert await s.pop_item() == user("small")
        assert await s.get_items(limit=1) == [big]

    run(main())


def test_an_item_holding_the_reserved_id_key_is_refused_not_changed(root):
    async def main():
        s = SessionStoreSession("k", root)
        await s.add_items([user("kept")])
        # Stored, the first came back as {"id": "mine", ...} and the second lost its "id".
        for item in (
            {"role": "user", "content": "c", "sse_item_id": "mine"},
            {"id": "dup", "role": "user", "content": "d", "sse_item_id": "mine2"},
        ):
            with pytest.raises(session_store.InvalidInput, match="sse_item_id"):
                await s.add_items([user("ok"), item])
        assert await s.get_items() == [user("kept")]
        s.close()

    run(main())


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def test_runner_conversation_with_tool_calls(root):
    model = ScriptedModel(
        [
            [function_call("get_weather", {"city": "Paris"}, call_id="call_1")],
            [assistant_message("It is sunny in Paris.", item_id="msg_1")],
            [function_call("get_weather", {"city": "Oslo"}, call_id="call_2")],
            [assistant_message("Oslo is sunny too.", item_id="msg_2")],
        ]
    )
    agent = Agent(name="forecaster", instructions="Answer.", model=model, tools=[get_weather])

    async def main():
        session = SessionStoreSession("conversation", root)
        first = await Runner.run(agent, "Weather in Paris?", session=session)
        assert first.final_output == "It is sunny in Paris."
        second = await Runner.run(agent, "And Oslo?", session=session)
        assert second.final_output == "Oslo is sunny too."
        model.assert_complete()
        items = await session.get_items()
        return items, session

    items, session = run(main())
    kinds = [i.get("type", "message") for i in items]
    assert kinds == [
        "message", "function_call", "function_call_output", "message",
        "message", "function_call", "function_call_output", "message",
    ]
    assert items[0]["content"] == "Weather in Paris?" and items[4]["content"] == "And Oslo?"
    assert items[2]["output"] == "sunny in Paris" and items[6]["output"] == "sunny in Oslo"
    assert items[1]["call_id"] == "call_1" and items[3]["id"] == "msg_1"
    # The second run saw the first run's items from the session.
    second_run_first_call = model.calls[2].input
    assert [i.get("content") for i in second_run_first_call if i.get("role") == "user"] == [
        "Weather in Paris?", "And Oslo?",
    ]
    # A fresh adapter (as after a restart) reads the same conversation; the file verifies.
    session.close()
    assert run(SessionStoreSession("conversation", root.path).get_items()) == items
    assert session_store.verify(os.path.join(root.path, "conversation"))["commits"] >= 2
    assert root.list()["sessions"][0]["preview"] == "Weather in Paris?"


def test_reads_follow_the_session_when_it_is_made_again(root):
    async def main():
        s = SessionStoreSession("again", root)
        await s.add_items([user("a"), user("b")])
        assert await s.get_items(1) == [user("b")]
        s.close()
        root.delete("again")
        reader = SessionStoreSession("again", root)
        assert await reader.get_items() == []
        writer = SessionStoreSession("again", root)
        await writer.add_items([user("c")])
        # The first adapter's kept reader sees the new file, not the deleted one.
        assert await reader.get_items() == [user("c")]
        assert await reader.get_items(5) == [user("c")]
        writer.close()
        reader.close()

    run(main())


def test_root_delete_of_a_session_an_adapter_of_the_process_writes(root):
    # The adapters' shared writer kept the session held: Root.delete waited out its `wait`
    # (10 s by default) and raised Cancelled naming this very process, the session kept.
    async def main():
        s = SessionStoreSession("user-42", root)
        other = SessionStoreSession("user-42", root.path)
        await s.add_items([user("a")])
        root.delete("user-42", wait=0)
        assert [x["session_ref"]["session_id"] for x in root.iter_sessions()] == []
        assert await other.get_items() == []
        await other.add_items([user("b")])  # the adapters write the session anew
        assert await s.get_items() == [user("b")]
        await root.adelete("user-42", wait=0)
        assert await s.get_items() == []
        await s.add_items([user("c")])
        assert await other.get_items() == [user("c")]
        s.close()
        other.close()
        # A plain Session of the process is another writer: still waited for.
        with root.open("user-42"):
            with pytest.raises(session_store.Cancelled, match="still holds it"):
                root.delete("user-42", wait=0)

    run(main())


def test_root_rename_of_a_session_an_adapter_of_the_process_writes(root):
    # The adapters' shared writer kept the session held: Root.rename raised WriterOwned
    # naming this very process, and an adapter has no Session to append the title through.
    async def main():
        s = SessionStoreSession("user-42", root)
        await s.add_items([user("a")])
        root.rename("user-42", "Trip to Rome")
        await root.arename("user-42", "Trip to Rome and Naples")
        await s.add_items([user("b")])
        assert await s.get_items() == [user("a"), user("b")]
        [summary] = root.list()["sessions"]
        assert summary["title"] == "Trip to Rome and Naples"
        s.close()

    run(main())


def test_root_rename_and_delete_while_adapters_of_the_process_write(root):
    # Root.rename and Root.delete closed the adapters' shared writer, and an adapter
    # adding items in another thread opened it again before the native call: the rename
    # raised WriterOwned naming this very process (9-13 of 20 times), the delete waited out
    # its `wait` and raised Cancelled naming it (outside testing, sessions 36 and 37).
    import threading

    conv = SessionStoreSession("c", root)
    conv.add_items_sync([user("x")])
    stop = threading.Event()
    adapter_errors: list[BaseException] = []

    def add() -> None:
        while not stop.is_set():
            try:
                conv.add_items_sync([user("x")])
            except BaseException as e:  # noqa: BLE001 - every failure is the defect
                adapter_errors.append(e)
                return

    threads = [threading.Thread(target=add) for _ in range(2)]
    for t in threads:
        t.start()
    deleted = 0
    try:
        for i in range(20):
            root.rename("c", f"title {i}")
        for _ in range(5):
            # A delete right after the last may find the session not made again yet.
            try:
                root.delete("c", wait=2)
                deleted += 1
            except session_store.NotFound:
                pass
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert adapter_errors == []
    assert deleted >= 1
    conv.add_items_sync([user("after")])
    assert conv.get_items_sync()[-1] == user("after")
    conv.close()


def test_a_collected_adapter_never_deadlocks_the_registry(tmp_path):
    """An adapter collected while its thread holds the writers' registry lock (a collection
    can run at any allocation) defers its release instead of waiting on that lock forever
    (it did: the finalizer took the same non-reentrant lock); the release happens as the
    lock is let go."""
    script = """
import sys
import session_store
from session_store import agents
root = session_store.Root(sys.argv[1])
adapter = agents.SessionStoreSession("gc", root)
adapter.add_items_sync([{"role": "user", "content": "hi"}])
agents._lock_registry()  # as this thread's own registry work does
del adapter  # its finalizer runs here, as a collection inside that work would run it
agents._unlock_registry()
root.open("gc").close()  # the collected adapter's writer was released with the lock
print("released")
"""
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "root")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "released"


FORKED_CHILD = r"""
import asyncio, json, os, signal, sys
from session_store.agents import SessionStoreSession

path = sys.argv[1]
parent = SessionStoreSession("forked", path)
asyncio.run(parent.add_items([{"role": "user", "content": "parent"}]))

def add(adapter, text):
    try:
        asyncio.run(adapter.add_items([{"role": "user", "content": text}]))
        return "ok"
    except Exception as e:
        return type(e).__name__

def before(out):  # in the child
    global inherited, early
    inherited = parent  # the parent's adapter, copied by fork
    early = SessionStoreSession("forked", path)
    out["inherited"] = add(inherited, "refused")
    out["early"] = add(early, "refused too")

def release():  # in the parent
    parent.close()

def after(out):  # in the child, once the parent has closed its adapter
    out["late"] = add(early, "child")
    out["new"] = add(SessionStoreSession("forked", path), "child again")
    inherited.close()  # lets the parent's copy go; the child's writer stays usable
    out["after"] = add(early, "child last")
    out["items"] = [i["content"] for i in asyncio.run(early.get_items())]
    early.close()
""" + FORK_HANDSHAKE


def test_a_forked_child_writes_once_the_parent_let_the_session_go(tmp_path):
    # A child made by os.fork() inherited the registry of shared writers, holding the
    # parent's writer: every adapter of that session in the child raised WriterOwned for
    # the child's whole life, also after the parent had closed it (Root.open worked).
    out = run_script(FORKED_CHILD, tmp_path / "root")
    child = json.loads(out.stdout)
    assert child["inherited"] == "WriterOwned" and child["early"] == "WriterOwned"
    assert child["late"] == "ok" and child["new"] == "ok" and child["after"] == "ok"
    assert child["items"] == ["parent", "child", "child again", "child last"]


FORK_WHILE_ADDING = r"""
import os, signal, sys, threading
import session_store
from session_store.agents import SessionStoreSession

conv = SessionStoreSession("c", sys.argv[1])
conv.add_items_sync([{"role": "user", "content": "x"}])
stop = False

def add():
    while not stop:
        conv.add_items_sync([{"role": "user", "content": "x"}])

thread = threading.Thread(target=add)
thread.start()
outcomes = []
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        signal.alarm(5)  # a child that hangs is ended by SIGALRM
        try:
            conv.add_items_sync([{"role": "user", "content": "child"}])
            os._exit(1)
        except session_store.WriterOwned:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    outcomes.append("hung" if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
stop = True
thread.join()
print(outcomes.count(0), outcomes.count("hung"))
"""


def test_an_inherited_adapter_raises_writer_owned_while_the_parent_adds(tmp_path):
    # The adapters of a session share one lock; a child made by os.fork() while a parent
    # thread held it (inside add_items_sync) inherited it held by a thread that does not
    # exist there: the child's adapter waited forever (20 of 20 forks) instead of raising
    # WriterOwned as the module says.
    out = run_script(FORK_WHILE_ADDING, tmp_path / "root")
    assert out.stdout.split() == ["20", "0"]


def test_any_str_is_a_session_id(root):
    """SQLiteSession takes any str as a session id; the store's own ids (no ':', '/', …, at
    most 255 bytes) stay the session's id, the others are mapped without collisions."""
    from session_store.agents import store_id_of

    weird = [
        "user:42", "alice@example.com", "a/b", "../x", "", " pad ", "CON", "q?", "é:ü",
        "x" * 300, "ü" * 200, "line\nbreak",
    ]

    async def main():
        for n, sid in enumerate(weird):
            s = SessionStoreSession(sid, root)
            assert s.session_id == sid
            await s.add_items([user(f"hello {n}")])
            s.close()
        for n, sid in enumerate(weird):
            s = SessionStoreSession(sid, root)
            assert await s.get_items() == [user(f"hello {n}")], sid
            assert s.events()["commits"]
            s.close()

    run(main())
    # The store's ids map to themselves (sessions stored before are still found) ...
    for sid in ["alice@example.com", "user-42", "agx-6869", "agx-zz", "agh-1", "agx-ff"]:
        assert store_id_of(sid) == sid
    assert store_id_of("user:42") == "agx-757365723a3432"
    assert store_id_of("") == "agx-"  # the empty id: its (empty) hex
    assert store_id_of("x" * 300).startswith("agh-") and len(store_id_of("x" * 300)) == 68
    # ... and an id of the mapped forms that another id maps to is mapped itself.
    for sid in ["agx-757365723a3432", "agx-", "agh-" + "0" * 64]:
        assert store_id_of(sid) != sid
        assert store_id_of(store_id_of(sid)) != store_id_of(sid)
    ids = weird + [store_id_of(w) for w in weird] + ["agx-757365723a3432", "agh-" + "0" * 64]
    assert len({store_id_of(i) for i in ids}) == len(set(ids))
    stored = {x["session_ref"]["session_id"] for x in root.iter_sessions()}
    assert stored == {store_id_of(w) for w in weird}
    assert "alice@example.com" in stored


def test_fork_to_any_str_id(root):
    s = SessionStoreSession("user:1", root)
    s.add_items_sync([user("a"), user("b")])
    branch = s.fork(after_item=0, new_session_id="user:1/branch")
    assert branch.session_id == "user:1/branch"
    assert branch.get_items_sync() == [user("a")]
    assert SessionStoreSession("user:1/branch", root).get_items_sync() == [user("a")]
    # Forked again onto it: named as given ("session agx-7573… already exists" before).
    with pytest.raises(session_store.AlreadyExists, match="^session 'user:1/branch' already"):
        s.fork(after_item=0, new_session_id="user:1/branch")
    s.close()
    branch.close()


def test_close_lets_go_of_the_read_connections(root):
    # A closed adapter kept its reader's connections (about five file descriptors) for as
    # long as it lived: 50 closed adapters kept in a list held 250 descriptors.
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    kept = []
    for i in range(50):
        adapter = SessionStoreSession(f"s{i}", root)
        adapter.add_items_sync([user("x")])
        assert adapter.get_items_sync() == [user("x")]
        adapter.close()
        kept.append(adapter)
    assert open_fds() < before + 25
    assert kept[0].get_items_sync() == [user("x")]  # reads still answer


def test_a_cancelled_change_has_ended_when_the_caller_sees_the_cancellation(root):
    # add_items ran in a bare worker thread: the caller saw CancelledError with the commit
    # still under way (0 items read right after, all of them seconds later) or, when the
    # thread had not started, never made (outside testing, session 38).
    items = [user("x" * 2000 + str(i)) for i in range(3000)]

    async def main():
        s = SessionStoreSession("cancel", root)
        task = asyncio.create_task(s.add_items(items))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(await s.get_items()) == len(items)
        # Cancelled before its thread could start, it still ends before the caller hears.
        task = asyncio.create_task(s.pop_item())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(await s.get_items()) == len(items) - 1
        s.close()

    run(main())


def test_an_item_refused_is_named_by_its_index_among_the_items(root):
    # The store counted the batch's events, the adapter's turn start first: the third item
    # was "events[3]".
    deep: object = "leaf"
    for _ in range(600):
        deep = [deep]
    s = SessionStoreSession("user:deep", root)
    with pytest.raises(session_store.InvalidInput) as e:
        s.add_items_sync([user("a"), user("b"), {"role": "tool", "content": deep}])
    text = str(e.value)
    assert text.startswith('session "user:deep" (stored as '), text
    assert "items[2] payload nests objects and arrays more than 512 deep" in text, text
    assert s.get_items_sync() == []
    s.close()
