"""SessionStoreSaver under a real LangGraph graph: a StateGraph with a messages channel,
interrupted and resumed from its checkpoint, time-travelled to an earlier checkpoint,
copied, reopened after a restart, and what the log holds (grown lists stored as suffixes)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import subprocess
import sys

from typing import Annotated

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, MessagesState, StateGraph
from typing_extensions import TypedDict

import session_store
from session_store.agents import SessionStoreSession
from session_store.langgraph import SessionStoreSaver, session_id_of, thread_id_of

from conftest import FORK_HANDSHAKE, lose_the_create_race, run_script


def echo(state: MessagesState) -> dict:
    """The model: answers the last message with its text reversed."""
    last = state["messages"][-1]
    return {"messages": [AIMessage(content=f"echo {last.content[::-1]}")]}


def review(state: MessagesState) -> dict:
    return {"messages": [AIMessage(content=f"reviewed {len(state['messages'])}")]}


def graph(saver: SessionStoreSaver, *, interrupt: bool = False):
    builder = StateGraph(MessagesState)
    builder.add_node("echo", echo)
    builder.add_node("review", review)
    builder.add_edge(START, "echo")
    builder.add_edge("echo", "review")
    builder.add_edge("review", END)
    return builder.compile(
        checkpointer=saver, interrupt_before=["review"] if interrupt else None
    )


def contents(state) -> list[str]:
    return [m.content for m in state.values["messages"]]


def config(thread: str, **extra) -> dict:
    return {"configurable": {"thread_id": thread, **extra}}


@pytest.fixture
def saver(root):
    with SessionStoreSaver(root) as saver:
        yield saver


class SerializerOfItsOwn:
    """A serializer that writes no msgpack (as an encrypting one): the saver tells
    a grown list by its items serialized one by one, not by the bytes of one array."""

    def __init__(self) -> None:
        self.inner = JsonPlusSerializer()

    def dumps_typed(self, obj):
        kind, data = self.inner.dumps_typed(obj)
        return "own+" + kind, data

    def loads_typed(self, data):
        kind, raw = data
        return self.inner.loads_typed((kind.removeprefix("own+"), raw))


@pytest.fixture(params=["msgpack", "own"])
def list_serde(request):
    """The serializer of the list tests: LangGraph's default, and one of its own."""
    return None if request.param == "msgpack" else SerializerOfItsOwn()


@pytest.fixture
def list_saver(root, list_serde):
    with SessionStoreSaver(root, serde=list_serde) as saver:
        yield saver


def test_the_adapters_reprs_name_their_root(root, saver) -> None:
    # The saver's was object.__repr__'s "<...SessionStoreSaver object at 0x7f...>", while
    # every other object of the package names what it is of.
    assert repr(saver) == f"<SessionStoreSaver in {root.path!r}>"
    assert repr(SessionStoreSession("s", root)) == f"<SessionStoreSession 's' in {root.path!r}>"
    assert repr(root) == f"<session_store.Root {root.path!r}>"
    with root.create("w") as session:
        assert repr(session) == "<session_store.Session 'w'>"
    assert repr(root.reader("w")) == "<session_store.SessionReader 'w'>"


def test_a_conversation_is_stored_and_read_back_after_a_restart(root, saver) -> None:
    g = graph(saver)
    g.invoke({"messages": [HumanMessage(content="hello")]}, config("chat"))
    g.invoke({"messages": [HumanMessage(content="again")]}, config("chat"))
    expected = ["hello", "echo olleh", "reviewed 2", "again", "echo niaga", "reviewed 5"]
    assert contents(g.get_state(config("chat"))) == expected
    saver.close()

    # A new process's view: a fresh root object and saver over the same folder.
    with SessionStoreSaver(session_store.Root(root.path)) as reopened:
        g2 = graph(reopened)
        assert contents(g2.get_state(config("chat"))) == expected
        history = list(g2.get_state_history(config("chat")))
        # Per invoke: the input, its step 0, echo, review; the same as LangGraph's own saver.
        assert [len(s.values.get("messages", [])) for s in history] == [6, 5, 4, 3, 3, 2, 1, 0]
        reference = graph(InMemorySaver())
        for text in ("hello", "again"):
            reference.invoke({"messages": [HumanMessage(content=text)]}, config("chat"))
        expected_history = list(reference.get_state_history(config("chat")))
        assert [(s.next, s.metadata["step"], s.metadata["source"]) for s in history] == [
            (s.next, s.metadata["step"], s.metadata["source"]) for s in expected_history
        ]
        g2.invoke({"messages": [HumanMessage(content="third")]}, config("chat"))
        assert contents(g2.get_state(config("chat")))[-3:] == [
            "third",
            "echo driht",
            "reviewed 8",
        ]
    assert root.verify(session_id_of("chat"))["events"] > 0


def test_an_interrupted_run_resumes_from_its_checkpoint(root, saver) -> None:
    g = graph(saver, interrupt=True)
    g.invoke({"messages": [HumanMessage(content="stop here")]}, config("paused"))
    state = g.get_state(config("paused"))
    assert state.next == ("review",)
    assert contents(state) == ["stop here", "echo ereh pots"]
    saver.close()

    with SessionStoreSaver(root) as later:
        g2 = graph(later, interrupt=True)
        assert g2.get_state(config("paused")).next == ("review",)
        g2.invoke(None, config("paused"))  # resume: runs the interrupted node
        state = g2.get_state(config("paused"))
        assert state.next == ()
        assert contents(state) == ["stop here", "echo ereh pots", "reviewed 2"]


def test_time_travel_forks_from_an_earlier_checkpoint(saver) -> None:
    g = graph(saver)
    g.invoke({"messages": [HumanMessage(content="one")]}, config("tt"))
    g.invoke({"messages": [HumanMessage(content="two")]}, config("tt"))
    history = list(g.get_state_history(config("tt")))
    # The checkpoint after the first invoke ended (3 messages, nothing next).
    after_first = next(s for s in history if len(s.values.get("messages", [])) == 3)
    assert contents(after_first) == ["one", "echo eno", "reviewed 2"]

    # Replaying from there with new input branches off it.
    g.invoke({"messages": [HumanMessage(content="other")]}, after_first.config)
    latest = g.get_state(config("tt"))
    assert contents(latest) == [
        "one", "echo eno", "reviewed 2", "other", "echo rehto", "reviewed 5"
    ]
    assert latest.parent_config is not None

    # Both branches stay readable: the old "two" run is still in the history.
    everything = list(g.get_state_history(config("tt")))
    assert len(everything) == len(history) + 4
    ends = {tuple(contents(s)) for s in everything if len(s.values.get("messages", [])) == 6}
    assert ends == {
        ("one", "echo eno", "reviewed 2", "two", "echo owt", "reviewed 5"),
        ("one", "echo eno", "reviewed 2", "other", "echo rehto", "reviewed 5"),
    }

    # Reading the earlier checkpoint by id gives it back unchanged.
    assert contents(g.get_state(after_first.config)) == ["one", "echo eno", "reviewed 2"]


