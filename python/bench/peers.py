"""Same-run comparison of session_store's adapters with the stores Python hosts use today.

    target/python-venv/bin/python python/bench/peers.py [--rounds 5] [--quick]
        [--only adds|reads|branch|graph]

One process, every store on the same local disk at the same durability (SQLite
``synchronous=FULL``; session_store's default ``durability="full"``), the same items
(~400 B messages), rounds interleaved (the contenders take turns inside each round, in a
rotating order), the median per contender and the ratio printed (> 1 means session_store is
faster, or smaller for bytes):

- ``SessionStoreSession`` vs openai-agents' ``SQLiteSession``: ``add_items`` of 1 item per
  call and of 64 per call, ``get_items()`` of a 20,000-item session, ``get_items(limit=50)``;
- branching a 20,000-item session at its middle: ``SessionStoreSession.fork`` vs
  ``AdvancedSQLiteSession.create_branch_from_turn``;
- a messages graph of 2,000 message-adding steps (1,000 invokes: a user message in, one
  reply node) through ``SessionStoreSaver`` vs LangGraph's ``SqliteSaver``: steps/s and the
  bytes on disk afterwards (database, WAL and blobs).

``--quick`` shrinks every size tenfold (a smoke run; its ratios are not the issue's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from agents.extensions.memory import AdvancedSQLiteSession
from agents.memory import SQLiteSession
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph

import session_store
from session_store.agents import SessionStoreSession
from session_store.langgraph import SessionStoreSaver

TEXT = "lorem ipsum dolor sit amet " * 14  # ~380 B of content: ~400 B items


def item(i: int) -> dict[str, Any]:
    role = "user" if i % 2 == 0 else "assistant"
    return {"role": role, "content": f"{i:08d} {TEXT}"}


def _full(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA synchronous=FULL")


class FullSQLiteSession(SQLiteSession):
    """``SQLiteSession`` with ``synchronous=FULL`` on its connections (its WAL default)."""

    @staticmethod
    def _configure_connection(conn: sqlite3.Connection) -> None:
        SQLiteSession._configure_connection(conn)
        _full(conn)


class FullAdvancedSQLiteSession(AdvancedSQLiteSession):
    """``AdvancedSQLiteSession`` with ``synchronous=FULL`` on its connections."""

    @staticmethod
    def _configure_connection(conn: sqlite3.Connection) -> None:
        AdvancedSQLiteSession._configure_connection(conn)
        _full(conn)


def folder_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files
    )


class Bench:
    def __init__(self, workdir: str, rounds: int, scale: int) -> None:
        self.workdir = workdir
        self.rounds = rounds
        self.scale = scale
        self.rows: list[tuple[str, str, float, str, float, float]] = []
        self.n = 0

    def path(self, name: str) -> str:
        self.n += 1
        return os.path.join(self.workdir, f"{self.n:03d}-{name}")

    def ours(self, session_id: str) -> SessionStoreSession:
        return SessionStoreSession(session_id, session_store.Root(self.path("root")))

    def sqlite(self, session_id: str) -> SQLiteSession:
        return FullSQLiteSession(session_id, self.path("agents.db"))

    def interleave(
        self, what: str, unit: str, contenders: dict[str, Callable[[], float]]
    ) -> dict[str, float]:
        """Median seconds per contender over the rounds, in rotating order."""
        names = list(contenders)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(self.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                times[name].append(contenders[name]())
        return {n: statistics.median(t) for n, t in times.items()}

    def record(
        self, what: str, unit: str, ours: float, peer: str, theirs: float, per: float
    ) -> None:
        """``ours``/``theirs`` are seconds for ``per`` units (ratio: their time / ours)."""
        self.rows.append((what, unit, per / ours, peer, per / theirs, theirs / ours))
        print(
            f"{what:<44} session_store {per / ours:>10.1f} {unit:<9} {peer:<22} "
            f"{per / theirs:>10.1f}  ratio {theirs / ours:6.2f}x",
            flush=True,
        )

    # openai-agents sessions.

    def add_items(self, per_call: int, calls: int) -> None:
        async def run(session: Any, start: list[int]) -> float:
            began = time.perf_counter()
            for _ in range(calls):
                base = start[0]
                await session.add_items([item(base + k) for k in range(per_call)])
                start[0] += per_call
            return time.perf_counter() - began

        ours, theirs = self.ours("adds"), self.sqlite("adds")
        counters = {"ours": [0], "theirs": [0]}
        medians = self.interleave(
            f"add_items {per_call}",
            "items/s",
            {
                "ours": lambda: asyncio.run(run(ours, counters["ours"])),
                "theirs": lambda: asyncio.run(run(theirs, counters["theirs"])),
            },
        )
        ours.close()
        theirs.close()
        self.record(
            f"add_items, {per_call} item(s) per call",
            "items/s",
            medians["ours"],
            "SQLiteSession",
            medians["theirs"],
            per_call * calls,
        )

    @staticmethod
    def fill(items: int, *sessions: Any) -> None:
        """Adds ``items`` items to each session, 100 per call (setup, not timed)."""

        async def run() -> None:
            for start in range(0, items, 100):
                batch = [item(i) for i in range(start, min(items, start + 100))]
                for session in sessions:
                    await session.add_items(batch)

        asyncio.run(run())

    def filled(self, items: int) -> tuple[SessionStoreSession, SQLiteSession]:
        ours, theirs = self.ours("reads"), self.sqlite("reads")
        self.fill(items, ours, theirs)
        return ours, theirs

    def get_items(self, items: int, reads: int) -> None:
        ours, theirs = self.filled(items)
        labels = {None: f"get_items() of {items:,} items", 50: f"get_items(limit=50) of {items:,}"}
        for limit, label in labels.items():
            async def run(session: Any, limit: int | None = limit) -> float:
                began = time.perf_counter()
                for _ in range(reads):
                    got = await session.get_items(limit)
                    assert len(got) == (items if limit is None else limit)
                return time.perf_counter() - began

            medians = self.interleave(
                label,
                "reads/s",
                {
                    "ours": lambda: asyncio.run(run(ours)),
                    "theirs": lambda: asyncio.run(run(theirs)),
                },
            )
            self.record(
                label, "reads/s", medians["ours"], "SQLiteSession", medians["theirs"], reads
            )
        ours.close()
        theirs.close()

    def branch(self, items: int) -> None:
        ours = self.ours("branch")
        theirs = FullAdvancedSQLiteSession(
            session_id="branch", db_path=self.path("advanced.db"), create_tables=True
        )
        self.fill(items, ours, theirs)
        middle = items // 2  # items 0..middle-1 kept: turns (user items) 1..middle/2
        made = [0]

        def ours_branch() -> float:
            began = time.perf_counter()
            child = ours.fork(after_item=middle - 1)
            elapsed = time.perf_counter() - began
            assert len(child.get_items_sync()) == middle
            child.close()
            return elapsed

        def theirs_branch() -> float:
            made[0] += 1

            async def run() -> float:
                await theirs.switch_to_branch("main")
                began = time.perf_counter()
                await theirs.create_branch_from_turn(middle // 2 + 1, f"b{made[0]}")
                return time.perf_counter() - began

            return asyncio.run(run())

        medians = self.interleave(
            "branch", "branches/s", {"ours": ours_branch, "theirs": theirs_branch}
        )
        ours.close()
        theirs.close()
        self.record(
            f"branch a {items:,}-item session at its middle",
            "branches/s",
            medians["ours"],
            "AdvancedSQLiteSession",
            medians["theirs"],
            1,
        )

    # LangGraph checkpointers.

    def graph_steps(self, invokes: int, chunks: int) -> None:
        def reply(state: MessagesState) -> dict:
            n = len(state["messages"])
            return {"messages": [AIMessage(content=f"{n:08d} {TEXT}")]}

        builder = StateGraph(MessagesState)
        builder.add_node("reply", reply)
        builder.add_edge(START, "reply")

        ours_dir = self.path("saver-root")
        ours_saver = SessionStoreSaver(ours_dir)
        theirs_db = self.path("saver.db")
        conn = sqlite3.connect(theirs_db, check_same_thread=False)
        theirs_saver = SqliteSaver(conn)
        theirs_saver.setup()
        _full(conn)
        graphs = {
            "ours": builder.compile(checkpointer=ours_saver),
            "theirs": builder.compile(checkpointer=theirs_saver),
        }
        spent = {"ours": 0.0, "theirs": 0.0}
        done = {"ours": 0, "theirs": 0}
        cfg = {"configurable": {"thread_id": "graph"}}
        per_chunk = invokes // chunks
        for c in range(chunks):
            for name in (("ours", "theirs") if c % 2 == 0 else ("theirs", "ours")):
                g = graphs[name]
                began = time.perf_counter()
                for _ in range(per_chunk):
                    i = done[name]
                    g.invoke({"messages": [HumanMessage(content=f"{i:08d} {TEXT}")]}, cfg)
                    done[name] += 1
                spent[name] += time.perf_counter() - began
        for name, g in graphs.items():
            assert len(g.get_state(cfg).values["messages"]) == 2 * invokes, name
        ours_saver.close()
        conn.close()
        steps = 2 * invokes
        self.record(
            f"messages graph, {steps:,} steps",
            "steps/s",
            spent["ours"],
            "SqliteSaver",
            spent["theirs"],
            steps,
        )
        ours_bytes, theirs_bytes = folder_bytes(ours_dir), folder_bytes(theirs_db)
        for suffix in ("-wal", "-shm"):
            if os.path.exists(theirs_db + suffix):
                theirs_bytes += os.path.getsize(theirs_db + suffix)
        ratio = theirs_bytes / ours_bytes
        what = "bytes on disk after the graph"
        self.rows.append((what, "MB", ours_bytes / 1e6, "SqliteSaver", theirs_bytes / 1e6, ratio))
        print(
            f"{what:<44} session_store {ours_bytes / 1e6:>10.2f} MB        "
            f"{'SqliteSaver':<22} {theirs_bytes / 1e6:>10.2f}  ratio {ratio:6.1f}x",
            flush=True,
        )

    def table(self) -> str:
        lines = [
            "| measure | session_store | peer | peer's | ratio (> 1: session_store ahead) |",
            "|---|---:|---|---:|---:|",
        ]
        for what, unit, ours, peer, theirs, ratio in self.rows:
            lines.append(
                f"| {what} | {ours:,.1f} {unit} | {peer} | {theirs:,.1f} {unit} | {ratio:.2f}x |"
            )
        return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="sizes / 10 (smoke run)")
    parser.add_argument("--dir", help="work folder (default: a temporary one, removed)")
    parser.add_argument(
        "--only",
        choices=["adds", "reads", "branch", "graph"],
        action="append",
        help="run only these measures (repeatable; default: all)",
    )
    args = parser.parse_args()
    only = set(args.only or ["adds", "reads", "branch", "graph"])
    scale = 10 if args.quick else 1
    workdir = args.dir or tempfile.mkdtemp(prefix="sse-peers-")
    os.makedirs(workdir, exist_ok=True)
    bench = Bench(workdir, args.rounds, scale)
    print(f"python {sys.version.split()[0]}, {args.rounds} rounds, work folder {workdir}")
    try:
        if "adds" in only:
            bench.add_items(1, 200 // scale)
            bench.add_items(64, 50 // scale)
        if "reads" in only:
            bench.get_items(20_000 // scale, 3)
        if "branch" in only:
            bench.branch(20_000 // scale)
        if "graph" in only:
            bench.graph_steps(1_000 // scale, 10)
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(bench.table())


if __name__ == "__main__":
    main()
