"""Shared fixtures: every test gets its own root in a temporary folder."""

from __future__ import annotations

import pytest

import session_store


@pytest.fixture
def root(tmp_path) -> session_store.Root:
    return session_store.Root(tmp_path / "root")


def turn(turn_id: str, *messages: dict) -> list[dict]:
    """The events of one completed turn holding ``messages``."""
    return [
        {"kind": "turn/start"},
        *({"kind": "message/complete", "payload": {"message": m}} for m in messages),
        {"kind": "turn/end", "payload": {"status": "completed"}},
    ]


def msg(i: int, role: str = "user", content: str | None = None) -> dict:
    return {"id": f"m{i}", "role": role, "content": content or f"message {i}"}