def test_grown_message_lists_are_stored_as_their_suffix(root, list_saver, list_serde) -> None:
    g = graph(list_saver)
    long = "x" * 5000  # above the inline threshold: a content part
    for i in range(5):
        g.invoke({"messages": [HumanMessage(content=f"{i} {long}")]}, config("grow"))
    assert len(g.get_state(config("grow")).values["messages"]) == 15

    records = []  # (base version, value) of each new version of "messages"
    after = 0
    while True:
        page = root.events(session_id_of("grow"), after=after)
        for commit in page["commits"]:
            values = [e["payload"] for e in commit["events"] if e["kind"] == "langgraph/value"]
            for event in commit["events"]:
                after = event["seq"]
                if event["kind"] == "langgraph/checkpoint":
                    names = event["payload"]["values"]
                    assert len(names) == len(values)
                    records += [(b, v) for (ch, _, b), v in zip(names, values) if ch == "messages"]
        if not page["truncated"]:
            break
    # One record per new version of the channel: the first whole, every later one only
    # the appended messages on top of the previous version.
    assert len(records) == 15
    assert records[0][0] is None
    assert all(base is not None for base, _ in records[1:])
    # Each message is stored once: every record holds the one message its step added.
    for _, record in records:
        value = list_saver.serde.loads_typed((record["t"], base64.b64decode(record["b"])))
        assert len(value) == 1


def test_a_thread_another_process_creates_meanwhile_is_opened(root, saver, monkeypatch):
    # Outside testing P3: two processes saving a new thread at once, the one whose create
    # came second raised AlreadyExists (29 of 30 races) instead of opening it.
    from langgraph.checkpoint.base import empty_checkpoint

    lose_the_create_race(monkeypatch)
    saved = saver.put(config("raced"), empty_checkpoint(), {"step": 1}, {})
    assert saver.get_tuple(saved) is not None


def test_a_refused_put_leaves_no_base_outside_the_log(root, saver) -> None:
    # A put whose metadata the serializer refuses stores nothing; the list it would have
    # grown must not become the base of the next checkpoint's suffix (it is not in the log).
    from langgraph.checkpoint.base import empty_checkpoint

    def checkpoint(messages: list[str], version: str) -> dict:
        c = empty_checkpoint()
        c["channel_values"] = {"messages": messages}
        c["channel_versions"] = {"messages": version}
        return c

    first = saver.put(config("refused"), checkpoint(["a"], "1"), {"step": 1}, {"messages": "1"})
    before = root.events(session_id_of("refused"))["commits"]
    with pytest.raises(TypeError):
        saver.put(first, checkpoint(["a", "b"], "2"), {"bad": object()}, {"messages": "2"})
    assert root.events(session_id_of("refused"))["commits"] == before
    third = saver.put(first, checkpoint(["a", "b", "c"], "3"), {"step": 3}, {"messages": "3"})
    assert saver.get_tuple(third).checkpoint["channel_values"]["messages"] == ["a", "b", "c"]
    with SessionStoreSaver(root) as fresh:
        assert fresh.get_tuple(third).checkpoint["channel_values"]["messages"] == ["a", "b", "c"]


def test_a_list_grown_from_equal_but_different_items_reads_back_exactly(
    root, list_saver, list_serde
) -> None:
    # A list whose head compares equal (==) to the version the saver last wrote but is not
    # the same values (1 == True == 1.0, {"n": 1} == {"n": 1.0}) is no suffix of it: stored
    # as one, a fresh saver read the old head back ([1, {"n": 1}, 2] for [True, {"n": 1.0},
    # 2]), the writing saver its cached list.
    from langgraph.checkpoint.base import empty_checkpoint

    def checkpoint(items: list, version: str) -> dict:
        c = empty_checkpoint()
        c["channel_values"] = {"items": items}
        c["channel_versions"] = {"items": version}
        return c

    first = list_saver.put(config("types"), checkpoint([1, {"n": 1}], "1"), {}, {"items": "1"})
    grown = [True, {"n": 1.0}, 2]
    second = list_saver.put(first, checkpoint(grown, "2"), {}, {"items": "2"})
    read = list_saver.get_tuple(second).checkpoint["channel_values"]["items"]
    assert repr(read) == repr(grown)
    with SessionStoreSaver(root, serde=list_serde) as fresh:
        read = fresh.get_tuple(second).checkpoint["channel_values"]["items"]
    assert repr(read) == repr(grown)
    # A list that did only grow (its head the same values) is still stored as its suffix.
    third = list_saver.put(second, checkpoint([*grown, 3], "3"), {}, {"items": "3"})
    with SessionStoreSaver(root, serde=list_serde) as fresh:
        assert repr(fresh.get_tuple(third).checkpoint["channel_values"]["items"]) == repr(
            [*grown, 3]
        )
    commits = root.events(session_id_of("types"))["commits"]
    names = [
        e["payload"]["values"] for c in commits for e in c["events"]
        if e["kind"] == "langgraph/checkpoint"
    ]
    assert [n[0][2] for n in names] == [None, None, "2"]


def test_an_item_changed_in_place_is_stored_with_the_list(root, list_saver, list_serde) -> None:
    # A node that edits an earlier message in place and adds one (outside testing, session
    # 35): the saver kept the list it last stored as those same objects, saw the head
    # "unchanged" and stored the new message alone; its own reads showed the edit, a fresh
    # saver (another process) read the old text.
    def bot(state: MessagesState) -> dict:
        if state["messages"][-1].content == "fix it":
            state["messages"][-2].content += " [corrected]"
            return {"messages": [AIMessage(content="fixed")]}
        return {"messages": [AIMessage(content="first answer")]}

    builder = StateGraph(MessagesState)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    g = builder.compile(checkpointer=list_saver)
    g.invoke({"messages": [("user", "hi")]}, config("edited"))
    g.invoke({"messages": [("user", "fix it")]}, config("edited"))
    expected = ["hi", "first answer [corrected]", "fix it", "fixed"]
    assert contents(g.get_state(config("edited"))) == expected
    with SessionStoreSaver(root, serde=list_serde) as fresh:
        assert contents(builder.compile(checkpointer=fresh).get_state(config("edited"))) == expected
    # A list that only grew is still stored as its suffix after that.
    g.invoke({"messages": [("user", "more")]}, config("edited"))
    # The last checkpoint's commit (a task's writes, saved from a background thread, may
    # land after it).
    names = [
        e["payload"]["values"]
        for c in root.events(session_id_of("edited"))["commits"]
        for e in c["events"]
        if e["kind"] == "langgraph/checkpoint"
    ][-1:]
    assert [n[2] for n in names[0] if n[0] == "messages"] != [None]


def test_a_read_state_changed_by_its_caller_changes_nothing_read_later(root, saver) -> None:
    # get_tuple handed out the objects the saver kept as the base of the next put: a caller
    # that changed its copy changed what every later read of that saver answered (a fresh
    # saver still read the log), and a put grown from them was stored without the change.
    g = graph(saver)
    g.invoke({"messages": [("user", "hi")]}, config("scribbled"))
    stored = contents(g.get_state(config("scribbled")))
    snapshot = g.get_state(config("scribbled"))
    snapshot.values["messages"][1].content = "scribbled by the caller"
    tuple_ = saver.get_tuple(config("scribbled"))
    tuple_.checkpoint["channel_values"]["messages"][0].content = "also scribbled"
    assert contents(g.get_state(config("scribbled"))) == stored
    with SessionStoreSaver(root) as fresh:
        assert contents(graph(fresh).get_state(config("scribbled"))) == stored


def test_copy_thread_is_a_fork_of_the_session(root, saver) -> None:
    g = graph(saver)
    g.invoke({"messages": [HumanMessage(content="source")]}, config("src"))
    saver.copy_thread("src", "dst")
    assert contents(g.get_state(config("dst"))) == contents(g.get_state(config("src")))
    summary = next(
        s for s in root.iter_sessions() if s["session_ref"]["session_id"] == session_id_of("dst")
    )
    assert summary["origin"] == "fork"
    assert summary["parent_id"] == session_id_of("src")
    # A target that exists is named as the thread it is (the message named only "lg-dst").
    with pytest.raises(session_store.AlreadyExists, match="^thread 'dst' already exists"):
        saver.copy_thread("src", "dst")

    # The copy continues on its own; the source is unchanged.
    g.invoke({"messages": [HumanMessage(content="only in dst")]}, config("dst"))
    assert len(contents(g.get_state(config("dst")))) == 6
    assert len(contents(g.get_state(config("src")))) == 3

    # Deleting the source leaves the copy whole.
    saver.delete_thread("src")
    assert g.get_state(config("src")).values == {}
    assert len(contents(g.get_state(config("dst")))) == 6


def test_prune_and_delete_for_runs_hide_checkpoints(saver) -> None:
    g = graph(saver)
    g.invoke({"messages": [HumanMessage(content="a")]}, config("p"))
    g.invoke({"messages": [HumanMessage(content="b")]}, config("p"))
    assert len(list(saver.list(config("p")))) == 8
    saver.prune(["p"])
    kept = list(saver.list(config("p")))
    assert len(kept) == 1
    assert [m.content for m in kept[0].checkpoint["channel_values"]["messages"]][-1] == "reviewed 5"
    assert contents(g.get_state(config("p")))[-1] == "reviewed 5"

    run = "5b6e0c52-0000-4000-8000-000000000001"
    run_config = {**config("r"), "metadata": {"run_id": run}}
    g.invoke({"messages": [HumanMessage(content="c")]}, run_config)
    assert {t.metadata.get("run_id") for t in saver.list(config("r"))} == {run}
    saver.delete_for_runs([run])
    assert list(saver.list(config("r"))) == []
    assert g.get_state(config("r")).values == {}
    assert len(list(saver.list(config("p")))) == 1  # other runs untouched


def delta_graph(saver, snapshot_frequency: int, other_frequency: int = 0):
    """A graph whose ``log`` is a ``DeltaChannel`` (and ``other`` another, stored every
    ``other_frequency`` updates, when given): LangGraph stores such a value every
    ``snapshot_frequency`` updates and rebuilds it from the ancestors' writes otherwise."""

    def joined(state, writes):
        return [*state, *(item for write in writes for item in write)]

    # The functional form: its types are read now, not as strings in this module's scope.
    fields = {
        "log": Annotated[list, DeltaChannel(joined, snapshot_frequency=snapshot_frequency)],
        "plain": list,
    }
    if other_frequency:
        fields["other"] = Annotated[list, DeltaChannel(joined, snapshot_frequency=other_frequency)]
    State = TypedDict("State", fields)  # type: ignore[misc]

    def step(state):
        update = {"log": [f"step{len(state['log'])}"], "plain": [*state.get("plain", []), "p"]}
        if other_frequency:
            update["other"] = ["o"]
        return update

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


def test_prune_keeps_what_a_delta_channel_is_rebuilt_from(saver) -> None:
    """Outside testing, session 43: ``prune`` kept only the latest checkpoint, whose
    ``DeltaChannel`` value is rebuilt from its ancestors' writes, and the value read back
    empty with no error (LangGraph's ``prune`` warns of it). It keeps the ancestors back to
    the first that stores every such channel, and each checkpoint it keeps reads as
    LangGraph's own InMemorySaver reads it (the first fix kept the ancestors one channel
    needed, which read another empty: the re-test)."""
    expected = ["user0", "step1", "user1", "step3", "user2", "step5", "user3", "step7"]
    for thread, frequency in (("rare", 100), ("often", 3)):
        g = delta_graph(saver, frequency)
        for i in range(4):
            g.invoke({"log": [f"user{i}"]}, config(thread))
        assert g.get_state(config(thread)).values["log"] == expected
        before = len(list(saver.list(config(thread))))
        saver.prune([thread])
        left = len(list(saver.list(config(thread))))
        assert g.get_state(config(thread)).values["log"] == expected, thread
        if frequency == 100:
            assert left == before  # no stored value since the first: every write is needed
        else:
            assert 1 < left < before
        g.invoke({"log": ["user4"]}, config(thread))
        assert g.get_state(config(thread)).values["log"] == [*expected, "user4", "step9"]

    # Two channels stored at different steps: every checkpoint kept reads right.
    reference = InMemorySaver()
    ours, theirs = delta_graph(saver, 3, 4), delta_graph(reference, 3, 4)
    for i in range(9):
        for g in (ours, theirs):
            g.invoke({"log": [f"user{i}"]}, config("two"))
    by_step = {t.metadata["step"]: t.checkpoint["id"] for t in reference.list(config("two"))}
    saver.prune(["two"])
    kept = list(saver.list(config("two")))
    assert 1 < len(kept) < len(by_step)
    for t in kept:
        step = t.metadata["step"]
        theirs_at = theirs.get_state(config("two", checkpoint_id=by_step[step])).values
        assert ours.get_state(t.config).values == theirs_at, step


def test_delete_for_runs_refuses_to_cut_what_a_delta_channel_is_rebuilt_from(saver) -> None:
    """Deleting an earlier run's checkpoints left a later state's ``DeltaChannel`` value
    short (LangGraph's ``delete_for_runs`` warns of it; outside testing, session 43):
    refused, nothing hidden; the later runs, or all of them, are deleted."""
    expected = ["user0", "step1", "user1", "step3", "user2", "step5", "user3", "step7"]
    g = delta_graph(saver, 3)
    runs = [f"5b6e0c52-0000-4000-8000-00000000010{i}" for i in range(4)]
    for i, run in enumerate(runs):
        g.invoke({"log": [f"user{i}"]}, {**config("runs"), "metadata": {"run_id": run}})
    before = len(list(saver.list(config("runs"))))
    with pytest.raises(session_store.InvalidInput, match="rebuilds its DeltaChannel values"):
        saver.delete_for_runs(runs[:1])
    assert len(list(saver.list(config("runs")))) == before
    state = g.get_state(config("runs")).values
    assert state["log"] == expected and state["plain"] == ["p"] * 4
    # The newest run: no kept checkpoint depends on it.
    saver.delete_for_runs(runs[3:])
    assert {t.metadata.get("run_id") for t in saver.list(config("runs"))} == set(runs[:3])
    assert g.get_state(config("runs")).values["log"] == expected[:6]
    saver.delete_for_runs(runs)
    assert list(saver.list(config("runs"))) == []


def test_a_delta_channel_no_node_writes_blocks_no_prune_or_delete(saver) -> None:
    """A ``DeltaChannel`` declared and never written (no version, nothing to rebuild) kept
    every checkpoint from ``prune`` and refused every ``delete_for_runs`` (re-test, session
    43): it is named in the metadata's counters all the same."""

    def joined(state, writes):
        return [*state, *(item for write in writes for item in write)]

    State = TypedDict(  # type: ignore[misc]
        "State",
        {"plain": list, "errors": Annotated[list, DeltaChannel(joined, snapshot_frequency=3)]},
    )
    builder = StateGraph(State)
    builder.add_node("step", lambda state: {"plain": [*state.get("plain", []), "p"]})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    g = builder.compile(checkpointer=saver)
    runs = [f"5b6e0c52-0000-4000-8000-00000000020{i}" for i in range(3)]
    for thread in ("pruned", "deleted"):
        for run in runs:
            g.invoke({"plain": []}, {**config(thread), "metadata": {"run_id": run}})
    saver.prune(["pruned"])
    assert len(list(saver.list(config("pruned")))) == 1
    assert g.get_state(config("pruned")).values["plain"] == ["p"]
    before = len(list(saver.list(config("deleted"))))
    saver.delete_for_runs(runs[:1])
    assert len(list(saver.list(config("deleted")))) < before
    assert g.get_state(config("deleted")).values["plain"] == ["p"]


def test_list_is_newest_first_across_namespaces_and_threads(root, saver) -> None:
    """As SqliteSaver (``ORDER BY checkpoint_id DESC``): listed thread by thread and
    namespace by namespace, ``limit`` took other checkpoints, and ``list(None, limit=1)``
    an older thread's (outside testing, session 43)."""
    child = StateGraph(MessagesState)
    child.add_node("echo", echo)
    child.add_edge(START, "echo")
    child.add_edge("echo", END)
    parent = StateGraph(MessagesState)
    parent.add_node("child", child.compile())
    parent.add_node("review", review)
    parent.add_edge(START, "child")
    parent.add_edge("child", "review")
    parent.add_edge("review", END)
    g = parent.compile(checkpointer=saver)
    for thread in ("zzz", "aaa"):
        g.invoke({"messages": [HumanMessage(content="hi")]}, config(thread))
    everything = list(saver.list(None))
    ids = [t.config["configurable"]["checkpoint_id"] for t in everything]
    assert ids == sorted(ids, reverse=True)
    assert {t.config["configurable"]["checkpoint_ns"] != "" for t in everything} == {True, False}
    assert next(saver.list(None, limit=1)).config["configurable"]["thread_id"] == "aaa"
    one_thread = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config("aaa"))]
    assert one_thread == sorted(one_thread, reverse=True)
    assert [
        t.config["configurable"]["checkpoint_id"] for t in saver.list(config("aaa"), limit=3)
    ] == one_thread[:3]


def test_long_thread_ids_map_to_their_hash_and_are_listed_by_their_log(root, saver) -> None:
    # A safe id of 201..=252 characters fits as "lg-<id>" (it was hex-encoded to 400+
    # bytes and refused as an "invalid session id" the caller never gave).
    for thread in ["a" * 201, "b" * 252, "é" * 62, "x/" * 62]:
        sid = session_id_of(thread)
        root.create(sid).close()
        assert thread_id_of(sid) == thread
    g = graph(saver)
    g.invoke({"messages": [HumanMessage(content="long")]}, config("c" * 240))
    assert contents(g.get_state(config("c" * 240)))[0] == "long"
    # Longer ones go to "lgh-<SHA-256>" and run (they were refused with InvalidInput):
    # the thread id is in the log, so list(None) names them.
    long = ["a" * 253, "é" * 63, "x/" * 63, "tenant:acme/user:" + "ü" * 2000]
    for n, thread in enumerate(long):
        sid = session_id_of(thread)
        assert sid == "lgh-" + hashlib.sha256(thread.encode()).hexdigest()
        assert thread_id_of(sid) is None  # not given back by the id alone
        g.invoke({"messages": [HumanMessage(content=f"long {n}")]}, config(thread))
        assert contents(g.get_state(config(thread)))[0] == f"long {n}"
    listed = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
    assert listed == {"c" * 240, *long}
    # Its first commit names it once; a fresh saver reads and lists it too.
    named = [
        e for e in root.events(session_id_of(long[3]))["commits"][0]["events"]
        if e["kind"] == "langgraph/thread"
    ]
    assert [e["payload"] for e in named] == [{"id": long[3]}]
    g.invoke({"messages": [HumanMessage(content="again")]}, config(long[3]))
    assert sum(
        e["kind"] == "langgraph/thread"
        for c in root.events(session_id_of(long[3]))["commits"]
        for e in c["events"]
    ) == 1
    fresh = SessionStoreSaver(root)
    assert {t.config["configurable"]["thread_id"] for t in fresh.list(None)} == listed
    # A copy to a long id is listed as its own thread (its log named the source).
    copy = "copy/" + "z" * 300
    fresh.copy_thread(long[0], copy)
    listed = [t.config["configurable"]["thread_id"] for t in fresh.list(None)]
    assert copy in listed and listed.count(long[0]) == listed.count(copy)
    assert contents(graph(fresh).get_state(config(copy)))[0] == "long 0"
    fresh.delete_thread(long[0])
    assert fresh.get_tuple(config(long[0])) is None
    assert contents(graph(fresh).get_state(config(copy)))[0] == "long 0"
    # A session of the hashed form that names another thread, or none, is no thread's.
    root.create("lgh-" + "0" * 64).close()
    assert long[0] not in {t.config["configurable"]["thread_id"] for t in fresh.list(None)}
    fresh.close()
    # A thread id that is not UTF-8: InvalidInput naming the thread id, nothing written.
    with pytest.raises(session_store.InvalidInput, match="thread id") as refused:
        g.invoke({"messages": [HumanMessage(content="no")]}, config("\ud800"))
    assert "session id" not in str(refused.value)


def test_delete_thread_while_another_saver_of_the_process_holds_its_writer(root) -> None:
    # Two savers of one root in one process (two graphs, a saver per request) share a
    # thread's writer: deleting through the other one waited 10 s for it and raised
    # Cancelled naming this process.
    a, b = SessionStoreSaver(root), SessionStoreSaver(root)
    g = graph(a)
    g.invoke({"messages": [HumanMessage(content="x")]}, config("shared"))
    assert root.writer_owner(session_id_of("shared")) is not None
    b.delete_thread("shared")
    for saver in (a, b):
        assert saver.get_tuple(config("shared")) is None
    # The first saver writes the thread anew.
    g.invoke({"messages": [HumanMessage(content="y")]}, config("shared"))
    again = contents(graph(b).get_state(config("shared")))
    assert again[0] == "y" and "x" not in again, again
    a.close()
    b.close()


def test_a_delete_waiting_for_another_process_holds_up_no_other_thread(root, saver) -> None:
    """delete_thread waited for another process's writer (Root.delete's 10 s) holding the
    saver's lock: every call on any other thread of the saver waited with it; and
    cancelling adelete_thread did not end its wait, so the thread was deleted once that
    process let go (outside testing, session 36)."""
    import threading
    import time

    g = graph(saver)
    for thread in ("held", "kept", "free"):
        g.invoke({"messages": [HumanMessage(content=thread)]}, config(thread))
    saver.close()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time, session_store\n"
         "root = session_store.Root(sys.argv[1])\n"
         "held = [root.open(sid) for sid in sys.argv[2:]]\n"
         "print('held', flush=True)\n"
         "time.sleep(60)\n",
         root.path, session_id_of("held"), session_id_of("kept")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        deleting = threading.Thread(target=saver.delete_thread, args=("held",))
        deleting.start()
        time.sleep(0.3)
        # Another thread of the saver reads and writes while the delete waits.
        assert contents(g.get_state(config("free")))[0] == "free"
        g.invoke({"messages": [HumanMessage(content="more")]}, config("free"))
        assert deleting.is_alive(), "the delete stopped waiting"

        async def cancelled() -> None:
            task = asyncio.ensure_future(saver.adelete_thread("kept"))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled())
    finally:
        holder.kill()
        holder.wait()
    # Once the other process let go, the waiting delete deletes; the cancelled one does
    # not (its native wait ended with the cancellation).
    deleting.join()
    time.sleep(0.5)
    assert saver.get_tuple(config("held")) is None
    assert contents(g.get_state(config("kept")))[0] == "kept"


def test_a_saver_dropped_without_close_releases_its_writer_locks(root) -> None:
    # As an agents adapter does when it is collected: a saver made per request and never
    # closed held the writer lock of every thread it wrote for the rest of the process's
    # life (another process got WriterOwned naming this one for good).
    import gc

    saver = SessionStoreSaver(root)
    graph(saver).invoke({"messages": [HumanMessage(content="hi")]}, config("dropped"))
    other = SessionStoreSaver(root)  # shares the writer while it lives
    graph(other).invoke({"messages": [HumanMessage(content="again")]}, config("dropped"))
    assert root.writer_owner(session_id_of("dropped"))["pid"] == os.getpid()
    del saver
    gc.collect()
    assert root.writer_owner(session_id_of("dropped"))["pid"] == os.getpid()
    del other
    gc.collect()
    assert root.writer_owner(session_id_of("dropped")) is None
    root.open(session_id_of("dropped")).close()
    # A saver closed and then dropped releases nothing twice; one still used after a close
    # takes the writer again and lets it go when dropped.
    saver = SessionStoreSaver(root)
    g = graph(saver)
    g.invoke({"messages": [HumanMessage(content="one")]}, config("dropped"))
    saver.close()
    g.invoke({"messages": [HumanMessage(content="two")]}, config("dropped"))
    assert root.writer_owner(session_id_of("dropped"))["pid"] == os.getpid()
    del saver, g
    gc.collect()
    assert root.writer_owner(session_id_of("dropped")) is None
    with SessionStoreSaver(root) as fresh:
        assert contents(graph(fresh).get_state(config("dropped")))[-3:-1] == [
            "two",
            "echo owt",
        ]


def test_a_saver_of_many_threads_keeps_few_files_open(tmp_path) -> None:
    # A saver kept the writer (about six file descriptors) and the reader (about four) of
    # every thread it wrote or read: under a limit of 512 descriptors its put failed with
    # "Too many open files" after about 80 threads.
    script = r"""
import os, resource, sys
import session_store
from langgraph.checkpoint.base import empty_checkpoint
from session_store.langgraph import MAX_OPEN_THREADS, SessionStoreSaver, session_id_of

resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
root = session_store.Root(sys.argv[1])
saver = SessionStoreSaver(root)
threads = [f"t{i}" for i in range(300)]
configs = {}
for step in range(2):
    for t in threads:
        c = empty_checkpoint()
        c["channel_values"] = {"x": [t, step]}
        c["channel_versions"] = {"x": str(step + 1)}
        configs[t] = saver.put(configs.get(t, {"configurable": {"thread_id": t}}), c, {}, {"x": str(step + 1)})
open_fds = len(os.listdir("/proc/self/fd"))
assert open_fds < 20 * MAX_OPEN_THREADS, open_fds
held = [t for t in threads if root.writer_owner(session_id_of(t)) is not None]
assert held == threads[-MAX_OPEN_THREADS:], held
reader = SessionStoreSaver(root)
for t in threads:
    got = reader.get_tuple(configs[t])
    assert got.checkpoint["channel_values"]["x"] == [t, 1], (t, got)
assert len(os.listdir("/proc/self/fd")) < 20 * MAX_OPEN_THREADS
# close() lets go of what the saver knows of every thread, those whose reader it dropped
# included (their indexes and list bases stayed in memory).
reader.close()
assert not reader._threads and not reader._lists and not reader._identities
saver.close()
assert all(root.writer_owner(session_id_of(t)) is None for t in threads)
"""
    run_script(script, tmp_path / "root")


def test_thread_ids_map_to_session_ids_and_back(root, saver) -> None:
    for thread in ["chat", "a-b_c", "UPPER", "with space", "ünïcode", "../x", "con", "nul"]:
        sid = session_id_of(thread)
        root.create(sid).close()  # an id the store accepts
        assert thread_id_of(sid) == thread
    assert thread_id_of("not-a-thread") is None
    # Ids the saver never makes name no thread: "lg-ABC" would be thread "ABC", whose
    # session is "lgx-414243"; "lgx-61" thread "a", whose session is "lg-a".
    for made_by_hand in ["lg-ABC", "lgx-61", "lgx-6", "lgx-ff", "lg-a b"]:
        assert thread_id_of(made_by_hand) is None, made_by_hand
    g = graph(saver)
    g.invoke({"messages": [HumanMessage(content="odd")]}, config("Odd/Thread: 1"))
    assert contents(g.get_state(config("Odd/Thread: 1")))[0] == "odd"
    threads = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
    assert threads == {"Odd/Thread: 1"}
    # A session "lg-ABC" made by hand beside thread "ABC" (session "lgx-414243"): listing
    # every thread gave ABC's checkpoints twice.
    root.create("lg-ABC").close()
    g.invoke({"messages": [HumanMessage(content="one")]}, config("ABC"))
    listed = [t.config["configurable"]["thread_id"] for t in saver.list(None)]
    assert listed.count("ABC") == len(list(saver.list(config("ABC")))) > 0
    assert set(listed) == {"Odd/Thread: 1", "ABC"}


def test_agents_conversations_and_threads_never_share_a_session(root, saver) -> None:
    """Thread "support" is session "lg-support"; an agents conversation of that very id was
    stored there too (its items then in the thread's session, deleted by delete_thread)."""
    from session_store.agents import store_id_of

    conversation = SessionStoreSession("lg-support", root)
    conversation.add_items_sync([{"role": "user", "content": "agents item"}])
    conversation.close()
    g = graph(saver)
    g.invoke({"messages": [HumanMessage(content="hi")]}, config("support"))
    assert conversation.store_id == "agx-6c672d737570706f7274" != session_id_of("support")
    saver.delete_thread("support")
    assert not any(t.config for t in saver.list(config("support")))
    again = SessionStoreSession("lg-support", root)
    assert again.get_items_sync() == [{"role": "user", "content": "agents item"}]
    again.close()
    # Every id of the LangGraph adapter's forms is mapped, one-to-one with the others.
    for thread in ["support", "Odd/Thread: 1", "a", ""]:
        sid = session_id_of(thread)
        assert store_id_of(sid) != sid and store_id_of(sid).startswith("agx-")
    ids = ["lg-x", "lgx-61", "lgx-", "lg-", "agx-6c672d78", "lgy-1", "lg_x"]
    assert len({store_id_of(i) for i in ids}) == len(ids)
    assert store_id_of("lgy-1") == "lgy-1" and store_id_of("lg_x") == "lg_x"
    assert store_id_of("agx-6c672d78") != "agx-6c672d78"  # the hex of "lg-x"
    assert thread_id_of(store_id_of("lg-support")) is None
    # A long thread's session ("lgh-" and a SHA-256) is no conversation's either.
    hashed = session_id_of("x" * 300)
    assert hashed.startswith("lgh-") and store_id_of(hashed).startswith("agx-")
    assert store_id_of("lgh-" + "0" * 63) == "lgh-" + "0" * 63  # not of the form: kept


def test_a_session_of_a_threads_id_made_by_hand_is_not_a_thread(root, saver) -> None:
    """A session "lg-notes" made with Root.create and holding a chat message was listed as
    thread "notes" (with no checkpoints), a put wrote LangGraph events into it and
    delete_thread deleted it (outside testing, B14). It is passed over and left alone."""
    notes = root.create("lg-notes")
    message = {"id": "m1", "role": "user", "content": "mine"}
    notes.append([{"kind": "message/complete", "payload": {"message": message}}],
                 operation_id="n1")
    notes.close()
    before = root.events("lg-notes")
    g = graph(saver)
    g.invoke({"messages": [HumanMessage(content="hi")]}, config("real"))
    saver.put_writes(
        {"configurable": {"thread_id": "real", "checkpoint_ns": "",
                          "checkpoint_id": saver.get_tuple(config("real")).config[
                              "configurable"]["checkpoint_id"]}},
        [("messages", [])],
        "task-1",
    )
    assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"real"}
    real_checkpoints = len(list(saver.list(config("real"))))
    assert real_checkpoints > 1
    assert list(saver.list(config("notes"))) == []
    assert saver.get_tuple(config("notes")) is None
    says = (
        "session lg-notes is not the session of LangGraph thread 'notes': it holds a "
        "message/complete event (sequence 1), which no saver writes"
    )
    refusals = {
        "writing to it": lambda: g.invoke({"messages": [HumanMessage(content="x")]},
                                          config("notes")),
        "deleting it": lambda: saver.delete_thread("notes"),
        "copying it": lambda: saver.copy_thread("notes", "copy"),
        "pruning it": lambda: saver.prune(["real", "notes"]),
        "pruning it ": lambda: saver.prune(["real", "notes"], strategy="delete"),
    }
    for refused, call in refusals.items():
        with pytest.raises(session_store.InvalidInput) as e:
            call()
        assert says in str(e.value) and f"{refused.strip()} refused" in str(e.value), refused
    saver.delete_for_runs(["any-run"])
    assert root.events("lg-notes") == before
    assert len(list(saver.list(config("real")))) == real_checkpoints  # prune changed none
    assert all(s["session_ref"]["session_id"] != "lg-copy" for s in root.iter_sessions())
    # A session made by hand holding a title only is a thread's: the saver writes to it.
    titled = root.create(session_id_of("titled"))
    titled.append([{"kind": "session/title", "payload": {"title": "T"}}], operation_id="t")
    titled.close()
    g.invoke({"messages": [HumanMessage(content="yo")]}, config("titled"))
    assert contents(g.get_state(config("titled")))[0] == "yo"
    saver.delete_thread("real")
    assert saver.get_tuple(config("real")) is None


def test_the_async_graph_api_works_with_the_saver(saver) -> None:
    async def run() -> list[str]:
        g = graph(saver)
        await g.ainvoke({"messages": [HumanMessage(content="async")]}, config("aio"))
        return contents(await g.aget_state(config("aio")))

    assert asyncio.run(run()) == ["async", "echo cnysa", "reviewed 2"]


def test_a_second_process_writer_gets_writer_owned(root, saver) -> None:
    graph(saver).invoke({"messages": [HumanMessage(content="mine")]}, config("owned"))
    script = (
        "import sys\n"
        "from langchain_core.messages import HumanMessage\n"
        "import session_store\n"
        "from session_store.langgraph import SessionStoreSaver\n"
        "saver = SessionStoreSaver(sys.argv[1])\n"
        "cfg = {'configurable': {'thread_id': 'owned'}}\n"
        "assert saver.get_tuple(cfg) is not None\n"  # reads take no lock
        "tup = saver.get_tuple(cfg)\n"
        "try:\n"
        "    saver.put_writes(tup.config, [('x', 1)], 'task')\n"
        "except session_store.WriterOwned as e:\n"
        "    print('owned', e.owner['pid'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, root.path], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["owned", str(os.getpid())]


def test_a_large_value_in_many_checkpoints_is_stored_once(root) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    def folder_bytes() -> int:
        return sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root.path) for f in fs
        )

    doc = os.urandom(60_000).hex()  # 120 kB that does not compress much
    with SessionStoreSaver(root) as saver:
        cfg = config("doc", checkpoint_ns="")
        saver.put(cfg, empty_checkpoint(), {}, {})
        before = folder_bytes()
        for i in range(10):
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"doc": doc}
            version = saver.get_next_version(None if i == 0 else version, None)
            checkpoint["channel_versions"] = {"doc": version}
            cfg = saver.put(cfg, checkpoint, {"step": i}, {"doc": version})
        grown = folder_bytes() - before
        assert saver.get_tuple(config("doc")).checkpoint["channel_values"]["doc"] == doc
    # Ten new versions of one 120 kB value: stored once (the rest is placeholders).
    assert grown < 3 * len(doc), grown


def test_a_thread_deleted_and_made_again_by_another_saver_is_read_anew(root) -> None:
    # A saver that had read a thread kept folding the log from where it stopped: after
    # another saver (or process) deleted the thread and made it again, it served the old
    # thread's checkpoint, and its next put stored a suffix of a list version that only the
    # old thread held (unreadable: "missing from the log").
    from langgraph.checkpoint.base import empty_checkpoint

    def put(saver, parent: dict, items: list[str]) -> dict:
        version = saver.get_next_version(None, None)
        c = empty_checkpoint()
        c["channel_values"] = {"items": items}
        c["channel_versions"] = {"items": version}
        return saver.put(parent, c, {"step": len(items)}, {"items": version})

    reader, other = SessionStoreSaver(root), SessionStoreSaver(root)
    with other:
        last = config("again")
        for n in range(1, 4):
            last = put(other, last, [f"old {i}" for i in range(n)])
    assert reader.get_tuple(config("again")).checkpoint["channel_values"]["items"] == [
        "old 0",
        "old 1",
        "old 2",
    ]
    with other:
        other.delete_thread("again")
        fresh = put(other, config("again"), ["old 0", "old 1", "old 2"])
    got = reader.get_tuple(config("again"))
    assert got.config == fresh
    assert got.checkpoint["channel_values"]["items"] == ["old 0", "old 1", "old 2"]
    assert len(list(reader.list(config("again")))) == 1
    with reader:
        grown = put(reader, fresh, ["old 0", "old 1", "old 2", "new 3"])
    with SessionStoreSaver(root) as third:
        assert third.get_tuple(grown).checkpoint["channel_values"]["items"] == [
            "old 0",
            "old 1",
            "old 2",
            "new 3",
        ]
        assert [t.config for t in third.list(config("again"))] == [grown, fresh]


FORKED_SAVER = r"""
import json, os, signal, sys
from langgraph.checkpoint.base import empty_checkpoint
from session_store import WriterOwned
from session_store.langgraph import SessionStoreSaver

def put(saver, parent, items):
    version = saver.get_next_version(None, None)
    c = empty_checkpoint()
    c["channel_values"] = {"items": items}
    c["channel_versions"] = {"items": version}
    return saver.put(parent, c, {}, {"items": version})

saver = SessionStoreSaver(sys.argv[1])
config = {"configurable": {"thread_id": "forked"}}
put(saver, config, ["parent"])

def attempt(items):
    try:
        put(saver, config, items)
        return "ok"
    except WriterOwned:
        return "WriterOwned"

def before(out):  # in the child
    out["early"] = attempt(["refused"])

def release():  # in the parent
    saver.close()

def after(out):  # in the child, once the parent has closed its saver
    out["late"] = attempt(["parent", "child"])
    out["items"] = saver.get_tuple(config).checkpoint["channel_values"]["items"]
    saver.close()
""" + FORK_HANDSHAKE


def test_a_forked_child_saver_writes_once_the_parent_let_the_thread_go(tmp_path) -> None:
    # A saver copied into a child by os.fork() kept the parent's writers: it raised
    # WriterOwned for every thread the parent had written, for the child's whole life, also
    # once the parent had closed its saver.
    out = run_script(FORKED_SAVER, tmp_path / "root")
    child = json.loads(out.stdout)
    assert child == {"early": "WriterOwned", "late": "ok", "items": ["parent", "child"]}


def test_a_saver_of_many_threads_keeps_a_bounded_index(root) -> None:
    # What a saver knew of a thread's log (folded index, list bases, file identity) stayed
    # in memory for every thread it ever read or wrote, the file descriptors only bounded.
    from langgraph.checkpoint.base import empty_checkpoint

    from session_store.langgraph import MAX_OPEN_THREADS

    def known(saver: SessionStoreSaver) -> set[str]:
        return {*saver._threads, *(k[0] for k in saver._lists), *saver._identities}

    threads = [f"t{i}" for i in range(3 * MAX_OPEN_THREADS)]
    configs = {}
    with SessionStoreSaver(root) as writer:
        for t in threads:
            c = empty_checkpoint()
            c["channel_values"] = {"x": [t]}
            c["channel_versions"] = {"x": "1"}
            configs[t] = writer.put(config(t), c, {}, {"x": "1"})
            assert len(known(writer)) <= 2 * MAX_OPEN_THREADS
        assert set(threads[-MAX_OPEN_THREADS:]) <= known(writer)
    with SessionStoreSaver(root) as reader:
        for t in threads:
            assert reader.get_tuple(configs[t]).checkpoint["channel_values"]["x"] == [t]
            assert len(known(reader)) <= MAX_OPEN_THREADS
        assert len(list(reader.list(None))) == len(threads)
        assert len(known(reader)) <= MAX_OPEN_THREADS
        # A thread read again after its index was dropped reads the same.
        assert reader.get_tuple(configs[threads[0]]).checkpoint["channel_values"]["x"] == ["t0"]


def test_max_open_threads_sets_how_many_threads_a_saver_keeps_open(root) -> None:
    # The bound was the module's constant: a host running more threads at once than 32
    # reopened and reread a thread's log at nearly every step, about ten times slower, and
    # could not change it (outside testing P2).
    from langgraph.checkpoint.base import empty_checkpoint

    threads = [f"t{i}" for i in range(40)]
    with SessionStoreSaver(root, max_open_threads=48) as saver:
        for t in threads:
            c = empty_checkpoint()
            c["channel_values"] = {"x": [t]}
            c["channel_versions"] = {"x": "1"}
            saver.put(config(t), c, {}, {"x": "1"})
            saver.get_tuple(config(t))
        # 40 threads, more than the default 32: every one kept open.
        assert set(saver._writers) == set(threads)
        assert set(saver._readers) == set(threads)
    with SessionStoreSaver(root, max_open_threads=4) as saver:
        for t in threads:
            saver.get_tuple(config(t))
            assert len(saver._readers) <= 4
    for bad, error in ((0, session_store.InvalidInput), (-1, session_store.InvalidInput),
                       ("8", TypeError), (True, TypeError), (2.0, TypeError)):
        with pytest.raises(error):
            SessionStoreSaver(root, max_open_threads=bad)


_STRICT_MSGPACK_SCRIPT = r"""
import os, sys
os.environ["LANGGRAPH_STRICT_MSGPACK"] = "true"
from typing import TypedDict
from langgraph.graph import END, START, StateGraph
from session_store.langgraph import SessionStoreSaver

class S(TypedDict):
    n: int

b = StateGraph(S)
b.add_node("inc", lambda s: {"n": s["n"] + 1})
b.add_edge(START, "inc")
b.add_edge("inc", END)
cfg = {"configurable": {"thread_id": "t"}}
saver = SessionStoreSaver(sys.argv[1])
assert b.compile(checkpointer=saver).invoke({"n": 1}, cfg) == {"n": 2}
# The graph's saver is a copy sharing this one's writer: both see the thread, in order.
assert b.compile(checkpointer=saver).invoke({"n": 5}, cfg) == {"n": 6}
assert saver.get_tuple(cfg).checkpoint["channel_values"]["n"] == 6
copy = saver.with_allowlist([("mymod", "MyType")])
assert copy is not saver and copy.serde is not saver.serde
del saver  # the copy keeps it alive: its writers stay held
assert b.compile(checkpointer=copy).invoke({"n": 9}, cfg) == {"n": 10}
copy.close()
print("ok")
"""


def test_a_saver_compiles_under_strict_msgpack(tmp_path) -> None:
    # LANGGRAPH_STRICT_MSGPACK makes compile() call with_allowlist, which copy.copy()s the
    # saver: the copy was refused ("cannot pickle or copy"), so no graph compiled.
    done = run_script(_STRICT_MSGPACK_SCRIPT, tmp_path / "root")
    assert done.stdout.strip() == "ok"


def test_a_put_raced_by_another_process_deleting_the_thread_stores_what_it_can_read(
    root, monkeypatch
):
    # A saver that read a thread puts a checkpoint whose list grew (stored as the items
    # added to the version it read); another process deletes the thread before the put
    # opens the writer. The put made the thread again with a checkpoint naming a base that
    # was not in it: no other saver could read it (outside testing P2, session 41). The
    # stored form is now worked out under the writer: the whole list.
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    first = SessionStoreSaver(root)
    checkpoint = empty_checkpoint()
    v1 = first.get_next_version(None, None)
    checkpoint["channel_values"] = {"messages": ["m0", "m1"]}
    checkpoint["channel_versions"] = {"messages": v1}
    first.put(cfg, checkpoint, {"step": 0}, {"messages": v1})
    first.close()

    saver = SessionStoreSaver(root)
    read = saver.get_tuple(cfg)
    v2 = saver.get_next_version(v1, None)
    grown = create_checkpoint(read.checkpoint, None, 1)
    grown["channel_values"] = {"messages": ["m0", "m1", "m2"]}
    grown["channel_versions"] = {"messages": v2}
    delete = (
        "import sys\n"
        "from session_store.langgraph import SessionStoreSaver\n"
        "SessionStoreSaver(sys.argv[1]).delete_thread('t')\n"
    )
    commit = SessionStoreSaver._commit

    def deleted_first(self, thread_id, events_of):
        run_script(delete, root.path)
        return commit(self, thread_id, events_of)

    monkeypatch.setattr(SessionStoreSaver, "_commit", deleted_first)
    saver.put(read.config, grown, {"step": 1}, {"messages": v2})
    monkeypatch.setattr(SessionStoreSaver, "_commit", commit)
    for reader in (saver, SessionStoreSaver(root)):
        assert reader.get_tuple(cfg).checkpoint["channel_values"] == {
            "messages": ["m0", "m1", "m2"]
        }
    saver.close()


def test_a_put_of_another_thread_of_the_process_waits_for_a_delete_of_its_thread(
    root, monkeypatch
):
    # delete_thread lets go of this saver's writer, then deletes: a put from another
    # thread of the process (LangGraph's background saves) opened the writer again in
    # between, and the delete either deleted what that put had just stored (here) or, when
    # the put's open came during its wait, waited out its 10 s for this very process and
    # raised Cancelled naming it (outside testing P3, session 41). The put now waits for
    # the delete and then makes the thread anew.
    import threading
    import time

    from langgraph.checkpoint.base import empty_checkpoint

    cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    saver = SessionStoreSaver(root)

    def checkpoint(value: str):
        made = empty_checkpoint()
        version = saver.get_next_version(None, None)
        made["channel_values"] = {"note": value}
        made["channel_versions"] = {"note": version}
        return made, {"note": version}

    first, versions = checkpoint("before")
    saver.put(cfg, first, {"step": 0}, versions)
    later, later_versions = checkpoint("after")
    putters = []
    before_delete = SessionStoreSaver._before_delete

    def then_a_put_from_another_thread(self, thread_id):
        gate = before_delete(self, thread_id)
        putter = threading.Thread(target=self.put, args=(cfg, later, {"step": 1}, later_versions))
        putter.start()
        putter.join(timeout=0.5)  # without the wait it has opened the writer by now
        putters.append(putter)
        return gate

    monkeypatch.setattr(SessionStoreSaver, "_before_delete", then_a_put_from_another_thread)
    started = time.monotonic()
    saver.delete_thread("t")
    assert time.monotonic() - started < 5
    putters[0].join(timeout=30)
    assert not putters[0].is_alive()
    monkeypatch.setattr(SessionStoreSaver, "_before_delete", before_delete)
    for reader in (saver, SessionStoreSaver(root)):
        found = reader.get_tuple(cfg)
        assert found.checkpoint["id"] == later["id"]
        assert found.checkpoint["channel_values"] == {"note": "after"}
    saver.close()


def test_an_error_of_a_threads_session_names_the_thread(root):
    # "session lgx-… is owned by another writer" named a session the caller could not tell
    # for its thread (outside testing P5, session 41): the thread is named too.
    from langgraph.checkpoint.base import empty_checkpoint

    holder = root.create(session_id_of("T1"))
    saver = SessionStoreSaver(root)
    checkpoint = empty_checkpoint()
    version = saver.get_next_version(None, None)
    checkpoint["channel_values"] = {"note": "x"}
    checkpoint["channel_versions"] = {"note": version}
    cfg = {"configurable": {"thread_id": "T1", "checkpoint_ns": ""}}
    with pytest.raises(session_store.WriterOwned) as refused:
        saver.put(cfg, checkpoint, {"step": 0}, {"note": version})
    assert f'session {session_id_of("T1")} (LangGraph thread "T1")' in str(refused.value)
    assert refused.value.owner["pid"] == os.getpid()
    holder.close()
    saver.put(cfg, checkpoint, {"step": 0}, {"note": version})
    saver.close()
